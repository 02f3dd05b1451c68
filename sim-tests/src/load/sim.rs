//! Sim mode: the same scenarios inside madsim, against the simulated world
//! (real Arbor nodes on simulated time, network and disk). One seed, one
//! deterministic run, far faster than real time; good for what-ifs (a slow
//! disk, a long RTT between replicas, another sync interval).
//!
//! The gateway calls a replica's service directly on that replica's madsim
//! node (the reference run mocked the gateway's network too); replicas talk
//! to each other over the simulated network with the configured latency.

use super::driver::{self, RunSpec};
use super::real::{params, verify};
use super::report::{RunReport, ServiceCounters};
use super::target::Target;
use crate::disk::{DiskConfig, DiskLatency, WeakDisk};
use crate::trace::Trace;
use crate::world::clock::{global_now, ClockSkew, SimClock};
use crate::world::runtime::SimRuntime;
use crate::world::{cluster_configs, Knobs, NodeSpec, World, BOOT_DEADLINE};
use arbor::config::Config;
use arbor::forest::Forest;
use arbor::proto::{Request, Response};
use arbor::runtime::{BoxFuture, Env};
use arbor::service::Service;
use arbor::Error;
use madsim::runtime::NodeHandle;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
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

/// How long (simulated) to wait after the load for replication to drain
/// before verifying every replica.
const REPLICATION_DRAIN_MAX: Duration = Duration::from_secs(120);

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
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.nodes.len();
        let (node, service) = self.nodes[i].clone();
        Box::pin(async move {
            match node
                .spawn(async move { service.handle(request).await })
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
    let runtime = madsim::runtime::Runtime::with_seed_and_config(options.seed, config);
    let spec = spec.clone();
    let options_inner = options.clone();
    let probes = Arc::new(Mutex::new(Vec::new()));
    let probes_inner = probes.clone();
    let result =
        runtime.block_on(async move { run_in_world(&spec, &options_inner, &probes_inner).await });
    drop(runtime);
    // Whatever still holds a disk now is a task or a cycle that outlived
    // the runtime (`World::shut_down`).
    let leaked = probes
        .lock()
        .unwrap()
        .iter()
        .filter(|d| d.is_alive())
        .count();
    let mut report = result?;
    if leaked > 0 {
        return Err(format!(
            "{leaked} simulated disk(s) outlived the run's runtime"
        ));
    }
    report.seed = Some(options.seed);
    report.wall_time_s = wall.elapsed().as_secs_f64();
    report.host = crate::host::describe();
    Ok(report)
}

/// `probes` receives a weak handle on each replica's disk, for the leak
/// check after the runtime is gone.
async fn run_in_world(
    spec: &RunSpec,
    options: &SimOptions,
    probes: &Mutex<Vec<WeakDisk>>,
) -> Result<RunReport, String> {
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
    let world = World::build(specs, Trace::new(false));
    probes.lock().unwrap().extend(world.disk_probes());
    let mut nodes = Vec::new();
    for id in world.replica_ids() {
        if !world.wait_up(id, BOOT_DEADLINE).await {
            return Err(format!("replica {id} did not come up"));
        }
        let handle = madsim::runtime::Handle::current()
            .get_node(world.node(id).madsim_id())
            .ok_or_else(|| format!("replica {id} has no madsim node"))?;
        let service = world.node(id).service().ok_or("replica went down")?;
        nodes.push((handle, service));
    }
    let services: Vec<Arc<Service>> = nodes.iter().map(|(_, s)| s.clone()).collect();
    let target = Arc::new(SimServiceTarget {
        nodes,
        next: AtomicUsize::new(0),
    });
    let out = driver::run(spec, &generator_env(), target).await;
    let acked = out.acked.clone();
    let mut report = RunReport::new(
        "Arbor tree service under gateway load (simulated)".to_string(),
        format!("sim/cluster{}", options.replicas),
        out,
    );
    report.params = params(spec, &options.config);
    report
        .params
        .insert("sim.disk".into(), format!("{:?}", options.disk_latency));
    report.params.insert(
        "sim.net_one_way".into(),
        format!("{:?}", options.net_latency),
    );
    report
        .params
        .insert("sim.replicas".into(), options.replicas.to_string());
    if options.verify {
        let drained = drain_replication(&services).await;
        if !drained {
            report.notes.push(format!(
                "replication still busy {REPLICATION_DRAIN_MAX:?} after the load; verified anyway"
            ));
        }
        let forests: Vec<Arc<Forest>> = services.iter().map(|s| s.forest().clone()).collect();
        report.verification = Some(verify(&forests, &spec.scenarios, &acked));
    }
    report.service = Some(ServiceCounters::sum(
        services
            .iter()
            .map(|s| s.stats())
            .collect::<Vec<_>>()
            .iter(),
    ));
    report.notes.push(disk_note(&world));
    for s in &services {
        s.shutdown();
    }
    // Ends every task of the replicas: madsim keeps a pending task, and
    // with it the world and its disks, past the runtime's end, which a
    // `matrix --mode sim` would pay for on every point of its grid.
    drop(services);
    let lingering = world.shut_down().await;
    if !lingering.is_empty() {
        return Err(format!(
            "replicas {lingering:?} still hold their database after the final kill"
        ));
    }
    Ok(report)
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

/// Waits (in simulated time) until every replica has pushed everything.
async fn drain_replication(services: &[Arc<Service>]) -> bool {
    let give_up = global_now() + REPLICATION_DRAIN_MAX;
    while global_now() < give_up {
        if services.iter().all(|s| s.replication_idle()) {
            return true;
        }
        madsim::time::sleep(Duration::from_millis(50)).await;
    }
    false
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
