//! CPU time of groups of threads (Linux): how much of the process's CPU
//! the nodes took and how much the generator took, in a run where both
//! share one process.
//!
//! Real mode runs the nodes and the generator on two tokio runtimes; each
//! runtime's threads (workers and blocking threads) join a
//! [`ThreadGroup`] as they start (`on_thread_start`) and leave it as they
//! stop. A group's CPU time is the user + system time the kernel counts
//! for each of its live threads (`/proc/self/task/TID/stat`), plus what
//! its threads had used when they stopped: a blocking thread that idles
//! out during the run takes its time with it otherwise.

use serde::Serialize;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The kernel's unit of `utime`/`stime` in `/proc/.../stat`: USER_HZ,
/// 100 on every Linux architecture Arbor builds for.
pub const TICKS_PER_SECOND: u64 = 100;

/// The calling thread's id (Linux), from the link `/proc/thread-self`
/// (`PID/task/TID`).
fn current_tid() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// `utime + stime` in ticks from a `stat` file's text: fields 14 and 15,
/// counted after the command name, which is in parentheses and may hold
/// spaces or parentheses itself.
fn stat_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Field 3 (state) is the first after the name.
    let mut fields = after_name.split_whitespace().skip(14 - 3);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn thread_ticks(tid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    stat_ticks(&stat)
}

/// CPU ticks of the whole process so far, every thread's, the exited ones'
/// too; `None` where `/proc` cannot tell.
pub fn process_ticks() -> Option<u64> {
    stat_ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// Threads counted together.
#[derive(Default)]
pub struct ThreadGroup {
    /// Live threads by id.
    live: Mutex<BTreeSet<u32>>,
    /// Ticks of the group's threads that stopped.
    exited_ticks: AtomicU64,
    /// Threads that joined so far.
    joined: AtomicUsize,
    /// Threads whose id `/proc` would not tell: their time is missing.
    unknown: AtomicUsize,
}

impl ThreadGroup {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn live(&self) -> std::sync::MutexGuard<'_, BTreeSet<u32>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts the calling thread in this group from now on.
    pub fn join_current(&self) {
        self.joined.fetch_add(1, Ordering::Relaxed);
        match current_tid() {
            Some(tid) => {
                self.live().insert(tid);
            }
            None => {
                self.unknown.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The calling thread stops: its time so far stays with the group.
    pub fn leave_current(&self) {
        let Some(tid) = current_tid() else { return };
        // Read before it leaves the live set, so that a reading of the
        // group never misses the thread's time: at worst it counts it
        // twice for an instant, never zero times.
        let ticks = thread_ticks(tid).unwrap_or(0);
        self.exited_ticks.fetch_add(ticks, Ordering::Relaxed);
        self.live().remove(&tid);
    }

    /// The group's CPU ticks so far.
    pub fn ticks(&self) -> u64 {
        let live: Vec<u32> = self.live().iter().copied().collect();
        let exited = self.exited_ticks.load(Ordering::Relaxed);
        exited
            + live
                .iter()
                .filter_map(|&tid| thread_ticks(tid))
                .sum::<u64>()
    }

    /// Threads that joined so far.
    pub fn threads(&self) -> usize {
        self.joined.load(Ordering::Relaxed)
    }

    /// Threads that joined but could not be counted (no `/proc`).
    pub fn uncounted(&self) -> usize {
        self.unknown.load(Ordering::Relaxed)
    }
}

/// A multi-thread tokio runtime whose threads are counted in `group` and
/// named `name` (profiles tell the groups apart by it).
pub fn counted_runtime(
    name: &str,
    workers: usize,
    group: Arc<ThreadGroup>,
) -> std::io::Result<tokio::runtime::Runtime> {
    let leaving = group.clone();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.max(1))
        .thread_name(name)
        .enable_all()
        .on_thread_start(move || group.join_current())
        .on_thread_stop(move || leaving.leave_current())
        .build()
}

/// Where the CPU of a real-mode run went while the load ran.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CpuUse {
    /// CPU seconds of the nodes' threads: services, servers (TCP, gRPC),
    /// replication, commits on blocking threads.
    pub nodes_s: f64,
    /// CPU seconds of the generator's threads: scheduling, the gateway's
    /// client side (encoding, signing, its connections).
    pub generator_s: f64,
    /// CPU seconds of the whole process over the same span (the two
    /// above, plus the sampler thread and the main thread).
    pub process_s: f64,
    /// Requests the generator got an answer to (each call of a sequence
    /// counts).
    pub requests: u64,
    pub nodes_us_per_request: f64,
    pub generator_us_per_request: f64,
    /// Wall seconds the span lasted.
    pub span_s: f64,
}

impl CpuUse {
    /// From tick counts measured at the span's start and end.
    pub fn of(nodes: Ticks, generator: Ticks, process: Ticks, requests: u64, span_s: f64) -> Self {
        let seconds = |t: Ticks| t.1.saturating_sub(t.0) as f64 / TICKS_PER_SECOND as f64;
        let per_request = |s: f64| match requests {
            0 => 0.0,
            n => s * 1e6 / n as f64,
        };
        let (nodes_s, generator_s) = (seconds(nodes), seconds(generator));
        Self {
            nodes_s,
            generator_s,
            process_s: seconds(process),
            requests,
            nodes_us_per_request: per_request(nodes_s),
            generator_us_per_request: per_request(generator_s),
            span_s,
        }
    }

    /// "nodes 12.3 s CPU (82.0 µs/request), generator 4.1 s (27.3 µs/request), process 16.9 s".
    pub fn text(&self) -> String {
        format!(
            "nodes {:.2} s CPU ({:.1} µs/request), generator {:.2} s ({:.1} µs/request), \
             whole process {:.2} s, over {:.1} s and {} answered requests",
            self.nodes_s,
            self.nodes_us_per_request,
            self.generator_s,
            self.generator_us_per_request,
            self.process_s,
            self.span_s,
            self.requests
        )
    }
}

/// Ticks at a span's start and end.
pub type Ticks = (u64, u64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_the_command_name() {
        // A command name with spaces and a parenthesis, as a thread may
        // be named; utime 1234 and stime 56 are fields 14 and 15.
        let stat = "4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 1234 56 0 0 20 0 9 0 100 200 300";
        assert_eq!(stat_ticks(stat), Some(1290));
        assert_eq!(stat_ticks("4242 (x) S 1 2"), None);
    }

    const BUSY_TICKS: u64 = 20;

    /// A thread's busy time shows in its group, stays there once the
    /// thread has stopped, and the group never counts more than the
    /// process.
    #[test]
    fn a_group_keeps_the_time_of_its_stopped_threads() {
        let group = ThreadGroup::new();
        let process_before = process_ticks().expect("/proc/self/stat");
        let before = group.ticks();
        let member = group.clone();
        std::thread::spawn(move || {
            member.join_current();
            let tid = current_tid().expect("/proc/thread-self");
            let start = thread_ticks(tid).expect("the thread's stat");
            // Busy until the kernel has counted 20 ticks (200 ms) of CPU
            // for this thread, however long a loaded host takes for it.
            let mut x = 0u64;
            while thread_ticks(tid).expect("the thread's stat") < start + BUSY_TICKS {
                for _ in 0..100_000 {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            }
            member.leave_current();
        })
        .join()
        .expect("the busy thread ends");
        let after = group.ticks();
        let process_after = process_ticks().expect("/proc/self/stat");
        assert_eq!(group.threads(), 1);
        assert_eq!(group.uncounted(), 0);
        assert!(after - before >= BUSY_TICKS, "{before} -> {after} ticks");
        assert!(
            after - before <= process_after - process_before + 1,
            "group {} ticks, process {}",
            after - before,
            process_after - process_before
        );
    }
}
