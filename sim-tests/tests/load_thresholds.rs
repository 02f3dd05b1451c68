//! `arbor-sim load --threshold` end to end: a tiny real-mode run over TCP
//! whose threshold cannot hold exits with 99 and says so first; one whose
//! thresholds hold exits with 0; bad usage exits with 2 before any load.

mod common;

use common::{arbor_sim, printed as text};
use std::path::Path;
use std::process::Output;

/// A one-second run at 50/s on one node, reached over loopback TCP (the
/// default path), its reports in `dir`, with `extra` flags.
fn tiny_load(dir: &Path, extra: &[&str]) -> Output {
    let json = dir.join("report.json");
    let html = dir.join("report.html");
    let base = [
        "load",
        "--rate",
        "50",
        "--duration",
        "1s",
        "--no-progress",
        "--replicas",
        "1",
        "--json",
        json.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ];
    arbor_sim(&[&base[..], extra].concat())
}

fn json_report(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("report.json")).expect("JSON report written");
    serde_json::from_str(&text).expect("JSON report parses")
}

/// No request of a real TCP round trip completes within a microsecond (the
/// histogram's floor), so this threshold fails whatever the machine.
#[test]
fn a_failed_threshold_exits_99_and_is_reported_first() {
    let dir = tempfile::tempdir().unwrap();
    let output = tiny_load(
        dir.path(),
        &["--threshold", "user: p(99)<1us", "--threshold", "rate<=1"],
    );
    let out = text(&output);
    assert_eq!(output.status.code(), Some(99), "{out}");
    let verdicts = out.find("█ THRESHOLDS").expect("threshold block");
    let first_scenario = out.find("scenario user").expect("scenario block");
    assert!(verdicts < first_scenario, "{out}");
    assert!(out.contains("✗ 'p(99)<1us' p(99)="), "{out}");
    assert!(out.contains("✓ 'rate<=1' rate="), "{out}");
    let report = json_report(dir.path());
    assert_eq!(report["gateway"], "tcp");
    let results = report["thresholds"].as_array().expect("thresholds in JSON");
    // The unscoped one judged both scenarios: three verdicts.
    assert_eq!(results.len(), 3, "{results:?}");
    assert_eq!(results[0]["threshold"], "p(99)<1us");
    assert_eq!(results[0]["passed"], false);
    assert!(results[1..].iter().all(|r| r["passed"] == true));
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert!(html.contains("✗ fail") && html.contains("gateway tcp"));
}

/// Limits no completed request can break (the deadline is 5 s; rates are
/// at most 1): the run passes.
#[test]
fn thresholds_that_hold_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    let thresholds = ["user: p(99)<60s", "avg<60s", "system: rate<=100%"];
    let args: Vec<&str> = thresholds.iter().flat_map(|t| ["--threshold", t]).collect();
    let output = tiny_load(dir.path(), &args);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(0), "{out}");
    assert!(out.contains("✓ 'p(99)<60s'"), "{out}");
    assert!(!out.contains('✗'), "{out}");
    let report = json_report(dir.path());
    let results = report["thresholds"].as_array().unwrap();
    assert_eq!(results.len(), 4);
    assert!(results.iter().all(|r| r["passed"] == true), "{results:?}");
    let user = report["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "user")
        .unwrap();
    assert_eq!(user["target_rate"], 50.0);
}

/// Usage errors exit with 2, name the bad part, and run no load (no
/// report is written).
#[test]
fn bad_usage_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 4] = [
        (&["--threshold", "user: p(99)<25xs"], "\"xs\""),
        (&["--threshold", "usr: p(99)<25ms"], "\"usr\""),
        (&["--threshold", "user: q(99)<25ms"], "\"q(99)\""),
        (&["--transport", "in-process"], "beside a wire path"),
    ];
    for (args, named) in cases {
        let output = tiny_load(dir.path(), args);
        let out = text(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {out}");
        assert!(out.contains(named), "{args:?} should name {named}: {out}");
        assert!(!dir.path().join("report.json").exists(), "{args:?} ran");
    }
}
