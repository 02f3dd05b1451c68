//! Every profile reaches what it claims (`scenario::check::claims`): seeds
//! 1..=SMALL_CLAIM_SEEDS of the test-size scenario of each profile pass
//! and reach every claim marked as reached at that size. The full-size
//! claims are checked by `arbor-sim sweep --seeds 40 --check-claims
//! --profile P` (docs/simulation.md, "Claims").

use arbor_sim::cli::run_sweep;
use arbor_sim::scenario::check::claims::SMALL_CLAIM_SEEDS;
use arbor_sim::scenario::plan::swarm::{Profile, Size};
use arbor_sim::scenario::Options;

fn jobs() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4)
}

fn reaches_its_claims(profile: Profile) {
    let options = Options {
        profile,
        ..Options::test()
    };
    assert_eq!(options.size, Size::TEST);
    let summary = run_sweep(1, SMALL_CLAIM_SEEDS, jobs(), &options, |_| {});
    for report in &summary.failures {
        println!("{report}");
    }
    assert!(summary.failures.is_empty(), "{} failed", profile.name());
    let unreached: Vec<&str> = profile
        .unreached_claims(Size::TEST, &summary.coverage)
        .into_iter()
        .map(|c| c.name())
        .collect();
    assert!(
        unreached.is_empty(),
        "profile {} never reached {unreached:?}: {}",
        profile.name(),
        summary.coverage
    );
}

#[test]
fn standard() {
    reaches_its_claims(Profile::Standard);
}

#[test]
fn push_only() {
    reaches_its_claims(Profile::PushOnly);
}

#[test]
fn sync_heavy() {
    reaches_its_claims(Profile::SyncHeavy);
}

#[test]
fn storage_errors() {
    reaches_its_claims(Profile::StorageErrors);
}

#[test]
fn sync_only() {
    reaches_its_claims(Profile::SyncOnly);
}

#[test]
fn replace() {
    reaches_its_claims(Profile::Replace);
}

#[test]
fn misconfig() {
    reaches_its_claims(Profile::Misconfig);
}

#[test]
fn members() {
    reaches_its_claims(Profile::Members);
}

#[test]
fn gateway() {
    reaches_its_claims(Profile::Gateway);
}

/// The list of tests above covers every profile.
#[test]
fn every_profile_has_a_test() {
    assert_eq!(Profile::ALL.len(), 9);
}
