//! The simulator's build of the engine (`arbor-engine-sim`) has the planted
//! bugs and the code probes compiled in, and the probes count: the other
//! side of engine/tests/build_features.rs, which proves the node's build has
//! neither.

use arbor::canary::{self, Canary};
use arbor::probe::{self, Probe};

#[test]
fn the_simulator_engine_has_canaries_and_probes() {
    assert!(canary::COMPILED);
    assert!(probe::ENABLED);
    // Canaries are process-wide: no other test of this binary sets one.
    canary::set(Some(Canary::MovesNoOp));
    assert!(canary::active(Canary::MovesNoOp));
    assert!(!canary::active(Canary::StaleUndoOnRedo));
    canary::set(None);
    assert!(Canary::ALL.iter().all(|&c| !canary::active(c)));
}

#[test]
fn hits_count_per_probe_and_take_starts_over() {
    probe::take();
    probe::hit(Probe::PullOpPageNext);
    probe::hit(Probe::PullOpPageNext);
    probe::hit(Probe::AnswerTooLarge);
    let counts = probe::take();
    assert_eq!(counts[Probe::PullOpPageNext as usize], 2);
    assert_eq!(counts[Probe::AnswerTooLarge as usize], 1);
    assert_eq!(counts.iter().sum::<u64>(), 3);
    assert_eq!(probe::take(), [0; Probe::ALL.len()]);
}
