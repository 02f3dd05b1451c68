//! Observers a scenario sets on every incarnation of every replica: one
//! sees each answer the moment the service gives it (before it leaves the
//! node), the other each pull pass once it ended. The world only carries
//! them; what they check is the scenario's business.

use crate::coverage::CoverageCounter;
use arbor::forest::Forest;
use arbor::proto::{Request, Response};
use arbor::service::{PullObserver, PullPass, Service};
use arbor::{Caller, ReplicaId};
use std::sync::{Arc, Mutex};

/// Sees an answer right after `Service::handle` gave it. A read's answer
/// was computed from the replica's state at some moment of the call: a
/// read that spent simulated disk time slept after its work, and commits
/// may have landed meanwhile, so `Seen` carries what the watch noted of
/// the replica before the call.
pub trait AnswerWatch: Send + Sync {
    /// `Some` when `answered` wants to see this request, with what the
    /// watch notes of `service` before the call.
    fn wants(&self, service: &Service, caller: &Caller, request: &Request) -> Option<Seen>;
    fn answered(
        &self,
        replica: ReplicaId,
        service: &Service,
        caller: &Caller,
        seen: Seen,
        response: &Response,
    );
    /// The replica's disk was destroyed: what was learnt of its state
    /// (logs, sessions) is void; a new database may reuse tree numbers.
    fn disk_replaced(&self, _replica: ReplicaId) {}
}

/// A request an `AnswerWatch` follows, and the (incarnation, next height)
/// of the tree it reads as they were before the call.
pub struct Seen {
    pub request: Request,
    pub before: Option<(Option<u64>, u64)>,
}

/// Sees every pull pass of a replica once it ended.
pub trait PullWatch: Send + Sync {
    fn pass_ended(&self, puller: ReplicaId, forest: &Arc<Forest>, pass: &PullPass);
    /// The replica's disk was destroyed (see `AnswerWatch::disk_replaced`).
    fn disk_replaced(&self, _replica: ReplicaId) {}
}

/// The observers of a world, set before it boots, and the run's coverage
/// counters, which they and the checkers add to.
#[derive(Default)]
pub struct Hooks {
    answers: Mutex<Option<Arc<dyn AnswerWatch>>>,
    pulls: Mutex<Option<Arc<dyn PullWatch>>>,
    pub coverage: CoverageCounter,
}

impl Hooks {
    pub fn watch_answers(&self, watch: Arc<dyn AnswerWatch>) {
        *self.answers.lock().unwrap() = Some(watch);
    }

    pub fn watch_pulls(&self, watch: Arc<dyn PullWatch>) {
        *self.pulls.lock().unwrap() = Some(watch);
    }

    /// Drops both observers (they may hold the world's parts).
    pub fn clear(&self) {
        self.answers.lock().unwrap().take();
        self.pulls.lock().unwrap().take();
    }

    pub fn answers(&self) -> Option<Arc<dyn AnswerWatch>> {
        self.answers.lock().unwrap().clone()
    }

    /// Tells both observers that the replica's disk was destroyed.
    pub fn disk_replaced(&self, replica: ReplicaId) {
        if let Some(watch) = self.answers() {
            watch.disk_replaced(replica);
        }
        let pulls = self.pulls.lock().unwrap().clone();
        if let Some(watch) = pulls {
            watch.disk_replaced(replica);
        }
    }

    /// Hands a freshly started service its pull observer, if any.
    pub fn attach_pulls(&self, replica: ReplicaId, service: &Service) {
        let Some(watch) = self.pulls.lock().unwrap().clone() else {
            return;
        };
        service.observe_pulls(Arc::new(NodePulls {
            replica,
            forest: service.forest().clone(),
            watch,
        }));
    }
}

/// The engine's pull observer of one incarnation.
struct NodePulls {
    replica: ReplicaId,
    forest: Arc<Forest>,
    watch: Arc<dyn PullWatch>,
}

impl PullObserver for NodePulls {
    fn pass_ended(&self, pass: &PullPass) {
        self.watch.pass_ended(self.replica, &self.forest, pass);
    }
}
