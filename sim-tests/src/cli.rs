//! Simulation subcommands: `sweep` runs many seeds on worker threads (each
//! seed in its own madsim runtime) and summarises; `replay` reruns one seed
//! with a readable trace on simulated time.

use crate::scenario::swarm::{Profile, Size};
use crate::scenario::{run_seed, Options, Report};
use arbor::canary::Canary;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

/// Options shared by both subcommands: which scenario variant to run.
#[derive(clap::Args, Debug, Clone)]
pub struct ScenarioArgs {
    /// Scenario profile: standard, push-only, sync-heavy, storage-errors.
    #[arg(long, default_value = "standard", value_parser = parse_profile)]
    pub profile: Profile,
    /// Switch on one planted bug (see engine/src/canary.rs), e.g.
    /// SharedSyncCursor.
    #[arg(long, value_parser = parse_canary)]
    pub canary: Option<Canary>,
    /// The smaller scenario `cargo test` uses.
    #[arg(long)]
    pub small: bool,
    /// Run without faults.
    #[arg(long)]
    pub no_faults: bool,
}

impl ScenarioArgs {
    fn options(&self, echo_trace: bool) -> Options {
        Options {
            profile: self.profile,
            size: if self.small {
                Size::TEST
            } else {
                Size::STANDARD
            },
            faults: !self.no_faults,
            canary: self.canary,
            echo_trace,
        }
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum SimCommand {
    /// Run many seeds of a scenario and summarise.
    Sweep {
        #[arg(long, default_value_t = 100)]
        seeds: u64,
        #[arg(long, default_value_t = 1)]
        seed_start: u64,
        /// Worker threads, each running its own simulations.
        #[arg(long, default_value_t = 1)]
        jobs: usize,
        #[command(flatten)]
        scenario: ScenarioArgs,
    },
    /// Replay one seed with a readable trace.
    Replay {
        #[arg(long)]
        seed: u64,
        #[command(flatten)]
        scenario: ScenarioArgs,
    },
}

pub fn parse_profile(name: &str) -> Result<Profile, String> {
    Profile::parse(name).ok_or_else(|| format!("unknown profile {name:?}"))
}

/// Accepts the variant name in any case, with or without dashes.
pub fn parse_canary(name: &str) -> Result<Canary, String> {
    let wanted: String = name.chars().filter(|c| *c != '-' && *c != '_').collect();
    Canary::ALL
        .into_iter()
        .find(|c| format!("{c:?}").eq_ignore_ascii_case(&wanted))
        .ok_or_else(|| {
            let names: Vec<String> = Canary::ALL.iter().map(|c| format!("{c:?}")).collect();
            format!("unknown canary {name:?}; one of {}", names.join(", "))
        })
}

pub fn run(command: SimCommand) -> ExitCode {
    match command {
        SimCommand::Sweep {
            seeds,
            seed_start,
            jobs,
            scenario,
        } => sweep(seed_start, seeds, jobs.max(1), &scenario.options(false)),
        SimCommand::Replay { seed, scenario } => replay(seed, &scenario.options(true)),
    }
}

/// Totals of a sweep.
#[derive(Default, Debug)]
pub struct SweepSummary {
    pub runs: u64,
    pub failures: Vec<Report>,
    pub ops_acked: u64,
    pub ops_sent: u64,
    pub faults_injected: u64,
    pub wall_seconds: f64,
    /// Each run's trace hash by seed: two builds that ran the same
    /// simulations agree on all of them.
    pub trace_hashes: std::collections::BTreeMap<u64, u64>,
}

impl SweepSummary {
    pub fn seeds_per_minute(&self) -> f64 {
        self.runs as f64 * 60.0 / self.wall_seconds.max(1e-9)
    }

    /// One hash over every run's trace hash in seed order: equal
    /// fingerprints mean a change (say, a faster simulator) left every
    /// simulated run exactly as it was.
    pub fn fingerprint(&self) -> u64 {
        let bytes: Vec<u8> = self
            .trace_hashes
            .iter()
            .flat_map(|(seed, hash)| seed.to_le_bytes().into_iter().chain(hash.to_le_bytes()))
            .collect();
        crate::trace::fnv_hash(&bytes)
    }
}

/// Runs seeds `start..start+count` on `jobs` threads; `on_done` sees each
/// report as it arrives (progress).
pub fn run_sweep(
    start: u64,
    count: u64,
    jobs: usize,
    options: &Options,
    mut on_done: impl FnMut(&Report),
) -> SweepSummary {
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(start));
    let end = start + count;
    let (tx, rx) = mpsc::channel::<Report>();
    let workers: Vec<_> = (0..jobs)
        .map(|_| {
            let (next, tx, options) = (next.clone(), tx.clone(), options.clone());
            // Threads outside the simulations: each runs whole runtimes.
            std::thread::spawn(move || loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end {
                    return;
                }
                if tx.send(run_seed(seed, &options)).is_err() {
                    return;
                }
            })
        })
        .collect();
    drop(tx);
    let mut summary = SweepSummary::default();
    for report in rx {
        on_done(&report);
        summary.runs += 1;
        summary.ops_acked += report.ops_acked;
        summary.ops_sent += report.ops_sent;
        summary.faults_injected += report.faults_injected;
        summary.trace_hashes.insert(report.seed, report.trace_hash);
        if !report.passed() {
            summary.failures.push(report);
        }
    }
    for worker in workers {
        let _ = worker.join();
    }
    summary.failures.sort_by_key(|r| r.seed);
    summary.wall_seconds = started.elapsed().as_secs_f64();
    summary
}

fn sweep(start: u64, count: u64, jobs: usize, options: &Options) -> ExitCode {
    // Panics inside runs are failures with their message in the report; the
    // default hook would only scribble over the progress bar.
    std::panic::set_hook(Box::new(|_| {}));
    let bar = indicatif::ProgressBar::new(count);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} seeds, {per_sec}, eta {eta} {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut failed = 0;
    let summary = run_sweep(start, count, jobs, options, |report| {
        if !report.passed() {
            failed += 1;
            bar.set_message(format!("{failed} failed"));
        }
        bar.inc(1);
    });
    bar.finish();
    let _ = std::panic::take_hook();
    print_summary(&summary, start, count, jobs, options);
    if summary.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn print_summary(summary: &SweepSummary, start: u64, count: u64, jobs: usize, options: &Options) {
    let size = options.size;
    println!();
    println!(
        "scenario: profile {}, {} ops, {:?} simulated, {} clients, faults {}, canary {:?}",
        options.profile.name(),
        size.ops_total,
        size.workload_duration,
        size.clients,
        if options.faults { "on" } else { "off" },
        options.canary
    );
    println!(
        "seeds {start}..{} on {jobs} thread(s), trace fingerprint {:016x}",
        start + count,
        summary.fingerprint()
    );
    println!("host: {}", crate::host::describe());
    println!(
        "| runs | failures | seeds/min | ops sent | ops acked (applied) | faults injected | wall |"
    );
    println!(
        "|-----:|---------:|----------:|---------:|--------------------:|----------------:|-----:|"
    );
    println!(
        "| {} | {} | {:.1} | {} | {} | {} | {:.1}s |",
        summary.runs,
        summary.failures.len(),
        summary.seeds_per_minute(),
        summary.ops_sent,
        summary.ops_acked,
        summary.faults_injected,
        summary.wall_seconds
    );
    if !summary.failures.is_empty() {
        println!("\nfailing seeds:");
        for report in &summary.failures {
            if let Some(failure) = &report.failure {
                println!("  seed {}: {failure}", report.seed);
            }
            println!("    replay: {}", report.replay_commands());
            println!("        or: {}", report.test_replay_command());
        }
    }
}

/// Prints simulated time instead of wall time in replay logs.
struct SimulatedTime;

impl tracing_subscriber::fmt::time::FormatTime for SimulatedTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        match madsim::time::TimeHandle::try_current() {
            Some(time) => {
                let t = time.elapsed();
                write!(w, "{:>4}.{:06}s", t.as_secs(), t.subsec_micros())
            }
            None => write!(w, "      -    "),
        }
    }
}

fn replay(seed: u64, options: &Options) -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,madsim=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_timer(SimulatedTime)
        .with_target(false)
        .try_init();
    let report = run_seed(seed, options);
    println!("{report}");
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
