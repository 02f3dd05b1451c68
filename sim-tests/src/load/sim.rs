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
use crate::disk::DiskLatency;
use crate::trace::Trace;
use crate::world::clock::{global_now, ClockSkew, SimClock};
use crate::world::runtime::SimRuntime;
use crate::world::storage::NodeDisk;
use crate::world::{cluster_configs, Knobs, NodeSpec, World};
use arbor::config::Config;
use arbor::forest::{Forest, ForestOptions};
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

/// A fault-free in-memory disk that charges simulated time per write, per
/// byte and per fsync (the calibrated model). The fault-injecting
/// `crate::disk::SimDisk` keeps a second, durable copy of the image and
/// refreshes it on every fsync, which costs O(database size) per commit:
/// fine for fault tests, quadratic over a 15-minute load run.
struct TimedMemDisk {
    bytes: Arc<Mutex<Vec<u8>>>,
    latency: DiskLatency,
    owed: Arc<Mutex<Duration>>,
    capacity_bytes: u64,
}

/// The redb backend of a [`TimedMemDisk`].
#[derive(Debug)]
struct TimedMemBackend {
    bytes: Arc<Mutex<Vec<u8>>>,
    latency: DiskLatency,
    owed: Arc<Mutex<Duration>>,
    capacity_bytes: u64,
}

impl std::fmt::Debug for TimedMemDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimedMemDisk")
            .field("latency", &self.latency)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl TimedMemBackend {
    fn charge(&self, d: Duration) {
        *lock(&self.owed) += d;
    }
}

impl redb::StorageBackend for TimedMemBackend {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(lock(&self.bytes).len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        let bytes = lock(&self.bytes);
        let start = usize::try_from(offset).map_err(std::io::Error::other)?;
        let end = start + out.len();
        let src = bytes
            .get(start..end)
            .ok_or_else(|| std::io::Error::other("read past end"))?;
        out.copy_from_slice(src);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        if len > self.capacity_bytes {
            return Err(std::io::Error::other(format!(
                "disk full ({} bytes)",
                self.capacity_bytes
            )));
        }
        lock(&self.bytes).resize(len as usize, 0);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.charge(self.latency.per_sync);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let end = offset + data.len() as u64;
        if end > self.capacity_bytes {
            return Err(std::io::Error::other(format!(
                "disk full ({} bytes)",
                self.capacity_bytes
            )));
        }
        {
            let mut bytes = lock(&self.bytes);
            if end as usize > bytes.len() {
                bytes.resize(end as usize, 0);
            }
            bytes[offset as usize..end as usize].copy_from_slice(data);
        }
        self.charge(
            self.latency.per_write
                + Duration::from_nanos(self.latency.per_byte_nanos * data.len() as u64),
        );
        Ok(())
    }
}

impl NodeDisk for TimedMemDisk {
    fn open(&self, options: ForestOptions) -> arbor::Result<Forest> {
        let backend = TimedMemBackend {
            bytes: self.bytes.clone(),
            latency: self.latency,
            owed: self.owed.clone(),
            capacity_bytes: self.capacity_bytes,
        };
        Forest::open_with_backend(backend, options)
    }

    fn power_fail(&self) {
        // Load runs crash nothing; a power cut would need the durable image
        // this disk deliberately does not keep.
        panic!("TimedMemDisk does not model power failure");
    }

    fn take_latency(&self) -> Duration {
        std::mem::take(&mut *lock(&self.owed))
    }

    fn describe(&self) -> String {
        format!("timed in-memory disk {:?}", self.latency)
    }
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
    let mut report = runtime.block_on(async move { run_in_world(&spec, &options_inner).await })?;
    report.seed = Some(options.seed);
    report.wall_time_s = wall.elapsed().as_secs_f64();
    Ok(report)
}

async fn run_in_world(spec: &RunSpec, options: &SimOptions) -> Result<RunReport, String> {
    let knobs = knobs(&options.config);
    let specs: Vec<NodeSpec> = cluster_configs(options.replicas, &knobs)
        .into_iter()
        .map(|mut config| {
            config.pilorama.no_sync = options.config.pilorama.no_sync;
            config.limits.max_commit_size = options.config.limits.max_commit_size;
            let disk = TimedMemDisk {
                bytes: Arc::default(),
                latency: options.disk_latency,
                owed: Arc::default(),
                capacity_bytes: LOAD_DISK_CAPACITY,
            };
            NodeSpec {
                config,
                skew: ClockSkew::default(),
                disk: Arc::new(disk),
            }
        })
        .collect();
    let world = World::build(specs, Trace::new(false));
    let mut nodes = Vec::new();
    for id in world.replica_ids() {
        if !world.wait_up(id, Duration::from_secs(10)).await {
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
    for s in &services {
        s.shutdown();
    }
    Ok(report)
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
