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
