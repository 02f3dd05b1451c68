//! Overload at a small scale, in simulated time: a node with a tiny write
//! queue and a slow disk gets three times what it can commit. Excess writes
//! must be refused quickly with `Overloaded` (not wait out the deadline),
//! every acknowledged write must be readable afterwards, and once the rate
//! drops the node must be clean again.

use arbor_sim::disk::DiskLatency;
use arbor_sim::load::driver::RunSpec;
use arbor_sim::load::real::reference_config;
use arbor_sim::load::scenario::{Scenario, Stage};
use arbor_sim::load::sim_mode::{self, SimOptions};
use std::time::Duration;

fn overload_options(seed: u64) -> SimOptions {
    let mut config = reference_config(1, "sim://load".into(), None);
    config.limits.max_pending_writes = 40;
    config.pilorama.max_batch_size = 20;
    SimOptions {
        seed,
        replicas: 1,
        config,
        // About 20 ms per commit of up to 20 writes: roughly 1000 writes/s.
        disk_latency: DiskLatency {
            per_write: Duration::ZERO,
            per_sync: Duration::from_millis(20),
            per_byte_nanos: 0,
        },
        net_latency: Duration::from_micros(100),
        verify: true,
    }
}

#[test]
fn excess_writes_fail_fast_and_acknowledged_ones_survive() {
    let seed = std::env::var("MADSIM_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let secs = Duration::from_secs;
    let user = Scenario::user(1, Duration::ZERO, 4).with_stages(vec![
        Stage {
            duration: secs(2),
            rate: 3000,
        },
        Stage {
            duration: secs(3),
            rate: 200,
        },
    ]);
    let spec = RunSpec {
        scenarios: vec![user],
        deadline: secs(5),
        window: secs(1),
        track_acks: true,
        progress: false,
    };
    let report = sim_mode::run(&spec, &overload_options(seed)).expect("sim run");
    let user = report.scenario("user").expect("user scenario");
    let overloaded = user.errors_by_kind.get("overloaded").copied().unwrap_or(0);
    assert!(
        overloaded > 1000,
        "seed {seed}: only {overloaded} refused: {:?}",
        user.errors_by_kind
    );
    assert_eq!(
        user.errors, overloaded,
        "seed {seed}: other errors {:?}",
        user.errors_by_kind
    );
    // Refusals come from the bounded queue, in simulated milliseconds, not
    // after the 5 s deadline.
    assert!(
        user.latency_failed.max_ms < 100.0,
        "seed {seed}: {:?}",
        user.latency_failed
    );
    assert!(user.ok > 0);
    let v = report.verification.as_ref().expect("verification ran");
    assert_eq!(v.acked, user.ok);
    assert_eq!(
        v.missing, 0,
        "seed {seed}: lost acknowledged writes {:?}",
        v.missing_sample
    );
    // After the overload stage the node keeps up again: the last windows of
    // the recovery stage are error-free.
    let tail: Vec<_> = user
        .windows
        .iter()
        .filter(|w| w.start_s >= 3.0 && w.start_s < 5.0)
        .collect();
    assert_eq!(tail.len(), 2);
    assert!(
        tail.iter().all(|w| w.errors == 0 && w.ok > 0),
        "seed {seed}: {tail:?}"
    );
    assert_eq!(report.stuck, 0);
}
