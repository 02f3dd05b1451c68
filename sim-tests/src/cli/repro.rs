//! From a failing run to a small reproduction: `replay` of a seed or a
//! capsule (with an HTML timeline), `shrink`, and the capsules a sweep
//! keeps with `--keep-failures`.

use super::{announce_seed, init_replay_log, usage_error, ScenarioArgs, EXIT_SEED_FAILED};
use crate::scenario::capsule::{replay_command, Capsule};
use crate::scenario::plan::Plan;
use crate::scenario::shrink::{shrink as shrink_plan, Counts, Shrunk, SHRINK_TRIALS_MAX};
use crate::scenario::swarm::Swarm;
use crate::scenario::{run_seed, Options, Report};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// The seed to replay, with the scenario flags it ran with.
    #[arg(long, required_unless_present = "capsule", conflicts_with = "capsule")]
    pub seed: Option<u64>,
    /// A capsule file (from `sweep --keep-failures` or `shrink`) instead.
    #[arg(long, value_name = "FILE")]
    pub capsule: Option<PathBuf>,
    /// Also write a self-contained HTML timeline of the run here.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Do not print each trace event.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub scenario: ScenarioArgs,
}

#[derive(clap::Args, Debug)]
pub struct ShrinkArgs {
    /// The failing seed, with the scenario flags it ran with.
    #[arg(long, required_unless_present = "capsule", conflicts_with = "capsule")]
    pub seed: Option<u64>,
    /// A failing capsule instead.
    #[arg(long, value_name = "FILE")]
    pub capsule: Option<PathBuf>,
    /// Threads running trial runs at once.
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// Most trial runs to spend.
    #[arg(long, default_value_t = SHRINK_TRIALS_MAX)]
    pub trials: u64,
    /// Where the minimal capsule goes (default: a name that says what it
    /// holds, in the current directory).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub scenario: ScenarioArgs,
}

/// A run to start from: a seed's drawn plan or a capsule's.
fn starting_plan(
    seed: Option<u64>,
    capsule: Option<&Path>,
    scenario: &ScenarioArgs,
    echo: bool,
) -> Result<(Plan, Options, Option<Capsule>), String> {
    if let Some(path) = capsule {
        let capsule = Capsule::read(path).map_err(|e| e.to_string())?;
        let mut plan = capsule.plan.clone();
        plan.swarm.seed = capsule.seed;
        return Ok((plan, capsule.options(echo), Some(capsule)));
    }
    let seed = seed.ok_or("--seed or --capsule is required")?;
    let options = scenario.options(echo);
    let swarm = Swarm::draw(seed, options.profile, options.size, options.faults);
    Ok((Plan::draw(swarm), options, None))
}

pub fn replay(args: &ReplayArgs) -> ExitCode {
    if !args.quiet {
        init_replay_log();
    }
    let (plan, options, capsule) = match starting_plan(
        args.seed,
        args.capsule.as_deref(),
        &args.scenario,
        !args.quiet,
    ) {
        Ok(start) => start,
        Err(e) => return usage_error(&e),
    };
    announce_seed(plan.swarm.seed, &[plan.swarm.seed], &options);
    let report = match &capsule {
        Some(capsule) => capsule.run(!args.quiet),
        None => run_seed(plan.swarm.seed, &options),
    };
    println!("{report}");
    if let Some(capsule) = &capsule {
        print_fingerprint_check(capsule, &report);
    }
    if let Some(path) = &args.html {
        let page = super::timeline::html(&report);
        if let Err(e) = std::fs::write(path, page) {
            return usage_error(&format!("--html {}: {e}", path.display()));
        }
        println!("timeline: {}", path.display());
    }
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_SEED_FAILED)
    }
}

fn print_fingerprint_check(capsule: &Capsule, report: &Report) {
    let fingerprint = format!("{:016x}", report.trace_hash);
    if fingerprint == capsule.outcome.trace_fingerprint {
        println!("trace fingerprint {fingerprint} matches the capsule's");
    } else {
        println!(
            "trace fingerprint {fingerprint} differs from the capsule's {} (written by {}; an edited capsule or another build)",
            capsule.outcome.trace_fingerprint, capsule.commit
        );
    }
}

pub fn shrink(args: &ShrinkArgs) -> ExitCode {
    let (plan, options, capsule) =
        match starting_plan(args.seed, args.capsule.as_deref(), &args.scenario, false) {
            Ok(start) => start,
            Err(e) => return usage_error(&e),
        };
    std::panic::set_hook(Box::new(|_| {}));
    let shrunk = shrink_plan(&plan, &options, args.jobs, args.trials);
    let _ = std::panic::take_hook();
    let shrunk = match shrunk {
        Ok(shrunk) => shrunk,
        Err(e) => {
            println!("seed {}: {e}", plan.swarm.seed);
            return ExitCode::from(EXIT_SEED_FAILED);
        }
    };
    let faults = capsule.as_ref().map_or(options.faults, |c| c.faults);
    let minimal = Capsule::of(&shrunk.report, faults, &super::records::commit());
    let path = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(minimal.file_name(".min")));
    if let Err(e) = minimal.write(&path) {
        return usage_error(&format!("{}: {e}", path.display()));
    }
    print_shrunk(&shrunk, &path);
    ExitCode::SUCCESS
}

/// Before and after counts, and how to replay the minimal capsule.
pub fn print_shrunk(shrunk: &Shrunk, path: &Path) {
    let (b, a) = (Counts::of(&shrunk.before), Counts::of(&shrunk.after));
    println!(
        "shrunk seed {} ({}) in {} trials, {:.1}s",
        shrunk.before.swarm.seed,
        shrunk.kind,
        shrunk.trials,
        shrunk.wall.as_secs_f64()
    );
    println!("| | faults | clients | client ops | replicas | workload |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, c) in [("before", b), ("after", a)] {
        println!(
            "| {name} | {} | {} | {} | {} | {} ms |",
            c.faults, c.clients, c.client_ops, c.replicas, c.workload_ms
        );
    }
    println!("minimal capsule: {}", path.display());
    println!("replay: {}", replay_command(path));
}

/// `--keep-failures`: the failing run's capsule, as it ran, written as
/// soon as it fails (a sweep killed later keeps it).
pub fn keep_failure(
    dir: Option<&Path>,
    report: &Report,
    options: &Options,
    commit: &str,
) -> Result<(), String> {
    let Some(dir) = dir else { return Ok(()) };
    let capsule = Capsule::of(report, options.faults, commit);
    let path = dir.join(capsule.file_name(""));
    capsule
        .write(&path)
        .map_err(|e| format!("--keep-failures {}: {e}", path.display()))
}

/// `--keep-failures` after the sweep: each failure shrunk, its minimal
/// capsule beside the one it came from.
pub fn keep_shrunk(
    dir: &Path,
    failures: &[Report],
    options: &Options,
    jobs: usize,
    trials_max: u64,
    commit: &str,
) -> Result<(), String> {
    if trials_max == 0 {
        return Ok(());
    }
    for report in failures {
        std::panic::set_hook(Box::new(|_| {}));
        let shrunk = shrink_plan(&report.plan, options, jobs, trials_max);
        let _ = std::panic::take_hook();
        let Ok(shrunk) = shrunk else {
            println!("seed {}: passed when rerun; not shrunk", report.seed);
            continue;
        };
        let capsule = Capsule::of(&shrunk.report, options.faults, commit);
        let path = dir.join(capsule.file_name(".min"));
        capsule
            .write(&path)
            .map_err(|e| format!("--keep-failures {}: {e}", path.display()))?;
        print_shrunk(&shrunk, &path);
    }
    Ok(())
}
