//! Bugs found by the simulator, each kept as the seed that failed before its
//! fix, and every capsule committed under `sim-tests/regressions/`.

mod common;

use arbor_sim::cli::run_seed_announced;
use arbor_sim::scenario::capsule::Capsule;
use arbor_sim::scenario::plan::swarm::Profile;
use arbor_sim::scenario::{Options, Report};
use arbor_sim::world::Network;
use common::{arbor_sim, printed};
use std::path::{Path, PathBuf};

/// Runs `seed` under `options`, prints its report and asserts that it
/// passed; gives the report for further checks.
fn replay_passes(seed: u64, options: &Options) -> Report {
    let report = run_seed_announced(seed, options);
    println!("{report}");
    assert!(report.passed(), "seed {seed} failed");
    report
}

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
    let report = replay_passes(6, &Options::standard());
    assert!(report.faults_injected > 0);
}

/// Seed 97 of the standard scenario never finished once storms could
/// leave their answers unread: the storm writes `Hello`s to its sockets
/// until its window ends, and a socket another fault had silenced takes
/// every write at once, so the loop spun without simulated time passing.
/// The storm now pauses between bursts.
#[test]
fn standard_seed_97_unread_storm_on_a_silenced_socket() {
    let report = replay_passes(97, &Options::standard());
    let unread = report
        .coverage
        .get(arbor_sim::coverage::Coverage::AnswerTimedOut);
    assert!(unread > 0, "no answer was left unread");
}

/// Test-size seed 357 diverged: after a sync round with pushes blocked,
/// replicas 2 and 3 lacked five ops of replica 1, every call to which was
/// reset. A fault had silenced replica 1's stream ends (half-open), and
/// those ends lived on until their idle timeout; the peers' new
/// connections reused the ports of their closed ones, so the simulated
/// network handed each the flow-control window of the silenced connection
/// between the same two addresses, whose reader was gone: every write
/// failed as reset. A window now belongs to one connection.
#[test]
fn test_seed_357_a_new_connection_gets_its_own_window() {
    replay_passes(357, &Options::test());
}

/// Test-size seed 111 failed the check that a storm whose sockets never
/// read leaves the replica none of its connections past the frame
/// timeout: another fault had silenced the replica's ends of them, whose
/// writes then all pass at once, so no answer stalled and the
/// connections waited for the idle timeout instead. The check now leaves
/// silenced connections out.
#[test]
fn test_seed_111_a_silenced_storm_connection_never_stalls() {
    replay_passes(111, &Options::test());
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
    let report = replay_passes(1000, &Options::standard());
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
    let report = replay_passes(52, &storage_errors());
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
    replay_passes(2023, &Options::standard());
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
    replay_passes(100738, &Options::standard());
}

/// Seed 194 of the standard scenario, once the swarm drew
/// `limits.counter_jump_max` small (here 1 or 2), diverged: after the
/// final sync round replica-2 lacked five ops of a system tree. The tree
/// had been dropped and written again; its new incarnation's counters
/// start above what the dropped one reached on the replica that wrote
/// it, the ops below went with the drop, and replica-2 refused every
/// op of the new log, pushed or pulled, as `CounterTooFar`, waiting for
/// ops between that no replica held any more. Seeds 201, 217, 235, 257
/// and 274 failed the same way. Ops a replica pulls from a peer's log
/// (`WriteOp::Pulled`) are now taken at any counter; pushes and `Apply`
/// calls keep the bound.
#[test]
fn standard_seed_194_a_log_above_a_drop_is_pulled() {
    let report = replay_passes(194, &Options::standard());
    let jump = report.swarm.knobs.counter_jump_max;
    assert!(
        jump.is_some_and(|j| j <= 16),
        "the seed draws a tight jump: {jump:?}"
    );
    let refused = report
        .coverage
        .get(arbor_sim::coverage::Coverage::CounterTooFar);
    assert!(refused > 0, "honest pushes met the bound");
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
    replay_passes(200385, &storage_errors());
}

/// Storage-errors seed 201270 panicked with "a process restart never
/// finished": healing began 11 ms after the supervisor started restarting a
/// replica whose disk-error window had just closed (a 1 s drain, then the
/// restart, then a check of its stored ops), and waited for it at most 1
/// s. The wait now covers the longest supervised restart (15 s).
#[test]
fn storage_errors_seed_201270_healing_waits_for_a_supervised_restart() {
    replay_passes(201270, &storage_errors());
}

/// Seed 232 of the standard scenario over TCP failed as `connections`:
/// "during a storm, replica-1 served no client within 9.628s (last error:
/// connection reset)". The storm's probe gave each call all the time left
/// of its bound; a call on a connection that another fault struck under
/// it waited out most of the bound, and the next had no time left. Each
/// call of the probe now gets one attempt's time, and the bound holds two
/// attempts.
#[test]
fn standard_seed_232_over_tcp_the_storm_probe_tries_again() {
    let options = Options {
        network: Network::Tcp,
        ..Options::standard()
    };
    replay_passes(232, &options);
}

/// Seed 126 of the sync-heavy scenario over TCP failed as `wrong
/// outcome`: an `Apply` as replica-4 on replica-3 was answered `Applied {
/// fresh: 0 }`, fewer fresh ops than it sent, which the outcome check
/// took for a write not accepted. The
/// connection had broken after the replica stored the ops; the transport
/// sent the idempotent call again, and the second attempt found them
/// stored. An `Applied` answer now stands for a stored write whatever
/// its fresh count (the count is still at most the ops sent).
#[test]
fn sync_heavy_seed_126_over_tcp_an_apply_sent_again_is_stored() {
    let options = Options {
        profile: Profile::SyncHeavy,
        network: Network::Tcp,
        ..Options::standard()
    };
    replay_passes(126, &options);
}

/// Seed 158 of the test-sized gateway profile failed with "the killed
/// incarnation still holds its forest" while the gRPC gateways' answer
/// check was being written: the check kept the replica's service from a
/// read's start to its answer, and a drained restart of that replica
/// came between, so the stopped process could not drop its database. The
/// check now holds the incarnation weakly.
#[test]
fn gateway_seed_158_small_a_grpc_read_holds_no_stopping_replica() {
    let options = Options {
        profile: Profile::Gateway,
        size: arbor_sim::scenario::plan::swarm::Size::TEST,
        network: Network::Tcp,
        ..Options::standard()
    };
    replay_passes(158, &options);
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

/// Every committed capsule replays through `arbor-sim replay --check`
/// (its own process: a capsule's canary is switched process-wide) to what
/// it was kept for (`kept_for`): a canary's capsule to the failure kind it
/// recorded, a fixed bug's capsule to a clean run that reaches the
/// coverage events of the situation in which it used to fail. A capsule
/// that no longer does fails the test with the command that records it
/// anew ("re-record").
#[test]
fn committed_capsules_reach_what_they_were_kept_for() {
    let paths = committed_capsules();
    assert!(!paths.is_empty(), "no capsule under sim-tests/regressions");
    let mut missed = Vec::new();
    for path in paths {
        let capsule = Capsule::read(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            capsule.kept_for.is_some(),
            "{}: no kept_for; add it (regressions/README.md) or re-record: {}",
            path.display(),
            capsule.rerecord_command(&path)
        );
        eprintln!("capsule {}: replaying", path.display());
        let (code, text) = check(&path);
        if code != Some(0) {
            missed.push(format!("exit {code:?}: {}", check_line(&text)));
        }
    }
    assert!(missed.is_empty(), "{}", missed.join("\n"));
}

/// `arbor-sim replay --quiet --check` of a capsule: its exit status and
/// what it printed.
fn check(path: &Path) -> (Option<i32>, String) {
    replay_with(path, "--check")
}

/// `arbor-sim replay --quiet FLAG --capsule PATH`: exit status, output.
fn replay_with(path: &Path, flag: &str) -> (Option<i32>, String) {
    let output = arbor_sim(&[
        "replay",
        "--quiet",
        flag,
        "--capsule",
        path.to_str().unwrap(),
    ]);
    (output.status.code(), printed(&output))
}

/// The line of a check's output that gives its verdict (all of it when
/// none does).
fn check_line(text: &str) -> &str {
    text.lines()
        .find(|l| l.contains("kept for"))
        .unwrap_or(text)
}

/// A copy of committed capsule `name` in `dir` with `edit` applied to its
/// JSON.
fn edited_capsule(dir: &Path, name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let from = committed_capsules()
        .into_iter()
        .find(|p| p.file_name().unwrap() == name)
        .unwrap_or_else(|| panic!("no capsule {name}"));
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(from).unwrap()).unwrap();
    edit(&mut json);
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    path
}

/// The check fails, saying "re-record" and how, when a capsule misses
/// what it was kept for: a canary's run that fails with another kind than
/// the one kept, a fixed bug's run that never reaches a coverage event it
/// names. A fixed bug's run that fails says the bug is back. `--record`
/// writes the replay's fingerprint into a capsule that reaches it.
#[test]
fn a_capsule_that_misses_what_it_was_kept_for_says_re_record() {
    let dir = tempfile::tempdir().unwrap();
    let canary = "canary-SubtreeDepthOffByOne.json";
    let other_kind = edited_capsule(dir.path(), canary, |json| {
        json["kept_for"] = serde_json::json!({ "failure": "divergence" });
    });
    let (code, text) = check(&other_kind);
    assert_eq!(code, Some(1), "{text}");
    let line = check_line(&text);
    assert!(
        line.contains("failed with wrong answer instead of divergence"),
        "{text}"
    );
    assert!(
        line.contains("re-record: cargo run --release -p arbor-sim -- shrink --seed"),
        "{text}"
    );
    let back = edited_capsule(dir.path(), canary, |json| {
        json["kept_for"] =
            serde_json::json!({ "fixed": { "failed_with": "wrong answer", "reaches": [] } });
    });
    let (code, text) = check(&back);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        check_line(&text).contains("fails again: wrong answer"),
        "{text}"
    );

    let fixed = "sync-only-seed-341-late-drop.json";
    let unreached = edited_capsule(dir.path(), fixed, |json| {
        let reaches = json["kept_for"]["fixed"]["reaches"].as_array_mut().unwrap();
        reaches.push(serde_json::json!("MisconfigWindow"));
    });
    let (code, text) = check(&unreached);
    assert_eq!(code, Some(1), "{text}");
    let line = check_line(&text);
    assert!(line.contains("never reached MisconfigWindow"), "{text}");
    assert!(line.contains("re-record: cargo run --release"), "{text}");

    let stale = edited_capsule(dir.path(), fixed, |json| {
        json["outcome"]["trace_fingerprint"] = serde_json::json!("0000000000000000");
    });
    let (code, text) = replay_with(&stale, "--record");
    assert_eq!(code, Some(0), "{text}");
    let recorded = Capsule::read(&stale).unwrap();
    assert_ne!(recorded.outcome.trace_fingerprint, "0000000000000000");
    assert!(text.contains(&format!("trace {} (", recorded.outcome.trace_fingerprint)));
    let (code, text) = check(&stale);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("matches the capsule's"), "{text}");
}
