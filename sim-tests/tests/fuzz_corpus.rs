//! Replays every committed fuzz input (fuzz/corpus/<target>/ and the
//! minimised crashes in fuzz/regressions/<target>/) through the same check
//! functions the cargo-fuzz targets call, so `cargo test` guards them
//! without cargo-fuzz or a nightly toolchain. Also feeds each target a few
//! hundred seeded pseudo-random inputs.

use arbor_sim::disk::SplitMix64;
use arbor_sim::fuzzing::{self, alloc::LimitedAlloc};
use std::path::{Path, PathBuf};

// Same allocator as the fuzz binaries, so an unbounded allocation fails
// the replay too.
#[global_allocator]
static ALLOC: LimitedAlloc = LimitedAlloc;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

fn check_of(target: &str) -> fn(&[u8]) {
    fuzzing::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .map(|(_, check)| *check)
        .unwrap_or_else(|| panic!("no fuzz target {target}"))
}

/// Committed inputs of a target, sorted so failures name a stable file.
fn committed_inputs(target: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for kind in ["corpus", "regressions"] {
        let dir = fuzz_dir().join(kind).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("readable corpus directory").path();
            if path.is_file() {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn replay(target: &str) {
    let check = check_of(target);
    let files = committed_inputs(target);
    assert!(!files.is_empty(), "no committed corpus for {target}");
    for file in files {
        let data = std::fs::read(&file).expect("readable corpus file");
        eprintln!("replaying {}", file.display());
        check(&data);
    }
}

/// Seeded random inputs of mixed lengths: a cheap sweep that needs no
/// corpus. The seed of a failing input is printed before it runs.
fn random_inputs(target: &str, count: u64) {
    let check = check_of(target);
    for seed in 0..count {
        let mut rng = SplitMix64::new(seed);
        let len = (rng.next_u64() % 512) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        eprintln!("{target}: random input seed {seed}");
        check(&data);
    }
}

#[test]
fn allocation_limit_is_enforced_in_this_binary() {
    assert!(fuzzing::alloc::enforced());
}

/// Set in the child that `oversized_allocation_aborts_the_process` starts.
const ABORT_PROBE_ENV: &str = "ARBOR_ALLOC_ABORT_PROBE";
const ABORT_PROBE_BYTES: usize = 3_000_017;

/// An infallible allocation above the limit must end the process with
/// std's allocation-failure abort (what libFuzzer records as a crash), not
/// unwind out of the allocator. An abort cannot be observed from inside,
/// so the test runs itself again in a child process that makes the
/// allocation, and inspects how the child died.
#[test]
fn oversized_allocation_aborts_the_process() {
    const NAME: &str = "oversized_allocation_aborts_the_process";
    if std::env::var_os(ABORT_PROBE_ENV).is_some() {
        eprintln!("probe: limit armed");
        let len = fuzzing::alloc::with_limit(1 << 20, || {
            std::hint::black_box(vec![0u8; ABORT_PROBE_BYTES]).len()
        });
        eprintln!("probe: survived with {len} bytes");
        return;
    }
    let child = std::process::Command::new(std::env::current_exe().expect("own test binary"))
        .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(ABORT_PROBE_ENV, "1")
        .output()
        .expect("test binary runs again");
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(
        stderr.contains("probe: limit armed"),
        "probe never ran: {stderr}"
    );
    assert!(!stderr.contains("probe: survived"), "{stderr}");
    assert!(!child.status.success(), "{stderr}");
    let message = format!("memory allocation of {ABORT_PROBE_BYTES} bytes failed");
    assert!(stderr.contains(&message), "{stderr}");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        const SIGABRT: i32 = 6;
        assert_eq!(child.status.signal(), Some(SIGABRT), "{stderr}");
    }
}

#[test]
fn every_target_has_a_replay_test() {
    let names: Vec<&str> = fuzzing::TARGETS.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["apply_oplog", "decode", "crash_recovery", "sim"]);
}

#[test]
fn corpus_apply_oplog() {
    replay("apply_oplog");
}

#[test]
fn corpus_decode() {
    replay("decode");
}

#[test]
fn corpus_crash_recovery() {
    replay("crash_recovery");
}

#[test]
fn corpus_sim() {
    replay("sim");
}

#[test]
fn random_apply_oplog() {
    random_inputs("apply_oplog", 200);
}

#[test]
fn random_decode() {
    random_inputs("decode", 2000);
}

#[test]
fn random_crash_recovery() {
    random_inputs("crash_recovery", 100);
}

#[test]
fn random_sim() {
    random_inputs("sim", 20);
}
