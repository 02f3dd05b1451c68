//! What a sweep leaves for CI: one JSON line per seed as it finishes
//! (`--jsonl`; a killed sweep keeps every seed done so far) and a JUnit
//! XML file at the end (`--junit`; one test case per seed, a failure's
//! replay command in its message).

use super::SeedRun;
use crate::failure::Failure;
use crate::scenario::swarm::Size;
use crate::scenario::Options;
use serde::Serialize;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

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
            size: size_name(options.size).to_string(),
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

/// "small", "standard" or "custom".
pub fn size_name(size: Size) -> &'static str {
    if size == Size::TEST {
        "small"
    } else if size == Size::STANDARD {
        "standard"
    } else {
        "custom"
    }
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

/// Creates `path` and its directory.
pub fn create_file(path: &Path) -> std::io::Result<std::fs::File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::File::create(path)
}

/// What a JUnit file says about the sweep as a whole.
pub struct SuiteInfo<'a> {
    /// e.g. "arbor-sim sweep standard small".
    pub name: &'a str,
    pub wall_s: f64,
    /// Recorded as properties (commit, seeds, partition, ...).
    pub properties: &'a [(&'a str, String)],
}

/// The sweep as JUnit XML (testsuites / testsuite / testcase / failure),
/// test cases in seed order. `reports` holds the text of each failing
/// seed's report, by seed, for the failure element's body.
pub fn junit_xml(
    suite: &SuiteInfo<'_>,
    records: &[SeedRecord],
    reports: &std::collections::BTreeMap<u64, String>,
) -> String {
    let failures = records.iter().filter(|r| !r.passed()).count();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let counts = format!(
        "tests=\"{}\" failures=\"{failures}\" errors=\"0\" time=\"{:.3}\"",
        records.len(),
        suite.wall_s
    );
    let name = xml_escape(suite.name);
    let _ = writeln!(out, "<testsuites name=\"{name}\" {counts}>");
    let _ = writeln!(out, "  <testsuite name=\"{name}\" {counts} skipped=\"0\">");
    out.push_str("    <properties>\n");
    for (key, value) in suite.properties {
        let _ = writeln!(
            out,
            "      <property name=\"{}\" value=\"{}\"/>",
            xml_escape(key),
            xml_escape(value)
        );
    }
    out.push_str("    </properties>\n");
    for record in records {
        out.push_str(&test_case(record, reports.get(&record.seed)));
    }
    out.push_str("  </testsuite>\n</testsuites>\n");
    out
}

fn test_case(record: &SeedRecord, report: Option<&String>) -> String {
    let open = format!(
        "    <testcase classname=\"arbor-sim.sweep.{}\" name=\"seed {}\" time=\"{:.3}\"",
        xml_escape(&record.profile),
        record.seed,
        record.wall_s
    );
    let Some(kind) = &record.failure_kind else {
        return format!("{open}/>\n");
    };
    let message = format!(
        "{kind}: {}; replay: {}",
        record.failure.as_deref().unwrap_or(""),
        record.replay
    );
    format!(
        "{open}>\n      <failure type=\"{}\" message=\"{}\">{}</failure>\n    </testcase>\n",
        xml_escape(kind),
        xml_escape(&truncate(&message, FAILURE_MESSAGE_CHARS_MAX)),
        xml_escape(report.map_or(message.as_str(), String::as_str))
    )
}

fn truncate(text: &str, chars_max: usize) -> String {
    match text.char_indices().nth(chars_max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// Escapes text for XML content and attribute values; characters XML 1.0
/// cannot hold at all (most control characters) become U+FFFD, and line
/// breaks and tabs become references so attributes keep them.
pub fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            '\t' => out.push_str("&#9;"),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_keeps_xml_well_formed() {
        assert_eq!(
            xml_escape("a<b & \"c\" 'd'>\n\u{1}"),
            "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;&#10;\u{fffd}"
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
