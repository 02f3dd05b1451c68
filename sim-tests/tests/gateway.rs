//! The gateway profile (`scenario::workload::gateway_mix`): versions of one key, delete
//! markers, overwrites in place by Move, tags and multipart parts, with
//! every answer held to the model. A short sweep passes and reaches each
//! of those situations.

use arbor_sim::cli::run_sweep;
use arbor_sim::coverage::Coverage;
use arbor_sim::scenario::plan::swarm::{Profile, Size};
use arbor_sim::scenario::Options;

/// Seeds 1..=SEEDS of the test-sized gateway profile.
const SEEDS: u64 = 8;

fn jobs() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4)
}

#[test]
fn gateway_call_sequences_pass_and_reach_versions() {
    let options = Options {
        profile: Profile::Gateway,
        size: Size::TEST,
        faults: true,
        canary: None,
        echo_trace: false,
        network: arbor_sim::world::Network::Tcp,
    };
    let summary = run_sweep(1, SEEDS, jobs(), &options, |_| {});
    for report in &summary.failures {
        println!("{report}");
    }
    println!("coverage: {}", summary.coverage);
    let failing: Vec<u64> = summary.failures.iter().map(|r| r.seed).collect();
    assert!(failing.is_empty(), "failing seeds: {failing:?}");
    let coverage = &summary.coverage;
    for what in [
        Coverage::LatestOfVersions,
        Coverage::GetNodeByPathAll,
        Coverage::DeleteMarker,
        Coverage::OverwriteByMove,
        Coverage::MultipartPart,
        Coverage::GetSubTree,
        Coverage::AddByPathResolved,
    ] {
        // Each at least once per seed on average.
        assert!(coverage.get(what) >= SEEDS, "{}: {coverage}", what.name());
    }
}
