//! The tree service: validation, the batcher, replication and background
//! sync around one forest (issue 3).
//!
//! SKELETON: the signatures below are the contract the simulator and the load
//! evaluator drive. Bodies are filled in by issue 3.

use crate::config::Config;
use crate::error::Result;
use crate::forest::Forest;
use crate::net::Transport;
use crate::proto::{Request, Response};
use crate::runtime::Env;
use std::sync::Arc;

/// Counters a node exposes (checkers, load reports).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceStats {
    pub writes_committed: u64,
    pub batches_committed: u64,
    pub batches_failed: u64,
    pub writes_rejected_overload: u64,
    pub ops_pushed: u64,
    pub ops_pulled: u64,
    pub sync_rounds: u64,
}

/// One running node of the tree service.
pub struct Service {
    _private: (),
}

impl Service {
    /// Starts the batcher, replication and (if configured) background sync
    /// on `env`, serving `forest`. Peers are reached through `transport`.
    pub fn start(
        _config: Config,
        _forest: Arc<Forest>,
        _env: Env,
        _transport: Arc<dyn Transport>,
    ) -> Result<Arc<Service>> {
        todo!()
    }

    /// Answers one request; errors are `Response::Error`.
    pub async fn handle(&self, _request: Request) -> Response {
        todo!()
    }

    /// Runs one full background-sync round now (every tree, every peer),
    /// whether or not periodic sync is enabled.
    pub async fn sync_now(&self) {
        todo!()
    }

    /// True when every locally stored op has been acknowledged by every peer
    /// that should receive it.
    pub fn replication_idle(&self) -> bool {
        todo!()
    }

    pub fn stats(&self) -> ServiceStats {
        todo!()
    }

    pub fn forest(&self) -> &Arc<Forest> {
        todo!()
    }

    /// Stops background work; in-flight callers get `ShuttingDown`.
    pub fn shutdown(&self) {
        todo!()
    }
}
