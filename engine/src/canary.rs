//! Deliberately planted bugs, compiled only with the `canary` feature. Only
//! `arbor-engine-sim` (the same sources built for the simulator) has that
//! feature; the `arbor-engine` package, whose library the node binary links,
//! does not declare it, so no build command can plant them in a node. The
//! simulator switches one on at run time and proves that its checkers catch
//! it. Without the feature every query is a constant `false` and the
//! optimiser removes the planted code paths.

/// The planted bugs, each reproducing a real class of failure. `ALL` lists
/// them in declaration order; `<&str>::from` gives the snake_case name of
/// the test in sim-tests/tests/canary.rs that covers each.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    strum::VariantArray,
    strum::IntoStaticStr,
)]
#[strum(serialize_all = "snake_case")]
#[repr(u8)]
pub enum Canary {
    /// Replication drops ops when its queue is full.
    ReplicationDropsOnFullQueue = 1,
    /// One sync cursor shared by all peers.
    SharedSyncCursor = 2,
    /// Redo keeps stale undo information.
    StaleUndoOnRedo = 3,
    /// An op older than the whole log is re-applied from the wrong position.
    OldOpWrongPosition = 4,
    /// A failed batch leaves its callers waiting.
    FailedBatchHangs = 5,
    /// Sync drops a tree on a transient peer error.
    SyncDropsTreeOnPeerError = 6,
    /// Path resolution picks a duplicate directory by arrival order.
    PathByArrivalOrder = 7,
    /// The service serves every caller everything (no rights checked,
    /// Apply's origin not checked).
    AuthorizationSkipped = 8,
    /// A pull pass whose page failed to apply moves its cursor past it.
    PullCursorPastFailedPage = 9,
    /// The pull cursor is made durable before the page it covers.
    PullCursorPersistedEarly = 10,
    /// GetSubTree descends one level deeper than asked.
    SubtreeDepthOffByOne = 11,
    /// Two callers of one commit get each other's results (same kind).
    ResultsToWrongCallers = 12,
    /// A move of an existing node is logged but does not move it.
    MovesNoOp = 13,
    /// A write refused with a definite error is applied anyway.
    DefiniteFailureApplied = 14,
    /// A drop keeps the dropped tree's pull cursors in memory: the tree
    /// created again passes over peers' ops it no longer holds.
    DropKeepsPullCursors = 15,
    /// A tree created again after a drop starts its counter and heights
    /// from zero: its stamps repeat the dropped incarnation's, and peers'
    /// pull cursors of the old log pass over its first ops.
    DropForgetsMarks = 16,
    /// A node takes a peer for the replica it dialled whatever replica id
    /// the peer names (its `Hello` answer, its sync check): a process
    /// claiming another replica's id hands out its ops.
    PeerIdentityUnchecked = 17,
    /// A node rejoining after its disk was replaced takes local writes
    /// before it pulled its peers' logs: its new stamps repeat ones its
    /// lost disk gave to other ops.
    RejoinAcceptsWrites = 18,
    /// A replica pulling a tree it does not hold yet (a joiner of its
    /// container) stops pulling it from that peer after the first page,
    /// for as long as the process lives.
    JoinerStopsAfterFirstPage = 19,
    /// A drop leaves the directory cache as it was, and a tree created
    /// again under the same name takes back its dropped incarnation's
    /// number: cached directory lookups of the old incarnation resolve
    /// paths of the new one.
    DropKeepsDirCache = 20,
    /// With `tree.ack_replicas` 2 or more, a local write is answered on
    /// its local commit alone, before any peer acknowledged it.
    AckBeforeReplicas = 21,
    /// A batch's write-ahead log record is written but not synced before
    /// the batch commits and is answered: a power failure loses writes
    /// that were acknowledged.
    WalAckBeforeSync = 22,
    /// A batch's transaction does not store the log position its record
    /// reaches, so the checkpoints after it (durable commits of the
    /// batcher or of a cursor, a drop) name an older one: the next open
    /// replays records the database already holds.
    CheckpointWithoutPosition = 23,
    /// GetNodeByPath with latest_only answers the oldest version of a
    /// key (the smallest meta time) instead of the newest.
    LatestPicksOldest = 24,
    /// Moving a directory away from its parent (a Move elsewhere, a
    /// Remove) leaves the directory cache's lookup of it in place: a later
    /// AddByPath on that replica puts its leaf under the moved directory.
    DirCacheKeptOnMove = 25,
    /// A node read counts its answer against an eighth of its byte
    /// budget: answers that fit the budget are refused as too large.
    AnswerBudgetEighth = 26,
    /// `Drop` asks for the writer role instead of the owner's: a writer
    /// may drop trees and whole containers.
    WriterMayDrop = 27,
    /// A replica of any container counts as a replica of every one: it
    /// may push ops into and read the logs of containers it does not hold.
    ReplicaOfAnyContainer = 28,
    /// `Remove` of a node the tree does not hold answers `Done` instead of
    /// `NodeNotFound`: the caller believes it removed something.
    RemoveMissingDone = 29,
    /// A server connection closed to make room for a new one keeps its
    /// connection slot: every eviction leaves the server one slot fewer,
    /// until it refuses every connection.
    EvictedSlotKept = 30,
    /// A call of any kind that fails on a pooled connection is sent again
    /// on a fresh one: a write whose connection broke after the peer took
    /// it is applied twice.
    RetriesAnyCall = 31,
    /// The gRPC front's GetSubTree stream loses the first node of every
    /// page after the first: a listing longer than one page misses nodes
    /// that the service's own pages hold.
    StreamSkipsPageStart = 32,
    /// A frame whose connection breaks while its body is read keeps the
    /// frame budget it reserved: every broken large frame leaves the
    /// server less room, until it refuses every large frame.
    BrokenFrameKeepsBudget = 33,
}

impl Canary {
    /// Every canary, in declaration order.
    pub const ALL: &'static [Canary] = <Canary as strum::VariantArray>::VARIANTS;
}

#[cfg(feature = "canary")]
mod imp {
    use super::Canary;
    use std::sync::atomic::{AtomicU8, Ordering};

    /// Whether the planted bugs are compiled in.
    pub const COMPILED: bool = true;

    static ACTIVE: AtomicU8 = AtomicU8::new(0);

    /// Switches one canary on (or all off with `None`) for this process.
    pub fn set(canary: Option<Canary>) {
        ACTIVE.store(canary.map_or(0, |c| c as u8), Ordering::SeqCst);
    }

    pub fn active(canary: Canary) -> bool {
        ACTIVE.load(Ordering::Relaxed) == canary as u8
    }
}

#[cfg(not(feature = "canary"))]
mod imp {
    use super::Canary;

    /// Whether the planted bugs are compiled in.
    pub const COMPILED: bool = false;

    #[inline(always)]
    pub fn active(_canary: Canary) -> bool {
        false
    }
}

pub use imp::*;

#[cfg(test)]
mod tests {
    use super::Canary;

    /// `ALL` holds each canary once, and its number (0 is "none on") is
    /// its place in the list counted from 1.
    #[test]
    fn all_lists_every_canary_by_number() {
        for (i, &canary) in Canary::ALL.iter().enumerate() {
            assert_eq!(canary as usize, i + 1, "{canary:?}");
        }
        assert_eq!(<&str>::from(Canary::MovesNoOp), "moves_no_op");
    }
}
