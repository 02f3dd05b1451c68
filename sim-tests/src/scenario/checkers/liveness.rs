//! Liveness: a healed cluster goes idle within a bounded simulated time,
//! and no caller is left waiting for an answer.

use crate::failure::{Failure, FailureKind};
use crate::world::clock::global_now;
use crate::world::World;
use arbor::ReplicaId;
use std::time::Duration;

/// How long a healed cluster may take to push everything (simulated).
pub const CONVERGENCE_DEADLINE: Duration = Duration::from_secs(120);
const IDLE_POLL: Duration = Duration::from_millis(50);

type Result<T = ()> = std::result::Result<T, Failure>;

/// Waits until every replica reports `replication_idle`, at most
/// `CONVERGENCE_DEADLINE`.
pub async fn replication_goes_idle(world: &World) -> Result {
    let deadline = global_now() + CONVERGENCE_DEADLINE;
    loop {
        let busy: Vec<ReplicaId> = world
            .nodes
            .iter()
            .filter(|n| n.service().is_none_or(|s| !s.replication_idle()))
            .map(|n| n.replica_id)
            .collect();
        if busy.is_empty() {
            return Ok(());
        }
        if global_now() >= deadline {
            return Err(Failure::new(
                FailureKind::Liveness,
                format!("replication not idle on {busy:?} within {CONVERGENCE_DEADLINE:?} after healing"),
            ));
        }
        madsim::time::sleep(IDLE_POLL).await;
    }
}

/// No caller of any replica is still waiting for a batch.
pub fn nobody_waits(world: &World) -> Result {
    for node in &world.nodes {
        let Some(service) = node.service() else {
            continue;
        };
        let pending = service.stats().pending_writes;
        if pending != 0 {
            return Err(Failure::new(
                FailureKind::HungCallers,
                format!(
                    "{} still has {pending} writes pending on an idle cluster",
                    node.name
                ),
            ));
        }
    }
    Ok(())
}

/// A replica whose inbound traffic stopped `waited` ago (the drain before
/// a supervised restart after disk errors) has answered every caller.
pub fn drained(replica: ReplicaId, pending: u64, waited: Duration) -> Result {
    if pending == 0 {
        return Ok(());
    }
    Err(Failure::new(
        FailureKind::HungCallers,
        format!("replica-{replica} still has {pending} writes pending {waited:?} after its inbound traffic stopped (disk errors before)"),
    ))
}
