//! `replay --html FILE`: one self-contained HTML page (inline SVG, no
//! network) drawing a run over simulated time: one lane per replica and
//! per client; client ops from send to answer (acknowledged, failed or
//! never answered; acknowledged drops in their own colour); partitions,
//! crashes, restarts, disk-error windows, disk replacements and the other
//! faults; the operator's membership steps (joins, catch-ups, leaves) on
//! its lane and the replica each is about; sync rounds the checks start;
//! check phases; and the
//! failure, with the ops its message names highlighted. Everything comes
//! from the run's trace, so a timeline shows exactly what a replay prints.
//! A few lines of plain JS zoom and pan the plot over simulated time (the
//! wheel zooms around the pointer, dragging pans; `#t=FROM,TO` in the
//! address opens a range, in seconds); without JS the page shows the
//! whole run.

use crate::scenario::Report;
use crate::trace::Event;
use crate::world::transport::{RequestKind, WireCall};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

const LABEL_W: f64 = 120.0;
const PLOT_W: f64 = 1100.0;
const LANE_H: f64 = 30.0;
const TOP: f64 = 70.0;
/// Most op bars drawn: a standard-size run has about 2,000 ops.
const OPS_DRAWN_MAX: usize = 20_000;
/// Most pushes and pulls drawn.
const WIRE_DRAWN_MAX: usize = 20_000;
/// Events listed under the drawing.
const EVENTS_LISTED_MAX: usize = 60;

/// One client op from send to answer.
struct Op {
    number: u64,
    client: String,
    replica: Option<String>,
    sent: Duration,
    answered: Option<(Duration, bool)>,
    /// Sends not answered yet (a drop is sent to every replica).
    waiting: usize,
    /// Every answer so far succeeded.
    all_ok: bool,
    summary: String,
}

/// A fault window on some lanes.
struct Window {
    start: Duration,
    end: Duration,
    lanes: Vec<String>,
    label: String,
    color: &'static str,
}

/// The HTML page of `report`'s run.
pub fn html(report: &Report) -> String {
    let events = &report.events;
    let end = events
        .last()
        .map_or(Duration::from_secs(1), |e| e.at)
        .max(Duration::from_millis(1));
    let lanes = lanes(events);
    let scale = Scale { end, lanes: &lanes };
    let ops = ops(events);
    let named = named_ops(report, &ops);
    let mut svg = String::new();
    let height = TOP + LANE_H * lanes.len() as f64 + 30.0;
    let _ = write!(
        svg,
        r#"<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="monospace" font-size="11" data-label-w="{LABEL_W}" data-plot-w="{PLOT_W}" data-end-s="{}">"#,
        LABEL_W + PLOT_W + 20.0,
        end.as_secs_f64()
    );
    draw_lanes(&mut svg, &scale);
    // Everything placed in time goes in one clipped group, which the
    // page's script rescales; the axis is redrawn by it.
    let _ = write!(
        svg,
        r#"<defs><clipPath id="plot-clip"><rect x="{LABEL_W}" y="0" width="{}" height="{height}"/></clipPath></defs><g id="plot" clip-path="url(#plot-clip)"><g id="axis">"#,
        PLOT_W + 20.0
    );
    draw_axis(&mut svg, &scale, height);
    svg.push_str("</g>");
    for window in windows(events) {
        draw_window(&mut svg, &scale, &window);
    }
    for call in report.wire.iter().take(WIRE_DRAWN_MAX) {
        draw_wire(&mut svg, &scale, call);
    }
    for op in ops.iter().take(OPS_DRAWN_MAX) {
        draw_op(&mut svg, &scale, op, named.contains(&op.number));
    }
    draw_marks(&mut svg, &scale, events, height);
    draw_final_failure(&mut svg, &scale, report, height);
    svg.push_str("</g></svg>");
    page(report, &svg, events, &named)
}

struct Scale<'a> {
    end: Duration,
    lanes: &'a [String],
}

impl Scale<'_> {
    fn x(&self, at: Duration) -> f64 {
        LABEL_W + PLOT_W * at.as_secs_f64() / self.end.as_secs_f64()
    }

    fn lane_y(&self, lane: &str) -> Option<f64> {
        let i = self.lanes.iter().position(|l| l == lane)?;
        Some(TOP + LANE_H * i as f64)
    }
}

/// Replicas, then clients (by number), then the nemesis and the world.
fn lanes(events: &[Event]) -> Vec<String> {
    let names: BTreeSet<&str> = events.iter().map(|e| e.node.as_str()).collect();
    let mut lanes: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    lanes.sort_by_key(|name| {
        let rank = match name.split('-').next() {
            Some("replica") => 0,
            Some("client") => 1,
            _ if name == "nemesis" => 2,
            _ => 3,
        };
        let number: u64 = name
            .rsplit('-')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        (rank, number, name.clone())
    });
    if !lanes.iter().any(|l| l == "nemesis") {
        lanes.push("nemesis".into());
    }
    lanes
}

fn op_number(what: &str) -> Option<(u64, &str)> {
    let rest = what.strip_prefix("op#")?;
    let digits = rest.find(' ').unwrap_or(rest.len());
    Some((rest[..digits].parse().ok()?, rest[digits..].trim_start()))
}

/// Whether an op event is an answer, and if so whether it succeeded. A
/// drop's answer is logged as the call's whole result.
fn answer_ok(rest: &str) -> Option<bool> {
    if rest.starts_with("ok") {
        Some(true)
    } else if rest.starts_with("failed") {
        Some(false)
    } else {
        rest.strip_prefix("drop: ")
            .map(|answer| answer == "Ok(Done)")
    }
}

/// Client ops from their first send to their last answer. A drop goes to
/// every replica under one op number: it is answered when every send is,
/// and acknowledged when every answer was.
fn ops(events: &[Event]) -> Vec<Op> {
    let mut ops: BTreeMap<(String, u64), Op> = BTreeMap::new();
    for event in events.iter().filter(|e| e.node.starts_with("client-")) {
        let Some((number, rest)) = op_number(&event.what) else {
            continue;
        };
        let key = (event.node.clone(), number);
        let answer = answer_ok(rest);
        if let Some(op) = ops.get_mut(&key) {
            op.summary.push_str(&format!(" / {rest}"));
            match answer {
                Some(ok) if op.waiting > 0 => {
                    op.waiting -= 1;
                    op.all_ok &= ok;
                    if op.waiting == 0 {
                        op.answered = Some((event.at, op.all_ok));
                    }
                }
                Some(_) => {}
                None => {
                    op.waiting += 1;
                    op.answered = None;
                }
            }
            continue;
        }
        if answer.is_some() {
            continue;
        }
        let replica = rest
            .rsplit("-> ")
            .next()
            .filter(|r| r.starts_with("replica-"));
        ops.insert(
            key,
            Op {
                number,
                client: event.node.clone(),
                replica: replica.map(str::to_string),
                sent: event.at,
                answered: None,
                waiting: 1,
                all_ok: true,
                summary: rest.to_string(),
            },
        );
    }
    ops.into_values().collect()
}

/// The numbers that follow each `marker` in `text`.
fn numbers_after(text: &str, marker: &str) -> Vec<u64> {
    text.match_indices(marker)
        .filter_map(|(i, _)| {
            let rest = text[i + marker.len()..].trim_start_matches(['#', ' ']);
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// The op a move's tag names: `key: "op", value: [49, 55]` is op 17.
fn tagged_ops(text: &str) -> Vec<u64> {
    let marker = "key: \"op\", value: [";
    text.match_indices(marker)
        .filter_map(|(i, _)| {
            let rest = &text[i + marker.len()..];
            let bytes: Vec<u8> = rest[..rest.find(']')?]
                .split(", ")
                .map(|b| b.trim().parse().ok())
                .collect::<Option<_>>()?;
            String::from_utf8(bytes).ok()?.parse().ok()
        })
        .collect()
}

/// Ops the failure's message names: by number ("op 17", "op#17", a
/// move's op tag) or by a node they created or moved ("id: 65537",
/// "child: 65537").
fn named_ops(report: &Report, ops: &[Op]) -> BTreeSet<u64> {
    let Some(failure) = &report.failure else {
        return BTreeSet::new();
    };
    let text = &failure.detail;
    let mut named: BTreeSet<u64> = numbers_after(text, "op").into_iter().collect();
    named.extend(tagged_ops(text));
    let nodes: BTreeSet<u64> = ["id: ", "child: "]
        .iter()
        .flat_map(|m| numbers_after(text, m))
        .collect();
    for op in ops {
        let answer = op.summary.rsplit(" / ").next().unwrap_or("");
        let mentions = answer
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse::<u64>().ok())
            .any(|n| nodes.contains(&n));
        if op.answered.is_some_and(|(_, ok)| ok) && mentions {
            named.insert(op.number);
        }
    }
    named
}

/// Parses the `Debug` form of a `Duration` ("1.5s", "300ms", "20µs").
fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let seconds = match unit {
        "s" => value,
        "ms" => value / 1e3,
        "µs" | "us" => value / 1e6,
        "ns" => value / 1e9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(seconds))
}

/// Replica numbers named in a nemesis note: "replica-3" and "(1, 2)".
fn replicas_named(text: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for (i, _) in text.match_indices("replica-") {
        let digits: String = text[i + 8..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        named.insert(format!("replica-{digits}"));
    }
    if let (Some(open), Some(close)) = (text.find('['), text.find(']')) {
        for part in text[open + 1..close].split(|c: char| !c.is_ascii_digit()) {
            if !part.is_empty() {
                named.insert(format!("replica-{part}"));
            }
        }
    }
    named
}

fn fault_style(what: &str) -> (&'static str, &'static str) {
    let styles = [
        ("partition", "partition", "#f4a261"),
        ("clog", "one-way", "#e9c46a"),
        ("packet loss", "packet loss", "#a8dadc"),
        ("latency", "latency", "#bde0fe"),
        ("crash", "down", "#e63946"),
        ("disk errors", "disk errors", "#9d4edd"),
        ("drop pushes", "push blackout", "#90be6d"),
    ];
    styles
        .iter()
        .find(|(prefix, _, _)| what.starts_with(prefix))
        .map_or(("fault", "#cccccc"), |(_, label, color)| (*label, *color))
}

/// An acknowledged drop of a container or tree.
const DROP_COLOR: &str = "#3a86ff";

/// The nemesis's note that starts a disk replacement.
const DISK_DESTROYED: &str = "destroy the disk of ";

/// A disk replacement's window, from its note ("destroy the disk of
/// replica-2, replace it after 1.2s"): the replica is down without a disk.
fn disk_replacement(event: &Event) -> Option<Window> {
    let rest = event.what.strip_prefix(DISK_DESTROYED)?;
    let (replica, after) = rest.split_once(", replace it after ")?;
    let length = parse_duration(after)?;
    Some(Window {
        start: event.at,
        end: event.at + length,
        lanes: vec![replica.to_string(), "nemesis".into()],
        label: format!("disk replaced: {}", event.what),
        color: "#6d597a",
    })
}

/// Fault windows from the nemesis's notes ("... for 1.2s").
fn windows(events: &[Event]) -> Vec<Window> {
    let mut windows = Vec::new();
    for event in events.iter().filter(|e| e.node == "nemesis") {
        if let Some(window) = disk_replacement(event) {
            windows.push(window);
            continue;
        }
        let Some((head, tail)) = event.what.rsplit_once(" for ") else {
            continue;
        };
        let Some(length) = parse_duration(tail) else {
            continue;
        };
        let (label, color) = fault_style(head);
        let mut lanes: Vec<String> = replicas_named(head).into_iter().collect();
        lanes.push("nemesis".into());
        windows.push(Window {
            start: event.at,
            end: event.at + length,
            lanes,
            label: format!("{label}: {}", event.what),
            color,
        });
    }
    windows
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn draw_lanes(svg: &mut String, scale: &Scale) {
    for (i, lane) in scale.lanes.iter().enumerate() {
        let y = TOP + LANE_H * i as f64;
        let fill = if i % 2 == 0 { "#f8f9fa" } else { "#ffffff" };
        let _ = write!(
            svg,
            r#"<rect x="0" y="{y}" width="{}" height="{LANE_H}" fill="{fill}"/><text x="4" y="{}">{}</text>"#,
            LABEL_W + PLOT_W,
            y + LANE_H / 2.0 + 4.0,
            escape(lane)
        );
    }
}

fn draw_axis(svg: &mut String, scale: &Scale, height: f64) {
    let seconds = scale.end.as_secs_f64();
    let step = [0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0]
        .into_iter()
        .find(|s| seconds / s <= 20.0)
        .unwrap_or(120.0);
    let mut t = 0.0;
    while t <= seconds {
        let x = scale.x(Duration::from_secs_f64(t));
        let _ = write!(
            svg,
            r##"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#dddddd"/><text x="{x}" y="{}" text-anchor="middle" fill="#555">{t:.1}s</text>"##,
            TOP - 4.0,
            height - 26.0,
            height - 12.0
        );
        t += step;
    }
}

fn draw_window(svg: &mut String, scale: &Scale, window: &Window) {
    let (x1, x2) = (scale.x(window.start), scale.x(window.end.min(scale.end)));
    for lane in &window.lanes {
        let Some(y) = scale.lane_y(lane) else {
            continue;
        };
        let _ = write!(
            svg,
            r#"<rect x="{x1:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}" opacity="0.55"><title>{}</title></rect>"#,
            y + 2.0,
            (x2 - x1).max(1.5),
            LANE_H - 4.0,
            window.color,
            escape(&window.label)
        );
    }
}

fn draw_op(svg: &mut String, scale: &Scale, op: &Op, named: bool) {
    let Some(y) = scale.lane_y(&op.client) else {
        return;
    };
    let (end, color) = match op.answered {
        Some((at, true)) if op.summary.starts_with("Drop") => (at, DROP_COLOR),
        Some((at, true)) => (at, "#2a9d8f"),
        Some((at, false)) => (at, "#d62828"),
        None => (scale.end, "#6c757d"),
    };
    let (x1, x2) = (scale.x(op.sent), scale.x(end));
    let stroke = if named {
        r##" stroke="#000" stroke-width="2.5""##
    } else {
        ""
    };
    let _ = write!(
        svg,
        r##"<rect x="{x1:.1}" y="{:.1}" width="{:.1}" height="8" fill="{color}"{stroke}><title>op#{} {}</title></rect>"##,
        y + 11.0,
        (x2 - x1).max(1.5),
        op.number,
        escape(&op.summary)
    );
    if let Some(ry) = op.replica.as_deref().and_then(|r| scale.lane_y(r)) {
        let _ = write!(
            svg,
            r#"<line x1="{x2:.1}" y1="{:.1}" x2="{x2:.1}" y2="{:.1}" stroke="{color}" stroke-width="{}"/>"#,
            ry + LANE_H - 9.0,
            ry + LANE_H - 2.0,
            if named { 3 } else { 1 }
        );
    }
}

/// A push or sync pull as a tick at the top of the sender's lane (faint
/// when the message filter dropped it).
fn draw_wire(svg: &mut String, scale: &Scale, call: &WireCall) {
    let Some(y) = scale.lane_y(&format!("replica-{}", call.from)) else {
        return;
    };
    let (color, top, what) = match call.kind {
        RequestKind::Push => ("#1d3557", 1.0, "push"),
        _ => ("#8338ec", 4.0, "sync pull"),
    };
    let x = scale.x(call.at);
    let opacity = if call.dropped { 0.25 } else { 0.8 };
    let _ = write!(
        svg,
        r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="{color}" opacity="{opacity}"><title>{what} replica-{} -> replica-{}{}</title></line>"#,
        y + top,
        y + top + 5.0,
        call.from,
        call.to,
        if call.dropped { " (dropped)" } else { "" }
    );
}

/// Point events: crashes, restarts, sync rounds, check phases, the failure.
fn draw_marks(svg: &mut String, scale: &Scale, events: &[Event], height: f64) {
    for event in events {
        let x = scale.x(event.at);
        if event.node == "world" {
            draw_world_mark(svg, x, event, height);
            continue;
        }
        if event.node == "operator" {
            draw_operator_mark(svg, scale, event);
            continue;
        }
        let Some(y) = scale.lane_y(&event.node) else {
            continue;
        };
        let color = match event.what.as_str() {
            w if w.starts_with("crash") => "#e63946",
            w if w.contains("restart") => "#f77f00",
            "up" => "#2a9d8f",
            "sync_now" => "#457b9d",
            _ if event.node.starts_with("replica-") => "#adb5bd",
            _ => continue,
        };
        let _ = write!(
            svg,
            r#"<circle cx="{x:.1}" cy="{:.1}" r="3.5" fill="{color}"><title>{}</title></circle>"#,
            y + 7.0,
            escape(&event.to_string())
        );
    }
}

/// How an operator's step (a membership change) is coloured.
fn operator_color(what: &str) -> &'static str {
    if what.contains(" joins ") {
        "#06d6a0"
    } else if what.contains(" caught up") {
        "#118ab2"
    } else if what.contains(" leaves ") || what.contains("its leave takes effect") {
        "#ef476f"
    } else {
        "#adb5bd"
    }
}

/// An operator's step as a diamond on its own lane and on the lane of
/// the replica it is about (its first word: "replica-4 joins ...", not the
/// members it lists).
fn draw_operator_mark(svg: &mut String, scale: &Scale, event: &Event) {
    let x = scale.x(event.at);
    let color = operator_color(&event.what);
    let subject = event.what.split_whitespace().next();
    let mut lanes: Vec<&str> = subject
        .filter(|w| w.starts_with("replica-"))
        .into_iter()
        .collect();
    lanes.push(&event.node);
    for y in lanes.iter().filter_map(|lane| scale.lane_y(lane)) {
        let cy = y + 7.0;
        let _ = write!(
            svg,
            r#"<polygon points="{x:.1},{:.1} {:.1},{cy:.1} {x:.1},{:.1} {:.1},{cy:.1}" fill="{color}"><title>{}</title></polygon>"#,
            cy - 5.0,
            x + 5.0,
            cy + 5.0,
            x - 5.0,
            escape(&event.to_string())
        );
    }
}

/// A failure the final checks found is not in the trace as an event: it
/// is marked at the run's end.
fn draw_final_failure(svg: &mut String, scale: &Scale, report: &Report, height: f64) {
    let Some(failure) = &report.failure else {
        return;
    };
    if report.events.iter().any(|e| e.what.starts_with("FAILURE")) {
        return;
    }
    let event = Event {
        at: scale.end,
        node: "world".into(),
        what: format!("FAILURE {failure}"),
    };
    draw_world_mark(svg, scale.x(scale.end), &event, height);
}

fn draw_world_mark(svg: &mut String, x: f64, event: &Event, height: f64) {
    let failure = event.what.starts_with("FAILURE");
    let (color, width) = if failure {
        ("#d00000", 3)
    } else {
        ("#6c757d", 1)
    };
    let _ = write!(
        svg,
        r#"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{}" stroke="{color}" stroke-width="{width}" stroke-dasharray="{}"><title>{}</title></line>"#,
        TOP - 10.0,
        height - 26.0,
        if failure { "none" } else { "4 3" },
        escape(&event.to_string())
    );
    if failure {
        let anchor = if x > LABEL_W + PLOT_W * 0.6 {
            "end"
        } else {
            "start"
        };
        let _ = write!(
            svg,
            r#"<text x="{x:.1}" y="{}" fill="{color}" font-weight="bold" text-anchor="{anchor}">{}</text>"#,
            TOP - 14.0,
            escape(&truncate(&event.what, 150))
        );
    }
}

fn truncate(text: &str, chars: usize) -> String {
    if text.chars().count() <= chars {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(chars).collect();
    cut.push('…');
    cut
}

/// Zoom and pan over simulated time. Every element of `#plot` keeps the
/// x coordinates the whole-run drawing gave it and is mapped from them, so
/// the Rust side draws once; widths grow with the zoom and never go under
/// 1.5 px, marks keep their size; the axis is redrawn for the range shown.
const ZOOM_SCRIPT: &str = r#"
(function () {
  var svg = document.getElementById('timeline');
  if (!svg) return;
  var NS = 'http://www.w3.org/2000/svg';
  var labelW = +svg.dataset.labelW, plotW = +svg.dataset.plotW, endS = +svg.dataset.endS;
  var axis = document.getElementById('axis');
  var axisTop = 0, axisBottom = 0, axisText = 0;
  var first = axis.querySelector('line'), firstText = axis.querySelector('text');
  if (first) { axisTop = +first.getAttribute('y1'); axisBottom = +first.getAttribute('y2'); }
  if (firstText) axisText = +firstText.getAttribute('y');
  var placed = [];
  document.querySelectorAll('#plot > :not(#axis)').forEach(function (el) {
    var base = {};
    ['x', 'width', 'x1', 'x2', 'cx'].forEach(function (a) {
      if (el.hasAttribute(a)) base[a] = +el.getAttribute(a);
    });
    placed.push([el, base]);
  });
  var view = [0, endS];
  function render() {
    var k = endS / (view[1] - view[0]);
    var shift = plotW * view[0] / endS;
    function map(x) { return labelW + (x - labelW - shift) * k; }
    placed.forEach(function (p) {
      var el = p[0], b = p[1];
      if ('x' in b) el.setAttribute('x', map(b.x).toFixed(1));
      if ('width' in b) el.setAttribute('width', Math.max(1.5, b.width * k).toFixed(1));
      if ('x1' in b) el.setAttribute('x1', map(b.x1).toFixed(1));
      if ('x2' in b) el.setAttribute('x2', map(b.x2).toFixed(1));
      if ('cx' in b) el.setAttribute('cx', map(b.cx).toFixed(1));
    });
    drawAxis();
    document.getElementById('zoom-range').textContent =
      view[0].toFixed(3) + 's .. ' + view[1].toFixed(3) + 's of ' + endS.toFixed(3) + 's';
  }
  function drawAxis() {
    while (axis.firstChild) axis.removeChild(axis.firstChild);
    var span = view[1] - view[0];
    var steps = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300];
    var step = steps.find(function (s) { return span / s <= 20; }) || 600;
    var digits = step < 0.01 ? 3 : step < 0.1 ? 2 : 1;
    for (var t = Math.ceil(view[0] / step) * step; t <= view[1] + 1e-9; t += step) {
      var x = labelW + plotW * (t - view[0]) / span;
      var line = document.createElementNS(NS, 'line');
      line.setAttribute('x1', x); line.setAttribute('x2', x);
      line.setAttribute('y1', axisTop); line.setAttribute('y2', axisBottom);
      line.setAttribute('stroke', '#dddddd');
      var text = document.createElementNS(NS, 'text');
      text.setAttribute('x', x); text.setAttribute('y', axisText);
      text.setAttribute('text-anchor', 'middle'); text.setAttribute('fill', '#555');
      text.textContent = t.toFixed(digits) + 's';
      axis.appendChild(line);
      // A label at the very left edge would be cut in half by the clip.
      if (x >= labelW + 14) axis.appendChild(text);
    }
  }
  function set(from, to) {
    var span = Math.min(endS, Math.max(to - from, endS / 1e5, 1e-6));
    from = Math.min(Math.max(from, 0), endS - span);
    view = [from, from + span];
    render();
  }
  function zoomAt(t, factor) {
    set(t - (t - view[0]) * factor, t + (view[1] - t) * factor);
  }
  function pointerTime(event) {
    var box = svg.getBoundingClientRect();
    var x = (event.clientX - box.left) * svg.width.baseVal.value / box.width;
    return view[0] + (view[1] - view[0]) * Math.min(Math.max((x - labelW) / plotW, 0), 1);
  }
  svg.addEventListener('wheel', function (event) {
    event.preventDefault();
    zoomAt(pointerTime(event), event.deltaY < 0 ? 0.8 : 1.25);
  }, { passive: false });
  var drag = null;
  svg.addEventListener('mousedown', function (event) { drag = [event.clientX, view[0], view[1]]; });
  window.addEventListener('mouseup', function () { drag = null; });
  window.addEventListener('mousemove', function (event) {
    if (!drag) return;
    var box = svg.getBoundingClientRect();
    var px = (event.clientX - drag[0]) * svg.width.baseVal.value / box.width;
    var dt = (drag[2] - drag[1]) * px / plotW;
    set(drag[1] - dt, drag[2] - dt);
  });
  function middle() { return (view[0] + view[1]) / 2; }
  document.getElementById('zoom-in').onclick = function () { zoomAt(middle(), 0.5); };
  document.getElementById('zoom-out').onclick = function () { zoomAt(middle(), 2); };
  document.getElementById('zoom-reset').onclick = function () { set(0, endS); };
  var asked = /[#&]t=([0-9.]+),([0-9.]+)/.exec(location.hash);
  if (asked && +asked[2] > +asked[1]) set(+asked[1], +asked[2]); else render();
})();
"#;

fn page(report: &Report, svg: &str, events: &[Event], named: &BTreeSet<u64>) -> String {
    let title = match &report.failure {
        Some(failure) => format!("seed {}: {failure}", report.seed),
        None => format!("seed {} passed", report.seed),
    };
    let start = events.len().saturating_sub(EVENTS_LISTED_MAX);
    let listed: Vec<String> = events[start..]
        .iter()
        .map(|e| escape(&e.to_string()))
        .collect();
    let named: Vec<String> = named.iter().map(|n| format!("op#{n}")).collect();
    format!(
        r#"<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>arbor-sim timeline: {title}</title>
<style>body{{font-family:sans-serif;margin:16px}} pre{{font-size:11px;background:#f4f4f4;padding:8px;overflow-x:auto}} .legend span{{display:inline-block;margin-right:14px}} .sw{{display:inline-block;width:12px;height:12px;vertical-align:middle;margin-right:4px}}</style>
</head><body>
<h2>{heading}</h2>
<p>{swarm}</p>
<p>ops sent {sent}, acknowledged {acked}; faults {faults}; simulated {simulated:?}; trace {hash:016x}. Ops the failure names: {named}</p>
<p id="zoom"><button id="zoom-in">zoom in</button> <button id="zoom-out">zoom out</button> <button id="zoom-reset">whole run</button> <span id="zoom-range"></span> (wheel: zoom at the pointer; drag: pan)</p>
<div class="legend">
<span><i class="sw" style="background:#2a9d8f"></i>op acknowledged</span><span><i class="sw" style="background:#d62828"></i>op failed</span><span><i class="sw" style="background:#6c757d"></i>op never answered</span><span><i class="sw" style="background:#3a86ff"></i>drop acknowledged</span><span><i class="sw" style="border:2.5px solid #000"></i>named by the failure</span>
<span><i class="sw" style="background:#f4a261"></i>partition</span><span><i class="sw" style="background:#e9c46a"></i>one-way</span><span><i class="sw" style="background:#e63946"></i>crash / down</span><span><i class="sw" style="background:#f77f00"></i>restart</span><span><i class="sw" style="background:#9d4edd"></i>disk errors</span><span><i class="sw" style="background:#90be6d"></i>push blackout</span><span><i class="sw" style="background:#6d597a"></i>disk replaced</span><span><i class="sw" style="background:#06d6a0;transform:rotate(45deg)"></i>joins</span><span><i class="sw" style="background:#118ab2;transform:rotate(45deg)"></i>caught up</span><span><i class="sw" style="background:#ef476f;transform:rotate(45deg)"></i>leaves</span><span><i class="sw" style="background:#a8dadc"></i>packet loss</span><span><i class="sw" style="background:#bde0fe"></i>latency</span><span><i class="sw" style="background:#457b9d"></i>check's sync round</span><span><i class="sw" style="background:#1d3557"></i>push (tick, lane top)</span><span><i class="sw" style="background:#8338ec"></i>sync pull</span><span>dashed: check phase; red: the failure</span>
</div>
{svg}
<h3>Last events</h3>
<pre>{events}</pre>
<script>{script}</script>
</body></html>
"#,
        script = ZOOM_SCRIPT,
        heading = escape(&truncate(&title, 160)),
        title = escape(&title),
        swarm = escape(&report.swarm.describe(report.plan.ops_planned())).replace('\n', "<br>"),
        sent = report.ops_sent,
        acked = report.ops_acked,
        faults = report.faults_injected,
        simulated = report.simulated,
        hash = report.trace_hash,
        named = if named.is_empty() {
            "none".to_string()
        } else {
            named.join(", ")
        },
        events = listed.join("\n"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::plan::swarm::{Profile, Size, Swarm};
    use crate::scenario::plan::Plan;

    /// The page zooms: every element placed in time is in the plot group
    /// the script rescales, the script and its controls are there, and
    /// the lane labels stay outside the group (they do not move).
    #[test]
    fn the_page_carries_its_zoom() {
        let at = Duration::from_millis;
        let event = |t, node: &str, what: &str| Event {
            at: at(t),
            node: node.into(),
            what: what.into(),
        };
        let events = vec![
            event(1, "client-1", "op#1 Add x under 0 -> replica-1"),
            event(4, "client-1", "op#1 ok Added"),
            event(6, "replica-1", "crash replica-1"),
        ];
        let svg_start = |page: &str| page.find("<svg").unwrap();
        let swarm = Swarm::draw(1, Profile::Standard, Size::TEST, true);
        let report = Report {
            seed: 1,
            plan: Plan::draw(swarm.clone()),
            swarm,
            canary: None,
            network: crate::world::Network::Tcp,
            failure: None,
            trace_hash: 0,
            events,
            ops_sent: 1,
            ops_acked: 1,
            faults_injected: 1,
            simulated: at(6),
            coverage: Default::default(),
            wire: Vec::new(),
        };
        let page = html(&report);
        let plot = page.find(r#"<g id="plot""#).expect("plot group");
        let labels = page.find(">client-1</text>").expect("lane label");
        assert!(svg_start(&page) < labels && labels < plot);
        let op_bar = page.find("<title>op#1").expect("op bar");
        let group_end = page.rfind("</g></svg>").expect("group closed");
        assert!(plot < op_bar && op_bar < group_end);
        for needle in [
            r#"data-end-s=""#,
            "zoom-in",
            "zoom-reset",
            "addEventListener('wheel'",
        ] {
            assert!(page.contains(needle), "{needle}");
        }
    }

    #[test]
    fn durations_parse_in_debug_form() {
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("300ms"), Some(Duration::from_millis(300)));
        assert_eq!(parse_duration("20µs"), Some(Duration::from_micros(20)));
        assert_eq!(parse_duration("soon"), None);
    }

    #[test]
    fn move_tags_name_their_op() {
        let text = r#"KeyValue { key: "op", value: [49, 55] }, id: 5"#;
        assert_eq!(tagged_ops(text), vec![17]);
        assert_eq!(numbers_after(text, "id: "), vec![5]);
    }

    #[test]
    fn notes_name_their_replicas() {
        let named = replicas_named("partition [(1, 3), (3, 1)]");
        assert_eq!(named.len(), 2);
        assert!(named.contains("replica-3"));
        assert_eq!(replicas_named("crash replica-2").len(), 1);
    }

    #[test]
    fn ops_pair_send_and_answer() {
        let at = Duration::from_millis;
        let event = |t, what: &str| Event {
            at: at(t),
            node: "client-1".into(),
            what: what.into(),
        };
        let events = vec![
            event(1, "op#4 Add x under 0 -> replica-2"),
            event(5, "op#4 ok Added"),
            event(6, "op#5 Remove x 3 -> replica-1"),
            event(9, "op#5 failed: timeout"),
        ];
        let ops = ops(&events);
        assert_eq!(ops.len(), 2);
        assert_eq!(ops[0].answered, Some((at(5), true)));
        assert_eq!(ops[0].replica.as_deref(), Some("replica-2"));
        assert_eq!(ops[1].answered, Some((at(9), false)));
    }

    /// Regression: a drop's answer ("op#N drop: Ok(Done)") was not read
    /// as one, and a drop sent to several replicas became a new op at each
    /// further answer, so drops were drawn as still waiting at the run's
    /// end.
    #[test]
    fn drops_pair_with_their_answers() {
        let at = Duration::from_millis;
        let event = |t, what: &str| Event {
            at: at(t),
            node: "client-2".into(),
            what: what.into(),
        };
        let events = vec![
            event(1, "op#7 Drop { cid: 1, tree: None } -> replica-3"),
            event(4, "op#7 drop: Ok(Done)"),
            event(5, "op#8 Drop { cid: 1, tree: None } -> replica-1"),
            event(8, "op#8 drop: Err(Timeout)"),
            // One drop sent to three replicas, answered out of order.
            event(10, "op#9 Drop { cid: 1, tree: None } -> replica-1"),
            event(11, "op#9 Drop { cid: 1, tree: None } -> replica-2"),
            event(12, "op#9 drop: Ok(Done)"),
            event(13, "op#9 Drop { cid: 1, tree: None } -> replica-3"),
            event(14, "op#9 drop: Ok(Done)"),
            event(15, "op#9 drop: Ok(Done)"),
        ];
        let ops = ops(&events);
        assert_eq!(ops.len(), 3);
        assert_eq!(ops[0].answered, Some((at(4), true)));
        assert_eq!(ops[1].answered, Some((at(8), false)));
        assert_eq!(
            (ops[2].sent, ops[2].answered),
            (at(10), Some((at(15), true)))
        );
        let lanes = vec!["client-2".to_string()];
        let scale = Scale {
            end: at(10),
            lanes: &lanes,
        };
        let mut svg = String::new();
        draw_op(&mut svg, &scale, &ops[0], false);
        assert!(svg.contains(DROP_COLOR), "{svg}");
    }

    /// Disk replacements are windows on their replica's lane; membership
    /// steps are marks on the operator's lane and the replicas they name.
    #[test]
    fn lifecycle_steps_are_drawn() {
        let at = Duration::from_millis;
        let event = |t, node: &str, what: &str| Event {
            at: at(t),
            node: node.into(),
            what: what.into(),
        };
        let nemesis = vec![event(
            2,
            "nemesis",
            "destroy the disk of replica-2, replace it after 1.5s",
        )];
        let found = windows(&nemesis);
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].start, found[0].end), (at(2), at(1502)));
        assert_eq!(found[0].lanes, vec!["replica-2", "nemesis"]);
        let lanes = ["replica-1", "replica-3", "operator"].map(String::from);
        let scale = Scale {
            end: at(10),
            lanes: &lanes,
        };
        let mut svg = String::new();
        let join = event(3, "operator", "replica-3 joins 0101 (members [1, 2, 3])");
        draw_marks(&mut svg, &scale, &[join], 100.0);
        assert_eq!(svg.matches("<polygon").count(), 2, "{svg}");
        assert!(svg.contains("#06d6a0"));
    }
}
