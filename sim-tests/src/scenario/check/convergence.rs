//! Convergence: once the faults have healed, the replicas of a tree hold
//! the same log and the same tree, by background sync alone (pushes
//! blocked) and by push, and answer the workload's reads alike.

use super::{check_at, liveness, Checker, Checkpoint};
use crate::failure::{Failure, FailureKind};
use crate::scenario::check::ledger::Ledger;
use crate::scenario::workload::intruder::CHECKER_CLIENT;
use crate::scenario::workload::read_request;
use crate::world::transport::RequestKind;
use crate::world::World;
use arbor::forest::TreeDump;
use arbor::proto::Response;
use arbor::runtime::BoxFuture;
use arbor::Caller;
use arbor::{ReplicaId, TreeKey};
use std::collections::BTreeSet;
use std::time::Duration;

/// Deadline of one sync round on one node (simulated).
const SYNC_ROUND_DEADLINE: Duration = Duration::from_secs(60);
/// Reads compared across replicas, at most.
const READS_COMPARED_MAX: usize = 150;

type Result<T = ()> = std::result::Result<T, Failure>;

/// Blocks or unblocks pushes between every pair of replicas.
pub fn set_pushes_blocked(world: &World, blocked: bool) {
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
        let detail = match madsim::time::timeout(SYNC_ROUND_DEADLINE, round).await {
            Ok(Some(())) => continue,
            Ok(None) => format!("replica-{replica} died during sync_now"),
            Err(_) => {
                format!("replica-{replica}: sync_now did not finish within {SYNC_ROUND_DEADLINE:?}")
            }
        };
        return Err(Failure::new(FailureKind::Liveness, detail));
    }
    Ok(())
}

/// After a sync round on every replica, each one has asked every peer of
/// its configuration which log it serves and recorded that log's epoch as
/// the one its pull cursors of the peer count heights in (docs/design.md
/// §6): a replica still counting another epoch (or none) would take the
/// heights of a rebuilt log for those of the log it replaced. Pairs where
/// either side is down or a stand-in runs are skipped.
pub fn peer_epochs_followed(world: &World) -> Result {
    let replicas = world.replica_ids();
    for &replica in &replicas {
        let node = world.node(replica);
        let Some(service) = node.service().filter(|_| !node.is_stand_in()) else {
            continue;
        };
        let configured = service.config().node.peers.iter().map(|p| p.replica_id);
        for peer in configured.filter(|p| replicas.contains(p) && *p != replica) {
            let peer_node = world.node(peer);
            let Some(peer_service) = peer_node.service().filter(|_| !peer_node.is_stand_in())
            else {
                continue;
            };
            let (Ok(recorded), Ok(Some(current))) = (
                service.forest().peer_log_epoch(peer),
                peer_service.forest().log_epoch(),
            ) else {
                continue;
            };
            if recorded != Some(current) {
                let detail = format!(
                    "after a sync round replica-{replica} counts its pull cursors of replica-{peer} \
                     in log epoch {recorded:?}, but that replica's log is of epoch {current}"
                );
                return Err(Failure::new(FailureKind::SyncCursor, detail));
            }
        }
    }
    Ok(())
}

/// Sync-only convergence: pushes stay blocked (`block_pushes`), so
/// whatever converges was carried by background sync alone.
pub async fn sync_converges(
    world: &World,
    ledger: &Ledger,
    checkers: &[Box<dyn Checker>],
) -> Result {
    world.trace.record(
        "world",
        "check: one sync round on every replica, pushes blocked",
    );
    let result = async {
        sync_round(world).await?;
        peer_epochs_followed(world)?;
        let when = "after a sync round with pushes blocked";
        check_at(world, ledger, when, checkers).await
    }
    .await;
    set_pushes_blocked(world, false);
    world.trace.record("world", "pushes flow again");
    result
}

/// Waits until every replica has pushed everything, then checks.
pub async fn push_converges(
    world: &World,
    ledger: &Ledger,
    checkers: &[Box<dyn Checker>],
) -> Result {
    world
        .trace
        .record("world", "check: waiting for replication to go idle");
    liveness::replication_goes_idle(world).await?;
    world.trace.record("world", "replication idle everywhere");
    check_at(world, ledger, "after replication went idle", checkers).await
}

/// The replicas of every tree hold identical trees and logs. Their
/// contents are compared as bytes; only a difference is decoded, to say
/// what differs.
pub struct SameState;

impl Checker for SameState {
    fn check<'a>(&'a self, at: &'a Checkpoint<'a>) -> BoxFuture<'a, Result> {
        Box::pin(async move { same_state(at) })
    }
}

fn same_state(at: &Checkpoint) -> Result {
    let trees: BTreeSet<&TreeKey> = at.contents.values().flat_map(|d| d.keys()).collect();
    for tree in trees {
        let holders = at.world.replicas_of(&tree.cid);
        let Some((&first, others)) = holders.split_first() else {
            continue;
        };
        let base = at.content(first, tree);
        for &other in others {
            if at.content(other, tree) != base {
                return Err(divergence(at, tree, &holders, first, other));
            }
        }
    }
    Ok(())
}

/// What differs in `tree` between replicas `first` and `other`.
fn divergence(
    at: &Checkpoint,
    tree: &TreeKey,
    holders: &[ReplicaId],
    first: ReplicaId,
    other: ReplicaId,
) -> Failure {
    let detail = (|| {
        let (left, right) = (dump(at.world, first, tree)?, dump(at.world, other, tree)?);
        let mut diff = describe_difference(&left, &right)
            .unwrap_or_else(|| "stored bytes differ, decoded trees alike".into());
        diff.push_str(&who_holds(at.world, holders, tree, &left, &right)?);
        Ok::<_, Failure>(diff)
    })();
    match detail {
        Ok(diff) => Failure::new(
            FailureKind::Divergence,
            format!(
                "{}: {:?}/{} differs between replica-{first} and replica-{other}: {diff}",
                at.when, tree.cid, tree.tree
            ),
        ),
        Err(failure) => failure,
    }
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

/// The workload's reads (up to `READS_COMPARED_MAX` leaves and their
/// directories, `latest_only` both ways) give the same answer on every
/// replica of their tree.
pub struct SameReads;

impl Checker for SameReads {
    fn check<'a>(&'a self, at: &'a Checkpoint<'a>) -> BoxFuture<'a, Result> {
        Box::pin(same_reads(at))
    }
}

async fn same_reads(at: &Checkpoint<'_>) -> Result {
    let mut reads: Vec<(TreeKey, Vec<String>)> = at
        .ledger
        .leaf_paths
        .iter()
        .take(READS_COMPARED_MAX)
        .cloned()
        .collect();
    let dirs: BTreeSet<_> = reads
        .iter()
        .map(|(tree, path)| (tree.clone(), vec![path[0].clone()]))
        .collect();
    reads.extend(dirs);
    for (tree, path) in reads {
        for latest_only in [false, true] {
            let answers = read_everywhere(at.world, &tree, &path, latest_only).await?;
            if let Some((other, answer)) = answers.iter().find(|(_, a)| *a != answers[0].1) {
                return Err(Failure::new(
                    FailureKind::DivergentRead,
                    format!(
                        "{}: GetNodeByPath {:?}/{} {path:?} latest_only={latest_only}: replica-{} says {:?}, replica-{other} says {answer:?}",
                        at.when, tree.cid, tree.tree, answers[0].0, answers[0].1
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// One read's answer from every replica of its tree.
async fn read_everywhere(
    world: &World,
    tree: &TreeKey,
    path: &[String],
    latest_only: bool,
) -> Result<Vec<(ReplicaId, Response)>> {
    let mut answers = Vec::new();
    for replica in world.replicas_of(&tree.cid) {
        let request = read_request(tree.clone(), path.to_vec(), latest_only);
        let answer = world
            .on_node(replica, |service| async move {
                let checker = Caller::Client(CHECKER_CLIENT.into());
                service.handle(&checker, request).await
            })
            .await
            .ok_or_else(|| {
                Failure::new(
                    FailureKind::Liveness,
                    format!("replica-{replica} down during reads"),
                )
            })?;
        answers.push((replica, answer));
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::super::standard;
    use super::*;
    use crate::scenario::check::ledger::Acked;
    use crate::trace::Trace;
    use crate::world::{cluster_configs, Knobs};
    use arbor::proto::Request;
    use arbor::{ContainerId, KeyValue, NodeId, ROOT};

    async fn assert_diverged(world: &World, ledger: &Ledger, what: &str) {
        let failure = check_at(world, ledger, "test", &standard())
            .await
            .expect_err("the replicas differ");
        assert_eq!(failure.kind, FailureKind::Divergence);
        assert!(failure.detail.contains(what), "{failure}");
    }

    /// The acked-write check finds the add and its tagged move among the
    /// logged ops, and misses a move with another tag.
    async fn check_acked_found(world: &World, tree: &TreeKey, node: NodeId) {
        let moved = |tag: &str| Acked::Moved {
            tree: tree.clone(),
            node,
            parent: ROOT,
            tag: tag.into(),
            acker: 1,
        };
        let mut ledger = Ledger::default();
        ledger.acked.extend([
            Acked::Created {
                tree: tree.clone(),
                node,
                acker: 1,
                sent: Some(crate::scenario::check::ledger::Sent {
                    items: vec![
                        KeyValue::new("FileName", b"x".to_vec()),
                        KeyValue::new("op", b"tag".to_vec()),
                    ],
                    parent: Some(ROOT),
                    directory: None,
                }),
            },
            moved("tag"),
        ]);
        check_at(world, &ledger, "test", &standard()).await.unwrap();
        ledger.acked.push(moved("other"));
        let lost = check_at(world, &ledger, "test", &standard())
            .await
            .unwrap_err();
        assert_eq!(lost.kind, FailureKind::LostWrite, "{lost}");
    }

    /// Byte comparison of the replicas' contents still reports what the
    /// decoded comparison did: an op one replica lacks, and an op whose
    /// meta differs between replicas while each tree is sound.
    #[test]
    fn a_difference_between_replicas_is_reported() {
        let runtime = madsim::runtime::Runtime::with_seed_and_config(7, Default::default());
        runtime.block_on(async {
            let knobs = Knobs {
                sync_interval: None,
                ..Knobs::default()
            };
            let mut world = World::build_simple(cluster_configs(2, &knobs), Trace::new(false));
            let client = world.client();
            for replica in [1, 2] {
                assert!(world.wait_up(replica, Duration::from_secs(10)).await);
            }
            let ledger = Ledger::default();
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

            assert_diverged(&world, &ledger, "logs differ (1 vs 0 ops").await;

            set_pushes_blocked(&world, false);
            push_converges(&world, &ledger, &standard()).await.unwrap();
            check_acked_found(&world, &tree, node).await;

            let service = world.node(2).service().expect("replica-2 up");
            service.forest().plant_changed_op(&tree, node).unwrap();
            assert_eq!(service.forest().check_invariants(&tree), Ok(()));
            assert_diverged(&world, &ledger, "logs differ (1 vs 1 ops").await;
        });
    }
}
