//! Property tests: the redb forest, fed a random op set in a random order,
//! split into random batches and with duplicates, ends in the same state as
//! the reference model fed the same ops in timestamp order.

use arbor::forest::*;
use arbor::model::TreeModel;
use arbor::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

fn tree() -> TreeKey {
    TreeKey::new(ContainerId([1; 32]), "prop")
}

/// Node ids are small (plus the reserved ones as parents) so that ops
/// collide: cycles, moves to TRASH, parents that do not exist yet.
fn node_id() -> impl Strategy<Value = NodeId> {
    1u64..=6
}

fn parent_id() -> impl Strategy<Value = NodeId> {
    prop_oneof![3 => node_id(), 2 => Just(ROOT), 1 => Just(TRASH), 1 => 7u64..=8]
}

fn items() -> impl Strategy<Value = Vec<KeyValue>> {
    let file_name =
        prop_oneof![Just("a"), Just("b"), Just("")].prop_map(|n| KeyValue::new(ATTR_FILE_NAME, n));
    let extra = prop_oneof![Just("x"), Just("y")].prop_map(|v| KeyValue::new("Other", v));
    (proptest::option::of(file_name), proptest::option::of(extra))
        .prop_map(|(f, e)| f.into_iter().chain(e).collect())
}

/// Ops with unique timestamps (a timestamp names exactly one op).
fn op_set(max_ops: usize) -> impl Strategy<Value = Vec<Move>> {
    unique_ops(
        (1u64..=40, 1u16..=3, parent_id(), node_id(), items()),
        max_ops,
    )
}

/// Ops that mostly create nodes (children drawn from many ids) under a few
/// nodes that also move: the shape of pushed writes, where an op arriving
/// behind newer logged ones mostly names nodes those never touched.
fn mostly_creating_op_set(max_ops: usize) -> impl Strategy<Value = Vec<Move>> {
    let parent = prop_oneof![3 => 1u64..=8, 2 => Just(ROOT), 1 => Just(TRASH)];
    let child = prop_oneof![2 => 1u64..=8, 3 => 9u64..=60];
    unique_ops((1u64..=60, 1u16..=3, parent, child, items()), max_ops)
}

fn unique_ops(
    one: impl Strategy<Value = (u64, u16, NodeId, NodeId, Vec<KeyValue>)>,
    max_ops: usize,
) -> impl Strategy<Value = Vec<Move>> {
    proptest::collection::vec(one, 1..max_ops).prop_map(|raw| {
        let mut seen = BTreeSet::new();
        raw.into_iter()
            .filter_map(|(counter, replica, parent, child, items)| {
                let ts = make_timestamp(counter, replica);
                seen.insert(ts).then_some(Move {
                    parent,
                    child,
                    meta: Meta { time: ts, items },
                })
            })
            .collect()
    })
}

/// An arrival order: a permutation of the ops with some repeated, split
/// into batches.
fn arrival(max_ops: usize) -> impl Strategy<Value = (Vec<Move>, Vec<Vec<Move>>)> {
    arrival_of(op_set(max_ops))
}

fn arrival_of(
    ops: impl Strategy<Value = Vec<Move>>,
) -> impl Strategy<Value = (Vec<Move>, Vec<Vec<Move>>)> {
    ops.prop_flat_map(|ops| {
        let n = ops.len();
        let order = Just(ops.clone()).prop_shuffle();
        let repeats = proptest::collection::vec(0..n, 0..=n / 2);
        let cuts = proptest::collection::vec(1usize..8, 1..=n);
        (Just(ops), order, repeats, cuts).prop_map(|(ops, mut order, repeats, cuts)| {
            for i in repeats {
                let op = order[i].clone();
                order.push(op);
            }
            (ops, split(order, &cuts))
        })
    })
}

fn split(order: Vec<Move>, cuts: &[usize]) -> Vec<Vec<Move>> {
    let mut batches = Vec::new();
    let mut rest = order.as_slice();
    for &cut in cuts.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (batch, tail) = rest.split_at(cut.min(rest.len()));
        batches.push(batch.to_vec());
        rest = tail;
    }
    batches
}

fn model_in_ts_order(ops: &[Move]) -> TreeModel {
    let mut sorted = ops.to_vec();
    sorted.sort_by_key(|op| op.ts());
    let mut model = TreeModel::new();
    for op in &sorted {
        assert!(model.apply(op));
    }
    model.check_invariant().unwrap();
    model
}

fn apply_batches(forest: &Forest, batches: &[Vec<Move>]) -> Result<(), TestCaseError> {
    for batch in batches {
        let requests: Vec<WriteRequest> = batch
            .iter()
            .map(|op| WriteRequest {
                tree: tree(),
                op: WriteOp::Apply { op: op.clone() },
            })
            .collect();
        for result in forest.write_batch(&requests).unwrap().results {
            prop_assert!(
                matches!(result, Ok(WriteOutcome::Applied { .. })),
                "{result:?}"
            );
        }
        prop_assert_eq!(forest.check_invariants(&tree()), Ok(()));
    }
    Ok(())
}

/// Path reads agree with the model for every short path over the names.
fn paths_agree(forest: &Forest, model: &TreeModel) -> Result<(), TestCaseError> {
    let names = ["a", "b", ""];
    let mut paths: Vec<Vec<String>> = names.iter().map(|n| vec![n.to_string()]).collect();
    for first in names {
        for second in names {
            paths.push(vec![first.to_string(), second.to_string()]);
        }
    }
    for path in &paths {
        for latest_only in [false, true] {
            let stored = forest
                .get_by_path(&tree(), ATTR_FILE_NAME, path, latest_only)
                .unwrap();
            prop_assert_eq!(
                stored,
                model.get_by_path(path, latest_only),
                "path {:?}",
                path
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn forest_matches_model_in_any_order((ops, batches) in arrival(40)) {
        let forest = Forest::in_memory(ForestOptions::default()).unwrap();
        apply_batches(&forest, &batches)?;
        let model = model_in_ts_order(&ops);
        prop_assert_eq!(forest.dump(&tree()).unwrap(), model.dump());
        prop_assert_eq!(forest.next_height(&tree()).unwrap(), ops.len() as u64);
        paths_agree(&forest, &model)?;
    }

    #[test]
    fn model_converges_in_any_order((ops, batches) in arrival(30)) {
        let mut model = TreeModel::new();
        for op in batches.iter().flatten() {
            model.apply(op);
            model.check_invariant().unwrap();
        }
        prop_assert_eq!(model.dump(), model_in_ts_order(&ops).dump());
    }
}

/// The heights each op should get: a batch stores its new ops in
/// timestamp order after everything stored before.
fn expected_storage_order(batches: &[Vec<Move>]) -> Vec<Timestamp> {
    let mut stored = BTreeSet::new();
    let mut order = Vec::new();
    for batch in batches {
        let fresh: BTreeSet<Timestamp> = batch
            .iter()
            .map(|op| op.ts())
            .filter(|ts| !stored.contains(ts))
            .collect();
        stored.extend(fresh.iter().copied());
        order.extend(fresh);
    }
    order
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Exercises the write path's shortcut for fresh ops that commute with
    /// the newer logged ones: after every batch the tree equals the model
    /// of the ops so far, and heights follow the arrival order.
    #[test]
    fn forest_matches_model_after_each_batch_of_mostly_creations(
        (_, batches) in arrival_of(mostly_creating_op_set(40))
    ) {
        let forest = Forest::in_memory(ForestOptions::default()).unwrap();
        let mut seen = Vec::new();
        for (i, batch) in batches.iter().enumerate() {
            apply_batches(&forest, std::slice::from_ref(batch))?;
            seen.extend(batch.iter().cloned());
            seen.sort_by_key(|op| op.ts());
            seen.dedup_by_key(|op| op.ts());
            prop_assert_eq!(
                forest.dump(&tree()).unwrap(),
                model_in_ts_order(&seen).dump(),
                "after batch {}",
                i
            );
        }
        let heights: Vec<Timestamp> = forest
            .get_op_log(&tree(), 0, usize::MAX)
            .unwrap()
            .iter()
            .map(|e| e.op.ts())
            .collect();
        prop_assert_eq!(heights, expected_storage_order(&batches));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn reopened_file_forest_keeps_its_state((ops, batches) in arrival(30)) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("forest.redb");
        let options = ForestOptions { durable: false, ..ForestOptions::default() };
        let dump = {
            let forest = Forest::open(&file, options.clone()).unwrap();
            apply_batches(&forest, &batches)?;
            forest.dump(&tree()).unwrap()
        };
        let forest = Forest::open(&file, options).unwrap();
        prop_assert_eq!(forest.dump(&tree()).unwrap(), dump.clone());
        prop_assert_eq!(dump, model_in_ts_order(&ops).dump());
        prop_assert_eq!(forest.check_invariants(&tree()), Ok(()));
        let log = forest.get_op_log(&tree(), 0, usize::MAX).unwrap();
        prop_assert_eq!(log.len(), ops.len());
    }
}

mod records_codec {
    use arbor::forest::records::*;
    use arbor::*;
    use proptest::prelude::*;

    fn kv() -> impl Strategy<Value = KeyValue> {
        (".{0,8}", proptest::collection::vec(any::<u8>(), 0..16))
            .prop_map(|(k, v)| KeyValue::new(k, v))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Damaged records are errors, never panics.
        #[test]
        fn decoders_survive_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_log(&bytes);
            let _ = decode_node(&bytes);
            let _ = decode_tree(&bytes);
            let _ = decode_tree_key(&bytes);
            let _ = log_body_len(&bytes);
            let _ = node_parent(&bytes);
        }

        #[test]
        fn records_round_trip(
            parent in any::<u64>(),
            child in any::<u64>(),
            items in proptest::collection::vec(kv(), 0..4),
            height in any::<u64>(),
            old_ts in any::<u64>(),
            internal in any::<bool>(),
        ) {
            let tail = LogTail { height, undo: Undo::Moved { old_parent: parent, old_ts } };
            let bytes = encode_log(parent, child, &items, tail);
            let record = decode_log(&bytes).unwrap();
            prop_assert_eq!(&record.body, &OpBody { parent, child, items: items.clone() });
            prop_assert_eq!(record.tail, tail);
            let retailed = replace_log_tail(&bytes, LogTail { height, undo: Undo::Created }).unwrap();
            prop_assert_eq!(decode_log(&retailed).unwrap().tail.undo, Undo::Created);
            prop_assert!(bytes.starts_with(&encode_op_body(parent, child, &items)));

            let node = NodeRecord { parent, time: old_ts, internal, name_key: name_key(&items) };
            prop_assert_eq!(decode_node(&encode_node(&node)).unwrap(), node);
            // A record as the write path keeps them: stored ops made every
            // node, and there is a newest counter exactly when ops are stored.
            let next_height = height / 2;
            let tree = TreeRecord {
                number: 1 + parent % arbor::forest::records::TREE_NUMBER_MAX,
                max_counter: if next_height == 0 { 0 } else { 1 + child % arbor::COUNTER_MAX },
                next_height,
                node_count: old_ts % (next_height + 1),
                max_parent: parent,
            };
            prop_assert_eq!(decode_tree(&encode_tree(&tree)).unwrap(), tree);
            // One that breaks them is damage: a typed error, never a panic.
            let broken = TreeRecord { node_count: next_height + 1, ..tree };
            let bytes = postcard::to_stdvec(&broken).unwrap();
            prop_assert!(matches!(decode_tree(&bytes), Err(arbor::Error::Malformed(_))));
            let key = TreeKey::new(ContainerId([height as u8; 32]), "tree/ü");
            prop_assert_eq!(decode_tree_key(&tree_key_bytes(&key)).unwrap(), key);
        }
    }
}
