#![no_main]
//! Thin wrapper: the check lives in arbor_sim::fuzzing::decode so that
//! `cargo test` replays this target's corpus without cargo-fuzz.

use arbor_sim::fuzzing::alloc::LimitedAlloc;
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: LimitedAlloc = LimitedAlloc;

fuzz_target!(|data: &[u8]| arbor_sim::fuzzing::decode::check(data));
