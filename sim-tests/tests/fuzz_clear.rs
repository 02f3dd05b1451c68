//! `Forest::clear`, which the fuzz targets use to reuse one database across
//! inputs: a cleared forest must be indistinguishable from a fresh one, or
//! an input would replay differently in a fresh process than in the fuzzer.

use arbor::forest::{CursorKind, Forest, ForestOptions, WriteOp, WriteOutcome, WriteRequest};
use arbor::{ContainerId, KeyValue, TreeKey, ROOT};

fn forest() -> Forest {
    Forest::in_memory(ForestOptions {
        replica_id: 3,
        durable: false,
        ..ForestOptions::default()
    })
    .expect("in-memory forest")
}

fn trees() -> [TreeKey; 2] {
    [
        TreeKey::new(ContainerId([1; 32]), "a"),
        TreeKey::new(ContainerId([2; 32]), "b"),
    ]
}

/// Local writes (timestamps and ids come from the forest's state) on two
/// trees plus a cursor: everything `clear` has to forget.
fn history(forest: &Forest) -> Vec<WriteOutcome> {
    let mut outcomes = Vec::new();
    for tree in trees() {
        let requests = vec![
            WriteRequest {
                tree: tree.clone(),
                op: WriteOp::AddByPath {
                    attr: "FileName".into(),
                    path: vec!["dir".into()],
                    items: vec![KeyValue::new("FileName", "leaf")],
                },
            },
            WriteRequest {
                tree: tree.clone(),
                op: WriteOp::Move {
                    parent: ROOT,
                    child: None,
                    items: vec![KeyValue::new("FileName", "x")],
                },
            },
        ];
        for result in forest.write_batch(&requests).expect("batch commits") {
            outcomes.push(result.expect("write accepted"));
        }
        forest
            .set_cursor(&tree, CursorKind::Pull, 2, 5)
            .expect("cursor set");
    }
    outcomes
}

#[test]
fn a_cleared_forest_behaves_like_a_fresh_one() {
    let fresh = forest();
    let expected = history(&fresh);

    let reused = forest();
    history(&reused);
    history(&reused);
    reused.clear().expect("clear");
    assert!(reused.all_trees().expect("all_trees").is_empty());
    assert_eq!(reused.log_rows().expect("log_rows"), 0);
    for tree in trees() {
        assert!(!reused.tree_exists(&tree).expect("tree_exists"));
        assert_eq!(
            reused.cursor(&tree, CursorKind::Pull, 2).expect("cursor"),
            0
        );
    }

    assert_eq!(history(&reused), expected, "other ids or timestamps");
    for tree in trees() {
        assert_eq!(reused.dump(&tree).ok(), fresh.dump(&tree).ok());
        assert_eq!(
            reused.get_op_log(&tree, 0, 100).expect("op log"),
            fresh.get_op_log(&tree, 0, 100).expect("op log")
        );
    }
}
