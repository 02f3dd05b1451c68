//! Each planted bug (engine/src/canary.rs) must be caught within 20 seeds
//! of its scenario profile, and the seeds run must pass with it off.
//! Canaries are switched process-wide, so these tests take turns.

use arbor::canary::Canary;
use arbor_sim::cli::{run_seed_announced, run_sweep};
use arbor_sim::scenario::plan::swarm::{Profile, Size};
use arbor_sim::scenario::{canary_test_name, Options, Report};
use arbor_sim::world::Network;
use std::sync::Mutex;

/// At least one of seeds 1..=SEEDS_MAX must fail with the canary on.
const SEEDS_MAX: u64 = 20;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn options(canary: Option<Canary>, profile: Profile, network: Network) -> Options {
    Options {
        profile,
        size: Size::TEST,
        faults: true,
        canary,
        echo_trace: false,
        network,
    }
}

fn jobs() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4)
}

/// Runs seeds in chunks of `jobs()` until one fails; the failing report.
fn first_catch(on: &Options) -> Option<Report> {
    let mut start = 1;
    while start <= SEEDS_MAX {
        let count = (jobs() as u64).min(SEEDS_MAX - start + 1);
        let summary = run_sweep(start, count, jobs(), on, |_| {});
        if let Some(report) = summary.failures.into_iter().next() {
            return Some(report);
        }
        start += count;
    }
    None
}

/// Caught with every node on the plaintext TCP network.
fn caught(canary: Canary) {
    caught_over(canary, Network::Tcp);
}

/// As `caught`, with every node on `network`.
fn caught_over(canary: Canary, network: Network) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let profile = Profile::for_canary(canary);
    if let Some(seed) = std::env::var("MADSIM_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        let report = run_seed_announced(seed, &options(Some(canary), profile, network));
        println!("{report}");
        assert!(!report.passed(), "{canary:?} not caught by seed {seed}");
        return;
    }
    let Some(report) = first_catch(&options(Some(canary), profile, network)) else {
        panic!(
            "{canary:?} was not caught by seeds 1..={SEEDS_MAX} of profile {}",
            profile.name()
        );
    };
    let needed = report.seed;
    println!(
        "{canary:?} caught by seed {needed} (profile {}): {}",
        profile.name(),
        report.failure.as_ref().unwrap()
    );
    let off = run_sweep(1, needed, jobs(), &options(None, profile, network), |_| {});
    for report in &off.failures {
        println!("{report}");
    }
    assert!(
        off.failures.is_empty(),
        "seeds 1..={needed} must pass with {canary:?} off"
    );
}

#[test]
fn replication_drops_on_full_queue() {
    caught(Canary::ReplicationDropsOnFullQueue);
}

#[test]
fn shared_sync_cursor() {
    caught(Canary::SharedSyncCursor);
}

#[test]
fn stale_undo_on_redo() {
    caught(Canary::StaleUndoOnRedo);
}

#[test]
fn old_op_wrong_position() {
    caught(Canary::OldOpWrongPosition);
}

#[test]
fn failed_batch_hangs() {
    caught(Canary::FailedBatchHangs);
}

#[test]
fn sync_drops_tree_on_peer_error() {
    caught(Canary::SyncDropsTreeOnPeerError);
}

#[test]
fn path_by_arrival_order() {
    caught(Canary::PathByArrivalOrder);
}

#[test]
fn authorization_skipped() {
    caught(Canary::AuthorizationSkipped);
}

#[test]
fn pull_cursor_past_failed_page() {
    caught(Canary::PullCursorPastFailedPage);
}

#[test]
fn pull_cursor_persisted_early() {
    caught(Canary::PullCursorPersistedEarly);
}

#[test]
fn subtree_depth_off_by_one() {
    caught(Canary::SubtreeDepthOffByOne);
}

#[test]
fn results_to_wrong_callers() {
    caught(Canary::ResultsToWrongCallers);
}

#[test]
fn moves_no_op() {
    caught(Canary::MovesNoOp);
}

#[test]
fn definite_failure_applied() {
    caught(Canary::DefiniteFailureApplied);
}

#[test]
fn drop_keeps_pull_cursors() {
    caught(Canary::DropKeepsPullCursors);
}

#[test]
fn drop_forgets_marks() {
    caught(Canary::DropForgetsMarks);
}

#[test]
fn peer_identity_unchecked() {
    caught(Canary::PeerIdentityUnchecked);
}

/// The same rule over mutual TLS, where the answerer is named by its certificate
/// first and by its `Hello` after.
#[test]
fn peer_identity_unchecked_over_tls() {
    caught_over(Canary::PeerIdentityUnchecked, Network::Tls);
}

#[test]
fn rejoin_accepts_writes() {
    caught(Canary::RejoinAcceptsWrites);
}

#[test]
fn joiner_stops_after_first_page() {
    caught(Canary::JoinerStopsAfterFirstPage);
}

#[test]
fn drop_keeps_dir_cache() {
    caught(Canary::DropKeepsDirCache);
}

#[test]
fn ack_before_replicas() {
    caught(Canary::AckBeforeReplicas);
}

#[test]
fn wal_ack_before_sync() {
    caught(Canary::WalAckBeforeSync);
}

#[test]
fn checkpoint_without_position() {
    caught(Canary::CheckpointWithoutPosition);
}

#[test]
fn latest_picks_oldest() {
    caught(Canary::LatestPicksOldest);
}

#[test]
fn dir_cache_kept_on_move() {
    caught(Canary::DirCacheKeptOnMove);
}

#[test]
fn answer_budget_eighth() {
    caught(Canary::AnswerBudgetEighth);
}

#[test]
fn writer_may_drop() {
    caught(Canary::WriterMayDrop);
}

/// Every canary has its test in this file, named as `canary_test_name`
/// (the replay command a failing report prints) names it.
#[test]
fn every_canary_has_its_test_here() {
    let source = include_str!("canary.rs");
    for &canary in Canary::ALL {
        let test = format!(
            "#[test]\nfn {}() {{\n    caught(Canary::{canary:?});",
            canary_test_name(canary)
        );
        assert!(source.contains(&test), "no test {test:?}");
    }
}

#[test]
fn replica_of_any_container() {
    caught(Canary::ReplicaOfAnyContainer);
}

#[test]
fn remove_missing_done() {
    caught(Canary::RemoveMissingDone);
}

/// Over TCP: the connection faults' storms make the server evict idle
/// connections, and the slot check sees the slots kept.
#[test]
fn evicted_slot_kept() {
    caught(Canary::EvictedSlotKept);
}

/// Over TCP: a reset on answer breaks pooled connections after the
/// server carried out their request; the write sent again makes a second
/// node with the first one's mark.
#[test]
fn retries_any_call() {
    caught(Canary::RetriesAnyCall);
}

/// The gateways that speak gRPC list directories over pages of a few
/// nodes; the service's pages are right, and only the answer as the
/// gateway read it (`check::oracle::end_to_end`) lacks their first nodes.
#[test]
fn stream_skips_page_start() {
    caught(Canary::StreamSkipsPageStart);
}

/// Over TCP: a storm's sockets each hold half of a large frame, and go
/// when the storm ends; the frame budget they reserved stays taken, more
/// than the server's live connections can be reading.
#[test]
fn broken_frame_keeps_budget() {
    caught(Canary::BrokenFrameKeepsBudget);
}
