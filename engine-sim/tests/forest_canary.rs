//! The forest's planted bugs must be observable: with each canary on, some
//! arrival order makes a replica diverge from the model (or from another
//! replica's reads), and with it off the same scenario converges.
//!
//! Canaries are process-wide switches, so the scenarios run one after the
//! other inside a single test.
#![cfg(feature = "canary")]

extern crate arbor_engine_sim as arbor;

use arbor::canary::{self, Canary};
use arbor::forest::*;
use arbor::model::TreeModel;
use arbor::*;

fn tree() -> TreeKey {
    TreeKey::new(ContainerId([9; 32]), "canary")
}

fn name(x: &str) -> Vec<KeyValue> {
    vec![KeyValue::new(ATTR_FILE_NAME, x)]
}

fn op(counter: u64, replica: ReplicaId, parent: NodeId, child: NodeId, file: &str) -> Move {
    Move {
        parent,
        child,
        meta: Meta {
            time: make_timestamp(counter, replica),
            items: name(file),
        },
    }
}

/// Applies each inner slice as one batch.
fn replay(batches: &[&[Move]]) -> Forest {
    let forest = Forest::in_memory(ForestOptions::default()).unwrap();
    for batch in batches {
        let requests: Vec<WriteRequest> = batch
            .iter()
            .map(|op| WriteRequest {
                tree: tree(),
                op: WriteOp::Apply { op: op.clone() },
            })
            .collect();
        forest.write_batch(&requests).unwrap();
    }
    forest
}

fn model(ops: &[Move]) -> TreeDump {
    let mut model = TreeModel::new();
    for op in ops {
        model.apply(op);
    }
    model.dump()
}

/// The scenario diverges from the model only while `canary` is on.
fn assert_caught(canary: Canary, ops: &[Move], batches: &[&[Move]]) {
    canary::set(None);
    assert_eq!(
        replay(batches).dump(&tree()).unwrap(),
        model(ops),
        "{canary:?} off"
    );
    canary::set(Some(canary));
    let planted = replay(batches).dump(&tree()).unwrap();
    canary::set(None);
    assert_ne!(planted, model(ops), "{canary:?} on must diverge");
}

fn old_op_wrong_position() {
    let node = make_timestamp(10, 1);
    let new = op(10, 1, ROOT, node, "new");
    let old = op(5, 2, TRASH, node, "old");
    assert_caught(
        Canary::OldOpWrongPosition,
        &[new.clone(), old.clone()],
        &[&[new], &[old]],
    );
}

/// Redo with the stale undo "created" of x: a later undo deletes c instead
/// of restoring it, and the redo is a no-op (cycle), so c stays deleted.
fn stale_undo_on_redo() {
    let (c, p) = (100, 200);
    let y = op(2, 1, ROOT, c, "c");
    let w = op(3, 1, c, p, "p");
    let x = op(5, 2, p, c, "c-under-p");
    let ops = [y.clone(), w.clone(), x.clone()];
    assert_caught(Canary::StaleUndoOnRedo, &ops, &[&[x], &[y], &[w]]);
}

/// Two replicas get the same two same-name directories in opposite orders:
/// their trees are identical, their path reads must be too.
fn path_by_arrival_order() {
    let (d1, d2) = (make_timestamp(1, 1), make_timestamp(1, 2));
    let dir1 = op(1, 1, ROOT, d1, "d");
    let dir2 = op(1, 2, ROOT, d2, "d");
    let f1 = op(2, 1, d1, make_timestamp(2, 1), "f");
    let f2 = op(2, 2, d2, make_timestamp(2, 2), "f");
    let reads = |forward: bool| {
        let order: [&[Move]; 2] = if forward {
            [std::slice::from_ref(&dir1), std::slice::from_ref(&dir2)]
        } else {
            [std::slice::from_ref(&dir2), std::slice::from_ref(&dir1)]
        };
        let forest = replay(&[order[0], order[1], &[f1.clone(), f2.clone()]]);
        let path = vec!["d".to_string(), "f".to_string()];
        let found = forest
            .get_by_path(&tree(), ATTR_FILE_NAME, &path, false)
            .unwrap();
        (forest.dump(&tree()).unwrap(), found)
    };
    canary::set(None);
    let (forward, backward) = (reads(true), reads(false));
    assert_eq!(forward, backward);
    assert_eq!(forward.1.len(), 1);
    assert_eq!(forward.1[0].parent, d1, "the smallest directory id wins");
    canary::set(Some(Canary::PathByArrivalOrder));
    let (forward, backward) = (reads(true), reads(false));
    canary::set(None);
    assert_eq!(forward.0, backward.0, "the trees themselves still converge");
    assert_ne!(forward.1, backward.1, "path reads must diverge");
}

#[test]
fn forest_canaries_are_observable() {
    old_op_wrong_position();
    stale_undo_on_redo();
    path_by_arrival_order();
}
