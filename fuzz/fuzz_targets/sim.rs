#![no_main]
//! Thin wrapper: the check lives in arbor_sim::fuzzing::sim so that
//! `cargo test` replays this target's corpus without cargo-fuzz. The bytes
//! script a small madsim cluster: writes, pauses and faults.

use arbor_sim::fuzzing::alloc::LimitedAlloc;
use arbor_sim::fuzzing::sim::{run, Input};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: LimitedAlloc = LimitedAlloc;

fuzz_target!(|input: Input| {
    if let Err(failure) = run(&input).failure {
        panic!("sim: {failure}");
    }
});
