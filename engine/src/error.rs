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
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// True for errors where retrying the same request later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Overloaded(_)
                | Error::Timeout
                | Error::Storage(_)
                | Error::Network(_)
                | Error::ShuttingDown
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
