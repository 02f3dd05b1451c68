//! Who may call what (docs/design.md §9): every request is checked against
//! the caller's identity before anything else is done or looked at, so
//! that a refused caller learns nothing about the container.
//!
//! - Replication (`Apply`) and sync (`GetOpLog`, `GetOpLogStamps`): the
//!   container's other configured replicas. The container's owners may
//!   also read the op log (operator tooling).
//! - Client requests: the roles of `access:` (owner, writer, reader) on the
//!   container; an anonymous caller holds `access.anonymous`.
//! - `TreeList`: readers, and the container's replicas (sync lists trees).
//! - `Healthcheck`: everyone.

use super::membership::Membership;
use crate::canary::{self, Canary};
use crate::config::{AccessConfig, Role};
use crate::error::{Error, Result};
use crate::identity::Caller;
use crate::proto::Request;
use crate::types::{timestamp_replica, ContainerId, Move, ReplicaId};

/// What a request needs, on which container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Need {
    Nothing,
    /// A client role on the container.
    Client(ContainerId, Role),
    /// Being one of the container's other replicas.
    Replica(ContainerId),
    /// A replica, or a client of this role.
    ReplicaOrClient(ContainerId, Role),
}

/// The operation's name (for refusals and logs) and what it needs.
fn need_of(request: &Request) -> (&'static str, Need) {
    let (name, need) = match request {
        Request::Add { tree, .. } => ("Add", Need::Client(tree.cid, Role::Writer)),
        Request::AddByPath { tree, .. } => ("AddByPath", Need::Client(tree.cid, Role::Writer)),
        Request::Move { tree, .. } => ("Move", Need::Client(tree.cid, Role::Writer)),
        Request::Remove { tree, .. } => ("Remove", Need::Client(tree.cid, Role::Writer)),
        Request::GetNodeByPath { tree, .. } => {
            ("GetNodeByPath", Need::Client(tree.cid, Role::Reader))
        }
        Request::GetMeta { tree, .. } => ("GetMeta", Need::Client(tree.cid, Role::Reader)),
        Request::GetSubTree { tree, .. } => ("GetSubTree", Need::Client(tree.cid, Role::Reader)),
        Request::ListChildren { tree, .. } => {
            ("ListChildren", Need::Client(tree.cid, Role::Reader))
        }
        Request::GetSubTreePage { tree, .. } => {
            ("GetSubTreePage", Need::Client(tree.cid, Role::Reader))
        }
        Request::TreeList { cid } => ("TreeList", Need::ReplicaOrClient(*cid, Role::Reader)),
        Request::Drop { cid, .. } => {
            let needed = if canary::active(Canary::WriterMayDrop) {
                Role::Writer // planted bug: the role one below
            } else {
                Role::Owner
            };
            ("Drop", Need::Client(*cid, needed))
        }
        Request::Apply { tree, .. } => ("Apply", Need::Replica(tree.cid)),
        Request::GetOpLog { tree, .. } => {
            ("GetOpLog", Need::ReplicaOrClient(tree.cid, Role::Owner))
        }
        Request::GetOpLogStamps { tree, .. } => (
            "GetOpLogStamps",
            Need::ReplicaOrClient(tree.cid, Role::Owner),
        ),
        Request::Healthcheck => ("Healthcheck", Need::Nothing),
        // Open to everyone: it is how a connection says who it is, and the
        // service checks the claim itself (service/hello.rs).
        Request::Hello { .. } => ("Hello", Need::Nothing),
    };
    (name, need)
}

/// The rights of this node's callers, from its configuration.
pub(crate) struct Access {
    config: AccessConfig,
}

impl Access {
    pub fn new(config: AccessConfig) -> Self {
        Self { config }
    }

    /// `PermissionDenied` unless `caller` may send `request`.
    pub fn check(&self, members: &Membership, caller: &Caller, request: &Request) -> Result<()> {
        let (operation, need) = need_of(request);
        if canary::active(Canary::AuthorizationSkipped) || self.allows(members, caller, need) {
            return Ok(());
        }
        Err(denied(operation, caller))
    }

    fn allows(&self, members: &Membership, caller: &Caller, need: Need) -> bool {
        match need {
            Need::Nothing => true,
            Need::Client(cid, role) => self.role_of(caller, &cid).is_some_and(|held| held >= role),
            Need::Replica(cid) => self.replicates(members, caller, &cid),
            Need::ReplicaOrClient(cid, role) => {
                self.replicates(members, caller, &cid)
                    || self.role_of(caller, &cid).is_some_and(|held| held >= role)
            }
        }
    }

    /// True when `caller` may replicate `cid`: one of its other
    /// configured replicas, or anyone under `anonymous: trusted`.
    fn replicates(&self, members: &Membership, caller: &Caller, cid: &ContainerId) -> bool {
        match caller {
            Caller::Anonymous => self.config.anonymous_replicates,
            _ => is_replica_of(members, caller, cid),
        }
    }

    /// An `Apply` carries only the calling replica's own ops: a pusher
    /// sends the ops that originated on it, never others'
    /// (docs/design.md §6), so an op stamped by another replica is a
    /// forgery or a misconfigured replica id. A trusted anonymous caller
    /// cannot be told apart from any replica: its ops must be stamped by
    /// one of the container's other replicas.
    pub fn check_apply_origin(
        &self,
        members: &Membership,
        caller: &Caller,
        cid: &ContainerId,
        ops: &[Move],
    ) -> Result<()> {
        if canary::active(Canary::AuthorizationSkipped) {
            return Ok(());
        }
        let stamped_right = |origin: ReplicaId| match caller {
            Caller::Peer(id) => origin == *id,
            Caller::Anonymous if self.config.anonymous_replicates => {
                members.peers_of(cid).contains(&origin)
            }
            _ => false,
        };
        match ops
            .iter()
            .find(|op| !stamped_right(timestamp_replica(op.ts())))
        {
            None => Ok(()),
            Some(op) => Err(denied(
                &format!(
                    "Apply ops stamped by replica {}",
                    timestamp_replica(op.ts())
                ),
                caller,
            )),
        }
    }

    /// The client role `caller` holds on `cid`: its own grant, and at
    /// least what every anonymous caller holds. Replicas hold no client
    /// role.
    fn role_of(&self, caller: &Caller, cid: &ContainerId) -> Option<Role> {
        match caller {
            Caller::Peer(_) => None,
            Caller::Anonymous => self.config.anonymous,
            Caller::Client(name) | Caller::Key(name) => {
                let granted = self.config.grants_of(cid).role_of(name);
                granted.max(self.config.anonymous)
            }
        }
    }
}

/// True when `caller` is one of the container's other configured replicas.
fn is_replica_of(members: &Membership, caller: &Caller, cid: &ContainerId) -> bool {
    match caller {
        Caller::Peer(id) if canary::active(Canary::ReplicaOfAnyContainer) => {
            // Planted bug: a replica of any container passes.
            members.peers_of(cid).contains(id) || members.all_peers().any(|p| p == *id)
        }
        Caller::Peer(id) => members.peers_of(cid).contains(id),
        Caller::Client(_) | Caller::Key(_) | Caller::Anonymous => false,
    }
}

fn denied(operation: &str, caller: &Caller) -> Error {
    Error::PermissionDenied {
        operation: operation.to_string(),
        caller: caller.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ContainerAccess, Grants, NodeConfig, PeerConfig};
    use crate::types::{make_timestamp, Meta, TreeKey, ROOT};

    fn cid(n: u8) -> ContainerId {
        ContainerId([n; 32])
    }

    fn members() -> Membership {
        let mut node = NodeConfig::solo(1);
        node.peers = vec![PeerConfig::new(2, String::new())];
        Membership::from_config(&node)
    }

    fn access(anonymous: Option<Role>) -> Access {
        let mut grants = Grants::default();
        grants.grant(Role::Owner, "own");
        grants.grant(Role::Writer, "write");
        grants.grant(Role::Reader, "read");
        Access::new(AccessConfig {
            anonymous,
            anonymous_replicates: false,
            default: Grants::default(),
            containers: vec![ContainerAccess {
                cid: cid(1),
                grants,
            }],
        })
    }

    fn client(name: &str) -> Caller {
        Caller::Client(name.into())
    }

    fn requests(cid: ContainerId) -> Vec<Request> {
        let tree = TreeKey::new(cid, "t");
        vec![
            Request::GetMeta {
                tree: tree.clone(),
                node: 5,
            },
            Request::Remove {
                tree: tree.clone(),
                node: 5,
            },
            Request::Drop { cid, tree: None },
            Request::Apply {
                tree: tree.clone(),
                ops: Vec::new(),
            },
            Request::GetOpLog {
                tree,
                from_height: 0,
                limit: 1,
            },
        ]
    }

    /// Which of `requests` each caller may send: a role includes the ones
    /// below it; replicas sync but hold no client role; nobody else gets
    /// anything.
    #[test]
    fn roles_include_the_ones_below() {
        let access = access(None);
        let members = members();
        let allowed = |caller: &Caller, cid: ContainerId| -> Vec<bool> {
            requests(cid)
                .iter()
                .map(|r| access.check(&members, caller, r).is_ok())
                .collect()
        };
        assert_eq!(
            allowed(&client("read"), cid(1)),
            [true, false, false, false, false]
        );
        assert_eq!(
            allowed(&client("write"), cid(1)),
            [true, true, false, false, false]
        );
        assert_eq!(
            allowed(&client("own"), cid(1)),
            [true, true, true, false, true]
        );
        assert_eq!(
            allowed(&Caller::Peer(2), cid(1)),
            [false, false, false, true, true]
        );
        for nobody in [
            client("own"),
            client("x"),
            Caller::Anonymous,
            Caller::Peer(3),
        ] {
            let cid = if nobody == client("own") {
                cid(2)
            } else {
                cid(1)
            };
            let expected = [false; 5];
            assert_eq!(allowed(&nobody, cid), expected, "{nobody}");
        }
        assert!(access
            .check(&members, &Caller::Anonymous, &Request::Healthcheck)
            .is_ok());
    }

    /// `access.anonymous` is what every caller without credentials holds,
    /// and every client holds at least that.
    #[test]
    fn anonymous_rights_apply_to_everyone_without_more() {
        let access = access(Some(Role::Writer));
        let members = members();
        let remove = &requests(cid(3))[1];
        let drop = &requests(cid(3))[2];
        assert!(access.check(&members, &Caller::Anonymous, remove).is_ok());
        assert!(access.check(&members, &client("read"), remove).is_ok());
        assert!(access.check(&members, &Caller::Anonymous, drop).is_err());
        let denied = access.check(&members, &client("x"), drop).unwrap_err();
        assert_eq!(
            denied,
            Error::PermissionDenied {
                operation: "Drop".into(),
                caller: "client \"x\"".into()
            }
        );
    }

    #[test]
    fn apply_carries_only_the_callers_own_ops() {
        let op = |replica| Move {
            parent: ROOT,
            child: 9,
            meta: Meta {
                time: make_timestamp(4, replica),
                items: Vec::new(),
            },
        };
        let members = members();
        let check = |access: &Access, caller: &Caller, ops: &[Move]| {
            access.check_apply_origin(&members, caller, &cid(1), ops)
        };
        let strict = access(None);
        assert!(check(&strict, &Caller::Peer(2), &[op(2), op(2)]).is_ok());
        assert!(check(&strict, &Caller::Peer(2), &[op(2), op(3)]).is_err());
        assert!(check(&strict, &client("own"), &[op(2)]).is_err());
        assert!(check(&strict, &Caller::Anonymous, &[op(2)]).is_err());
        // Trusted anonymous callers carry ops of the other replicas only.
        let trusting = Access::new(AccessConfig::trusting_everyone());
        assert!(check(&trusting, &Caller::Anonymous, &[op(2)]).is_ok());
        assert!(check(&trusting, &Caller::Anonymous, &[op(1)]).is_err());
        assert!(check(&trusting, &Caller::Anonymous, &[op(3)]).is_err());
    }
}
