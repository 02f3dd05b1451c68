//! The engine's view of time and task scheduling. Production uses the system
//! clock and tokio; the simulator plugs in madsim time (with per-node skew)
//! and its executor. The engine itself never names either.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A source of time for one node.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic time since an origin fixed when the clock was made. A
    /// simulated clock may add a per-node offset and drift, but never goes
    /// backwards.
    fn now(&self) -> Duration;

    /// Completes once `duration` has passed on this clock.
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()>;
}

/// Task spawning and blocking work for one node.
pub trait Runtime: Send + Sync + 'static {
    /// Runs a background task until it completes or the node stops.
    fn spawn(&self, name: &'static str, task: BoxFuture<'static, ()>);

    /// Runs blocking storage work (a redb write transaction) without stalling
    /// the async executor. Production hands it to a blocking thread; the
    /// simulator runs it inline and then sleeps for the simulated disk time it
    /// consumed.
    fn run_blocking(&self, work: Box<dyn FnOnce() + Send + 'static>) -> BoxFuture<'static, ()>;

    /// A log epoch for a database created now: a number this replica's
    /// databases never had before, so that a peer can tell a log rebuilt on
    /// a replaced disk from the one it pulled (docs/design.md §6).
    /// Production draws it at random; the simulator derives it from the
    /// seed's time.
    fn log_epoch_fresh(&self) -> u64;
}

/// Runs `work` through `runtime.run_blocking` and returns its result.
pub async fn blocking<R, F>(runtime: &dyn Runtime, work: F) -> R
where
    R: Send + 'static,
    F: FnOnce() -> R + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    runtime
        .run_blocking(Box::new(move || {
            let _ = tx.send(work());
        }))
        .await;
    // The closure always runs to completion before run_blocking resolves; a
    // missing result means the work panicked, which must not be hidden.
    rx.await.expect("blocking work panicked")
}

/// Waits for `fut` at most `timeout` on `clock`; `None` when it ran out.
pub async fn with_timeout<T>(
    clock: &dyn Clock,
    timeout: Duration,
    fut: impl Future<Output = T>,
) -> Option<T> {
    let sleep = clock.sleep(timeout);
    futures::pin_mut!(fut);
    match futures::future::select(fut, sleep).await {
        futures::future::Either::Left((value, _)) => Some(value),
        futures::future::Either::Right(((), _)) => None,
    }
}

/// Shared handles to the environment a node runs in.
#[derive(Clone)]
pub struct Env {
    pub clock: Arc<dyn Clock>,
    pub runtime: Arc<dyn Runtime>,
}

/// Waits for `fut` until `deadline` (a reading of `clock`); `None` when it
/// passed first. The future is polled once even at a passed deadline.
pub async fn until<T>(
    clock: &dyn Clock,
    deadline: Duration,
    fut: impl Future<Output = T>,
) -> Option<T> {
    with_timeout(clock, deadline.saturating_sub(clock.now()), fut).await
}
