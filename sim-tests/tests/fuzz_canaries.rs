//! The fuzz checks must catch the engine's planted bugs: with a canary
//! switched on, a sweep of seeded inputs must make the check fail, proving
//! that the check can fail at all. Its own test binary, because a canary is
//! switched on process-wide.

use arbor::canary::{self, Canary};
use arbor_sim::disk::SplitMix64;
use arbor_sim::fuzzing;
use arbor_sim::fuzzing::sim::{self, Step};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

/// Canaries are process-wide: the tests of this binary take turns.
static CANARY_LOCK: Mutex<()> = Mutex::new(());

/// Seeded inputs tried per canary before giving up.
const MAX_INPUTS: u64 = 3000;
/// Seeded inputs that must pass with every canary off (the corpus replay
/// test sweeps more).
const CLEAN_INPUTS: u64 = 200;

/// The first seed whose random input makes `check` panic.
fn first_failing_seed(check: fn(&[u8]), inputs: u64) -> Option<u64> {
    (0..inputs).find(|&seed| {
        let mut rng = SplitMix64::new(seed);
        let len = 20 + (rng.next_u64() % 100) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        catch_unwind(AssertUnwindSafe(|| check(&data))).is_err()
    })
}

#[test]
fn apply_oplog_catches_the_planted_forest_bugs() {
    let _turn = CANARY_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // Silence the expected panics' messages; restore for the final asserts.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut found = Vec::new();
    for bug in [
        Canary::StaleUndoOnRedo,
        Canary::OldOpWrongPosition,
        Canary::PathByArrivalOrder,
    ] {
        canary::set(Some(bug));
        found.push((
            bug,
            first_failing_seed(fuzzing::apply_oplog::check, MAX_INPUTS),
        ));
    }
    canary::set(None);
    let clean = first_failing_seed(fuzzing::apply_oplog::check, CLEAN_INPUTS);
    std::panic::set_hook(hook);
    for (bug, seed) in found {
        assert!(
            seed.is_some(),
            "{bug:?} not detected in {MAX_INPUTS} inputs"
        );
        eprintln!("{bug:?} detected by seed {seed:?}");
    }
    assert_eq!(
        clean, None,
        "the check fails without any planted bug (seed {clean:?})"
    );
}

/// The `sim` target's checkers catch a replication queue that drops ops
/// when full: bursts of writes over three trees to one replica of a
/// push-only cluster (sync off, one-slot queue, one worker, batches of up
/// to 100 gathered for 5 ms) must fail the check with the canary on, and
/// pass with it off.
#[test]
fn sim_catches_a_replication_queue_that_drops_ops() {
    let _turn = CANARY_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // Setup bits (see `Setup::from_bits`): 3 replicas, max_batch_size 100,
    // max_batch_delay 5 ms, queue of 1, 1 worker, sync off.
    let input = sim::Input {
        seed: 7,
        setup: 0b1111,
        steps: (0..30u8)
            .map(|i| Step::Write {
                replica: 0,
                kind: 4 * (i % 3),
                a: i,
                b: 0,
            })
            .collect(),
    };
    canary::set(Some(Canary::ReplicationDropsOnFullQueue));
    let with_canary = sim::run(&input);
    canary::set(None);
    let clean = sim::run(&input);
    assert!(
        clean.failure.is_ok(),
        "fails without the canary: {:?}",
        clean.failure
    );
    assert!(
        clean.acked >= 30,
        "only {} writes acknowledged",
        clean.acked
    );
    let failure = with_canary
        .failure
        .expect_err("the dropped pushes went unnoticed");
    eprintln!("caught: {failure}");
}
