//! The open-model generator (k6's constant-arrival-rate executor): iteration
//! `n` of a stage at rate `r` is due `n / r` seconds into the stage, whether
//! or not earlier iterations finished. Each iteration needs a free VU; the
//! pool starts at `vus_prealloc` and, as in k6, an arrival that finds every VU
//! busy is dropped and one more VU is added (up to `vus_max`) for later ones.
//! Every request has a deadline; missing it is an error.

use super::gateway::{self, CallLog, Session};
use super::metrics::{Outcome, ScenarioRecorder, ScenarioSummary, Snapshot};
use super::scenario::{iteration_start, iterations_due, Scenario, Workload};
use super::target::Target;
use arbor::runtime::{with_timeout, Env};
use arbor::types::NodeId;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Arrivals started back to back before the arrival loop yields, so that a
/// catch-up burst cannot starve the executor.
const ARRIVAL_BURST_MAX: u32 = 256;

/// How one run is shaped.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub scenarios: Vec<Scenario>,
    /// Per-request deadline (k6 request timeout).
    pub deadline: Duration,
    /// Width of the over-time windows.
    pub window: Duration,
    /// Keep every acknowledged node id, to verify them afterwards.
    pub track_acks: bool,
    /// Draw a progress bar (or print periodic lines when not on a terminal).
    pub progress: bool,
}

/// Process-level numbers sampled once per window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Sample {
    pub at_s: f64,
    pub in_flight: u64,
    /// Resident set size of this process (Linux), 0 when unknown.
    pub rss_mb: f64,
}

/// What a run produced.
#[derive(Clone, Debug, Default)]
pub struct RunOutput {
    pub scenarios: Vec<ScenarioSummary>,
    /// Acknowledged node ids per scenario (empty unless `track_acks`).
    pub acked: Vec<Vec<NodeId>>,
    pub samples: Vec<Sample>,
    /// Iterations still running when the drain gave up (a target that
    /// ignores cancellation); 0 in a healthy run.
    pub stuck: u64,
    /// Run length on the generator's clock, drain included.
    pub elapsed: Duration,
}

struct Shared {
    scenario: Scenario,
    recorder: Mutex<ScenarioRecorder>,
    in_flight: AtomicU64,
}

impl Shared {
    fn recorder(&self) -> std::sync::MutexGuard<'_, ScenarioRecorder> {
        // A panic while holding the lock is already a failed run; the
        // numbers behind it are still the best we have.
        self.recorder.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl CallLog for Shared {
    fn record_call(&self, call: &'static str, latency: Duration, ok: bool) {
        self.recorder().record_call(call, latency, ok);
    }
}

/// Makes what has to exist before `spec`'s load can run (the gateway
/// scenarios' objects) through `target`; true when there was something
/// to make (the caller then lets replication settle).
pub async fn prepare(spec: &RunSpec, env: &Env, target: Arc<dyn Target>) -> Result<bool, String> {
    let gateway = spec
        .scenarios
        .iter()
        .any(|s| matches!(s.workload, Workload::Gateway(_)));
    if gateway {
        gateway::prepare(target, env.clock.clone()).await?;
    }
    Ok(gateway)
}

/// Runs every scenario of `spec` at once against `target`, on `env`.
pub async fn run(spec: &RunSpec, env: &Env, target: Arc<dyn Target>) -> RunOutput {
    let run_start = env.clock.now();
    let shared: Vec<Arc<Shared>> = spec
        .scenarios
        .iter()
        .map(|s| {
            Arc::new(Shared {
                scenario: s.clone(),
                recorder: Mutex::new(ScenarioRecorder::new(&s.name, spec.window, spec.track_acks)),
                in_flight: AtomicU64::new(0),
            })
        })
        .collect();
    let mut arrivals_done = Vec::new();
    for s in &shared {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = arrivals(
            s.clone(),
            env.clone(),
            target.clone(),
            spec.deadline,
            run_start,
        );
        env.runtime.spawn(
            "load-arrivals",
            Box::pin(async move {
                task.await;
                let _ = tx.send(());
            }),
        );
        arrivals_done.push(rx);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (samples_tx, samples_rx) = tokio::sync::oneshot::channel();
    let total = spec
        .scenarios
        .iter()
        .map(|s| s.duration())
        .max()
        .unwrap_or_default();
    let progress = spec.progress.then(|| Progress::new(total));
    let ticker = ticker(
        spec.window,
        progress,
        env.clone(),
        shared.clone(),
        stop.clone(),
        run_start,
    );
    env.runtime.spawn(
        "load-progress",
        Box::pin(async move {
            let _ = samples_tx.send(ticker.await);
        }),
    );
    for rx in arrivals_done {
        rx.await.expect("arrival loop panicked");
    }
    let stuck = drain(env, &shared, spec.deadline).await;
    stop.store(true, Ordering::SeqCst);
    let samples = samples_rx.await.expect("progress task panicked");
    let end = env.clock.now().saturating_sub(run_start);
    let mut out = RunOutput {
        samples,
        stuck,
        elapsed: end,
        ..RunOutput::default()
    };
    for s in &shared {
        let recorder = std::mem::replace(
            &mut *s.recorder(),
            ScenarioRecorder::new(&s.scenario.name, spec.window, false),
        );
        let planned = iterations_due(&s.scenario.stages, s.scenario.duration());
        let (summary, acked) = recorder.finish(end, s.scenario.duration(), planned);
        out.scenarios.push(summary);
        out.acked.push(acked);
    }
    out
}

/// One scenario's arrivals, on schedule, until its last stage ends.
async fn arrivals(
    shared: Arc<Shared>,
    env: Env,
    target: Arc<dyn Target>,
    deadline: Duration,
    run_start: Duration,
) {
    let mut vus_allocated = shared.scenario.vus_prealloc.min(shared.scenario.vus_max);
    let mut n = 0u64;
    let mut burst = 0u32;
    while let Some(due) = iteration_start(&shared.scenario.stages, n) {
        let now = env.clock.now().saturating_sub(run_start);
        if due > now || burst >= ARRIVAL_BURST_MAX {
            env.clock.sleep(due.saturating_sub(now)).await;
            burst = 0;
            continue;
        }
        burst += 1;
        let in_flight = shared.in_flight.load(Ordering::SeqCst);
        if in_flight < vus_allocated {
            shared.in_flight.fetch_add(1, Ordering::SeqCst);
            shared
                .recorder()
                .record_start(now, now - due, in_flight + 1, vus_allocated);
            let task = iteration(
                shared.clone(),
                env.clone(),
                target.clone(),
                n,
                deadline,
                run_start,
            );
            env.runtime.spawn("load-iteration", Box::pin(task));
        } else {
            shared.recorder().record_dropped(now, vus_allocated);
            vus_allocated = (vus_allocated + 1).min(shared.scenario.vus_max);
        }
        n += 1;
    }
}

async fn iteration(
    shared: Arc<Shared>,
    env: Env,
    target: Arc<dyn Target>,
    n: u64,
    deadline: Duration,
    run_start: Duration,
) {
    let started = env.clock.now();
    let outcome = match shared.scenario.workload {
        Workload::Gateway(op) => {
            let session = Session {
                target,
                key: n,
                clock: env.clock.clone(),
                log: shared.clone(),
            };
            let sequence = gateway::iteration(op, n, &session);
            with_timeout(&*env.clock, deadline, sequence)
                .await
                .unwrap_or(Outcome::from_response(None))
        }
        _ => {
            let request = shared.scenario.request(n);
            let response = with_timeout(&*env.clock, deadline, target.call(request)).await;
            Outcome::from_response(response)
        }
    };
    let finished = env.clock.now();
    shared.recorder().record_done(
        finished.saturating_sub(run_start),
        finished.saturating_sub(started),
        outcome,
        shared.in_flight.load(Ordering::SeqCst),
    );
    shared.in_flight.fetch_sub(1, Ordering::SeqCst);
}

/// Waits for in-flight iterations; every one has a deadline, so this ends
/// soon after it unless the executor itself is stuck. Returns how many were
/// still running when it gave up.
async fn drain(env: &Env, shared: &[Arc<Shared>], deadline: Duration) -> u64 {
    let poll = Duration::from_millis(5);
    let give_up = env.clock.now() + deadline + Duration::from_secs(5);
    loop {
        let in_flight: u64 = shared
            .iter()
            .map(|s| s.in_flight.load(Ordering::SeqCst))
            .sum();
        if in_flight == 0 || env.clock.now() >= give_up {
            return in_flight;
        }
        env.clock.sleep(poll).await;
    }
}

/// Samples process numbers once per window and keeps the operator informed,
/// until `stop`.
async fn ticker(
    window: Duration,
    mut progress: Option<Progress>,
    env: Env,
    shared: Vec<Arc<Shared>>,
    stop: Arc<AtomicBool>,
    run_start: Duration,
) -> Vec<Sample> {
    let mut samples = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        env.clock.sleep(window).await;
        let at = env.clock.now().saturating_sub(run_start);
        let in_flight = shared
            .iter()
            .map(|s| s.in_flight.load(Ordering::SeqCst))
            .sum();
        samples.push(Sample {
            at_s: at.as_secs_f64(),
            in_flight,
            rss_mb: rss_mb(),
        });
        if let Some(p) = progress.as_mut() {
            let snaps: Vec<(String, Snapshot)> = shared
                .iter()
                .map(|s| (s.scenario.name.clone(), s.recorder().snapshot()))
                .collect();
            p.update(at, &snaps);
        }
    }
    if let Some(p) = progress {
        p.finish();
    }
    samples
}

/// Resident set size from /proc (Linux); 0 elsewhere.
pub fn rss_mb() -> f64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0.0;
    };
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (pages * 4096) as f64 / (1024.0 * 1024.0)
}

/// A progress bar on a terminal, a line every ten windows otherwise.
struct Progress {
    bar: indicatif::ProgressBar,
    lines_every: u64,
    updates: u64,
}

impl Progress {
    fn new(total: Duration) -> Self {
        let bar = indicatif::ProgressBar::new(total.as_secs().max(1));
        bar.set_style(
            indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len}s {msg}")
                .expect("static progress template")
                .progress_chars("=> "),
        );
        bar.set_prefix("load");
        Self {
            bar,
            lines_every: 10,
            updates: 0,
        }
    }

    fn update(&mut self, at: Duration, snaps: &[(String, Snapshot)]) {
        let msg = snaps
            .iter()
            .map(|(name, s)| {
                format!(
                    "{name}: {:.0}/s p99 {:.1}ms ok {} err {} drop {}",
                    s.last_rate, s.last_p99_ms, s.ok, s.errors, s.dropped
                )
            })
            .collect::<Vec<_>>()
            .join(" | ");
        self.updates += 1;
        if self.bar.is_hidden() {
            if self.updates.is_multiple_of(self.lines_every) {
                eprintln!("[{:>6.0}s] {msg}", at.as_secs_f64());
            }
        } else {
            self.bar.set_position(at.as_secs());
            self.bar.set_message(msg);
        }
    }

    fn finish(self) {
        self.bar.finish_and_clear();
    }
}
