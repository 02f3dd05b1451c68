//! Bugs found by the simulator, each kept as the seed that failed before its
//! fix, and every capsule committed under `sim-tests/regressions/`.

mod common;

use arbor_sim::cli::run_seed_announced;
use arbor_sim::scenario::capsule::Capsule;
use arbor_sim::scenario::swarm::Profile;
use arbor_sim::scenario::Options;
use common::{arbor_sim, printed};
use std::path::PathBuf;

/// The full-size scenario of the `storage-errors` profile.
fn storage_errors() -> Options {
    Options {
        profile: Profile::StorageErrors,
        ..Options::standard()
    }
}

/// Sweep seed 6 of the standard scenario never finished: the periodic
/// invariant sweep ran `Forest::check_invariants` on a replica whose disk had
/// failed. redb's range iterator then yields an error for every `next()`,
/// and the check counted log rows with `Iterator::count`, which counted
/// errors forever (no simulated time passed, so the run spun). The check
/// now stops at the first error.
#[test]
fn standard_seed_6_invariant_sweep_on_failed_disk() {
    let report = run_seed_announced(6, &Options::standard());
    println!("{report}");
    assert!(report.passed(), "seed 6 failed");
    assert!(report.faults_injected > 0);
}

/// Sweep seed 1000 of the standard scenario diverged: replica 1's disk
/// failed a write near the end of an I/O-error window, after which redb
/// refused every write ("Previous I/O error occurred") until the database
/// was reopened. The window outlasted the workload, so the final healing
/// ended it without the supervisor's process restart, and replica 1 could
/// not store what the check's sync round pulled. The service now reopens
/// the database itself after a storage error (bounded retries, backoff).
#[test]
fn standard_seed_1000_database_poisoned_by_io_error() {
    let report = run_seed_announced(1000, &Options::standard());
    println!("{report}");
    assert!(report.passed(), "seed 1000 failed");
    assert!(report.faults_injected > 0);
}

/// Storage-errors seed 52 reported a hung caller that was not hung: the
/// supervisor's drain check stops a replica's inbound traffic for 1 s and
/// expects every admitted write answered by then, but a request sent just
/// before the cut, delayed by a latency spike (up to 1.5 s per message),
/// was admitted late in the window and was still in its batch. The check
/// now gives writes still pending after the window up to 2 s more (a
/// really hung caller stays pending; canary `FailedBatchHangs` is still
/// caught on seed 1).
#[test]
fn storage_errors_seed_52_late_request_in_the_drain_window() {
    let report = run_seed_announced(52, &storage_errors());
    println!("{report}");
    assert!(report.passed(), "seed 52 failed");
    assert!(report.faults_injected > 0);
}

/// A 3,000-seed sweep (`--seed-start 100000 --jobs 2`) was killed by the
/// OOM killer after 427 s at 24 GB: every seed kept its whole world alive,
/// about 12 MB. madsim drops no pending task when its runtime is dropped,
/// and a task still waiting on a timer at the end (a replica's service
/// loops; here also the nemesis's restart of a crashed replica, scheduled
/// after the final checks) holds the world, its forests and disks through
/// a reference cycle with the runtime. A run now aborts its detached tasks
/// and kills every replica before it ends, and `run_seed` reports a
/// simulated disk that outlives the runtime as a `leak` failure. Before
/// the fix every seed failed that check; seed 2023 also has a nemesis
/// task pending at the end, which killing the replicas alone missed.
#[test]
fn standard_seed_2023_nothing_outlives_the_run() {
    let report = run_seed_announced(2023, &Options::standard());
    println!("{report}");
    assert!(report.passed(), "seed 2023 failed");
}

/// Sweep seed 100738 of the standard scenario diverged: after replication
/// went idle, replica-2 lacked an acked op of replica-3 (sync off, so only
/// pushes spread it). Replica-3 had restarted after power failures; the
/// simulated transport numbered its calls from 1 again in the new
/// incarnation, and a late answer to the killed incarnation's push of
/// another tree (`Applied { fresh: 0 }`) reached the port the new push
/// waited on, with the same call id. The push cursor moved past an op
/// replica-2 never got. Call ids now come from one source per world
/// (`transport::CallIds`); `sim_transport.rs` has the transport-level test.
/// Seeds 101307 and 102355 failed the same way.
#[test]
fn standard_seed_100738_stale_answer_after_a_restart() {
    let report = run_seed_announced(100738, &Options::standard());
    println!("{report}");
    assert!(report.passed(), "seed 100738 failed");
}

/// Storage-errors seed 200385 reported a broken tree invariant that was a
/// storage error: the full check folded an error reading the log (redb's
/// "Previous I/O error occurred" on a database an injected write error had
/// poisoned, met only once the check needed a page that was not cached)
/// into its verdict string, and the periodic sweep, which skips storage
/// errors only when they come as errors, counted it as a broken tree. The
/// check now returns storage errors as errors.
#[test]
fn storage_errors_seed_200385_storage_error_is_not_a_broken_tree() {
    let report = run_seed_announced(200385, &storage_errors());
    println!("{report}");
    assert!(report.passed(), "seed 200385 failed");
}

/// Storage-errors seed 201270 panicked with "a process restart never
/// finished": healing began 11 ms after the supervisor started restarting a
/// replica whose disk-error window had just closed (a 1 s drain, then the
/// restart, then a check of its stored ops), and waited for it at most 1
/// s. The wait now covers the longest supervised restart (15 s).
#[test]
fn storage_errors_seed_201270_healing_waits_for_a_supervised_restart() {
    let report = run_seed_announced(201270, &storage_errors());
    println!("{report}");
    assert!(report.passed(), "seed 201270 failed");
}

/// The capsules under `sim-tests/regressions/`, in name order.
fn committed_capsules() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("regressions");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    paths
}

/// Every committed capsule replays through `arbor-sim replay --capsule`
/// (its own process: a capsule's canary is switched process-wide). A
/// capsule of a real bug must pass now that the bug is fixed; a capsule
/// with a canary on must still fail with the kind it recorded, which
/// proves the replay still reaches the planted bug.
#[test]
fn committed_capsules_replay() {
    let paths = committed_capsules();
    assert!(!paths.is_empty(), "no capsule under sim-tests/regressions");
    for path in paths {
        let capsule = Capsule::read(&path).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("capsule {}: replaying", path.display());
        let output = arbor_sim(&["replay", "--quiet", "--capsule", path.to_str().unwrap()]);
        let text = printed(&output);
        match (&capsule.canary, &capsule.outcome.failure_kind) {
            (Some(_), Some(kind)) => {
                assert_eq!(output.status.code(), Some(1), "{}: {text}", path.display());
                let failed = format!("FAILED: {kind}:");
                assert!(text.contains(&failed), "{}: {text}", path.display());
            }
            _ => assert_eq!(output.status.code(), Some(0), "{}: {text}", path.display()),
        }
    }
}
