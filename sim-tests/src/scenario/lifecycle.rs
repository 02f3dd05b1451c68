//! One lifecycle for every simulated run: boot the world, let the driver
//! run its workload and faults, heal, check, end. `run_seed`, the `sim`
//! fuzz target and the load evaluator's sim mode all go through it, so
//! they hold a cluster to the same checkers within the same deadlines.

use super::check::invariants::{InvariantSweep, Sweep};
use super::check::ledger::Ledger;
use super::check::{self, convergence, liveness};
use crate::disk::WeakDisk;
use crate::failure::{Failure, FailureKind};
use crate::world::supervisor::Supervisor;
use crate::world::{World, BOOT_DEADLINE};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Deadline of one client call (simulated).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Quiet time after healing, so batches and messages in flight land. A
/// chunk a lossy or clogged link held is retried up to 10 s apart
/// (`world/simnet.rs`): one sent before healing may land up to 10 s after
/// it. A push that lands after the sync round, of ops its sender dropped
/// since, would make a tree again on one replica alone, which only the
/// next sync round brings to the others.
pub const SETTLE: Duration = Duration::from_secs(12);

type Result<T = ()> = std::result::Result<T, Failure>;

/// Runs `body` in a fresh madsim runtime; then, with the runtime gone,
/// checks that no disk the body watched (`LeakProbe::watch`) outlived it.
/// madsim drops no pending task when its runtime goes: a task left waiting
/// would keep its whole world alive for the rest of the process.
pub fn run_in_runtime<T, F>(
    seed: u64,
    config: madsim::Config,
    time_limit: Option<Duration>,
    body: impl FnOnce(LeakProbe) -> F,
) -> (T, Result)
where
    F: Future<Output = T>,
{
    let probe = LeakProbe::default();
    let mut runtime = madsim::runtime::Runtime::with_seed_and_config(seed, config);
    if let Some(limit) = time_limit {
        runtime.set_time_limit(limit);
    }
    let out = runtime.block_on(body(probe.clone()));
    drop(runtime);
    (out, probe.check())
}

/// Weak handles on the disks of a run's world (see `run_in_runtime`).
#[derive(Clone, Default)]
pub struct LeakProbe(Arc<Mutex<Vec<WeakDisk>>>);

impl LeakProbe {
    pub fn watch(&self, world: &World) {
        self.0.lock().unwrap().extend(world.disk_probes());
    }

    fn check(&self) -> Result {
        let leaked = self
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|d| d.is_alive())
            .count();
        if leaked == 0 {
            return Ok(());
        }
        Err(Failure::new(
            FailureKind::Leak,
            format!("{leaked} simulated disk(s) outlived the run's runtime"),
        ))
    }
}

/// Every replica serves within `BOOT_DEADLINE`.
pub async fn boot(world: &World) -> Result {
    for replica in world.replica_ids() {
        if !world.wait_up(replica, BOOT_DEADLINE).await {
            return Err(Failure::new(
                FailureKind::Liveness,
                format!("replica-{replica} did not boot"),
            ));
        }
    }
    Ok(())
}

/// Ends every fault, lets the driver finish what it still has in flight
/// (`last_work`, which gives the ledger to check against), restarts what
/// is down or had disk errors, then holds the cluster to the checkers. A
/// failure seen while the faults ran comes first.
pub async fn heal_and_check(
    supervisor: &Arc<Supervisor>,
    last_work: impl Future<Output = Ledger>,
) -> Result {
    let (world, verdict) = (supervisor.world(), supervisor.verdict());
    world.trace.record("world", "heal everything");
    supervisor.end_faults();
    let ledger = last_work.await;
    supervisor.restart_all().await?;
    verdict.result()?;
    check(world, &ledger).await?;
    verdict.result()
}

/// The checks of a healed cluster: the tree invariant everywhere;
/// convergence by sync alone (when sync is configured) and then by push,
/// each followed by the checkpoint checkers; nobody left waiting.
async fn check(world: &World, ledger: &Ledger) -> Result {
    InvariantSweep::default().check(world, Sweep::Full)?;
    let checkers = check::standard();
    if world.sync_configured() {
        // Sync must converge the cluster on its own: pushes are blocked
        // before the quiet period, so no push in flight can help.
        convergence::block_pushes(world);
        madsim::time::sleep(SETTLE).await;
        liveness::client_requests_end(world).await?;
        convergence::sync_converges(world, ledger, &checkers).await?;
    } else {
        madsim::time::sleep(SETTLE).await;
        liveness::client_requests_end(world).await?;
    }
    convergence::push_converges(world, ledger, &checkers).await?;
    check::answers::count_situations(world)?;
    liveness::nobody_waits(world).await
}

/// Ends the world: the supervisor's pending tasks are aborted and every
/// replica is killed, and each must drop its forest (`World::shut_down`).
pub async fn end(supervisor: &Supervisor) -> Result {
    supervisor.abort_detached();
    let lingering = supervisor.world().shut_down().await;
    if lingering.is_empty() {
        return Ok(());
    }
    Err(Failure::new(
        FailureKind::Leak,
        format!("replicas {lingering:?} still hold their forest after the final kill"),
    ))
}
