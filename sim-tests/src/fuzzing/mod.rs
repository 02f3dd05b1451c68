//! Fuzz check functions, shared by the cargo-fuzz targets in `fuzz/` and by
//! `cargo test`, which replays the committed corpus through the same code
//! (sim-tests/tests/fuzz_corpus.rs) without needing cargo-fuzz.
//!
//! Every `check` takes the raw fuzzer bytes, builds its structured input
//! with `arbitrary`, and panics only when Arbor is wrong: bytes that do not
//! make a valid input are simply ignored.

pub mod alloc;
pub mod apply_oplog;
pub mod crash_recovery;
pub mod decode;
pub mod ops;
pub mod sim;

/// A fuzz target's check: panics when Arbor is wrong.
pub type Check = fn(&[u8]);

/// Every fuzz target by name, as the corpus directories are named.
pub const TARGETS: &[(&str, Check)] = &[
    ("apply_oplog", apply_oplog::check),
    ("decode", decode::check),
    ("crash_recovery", crash_recovery::check),
    ("sim", sim::check),
];
