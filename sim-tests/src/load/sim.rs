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

/// A fault-free in-memory disk that charges simulated time per write, per
/// byte and per fsync (the calibrated model). The fault-injecting
/// `crate::disk::SimDisk` keeps a second, durable copy of the image and
/// refreshes it on every fsync, which costs O(database size) per commit:
/// fine for fault tests, quadratic over a 15-minute load run.
struct TimedMemDisk {
    store: Arc<Mutex<ChunkedBytes>>,
    latency: DiskLatency,
    owed: Arc<Mutex<Duration>>,
    capacity_bytes: u64,
}

/// The redb backend of a [`TimedMemDisk`].
#[derive(Debug)]
struct TimedMemBackend {
    store: Arc<Mutex<ChunkedBytes>>,
    latency: DiskLatency,
    owed: Arc<Mutex<Duration>>,
    capacity_bytes: u64,
}

/// Bytes per chunk of a [`ChunkedBytes`]: large enough that a
/// multi-gigabyte image is a few thousand allocations, small enough that
/// growing the file by one redb region touches little memory.
const CHUNK_BYTES: usize = 1 << 20;

/// A sparse file image in fixed-size chunks. A flat `Vec` that grows with
/// the database copies the whole image on every reallocation and zero-fills
/// every extension, and its doubling capacity holds up to twice the
/// database in memory; here growing is free (a missing chunk reads as
/// zeros) and a write allocates only the chunks it lands in.
#[derive(Debug, Default)]
struct ChunkedBytes {
    chunks: Vec<Option<Box<[u8]>>>,
    len: u64,
}

impl ChunkedBytes {
    fn len(&self) -> u64 {
        self.len
    }

    /// File semantics: bytes beyond the old length read as zeros after
    /// growing, also where an earlier shrink cut them off.
    fn set_len(&mut self, len: u64) {
        if len < self.len {
            let chunks = usize::try_from(len.div_ceil(CHUNK_BYTES as u64))
                .expect("a simulated disk fits in memory");
            self.chunks.truncate(chunks);
            let kept_end = (self.chunks.len() * CHUNK_BYTES) as u64;
            self.zero_range(len, self.len.min(kept_end));
        }
        self.len = len;
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        let end = offset
            .checked_add(out.len() as u64)
            .filter(|end| *end <= self.len)
            .ok_or_else(|| std::io::Error::other("read past end"))?;
        let mut done = 0;
        for (chunk, within, n) in pieces(offset, end) {
            let dst = &mut out[done..done + n];
            match self.chunks.get(chunk).and_then(Option::as_deref) {
                Some(bytes) => dst.copy_from_slice(&bytes[within..within + n]),
                None => dst.fill(0),
            }
            done += n;
        }
        Ok(())
    }

    /// Writes past the end extend the image, as a file does.
    fn write(&mut self, offset: u64, data: &[u8]) {
        let end = offset + data.len() as u64;
        let mut done = 0;
        for (chunk, within, n) in pieces(offset, end) {
            self.chunk_mut(chunk)[within..within + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        self.len = self.len.max(end);
    }

    fn chunk_mut(&mut self, chunk: usize) -> &mut [u8] {
        if self.chunks.len() <= chunk {
            self.chunks.resize_with(chunk + 1, || None);
        }
        // A zeroed allocation of this size comes straight from fresh pages,
        // so nothing is filled twice.
        self.chunks[chunk].get_or_insert_with(|| vec![0u8; CHUNK_BYTES].into_boxed_slice())
    }

    fn zero_range(&mut self, start: u64, end: u64) {
        for (chunk, within, n) in pieces(start, end) {
            if let Some(bytes) = self.chunks.get_mut(chunk).and_then(Option::as_deref_mut) {
                bytes[within..within + n].fill(0);
            }
        }
    }

    /// Bytes held in memory (allocated chunks).
    fn resident_bytes(&self) -> u64 {
        self.chunks.iter().flatten().count() as u64 * CHUNK_BYTES as u64
    }
}

/// Splits `[start, end)` into (chunk index, offset in chunk, length) pieces.
fn pieces(start: u64, end: u64) -> impl Iterator<Item = (usize, usize, usize)> {
    let chunk_bytes = CHUNK_BYTES as u64;
    let mut at = start;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let chunk = at / chunk_bytes;
        let within = at % chunk_bytes;
        let n = (chunk_bytes - within).min(end - at);
        at += n;
        Some((chunk as usize, within as usize, n as usize))
    })
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

    fn check_capacity(&self, end: u64) -> Result<(), std::io::Error> {
        if end > self.capacity_bytes {
            return Err(std::io::Error::other(format!(
                "disk full ({} bytes)",
                self.capacity_bytes
            )));
        }
        Ok(())
    }
}

impl redb::StorageBackend for TimedMemBackend {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(lock(&self.store).len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        lock(&self.store).read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.check_capacity(len)?;
        lock(&self.store).set_len(len);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.charge(self.latency.per_sync);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| std::io::Error::other("write past u64"))?;
        self.check_capacity(end)?;
        lock(&self.store).write(offset, data);
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
            store: self.store.clone(),
            latency: self.latency,
            owed: self.owed.clone(),
            capacity_bytes: self.capacity_bytes,
        };
        let db = redb::Builder::new()
            .set_cache_size(LOAD_REDB_CACHE_BYTES)
            .create_with_backend(backend)?;
        Forest::from_database(db, options)
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
    let stores = Arc::new(Mutex::new(Vec::new()));
    let stores_inner = stores.clone();
    let result =
        runtime.block_on(async move { run_in_world(&spec, &options_inner, &stores_inner).await });
    drop(runtime);
    // Whatever still holds a disk image now is a task or a cycle that
    // outlived the runtime (`World::shut_down`).
    let leaked = lock(&stores)
        .iter()
        .filter(|s| s.strong_count() > 0)
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

/// `stores` receives a weak handle on each replica's disk image, for the
/// leak check after the runtime is gone.
async fn run_in_world(
    spec: &RunSpec,
    options: &SimOptions,
    stores: &Mutex<Vec<std::sync::Weak<Mutex<ChunkedBytes>>>>,
) -> Result<RunReport, String> {
    let knobs = knobs(&options.config);
    let mut disks = Vec::new();
    let specs: Vec<NodeSpec> = cluster_configs(options.replicas, &knobs)
        .into_iter()
        .map(|mut config| {
            config.pilorama.no_sync = options.config.pilorama.no_sync;
            config.limits.max_commit_size = options.config.limits.max_commit_size;
            config.pilorama.replicated_batch_delay = options.config.pilorama.replicated_batch_delay;
            let disk = Arc::new(TimedMemDisk {
                store: Arc::default(),
                latency: options.disk_latency,
                owed: Arc::default(),
                capacity_bytes: LOAD_DISK_CAPACITY,
            });
            lock(stores).push(Arc::downgrade(&disk.store));
            disks.push(disk.clone());
            NodeSpec {
                config,
                skew: ClockSkew::default(),
                disk,
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
    report.notes.push(disk_note(&disks));
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
fn disk_note(disks: &[Arc<TimedMemDisk>]) -> String {
    let mb = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    let sizes: Vec<String> = disks
        .iter()
        .map(|d| {
            let store = lock(&d.store);
            format!(
                "{:.0} MB ({:.0} MB resident)",
                mb(store.len()),
                mb(store.resident_bytes())
            )
        })
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

    /// A tiny seeded generator (xorshift), so the model test needs no crate.
    struct Xorshift(u64);

    impl Xorshift {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Random writes, reads and resizes, several crossing chunk boundaries,
    /// behave exactly as on a flat vector (a file that zero-fills growth).
    #[test]
    fn chunked_bytes_match_a_flat_vector() {
        let mut rng = Xorshift(0x9e37_79b9_7f4a_7c15);
        let mut chunked = ChunkedBytes::default();
        let mut model: Vec<u8> = Vec::new();
        let span = 4 * CHUNK_BYTES as u64;
        for step in 0..3000u64 {
            match rng.below(4) {
                0 => {
                    let len = rng.below(span);
                    chunked.set_len(len);
                    model.resize(len as usize, 0);
                }
                1 | 2 => {
                    let offset = rng.below(span);
                    let n = 1 + rng.below(3 * 4096) as usize;
                    let data: Vec<u8> = (0..n).map(|i| (step as usize + i) as u8 | 1).collect();
                    chunked.write(offset, &data);
                    let end = offset as usize + n;
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[offset as usize..end].copy_from_slice(&data);
                }
                _ => {
                    let offset = rng.below(span);
                    let n = rng.below(2 * CHUNK_BYTES as u64) as usize;
                    let mut out = vec![0xAA; n];
                    let got = chunked.read(offset, &mut out);
                    match model.get(offset as usize..offset as usize + n) {
                        Some(want) => {
                            assert!(got.is_ok(), "step {step}: read failed");
                            assert_eq!(&out[..], want, "step {step}: bytes differ");
                        }
                        None => assert!(got.is_err(), "step {step}: read past end allowed"),
                    }
                }
            }
            assert_eq!(chunked.len(), model.len() as u64, "step {step}");
        }
        let mut all = vec![0; model.len()];
        chunked.read(0, &mut all).expect("whole image");
        assert_eq!(all, model);
    }

    /// Shrinking drops the chunks past the end, and growing again reads
    /// zeros where the old bytes were.
    #[test]
    fn shrink_frees_chunks_and_regrowth_reads_zeros() {
        let mut store = ChunkedBytes::default();
        store.write(0, &vec![7; 3 * CHUNK_BYTES]);
        assert_eq!(store.resident_bytes(), 3 * CHUNK_BYTES as u64);
        store.set_len(CHUNK_BYTES as u64 + 10);
        assert_eq!(store.resident_bytes(), 2 * CHUNK_BYTES as u64);
        store.set_len(3 * CHUNK_BYTES as u64);
        let mut out = vec![1; 20];
        store.read(CHUNK_BYTES as u64, &mut out).expect("in range");
        assert_eq!(out[..10], [7; 10]);
        assert_eq!(out[10..], [0; 10]);
        let mut tail = vec![1; 4096];
        store
            .read(2 * CHUNK_BYTES as u64 + 5, &mut tail)
            .expect("in range");
        assert!(tail.iter().all(|b| *b == 0));
    }

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
