//! `arbor-sim sweep` as CI drives it: partitions that split a seed range
//! between machines, JUnit and JSON-lines records, exit statuses, and seeds
//! named before they run.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};

mod common;

use common::{arbor_sim, printed as text};

/// Seeds 1..=SEEDS of the test-sized scenario.
const SEEDS: u64 = 6;

fn sweep(args: &[&str]) -> Output {
    arbor_sim(&[&["sweep"], args].concat())
}

fn records(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .expect("JSON lines written")
        .lines()
        .map(|line| serde_json::from_str(line).expect("each line is JSON"))
        .collect()
}

/// Seed -> trace fingerprint of a small sweep over `1..=SEEDS`, perhaps one
/// part of it.
fn fingerprints(dir: &Path, partition: Option<&str>) -> BTreeMap<u64, String> {
    let file = dir.join(format!(
        "{}.jsonl",
        partition.unwrap_or("all").replace(['/', ':'], "-")
    ));
    let seeds = SEEDS.to_string();
    let mut args = vec!["--seeds", &seeds, "--small", "--jobs", "2", "--jsonl"];
    let file_arg = file.to_str().unwrap();
    args.push(file_arg);
    if let Some(p) = partition {
        args.extend(["--partition", p]);
    }
    let output = sweep(&args);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{partition:?}: {}",
        text(&output)
    );
    if let Some(p) = partition {
        assert!(
            text(&output).contains(&format!("part {p}")),
            "{}",
            text(&output)
        );
    }
    records(&file)
        .iter()
        .map(|r| {
            assert_eq!(r["verdict"], "pass");
            let seed = r["seed"].as_u64().expect("seed");
            (seed, r["trace_fingerprint"].as_str().unwrap().to_string())
        })
        .collect()
}

/// The parts of either kind run disjoint seed sets whose union is the
/// unpartitioned sweep, seed by seed, each with the same fingerprint.
#[test]
fn partitions_split_the_sweep_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let all = fingerprints(dir.path(), None);
    assert_eq!(
        all.keys().copied().collect::<Vec<_>>(),
        (1..=SEEDS).collect::<Vec<_>>()
    );
    for parts in [["slice:1/2", "slice:2/2"], ["hash:1/2", "hash:2/2"]] {
        let mut union = BTreeMap::new();
        for part in parts {
            for (seed, fingerprint) in fingerprints(dir.path(), Some(part)) {
                assert!(
                    union.insert(seed, fingerprint).is_none(),
                    "seed {seed} twice in {parts:?}"
                );
            }
        }
        assert_eq!(union, all, "{parts:?}");
    }
}

/// A canary that hangs callers on storage errors fails its first seeds
/// within a second: exit 1, a failure record in JSON lines and JUnit.
#[test]
fn a_failing_seed_exits_1_with_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let (jsonl, junit) = (
        dir.path().join("seeds.jsonl"),
        dir.path().join("out/junit.xml"),
    );
    let output = sweep(&[
        "--seeds",
        "3",
        "--small",
        "--jobs",
        "2",
        "--profile",
        "storage-errors",
        "--canary",
        "FailedBatchHangs",
        "--jsonl",
        jsonl.to_str().unwrap(),
        "--junit",
        junit.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    let records = records(&jsonl);
    assert_eq!(records.len(), 3);
    let failed: Vec<&serde_json::Value> =
        records.iter().filter(|r| r["verdict"] == "fail").collect();
    assert!(!failed.is_empty(), "{records:?}");
    for r in &records {
        assert_eq!(r["profile"], "storage-errors");
        assert_eq!(r["canary"], "FailedBatchHangs");
        assert!(r["commit"].as_str().is_some_and(|c| !c.is_empty()));
        assert!(r["wall_s"].as_f64().unwrap() > 0.0 && r["simulated_s"].as_f64().unwrap() > 0.0);
        assert_eq!(r["trace_fingerprint"].as_str().unwrap().len(), 16);
    }
    for r in &failed {
        assert!(
            r["failure_kind"].as_str().is_some_and(|k| !k.is_empty()),
            "{r}"
        );
        let replay = r["replay"].as_str().unwrap();
        assert!(
            replay.contains(&format!("replay --seed {}", r["seed"])),
            "{replay}"
        );
        assert!(replay.contains("--canary FailedBatchHangs"), "{replay}");
    }
    let xml = std::fs::read_to_string(&junit).expect("JUnit written");
    let doc = roxmltree::Document::parse(&xml).expect("JUnit is well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "testsuites");
    let suite = root
        .children()
        .find(|n| n.has_tag_name("testsuite"))
        .expect("testsuite");
    for element in [root, suite] {
        assert_eq!(element.attribute("tests"), Some("3"));
        assert_eq!(
            element.attribute("failures"),
            Some(failed.len().to_string().as_str())
        );
        assert!(element.attribute("time").unwrap().parse::<f64>().is_ok());
    }
    let cases: Vec<_> = suite
        .children()
        .filter(|n| n.has_tag_name("testcase"))
        .collect();
    let names: Vec<&str> = cases.iter().map(|c| c.attribute("name").unwrap()).collect();
    assert_eq!(names, ["seed 1", "seed 2", "seed 3"]);
    for (case, record) in cases.iter().zip(&records_by_seed(&records)) {
        let failure = case.children().find(|n| n.has_tag_name("failure"));
        assert_eq!(failure.is_some(), record["verdict"] == "fail", "{record}");
        if let Some(failure) = failure {
            let message = failure.attribute("message").unwrap();
            assert!(
                message.contains(record["replay"].as_str().unwrap()),
                "{message}"
            );
            assert_eq!(failure.attribute("type"), record["failure_kind"].as_str());
            assert!(failure.text().is_some_and(|t| t.contains("FAILED")));
        }
    }
}

fn records_by_seed(records: &[serde_json::Value]) -> Vec<serde_json::Value> {
    let mut sorted = records.to_vec();
    sorted.sort_by_key(|r| r["seed"].as_u64());
    sorted
}

/// A failing replay exits 1 as a failing sweep does (seed 2 fails with
/// this canary; seed 1 happens not to).
#[test]
fn a_failing_replay_exits_1() {
    let output = arbor_sim(&[
        "replay",
        "--seed",
        "2",
        "--small",
        "--profile",
        "storage-errors",
        "--canary",
        "FailedBatchHangs",
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    // Redirected, as a reader saving it does: no colour codes, no madsim
    // start-up warning, and a header in a config's words.
    let out = text(&output);
    assert!(
        !out.contains('\u{1b}'),
        "ANSI codes in a piped replay: {out:?}"
    );
    assert!(!out.contains("HashMap"), "{out}");
    let header: Vec<&str> = out
        .lines()
        .skip_while(|line| !line.starts_with("seed 2 profile storage-errors ("))
        .take_while(|line| !line.starts_with("ops sent"))
        .collect();
    assert_eq!(header.len(), 4, "{out}");
    let header = header.join("\n");
    for debug in ["Some(", "None", "DiskFaults", "{"] {
        assert!(!header.contains(debug), "{debug} in {header}");
    }
}

/// Bad flags and unwritable outputs exit 2 before any seed runs.
#[test]
fn bad_usage_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let under_file = file.join("out.xml");
    let under_file = under_file.to_str().unwrap();
    let cases: [&[&str]; 8] = [
        &["--network", "carrier-pigeon"],
        &["--partition", "slice:0/2"],
        &["--partition", "slice:3/2"],
        &["--partition", "range:1/2"],
        &["--seeds", "many"],
        &["--junit", under_file],
        &["--jsonl", under_file],
        &["--seed-start", "18446744073709551615", "--seeds", "2"],
    ];
    for args in cases {
        let output = sweep(&[&["--small"], args].concat());
        let out = text(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {out}");
        assert!(!out.contains("starting"), "{args:?} ran a seed: {out}");
    }
    let replay = arbor_sim(&["replay", "--small"]);
    assert_eq!(replay.status.code(), Some(2), "{}", text(&replay));
    let capsule = "regressions/sync-only-seed-341-late-drop.json";
    let capsule = Path::new(env!("CARGO_MANIFEST_DIR")).join(capsule);
    let capsule = capsule.to_str().unwrap();
    // Recorded over plaintext TCP: a replay over TLS cannot record it.
    let record = [
        "replay",
        "--capsule",
        capsule,
        "--network",
        "tls",
        "--record",
    ];
    let replay = arbor_sim(&record);
    assert_eq!(replay.status.code(), Some(2), "{}", text(&replay));
    assert!(!text(&replay).contains("starting"), "{}", text(&replay));
}

/// The seed is on stderr while its run is still going: a sweep killed by
/// a timeout has named it.
#[test]
fn the_seed_is_named_before_its_run_ends() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_arbor-sim"))
        .args(["sweep", "--seeds", "1", "--seed-start", "4242"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    // The full-size seed runs for seconds; it has not finished yet.
    let still_running = child.try_wait().unwrap().is_none();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(line.starts_with("seed 4242: starting"), "{line:?}");
    assert!(still_running, "the seed finished before its name was read");
}
