//! What the load generator drives: anything that answers a request. Real
//! mode and sim mode differ only in the target (and the clock).

use arbor::error::Error;
use arbor::net::Transport;
use arbor::proto::{Request, Response};
use arbor::runtime::BoxFuture;
use arbor::service::Service;
use arbor::types::ReplicaId;
use arbor::Caller;
use serde::Serialize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How the load generator, standing in for the object gateway, reaches
/// the nodes under test. Users reach Arbor over the wire, so a wire path is
/// what a report measures; in-process runs are reported beside one only.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GatewayTransport {
    /// The wire protocol over loopback TCP: framing, encoding, connection
    /// pool and the server's limits, as a gateway on another host has them.
    Tcp,
    /// The same over mutual TLS: the nodes replicate over TLS too, with
    /// certificates made for the run; the gateway is a client certificate.
    Tls,
    /// The `tree.TreeService` gRPC front (plaintext HTTP/2 over loopback),
    /// every call signed with the load's key, as gateways and the
    /// reference loader call it; the nodes replicate over TCP.
    Grpc,
    /// Direct calls to the service in this process: no wire, no encoding;
    /// the service's own cost only.
    InProcess,
}

impl GatewayTransport {
    pub fn name(self) -> &'static str {
        match self {
            GatewayTransport::Tcp => "tcp",
            GatewayTransport::Tls => "tls",
            GatewayTransport::Grpc => "grpc",
            GatewayTransport::InProcess => "in-process",
        }
    }

    /// Whether requests cross the wire as users' requests do.
    pub fn is_wire(self) -> bool {
        match self {
            GatewayTransport::Tcp | GatewayTransport::Tls | GatewayTransport::Grpc => true,
            GatewayTransport::InProcess => false,
        }
    }

    /// For report headers: "gateway over tcp", "gateway in process".
    pub fn describe(self) -> &'static str {
        match self {
            GatewayTransport::Tcp => "gateway over tcp",
            GatewayTransport::Tls => "gateway over mutual TLS",
            GatewayTransport::Grpc => "gateway over gRPC (tree.TreeService, signed calls)",
            GatewayTransport::InProcess => "gateway in process (no wire)",
        }
    }
}

/// A service endpoint under load.
pub trait Target: Send + Sync + 'static {
    /// Sends `request` to the next node, round-robin.
    fn call(&self, request: Request) -> BoxFuture<'static, Response>;

    /// Sends `request` to the node `key` picks (`key` modulo the nodes):
    /// the calls of one sequence go to one node, which then reads what the
    /// sequence wrote before replication brings it elsewhere.
    fn call_at(&self, key: u64, request: Request) -> BoxFuture<'static, Response>;
}

/// In-process nodes, called directly (no network between the gateway and the
/// node, as in the reference run where the gateway side was mocked).
/// With several nodes, requests go round-robin. Each call runs on the
/// nodes' runtime (`on`), so that its CPU counts as the nodes'.
pub struct ServiceTarget {
    nodes: Vec<Arc<Service>>,
    on: tokio::runtime::Handle,
    next: AtomicUsize,
}

impl ServiceTarget {
    pub fn new(nodes: Vec<Arc<Service>>, on: tokio::runtime::Handle) -> Self {
        assert!(!nodes.is_empty(), "a target needs at least one node");
        Self {
            nodes,
            on,
            next: AtomicUsize::new(0),
        }
    }
}

impl Target for ServiceTarget {
    fn call(&self, request: Request) -> BoxFuture<'static, Response> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.call_at(i as u64, request)
    }

    fn call_at(&self, key: u64, request: Request) -> BoxFuture<'static, Response> {
        let node = self.nodes[(key % self.nodes.len() as u64) as usize].clone();
        let call = self
            .on
            .spawn(async move { node.handle(&Caller::Anonymous, request).await });
        Box::pin(async move {
            call.await.unwrap_or_else(|e| {
                Response::Error(arbor::Error::Network(format!("service call failed: {e}")))
            })
        })
    }
}

/// Requests sent through a transport (TCP, madsim endpoints) to replicas,
/// round-robin; a transport failure becomes an error response.
pub struct TransportTarget {
    transport: Arc<dyn Transport>,
    replicas: Vec<ReplicaId>,
    timeout: Duration,
    next: AtomicUsize,
}

impl TransportTarget {
    pub fn new(transport: Arc<dyn Transport>, replicas: Vec<ReplicaId>, timeout: Duration) -> Self {
        assert!(!replicas.is_empty(), "a target needs at least one replica");
        Self {
            transport,
            replicas,
            timeout,
            next: AtomicUsize::new(0),
        }
    }
}

impl Target for TransportTarget {
    fn call(&self, request: Request) -> BoxFuture<'static, Response> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.call_at(i as u64, request)
    }

    fn call_at(&self, key: u64, request: Request) -> BoxFuture<'static, Response> {
        let replica = self.replicas[(key % self.replicas.len() as u64) as usize];
        let call = self.transport.call(replica, request, self.timeout);
        Box::pin(async move { call.await.unwrap_or_else(Response::Error) })
    }
}

/// A transport for a node without peers: every call fails, which a node
/// with no peers never makes.
pub struct NoPeers;

impl Transport for NoPeers {
    fn call(
        &self,
        peer: ReplicaId,
        _request: Request,
        _timeout: Duration,
    ) -> BoxFuture<'static, Result<Response, Error>> {
        Box::pin(async move { Err(Error::Network(format!("no route to replica {peer}"))) })
    }
}
