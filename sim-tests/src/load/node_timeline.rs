//! A per-second record of each node under a real-mode load: the batcher's
//! queue, what its commits took, replication's traffic and backlog, and
//! the database file's size. A latency step in the summary's windows is
//! explained by the row that changes with it (a commit that takes the
//! whole second, a push backlog, a file that grows).

use super::metrics::WindowStats;
use arbor::service::{Service, ServiceStats};
use arbor::types::ReplicaId;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One node over one sampling interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NodeSecond {
    /// End of the interval, seconds since the load started.
    pub at_s: f64,
    pub replica: ReplicaId,
    /// Writes admitted and not answered at the end (the batcher's queue).
    pub pending_writes: u64,
    /// Commits and the writes they held, in the interval.
    pub commits: u64,
    pub writes: u64,
    /// Time the commits took / the interval: 1.0 is a batcher that did
    /// nothing but commit.
    pub commit_busy: f64,
    pub commit_ms_avg: f64,
    /// Of the commits, those that were checkpoints (durable, with a
    /// write-ahead log): each stalls the batcher for its whole duration.
    pub checkpoints: u64,
    pub ops_pushed: u64,
    pub ops_pulled: u64,
    /// (tree, peer) pairs waiting for a push worker at the end: queued,
    /// in the backlog, or backing off.
    pub push_pairs_waiting: u64,
    pub push_failures: u64,
    pub rejected: u64,
    /// Size of the node's database file at the end.
    pub file_mib: f64,
}

impl NodeSecond {
    /// The row of `replica` between two snapshots `interval` apart.
    pub fn between(
        at_s: f64,
        replica: ReplicaId,
        before: &ServiceStats,
        after: &ServiceStats,
        interval: Duration,
        file_bytes: u64,
    ) -> Self {
        let delta = |f: fn(&ServiceStats) -> u64| f(after).saturating_sub(f(before));
        let commits = delta(|s| s.batches_committed + s.batches_failed);
        let commit_us = delta(|s| s.commit_us);
        let interval_us = interval.as_micros().max(1) as f64;
        Self {
            at_s,
            replica,
            pending_writes: after.pending_writes,
            commits,
            writes: delta(|s| s.writes_committed),
            commit_busy: commit_us as f64 / interval_us,
            commit_ms_avg: match commits {
                0 => 0.0,
                n => commit_us as f64 / n as f64 / 1000.0,
            },
            checkpoints: delta(|s| s.wal.checkpoints),
            ops_pushed: delta(|s| s.ops_pushed),
            ops_pulled: delta(|s| s.ops_pulled),
            push_pairs_waiting: after.push_pairs_queued
                + after.push_pairs_backlog
                + after.push_pairs_delayed,
            push_failures: delta(|s| s.push_failures),
            rejected: delta(|s| s.writes_rejected_overload),
            file_mib: file_bytes as f64 / (1024.0 * 1024.0),
        }
    }
}

/// The nodes a sampler watches: each service and its database file.
pub struct Watched {
    pub services: Vec<Arc<Service>>,
    pub files: Vec<PathBuf>,
}

/// Samples every `interval` of wall time until `stop`. Runs on a thread
/// of its own: the runtime's workers are what is being measured, and a
/// sampler queued behind them would shift its own intervals.
pub fn sample(watched: Watched, interval: Duration, stop: Arc<AtomicBool>) -> Vec<NodeSecond> {
    assert_eq!(watched.services.len(), watched.files.len());
    let start = Instant::now();
    let mut before: Vec<ServiceStats> = watched.services.iter().map(|s| s.stats()).collect();
    let mut last = start;
    let mut rows = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(interval);
        let now = Instant::now();
        let at_s = now.duration_since(start).as_secs_f64();
        for (i, service) in watched.services.iter().enumerate() {
            let after = service.stats();
            let bytes = std::fs::metadata(&watched.files[i]).map_or(0, |m| m.len());
            let replica = service.config().node.replica_id;
            let row = NodeSecond::between(at_s, replica, &before[i], &after, now - last, bytes);
            rows.push(row);
            before[i] = after;
        }
        last = now;
    }
    rows
}

/// The timeline as a text table, one line per node and interval, each
/// beside the p50 latency and the generator's start lag of `windows` (a
/// scenario's one-second windows) in the same second.
pub fn text(rows: &[NodeSecond], windows: &[WindowStats]) -> String {
    let mut out = String::from(
        "\n  node timeline (per interval: the scenario's p50 and generator lag; commits, \
         writes/commit, commit ms avg, share of time committing, checkpoints, queue at the \
         end, ops pushed/pulled, push pairs waiting, file)\n",
    );
    let _ = writeln!(
        out,
        "  {:>6} {:>8} {:>8} {:>4} {:>7} {:>7} {:>8} {:>5} {:>4} {:>6} {:>7} {:>7} {:>5} {:>8}",
        "s",
        "p50 ms",
        "lag ms",
        "node",
        "commits",
        "w/c",
        "ms/c",
        "busy",
        "ckpt",
        "queue",
        "pushed",
        "pulled",
        "wait",
        "file MiB"
    );
    for r in rows {
        let window = windows
            .iter()
            .find(|w| w.start_s <= r.at_s - 0.5 && r.at_s - 0.5 < w.start_s + 1.0);
        let (p50_ms, lag_ms) = window.map_or((0.0, 0.0), |w| (w.p50_ms, w.start_lag_max_ms));
        let per_commit = match r.commits {
            0 => 0.0,
            n => r.writes as f64 / n as f64,
        };
        let _ = writeln!(
            out,
            "  {:>6.1} {:>8.1} {:>8.1} {:>4} {:>7} {:>7.1} {:>8.2} {:>5.2} {:>4} {:>6} {:>7} {:>7} {:>5} {:>8.1}",
            r.at_s,
            p50_ms,
            lag_ms,
            r.replica,
            r.commits,
            per_commit,
            r.commit_ms_avg,
            r.commit_busy,
            r.checkpoints,
            r.pending_writes,
            r.ops_pushed,
            r.ops_pulled,
            r.push_pairs_waiting,
            r.file_mib
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbor::forest::wal::WalStats;

    /// Deltas, averages and the busy share come from the two snapshots;
    /// gauges from the later one.
    #[test]
    fn a_row_is_the_difference_of_two_snapshots() {
        let before = ServiceStats {
            writes_committed: 1000,
            batches_committed: 10,
            commit_us: 50_000,
            wal: WalStats {
                checkpoints: 2,
                ..WalStats::default()
            },
            ops_pushed: 7,
            pending_writes: 99,
            ..ServiceStats::default()
        };
        let after = ServiceStats {
            writes_committed: 1600,
            batches_committed: 13,
            batches_failed: 1,
            commit_us: 850_000,
            wal: WalStats {
                checkpoints: 3,
                ..WalStats::default()
            },
            ops_pushed: 1207,
            pending_writes: 4,
            push_pairs_backlog: 2,
            push_pairs_queued: 1,
            ..ServiceStats::default()
        };
        let row = NodeSecond::between(2.0, 3, &before, &after, Duration::from_secs(1), 1 << 21);
        assert_eq!((row.commits, row.writes, row.ops_pushed), (4, 600, 1200));
        assert_eq!(row.checkpoints, 1);
        assert!((row.commit_busy - 0.8).abs() < 1e-9, "{}", row.commit_busy);
        assert!((row.commit_ms_avg - 200.0).abs() < 1e-9);
        assert_eq!((row.pending_writes, row.push_pairs_waiting), (4, 3));
        assert!((row.file_mib - 2.0).abs() < 1e-9);
        let idle = NodeSecond::between(3.0, 3, &after, &after, Duration::from_secs(1), 0);
        assert_eq!(
            (idle.commits, idle.commit_ms_avg, idle.commit_busy),
            (0, 0.0, 0.0)
        );
        assert!(text(&[row, idle], &[]).contains("1200"));
    }
}
