//! The answer oracle: what a replica should answer to a read, worked out
//! by the reference model (`arbor::model`) from that replica's own log at
//! the moment it answered. The engine's answer and the model's must agree
//! exactly; a bug that makes every replica wrong the same way is caught
//! here, where comparing replicas with each other sees nothing.
//!
//! `watch` applies it to every answer a replica gives during the run (and
//! checks each pull pass, and the sessions of the clients); the checkpoint
//! checker `check::answers` applies it to reads it issues itself once
//! the cluster has converged.

pub mod end_to_end;
pub mod expect;
pub mod watch;

use arbor::forest::Forest;
use arbor::model::TreeModel;
use arbor::{Move, NodeId, NodeInfo, Timestamp, TreeKey};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

/// One tree of one replica as it is now: its log by timestamp, its stored
/// nodes, and what the model makes of that log (each built on first need).
pub struct TreeView {
    pub log: Vec<Move>,
    pub nodes: Vec<NodeInfo>,
    /// The height of the log's first op: 0, or the height the tree's
    /// dropped incarnations reached (docs/design.md §6).
    pub first_height: u64,
    /// Which incarnation of the tree this is (`Forest::tree_incarnation`).
    pub incarnation: u64,
    model: OnceLock<TreeModel>,
    /// The model's nodes by parent, ascending ids.
    children: OnceLock<BTreeMap<NodeId, Vec<NodeInfo>>>,
    timestamps: OnceLock<BTreeSet<Timestamp>>,
}

impl TreeView {
    /// The tree on `forest`; `Ok(None)` when the replica has no such tree.
    /// Its reads are synchronous, so no other task of the simulation runs
    /// between them: they see one state of the tree.
    pub fn read(forest: &Forest, tree: &TreeKey) -> Result<Option<TreeView>, arbor::Error> {
        let dump = match forest.dump(tree) {
            Ok(dump) => dump,
            Err(arbor::Error::TreeNotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        let next_height = forest.next_height(tree)?;
        let Some(incarnation) = forest.tree_incarnation(tree)? else {
            return Ok(None);
        };
        let first_height = next_height
            .checked_sub(dump.log.len() as u64)
            .expect("a log holds no more ops than heights");
        Ok(Some(TreeView {
            log: dump.log,
            nodes: dump.nodes,
            first_height,
            incarnation,
            model: OnceLock::new(),
            children: OnceLock::new(),
            timestamps: OnceLock::new(),
        }))
    }

    /// This view with the ops the log took since (`more`, the heights from
    /// `first_height + log.len()` on, in height order), for the answer
    /// checks: within one incarnation a log only grows. Only the log and
    /// the model are kept (the stored nodes are not read again); a model
    /// already built is carried over and takes the new ops.
    pub fn extended(&self, more: &[Move]) -> TreeView {
        let mut added: Vec<Move> = more.to_vec();
        added.sort_by_key(|op| op.ts());
        let mut log = Vec::with_capacity(self.log.len() + added.len());
        let (mut old, mut new) = (self.log.iter().peekable(), added.into_iter().peekable());
        loop {
            let take_old = match (old.peek(), new.peek()) {
                (Some(a), Some(b)) => {
                    assert_ne!(a.ts(), b.ts(), "a log holds timestamp {} twice", a.ts());
                    a.ts() < b.ts()
                }
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            if take_old {
                log.push(old.next().expect("peeked").clone());
            } else {
                log.push(new.next().expect("peeked"));
            }
        }
        let model = OnceLock::new();
        if let Some(built) = self.model.get() {
            let mut built = built.clone();
            for op in more {
                assert!(built.apply(op), "a log holds timestamp {} twice", op.ts());
            }
            let _ = model.set(built);
        }
        TreeView {
            log,
            nodes: Vec::new(),
            first_height: self.first_height,
            incarnation: self.incarnation,
            model,
            children: OnceLock::new(),
            timestamps: OnceLock::new(),
        }
    }

    /// The tree as it was before the ops `late` (the last ones its log
    /// took: within one incarnation a log only grows, so without them it
    /// is an earlier state). Only the log is kept: the answer checks read
    /// nothing else.
    pub fn without(&self, late: &BTreeSet<Timestamp>) -> TreeView {
        let log: Vec<Move> = self
            .log
            .iter()
            .filter(|op| !late.contains(&op.ts()))
            .cloned()
            .collect();
        assert_eq!(
            log.len() + late.len(),
            self.log.len(),
            "late ops are logged"
        );
        TreeView {
            log,
            nodes: Vec::new(),
            first_height: self.first_height,
            incarnation: self.incarnation,
            model: OnceLock::new(),
            children: OnceLock::new(),
            timestamps: OnceLock::new(),
        }
    }

    /// The model of this log: every op applied in timestamp order.
    pub fn model(&self) -> &TreeModel {
        self.model.get_or_init(|| {
            let mut model = TreeModel::new();
            for op in &self.log {
                assert!(
                    model.apply(op),
                    "a dumped log holds timestamp {} twice",
                    op.ts()
                );
            }
            model
        })
    }

    /// The op logged at `ts`.
    pub fn op_at(&self, ts: Timestamp) -> Option<&Move> {
        let at = self.log.binary_search_by_key(&ts, |op| op.ts()).ok()?;
        Some(&self.log[at])
    }

    pub fn timestamps(&self) -> &BTreeSet<Timestamp> {
        self.timestamps
            .get_or_init(|| self.log.iter().map(|op| op.ts()).collect())
    }

    /// The model's children of `parent`, ascending.
    pub fn children(&self, parent: NodeId) -> &[NodeInfo] {
        let all = self.children.get_or_init(|| {
            let mut all: BTreeMap<NodeId, Vec<NodeInfo>> = BTreeMap::new();
            for node in self.model().dump().nodes {
                all.entry(node.parent).or_default().push(node);
            }
            all
        });
        all.get(&parent).map_or(&[][..], Vec::as_slice)
    }

    /// The stored nodes differ from the model's state for the stored log:
    /// the first difference.
    pub fn state_difference(&self) -> Option<String> {
        let expected = self.model().dump().nodes;
        if expected == self.nodes {
            return None;
        }
        let first = expected.iter().zip(&self.nodes).find(|(m, s)| m != s);
        Some(match first {
            Some((model, stored)) => format!("stored {stored:?} where the model has {model:?}"),
            None => format!(
                "{} stored nodes, {} in the model",
                self.nodes.len(),
                expected.len()
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbor::{KeyValue, Meta, ROOT};

    fn op(ts: Timestamp, parent: NodeId, child: NodeId) -> Move {
        Move {
            parent,
            child,
            meta: Meta {
                time: ts,
                items: vec![KeyValue {
                    key: "FileName".into(),
                    value: format!("n{child}").into_bytes(),
                }],
            },
        }
    }

    fn view_of(log: &[Move]) -> TreeView {
        let mut log = log.to_vec();
        log.sort_by_key(|op| op.ts());
        TreeView {
            log,
            nodes: Vec::new(),
            first_height: 0,
            incarnation: 1,
            model: OnceLock::new(),
            children: OnceLock::new(),
            timestamps: OnceLock::new(),
        }
    }

    /// An extended view is the view of the whole log: ops in timestamp
    /// order, the same model whether or not the old one was built (new ops
    /// older than logged ones included: 2 moves node 11 under 10 before 3
    /// moves 10 under 11, which the model then refuses as a cycle).
    #[test]
    fn an_extended_view_is_the_view_of_the_whole_log() {
        let first = [op(1, ROOT, 10), op(3, 10, 11), op(5, 11, 10)];
        let more = [op(4, ROOT, 12), op(2, ROOT, 11), op(6, 12, 13)];
        let all: Vec<Move> = first.iter().chain(&more).cloned().collect();
        let whole = view_of(&all);
        for built in [false, true] {
            let start = view_of(&first);
            if built {
                let _ = start.model();
            }
            let extended = start.extended(&more);
            assert_eq!(extended.model.get().is_some(), built);
            let times: Vec<Timestamp> = extended.log.iter().map(|op| op.ts()).collect();
            assert_eq!(times, vec![1, 2, 3, 4, 5, 6]);
            assert_eq!(extended.log, whole.log);
            assert_eq!(extended.model().dump().nodes, whole.model().dump().nodes);
            assert_eq!(extended.first_height, 0);
            assert_eq!(extended.incarnation, 1);
        }
    }
}
