//! Code probes: branches of the engine that a bug can hide in and that a test
//! workload reaches only if its sizes and faults are drawn to reach them
//! (a second page, a page cut by its byte budget, a refusal at a bound).
//! The engine marks each with `probe::hit`; the simulator reads the counts
//! of a run and proves that every profile reaches the branches it claims.
//!
//! Compiled only with the `probes` feature, which only `arbor-engine-sim`
//! (the simulator's build of these sources) declares; without it `hit` is
//! an empty inline function. With it the
//! counts are per thread: a simulated run executes on one thread, so the
//! runs of a sweep on several threads keep apart.

/// A branch worth proving reached. The simulator names each by its variant
/// name (`arbor_sim::coverage`).
///
/// A probe's number (`probe as usize`) is its place in `Probe::ALL` and its
/// index in `ProbeCounts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, strum::VariantArray)]
#[repr(usize)]
pub enum Probe {
    /// A pull pass fetched a second page of a peer's stamps.
    PullStampPageNext,
    /// A run of missing heights needed a second `GetOpLog` page.
    PullOpPageNext,
    /// One stamp page held more than one run of missing heights.
    PullSeveralRuns,
    /// A pull cursor made durable in the middle of a pass (its lag bound).
    PullCursorPersistedByLag,
    /// A `GetOpLog` answer cut short by the answer byte budget.
    OpLogCutByBytes,
    /// A `GetOpLogStamps` answer whose page the byte budget made smaller
    /// than `limits.sync_stamp_page_size`.
    StampsCutByBytes,
    /// A push page cut short by the answer byte budget.
    PushCutByBytes,
    /// A write refused with `Overloaded` because `limits.max_pending_writes`
    /// writes waited for the batcher.
    AdmissionRefused,
    /// A local write refused with `Overloaded` because
    /// `limits.max_pending_writes` writes already waited for
    /// `tree.ack_replicas` replicas.
    AwaitingReplicasFull,
    /// A replicated op refused as `CounterTooFar`.
    CounterTooFar,
    /// A directory lookup answered by the cache in a tree where an
    /// undo/redo pass ran since the cache was last emptied.
    DirCacheHitAfterUndo,
    /// A latest-only path lookup that chose among several nodes of the name.
    LatestAmongSeveral,
    /// A read refused because its answer would exceed its byte or count
    /// bound.
    AnswerTooLarge,
    /// A TCP server's answer that its client did not take within the frame
    /// timeout (it stopped reading): the connection was closed.
    AnswerTimedOut,
}

impl Probe {
    /// Every probe, in declaration order.
    pub const ALL: &'static [Probe] = <Probe as strum::VariantArray>::VARIANTS;
}

/// Counts of every probe, in the order of `Probe::ALL`.
pub type ProbeCounts = [u64; Probe::ALL.len()];

#[cfg(feature = "probes")]
mod imp {
    use super::{Probe, ProbeCounts};
    use std::cell::RefCell;

    /// Whether probes are compiled in.
    pub const ENABLED: bool = true;

    thread_local! {
        static COUNTS: RefCell<ProbeCounts> = const { RefCell::new([0; Probe::ALL.len()]) };
    }

    pub fn hit(probe: Probe) {
        COUNTS.with(|counts| counts.borrow_mut()[probe as usize] += 1);
    }

    /// This thread's counts, which start again from 0.
    pub fn take() -> ProbeCounts {
        COUNTS.with(|counts| std::mem::take(&mut *counts.borrow_mut()))
    }
}

#[cfg(not(feature = "probes"))]
mod imp {
    use super::{Probe, ProbeCounts};

    /// Whether probes are compiled in.
    pub const ENABLED: bool = false;

    #[inline(always)]
    pub fn hit(_probe: Probe) {}

    /// Always zero: probes are not compiled in.
    pub fn take() -> ProbeCounts {
        [0; Probe::ALL.len()]
    }
}

pub use imp::*;

#[cfg(test)]
mod tests {
    use super::Probe;

    /// `hit` indexes the counts by a probe's number: it must be the
    /// probe's place in `ALL`. (Counting itself is tested where probes are
    /// compiled in: sim-tests/tests/planted.rs.)
    #[test]
    fn a_probe_number_is_its_place_in_all() {
        for (i, &probe) in Probe::ALL.iter().enumerate() {
            assert_eq!(probe as usize, i, "{probe:?}");
        }
    }
}
