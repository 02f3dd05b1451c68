//! Property test of local writes: random AddByPath / Move / Remove requests
//! mixed with replicated ops from two other replicas (same-name directories,
//! old timestamps), in random batches. A model of `write_batch` (replicated
//! ops first, then local ones in request order, each on the next counter)
//! predicts every outcome and the full state after every batch.

use arbor::forest::*;
use arbor::model::TreeModel;
use arbor::*;
use proptest::prelude::*;

fn tree() -> TreeKey {
    TreeKey::new(ContainerId([2; 32]), "local")
}

const NAMES: [&str; 3] = ["a", "b", ""];

#[derive(Clone, Debug)]
enum Req {
    Add {
        dirs: Vec<usize>,
        leaf: usize,
        extra: bool,
    },
    /// Node chosen among the model's nodes at run time.
    Remove {
        pick: usize,
    },
    Move {
        child: usize,
        parent: usize,
        name: usize,
    },
    Foreign(Move),
}

fn foreign_op() -> impl Strategy<Value = Move> {
    let id = (1u64..=6, 2u16..=3).prop_map(|(c, r)| make_timestamp(c, r));
    let parent = prop_oneof![2 => Just(ROOT), 1 => Just(TRASH), 3 => id.clone()];
    (1u64..=30, 2u16..=3, parent, id, 0..NAMES.len()).prop_map(
        |(counter, replica, parent, child, name)| Move {
            parent,
            child,
            meta: Meta {
                time: make_timestamp(counter, replica),
                items: vec![KeyValue::new(ATTR_FILE_NAME, NAMES[name])],
            },
        },
    )
}

fn request() -> impl Strategy<Value = Req> {
    prop_oneof![
        4 => (proptest::collection::vec(0..NAMES.len(), 1..=3), 0..NAMES.len(), any::<bool>())
            .prop_map(|(dirs, leaf, extra)| Req::Add { dirs, leaf, extra }),
        1 => any::<usize>().prop_map(|pick| Req::Remove { pick }),
        1 => (any::<usize>(), any::<usize>(), 0..NAMES.len())
            .prop_map(|(child, parent, name)| Req::Move { child, parent, name }),
        3 => foreign_op().prop_map(Req::Foreign),
    ]
}

fn batches() -> impl Strategy<Value = Vec<Vec<Req>>> {
    proptest::collection::vec(proptest::collection::vec(request(), 1..8), 1..10)
}

fn names(indexes: &[usize]) -> Vec<String> {
    indexes.iter().map(|&i| NAMES[i].to_string()).collect()
}

/// Node ids of the model, for picking targets.
fn node_ids(model: &TreeModel) -> Vec<NodeId> {
    model.dump().nodes.iter().map(|n| n.id).collect()
}

fn next_ts(model: &TreeModel) -> Timestamp {
    make_timestamp(model.max_counter() + 1, 1)
}

/// Runs one batch through the model; returns the concrete requests (in
/// request order) and the expected outcomes.
fn model_batch(model: &mut TreeModel, batch: &[Req]) -> (Vec<WriteOp>, Vec<Result<WriteOutcome>>) {
    let mut ops: Vec<Option<WriteOp>> = vec![None; batch.len()];
    let mut expected: Vec<Option<Result<WriteOutcome>>> = vec![None; batch.len()];
    for (i, req) in batch.iter().enumerate() {
        if let Req::Foreign(op) = req {
            // A timestamp names one op: reuse the logged op when the
            // generator drew the same timestamp twice.
            let op = model.op_at(op.ts()).unwrap_or(op).clone();
            let fresh = model.apply(&op);
            ops[i] = Some(WriteOp::Apply { op });
            expected[i] = Some(Ok(WriteOutcome::Applied { fresh }));
        }
    }
    for (i, req) in batch.iter().enumerate() {
        let (op, outcome) = match req {
            Req::Foreign(_) => continue,
            Req::Add { dirs, leaf, extra } => model_add(model, &names(dirs), *leaf, *extra),
            Req::Remove { pick } => model_remove(model, *pick),
            Req::Move {
                child,
                parent,
                name,
            } => model_move(model, *child, *parent, *name),
        };
        ops[i] = Some(op);
        expected[i] = Some(outcome);
    }
    let ops = ops.into_iter().map(Option::unwrap).collect();
    (ops, expected.into_iter().map(Option::unwrap).collect())
}

fn model_add(
    model: &mut TreeModel,
    dirs: &[String],
    leaf: usize,
    extra: bool,
) -> (WriteOp, Result<WriteOutcome>) {
    let mut items = vec![KeyValue::new(ATTR_FILE_NAME, NAMES[leaf])];
    if extra {
        items.push(KeyValue::new("Size", "1"));
    }
    let ops = model.add_by_path_ops(dirs, &items, 1);
    for op in &ops {
        assert!(model.apply(op));
    }
    let (leaf_op, dir_ops) = ops.split_last().unwrap();
    let outcome = WriteOutcome::AddedByPath {
        leaf: leaf_op.child,
        created: dir_ops.iter().map(|op| op.child).collect(),
        parent: leaf_op.parent,
        ts: leaf_op.ts(),
    };
    let request = WriteOp::AddByPath {
        attr: ATTR_FILE_NAME.into(),
        path: dirs.to_vec(),
        items,
    };
    (request, Ok(outcome))
}

fn model_remove(model: &mut TreeModel, pick: usize) -> (WriteOp, Result<WriteOutcome>) {
    let ids = node_ids(model);
    if ids.is_empty() {
        let node = 77;
        let error = if model.max_counter() == 0 {
            Error::TreeNotFound
        } else {
            Error::NodeNotFound(node)
        };
        return (WriteOp::Remove { node }, Err(error));
    }
    let node = ids[pick % ids.len()];
    let ts = next_ts(model);
    let items = model.node(node).unwrap().meta.items;
    assert!(model.apply(&Move {
        parent: TRASH,
        child: node,
        meta: Meta { time: ts, items }
    }));
    (
        WriteOp::Remove { node },
        Ok(WriteOutcome::Moved { node, ts }),
    )
}

fn model_move(
    model: &mut TreeModel,
    child: usize,
    parent: usize,
    name: usize,
) -> (WriteOp, Result<WriteOutcome>) {
    let ids = node_ids(model);
    let ts = next_ts(model);
    // An empty model or an out-of-range pick creates a fresh node under ROOT.
    let child = (!ids.is_empty() && !child.is_multiple_of(3)).then(|| ids[child % ids.len()]);
    let parent = if ids.is_empty() {
        ROOT
    } else {
        ids[parent % ids.len()]
    };
    let items = vec![KeyValue::new(ATTR_FILE_NAME, NAMES[name])];
    let node = child.unwrap_or(ts);
    if !model.is_ancestor_or_self(ROOT, parent) {
        // Under TRASH or an orphan (a foreign op's missing parent): refused,
        // nothing stored, no timestamp taken.
        let op = WriteOp::Move {
            parent,
            child,
            items,
        };
        return (op, Err(Error::ParentNotLive(parent)));
    }
    assert!(model.apply(&Move {
        parent,
        child: node,
        meta: Meta {
            time: ts,
            items: items.clone()
        }
    }));
    (
        WriteOp::Move {
            parent,
            child,
            items,
        },
        Ok(WriteOutcome::Moved { node, ts }),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn local_writes_match_the_model(batches in batches()) {
        let forest = Forest::in_memory(ForestOptions::default()).unwrap();
        let mut model = TreeModel::new();
        for batch in &batches {
            let (ops, expected) = model_batch(&mut model, batch);
            let requests: Vec<WriteRequest> = ops
                .into_iter()
                .map(|op| WriteRequest { tree: tree(), op })
                .collect();
            let outcomes = forest.write_batch(&requests).unwrap().results;
            prop_assert_eq!(outcomes, expected);
            if model.max_counter() > 0 {
                prop_assert_eq!(forest.dump(&tree()).unwrap(), model.dump());
                prop_assert_eq!(forest.check_invariants(&tree()), Ok(()));
            }
        }
        for first in NAMES {
            for second in NAMES {
                let path = vec![first.to_string(), second.to_string()];
                if model.max_counter() > 0 {
                    let stored = forest.get_by_path(&tree(), ATTR_FILE_NAME, &path, false).unwrap();
                    prop_assert_eq!(stored, model.get_by_path(&path, false));
                }
            }
        }
    }
}
