//! The full and touched checks find each kind of damage; checked batches.

use super::super::{Forest, ForestOptions, InvariantCheck, WriteOp, WriteOutcome, WriteRequest};
use super::*;
use redb::ReadableTable;

fn tree() -> TreeKey {
    TreeKey::new(ContainerId([3; 32]), "t")
}

fn write(forest: &Forest, op: WriteOp) -> (NodeId, Timestamp) {
    let request = WriteRequest { tree: tree(), op };
    match forest
        .write_batch(&[request])
        .unwrap()
        .results
        .pop()
        .unwrap()
    {
        Ok(WriteOutcome::Moved { node, ts }) => (node, ts),
        other => panic!("{other:?}"),
    }
}

fn named(name: &str) -> Vec<KeyValue> {
    vec![KeyValue::new(ATTR_FILE_NAME, name)]
}

/// A small tree: directory `a` with `x` and `y` under it, `x` then
/// moved to the root (so one op is no node's current time).
/// Returns the forest, the tree number, `x` and the op that created it.
fn sample() -> (Forest, u64, NodeId, Timestamp) {
    let forest = Forest::in_memory(ForestOptions::default()).unwrap();
    let add = |parent, name: &str| WriteOp::Move {
        parent,
        child: None,
        items: named(name),
    };
    let (a, _) = write(&forest, add(ROOT, "a"));
    let (x, created) = write(&forest, add(a, "x"));
    write(&forest, add(a, "y"));
    write(
        &forest,
        WriteOp::Move {
            parent: ROOT,
            child: Some(x),
            items: named("x"),
        },
    );
    forest.check_invariants(&tree()).unwrap();
    let number = forest.read_tree(&tree()).unwrap().rec.number;
    (forest, number, x, created)
}

/// Runs `corrupt` in a write transaction, then the full check.
fn corrupted(corrupt: impl FnOnce(&redb::WriteTransaction, u64, NodeId, Timestamp)) -> String {
    let (forest, t, x, created) = sample();
    let txn = forest.begin_write().unwrap();
    corrupt(&txn, t, x, created);
    txn.txn.commit().unwrap();
    forest
        .check_invariants(&tree())
        .expect_err("the corruption is found")
}

fn rewrite_node(txn: &redb::WriteTransaction, t: u64, id: NodeId, f: impl FnOnce(&mut NodeRecord)) {
    let mut nodes = txn.open_table(tree_table(&tree_table_name(t))).unwrap();
    let key = node_key(id);
    let mut node = decode_node(nodes.get(key).unwrap().unwrap().value()).unwrap();
    f(&mut node);
    nodes.insert(key, encode_node(&node).as_slice()).unwrap();
}

fn add_named(name: &str) -> WriteRequest {
    WriteRequest {
        tree: tree(),
        op: WriteOp::Move {
            parent: ROOT,
            child: None,
            items: named(name),
        },
    }
}

#[test]
fn a_checked_batch_reports_a_break_and_stores_nothing() {
    let (forest, t, x, _) = sample();
    let txn = forest.begin_write().unwrap();
    rewrite_node(&txn, t, x, |n| n.time += 1);
    txn.txn.commit().unwrap();
    let height = forest.next_height(&tree()).unwrap();
    for check in [InvariantCheck::Touched(vec![x]), InvariantCheck::Whole] {
        let batch = forest
            .write_batch_checked(&[add_named("z")], |results| {
                assert!(matches!(results[0], Ok(WriteOutcome::Moved { .. })));
                vec![(tree(), check.clone())]
            })
            .unwrap();
        let broken = batch.verdict.expect_err("the check sees node x");
        assert!(meta_time_lost(&broken), "{check:?}: {broken}");
        assert_eq!(forest.next_height(&tree()), Ok(height), "not committed");
    }
    // Nodes away from the break pass, and the batch commits.
    let batch = forest
        .write_batch_checked(&[add_named("z")], |_| {
            vec![(tree(), InvariantCheck::Touched(vec![]))]
        })
        .unwrap();
    assert_eq!(batch.verdict, Ok(()));
    assert_eq!(forest.next_height(&tree()), Ok(height + 1));
}

#[test]
fn a_checked_batch_sees_its_own_writes() {
    let forest = Forest::in_memory(ForestOptions::default()).unwrap();
    let mut created = None;
    let batch = forest
        .write_batch_checked(&[add_named("a")], |results| {
            if let Ok(WriteOutcome::Moved { node, .. }) = results[0] {
                created = Some(node);
            }
            vec![
                (tree(), InvariantCheck::Whole),
                (
                    tree(),
                    InvariantCheck::Touched(created.into_iter().collect()),
                ),
            ]
        })
        .unwrap();
    // The tree did not exist before this batch: the checks looked at
    // the uncommitted state.
    assert_eq!(batch.verdict, Ok(()));
    assert!(created.is_some());
    let other = TreeKey::new(ContainerId([4; 32]), "absent");
    let batch = forest
        .write_batch_checked(&[add_named("b")], |_| vec![(other, InvariantCheck::Whole)])
        .unwrap();
    assert!(batch.verdict.is_err(), "an absent tree fails its check");
    assert_eq!(
        forest.next_height(&tree()),
        Ok(1),
        "and the batch is not stored"
    );
}

fn parented(links: &[(NodeId, NodeId)]) -> BTreeMap<NodeId, NodeRecord> {
    links
        .iter()
        .map(|&(id, parent)| {
            let record = NodeRecord {
                parent,
                time: id,
                internal: true,
                name_key: component_key("n"),
            };
            (id, record)
        })
        .collect()
}

#[test]
fn cycles_are_found_and_anchored_chains_pass() {
    // 5 hangs under a parent that is not stored; 6 is in the trash.
    let sound = parented(&[(2, ROOT), (3, 2), (4, 3), (5, 99), (7, 5), (6, TRASH)]);
    assert_eq!(check_acyclic(&sound), Ok(()));
    let self_loop = parented(&[(2, ROOT), (3, 3)]);
    assert_eq!(
        check_acyclic(&self_loop),
        Err("cycle through node 3".into())
    );
    // A chain leading into a cycle further up.
    let above = parented(&[(2, 4), (3, 2), (4, 3), (9, 3), (10, 9)]);
    let broken = check_acyclic(&above).expect_err("2 -> 4 -> 3 -> 2");
    assert!(broken.starts_with("cycle through node "), "{broken}");
}

/// What the checks say of a node whose meta time names no op: the node
/// points at no logged op, or (met first by the full check's walk of the
/// log) the op that set the node's meta leaves its items to a node that
/// no longer names it.
fn meta_time_lost(broken: &str) -> bool {
    broken.contains("not in the log") || broken.contains("whose meta is another op's")
}

#[test]
fn node_time_missing_from_the_log() {
    let broken = corrupted(|txn, t, x, _| rewrite_node(txn, t, x, |n| n.time += 1));
    assert!(meta_time_lost(&broken), "{broken}");
}

#[test]
fn node_state_differs_from_its_op() {
    let broken =
        corrupted(|txn, t, x, _| rewrite_node(txn, t, x, |n| n.name_key = component_key("z")));
    assert!(broken.contains("state differs"), "{broken}");
    let broken = corrupted(|txn, t, x, _| rewrite_node(txn, t, x, |n| n.internal = !n.internal));
    assert!(broken.contains("state differs"), "{broken}");
}

type LogTable<'txn> = redb::Table<'txn, RowKey, &'static [u8]>;

/// The log table and the stored bytes of op `ts` of tree `t`.
fn logged(txn: &redb::WriteTransaction, t: u64, ts: Timestamp) -> (LogTable<'_>, Vec<u8>) {
    let log = txn.open_table(tree_table(&tree_table_name(t))).unwrap();
    let bytes = log.get(log_key(ts)).unwrap().unwrap().value().to_vec();
    (log, bytes)
}

#[test]
fn height_of_a_logged_op_is_wrong() {
    let broken = corrupted(|txn, t, _, created| {
        let (mut log, bytes) = logged(txn, t, created);
        let mut tail = LogView::parse(&bytes).unwrap().tail;
        tail.height += 7;
        let bytes = replace_log_tail(&bytes, tail).unwrap();
        log.insert(log_key(created), bytes.as_slice()).unwrap();
    });
    assert!(broken.contains("disagrees about its height"), "{broken}");
}

#[test]
fn height_names_an_op_missing_from_the_log() {
    // The op that created `x` is no node's current time any more, so
    // only the height index still points at it.
    let broken = corrupted(|txn, t, _, created| {
        let mut rows = txn.open_table(tree_table(&tree_table_name(t))).unwrap();
        rows.remove(log_key(created)).unwrap();
    });
    assert!(broken.contains("points at absent op"), "{broken}");
}

#[test]
fn log_longer_than_the_heights() {
    let broken = corrupted(|txn, t, _, created| {
        let (mut log, bytes) = logged(txn, t, created);
        log.insert(log_key(created + 1), bytes.as_slice()).unwrap();
    });
    assert!(broken.contains("log entries"), "{broken}");
}
