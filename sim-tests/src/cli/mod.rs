//! Simulation subcommands: `sweep` runs many seeds on worker threads (each
//! seed in its own madsim runtime) and summarises, perhaps one part of a
//! range shared by several machines, with JUnit and JSON-lines records for
//! CI; `replay` reruns one seed with a readable trace on simulated time.

pub mod partition;
pub mod records;
pub mod repro;
pub mod timeline;

use crate::files::create_file;
use crate::scenario::plan::swarm::{Profile, Size};
use crate::scenario::{parse_canary, run_seed, Options, Report};
use crate::world::Network;
use arbor::canary::Canary;
use partition::{Partition, SeedSet};
use records::{commit, junit_report, JsonLines, SeedRecord, SuiteInfo};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

/// Options shared by both subcommands: which scenario variant to run.
#[derive(clap::Args, Debug, Clone)]
pub struct ScenarioArgs {
    /// Scenario profile: standard, push-only, sync-heavy, storage-errors, sync-only, replace, misconfig, members, gateway.
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
    /// How simulated nodes reach each other: tcp (the engine's own TCP
    /// stack over madsim's simulated streams) or tls (that stack with
    /// mutual TLS and certificates made by the run). Default: tcp, or a
    /// replayed capsule's own.
    #[arg(long, value_parser = Network::parse)]
    pub network: Option<Network>,
}

impl ScenarioArgs {
    pub fn options(&self, echo_trace: bool) -> Options {
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
            network: self.network.unwrap_or_default(),
        }
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum SimCommand {
    /// Run many seeds of a scenario and summarise. Exit status: 0 every
    /// seed passed, 1 a seed failed, 2 usage or environment error (bad
    /// flags, an output file that cannot be written), 3 with
    /// --check-claims: every seed passed but a claim of the profile was
    /// never reached.
    Sweep(SweepArgs),
    /// Replay one seed, or one capsule, with a readable trace. Exit
    /// status: 0 passed, 1 failed, 2 usage error; with `--check` or
    /// `--record`, 0 the capsule reaches what it was kept for, 1 it does
    /// not.
    Replay(repro::ReplayArgs),
    /// Shrink a failing seed or capsule to a minimal capsule, replayed
    /// before it is written. Exit status: 0 shrunk, 1 the run passed
    /// (nothing to shrink) or the minimal capsule does not replay to the
    /// same failure kind (nothing written), 2 usage error.
    Shrink(repro::ShrinkArgs),
}

#[derive(clap::Args, Debug)]
pub struct SweepArgs {
    #[arg(long, default_value_t = 100)]
    pub seeds: u64,
    #[arg(long, default_value_t = 1)]
    pub seed_start: u64,
    /// Worker threads, each running its own simulations.
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// Run one part of the seed range, so that N machines share it:
    /// `slice:M/N` runs the M-th of N contiguous slices, `hash:M/N` the
    /// seeds whose hash falls in part M (M counts from 1). The N parts of
    /// either kind are disjoint and together cover the range.
    #[arg(long, value_name = "KIND:M/N", value_parser = Partition::parse)]
    pub partition: Option<Partition>,
    /// Write a JUnit XML report here at the end: one test case per seed, a
    /// failure's replay command in its message.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Write one JSON line per seed here as each finishes: seed, commit,
    /// profile, canary, verdict, failure kind, simulated and wall time,
    /// trace fingerprint, replay command.
    #[arg(long, value_name = "FILE")]
    pub jsonl: Option<PathBuf>,
    /// Write a capsule of every failing seed into DIR as it fails, and,
    /// after the sweep, its shrunk capsule (`arbor-sim shrink`).
    #[arg(long, value_name = "DIR")]
    pub keep_failures: Option<PathBuf>,
    /// Most trial runs shrinking one kept failure may spend; 0 keeps the
    /// capsules as they ran, unshrunk.
    #[arg(long, value_name = "N", default_value_t = crate::scenario::capsule::shrink::SHRINK_TRIALS_MAX)]
    pub shrink_trials: u64,
    /// Fail (exit status 3) when the sweep never reached a situation its
    /// profile claims (`scenario::check::claims`); needs at least 40 seeds (20
    /// with --small), as the claims were set over that many
    #[arg(long)]
    pub check_claims: bool,
    #[command(flatten)]
    pub scenario: ScenarioArgs,
}

/// Exit status of a sweep or replay in which a seed failed.
pub const EXIT_SEED_FAILED: u8 = 1;
/// Exit status of a usage or environment error (clap's, too).
pub const EXIT_USAGE: u8 = 2;
/// Exit status of a sweep with `--check-claims` whose seeds all passed but
/// never reached a situation the profile claims.
pub const EXIT_CLAIMS_UNREACHED: u8 = 3;

pub fn parse_profile(name: &str) -> Result<Profile, String> {
    Profile::parse(name).ok_or_else(|| format!("unknown profile {name:?}"))
}

pub fn run(command: SimCommand) -> ExitCode {
    match command {
        SimCommand::Sweep(args) => sweep(&args),
        SimCommand::Replay(args) => repro::replay(&args),
        SimCommand::Shrink(args) => repro::shrink(&args),
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
    /// The coverage counts of every run added up.
    pub coverage: crate::coverage::CoverageCounts,
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

/// One seed's verdict and the wall time its run took.
#[derive(Debug)]
pub struct SeedRun {
    pub report: Report,
    pub wall: Duration,
}

/// Runs seeds `start..start+count` on `jobs` threads, naming each seed on
/// stderr before it starts (`announce_seed`); `on_done` sees each run as it
/// finishes (progress).
pub fn run_sweep(
    start: u64,
    count: u64,
    jobs: usize,
    options: &Options,
    on_done: impl FnMut(&SeedRun),
) -> SweepSummary {
    let seeds = SeedSet {
        range: start..start + count,
        partition: None,
    };
    let announce = |seed: u64, running: &[u64]| announce_seed(seed, running, options);
    run_seeds(&seeds, jobs, options, &announce, on_done)
}

/// Runs the seeds of `seeds` on `jobs` threads. `on_start` runs on the
/// worker just before each seed, with the seeds running at that moment;
/// `on_done` sees each run as it finishes.
pub fn run_seeds(
    seeds: &SeedSet,
    jobs: usize,
    options: &Options,
    on_start: &(dyn Fn(u64, &[u64]) + Sync),
    mut on_done: impl FnMut(&SeedRun),
) -> SweepSummary {
    let started = Instant::now();
    let walk = seeds.walk();
    let (next, end) = (AtomicU64::new(walk.start), walk.end);
    let running = Mutex::new(BTreeSet::new());
    let mut summary = SweepSummary::default();
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<SeedRun>();
        for _ in 0..jobs.max(1) {
            let (tx, next, running) = (tx.clone(), &next, &running);
            // Threads outside the simulations: each runs whole runtimes.
            scope.spawn(move || loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end {
                    return;
                }
                if !seeds.contains(seed) {
                    continue;
                }
                let run = run_one(seed, options, on_start, running);
                if tx.send(run).is_err() {
                    return;
                }
            });
        }
        drop(tx);
        for run in rx {
            on_done(&run);
            summary.add(run.report);
        }
    });
    summary.failures.sort_by_key(|r| r.seed);
    summary.wall_seconds = started.elapsed().as_secs_f64();
    summary
}

/// One seed on a worker: announced, run, timed.
fn run_one(
    seed: u64,
    options: &Options,
    on_start: &(dyn Fn(u64, &[u64]) + Sync),
    running: &Mutex<BTreeSet<u64>>,
) -> SeedRun {
    let now_running: Vec<u64> = {
        let mut running = running.lock().unwrap_or_else(|e| e.into_inner());
        running.insert(seed);
        running.iter().copied().collect()
    };
    on_start(seed, &now_running);
    let wall = Instant::now();
    let report = run_seed(seed, options);
    let wall = wall.elapsed();
    running
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&seed);
    SeedRun { report, wall }
}

impl SweepSummary {
    fn add(&mut self, report: Report) {
        self.runs += 1;
        self.ops_acked += report.ops_acked;
        self.ops_sent += report.ops_sent;
        self.faults_injected += report.faults_injected;
        self.trace_hashes.insert(report.seed, report.trace_hash);
        self.coverage.merge(&report.coverage);
        if !report.passed() {
            self.failures.push(report);
        }
    }
}

/// Names a seed on stderr before it runs, so that a run killed by a
/// timeout still says which seeds it was in: one line, with the other
/// seeds running at the time. Written to the stream itself, not through
/// `eprintln!`, which a test harness captures and loses with the process.
pub fn announce_seed(seed: u64, running: &[u64], options: &Options) {
    let mut line = format!("seed {seed}: starting ({}", options.profile.name());
    if options.size == Size::TEST {
        line.push_str(", small");
    }
    if !options.faults {
        line.push_str(", no faults");
    }
    if let Some(canary) = options.canary {
        let _ = write!(line, ", canary {canary:?}");
    }
    line.push(')');
    let others: Vec<String> = running
        .iter()
        .filter(|s| **s != seed)
        .map(u64::to_string)
        .collect();
    if !others.is_empty() {
        let _ = write!(line, "; also running {}", others.join(", "));
    }
    line.push('\n');
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(line.as_bytes());
    let _ = stderr.flush();
}

/// `run_seed` with the seed named on stderr first (`announce_seed`).
pub fn run_seed_announced(seed: u64, options: &Options) -> Report {
    announce_seed(seed, &[seed], options);
    run_seed(seed, options)
}

/// Where a sweep writes its records.
struct Outputs {
    commit: String,
    jsonl: Option<JsonLines>,
    /// Every seed's record, kept for the JUnit file.
    records: Vec<SeedRecord>,
    /// Failing seeds' reports, for the JUnit failure bodies.
    failure_reports: BTreeMap<u64, String>,
    /// `--keep-failures`: where failing seeds' capsules go.
    keep: Option<PathBuf>,
    /// The first write error; the sweep goes on and reports it at the end.
    error: Option<String>,
}

impl Outputs {
    fn open(args: &SweepArgs) -> Result<Outputs, String> {
        let jsonl = match &args.jsonl {
            Some(path) => Some(
                JsonLines::create(path).map_err(|e| format!("--jsonl {}: {e}", path.display()))?,
            ),
            None => None,
        };
        if let Some(path) = &args.junit {
            // Created now and rewritten at the end: a path that cannot be
            // written stops the sweep before it spends any time.
            create_file(path).map_err(|e| format!("--junit {}: {e}", path.display()))?;
        }
        Ok(Outputs {
            commit: commit(),
            jsonl,
            records: Vec::new(),
            failure_reports: BTreeMap::new(),
            keep: args.keep_failures.clone(),
            error: None,
        })
    }

    fn record(&mut self, run: &SeedRun, options: &Options) {
        let record = SeedRecord::of(run, options, &self.commit);
        if let Some(jsonl) = &mut self.jsonl {
            if let Err(e) = jsonl.write(&record) {
                self.error.get_or_insert(format!("--jsonl: {e}"));
            }
        }
        if !run.report.passed() {
            self.failure_reports
                .insert(run.report.seed, run.report.to_string());
            if let Err(e) =
                repro::keep_failure(self.keep.as_deref(), &run.report, options, &self.commit)
            {
                self.error.get_or_insert(e);
            }
        }
        self.records.push(record);
    }

    fn write_junit(&mut self, args: &SweepArgs, seeds: &SeedSet, summary: &SweepSummary) {
        let Some(path) = &args.junit else {
            return;
        };
        self.records.sort_by_key(|r| r.seed);
        let options = args.scenario.options(false);
        let name = format!(
            "arbor-sim sweep {}{}",
            options.profile.name(),
            if args.scenario.small { " small" } else { "" }
        );
        let mut properties = vec![
            ("commit", self.commit.clone()),
            ("seeds", seeds.describe()),
            ("faults", options.faults.to_string()),
            ("host", crate::host::describe()),
        ];
        if let Some(canary) = options.canary {
            properties.push(("canary", format!("{canary:?}")));
        }
        let suite = SuiteInfo {
            name: &name,
            wall_s: summary.wall_seconds,
            properties: &properties,
        };
        let report = junit_report(&suite, &self.records, &self.failure_reports);
        let written = report
            .to_string()
            .map_err(|e| e.to_string())
            .and_then(|xml| std::fs::write(path, xml).map_err(|e| e.to_string()));
        if let Err(e) = written {
            self.error
                .get_or_insert(format!("--junit {}: {e}", path.display()));
        }
    }
}

fn sweep(args: &SweepArgs) -> ExitCode {
    let seeds = match SeedSet::new(args.seed_start, args.seeds, args.partition) {
        Ok(seeds) => seeds,
        Err(e) => return usage_error(&e),
    };
    let options = args.scenario.options(false);
    let claim_seeds = crate::scenario::check::claims::claim_seeds(options.size);
    if args.check_claims && seeds.len() < claim_seeds {
        return usage_error(&format!(
            "--check-claims: the claims hold over {claim_seeds} seeds, {} asked",
            seeds.len()
        ));
    }
    let mut outputs = match Outputs::open(args) {
        Ok(outputs) => outputs,
        Err(e) => return usage_error(&e),
    };
    let jobs = args.jobs.max(1);
    // Panics inside runs are failures with their message in the report; the
    // default hook would only scribble over the progress bar.
    std::panic::set_hook(Box::new(|_| {}));
    let bar = indicatif::ProgressBar::new(seeds.len());
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} seeds, {per_sec}, eta {eta} {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let announce = |seed: u64, running: &[u64]| {
        bar.suspend(|| announce_seed(seed, running, &options));
    };
    let mut failed = 0;
    let summary = run_seeds(&seeds, jobs, &options, &announce, |run| {
        if !run.report.passed() {
            failed += 1;
            bar.set_message(format!("{failed} failed"));
        }
        outputs.record(run, &options);
        bar.inc(1);
    });
    bar.finish();
    let _ = std::panic::take_hook();
    outputs.write_junit(args, &seeds, &summary);
    print_summary(&summary, &seeds, jobs, &options);
    if let Some(dir) = &args.keep_failures {
        if let Err(e) = repro::keep_shrunk(
            dir,
            &summary.failures,
            &options,
            jobs,
            args.shrink_trials,
            &outputs.commit,
        ) {
            outputs.error.get_or_insert(e);
        }
    }
    if !summary.failures.is_empty() {
        return ExitCode::from(EXIT_SEED_FAILED);
    }
    let unreached = options
        .profile
        .unreached_claims(options.size, &summary.coverage);
    if args.check_claims && !unreached.is_empty() {
        return ExitCode::from(EXIT_CLAIMS_UNREACHED);
    }
    match &outputs.error {
        Some(e) => usage_error(e),
        None => ExitCode::SUCCESS,
    }
}

pub(crate) fn usage_error(message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(EXIT_USAGE)
}

fn print_summary(summary: &SweepSummary, seeds: &SeedSet, jobs: usize, options: &Options) {
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
        "{} on {jobs} thread(s), trace fingerprint {:016x}",
        seeds.describe(),
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
    println!("\ncoverage (over all runs):");
    for what in crate::coverage::Coverage::ALL {
        println!("  {:<36} {}", what.name(), summary.coverage.get(what));
    }
    let missing = summary.coverage.missing();
    if !missing.is_empty() {
        let names: Vec<&str> = missing.iter().map(|c| c.name()).collect();
        println!("  never reached: {}", names.join(", "));
    }
    let claims = options.profile.claims_at(size);
    let unreached = options.profile.unreached_claims(size, &summary.coverage);
    if unreached.is_empty() {
        println!(
            "claims of profile {}: all {} reached",
            options.profile.name(),
            claims.len()
        );
    } else {
        let names: Vec<&str> = unreached.iter().map(|c| c.name()).collect();
        println!(
            "claims of profile {}: {} of {} reached; never reached: {}",
            options.profile.name(),
            claims.len() - unreached.len(),
            claims.len(),
            names.join(", ")
        );
    }
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

/// The replay log's filter unless `RUST_LOG` says otherwise. madsim warns
/// at every start that it cannot seed std's `HashMap` on Linux; a replay's
/// repetition is checked by its trace fingerprint instead, so that line
/// is left out.
pub const REPLAY_LOG_FILTER: &str = "info,madsim=warn,madsim::sim::rand=error";

/// Sets up the replay log: trace events and engine logs on simulated time,
/// on stdout, coloured only when stdout is a terminal.
pub(crate) fn init_replay_log() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(REPLAY_LOG_FILTER));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_timer(SimulatedTime)
        .with_target(false)
        .with_ansi(std::io::stdout().is_terminal())
        .try_init();
}
