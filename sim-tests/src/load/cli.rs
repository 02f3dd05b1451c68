//! Load-evaluation subcommands: `load` (one run), `matrix` (the reference
//! grid and the search for the highest clean rate) and `overload`.

use super::driver::RunSpec;
use super::matrix::{self, CleanBar, MatrixResult, Point, Runner, SearchPlan};
use super::metrics::recovery_after_s;
use super::real::{self, RealOptions, Topology};
use super::report::{write_creating_dirs, RunReport};
use super::scenario::{Scenario, Stage};
use super::sim::{self, SimOptions};
use arbor::config::Config;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Subcommand, Debug)]
pub enum LoadCommand {
    /// Run one constant-arrival-rate load test (k6 semantics).
    Load {
        #[command(flatten)]
        common: Box<Common>,
        /// User-scenario arrival rate (iterations per second).
        #[arg(long, default_value_t = 1000)]
        rate: u64,
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        duration: Duration,
        /// Write the self-contained HTML report here (default
        /// reports/<timestamp>.html).
        #[arg(long)]
        html: Option<PathBuf>,
    },
    /// Run the reference grid (1000/2500/5000 RPS x sync 5m/off) and search
    /// upward for the highest rate with p99 <= 100 ms and no errors.
    Matrix {
        #[command(flatten)]
        common: Box<Common>,
        /// Length of each grid run.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        grid_duration: Duration,
        /// Length of each search probe.
        #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
        search_duration: Duration,
        #[arg(long, default_value_t = 5000)]
        search_start: u64,
        #[arg(long, default_value_t = 200_000)]
        search_max: u64,
        /// Upper bound on search probes.
        #[arg(long, default_value_t = 12)]
        search_probes: u32,
        #[arg(long)]
        no_grid: bool,
        #[arg(long)]
        no_search: bool,
    },
    /// Overload: `--base-rate` for a while, then `--rate` for
    /// `--overload-duration`, then `--base-rate` again; checks that excess
    /// requests fail fast and every acknowledged write is readable.
    Overload {
        #[command(flatten)]
        common: Box<Common>,
        #[arg(long)]
        rate: u64,
        #[arg(long)]
        base_rate: u64,
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        warmup: Duration,
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        overload_duration: Duration,
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        recovery: Duration,
        #[arg(long)]
        html: Option<PathBuf>,
    },
    /// Measure real commit latency and fit sim mode's disk model to it.
    Calibrate(CalibrateArgs),
}

/// Measures real commits and fits sim mode's disk latency to them.
#[derive(clap::Args, Debug, Clone)]
pub struct CalibrateArgs {
    /// Commits measured per batch size (fewer for large batches).
    #[arg(long, default_value_t = 200)]
    commits: usize,
    /// Where the databases go (default: a fresh temporary directory).
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

/// Options every load subcommand shares.
#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// Service configuration (YAML, DESIGN §7 keys); the reference
    /// configuration when absent. Flags below override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Background sync interval, or "off" (default 5m, or the --config
    /// file's value).
    #[arg(long)]
    sync: Option<String>,
    #[arg(long)]
    max_batch_size: Option<usize>,
    #[arg(long, value_parser = humantime::parse_duration)]
    max_batch_delay: Option<Duration>,
    #[arg(long)]
    max_pending_writes: Option<usize>,
    /// Most writes one commit takes from a backlog (limits.max_commit_size).
    #[arg(long)]
    max_commit_size: Option<usize>,
    /// How long a batch of replicated ops only waits for more writes
    /// (pilorama.replicated_batch_delay; what-if, the reference has 0).
    #[arg(long, value_parser = humantime::parse_duration)]
    replicated_batch_delay: Option<Duration>,
    /// Acknowledge before the batch is durable.
    #[arg(long)]
    no_sync: bool,
    /// System-scenario rate (Add into tree "system"); 0 turns it off.
    #[arg(long, default_value_t = 10)]
    system_rate: u64,
    /// Per-request deadline.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    deadline: Duration,
    /// User objects are spread over this many prefixes.
    #[arg(long, default_value_t = 1)]
    prefixes: u32,
    /// Tokio worker threads in real mode.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Where the databases go (default: a fresh temporary directory).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Check afterwards that every acknowledged node is readable.
    #[arg(long)]
    verify: bool,
    /// Write the JSON report here.
    #[arg(long)]
    json: Option<PathBuf>,
    #[arg(long)]
    no_progress: bool,
    /// `real` (wall clock, redb files, threads) or `sim` (madsim, simulated
    /// disk and network, one seed).
    #[arg(long, value_enum, default_value_t = Mode::Real)]
    mode: Mode,
    /// Replicas: 1 (a single node) or more (a cluster with replication;
    /// real mode connects them over loopback TCP).
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Real cluster: the gateway calls replicas over TCP too (default: in
    /// process, as the reference run mocked the gateway's network).
    #[arg(long)]
    gateway_tcp: bool,
    /// Sim mode: the seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Sim mode: round-trip time between replicas.
    #[arg(long, default_value = "200us", value_parser = humantime::parse_duration)]
    rtt: Duration,
    /// Sim mode: disk time per fsync (default: the real-mode calibration).
    #[arg(long, value_parser = humantime::parse_duration)]
    disk_sync: Option<Duration>,
    /// Sim mode: disk time per write call.
    #[arg(long, value_parser = humantime::parse_duration)]
    disk_write: Option<Duration>,
    /// Sim mode: disk time per byte written, in nanoseconds.
    #[arg(long)]
    disk_byte_ns: Option<u64>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Real,
    Sim,
}

impl Common {
    fn sync_explicit(&self) -> bool {
        self.sync.is_some()
    }

    fn sync_interval(&self) -> Result<Option<Duration>, String> {
        match self.sync.as_deref().unwrap_or("5m") {
            "off" | "0" | "0s" => Ok(None),
            s => humantime::parse_duration(s)
                .map(Some)
                .map_err(|e| format!("--sync {s:?}: {e}")),
        }
    }

    fn config(&self) -> Result<Config, String> {
        let mut config = match &self.config {
            Some(path) => Config::load(path).map_err(|e| format!("--config: {e}"))?,
            None => real::reference_config(1, PathBuf::new(), None),
        };
        if self.config.is_none() || self.sync_explicit() {
            config.tree.sync_interval = self.sync_interval()?;
        }
        if let Some(n) = self.max_batch_size {
            config.pilorama.max_batch_size = n;
        }
        if let Some(d) = self.max_batch_delay {
            config.pilorama.max_batch_delay = d;
        }
        if let Some(n) = self.max_pending_writes {
            config.limits.max_pending_writes = n;
        }
        if let Some(n) = self.max_commit_size {
            config.limits.max_commit_size = n;
        }
        if let Some(d) = self.replicated_batch_delay {
            config.pilorama.replicated_batch_delay = d;
        }
        config.pilorama.no_sync |= self.no_sync;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    fn spec(&self, user_stages: Vec<Stage>, track_acks: bool) -> RunSpec {
        let total: Duration = user_stages.iter().map(|s| s.duration).sum();
        let mut scenarios = Vec::new();
        if self.system_rate > 0 {
            scenarios.push(Scenario::system(self.system_rate, total));
        }
        scenarios.push(Scenario::user(1, total, self.prefixes).with_stages(user_stages));
        RunSpec {
            scenarios,
            deadline: self.deadline,
            window: Duration::from_secs(1),
            track_acks,
            progress: !self.no_progress,
        }
    }

    fn sim_options(&self, config: Config) -> SimOptions {
        let mut disk = sim::CALIBRATED_DISK;
        if let Some(d) = self.disk_sync {
            disk.per_sync = d;
        }
        if let Some(d) = self.disk_write {
            disk.per_write = d;
        }
        if let Some(n) = self.disk_byte_ns {
            disk.per_byte_nanos = n;
        }
        SimOptions {
            seed: self.seed,
            replicas: self.replicas,
            config,
            disk_latency: disk,
            net_latency: self.rtt / 2,
            verify: self.verify,
        }
    }

    /// One run in the chosen mode.
    fn run(&self, spec: &RunSpec, config: Config, verify: bool) -> Result<RunReport, String> {
        match self.mode {
            Mode::Real => {
                let mut options = self.real_options(config)?;
                options.verify |= verify;
                real::run(spec, &options)
            }
            Mode::Sim => {
                let mut options = self.sim_options(config);
                options.verify |= verify;
                sim::run(spec, &options)
            }
        }
    }

    fn real_options(&self, config: Config) -> Result<RealOptions, String> {
        let topology = match self.replicas {
            0 => return Err("--replicas must be at least 1".into()),
            1 => Topology::Single,
            replicas => Topology::Cluster {
                replicas,
                via_tcp: self.gateway_tcp,
            },
        };
        Ok(RealOptions {
            topology,
            config,
            data_dir: self.data_dir.clone(),
            worker_threads: self.workers,
            verify: self.verify,
        })
    }
}

pub fn run(command: LoadCommand) -> ExitCode {
    match dispatch(command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(command: LoadCommand) -> Result<ExitCode, String> {
    match command {
        LoadCommand::Calibrate(args) => {
            let temp = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
            let dir = args
                .data_dir
                .clone()
                .unwrap_or_else(|| temp.path().to_path_buf());
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let calibration = super::calibrate::run(&dir, args.commits)?;
            println!("{}", calibration.text());
            Ok(ExitCode::SUCCESS)
        }
        LoadCommand::Load {
            common,
            rate,
            duration,
            html,
        } => {
            let spec = common.spec(vec![Stage { duration, rate }], common.verify);
            let report = common.run(&spec, common.config()?, false)?;
            finish_run(&common, &report, html)
        }
        LoadCommand::Matrix {
            common,
            grid_duration,
            search_duration,
            search_start,
            search_max,
            search_probes,
            no_grid,
            no_search,
        } => {
            let mut runner = RealRunner {
                common: (*common).clone(),
                base: common.config()?,
            };
            let bar = CleanBar::default();
            let grid = if no_grid {
                Vec::new()
            } else {
                reference_grid(grid_duration)
            };
            let grid_rows = matrix::run_grid(&mut runner, &grid, &bar);
            let (highest_clean_rate, search) = if no_search {
                (None, Vec::new())
            } else {
                let plan = SearchPlan {
                    start_rate: search_start,
                    max_rate: search_max,
                    duration: search_duration,
                    sync_interval: runner.base.tree.sync_interval,
                    resolution: 0.05,
                    probes_max: search_probes,
                };
                matrix::search(&mut runner, &plan, &bar)
            };
            let result = MatrixResult {
                grid: grid_rows,
                search,
                highest_clean_rate,
            };
            println!("\n{}", matrix::result_text(&result, &bar));
            if let Some(path) = &common.json {
                let text = serde_json::to_string_pretty(&result).map_err(|e| e.to_string())?;
                write_creating_dirs(path, text.as_bytes())
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        LoadCommand::Overload {
            common,
            rate,
            base_rate,
            warmup,
            overload_duration,
            recovery,
            html,
        } => {
            let stages = vec![
                Stage {
                    duration: warmup,
                    rate: base_rate,
                },
                Stage {
                    duration: overload_duration,
                    rate,
                },
                Stage {
                    duration: recovery,
                    rate: base_rate,
                },
            ];
            let spec = common.spec(stages, true);
            let mut report = common.run(&spec, common.config()?, true)?;
            report.title = format!("Overload: {base_rate}/s, {rate}/s, {base_rate}/s");
            report
                .notes
                .extend(recovery_notes(&report, warmup, overload_duration));
            finish_run(&common, &report, html)
        }
    }
}

/// One line per scenario: how long after the rate dropped its latency was
/// back to normal (`metrics::recovery_after_s`).
fn recovery_notes(report: &RunReport, warmup: Duration, overload: Duration) -> Vec<String> {
    let overload_at_s = warmup.as_secs_f64();
    let drop_at_s = overload_at_s + overload.as_secs_f64();
    let mut notes: Vec<String> = report
        .scenarios
        .iter()
        .map(
            |s| match recovery_after_s(&s.windows, overload_at_s, drop_at_s) {
                Some(recovery) => format!(
                    "{}: latency back to normal {:.0} s after the rate dropped \
                 (every later 1 s window: {} within 2x or 5 ms of the warm-up's, no error)",
                    s.name,
                    recovery.after_s,
                    recovery.measure.name()
                ),
                None => format!(
                    "{}: latency did not settle back to normal before the run ended",
                    s.name
                ),
            },
        )
        .collect();
    // A generator behind its schedule still sends the overload's arrivals
    // after the drop, and the recovery above counts that time too.
    let lag_ms = report
        .scenarios
        .iter()
        .map(|s| s.start_lag_max_ms)
        .fold(0.0, f64::max);
    if lag_ms >= GENERATOR_LAG_NOTE_MS {
        notes.push(format!(
            "the generator ran up to {:.1} s behind its schedule (it shares the CPU with \
             the service): arrivals due during the overload were still starting after \
             the drop, so part of the recovery time is the generator catching up",
            lag_ms / 1000.0
        ));
    }
    notes
}

/// Start lag from which the overload report says the generator fell
/// behind: one one-second window.
const GENERATOR_LAG_NOTE_MS: f64 = 1000.0;

/// 1000/2500/5000 RPS, each with sync every 5 minutes and with sync off.
pub fn reference_grid(duration: Duration) -> Vec<Point> {
    let mut points = Vec::new();
    for rate in [1000, 2500, 5000] {
        for sync_interval in [Some(Duration::from_secs(300)), None] {
            points.push(Point {
                rate,
                sync_interval,
                duration,
            });
        }
    }
    points
}

struct RealRunner {
    common: Common,
    base: Config,
}

impl Runner for RealRunner {
    fn run(&mut self, point: &Point) -> RunReport {
        let mut config = self.base.clone();
        config.tree.sync_interval = point.sync_interval;
        let spec = self.common.spec(
            vec![Stage {
                duration: point.duration,
                rate: point.rate,
            }],
            false,
        );
        match self.common.run(&spec, config, false) {
            Ok(report) => report,
            Err(e) => {
                eprintln!("run at {}/s failed: {e}", point.rate);
                RunReport::default()
            }
        }
    }
}

fn finish_run(
    common: &Common,
    report: &RunReport,
    html: Option<PathBuf>,
) -> Result<ExitCode, String> {
    println!("{}", report.summary_text());
    if let Some(path) = &common.json {
        report
            .write_json(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let html = html.unwrap_or_else(default_html_path);
    write_creating_dirs(&html, super::html::render(report).as_bytes())
        .map_err(|e| format!("{}: {e}", html.display()))?;
    println!("  html report: {}", html.display());
    let lost = report.verification.as_ref().is_some_and(|v| v.missing > 0);
    Ok(if lost || report.stuck > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn default_html_path() -> PathBuf {
    let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
        .to_string()
        .replace(':', "-");
    PathBuf::from("reports").join(format!("{stamp}.html"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        common: Common,
    }

    fn config_of(args: &[&str]) -> Result<Config, String> {
        let argv = std::iter::once("load").chain(args.iter().copied());
        Cli::try_parse_from(argv).unwrap().common.config()
    }

    #[test]
    fn replicated_batch_delay_is_a_checked_what_if() {
        let delay = |c: Config| c.pilorama.replicated_batch_delay;
        assert_eq!(delay(config_of(&[]).unwrap()), Duration::ZERO);
        let what_if = config_of(&["--replicated-batch-delay", "40ms"]).unwrap();
        assert_eq!(delay(what_if), Duration::from_millis(40));
        // More than half of the 5 s replication timeout is refused.
        let error = config_of(&["--replicated-batch-delay", "10s"]).unwrap_err();
        assert!(error.contains("pilorama.replicated_batch_delay"), "{error}");
    }
}
