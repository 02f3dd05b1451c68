//! Durability: nothing acknowledged is lost. Every acknowledged write is
//! in the replicas' common log at every checkpoint, unless a drop of its
//! tree may have erased it (`Ledger::erasable`; counted as erased) or
//! only a disk destroyed since held it (`scenario::nemesis::replace`; counted as
//! lost at risk). That what a replica had stored before a crash or a
//! process restart is still there after it (commits are durable,
//! `Durability::Immediate`) is the supervisor's own check
//! (`world::supervisor::kept_across_restart`).

use super::{Checker, Checkpoint};
use crate::coverage::Coverage;
use crate::failure::{Failure, FailureKind};
use crate::scenario::check::ledger::Acked;
use arbor::forest::records::LogView;
use arbor::forest::ReplicaContent;
use arbor::runtime::BoxFuture;
use arbor::{timestamp_replica, NodeId, ReplicaId, TreeKey, TRASH};
use std::collections::{BTreeMap, BTreeSet};

type Result<T = ()> = std::result::Result<T, Failure>;

/// Every write of the ledger is in the log its tree's replicas share (the
/// first replica's; `convergence::SameState` runs first and holds the
/// others to it).
pub struct AckedWrites;

impl Checker for AckedWrites {
    fn check<'a>(&'a self, at: &'a Checkpoint<'a>) -> BoxFuture<'a, Result> {
        Box::pin(async move { acked_present(at) })
    }
}

/// One logged op, as the acked-write check needs it.
struct LoggedOp<'a> {
    ts: u64,
    parent: NodeId,
    tag: Option<&'a [u8]>,
}

/// Per tree, the logged ops by the node they move: each acked write looks
/// among the ops of its own node only.
type OpsByChild<'a> = BTreeMap<&'a TreeKey, BTreeMap<NodeId, Vec<LoggedOp<'a>>>>;

/// The common log of every tree some replica holds.
fn common_logs<'a>(at: &'a Checkpoint) -> BTreeMap<&'a TreeKey, &'a ReplicaContent> {
    let trees: BTreeSet<&TreeKey> = at.contents.values().flat_map(|d| d.keys()).collect();
    trees
        .into_iter()
        .filter_map(|tree| {
            let first = *at.world.replicas_of(&tree.cid).first()?;
            Some((tree, at.content(first, tree)))
        })
        .collect()
}

fn ops_by_child<'a>(logs: &BTreeMap<&'a TreeKey, &'a ReplicaContent>) -> Result<OpsByChild<'a>> {
    let mut all = BTreeMap::new();
    for (&tree, content) in logs {
        let mut by_child: BTreeMap<NodeId, Vec<LoggedOp>> = BTreeMap::new();
        for (ts, op) in content.ops() {
            let op = LogView::parse_op(op).map_err(|e| {
                Failure::new(
                    FailureKind::TreeInvariant,
                    format!("{:?}/{}: op {ts}: {e}", tree.cid, tree.tree),
                )
            })?;
            let tag = op
                .items()
                .find(|(key, _)| *key == crate::scenario::check::ledger::MOVE_TAG_KEY.as_bytes())
                .map(|(_, value)| value);
            by_child.entry(op.child).or_default().push(LoggedOp {
                ts,
                parent: op.parent,
                tag,
            });
        }
        all.insert(tree, by_child);
    }
    Ok(all)
}

fn acked_present(at: &Checkpoint) -> Result {
    let logs = common_logs(at);
    let timestamps: BTreeMap<&TreeKey, BTreeSet<u64>> = logs
        .iter()
        .map(|(&tree, content)| (tree, content.ops().map(|(ts, _)| ts).collect()))
        .collect();
    let by_child = ops_by_child(&logs)?;
    let ops_of = |tree: &TreeKey, node: &NodeId| -> &[LoggedOp] {
        by_child
            .get(tree)
            .and_then(|ops| ops.get(node))
            .map_or(&[], Vec::as_slice)
    };
    let mut erased = 0;
    let at_risk = at.ledger.replaced.at_risk(at.ledger);
    let mut lost_at_risk = 0;
    for (index, acked) in at.ledger.acked.iter().enumerate() {
        let present = match acked {
            Acked::Created { tree, node, .. } => {
                timestamps.get(tree).is_some_and(|ts| ts.contains(node))
            }
            Acked::Moved {
                tree,
                node,
                parent,
                tag,
                ..
            } => ops_of(tree, node)
                .iter()
                .any(|op| op.parent == *parent && op.tag == Some(tag.as_bytes())),
            Acked::Removed { tree, node, acker } => ops_of(tree, node)
                .iter()
                .any(|op| op.parent == TRASH && timestamp_replica(op.ts) == *acker),
        };
        if !present && at.ledger.erasable(index) {
            erased += 1;
            continue;
        }
        if !present && at_risk.contains(&index) {
            lost_at_risk += 1;
            continue;
        }
        if !present {
            let tree = acked.tree();
            let holders: Vec<ReplicaId> = (at.contents.iter())
                .filter(|(_, trees)| {
                    let presence = crate::scenario::nemesis::replace::Presence::of(
                        trees.iter().filter(|(t, _)| *t == tree),
                    );
                    presence.holds(acked)
                })
                .map(|(&replica, _)| replica)
                .collect();
            return Err(Failure::new(
                FailureKind::LostWrite,
                format!(
                    "{}: acknowledged {acked:?} is missing (replicas holding it now: {holders:?})",
                    at.when
                ),
            ));
        }
    }
    let coverage = &at.world.hooks.coverage;
    coverage.add(Coverage::ErasedByDrop, erased);
    coverage.add(Coverage::WritesAtRisk, at_risk.len() as u64);
    coverage.add(Coverage::LostAtRisk, lost_at_risk);
    Ok(())
}
