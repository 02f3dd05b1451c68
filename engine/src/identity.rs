//! Who is calling: the identity a transport established for a request.
//! The transport authenticates (a TLS certificate in production, the
//! simulated network's source address in simulation); the service decides
//! what that identity may do (docs/design.md §9).

use crate::canary::{self, Canary};
use crate::tls::CertIdentity;
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

/// Who dialled a call, for checking who answered it.
#[derive(Clone, Copy, Debug)]
pub struct Dialler<'a> {
    /// The cluster this end belongs to.
    pub cluster_id: &'a str,
    /// This end's replica id; `None` for a client.
    pub own: Option<ReplicaId>,
    /// The replica the call was meant for; `None` when it was dialled by
    /// address alone.
    pub expect: Option<ReplicaId>,
}

/// The one rule for the identity that answers a dialled call, whatever
/// named it (a server's certificate, a `Hello` answer, the replica id a
/// simulated answer carries): a replica of this cluster, the replica
/// dialled when one was, and not this replica itself (two nodes sharing
/// one `node.replica_id`). `Err` says why not, naming `named`.
pub fn check_answerer(dialler: &Dialler<'_>, named: &CertIdentity) -> Result<(), String> {
    let (cluster_id, replica_id) = match named {
        CertIdentity::Client { .. } => return Err(format!("{named} is a client, not a replica")),
        CertIdentity::Replica {
            cluster_id,
            replica_id,
        } => (cluster_id, *replica_id),
    };
    if cluster_id != dialler.cluster_id {
        return Err(format!(
            "{named} is of cluster {cluster_id:?}, not {:?}",
            dialler.cluster_id
        ));
    }
    // Planted bug: whoever answers is taken for the replica dialled.
    if canary::active(Canary::PeerIdentityUnchecked) {
        return Ok(());
    }
    if let Some(expect) = dialler.expect.filter(|&e| e != replica_id) {
        return Err(format!(
            "{named} answered where replica {expect} was dialled"
        ));
    }
    if dialler.own == Some(replica_id) {
        return Err(format!(
            "{named} is this node's own id: two nodes share one node.replica_id"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(cluster_id: &str, replica_id: ReplicaId) -> CertIdentity {
        CertIdentity::Replica {
            cluster_id: cluster_id.into(),
            replica_id,
        }
    }

    /// Each rule refuses on its own, with its reason; what passes every
    /// rule is taken.
    #[test]
    fn the_answerer_must_be_the_replica_dialled_of_this_cluster_and_not_this_one() {
        let dialler = Dialler {
            cluster_id: "c",
            own: Some(1),
            expect: Some(2),
        };
        let client = CertIdentity::Client {
            cluster_id: "c".into(),
            name: "gw".into(),
        };
        let refusals = [
            (client, "is a client"),
            (replica("other", 2), "of cluster \"other\""),
            (replica("c", 3), "where replica 2 was dialled"),
        ];
        for (named, why) in refusals {
            let refused = check_answerer(&dialler, &named).unwrap_err();
            assert!(refused.contains(why), "{named}: {refused}");
        }
        assert_eq!(check_answerer(&dialler, &replica("c", 2)), Ok(()));

        // Dialled by address: any replica but this one.
        let by_address = Dialler {
            expect: None,
            ..dialler
        };
        assert_eq!(check_answerer(&by_address, &replica("c", 3)), Ok(()));
        let own = check_answerer(&by_address, &replica("c", 1)).unwrap_err();
        assert!(own.contains("share one node.replica_id"), "{own}");
        // A client dialling checks no own id.
        let client_end = Dialler {
            own: None,
            ..by_address
        };
        assert_eq!(check_answerer(&client_end, &replica("c", 1)), Ok(()));
    }
}
