//! Liveness: a healed cluster goes idle within a bounded simulated time,
//! and no caller is left waiting for an answer. That a replica drained
//! before a restart answered every caller is the supervisor's own check
//! (`world::supervisor::drained`).

use crate::failure::{Failure, FailureKind};
use crate::world::clock::global_now;
use crate::world::{SimNode, World};
use arbor::ReplicaId;
use std::time::Duration;

/// How long a healed cluster may take to push everything (simulated).
pub const CONVERGENCE_DEADLINE: Duration = Duration::from_secs(120);
const IDLE_POLL: Duration = Duration::from_millis(50);

type Result<T = ()> = std::result::Result<T, Failure>;

/// Polls `busy` until it names nothing, at most `deadline` (simulated)
/// from now; `Err` with what it named last when time is up.
async fn until_none<T>(
    deadline: Duration,
    mut busy: impl FnMut() -> Vec<T>,
) -> std::result::Result<(), Vec<T>> {
    let end = global_now() + deadline;
    loop {
        let named = busy();
        if named.is_empty() {
            return Ok(());
        }
        if global_now() >= end {
            return Err(named);
        }
        madsim::time::sleep(IDLE_POLL).await;
    }
}

/// The nodes whose `count` is non-zero, each named by `label`, with it
/// (`None`: nothing to count there).
fn nonzero<T>(
    world: &World,
    label: impl Fn(&SimNode) -> T,
    count: impl Fn(&SimNode) -> Option<u64>,
) -> Vec<(T, u64)> {
    (world.nodes.iter())
        .filter_map(|n| count(n).filter(|&c| c != 0).map(|c| (label(n), c)))
        .collect()
}

/// Waits until every replica reports `replication_idle`, at most
/// `CONVERGENCE_DEADLINE`.
pub async fn replication_goes_idle(world: &World) -> Result {
    let busy = || {
        world
            .nodes
            .iter()
            .filter(|n| n.service().is_none_or(|s| !s.replication_idle()))
            .map(|n| n.replica_id)
            .collect::<Vec<ReplicaId>>()
    };
    until_none(CONVERGENCE_DEADLINE, busy).await.map_err(|busy| {
        Failure::new(
            FailureKind::Liveness,
            format!("replication not idle on {busy:?} within {CONVERGENCE_DEADLINE:?} after healing"),
        )
    })
}

/// How long a healed replica may go on serving client requests whose
/// callers gave up (simulated).
pub const CLIENT_REQUESTS_DEADLINE: Duration = Duration::from_secs(60);

/// Waits until no replica serves a client request any more, at most
/// `CLIENT_REQUESTS_DEADLINE`. A request whose caller timed out still runs
/// on its replica and may change it later: a `Drop` that waits for its
/// locks behind a pass can run after the check's sync round brought the
/// tree back, leaving that replica apart until the next round. The ledger
/// already lets such a drop run at any later time (docs/design.md §6); the
/// checks of convergence start once it ran.
pub async fn client_requests_end(world: &World) -> Result {
    let serving = || {
        nonzero(
            world,
            |n| n.replica_id,
            |n| Some(n.client_requests_serving()),
        )
    };
    until_none(CLIENT_REQUESTS_DEADLINE, serving).await.map_err(|serving| {
        Failure::new(
            FailureKind::Liveness,
            format!("client requests still served (replica, count) {serving:?} {CLIENT_REQUESTS_DEADLINE:?} after healing"),
        )
    })
}

/// How long the last check waits for writes still pending: over TCP a
/// replicated request its pusher gave up on can still arrive after the
/// cluster went idle (madsim retries a chunk a clogged link held, up to
/// 10 s apart) and then waits for its batch.
pub const PENDING_WRITES_DEADLINE: Duration = Duration::from_secs(15);

/// No caller of any replica is still waiting for a batch, once writes that
/// were still arriving have had `PENDING_WRITES_DEADLINE` to finish. A
/// write that never finishes stays pending.
pub async fn nobody_waits(world: &World) -> Result {
    let pending = || {
        let pending_writes = |n: &SimNode| Some(n.service()?.stats().pending_writes);
        nonzero(world, |n| n.name.clone(), pending_writes)
    };
    until_none(PENDING_WRITES_DEADLINE, pending)
        .await
        .map_err(|pending| {
            let (name, count) = &pending[0];
            Failure::new(
                FailureKind::HungCallers,
                format!(
                    "{name} still has {count} writes pending on an idle cluster \
                     {PENDING_WRITES_DEADLINE:?} after its checks"
                ),
            )
        })
}
