//! Simulation subcommands: `sweep` and `replay` (issue 4).
//!
//! SKELETON: the simulation work fills these in.

use std::process::ExitCode;

#[derive(clap::Subcommand, Debug)]
pub enum SimCommand {
    /// Run many seeds of the standard scenario.
    Sweep {
        #[arg(long, default_value_t = 100)]
        seeds: u64,
    },
    /// Replay one seed with a readable trace.
    Replay {
        #[arg(long)]
        seed: u64,
    },
}

pub fn run(_command: SimCommand) -> ExitCode {
    eprintln!("not implemented yet");
    ExitCode::FAILURE
}
