//! `arbor-sim`: simulation sweeps and replay, and load evaluation.

use clap::Parser;

// Simulated load runs spend much of their time in malloc/free as three
// in-memory databases grow: a 60 s 3-replica run at 1000 RPS took 7.1 s of
// wall time with mimalloc against 14.7 s with glibc's allocator, with
// identical results. Allocation never reaches simulated state, so
// determinism is unaffected.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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

// mimalloc's `mi_option_set` and the number of its `purge_delay` option
// (the same in mimalloc v2 and v3); declared here because the crate's
// `extended` feature needs a crate the offline registry lacks.
extern "C" {
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

/// Tells mimalloc to keep the memory it frees instead of returning it to
/// the OS a second later. A load run frees and reallocates redb's 4 KiB page
/// buffers all the time; returned memory comes back as fresh pages the
/// kernel must fault in and clear (a 3-minute sim run: 31 600 page faults,
/// 830 without purging, same peak RSS). `MIMALLOC_PURGE_DELAY` in the
/// environment still wins.
fn keep_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a plain integer option; mimalloc reads it at each purge.
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, -1) }
    }
}

fn main() -> std::process::ExitCode {
    keep_freed_memory();
    let cli = Cli::parse();
    match cli.command {
        Command::Sim(cmd) => arbor_sim::cli::run(cmd),
        Command::Load(cmd) => arbor_sim::load::cli::run(cmd),
    }
}
