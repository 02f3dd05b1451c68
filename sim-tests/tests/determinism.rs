//! Determinism self-check: the same seed twice gives the same run
//! (compared by fingerprint and, on mismatch, event by event), and
//! different seeds give different runs.

use arbor_sim::scenario::{run_seed, Options, Report};
use arbor_sim::trace::first_difference;
use arbor_sim::world::Network;

#[test]
fn same_seed_same_trace() {
    for seed in [3, 17, 101] {
        repeats(seed, &Options::test());
    }
}

/// Over the engine's own stack too, connection faults and TLS handshakes
/// included: every draw of theirs comes from the seed.
#[test]
fn same_seed_same_trace_over_tcp_and_tls() {
    for (seed, network) in [(8, Network::Tcp), (2, Network::Tls)] {
        let options = Options {
            network,
            ..Options::test()
        };
        let report = repeats(seed, &options);
        let wire = report
            .events
            .iter()
            .filter(|e| e.to_string().contains("wire "))
            .count();
        assert!(
            wire > 1,
            "seed {seed} over {network:?} struck no connection"
        );
    }
}

/// Runs `seed` twice; the first report once both agree event by event.
fn repeats(seed: u64, options: &Options) -> Report {
    let first = run_seed(seed, options);
    let second = run_seed(seed, options);
    if first.trace_hash != second.trace_hash {
        let Some((index, a, b)) = first_difference(&first.events, &second.events) else {
            panic!("seed {seed} is not deterministic: its fingerprints differ, its events do not");
        };
        panic!(
            "seed {seed} is not deterministic: first difference at event {index}:\n  run 1: {}\n  run 2: {}",
            a.map_or("<end>".into(), |e| e.to_string()),
            b.map_or("<end>".into(), |e| e.to_string())
        );
    }
    assert_eq!(first.events, second.events);
    assert_eq!(first.failure, second.failure);
    assert!(
        first.events.len() > 100,
        "seed {seed}: trace too short to prove anything"
    );
    first
}

#[test]
fn different_seeds_differ() {
    let options = Options::test();
    let a = run_seed(5, &options);
    let b = run_seed(6, &options);
    assert_ne!(a.trace_hash, b.trace_hash);
}
