//! The gateway path over gRPC: the service's own requests that the
//! scenarios make, sent as the `tree.TreeService` calls a gateway or the
//! reference loader sends (every body signed with the load's key), and
//! the answers read back as the service's own responses.
//!
//! Each node gets a few HTTP/2 channels (connections); calls go to the
//! nodes round-robin and, within a node, to its channels round-robin.
//! Signing uses `VariableTimeSigner`: the same signatures as the
//! constant-time signer at a fraction of its cost, fine for a key made
//! for one run.

use super::target::Target;
use arbor::error::Error;
use arbor::grpc::client::{self, proto_meta};
use arbor::grpc::pb::{self, tree_service_client::TreeServiceClient};
use arbor::grpc::{Signer, VariableTimeSigner};
use arbor::proto::{Request, Response};
use arbor::runtime::BoxFuture;
use arbor::types::{KeyValue, Meta, NodeInfo, TreeKey};
use prost::Message;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// The seed of the load generator's signing key: one key for every run,
/// so that configs and profiles name the same caller.
pub const LOAD_KEY_SEED: u64 = 0x6c6f_6164;

/// The load generator's signing key.
pub fn load_signer() -> Signer {
    Signer::from_seed(LOAD_KEY_SEED)
}

/// Nodes reached over gRPC.
pub struct GrpcTarget {
    /// Per node, its channels.
    nodes: Vec<Vec<TreeServiceClient<Channel>>>,
    signer: Arc<VariableTimeSigner>,
    next_node: AtomicUsize,
    next_channel: AtomicUsize,
}

impl GrpcTarget {
    /// Opens `channels` HTTP/2 connections to each front at `addresses`
    /// (plaintext), to be used from the runtime this is called on.
    pub async fn connect(
        addresses: &[String],
        channels: usize,
        signer: &Signer,
    ) -> Result<Self, String> {
        assert!(!addresses.is_empty(), "a target needs at least one node");
        let mut nodes = Vec::new();
        for address in addresses {
            let target = client::Target::plaintext(address.clone());
            let mut clients = Vec::new();
            for _ in 0..channels.max(1) {
                let channel = target.connect().await.map_err(|e| e.to_string())?;
                clients.push(
                    TreeServiceClient::new(channel)
                        .max_decoding_message_size(target.max_message_bytes)
                        .max_encoding_message_size(target.max_message_bytes),
                );
            }
            nodes.push(clients);
        }
        Ok(Self {
            nodes,
            signer: Arc::new(signer.variable_time()),
            next_node: AtomicUsize::new(0),
            next_channel: AtomicUsize::new(0),
        })
    }

    /// Calls TreeList once over every channel: the connections are up and
    /// each node has built the verification table of the load's key
    /// (hundreds of milliseconds at its first use) before the load starts.
    pub async fn warm_up(&self, tree: &TreeKey) -> Result<(), String> {
        for (node, clients) in self.nodes.iter().enumerate() {
            for client in clients {
                let body = pb::tree_list_request::Body {
                    container_id: tree.cid.0.to_vec(),
                };
                let signature = sign(&self.signer, &body);
                let request = pb::TreeListRequest {
                    body: Some(body),
                    signature: Some(signature),
                };
                client
                    .clone()
                    .tree_list(request)
                    .await
                    .map_err(|status| format!("warming up gRPC node {node}: {status}"))?;
            }
        }
        Ok(())
    }

    /// Channels per node.
    pub fn channels(&self) -> usize {
        self.nodes[0].len()
    }
}

impl Target for GrpcTarget {
    fn call(&self, request: Request) -> BoxFuture<'static, Response> {
        let node = self.next_node.fetch_add(1, Ordering::Relaxed);
        self.call_at(node as u64, request)
    }

    fn call_at(&self, key: u64, request: Request) -> BoxFuture<'static, Response> {
        let clients = &self.nodes[(key % self.nodes.len() as u64) as usize];
        let channel = self.next_channel.fetch_add(1, Ordering::Relaxed) % clients.len();
        let client = clients[channel].clone();
        let signer = self.signer.clone();
        Box::pin(async move {
            send(client, &signer, request)
                .await
                .unwrap_or_else(|status| Response::Error(error_of(&status)))
        })
    }
}

fn sign<B: Message>(signer: &VariableTimeSigner, body: &B) -> pb::Signature {
    let (key, sign) = signer.sign(&body.encode_to_vec());
    pb::Signature { key, sign }
}

fn node_info(id: u64, parent: u64, time: u64, meta: Vec<pb::KeyValue>) -> NodeInfo {
    NodeInfo {
        id,
        parent,
        meta: Meta {
            time,
            items: client::native_meta(meta),
        },
    }
}

fn cid(tree: &TreeKey) -> Vec<u8> {
    tree.cid.0.to_vec()
}

fn meta(items: &[KeyValue]) -> Vec<pb::KeyValue> {
    proto_meta(items)
}

/// `request` as its gRPC call, and the answer as the service's response.
async fn send(
    mut client: TreeServiceClient<Channel>,
    signer: &VariableTimeSigner,
    request: Request,
) -> Result<Response, Status> {
    macro_rules! signed {
        ($request:ident, $body:expr) => {{
            let body = $body;
            let signature = Some(sign(signer, &body));
            pb::$request {
                body: Some(body),
                signature,
            }
        }};
    }
    match request {
        Request::Add {
            tree,
            parent,
            items,
        } => {
            let request = signed!(
                AddRequest,
                pb::add_request::Body {
                    container_id: cid(&tree),
                    tree_id: tree.tree,
                    parent_id: parent,
                    meta: meta(&items),
                    bearer_token: Vec::new(),
                }
            );
            let body = client.add(request).await?.into_inner().body;
            Ok(Response::Added {
                node: body.unwrap_or_default().node_id,
            })
        }
        Request::AddByPath {
            tree,
            attr,
            path,
            items,
        } => {
            let request = signed!(
                AddByPathRequest,
                pb::add_by_path_request::Body {
                    container_id: cid(&tree),
                    tree_id: tree.tree,
                    path_attribute: attr,
                    path,
                    meta: meta(&items),
                    bearer_token: Vec::new(),
                }
            );
            let body = client.add_by_path(request).await?.into_inner().body;
            let body = body.unwrap_or_default();
            let mut nodes = body.nodes.into_iter();
            let leaf = nodes
                .next()
                .ok_or_else(|| Status::internal("AddByPath answered without a node"))?;
            Ok(Response::AddedByPath {
                leaf,
                created: nodes.collect(),
                parent: body.parent_id,
            })
        }
        Request::Move {
            tree,
            parent,
            node,
            items,
        } => {
            let request = signed!(
                MoveRequest,
                pb::move_request::Body {
                    container_id: cid(&tree),
                    tree_id: tree.tree,
                    parent_id: parent,
                    node_id: node,
                    meta: meta(&items),
                    bearer_token: Vec::new(),
                }
            );
            client.r#move(request).await?;
            Ok(Response::Done)
        }
        Request::Remove { tree, node } => {
            let request = signed!(
                RemoveRequest,
                pb::remove_request::Body {
                    container_id: cid(&tree),
                    tree_id: tree.tree,
                    node_id: node,
                    bearer_token: Vec::new(),
                }
            );
            client.remove(request).await?;
            Ok(Response::Done)
        }
        Request::GetNodeByPath {
            tree,
            attr,
            path,
            attributes,
            latest_only,
            all_attributes,
        } => {
            let request = signed!(
                GetNodeByPathRequest,
                pb::get_node_by_path_request::Body {
                    container_id: cid(&tree),
                    tree_id: tree.tree,
                    path_attribute: attr,
                    path,
                    attributes,
                    latest_only,
                    all_attributes,
                    bearer_token: Vec::new(),
                }
            );
            let body = client.get_node_by_path(request).await?.into_inner().body;
            let nodes = body.unwrap_or_default().nodes.into_iter();
            Ok(Response::Nodes(
                nodes
                    .map(|n| node_info(n.node_id, n.parent_id, n.timestamp, n.meta))
                    .collect(),
            ))
        }
        Request::GetSubTree { tree, root, depth } => {
            let request = signed!(
                GetSubTreeRequest,
                pb::get_sub_tree_request::Body {
                    container_id: cid(&tree),
                    tree_id: tree.tree,
                    root_id: vec![root],
                    depth,
                    bearer_token: Vec::new(),
                    order_by: None,
                }
            );
            let mut stream = client.get_sub_tree(request).await?.into_inner();
            let mut nodes = Vec::new();
            while let Some(item) = stream.message().await? {
                let n = item.body.unwrap_or_default();
                nodes.push(node_info(n.node_id, n.parent_id, n.timestamp, n.meta));
            }
            Ok(Response::Nodes(nodes))
        }
        other => Ok(Response::Error(Error::InvalidOp(format!(
            "the load generator sends no {} over gRPC",
            super::gateway::call_name(&other)
        )))),
    }
}

/// The service's error behind a gRPC status, as far as the load's error
/// kinds tell them apart (`metrics::ErrorKind`): the front's texts are the
/// errors' own (`arbor::grpc::status_of`); a status the front did not make
/// (a connection that failed) is a network error.
pub fn error_of(status: &Status) -> Error {
    let message = status.message();
    match status.code() {
        Code::Unavailable => {
            if let Some(why) = message.strip_prefix("overloaded: ") {
                Error::Overloaded(why.to_string())
            } else if let Some(why) = message.strip_prefix("storage error: ") {
                Error::Storage(why.to_string())
            } else if message == Error::ShuttingDown.to_string() {
                Error::ShuttingDown
            } else {
                Error::Network(format!("gRPC unavailable: {message}"))
            }
        }
        Code::DeadlineExceeded => Error::Timeout,
        Code::Unknown | Code::Cancelled => {
            Error::Network(format!("gRPC {:?}: {message}", status.code()))
        }
        Code::PermissionDenied | Code::Unauthenticated => Error::PermissionDenied {
            operation: "a gRPC call".to_string(),
            caller: message.to_string(),
        },
        code => Error::InvalidOp(format!("gRPC {code:?}: {message}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::metrics::{ErrorKind, Outcome};

    /// Each refusal the front makes comes back as the error kind the load
    /// counts it as.
    #[test]
    fn statuses_become_the_load_s_error_kinds() {
        let kind = |error: Error| {
            let status = arbor::grpc::status_of(error);
            match Outcome::from_response(Some(Response::Error(error_of(&status)))) {
                Outcome::Failed(kind) => kind,
                ok => panic!("{ok:?}"),
            }
        };
        assert_eq!(
            kind(Error::Overloaded("queue full".into())),
            ErrorKind::Overloaded
        );
        assert_eq!(kind(Error::Timeout), ErrorKind::Timeout);
        assert_eq!(kind(Error::Storage("disk".into())), ErrorKind::Storage);
        assert_eq!(kind(Error::ShuttingDown), ErrorKind::ShuttingDown);
        assert_eq!(kind(Error::Network("reset".into())), ErrorKind::Network);
        assert_eq!(kind(Error::NodeNotFound(7)), ErrorKind::Other);
        let refused = Error::PermissionDenied {
            operation: "Add".into(),
            caller: "k".into(),
        };
        assert_eq!(kind(refused), ErrorKind::Other);
        let lost = Status::unavailable("error trying to connect: connection refused");
        assert!(matches!(error_of(&lost), Error::Network(_)));
        assert_eq!(
            error_of(&Status::unavailable("overloaded: queue full")),
            Error::Overloaded("queue full".into())
        );
    }
}
