//! Node replacement: a replica's disk is destroyed for good and the node
//! starts again on an empty one under the same replica id, rejoining
//! (`node.rejoin`, docs/design.md §6). A write whose every copy was on
//! disks that were destroyed is gone by design: such a write is *at
//! risk*, counted and reported, never a failure. Anything else missing is
//! a lost write.
//!
//! The classification is exact, not a guess: when the fault strikes, the
//! nemesis captures every replica's trees (the victim's included) in the
//! same simulation step as the destruction (no other task runs between),
//! and the ledger knows, for every acknowledged write, which disk of its
//! acker was in place when the write was sent: only that disk can have
//! acknowledged it (the replacement's downtime exceeds any message's
//! flight). A write is at risk when the disk that acknowledged it was
//! destroyed and, at that destruction or a later one, the destroyed disk
//! held it and every other replica that did was sent a drop of its tree
//! that may have run after: its last copy went with that disk.
//! One destruction at a time loses only what the acker alone held; a
//! second one while a rebuilt node is still pulling can take the last
//! copy of a write its acker had already handed on.
//!
//! With `tree.ack_replicas` k >= 2 an acknowledged write was held by k
//! replicas when it was answered, so it is at risk only when k of the
//! disks that held it were destroyed (each destruction capture says
//! whether its victim held it), or when a destruction took its last copy
//! after a drop of its tree, sent since the write, may have erased the
//! other copies. A single lost disk never excuses such a write.

use crate::scenario::check::ledger::{Acked, DropScope, Drops, Ledger};
use crate::scenario::check::Contents;
use arbor::forest::records::LogView;
use arbor::forest::ReplicaContent;
use arbor::{timestamp_replica, ContainerId, NodeId, ReplicaId, TreeKey, TRASH};
use std::collections::{BTreeMap, BTreeSet};

/// One destroyed disk and what every replica held at that moment.
#[derive(Clone, Debug)]
pub struct Destruction {
    pub replica: ReplicaId,
    /// The destroyed disk (`World::disk_generation` before it died).
    pub disk: u64,
    /// Every tree of every replica, the victim's included, as captured
    /// then.
    pub held: Contents,
    /// `Drops::answered` then: a drop sent to a replica and not answered
    /// by then may have erased what it held at the capture.
    pub drops_answered: BTreeMap<(DropScope, ReplicaId), u64>,
    /// `Drops::sent` then: the drops sent before the disk died.
    pub drops_sent: BTreeMap<(DropScope, ReplicaId), u64>,
    /// The replica sets then (`World::view`): a copy on a replica that
    /// no longer replicates the container (it left) is pulled by nobody,
    /// so it keeps nothing for the rebuilt node or the others. Containers
    /// not listed are on every replica.
    pub members: BTreeMap<ContainerId, Vec<ReplicaId>>,
}

impl Destruction {
    /// Whether this destruction took the last copy of `acked`: the victim
    /// held it, and every other replica that held it then was sent a drop
    /// of its tree that may have run after (docs/design.md §6: a drop on
    /// the replicas that held a write erases it), so none may keep it.
    fn took_last_copy(
        &self,
        presence: &BTreeMap<ReplicaId, Presence<'_>>,
        acked: &Acked,
        drops: &Drops,
    ) -> bool {
        let victim_held = presence
            .get(&self.replica)
            .is_some_and(|held| held.holds(acked));
        let kept_elsewhere = presence.iter().any(|(&replica, held)| {
            replica != self.replica
                && self.serves(replica, acked.tree())
                && held.holds(acked)
                && !drops.dropped_since(acked.tree(), replica, &self.drops_answered)
        });
        victim_held && !kept_elsewhere
    }

    /// Whether a replica other than the victim that replicated the
    /// container held `acked` then.
    fn held_elsewhere(&self, presence: &BTreeMap<ReplicaId, Presence<'_>>, acked: &Acked) -> bool {
        (presence.iter()).any(|(&replica, held)| {
            replica != self.replica && self.serves(replica, acked.tree()) && held.holds(acked)
        })
    }

    /// Whether `replica` replicated `tree`'s container then, so that its
    /// copy could reach the others by sync.
    fn serves(&self, replica: ReplicaId, tree: &TreeKey) -> bool {
        self.members
            .get(&tree.cid)
            .is_none_or(|members| members.contains(&replica))
    }
}

/// The replacements of a run, in the ledger beside the writes.
#[derive(Clone, Debug, Default)]
pub struct Replacements {
    /// In the order they struck.
    pub destroyed: Vec<Destruction>,
    /// Per index into `Ledger::acked`: the acker's disk when the write
    /// was sent. Writes recorded without it were sent to a first disk.
    pub sent_to_disk: BTreeMap<usize, u64>,
    /// `tree.ack_replicas` of every node of the run; 0 (a recorder that
    /// never sets it) counts as 1.
    pub ack_replicas: usize,
}

impl Replacements {
    /// The acknowledged writes at risk: the disk that acknowledged one was
    /// destroyed, and that destruction or a later one took its last copy.
    pub fn at_risk(&self, ledger: &Ledger) -> BTreeSet<usize> {
        let presences: Vec<BTreeMap<ReplicaId, Presence>> = self
            .destroyed
            .iter()
            .map(|destruction| {
                (destruction.held.iter())
                    .map(|(&replica, trees)| (replica, Presence::of(trees.iter())))
                    .collect()
            })
            .collect();
        self.at_risk_among(ledger, &presences)
    }

    /// The ops, by tree and stamp, whose last copy a destruction took
    /// after their origin had lost a disk: the victim held the op, no
    /// other replica did, and the op's origin (the low bits of its stamp)
    /// is the victim or had a disk destroyed before. Such an op is gone
    /// for good; its stamp may name another op since (docs/design.md §6).
    pub fn ops_gone(&self) -> BTreeSet<(TreeKey, u64)> {
        let mut gone = BTreeSet::new();
        for (index, destruction) in self.destroyed.iter().enumerate() {
            let Some(victim) = destruction.held.get(&destruction.replica) else {
                continue;
            };
            let lost_disk =
                |origin: ReplicaId| self.destroyed[..=index].iter().any(|d| d.replica == origin);
            for (tree, content) in victim {
                let elsewhere: BTreeSet<u64> = (destruction.held.iter())
                    .filter(|(&replica, _)| replica != destruction.replica)
                    .filter_map(|(_, trees)| trees.get(tree))
                    .flat_map(|content| content.ops().map(|(ts, _)| ts))
                    .collect();
                let last_copies = content.ops().map(|(ts, _)| ts);
                let taken = last_copies.filter(|ts| !elsewhere.contains(ts));
                for ts in taken.filter(|&ts| lost_disk(timestamp_replica(ts))) {
                    gone.insert((tree.clone(), ts));
                }
            }
        }
        gone
    }

    /// Whether the disk that acknowledged write `index` was destroyed
    /// later. With it went the `dropped` marks of that disk (docs/design.md
    /// §6): once a drop erased the write everywhere, the rebuilt node may
    /// give its stamp to another op.
    pub fn acking_disk_destroyed(&self, index: usize, acked: &Acked) -> bool {
        let disk = self.sent_to_disk.get(&index).copied().unwrap_or(0);
        let acker = acker_of(acked);
        (self.destroyed.iter()).any(|d| d.replica == acker && d.disk == disk)
    }

    /// `at_risk`, with what each replica held at each destruction indexed.
    fn at_risk_among(
        &self,
        ledger: &Ledger,
        presences: &[BTreeMap<ReplicaId, Presence>],
    ) -> BTreeSet<usize> {
        assert_eq!(presences.len(), self.destroyed.len());
        let mut risky = BTreeSet::new();
        let needed = self.ack_replicas.max(1);
        for (index, acked) in ledger.acked.iter().enumerate() {
            if needed >= 2 {
                if self.replicated_at_risk(ledger, index, presences, needed) {
                    risky.insert(index);
                }
                continue;
            }
            let disk = self.sent_to_disk.get(&index).copied().unwrap_or(0);
            let acker = acker_of(acked);
            // From the first destruction the acker's copy no longer
            // counted at: its disk went, or it had left the container.
            let Some(first) = self.destroyed.iter().position(|d| {
                (d.replica == acker && d.disk == disk) || !d.serves(acker, acked.tree())
            }) else {
                continue;
            };
            let mut later = self.destroyed.iter().zip(presences).skip(first);
            if later.any(|(d, presence)| d.took_last_copy(presence, acked, &ledger.drops)) {
                risky.insert(index);
            }
        }
        risky
    }
}

impl Replacements {
    /// Whether write `index`, acknowledged once `needed` replicas held
    /// it, may be gone by design: `needed` destroyed disks held it, or a
    /// destruction took its last copy after a drop of its tree was sent
    /// since the write (the drop may have erased the other copies).
    fn replicated_at_risk(
        &self,
        ledger: &Ledger,
        index: usize,
        presences: &[BTreeMap<ReplicaId, Presence>],
        needed: usize,
    ) -> bool {
        let acked = &ledger.acked[index];
        let destructions = self.destroyed.iter().zip(presences);
        let holders_destroyed = destructions
            .clone()
            .filter(|(d, presence)| presence.get(&d.replica).is_some_and(|h| h.holds(acked)))
            .count();
        if holders_destroyed >= needed {
            return true;
        }
        let sent_before = ledger.drops.sent_before.get(&index);
        let dropped_since = |d: &Destruction| {
            sent_before.is_some_and(|&n| Drops::count(&d.drops_sent, acked.tree(), None) > n)
        };
        // A last copy taken strictly (no other holder then) needs a drop
        // sent before the destruction: k >= 2 replicas held the write.
        // One taken with other holders then had drops erase those after.
        let mut last_copies =
            destructions.filter(|(d, p)| d.took_last_copy(p, acked, &ledger.drops));
        last_copies.any(|(d, p)| dropped_since(d) || d.held_elsewhere(p, acked))
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
                    .find(|(key, _)| {
                        *key == crate::scenario::check::ledger::MOVE_TAG_KEY.as_bytes()
                    })
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

    /// A replica holding ops of these stamps in `tree()`.
    fn holding(stamps: &[NodeId]) -> Presence<'static> {
        Presence {
            timestamps: BTreeMap::from([(tree_ref(), stamps.iter().copied().collect())]),
            by_child: BTreeMap::new(),
        }
    }

    fn tree_ref() -> &'static TreeKey {
        static TREE: std::sync::OnceLock<TreeKey> = std::sync::OnceLock::new();
        TREE.get_or_init(tree)
    }

    fn destruction(replica: ReplicaId) -> Destruction {
        Destruction {
            replica,
            disk: 0,
            held: Contents::new(),
            drops_answered: BTreeMap::new(),
            drops_sent: BTreeMap::new(),
            members: BTreeMap::new(),
        }
    }

    /// A write is at risk only when the disk that acknowledged it was
    /// destroyed and a destruction took its last copy: one a later disk of
    /// the same replica acknowledged is not, one another replica held is
    /// not, and one whose acker's disk lives is never at risk, whatever
    /// was destroyed.
    #[test]
    fn at_risk_is_acked_by_a_dead_disk_and_last_held_by_one() {
        let only_on_2 = (8 << 16) | 2;
        let also_on_3 = (9 << 16) | 2;
        let handed_on = (10 << 16) | 2;
        let acked_by_3 = (11 << 16) | 3;
        let ledger = Ledger {
            acked: vec![
                created(only_on_2, 2),
                created(only_on_2, 2),
                created(also_on_3, 2),
                created(handed_on, 2),
                created(acked_by_3, 3),
            ],
            ..Ledger::default()
        };
        // Replica 2's first disk dies holding all of its writes; 3 holds
        // one of them, 1 holds the one 2 handed on and 3's own write.
        let first = BTreeMap::from([
            (1, holding(&[handed_on, acked_by_3])),
            (2, holding(&[only_on_2, also_on_3, handed_on])),
            (3, holding(&[also_on_3, acked_by_3])),
        ]);
        // Then replica 1 dies before anyone pulled what it alone held.
        let second = BTreeMap::from([
            (1, holding(&[handed_on, acked_by_3])),
            (2, holding(&[])),
            (3, holding(&[also_on_3])),
        ]);
        let replacements = Replacements {
            destroyed: vec![destruction(2), destruction(1)],
            sent_to_disk: BTreeMap::from([(1, 1)]),
            ack_replicas: 1,
        };
        let presences = [first, second];
        let risky = replacements.at_risk_among(&ledger, &presences);
        assert_eq!(risky, BTreeSet::from([0, 3]));
    }

    // Regression (standard small seed 67): replica 1 acknowledged a write
    // and pushed it to replica 3 only; replica 1's disk was destroyed, and
    // then a drop of the tree ran on replica 3. No replica kept it, yet
    // neither rule excused it: the drop was not sent to the acker, and the
    // destruction did not take the last copy. Both together did.
    #[test]
    fn a_destruction_and_a_drop_together_take_the_last_copy() {
        let write = (12 << 16) | 1;
        let mut ledger = Ledger {
            acked: vec![created(write, 1)],
            ..Ledger::default()
        };
        let held = BTreeMap::from([(1, holding(&[write])), (3, holding(&[write]))]);
        let replacements = Replacements {
            destroyed: vec![destruction(1)],
            sent_to_disk: BTreeMap::new(),
            ack_replicas: 1,
        };
        let presences = [held];
        assert!(replacements.at_risk_among(&ledger, &presences).is_empty());
        // A drop of another tree changes nothing.
        let other = TreeKey::new(tree().cid, "other");
        ledger.drop_sent((other.cid, Some(other.tree.clone())), 3);
        assert!(replacements.at_risk_among(&ledger, &presences).is_empty());
        ledger.drop_sent((tree().cid, Some(tree().tree.clone())), 3);
        assert_eq!(
            replacements.at_risk_among(&ledger, &presences),
            BTreeSet::from([0])
        );
        // The same with two acknowledgements: both holders are gone, one
        // with its disk and one by a drop.
        let two_acks = Replacements {
            ack_replicas: 2,
            ..replacements.clone()
        };
        assert_eq!(
            two_acks.at_risk_among(&ledger, &presences),
            BTreeSet::from([0])
        );
        // A drop replica 3 had answered before the capture ran before it:
        // replica 3 held the write after it.
        let mut answered_before = replacements.clone();
        answered_before.destroyed[0].drops_answered = ledger.drops.sent.clone();
        assert!(answered_before
            .at_risk_among(&ledger, &presences)
            .is_empty());
    }

    // Regression (standard seed 183 over TCP): replica 2 left the second
    // container after its writes had been handed to replicas 1 and 3; a
    // client dropped the container on replica 3; then replica 1's disk was
    // destroyed. Two acknowledged writes were gone from every replica of
    // the container, one acked by replica 1 and one by replica 2, and both
    // were reported lost: replica 2 still held them, so the destruction
    // did not count as taking their last copy, and replica 2's own disk
    // lived. A replica that left the container keeps nothing for the
    // others: nobody pulls from it.
    #[test]
    fn a_copy_on_a_replica_that_left_keeps_nothing() {
        let by_1 = (13 << 16) | 1;
        let by_2 = (14 << 16) | 2;
        let ledger = Ledger {
            acked: vec![created(by_1, 1), created(by_2, 2)],
            ..Ledger::default()
        };
        let held = BTreeMap::from([
            (1, holding(&[by_1, by_2])),
            (2, holding(&[by_1, by_2])),
            (3, holding(&[])),
        ]);
        let member = |members: Vec<ReplicaId>| {
            let mut destroyed = destruction(1);
            destroyed.members = BTreeMap::from([(tree().cid, members)]);
            Replacements {
                destroyed: vec![destroyed],
                sent_to_disk: BTreeMap::new(),
                ack_replicas: 1,
            }
        };
        let presences = [held];
        // Replica 2 still replicates the container: its copies count.
        let stayed = member(vec![1, 2, 3]);
        assert!(stayed.at_risk_among(&ledger, &presences).is_empty());
        // It left: both writes lost their last copy that counted.
        let left = member(vec![1, 3]);
        assert_eq!(
            left.at_risk_among(&ledger, &presences),
            BTreeSet::from([0, 1])
        );
    }

    /// Only the disk a write was sent to counts: a write to replica 2's
    /// second disk outlives the destruction of its first, and a write to
    /// replica 3 outlives any destruction of replica 2.
    #[test]
    fn the_acking_disk_is_the_one_the_write_was_sent_to() {
        let replacements = Replacements {
            destroyed: vec![destruction(2)],
            sent_to_disk: BTreeMap::from([(1, 1)]),
            ..Replacements::default()
        };
        let to_2 = created(1 << 16 | 2, 2);
        assert!(replacements.acking_disk_destroyed(0, &to_2));
        assert!(!replacements.acking_disk_destroyed(1, &to_2));
        assert!(!replacements.acking_disk_destroyed(2, &created(1 << 16 | 3, 3)));
    }

    /// With ack_replicas 2 one destroyed disk never excuses a missing
    /// write, even the acker's alone holding it (it was answered only once
    /// a peer held it too); two destroyed disks that held it do, and so
    /// does a destruction that took the last copy after a drop of its tree
    /// was sent since the write, but not after a drop sent before it.
    #[test]
    fn with_two_acks_only_two_dead_holders_or_a_later_drop_excuse_a_write() {
        let (a, b, c, d) = ((8 << 16) | 2, (9 << 16) | 2, (10 << 16) | 2, (11 << 16) | 2);
        let mut ledger = Ledger {
            acked: [a, b, c, d].map(|ts| created(ts, 2)).to_vec(),
            ..Ledger::default()
        };
        ledger.drops.sent_before = BTreeMap::from([(2, 0), (3, 1)]);
        // Replica 2 dies holding all four, alone with `a`, `c` and `d`;
        // replica 3 held `b` and dies next, before 2 pulled it back.
        let first = BTreeMap::from([(2, holding(&[a, b, c, d])), (3, holding(&[b]))]);
        let second = BTreeMap::from([(2, holding(&[])), (3, holding(&[b]))]);
        let scope = (tree().cid, Some(tree().tree));
        let mut dropped = destruction(2);
        dropped.drops_sent = BTreeMap::from([((scope, 3), 1)]);
        let replacements = Replacements {
            destroyed: vec![dropped, destruction(3)],
            sent_to_disk: BTreeMap::new(),
            ack_replicas: 2,
        };
        let risky = replacements.at_risk_among(&ledger, &[first, second]);
        assert_eq!(risky, BTreeSet::from([1, 2]));
        let one = Replacements {
            ack_replicas: 1,
            ..replacements.clone()
        };
        let presences = [
            BTreeMap::from([(2, holding(&[a, b, c, d])), (3, holding(&[b]))]),
            BTreeMap::from([(2, holding(&[])), (3, holding(&[b]))]),
        ];
        assert_eq!(
            one.at_risk_among(&ledger, &presences),
            BTreeSet::from([0, 1, 2, 3])
        );
    }
}
