//! The `sim` fuzz target's check on hand-written scripts: each fault kind
//! runs, writes get acknowledged through it, the cluster still passes the
//! scenario's checkers, and one input always gives the same event trace.

use arbor_sim::fuzzing::sim::{run, Input, Step};

fn write(replica: u8, kind: u8, a: u8, b: u8) -> Step {
    Step::Write {
        replica,
        kind,
        a,
        b,
    }
}

/// Writes of every kind to every replica, with `fault` in the middle.
fn script(setup: u16, fault: &[Step]) -> Input {
    let mut steps = Vec::new();
    for i in 0..6u8 {
        steps.push(write(i, i, i, i + 1));
    }
    steps.extend_from_slice(fault);
    for i in 0..12u8 {
        steps.push(write(i, i + 1, 2 * i + 1, i + 3));
        if i % 3 == 0 {
            steps.push(Step::Pause(5));
        }
    }
    Input {
        seed: 42,
        setup,
        steps,
    }
}

fn passes(input: &Input) -> usize {
    let outcome = run(input);
    if let Err(failure) = outcome.failure {
        panic!("{input:?} failed: {failure}");
    }
    outcome.acked
}

#[test]
fn fault_free_script_passes_and_acks() {
    // 3 replicas, sync every 300 ms.
    let acked = passes(&script(0b1_0000_0001, &[]));
    assert!(acked >= 10, "only {acked} writes acknowledged");
}

#[test]
fn every_fault_kind_keeps_the_checks_green() {
    let faults = [
        vec![Step::Partition { a: 0, b: 1 }, Step::Pause(30)],
        vec![
            Step::Clog { from: 1, to: 2 },
            Step::Pause(30),
            Step::HealNetwork,
        ],
        vec![Step::PacketLoss(60), Step::Pause(30)],
        vec![Step::BlockPushes { from: 0, to: 1 }, Step::Pause(30)],
        vec![Step::Crash(1), Step::Pause(20), Step::Restart(1)],
        vec![Step::Crash(2)],
        vec![
            Step::DiskErrors {
                replica: 0,
                write: 40,
                sync: 40,
            },
            Step::Pause(20),
        ],
    ];
    // With sync (3 replicas, sync 300 ms) and push-only (2 replicas, torn
    // writes): push-only must still converge once healed.
    for setup in [0b1_0000_0001u16, 0b1000_0000_0000] {
        for fault in &faults {
            let acked = passes(&script(setup, fault));
            assert!(acked > 0, "nothing acknowledged under {fault:?}");
        }
    }
}

#[test]
fn one_input_one_trace() {
    let input = script(
        0b1_0000_0001,
        &[
            Step::Crash(0),
            Step::PacketLoss(30),
            Step::Pause(10),
            Step::Restart(0),
        ],
    );
    let first = run(&input);
    let second = run(&input);
    assert!(first.failure.is_ok());
    assert_eq!(
        first.trace_hash, second.trace_hash,
        "same input, other trace"
    );
    let other = run(&Input {
        seed: 43,
        ..input.clone()
    });
    assert_ne!(
        first.trace_hash, other.trace_hash,
        "the trace hash does not see the seed"
    );
}
