//! `arbor-sim`: simulation sweeps and replay, and load evaluation.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "arbor-sim",
    version,
    about = "Arbor's deterministic simulator and load evaluator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    #[command(flatten)]
    Sim(arbor_sim::cli::SimCommand),
    #[command(flatten)]
    Load(arbor_sim::load::cli::LoadCommand),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Sim(cmd) => arbor_sim::cli::run(cmd),
        Command::Load(cmd) => arbor_sim::load::cli::run(cmd),
    }
}
