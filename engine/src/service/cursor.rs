//! The per-(tree, peer) cursor that push and pull both keep: a position in
//! memory that only moves forward, and a durable copy written lazily
//! (docs/design.md §6). A lagging durable copy only costs re-sent or
//! re-pulled ops after a restart, which Apply and the pull's filter absorb;
//! writing it after every page cost a durable commit per page.

use super::Core;
use crate::error::Result;
use crate::forest::CursorKind;
use crate::runtime::blocking;
use crate::types::{ReplicaId, TreeKey};
use std::time::Duration;

/// How far (in heights) the position may run ahead of its durable copy
/// before the copy is written.
pub(super) const CURSOR_LAG_MAX: u64 = 512;

/// A lagging durable copy is written at the latest after this many
/// `replication_timeout`s, and not before `CURSOR_PERSIST_PERIOD_MIN`, so
/// that a quiet tree's resend or re-pull after a restart is bounded in time
/// too (`CURSOR_LAG_MAX` bounds it in ops). Each write is a durable commit
/// of its own.
const CURSOR_PERIODS: u32 = 16;
const CURSOR_PERSIST_PERIOD_MIN: Duration = Duration::from_secs(60);

/// How long a lagging durable copy may wait, for a `replication_timeout`.
pub(super) fn persist_period(replication_timeout: Duration) -> Duration {
    (replication_timeout * CURSOR_PERIODS).max(CURSOR_PERSIST_PERIOD_MIN)
}

/// A cursor over a peer's or this node's log: every height below
/// `position` is acknowledged (push) or applied here (pull).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LazyCursor {
    position: u64,
    /// The durable copy as last read or written.
    durable: u64,
    /// When this process last wrote the durable copy; `None`: not yet.
    persisted_at: Option<Duration>,
}

impl LazyCursor {
    /// A cursor as read from storage.
    pub fn loaded(durable: u64) -> Self {
        Self {
            position: durable,
            durable,
            persisted_at: None,
        }
    }

    pub fn position(&self) -> u64 {
        self.position
    }

    /// Moves the position to `to`. Moving back would hand out heights
    /// twice or lose them: a bug, not an input.
    pub fn advance(&mut self, to: u64) {
        assert!(
            to >= self.position,
            "cursor moved back from {} to {to}",
            self.position
        );
        self.position = to;
    }

    /// The position is ahead of the durable copy.
    pub fn lagging(&self) -> bool {
        self.position > self.durable
    }

    /// The lag has reached `CURSOR_LAG_MAX`: write at once.
    pub fn lag_exceeded(&self) -> bool {
        self.position - self.durable >= CURSOR_LAG_MAX
    }

    /// The durable copy was not written for `period` (or not yet).
    pub fn stale(&self, now: Duration, period: Duration) -> bool {
        self.persisted_at
            .is_none_or(|at| now.saturating_sub(at) >= period)
    }

    /// Whether the durable copy should be written now.
    pub fn persist_due(&self, now: Duration, period: Duration) -> bool {
        self.lagging() && (self.lag_exceeded() || self.stale(now, period))
    }

    /// Records that `value` was made durable at `now`.
    fn persisted(&mut self, value: u64, now: Duration) {
        assert!(
            value >= self.durable && value <= self.position,
            "durable cursor {value} outside {}..={}",
            self.durable,
            self.position
        );
        self.durable = value;
        self.persisted_at = Some(now);
    }

    /// An invariant every holder relies on: the durable copy never runs
    /// ahead of the position.
    fn check(&self) {
        assert!(
            self.durable <= self.position,
            "durable cursor {} ahead of {}",
            self.durable,
            self.position
        );
    }
}

/// Writes `cursor`'s position as the durable `kind` cursor of `(tree,
/// peer)`. The caller holds the tree's lock (a dropped tree's cursor is
/// never written back).
pub(super) async fn persist(
    core: &Core,
    tree: &TreeKey,
    kind: CursorKind,
    peer: ReplicaId,
    cursor: &mut LazyCursor,
) -> Result<()> {
    cursor.check();
    let forest = core.forest.clone();
    let key = tree.clone();
    let value = cursor.position;
    blocking(&*core.env.runtime, move || {
        forest.set_cursor(&key, kind, peer, value)
    })
    .await
    .inspect_err(|error| core.note_error(error))?;
    cursor.persisted(value, core.env.clock.now());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERIOD: Duration = Duration::from_secs(60);

    #[test]
    fn a_cursor_is_written_when_far_ahead_or_stale() {
        let mut cursor = LazyCursor::loaded(10);
        assert!(!cursor.lagging());
        assert!(!cursor.persist_due(Duration::ZERO, PERIOD));
        cursor.advance(12);
        // Never written by this process: due at once.
        assert!(cursor.persist_due(Duration::ZERO, PERIOD));
        cursor.persisted(12, Duration::from_secs(1));
        cursor.advance(20);
        assert!(!cursor.persist_due(Duration::from_secs(2), PERIOD));
        assert!(cursor.persist_due(Duration::from_secs(61), PERIOD));
        cursor.advance(12 + CURSOR_LAG_MAX);
        assert!(cursor.persist_due(Duration::from_secs(2), PERIOD));
    }

    #[test]
    fn the_lag_is_the_distance_from_the_durable_copy() {
        // Far from 0 both, one height apart: a small lag, however high.
        let mut cursor = LazyCursor::loaded(10 * CURSOR_LAG_MAX);
        cursor.advance(10 * CURSOR_LAG_MAX + 1);
        assert!(!cursor.lag_exceeded());
        cursor.persisted(10 * CURSOR_LAG_MAX + 1, Duration::from_secs(1));
        assert!(!cursor.persist_due(Duration::from_secs(2), PERIOD));
        cursor.advance(11 * CURSOR_LAG_MAX);
        assert!(!cursor.lag_exceeded());
        cursor.advance(11 * CURSOR_LAG_MAX + 1);
        assert!(cursor.lag_exceeded());
    }

    #[test]
    #[should_panic(expected = "cursor moved back")]
    fn a_cursor_never_moves_back() {
        let mut cursor = LazyCursor::loaded(10);
        cursor.advance(9);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn the_durable_copy_never_passes_the_position() {
        let mut cursor = LazyCursor::loaded(10);
        cursor.persisted(11, Duration::ZERO);
    }

    #[test]
    fn the_period_has_a_floor() {
        assert_eq!(
            persist_period(Duration::from_secs(1)),
            CURSOR_PERSIST_PERIOD_MIN
        );
        assert_eq!(
            persist_period(Duration::from_secs(10)),
            Duration::from_secs(160)
        );
    }
}
