//! The gateway profile (`scenario::workload::gateway_mix`): versions of one key, delete
//! markers, overwrites in place by Move, tags and multipart parts, with
//! every answer held to the model; in most seeds some clients speak gRPC
//! to the replicas' fronts. A short sweep passes and reaches each of those
//! situations, and a seed with gateways on gRPC replays to the same trace.

use arbor_sim::cli::run_sweep;
use arbor_sim::coverage::Coverage;
use arbor_sim::scenario::plan::swarm::{Profile, Size, Swarm};
use arbor_sim::scenario::Options;
use arbor_sim::trace::first_difference;

/// Seeds 1..=SEEDS of the test-sized gateway profile.
const SEEDS: u64 = 8;

fn jobs() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4)
}

/// The test-sized gateway profile with faults, over TCP.
fn options() -> Options {
    Options {
        profile: Profile::Gateway,
        size: Size::TEST,
        faults: true,
        canary: None,
        echo_trace: false,
        network: arbor_sim::world::Network::Tcp,
    }
}

#[test]
fn gateway_call_sequences_pass_and_reach_versions() {
    let options = options();
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
        Coverage::GetSubTreePage,
        Coverage::SubTreePageContinued,
        Coverage::GrpcAnswer,
    ] {
        // Each at least once per seed on average.
        assert!(coverage.get(what) >= SEEDS, "{}: {coverage}", what.name());
    }
}

/// A seed whose gateways speak gRPC (HTTP/2 on the simulated streams, the
/// signatures, the streamed pages) runs the same twice.
#[test]
fn a_seed_with_gateways_on_grpc_replays_exactly() {
    let options = options();
    let seed = (1..)
        .find(|&seed| {
            let swarm = Swarm::draw(seed, options.profile, options.size, options.faults);
            swarm.grpc.is_some()
        })
        .expect("a seed with gRPC gateways");
    let first = arbor_sim::scenario::run_seed(seed, &options);
    let second = arbor_sim::scenario::run_seed(seed, &options);
    assert!(first.passed(), "{first}");
    assert!(first.coverage.get(Coverage::GrpcAnswer) > 0, "{first}");
    if let Some((index, a, b)) = first_difference(&first.events, &second.events) {
        panic!("seed {seed}: the runs part at event {index}: {a:?} then {b:?}");
    }
    assert_eq!(first.trace_hash, second.trace_hash, "seed {seed}");
}
