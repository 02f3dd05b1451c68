//! Which replicas hold which containers, from the configuration alone
//! (docs/design.md §6): built once at start, so that a push or a sync asks
//! for a container's peers without building a set each time.

use crate::config::NodeConfig;
use crate::error::{Error, Result};
use crate::types::{ContainerId, ReplicaId};
use std::collections::{BTreeMap, BTreeSet};

/// The replica sets this node knows of.
#[derive(Clone, Debug)]
pub(crate) struct Membership {
    own: ReplicaId,
    /// The peers of a container the configuration does not list: it is
    /// held by this node and every configured peer.
    unlisted_peers: Vec<ReplicaId>,
    listed: BTreeMap<ContainerId, Listed>,
}

#[derive(Clone, Debug)]
struct Listed {
    /// Whether this node is one of the container's replicas.
    held_here: bool,
    /// The container's other replicas, ascending, each once.
    peers: Vec<ReplicaId>,
    /// Replicas that left the container, ascending, each once.
    retired: Vec<ReplicaId>,
}

impl Membership {
    pub fn from_config(node: &NodeConfig) -> Self {
        let own = node.replica_id;
        let peers_except_own = |replicas: &mut dyn Iterator<Item = ReplicaId>| {
            let set: BTreeSet<ReplicaId> = replicas.filter(|r| *r != own).collect();
            set.into_iter().collect::<Vec<_>>()
        };
        let unlisted_peers = peers_except_own(&mut node.peers.iter().map(|p| p.replica_id));
        let listed = node
            .containers
            .iter()
            .map(|container| {
                let listed = Listed {
                    held_here: container.replicas.contains(&own),
                    peers: peers_except_own(&mut container.replicas.iter().copied()),
                    retired: peers_except_own(&mut container.retired.iter().copied()),
                };
                (container.cid, listed)
            })
            .collect();
        Self {
            own,
            unlisted_peers,
            listed,
        }
    }

    pub fn own(&self) -> ReplicaId {
        self.own
    }

    /// True when this node is one of the container's replicas.
    pub fn replicates(&self, cid: &ContainerId) -> bool {
        self.listed.get(cid).is_none_or(|listed| listed.held_here)
    }

    /// `NotReplica` unless this node holds the container.
    pub fn check_replica(&self, cid: &ContainerId) -> Result<()> {
        if self.replicates(cid) {
            Ok(())
        } else {
            Err(Error::NotReplica(cid.to_string()))
        }
    }

    /// The container's other replicas, ascending.
    pub fn peers_of(&self, cid: &ContainerId) -> &[ReplicaId] {
        match self.listed.get(cid) {
            Some(listed) => &listed.peers,
            None => &self.unlisted_peers,
        }
    }

    /// True when `origin` may have stamped ops of the container: this
    /// node, one of its other replicas, or one that left it (its ops stay
    /// the container's, and reach a joiner or a dropped tree by pull).
    pub fn may_stamp(&self, cid: &ContainerId, origin: ReplicaId) -> bool {
        let retired = self
            .listed
            .get(cid)
            .is_some_and(|listed| listed.retired.contains(&origin));
        origin == self.own || self.peers_of(cid).contains(&origin) || retired
    }

    /// Every configured peer, ascending.
    pub fn all_peers(&self) -> impl Iterator<Item = ReplicaId> + '_ {
        self.unlisted_peers.iter().copied()
    }

    /// The listed containers this node holds, ascending: sync looks for
    /// their trees on peers even before it holds any of them.
    pub fn listed_here(&self) -> impl Iterator<Item = &ContainerId> {
        self.listed
            .iter()
            .filter(|(_, listed)| listed.held_here)
            .map(|(cid, _)| cid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ContainerConfig, PeerConfig};

    fn node() -> NodeConfig {
        let mut node = NodeConfig::solo(2);
        node.peers = [3, 1, 4]
            .map(|replica_id| PeerConfig::new(replica_id, String::new()))
            .into();
        node.containers = vec![
            ContainerConfig {
                cid: ContainerId([1; 32]),
                replicas: vec![4, 2, 1, 4],
                retired: vec![3],
            },
            ContainerConfig::new(ContainerId([2; 32]), vec![1, 3]),
        ];
        node
    }

    #[test]
    fn peers_are_the_other_replicas_ascending() {
        let members = Membership::from_config(&node());
        assert_eq!(members.own(), 2);
        assert_eq!(members.peers_of(&ContainerId([1; 32])), &[1, 4]);
        assert_eq!(members.peers_of(&ContainerId([9; 32])), &[1, 3, 4]);
        assert!(members.replicates(&ContainerId([1; 32])));
        assert!(members.replicates(&ContainerId([9; 32])));
        assert!(!members.replicates(&ContainerId([2; 32])));
        assert!(matches!(
            members.check_replica(&ContainerId([2; 32])),
            Err(Error::NotReplica(_))
        ));
        let listed: Vec<_> = members.listed_here().collect();
        assert_eq!(listed, vec![&ContainerId([1; 32])]);
    }

    /// A retired replica is no peer, but its ops are still the container's.
    #[test]
    fn retired_replicas_stamp_but_are_no_peers() {
        let members = Membership::from_config(&node());
        let cid = ContainerId([1; 32]);
        assert!(!members.peers_of(&cid).contains(&3));
        assert!(members.may_stamp(&cid, 3));
        assert!(members.may_stamp(&cid, 2));
        assert!(members.may_stamp(&cid, 4));
        assert!(!members.may_stamp(&cid, 5));
        assert!(!members.may_stamp(&ContainerId([2; 32]), 4));
    }
}
