//! Pass/fail criteria on a run's aggregates, in the spirit of k6's
//! thresholds: `--threshold 'user: p(99)<25ms'`. A run whose thresholds
//! fail exits with [`EXIT_THRESHOLDS_FAILED`], so a CI job can gate on it.
//!
//! Grammar: `[scenario ':'] aggregate operator value`, where aggregate is
//! `p(N)`, `avg`, `med`, `min` or `max` of the latency of every completed
//! iteration (errors included, as k6's `http_req_duration`), `rate` (the
//! share of completed iterations that failed, k6's `http_req_failed`) or
//! `dropped` (iterations that found no free VU, k6's `dropped_iterations`);
//! operator is one of `<`, `<=`, `>`, `>=`, `==`, `!=`. Latency values take
//! a unit (`us`, `µs`, `ms`, `s`; a bare number is milliseconds, as in k6),
//! rates a fraction or a percentage (`0.01`, `1%`), `dropped` a count.
//! Without a scenario, a threshold holds for each scenario on its own.

use super::metrics::ScenarioSummary;
use super::report::fmt_ms;
use serde::{Serialize, Serializer};
use std::fmt;

/// k6's exit status when a threshold failed.
pub const EXIT_THRESHOLDS_FAILED: u8 = 99;

/// Longest threshold expression accepted (a typo, not a novel).
const THRESHOLD_CHARS_MAX: usize = 200;

/// Which scenarios a threshold judges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    Every,
    Scenario(String),
}

/// What a threshold measures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Aggregate {
    /// The latency percentile `p` (0 < p <= 100).
    Percentile(f64),
    Avg,
    Med,
    Min,
    Max,
    /// Failed iterations / completed iterations.
    ErrorRate,
    /// Dropped iterations.
    Dropped,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Less,
    LessEqual,
    Greater,
    GreaterEqual,
    Equal,
    NotEqual,
}

impl Op {
    /// Longest symbols first, so that `<=` is not read as `<`.
    const SYMBOLS: [(&'static str, Op); 6] = [
        ("<=", Op::LessEqual),
        (">=", Op::GreaterEqual),
        ("==", Op::Equal),
        ("!=", Op::NotEqual),
        ("<", Op::Less),
        (">", Op::Greater),
    ];

    fn holds(self, observed: f64, limit: f64) -> bool {
        match self {
            Op::Less => observed < limit,
            Op::LessEqual => observed <= limit,
            Op::Greater => observed > limit,
            Op::GreaterEqual => observed >= limit,
            Op::Equal => observed == limit,
            Op::NotEqual => observed != limit,
        }
    }
}

/// One parsed `--threshold`.
#[derive(Clone, Debug, PartialEq)]
pub struct Threshold {
    pub scope: Scope,
    pub aggregate: Aggregate,
    pub op: Op,
    /// Milliseconds for latencies, a fraction for `rate`, a count for
    /// `dropped`.
    pub limit: f64,
    /// The expression as given, without its scope, for the summary.
    pub expression: String,
}

impl Serialize for Threshold {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.scope {
            Scope::Every => write!(f, "{}", self.expression),
            Scope::Scenario(name) => write!(f, "{name}: {}", self.expression),
        }
    }
}

impl Threshold {
    /// Parses one threshold; the error names the part that is wrong.
    pub fn parse(text: &str) -> Result<Threshold, String> {
        if text.chars().count() > THRESHOLD_CHARS_MAX {
            return Err(format!(
                "threshold longer than {THRESHOLD_CHARS_MAX} characters"
            ));
        }
        let (scope, expression) = match text.split_once(':') {
            Some((name, rest)) => (Scope::Scenario(parse_scope(name)?), rest.trim()),
            None => (Scope::Every, text.trim()),
        };
        let (aggregate_text, op, value_text) = split_at_operator(expression)?;
        let aggregate = parse_aggregate(aggregate_text)?;
        let limit = parse_value(aggregate, value_text)?;
        Ok(Threshold {
            scope,
            aggregate,
            op,
            limit,
            expression: expression.to_string(),
        })
    }

    pub fn applies_to(&self, scenario: &str) -> bool {
        match &self.scope {
            Scope::Every => true,
            Scope::Scenario(name) => name == scenario,
        }
    }

    /// One verdict per scenario it applies to.
    pub fn evaluate(&self, scenarios: &[ScenarioSummary]) -> Vec<ThresholdResult> {
        scenarios
            .iter()
            .filter(|s| self.applies_to(&s.name))
            .map(|s| {
                let observed = observe(self.aggregate, s);
                ThresholdResult {
                    scenario: s.name.clone(),
                    threshold: self.expression.clone(),
                    observed,
                    observed_text: observed_text(self.aggregate, observed),
                    passed: observed.is_some_and(|v| self.op.holds(v, self.limit)),
                }
            })
            .collect()
    }
}

/// A scenario name: what the report calls the scenario.
fn parse_scope(name: &str) -> Result<String, String> {
    let name = name.trim();
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if name.is_empty() {
        return Err("empty scenario name before ':'".into());
    }
    if !name.chars().all(valid) {
        return Err(format!(
            "scenario name {name:?} may hold only letters, digits, '_' and '-'"
        ));
    }
    Ok(name.to_string())
}

/// Splits `p(99)<25ms` into `p(99)`, `<` and `25ms` at the first operator.
fn split_at_operator(expression: &str) -> Result<(&str, Op, &str), String> {
    let at = expression
        .find(['<', '>', '=', '!'])
        .ok_or_else(|| format!("no operator in {expression:?} (one of <, <=, >, >=, ==, !=)"))?;
    let (left, rest) = expression.split_at(at);
    let (symbol, op) = Op::SYMBOLS
        .into_iter()
        .find(|(symbol, _)| rest.starts_with(symbol))
        .ok_or_else(|| format!("unknown operator at {rest:?} (one of <, <=, >, >=, ==, !=)"))?;
    let value = rest[symbol.len()..].trim();
    if value.is_empty() {
        return Err(format!("no value after {symbol:?} in {expression:?}"));
    }
    Ok((left.trim(), op, value))
}

fn parse_aggregate(text: &str) -> Result<Aggregate, String> {
    let aggregate = match text {
        "avg" => Aggregate::Avg,
        "med" => Aggregate::Med,
        "min" => Aggregate::Min,
        "max" => Aggregate::Max,
        "rate" => Aggregate::ErrorRate,
        "dropped" => Aggregate::Dropped,
        "" => return Err("no aggregate before the operator".into()),
        _ => return parse_percentile(text),
    };
    Ok(aggregate)
}

fn parse_percentile(text: &str) -> Result<Aggregate, String> {
    let unknown =
        || format!("unknown aggregate {text:?} (one of p(N), avg, med, min, max, rate, dropped)");
    let inner = text
        .strip_prefix("p(")
        .and_then(|rest| rest.strip_suffix(')'))
        .ok_or_else(unknown)?;
    let p: f64 = inner
        .trim()
        .parse()
        .map_err(|_| format!("percentile {inner:?} in {text:?} is not a number"))?;
    if !(p > 0.0 && p <= 100.0) {
        return Err(format!("percentile {inner} in {text:?} is not in (0, 100]"));
    }
    Ok(Aggregate::Percentile(p))
}

fn parse_value(aggregate: Aggregate, text: &str) -> Result<f64, String> {
    match aggregate {
        Aggregate::ErrorRate => parse_rate(text),
        Aggregate::Dropped => parse_count(text),
        _ => parse_latency_ms(text),
    }
}

/// `25ms`, `1.5s`, `800us`, `800µs`, or a bare number of milliseconds.
fn parse_latency_ms(text: &str) -> Result<f64, String> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit.trim() {
        "" | "ms" => 1.0,
        "s" => 1000.0,
        "us" | "µs" => 0.001,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (one of us, µs, ms, s)"
            ))
        }
    };
    Ok(parse_number(number, text)? * scale)
}

/// `0.01` or `1%`.
fn parse_rate(text: &str) -> Result<f64, String> {
    let (number, scale) = match text.strip_suffix('%') {
        Some(number) => (number.trim(), 0.01),
        None => (text, 1.0),
    };
    let rate = parse_number(number, text)? * scale;
    if rate > 1.0 {
        return Err(format!(
            "rate {text:?} is above 1 (write a fraction, 0.01, or a percentage, 1%)"
        ));
    }
    Ok(rate)
}

fn parse_count(text: &str) -> Result<f64, String> {
    text.parse::<u64>()
        .map(|n| n as f64)
        .map_err(|_| format!("dropped count {text:?} is not a whole number"))
}

fn parse_number(number: &str, whole: &str) -> Result<f64, String> {
    match number.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("value {whole:?} is not a non-negative number")),
    }
}

/// The scenario's value of `aggregate`; `None` for a latency of a scenario
/// that completed nothing (a threshold cannot hold on no data).
fn observe(aggregate: Aggregate, s: &ScenarioSummary) -> Option<f64> {
    let latency = &s.latency;
    let measured = latency.count > 0;
    match aggregate {
        Aggregate::Percentile(p) => measured.then(|| latency.quantile_ms(p / 100.0)),
        Aggregate::Avg => measured.then_some(latency.avg_ms),
        Aggregate::Med => measured.then_some(latency.med_ms),
        Aggregate::Min => measured.then_some(latency.min_ms),
        Aggregate::Max => measured.then_some(latency.max_ms),
        Aggregate::ErrorRate => Some(s.error_rate),
        Aggregate::Dropped => Some(s.dropped as f64),
    }
}

/// The observed value as k6 prints it: `p(99)=3.21ms`, `rate=0.50%`.
fn observed_text(aggregate: Aggregate, observed: Option<f64>) -> String {
    let name = match aggregate {
        Aggregate::Percentile(p) => format!("p({p})"),
        Aggregate::Avg => "avg".into(),
        Aggregate::Med => "med".into(),
        Aggregate::Min => "min".into(),
        Aggregate::Max => "max".into(),
        Aggregate::ErrorRate => "rate".into(),
        Aggregate::Dropped => "dropped".into(),
    };
    let Some(value) = observed else {
        return format!("{name}=none (no completed iterations)");
    };
    let value = match aggregate {
        Aggregate::ErrorRate => format!("{:.2}%", value * 100.0),
        Aggregate::Dropped => format!("{value:.0}"),
        _ => fmt_ms(value),
    };
    format!("{name}={value}")
}

/// One threshold's verdict on one scenario.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ThresholdResult {
    pub scenario: String,
    /// The expression, e.g. `p(99)<25ms`.
    pub threshold: String,
    /// In the aggregate's unit (ms, fraction, count); `None` without data.
    pub observed: Option<f64>,
    pub observed_text: String,
    pub passed: bool,
}

/// Every threshold's verdicts, in the order given.
pub fn evaluate_all(
    thresholds: &[Threshold],
    scenarios: &[ScenarioSummary],
) -> Vec<ThresholdResult> {
    thresholds
        .iter()
        .flat_map(|t| t.evaluate(scenarios))
        .collect()
}

/// A scoped threshold must name a scenario the run has: a typo would
/// otherwise judge nothing and pass.
pub fn check_scopes(thresholds: &[Threshold], scenarios: &[&str]) -> Result<(), String> {
    for t in thresholds {
        if let Scope::Scenario(name) = &t.scope {
            if !scenarios.contains(&name.as_str()) {
                return Err(format!(
                    "--threshold '{t}': this run has no scenario {name:?} (it has {})",
                    scenarios.join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// k6's threshold block: verdicts grouped by scenario, ✓ or ✗, the
/// expression and the observed value.
pub fn results_text(results: &[ThresholdResult]) -> String {
    let mut names: Vec<&str> = Vec::new();
    for r in results {
        if !names.contains(&r.scenario.as_str()) {
            names.push(&r.scenario);
        }
    }
    let mut out = String::from("\n  █ THRESHOLDS\n");
    for name in names {
        out.push_str(&format!("\n    {name}\n"));
        for r in results.iter().filter(|r| r.scenario == name) {
            let mark = if r.passed { '✓' } else { '✗' };
            out.push_str(&format!(
                "    {mark} '{}' {}\n",
                r.threshold, r.observed_text
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::metrics::LatencySummary;

    fn parse(text: &str) -> Threshold {
        Threshold::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    fn parse_error(text: &str) -> String {
        match Threshold::parse(text) {
            Ok(t) => panic!("{text:?} parsed as {t:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn scope_aggregate_operator_and_value_are_read() {
        let t = parse("user: p(99)<25ms");
        assert_eq!(t.scope, Scope::Scenario("user".into()));
        assert_eq!(t.aggregate, Aggregate::Percentile(99.0));
        assert_eq!(t.op, Op::Less);
        assert_eq!(t.limit, 25.0);
        assert_eq!(t.expression, "p(99)<25ms");
        assert_eq!(t.to_string(), "user: p(99)<25ms");
        let t = parse(" p(99.9) >= 1.5s ");
        assert_eq!(t.scope, Scope::Every);
        assert_eq!(t.aggregate, Aggregate::Percentile(99.9));
        assert_eq!((t.op, t.limit), (Op::GreaterEqual, 1500.0));
    }

    #[test]
    fn every_aggregate_operator_and_unit_parses() {
        let cases = [
            ("avg<=10", Aggregate::Avg, Op::LessEqual, 10.0),
            ("med>800us", Aggregate::Med, Op::Greater, 0.8),
            ("min!=500µs", Aggregate::Min, Op::NotEqual, 0.5),
            ("max==2s", Aggregate::Max, Op::Equal, 2000.0),
            ("rate<0.01", Aggregate::ErrorRate, Op::Less, 0.01),
            ("rate<=5%", Aggregate::ErrorRate, Op::LessEqual, 0.05),
            ("dropped==0", Aggregate::Dropped, Op::Equal, 0.0),
        ];
        for (text, aggregate, op, limit) in cases {
            let t = parse(text);
            assert_eq!((t.aggregate, t.op), (aggregate, op), "{text}");
            assert!((t.limit - limit).abs() < 1e-12, "{text}: {}", t.limit);
        }
    }

    /// Each error names the part that is wrong.
    #[test]
    fn bad_parts_are_named() {
        let cases = [
            ("user: p(99)<25xs", "\"xs\""),
            ("user: p99<25ms", "\"p99\""),
            ("user: p(abc)<25ms", "\"abc\""),
            ("user: p(0)<25ms", "p(0)"),
            ("user: p(101)<25ms", "p(101)"),
            ("user: p(99) 25ms", "no operator"),
            ("user: p(99)=<25ms", "\"=<25ms\""),
            ("user: p(99)<", "no value"),
            ("user: <25ms", "no aggregate"),
            (": p(99)<25ms", "empty scenario name"),
            ("us er: p(99)<25ms", "\"us er\""),
            ("rate<2", "above 1"),
            ("rate<-1", "\"-1\""),
            ("dropped<0.5", "\"0.5\""),
            ("avg<fast", "\"fast\""),
        ];
        for (text, named) in cases {
            let e = parse_error(text);
            assert!(e.contains(named), "{text:?}: {e:?} should name {named}");
        }
        assert!(parse_error(&"p".repeat(300)).contains("longer than"));
    }

    fn scenario(name: &str) -> ScenarioSummary {
        ScenarioSummary {
            name: name.into(),
            ok: 98,
            errors: 2,
            error_rate: 0.02,
            dropped: 3,
            latency: LatencySummary {
                count: 100,
                avg_ms: 4.0,
                min_ms: 0.5,
                med_ms: 3.0,
                max_ms: 40.0,
                p90_ms: 9.0,
                p95_ms: 12.0,
                p99_ms: 30.0,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn verdict(text: &str) -> bool {
        let results = parse(text).evaluate(&[scenario("user")]);
        assert_eq!(results.len(), 1, "{text}");
        results[0].passed
    }

    /// For each aggregate, a limit on either side of the observed value.
    #[test]
    fn each_aggregate_passes_and_fails() {
        let cases = [
            ("p(99)<31ms", "p(99)<29ms"),
            ("p(90)<=9ms", "p(90)<9ms"),
            ("p(95)>11ms", "p(95)>12ms"),
            ("avg<5", "avg<4"),
            ("med==3ms", "med!=3ms"),
            ("min>=500us", "min>0.6ms"),
            ("max<=40ms", "max<40ms"),
            ("rate<0.03", "rate<0.01"),
            ("rate<=2%", "rate<2%"),
            ("dropped<=3", "dropped==0"),
        ];
        for (pass, fail) in cases {
            assert!(verdict(pass), "{pass} should pass");
            assert!(!verdict(fail), "{fail} should fail");
        }
    }

    #[test]
    fn unscoped_thresholds_judge_each_scenario() {
        let mut system = scenario("system");
        system.latency.p99_ms = 80.0;
        let scenarios = [system, scenario("user")];
        let results = parse("p(99)<50ms").evaluate(&scenarios);
        let verdicts: Vec<(&str, bool)> = results
            .iter()
            .map(|r| (r.scenario.as_str(), r.passed))
            .collect();
        assert_eq!(verdicts, [("system", false), ("user", true)]);
        assert_eq!(parse("user: p(99)<50ms").evaluate(&scenarios).len(), 1);
    }

    /// A latency threshold on a scenario that completed nothing fails: no
    /// data is no evidence. Rates and drops of nothing are zero.
    #[test]
    fn no_data_fails_latency_thresholds() {
        let empty = ScenarioSummary {
            name: "user".into(),
            ..Default::default()
        };
        let results = parse("p(99)<1s").evaluate(std::slice::from_ref(&empty));
        assert!(!results[0].passed);
        assert_eq!(results[0].observed, None);
        assert!(results[0].observed_text.contains("none"));
        assert!(parse("rate==0").evaluate(std::slice::from_ref(&empty))[0].passed);
    }

    #[test]
    fn scopes_must_name_a_scenario_of_the_run() {
        let thresholds = [parse("p(99)<1s"), parse("usr: avg<1s")];
        let e = check_scopes(&thresholds, &["system", "user"]).unwrap_err();
        assert!(e.contains("\"usr\"") && e.contains("system, user"), "{e}");
        assert!(check_scopes(&thresholds[..1], &["user"]).is_ok());
    }

    #[test]
    fn the_summary_block_marks_each_verdict() {
        let results = evaluate_all(
            &[parse("user: p(99)<25ms"), parse("rate<0.01")],
            &[scenario("user")],
        );
        let text = results_text(&results);
        assert!(text.contains("█ THRESHOLDS"), "{text}");
        assert!(text.contains("✗ 'p(99)<25ms' p(99)=30.00ms"), "{text}");
        assert!(text.contains("✗ 'rate<0.01' rate=2.00%"), "{text}");
        let passing = evaluate_all(&[parse("dropped<5")], &[scenario("user")]);
        assert!(results_text(&passing).contains("✓ 'dropped<5' dropped=3"));
    }
}
