//! Who is calling: the identity a transport established for a request.
//! The transport authenticates (a TLS certificate in production, the
//! simulated network's source address in simulation); the service decides
//! what that identity may do (docs/design.md §9).

use crate::types::ReplicaId;
use std::fmt;

/// The authenticated caller of one request.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Caller {
    /// A replica of this cluster, by its stable replica id.
    Peer(ReplicaId),
    /// A client, by the name its credentials carry.
    Client(String),
    /// A caller of the gRPC front, by the public key that signed its
    /// request: 66 lowercase hex digits of the compressed P-256 key.
    Key(String),
    /// Nobody the transport could authenticate (a plaintext connection).
    Anonymous,
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Caller::Peer(id) => write!(f, "replica {id}"),
            Caller::Client(name) => write!(f, "client {name:?}"),
            Caller::Key(hex) => write!(f, "key {hex}"),
            Caller::Anonymous => f.write_str("anonymous"),
        }
    }
}
