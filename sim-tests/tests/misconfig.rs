//! A misconfiguration in the simulator: the node at replica 3's address is
//! configured as replica 2 (two nodes with one replica id). It is detected,
//! never a silent divergence: its pushes, stamped as replica 2 from replica
//! 3's address, are refused; the other replicas refuse its answers as
//! from another replica than they dialled and do not pull from it; the trust
//! checker counts it as a failure of its own kind; and no correct replica
//! holds an op the impostor wrote.
//!
//! The swarm draws the same fault (`scenario::nemesis::misconfig`): the tests below
//! check that it is drawn and that a sweep of the profile targeting it
//! passes; `tests/canary.rs` that turning the detection off is caught.

use arbor::proto::{Request, Response};
use arbor::{ContainerId, KeyValue, TreeKey, ATTR_FILE_NAME, ROOT};
use arbor_sim::cli::run_sweep;
use arbor_sim::coverage::Coverage;
use arbor_sim::failure::FailureKind;
use arbor_sim::scenario::check::ledger::Ledger;
use arbor_sim::scenario::check::{self, check_at};
use arbor_sim::scenario::plan::swarm::{Profile, Size, Swarm};
use arbor_sim::scenario::plan::{FaultKind, Plan};
use arbor_sim::scenario::Options;
use arbor_sim::trace::Trace;
use arbor_sim::world::{cluster_configs_with, Knobs, World};
use madsim::runtime::Runtime;
use std::time::Duration;

fn add(tree: &TreeKey, name: &str) -> Request {
    Request::Add {
        tree: tree.clone(),
        parent: ROOT,
        items: vec![KeyValue::new(ATTR_FILE_NAME, name.as_bytes().to_vec())],
    }
}

#[test]
fn two_replicas_with_one_id_are_detected() {
    let runtime = Runtime::with_seed_and_config(7, madsim::Config::default());
    runtime.block_on(async {
        let knobs = Knobs {
            sync_interval: Some(Duration::from_secs(2)),
            ..Knobs::default()
        };
        let mut configs = cluster_configs_with(3, &knobs, &[]);
        // The third node's file says replica 2; it knows replica 1 only.
        configs[2].node.replica_id = 2;
        configs[2].node.peers.retain(|p| p.replica_id == 1);
        configs[2].validate().expect("valid on its own");
        let mut world = World::build_simple(configs, Trace::new(false));
        let client = world.client();
        madsim::time::sleep(Duration::from_secs(2)).await;
        let tree = TreeKey::new(ContainerId([5; 32]), "t");
        // Replica id 2 reaches the impostor (the last node named 2).
        for (replica, name) in [(1, "real"), (2, "impostor")] {
            let answer = client
                .call(replica, add(&tree, name), Duration::from_secs(2))
                .await;
            assert!(matches!(answer, Ok(Response::Added { .. })), "{answer:?}");
        }
        madsim::time::sleep(Duration::from_secs(20)).await;

        let stats = |index: usize| world.nodes[index].service().unwrap().stats();
        for index in [0, 1] {
            let seen = stats(index);
            assert!(
                seen.peer_identity_mismatches + seen.peers_refused > 0,
                "node {index} did not notice the impostor: {seen:?}"
            );
            let forest = world.nodes[index].service().unwrap().forest().clone();
            let log = forest.dump(&tree).map(|d| d.log).unwrap_or_default();
            let impostors = log.iter().filter(|op| {
                op.meta
                    .items
                    .iter()
                    .any(|kv| kv.value.as_slice() == b"impostor")
            });
            assert_eq!(impostors.count(), 0, "node {index} took the impostor's op");
        }
        // Node 3 dials replica 1 saying `Hello` as replica 2 from replica
        // 3's address: refused before any push is taken.
        assert!(stats(0).hellos_refused > 0, "node 3 passed for replica 2");
        let failure = check_at(&world, &Ledger::default(), "test", &check::standard())
            .await
            .unwrap_err();
        assert_eq!(failure.kind, FailureKind::StampConflict, "{failure}");
    });
}

/// Seeds of the misconfig profile the sweep test runs.
const MISCONFIG_SEEDS: u64 = 12;

fn has_misconfig(plan: &Plan) -> bool {
    plan.faults
        .iter()
        .any(|f| matches!(f.kind, FaultKind::Misconfig { .. }))
}

fn seeds_drawing_misconfig(profile: Profile, seeds: u64) -> u64 {
    (1..=seeds)
        .filter(|&seed| has_misconfig(&Plan::draw(Swarm::draw(seed, profile, Size::TEST, true))))
        .count() as u64
}

/// The swarm draws the fault: rarely in the standard profile (never where
/// no sync runs), in most seeds of the profile that targets it, never
/// with faults off; a misconfigured replica never claims its own id.
#[test]
fn the_swarm_draws_the_misconfiguration() {
    let standard = seeds_drawing_misconfig(Profile::Standard, 1_000);
    assert!(
        (1..=200).contains(&standard),
        "standard seeds drawing it: {standard} of 1000"
    );
    let targeted = seeds_drawing_misconfig(Profile::Misconfig, 100);
    assert!(
        targeted >= 60,
        "misconfig seeds drawing it: {targeted} of 100"
    );
    for seed in 1..=300 {
        let swarm = Swarm::draw(seed, Profile::Standard, Size::TEST, true);
        let plan = Plan::draw(swarm.clone());
        for fault in &plan.faults {
            if let FaultKind::Misconfig { replica, claims } = fault.kind {
                assert_ne!(replica, claims, "seed {seed}");
                assert!(
                    swarm.knobs.sync_interval.is_some(),
                    "seed {seed} without sync"
                );
            }
        }
        let quiet = Swarm::draw(seed, Profile::Misconfig, Size::TEST, false);
        assert!(
            !has_misconfig(&Plan::draw(quiet)),
            "seed {seed} with faults off"
        );
    }
}

/// A sweep of the misconfig profile passes, and its windows ran, were
/// detected by the correct replicas and acknowledged misled writes.
#[test]
fn a_misconfig_sweep_passes() {
    let options = Options {
        profile: Profile::Misconfig,
        ..Options::test()
    };
    let summary = run_sweep(1, MISCONFIG_SEEDS, 2, &options, |_| {});
    for report in &summary.failures {
        println!("{report}");
    }
    let failing: Vec<u64> = summary.failures.iter().map(|r| r.seed).collect();
    assert!(failing.is_empty(), "failing seeds: {failing:?}");
    println!("coverage: {}", summary.coverage);
    for what in [
        Coverage::MisconfigWindow,
        Coverage::MisconfigDetected,
        Coverage::MisconfigAcked,
    ] {
        assert!(
            summary.coverage.get(what) > 0,
            "never reached: {}",
            what.name()
        );
    }
}
