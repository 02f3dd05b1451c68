//! The reference grid (1000/2500/5000 RPS x background sync on/off) side by
//! side with the reference run's numbers, then a search for the highest rate
//! that stays clean (by default p99 <= 100 ms, no errors, no dropped
//! iterations; `--threshold`s replace that bar).

use super::report::{fmt_ms, RunReport};
use super::threshold::{evaluate_all, Threshold};
use serde::Serialize;
use std::fmt::Write as _;
use std::time::Duration;

/// The reference run (Go implementation, bbolt, network mocked): average
/// latency of the user scenario, in ms, per rate. The reference did not
/// report the other percentiles, nor separate numbers for sync on and off.
pub const REFERENCE_AVG_MS: [(u64, f64); 3] = [(1000, 13.7), (2500, 19.5), (5000, 1100.0)];

/// One cell of the grid.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Point {
    pub rate: u64,
    /// Background sync interval; `None` = off.
    pub sync_interval: Option<Duration>,
    pub duration: Duration,
}

/// Runs one point to completion (in real or simulated time).
pub trait Runner {
    fn run(&mut self, point: &Point) -> RunReport;
}

/// What counts as clean: every threshold holds on the scenarios it
/// judges, no iteration is stuck.
#[derive(Clone, Debug, Serialize)]
pub struct CleanBar {
    pub thresholds: Vec<Threshold>,
}

impl Default for CleanBar {
    /// p99 <= 100 ms, no errors and no dropped iterations, in every
    /// scenario.
    fn default() -> Self {
        let thresholds = ["p(99)<=100ms", "rate==0", "dropped==0"]
            .into_iter()
            .map(|t| Threshold::parse(t).expect("static threshold"))
            .collect();
        Self { thresholds }
    }
}

impl CleanBar {
    pub fn is_clean(&self, report: &RunReport) -> bool {
        !report.scenarios.is_empty()
            && report.stuck == 0
            && evaluate_all(&self.thresholds, &report.scenarios)
                .iter()
                .all(|r| r.passed)
    }

    /// "p(99)<=100ms, rate==0, dropped==0".
    pub fn text(&self) -> String {
        let texts: Vec<String> = self.thresholds.iter().map(|t| t.to_string()).collect();
        texts.join(", ")
    }
}

/// One measured row.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub rate: u64,
    pub sync: String,
    pub avg_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub achieved_rate: f64,
    pub errors: u64,
    pub dropped: u64,
    pub clean: bool,
    pub reference_avg_ms: Option<f64>,
    /// The nodes' CPU per answered request, µs (real mode).
    pub nodes_cpu_us_per_request: Option<f64>,
    /// The generator's CPU per answered request, µs (real mode).
    pub generator_cpu_us_per_request: Option<f64>,
}

impl Row {
    fn of(point: &Point, report: &RunReport, bar: &CleanBar) -> Self {
        let user = report.scenario("user").cloned().unwrap_or_default();
        Self {
            rate: point.rate,
            sync: sync_label(point.sync_interval),
            avg_ms: user.latency.avg_ms,
            p90_ms: user.latency.p90_ms,
            p99_ms: user.latency.p99_ms,
            max_ms: user.latency.max_ms,
            achieved_rate: user.achieved_rate,
            errors: report.scenarios.iter().map(|s| s.errors).sum(),
            dropped: report.scenarios.iter().map(|s| s.dropped).sum(),
            clean: bar.is_clean(report),
            reference_avg_ms: REFERENCE_AVG_MS
                .iter()
                .find(|(r, _)| *r == point.rate)
                .map(|(_, ms)| *ms),
            nodes_cpu_us_per_request: report.cpu.as_ref().map(|c| c.nodes_us_per_request),
            generator_cpu_us_per_request: report.cpu.as_ref().map(|c| c.generator_us_per_request),
        }
    }
}

pub fn sync_label(interval: Option<Duration>) -> String {
    match interval {
        Some(d) => humantime::format_duration(d).to_string(),
        None => "off".to_string(),
    }
}

/// The grid's result and the search's over one gateway path.
#[derive(Clone, Debug, Serialize)]
pub struct PathResult {
    /// "tcp", "in-process", "in-process (simulated)".
    pub gateway: String,
    pub grid: Vec<Row>,
    pub search: Vec<Row>,
    /// Highest rate found clean; `None` if even the first probe was not.
    pub highest_clean_rate: Option<u64>,
}

/// A whole matrix: one result per path, the wire path first.
#[derive(Clone, Debug, Serialize)]
pub struct MatrixResult {
    pub mode: String,
    pub replicas: usize,
    /// What the search called clean.
    pub clean: String,
    pub paths: Vec<PathResult>,
}

/// How the upward search proceeds.
#[derive(Clone, Copy, Debug)]
pub struct SearchPlan {
    pub start_rate: u64,
    pub max_rate: u64,
    pub duration: Duration,
    pub sync_interval: Option<Duration>,
    /// Stop bisecting when the bracket is narrower than this fraction.
    pub resolution: f64,
    /// Bound on probes, whatever happens.
    pub probes_max: u32,
}

/// Runs the grid, printing each row as it lands.
pub fn run_grid(runner: &mut dyn Runner, points: &[Point], bar: &CleanBar) -> Vec<Row> {
    if !points.is_empty() {
        println!("{}", header());
    }
    points
        .iter()
        .map(|p| {
            let row = Row::of(p, &runner.run(p), bar);
            println!("{}", row_text(&row));
            row
        })
        .collect()
}

/// Runs the grid over several paths, alternated: each point over every
/// path before the next point, the paths' order reversed from one point
/// to the next (A B, B A, A B, ...), so that a host that slows down
/// during the grid weighs on every path alike. Each row prints with its
/// path's label as it lands; the rows come back per path.
pub fn run_grids(
    runners: &mut [(String, &mut dyn Runner)],
    points: &[Point],
    bar: &CleanBar,
) -> Vec<Vec<Row>> {
    let mut rows: Vec<Vec<Row>> = runners.iter().map(|_| Vec::new()).collect();
    if points.is_empty() || runners.is_empty() {
        return rows;
    }
    println!("{:<12} {}", "gateway", header());
    for (i, point) in points.iter().enumerate() {
        let mut order: Vec<usize> = (0..runners.len()).collect();
        if i % 2 == 1 {
            order.reverse();
        }
        for path in order {
            let (label, runner) = &mut runners[path];
            let row = Row::of(point, &runner.run(point), bar);
            println!("{label:<12} {}", row_text(&row));
            rows[path].push(row);
        }
    }
    rows
}

/// Doubles the rate while clean (halves it while not), then bisects the
/// bracket between the best clean and the lowest unclean rate.
pub fn search(
    runner: &mut dyn Runner,
    plan: &SearchPlan,
    bar: &CleanBar,
) -> (Option<u64>, Vec<Row>) {
    let mut rows = Vec::new();
    let mut probe = |rate: u64, rows: &mut Vec<Row>| -> bool {
        let point = Point {
            rate,
            sync_interval: plan.sync_interval,
            duration: plan.duration,
        };
        let row = Row::of(&point, &runner.run(&point), bar);
        println!("{}", row_text(&row));
        rows.push(row);
        rows.last().is_some_and(|r| r.clean)
    };
    println!("{}", header());
    let mut clean: Option<u64> = None;
    let mut dirty: Option<u64> = None;
    let mut rate = plan.start_rate.max(1);
    let mut probes = 0;
    while probes < plan.probes_max && rate > 0 {
        probes += 1;
        if probe(rate, &mut rows) {
            clean = Some(rate);
            if dirty.is_some() || rate >= plan.max_rate {
                break;
            }
            rate = (rate * 2).min(plan.max_rate);
        } else {
            dirty = Some(rate);
            if clean.is_some() {
                break;
            }
            rate /= 2;
        }
    }
    while let (Some(lo), Some(hi)) = (clean, dirty) {
        if probes >= plan.probes_max || (hi - lo) as f64 <= lo as f64 * plan.resolution {
            break;
        }
        probes += 1;
        let mid = lo + (hi - lo) / 2;
        if probe(mid, &mut rows) {
            clean = Some(mid);
        } else {
            dirty = Some(mid);
        }
    }
    (clean, rows)
}

pub fn header() -> String {
    format!(
        "{:>7} {:>5} | {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>5} | {:>13} | {:>11}",
        "rate",
        "sync",
        "achieved",
        "avg",
        "p90",
        "p99",
        "max",
        "errors",
        "dropped",
        "clean",
        "reference avg",
        "node µs/req"
    )
}

pub fn row_text(r: &Row) -> String {
    format!(
        "{:>7} {:>5} | {:>9.1} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>5} | {:>13} | {:>11}",
        r.rate,
        r.sync,
        r.achieved_rate,
        fmt_ms(r.avg_ms),
        fmt_ms(r.p90_ms),
        fmt_ms(r.p99_ms),
        fmt_ms(r.max_ms),
        r.errors,
        r.dropped,
        if r.clean { "yes" } else { "no" },
        r.reference_avg_ms
            .map(fmt_ms)
            .unwrap_or_else(|| "-".to_string()),
        r.nodes_cpu_us_per_request
            .map_or_else(|| "-".to_string(), |us| format!("{us:.1}"))
    )
}

/// The whole matrix as text, for docs and logs.
pub fn result_text(result: &MatrixResult) -> String {
    let mut out = String::new();
    for path in &result.paths {
        let _ = writeln!(
            out,
            "{}, {} replica(s), gateway {}",
            result.mode, result.replicas, path.gateway
        );
        out.push_str(&path_text(path, &result.clean));
        out.push('\n');
    }
    let rates: Vec<String> = result
        .paths
        .iter()
        .filter(|p| !p.search.is_empty())
        .map(|p| {
            let rate = p
                .highest_clean_rate
                .map_or("none".to_string(), |r| format!("{r}/s"));
            format!("{rate} with the gateway {}", p.gateway)
        })
        .collect();
    if !rates.is_empty() {
        let _ = writeln!(
            out,
            "highest clean rate, {} replica(s): {}",
            result.replicas,
            rates.join("; beside it ")
        );
    }
    out
}

fn path_text(path: &PathResult, clean: &str) -> String {
    let mut out = String::new();
    if !path.grid.is_empty() {
        let _ = writeln!(
            out,
            "reference grid (user scenario; system scenario at 10/s alongside)"
        );
        let _ = writeln!(out, "{}", header());
        for r in &path.grid {
            let _ = writeln!(out, "{}", row_text(r));
        }
    }
    if !path.search.is_empty() {
        let _ = writeln!(out, "search (clean = {clean}, nothing stuck)");
        let _ = writeln!(out, "{}", header());
        for r in &path.search {
            let _ = writeln!(out, "{}", row_text(r));
        }
        let _ = writeln!(
            out,
            "highest clean rate: {}",
            path.highest_clean_rate
                .map_or("none".to_string(), |r| r.to_string())
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::metrics::{LatencySummary, ScenarioSummary};

    /// A pretend service that is clean up to `limit` RPS.
    struct Threshold {
        limit: u64,
        seen: Vec<u64>,
    }

    impl Runner for Threshold {
        fn run(&mut self, point: &Point) -> RunReport {
            self.seen.push(point.rate);
            let p99_ms = if point.rate <= self.limit {
                10.0
            } else {
                500.0
            };
            RunReport {
                scenarios: vec![ScenarioSummary {
                    name: "user".into(),
                    latency: LatencySummary {
                        count: 100,
                        p99_ms,
                        ..Default::default()
                    },
                    ..Default::default()
                }],
                ..Default::default()
            }
        }
    }

    fn threshold(limit: u64) -> Threshold {
        Threshold {
            limit,
            seen: vec![],
        }
    }

    fn plan(start_rate: u64, max_rate: u64, resolution: f64, probes_max: u32) -> SearchPlan {
        SearchPlan {
            start_rate,
            max_rate,
            duration: Duration::from_secs(1),
            sync_interval: None,
            resolution,
            probes_max,
        }
    }

    #[test]
    fn search_brackets_the_limit() {
        let mut t = threshold(37_000);
        let plan = plan(5000, 1_000_000, 0.02, 30);
        let (best, rows) = search(&mut t, &plan, &CleanBar::default());
        let best = best.unwrap();
        assert!(best <= 37_000 && best as f64 >= 37_000.0 * 0.98, "{best}");
        assert_eq!(&t.seen[..4], &[5000, 10_000, 20_000, 40_000]);
        assert_eq!(rows.len(), t.seen.len());
    }

    #[test]
    fn search_reports_none_when_nothing_is_clean() {
        let mut t = threshold(0);
        let plan = plan(5000, 100_000, 0.05, 10);
        assert_eq!(search(&mut t, &plan, &CleanBar::default()).0, None);
        assert_eq!(t.seen.len(), 10);
        assert!(t.seen.windows(2).all(|w| w[1] == w[0] / 2), "{:?}", t.seen);
    }

    /// Thresholds replace the default bar: a 5 ms p99 bar makes every
    /// probe of the pretend service (10 ms when clean) unclean.
    #[test]
    fn thresholds_set_the_bar() {
        let strict = CleanBar {
            thresholds: vec![super::Threshold::parse("user: p(99)<5ms").unwrap()],
        };
        let mut t = threshold(37_000);
        let plan = plan(5000, 100_000, 0.05, 6);
        assert_eq!(search(&mut t, &plan, &strict).0, None);
        let mut t = threshold(37_000);
        let report = t.run(&Point {
            rate: 1000,
            sync_interval: None,
            duration: Duration::from_secs(1),
        });
        assert!(CleanBar::default().is_clean(&report));
        let stuck = RunReport { stuck: 1, ..report };
        assert!(!CleanBar::default().is_clean(&stuck));
        assert_eq!(
            CleanBar::default().text(),
            "p(99)<=100ms, rate==0, dropped==0"
        );
    }

    #[test]
    fn search_goes_down_when_the_start_is_too_high() {
        let mut t = threshold(1200);
        let plan = plan(5000, 100_000, 0.05, 20);
        let best = search(&mut t, &plan, &CleanBar::default()).0.unwrap();
        assert!((1140..=1200).contains(&best), "{best} {:?}", t.seen);
    }
}
