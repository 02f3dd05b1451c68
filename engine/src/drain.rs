//! Leaving a container safely (docs/design.md §6, membership): before a
//! replica leaves a container, everything it holds there must be held by
//! the replicas that stay. `judge` is the rule, and the one answer both
//! `arbor drain` (over the network, `held_ops`) and the simulator's
//! operator (in process, `held_ops_local`) go by:
//!
//! - every op the leaver stamped is held by **every** remaining member
//!   (its own ops are its own to push, and a remaining member no longer
//!   pulls from it once the leave takes effect);
//! - every op the leaver holds, whoever stamped it, is held by **one** of
//!   them (its originator may have lost its disk since, leaving the leaver
//!   the last replica serving it).
//!
//! Ops are compared by timestamp, tree by tree.

use crate::error::{Error, Result};
use crate::forest::Forest;
use crate::proto::{Request, Response};
use crate::tcp::Connection;
use crate::types::{timestamp_replica, ContainerId, ReplicaId, Timestamp, TreeKey};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The ops one replica holds in one container, by tree.
pub type HeldOps = BTreeMap<TreeKey, BTreeSet<Timestamp>>;

/// Stamps asked for per `GetOpLogStamps` page (the node caps it).
const STAMP_PAGE: u32 = 16_384;

/// Whether a leaver has handed a container over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainReport {
    pub cid: ContainerId,
    pub leaver: ReplicaId,
    pub remaining: Vec<ReplicaId>,
    /// Trees and ops the leaver holds in the container.
    pub trees: usize,
    pub ops: usize,
    /// Ops the leaver stamped that a remaining member lacks, summed over
    /// the members, and the first of them.
    pub own_missing: usize,
    pub first_own_missing: Option<(ReplicaId, TreeKey, Timestamp)>,
    /// Ops the leaver holds that no remaining member holds, and the first.
    pub unkept: usize,
    pub first_unkept: Option<(TreeKey, Timestamp)>,
}

impl DrainReport {
    /// True once the leave can take effect without losing an op.
    pub fn done(&self) -> bool {
        self.own_missing == 0 && self.unkept == 0
    }
}

impl fmt::Display for DrainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (cid, leaver, remaining) = (self.cid, self.leaver, &self.remaining);
        if self.done() {
            return write!(
                f,
                "container {cid}: drained: the {} ops replica {leaver} holds in {} trees are \
                 held by the remaining replicas {remaining:?}",
                self.ops, self.trees
            );
        }
        write!(f, "container {cid}: not drained:")?;
        if let Some((member, tree, ts)) = &self.first_own_missing {
            write!(
                f,
                " {} ops replica {leaver} stamped are missing on remaining replicas \
                 (first: op {ts} of tree {:?} on replica {member});",
                self.own_missing, tree.tree
            )?;
        }
        if let Some((tree, ts)) = &self.first_unkept {
            write!(
                f,
                " {} ops replica {leaver} holds are held by none of {remaining:?} \
                 (first: op {ts} of tree {:?});",
                self.unkept, tree.tree
            )?;
        }
        write!(f, " {} ops in {} trees in all", self.ops, self.trees)
    }
}

/// The rule (see the module comment): what `leaver`, holding `held` of
/// container `cid`, has not handed over to the `remaining` members, each
/// with what it holds there.
pub fn judge(
    cid: ContainerId,
    leaver: ReplicaId,
    held: &HeldOps,
    remaining: &[(ReplicaId, HeldOps)],
) -> DrainReport {
    let mut report = DrainReport {
        cid,
        leaver,
        remaining: remaining.iter().map(|(id, _)| *id).collect(),
        trees: held.len(),
        ops: held.values().map(BTreeSet::len).sum(),
        own_missing: 0,
        first_own_missing: None,
        unkept: 0,
        first_unkept: None,
    };
    let holds = |other: &HeldOps, tree: &TreeKey, ts: &Timestamp| {
        other.get(tree).is_some_and(|stamps| stamps.contains(ts))
    };
    for (tree, stamps) in held {
        for ts in stamps {
            if timestamp_replica(*ts) == leaver {
                for (member, other) in remaining {
                    if !holds(other, tree, ts) {
                        report.own_missing += 1;
                        report
                            .first_own_missing
                            .get_or_insert_with(|| (*member, tree.clone(), *ts));
                    }
                }
            }
            if !remaining.iter().any(|(_, other)| holds(other, tree, ts)) {
                report.unkept += 1;
                report
                    .first_unkept
                    .get_or_insert_with(|| (tree.clone(), *ts));
            }
        }
    }
    report
}

/// What the replica behind `connection` holds in `cid`: its trees
/// (`TreeList`) and, page by page, the stamps of their logs
/// (`GetOpLogStamps`). The caller needs the rights to read op logs
/// (an owner of the container, or a trusted caller). Each call must be
/// answered within `call_timeout`.
pub async fn held_ops(
    connection: &mut Connection,
    cid: ContainerId,
    call_timeout: std::time::Duration,
) -> Result<HeldOps> {
    let mut call = async |request: Request| {
        tokio::time::timeout(call_timeout, connection.call(&request))
            .await
            .map_err(|_| Error::Timeout)?
    };
    let trees = match call(Request::TreeList { cid }).await? {
        Response::Trees(trees) => trees,
        Response::Error(Error::TreeNotFound) => Vec::new(),
        Response::Error(error) => return Err(error),
        other => return Err(unexpected("TreeList", &other)),
    };
    let mut held = HeldOps::new();
    for tree_id in trees {
        let tree = TreeKey::new(cid, tree_id);
        let mut stamps = BTreeSet::new();
        let mut from_height = 0;
        loop {
            let page = Request::GetOpLogStamps {
                tree: tree.clone(),
                from_height,
                limit: STAMP_PAGE,
            };
            match call(page).await? {
                Response::OpLogStamps {
                    stamps: page,
                    next_height,
                    first_height,
                } => {
                    if page.is_empty() {
                        if from_height < first_height {
                            // A tree created again after a drop: its log
                            // starts above 0.
                            from_height = first_height;
                            continue;
                        }
                        break;
                    }
                    stamps.extend(page.iter().map(|stamp| stamp.ts));
                    from_height = next_height;
                }
                // Dropped since it was listed: it holds nothing.
                Response::Error(Error::TreeNotFound) => break,
                Response::Error(error) => return Err(error),
                other => return Err(unexpected("GetOpLogStamps", &other)),
            }
        }
        held.insert(tree, stamps);
    }
    Ok(held)
}

/// What `forest` holds in `cid`, read in process the way `held_ops` reads
/// it over the network (the simulator's operator uses it). Synchronous.
pub fn held_ops_local(forest: &Forest, cid: &ContainerId) -> Result<HeldOps> {
    let mut held = HeldOps::new();
    for tree_id in forest.tree_list(cid)? {
        let tree = TreeKey::new(*cid, tree_id);
        let mut stamps = BTreeSet::new();
        let mut from_height = 0;
        loop {
            let page = match forest.get_op_log_stamps(&tree, from_height, STAMP_PAGE as usize) {
                Ok(page) => page,
                Err(Error::TreeNotFound) => break,
                Err(error) => return Err(error),
            };
            if page.stamps.is_empty() {
                if from_height < page.first_height {
                    from_height = page.first_height;
                    continue;
                }
                break;
            }
            stamps.extend(page.stamps.iter().map(|stamp| stamp.ts));
            from_height = page.next_height;
        }
        held.insert(tree, stamps);
    }
    Ok(held)
}

fn unexpected(request: &str, answer: &Response) -> Error {
    Error::Malformed(format!("{request} answered with {answer:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(stamps: &[Timestamp]) -> BTreeSet<Timestamp> {
        stamps.iter().copied().collect()
    }

    /// The rule, fed the history of members seed 482 of the simulator:
    /// replica-4 stamped op 262148, replica-1 pulled it, replica-4's disk
    /// was then destroyed, and replica-1 left holding the only served
    /// copy. A drain that looked at the leaver's own ops alone let that
    /// leave take effect and the write was lost; it must wait until a
    /// remaining member holds the op, and each remaining member every own
    /// op.
    #[test]
    fn a_leaver_keeps_serving_another_replicas_op_it_alone_holds() {
        let cid = ContainerId([1; 32]);
        let tree = TreeKey::new(cid, "version");
        let (own_op, foreign_op) = (0x1_0001, 0x4_0004);
        assert_eq!(timestamp_replica(own_op), 1);
        assert_eq!(timestamp_replica(foreign_op), 4);
        let held = HeldOps::from([(tree.clone(), set(&[own_op, foreign_op]))]);
        let own_only = HeldOps::from([(tree.clone(), set(&[own_op]))]);
        let all = held.clone();
        let nothing = HeldOps::new();
        let judge = |others: &[HeldOps]| {
            let members: Vec<_> = (2..).zip(others.iter().cloned()).collect();
            judge(cid, 1, &held, &members)
        };
        let not_handed = judge(&[own_only.clone(), own_only.clone()]);
        assert!(!not_handed.done());
        assert_eq!(not_handed.unkept, 1);
        assert_eq!(not_handed.first_unkept, Some((tree.clone(), foreign_op)));
        assert!(
            not_handed.to_string().contains("not drained"),
            "{not_handed}"
        );
        assert!(judge(&[own_only.clone(), all.clone()]).done());
        let own_missing = judge(&[nothing, all.clone()]);
        assert!(!own_missing.done());
        assert_eq!(own_missing.own_missing, 1);
        assert_eq!(
            own_missing.first_own_missing,
            Some((2, tree.clone(), own_op))
        );
        let done = judge(&[all.clone(), all]);
        assert!(done.done() && done.ops == 2 && done.trees == 1);
        assert!(done.to_string().contains("drained"), "{done}");
        // Nobody to hand over to: only an empty container is drained.
        assert!(!judge(&[]).done());
        assert!(super::judge(cid, 1, &HeldOps::new(), &[]).done());
    }
}
