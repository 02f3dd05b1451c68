//! What every side reports: wall time, CPU time of the bench thread and
//! the bytes handed to the file, per batch of AddByPath calls.

use arbor::forest::CountingBackend;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// CPU time consumed so far by this thread (Linux schedstat; zero where
/// unavailable). Unlike wall time it leaves out fsync waits and other
/// processes on the machine.
pub fn thread_cpu() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}

/// A file-backed, counting redb backend in `dir`.
pub fn counting_file(
    dir: &std::path::Path,
) -> (CountingBackend<redb::backends::FileBackend>, Arc<AtomicU64>) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join("bench.redb"))
        .expect("bench file opens");
    CountingBackend::new(redb::backends::FileBackend::new(file).expect("redb file backend"))
}

/// One side's run.
pub struct Row {
    pub name: String,
    pub ops: usize,
    pub commits: usize,
    pub elapsed: Duration,
    pub cpu: Duration,
    /// `None` for a side that writes no file.
    pub written_bytes: Option<u64>,
    /// fsyncs of every file (`None`: not counted).
    pub syncs: Option<u64>,
    /// Checkpoints of a run on the write-ahead log.
    pub checkpoints: Option<Checkpoints>,
}

/// The durable redb commits of a run on the write-ahead log, and the
/// time of the batches (or final call) that made them.
pub struct Checkpoints {
    pub count: u64,
    pub time: Duration,
}

impl Row {
    pub fn ops_per_s(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }

    pub fn print(&self, reference_ops_per_s: f64) {
        let cpu_us_per_op = self.cpu.as_secs_f64() * 1e6 / self.ops as f64;
        let kib = match self.written_bytes {
            Some(b) => format!("{:.1}", b as f64 / 1024.0 / self.commits.max(1) as f64),
            None => "no file".into(),
        };
        let bytes_per_op = match self.written_bytes {
            Some(b) => format!("{:.0}", b as f64 / self.ops as f64),
            None => "-".into(),
        };
        let syncs = match self.syncs {
            Some(n) => format!("{:.0}", n as f64 / self.elapsed.as_secs_f64()),
            None => "-".into(),
        };
        let checkpoints = match &self.checkpoints {
            Some(c) => format!(
                "{} x {:.1} ms",
                c.count,
                c.time.as_secs_f64() * 1e3 / c.count.max(1) as f64
            ),
            None => "-".into(),
        };
        println!(
            "| {:<46} | {:>8} | {:>10.0} | {:>9.2} | {:>10} | {:>7} | {:>8} | {:>14} | {:>6.2}x |",
            self.name,
            self.ops,
            self.ops_per_s(),
            cpu_us_per_op,
            kib,
            bytes_per_op,
            syncs,
            checkpoints,
            self.ops_per_s() / reference_ops_per_s
        );
    }
}

pub fn print_header() {
    println!(
        "| {:<46} | {:>8} | {:>10} | {:>9} | {:>10} | {:>7} | {:>8} | {:>14} | {:>7} |",
        "side",
        "ops",
        "ops/s",
        "cpu us/op",
        "KiB/commit",
        "B/op",
        "fsyncs/s",
        "checkpoints",
        "/ Arbor"
    );
    println!(
        "|{:-<48}|{:-<9}:|{:-<11}:|{:-<10}:|{:-<11}:|{:-<8}:|{:-<9}:|{:-<15}:|{:-<8}:|",
        "", "", "", "", "", "", "", "", ""
    );
}

/// Runs `batch` over `count` objects in chunks and measures it; `batch`
/// is given each chunk's first index and length.
pub fn timed(
    count: usize,
    batch: usize,
    mut run: impl FnMut(usize, usize),
) -> (Duration, Duration) {
    assert!(batch >= 1, "a batch holds at least one call");
    let cpu_start = thread_cpu();
    let start = Instant::now();
    let mut first = 0;
    while first < count {
        let len = batch.min(count - first);
        run(first, len);
        first += len;
    }
    (start.elapsed(), thread_cpu() - cpu_start)
}
