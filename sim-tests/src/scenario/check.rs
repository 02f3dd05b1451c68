//! The checkers that run once the faults have healed: convergence (same
//! log and tree on every replica), durability of every acknowledged write,
//! equal reads everywhere, nobody left waiting, and liveness within a
//! bounded simulated time.

use super::workload::{read_request, Acked, Workload};
use crate::failure::{Failure, FailureKind};
use crate::world::clock::global_now;
use crate::world::transport::RequestKind;
use crate::world::World;
use arbor::forest::records::LogView;
use arbor::forest::{ReplicaContent, TreeDump};
use arbor::proto::Response;
use arbor::{timestamp_replica, NodeId, ReplicaId, TreeKey, TRASH};
use std::collections::{BTreeMap, BTreeSet};

use std::time::Duration;

/// How long a healed cluster may take to push everything (simulated).
pub const CONVERGENCE_DEADLINE: Duration = Duration::from_secs(120);
/// Deadline of one sync round on one node (simulated).
const SYNC_ROUND_DEADLINE: Duration = Duration::from_secs(60);
/// Reads compared across replicas, at most.
const READS_COMPARED_MAX: usize = 150;

type Result<T = ()> = std::result::Result<T, Failure>;

/// Blocks or unblocks pushes between every pair of replicas.
fn set_pushes_blocked(world: &World, blocked: bool) {
    for from in world.replica_ids() {
        for to in world.replica_ids() {
            if from == to {
                continue;
            }
            if blocked {
                world.filter.block(from, to, RequestKind::Push);
            } else {
                world.filter.unblock(from, to, RequestKind::Push);
            }
        }
    }
}

/// Drops every push between replicas from now on, until the sync check ends.
pub fn block_pushes(world: &World) {
    world
        .trace
        .record("world", "pushes between replicas blocked");
    set_pushes_blocked(world, true);
}

/// One sync round on every replica, in replica order: afterwards every
/// replica must hold everything any replica held before the round.
pub async fn sync_round(world: &World) -> Result {
    for replica in world.replica_ids() {
        world
            .trace
            .record(&format!("replica-{replica}"), "sync_now");
        let round = world.on_node(replica, |service| async move { service.sync_now().await });
        match madsim::time::timeout(SYNC_ROUND_DEADLINE, round).await {
            Ok(Some(())) => {}
            Ok(None) => {
                return Err(Failure::new(
                    FailureKind::Liveness,
                    format!("replica-{replica} died during sync_now"),
                ))
            }
            Err(_) => {
                return Err(Failure::new(
                    FailureKind::Liveness,
                    format!(
                        "replica-{replica}: sync_now did not finish within {SYNC_ROUND_DEADLINE:?}"
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// Sync-only convergence: pushes stay blocked, so whatever converges was
/// carried by background sync alone.
pub async fn check_sync_converges(world: &World, workload: &Workload) -> Result {
    world.trace.record(
        "world",
        "check: one sync round on every replica, pushes blocked",
    );
    let result = async {
        sync_round(world).await?;
        check_converged(world, workload, "after a sync round with pushes blocked").await
    }
    .await;
    set_pushes_blocked(world, false);
    world.trace.record("world", "pushes flow again");
    result
}

/// Waits until every replica has pushed everything, then checks.
pub async fn check_push_converges(world: &World, workload: &Workload) -> Result {
    world
        .trace
        .record("world", "check: waiting for replication to go idle");
    let deadline = global_now() + CONVERGENCE_DEADLINE;
    loop {
        let busy: Vec<ReplicaId> = world
            .nodes
            .iter()
            .filter(|n| n.service().is_none_or(|s| !s.replication_idle()))
            .map(|n| n.replica_id)
            .collect();
        if busy.is_empty() {
            break;
        }
        if global_now() >= deadline {
            return Err(Failure::new(
                FailureKind::Liveness,
                format!("replication not idle on {busy:?} within {CONVERGENCE_DEADLINE:?} after healing"),
            ));
        }
        madsim::time::sleep(Duration::from_millis(50)).await;
    }
    world.trace.record("world", "replication idle everywhere");
    check_converged(world, workload, "after replication went idle").await?;
    check_nobody_waits(world)
}

/// No caller of any replica is still waiting for a batch.
pub fn check_nobody_waits(world: &World) -> Result {
    for node in &world.nodes {
        let Some(service) = node.service() else {
            continue;
        };
        let pending = service.stats().pending_writes;
        if pending != 0 {
            return Err(Failure::new(
                FailureKind::HungCallers,
                format!(
                    "{} still has {pending} writes pending on an idle cluster",
                    node.name
                ),
            ));
        }
    }
    Ok(())
}

/// Every tree of every replica, checked in full, with what its replicas
/// must hold alike (captured by the same pass over its rows).
fn contents(world: &World) -> Result<BTreeMap<ReplicaId, BTreeMap<TreeKey, ReplicaContent>>> {
    let mut all = BTreeMap::new();
    for node in &world.nodes {
        let service = node.service().ok_or_else(|| {
            Failure::new(
                FailureKind::Liveness,
                format!("{} is down at check time", node.name),
            )
        })?;
        let forest = service.forest();
        let trees = forest.all_trees().map_err(|e| {
            Failure::new(
                FailureKind::Storage,
                format!("{}: all_trees: {e}", node.name),
            )
        })?;
        let mut per_tree = BTreeMap::new();
        for tree in trees {
            let (verdict, content) = forest.check_invariants_capturing(&tree).map_err(|e| {
                Failure::new(FailureKind::Storage, format!("{}: check: {e}", node.name))
            })?;
            if let Err(broken) = verdict {
                return Err(Failure::new(
                    FailureKind::TreeInvariant,
                    format!("{} {:?}/{}: {broken}", node.name, tree.cid, tree.tree),
                ));
            }
            per_tree.insert(tree, content);
        }
        all.insert(node.replica_id, per_tree);
    }
    Ok(all)
}

/// The decoded log and tree of `tree` on `replica`; empty where the
/// replica has no such tree.
fn dump(world: &World, replica: ReplicaId, tree: &TreeKey) -> Result<TreeDump> {
    let node = world.node(replica);
    let service = node.service().ok_or_else(|| {
        Failure::new(
            FailureKind::Liveness,
            format!("{} is down at check time", node.name),
        )
    })?;
    match service.forest().dump(tree) {
        Ok(dump) => Ok(dump),
        Err(arbor::Error::TreeNotFound) => Ok(TreeDump {
            nodes: Vec::new(),
            log: Vec::new(),
        }),
        Err(e) => Err(Failure::new(
            FailureKind::Storage,
            format!("{}: dump: {e}", node.name),
        )),
    }
}

/// Replicas hold identical trees and logs, every acked write is in them,
/// and reads agree. The replicas' contents are compared as bytes; only a
/// difference is decoded, to say what differs.
pub async fn check_converged(world: &World, workload: &Workload, when: &str) -> Result {
    let all = contents(world)?;
    let trees: BTreeSet<&TreeKey> = all.values().flat_map(|d| d.keys()).collect();
    let mut reference: BTreeMap<&TreeKey, &ReplicaContent> = BTreeMap::new();
    let empty = ReplicaContent::default();
    for tree in trees {
        let holders = workload.replicas_of(&tree.cid);
        let Some(&first) = holders.first() else {
            continue;
        };
        let base = all[&first].get(tree).unwrap_or(&empty);
        for &other in &holders[1..] {
            if all[&other].get(tree).unwrap_or(&empty) != base {
                let (left, right) = (dump(world, first, tree)?, dump(world, other, tree)?);
                let mut diff = describe_difference(&left, &right)
                    .unwrap_or_else(|| "stored bytes differ, decoded trees alike".into());
                diff.push_str(&who_holds(world, &holders, tree, &left, &right)?);
                return Err(Failure::new(
                    FailureKind::Divergence,
                    format!("{when}: {:?}/{} differs between replica-{first} and replica-{other}: {diff}", tree.cid, tree.tree),
                ));
            }
        }
        reference.insert(tree, base);
    }
    check_acked_present(&reference, workload, when)?;
    check_reads_agree(world, workload, when).await?;
    world.trace.record("world", format!("converged {when}"));
    Ok(())
}

/// For ops in one log and not the other: the first such op, and which
/// replicas of the tree hold each (a replica outside the pair tells whether
/// the op was lost or never spread).
fn who_holds(
    world: &World,
    holders: &[ReplicaId],
    tree: &TreeKey,
    left: &TreeDump,
    right: &TreeDump,
) -> Result<String> {
    let stamps = |d: &TreeDump| d.log.iter().map(|op| op.ts()).collect::<BTreeSet<u64>>();
    let (a, b) = (stamps(left), stamps(right));
    let differing: Vec<u64> = a.symmetric_difference(&b).take(5).copied().collect();
    let Some(&first) = differing.first() else {
        return Ok(String::new());
    };
    let op = left
        .log
        .iter()
        .chain(&right.log)
        .find(|op| op.ts() == first)
        .expect("a differing stamp is in one of the logs");
    let mut out = format!("; op {first}: {op:?}; held by:");
    for &replica in holders {
        let log = stamps(&dump(world, replica, tree)?);
        let held: Vec<u64> = differing
            .iter()
            .filter(|ts| log.contains(ts))
            .copied()
            .collect();
        out.push_str(&format!(" replica-{replica} {held:?}"));
    }
    Ok(out)
}

fn describe_difference(a: &TreeDump, b: &TreeDump) -> Option<String> {
    if a.log != b.log {
        let ts_a: BTreeSet<u64> = a.log.iter().map(|op| op.ts()).collect();
        let ts_b: BTreeSet<u64> = b.log.iter().map(|op| op.ts()).collect();
        let only_a: Vec<&u64> = ts_a.difference(&ts_b).take(5).collect();
        let only_b: Vec<&u64> = ts_b.difference(&ts_a).take(5).collect();
        return Some(format!(
            "logs differ ({} vs {} ops; only left {only_a:?}; only right {only_b:?})",
            a.log.len(),
            b.log.len()
        ));
    }
    if a.nodes != b.nodes {
        let first = a.nodes.iter().zip(&b.nodes).find(|(x, y)| x != y);
        return Some(format!(
            "same log, different trees ({} vs {} nodes; first difference {first:?})",
            a.nodes.len(),
            b.nodes.len()
        ));
    }
    None
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
                .find(|(key, _)| *key == b"op")
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

/// Every acknowledged write is in the (common) log.
fn check_acked_present(
    logs: &BTreeMap<&TreeKey, &ReplicaContent>,
    workload: &Workload,
    when: &str,
) -> Result {
    let ledger = workload.ledger.lock().unwrap();
    let timestamps: BTreeMap<&TreeKey, BTreeSet<u64>> = logs
        .iter()
        .map(|(&tree, content)| (tree, content.ops().map(|(ts, _)| ts).collect()))
        .collect();
    let by_child = ops_by_child(logs)?;
    let ops_of = |tree: &TreeKey, node: &NodeId| -> &[LoggedOp] {
        by_child
            .get(tree)
            .and_then(|ops| ops.get(node))
            .map_or(&[], Vec::as_slice)
    };
    for acked in &ledger.acked {
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
        if !present {
            return Err(Failure::new(
                FailureKind::LostWrite,
                format!("{when}: acknowledged {acked:?} is missing"),
            ));
        }
    }
    Ok(())
}

/// The workload's reads give the same answer on every replica.
async fn check_reads_agree(world: &World, workload: &Workload, when: &str) -> Result {
    let mut reads: Vec<_> = {
        let ledger = workload.ledger.lock().unwrap();
        ledger
            .leaf_paths
            .iter()
            .take(READS_COMPARED_MAX)
            .cloned()
            .collect()
    };
    let dirs: BTreeSet<_> = reads
        .iter()
        .map(|(tree, path)| (tree.clone(), vec![path[0].clone()]))
        .collect();
    reads.extend(dirs);
    for (tree, path) in reads {
        for latest_only in [false, true] {
            let mut answers: Vec<(ReplicaId, Response)> = Vec::new();
            for replica in workload.replicas_of(&tree.cid) {
                let request = read_request(tree.clone(), path.clone(), latest_only);
                let answer = world
                    .on_node(
                        replica,
                        |service| async move { service.handle(request).await },
                    )
                    .await
                    .ok_or_else(|| {
                        Failure::new(
                            FailureKind::Liveness,
                            format!("replica-{replica} down during reads"),
                        )
                    })?;
                answers.push((replica, answer));
            }
            if let Some((other, answer)) = answers.iter().find(|(_, a)| *a != answers[0].1) {
                return Err(Failure::new(
                    FailureKind::DivergentRead,
                    format!(
                        "{when}: GetNodeByPath {:?}/{} {path:?} latest_only={latest_only}: replica-{} says {:?}, replica-{other} says {answer:?}",
                        tree.cid, tree.tree, answers[0].0, answers[0].1
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::Verdict;
    use crate::trace::Trace;
    use crate::world::{cluster_configs, Knobs};
    use arbor::proto::Request;
    use arbor::{ContainerId, KeyValue, ROOT};
    use std::sync::Arc;

    async fn assert_diverged(world: &World, workload: &Workload, what: &str) {
        let failure = check_converged(world, workload, "test")
            .await
            .expect_err("the replicas differ");
        assert_eq!(failure.kind, FailureKind::Divergence);
        assert!(failure.detail.contains(what), "{failure}");
    }

    /// The acked-write check finds the add and its tagged move among the
    /// logged ops, and misses a move with another tag.
    async fn check_acked_found(world: &World, workload: &Workload, tree: &TreeKey, node: NodeId) {
        let moved = |tag: &str| Acked::Moved {
            tree: tree.clone(),
            node,
            parent: ROOT,
            tag: tag.into(),
            acker: 1,
        };
        workload.ledger.lock().unwrap().acked.extend([
            Acked::Created {
                tree: tree.clone(),
                node,
                acker: 1,
            },
            moved("tag"),
        ]);
        check_converged(world, workload, "test").await.unwrap();
        workload.ledger.lock().unwrap().acked.push(moved("other"));
        let lost = check_converged(world, workload, "test").await.unwrap_err();
        assert_eq!(lost.kind, FailureKind::LostWrite, "{lost}");
        workload.ledger.lock().unwrap().acked.pop();
    }

    /// Byte comparison of the replicas' contents still reports what the
    /// decoded comparison did: an op one replica lacks, and an op whose
    /// meta differs between replicas while each tree is sound.
    #[test]
    fn a_difference_between_replicas_is_reported() {
        let runtime = madsim::runtime::Runtime::with_seed_and_config(7, Default::default());
        runtime.block_on(async {
            let trace = Trace::new(false);
            let knobs = Knobs {
                sync_interval: None,
                ..Knobs::default()
            };
            let mut world = World::build_simple(cluster_configs(2, &knobs), trace.clone());
            let client = world.client();
            let world = Arc::new(world);
            for replica in [1, 2] {
                assert!(world.wait_up(replica, Duration::from_secs(10)).await);
            }
            let workload =
                Workload::new(world.clone(), Verdict::new(trace), Duration::from_secs(2));
            let tree = TreeKey::new(ContainerId([9; 32]), "t");
            block_pushes(&world);
            let request = Request::Add {
                tree: tree.clone(),
                parent: ROOT,
                items: vec![
                    KeyValue::new("FileName", b"x".to_vec()),
                    KeyValue::new("op", b"tag".to_vec()),
                ],
            };
            let node = match client.call(1, request, Duration::from_secs(2)).await {
                Ok(Response::Added { node }) => node,
                other => panic!("add failed: {other:?}"),
            };

            assert_diverged(&world, &workload, "logs differ (1 vs 0 ops").await;

            set_pushes_blocked(&world, false);
            check_push_converges(&world, &workload).await.unwrap();
            check_acked_found(&world, &workload, &tree, node).await;

            let service = world.node(2).service().expect("replica-2 up");
            service.forest().plant_changed_op(&tree, node).unwrap();
            assert_eq!(service.forest().check_invariants(&tree), Ok(()));
            assert_diverged(&world, &workload, "logs differ (1 vs 1 ops").await;
        });
    }
}
