//! Typed errors. Operating errors (bad input, full queues, I/O, timeouts) are
//! values; broken internal invariants panic so the simulator sees them.

use serde::{Deserialize, Serialize};

/// Everything the engine and the service can refuse or fail with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum Error {
    #[error("tree not found")]
    TreeNotFound,
    #[error("node {0} not found")]
    NodeNotFound(u64),
    #[error("attribute {0:?} is not the path attribute FileName")]
    UnsupportedAttribute(String),
    #[error("empty path")]
    EmptyPath,
    #[error("the root node cannot be moved or removed")]
    RootImmutable,
    #[error("invalid op: {0}")]
    InvalidOp(String),
    #[error("request too large: {what} is {size}, limit {limit}")]
    TooLarge { what: String, size: u64, limit: u64 },
    #[error("malformed input: {0}")]
    Malformed(String),
    #[error("overloaded: {0}")]
    Overloaded(String),
    #[error("timed out")]
    Timeout,
    #[error("storage error: {0}")]
    Storage(String),
    #[error("network error: {0}")]
    Network(String),
    #[error("node is shutting down")]
    ShuttingDown,
    #[error("this node does not hold container {0}")]
    NotReplica(String),
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The other end of a connection is not who it must be: a certificate
    /// or `Hello` naming another cluster, another replica than the one
    /// dialled, this node's own replica id, or no configured peer.
    #[error("identity refused: {0}")]
    IdentityRefused(String),
    /// The caller's identity does not hold the right this request needs
    /// (docs/design.md §9). Nothing was done, and nothing about the
    /// container or its trees was looked at.
    #[error("permission denied: {caller} may not {operation}")]
    PermissionDenied { operation: String, caller: String },
    /// A pushed op whose counter is more than `limits.counter_jump_max`
    /// ahead of the tree's: refused until the tree has caught up.
    #[error("counter {counter} is more than {limit} ahead of the tree's counter {known}")]
    CounterTooFar {
        counter: u64,
        known: u64,
        limit: u64,
    },
    /// Two different ops under one timestamp: the replicas that hold them
    /// can never agree by themselves (docs/design.md §2).
    #[error("timestamp {0} is already used by a different op")]
    StampConflict(u64),
    /// A local Add or Move under a parent that is removed (in `TRASH`) or
    /// that no path from `ROOT` reaches.
    #[error("parent {0} is removed or not reachable from the root")]
    ParentNotLive(u64),
    /// A peer answered as another replica than the one it is configured
    /// as: a misconfigured replica id (docs/design.md §9).
    #[error("peer configured as replica {expected} answers as replica {answered}")]
    WrongPeer { expected: u16, answered: u16 },
    /// This node's disk was replaced (`node.rejoin`) and it has not yet
    /// pulled every peer's log to the end: it takes no local write until
    /// then, so that its stamps stay above the ones its lost disk gave
    /// (docs/design.md §6). Nothing was done; retry later or elsewhere.
    #[error("rejoining: no local writes until every peer's log is pulled")]
    Rejoining,
    /// A local write committed on the node that took it, but fewer than
    /// `needed` replicas (`tree.ack_replicas`) held it within
    /// `tree.replication_timeout`: `held` did. It is durable there and
    /// keeps replicating, so to the caller it is maybe applied, like a
    /// `Timeout` (docs/design.md §6).
    #[error("stored on {held} of the {needed} replicas required; it keeps replicating")]
    NotReplicated { held: u32, needed: u32 },
    /// A listing's continuation that does not continue this listing (another
    /// root, parent, order or depth, or a name key no page gives), or
    /// whose place moved or left the listed subtree since its page was
    /// read (docs/design.md §4): continuing would skip or repeat nodes.
    /// Start the listing again.
    #[error("listing continuation refused: {0}")]
    CursorRefused(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// True for errors where retrying the same request later may succeed.
    /// An op refused as `CounterTooFar` is accepted once the tree has
    /// caught up with the ops between (docs/design.md §9).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Overloaded(_)
                | Error::CounterTooFar { .. }
                | Error::Timeout
                | Error::Storage(_)
                | Error::Network(_)
                | Error::ShuttingDown
                | Error::Rejoining
                | Error::NotReplicated { .. }
        )
    }
}

macro_rules! storage_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self {
                Error::Storage(e.to_string())
            }
        }
    )*};
}

storage_from!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);
