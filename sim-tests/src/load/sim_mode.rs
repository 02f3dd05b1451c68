//! Sim mode: the same scenarios inside madsim, against the simulated world
//! (real Arbor nodes on simulated time, network and disk). One seed, one
//! deterministic run, far faster than real time; good for what-ifs (a slow
//! disk, a long RTT between replicas, another sync interval).
//!
//! The gateway calls a replica's service directly on that replica's madsim
//! node (the reference run mocked the gateway's network too); replicas talk
//! to each other over the simulated network with the configured latency.

use super::driver::{self, RunSpec};
use super::real::{params, scenario_tree, verify};
use super::report::{RunReport, ServiceCounters};
use super::scenario::Scenario;
use super::target::Target;
use crate::disk::{DiskConfig, DiskLatency};
use crate::failure::Verdict;
use crate::scenario::check::ledger::{Acked, Ledger};
use crate::scenario::check::liveness;
use crate::scenario::lifecycle::{self, LeakProbe};
use crate::trace::Trace;
use crate::world::clock::{ClockSkew, SimClock};
use crate::world::runtime::SimRuntime;
use crate::world::supervisor::Supervisor;
use crate::world::{cluster_configs, Knobs, NodeSpec, World};
use arbor::config::Config;
use arbor::forest::Forest;
use arbor::proto::{Request, Response};
use arbor::runtime::{BoxFuture, Env};
use arbor::service::Service;
use arbor::Caller;
use arbor::{Error, NodeId};
use madsim::runtime::NodeHandle;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Disk costs measured in real mode on the development machine (see
/// docs/load.md, "Sim-mode calibration"): what one redb commit of a batch
/// costs in writes, bytes and fsyncs.
pub const CALIBRATED_DISK: DiskLatency = DiskLatency {
    per_write: Duration::ZERO,
    per_sync: Duration::from_micros(3560),
    per_byte_nanos: 35,
};

/// The load generator's environment inside a simulation: madsim's global
/// time (no skew) and madsim tasks on the current node, no disk time.
pub fn generator_env() -> Env {
    Env {
        clock: Arc::new(SimClock::new(ClockSkew::default())),
        runtime: Arc::new(SimRuntime::new(None)),
    }
}

/// A simulated disk large enough for long load runs.
const LOAD_DISK_CAPACITY: u64 = 16 << 30;

/// redb's page cache per simulated replica (redb's default is 1 GiB). The
/// disk is memory too, so a cache that grows with the database only holds
/// a second copy of it: the 15-minute reference run's peak RSS falls from
/// 6.0 to 3.2 GB and its system time by half (fewer fresh pages to fault
/// in), while its user time stays within the host's noise (a miss costs a
/// 4 KiB copy from the disk). Reads cost no simulated time, so the run's
/// results barely move: redb writes back part of a very large transaction
/// early when its dirty pages pass half the cache, which the disk charges
/// at that moment.
const LOAD_REDB_CACHE_BYTES: usize = 64 << 20;

/// Sim-mode settings besides the load itself.
#[derive(Clone, Debug)]
pub struct SimOptions {
    pub seed: u64,
    pub replicas: usize,
    /// The service configuration every replica gets (peers and addresses are
    /// the world's).
    pub config: Config,
    pub disk_latency: DiskLatency,
    /// One-way latency between replicas.
    pub net_latency: Duration,
    pub verify: bool,
}

/// Calls a replica's service on the replica's own madsim node, round-robin.
struct SimServiceTarget {
    nodes: Vec<(NodeHandle, Arc<Service>)>,
    next: AtomicUsize,
}

impl Target for SimServiceTarget {
    fn call(&self, request: Request) -> BoxFuture<'static, Response> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.call_at(i as u64, request)
    }

    fn call_at(&self, key: u64, request: Request) -> BoxFuture<'static, Response> {
        let (node, service) = self.nodes[(key % self.nodes.len() as u64) as usize].clone();
        Box::pin(async move {
            match node
                .spawn(async move { service.handle(&Caller::Anonymous, request).await })
                .await
            {
                Ok(response) => response,
                Err(e) => Response::Error(Error::Network(format!("replica task failed: {e}"))),
            }
        })
    }
}

/// The world's knobs from a service configuration.
pub fn knobs(config: &Config) -> Knobs {
    Knobs {
        max_batch_size: config.pilorama.max_batch_size,
        max_batch_delay: config.pilorama.max_batch_delay,
        replication_channel_capacity: config.tree.replication_channel_capacity,
        replication_worker_count: config.tree.replication_worker_count,
        replication_timeout: config.tree.replication_timeout,
        sync_interval: config.tree.sync_interval,
        max_pending_writes: config.limits.max_pending_writes,
        sync_page_size: config.limits.sync_page_size,
        stamp_page_size: None,
        message_bytes: None,
        counter_jump_max: None,
    }
}

/// Runs `spec` in a fresh simulation and reports.
pub fn run(spec: &RunSpec, options: &SimOptions) -> Result<RunReport, String> {
    if options.replicas == 0 || options.replicas > 7 {
        return Err(format!("--replicas {}: between 1 and 7", options.replicas));
    }
    let wall = Instant::now();
    let mut config = madsim::Config::default();
    let one_way = options.net_latency;
    config.net.send_latency = one_way..one_way + Duration::from_micros(1);
    let body = |probe| run_in_world(spec, options, probe);
    let (result, leak) = lifecycle::run_in_runtime(options.seed, config, None, body);
    let mut report = result?;
    leak.map_err(|failure| failure.to_string())?;
    report.seed = Some(options.seed);
    report.wall_time_s = wall.elapsed().as_secs_f64();
    report.host = crate::host::describe();
    Ok(report)
}

/// The run's world through the lifecycle: boot, the load, (with
/// `--verify`) heal and check, end.
async fn run_in_world(
    spec: &RunSpec,
    options: &SimOptions,
    probe: LeakProbe,
) -> Result<RunReport, String> {
    let world = Arc::new(build_world(options));
    probe.watch(&world);
    let supervisor = Supervisor::new(world.clone(), Verdict::new(world.trace.clone()));
    let result = load_and_check(spec, options, &supervisor).await;
    // Ends every task of the replicas: madsim keeps a pending task, and
    // with it the world and its disks, past the runtime's end, which a
    // `matrix --mode sim` would pay for on every point of its grid.
    let ended = lifecycle::end(&supervisor).await;
    let report = result?;
    ended.map_err(|failure| failure.to_string())?;
    Ok(report)
}

fn build_world(options: &SimOptions) -> World {
    let knobs = knobs(&options.config);
    let specs: Vec<NodeSpec> = cluster_configs(options.replicas, &knobs)
        .into_iter()
        .enumerate()
        .map(|(i, mut config)| {
            config.pilorama.no_sync = options.config.pilorama.no_sync;
            config.limits.max_commit_size = options.config.limits.max_commit_size;
            config.pilorama.replicated_batch_delay = options.config.pilorama.replicated_batch_delay;
            NodeSpec {
                config,
                skew: ClockSkew::default(),
                disk: DiskConfig {
                    latency: options.disk_latency,
                    capacity_bytes: LOAD_DISK_CAPACITY,
                    ..DiskConfig::reliable(options.seed.wrapping_add(i as u64))
                },
                redb_cache_bytes: Some(LOAD_REDB_CACHE_BYTES),
            }
        })
        .collect();
    World::build(specs, Trace::new(false))
}

async fn load_and_check(
    spec: &RunSpec,
    options: &SimOptions,
    supervisor: &Arc<Supervisor>,
) -> Result<RunReport, String> {
    let world = supervisor.world();
    lifecycle::boot(world).await.map_err(|f| f.to_string())?;
    let nodes = serving_nodes(world)?;
    let services: Vec<Arc<Service>> = nodes.iter().map(|(_, s)| s.clone()).collect();
    let target: Arc<dyn Target> = Arc::new(SimServiceTarget {
        nodes,
        next: AtomicUsize::new(0),
    });
    if driver::prepare(spec, &generator_env(), target.clone()).await? {
        // What was prepared on one replica is on every one before the load.
        liveness::replication_goes_idle(world)
            .await
            .map_err(|f| f.to_string())?;
    }
    let out = driver::run(spec, &generator_env(), target).await;
    let acked = out.acked.clone();
    let mut report = new_report(spec, options, out);
    if options.verify {
        // Before the counters are read, so that they count every push.
        liveness::replication_goes_idle(world)
            .await
            .map_err(|f| f.to_string())?;
    }
    report.service = Some(ServiceCounters::sum(
        services
            .iter()
            .map(|s| s.stats())
            .collect::<Vec<_>>()
            .iter(),
    ));
    if options.verify {
        let ledger = ledger_of(&spec.scenarios, &acked);
        lifecycle::heal_and_check(supervisor, async { ledger })
            .await
            .map_err(|f| format!("checks failed: {f}"))?;
        let forests: Vec<Arc<Forest>> = services.iter().map(|s| s.forest().clone()).collect();
        report.verification = Some(verify(&forests, &spec.scenarios, &acked));
    }
    report.notes.push(disk_note(world));
    for s in &services {
        s.shutdown();
    }
    Ok(report)
}

/// Every replica's madsim node and service, once all serve.
fn serving_nodes(world: &World) -> Result<Vec<(NodeHandle, Arc<Service>)>, String> {
    let mut nodes = Vec::new();
    for id in world.replica_ids() {
        let handle = madsim::runtime::Handle::current()
            .get_node(world.node(id).madsim_id())
            .ok_or_else(|| format!("replica {id} has no madsim node"))?;
        let service = world.node(id).service().ok_or("replica went down")?;
        nodes.push((handle, service));
    }
    Ok(nodes)
}

fn new_report(spec: &RunSpec, options: &SimOptions, out: driver::RunOutput) -> RunReport {
    let mut report = RunReport::new(
        "Arbor tree service under gateway load (simulated)".to_string(),
        format!("sim/cluster{}", options.replicas),
        out,
    );
    report.params = params(spec, &options.config);
    let sim_params = [
        ("sim.disk", format!("{:?}", options.disk_latency)),
        ("sim.net_one_way", format!("{:?}", options.net_latency)),
        ("sim.replicas", options.replicas.to_string()),
    ];
    for (key, value) in sim_params {
        report.params.insert(key.into(), value);
    }
    report
}

/// The load's acknowledgements as a ledger for the checkers: every
/// acknowledged id is a node its scenario created in its tree. The load
/// does not record which replica answered; `acker` is 0, the id the
/// world's clients use, which is no replica's.
fn ledger_of(scenarios: &[Scenario], acked: &[Vec<NodeId>]) -> Ledger {
    let mut ledger = Ledger::default();
    for (scenario, ids) in scenarios.iter().zip(acked) {
        let tree = scenario_tree(scenario);
        ledger.acked.extend(ids.iter().map(|&node| Acked::Created {
            tree: tree.clone(),
            node,
            acker: 0,
            sent: None,
        }));
    }
    ledger
}

/// The replicas' database sizes at the end of the run.
fn disk_note(world: &World) -> String {
    let sizes: Vec<String> = world
        .nodes
        .iter()
        .map(|n| format!("{:.0} MB", n.disk.len_bytes() as f64 / (1024.0 * 1024.0)))
        .collect();
    format!("simulated disks: {}", sizes.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::real::reference_config;
    use crate::load::scenario::Scenario;
    use std::path::PathBuf;

    fn small_run(seed: u64) -> serde_json::Value {
        let duration = Duration::from_secs(2);
        let spec = RunSpec {
            scenarios: vec![
                Scenario::system(10, duration),
                Scenario::user(300, duration, 4),
            ],
            deadline: Duration::from_secs(5),
            window: Duration::from_secs(1),
            track_acks: true,
            progress: false,
        };
        let mut config = reference_config(1, PathBuf::new(), None);
        config.tree.sync_interval = Some(Duration::from_secs(1));
        let options = SimOptions {
            seed,
            replicas: 3,
            config,
            disk_latency: CALIBRATED_DISK,
            net_latency: Duration::from_micros(100),
            verify: true,
        };
        let report = run(&spec, &options).expect("sim run");
        let v = report.verification.as_ref().expect("verified");
        assert_eq!(v.missing, 0, "lost acknowledged writes: {v:?}");
        assert!(v.found > 500, "too few acknowledged writes: {v:?}");
        let mut json = serde_json::to_value(&report).expect("report serialises");
        // Wall time, the host's name and the process's RSS are the host's,
        // not the seed's.
        json["wall_time_s"] = serde_json::Value::Null;
        json["host"] = serde_json::Value::Null;
        for sample in json["samples"].as_array_mut().expect("samples") {
            sample["rss_mb"] = serde_json::Value::Null;
        }
        json
    }

    /// One seed, one report: the whole run (latencies, counters, windows,
    /// the disks' sizes) repeats exactly.
    #[test]
    fn same_seed_gives_the_same_report() {
        let first = small_run(11);
        assert_eq!(first, small_run(11));
        assert_ne!(first, small_run(12), "the seed should matter");
    }
}
