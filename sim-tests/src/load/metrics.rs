//! Recording what happened: per scenario, HDR histograms of latency over the
//! whole run, and one-second windows (counts and percentiles) for the
//! over-time charts. Windows are closed as time moves on, so a long run
//! keeps a few numbers per second, not every sample.

use arbor::error::Error;
use arbor::proto::Response;
use arbor::types::NodeId;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Latencies are recorded in microseconds, from 1 µs to this bound (well
/// past any deadline the generator uses; larger values saturate).
const LATENCY_US_MAX: u64 = 120_000_000;

/// Why an iteration failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum ErrorKind {
    /// No answer within the generator's deadline.
    Deadline,
    /// The service refused the write because its queue was full.
    Overloaded,
    /// The service answered with its own timeout.
    Timeout,
    Network,
    Storage,
    ShuttingDown,
    /// Any other error, or an answer of the wrong kind.
    Other,
}

impl ErrorKind {
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Deadline => "deadline",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Network => "network",
            ErrorKind::Storage => "storage",
            ErrorKind::ShuttingDown => "shutting_down",
            ErrorKind::Other => "other",
        }
    }
}

/// The result of one iteration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged; the id of the node it created, if any.
    Ok {
        node: Option<NodeId>,
    },
    Failed(ErrorKind),
}

impl Outcome {
    /// Classifies a response (`None`: the deadline passed first).
    pub fn from_response(response: Option<Response>) -> Self {
        match response {
            None => Outcome::Failed(ErrorKind::Deadline),
            Some(Response::Added { node }) => Outcome::Ok { node: Some(node) },
            Some(Response::AddedByPath { leaf, .. }) => Outcome::Ok { node: Some(leaf) },
            Some(Response::Error(e)) => Outcome::Failed(classify(&e)),
            Some(Response::Done) => Outcome::Ok { node: None },
            Some(_) => Outcome::Failed(ErrorKind::Other),
        }
    }
}

fn classify(error: &Error) -> ErrorKind {
    match error {
        Error::Overloaded(_) => ErrorKind::Overloaded,
        Error::Timeout => ErrorKind::Timeout,
        Error::Network(_) => ErrorKind::Network,
        Error::Storage(_) => ErrorKind::Storage,
        Error::ShuttingDown => ErrorKind::ShuttingDown,
        _ => ErrorKind::Other,
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("static histogram bounds")
}

fn micros(d: Duration) -> u64 {
    d.as_micros().clamp(1, u128::from(LATENCY_US_MAX)) as u64
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Latency statistics, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub avg_ms: f64,
    pub min_ms: f64,
    pub med_ms: f64,
    pub max_ms: f64,
    pub p90_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
}

impl LatencySummary {
    fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            count: h.len(),
            avg_ms: h.mean() / 1000.0,
            min_ms: ms(h.min()),
            med_ms: ms(h.value_at_quantile(0.5)),
            max_ms: ms(h.max()),
            p90_ms: ms(h.value_at_quantile(0.90)),
            p95_ms: ms(h.value_at_quantile(0.95)),
            p99_ms: ms(h.value_at_quantile(0.99)),
        }
    }
}

/// One second (or `window`) of one scenario. Percentiles are over the
/// acknowledged requests that completed in the window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WindowStats {
    pub start_s: f64,
    pub started: u64,
    pub ok: u64,
    pub errors: u64,
    pub overloaded: u64,
    pub dropped: u64,
    pub avg_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// Everything measured for one scenario.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ScenarioSummary {
    pub name: String,
    pub duration_s: f64,
    /// Iterations started (excludes dropped ones).
    pub iterations: u64,
    pub ok: u64,
    pub errors: u64,
    pub errors_by_kind: BTreeMap<String, u64>,
    pub error_rate: f64,
    /// Iterations that found no free VU and never ran.
    pub dropped: u64,
    /// Completed iterations per second over the scenario's duration.
    pub achieved_rate: f64,
    /// Every completed iteration, errors included (k6's http_req_duration).
    pub latency: LatencySummary,
    /// Acknowledged iterations only.
    pub latency_ok: LatencySummary,
    /// Failed iterations only: shows whether overload fails fast.
    pub latency_failed: LatencySummary,
    pub vus_allocated_max: u64,
    pub in_flight_max: u64,
    pub windows: Vec<WindowStats>,
}

struct WindowAcc {
    index: u64,
    latency_ok: Histogram<u64>,
    stats: WindowStats,
}

/// The mutable record of one scenario during a run.
pub struct ScenarioRecorder {
    name: String,
    window: Duration,
    latency: Histogram<u64>,
    latency_ok: Histogram<u64>,
    latency_failed: Histogram<u64>,
    started: u64,
    ok: u64,
    errors: BTreeMap<ErrorKind, u64>,
    dropped: u64,
    vus_allocated_max: u64,
    in_flight_max: u64,
    current: WindowAcc,
    windows: Vec<WindowStats>,
    /// Ids of acknowledged nodes, kept only when verification is asked for.
    acked: Option<Vec<NodeId>>,
}

impl ScenarioRecorder {
    pub fn new(name: &str, window: Duration, track_acks: bool) -> Self {
        assert!(!window.is_zero(), "window must be positive");
        Self {
            name: name.to_string(),
            window,
            latency: new_histogram(),
            latency_ok: new_histogram(),
            latency_failed: new_histogram(),
            started: 0,
            ok: 0,
            errors: BTreeMap::new(),
            dropped: 0,
            vus_allocated_max: 0,
            in_flight_max: 0,
            current: WindowAcc {
                index: 0,
                latency_ok: new_histogram(),
                stats: WindowStats::default(),
            },
            windows: Vec::new(),
            acked: track_acks.then(Vec::new),
        }
    }

    /// Moves the current window forward to the one holding `at`. Late
    /// records (a thread that lost a race) count in the current window.
    fn roll_to(&mut self, at: Duration) {
        let index = (at.as_nanos() / self.window.as_nanos()) as u64;
        while self.current.index < index {
            self.close_window();
        }
    }

    fn close_window(&mut self) {
        let acc = &mut self.current;
        let mut stats = std::mem::take(&mut acc.stats);
        stats.start_s = acc.index as f64 * self.window.as_secs_f64();
        let lat = LatencySummary::of(&acc.latency_ok);
        stats.avg_ms = lat.avg_ms;
        stats.p50_ms = lat.med_ms;
        stats.p90_ms = lat.p90_ms;
        stats.p99_ms = lat.p99_ms;
        stats.max_ms = lat.max_ms;
        self.windows.push(stats);
        acc.latency_ok.reset();
        acc.index += 1;
    }

    pub fn record_start(&mut self, at: Duration, in_flight: u64, vus_allocated: u64) {
        self.roll_to(at);
        self.started += 1;
        self.current.stats.started += 1;
        self.in_flight_max = self.in_flight_max.max(in_flight);
        self.vus_allocated_max = self.vus_allocated_max.max(vus_allocated);
    }

    pub fn record_dropped(&mut self, at: Duration, vus_allocated: u64) {
        self.roll_to(at);
        self.dropped += 1;
        self.current.stats.dropped += 1;
        self.vus_allocated_max = self.vus_allocated_max.max(vus_allocated);
    }

    pub fn record_done(&mut self, at: Duration, latency: Duration, outcome: Outcome) {
        self.roll_to(at);
        let us = micros(latency);
        self.latency.saturating_record(us);
        match outcome {
            Outcome::Ok { node } => {
                self.ok += 1;
                self.current.stats.ok += 1;
                self.latency_ok.saturating_record(us);
                self.current.latency_ok.saturating_record(us);
                if let (Some(acked), Some(node)) = (self.acked.as_mut(), node) {
                    acked.push(node);
                }
            }
            Outcome::Failed(kind) => {
                *self.errors.entry(kind).or_default() += 1;
                self.current.stats.errors += 1;
                if kind == ErrorKind::Overloaded {
                    self.current.stats.overloaded += 1;
                }
                self.latency_failed.saturating_record(us);
            }
        }
    }

    /// A cheap look at the run so far, for the progress line.
    pub fn snapshot(&self) -> Snapshot {
        let last = self.windows.last();
        Snapshot {
            started: self.started,
            ok: self.ok,
            errors: self.errors.values().sum(),
            dropped: self.dropped,
            last_p99_ms: last.map_or(0.0, |w| w.p99_ms),
            last_rate: last.map_or(0.0, |w| {
                (w.ok + w.errors) as f64 / self.window.as_secs_f64()
            }),
        }
    }

    pub fn acked(&self) -> &[NodeId] {
        self.acked.as_deref().unwrap_or(&[])
    }

    /// Closes the last window and summarises; `duration` is the scenario's
    /// planned length (the achieved rate is measured against it).
    pub fn finish(mut self, end: Duration, duration: Duration) -> (ScenarioSummary, Vec<NodeId>) {
        self.roll_to(end);
        if self.current.stats != WindowStats::default() {
            self.close_window();
        }
        let errors: u64 = self.errors.values().sum();
        let completed = self.ok + errors;
        let summary = ScenarioSummary {
            name: self.name,
            duration_s: duration.as_secs_f64(),
            iterations: self.started,
            ok: self.ok,
            errors,
            errors_by_kind: self
                .errors
                .iter()
                .map(|(k, v)| (k.name().to_string(), *v))
                .collect(),
            error_rate: if completed == 0 {
                0.0
            } else {
                errors as f64 / completed as f64
            },
            dropped: self.dropped,
            achieved_rate: completed as f64 / duration.as_secs_f64().max(1e-9),
            latency: LatencySummary::of(&self.latency),
            latency_ok: LatencySummary::of(&self.latency_ok),
            latency_failed: LatencySummary::of(&self.latency_failed),
            vus_allocated_max: self.vus_allocated_max,
            in_flight_max: self.in_flight_max,
            windows: self.windows,
        };
        (summary, self.acked.unwrap_or_default())
    }
}

/// Progress-line numbers.
#[derive(Clone, Copy, Debug, Default)]
pub struct Snapshot {
    pub started: u64,
    pub ok: u64,
    pub errors: u64,
    pub dropped: u64,
    pub last_p99_ms: f64,
    pub last_rate: f64,
}

/// How long after the rate dropped (at `drop_at_s`) latency was back to
/// normal: the start of the first window from which every later window has
/// a p99 within twice the baseline (the median per-window p99 before
/// `overload_at_s`, first second skipped as warm-up) and no error, refusal
/// or dropped iteration. `None` when the run never settled or there is no
/// baseline.
pub fn recovery_after_s(
    windows: &[WindowStats],
    overload_at_s: f64,
    drop_at_s: f64,
) -> Option<f64> {
    let mut baseline: Vec<f64> = windows
        .iter()
        .filter(|w| w.start_s >= 1.0 && w.start_s + 1.0 <= overload_at_s && w.ok > 0)
        .map(|w| w.p99_ms)
        .collect();
    if baseline.is_empty() {
        return None;
    }
    baseline.sort_by(f64::total_cmp);
    let normal_p99_ms = 2.0 * baseline[baseline.len() / 2];
    let settled = |w: &WindowStats| {
        w.p99_ms <= normal_p99_ms && w.errors == 0 && w.overloaded == 0 && w.dropped == 0
    };
    let after: Vec<&WindowStats> = windows.iter().filter(|w| w.start_s >= drop_at_s).collect();
    let unsettled_tail = after.iter().rposition(|w| !settled(w));
    let first_settled = match unsettled_tail {
        None => after.first()?,
        Some(i) => after.get(i + 1)?,
    };
    Some(first_settled.start_s - drop_at_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_totals_add_up() {
        let mut r = ScenarioRecorder::new("user", Duration::from_secs(1), true);
        let ms = Duration::from_millis;
        r.record_start(ms(0), 1, 10);
        r.record_done(ms(10), ms(10), Outcome::Ok { node: Some(7) });
        r.record_start(ms(1500), 1, 10);
        r.record_done(ms(2500), ms(1000), Outcome::Failed(ErrorKind::Overloaded));
        r.record_dropped(ms(2600), 10);
        let (s, acked) = r.finish(ms(3000), Duration::from_secs(3));
        assert_eq!(acked, vec![7]);
        assert_eq!((s.iterations, s.ok, s.errors, s.dropped), (2, 1, 1, 1));
        assert_eq!(s.errors_by_kind.get("overloaded"), Some(&1));
        assert_eq!(s.windows.len(), 3);
        assert_eq!(s.windows[0].ok, 1);
        assert_eq!(s.windows[1].started, 1);
        assert_eq!((s.windows[2].errors, s.windows[2].dropped), (1, 1));
        assert!((s.latency_ok.p99_ms - 10.0).abs() < 0.05);
        assert!((s.latency.max_ms - 1000.0).abs() < 1.0);
        assert!((s.error_rate - 0.5).abs() < 1e-9);
    }

    fn window(start_s: f64, p99_ms: f64, overloaded: u64) -> WindowStats {
        WindowStats {
            start_s,
            ok: 100,
            overloaded,
            p99_ms,
            ..Default::default()
        }
    }

    /// 10 s at base (p99 5 ms), overload from 10 s to 20 s, then base again.
    fn overload_run(after_drop: &[(f64, u64)]) -> Vec<WindowStats> {
        let mut windows: Vec<_> = (0..10).map(|s| window(s as f64, 5.0, 0)).collect();
        windows.extend((10..20).map(|s| window(s as f64, 400.0, 50)));
        for (i, (p99_ms, overloaded)) in after_drop.iter().enumerate() {
            windows.push(window(20.0 + i as f64, *p99_ms, *overloaded));
        }
        windows
    }

    #[test]
    fn recovery_is_the_start_of_the_settled_tail() {
        let windows = overload_run(&[(300.0, 3), (80.0, 0), (9.0, 0), (6.0, 0), (5.0, 0)]);
        assert_eq!(recovery_after_s(&windows, 10.0, 20.0), Some(2.0));
    }

    #[test]
    fn a_relapse_moves_the_recovery_later() {
        let windows = overload_run(&[(9.0, 0), (5.0, 0), (50.0, 0), (5.0, 0), (5.0, 0)]);
        assert_eq!(recovery_after_s(&windows, 10.0, 20.0), Some(3.0));
        let refused = overload_run(&[(5.0, 0), (5.0, 1), (5.0, 0)]);
        assert_eq!(recovery_after_s(&refused, 10.0, 20.0), Some(2.0));
    }

    #[test]
    fn no_recovery_when_the_last_window_is_still_slow() {
        let windows = overload_run(&[(5.0, 0), (200.0, 0)]);
        assert_eq!(recovery_after_s(&windows, 10.0, 20.0), None);
        assert_eq!(recovery_after_s(&windows[..1], 10.0, 20.0), None);
    }

    #[test]
    fn immediate_recovery_is_zero() {
        let windows = overload_run(&[(6.0, 0), (5.0, 0)]);
        assert_eq!(recovery_after_s(&windows, 10.0, 20.0), Some(0.0));
    }
}
