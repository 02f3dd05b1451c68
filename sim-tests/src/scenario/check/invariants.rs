//! The tree invariant (every node has one parent and reaches ROOT or
//! TRASH; the stored rows agree with the log): on the acking replica after
//! every write, limited to what the write touched; in sweeps over every
//! tree of every live replica while faults strike; and in full at every
//! checkpoint, where the same pass captures what the replicas must hold
//! alike.

use super::Contents;
use crate::failure::{Failure, FailureKind};
use crate::world::clock::global_now;
use crate::world::World;
use arbor::forest::records::TreeRecord;
use arbor::forest::{Forest, Recheck};
use arbor::{NodeId, ReplicaId, TreeKey};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// A sweep that skips unchanged trees checks a tree whose record has not
/// moved again once its last full check is this old: a break written
/// outside the op path is still found within this time, not only at the
/// final checks.
pub const UNCHANGED_RECHECK_INTERVAL: Duration = Duration::from_secs(15);

/// How much a sweep may skip (see `InvariantSweep`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sweep {
    Full,
    SkipUnchanged,
}

/// A tree found broken: where, and what broke.
pub type Broken = (ReplicaId, TreeKey, String);

/// Sweeps of the tree invariant over every tree of every live replica,
/// remembering what each full check saw. `Full` checks every tree;
/// `SkipUnchanged` (the periodic sweeps) skips a tree whose record equals
/// the one its last full check saw on the same incarnation of the replica,
/// less than `UNCHANGED_RECHECK_INTERVAL` ago, with no disk error window
/// on that replica since (`forget`).
#[derive(Default)]
pub struct InvariantSweep {
    checked: Mutex<BTreeMap<ReplicaId, CheckedIncarnation>>,
}

/// Full checks of one incarnation of a replica's forest: the tree records
/// they saw and when. Tied to that forest object, so a restart (a new
/// forest over the disk) starts with nothing checked.
struct CheckedIncarnation {
    forest: Weak<Forest>,
    trees: BTreeMap<TreeKey, (TreeRecord, Duration)>,
}

impl InvariantSweep {
    /// The first broken tree, as a failure.
    pub fn check(&self, world: &World, sweep: Sweep) -> Result<(), Failure> {
        match self.broken_trees(world, sweep).into_iter().next() {
            None => Ok(()),
            Some((replica, tree, broken)) => Err(Failure::new(
                FailureKind::TreeInvariant,
                format!("replica-{replica} {:?}/{}: {broken}", tree.cid, tree.tree),
            )),
        }
    }

    /// The next sweep checks every tree of `replica` in full.
    pub fn forget(&self, replica: ReplicaId) {
        self.checked.lock().unwrap().remove(&replica);
    }

    /// Every tree the sweep finds broken, with what broke.
    pub fn broken_trees(&self, world: &World, sweep: Sweep) -> Vec<Broken> {
        let mut broken = Vec::new();
        for node in &world.nodes {
            let Some(service) = node.service() else {
                continue;
            };
            let forest = service.forest();
            let trees = match forest.all_trees() {
                Ok(trees) => trees,
                Err(e) => {
                    // A storage error while listing is an operating error
                    // (injected disk faults), not a broken invariant.
                    world
                        .trace
                        .record("world", format!("{}: cannot list trees: {e}", node.name));
                    continue;
                }
            };
            let mut checked = self.checked.lock().unwrap();
            let memo = checked
                .entry(node.replica_id)
                .or_insert_with(|| CheckedIncarnation {
                    forest: Weak::new(),
                    trees: BTreeMap::new(),
                });
            memo.follow(forest);
            for tree in trees {
                if let Some(what) = memo.check(forest, &tree, sweep) {
                    broken.push((node.replica_id, tree, what));
                }
            }
        }
        broken
    }
}

impl CheckedIncarnation {
    /// Forgets every check when `forest` is another incarnation.
    fn follow(&mut self, forest: &Arc<Forest>) {
        if !std::ptr::eq(self.forest.as_ptr(), Arc::as_ptr(forest)) {
            self.forest = Arc::downgrade(forest);
            self.trees.clear();
        }
    }

    /// Checks one tree unless the sweep may skip it; what broke, if any.
    fn check(&mut self, forest: &Forest, tree: &TreeKey, sweep: Sweep) -> Option<String> {
        let now = global_now();
        let seen = match (sweep, self.trees.get(tree)) {
            (Sweep::SkipUnchanged, Some((rec, at))) if now < *at + UNCHANGED_RECHECK_INTERVAL => {
                Some(rec)
            }
            _ => None,
        };
        let verdict = match forest.check_invariants_if_changed(tree, seen) {
            Ok(Recheck::Unchanged) => return None,
            Ok(Recheck::Checked { rec, verdict }) => {
                self.trees.insert(tree.clone(), (rec, now));
                verdict
            }
            // A storage error while reading (a database poisoned by an
            // injected I/O error) is an operating error; any other (an
            // undecodable row) is a broken invariant.
            Err(arbor::Error::Storage(_)) => {
                self.trees.remove(tree);
                return None;
            }
            Err(other) => {
                self.trees.remove(tree);
                Err(other.to_string())
            }
        };
        verdict.err()
    }
}

/// Checks, on the replica that acked a write, the part of the tree
/// invariant that write could break: the nodes it wrote and their ancestor
/// chains (the sweeps check the rest). A storage error while reading (a
/// database poisoned by an injected I/O error) is an operating error, not
/// a violation.
pub fn after_write(
    world: &World,
    replica: ReplicaId,
    tree: &TreeKey,
    touched: &[NodeId],
) -> Result<(), Failure> {
    let Some(service) = world.node(replica).service() else {
        return Ok(());
    };
    match service.forest().check_invariants_touched(tree, touched) {
        Ok(()) => Ok(()),
        Err(message) if message.starts_with("storage error") => Ok(()),
        Err(broken) => Err(Failure::new(
            FailureKind::TreeInvariant,
            format!(
                "replica-{replica} {:?}/{} after a write: {broken}",
                tree.cid, tree.tree
            ),
        )),
    }
}

/// Every tree of every replica, checked in full, with what its replicas
/// must hold alike (captured by the same pass over its rows). Every
/// replica must serve.
pub fn capture(world: &World) -> Result<Contents, Failure> {
    let mut all = BTreeMap::new();
    for node in &world.nodes {
        let service = node.service().ok_or_else(|| {
            Failure::new(
                FailureKind::Liveness,
                format!("{} is down at check time", node.name),
            )
        })?;
        let forest = service.forest();
        let storage = |what: &str, e: arbor::Error| {
            Failure::new(FailureKind::Storage, format!("{}: {what}: {e}", node.name))
        };
        let trees = forest.all_trees().map_err(|e| storage("all_trees", e))?;
        let mut per_tree = BTreeMap::new();
        for tree in trees {
            let (verdict, content) = forest
                .check_invariants_capturing(&tree)
                .map_err(|e| storage("check", e))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Trace;
    use crate::world::{cluster_configs, Client, Knobs};
    use arbor::proto::{Request, Response};
    use arbor::{ContainerId, KeyValue, ROOT};

    fn tree(name: &str) -> TreeKey {
        TreeKey::new(ContainerId([9; 32]), name)
    }

    async fn add(client: &Client, tree: &TreeKey) -> NodeId {
        let request = Request::Add {
            tree: tree.clone(),
            parent: ROOT,
            items: vec![KeyValue::new("FileName", b"x".to_vec())],
        };
        match client.call(1, request, Duration::from_secs(2)).await {
            Ok(Response::Added { node }) => node,
            other => panic!("add failed: {other:?}"),
        }
    }

    /// The names of the trees one sweep finds broken.
    fn sweep(sweeps: &InvariantSweep, world: &World, how: Sweep) -> Vec<String> {
        let found = sweeps.broken_trees(world, how);
        // The planted meta time names no op: the check meets either the
        // time missing from the log or the op that set the node's meta
        // holding it no longer, whichever its scan reaches first.
        for (_, _, what) in &found {
            assert!(
                what.contains("not in the log") || what.contains("whose meta is another op's"),
                "{what}"
            );
        }
        found.into_iter().map(|(_, tree, _)| tree.tree).collect()
    }

    fn plant(world: &World, tree: &TreeKey, node: NodeId) {
        let service = world.node(1).service().expect("replica up");
        service.forest().plant_broken_node(tree, node).unwrap();
    }

    /// What each kind of sweep sees of a break written outside the op
    /// path (the tree's record does not move): the skipping sweep finds it
    /// once the tree changes, once its last check is
    /// `UNCHANGED_RECHECK_INTERVAL` old, or after a restart; a full sweep
    /// (healing, checkpoints) at once.
    #[test]
    fn a_planted_break_is_caught() {
        let runtime = madsim::runtime::Runtime::with_seed_and_config(5, Default::default());
        runtime.block_on(async {
            let configs = cluster_configs(1, &Knobs::default());
            let mut world = World::build_simple(configs, Trace::new(false));
            let client = world.client();
            assert!(world.wait_up(1, Duration::from_secs(10)).await);
            let sweeps = InvariantSweep::default();
            let (changing, quiet, restarted) = (tree("a"), tree("b"), tree("c"));
            let mut planted = Vec::new();
            for tree in [&changing, &quiet, &restarted] {
                planted.push(add(&client, tree).await);
            }
            let none: Vec<String> = Vec::new();
            let all = vec!["a".to_string(), "b".into(), "c".into()];
            assert_eq!(sweep(&sweeps, &world, Sweep::SkipUnchanged), none);
            for (tree, &node) in [&changing, &quiet, &restarted].into_iter().zip(&planted) {
                plant(&world, tree, node);
            }
            assert_eq!(
                sweep(&sweeps, &world, Sweep::SkipUnchanged),
                none,
                "unchanged records, checked just now: skipped"
            );
            assert_eq!(
                sweep(&sweeps, &world, Sweep::Full),
                all,
                "a full sweep finds all"
            );
            assert_eq!(sweep(&sweeps, &world, Sweep::Full), all, "every time");

            // The skipping sweep checks a tree again once it changes ...
            add(&client, &changing).await;
            assert_eq!(sweep(&sweeps, &world, Sweep::SkipUnchanged), vec!["a"]);

            // ... once its last check is old enough ...
            madsim::time::sleep(UNCHANGED_RECHECK_INTERVAL).await;
            assert_eq!(sweep(&sweeps, &world, Sweep::SkipUnchanged), all);
            assert_eq!(sweep(&sweeps, &world, Sweep::SkipUnchanged), none);

            // ... and after the replica restarted (a new forest).
            world.restart_process(1).await;
            assert!(world.wait_up(1, Duration::from_secs(10)).await);
            assert_eq!(sweep(&sweeps, &world, Sweep::SkipUnchanged), all);

            // `check` reports the first break as a failure.
            let failure = sweeps.check(&world, Sweep::Full).unwrap_err();
            assert_eq!(failure.kind, FailureKind::TreeInvariant);
            assert!(failure.detail.starts_with("replica-1 "), "{failure}");
        });
    }
}
