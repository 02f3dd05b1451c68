//! The engine's view of the network: a request/response call to a peer with
//! a deadline. Production uses TCP (`tcp`); the simulator uses madsim
//! endpoints. The service never knows which.

use crate::error::Error;
use crate::proto::{Request, Response};
use crate::runtime::BoxFuture;
use crate::types::ReplicaId;
use std::time::Duration;

/// Calls to other replicas, addressed by their stable replica id.
pub trait Transport: Send + Sync + 'static {
    /// Sends `request` to `peer` and waits for its response at most
    /// `timeout`. Transport failures (unreachable, timeout, bad frame) are
    /// errors; an application error arrives as `Response::Error`.
    fn call(
        &self,
        peer: ReplicaId,
        request: Request,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Response, Error>>;

    /// Connections this transport refused to use because the other end
    /// was not the replica it dialled (docs/design.md §9); 0 for a
    /// transport that authenticates nothing itself.
    fn identities_refused(&self) -> u64 {
        0
    }
}

/// A byte stream a connection runs over: plain TCP, TLS over TCP, or a
/// simulated stream.
pub trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for S {}

/// Opens stream connections: tokio sockets in production
/// (`system::TokioNet`), simulated ones in the simulator. `tcp` dials only
/// through this, so the same framing, pool and checks run in both.
pub trait Net: Send + Sync + 'static {
    /// Connects to `address` (host:port); no timeout of its own.
    fn connect(&self, address: String) -> BoxFuture<'static, std::io::Result<Box<dyn Stream>>>;
}

/// Accepts stream connections for a `tcp::Server`.
pub trait Listener: Send + Sync + 'static {
    /// The next connection and where it came from.
    fn accept(&self) -> BoxFuture<'_, std::io::Result<(Box<dyn Stream>, std::net::SocketAddr)>>;

    fn local_addr(&self) -> std::io::Result<std::net::SocketAddr>;

    /// Who a plaintext connection from `remote` is before it says `Hello`.
    /// A socket listener knows nothing of it (`Anonymous`); a network that
    /// delivers only from the address a machine has (the simulator's) may
    /// name the caller by it, as a client certificate would over TLS. The
    /// caller's `Hello` is then checked against that name.
    fn caller(&self, _remote: std::net::SocketAddr) -> crate::identity::Caller {
        crate::identity::Caller::Anonymous
    }
}
