//! Load-evaluation subcommands: `load` (one run), `matrix` (the reference
//! grid and the search for the highest clean rate) and `overload`.

use super::driver::RunSpec;
use super::matrix::{self, CleanBar, MatrixResult, PathResult, Point, Runner, SearchPlan};
use super::metrics::recovery_after_s;
use super::real::{self, RealOptions};
use super::report::{write_creating_dirs, PathSummary, RunReport};
use super::scenario::{Requests, Stage};
use super::sim_mode::{self, SimOptions};
use super::target::GatewayTransport;
use super::threshold::{check_scopes, evaluate_all, Threshold, EXIT_THRESHOLDS_FAILED};
use arbor::config::Config;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Subcommand, Debug)]
pub enum LoadCommand {
    /// Run one constant-arrival-rate load test (k6 semantics). Exit
    /// status: 0 passed, 1 acknowledged writes lost or iterations stuck, 2
    /// usage or environment error, 99 a --threshold failed.
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
    /// upward for the highest clean rate: p99 <= 100 ms, no errors, no
    /// dropped iterations, or the --thresholds given. Over each --transport
    /// path, wire first, the grid's points alternated between the paths;
    /// with --replicas 1 or more.
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
    /// Service configuration (YAML, docs/design.md §7 keys); the reference
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
    /// Which requests: `default` (system Add beside user AddByPath of
    /// bucket/prefix-P/object-N), `loader` (the reference tree loader's:
    /// container all zeros, the same seven meta pairs on every system Add,
    /// user AddByPath of test/only/path/N) or `gateway` (the S3 gateway's
    /// call sequences, one scenario per S3 operation sharing --rate;
    /// no system scenario).
    #[arg(long, value_enum, default_value_t = Requests::Default)]
    requests: Requests,
    /// Real mode: tokio worker threads of the nodes' runtime.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Real mode: tokio worker threads of the generator's runtime (the
    /// scenarios and the gateway's client side).
    #[arg(long, default_value_t = 1)]
    generator_workers: usize,
    /// gRPC gateway: HTTP/2 channels (connections) to each node; calls
    /// spread over them round-robin.
    #[arg(long, default_value_t = 2)]
    grpc_channels: usize,
    /// Wire gateway: calls in flight to each node (default: the clients'
    /// half of a node's connections, `limits.max_connections / 2`).
    #[arg(long)]
    gateway_calls: Option<usize>,
    /// Wire gateway: idle connections kept per node (default
    /// `tree.cache_size`).
    #[arg(long)]
    gateway_idle: Option<usize>,
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
    /// Print each node's per-second counters after the summary (real
    /// mode): commits and their durations, the batcher's queue,
    /// replication traffic and backlog, file size. Always in the JSON.
    #[arg(long)]
    timeline: bool,
    /// `real` (wall clock, redb files, threads) or `sim` (madsim, simulated
    /// disk and network, one seed).
    #[arg(long, value_enum, default_value_t = Mode::Real)]
    mode: Mode,
    /// Replicas: 1 (a single node) or more (a cluster with replication;
    /// real mode connects them over loopback TCP).
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// How the generator (the gateway) reaches the nodes: `tcp`, the wire
    /// path users take, `tls`, the same over mutual TLS (the replicas too,
    /// with certificates made for the run), `grpc`, the tree.TreeService
    /// front with signed calls (the replicas replicate over TCP), or
    /// `in-process`, direct calls without a wire. `--target` is another
    /// name for it.
    /// Comma-separated paths run the same load over each, one after the
    /// other, wire first; in-process numbers are only reported beside a
    /// wire path's (`--transport tcp,in-process`). Default: tcp; sim mode
    /// has only its simulated in-process gateway.
    #[arg(long, visible_alias = "target", value_enum, value_delimiter = ',')]
    transport: Vec<GatewayTransport>,
    /// A pass/fail criterion, as k6's thresholds:
    /// `[SCENARIO:] AGGREGATE OP VALUE`, e.g. 'user: p(99)<25ms',
    /// 'rate<0.01', 'system: dropped==0'. AGGREGATE: p(N), avg, med, min,
    /// max (latency: us, ms, s; a bare number is ms), rate (failed share
    /// of completed iterations: 0.01 or 1%), dropped (count). OP: `<`,
    /// `<=`, `>`, `>=`, `==`, `!=`. Without SCENARIO it holds for every
    /// scenario. Repeat for more. Verdicts come first in the summary; a
    /// failed one makes the run exit with 99. In `matrix`, thresholds
    /// replace the clean bar.
    #[arg(long = "threshold", value_name = "THRESHOLD", value_parser = Threshold::parse)]
    thresholds: Vec<Threshold>,
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

/// Why a subcommand stopped before it could judge a run.
#[derive(Debug)]
pub enum Stop {
    /// Bad flags or an environment that cannot run the load (unreadable
    /// config, unwritable output, no port): exit 2.
    Usage(String),
    /// A run that could not complete (sim mode's world would not boot):
    /// exit 1.
    Failed(String),
}

impl From<String> for Stop {
    fn from(message: String) -> Self {
        Stop::Usage(message)
    }
}

/// Exit status of a run that lost acknowledged writes, left iterations
/// stuck, or could not complete.
pub const EXIT_RUN_FAILED: u8 = 1;
/// Exit status of a usage or environment error (clap's, too).
pub const EXIT_USAGE: u8 = 2;

impl Common {
    /// The gateway paths to run, wire first. In-process numbers are only
    /// reported beside a wire path's, so a real-mode list needs one.
    fn gateways(&self) -> Result<Vec<GatewayTransport>, String> {
        if self.mode == Mode::Sim {
            return match self.transport.iter().find(|g| g.is_wire()) {
                Some(g) => Err(format!(
                    "--transport {}: sim mode's gateway calls the simulated replicas \
                     in process; the wire is real mode only",
                    g.name()
                )),
                None => Ok(vec![GatewayTransport::InProcess]),
            };
        }
        if self.transport.is_empty() {
            return Ok(vec![GatewayTransport::Tcp]);
        }
        let mut gateways = self.transport.clone();
        gateways.sort_by_key(|g| !g.is_wire());
        gateways.dedup();
        if !gateways[0].is_wire() {
            return Err(
                "--transport in-process: in-process numbers are only reported beside a \
                 wire path's; add one (--transport tcp,in-process)"
                    .into(),
            );
        }
        Ok(gateways)
    }

    /// Fails before the run, not after it, on flags that cannot work
    /// together and on outputs that cannot be written (checked last: the
    /// check creates them).
    fn check_usage(&self, spec: &RunSpec, html: &Path) -> Result<(), String> {
        self.gateways()?;
        self.check_thresholds(spec)?;
        if let Some(json) = &self.json {
            check_writable(json)?;
        }
        check_writable(html)
    }

    /// Thresholds name scenarios this run has.
    fn check_thresholds(&self, spec: &RunSpec) -> Result<(), String> {
        let names: Vec<&str> = spec.scenarios.iter().map(|s| s.name.as_str()).collect();
        check_scopes(&self.thresholds, &names)
    }

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
        let scenarios = self
            .requests
            .scenarios(self.system_rate, user_stages, self.prefixes);
        RunSpec {
            scenarios,
            deadline: self.deadline,
            window: Duration::from_secs(1),
            track_acks,
            progress: !self.no_progress,
        }
    }

    fn sim_options(&self, config: Config) -> SimOptions {
        let mut disk = sim_mode::CALIBRATED_DISK;
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

    /// One run in the chosen mode over `gateway`; `separate_dir` gives it
    /// its own subdirectory of `--data-dir` (several paths in one call).
    fn run(
        &self,
        spec: &RunSpec,
        config: Config,
        verify: bool,
        gateway: GatewayTransport,
        separate_dir: bool,
    ) -> Result<RunReport, Stop> {
        match self.mode {
            Mode::Real => {
                let mut options = self.real_options(config, gateway)?;
                options.verify |= verify;
                if separate_dir {
                    options.data_dir = options.data_dir.map(|d| d.join(gateway.name()));
                }
                Ok(real::run(spec, &options)?)
            }
            Mode::Sim => {
                let mut options = self.sim_options(config);
                options.verify |= verify;
                let mut report = sim_mode::run(spec, &options).map_err(Stop::Failed)?;
                report.gateway = format!("{} (simulated)", gateway.name());
                report.replicas = self.replicas;
                Ok(report)
            }
        }
    }

    /// The run over the first gateway path, with the others' headline
    /// numbers beside it, judged by the thresholds.
    fn run_paths(&self, spec: &RunSpec, config: Config, verify: bool) -> Result<RunReport, Stop> {
        let gateways = self.gateways()?;
        self.check_thresholds(spec)?;
        let several = gateways.len() > 1;
        let mut report = self.run(spec, config.clone(), verify, gateways[0], several)?;
        for gateway in &gateways[1..] {
            let other = self.run(spec, config.clone(), verify, *gateway, several)?;
            report.beside.push(PathSummary::of(&other));
        }
        report.thresholds = evaluate_all(&self.thresholds, &report.scenarios);
        Ok(report)
    }

    fn real_options(
        &self,
        config: Config,
        gateway: GatewayTransport,
    ) -> Result<RealOptions, String> {
        if self.replicas == 0 {
            return Err("--replicas must be at least 1".into());
        }
        if self.gateway_calls == Some(0) {
            return Err("--gateway-calls must be at least 1".into());
        }
        if self.grpc_channels == 0 {
            return Err("--grpc-channels must be at least 1".into());
        }
        Ok(RealOptions {
            replicas: self.replicas,
            gateway,
            config,
            data_dir: self.data_dir.clone(),
            worker_threads: self.workers,
            generator_threads: self.generator_workers,
            grpc_channels: self.grpc_channels,
            verify: self.verify,
            gateway_calls: self.gateway_calls,
            gateway_idle: self.gateway_idle,
        })
    }
}

/// Runs a load subcommand: exit 0 when the run passed, 1 when it failed
/// (lost writes, stuck iterations), 2 on a usage or environment error, 99
/// when a threshold failed.
pub fn run(command: LoadCommand) -> ExitCode {
    match dispatch(command) {
        Ok(code) => code,
        Err(Stop::Usage(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(Stop::Failed(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_RUN_FAILED)
        }
    }
}

fn dispatch(command: LoadCommand) -> Result<ExitCode, Stop> {
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
            let config = common.config()?;
            let html = html.unwrap_or_else(default_html_path);
            common.check_usage(&spec, &html)?;
            let report = common.run_paths(&spec, config, false)?;
            finish_run(&common, &report, &html)
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
            let gateways = common.gateways()?;
            if common.requests == Requests::Gateway {
                return Err(Stop::Usage(
                    "matrix --requests gateway: the grid and the search judge the user \
                     scenario, which the gateway's requests do not have; run `load \
                     --requests gateway`"
                        .into(),
                ));
            }
            let bar = if common.thresholds.is_empty() {
                CleanBar::default()
            } else {
                common.check_thresholds(&common.spec(vec![], false))?;
                CleanBar {
                    thresholds: common.thresholds.clone(),
                }
            };
            if let Some(path) = &common.json {
                check_writable(path)?;
            }
            let base = common.config()?;
            let plan = SearchPlan {
                start_rate: search_start,
                max_rate: search_max,
                duration: search_duration,
                sync_interval: base.tree.sync_interval,
                resolution: 0.05,
                probes_max: search_probes,
            };
            let grid = if no_grid {
                Vec::new()
            } else {
                reference_grid(grid_duration)
            };
            let separate_dir = gateways.len() > 1;
            let mut runners: Vec<RealRunner> = gateways
                .iter()
                .map(|&gateway| RealRunner {
                    common: (*common).clone(),
                    base: base.clone(),
                    gateway,
                    separate_dir,
                })
                .collect();
            println!(
                "\n{} replica(s), {}",
                common.replicas,
                gateways
                    .iter()
                    .map(|g| g.describe())
                    .collect::<Vec<_>>()
                    .join("; beside it ")
            );
            let grids = {
                let mut labelled: Vec<(String, &mut dyn Runner)> = runners
                    .iter_mut()
                    .map(|r| (r.gateway_label(), r as &mut dyn Runner))
                    .collect();
                matrix::run_grids(&mut labelled, &grid, &bar)
            };
            let mut paths = Vec::new();
            for (runner, grid_rows) in runners.iter_mut().zip(grids) {
                let (highest_clean_rate, search) = if no_search {
                    (None, Vec::new())
                } else {
                    println!("\nsearch, {}", runner.gateway.describe());
                    matrix::search(runner, &plan, &bar)
                };
                paths.push(PathResult {
                    gateway: runner.gateway_label(),
                    grid: grid_rows,
                    search,
                    highest_clean_rate,
                });
            }
            let result = MatrixResult {
                mode: format!("{:?}", common.mode).to_lowercase(),
                replicas: common.replicas,
                clean: bar.text(),
                paths,
            };
            println!("\n{}", matrix::result_text(&result));
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
            let config = common.config()?;
            let html = html.unwrap_or_else(default_html_path);
            common.check_usage(&spec, &html)?;
            let mut report = common.run_paths(&spec, config, true)?;
            report.title = format!("Overload: {base_rate}/s, {rate}/s, {base_rate}/s");
            report
                .notes
                .extend(recovery_notes(&report, warmup, overload_duration));
            finish_run(&common, &report, &html)
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
    gateway: GatewayTransport,
    separate_dir: bool,
}

impl RealRunner {
    fn gateway_label(&self) -> String {
        match self.common.mode {
            Mode::Real => self.gateway.name().to_string(),
            Mode::Sim => format!("{} (simulated)", self.gateway.name()),
        }
    }
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
        let run = self
            .common
            .run(&spec, config, false, self.gateway, self.separate_dir);
        match run {
            Ok(report) => report,
            Err(Stop::Usage(e) | Stop::Failed(e)) => {
                eprintln!("run at {}/s failed: {e}", point.rate);
                RunReport::default()
            }
        }
    }
}

/// Creates the file's directory and opens the file for writing (leaving
/// an existing file's content alone).
pub fn check_writable(path: &Path) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map(drop)
        .map_err(fail)
}

fn finish_run(common: &Common, report: &RunReport, html: &Path) -> Result<ExitCode, Stop> {
    println!("{}", report.summary_text());
    if common.timeline {
        let user = report.scenario("user").map_or(&[][..], |s| &s.windows[..]);
        println!("{}", super::node_timeline::text(&report.timeline, user));
    }
    if let Some(path) = &common.json {
        report
            .write_json(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    write_creating_dirs(html, super::html::render(report).as_bytes())
        .map_err(|e| format!("{}: {e}", html.display()))?;
    println!("  html report: {}", html.display());
    Ok(if report.failed() {
        ExitCode::from(EXIT_RUN_FAILED)
    } else if !report.thresholds_passed() {
        ExitCode::from(EXIT_THRESHOLDS_FAILED)
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
