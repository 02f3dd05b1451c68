//! The engine's task runtime inside the simulation: madsim tasks, and
//! blocking storage work run inline followed by the simulated disk time.

use arbor::runtime::{BoxFuture, Runtime};
use std::sync::Arc;
use std::time::Duration;

/// Reports (and resets) the disk time the last storage work consumed.
pub type LatencySource = Arc<dyn Fn() -> Duration + Send + Sync>;

pub struct SimRuntime {
    disk_latency: Option<LatencySource>,
}

impl SimRuntime {
    pub fn new(disk_latency: Option<LatencySource>) -> Self {
        Self { disk_latency }
    }
}

impl Runtime for SimRuntime {
    fn spawn(&self, _name: &'static str, task: BoxFuture<'static, ()>) {
        // Spawned on the current madsim node, so a node kill drops it.
        drop(madsim::task::spawn(task));
    }

    fn run_blocking(&self, work: Box<dyn FnOnce() + Send + 'static>) -> BoxFuture<'static, ()> {
        let latency = self.disk_latency.clone();
        Box::pin(async move {
            // Inline: a simulation may not start OS threads, and running the
            // work inside this poll keeps it on the seed's schedule.
            work();
            let spent = latency.map(|take| take()).unwrap_or_default();
            if !spent.is_zero() {
                madsim::time::sleep(spent).await;
            }
        })
    }

    fn log_epoch_fresh(&self) -> u64 {
        // The simulated wall clock: seeded, and later for every new
        // database of a replica (a rebuild follows the disk's loss). Not a
        // draw from the seed's generator, which would shift every seed.
        let wall = madsim::time::TimeHandle::current()
            .now_time()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        wall.as_nanos() as u64
    }
}
