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
    /// The whole distribution, for percentiles nobody listed above (a
    /// threshold on `p(99.9)`); absent in summaries built by hand.
    #[serde(skip)]
    pub histogram: Option<LatencyHistogram>,
}

/// A run's latency histogram (µs), shared instead of copied.
#[derive(Clone, PartialEq)]
pub struct LatencyHistogram(std::sync::Arc<Histogram<u64>>);

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LatencyHistogram({} samples)", self.0.len())
    }
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
            histogram: Some(LatencyHistogram(std::sync::Arc::new(h.clone()))),
        }
    }

    /// The latency at quantile `q` (0 < q <= 1). Without the histogram,
    /// the smallest listed quantile at or above `q`: never an understatement.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        assert!(q > 0.0 && q <= 1.0, "quantile {q} out of (0, 1]");
        if let Some(LatencyHistogram(h)) = &self.histogram {
            return ms(h.value_at_quantile(q));
        }
        let listed = [
            (0.5, self.med_ms),
            (0.90, self.p90_ms),
            (0.95, self.p95_ms),
            (0.99, self.p99_ms),
        ];
        listed
            .into_iter()
            .find(|(at, _)| q <= at + 1e-12)
            .map_or(self.max_ms, |(_, v)| v)
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
    /// Most iterations in flight at once (k6's busy VUs), seen as
    /// iterations started and finished in the window.
    pub in_flight_max: u64,
    /// The VU pool's size at the window's end.
    pub vus_allocated: u64,
    /// How late the generator started the window's latest-started
    /// iteration (the generator falling behind shows here first).
    pub start_lag_max_ms: f64,
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
    /// Iterations the schedule asked for per second over the duration.
    pub target_rate: f64,
    /// Every completed iteration, errors included (k6's http_req_duration).
    pub latency: LatencySummary,
    /// Acknowledged iterations only.
    pub latency_ok: LatencySummary,
    /// Failed iterations only: shows whether overload fails fast.
    pub latency_failed: LatencySummary,
    pub vus_allocated_max: u64,
    pub in_flight_max: u64,
    /// How late the generator started its latest-started iteration,
    /// against the schedule. Near zero unless the host could not keep up
    /// (the generator shares the CPU with the service in real mode); late
    /// iterations start in a burst, so their load lands after it was due.
    pub start_lag_max_ms: f64,
    pub windows: Vec<WindowStats>,
    /// Per call of a sequence (gateway scenarios), by the call's name;
    /// empty for scenarios of one request per iteration.
    pub calls: Vec<CallSummary>,
}

/// The calls of one name that a scenario's sequences made.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CallSummary {
    /// The gRPC method: "GetNodeByPath", "AddByPath", ...
    pub call: String,
    /// Answered calls, errors included (a call cut off by the iteration's
    /// deadline is in neither).
    pub count: u64,
    pub errors: u64,
    pub latency: LatencySummary,
}

struct CallAcc {
    latency: Histogram<u64>,
    errors: u64,
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
    start_lag_max: Duration,
    current: WindowAcc,
    windows: Vec<WindowStats>,
    /// Ids of acknowledged nodes, kept only when verification is asked for.
    acked: Option<Vec<NodeId>>,
    calls: BTreeMap<&'static str, CallAcc>,
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
            start_lag_max: Duration::ZERO,
            current: WindowAcc {
                index: 0,
                latency_ok: new_histogram(),
                stats: WindowStats::default(),
            },
            windows: Vec::new(),
            acked: track_acks.then(Vec::new),
            calls: BTreeMap::new(),
        }
    }

    /// One call of a sequence was answered after `latency`.
    pub fn record_call(&mut self, call: &'static str, latency: Duration, ok: bool) {
        let acc = self.calls.entry(call).or_insert_with(|| CallAcc {
            latency: new_histogram(),
            errors: 0,
        });
        acc.latency.saturating_record(micros(latency));
        acc.errors += u64::from(!ok);
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
        // The pool never shrinks: a window without arrivals still has it.
        acc.stats.vus_allocated = stats.vus_allocated;
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

    /// An iteration started at `at`, `lag` after it was due.
    pub fn record_start(
        &mut self,
        at: Duration,
        lag: Duration,
        in_flight: u64,
        vus_allocated: u64,
    ) {
        self.roll_to(at);
        self.start_lag_max = self.start_lag_max.max(lag);
        self.started += 1;
        self.current.stats.started += 1;
        self.in_flight_max = self.in_flight_max.max(in_flight);
        self.vus_allocated_max = self.vus_allocated_max.max(vus_allocated);
        let window = &mut self.current.stats;
        window.in_flight_max = window.in_flight_max.max(in_flight);
        window.vus_allocated = vus_allocated;
        window.start_lag_max_ms = window.start_lag_max_ms.max(lag.as_secs_f64() * 1000.0);
    }

    pub fn record_dropped(&mut self, at: Duration, vus_allocated: u64) {
        self.roll_to(at);
        self.dropped += 1;
        self.current.stats.dropped += 1;
        self.current.stats.vus_allocated = vus_allocated;
        self.vus_allocated_max = self.vus_allocated_max.max(vus_allocated);
    }

    /// An iteration finished at `at`; `in_flight` counts it still.
    pub fn record_done(
        &mut self,
        at: Duration,
        latency: Duration,
        outcome: Outcome,
        in_flight: u64,
    ) {
        self.roll_to(at);
        let window = &mut self.current.stats;
        window.in_flight_max = window.in_flight_max.max(in_flight);
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
    pub fn finish(
        mut self,
        end: Duration,
        duration: Duration,
        planned: u64,
    ) -> (ScenarioSummary, Vec<NodeId>) {
        self.roll_to(end);
        let last = &self.current.stats;
        if last.started + last.ok + last.errors + last.dropped > 0 {
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
            target_rate: planned as f64 / duration.as_secs_f64().max(1e-9),
            latency: LatencySummary::of(&self.latency),
            latency_ok: LatencySummary::of(&self.latency_ok),
            latency_failed: LatencySummary::of(&self.latency_failed),
            vus_allocated_max: self.vus_allocated_max,
            in_flight_max: self.in_flight_max,
            start_lag_max_ms: self.start_lag_max.as_secs_f64() * 1000.0,
            windows: self.windows,
            calls: self
                .calls
                .iter()
                .map(|(call, acc)| CallSummary {
                    call: call.to_string(),
                    count: acc.latency.len(),
                    errors: acc.errors,
                    latency: LatencySummary::of(&acc.latency),
                })
                .collect(),
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

/// Fewest completed requests a one-second window needs before its p99 says
/// anything: below it, p99 is the window's slowest request or close to it.
pub const P99_WINDOW_OK_MIN: u64 = 100;

/// Which per-window latency a recovery judgement compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowLatency {
    /// The window's p99: scenarios whose windows hold at least
    /// [`P99_WINDOW_OK_MIN`] requests.
    P99,
    /// The window's median: sparse scenarios (the 10/s system scenario),
    /// where a p99 of ten requests is their maximum and one slow request,
    /// which the warm-up windows have too, would count as not recovered.
    Median,
}

impl WindowLatency {
    fn of(self, w: &WindowStats) -> f64 {
        match self {
            Self::P99 => w.p99_ms,
            Self::Median => w.p50_ms,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::P99 => "p99",
            Self::Median => "median",
        }
    }
}

/// Slack below which a latency counts as normal whatever its ratio to the
/// warm-up's: the reference configuration's batch window. A write waits up
/// to one window for its batch, so latencies a few milliseconds apart are
/// the batching's granularity, not a slowdown: a 1.5 ms warm-up median
/// would otherwise call a 3.2 ms window (a database grown tenfold during
/// the overload) unrecovered.
pub const NORMAL_SLACK_MS: f64 = 5.0;

/// When latency was back to normal after an overload, and by which measure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recovery {
    /// Seconds after the rate dropped.
    pub after_s: f64,
    pub measure: WindowLatency,
}

/// How long after the rate dropped (at `drop_at_s`) latency was back to
/// normal: the start of the first window from which every later window has
/// its latency within twice the baseline, or within [`NORMAL_SLACK_MS`] of
/// it (the baseline: the median over the windows before `overload_at_s`,
/// first second skipped as warm-up) and no error,
/// refusal or dropped iteration. The latency is each window's p99 when the
/// baseline windows hold [`P99_WINDOW_OK_MIN`] requests or more (median
/// count), its median otherwise. `None` when the run never settled or there
/// is no baseline.
pub fn recovery_after_s(
    windows: &[WindowStats],
    overload_at_s: f64,
    drop_at_s: f64,
) -> Option<Recovery> {
    let base: Vec<&WindowStats> = windows
        .iter()
        .filter(|w| w.start_s >= 1.0 && w.start_s + 1.0 <= overload_at_s && w.ok > 0)
        .collect();
    if base.is_empty() {
        return None;
    }
    let mut counts: Vec<u64> = base.iter().map(|w| w.ok).collect();
    counts.sort_unstable();
    let measure = if counts[counts.len() / 2] >= P99_WINDOW_OK_MIN {
        WindowLatency::P99
    } else {
        WindowLatency::Median
    };
    let mut baseline: Vec<f64> = base.iter().map(|w| measure.of(w)).collect();
    baseline.sort_by(f64::total_cmp);
    let base_ms = baseline[baseline.len() / 2];
    let normal_ms = (2.0 * base_ms).max(base_ms + NORMAL_SLACK_MS);
    let settled = |w: &WindowStats| {
        measure.of(w) <= normal_ms && w.errors == 0 && w.overloaded == 0 && w.dropped == 0
    };
    let after: Vec<&WindowStats> = windows.iter().filter(|w| w.start_s >= drop_at_s).collect();
    let unsettled_tail = after.iter().rposition(|w| !settled(w));
    let first_settled = match unsettled_tail {
        None => after.first()?,
        Some(i) => after.get(i + 1)?,
    };
    Some(Recovery {
        after_s: first_settled.start_s - drop_at_s,
        measure,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each window keeps its peak of iterations in flight, counted at
    /// starts and at completions, and the pool's size, which carries over
    /// windows without arrivals: the over-time chart of k6's VUs.
    #[test]
    fn windows_track_in_flight_and_the_pool() {
        let mut r = ScenarioRecorder::new("user", Duration::from_secs(1), false);
        let at = Duration::from_millis;
        for (i, start_ms) in [100, 200, 300].into_iter().enumerate() {
            r.record_start(at(start_ms), Duration::ZERO, i as u64 + 1, 10);
        }
        for (in_flight, done_ms) in [(3, 1100), (2, 1200)] {
            r.record_done(at(done_ms), at(900), Outcome::Ok { node: None }, in_flight);
        }
        r.record_dropped(at(3500), 11);
        r.record_done(at(3600), at(3300), Outcome::Ok { node: None }, 1);
        let (s, _) = r.finish(at(4000), Duration::from_secs(4), 5);
        let in_flight: Vec<u64> = s.windows.iter().map(|w| w.in_flight_max).collect();
        assert_eq!(in_flight, [3, 3, 0, 1]);
        let vus: Vec<u64> = s.windows.iter().map(|w| w.vus_allocated).collect();
        assert_eq!(vus, [10, 10, 10, 11]);
        assert!((s.target_rate - 1.25).abs() < 1e-9);
    }

    #[test]
    fn windows_and_totals_add_up() {
        let mut r = ScenarioRecorder::new("user", Duration::from_secs(1), true);
        let ms = Duration::from_millis;
        r.record_start(ms(0), ms(0), 1, 10);
        r.record_done(ms(10), ms(10), Outcome::Ok { node: Some(7) }, 1);
        r.record_start(ms(1500), ms(30), 1, 10);
        r.record_done(
            ms(2500),
            ms(1000),
            Outcome::Failed(ErrorKind::Overloaded),
            1,
        );
        r.record_dropped(ms(2600), 10);
        let (s, acked) = r.finish(ms(3000), Duration::from_secs(3), 3);
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
        assert!((s.start_lag_max_ms - 30.0).abs() < 1e-9);
    }

    fn window(start_s: f64, p99_ms: f64, overloaded: u64) -> WindowStats {
        WindowStats {
            start_s,
            ok: 100,
            overloaded,
            p50_ms: p99_ms / 2.0,
            p99_ms,
            ..Default::default()
        }
    }

    /// Recovery of a 10 s / 10 s overload run, with the measure a dense
    /// scenario gets.
    fn after(windows: &[WindowStats]) -> Option<f64> {
        let recovery = recovery_after_s(windows, 10.0, 20.0)?;
        assert_eq!(recovery.measure, WindowLatency::P99);
        Some(recovery.after_s)
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
        assert_eq!(after(&windows), Some(2.0));
    }

    #[test]
    fn a_relapse_moves_the_recovery_later() {
        let windows = overload_run(&[(9.0, 0), (5.0, 0), (50.0, 0), (5.0, 0), (5.0, 0)]);
        assert_eq!(after(&windows), Some(3.0));
        let refused = overload_run(&[(5.0, 0), (5.0, 1), (5.0, 0)]);
        assert_eq!(after(&refused), Some(2.0));
    }

    #[test]
    fn no_recovery_when_the_last_window_is_still_slow() {
        let windows = overload_run(&[(5.0, 0), (200.0, 0)]);
        assert_eq!(after(&windows), None);
        assert_eq!(after(&windows[..1]), None);
    }

    /// Ten requests a second, with one slow request in some windows both
    /// before and after the overload: the windows' medians judge it, so the
    /// outliers, normal for this scenario, do not hold recovery back; a
    /// window whose typical request is slow still does.
    #[test]
    fn sparse_scenarios_are_judged_by_their_median() {
        let sparse = |start_s: f64, p50_ms: f64, max_ms: f64| WindowStats {
            start_s,
            ok: 10,
            p50_ms,
            p99_ms: max_ms,
            max_ms,
            ..Default::default()
        };
        let mut windows: Vec<_> = (0..10)
            .map(|s| sparse(s as f64, 5.0, if s % 3 == 0 { 140.0 } else { 7.0 }))
            .collect();
        windows.extend((10..20).map(|s| sparse(s as f64, 300.0, 900.0)));
        windows
            .extend((20..30).map(|s| sparse(s as f64, 5.5, if s % 4 == 0 { 150.0 } else { 7.0 })));
        let recovery = recovery_after_s(&windows, 10.0, 20.0).expect("recovers");
        assert_eq!(recovery.measure, WindowLatency::Median);
        assert_eq!(recovery.after_s, 0.0);
        // Judged by p99 instead, the outlier at 28 s would have put
        // recovery at 9 s. A slow median at 23 s still counts.
        windows[23].p50_ms = 40.0;
        assert_eq!(
            recovery_after_s(&windows, 10.0, 20.0).map(|r| r.after_s),
            Some(4.0)
        );
    }

    /// A fast warm-up (1.5 ms): doubling it stays inside one batch window,
    /// so windows up to 5 ms slower still count as normal; slower ones not.
    #[test]
    fn fast_baselines_get_a_batch_window_of_slack() {
        let mut windows: Vec<_> = (0..10).map(|s| window(s as f64, 1.5, 0)).collect();
        windows.extend((10..20).map(|s| window(s as f64, 400.0, 50)));
        windows.extend((20..25).map(|s| window(s as f64, 3.2, 0)));
        assert_eq!(after(&windows), Some(0.0));
        windows[22].p99_ms = 6.4;
        assert_eq!(after(&windows), Some(0.0), "6.4 ms is within 1.5 + 5 ms");
        windows[22].p99_ms = 6.6;
        assert_eq!(after(&windows), Some(3.0), "6.6 ms is not");
    }

    #[test]
    fn immediate_recovery_is_zero() {
        let windows = overload_run(&[(6.0, 0), (5.0, 0)]);
        assert_eq!(after(&windows), Some(0.0));
    }
}
