//! The checkers that hold a converged cluster to the reference model and
//! to what each caller was promised:
//!
//! - `ModelState`: every tree's stored nodes are the model's state for its
//!   stored log, on its first replica (`SameState` holds the others to it;
//!   a bug that makes every replica wrong alike shows here);
//! - `ConvergedReads`: every read RPC, issued on each tree's first replica (GetSubTree
//!   at depths 0-3 from the root and from directories, GetNodeByPath both
//!   ways, GetMeta, TreeList, GetOpLog and GetOpLogStamps paged through the
//!   whole log), answers what the model of that replica's log says;
//! - `Promises`: an acknowledged creation carries exactly what its caller
//!   sent; an acknowledged move took effect and an acknowledged remove left
//!   its node under TRASH unless the model says a newer op overrode it (or
//!   the move would have made a cycle); a write refused with a definite
//!   error appears nowhere; and no creation was carried out twice (no two
//!   nodes of a tree carry one write's mark, whatever its caller was told).
//!
//! They also count the situations the run reached (`coverage`).

use super::{Checker, Checkpoint};
use crate::coverage::{Coverage, DEEP_UNDO_OPS};
use crate::failure::{Failure, FailureKind};
use crate::scenario::check::ledger::{Acked, Failed, Sent};
use crate::scenario::check::oracle::expect::{check_read, wrong_detail, Checked};
use crate::scenario::check::oracle::TreeView;
use crate::scenario::workload::intruder::CHECKER_CLIENT;
use crate::world::World;
use arbor::proto::{Request, Response};
use arbor::runtime::BoxFuture;
use arbor::{
    timestamp_replica, Caller, KeyValue, Move, NodeId, ReplicaId, TreeKey, ATTR_FILE_NAME, ROOT,
    TRASH,
};
use std::collections::{BTreeMap, BTreeSet};

type Result<T = ()> = std::result::Result<T, Failure>;

/// Directories GetSubTree starts from, per tree, at most.
const SUBTREE_DIRECTORIES_MAX: usize = 4;
/// Nodes GetMeta asks for, per tree, at most.
const META_NODES_MAX: usize = 12;
/// Page size of the paged log reads (small, so a log takes many pages).
const LOG_PAGE: u32 = 16;
/// Trees with more ops are not read at checkpoints (the load evaluator's
/// sim mode writes far larger trees than the scenario; `ModelState` still
/// holds them to the model).
const CONVERGED_READS_OPS_MAX: usize = 5_000;

/// The trees of every replica's content, each with its holders.
fn trees(at: &Checkpoint) -> BTreeSet<TreeKey> {
    at.contents
        .values()
        .flat_map(|d| d.keys().cloned())
        .collect()
}

/// The view of `tree` on `replica`; a failure when it cannot be read.
fn view(world: &World, replica: ReplicaId, tree: &TreeKey) -> Result<Option<TreeView>> {
    let node = world.node(replica);
    let service = node.service().ok_or_else(|| {
        Failure::new(
            FailureKind::Liveness,
            format!("{} is down at check time", node.name),
        )
    })?;
    TreeView::read(service.forest(), tree)
        .map_err(|e| Failure::new(FailureKind::Storage, format!("{}: dump: {e}", node.name)))
}

fn first_holder(world: &World, tree: &TreeKey) -> Option<ReplicaId> {
    world.replicas_of(&tree.cid).first().copied()
}

/// Stored state equals the model's state of the stored log.
pub struct ModelState;

impl Checker for ModelState {
    fn check<'a>(&'a self, at: &'a Checkpoint<'a>) -> BoxFuture<'a, Result> {
        Box::pin(async move {
            // `SameState` ran first: the other replicas hold the same bytes.
            for tree in trees(at) {
                if let Some(replica) = first_holder(at.world, &tree) {
                    let Some(view) = view(at.world, replica, &tree)? else {
                        continue;
                    };
                    if let Some(difference) = view.state_difference() {
                        return Err(Failure::new(
                            FailureKind::WrongAnswer,
                            format!(
                                "{}: replica-{replica} {:?}/{}: {difference}",
                                at.when, tree.cid, tree.tree
                            ),
                        ));
                    }
                }
            }
            Ok(())
        })
    }
}

/// Counts, from the final logs of every tree, the situations of
/// `coverage`: per replica its arrival order (undo/redo, ops older than the
/// log), and from the model of the common log cycles refused and same-name
/// directories. Run once, at the last checkpoint.
pub fn count_situations(world: &World) -> Result {
    let mut trees = BTreeSet::new();
    for node in &world.nodes {
        if let Some(Ok(all)) = node.service().map(|s| s.forest().all_trees()) {
            trees.extend(all);
        }
    }
    for tree in trees {
        count_tree(world, &tree)?;
    }
    Ok(())
}

fn count_tree(world: &World, tree: &TreeKey) -> Result {
    let coverage = &world.hooks.coverage;
    for replica in world.replicas_of(&tree.cid) {
        let Some(service) = world.node(replica).service() else {
            continue;
        };
        let forest = service.forest();
        let Ok(height) = forest.next_height(tree) else {
            continue;
        };
        let Ok(entries) = forest.get_op_log(tree, 0, height as usize) else {
            continue;
        };
        let mut seen = BTreeSet::new();
        for entry in entries {
            let ts = entry.op.ts();
            let newer = seen.range(ts..).take(DEEP_UNDO_OPS).count();
            if newer > 0 {
                coverage.hit(Coverage::UndoRedo);
            }
            if newer >= DEEP_UNDO_OPS {
                coverage.hit(Coverage::UndoRedoDeep);
            }
            if seen.first().is_some_and(|&oldest| ts < oldest) {
                coverage.hit(Coverage::OlderThanLog);
            }
            seen.insert(ts);
        }
    }
    let Some(first) = first_holder(world, tree) else {
        return Ok(());
    };
    let Some(view) = view(world, first, tree)? else {
        return Ok(());
    };
    let model = view.model();
    let refused = view
        .log
        .iter()
        .filter(|op| model.effective(op.ts()) == Some(false));
    coverage.add(Coverage::CycleRefused, refused.count() as u64);
    let mut directories = BTreeSet::new();
    for node in &view.nodes {
        if node.meta.is_internal() && !directories.insert((node.parent, node.meta.file_name())) {
            coverage.hit(Coverage::SameNameDirectories);
        }
    }
    Ok(())
}

/// Every read RPC on every replica answers what the model says.
pub struct ConvergedReads;

impl Checker for ConvergedReads {
    fn check<'a>(&'a self, at: &'a Checkpoint<'a>) -> BoxFuture<'a, Result> {
        Box::pin(async move {
            // One replica per tree: `SameState` ran first, and
            // `SameReads` compares path reads (which per-replica caches
            // serve) across all of them.
            for tree in trees(at) {
                if let Some(replica) = first_holder(at.world, &tree) {
                    reads_on(at, replica, &tree).await?;
                }
            }
            Ok(())
        })
    }
}

/// The reads of `tree` the checkpoint issues.
fn reads_of(at: &Checkpoint, tree: &TreeKey, view: &TreeView) -> Vec<Request> {
    let model = view.model();
    let mut reads = Vec::new();
    let directories = model
        .children(ROOT)
        .into_iter()
        .filter(|id| model.node(*id).is_some_and(|n| n.meta.is_internal()))
        .take(SUBTREE_DIRECTORIES_MAX);
    for root in [ROOT].into_iter().chain(directories) {
        for depth in 0..=3 {
            let tree = tree.clone();
            reads.push(Request::GetSubTree { tree, root, depth });
        }
    }
    let known = at.ledger.known.get(tree).map_or(&[][..], Vec::as_slice);
    for &node in known.iter().take(META_NODES_MAX) {
        reads.push(Request::GetMeta {
            tree: tree.clone(),
            node,
        });
    }
    let paths = at.ledger.leaf_paths.iter().filter(|(t, _)| t == tree);
    for (_, path) in paths.take(META_NODES_MAX) {
        for latest_only in [false, true] {
            reads.push(crate::scenario::workload::read_request(
                tree.clone(),
                path.clone(),
                latest_only,
            ));
        }
    }
    reads.push(Request::TreeList { cid: tree.cid });
    reads
}

/// The checkpoint's reads of `tree` on `replica`, answered and held to the
/// model in one step of the simulation (nothing commits in between), and
/// the whole log paged through.
async fn reads_on(at: &Checkpoint<'_>, replica: ReplicaId, tree: &TreeKey) -> Result {
    let Some(planned) = view(at.world, replica, tree)? else {
        return Ok(());
    };
    if planned.log.len() > CONVERGED_READS_OPS_MAX {
        return Ok(());
    }
    let reads = reads_of(at, tree, &planned);
    let key = tree.clone();
    let answered = at
        .world
        .on_node(replica, move |service| async move {
            let mut answers = Vec::new();
            for request in reads {
                let response = service.handle(&checker_caller(), request.clone()).await;
                answers.push((request, response));
            }
            let logs = page_through(&service, &key).await;
            (
                answers,
                logs,
                TreeView::read(service.forest(), &key),
                service,
            )
        })
        .await;
    let Some((answers, logs, Ok(Some(view)), service)) = answered else {
        return Ok(());
    };
    let coverage = &at.world.hooks.coverage;
    for (request, response) in answers.iter().chain(&logs) {
        match check_read(request, response, Some(&view), service.forest()) {
            Checked::Agreed(kind) => coverage.hit(kind),
            Checked::Skipped => {}
            Checked::Wrong(wrong) => {
                let detail = wrong_detail(replica, request, &wrong);
                return Err(Failure::new(
                    FailureKind::WrongAnswer,
                    format!("{}: {detail}", at.when),
                ));
            }
        }
    }
    every_op_once(at, replica, tree, &logs, &view)
}

/// GetOpLog and GetOpLogStamps from height 0 until an empty page.
async fn page_through(
    service: &arbor::service::Service,
    tree: &TreeKey,
) -> Vec<(Request, Response)> {
    let mut out = Vec::new();
    for stamps in [false, true] {
        let mut from_height = 0;
        loop {
            let (tree, limit) = (tree.clone(), LOG_PAGE);
            let request = if stamps {
                Request::GetOpLogStamps {
                    tree,
                    from_height,
                    limit,
                }
            } else {
                Request::GetOpLog {
                    tree,
                    from_height,
                    limit,
                }
            };
            let response = service.handle(&checker_caller(), request.clone()).await;
            let next = match &response {
                Response::OpLog {
                    entries,
                    next_height,
                } if !entries.is_empty() => *next_height,
                Response::OpLogStamps {
                    stamps,
                    next_height,
                    ..
                } if !stamps.is_empty() => *next_height,
                _ => u64::MAX,
            };
            out.push((request, response));
            if next <= from_height || next == u64::MAX {
                break;
            }
            from_height = next;
        }
    }
    out
}

/// The GetOpLog pages together hold every logged op exactly once.
fn every_op_once(
    at: &Checkpoint,
    replica: ReplicaId,
    tree: &TreeKey,
    pages: &[(Request, Response)],
    view: &TreeView,
) -> Result {
    let mut seen = BTreeSet::new();
    for (_, response) in pages {
        if let Response::OpLog { entries, .. } = response {
            for entry in entries {
                if !seen.insert(entry.op.ts()) {
                    return Err(wrong_log(
                        at,
                        replica,
                        tree,
                        format!("op {} twice", entry.op.ts()),
                    ));
                }
            }
        }
    }
    if seen != *view.timestamps() {
        let detail = format!("{} ops paged, {} logged", seen.len(), view.log.len());
        return Err(wrong_log(at, replica, tree, detail));
    }
    Ok(())
}

fn wrong_log(at: &Checkpoint, replica: ReplicaId, tree: &TreeKey, detail: String) -> Failure {
    Failure::new(
        FailureKind::WrongAnswer,
        format!(
            "{}: replica-{replica} {:?}/{}: GetOpLog paged through: {detail}",
            at.when, tree.cid, tree.tree
        ),
    )
}

/// What each caller was promised (see the module's words).
pub struct Promises;

impl Checker for Promises {
    fn check<'a>(&'a self, at: &'a Checkpoint<'a>) -> BoxFuture<'a, Result> {
        Box::pin(async move { promises(at) })
    }
}

/// One tree's common state: the view and its ops by the node they move.
struct Common {
    view: TreeView,
    by_child: BTreeMap<NodeId, Vec<usize>>,
}

impl Common {
    fn new(view: TreeView) -> Self {
        let mut by_child: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
        for (i, op) in view.log.iter().enumerate() {
            by_child.entry(op.child).or_default().push(i);
        }
        Self { view, by_child }
    }

    fn ops_of(&self, node: NodeId) -> impl Iterator<Item = &Move> {
        let at = self.by_child.get(&node).map_or(&[][..], Vec::as_slice);
        at.iter().map(|&i| &self.view.log[i])
    }

    fn stored(&self, node: NodeId) -> Option<&arbor::NodeInfo> {
        let at = self.view.nodes.binary_search_by_key(&node, |n| n.id).ok()?;
        Some(&self.view.nodes[at])
    }
}

fn promises(at: &Checkpoint) -> Result {
    let mut common: BTreeMap<TreeKey, Option<Common>> = BTreeMap::new();
    for tree in trees(at) {
        let Some(first) = first_holder(at.world, &tree) else {
            continue;
        };
        common.insert(tree.clone(), view(at.world, first, &tree)?.map(Common::new));
    }
    // A write only a destroyed disk held is gone by design, and the stamp
    // it had may name another op now (`scenario::nemesis::replace`).
    let at_risk = at.ledger.replaced.at_risk(at.ledger);
    // An op whose last copy went with a destroyed disk is gone for good:
    // a node made under it lost its directory, and its stamp may name
    // another op now. It was the acker's only if a drop took the acker's
    // copy (else the acker's disk still holds it, or it is at risk).
    let gone = at.ledger.replaced.ops_gone();
    for (index, acked) in at.ledger.acked.iter().enumerate() {
        if at_risk.contains(&index) {
            continue;
        }
        if let Acked::Created { tree, node, .. } = acked {
            if at.ledger.erasable(index) && gone.contains(&(tree.clone(), *node)) {
                continue;
            }
            // A drop may have erased it on every replica, and its acker's
            // disk, destroyed since, took the drop's marks along: the
            // rebuilt node may stamp another op with its stamp. (A replica
            // still holding it would meet that op as a stamp conflict,
            // which `intruder` fails.)
            if at.ledger.erasable(index) && at.ledger.replaced.acking_disk_destroyed(index, acked) {
                continue;
            }
        }
        let tree = match acked {
            Acked::Created { tree, .. }
            | Acked::Moved { tree, .. }
            | Acked::Removed { tree, .. } => tree,
        };
        // A missing tree or op is `durability::AckedWrites`'s to report.
        let Some(Some(state)) = common.get(tree) else {
            continue;
        };
        let dropped = at.ledger.drops.sent_of(tree) > 0;
        let lost_dir = |dir: NodeId| gone.contains(&(tree.clone(), dir));
        if let Err(broken) = kept(acked, state, dropped, &lost_dir) {
            return Err(Failure::new(
                FailureKind::BrokenPromise,
                format!("{}: {:?}/{}: {broken}", at.when, tree.cid, tree.tree),
            ));
        }
    }
    never_applied(at)?;
    applied_once(at, &common)?;
    let coverage = &at.world.hooks.coverage;
    for failed in &at.ledger.unknown {
        if let Some(Some(state)) = common.get(&failed.tree) {
            if state.view.log.iter().any(|op| carries(op, &failed.mark)) {
                coverage.hit(Coverage::TimeoutLaterApplied);
            }
        }
    }
    coverage.add(Coverage::DefiniteFailure, at.ledger.refused.len() as u64);
    Ok(())
}

/// Each marked write sent made at most one node: a creation carried out
/// twice (a transport that sends a write again after its connection broke
/// behind it, say) leaves its mark on two nodes. (Later ops of the same
/// node may carry its meta again, and a move carried out twice leaves one
/// node where it was told to go: neither shows here.)
fn applied_once(at: &Checkpoint, common: &BTreeMap<TreeKey, Option<Common>>) -> Result {
    let mut sent: BTreeMap<&TreeKey, BTreeSet<&KeyValue>> = BTreeMap::new();
    for (tree, mark) in &at.ledger.marks_sent {
        sent.entry(tree).or_default().insert(mark);
    }
    for (tree, marks) in sent {
        let Some(Some(state)) = common.get(tree) else {
            continue;
        };
        // The node each mark first came with, and that op's stamp.
        let mut seen: BTreeMap<&KeyValue, (NodeId, u64)> = BTreeMap::new();
        for op in &state.view.log {
            for item in op.meta.items.iter().filter(|kv| marks.contains(kv)) {
                let (node, first) = *seen.entry(item).or_insert((op.child, op.ts()));
                if node != op.child {
                    return Err(Failure::new(
                        FailureKind::BrokenPromise,
                        format!(
                            "{}: {:?}/{}: one write carried out twice: ops {first} and {} \
                             both carry {item:?}, for nodes {node} and {}",
                            at.when,
                            tree.cid,
                            tree.tree,
                            op.ts(),
                            op.child
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

fn carries(op: &Move, mark: &KeyValue) -> bool {
    op.meta.items.iter().any(|kv| kv == mark)
}

/// One acknowledged write against the common state.
/// `dropped`: some drop of the tree was sent, which may have erased ops
/// this write's ops build on.
fn kept(
    acked: &Acked,
    state: &Common,
    dropped: bool,
    lost_dir: &dyn Fn(NodeId) -> bool,
) -> std::result::Result<(), String> {
    match acked {
        Acked::Created {
            node,
            sent: Some(sent),
            ..
        } => created_as_sent(*node, sent, state, dropped, lost_dir),
        Acked::Created { sent: None, .. } => Ok(()),
        Acked::Moved {
            node, parent, tag, ..
        } => {
            let tagged = |op: &&Move| {
                op.parent == *parent
                    && op.meta.items.iter().any(|kv| {
                        kv.key == crate::scenario::check::ledger::MOVE_TAG_KEY
                            && kv.value == tag.as_bytes()
                    })
            };
            let Some(op) = state.ops_of(*node).find(tagged) else {
                return Ok(());
            };
            took_effect(op, state).map_err(|e| format!("acknowledged move {tag} of {node}: {e}"))
        }
        Acked::Removed { node, acker, .. } => {
            let mut removes = state
                .ops_of(*node)
                .filter(|op| op.parent == TRASH && timestamp_replica(op.ts()) == *acker);
            match removes.try_for_each(|op| took_effect(op, state)) {
                Ok(()) => Ok(()),
                Err(e) => Err(format!("acknowledged remove of {node}: {e}")),
            }
        }
    }
}

/// The node of `op` is where `op` put it, unless the model says the op
/// would have made a cycle or a newer op of the node overrode it.
fn took_effect(op: &Move, state: &Common) -> std::result::Result<(), String> {
    let model = state.view.model();
    if model.effective(op.ts()) != Some(true) {
        return Ok(());
    }
    let current = model.node(op.child).map(|n| n.meta.time);
    if current != Some(op.ts()) {
        return Ok(());
    }
    match state.stored(op.child) {
        Some(node) if node.parent == op.parent && node.meta.time == op.ts() => Ok(()),
        other => Err(format!(
            "op {} should have put it under {}, it is stored as {:?}",
            op.ts(),
            op.parent,
            other.map(|n| (n.parent, n.meta.time))
        )),
    }
}

/// The creating op of `node` carries what its caller sent.
fn created_as_sent(
    node: NodeId,
    sent: &Sent,
    state: &Common,
    dropped: bool,
    lost_dir: &dyn Fn(NodeId) -> bool,
) -> std::result::Result<(), String> {
    let Some(op) = state.view.op_at(node) else {
        return Ok(());
    };
    let wrong = if op.child != node {
        Some(format!("op {node} moves {} instead", op.child))
    } else if op.meta.items != sent.items {
        Some(format!(
            "carries {:?}, the caller sent {:?}",
            op.meta.items, sent.items
        ))
    } else if sent.parent.is_some_and(|p| p != op.parent) {
        Some(format!(
            "under {}, the caller said {:?}",
            op.parent, sent.parent
        ))
    } else if let Some(dir) = &sent.directory {
        let expected = [KeyValue::new(ATTR_FILE_NAME, dir.as_bytes())];
        let parent = state.view.op_at(op.parent).map(|p| p.meta.items.as_slice());
        // A drop may have erased the directory's op and kept the leaf's
        // (docs/design.md §6); a directory op that is there must match.
        // So may a destroyed disk that held its last copy, and the
        // directory's stamp may name another op since.
        let erased = (dropped && parent.is_none()) || lost_dir(op.parent);
        (!erased && parent != Some(&expected[..]))
            .then(|| format!("under {} ({parent:?}), not directory {dir:?}", op.parent))
    } else {
        None
    };
    match wrong {
        Some(wrong) => Err(format!("acknowledged node {node}: {wrong}")),
        None => Ok(()),
    }
}

/// No replica's log holds an op of a write refused with a definite error.
fn never_applied(at: &Checkpoint) -> Result {
    let mut by_tree: BTreeMap<&TreeKey, Vec<&Failed>> = BTreeMap::new();
    for failed in &at.ledger.refused {
        by_tree.entry(&failed.tree).or_default().push(failed);
    }
    for (tree, refused) in by_tree {
        for replica in at.world.replicas_of(&tree.cid) {
            let Some(view) = view(at.world, replica, tree)? else {
                continue;
            };
            for failed in &refused {
                if let Some(op) = view.log.iter().find(|op| carries(op, &failed.mark)) {
                    return Err(Failure::new(
                        FailureKind::BrokenPromise,
                        format!(
                            "{}: replica-{replica} {:?}/{}: op {} carries {:?} of a write refused with \"{}\"",
                            at.when, tree.cid, tree.tree, op.ts(), failed.mark, failed.error
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The identity the checker reads with: an owner of every container in the
/// simulated access config, since client op-log pages need the owner right.
fn checker_caller() -> Caller {
    Caller::Client(CHECKER_CLIENT.into())
}
