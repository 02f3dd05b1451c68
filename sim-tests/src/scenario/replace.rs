//! Node replacement: a replica's disk is destroyed for good and the node
//! starts again on an empty one under the same replica id, rejoining
//! (`node.rejoin`, docs/design.md §6). What it alone had acknowledged and
//! no other replica held when its disk died is gone by design: such a
//! write is *at risk*, counted and reported, never a failure. Anything
//! else missing is a lost write.
//!
//! The classification is exact, not a guess: when the fault strikes, the
//! nemesis captures every other replica's trees in the same simulation
//! step as the destruction (no other task runs between), and the ledger
//! knows, for every acknowledged write, which disk of its acker was in
//! place when the write was sent: only that disk can have acknowledged it
//! (the replacement's downtime exceeds any message's flight).

use super::checkers::Contents;
use super::ledger::{Acked, Ledger};
use arbor::forest::records::LogView;
use arbor::forest::ReplicaContent;
use arbor::{timestamp_replica, NodeId, ReplicaId, TreeKey, TRASH};
use std::collections::{BTreeMap, BTreeSet};

/// One destroyed disk and what the other replicas held at that moment.
#[derive(Clone, Debug)]
pub struct Destruction {
    pub replica: ReplicaId,
    /// The destroyed disk (`World::disk_generation` before it died).
    pub disk: u64,
    /// Every tree of every other replica, as captured then.
    pub held_elsewhere: Contents,
}

/// The replacements of a run, in the ledger beside the writes.
#[derive(Clone, Debug, Default)]
pub struct Replacements {
    pub destroyed: Vec<Destruction>,
    /// Per index into `Ledger::acked`: the acker's disk when the write
    /// was sent. Writes recorded without it were sent to a first disk.
    pub sent_to_disk: BTreeMap<usize, u64>,
}

impl Replacements {
    /// The acknowledged writes at risk: acknowledged by a disk that was
    /// destroyed and held by no other replica at that moment.
    pub fn at_risk(&self, ledger: &Ledger) -> BTreeSet<usize> {
        let mut risky = BTreeSet::new();
        for destruction in &self.destroyed {
            let holders: Vec<Presence> = destruction
                .held_elsewhere
                .values()
                .map(|trees| Presence::of(trees.iter()))
                .collect();
            for (index, acked) in ledger.acked.iter().enumerate() {
                let disk = self.sent_to_disk.get(&index).copied().unwrap_or(0);
                let acker = acker_of(acked);
                if acker != destruction.replica || disk != destruction.disk {
                    continue;
                }
                if !holders.iter().any(|held| held.holds(acked)) {
                    risky.insert(index);
                }
            }
        }
        risky
    }
}

fn acker_of(acked: &Acked) -> ReplicaId {
    match acked {
        Acked::Created { acker, .. }
        | Acked::Moved { acker, .. }
        | Acked::Removed { acker, .. } => *acker,
    }
}

/// One logged op, as the presence of an acknowledged write needs it.
struct LoggedOp {
    ts: u64,
    parent: NodeId,
    tag: Option<Vec<u8>>,
}

/// The ops of some trees, indexed to tell whether an acknowledged write
/// is among them.
pub struct Presence<'a> {
    timestamps: BTreeMap<&'a TreeKey, BTreeSet<u64>>,
    by_child: BTreeMap<&'a TreeKey, BTreeMap<NodeId, Vec<LoggedOp>>>,
}

impl<'a> Presence<'a> {
    /// Indexes the logs of `trees`; an op that does not parse is left out
    /// (the invariant checks report it).
    pub fn of(trees: impl Iterator<Item = (&'a TreeKey, &'a ReplicaContent)>) -> Self {
        let mut presence = Presence {
            timestamps: BTreeMap::new(),
            by_child: BTreeMap::new(),
        };
        for (tree, content) in trees {
            let mut stamps = BTreeSet::new();
            let mut by_child: BTreeMap<NodeId, Vec<LoggedOp>> = BTreeMap::new();
            for (ts, op) in content.ops() {
                stamps.insert(ts);
                let Ok(op) = LogView::parse_op(op) else {
                    continue;
                };
                let tag = op
                    .items()
                    .find(|(key, _)| *key == super::ledger::MOVE_TAG_KEY.as_bytes())
                    .map(|(_, value)| value.to_vec());
                by_child.entry(op.child).or_default().push(LoggedOp {
                    ts,
                    parent: op.parent,
                    tag,
                });
            }
            presence.timestamps.insert(tree, stamps);
            presence.by_child.insert(tree, by_child);
        }
        presence
    }

    fn ops_of(&self, tree: &TreeKey, node: &NodeId) -> &[LoggedOp] {
        self.by_child
            .get(tree)
            .and_then(|ops| ops.get(node))
            .map_or(&[], Vec::as_slice)
    }

    /// Whether the op of `acked` is among these logs.
    pub fn holds(&self, acked: &Acked) -> bool {
        match acked {
            Acked::Created { tree, node, .. } => self
                .timestamps
                .get(tree)
                .is_some_and(|ts| ts.contains(node)),
            Acked::Moved {
                tree,
                node,
                parent,
                tag,
                ..
            } => self
                .ops_of(tree, node)
                .iter()
                .any(|op| op.parent == *parent && op.tag.as_deref() == Some(tag.as_bytes())),
            Acked::Removed { tree, node, acker } => self
                .ops_of(tree, node)
                .iter()
                .any(|op| op.parent == TRASH && timestamp_replica(op.ts) == *acker),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbor::ContainerId;

    fn tree() -> TreeKey {
        TreeKey::new(ContainerId([1; 32]), "t")
    }

    fn created(node: NodeId, acker: ReplicaId) -> Acked {
        Acked::Created {
            tree: tree(),
            node,
            acker,
            sent: None,
        }
    }

    /// Only a write its destroyed disk acknowledged and no other replica
    /// held is at risk: one a later disk of the same replica acknowledged,
    /// and one another replica acknowledged, are not. (Writes another
    /// replica held: the simulator test of the replace profile.)
    #[test]
    fn at_risk_is_acked_by_the_dead_disk_and_held_nowhere_else() {
        let lost_ts = (8 << 16) | 2;
        let ledger = Ledger {
            acked: vec![
                created(lost_ts, 2),
                created(lost_ts, 2),
                created((9 << 16) | 3, 3),
            ],
            ..Ledger::default()
        };
        let content = ReplicaContent::default();
        let held_elsewhere = Contents::from([(3, BTreeMap::from([(tree(), content)]))]);
        let replacements = Replacements {
            destroyed: vec![Destruction {
                replica: 2,
                disk: 0,
                held_elsewhere,
            }],
            sent_to_disk: BTreeMap::from([(1, 1)]),
        };
        assert_eq!(replacements.at_risk(&ledger), BTreeSet::from([0]));
    }
}
