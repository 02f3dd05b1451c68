//! `Forest::clear`, which the fuzz targets use to reuse one database across
//! inputs: a cleared forest must be indistinguishable from a fresh one, or
//! an input would replay differently in a fresh process than in the fuzzer.

use arbor::forest::{CursorKind, Forest, ForestOptions, WriteOp, WriteOutcome, WriteRequest};
use arbor::{ContainerId, KeyValue, TreeKey, ROOT};
use arbor_sim::disk::{DiskConfig, SimDisk};

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
        for result in forest
            .write_batch(&requests)
            .expect("batch commits")
            .results
        {
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
    cleared_like_fresh(Forest::clear);
}

#[test]
fn a_forest_cleared_without_sync_behaves_like_a_fresh_one() {
    cleared_like_fresh(Forest::clear_without_sync);
}

fn cleared_like_fresh(clear: fn(&Forest) -> arbor::Result<()>) {
    let fresh = forest();
    let expected = history(&fresh);

    let reused = forest();
    history(&reused);
    history(&reused);
    clear(&reused).expect("clear");
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

/// The fuzz targets clear without sync between inputs and durably only now
/// and then: the pages of the non-durable commits must be reused, not
/// piled up until the next durable commit.
#[test]
fn clearing_without_sync_does_not_grow_the_database() {
    let disk = SimDisk::new(DiskConfig::reliable(0));
    let options = ForestOptions {
        durable: false,
        ..ForestOptions::default()
    };
    let forest = Forest::open_with_backend(disk.backend(), options).expect("forest opens");
    history(&forest);
    forest.clear_without_sync().expect("clear without sync");
    history(&forest);
    forest.clear().expect("clear");
    let after_two = disk.len_bytes();
    let mut largest = after_two;
    for _ in 0..200 {
        history(&forest);
        forest.clear_without_sync().expect("clear without sync");
        largest = largest.max(disk.len_bytes());
    }
    forest.clear().expect("clear");
    eprintln!("database: {after_two} bytes after two histories, at most {largest} over 200 more");
    assert!(
        largest <= 2 * after_two,
        "database grew from {after_two} to {largest} bytes over 200 non-durable clears"
    );
}
