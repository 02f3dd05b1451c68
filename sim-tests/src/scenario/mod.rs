//! One seed in, one verdict out: builds the world the seed describes, runs
//! the object-gateway workload under the seed's faults, heals, and checks.

pub mod checkers;
pub mod ledger;
pub mod nemesis;
pub mod swarm;
pub mod workload;

use crate::disk::DiskConfig;
use crate::failure::{Failure, FailureKind, Verdict};
use crate::trace::{Event, Trace};
use crate::world::supervisor::Supervisor;
use crate::world::{cluster_configs_with, World, BOOT_DEADLINE};
use arbor::canary::Canary;
use arbor::config::ContainerConfig;
use arbor::{ContainerId, ReplicaId};
use checkers::invariants::{InvariantSweep, Sweep};
use checkers::{convergence, liveness};
use nemesis::Nemesis;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use swarm::{Profile, Size, Swarm};
use workload::Workload;

/// Deadline of one client call (simulated).
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Quiet time after healing, so batches and messages in flight land.
const SETTLE: Duration = Duration::from_secs(3);
/// Simulated time beyond the workload after which a run is declared hung.
const RUN_TIME_LIMIT_EXTRA: Duration = Duration::from_secs(900);

/// How to run a seed.
#[derive(Clone, Debug)]
pub struct Options {
    pub profile: Profile,
    pub size: Size,
    pub faults: bool,
    /// The planted bug switched on for this run (process-wide).
    pub canary: Option<Canary>,
    /// Print every trace event through `tracing` (replay).
    pub echo_trace: bool,
}

impl Options {
    pub fn standard() -> Self {
        Self {
            profile: Profile::Standard,
            size: Size::STANDARD,
            faults: true,
            canary: None,
            echo_trace: false,
        }
    }

    pub fn test() -> Self {
        Self {
            size: Size::TEST,
            ..Self::standard()
        }
    }
}

/// The verdict and the numbers of one run.
#[derive(Clone, Debug)]
pub struct Report {
    pub seed: u64,
    pub swarm: Swarm,
    pub canary: Option<Canary>,
    pub failure: Option<Failure>,
    pub trace_hash: u64,
    pub events: Vec<Event>,
    pub ops_sent: u64,
    pub ops_acked: u64,
    pub faults_injected: u64,
    pub simulated: Duration,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }

    /// The `cargo test` command that replays this run (the test binary
    /// and test that ran it pick the scenario; the seed comes from the env).
    pub fn test_replay_command(&self) -> String {
        match self.canary {
            Some(canary) => format!(
                "MADSIM_TEST_SEED={} cargo test -p arbor-sim --test canary -- {} --nocapture",
                self.seed,
                canary_test_name(canary)
            ),
            // The test runs the test-sized scenario unless told otherwise,
            // so a seed found by a full-size sweep names its size.
            None => format!(
                "MADSIM_TEST_SEED={}{} cargo test -p arbor-sim --test sim -- standard_seeds --nocapture",
                self.seed,
                if self.swarm.size == Size::TEST {
                    ""
                } else {
                    " ARBOR_SIM_SIZE=standard"
                }
            ),
        }
    }

    /// The CLI command that replays this run with a readable trace.
    pub fn replay_commands(&self) -> String {
        let canary = self
            .canary
            .map(|c| format!(" --canary {c:?}"))
            .unwrap_or_default();
        let profile = match self.swarm.profile {
            Profile::Standard => String::new(),
            other => format!(" --profile {}", other.name()),
        };
        let size = if self.swarm.size == Size::TEST {
            " --small"
        } else {
            ""
        };
        format!(
            "cargo run --release -p arbor-sim -- replay --seed {}{profile}{canary}{size}",
            self.seed
        )
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.failure {
            None => writeln!(f, "seed {} passed", self.seed)?,
            Some(failure) => writeln!(f, "seed {} FAILED: {failure}", self.seed)?,
        }
        writeln!(f, "{}", self.swarm)?;
        writeln!(
            f,
            "ops sent {}, acked {}, faults {}, simulated {:?}, trace {:016x} ({} events)",
            self.ops_sent,
            self.ops_acked,
            self.faults_injected,
            self.simulated,
            self.trace_hash,
            self.events.len()
        )?;
        if self.failure.is_some() {
            writeln!(f, "last events:")?;
            let start = self.events.len().saturating_sub(15);
            for event in &self.events[start..] {
                writeln!(f, "  {event}")?;
            }
            writeln!(f, "replay: {}", self.replay_commands())?;
            writeln!(f, "    or: {}", self.test_replay_command())?;
        }
        Ok(())
    }
}

/// The name of the test in tests/canary.rs that covers a canary.
pub fn canary_test_name(canary: Canary) -> &'static str {
    match canary {
        Canary::ReplicationDropsOnFullQueue => "replication_drops_on_full_queue",
        Canary::SharedSyncCursor => "shared_sync_cursor",
        Canary::StaleUndoOnRedo => "stale_undo_on_redo",
        Canary::OldOpWrongPosition => "old_op_wrong_position",
        Canary::FailedBatchHangs => "failed_batch_hangs",
        Canary::SyncDropsTreeOnPeerError => "sync_drops_tree_on_peer_error",
        Canary::PathByArrivalOrder => "path_by_arrival_order",
    }
}

/// The containers of the workload and their replica sets: with four
/// replicas the second container lives on three of them only.
fn replica_sets(replicas: usize) -> Vec<(ContainerId, Vec<ReplicaId>)> {
    let all: Vec<ReplicaId> = (1..=replicas as ReplicaId).collect();
    workload::containers()
        .into_iter()
        .enumerate()
        .map(|(i, cid)| {
            let set = if i == 1 && replicas > 3 {
                all[..3].to_vec()
            } else {
                all.clone()
            };
            (cid, set)
        })
        .collect()
}

#[derive(Default)]
struct Tally {
    ops_sent: u64,
    ops_acked: u64,
}

/// Runs one seed in its own madsim runtime and reports the verdict. A
/// panic inside the simulation (a broken engine assertion) is a failure.
pub fn run_seed(seed: u64, options: &Options) -> Report {
    let swarm = Swarm::draw(seed, options.profile, options.size, options.faults);
    let trace = Trace::new(options.echo_trace);
    let tally = Arc::new(Mutex::new(Tally::default()));
    let faults = Arc::new(AtomicU64::new(0));
    let simulated = Arc::new(Mutex::new(Duration::ZERO));
    let disks = Arc::new(Mutex::new(Vec::new()));
    // Process-wide: every run of a sweep sets the same value, so parallel
    // runs agree; runs with different canaries must not overlap.
    arbor::canary::set(options.canary);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let mut runtime =
            madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
        runtime.set_time_limit(swarm.size.workload_duration + RUN_TIME_LIMIT_EXTRA);
        let (swarm, trace, tally, faults, simulated, disks) = (
            swarm.clone(),
            trace.clone(),
            tally.clone(),
            faults.clone(),
            simulated.clone(),
            disks.clone(),
        );
        runtime.block_on(async move {
            let verdict = simulate(&swarm, &trace, &tally, &faults, &disks).await;
            *simulated.lock().unwrap() = crate::world::clock::global_now();
            verdict
        })
    }));
    let mut failure = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(failure)) => Some(failure),
        Err(panic) => Some(Failure::new(FailureKind::Panic, panic_message(&panic))),
    };
    // The runtime is gone: whatever still holds a disk is a task or a
    // cycle that outlived it, and would hold it for the rest of a sweep.
    let leaked = disks
        .lock()
        .unwrap()
        .iter()
        .filter(|d| d.is_alive())
        .count();
    if failure.is_none() && leaked > 0 {
        failure = Some(Failure::new(
            FailureKind::Leak,
            format!("{leaked} simulated disk(s) outlived the run's runtime"),
        ));
    }
    let tally = tally.lock().unwrap();
    let simulated = *simulated.lock().unwrap();
    Report {
        seed,
        swarm,
        canary: options.canary,
        failure,
        trace_hash: trace.hash(),
        events: trace.events(),
        ops_sent: tally.ops_sent,
        ops_acked: tally.ops_acked,
        faults_injected: faults.load(Ordering::Relaxed),
        simulated,
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".into()
    }
}

fn build_world(swarm: &Swarm, trace: &Trace) -> World {
    let containers: Vec<ContainerConfig> = replica_sets(swarm.replicas)
        .into_iter()
        .map(|(cid, replicas)| ContainerConfig { cid, replicas })
        .collect();
    let mut configs = cluster_configs_with(swarm.replicas, &swarm.knobs, &containers);
    for config in &mut configs {
        config.pilorama.replicated_batch_delay = swarm.replicated_batch_delay;
    }
    let disk_config = |i: usize| {
        let mut config = DiskConfig::reliable(swarm.seed.wrapping_mul(31).wrapping_add(i as u64));
        config.latency = swarm.disk_latency;
        config.faults.torn_write_probability = swarm.torn_write_probability;
        config
    };
    World::build_on_disks(configs, &swarm.skews, disk_config, trace.clone())
}

async fn simulate(
    swarm: &Swarm,
    trace: &Trace,
    tally: &Mutex<Tally>,
    faults: &Arc<AtomicU64>,
    disk_probes: &Mutex<Vec<crate::disk::WeakDisk>>,
) -> Result<(), Failure> {
    let mut world = build_world(swarm, trace);
    disk_probes.lock().unwrap().extend(world.disk_probes());
    let clients: Vec<_> = (0..swarm.size.clients).map(|_| world.client()).collect();
    let world = Arc::new(world);
    for replica in world.replica_ids() {
        if !world.wait_up(replica, BOOT_DEADLINE).await {
            return Err(Failure::new(
                FailureKind::Liveness,
                format!("replica-{replica} did not boot"),
            ));
        }
    }
    let verdict = Verdict::new(trace.clone());
    let supervisor = Supervisor::new(world.clone(), verdict.clone());
    let workload = Arc::new(Workload::new(world.clone(), verdict, CALL_TIMEOUT));
    let nemesis = Nemesis::new(supervisor.clone(), workload.clone(), swarm.clone());
    run_workload(swarm, &workload, &nemesis, clients).await;
    let result = heal_and_check(swarm, &supervisor, &workload).await;
    faults.store(nemesis.faults_injected(), Ordering::Relaxed);
    supervisor.abort_detached();
    let lingering = world.shut_down().await;
    assert!(
        lingering.is_empty(),
        "replicas {lingering:?} still hold their forest after the final kill"
    );
    let ledger = workload.ledger.lock().unwrap();
    let mut t = tally.lock().unwrap();
    t.ops_sent = ledger.ops_sent;
    t.ops_acked = ledger.ops_acked;
    result
}

async fn run_workload(
    swarm: &Swarm,
    workload: &Arc<Workload>,
    nemesis: &Arc<Nemesis>,
    clients: Vec<crate::world::Client>,
) {
    let deadline = crate::world::clock::global_now() + swarm.size.workload_duration;
    let ops_per_client = swarm.size.ops_total / swarm.size.clients as u64;
    // Closed-loop clients: think time spreads each client's ops over the
    // run, leaving room for the calls themselves.
    let think_mean = swarm.size.workload_duration.mul_f64(0.6) / ops_per_client.max(1) as u32;
    let mut tasks = Vec::new();
    for client in clients {
        let workload = workload.clone();
        tasks.push(madsim::task::spawn(workload::run_client(
            workload,
            client,
            ops_per_client,
            think_mean,
        )));
    }
    if let Some(window) = swarm.opening_partition {
        nemesis.clone().opening_partition(window);
    }
    let strikes = madsim::task::spawn(nemesis.clone().run(deadline));
    for task in tasks {
        let _ = task.await;
    }
    let _ = strikes.await;
}

async fn heal_and_check(
    swarm: &Swarm,
    supervisor: &Arc<Supervisor>,
    workload: &Arc<Workload>,
) -> Result<(), Failure> {
    let world = supervisor.world();
    world.trace.record("world", "heal everything");
    supervisor.end_faults();
    supervisor.restart_all().await?;
    workload.verdict.result()?;
    InvariantSweep::default().check(world, Sweep::Full)?;
    let ledger = workload.ledger.lock().unwrap().clone();
    let checkers = checkers::standard();
    if swarm.knobs.sync_interval.is_some() {
        // Sync must converge the cluster on its own: pushes are blocked
        // before the quiet period, so no push in flight can help.
        convergence::block_pushes(world);
        madsim::time::sleep(SETTLE).await;
        convergence::sync_converges(world, &ledger, &checkers).await?;
    } else {
        madsim::time::sleep(SETTLE).await;
    }
    convergence::push_converges(world, &ledger, &checkers).await?;
    liveness::nobody_waits(world)?;
    workload.verdict.result()
}
