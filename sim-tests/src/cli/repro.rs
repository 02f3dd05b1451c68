//! From a failing run to a small reproduction: `replay` of a seed or a
//! capsule (with an HTML timeline), `shrink`, and the capsules a sweep
//! keeps with `--keep-failures`.

use super::{announce_seed, init_replay_log, usage_error, ScenarioArgs, EXIT_SEED_FAILED};
use crate::scenario::capsule::shrink::{
    shrink_to_capsule, Accept, Counts, Shrunk, SHRINK_TRIALS_MAX,
};
use crate::scenario::capsule::{replay_command, Capsule, Missed};
use crate::scenario::plan::swarm::Swarm;
use crate::scenario::plan::Plan;
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
    /// Also write this run's capsule here (a passing run's has no
    /// `kept_for`: say by hand what it is kept for).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Check that the capsule's run still reaches what it was kept for
    /// (its `kept_for`); the exit status says whether it does (0) or not
    /// (1), and a miss names the command that records it anew.
    #[arg(long, requires = "capsule")]
    pub check: bool,
    /// Check as `--check` does, and when the run reaches what the capsule
    /// was kept for, write this run's outcome (trace fingerprint, counts,
    /// commit) into the capsule file.
    #[arg(long, requires = "capsule")]
    pub record: bool,
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
    if let (Some(capsule), Some(network)) = (&capsule, args.scenario.network) {
        if args.record && network != capsule.network {
            return usage_error(&format!(
                "--record: the capsule ran on {}; a replay on {} cannot record it",
                capsule.network.name(),
                network.name()
            ));
        }
    }
    announce_seed(plan.swarm.seed, &[plan.swarm.seed], &options);
    let report = match &capsule {
        Some(capsule) => capsule.run_over(
            !args.quiet,
            args.scenario.network.unwrap_or(capsule.network),
        ),
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
    if let Some(path) = &args.out {
        let faults = capsule.as_ref().map_or(options.faults, |c| c.faults);
        let mut kept = Capsule::of(&report, faults, &super::records::commit());
        if let Some(capsule) = &capsule {
            kept.kept_for.clone_from(&capsule.kept_for);
        }
        if let Err(e) = kept.write(path) {
            return usage_error(&format!("--out {}: {e}", path.display()));
        }
        println!("capsule: {}", path.display());
    }
    if let (Some(capsule), Some(path)) = (&capsule, &args.capsule) {
        if args.check || args.record {
            return check_capsule(capsule, path, &report, args.record);
        }
    }
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_SEED_FAILED)
    }
}

/// `replay --check` and `--record`: whether the replay reaches what the
/// capsule was kept for, and with `record` the capsule written anew.
fn check_capsule(capsule: &Capsule, path: &Path, report: &Report, record: bool) -> ExitCode {
    let kept_for = capsule
        .kept_for
        .as_ref()
        .map_or("nothing (no kept_for)".to_string(), |k| k.to_string());
    let recorded = match capsule.recorded(report, &super::records::commit()) {
        Ok(recorded) => recorded,
        Err(missed @ Missed::FailsAgain { .. }) => {
            println!(
                "{}: kept for {kept_for}; {missed}: the fixed bug, or another, is back",
                path.display()
            );
            return ExitCode::from(EXIT_SEED_FAILED);
        }
        Err(missed) => {
            println!(
                "{}: no longer reaches what it was kept for ({kept_for}): {missed}; re-record: {}",
                path.display(),
                capsule.rerecord_command(path)
            );
            return ExitCode::from(EXIT_SEED_FAILED);
        }
    };
    println!(
        "{}: reaches what it was kept for ({kept_for})",
        path.display()
    );
    if record {
        if let Err(e) = recorded.write(path) {
            return usage_error(&format!("{}: {e}", path.display()));
        }
        println!(
            "recorded {} (trace fingerprint {})",
            path.display(),
            recorded.outcome.trace_fingerprint
        );
    }
    ExitCode::SUCCESS
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
    let faults = capsule.as_ref().map_or(options.faults, |c| c.faults);
    let commit = super::records::commit();
    std::panic::set_hook(Box::new(|_| {}));
    let shrunk = shrink_to_capsule(
        &plan,
        &options,
        (faults, &commit),
        args.jobs,
        args.trials,
        Accept::SameKind,
    );
    let _ = std::panic::take_hook();
    let (shrunk, minimal) = match shrunk {
        Ok(shrunk) => shrunk,
        Err(e) => {
            println!("seed {}: {e}", plan.swarm.seed);
            return ExitCode::from(EXIT_SEED_FAILED);
        }
    };
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
        let shrunk = shrink_to_capsule(
            &report.plan,
            options,
            (options.faults, commit),
            jobs,
            trials_max,
            Accept::SameKind,
        );
        let _ = std::panic::take_hook();
        let (shrunk, capsule) = match shrunk {
            Ok(shrunk) => shrunk,
            Err(e) => {
                println!("seed {}: {e}; not shrunk", report.seed);
                continue;
            }
        };
        let path = dir.join(capsule.file_name(".min"));
        capsule
            .write(&path)
            .map_err(|e| format!("--keep-failures {}: {e}", path.display()))?;
        print_shrunk(&shrunk, &path);
    }
    Ok(())
}
