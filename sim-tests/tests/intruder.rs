//! The intruder of every simulated run: refused on every call it gets an
//! answer to, and the run passes; with the authorization check planted
//! away, the run fails as an intrusion.

use arbor::canary::Canary;
use arbor_sim::failure::FailureKind;
use arbor_sim::scenario::{run_seed, Options};

fn count(report: &arbor_sim::scenario::Report, what: &str) -> usize {
    report
        .events
        .iter()
        .filter(|e| e.what.contains(what))
        .count()
}

#[test]
fn the_intruder_is_refused_and_leaves_no_trace() {
    let report = run_seed(3, &Options::test());
    assert!(report.passed(), "{report}");
    let sent = count(&report, "intrudes ");
    let refused = count(&report, "intruder refused");
    assert!(sent > 0, "the intruder never ran");
    assert!(
        refused > 0 && refused <= sent,
        "{refused} of {sent} refused"
    );
    assert_eq!(count(&report, "SERVED"), 0);

    let options = Options {
        canary: Some(Canary::AuthorizationSkipped),
        ..Options::test()
    };
    let report = run_seed(3, &options);
    arbor::canary::set(None);
    let failure = report
        .failure
        .expect("an intruder served everything fails the run");
    assert!(
        matches!(
            failure.kind,
            // Whichever checker sees the intruder's effect first: the
            // intruder checker, or the oracles when a served forgery
            // reaches a client's answer before the end of the run, or the
            // invariant check of a write whose tree a served Drop just
            // deleted (seed 3 once the swarm drew the log's knobs).
            FailureKind::Intrusion
                | FailureKind::TreeInvariant
                | FailureKind::LostWrite
                | FailureKind::SessionGuarantee
                | FailureKind::WrongAnswer
                | FailureKind::BrokenPromise
        ),
        "{failure}"
    );
}
