//! From a failing seed to a small reproduction: the capsule a sweep keeps
//! replays with the sweep's trace fingerprint, an edited capsule still
//! replays (deterministically), and a canary's failure shrinks to a capsule
//! that still fails the same way. Canaries are switched process-wide, so
//! the tests of this binary that run one take turns.

use arbor::canary::Canary;
use arbor_sim::cli::run_sweep;
use arbor_sim::failure::FailureKind;
use arbor_sim::scenario::capsule::shrink::{shrink_to_capsule, Accept, Counts, ShrinkError};
use arbor_sim::scenario::capsule::{Capsule, KeptFor};
use arbor_sim::scenario::plan::swarm::{Profile, Size};
use arbor_sim::scenario::{Options, Report};
use arbor_sim::world::Network;
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
        network: Network::Tcp,
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
    swept_capsules_replay(CANARY, Network::Tcp);
}

/// The same over TLS: the capsule records its network and replays on it,
/// handshakes and connection faults included.
#[test]
fn a_capsule_swept_over_tls_replays_over_tls() {
    swept_capsules_replay(Canary::EvictedSlotKept, Network::Tls);
}

/// Sweeps seeds 1-4 of `canary`'s profile on `network`, keeping
/// failures; each kept capsule names the network and replays with the
/// sweep's fingerprint.
fn swept_capsules_replay(canary: Canary, network: Network) {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("seeds.jsonl");
    let keep = dir.path().join("capsules");
    let profile = Profile::for_canary(canary).name();
    let canary = format!("{canary:?}");
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
        "--network",
        network.name(),
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
        assert_eq!(capsule.network, network);
        let json = std::fs::read_to_string(&path).unwrap();
        let named = format!("\"network\": \"{}\"", network.name());
        assert!(json.contains(&named), "{json}");
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
    let (shrunk, capsule) = shrink_to_capsule(
        &report.plan,
        &options(),
        (true, "test"),
        2,
        300,
        Accept::SameKind,
    )
    .expect("the run fails, and so does its minimal capsule");
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
    assert_eq!(capsule.kept_for, Some(KeptFor::Failure(kind)));
    let again = Capsule::parse(&capsule.to_json()).unwrap().run(false);
    assert_eq!(again.failure.map(|f| f.kind), Some(kind));
    assert_eq!(again.trace_hash, shrunk.report.trace_hash);
}

/// The committed capsule of the canary these tests use.
fn committed_canary_capsule() -> Capsule {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("regressions")
        .join(format!("canary-{CANARY:?}.json"));
    Capsule::read(&path).unwrap()
}

/// A shrinker that keeps every trial run, whatever it gave, is planted:
/// it throws away the disk-error faults the canary's failure needs, and
/// the replay of the capsule it made no longer fails with the kind it
/// was shrunk for, so `shrink_to_capsule` refuses it instead of handing
/// back a capsule that proves nothing.
#[test]
fn a_shrunk_capsule_that_misses_the_kind_is_refused() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let capsule = committed_canary_capsule();
    let mut plan = capsule.plan.clone();
    plan.swarm.seed = capsule.seed;
    let kind = FailureKind::HungCallers;
    assert_eq!(capsule.kept_for, Some(KeptFor::Failure(kind)));
    let planted = shrink_to_capsule(
        &plan,
        &capsule.options(false),
        (capsule.faults, "test"),
        1,
        6,
        Accept::Anything,
    );
    match planted {
        Err(ShrinkError::NotReproduced {
            kind: shrunk_for,
            replayed,
        }) => {
            assert_eq!(shrunk_for, kind);
            assert_ne!(replayed, Some(kind));
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok((shrunk, _)) => panic!(
            "the planted shrinker's capsule was accepted: {:?}",
            Counts::of(&shrunk.after)
        ),
    }
}

/// The fingerprint hash of a run's events in words, as the fingerprint
/// was computed before it took run events only.
fn words_hash(events: &[arbor_sim::trace::Event]) -> u64 {
    let mut bytes = Vec::new();
    for event in events {
        bytes.extend_from_slice(&event.at.as_nanos().to_le_bytes());
        bytes.extend_from_slice(event.node.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(event.what.as_bytes());
    }
    arbor_sim::trace::fnv_hash(&bytes)
}

/// An edit that changes only the words of the trace (planted with
/// `trace::set_reworded`, as a reworded message or a renamed type in a
/// `Debug` rendering would) leaves the fingerprint of a capsule's run as
/// it was, though a hash of the words moves; a real change of the run (a
/// fault fewer) moves the fingerprint.
#[test]
fn the_fingerprint_moves_with_the_run_not_with_its_words() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let capsule = committed_canary_capsule();
    let plain = capsule.run(false);
    arbor_sim::trace::set_reworded(true);
    let reworded = capsule.run(false);
    arbor_sim::trace::set_reworded(false);
    assert_ne!(plain.events, reworded.events);
    assert_ne!(words_hash(&plain.events), words_hash(&reworded.events));
    assert_eq!(plain.trace_hash, reworded.trace_hash);
    assert_eq!(
        capsule.outcome.trace_fingerprint,
        format!("{:016x}", plain.trace_hash),
        "the committed capsule's fingerprint is this build's"
    );
    let mut fewer = capsule.clone();
    assert!(!fewer.plan.faults.is_empty());
    fewer.plan.faults.pop();
    assert_ne!(fewer.run(false).trace_hash, plain.trace_hash);
}
