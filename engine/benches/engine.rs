//! Forest benchmark: a binary printing a table (no timed assertions).
//!
//! `cargo bench -p arbor-engine --bench engine -- [--ops N] [--batch B]
//! [--reapply N] [--only NAME] [--no-sync] [--memory] [--late K,K..]
//! [--list-children N] [--cache-bytes N]`
//!
//! `add_by_path` spreads each batch over about a hundred directories (2-3
//! levels); the `add, 1 dir` rows put every object into one directory,
//! named in creation order or scrambled, which is what the children
//! index's name order changes.
//!
//! The `list` rows (a table of their own, printed with `--only list`
//! alone) page through one directory of
//! `--list-children` children (100,000 by default; the goal is stated at
//! 10^6) in pages of 1,000, each page in its own snapshot with the
//! service's message bound, and print nodes/s and how far the process's
//! resident memory grew over the listing: once right after the
//! directory was written, once after the forest was opened again (an
//! empty page cache, which the listing then fills up to
//! `pilorama.cache_bytes`). Id order scans the directory for each page:
//! its row lists a few pages only.
//!
//! Every scenario runs on a fresh temp-file database with durable commits
//! (`Durability::Immediate`), as the service runs it by default; `--no-sync`
//! switches to non-durable commits to show the CPU cost alone.

use arbor::forest::*;
use arbor::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Args {
    ops: usize,
    batch: usize,
    reapply_ops: usize,
    only: Option<String>,
    /// Non-durable commits: separates CPU cost from fsync cost.
    no_sync: bool,
    /// Lateness of the apply scenarios (0 = in order).
    late: Vec<usize>,
    /// Durable commits on an in-memory backend: redb's whole commit path
    /// without a real fsync, the shape of cost the simulator pays.
    memory: bool,
    /// Children of the directory the `list` rows page through.
    list_children: usize,
    /// redb's page cache (`pilorama.cache_bytes`).
    cache_bytes: usize,
}

fn parse_args() -> Args {
    let mut args = Args {
        ops: 100_000,
        batch: 100,
        reapply_ops: 100_000,
        only: None,
        no_sync: false,
        late: vec![0, 10, 100],
        memory: false,
        list_children: 100_000,
        cache_bytes: arbor::config::PILORAMA_CACHE_BYTES_DEFAULT,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().expect("flag needs a value");
        match arg.as_str() {
            "--ops" => args.ops = value().parse().expect("--ops N"),
            "--batch" => args.batch = value().parse().expect("--batch N"),
            "--reapply" => args.reapply_ops = value().parse().expect("--reapply N"),
            "--only" => args.only = Some(value()),
            "--no-sync" => args.no_sync = true,
            "--memory" => args.memory = true,
            "--cache-bytes" => args.cache_bytes = value().parse().expect("--cache-bytes N"),
            "--list-children" => args.list_children = value().parse().expect("--list-children N"),
            "--late" => {
                args.late = value()
                    .split(',')
                    .map(|k| k.parse().expect("--late K[,K..]"))
                    .collect()
            }
            // cargo bench passes --bench; anything else is ignored too.
            _ => {}
        }
    }
    args
}

fn tree() -> TreeKey {
    TreeKey::new(ContainerId([0xab; 32]), "bench")
}

/// Seven fields, FileName first, like an object version node.
fn object_meta(i: usize) -> Vec<KeyValue> {
    object_meta_named(i, format!("object-{i:08}.bin"))
}

fn object_meta_named(i: usize, name: String) -> Vec<KeyValue> {
    vec![
        KeyValue::new(ATTR_FILE_NAME, name),
        KeyValue::new(
            "OID",
            format!("{:064x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        ),
        KeyValue::new("Owner", "NbUgTSFvPmsRxmGeWpuuGeJUoRoi6PErcM"),
        KeyValue::new("Size", (i * 4096).to_string()),
        KeyValue::new("Created", (1_700_000_000 + i).to_string()),
        KeyValue::new("ContentType", "application/octet-stream"),
        KeyValue::new("ETag", format!("{:032x}", i.wrapping_mul(31))),
    ]
}

/// Unique 3-4 component paths (2-3 directories plus the leaf's FileName):
/// a spread of directories shared by many objects.
fn object_dirs(i: usize) -> Vec<String> {
    let mut dirs = vec![
        format!("bucket-{}", i % 8),
        format!("prefix-{}", (i / 8) % 64),
    ];
    if i % 2 == 1 {
        dirs.push(format!("sub-{}", (i / 512) % 32));
    }
    dirs
}

fn add_request(i: usize) -> WriteRequest {
    WriteRequest {
        tree: tree(),
        op: WriteOp::AddByPath {
            attr: ATTR_FILE_NAME.into(),
            path: object_dirs(i),
            items: object_meta(i),
        },
    }
}

/// Names of the one-directory scenarios: in creation order, or in an
/// order unrelated to it (a bijective scramble of the number).
#[derive(Clone, Copy)]
enum Names {
    InOrder,
    Scrambled,
}

/// Every object in one directory (a bucket's flat prefix).
fn add_one_dir_request(i: usize, names: Names) -> WriteRequest {
    let name = match names {
        Names::InOrder => format!("object-{i:016}.bin"),
        Names::Scrambled => format!(
            "object-{:016x}.bin",
            (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ),
    };
    WriteRequest {
        tree: tree(),
        op: WriteOp::AddByPath {
            attr: ATTR_FILE_NAME.into(),
            path: vec!["bucket-0".into(), "uploads".into()],
            items: object_meta_named(i, name),
        },
    }
}

fn apply_request(op: &Move) -> WriteRequest {
    WriteRequest {
        tree: tree(),
        op: WriteOp::Apply { op: op.clone() },
    }
}

struct Row {
    name: String,
    ops: usize,
    elapsed: Duration,
    commits: Vec<Duration>,
    /// CPU time of the bench thread over the run: unlike wall time it does
    /// not count waiting for fsync or for other processes on the machine.
    /// Sampled from the scheduler, so only meaningful over long runs.
    cpu: Duration,
    /// Bytes handed to the file over the run (redb pages and headers).
    written_bytes: u64,
}

/// CPU time consumed so far by this thread (Linux schedstat; zero where
/// unavailable).
fn thread_cpu() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}

impl Row {
    fn print(&self) {
        let ops_per_s = self.ops as f64 / self.elapsed.as_secs_f64();
        let (p50, p99) = percentiles(&self.commits);
        let cpu_us_per_op = self.cpu.as_secs_f64() * 1e6 / self.ops as f64;
        let kib_per_commit = self.written_bytes as f64 / 1024.0 / self.commits.len() as f64;
        println!(
            "| {:<36} | {:>8} | {:>10.0} | {:>9.3} | {:>9.3} | {:>9.2} | {:>10.1} |",
            self.name,
            self.ops,
            ops_per_s,
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3,
            cpu_us_per_op,
            kib_per_commit
        );
    }
}

fn percentiles(samples: &[Duration]) -> (Duration, Duration) {
    if samples.is_empty() {
        return (Duration::ZERO, Duration::ZERO);
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    (at(0.50), at(0.99))
}

/// A forest on a temp file (in memory with `--memory`), with a counter of
/// the bytes written to it.
fn open_file(dir: &tempfile::TempDir, args: &Args) -> (Forest, Arc<AtomicU64>) {
    let options = ForestOptions {
        durable: !args.no_sync,
        cache_bytes: args.cache_bytes,
        ..ForestOptions::default()
    };
    if args.memory {
        let (backend, written_bytes) = CountingBackend::new(redb::backends::InMemoryBackend::new());
        let forest = Forest::open_with_backend(backend, options).unwrap();
        return (forest, written_bytes);
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.path().join("bench.redb"))
        .unwrap();
    let (backend, written_bytes) =
        CountingBackend::new(redb::backends::FileBackend::new(file).unwrap());
    (
        Forest::open_with_backend(backend, options).unwrap(),
        written_bytes,
    )
}

/// Runs `requests` in batches; returns the wall time, each commit's
/// latency (one `write_batch` call) and the CPU time spent. Never inlined,
/// so that `valgrind --tool=callgrind --toggle-collect='*run_batches*'`
/// counts the measured work alone.
#[inline(never)]
fn run_batches(
    forest: &Forest,
    requests: &[WriteRequest],
    batch: usize,
) -> (Duration, Vec<Duration>, Duration) {
    let mut commits = Vec::with_capacity(requests.len() / batch + 1);
    let cpu_start = thread_cpu();
    let start = Instant::now();
    for chunk in requests.chunks(batch) {
        let begin = Instant::now();
        let results = forest.write_batch(chunk).unwrap().results;
        commits.push(begin.elapsed());
        assert!(results.iter().all(|r| r.is_ok()), "bench request failed");
    }
    (start.elapsed(), commits, thread_cpu() - cpu_start)
}

fn bench_add_by_path(args: &Args) -> Row {
    let dir = tempfile::tempdir().unwrap();
    let (forest, written) = open_file(&dir, args);
    let requests: Vec<WriteRequest> = (0..args.ops).map(add_request).collect();
    written.store(0, Ordering::Relaxed);
    let (elapsed, commits, cpu) = run_batches(&forest, &requests, args.batch);
    Row {
        name: format!("add_by_path, batch {}", args.batch),
        ops: args.ops,
        elapsed,
        commits,
        cpu,
        written_bytes: written.load(Ordering::Relaxed),
    }
}

/// AddByPath into one directory: the children index of one parent grows
/// to `ops` rows, with names arriving in order or scrambled.
fn bench_add_one_dir(args: &Args, names: Names) -> Row {
    let dir = tempfile::tempdir().unwrap();
    let (forest, written) = open_file(&dir, args);
    let requests: Vec<WriteRequest> = (0..args.ops)
        .map(|i| add_one_dir_request(i, names))
        .collect();
    written.store(0, Ordering::Relaxed);
    let (elapsed, commits, cpu) = run_batches(&forest, &requests, args.batch);
    let order = match names {
        Names::InOrder => "names in order",
        Names::Scrambled => "names scrambled",
    };
    Row {
        name: format!("add, 1 dir, {order}, batch {}", args.batch),
        ops: args.ops,
        elapsed,
        commits,
        cpu,
        written_bytes: written.load(Ordering::Relaxed),
    }
}

/// A realistic replicated log of `count` ops: those of AddByPath calls
/// made on another replica (directories included), in timestamp order.
fn source_log(count: usize) -> Vec<Move> {
    let source = Forest::in_memory(ForestOptions {
        replica_id: 2,
        durable: false,
        ..ForestOptions::default()
    })
    .unwrap();
    let requests: Vec<WriteRequest> = (0..count).map(add_request).collect();
    for chunk in requests.chunks(1000) {
        source.write_batch(chunk).unwrap();
    }
    let mut log = source.dump(&tree()).unwrap().log;
    log.truncate(count);
    log
}

/// Arrival order where every odd-numbered op (in timestamp order) arrives
/// `k` positions late: each such op is older than up to `k` stored ops.
fn delayed(log: &[Move], k: usize) -> Vec<Move> {
    let mut keyed: Vec<(usize, &Move)> = log
        .iter()
        .enumerate()
        .map(|(i, op)| (if i % 2 == 1 { i + k } else { i }, op))
        .collect();
    keyed.sort_by_key(|(slot, _)| *slot);
    keyed.into_iter().map(|(_, op)| op.clone()).collect()
}

fn bench_apply(args: &Args, log: &[Move], k: usize) -> Row {
    let dir = tempfile::tempdir().unwrap();
    let (forest, written) = open_file(&dir, args);
    let order = if k == 0 {
        log.to_vec()
    } else {
        delayed(log, k)
    };
    let requests: Vec<WriteRequest> = order.iter().map(apply_request).collect();
    written.store(0, Ordering::Relaxed);
    let (elapsed, commits, cpu) = run_batches(&forest, &requests, args.batch);
    assert_eq!(forest.next_height(&tree()).unwrap(), log.len() as u64);
    let name = if k == 0 {
        format!("apply in order, batch {}", args.batch)
    } else {
        format!("apply, odd ops {k} late, batch {}", args.batch)
    };
    Row {
        name,
        ops: log.len(),
        elapsed,
        commits,
        cpu,
        written_bytes: written.load(Ordering::Relaxed),
    }
}

fn bench_reapply(args: &Args, log: &[Move]) -> Row {
    let dir = tempfile::tempdir().unwrap();
    let (forest, written) = open_file(&dir, args);
    let requests: Vec<WriteRequest> = log.iter().map(apply_request).collect();
    for chunk in requests.chunks(1000) {
        forest.write_batch(chunk).unwrap();
    }
    written.store(0, Ordering::Relaxed);
    let (elapsed, commits, cpu) = run_batches(&forest, &requests, args.batch);
    assert_eq!(forest.next_height(&tree()).unwrap(), log.len() as u64);
    Row {
        name: format!("re-apply stored log, batch {}", args.batch),
        ops: log.len(),
        elapsed,
        commits,
        cpu,
        written_bytes: written.load(Ordering::Relaxed),
    }
}

/// The floor under every durable commit: one small write plus fsync on
/// the same file system.
fn bench_fsync(dir: &tempfile::TempDir, size_kib: usize) -> Row {
    use std::io::Write;
    let mut file = std::fs::File::create(dir.path().join("fsync.probe")).unwrap();
    let block = vec![0x5a_u8; size_kib * 1024];
    let mut samples = Vec::new();
    let cpu_start = thread_cpu();
    let start = Instant::now();
    for _ in 0..100 {
        let begin = Instant::now();
        file.write_all(&block).unwrap();
        file.sync_data().unwrap();
        samples.push(begin.elapsed());
    }
    Row {
        name: format!("fsync after a {size_kib} KiB append"),
        ops: 100,
        elapsed: start.elapsed(),
        commits: samples,
        cpu: thread_cpu() - cpu_start,
        written_bytes: (size_kib * 1024 * 100) as u64,
    }
}

fn bench_empty_commit(dir: &tempfile::TempDir, args: &Args) -> Row {
    let (forest, written) = open_file(dir, args);
    let mut samples = Vec::new();
    let cpu_start = thread_cpu();
    let start = Instant::now();
    for i in 0..200u64 {
        let begin = Instant::now();
        forest.set_cursor_for_bench(i);
        samples.push(begin.elapsed());
    }
    Row {
        name: "one-row redb commit".into(),
        ops: 200,
        elapsed: start.elapsed(),
        commits: samples,
        cpu: thread_cpu() - cpu_start,
        written_bytes: written.load(Ordering::Relaxed),
    }
}

/// Resident memory of this process (Linux; 0 where unavailable).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// How one listing went: pages, nodes, time and resident memory.
struct ListRow {
    name: String,
    pages: usize,
    nodes: usize,
    elapsed: Duration,
    /// CPU time of the bench thread over the listing.
    cpu: Duration,
    rss_before: u64,
    rss_growth_max: u64,
}

impl ListRow {
    fn print(&self) {
        let per_s = self.nodes as f64 / self.elapsed.as_secs_f64();
        let ms_per_page = self.elapsed.as_secs_f64() * 1e3 / self.pages as f64;
        let cpu_us_per_node = self.cpu.as_secs_f64() * 1e6 / self.nodes as f64;
        println!(
            "| {:<58} | {:>6} | {:>9} | {:>10.0} | {:>8.2} | {:>8.2} | {:>8.1} | {:>8.1} |",
            self.name,
            self.pages,
            self.nodes,
            per_s,
            ms_per_page,
            cpu_us_per_node,
            self.rss_before as f64 / (1 << 20) as f64,
            self.rss_growth_max as f64 / (1 << 20) as f64,
        );
    }
}

/// Pages through a listing until it ends or `max_pages` pages are read;
/// `page` reads one page after a cursor.
fn run_listing(
    name: String,
    max_pages: usize,
    mut page: impl FnMut(Option<&ListCursor>) -> ListPage,
) -> ListRow {
    let rss_before = rss_bytes();
    let mut rss_growth_max = 0;
    let (mut pages, mut nodes) = (0, 0);
    let mut after = None;
    let cpu_start = thread_cpu();
    let start = Instant::now();
    while pages < max_pages {
        let got = page(after.as_ref());
        pages += 1;
        nodes += got.nodes.len();
        rss_growth_max = rss_growth_max.max(rss_bytes().saturating_sub(rss_before));
        match got.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    ListRow {
        name,
        pages,
        nodes,
        elapsed: start.elapsed(),
        cpu: thread_cpu() - cpu_start,
        rss_before,
        rss_growth_max,
    }
}

/// One directory of `--list-children` children named in creation order
/// or scrambled (written in batches of 1,000), listed in pages of 1,000: children in
/// name order, the directory's subtree (depth 2) in name order, children
/// in id order (a few pages); after the write, and again after reopening.
fn bench_list(args: &Args, names: Names) -> Vec<ListRow> {
    let dir = tempfile::tempdir().unwrap();
    let (forest, _) = open_file(&dir, args);
    let mut directory = None;
    // Made a batch at a time: the process's memory stays what a node's is.
    for first in (0..args.list_children).step_by(1000) {
        let last = (first + 1000).min(args.list_children);
        let batch: Vec<WriteRequest> = (first..last)
            .map(|i| add_one_dir_request(i, names))
            .collect();
        let results = forest.write_batch(&batch).unwrap().results;
        if let Ok(WriteOutcome::AddedByPath { created, .. }) = &results[0] {
            directory = directory.or(created.last().copied());
        }
    }
    let names = match names {
        Names::InOrder => "names in order",
        Names::Scrambled => "scrambled",
    };
    let directory = directory.expect("the first add made the directory");
    // What the service allows one answer (4 MiB messages).
    let bounds = AnswerBounds {
        nodes_max: 1000,
        bytes_max: (4 << 20) - (8 << 10),
        node_overhead_bytes: 64,
    };
    let mut rows = Vec::new();
    let mut forest = Some(forest);
    for state in ["after writes", "reopened"] {
        if state == "reopened" {
            drop(forest.take());
            forest = Some(open_file(&dir, args).0);
        }
        let forest = forest.as_ref().unwrap();
        let n = args.list_children;
        let children = |order, after: Option<&ListCursor>| {
            let page = forest.list_children_page(&tree(), directory, order, after, bounds);
            page.unwrap()
        };
        let row = run_listing(
            format!("children by name, {names}, {state}"),
            usize::MAX,
            |after| children(ListOrder::Name, after),
        );
        assert_eq!(row.nodes, n, "every child listed once");
        rows.push(row);
        let row = run_listing(
            format!("subtree depth 2 by name, {names}, {state}"),
            usize::MAX,
            |after| {
                let page =
                    forest.get_subtree_page(&tree(), directory, 2, ListOrder::Name, after, bounds);
                page.unwrap()
            },
        );
        assert_eq!(row.nodes, n + 1, "the directory and every child");
        rows.push(row);
        rows.push(run_listing(
            format!("children by id (5 pages), {names}, {state}"),
            5,
            |after| children(ListOrder::Id, after),
        ));
    }
    rows
}

/// Commits a one-row write through the public API (a cursor bump).
trait CursorBump {
    fn set_cursor_for_bench(&self, value: u64);
}

impl CursorBump for Forest {
    fn set_cursor_for_bench(&self, value: u64) {
        if value == 0 {
            let seed = WriteRequest {
                tree: tree(),
                op: WriteOp::Move {
                    parent: ROOT,
                    child: None,
                    items: vec![],
                },
            };
            self.write_batch(&[seed]).unwrap();
        }
        self.set_cursor(&tree(), CursorKind::Pull, 1, value)
            .unwrap();
    }
}

fn main() {
    let args = parse_args();
    let wanted = |name: &str| args.only.as_deref().is_none_or(|o| name.starts_with(o));
    println!(
        "ops={} batch={} reapply={} durable={} cache_bytes={} ({})",
        args.ops,
        args.batch,
        args.reapply_ops,
        !args.no_sync,
        args.cache_bytes,
        if args.memory {
            "in memory"
        } else {
            "temp file"
        }
    );
    println!(
        "| {:<36} | {:>8} | {:>10} | {:>9} | {:>9} | {:>9} | {:>10} |",
        "scenario", "ops", "ops/s", "p50 ms", "p99 ms", "cpu us/op", "KiB/commit"
    );
    println!(
        "|{:-<38}|{:-<10}|{:-<12}|{:-<11}|{:-<11}|{:-<11}|{:-<12}|",
        "", "", "", "", "", "", ""
    );
    let floor_dir = tempfile::tempdir().unwrap();
    if wanted("floor") {
        for size_kib in [4, 64, 512] {
            bench_fsync(&floor_dir, size_kib).print();
        }
        bench_empty_commit(&floor_dir, &args).print();
    }
    if wanted("add_by_path") {
        bench_add_by_path(&args).print();
    }
    if wanted("add_one_dir") {
        bench_add_one_dir(&args, Names::InOrder).print();
        bench_add_one_dir(&args, Names::Scrambled).print();
    }
    if wanted("apply") {
        let log = source_log(args.ops);
        for &k in &args.late {
            bench_apply(&args, &log, k).print();
        }
    }
    if wanted("reapply") {
        let log = source_log(args.reapply_ops);
        bench_reapply(&args, &log).print();
    }
    // Not part of the default run: its table has other columns.
    if args.only.as_deref().is_some_and(|o| "list".starts_with(o)) {
        println!();
        println!(
            "listing one directory of {} children, pages of 1000",
            args.list_children
        );
        println!(
            "| {:<58} | {:>6} | {:>9} | {:>10} | {:>8} | {:>8} | {:>8} | {:>8} |",
            "listing", "pages", "nodes", "nodes/s", "ms/page", "cpu us/node", "RSS MiB", "grew MiB"
        );
        println!(
            "|{:-<60}|{:-<8}|{:-<11}|{:-<12}|{:-<10}|{:-<10}|{:-<10}|{:-<10}|",
            "", "", "", "", "", "", "", ""
        );
        for names in [Names::InOrder, Names::Scrambled] {
            for row in bench_list(&args, names) {
                row.print();
            }
        }
    }
}
