#![no_main]
//! Thin wrapper: the check lives in arbor_sim::fuzzing::crash_recovery so that
//! `cargo test` replays this target's corpus without cargo-fuzz. The
//! input is the structured one (libFuzzer bytes -> arbitrary, exactly as
//! `check` parses them), so `cargo fuzz fmt` can print an artifact.

use arbor_sim::fuzzing::alloc::LimitedAlloc;
use arbor_sim::fuzzing::crash_recovery::{run, Input};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: LimitedAlloc = LimitedAlloc;

fuzz_target!(|input: Input| {
    run(&input);
});
