//! The simulator's half of the mutation campaign's test command
//! (`scripts/mutants.sh`, `.cargo/mutants.toml`): a short sweep of the
//! test-sized scenario under every profile. A mutant of the engine that
//! every profile's seeds pass (and the engine's unit tests too) is one the
//! checks cannot tell from the real code.
//!
//! Beyond passing, each profile's sweep must show the engine doing what
//! the profile exists to test (`reached`): a check that fails on a mutant
//! that only stops the engine noticing a fault, which leaves every run
//! passing when the fault happens not to hurt within two seeds.
//!
//! `ARBOR_MUTANTS_SEEDS` sets the seeds per profile (default 2, what
//! `cargo test` runs; the campaign sets more).

use arbor_sim::cli::run_sweep;
use arbor_sim::coverage::Coverage;
use arbor_sim::scenario::plan::swarm::Profile;
use arbor_sim::scenario::Options;

fn seeds_per_profile() -> u64 {
    std::env::var("ARBOR_MUTANTS_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2)
}

/// What the engine must be seen doing in a profile's sweep.
fn reached(profile: Profile) -> &'static [Coverage] {
    match profile {
        // A process answering as another replica ran, and a correct
        // replica refused to pull from it (docs/design.md §9).
        Profile::Misconfig => &[Coverage::MisconfigWindow, Coverage::MisconfigDetected],
        _ => &[],
    }
}

#[test]
fn every_profile_passes_a_short_sweep() {
    let seeds = seeds_per_profile();
    let mut failing = Vec::new();
    let mut unreached = Vec::new();
    for profile in Profile::ALL {
        let options = Options {
            profile,
            ..Options::test()
        };
        let summary = run_sweep(1, seeds, 1, &options, |_| {});
        assert_eq!(summary.runs, seeds);
        assert!(summary.ops_acked > 0, "{}: nothing acked", profile.name());
        for report in &summary.failures {
            println!("{report}");
            failing.push((profile.name(), report.seed));
        }
        println!("{}: {}", profile.name(), summary.coverage);
        for &what in reached(profile) {
            if summary.coverage.get(what) == 0 {
                unreached.push((profile.name(), what.name()));
            }
        }
    }
    assert!(failing.is_empty(), "failing (profile, seed): {failing:?}");
    assert!(
        unreached.is_empty(),
        "never reached (profile, situation): {unreached:?}"
    );
}
