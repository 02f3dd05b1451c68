//! Load-evaluation subcommands: `load` and `matrix` (issue 6).
//!
//! SKELETON: the load-evaluation work fills these in.

use std::process::ExitCode;

#[derive(clap::Subcommand, Debug)]
pub enum LoadCommand {
    /// Run one constant-arrival-rate load test.
    Load {
        #[arg(long, default_value_t = 1000)]
        rate: u64,
    },
    /// Run the reference grid and search for the highest clean rate.
    Matrix {},
}

pub fn run(_command: LoadCommand) -> ExitCode {
    eprintln!("not implemented yet");
    ExitCode::FAILURE
}
