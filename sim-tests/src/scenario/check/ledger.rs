//! The ledger: what the clients of a run were acknowledged, which the
//! checkers hold every replica to. The scenario's workload, the `sim` fuzz
//! target and the load evaluator's sim mode all record into one.

use arbor::proto::{Request, Response};
use arbor::{ContainerId, Error, KeyValue, NodeId, ReplicaId, TreeKey, ATTR_FILE_NAME, ROOT};
use std::collections::{BTreeMap, BTreeSet};

/// The meta key whose unique value tags a move, so the checkers can tell
/// its op from other moves of the same node.
pub const MOVE_TAG_KEY: &str = "op";

/// An acknowledged write: what every replica must eventually hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acked {
    /// A node created by an op whose timestamp is the node id.
    Created {
        tree: TreeKey,
        node: NodeId,
        acker: ReplicaId,
        /// `None` where the recorder does not keep what was sent.
        sent: Option<Sent>,
    },
    /// A move tagged with a unique `MOVE_TAG_KEY` meta value.
    Moved {
        tree: TreeKey,
        node: NodeId,
        parent: NodeId,
        tag: String,
        acker: ReplicaId,
    },
    /// A remove: some op of the acker moved `node` under TRASH.
    Removed {
        tree: TreeKey,
        node: NodeId,
        acker: ReplicaId,
    },
}

impl Acked {
    pub fn tree(&self) -> &TreeKey {
        match self {
            Acked::Created { tree, .. }
            | Acked::Moved { tree, .. }
            | Acked::Removed { tree, .. } => tree,
        }
    }

    /// The replica that acknowledged the write.
    pub fn acker(&self) -> ReplicaId {
        match self {
            Acked::Created { acker, .. }
            | Acked::Moved { acker, .. }
            | Acked::Removed { acker, .. } => *acker,
        }
    }
}

/// What the caller of a creation sent: the node's meta, and its parent
/// (`Add`) or the name of its directory (an `AddByPath` leaf).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sent {
    pub items: Vec<KeyValue>,
    pub parent: Option<NodeId>,
    pub directory: Option<String>,
}

/// A write that failed, told apart from every other op by one meta item
/// only it carries (an object's OID, a record's name, a move's tag).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failed {
    pub tree: TreeKey,
    pub mark: KeyValue,
    pub error: Error,
}

/// True for an error that says the write was not applied and never will
/// be: the request was refused before it was queued (bad input, unknown
/// tree or node, overload). The other errors (timeouts, network and
/// storage errors, shutdown, a write stored but not yet on
/// `tree.ack_replicas` replicas) leave the outcome unknown.
pub fn definite(error: &Error) -> bool {
    !matches!(
        error,
        Error::Timeout
            | Error::Storage(_)
            | Error::Network(_)
            | Error::ShuttingDown
            | Error::NotReplicated { .. }
    )
}

/// The meta item that marks a write's op as this write's, if it has one.
pub fn mark_of(request: &Request) -> Option<(TreeKey, KeyValue)> {
    let (tree, items, key) = match request {
        Request::Add { tree, items, .. } => (tree, items, ATTR_FILE_NAME),
        Request::AddByPath { tree, items, .. } => (tree, items, "OID"),
        Request::Move { tree, items, .. } => (tree, items, MOVE_TAG_KEY),
        _ => return None,
    };
    let mark = items.iter().find(|kv| kv.key == key)?;
    Some((tree.clone(), mark.clone()))
}

/// What the clients did, shared between them and the checkers.
#[derive(Clone, Default)]
pub struct Ledger {
    pub acked: Vec<Acked>,
    /// Nodes known to exist per tree (acked creations), move/remove targets.
    pub known: BTreeMap<TreeKey, Vec<NodeId>>,
    /// Full paths of acked leaves made by AddByPath.
    pub leaf_paths: BTreeSet<(TreeKey, Vec<String>)>,
    /// Writes refused with a definite error: none may ever be applied.
    pub refused: Vec<Failed>,
    /// Writes whose outcome is unknown (their call timed out, say).
    pub unknown: Vec<Failed>,
    /// The mark of every marked write sent (`mark_of`), whatever became of
    /// it: no two ops of a tree may carry one (`answers::Promises`).
    pub marks_sent: Vec<(TreeKey, KeyValue)>,
    pub ops_sent: u64,
    pub ops_acked: u64,
    pub ops_failed: u64,
    /// What the intruder's calls got (`scenario::workload::intruder`).
    pub intruder: crate::scenario::workload::intruder::IntruderRecord,
    /// The drops of the run (`Drops`).
    pub drops: Drops,
    /// The disks destroyed in the run, and which disk took each write
    /// (`scenario::nemesis::replace`).
    pub replaced: crate::scenario::nemesis::replace::Replacements,
    /// What the misconfiguration windows did (`scenario::nemesis::misconfig`).
    pub misconfig: crate::scenario::nemesis::misconfig::MisconfigRecord,
}

/// What a drop covers: one tree of a container, or all of them (`None`).
pub type DropScope = (ContainerId, Option<String>);

/// The drops clients sent, to tell an acknowledged write that a drop may
/// have erased from a lost one (docs/design.md §6: a drop deletes one
/// replica's copy and every op in it). A write is erased only if every
/// replica that held it dropped its copy; its acker held it, so a drop
/// that never reached the acker erases nothing (the acker's copy comes
/// back to the others by sync). A drop sent to the acker may erase the
/// write unless it was answered before the write was sent; a drop left
/// unanswered (a timeout) may take effect any time later.
///
/// Once the acker has left the container (docs/design.md §6, membership)
/// its copy is no longer served, so a drop at the acker is no longer the
/// only way to erase the write: the leave drained, so every remaining
/// member held the write then (`Handoff`), and the write may be erased
/// only if each of them was sent a drop of its tree that it had not
/// answered by then.
#[derive(Clone, Debug, Default)]
pub struct Drops {
    /// Drops sent, per scope and replica.
    pub sent: BTreeMap<(DropScope, ReplicaId), u64>,
    /// Drops answered (done or refused), per scope and replica.
    pub answered: BTreeMap<(DropScope, ReplicaId), u64>,
    /// Per index into `Ledger::acked`: the drops of its tree its acker
    /// had answered before the write was sent. Writes recorded without it
    /// (by the recorders that never drop) are never erasable.
    pub answered_before: BTreeMap<usize, u64>,
    /// Per index into `Ledger::acked`: the drops of its tree sent to any
    /// replica before the write was sent (`scenario::nemesis::replace` asks
    /// whether one was sent since).
    pub sent_before: BTreeMap<usize, u64>,
    /// Drops answered `Done`.
    pub done: u64,
    /// The leaves that took effect, in time order.
    pub handoffs: Vec<Handoff>,
}

/// A leave that drained: when it was checked, every member remaining in
/// `cid` held every op `leaver` had stamped there, and it never served
/// the container again.
#[derive(Clone, Debug)]
pub struct Handoff {
    pub cid: ContainerId,
    pub leaver: ReplicaId,
    /// The remaining members, each holding the leaver's ops.
    pub holders: Vec<ReplicaId>,
    /// `Drops::answered` when the drain was checked: those drops had
    /// taken effect before the holders were seen holding the ops.
    answered: BTreeMap<(DropScope, ReplicaId), u64>,
}

impl Drops {
    /// The drops of `tree` in `counts`, sent to `replica` or (`None`) to
    /// any replica.
    pub(crate) fn count(
        counts: &BTreeMap<(DropScope, ReplicaId), u64>,
        tree: &TreeKey,
        replica: Option<ReplicaId>,
    ) -> u64 {
        let covers = |scope: &DropScope| {
            scope.0 == tree.cid && scope.1.as_ref().is_none_or(|name| *name == tree.tree)
        };
        counts
            .iter()
            .filter(|((scope, to), _)| covers(scope) && replica.is_none_or(|r| r == *to))
            .map(|(_, n)| n)
            .sum()
    }

    /// Drops of `tree` that `replica` answered so far: a write sent to it
    /// now is safe from them.
    pub fn answered_by(&self, tree: &TreeKey, replica: ReplicaId) -> u64 {
        Self::count(&self.answered, tree, Some(replica))
    }

    /// Drops of `tree` sent to `replica` so far.
    pub fn sent_to(&self, tree: &TreeKey, replica: ReplicaId) -> u64 {
        Self::count(&self.sent, tree, Some(replica))
    }

    /// Whether `replica` was sent a drop of `tree` that it had not
    /// answered when `answered_then` (a copy of `answered`) was taken:
    /// such a drop may have run after that moment.
    pub fn dropped_since(
        &self,
        tree: &TreeKey,
        replica: ReplicaId,
        answered_then: &BTreeMap<(DropScope, ReplicaId), u64>,
    ) -> bool {
        self.sent_to(tree, replica) > Self::count(answered_then, tree, Some(replica))
    }

    /// Drops of `tree` sent to any replica so far.
    pub fn sent_of(&self, tree: &TreeKey) -> u64 {
        Self::count(&self.sent, tree, None)
    }

    /// Drops of `tree` answered by any replica so far.
    pub fn answered_of(&self, tree: &TreeKey) -> u64 {
        Self::count(&self.answered, tree, None)
    }

    /// Whether every holder `acker`'s leave of `tree`'s container handed
    /// its writes to was sent a drop of `tree` it had not answered when
    /// the leave drained. False while `acker` has not left.
    fn dropped_by_every_holder(&self, tree: &TreeKey, acker: ReplicaId) -> bool {
        let handoff = self
            .handoffs
            .iter()
            .find(|h| h.cid == tree.cid && h.leaver == acker);
        handoff.is_some_and(|h| {
            let dropped = |&holder: &ReplicaId| {
                self.sent_to(tree, holder) > Self::count(&h.answered, tree, Some(holder))
            };
            !h.holders.is_empty() && h.holders.iter().all(dropped)
        })
    }
}

impl Ledger {
    /// Records what `acker`'s answer to a write acknowledged; the nodes the
    /// write touched (nothing for reads and error answers).
    pub fn record(
        &mut self,
        acker: ReplicaId,
        request: &Request,
        response: &Response,
    ) -> Vec<NodeId> {
        match (request, response) {
            (
                Request::AddByPath {
                    tree, path, items, ..
                },
                Response::AddedByPath { leaf, created, .. },
            ) => {
                let touched: Vec<NodeId> = created.iter().copied().chain([*leaf]).collect();
                let mut parent = (created.len() == path.len()).then_some(ROOT);
                for (&node, name) in created.iter().zip(&path[path.len() - created.len()..]) {
                    let items = vec![KeyValue::new(ATTR_FILE_NAME, name.as_bytes())];
                    let sent = Sent {
                        items,
                        parent,
                        directory: None,
                    };
                    self.created(tree, node, acker, sent);
                    parent = Some(node);
                }
                let sent = Sent {
                    items: items.clone(),
                    parent,
                    directory: path.last().cloned(),
                };
                self.created(tree, *leaf, acker, sent);
                if let Some(name) = value_of(items, ATTR_FILE_NAME) {
                    let leaf_path = path.iter().cloned().chain([name]).collect();
                    self.leaf_paths.insert((tree.clone(), leaf_path));
                }
                touched
            }
            (
                Request::Add {
                    tree,
                    parent,
                    items,
                },
                Response::Added { node },
            ) => {
                let sent = Sent {
                    items: items.clone(),
                    parent: Some(*parent),
                    directory: None,
                };
                self.created(tree, *node, acker, sent);
                vec![*node]
            }
            (
                Request::Move {
                    tree,
                    parent,
                    node,
                    items,
                },
                Response::Done,
            ) => {
                let tag = value_of(items, MOVE_TAG_KEY).expect("every move carries a tag");
                self.acked.push(Acked::Moved {
                    tree: tree.clone(),
                    node: *node,
                    parent: *parent,
                    tag,
                    acker,
                });
                vec![*node]
            }
            (Request::Remove { tree, node }, Response::Done) => {
                self.acked.push(Acked::Removed {
                    tree: tree.clone(),
                    node: *node,
                    acker,
                });
                vec![*node]
            }
            _ => Vec::new(),
        }
    }

    /// Records a write that failed with `error` by its `mark_of` (a write
    /// without one is not recorded): refused when the replica answered
    /// with a `definite` error, else unknown (an error of the caller's own
    /// transport says nothing of what the replica did).
    pub fn failed(&mut self, mark: Option<(TreeKey, KeyValue)>, error: &Error, answered: bool) {
        let Some((tree, mark)) = mark else {
            return;
        };
        let failed = Failed {
            tree,
            mark,
            error: error.clone(),
        };
        if answered && definite(error) {
            self.refused.push(failed);
        } else {
            self.unknown.push(failed);
        }
    }

    /// `record`, for a write sent when its acker had answered
    /// `answered_before` drops of its tree (`Drops::answered_by`).
    pub fn record_after_drops(
        &mut self,
        acker: ReplicaId,
        request: &Request,
        response: &Response,
        answered_before: u64,
    ) -> Vec<NodeId> {
        let first = self.acked.len();
        let touched = self.record(acker, request, response);
        for index in first..self.acked.len() {
            self.drops.answered_before.insert(index, answered_before);
        }
        touched
    }

    /// Notes that the writes recorded from `first` on were sent to the
    /// acker's disk `disk` (`World::disk_generation`).
    pub fn sent_to_disk(&mut self, first: usize, disk: u64) {
        for index in first..self.acked.len() {
            self.replaced.sent_to_disk.insert(index, disk);
        }
    }

    /// Whether a drop may have erased the acknowledged write at `index`:
    /// some drop of its tree sent to its acker was not answered before the
    /// write was sent, or its acker left the container and every member it
    /// handed the write to was sent a drop after (`Drops`).
    pub fn erasable(&self, index: usize) -> bool {
        let Some(&before) = self.drops.answered_before.get(&index) else {
            return false;
        };
        let acked = &self.acked[index];
        let (tree, acker) = (acked.tree(), acked.acker());
        self.drops.sent_to(tree, acker) > before || self.drops.dropped_by_every_holder(tree, acker)
    }

    /// Records that `leaver`'s leave of `cid` drained into `holders`: from
    /// now on only they keep what it acknowledged there.
    pub fn handed_off(&mut self, cid: ContainerId, leaver: ReplicaId, holders: Vec<ReplicaId>) {
        assert!(
            !holders.contains(&leaver),
            "a leaver hands its writes to others"
        );
        let answered = self.drops.answered.clone();
        self.drops.handoffs.push(Handoff {
            cid,
            leaver,
            holders,
            answered,
        });
    }

    /// Records a drop about to be sent.
    pub fn drop_sent(&mut self, scope: DropScope, replica: ReplicaId) {
        *self.drops.sent.entry((scope, replica)).or_default() += 1;
    }

    /// Records a drop's answer: `done` when it was carried out. A drop
    /// left without an answer is never recorded here.
    pub fn drop_answered(&mut self, scope: DropScope, replica: ReplicaId, done: bool) {
        *self.drops.answered.entry((scope, replica)).or_default() += 1;
        self.drops.done += u64::from(done);
    }

    fn created(&mut self, tree: &TreeKey, node: NodeId, acker: ReplicaId, sent: Sent) {
        self.acked.push(Acked::Created {
            tree: tree.clone(),
            node,
            acker,
            sent: Some(sent),
        });
        self.known.entry(tree.clone()).or_default().push(node);
    }
}

/// The value of `key` in a meta, as text.
fn value_of(items: &[arbor::KeyValue], key: &str) -> Option<String> {
    items
        .iter()
        .find(|kv| kv.key == key)
        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbor::{ContainerId, KeyValue, ROOT};

    /// An AddByPath acknowledges every node it made and its leaf's path; a
    /// move its tag; an error answer nothing.
    #[test]
    fn answers_are_recorded_as_acknowledged() {
        let tree = TreeKey::new(ContainerId([1; 32]), "t");
        let mut ledger = Ledger::default();
        let add = Request::AddByPath {
            tree: tree.clone(),
            attr: ATTR_FILE_NAME.into(),
            path: vec!["dir".into()],
            items: vec![KeyValue::new(ATTR_FILE_NAME, b"obj".to_vec())],
        };
        let added = Response::AddedByPath {
            leaf: 9,
            created: vec![8],
            parent: 8,
        };
        assert_eq!(ledger.record(2, &add, &added), vec![8, 9]);
        assert_eq!(ledger.known[&tree], vec![8, 9]);
        assert!(ledger
            .leaf_paths
            .contains(&(tree.clone(), vec!["dir".to_string(), "obj".into()])));
        let moved = Request::Move {
            tree: tree.clone(),
            parent: ROOT,
            node: 9,
            items: vec![KeyValue::new(MOVE_TAG_KEY, b"17".to_vec())],
        };
        assert_eq!(ledger.record(1, &moved, &Response::Done), vec![9]);
        let refused = Response::Error(arbor::Error::TreeNotFound);
        assert_eq!(ledger.record(1, &moved, &refused), Vec::<NodeId>::new());
        let tags: Vec<&str> = ledger
            .acked
            .iter()
            .filter_map(|a| match a {
                Acked::Moved { tag, .. } => Some(tag.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(tags, ["17"]);
        assert_eq!(ledger.acked.len(), 3);
    }

    /// A write is erasable by a drop of its tree (or container) sent to
    /// its acker and not answered before the write was sent, and by no
    /// other drop: not one answered before, not another tree's, not one
    /// that reached only another replica.
    #[test]
    fn only_drops_at_the_acker_not_answered_before_a_write_may_erase_it() {
        let cid = ContainerId([1; 32]);
        let tree = TreeKey::new(cid, "t");
        let other = TreeKey::new(cid, "u");
        let add = |tree: &TreeKey| Request::Add {
            tree: tree.clone(),
            parent: ROOT,
            items: vec![KeyValue::new(ATTR_FILE_NAME, b"x".to_vec())],
        };
        let t = || (cid, Some("t".to_string()));
        let mut ledger = Ledger::default();
        ledger.drop_sent(t(), 1);
        ledger.drop_answered(t(), 1, true);
        let before = ledger.drops.answered_by(&tree, 1);
        assert_eq!(before, 1);
        ledger.record_after_drops(1, &add(&tree), &Response::Added { node: 5 }, before);
        let before = ledger.drops.answered_by(&other, 1);
        ledger.record_after_drops(1, &add(&other), &Response::Added { node: 6 }, before);
        ledger.record(1, &add(&tree), &Response::Added { node: 7 });
        assert!(!ledger.erasable(0), "the drop was answered before");
        ledger.drop_sent((cid, Some("u".into())), 2);
        assert!(!ledger.erasable(1), "a drop at another replica");
        ledger.drop_sent((cid, Some("u".into())), 1);
        assert!(!ledger.erasable(0), "another tree's drop");
        assert!(
            ledger.erasable(1),
            "its tree's drop at its acker, never answered"
        );
        ledger.drop_sent((cid, None), 2);
        ledger.drop_answered((cid, None), 2, true);
        assert!(
            !ledger.erasable(0),
            "its container's later drop at another replica"
        );
        ledger.drop_sent((cid, None), 1);
        assert!(
            ledger.erasable(0),
            "its container's later drop at its acker"
        );
        assert!(!ledger.erasable(2), "recorded without its drops");
        assert_eq!(ledger.drops.sent_of(&tree), 3);
        assert_eq!(ledger.drops.answered_of(&tree), 2);
    }

    /// After its acker left the container, a write is erasable only when
    /// every member the leave handed it to was sent a drop of its tree
    /// that it had not answered when the leave drained. Members-profile
    /// seed 6 failed with a lost write before this: its acker had left,
    /// and the drop that erased it went to every remaining member.
    #[test]
    fn after_a_leave_only_drops_at_every_holder_may_erase_the_leavers_writes() {
        let cid = ContainerId([1; 32]);
        let tree = TreeKey::new(cid, "t");
        let other = TreeKey::new(cid, "u");
        let add = Request::Add {
            tree: tree.clone(),
            parent: ROOT,
            items: vec![KeyValue::new(ATTR_FILE_NAME, b"x".to_vec())],
        };
        let t = || (cid, Some("t".to_string()));
        let mut ledger = Ledger::default();
        ledger.record_after_drops(1, &add, &Response::Added { node: 5 }, 0);
        ledger.record_after_drops(4, &add, &Response::Added { node: 6 }, 0);
        // Answered at replica 3 before the drain: taken into account then.
        ledger.drop_sent(t(), 3);
        ledger.drop_answered(t(), 3, true);
        // Still on its way to replica 2 when the leave drained.
        ledger.drop_sent(t(), 2);
        ledger.handed_off(cid, 1, vec![2, 3]);
        assert!(!ledger.erasable(0), "replica 3 holds it since its drop");
        ledger.drop_sent((cid, Some("u".into())), 3);
        assert!(!ledger.erasable(0), "another tree's drop");
        assert_eq!(ledger.drops.sent_to(&other, 3), 1);
        ledger.drop_sent((cid, None), 3);
        assert!(ledger.erasable(0), "every holder was sent a drop since");
        assert!(
            !ledger.erasable(1),
            "its acker did not leave and got no drop of its own"
        );
        let mut ledger = Ledger::default();
        ledger.record_after_drops(1, &add, &Response::Added { node: 5 }, 0);
        ledger.handed_off(ContainerId([2; 32]), 1, vec![2]);
        ledger.drop_sent(t(), 2);
        assert!(!ledger.erasable(0), "its acker left another container");
    }
}
