//! A self-contained HTML report: summary tables and inline SVG charts of
//! latency percentiles and throughput over time. No scripts, no fonts, no
//! network: the file opens anywhere.

use super::metrics::{ScenarioSummary, WindowStats};
use super::node_timeline::NodeSecond;
use super::report::{fmt_ms, PathSummary, RunReport};
use arbor::types::ReplicaId;
use std::collections::BTreeSet;
use std::fmt::Write as _;

const CHART_WIDTH: f64 = 900.0;
const CHART_HEIGHT: f64 = 260.0;
const MARGIN_LEFT: f64 = 70.0;
const MARGIN_RIGHT: f64 = 130.0;
const MARGIN_TOP: f64 = 28.0;
const MARGIN_BOTTOM: f64 = 36.0;

/// One line of a chart.
pub struct Series {
    pub name: String,
    pub color: &'static str,
    pub points: Vec<(f64, f64)>,
}

/// Renders the whole report.
pub fn render(report: &RunReport) -> String {
    let mut body = String::new();
    let _ = writeln!(body, "<h1>{}</h1>", esc(&report.title));
    let _ = writeln!(
        body,
        "<p class=meta>mode <b>{}</b>{}; {:.1} s on the load clock, {:.1} s wall{}</p>",
        esc(&report.path_text()),
        report
            .seed
            .map(|s| format!(", seed {s}"))
            .unwrap_or_default(),
        report.clock_time_s,
        report.wall_time_s,
        if report.host.is_empty() {
            String::new()
        } else {
            format!(" on {}", esc(&report.host))
        }
    );
    body.push_str(&thresholds_table(report));
    body.push_str(&params_table(report));
    body.push_str(&summary_table(&report.scenarios));
    body.push_str(&paths_table(report));
    // The verdicts (verification, recovery, notes) under the summary table,
    // so that the first screen of the report is the whole summary.
    if let Some(v) = &report.verification {
        let _ = writeln!(
            body,
            "<p>Verification: {} of {} acknowledged nodes readable on {} replica(s); {} missing.</p>",
            v.found, v.acked, v.replicas_checked, v.missing
        );
    }
    for n in &report.notes {
        let _ = writeln!(body, "<p class=note>{}</p>", esc(n));
    }
    for s in &report.scenarios {
        body.push_str(&scenario_charts(s));
    }
    body.push_str(&process_chart(report));
    body.push_str(&node_charts(&report.timeline));
    format!(
        "<!doctype html>\n<html><head><meta charset=utf-8><title>{}</title>\n<style>{}</style></head>\n<body>\n{}</body></html>\n",
        esc(&report.title),
        STYLE,
        body
    )
}

const STYLE: &str = "body{font-family:sans-serif;margin:24px;color:#222}\
table{border-collapse:collapse;margin:8px 0 18px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}.meta{color:#555}.note{color:#a40}\
.pass{color:#080}.fail{color:#c00;font-weight:bold}\
svg{display:block;margin:6px 0 18px}";

/// k6's threshold block as a table, first on the page: the verdict.
fn thresholds_table(report: &RunReport) -> String {
    if report.thresholds.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<table><tr><th>threshold</th><th>scenario</th><th>observed</th><th>verdict</th></tr>\n",
    );
    for t in &report.thresholds {
        let (class, mark) = if t.passed {
            ("pass", "✓ pass")
        } else {
            ("fail", "✗ fail")
        };
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class={class}>{mark}</td></tr>",
            esc(&t.threshold),
            esc(&t.scenario),
            esc(&t.observed_text)
        );
    }
    out.push_str("</table>\n");
    out
}

/// The run's own path and the paths measured beside it.
fn paths_table(report: &RunReport) -> String {
    if report.beside.is_empty() {
        return String::new();
    }
    let own = PathSummary::of(report);
    let mut out = String::from(
        "<p>The same load over other paths, one run after the other:</p>\n\
         <table><tr><th>scenario</th><th>gateway</th><th>achieved/s</th><th>target/s</th>\
         <th>avg</th><th>p99</th><th>max</th><th>errors</th><th>dropped</th></tr>\n",
    );
    for path in std::iter::once(&own).chain(&report.beside) {
        for p in &path.scenarios {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{:.1}</td><td>{:.0}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&p.name),
                esc(&path.gateway),
                p.achieved_rate,
                p.target_rate,
                fmt_ms(p.avg_ms),
                fmt_ms(p.p99_ms),
                fmt_ms(p.max_ms),
                p.errors,
                p.dropped
            );
        }
    }
    out.push_str("</table>\n");
    out
}

fn params_table(report: &RunReport) -> String {
    let mut out = String::from("<table><tr><th>parameter</th><th>value</th></tr>\n");
    for (k, v) in &report.params {
        let _ = writeln!(out, "<tr><td>{}</td><td>{}</td></tr>", esc(k), esc(v));
    }
    if let Some(c) = &report.service {
        let _ = writeln!(
            out,
            "<tr><td>service</td><td>{} writes in {} batches (avg {:.1}), {} rejected overload, {} pushed, {} pulled</td></tr>",
            c.writes_committed, c.batches_committed, c.batch_size_avg, c.writes_rejected_overload, c.ops_pushed, c.ops_pulled
        );
    }
    if let Some(cpu) = &report.cpu {
        let _ = writeln!(out, "<tr><td>cpu</td><td>{}</td></tr>", esc(&cpu.text()));
    }
    out.push_str("</table>\n");
    out
}

fn summary_table(scenarios: &[ScenarioSummary]) -> String {
    let mut out = String::from(
        "<table><tr><th>scenario</th><th>iterations</th><th>rate/s</th><th>target/s</th><th>errors</th><th>dropped</th>\
         <th>avg</th><th>min</th><th>med</th><th>p90</th><th>p95</th><th>p99</th><th>max</th></tr>\n",
    );
    for s in scenarios {
        let l = &s.latency;
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{:.1}</td><td>{:.1}</td><td>{} ({:.2}%){}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&s.name),
            s.ok + s.errors,
            s.achieved_rate,
            s.target_rate,
            s.errors,
            s.error_rate * 100.0,
            error_kinds(s),
            s.dropped,
            fmt_ms(l.avg_ms),
            fmt_ms(l.min_ms),
            fmt_ms(l.med_ms),
            fmt_ms(l.p90_ms),
            fmt_ms(l.p95_ms),
            fmt_ms(l.p99_ms),
            fmt_ms(l.max_ms)
        );
    }
    out.push_str("</table>\n");
    out
}

/// What the errors were, e.g. "<br>overloaded 143", or nothing.
fn error_kinds(s: &ScenarioSummary) -> String {
    s.errors_by_kind
        .iter()
        .map(|(kind, n)| format!("<br>{} {n}", esc(kind)))
        .collect()
}

fn scenario_charts(s: &ScenarioSummary) -> String {
    let w = &s.windows;
    let pick = |f: fn(&super::metrics::WindowStats) -> f64| -> Vec<(f64, f64)> {
        w.iter()
            .filter(|x| x.ok > 0)
            .map(|x| (x.start_s, f(x)))
            .collect()
    };
    let series = |name: &str, color: &'static str, points: Vec<(f64, f64)>| Series {
        name: name.into(),
        color,
        points,
    };
    let latency = [
        series("p50", "#1f77b4", pick(|x| x.p50_ms)),
        series("p90", "#2ca02c", pick(|x| x.p90_ms)),
        series("p99", "#ff7f0e", pick(|x| x.p99_ms)),
        series("max", "#d62728", pick(|x| x.max_ms)),
    ];
    let width_s = w.first().map_or(1.0, |_| {
        if w.len() > 1 {
            w[1].start_s - w[0].start_s
        } else {
            1.0
        }
    });
    let per_s = |f: fn(&super::metrics::WindowStats) -> u64| -> Vec<(f64, f64)> {
        w.iter()
            .map(|x| (x.start_s, f(x) as f64 / width_s))
            .collect()
    };
    let throughput = [
        series("ok/s", "#2ca02c", per_s(|x| x.ok)),
        series("errors/s", "#d62728", per_s(|x| x.errors)),
        series("overloaded/s", "#9467bd", per_s(|x| x.overloaded)),
        series("dropped/s", "#8c564b", per_s(|x| x.dropped)),
    ];
    let in_flight = [
        series(
            "in flight (peak)",
            "#1f77b4",
            per_window(w, |x| x.in_flight_max),
        ),
        series(
            "VUs allocated",
            "#7f7f7f",
            per_window(w, |x| x.vus_allocated),
        ),
    ];
    let mut out = format!("<h2>scenario {}</h2>\n", esc(&s.name));
    out.push_str(&line_chart(
        "latency of acknowledged requests (ms, log scale)",
        &latency,
        true,
    ));
    out.push_str(&line_chart("throughput (per second)", &throughput, false));
    out.push_str(&line_chart(
        "iterations in flight (k6's busy VUs) and the VU pool",
        &in_flight,
        false,
    ));
    out
}

/// One value per window, as is (counts, not rates).
fn per_window(windows: &[WindowStats], f: fn(&WindowStats) -> u64) -> Vec<(f64, f64)> {
    windows.iter().map(|x| (x.start_s, f(x) as f64)).collect()
}

fn process_chart(report: &RunReport) -> String {
    if report.samples.is_empty() {
        return String::new();
    }
    let in_flight = Series {
        name: "in flight".into(),
        color: "#1f77b4",
        points: report
            .samples
            .iter()
            .map(|s| (s.at_s, s.in_flight as f64))
            .collect(),
    };
    let rss = Series {
        name: "RSS MB".into(),
        color: "#d62728",
        points: report.samples.iter().map(|s| (s.at_s, s.rss_mb)).collect(),
    };
    let mut out = String::from("<h2>process</h2>\n");
    out.push_str(&line_chart(
        "requests in flight, all scenarios (sampled each window)",
        &[in_flight],
        false,
    ));
    out.push_str(&line_chart("resident memory (MB)", &[rss], false));
    out
}

/// What a node chart plots from each row.
type NodeMeasure = fn(&NodeSecond) -> f64;

/// Colors of the nodes' series, by position.
const NODE_COLORS: [&str; 5] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"];

/// Each node's timeline (`node_timeline::NodeSecond`): the share of time its
/// batcher spent committing, its queue, and what it pushed.
fn node_charts(timeline: &[NodeSecond]) -> String {
    if timeline.is_empty() {
        return String::new();
    }
    let replicas: BTreeSet<ReplicaId> = timeline.iter().map(|r| r.replica).collect();
    let series = |f: NodeMeasure| -> Vec<Series> {
        replicas
            .iter()
            .enumerate()
            .map(|(i, &replica)| Series {
                name: format!("node {replica}"),
                color: NODE_COLORS[i % NODE_COLORS.len()],
                points: timeline
                    .iter()
                    .filter(|r| r.replica == replica)
                    .map(|r| (r.at_s, f(r)))
                    .collect(),
            })
            .collect()
    };
    let mut out = String::from("<h2>nodes</h2>\n");
    let charts: [(&str, NodeMeasure); 4] = [
        (
            "share of each second spent in commits (1 = the batcher never idles)",
            |r| r.commit_busy,
        ),
        ("average commit (ms)", |r| r.commit_ms_avg),
        ("writes waiting in the batcher (end of each second)", |r| {
            r.pending_writes as f64
        }),
        ("ops pushed to peers per second", |r| r.ops_pushed as f64),
    ];
    for (title, f) in charts {
        out.push_str(&line_chart(title, &series(f), false));
    }
    out
}

/// An SVG line chart with axes, ticks and a legend; `log_y` for latencies
/// that span microseconds to seconds.
pub fn line_chart(title: &str, series: &[Series], log_y: bool) -> String {
    let points = series.iter().flat_map(|s| s.points.iter());
    let (mut x_max, mut y_min, mut y_max) = (0.0f64, f64::MAX, 0.0f64);
    for &(x, y) in points {
        x_max = x_max.max(x);
        y_max = y_max.max(y);
        if y > 0.0 {
            y_min = y_min.min(y);
        }
    }
    x_max = x_max.max(1.0);
    let y_axis = if log_y {
        YAxis::log(y_min.min(y_max), y_max)
    } else {
        YAxis::linear(y_max)
    };
    let plot_w = CHART_WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
    let plot_h = CHART_HEIGHT - MARGIN_TOP - MARGIN_BOTTOM;
    let sx = |x: f64| MARGIN_LEFT + x / x_max * plot_w;
    let sy = |y: f64| MARGIN_TOP + plot_h * (1.0 - y_axis.frac(y));
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{CHART_WIDTH}' height='{CHART_HEIGHT}' font-size='11'>\n\
         <text x='{MARGIN_LEFT}' y='16' font-weight='bold'>{}</text>\n\
         <rect x='{MARGIN_LEFT}' y='{MARGIN_TOP}' width='{plot_w}' height='{plot_h}' fill='none' stroke='#999'/>\n",
        esc(title)
    );
    for (value, label) in y_axis.ticks() {
        let y = sy(value);
        let _ = writeln!(
            svg,
            "<line x1='{MARGIN_LEFT}' x2='{:.1}' y1='{y:.1}' y2='{y:.1}' stroke='#eee'/><text x='{:.1}' y='{:.1}' text-anchor='end'>{label}</text>",
            MARGIN_LEFT + plot_w,
            MARGIN_LEFT - 6.0,
            y + 4.0
        );
    }
    for x in nice_ticks(x_max) {
        let px = sx(x);
        let _ = writeln!(
            svg,
            "<text x='{px:.1}' y='{:.1}' text-anchor='middle'>{}s</text>",
            MARGIN_TOP + plot_h + 16.0,
            trim_num(x)
        );
    }
    for (i, s) in series.iter().enumerate() {
        let path: Vec<String> = s
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        if !path.is_empty() {
            let _ = writeln!(
                svg,
                "<polyline fill='none' stroke='{}' stroke-width='1.5' points='{}'/>",
                s.color,
                path.join(" ")
            );
        }
        let ly = MARGIN_TOP + 14.0 * i as f64 + 8.0;
        let lx = MARGIN_LEFT + plot_w + 10.0;
        let _ = writeln!(
            svg,
            "<line x1='{lx}' x2='{:.1}' y1='{ly}' y2='{ly}' stroke='{}' stroke-width='3'/><text x='{:.1}' y='{:.1}'>{}</text>",
            lx + 18.0,
            s.color,
            lx + 24.0,
            ly + 4.0,
            esc(&s.name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

enum YAxis {
    Linear { max: f64 },
    Log { lo: f64, hi: f64 },
}

impl YAxis {
    fn linear(y_max: f64) -> Self {
        let ticks = nice_ticks(y_max.max(1e-9));
        let max = ticks.last().copied().unwrap_or(1.0).max(y_max).max(1e-9);
        YAxis::Linear { max }
    }

    fn log(y_min: f64, y_max: f64) -> Self {
        let lo = 10f64.powf(y_min.max(1e-3).log10().floor());
        let hi = 10f64.powf(y_max.max(lo * 10.0).log10().ceil());
        YAxis::Log { lo, hi }
    }

    fn frac(&self, y: f64) -> f64 {
        match *self {
            YAxis::Linear { max } => (y / max).clamp(0.0, 1.0),
            YAxis::Log { lo, hi } => {
                ((y.max(lo).log10() - lo.log10()) / (hi.log10() - lo.log10())).clamp(0.0, 1.0)
            }
        }
    }

    fn ticks(&self) -> Vec<(f64, String)> {
        match *self {
            YAxis::Linear { max } => nice_ticks(max)
                .into_iter()
                .map(|t| (t, trim_num(t)))
                .collect(),
            YAxis::Log { lo, hi } => {
                let mut out = Vec::new();
                let mut t = lo;
                while t <= hi * 1.0001 {
                    out.push((t, trim_num(t)));
                    t *= 10.0;
                }
                out
            }
        }
    }
}

/// 0 and about five round steps up to `max`.
fn nice_ticks(max: f64) -> Vec<f64> {
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let mut ticks = Vec::new();
    let mut t = 0.0;
    while t <= max + step * 0.999 && ticks.len() < 12 {
        ticks.push(t);
        t += step;
    }
    ticks
}

fn trim_num(v: f64) -> String {
    if v >= 1000.0 && v % 1000.0 == 0.0 {
        format!("{}k", v / 1000.0)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Escapes text for HTML element content and attribute values.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\'', "&#39;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_is_self_contained_svg() {
        let s = Series {
            name: "p99 <x>".into(),
            color: "#000",
            points: vec![(0.0, 0.5), (1.0, 20.0), (2.0, 1500.0)],
        };
        let svg = line_chart("t", &[s], true);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("p99 &lt;x&gt;"));
        assert!(!svg.contains("http://") || svg.contains("xmlns='http://www.w3.org/2000/svg'"));
        assert_eq!(svg.matches("<polyline").count(), 1);
    }

    /// The verdicts open the page, the path is named, and each scenario
    /// charts its iterations in flight over time.
    #[test]
    fn report_shows_thresholds_path_and_in_flight() {
        use crate::load::metrics::WindowStats;
        use crate::load::threshold::{evaluate_all, Threshold};
        let windows = (0..3)
            .map(|i| WindowStats {
                start_s: i as f64,
                in_flight_max: 5 + i,
                vus_allocated: 100,
                ..Default::default()
            })
            .collect();
        let mut report = RunReport {
            mode: "real/single".into(),
            gateway: "tcp".into(),
            scenarios: vec![ScenarioSummary {
                name: "user".into(),
                windows,
                ..Default::default()
            }],
            ..Default::default()
        };
        let threshold = Threshold::parse("user: rate<0.01").unwrap();
        report.thresholds = evaluate_all(&[threshold], &report.scenarios);
        let html = render(&report);
        assert!(html.contains("real/single, gateway tcp"));
        let verdict = html.find("✓ pass").expect("verdict shown");
        assert!(verdict < html.find("<th>parameter</th>").unwrap());
        assert!(html.contains("iterations in flight (k6&#39;s busy VUs)"));
        assert!(html.contains("VUs allocated"));
    }

    /// A run with a timeline charts each node as its own series; a run
    /// without one (sim mode) has no node section.
    #[test]
    fn nodes_are_charted_one_series_each() {
        let row = |at_s: f64, replica: ReplicaId, busy: f64| NodeSecond {
            at_s,
            replica,
            commit_busy: busy,
            ..Default::default()
        };
        let mut report = RunReport::default();
        assert!(!render(&report).contains("<h2>nodes</h2>"));
        report.timeline = vec![
            row(1.0, 1, 0.2),
            row(1.0, 2, 0.9),
            row(2.0, 1, 0.3),
            row(2.0, 2, 1.0),
        ];
        let html = render(&report);
        let nodes = &html[html.find("<h2>nodes</h2>").expect("node section")..];
        assert!(nodes.contains("node 1") && nodes.contains("node 2"));
        // Four charts, two series each.
        assert_eq!(nodes.matches("<polyline").count(), 8);
    }

    #[test]
    fn ticks_cover_the_maximum() {
        for max in [0.7, 3.0, 42.0, 999.0, 30_000.0] {
            let t = nice_ticks(max);
            assert!(*t.last().unwrap() >= max, "{max}: {t:?}");
            assert!(t.len() <= 12);
        }
    }
}
