//! `Hello`: the first frame of an outbound connection, in which the caller
//! says which cluster it belongs to and, for a node, which replica it is
//! (docs/design.md §9). The receiver refuses a foreign cluster, its own
//! replica id (two nodes configured with one id would otherwise diverge
//! silently), an id that is not a configured peer, and an id that differs
//! from the one the caller's certificate names. The caller checks the
//! answer in turn (`tcp`), so a misconfiguration is refused on both sides.
//!
//! This is a pure function of the configuration and the caller, so the
//! simulator and test handlers answer `Hello` with the same code.

use crate::config::NodeConfig;
use crate::error::{Error, Result};
use crate::identity::Caller;
use crate::proto::Response;
use crate::types::ReplicaId;
use std::sync::atomic::Ordering;

impl super::Service {
    /// Answers `Hello`; a refusal is logged with the caller and counted.
    pub(super) fn hello(
        &self,
        caller: &Caller,
        cluster_id: &str,
        claim: Option<ReplicaId>,
    ) -> Response {
        match answer(&self.core.config.node, caller, cluster_id, claim) {
            Ok(response) => response,
            Err(error) => {
                self.core.hellos_refused.fetch_add(1, Ordering::Relaxed);
                tracing::error!(%caller, %error, "Hello refused");
                Response::Error(error)
            }
        }
    }
}

/// The answer to `Hello { cluster_id, replica_id: claim }` from `caller`,
/// or why it is refused.
pub fn answer(
    node: &NodeConfig,
    caller: &Caller,
    cluster_id: &str,
    claim: Option<ReplicaId>,
) -> Result<Response> {
    let refuse = |why: String| Err(Error::IdentityRefused(why));
    if cluster_id != node.cluster_id {
        return refuse(format!(
            "caller is of cluster {cluster_id:?}, this node of {:?}",
            node.cluster_id
        ));
    }
    if let Some(id) = claim {
        if id == node.replica_id {
            return refuse(format!(
                "caller claims replica {id}, this node's own id: two nodes share one node.replica_id"
            ));
        }
        if !node.peers.iter().any(|p| p.replica_id == id) {
            return refuse(format!("caller claims replica {id}, not a configured peer"));
        }
        match caller {
            Caller::Peer(named) if *named != id => {
                return refuse(format!(
                    "caller claims replica {id}, its certificate names replica {named}"
                ))
            }
            Caller::Client(name) => {
                return refuse(format!(
                    "client {name:?} claims replica {id}: its certificate names no replica"
                ))
            }
            Caller::Key(key) => {
                return refuse(format!(
                    "key {key} claims replica {id}: replicas say who they are by certificate"
                ))
            }
            _ => {}
        }
    }
    Ok(Response::Hello {
        cluster_id: node.cluster_id.clone(),
        replica_id: node.replica_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PeerConfig;

    fn node() -> NodeConfig {
        let mut node = NodeConfig::solo(2);
        node.cluster_id = "c".into();
        node.peers = vec![PeerConfig::new(3, "127.0.0.1:1")];
        node
    }

    #[test]
    fn a_configured_peer_of_the_cluster_is_answered() {
        let ok = Response::Hello {
            cluster_id: "c".into(),
            replica_id: 2,
        };
        for caller in [Caller::Anonymous, Caller::Peer(3)] {
            assert_eq!(answer(&node(), &caller, "c", Some(3)), Ok(ok.clone()));
        }
        let client = Caller::Client("gw".into());
        assert_eq!(answer(&node(), &client, "c", None), Ok(ok));
    }

    #[test]
    fn every_wrong_claim_is_refused() {
        let cases = [
            (Caller::Anonymous, "other", Some(3)),
            (Caller::Anonymous, "other", None),
            (Caller::Anonymous, "c", Some(2)),
            (Caller::Anonymous, "c", Some(4)),
            (Caller::Peer(3), "c", Some(4)),
            (Caller::Peer(4), "c", Some(3)),
            (Caller::Client("gw".into()), "c", Some(3)),
        ];
        for (caller, cluster, claim) in cases {
            let got = answer(&node(), &caller, cluster, claim);
            assert!(
                matches!(got, Err(Error::IdentityRefused(_))),
                "{caller} {cluster} {claim:?}: {got:?}"
            );
        }
    }
}
