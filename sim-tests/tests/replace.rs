//! Node replacement in simulation: the replace profile destroys disks
//! often; every replaced node rejoins empty and catches up from its peers,
//! and every check holds, with the writes only a dead disk held counted as
//! at risk rather than lost (and, in the seeds with `tree.ack_replicas: 2`,
//! no write answered lost to one dead disk).

use arbor_sim::cli::run_sweep;
use arbor_sim::coverage::Coverage;
use arbor_sim::scenario::plan::swarm::{Profile, Size};
use arbor_sim::scenario::Options;

/// Seeds 1..=SEEDS of the test-sized replace profile.
const SEEDS: u64 = 12;

fn jobs() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4)
}

#[test]
fn replaced_nodes_catch_up_and_lose_only_writes_at_risk() {
    let options = Options {
        profile: Profile::Replace,
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
    assert!(coverage.get(Coverage::DiskReplaced) >= SEEDS, "{coverage}");
    assert!(coverage.get(Coverage::RejoinRefused) > 0, "{coverage}");
    // About half the seeds answer writes only once two replicas hold them.
    assert!(coverage.get(Coverage::AckedByReplicas) > 0, "{coverage}");
}
