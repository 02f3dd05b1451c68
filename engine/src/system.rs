//! Production Clock and Runtime: the system clock and tokio. The only place
//! (with `tcp` and the binary) where the engine touches real time and the
//! tokio executor; everything else sees them through `runtime::Env`.

use crate::runtime::{BoxFuture, Clock, Env, Runtime};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Monotonic wall time since the clock was made.
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// Tasks on the ambient tokio runtime; blocking work on its blocking pool.
/// Must be used from inside a tokio runtime.
#[derive(Default)]
pub struct TokioRuntime;

impl Runtime for TokioRuntime {
    fn spawn(&self, name: &'static str, task: BoxFuture<'static, ()>) {
        tracing::trace!(task = name, "spawn");
        tokio::spawn(task);
    }

    fn run_blocking(&self, work: Box<dyn FnOnce() + Send + 'static>) -> BoxFuture<'static, ()> {
        let handle = tokio::task::spawn_blocking(work);
        Box::pin(async move {
            // A panic in the work is surfaced by `runtime::blocking`, which
            // finds its result channel closed.
            let _ = handle.await;
        })
    }
}

/// The production environment: system clock and tokio.
pub fn system_env() -> Env {
    Env {
        clock: Arc::new(SystemClock::new()),
        runtime: Arc::new(TokioRuntime),
    }
}
