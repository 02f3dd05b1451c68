//! `arbor-sim`: simulation sweeps and replay (issue 4), load evaluation
//! (issue 6).
//!
//! SKELETON: each subcommand delegates to its module.

fn main() {}
