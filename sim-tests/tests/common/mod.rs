//! Helpers for the tests that run the built `arbor-sim` binary.

use std::process::{Command, Output};

/// `arbor-sim` with `args`, run to its end.
pub fn arbor_sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_arbor-sim"))
        .args(args)
        .output()
        .expect("arbor-sim runs")
}

/// Everything a run printed, stdout then stderr, for assertion messages.
pub fn printed(output: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
