//! One seed in, one verdict out: builds the world the seed describes, runs
//! the object-gateway workload under the seed's faults, heals, and checks.
//!
//! By concern: `plan` is what a run reads (the configuration the seed
//! draws, its faults and its clients' op streams); `workload` the clients
//! (the object gateway and the intruder); `nemesis` what strikes the
//! cluster meanwhile (crashes, partitions, disk errors, membership
//! changes, replaced disks, a replica id twice); `check` what the run is
//! held to (the ledger, the checkers, the answer oracle, each profile's
//! claims); `lifecycle` the boot, heal, check and end every simulated run
//! shares; `capsule` a run kept in a file, replayed and shrunk. This
//! module ties them together for one seed.

pub mod capsule;
pub mod check;
pub mod lifecycle;
pub mod nemesis;
pub mod plan;
pub mod workload;

use crate::coverage;
use crate::disk::DiskConfig;
use crate::failure::{Failure, FailureKind, Verdict};
use crate::trace::{Event, Trace};
use crate::world::supervisor::Supervisor;
use crate::world::transport::WireCall;
use crate::world::{cluster_configs_with, Network, World};
use arbor::canary::Canary;
use arbor::config::ContainerConfig;
use arbor::{ContainerId, ReplicaId};
use lifecycle::{LeakProbe, CALL_TIMEOUT};
use nemesis::Nemesis;
use plan::swarm::{Profile, Size, Swarm};
use plan::Plan;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;
use workload::Workload;

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
    /// How the world's nodes reach each other. A run's trace, and so its
    /// fingerprint, depends on it; a capsule records it.
    pub network: Network,
}

impl Options {
    pub fn standard() -> Self {
        Self {
            profile: Profile::Standard,
            size: Size::STANDARD,
            faults: true,
            canary: None,
            echo_trace: false,
            network: Network::Tcp,
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
    /// What the run read: its faults and its clients' op streams.
    pub plan: Plan,
    pub canary: Option<Canary>,
    /// The network the run's nodes were on.
    pub network: Network,
    pub failure: Option<Failure>,
    pub trace_hash: u64,
    pub events: Vec<Event>,
    pub ops_sent: u64,
    pub ops_acked: u64,
    pub faults_injected: u64,
    pub simulated: Duration,
    /// How often the run reached each situation of `coverage::Coverage`.
    pub coverage: coverage::CoverageCounts,
    /// Pushes and sync pulls between replicas (for the timeline).
    pub wire: Vec<WireCall>,
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
            // The test runs the test-sized standard profile over plaintext
            // TCP unless told otherwise, so a seed names what it ran with.
            None => {
                let size = match self.swarm.size == Size::TEST {
                    true => String::new(),
                    false => " ARBOR_SIM_SIZE=standard".into(),
                };
                let (profile, network) = self.unusual(" ARBOR_SIM_PROFILE=", " ARBOR_SIM_NETWORK=");
                format!(
                    "MADSIM_TEST_SEED={}{size}{profile}{network} cargo test -p arbor-sim --test sim -- standard_seeds --nocapture",
                    self.seed
                )
            }
        }
    }

    /// The profile and the network, each behind its flag, where they are
    /// not the defaults (standard, tcp); empty where they are.
    fn unusual(&self, profile_flag: &str, network_flag: &str) -> (String, String) {
        let profile = match self.swarm.profile {
            Profile::Standard => String::new(),
            other => format!("{profile_flag}{}", other.name()),
        };
        let network = match self.network {
            Network::Tcp => String::new(),
            other => format!("{network_flag}{}", other.name()),
        };
        (profile, network)
    }

    /// The CLI command that replays this run with a readable trace.
    pub fn replay_commands(&self) -> String {
        let canary = self
            .canary
            .map(|c| format!(" --canary {c:?}"))
            .unwrap_or_default();
        let (profile, network) = self.unusual(" --profile ", " --network ");
        let size = if self.swarm.size == Size::TEST {
            " --small"
        } else {
            ""
        };
        format!(
            "cargo run --release -p arbor-sim -- replay --seed {}{profile}{canary}{size}{network}",
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
        writeln!(f, "{}", self.swarm.describe(self.plan.ops_planned()))?;
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
        writeln!(f, "coverage: {}", self.coverage)?;
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
    canary.into()
}

/// Accepts the variant name in any case, with or without dashes.
pub fn parse_canary(name: &str) -> Result<Canary, String> {
    let wanted: String = name.chars().filter(|c| *c != '-' && *c != '_').collect();
    Canary::ALL
        .iter()
        .copied()
        .find(|c| format!("{c:?}").eq_ignore_ascii_case(&wanted))
        .ok_or_else(|| {
            let names: Vec<String> = Canary::ALL.iter().map(|c| format!("{c:?}")).collect();
            format!("unknown canary {name:?}; one of {}", names.join(", "))
        })
}

/// The containers of the workload and their replica sets: with four
/// replicas the second container lives on three of them only.
pub(crate) fn replica_sets(replicas: usize) -> Vec<(ContainerId, Vec<ReplicaId>)> {
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

/// What a run counted, for its report.
#[derive(Default)]
struct Counts {
    ops_sent: u64,
    ops_acked: u64,
    faults_injected: u64,
    simulated: Duration,
    coverage: coverage::CoverageCounts,
    wire: Vec<WireCall>,
}

/// Runs one seed in its own madsim runtime and reports the verdict. A
/// panic inside the simulation (a broken engine assertion) is a failure.
pub fn run_seed(seed: u64, options: &Options) -> Report {
    let swarm = Swarm::draw(seed, options.profile, options.size, options.faults);
    run_plan(&Plan::draw(swarm), options)
}

/// Runs `plan` (seeded by its swarm's seed) in its own madsim runtime;
/// `options` give the canary and whether to echo the trace. The plan must
/// be valid (`Plan::validate`).
pub fn run_plan(plan: &Plan, options: &Options) -> Report {
    assert_eq!(plan.validate(), Ok(()), "run_plan needs a valid plan");
    let swarm = plan.swarm.clone();
    let seed = swarm.seed;
    let trace = Trace::new(options.echo_trace);
    // Process-wide: every run of a sweep sets the same value, so parallel
    // runs agree; runs with different canaries must not overlap.
    arbor::canary::set(options.canary);
    // Per thread, and a run keeps to its thread: start from zero.
    arbor::probe::take();
    let time_limit = swarm.size.workload_duration + RUN_TIME_LIMIT_EXTRA;
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let body = |probe| simulate(plan, &trace, probe, options);
        lifecycle::run_in_runtime(seed, madsim::Config::default(), Some(time_limit), body)
    }));
    let (counts, failure) = match outcome {
        Ok(((counts, verdict), leak)) => (counts, verdict.and(leak).err()),
        Err(panic) => {
            let failure = Failure::new(FailureKind::Panic, panic_message(&panic));
            (Counts::default(), Some(failure))
        }
    };
    Report {
        seed,
        swarm,
        plan: plan.clone(),
        canary: options.canary,
        network: options.network,
        trace_hash: trace.run_fingerprint(failure.as_ref().map(|f| f.kind.name())),
        failure,
        events: trace.events(),
        ops_sent: counts.ops_sent,
        ops_acked: counts.ops_acked,
        faults_injected: counts.faults_injected,
        simulated: counts.simulated,
        coverage: counts.coverage,
        wire: counts.wire,
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

/// The world of `swarm` on `network`; every node takes `wire`'s
/// connection limits.
fn build_world(
    swarm: &Swarm,
    trace: &Trace,
    network: Network,
    wire: &nemesis::wire::WireKnobs,
) -> World {
    let containers: Vec<ContainerConfig> = replica_sets(swarm.replicas)
        .into_iter()
        .map(|(cid, replicas)| ContainerConfig::new(cid, replicas))
        .collect();
    let mut configs = cluster_configs_with(swarm.replicas, &swarm.knobs, &containers);
    let intruder = format!("client-{}", intruder_index(swarm));
    let access =
        workload::intruder::access_config(swarm.size.clients, &intruder, &swarm.intruder_roles);
    for config in &mut configs {
        config.pilorama.replicated_batch_delay = swarm.replicated_batch_delay;
        config.pilorama.wal = swarm.wal.enabled;
        config.pilorama.checkpoint_interval = swarm.wal.checkpoint_interval;
        config.pilorama.checkpoint_bytes = swarm.wal.checkpoint_bytes;
        config.pilorama.wal_segment_bytes = swarm.wal.segment_bytes;
        config.pilorama.wal_spare_segments = swarm.wal.spare_segments;
        config.tree.ack_replicas = swarm.ack_replicas;
        config.access = access.clone();
        if let Some(grpc) = &swarm.grpc {
            serve_grpc(config, grpc, swarm.size.clients);
        }
        wire.apply(config);
    }
    let disk_config = |i: usize| {
        let mut config = DiskConfig::reliable(swarm.seed.wrapping_mul(31).wrapping_add(i as u64));
        config.latency = swarm.disk_latency;
        config.faults.torn_write_probability = swarm.torn_write_probability;
        config
    };
    let world =
        World::build_on_disks_over(configs, &swarm.skews, disk_config, trace.clone(), network);
    world.set_stream_window(swarm.stream_window);
    world
}

/// A gRPC front on `config`'s node with `grpc`'s limits, and the keys of
/// the gateways that may speak to it (every client's, as owners of every
/// container, the rights the native clients hold). No key gets a verification table:
/// building one takes longer than a seed's whole run, and a key without
/// one is checked by the same rules the slower way.
fn serve_grpc(config: &mut arbor::config::Config, grpc: &plan::swarm::GrpcKnobs, clients: usize) {
    let native: std::net::SocketAddr = config.node.listen.parse().expect("listen is ip:port");
    let front = std::net::SocketAddr::new(native.ip(), crate::world::config::GRPC_PORT);
    config.grpc.listen = Some(front.to_string());
    config.grpc.stream_page_nodes = grpc.stream_page_nodes;
    config.grpc.max_concurrent_streams = grpc.max_concurrent_streams;
    config.grpc.key_tables_max = 0;
    let access = &mut config.access;
    for index in 1..=clients {
        let key = workload::gateway_mix::gateway_signer(index).public().hex();
        let containers = access.containers.iter_mut().map(|c| &mut c.grants);
        for grants in containers.chain([&mut access.default]) {
            grants.grant(arbor::config::Role::Owner, &key);
        }
    }
}

/// The seed's world through the lifecycle: boot, the workload under the
/// nemesis, heal and check, end.
async fn simulate(
    plan: &Plan,
    trace: &Trace,
    probe: LeakProbe,
    options: &Options,
) -> (Counts, Result<(), Failure>) {
    let swarm = &plan.swarm;
    let network = options.network;
    let wire = {
        let latency_max = (plan.faults.iter())
            .filter_map(|fault| match fault.kind {
                plan::FaultKind::LatencySpike { high_ms } => Some(high_ms),
                _ => None,
            })
            .max()
            .map_or(Duration::ZERO, Duration::from_millis);
        nemesis::wire::WirePlan::draw(swarm, options.faults).with_latency_max(latency_max)
    };
    let mut world = build_world(swarm, trace, network, &wire.knobs);
    probe.watch(&world);
    let clients: Vec<_> = plan
        .clients
        .iter()
        .enumerate()
        .map(|(at, c)| match &swarm.grpc {
            Some(grpc) if at < grpc.gateways => {
                world.grpc_client(c.index, &workload::gateway_mix::gateway_signer(c.index))
            }
            _ => world.client_numbered(c.index),
        })
        .collect();
    // Numbered after every client the size allows, whatever the plan
    // keeps: it holds no right (`workload::intruder::access_config`).
    let intruder = world.client_numbered(intruder_index(swarm));
    let rogue = swarm.rogue_replica.map(|id| world.caller_as_replica(id));
    let probe = world.misled_client(nemesis::wire::probe_client_index(swarm.size.clients));
    let wire = (wire, probe);
    // Only a run with misconfiguration windows has the misled client.
    let misled = plan
        .faults
        .iter()
        .any(|f| matches!(f.kind, plan::FaultKind::Misconfig { .. }))
        .then(|| world.misled_client(nemesis::misconfig::misled_client_index(swarm.size.clients)));
    let world = Arc::new(world);
    let verdict = Verdict::new(trace.clone());
    watch(&world, &verdict, swarm);
    let supervisor = Supervisor::new(world.clone(), verdict.clone());
    let workload = Arc::new(Workload::new(
        world.clone(),
        verdict.clone(),
        CALL_TIMEOUT,
        swarm.gateway_clients || swarm.profile == Profile::Gateway,
    ));
    workload.ledger.lock().unwrap().replaced.ack_replicas = swarm.ack_replicas;
    let faults = plan.faults.clone();
    let nemesis = Nemesis::new(
        supervisor.clone(),
        workload.clone(),
        faults,
        swarm.disk_faults,
    );
    if let Some(client) = misled {
        nemesis.set_misled_client(client);
    }
    let result = async {
        lifecycle::boot(&world).await?;
        let drivers = (&workload, &nemesis, &supervisor);
        run_workload(plan, drivers, clients, (intruder, rogue), wire).await;
        let ledger = async { workload.ledger.lock().unwrap().clone() };
        lifecycle::heal_and_check(&supervisor, ledger).await
    }
    .await;
    count_disk_situations(&world);
    (world.hooks.coverage).add(
        coverage::Coverage::WriteStalled,
        world.kernels().writes_stalled(),
    );
    let mut coverage = world.hooks.coverage.counts();
    coverage.add_probes(&arbor::probe::take());
    world.hooks.clear();
    let ended = lifecycle::end(&supervisor).await;
    let ledger = workload.ledger.lock().unwrap();
    let counts = Counts {
        ops_sent: ledger.ops_sent,
        ops_acked: ledger.ops_acked,
        faults_injected: nemesis.faults_injected(),
        simulated: crate::world::clock::global_now(),
        coverage,
        wire: world.filter.calls(),
    };
    (counts, result.and(ended))
}

/// Sets the oracles that watch the run (`check::oracle::watch`) and drops the
/// pushes the seed cuts for the whole run.
/// The intruder's client number: after every client the size allows,
/// whatever the plan keeps, so no planned client shares its identity.
fn intruder_index(swarm: &Swarm) -> usize {
    swarm.size.clients + 1
}

fn watch(world: &Arc<World>, verdict: &Verdict, swarm: &Swarm) {
    let coverage = world.hooks.coverage.clone();
    let intruder = format!("client-{}", intruder_index(swarm));
    let misled = format!(
        "client-{}",
        nemesis::misconfig::misled_client_index(swarm.size.clients)
    );
    let answers = check::oracle::watch::AnswerOracle::new(verdict.clone(), coverage.clone())
        .ignoring(intruder)
        .ignoring(misled);
    world.hooks.watch_answers(Arc::new(answers));
    let pulls = check::oracle::watch::SyncWatch::new(world, verdict.clone(), coverage.clone());
    world.hooks.watch_pulls(Arc::new(pulls));
    let blocked = swarm.pushes_blocked();
    if !blocked.is_empty() {
        world
            .trace
            .record("world", format!("pushes dropped all run: {blocked:?}"));
        coverage.hit(coverage::Coverage::PushBlackout);
    }
    for (from, to) in blocked {
        world
            .filter
            .block(from, to, crate::world::transport::RequestKind::Push);
    }
}

/// Torn writes and disk errors (each followed by a reopen: the supervisor
/// restarts a replica after its disk errors) from the disks' own counts.
fn count_disk_situations(world: &World) {
    let coverage = &world.hooks.coverage;
    for node in &world.nodes {
        let stats = node.disk.stats();
        coverage.add(coverage::Coverage::TornWrite, stats.writes_torn);
        if stats.write_errors_injected + stats.sync_errors_injected > 0 {
            coverage.hit(coverage::Coverage::DiskErrorReopen);
        }
    }
}

async fn run_workload(
    plan: &Plan,
    (workload, nemesis, supervisor): (&Arc<Workload>, &Arc<Nemesis>, &Arc<Supervisor>),
    clients: Vec<crate::world::Client>,
    (intruder, rogue): (crate::world::Client, Option<crate::world::Client>),
    (wire, probe): (nemesis::wire::WirePlan, crate::world::Client),
) {
    let size = plan.swarm.size;
    let start = crate::world::clock::global_now();
    let deadline = start + size.workload_duration;
    // Closed-loop clients: think time spreads each client's ops over the
    // run, leaving room for the calls themselves. It follows the size, not
    // the plan's budgets, so cutting one client's ops leaves the others'
    // timing alone.
    let ops_per_client = size.ops_total / size.clients.max(1) as u64;
    let think_mean = size.workload_duration.mul_f64(0.6) / ops_per_client.max(1) as u32;
    let mut tasks = Vec::new();
    for (client, client_plan) in clients.into_iter().zip(&plan.clients) {
        let run = workload::run_client(workload.clone(), client, client_plan.ops, think_mean);
        let run = plan::with_client_stream(client_plan, run);
        tasks.push(madsim::task::spawn(run));
    }
    let span = size.workload_duration.mul_f64(0.6);
    tasks.push(madsim::task::spawn(workload::intruder::run_intruder(
        workload.clone(),
        intruder,
        span,
        plan.swarm.intruder_roles.clone(),
        (plan.swarm.sets_stay_whole()).then(|| replica_sets(plan.swarm.replicas)),
    )));
    if let (Some(client), Some(me)) = (rogue, plan.swarm.rogue_replica) {
        tasks.push(madsim::task::spawn(workload::rogue::run_rogue(
            workload.clone(),
            client,
            span,
            me,
            replica_sets(plan.swarm.replicas),
        )));
    }
    let strikes = madsim::task::spawn(nemesis.clone().run(start, deadline));
    let verdict = workload.verdict.clone();
    let run = nemesis::wire::run(wire, supervisor.clone(), verdict, probe, start, deadline);
    tasks.push(madsim::task::spawn(run));
    // A task more changes the schedule of the whole run: spawned only when
    // there is a change to carry out, so a seed without one runs (and its
    // capsules replay) as before membership changes existed.
    if !plan.changes.is_empty() {
        tasks.push(madsim::task::spawn(nemesis::members::run(
            plan.changes.clone(),
            supervisor.clone(),
            workload.clone(),
            plan.swarm.profile,
            start,
        )));
    }
    for task in tasks {
        let _ = task.await;
    }
    let _ = strikes.await;
}
