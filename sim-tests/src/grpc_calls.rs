//! The service's own requests as the `tree.TreeService` calls a gateway
//! sends (each body signed), and the answers read back as the service's
//! own responses: what the load generator's gRPC target and the
//! simulator's gRPC gateways both speak.

use arbor::error::Error;
use arbor::grpc::client::{self, proto_meta};
use arbor::grpc::pb::{self, tree_service_client::TreeServiceClient};
use arbor::grpc::VariableTimeSigner;
use arbor::proto::{Request, Response};
use arbor::types::{KeyValue, Meta, NodeInfo, TreeKey};
use prost::Message;
use tonic::client::GrpcService;
use tonic::codegen::{Body, Bytes, StdError};
use tonic::{Code, Status};

pub fn sign<B: Message>(signer: &VariableTimeSigner, body: &B) -> pb::Signature {
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
pub async fn send<T>(
    mut client: TreeServiceClient<T>,
    signer: &VariableTimeSigner,
    request: Request,
) -> Result<Response, Status>
where
    T: GrpcService<tonic::body::Body>,
    T::Error: Into<StdError>,
    T::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as Body>::Error: Into<StdError> + Send,
{
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
        other => Ok(without_call(&other).expect("a request without a gRPC call")),
    }
}

/// The answer to a request the gRPC API has no call for; `None` when it
/// has one (`send` makes it).
pub fn without_call(request: &Request) -> Option<Response> {
    let has_call = matches!(
        request,
        Request::Add { .. }
            | Request::AddByPath { .. }
            | Request::Move { .. }
            | Request::Remove { .. }
            | Request::GetNodeByPath { .. }
            | Request::GetSubTree { .. }
    );
    (!has_call).then(|| {
        Response::Error(Error::InvalidOp(format!(
            "{} has no gRPC call",
            request.kind()
        )))
    })
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
