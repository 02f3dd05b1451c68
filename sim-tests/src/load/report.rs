//! The result of one run as data (JSON) and as a k6-style end-of-test
//! summary.

use super::cpu::CpuUse;
use super::driver::{RunOutput, Sample};
use super::metrics::{CallSummary, LatencySummary, ScenarioSummary};
use super::node_timeline::NodeSecond;
use super::threshold::{results_text, ThresholdResult};
use arbor::service::ServiceStats;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Service counters, summed over the nodes under test.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ServiceCounters {
    pub writes_committed: u64,
    pub batches_committed: u64,
    pub batches_failed: u64,
    pub writes_rejected_overload: u64,
    pub ops_pushed: u64,
    pub ops_pulled: u64,
    pub sync_rounds: u64,
    /// writes_committed / batches_committed.
    pub batch_size_avg: f64,
}

impl ServiceCounters {
    pub fn sum<'a>(stats: impl IntoIterator<Item = &'a ServiceStats>) -> Self {
        let mut c = Self::default();
        for s in stats {
            c.writes_committed += s.writes_committed;
            c.batches_committed += s.batches_committed;
            c.batches_failed += s.batches_failed;
            c.writes_rejected_overload += s.writes_rejected_overload;
            c.ops_pushed += s.ops_pushed;
            c.ops_pulled += s.ops_pulled;
            c.sync_rounds += s.sync_rounds;
        }
        if c.batches_committed > 0 {
            c.batch_size_avg = c.writes_committed as f64 / c.batches_committed as f64;
        }
        c
    }
}

/// After the run: was every acknowledged node readable?
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Verification {
    pub acked: u64,
    pub found: u64,
    pub missing: u64,
    /// A few missing ids, for debugging.
    pub missing_sample: Vec<u64>,
    /// Nodes checked on (all replicas in a cluster run).
    pub replicas_checked: u32,
}

/// Everything about one run, as written to `--json`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunReport {
    pub title: String,
    /// e.g. "real/single", "real/cluster3-tcp", "sim/cluster3".
    pub mode: String,
    /// The path the generator's requests took to the nodes: "tcp",
    /// "in-process" (`target::GatewayTransport`), or in sim mode
    /// "in-process (simulated)".
    pub gateway: String,
    pub replicas: usize,
    pub seed: Option<u64>,
    /// Verdicts of the run's `--threshold`s, in the order given.
    pub thresholds: Vec<ThresholdResult>,
    /// The same load over other paths, measured in the same invocation
    /// (in process, beside a wire run).
    pub beside: Vec<PathSummary>,
    /// The knobs of this run, for the record.
    pub params: BTreeMap<String, String>,
    pub scenarios: Vec<ScenarioSummary>,
    pub samples: Vec<Sample>,
    /// Per-second counters of each node (real mode; `timeline`).
    pub timeline: Vec<NodeSecond>,
    pub service: Option<ServiceCounters>,
    /// CPU of the nodes and of the generator while the load ran (real
    /// mode on Linux; `load::cpu`).
    pub cpu: Option<CpuUse>,
    pub verification: Option<Verification>,
    /// Iterations that never finished (should be 0).
    pub stuck: u64,
    /// Run length on the generator's clock (simulated time in sim mode).
    pub clock_time_s: f64,
    /// Wall time the run took.
    pub wall_time_s: f64,
    /// The machine that took it (`host::describe`): wall time is only
    /// comparable between runs on the same CPU.
    pub host: String,
    pub notes: Vec<String>,
}

impl RunReport {
    pub fn new(title: String, mode: String, out: RunOutput) -> Self {
        Self {
            title,
            mode,
            scenarios: out.scenarios,
            samples: out.samples,
            stuck: out.stuck,
            clock_time_s: out.elapsed.as_secs_f64(),
            ..Self::default()
        }
    }

    /// Whether this run or one beside it lost acknowledged writes or left
    /// iterations stuck.
    pub fn failed(&self) -> bool {
        PathSummary::of(self).failed() || self.beside.iter().any(PathSummary::failed)
    }

    /// Whether every threshold held (true without thresholds).
    pub fn thresholds_passed(&self) -> bool {
        self.thresholds.iter().all(|t| t.passed)
    }

    /// "real/single, gateway over tcp".
    pub fn path_text(&self) -> String {
        let gateway = match self.gateway.as_str() {
            "" => "gateway path unknown".to_string(),
            g => format!("gateway {g}"),
        };
        format!("{}, {gateway}", self.mode)
    }

    pub fn scenario(&self, name: &str) -> Option<&ScenarioSummary> {
        self.scenarios.iter().find(|s| s.name == name)
    }

    pub fn write_json(&self, path: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        write_creating_dirs(path, text.as_bytes())
    }

    /// The end-of-test summary, k6 style.
    pub fn summary_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "\n  {}  [{}]", self.title, self.path_text());
        if !self.thresholds.is_empty() {
            out.push_str(&results_text(&self.thresholds));
            out.push('\n');
        }
        for (k, v) in &self.params {
            let _ = writeln!(out, "    {k}: {v}");
        }
        for s in &self.scenarios {
            out.push_str(&scenario_text(s));
        }
        if !self.beside.is_empty() {
            out.push_str(&paths_text(self));
        }
        if let Some(c) = &self.service {
            let _ = writeln!(
                out,
                "\n  service: {} writes in {} batches (avg {:.1}/batch), {} failed batches, \
                 {} rejected (overload), {} pushed, {} pulled, {} sync rounds",
                c.writes_committed,
                c.batches_committed,
                c.batch_size_avg,
                c.batches_failed,
                c.writes_rejected_overload,
                c.ops_pushed,
                c.ops_pulled,
                c.sync_rounds
            );
        }
        if let Some(cpu) = &self.cpu {
            let _ = writeln!(out, "  cpu: {}", cpu.text());
        }
        if let Some(v) = &self.verification {
            let _ = writeln!(
                out,
                "  verify: {}/{} acknowledged nodes readable on {} replica(s), {} missing {:?}",
                v.found, v.acked, v.replicas_checked, v.missing, v.missing_sample
            );
        }
        let rss_max = self.samples.iter().map(|s| s.rss_mb).fold(0.0, f64::max);
        let _ = writeln!(
            out,
            "  time: {:.1}s on the load clock, {:.1}s wall; peak RSS {:.0} MB; stuck {}",
            self.clock_time_s, self.wall_time_s, rss_max, self.stuck
        );
        if !self.host.is_empty() {
            let _ = writeln!(out, "  host: {}", self.host);
        }
        for n in &self.notes {
            let _ = writeln!(out, "  note: {n}");
        }
        out
    }
}

fn scenario_text(s: &ScenarioSummary) -> String {
    let mut out = String::new();
    let completed = s.ok + s.errors;
    let _ = writeln!(out, "\n  scenario {} ({:.0}s)", s.name, s.duration_s);
    let line = |out: &mut String, name: &str, value: String| {
        let dots = ".".repeat(24usize.saturating_sub(name.len()));
        let _ = writeln!(out, "    {name}{dots}: {value}");
    };
    line(
        &mut out,
        "iterations",
        format!(
            "{completed:<10} {:.1}/s of {:.1}/s target ({:.1}%)",
            s.achieved_rate,
            s.target_rate,
            achieved_share(s) * 100.0
        ),
    );
    line(&mut out, "ok", format!("{}", s.ok));
    let kinds: Vec<String> = s
        .errors_by_kind
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    line(
        &mut out,
        "errors",
        format!(
            "{:.2}%  {} {}",
            s.error_rate * 100.0,
            s.errors,
            bracket(&kinds)
        ),
    );
    line(&mut out, "dropped_iterations", format!("{}", s.dropped));
    line(&mut out, "latency", latency_text(&s.latency));
    if s.errors > 0 {
        line(&mut out, "latency{ok}", latency_text(&s.latency_ok));
        line(&mut out, "latency{failed}", latency_text(&s.latency_failed));
    }
    line(
        &mut out,
        "vus",
        format!(
            "peak in flight {}, allocated max {}",
            s.in_flight_max, s.vus_allocated_max
        ),
    );
    line(
        &mut out,
        "start_lag",
        format!(
            "max={} (how late the generator started iterations)",
            fmt_ms(s.start_lag_max_ms)
        ),
    );
    for c in &s.calls {
        line(&mut out, &format!("call {}", c.call), call_text(c));
    }
    out
}

/// One call kind of a sequence: how many, errors, latency.
fn call_text(c: &CallSummary) -> String {
    format!(
        "{} calls, {} errors, avg={} med={} p(99)={} max={}",
        c.count,
        c.errors,
        fmt_ms(c.latency.avg_ms),
        fmt_ms(c.latency.med_ms),
        fmt_ms(c.latency.p99_ms),
        fmt_ms(c.latency.max_ms)
    )
}

/// Achieved rate / target rate (1 when nothing was asked for).
pub fn achieved_share(s: &ScenarioSummary) -> f64 {
    if s.target_rate > 0.0 {
        s.achieved_rate / s.target_rate
    } else {
        1.0
    }
}

/// One scenario's headline numbers over one path.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PathScenario {
    pub name: String,
    pub target_rate: f64,
    pub achieved_rate: f64,
    pub avg_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub errors: u64,
    pub dropped: u64,
}

/// A run's headline numbers, to set beside another path's run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PathSummary {
    pub gateway: String,
    pub mode: String,
    pub wall_time_s: f64,
    pub scenarios: Vec<PathScenario>,
    pub stuck: u64,
    pub verification: Option<Verification>,
    pub cpu: Option<CpuUse>,
}

impl PathSummary {
    pub fn of(report: &RunReport) -> Self {
        let scenarios = report
            .scenarios
            .iter()
            .map(|s| PathScenario {
                name: s.name.clone(),
                target_rate: s.target_rate,
                achieved_rate: s.achieved_rate,
                avg_ms: s.latency.avg_ms,
                p99_ms: s.latency.p99_ms,
                max_ms: s.latency.max_ms,
                errors: s.errors,
                dropped: s.dropped,
            })
            .collect();
        Self {
            gateway: report.gateway.clone(),
            mode: report.mode.clone(),
            wall_time_s: report.wall_time_s,
            scenarios,
            stuck: report.stuck,
            verification: report.verification.clone(),
            cpu: report.cpu.clone(),
        }
    }

    /// Acknowledged writes missing afterwards, or iterations stuck.
    pub fn failed(&self) -> bool {
        self.stuck > 0 || self.verification.as_ref().is_some_and(|v| v.missing > 0)
    }
}

/// The run's own path, then the paths beside it, scenario by scenario.
fn paths_text(report: &RunReport) -> String {
    let own = PathSummary::of(report);
    let mut out =
        String::from("\n  paths (the same load, one run after the other in this invocation)\n");
    let _ = writeln!(
        out,
        "    {:<8} {:<12} {:>19} {:>9} {:>9} {:>9} {:>7} {:>7}",
        "scenario", "gateway", "achieved/target", "avg", "p99", "max", "errors", "dropped"
    );
    for s in &own.scenarios {
        for path in std::iter::once(&own).chain(&report.beside) {
            let Some(p) = path.scenarios.iter().find(|p| p.name == s.name) else {
                continue;
            };
            let _ = writeln!(
                out,
                "    {:<8} {:<12} {:>19} {:>9} {:>9} {:>9} {:>7} {:>7}",
                p.name,
                path.gateway,
                format!("{:.1}/{:.0}/s", p.achieved_rate, p.target_rate),
                fmt_ms(p.avg_ms),
                fmt_ms(p.p99_ms),
                fmt_ms(p.max_ms),
                p.errors,
                p.dropped
            );
        }
    }
    for path in std::iter::once(&own).chain(&report.beside) {
        if let Some(cpu) = &path.cpu {
            let _ = writeln!(out, "    cpu over {}: {}", path.gateway, cpu.text());
        }
    }
    for path in &report.beside {
        if let Some(v) = &path.verification {
            let _ = writeln!(
                out,
                "    verify over {}: {}/{} acknowledged nodes readable on {} replica(s), {} missing",
                path.gateway, v.found, v.acked, v.replicas_checked, v.missing
            );
        }
        if path.stuck > 0 {
            let _ = writeln!(out, "    stuck over {}: {}", path.gateway, path.stuck);
        }
    }
    out
}

fn bracket(items: &[String]) -> String {
    if items.is_empty() {
        String::new()
    } else {
        format!("({})", items.join(", "))
    }
}

pub fn latency_text(l: &LatencySummary) -> String {
    format!(
        "avg={} min={} med={} max={} p(90)={} p(95)={} p(99)={}",
        fmt_ms(l.avg_ms),
        fmt_ms(l.min_ms),
        fmt_ms(l.med_ms),
        fmt_ms(l.max_ms),
        fmt_ms(l.p90_ms),
        fmt_ms(l.p95_ms),
        fmt_ms(l.p99_ms)
    )
}

/// Milliseconds the way k6 prints durations: µs below 1 ms, s above 1 s.
pub fn fmt_ms(ms: f64) -> String {
    if ms < 1.0 {
        format!("{:.0}µs", ms * 1000.0)
    } else if ms < 1000.0 {
        format!("{ms:.2}ms")
    } else {
        format!("{:.2}s", ms / 1000.0)
    }
}

pub fn write_creating_dirs(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::threshold::{evaluate_all, Threshold};

    fn user(achieved_rate: f64, p99_ms: f64) -> ScenarioSummary {
        ScenarioSummary {
            name: "user".into(),
            target_rate: 1000.0,
            achieved_rate,
            latency: LatencySummary {
                count: 10,
                p99_ms,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// k6 prints the threshold verdicts before everything else, and the
    /// achieved rate beside the target.
    #[test]
    fn summary_opens_with_thresholds_and_shows_the_target_rate() {
        let mut report = RunReport {
            mode: "real/single".into(),
            gateway: "tcp".into(),
            scenarios: vec![user(950.0, 30.0)],
            ..Default::default()
        };
        report.params.insert("deadline".into(), "5s".into());
        let threshold = Threshold::parse("user: p(99)<25ms").unwrap();
        report.thresholds = evaluate_all(&[threshold], &report.scenarios);
        assert!(!report.thresholds_passed());
        let text = report.summary_text();
        assert!(text.contains("[real/single, gateway tcp]"), "{text}");
        let verdict = text.find("✗ 'p(99)<25ms' p(99)=30.00ms").expect("verdict");
        assert!(verdict < text.find("deadline").unwrap(), "{text}");
        assert!(
            text.contains("950.0/s of 1000.0/s target (95.0%)"),
            "{text}"
        );
    }

    #[test]
    fn other_paths_are_listed_beside_the_run() {
        let mut report = RunReport {
            gateway: "tcp".into(),
            scenarios: vec![user(900.0, 40.0)],
            ..Default::default()
        };
        let mut in_process = report.clone();
        in_process.gateway = "in-process".into();
        in_process.scenarios = vec![user(1000.0, 4.0)];
        report.beside.push(PathSummary::of(&in_process));
        let text = report.summary_text();
        let tcp = text.find("user     tcp").expect("own path");
        let beside = text.find("user     in-process").expect("beside");
        assert!(tcp < beside, "{text}");
        assert!(text.contains("1000.0/1000/s"), "{text}");
        assert!(!report.failed());
        // Writes lost on the path beside fail the whole run.
        in_process.verification = Some(Verification {
            acked: 10,
            found: 9,
            missing: 1,
            ..Default::default()
        });
        report.beside = vec![PathSummary::of(&in_process)];
        assert!(report.failed());
        assert!(report
            .summary_text()
            .contains("verify over in-process: 9/10"));
    }
}
