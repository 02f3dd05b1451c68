//! Scale bench: one bucket-sized tree, written and read the way a node
//! runs it. A binary printing tables (no timed assertions).
//!
//! `cargo bench -p arbor-engine --bench scale -- [--objects N] [--batch B]
//! [--dir PATH] [--cache-bytes N] [--checkpoint-bytes N] [--lookups N]
//! [--no-catch-up]`
//!
//! - **Ingest**: `--objects` AddByPath calls (`workload.rs`: seven meta
//!   fields, half of them under scrambled names in one flat directory,
//!   half spread over 10,000 prefixes) in batches of `--batch`, through a
//!   durable forest on its write-ahead log, committed as the batcher
//!   commits (a checkpoint every `pilorama.checkpoint_interval` or
//!   `--checkpoint-bytes` of log, 4 MiB unless given). One row
//!   per 10 % of the objects: ops/s of that segment, commit p50/p99, CPU
//!   per op, the file's size and the pages in use (after a checkpoint at
//!   the segment's end, timed apart), each per object, the bytes redb
//!   wrote to its file and the bytes the log wrote (records, and the zeros
//!   of the segments it made; a roll into a spare writes none), each per
//!   op, and the process's resident memory.
//! - **Storage**: what the pages in use hold at full size, per table and
//!   per kind of row, against the objects' encoded size (each op as the
//!   log keeps it and a pull carries it: ids, items, timestamp).
//! - **Reads at full size**: `--lookups` lookups by path of random
//!   objects (p50, p99); the flat directory listed whole by name in
//!   pages of 1,000 (nodes/s, growth of the resident memory), right after
//!   the writes and again after the forest is opened anew; the reopen
//!   itself (an empty page cache).
//! - **Catch-up**: the forest served over loopback TCP by a node
//!   (replica 1, its own runtime, pushes to the new replica already
//!   acknowledged so that only the pull moves ops), and a new replica 2
//!   on an empty disk running one sync round, which pulls the whole log:
//!   time, ops/s, and the CPU each node spent, per op.

mod workload;

use arbor::batcher::checkpointing_commit;
use arbor::config::{Config, ContainerConfig, PeerConfig, PiloramaConfig};
use arbor::forest::wal;
use arbor::forest::*;
use arbor::service::Service;
use arbor::system::{system_env_on, SystemClock};
use arbor::tcp::{Server, ServerOptions, TcpTransport};
use arbor::*;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Args {
    objects: u64,
    batch: u64,
    dir: Option<PathBuf>,
    cache_bytes: usize,
    /// `pilorama.checkpoint_bytes` of the ingest and of both catch-up nodes.
    checkpoint_bytes: usize,
    lookups: usize,
    catch_up: bool,
    /// Reads at full size (lookups, listings, reopen).
    reads: bool,
}

fn parse_args() -> Args {
    let mut args = Args {
        objects: 1_000_000,
        batch: 100,
        dir: None,
        cache_bytes: arbor::config::PILORAMA_CACHE_BYTES_DEFAULT,
        checkpoint_bytes: PiloramaConfig::default().checkpoint_bytes,
        lookups: 10_000,
        catch_up: true,
        reads: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().expect("flag needs a value");
        match arg.as_str() {
            "--objects" => args.objects = value().parse().expect("--objects N"),
            "--batch" => args.batch = value().parse().expect("--batch N"),
            "--dir" => args.dir = Some(value().into()),
            "--cache-bytes" => args.cache_bytes = value().parse().expect("--cache-bytes N"),
            "--checkpoint-bytes" => {
                args.checkpoint_bytes = value().parse().expect("--checkpoint-bytes N")
            }
            "--lookups" => args.lookups = value().parse().expect("--lookups N"),
            "--no-catch-up" => args.catch_up = false,
            "--no-reads" => args.reads = false,
            // cargo bench passes --bench; anything else is ignored too.
            _ => {}
        }
    }
    assert!(
        args.objects >= 10 && args.batch >= 1,
        "--objects >= 10, --batch >= 1"
    );
    args
}

const SEGMENTS: u64 = 10;
const CID: ContainerId = ContainerId([0xb0; 32]);

fn tree() -> TreeKey {
    TreeKey::new(CID, "bucket")
}

fn request(i: u64) -> WriteRequest {
    let (dirs, name) = workload::key(i);
    let items = workload::fields(i, name)
        .into_iter()
        .map(|(k, v)| KeyValue::new(k, v))
        .collect();
    WriteRequest {
        tree: tree(),
        op: WriteOp::AddByPath {
            attr: ATTR_FILE_NAME.into(),
            path: dirs,
            items,
        },
    }
}

/// The encoded size of the ops one request stored (see
/// `workload::encoded_op_bytes`): its leaf and the directories it made.
fn encoded_bytes(request: &WriteRequest, outcome: &WriteOutcome) -> u64 {
    let WriteOp::AddByPath { path, items, .. } = &request.op else {
        unreachable!("the workload adds by path")
    };
    let leaf = workload::encoded_op_bytes(
        items
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_slice())),
    );
    let WriteOutcome::AddedByPath { created, .. } = outcome else {
        unreachable!("an AddByPath answers AddedByPath")
    };
    let made = &path[path.len() - created.len()..];
    let dirs: u64 = made
        .iter()
        .map(|name| workload::encoded_op_bytes([(ATTR_FILE_NAME, name.as_bytes())]))
        .sum();
    leaf + dirs
}

/// CPU time consumed so far by this thread (Linux schedstat).
fn thread_cpu() -> Duration {
    schedstat("/proc/thread-self/schedstat")
}

fn schedstat(path: impl AsRef<Path>) -> Duration {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}

/// CPU time of this process's threads whose name starts with `prefix`.
fn threads_cpu(prefix: &str) -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|name| name.starts_with(prefix))
        })
        .map(|task| schedstat(task.path().join("schedstat")))
        .sum()
}

/// Resident memory of this process in bytes (Linux; 0 elsewhere).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn percentiles(samples: &mut [Duration]) -> (Duration, Duration) {
    if samples.is_empty() {
        return (Duration::ZERO, Duration::ZERO);
    }
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.50), at(0.99))
}

/// Bytes of the database file and of its write-ahead log's segments.
fn file_bytes(db: &Path) -> (u64, u64) {
    let db_bytes = std::fs::metadata(db).map_or(0, |m| m.len());
    let wal = arbor::forest::wal::wal_dir_of(db);
    let wal_bytes = std::fs::read_dir(wal)
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    (db_bytes, wal_bytes)
}

fn forest_options(args: &Args) -> ForestOptions {
    let defaults = ForestOptions::default();
    ForestOptions {
        cache_bytes: args.cache_bytes,
        wal: wal::WalOptions {
            checkpoint_bytes: args.checkpoint_bytes as u64,
            ..defaults.wal
        },
        ..defaults
    }
}

/// What redb did to the database file.
#[derive(Clone, Default)]
struct FileCounters {
    written_bytes: Arc<AtomicU64>,
    syncs: Arc<AtomicU64>,
    reads: Arc<AtomicU64>,
}

impl FileCounters {
    fn take(&self) -> (u64, u64, u64) {
        (
            self.written_bytes.swap(0, Ordering::Relaxed),
            self.syncs.swap(0, Ordering::Relaxed),
            self.reads.swap(0, Ordering::Relaxed),
        )
    }
}

/// The forest on `db` and its write-ahead log, as `Forest::open` opens
/// them (the file exists: `create_aside` made it), with redb's file
/// behind a counting backend. The forest cannot reopen itself.
fn open_counted(db: &Path, options: ForestOptions) -> (Forest, FileCounters) {
    if !db.exists() {
        // A whole empty database first, as `Forest::open` makes one.
        drop(Forest::open(db, options.clone()).expect("forest created"));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(db)
        .expect("database file opens");
    let (backend, written_bytes) =
        CountingBackend::new(redb::backends::FileBackend::new(file).expect("file backend"));
    let counters = FileCounters {
        written_bytes,
        syncs: backend.sync_counter(),
        reads: backend.read_counter(),
    };
    let cache_bytes = options.cache_bytes;
    let backend = std::sync::Mutex::new(Some(backend));
    let opener: DatabaseOpener = Box::new(move || {
        let backend = backend.lock().unwrap().take().expect("opened once");
        let mut builder = redb::Builder::new();
        builder.set_cache_size(cache_bytes);
        Ok(builder.create_with_backend(backend)?)
    });
    let dir = wal::wal_dir_of(db);
    let wal: wal::WalOpener = Box::new(move || {
        let storage = wal::DirStorage::open(&dir).map_err(|e| Error::Storage(e.to_string()))?;
        Ok(Box::new(storage) as Box<dyn wal::WalStorage>)
    });
    let forest = Forest::open_with_wal(opener, wal, options).expect("forest opens");
    (forest, counters)
}

/// What the ingest leaves for the later parts.
struct Ingested {
    forest: Arc<Forest>,
    /// The flat directory's id.
    flat: NodeId,
    encoded_bytes: u64,
}

fn ingest(args: &Args, db: &Path) -> Ingested {
    let (forest, counters) = open_counted(db, forest_options(args));
    let forest = Arc::new(forest);
    let interval = PiloramaConfig::default().checkpoint_interval;
    let commit = checkpointing_commit(
        forest.clone(),
        Arc::new(SystemClock::new()),
        interval,
        arbor::metrics::latency_histogram(),
    );
    println!(
        "ingest: {} objects, batches of {}, durable on the write-ahead log, a checkpoint every {:?} \
         or {} bytes of log",
        args.objects, args.batch, interval, args.checkpoint_bytes
    );
    println!(
        "| {:>9} | {:>9} | {:>8} | {:>7} | {:>7} | {:>9} | {:>10} | {:>9} | {:>9} | {:>9} | {:>7} | {:>9} | {:>7} |",
        "objects",
        "ops/s",
        "vs first",
        "p50 ms",
        "p99 ms",
        "cpu us/op",
        "file B/obj",
        "reads/op",
        "wrote B/op",
        "log B/op",
        "ckpts",
        "ckpt ms",
        "RSS MiB"
    );
    println!(
        "|{:->11}|{:->11}|{:->10}|{:->9}|{:->9}|{:->11}|{:->12}|{:->11}|{:->11}|{:->11}|{:->9}|{:->11}|{:->9}|",
        ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":"
    );
    let mut flat = None;
    let mut encoded = 0u64;
    let mut first_rate = None;
    for segment in 0..SEGMENTS {
        let (from, to) = (
            segment * args.objects / SEGMENTS,
            (segment + 1) * args.objects / SEGMENTS,
        );
        let mut commits = Vec::with_capacity(((to - from) / args.batch + 1) as usize);
        counters.take();
        let log = forest.wal_stats();
        let cpu = thread_cpu();
        let start = Instant::now();
        let mut first = from;
        while first < to {
            let last = (first + args.batch).min(to);
            let requests: Vec<WriteRequest> = (first..last).map(request).collect();
            let began = Instant::now();
            let results = commit(&requests).expect("batch commits").results;
            commits.push(began.elapsed());
            for (i, (request, result)) in (first..).zip(requests.iter().zip(&results)) {
                let outcome = result.as_ref().expect("an AddByPath failed");
                encoded += encoded_bytes(request, outcome);
                if i == 0 {
                    if let WriteOutcome::AddedByPath { parent, .. } = outcome {
                        flat = Some(*parent);
                    }
                }
            }
            first = last;
        }
        let elapsed = start.elapsed();
        let cpu = thread_cpu() - cpu;
        let (written, _, reads) = counters.take();
        let logged = forest.wal_stats();
        let checkpoints = logged.checkpoints - log.checkpoints;
        let log_bytes = logged.bytes - log.bytes + logged.preallocated - log.preallocated;
        let checkpoint = Instant::now();
        forest.checkpoint().expect("checkpoint");
        let checkpoint = checkpoint.elapsed();
        let rate = (to - from) as f64 / elapsed.as_secs_f64();
        let first_rate = *first_rate.get_or_insert(rate);
        let (p50, p99) = percentiles(&mut commits);
        let (db_bytes, _) = file_bytes(db);
        let ops = (to - from) as f64;
        println!(
            "| {:>9} | {:>9.0} | {:>7.2}x | {:>7.2} | {:>7.2} | {:>9.2} | {:>10.0} | {:>9.2} | {:>10.0} | {:>9.0} | {:>7} | {:>9.0} | {:>7.0} |",
            to,
            rate,
            rate / first_rate,
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3,
            cpu.as_secs_f64() * 1e6 / ops,
            db_bytes as f64 / to as f64,
            reads as f64 / ops,
            written as f64 / ops,
            log_bytes as f64 / ops,
            checkpoints,
            checkpoint.as_secs_f64() * 1e3,
            mib(rss_bytes()),
        );
    }
    println!();
    Ingested {
        forest,
        flat: flat.expect("object 0 made the flat directory"),
        encoded_bytes: encoded,
    }
}

fn print_storage(forest: &Forest, objects: u64, encoded_bytes: u64) {
    let stats = forest.storage_stats().expect("storage stats");
    let ops = forest.next_height(&tree()).expect("tree exists");
    let used = stats.used_bytes();
    println!(
        "storage at {objects} objects ({ops} ops): {} pages of {} B in use, {:.0} B per object; \
         the ops encoded (ids, items, timestamp) {:.0} B per object: used / encoded = {:.2}",
        stats.allocated_pages,
        stats.page_size,
        used as f64 / objects as f64,
        encoded_bytes as f64 / objects as f64,
        used as f64 / encoded_bytes as f64
    );
    println!(
        "| {:<16} | {:>11} | {:>12} | {:>13} | {:>11} | {:>9} |",
        "table", "leaf pages", "branch pages", "stored B/obj", "pages B/obj", "fill"
    );
    println!(
        "|{:-<18}|{:->13}|{:->14}|{:->15}|{:->13}|{:->11}|",
        "", ":", ":", ":", ":", ":"
    );
    for table in &stats.tables {
        let pages = (table.leaf_pages + table.branch_pages) * stats.page_size;
        let leaf_bytes = table.leaf_pages * stats.page_size;
        println!(
            "| {:<16} | {:>11} | {:>12} | {:>13.0} | {:>11.0} | {:>8.0} % |",
            table.name,
            table.leaf_pages,
            table.branch_pages,
            table.stored_bytes as f64 / objects as f64,
            pages as f64 / objects as f64,
            100.0 * table.stored_bytes as f64 / leaf_bytes.max(1) as f64
        );
    }
    println!();
    println!(
        "| {:<16} | {:>11} | {:>13} | {:>9} |",
        "rows", "rows", "stored B/obj", "B/row"
    );
    println!("|{:-<18}|{:->13}|{:->15}|{:->11}|", "", ":", ":", ":");
    for kind in &stats.kinds {
        println!(
            "| {:<16} | {:>11} | {:>13.1} | {:>9.1} |",
            kind.name,
            kind.rows,
            kind.stored_bytes as f64 / objects as f64,
            kind.stored_bytes as f64 / kind.rows.max(1) as f64
        );
    }
    println!();
}

/// xorshift64*: the objects the lookups ask for.
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

fn lookups(forest: &Forest, args: &Args) {
    let mut draw = Draw(0x1234_5678_9abc_def1);
    let mut samples = Vec::with_capacity(args.lookups);
    for _ in 0..args.lookups {
        let i = draw.below(args.objects);
        let (mut path, name) = workload::key(i);
        path.push(name);
        let began = Instant::now();
        let found = forest
            .get_by_path(&tree(), ATTR_FILE_NAME, &path, true)
            .expect("lookup");
        samples.push(began.elapsed());
        assert_eq!(found.len(), 1, "object {i} found once");
    }
    let (p50, p99) = percentiles(&mut samples);
    println!(
        "lookups by path at full size: {} random objects, p50 {:.1} us, p99 {:.1} us",
        args.lookups,
        p50.as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6
    );
}

/// Lists the flat directory whole, by name, in pages of 1,000.
fn listing(forest: &Forest, flat: NodeId, expected: u64, state: &str) {
    // What the service allows one answer (4 MiB messages).
    let bounds = AnswerBounds {
        nodes_max: 1000,
        bytes_max: (4 << 20) - (8 << 10),
        node_overhead_bytes: 64,
    };
    let rss_before = rss_bytes();
    let mut rss_max = rss_before;
    let mut nodes = 0u64;
    let mut pages = 0u64;
    let mut after: Option<ListCursor> = None;
    let cpu = thread_cpu();
    let start = Instant::now();
    loop {
        let page = forest
            .list_children_page(&tree(), flat, ListOrder::Name, after.as_ref(), bounds)
            .expect("page");
        nodes += page.nodes.len() as u64;
        pages += 1;
        if pages.is_multiple_of(64) {
            rss_max = rss_max.max(rss_bytes());
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let elapsed = start.elapsed();
    let cpu = thread_cpu() - cpu;
    rss_max = rss_max.max(rss_bytes());
    assert_eq!(nodes, expected, "every child listed once");
    println!(
        "listing the flat directory ({nodes} children) by name, pages of 1000, {state}: \
         {:.0} nodes/s, {:.2} us CPU/node, RSS {:.0} MiB, grew {:.1} MiB",
        nodes as f64 / elapsed.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / nodes as f64,
        mib(rss_before),
        mib(rss_max - rss_before)
    );
}

/// The config of replica `id` of the bucket's container, served at
/// `listen`, with `peer` as its one peer, and the bench's cache and
/// checkpoint sizes.
fn node_config(
    args: &Args,
    id: ReplicaId,
    path: &Path,
    listen: &str,
    peer: (ReplicaId, &str),
) -> Config {
    let mut config = Config::default_for_test(id);
    config.pilorama.path = path.to_path_buf();
    config.pilorama.cache_bytes = args.cache_bytes;
    config.pilorama.checkpoint_bytes = args.checkpoint_bytes;
    config.node.listen = listen.to_string();
    config.node.peers = vec![PeerConfig::new(peer.0, peer.1)];
    config.node.containers = vec![ContainerConfig::new(CID, vec![1, 2])];
    config.tree.sync_interval = None;
    config
}

fn runtime(name: &str) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .thread_keep_alive(Duration::from_secs(3600))
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Starts a node of `config` on `rt`, served over TCP on `listener`.
fn serve(
    rt: &tokio::runtime::Runtime,
    config: Config,
    listener: std::net::TcpListener,
) -> Arc<Service> {
    let forest =
        Forest::open(&config.pilorama.path, config.forest_options()).expect("forest opens");
    let env = system_env_on(rt.handle().clone());
    rt.block_on(async move {
        let transport = Arc::new(TcpTransport::new(&config, None));
        let service = Service::start(config.clone(), Arc::new(forest), env, transport)
            .expect("service starts");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
        let options = ServerOptions::from_config(&config);
        tokio::spawn(Server::new(listener, service.clone(), options, None).run());
        service
    })
}

fn catch_up(args: &Args, db: &Path, dir: &Path, ops: u64) {
    let bind = || std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let (donor_listener, joiner_listener) = (bind(), bind());
    let donor_addr = donor_listener.local_addr().unwrap().to_string();
    let joiner_addr = joiner_listener.local_addr().unwrap().to_string();
    let donor_config = node_config(args, 1, db, &donor_addr, (2, &joiner_addr));
    let joiner_path = dir.join("joiner.redb");
    let joiner_config = node_config(args, 2, &joiner_path, &joiner_addr, (1, &donor_addr));
    {
        // Pushes to the new replica count as acknowledged: the pull alone
        // moves the log.
        let forest = Forest::open(db, donor_config.forest_options()).expect("forest opens");
        forest
            .set_cursor(&tree(), CursorKind::Push, 2, ops)
            .expect("push cursor");
    }
    let donor_rt = runtime("donor");
    let joiner_rt = runtime("joiner");
    let donor = serve(&donor_rt, donor_config, donor_listener);
    let joiner = serve(&joiner_rt, joiner_config, joiner_listener);
    let (donor_cpu, joiner_cpu) = (threads_cpu("donor"), threads_cpu("joiner"));
    let start = Instant::now();
    joiner_rt.block_on(joiner.sync_now());
    let elapsed = start.elapsed();
    let (donor_cpu, joiner_cpu) = (
        threads_cpu("donor") - donor_cpu,
        threads_cpu("joiner") - joiner_cpu,
    );
    let held = joiner.forest().next_height(&tree()).unwrap_or(0);
    let stats = joiner.stats();
    println!(
        "catch-up over TCP: an empty replica pulled {held} of {ops} ops in one sync round, \
         {:.1} s, {:.0} ops/s; donor CPU {:.2} us/op, new replica CPU {:.2} us/op; \
         {} GetOpLog pages",
        elapsed.as_secs_f64(),
        held as f64 / elapsed.as_secs_f64(),
        donor_cpu.as_secs_f64() * 1e6 / held.max(1) as f64,
        joiner_cpu.as_secs_f64() * 1e6 / held.max(1) as f64,
        stats.sync_pages_pulled,
    );
    assert_eq!(held, ops, "the new replica holds the whole log");
    joiner.shutdown();
    donor.shutdown();
}

fn main() {
    let args = parse_args();
    let temp;
    let dir = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).expect("--dir");
            dir.clone()
        }
        None => {
            temp = tempfile::tempdir().expect("temp dir");
            temp.path().to_path_buf()
        }
    };
    let db = dir.join("bucket.redb");
    println!(
        "scale: {} objects, batch {}, cache_bytes {}, checkpoint_bytes {}, in {}",
        args.objects,
        args.batch,
        args.cache_bytes,
        args.checkpoint_bytes,
        dir.display()
    );
    let Ingested {
        forest,
        flat,
        encoded_bytes,
    } = ingest(&args, &db);
    print_storage(&forest, args.objects, encoded_bytes);
    if !args.reads {
        return;
    }
    lookups(&forest, &args);
    let flat_children = args.objects.div_ceil(2);
    listing(&forest, flat, flat_children, "after the writes");
    let ops = forest.next_height(&tree()).expect("tree exists");
    drop(forest);
    let began = Instant::now();
    let forest = Forest::open(&db, forest_options(&args)).expect("forest opens again");
    println!(
        "reopen at full size: {:.1} ms",
        began.elapsed().as_secs_f64() * 1e3
    );
    listing(&forest, flat, flat_children, "reopened");
    drop(forest);
    if args.catch_up {
        catch_up(&args, &db, &dir, ops);
    }
}
