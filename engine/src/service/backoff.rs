//! The one retry schedule of the service: pushes that failed and reopens of
//! a failed database wait by it.

use std::time::Duration;

/// The wait after the `failures`-th failure in a row: doubling from 1/32 of
/// `cap` (at least a millisecond), never above `cap`.
pub(super) fn backoff(failures: u32, cap: Duration) -> Duration {
    assert!(failures >= 1, "a backoff follows a failure");
    let base = (cap / 32).max(Duration::from_millis(1));
    base.saturating_mul(1u32 << (failures.min(16) - 1)).min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap() {
        let cap = Duration::from_millis(3200);
        let waits: Vec<u128> = (1..=8).map(|n| backoff(n, cap).as_millis()).collect();
        assert_eq!(waits, vec![100, 200, 400, 800, 1600, 3200, 3200, 3200]);
        assert_eq!(backoff(u32::MAX, cap), cap);
        assert_eq!(
            backoff(1, Duration::from_micros(5)),
            Duration::from_micros(5)
        );
    }
}
