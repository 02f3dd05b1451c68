//! What a sweep leaves for CI: one JSON line per seed as it finishes
//! (`--jsonl`; a killed sweep keeps every seed done so far) and a JUnit
//! XML file at the end (`--junit`; one test case per seed, a failure's
//! replay command in its message).

use super::SeedRun;
use crate::failure::Failure;
use crate::files::create_file;
use crate::scenario::Options;
use quick_junit::{NonSuccessKind, Property, Report, TestCase, TestCaseStatus, TestSuite};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

/// Longest failure message put in a JUnit attribute: CI systems show it in
/// one line; the whole report goes in the element's text.
const FAILURE_MESSAGE_CHARS_MAX: usize = 1000;

/// One seed's result as a `--jsonl` line.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SeedRecord {
    pub seed: u64,
    /// The source commit (`commit()`).
    pub commit: String,
    pub profile: String,
    /// "standard" or "small".
    pub size: String,
    pub faults: bool,
    pub canary: Option<String>,
    /// "pass" or "fail".
    pub verdict: String,
    pub failure_kind: Option<String>,
    pub failure: Option<String>,
    pub simulated_s: f64,
    pub wall_s: f64,
    /// The run's trace hash: equal on every build that simulated the same.
    pub trace_fingerprint: String,
    pub replay: String,
    pub test_replay: String,
}

impl SeedRecord {
    pub fn of(run: &SeedRun, options: &Options, commit: &str) -> SeedRecord {
        let report = &run.report;
        SeedRecord {
            seed: report.seed,
            commit: commit.to_string(),
            profile: options.profile.name().to_string(),
            size: options.size.name().to_string(),
            faults: options.faults,
            canary: report.canary.map(|c| format!("{c:?}")),
            verdict: if report.passed() { "pass" } else { "fail" }.to_string(),
            failure_kind: report.failure.as_ref().map(failure_kind),
            failure: report.failure.as_ref().map(|f| f.detail.clone()),
            simulated_s: report.simulated.as_secs_f64(),
            wall_s: run.wall.as_secs_f64(),
            trace_fingerprint: format!("{:016x}", report.trace_hash),
            replay: replay_command(run, options),
            test_replay: report.test_replay_command(),
        }
    }

    pub fn passed(&self) -> bool {
        self.failure_kind.is_none()
    }
}

/// The failure's kind as a short word ("divergence", "panic").
pub fn failure_kind(failure: &Failure) -> String {
    failure.kind.to_string()
}

/// The CLI command that reruns this seed with a readable trace.
pub fn replay_command(run: &SeedRun, options: &Options) -> String {
    let no_faults = if options.faults { "" } else { " --no-faults" };
    format!("{}{no_faults}", run.report.replay_commands())
}

/// The source commit the binary was built from (`build.rs`):
/// `ARBOR_COMMIT` when the builder set it, else `git rev-parse HEAD` at
/// build time (with `-dirty` when tracked files differed from it), else
/// "unknown".
pub fn commit() -> String {
    env!("ARBOR_BUILD_COMMIT").to_string()
}

/// `--jsonl`: appends a line per seed, flushed, as seeds finish.
pub struct JsonLines {
    file: std::io::BufWriter<std::fs::File>,
}

impl JsonLines {
    /// Creates (truncates) the file, so a broken path fails before the sweep.
    pub fn create(path: &Path) -> std::io::Result<JsonLines> {
        Ok(JsonLines {
            file: std::io::BufWriter::new(create_file(path)?),
        })
    }

    pub fn write(&mut self, record: &SeedRecord) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.file, record)?;
        self.file.write_all(b"\n")?;
        self.file.flush()
    }
}

/// What a JUnit file says about the sweep as a whole.
pub struct SuiteInfo<'a> {
    /// e.g. "arbor-sim sweep standard small".
    pub name: &'a str,
    pub wall_s: f64,
    /// Recorded as properties (commit, seeds, partition, ...).
    pub properties: &'a [(&'a str, String)],
}

/// The sweep as a JUnit report (testsuites / testsuite / testcase /
/// failure), test cases in seed order. `reports` holds the text of each
/// failing seed's report, by seed, for the failure element's body.
pub fn junit_report(
    suite: &SuiteInfo<'_>,
    records: &[SeedRecord],
    reports: &BTreeMap<u64, String>,
) -> Report {
    let mut test_suite = TestSuite::new(suite.name);
    test_suite.add_properties(
        suite
            .properties
            .iter()
            .map(|(key, value)| Property::new(*key, value)),
    );
    test_suite.add_test_cases(records.iter().map(|r| test_case(r, reports.get(&r.seed))));
    let mut report = Report::new(suite.name);
    if let Some(wall) = seconds(suite.wall_s) {
        test_suite.set_time(wall);
        report.set_time(wall);
    }
    report.add_test_suite(test_suite);
    report
}

fn test_case(record: &SeedRecord, report: Option<&String>) -> TestCase {
    let status = match &record.failure_kind {
        None => TestCaseStatus::success(),
        Some(kind) => {
            let message = format!(
                "{kind}: {}; replay: {}",
                record.failure.as_deref().unwrap_or(""),
                record.replay
            );
            let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
            status
                .set_type(kind)
                .set_message(truncate(&message, FAILURE_MESSAGE_CHARS_MAX))
                .set_description(report.map_or(message.as_str(), String::as_str));
            status
        }
    };
    let mut case = TestCase::new(format!("seed {}", record.seed), status);
    case.set_classname(format!("arbor-sim.sweep.{}", record.profile));
    if let Some(wall) = seconds(record.wall_s) {
        case.set_time(wall);
    }
    case
}

/// A measured duration in seconds; `None` for a value no `Duration` holds.
fn seconds(s: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(s).ok()
}

fn truncate(text: &str, chars_max: usize) -> String {
    match text.char_indices().nth(chars_max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seed: u64, failure: Option<(&str, &str)>) -> SeedRecord {
        SeedRecord {
            seed,
            commit: "c0ffee".to_string(),
            profile: "storage-errors".to_string(),
            size: "small".to_string(),
            faults: true,
            canary: None,
            verdict: if failure.is_some() { "fail" } else { "pass" }.to_string(),
            failure_kind: failure.map(|(kind, _)| kind.to_string()),
            failure: failure.map(|(_, detail)| detail.to_string()),
            simulated_s: 12.5,
            wall_s: 0.25,
            trace_fingerprint: "0123456789abcdef".to_string(),
            replay: format!("arbor-sim replay --seed {seed} --small"),
            test_replay: String::new(),
        }
    }

    /// Text that XML must escape or cannot hold stays well-formed, and
    /// every promise of the file holds: a case per seed in the given
    /// order, the profile in the class name, the failure's kind, replay
    /// command and report, the suite's properties and counts.
    #[test]
    fn the_junit_report_names_each_seed_and_its_failure() {
        let detail = "a<b & \"c\" 'd'>\n\u{1}\u{1b}[31mred";
        let records = [
            record(4, None),
            record(7, Some(("divergence", detail))),
            record(9, None),
        ];
        let reports = BTreeMap::from([(7, "seed 7 FAILED: <tree> & more\nline two".to_string())]);
        let properties = [
            ("commit", "c0ffee".to_string()),
            ("seeds", "a & b".to_string()),
        ];
        let suite = SuiteInfo {
            name: "arbor-sim sweep storage-errors small",
            wall_s: 1.5,
            properties: &properties,
        };
        let xml = junit_report(&suite, &records, &reports)
            .to_string()
            .unwrap();
        let doc = roxmltree::Document::parse(&xml).expect("well-formed XML");
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "testsuites");
        let suite = root
            .children()
            .find(|n| n.has_tag_name("testsuite"))
            .unwrap();
        for element in [root, suite] {
            assert_eq!(
                element.attribute("name"),
                Some("arbor-sim sweep storage-errors small")
            );
            assert_eq!(element.attribute("tests"), Some("3"));
            assert_eq!(element.attribute("failures"), Some("1"));
            assert_eq!(element.attribute("time"), Some("1.500"));
        }
        let properties: Vec<(&str, &str)> = suite
            .descendants()
            .filter(|n| n.has_tag_name("property"))
            .map(|p| (p.attribute("name").unwrap(), p.attribute("value").unwrap()))
            .collect();
        assert_eq!(properties, [("commit", "c0ffee"), ("seeds", "a & b")]);
        let cases: Vec<_> = suite
            .children()
            .filter(|n| n.has_tag_name("testcase"))
            .collect();
        let names: Vec<&str> = cases.iter().map(|c| c.attribute("name").unwrap()).collect();
        assert_eq!(names, ["seed 4", "seed 7", "seed 9"]);
        for case in &cases {
            assert_eq!(
                case.attribute("classname"),
                Some("arbor-sim.sweep.storage-errors")
            );
            assert_eq!(case.attribute("time"), Some("0.250"));
        }
        let failures: Vec<_> = suite
            .descendants()
            .filter(|n| n.has_tag_name("failure"))
            .collect();
        assert_eq!(failures.len(), 1);
        let failure = failures[0];
        assert_eq!(failure.parent().unwrap().attribute("name"), Some("seed 7"));
        assert_eq!(failure.attribute("type"), Some("divergence"));
        let message = failure.attribute("message").unwrap();
        assert!(
            message.starts_with("divergence: a<b & \"c\" 'd'>"),
            "{message}"
        );
        assert!(
            !message.contains('\u{1}') && !message.contains('\u{1b}'),
            "{message:?}"
        );
        assert!(
            message.ends_with("; replay: arbor-sim replay --seed 7 --small"),
            "{message}"
        );
        assert_eq!(
            failure.text(),
            Some("seed 7 FAILED: <tree> & more\nline two")
        );
    }

    /// Without a report text the failure's body repeats its message; a
    /// message too long for one line is cut, the body keeps it whole.
    #[test]
    fn a_long_failure_is_cut_in_its_message_only() {
        let detail = "x".repeat(FAILURE_MESSAGE_CHARS_MAX * 2);
        let suite = SuiteInfo {
            name: "s",
            wall_s: 0.0,
            properties: &[],
        };
        let records = [record(1, Some(("panic", &detail)))];
        let xml = junit_report(&suite, &records, &BTreeMap::new())
            .to_string()
            .unwrap();
        let doc = roxmltree::Document::parse(&xml).unwrap();
        let failure = doc
            .descendants()
            .find(|n| n.has_tag_name("failure"))
            .unwrap();
        let message = failure.attribute("message").unwrap();
        assert_eq!(message.chars().count(), FAILURE_MESSAGE_CHARS_MAX + 1);
        assert!(message.ends_with('…'));
        let body = failure.text().unwrap();
        assert!(
            body.contains(&detail) && body.ends_with("replay: arbor-sim replay --seed 1 --small")
        );
    }

    #[test]
    fn long_messages_are_cut_on_a_character() {
        assert_eq!(truncate("ééé", 2), "éé…");
        assert_eq!(truncate("abc", 3), "abc");
    }

    #[test]
    fn the_commit_is_named_or_unknown() {
        let commit = commit();
        let hex = commit.trim_end_matches("-dirty");
        assert!(
            commit == "unknown" || (hex.len() == 40 && hex.chars().all(|c| c.is_ascii_hexdigit())),
            "{commit}"
        );
    }
}
