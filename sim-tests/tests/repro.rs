//! From a failing seed to a small reproduction: the capsule a sweep keeps
//! replays with the sweep's trace fingerprint, an edited capsule still
//! replays (deterministically), and a canary's failure shrinks to a capsule
//! that still fails the same way. Canaries are switched process-wide, so
//! the tests of this binary that run one take turns.

use arbor::canary::Canary;
use arbor_sim::cli::run_sweep;
use arbor_sim::scenario::capsule::Capsule;
use arbor_sim::scenario::shrink::{shrink, Counts};
use arbor_sim::scenario::swarm::{Profile, Size};
use arbor_sim::scenario::{Options, Report};
use std::sync::Mutex;

mod common;

use common::{arbor_sim, printed};

/// The canary these tests use, caught by the first seeds of its profile.
const CANARY: Canary = Canary::FailedBatchHangs;
/// Seeds searched for a failing one.
const SEEDS_MAX: u64 = 20;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn options() -> Options {
    Options {
        profile: Profile::for_canary(CANARY),
        size: Size::TEST,
        faults: true,
        canary: Some(CANARY),
        echo_trace: false,
    }
}

/// The first failing seed's report.
fn first_failure() -> Report {
    let summary = run_sweep(1, SEEDS_MAX, 2, &options(), |_| {});
    summary
        .failures
        .into_iter()
        .next()
        .expect("the canary is caught within SEEDS_MAX seeds")
}

/// `sweep --keep-failures` writes a capsule per failing seed as it ran;
/// `replay --capsule` of it gives the fingerprint the sweep recorded.
#[test]
fn a_swept_capsule_replays_with_the_sweeps_fingerprint() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("seeds.jsonl");
    let keep = dir.path().join("capsules");
    let canary = format!("{CANARY:?}");
    let profile = Profile::for_canary(CANARY).name();
    let output = arbor_sim(&[
        "sweep",
        "--seeds",
        "4",
        "--small",
        "--jobs",
        "2",
        "--profile",
        profile,
        "--canary",
        &canary,
        "--jsonl",
        jsonl.to_str().unwrap(),
        "--keep-failures",
        keep.to_str().unwrap(),
        "--shrink-trials",
        "0",
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", printed(&output));
    let records: Vec<serde_json::Value> = std::fs::read_to_string(&jsonl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let failed: Vec<&serde_json::Value> =
        records.iter().filter(|r| r["verdict"] == "fail").collect();
    assert!(!failed.is_empty(), "no seed of 1-4 failed");
    for record in failed {
        let seed = record["seed"].as_u64().unwrap();
        let path = keep.join(format!("{profile}-{canary}-seed-{seed}.json"));
        let capsule = Capsule::read(&path).expect("the sweep kept the failure's capsule");
        let fingerprint = record["trace_fingerprint"].as_str().unwrap();
        assert_eq!(capsule.outcome.trace_fingerprint, fingerprint);
        let replay = arbor_sim(&["replay", "--quiet", "--capsule", path.to_str().unwrap()]);
        let text = printed(&replay);
        assert_eq!(replay.status.code(), Some(1), "{text}");
        assert!(
            text.contains(&format!("trace fingerprint {fingerprint} matches")),
            "{text}"
        );
    }
}

/// A capsule with a fault and a client deleted by hand (in its JSON)
/// still runs, twice the same, and differently from the original.
#[test]
fn an_edited_capsule_still_replays() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let report = first_failure();
    let capsule = Capsule::of(&report, true, "test");
    let mut json: serde_json::Value = serde_json::from_str(&capsule.to_json()).unwrap();
    let plan = &mut json["plan"];
    let faults = plan["faults"].as_array_mut().unwrap();
    assert!(!faults.is_empty(), "seed {} drew no fault", report.seed);
    faults.remove(0);
    plan["clients"].as_array_mut().unwrap().pop();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edited.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    let edited = Capsule::read(&path).expect("an edited capsule is still a capsule");
    assert_eq!(edited.plan.faults.len(), capsule.plan.faults.len() - 1);
    assert_eq!(edited.plan.clients.len(), capsule.plan.clients.len() - 1);
    let (first, second) = (edited.run(false), edited.run(false));
    assert_eq!(first.trace_hash, second.trace_hash);
    assert_eq!(first.events, second.events);
    assert_ne!(first.trace_hash, report.trace_hash);
    let dropped = format!("client-{}", capsule.plan.clients.last().unwrap().index);
    assert!(
        first.events.iter().all(|e| e.node != dropped),
        "the dropped client still ran"
    );
    // The unedited capsule gives the original run back.
    assert_eq!(capsule.run(false).trace_hash, report.trace_hash);
}

/// The canary's first failing seed shrinks to fewer faults and ops, and
/// the minimal capsule fails with the same kind and fingerprint.
#[test]
fn a_canary_failure_shrinks_to_a_capsule_that_still_fails() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let report = first_failure();
    let kind = report.failure.as_ref().unwrap().kind;
    let shrunk = shrink(&report.plan, &options(), 2, 300).expect("the run fails");
    let (before, after) = (Counts::of(&shrunk.before), Counts::of(&shrunk.after));
    println!(
        "seed {}: {before:?} -> {after:?} in {} trials",
        report.seed, shrunk.trials
    );
    assert_eq!(shrunk.kind, kind);
    assert!(after.faults <= before.faults);
    assert!(
        after.client_ops < before.client_ops,
        "{before:?} -> {after:?}"
    );
    let capsule = Capsule::of(&shrunk.report, true, "test");
    let again = Capsule::parse(&capsule.to_json()).unwrap().run(false);
    assert_eq!(again.failure.map(|f| f.kind), Some(kind));
    assert_eq!(again.trace_hash, shrunk.report.trace_hash);
}
