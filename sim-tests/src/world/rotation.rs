//! Which replicas clients call: a gateway takes a replica out of rotation
//! while it is known to be misconfigured (its health check names another
//! replica) and puts it back once it is restored. Every client call of the
//! world counts here while in flight, so the scenario can wait until no
//! caller still talks to a replica it is about to replace.

use arbor::ReplicaId;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct Rotation {
    out: Mutex<BTreeSet<ReplicaId>>,
    in_flight: Mutex<BTreeMap<ReplicaId, u64>>,
}

impl Rotation {
    pub fn take_out(&self, replica: ReplicaId) {
        self.out.lock().unwrap().insert(replica);
    }

    pub fn put_back(&self, replica: ReplicaId) {
        self.out.lock().unwrap().remove(&replica);
    }

    pub fn is_out(&self, replica: ReplicaId) -> bool {
        self.out.lock().unwrap().contains(&replica)
    }

    /// Client calls to `replica` not yet answered or timed out.
    pub fn in_flight(&self, replica: ReplicaId) -> u64 {
        self.in_flight
            .lock()
            .unwrap()
            .get(&replica)
            .copied()
            .unwrap_or(0)
    }

    /// Counts one call to `replica` for as long as the guard lives.
    pub fn enter(self: &Arc<Self>, replica: ReplicaId) -> CallGuard {
        *self.in_flight.lock().unwrap().entry(replica).or_default() += 1;
        CallGuard {
            rotation: self.clone(),
            replica,
        }
    }
}

/// One client call in flight.
pub struct CallGuard {
    rotation: Arc<Rotation>,
    replica: ReplicaId,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let mut in_flight = self.rotation.in_flight.lock().unwrap();
        let count = in_flight
            .get_mut(&self.replica)
            .expect("a call in flight was counted");
        assert!(*count > 0, "calls in flight went below zero");
        *count -= 1;
    }
}
