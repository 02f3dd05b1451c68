//! A node's clock in the simulated world. madsim has one global clock, so a
//! node's skew (a fixed offset plus a drift rate) lives here.

use arbor::runtime::{BoxFuture, Clock};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Largest drift the simulator draws, in parts per million. Real quartz
/// drifts tens of ppm; a larger bound stresses timeouts harder.
pub const DRIFT_PPM_MAX: i64 = 5_000;

/// How one node's clock deviates from the global simulated time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClockSkew {
    /// Added to every reading.
    pub offset: Duration,
    /// Rate error in parts per million; positive runs fast. Bounded by
    /// `DRIFT_PPM_MAX` in absolute value.
    pub drift_ppm: i64,
}

/// A skewed view of madsim's global time. It is shared across restarts of a
/// node, like a hardware clock that keeps running through a crash.
#[derive(Debug)]
pub struct SimClock {
    skew: ClockSkew,
    /// The largest value handed out, in nanoseconds: readings never go back.
    last_nanos: AtomicU64,
}

impl SimClock {
    pub fn new(skew: ClockSkew) -> Self {
        assert!(skew.drift_ppm.abs() <= DRIFT_PPM_MAX, "drift out of bounds");
        Self {
            skew,
            last_nanos: AtomicU64::new(0),
        }
    }

    pub fn skew(&self) -> ClockSkew {
        self.skew
    }

    /// Local duration -> global duration that passes meanwhile.
    fn to_global(&self, local: Duration) -> Duration {
        let rate = 1_000_000 + self.skew.drift_ppm;
        let nanos = local.as_nanos() * 1_000_000 / rate as u128;
        Duration::from_nanos(nanos.min(u64::MAX as u128) as u64)
    }

    fn to_local(&self, global: Duration) -> Duration {
        let rate = 1_000_000 + self.skew.drift_ppm;
        let nanos = global.as_nanos() * rate as u128 / 1_000_000;
        self.skew.offset + Duration::from_nanos(nanos.min(u64::MAX as u128) as u64)
    }
}

/// Global simulated time since the simulation started.
pub fn global_now() -> Duration {
    madsim::time::TimeHandle::current().elapsed()
}

impl Clock for SimClock {
    fn now(&self) -> Duration {
        let local = self.to_local(global_now()).as_nanos() as u64;
        let previous = self.last_nanos.fetch_max(local, Ordering::Relaxed);
        Duration::from_nanos(previous.max(local))
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(madsim::time::sleep(self.to_global(duration)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_clock_sleeps_less_global_time() {
        let clock = SimClock::new(ClockSkew {
            offset: Duration::from_secs(3),
            drift_ppm: 1_000,
        });
        let global = clock.to_global(Duration::from_secs(1001));
        assert_eq!(global, Duration::from_secs(1000));
        assert_eq!(
            clock.to_local(Duration::from_secs(1000)),
            Duration::from_secs(1004)
        );
    }

    #[test]
    fn readings_never_go_back() {
        let rt = madsim::runtime::Runtime::with_seed_and_config(1, Default::default());
        rt.block_on(async {
            let clock = SimClock::new(ClockSkew {
                offset: Duration::from_millis(5),
                drift_ppm: -DRIFT_PPM_MAX,
            });
            let mut previous = clock.now();
            for _ in 0..50 {
                clock.sleep(Duration::from_millis(7)).await;
                let now = clock.now();
                assert!(now >= previous);
                previous = now;
            }
            assert!(previous >= Duration::from_millis(5 + 50 * 7));
        });
    }
}
