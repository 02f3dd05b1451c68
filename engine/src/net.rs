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
