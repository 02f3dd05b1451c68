//! The load generator's k6 semantics, checked in simulated time against
//! scripted targets: open arrivals, the VU pool, deadlines, drops.

use arbor::error::Error;
use arbor::proto::{Request, Response};
use arbor::runtime::BoxFuture;
use arbor_sim::load::driver::{self, RunOutput, RunSpec};
use arbor_sim::load::scenario::{Scenario, Stage};
use arbor_sim::load::sim_mode::generator_env;
use arbor_sim::load::target::Target;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Answers every request after a fixed simulated delay; `None` never answers.
struct Scripted {
    latency: Option<Duration>,
    next_id: AtomicU64,
}

impl Target for Scripted {
    fn call_at(&self, _key: u64, request: Request) -> BoxFuture<'static, Response> {
        self.call(request)
    }

    fn call(&self, _request: Request) -> BoxFuture<'static, Response> {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst) + 1;
        let latency = self.latency;
        Box::pin(async move {
            match latency {
                Some(d) => {
                    madsim::time::sleep(d).await;
                    Response::Added { node: id }
                }
                None => futures::future::pending().await,
            }
        })
    }
}

/// Refuses every request at once.
struct Refusing;

impl Target for Refusing {
    fn call_at(&self, _key: u64, request: Request) -> BoxFuture<'static, Response> {
        self.call(request)
    }

    fn call(&self, _request: Request) -> BoxFuture<'static, Response> {
        Box::pin(async { Response::Error(Error::Overloaded("queue full".into())) })
    }
}

fn run_sim(spec: RunSpec, target: Arc<dyn Target>) -> RunOutput {
    let runtime = madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default());
    runtime.block_on(async move { driver::run(&spec, &generator_env(), target).await })
}

fn spec(scenarios: Vec<Scenario>, deadline: Duration) -> RunSpec {
    RunSpec {
        scenarios,
        deadline,
        window: Duration::from_secs(1),
        track_acks: true,
        progress: false,
    }
}

fn scripted(latency: Option<Duration>) -> Arc<dyn Target> {
    Arc::new(Scripted {
        latency,
        next_id: AtomicU64::new(0),
    })
}

#[test]
fn constant_rate_runs_every_iteration_on_schedule() {
    let secs = Duration::from_secs(5);
    let s = spec(
        vec![Scenario::system(10, secs), Scenario::user(200, secs, 1)],
        Duration::from_secs(5),
    );
    let out = run_sim(s, scripted(Some(Duration::from_millis(10))));
    let (system, user) = (&out.scenarios[0], &out.scenarios[1]);
    assert_eq!((system.iterations, system.ok, system.dropped), (50, 50, 0));
    assert_eq!(
        (user.iterations, user.ok, user.errors, user.dropped),
        (1000, 1000, 0, 0)
    );
    assert!((user.achieved_rate - 200.0).abs() < 1e-9);
    assert!(
        (user.latency.avg_ms - 10.0).abs() < 0.05,
        "{:?}",
        user.latency
    );
    assert_eq!(out.acked[1].len(), 1000);
    // Five full one-second windows of 200 starts each.
    let starts: Vec<u64> = user.windows.iter().map(|w| w.started).collect();
    assert_eq!(&starts[..5], &[200; 5]);
    assert_eq!(out.stuck, 0);
}

#[test]
fn arrivals_do_not_wait_for_slow_iterations() {
    // A closed model with 100 VUs and 1 s latency would start 100/s at most;
    // the open model keeps starting 300/s and lets the pool grow.
    let secs = Duration::from_secs(3);
    let mut user = Scenario::user(300, secs, 1);
    user.vus_prealloc = 100;
    user.vus_max = 2000;
    let out = run_sim(
        spec(vec![user], Duration::from_secs(5)),
        scripted(Some(Duration::from_secs(1))),
    );
    let u = &out.scenarios[0];
    assert_eq!(u.iterations + u.dropped, 900);
    assert_eq!(u.ok, u.iterations);
    // k6 drops an arrival that finds the pool empty and adds one VU, so a
    // few arrivals are lost while the pool grows towards rate x latency.
    assert!(u.dropped > 0, "dropped {}", u.dropped);
    assert!(u.iterations > 600, "started {}", u.iterations);
    assert!(
        u.in_flight_max > 200 && u.in_flight_max <= 300,
        "in flight {}",
        u.in_flight_max
    );
    assert!(u.vus_allocated_max > 200);
}

#[test]
fn missed_deadlines_are_errors_and_a_full_pool_drops() {
    let mut user = Scenario::user(100, Duration::from_secs(2), 1);
    user.vus_prealloc = 20;
    user.vus_max = 50;
    let out = run_sim(spec(vec![user], Duration::from_secs(1)), scripted(None));
    let u = &out.scenarios[0];
    assert_eq!(u.iterations + u.dropped, 200);
    assert_eq!(u.ok, 0);
    assert_eq!(u.errors, u.iterations);
    assert_eq!(u.errors_by_kind.get("deadline"), Some(&u.errors));
    assert!(u.dropped > 0);
    assert!(u.in_flight_max <= 50);
    // Every failed request took its full deadline, not more.
    assert!((u.latency.min_ms - 1000.0).abs() < 1.0 && (u.latency.max_ms - 1000.0).abs() < 1.0);
    assert!(out.acked[0].is_empty());
    assert_eq!(out.stuck, 0);
}

#[test]
fn refusals_are_counted_by_kind() {
    let user = Scenario::user(50, Duration::from_secs(2), 1);
    let out = run_sim(spec(vec![user], Duration::from_secs(5)), Arc::new(Refusing));
    let u = &out.scenarios[0];
    assert_eq!((u.iterations, u.ok, u.errors), (100, 0, 100));
    assert_eq!(u.errors_by_kind.get("overloaded"), Some(&100));
    assert!(u.latency_failed.max_ms < 1.0);
}

#[test]
fn stages_change_the_rate() {
    let user = Scenario::user(1, Duration::ZERO, 1).with_stages(vec![
        Stage {
            duration: Duration::from_secs(2),
            rate: 50,
        },
        Stage {
            duration: Duration::from_secs(2),
            rate: 200,
        },
    ]);
    let out = run_sim(
        spec(vec![user], Duration::from_secs(5)),
        scripted(Some(Duration::from_millis(1))),
    );
    let u = &out.scenarios[0];
    assert_eq!(u.iterations, 500);
    let starts: Vec<u64> = u.windows.iter().map(|w| w.started).collect();
    assert_eq!(&starts[..4], &[50, 50, 200, 200]);
}
