//! Calibrates sim mode's disk from real measurements: the same batches of
//! user-scenario writes are committed on a real redb file and on the
//! simulated disk; the real time per commit is then explained by what the
//! simulated disk counted (fsyncs and bytes written).
//!
//! In a simulation, CPU time is free: only the disk's latency advances the
//! clock. So the fitted latency stands for the whole commit (CPU, page
//! writes and fsyncs), which is what a caller waits for.

use super::scenario::Scenario;
use crate::disk::{DiskConfig, DiskLatency, DiskStats, SimDisk};
use arbor::forest::{Forest, ForestOptions, WriteOp, WriteRequest};
use arbor::proto::Request;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// One measured batch size.
#[derive(Clone, Debug, Default)]
pub struct Measurement {
    pub batch_size: usize,
    pub batches: usize,
    pub real_durable: Duration,
    pub real_no_sync: Duration,
    /// Per commit, on the simulated disk.
    pub syncs: f64,
    pub writes: f64,
    pub bytes: f64,
}

/// The measurements and the fitted disk.
#[derive(Clone, Debug)]
pub struct Calibration {
    pub measurements: Vec<Measurement>,
    pub fitted: DiskLatency,
}

/// Turns a user-scenario request into a forest write.
fn write_of(request: Request) -> WriteRequest {
    match request {
        Request::AddByPath {
            tree,
            attr,
            path,
            items,
        } => WriteRequest {
            tree,
            op: WriteOp::AddByPath { attr, path, items },
        },
        other => unreachable!("the user scenario only sends AddByPath, got {other:?}"),
    }
}

fn batches(size: usize, count: usize, first: u64) -> Vec<Vec<WriteRequest>> {
    let user = Scenario::user(1, Duration::ZERO, 16);
    (0..count)
        .map(|b| {
            (0..size)
                .map(|i| write_of(user.request(first + (b * size + i) as u64)))
                .collect()
        })
        .collect()
}

/// Mean wall time per commit on a real file.
fn time_real(
    dir: &std::path::Path,
    durable: bool,
    size: usize,
    count: usize,
) -> Result<Duration, String> {
    let path = dir.join(format!("calibrate-{size}-{durable}.redb"));
    let options = ForestOptions {
        durable,
        ..ForestOptions::default()
    };
    let forest =
        Forest::open(&path, options).map_err(|e| format!("open {}: {e}", path.display()))?;
    // A warm-up tree so that the measured commits are not the first ones.
    for batch in batches(size, 10, 1 << 40) {
        forest.write_batch(&batch).map_err(|e| e.to_string())?;
    }
    let work = batches(size, count, 0);
    let started = Instant::now();
    for batch in &work {
        forest.write_batch(batch).map_err(|e| e.to_string())?;
    }
    Ok(started.elapsed() / count as u32)
}

/// What the simulated disk sees per commit of the same batches.
fn count_sim(size: usize, count: usize) -> Result<(f64, f64, f64), String> {
    let disk = SimDisk::new(DiskConfig {
        capacity_bytes: 4 << 30,
        ..DiskConfig::reliable(1)
    });
    let forest = Forest::open_with_backend(disk.backend(), ForestOptions::default())
        .map_err(|e| e.to_string())?;
    for batch in batches(size, 10, 1 << 40) {
        forest.write_batch(&batch).map_err(|e| e.to_string())?;
    }
    let before: DiskStats = disk.stats();
    for batch in batches(size, count, 0) {
        forest.write_batch(&batch).map_err(|e| e.to_string())?;
    }
    let after = disk.stats();
    let n = count as f64;
    Ok((
        (after.syncs - before.syncs) as f64 / n,
        (after.writes - before.writes) as f64 / n,
        (after.bytes_written - before.bytes_written) as f64 / n,
    ))
}

/// Measures batch sizes 1, 10 and 100 and fits per-sync and per-byte costs.
pub fn run(dir: &std::path::Path, commits: usize) -> Result<Calibration, String> {
    let mut measurements = Vec::new();
    for size in [1usize, 10, 100] {
        let count = (commits * 10 / size).clamp(20, commits);
        let (syncs, writes, bytes) = count_sim(size, count)?;
        measurements.push(Measurement {
            batch_size: size,
            batches: count,
            real_durable: time_real(dir, true, size, count)?,
            real_no_sync: time_real(dir, false, size, count)?,
            syncs,
            writes,
            bytes,
        });
    }
    let fitted = fit(&measurements);
    Ok(Calibration {
        measurements,
        fitted,
    })
}

/// Least squares for `time = per_sync * syncs + per_byte * bytes` through
/// the origin; negative coefficients are clamped to zero.
fn fit(ms: &[Measurement]) -> DiskLatency {
    let (mut ss, mut sb, mut bb, mut st, mut bt) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for m in ms {
        let t = m.real_durable.as_secs_f64() * 1e9;
        ss += m.syncs * m.syncs;
        sb += m.syncs * m.bytes;
        bb += m.bytes * m.bytes;
        st += m.syncs * t;
        bt += m.bytes * t;
    }
    let det = ss * bb - sb * sb;
    let (per_sync_ns, per_byte_ns) = if det.abs() < f64::EPSILON {
        (if ss > 0.0 { st / ss } else { 0.0 }, 0.0)
    } else {
        ((st * bb - bt * sb) / det, (ss * bt - sb * st) / det)
    };
    DiskLatency {
        per_write: Duration::ZERO,
        per_sync: Duration::from_nanos(per_sync_ns.max(0.0) as u64),
        per_byte_nanos: per_byte_ns.max(0.0).round() as u64,
    }
}

impl Calibration {
    pub fn text(&self) -> String {
        let mut out = String::from(
            "batch  commits  real durable  real no_sync  syncs/commit  writes/commit  bytes/commit  model\n",
        );
        for m in &self.measurements {
            let model = self.fitted.per_sync.as_secs_f64() * 1e6 * m.syncs
                + self.fitted.per_byte_nanos as f64 * m.bytes / 1000.0;
            let _ = writeln!(
                out,
                "{:>5}  {:>7}  {:>10.0}µs  {:>10.0}µs  {:>12.1}  {:>13.1}  {:>12.0}  {:>6.0}µs",
                m.batch_size,
                m.batches,
                m.real_durable.as_secs_f64() * 1e6,
                m.real_no_sync.as_secs_f64() * 1e6,
                m.syncs,
                m.writes,
                m.bytes,
                model
            );
        }
        let _ = writeln!(
            out,
            "fitted: per_sync = {:?}, per_byte = {} ns, per_write = 0",
            self.fitted.per_sync, self.fitted.per_byte_nanos
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_recovers_a_linear_model() {
        let m = |syncs: f64, bytes: f64| Measurement {
            syncs,
            bytes,
            real_durable: Duration::from_nanos((syncs * 500_000.0 + bytes * 3.0) as u64),
            ..Measurement::default()
        };
        let d = fit(&[m(2.0, 8192.0), m(2.0, 40_000.0), m(2.0, 300_000.0)]);
        assert_eq!(d.per_byte_nanos, 3);
        assert!((d.per_sync.as_nanos() as i64 - 500_000).abs() < 10, "{d:?}");
    }
}
