//! The gateway path over gRPC: the service's own requests that the
//! scenarios make, sent as the `tree.TreeService` calls a gateway or the
//! reference loader sends (every body signed with the load's key;
//! `crate::grpc_calls` translates), and the answers read back as the
//! service's own responses.
//!
//! Each node gets a few HTTP/2 channels (connections); calls go to the
//! nodes round-robin and, within a node, to its channels round-robin.
//! Signing uses `VariableTimeSigner`: the same signatures as the
//! constant-time signer at a fraction of its cost, fine for a key made
//! for one run.

use super::target::Target;
pub use crate::grpc_calls::error_of;
use crate::grpc_calls::{send, sign};
use arbor::grpc::client;
use arbor::grpc::pb::{self, tree_service_client::TreeServiceClient};
use arbor::grpc::{Signer, VariableTimeSigner};
use arbor::proto::{Request, Response};
use arbor::runtime::BoxFuture;
use arbor::types::TreeKey;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tonic::transport::Channel;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::metrics::{ErrorKind, Outcome};
    use arbor::error::Error;
    use tonic::Status;

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
