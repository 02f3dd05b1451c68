//! Clocks and task spawners for the load generator itself: wall time and
//! tokio in real mode, madsim time and tasks in sim mode. The nodes under
//! test get theirs from the engine (`arbor::system`) or the sim world.

use arbor::runtime::{BoxFuture, Clock, Env, Runtime};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Wall time; `sleep` needs a tokio runtime with timers.
pub struct WallClock {
    origin: Instant,
}

impl WallClock {
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for WallClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for WallClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// Spawns onto a tokio runtime (worker threads) and its blocking pool.
pub struct TokioSpawner {
    handle: tokio::runtime::Handle,
}

impl TokioSpawner {
    pub fn new(handle: tokio::runtime::Handle) -> Self {
        Self { handle }
    }
}

impl Runtime for TokioSpawner {
    fn spawn(&self, _name: &'static str, task: BoxFuture<'static, ()>) {
        self.handle.spawn(task);
    }

    fn run_blocking(&self, work: Box<dyn FnOnce() + Send + 'static>) -> BoxFuture<'static, ()> {
        let join = self.handle.spawn_blocking(work);
        Box::pin(async move {
            if let Err(e) = join.await {
                std::panic::resume_unwind(e.into_panic());
            }
        })
    }
}

/// The generator's environment in real mode.
pub fn wall_env(handle: tokio::runtime::Handle) -> Env {
    Env {
        clock: Arc::new(WallClock::new()),
        runtime: Arc::new(TokioSpawner::new(handle)),
    }
}

/// madsim's global simulated time (the generator needs no skew).
pub struct SimClock {
    origin: Instant,
}

impl SimClock {
    /// Must be called inside a madsim runtime.
    pub fn new() -> Self {
        Self {
            origin: madsim::time::Instant::now(),
        }
    }
}

impl Default for SimClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SimClock {
    fn now(&self) -> Duration {
        madsim::time::Instant::now().duration_since(self.origin)
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(madsim::time::sleep(duration))
    }
}

/// Spawns madsim tasks on the current simulated node; blocking work runs
/// inline (there are no threads in a simulation).
pub struct SimSpawner;

impl Runtime for SimSpawner {
    fn spawn(&self, _name: &'static str, task: BoxFuture<'static, ()>) {
        madsim::task::spawn(task);
    }

    fn run_blocking(&self, work: Box<dyn FnOnce() + Send + 'static>) -> BoxFuture<'static, ()> {
        work();
        Box::pin(async {})
    }
}

/// The generator's environment in sim mode (inside a madsim runtime).
pub fn sim_env() -> Env {
    Env {
        clock: Arc::new(SimClock::new()),
        runtime: Arc::new(SimSpawner),
    }
}
