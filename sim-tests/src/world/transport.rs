//! What the simulated network carries besides bytes: the handlers that
//! answer a node's requests (the service, counted and watched), and the
//! message filter, a middlebox that drops chosen request kinds between
//! chosen replicas and notes the pushes and pulls it sees. The bytes
//! themselves go over the engine's own TCP stack on madsim's streams
//! (`simnet`).

use arbor::proto::{Request, Response};
use arbor::runtime::BoxFuture;
use arbor::{Caller, ReplicaId};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Something that answers requests: a node's service, or a test double.
pub trait Handler: Send + Sync + 'static {
    /// Answers `request` from `caller`, as the network identified it.
    fn serve(self: Arc<Self>, caller: Caller, request: Request) -> BoxFuture<'static, Response>;
}

impl Handler for arbor::service::Service {
    fn serve(self: Arc<Self>, caller: Caller, request: Request) -> BoxFuture<'static, Response> {
        Box::pin(async move { arbor::service::Service::handle(&self, &caller, request).await })
    }
}

/// A handler that counts the client requests it is serving. A client that
/// timed out leaves its request running on the server (a `Drop` waiting
/// for its locks, say), and such a request may still change the replica:
/// the checks of a healed cluster wait until none is left.
pub struct Counted {
    pub inner: Arc<dyn Handler>,
    pub serving: Arc<AtomicU64>,
}

impl Handler for Counted {
    fn serve(self: Arc<Self>, caller: Caller, request: Request) -> BoxFuture<'static, Response> {
        if let Caller::Peer(_) = caller {
            return self.inner.clone().serve(caller, request);
        }
        let serving = super::supervisor::InFlight::enter(&self.serving);
        let answer = self.inner.clone().serve(caller, request);
        Box::pin(async move {
            let response = answer.await;
            drop(serving);
            response
        })
    }
}

/// A service whose answers an `AnswerWatch` sees before they leave.
pub struct Watched {
    pub replica: ReplicaId,
    pub service: Arc<arbor::service::Service>,
    pub watch: Arc<dyn super::hooks::AnswerWatch>,
}

impl Handler for Watched {
    fn serve(self: Arc<Self>, caller: Caller, request: Request) -> BoxFuture<'static, Response> {
        Box::pin(async move {
            let seen = self.watch.wants(&self.service, &caller, &request);
            let response = self.service.handle(&caller, request).await;
            if let Some(seen) = seen {
                let watch = &self.watch;
                watch.answered(self.replica, &self.service, &caller, seen, &response);
            }
            response
        })
    }
}

/// The kind of a request, for selective message faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RequestKind {
    /// Replication pushes (`Apply`).
    Push,
    /// Sync pulls (`GetOpLogStamps`, `GetOpLog`).
    Pull,
    /// Everything else.
    Other,
}

impl RequestKind {
    pub fn of(request: &Request) -> Self {
        match request {
            Request::Apply { .. } => RequestKind::Push,
            Request::GetOpLog { .. } | Request::GetOpLogStamps { .. } => RequestKind::Pull,
            _ => RequestKind::Other,
        }
    }
}

/// Most replica-to-replica calls a world remembers for the timeline.
pub const WIRE_CALLS_MAX: usize = 50_000;

/// One push or sync pull a replica started, for the timeline; not part
/// of the trace or its fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireCall {
    pub at: Duration,
    pub from: ReplicaId,
    pub to: ReplicaId,
    pub kind: RequestKind,
    /// The filter dropped it.
    pub dropped: bool,
}

/// Drops chosen request kinds between chosen replicas: a middlebox that
/// loses one message type, which the network layer alone cannot express.
/// It also notes the pushes and pulls it sees (`WireCall`).
#[derive(Debug, Default)]
pub struct MessageFilter {
    blocked: Mutex<BTreeMap<(ReplicaId, ReplicaId, RequestKind), ()>>,
    calls: Mutex<Vec<WireCall>>,
}

impl MessageFilter {
    /// Notes a push or pull between replicas, up to `WIRE_CALLS_MAX`.
    fn note(&self, from: ReplicaId, to: ReplicaId, kind: RequestKind, dropped: bool) {
        if from == 0 || kind == RequestKind::Other {
            return;
        }
        let mut calls = self.calls.lock().unwrap();
        if calls.len() < WIRE_CALLS_MAX {
            let at = crate::world::clock::global_now();
            calls.push(WireCall {
                at,
                from,
                to,
                kind,
                dropped,
            });
        }
    }

    /// Whether `request` from `from` to `to` is blocked, noted as a
    /// call either way.
    pub(crate) fn stops(&self, from: ReplicaId, to: ReplicaId, request: &Request) -> bool {
        let kind = RequestKind::of(request);
        let blocked = self.is_blocked(from, to, kind);
        self.note(from, to, kind, blocked);
        blocked
    }

    /// The pushes and pulls noted so far.
    pub fn calls(&self) -> Vec<WireCall> {
        self.calls.lock().unwrap().clone()
    }

    pub fn block(&self, from: ReplicaId, to: ReplicaId, kind: RequestKind) {
        self.blocked.lock().unwrap().insert((from, to, kind), ());
    }

    pub fn unblock(&self, from: ReplicaId, to: ReplicaId, kind: RequestKind) {
        self.blocked.lock().unwrap().remove(&(from, to, kind));
    }

    pub fn unblock_all(&self) {
        self.blocked.lock().unwrap().clear();
    }

    pub fn is_blocked(&self, from: ReplicaId, to: ReplicaId, kind: RequestKind) -> bool {
        self.blocked.lock().unwrap().contains_key(&(from, to, kind))
    }
}
