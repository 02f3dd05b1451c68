//! Unit tests of the forest: every operation, the CRDT corner cases and the
//! typed errors.

use arbor::forest::*;
use arbor::model::TreeModel;
use arbor::*;

fn tree() -> TreeKey {
    TreeKey::new(ContainerId([7; 32]), "t")
}

fn forest() -> Forest {
    Forest::in_memory(ForestOptions::default()).unwrap()
}

fn forest_as(replica_id: ReplicaId) -> Forest {
    Forest::in_memory(ForestOptions {
        replica_id,
        ..ForestOptions::default()
    })
    .unwrap()
}

fn name(x: &str) -> Vec<KeyValue> {
    vec![KeyValue::new(ATTR_FILE_NAME, x)]
}

fn path(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

fn op(ts: Timestamp, parent: NodeId, child: NodeId, items: Vec<KeyValue>) -> Move {
    Move {
        parent,
        child,
        meta: Meta { time: ts, items },
    }
}

fn ts(counter: u64, replica: ReplicaId) -> Timestamp {
    make_timestamp(counter, replica)
}

fn write_one(f: &Forest, op: WriteOp) -> Result<WriteOutcome> {
    let mut out = f
        .write_batch(&[WriteRequest { tree: tree(), op }])
        .unwrap()
        .results;
    out.pop().unwrap()
}

fn apply(f: &Forest, ops: &[Move]) -> Vec<Result<WriteOutcome>> {
    let requests: Vec<WriteRequest> = ops
        .iter()
        .map(|op| WriteRequest {
            tree: tree(),
            op: WriteOp::Apply { op: op.clone() },
        })
        .collect();
    f.write_batch(&requests).unwrap().results
}

fn add_by_path(f: &Forest, dirs: &[&str], items: Vec<KeyValue>) -> Result<WriteOutcome> {
    write_one(
        f,
        WriteOp::AddByPath {
            attr: ATTR_FILE_NAME.into(),
            path: path(dirs),
            items,
        },
    )
}

fn model_of(ops: &[Move]) -> TreeModel {
    let mut model = TreeModel::new();
    for op in ops {
        model.apply(op);
    }
    model
}

#[test]
fn add_by_path_creates_missing_dirs_then_a_leaf() {
    let f = forest();
    let first = add_by_path(&f, &["a", "b"], name("file")).unwrap();
    let WriteOutcome::AddedByPath {
        leaf,
        created,
        parent,
        ts,
    } = first
    else {
        panic!("unexpected outcome {first:?}");
    };
    assert_eq!(
        parent, created[1],
        "the leaf hangs under the last directory"
    );
    // Two directories and the leaf take three consecutive counters.
    assert_eq!(created, vec![make_timestamp(1, 1), make_timestamp(2, 1)]);
    assert_eq!(leaf, make_timestamp(3, 1));
    assert_eq!(ts, leaf);
    let leaf_node = f.get_node(&tree(), leaf).unwrap().unwrap();
    assert_eq!(leaf_node.parent, created[1]);
    assert_eq!(
        f.get_node(&tree(), created[0]).unwrap().unwrap().parent,
        ROOT
    );

    // A second add reuses the directories.
    let second = add_by_path(&f, &["a", "b"], name("other")).unwrap();
    let WriteOutcome::AddedByPath {
        leaf: leaf2,
        created: created2,
        parent: parent2,
        ..
    } = second
    else {
        panic!("unexpected outcome {second:?}");
    };
    assert!(created2.is_empty());
    assert_eq!(parent2, created[1], "an existing directory is the parent");
    assert_eq!(
        f.get_node(&tree(), leaf2).unwrap().unwrap().parent,
        created[1]
    );
    let found = f
        .get_by_path(&tree(), ATTR_FILE_NAME, &path(&["a", "b", "other"]), false)
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].id, leaf2);
    f.check_invariants(&tree()).unwrap();
}

#[test]
fn leaf_items_are_stored_as_given() {
    let f = forest();
    let items = vec![
        KeyValue::new("Owner", "me"),
        KeyValue::new(ATTR_FILE_NAME, "x"),
    ];
    let WriteOutcome::AddedByPath { leaf, .. } = add_by_path(&f, &["d"], items.clone()).unwrap()
    else {
        panic!()
    };
    let node = f.get_node(&tree(), leaf).unwrap().unwrap();
    assert_eq!(node.meta.items, items);
    assert_eq!(node.meta.time, leaf);
    // The leaf is not a directory: a deeper path through it finds nothing.
    let through = f
        .get_by_path(&tree(), ATTR_FILE_NAME, &path(&["d", "x", "y"]), false)
        .unwrap();
    assert!(through.is_empty());
}

#[test]
fn duplicate_names_and_latest_only() {
    let f = forest();
    let mut leaves = Vec::new();
    for owner in ["a", "b", "c"] {
        let items = vec![
            KeyValue::new(ATTR_FILE_NAME, "f"),
            KeyValue::new("Owner", owner),
        ];
        match add_by_path(&f, &["dir"], items).unwrap() {
            WriteOutcome::AddedByPath { leaf, .. } => leaves.push(leaf),
            other => panic!("{other:?}"),
        }
    }
    let all = f
        .get_by_path(&tree(), ATTR_FILE_NAME, &path(&["dir", "f"]), false)
        .unwrap();
    assert_eq!(all.iter().map(|n| n.id).collect::<Vec<_>>(), leaves);
    let latest = f
        .get_by_path(&tree(), ATTR_FILE_NAME, &path(&["dir", "f"]), true)
        .unwrap();
    assert_eq!(latest.len(), 1);
    assert_eq!(latest[0].id, leaves[2]);
    assert_eq!(latest[0].meta.get("Owner"), Some(&b"c"[..]));

    // Updating the oldest one makes it the latest.
    let update = WriteOp::Move {
        parent: all[0].parent,
        child: Some(leaves[0]),
        items: vec![
            KeyValue::new(ATTR_FILE_NAME, "f"),
            KeyValue::new("Owner", "z"),
        ],
    };
    write_one(&f, update).unwrap();
    let latest = f
        .get_by_path(&tree(), ATTR_FILE_NAME, &path(&["dir", "f"]), true)
        .unwrap();
    assert_eq!(latest[0].id, leaves[0]);
}

/// Many large versions under one path: a bounded lookup refuses as soon
/// as its answer passes the bound, having built at most the bound plus one
/// version (the size it reports), not every version; the attribute filter
/// applies before counting, so a filtered answer of the same matches fits.
#[test]
fn path_lookup_stops_building_at_its_bound() {
    let f = forest();
    let (versions, blob_bytes) = (120, 32 << 10);
    for _ in 0..versions {
        let mut items = name("f");
        items.push(KeyValue::new("blob", vec![9u8; blob_bytes]));
        add_by_path(&f, &["dir"], items).unwrap();
    }
    let bounds = AnswerBounds {
        bytes_max: 256 << 10,
        node_overhead_bytes: 64,
        ..AnswerBounds::UNBOUNDED
    };
    let lookup = |keep: &dyn Fn(&KeyValue) -> bool| {
        let answer = PathAnswer { keep, bounds };
        f.get_by_path_bounded(&tree(), ATTR_FILE_NAME, &path(&["dir", "f"]), false, answer)
    };
    let Err(Error::TooLarge { what, size, limit }) = lookup(&|_| true) else {
        panic!("an answer of {versions} versions of {blob_bytes} bytes fit");
    };
    assert_eq!((what.as_str(), limit), ("nodes", 256 << 10));
    let one_version = (blob_bytes + 1024) as u64;
    assert!(size > limit && size <= limit + one_version, "built {size}");
    assert!(size < (versions * blob_bytes) as u64 / 4);
    let names_only = lookup(&|kv: &KeyValue| kv.key == ATTR_FILE_NAME).unwrap();
    assert_eq!(names_only.len(), versions);
    assert!(names_only.iter().all(|n| n.meta.items.len() == 1));
    let few = AnswerBounds {
        nodes_max: 3,
        ..AnswerBounds::UNBOUNDED
    };
    let answer = PathAnswer {
        keep: &|_| true,
        bounds: few,
    };
    let refused =
        f.get_by_path_bounded(&tree(), ATTR_FILE_NAME, &path(&["dir", "f"]), false, answer);
    assert!(matches!(
        refused,
        Err(Error::TooLarge {
            size: 4,
            limit: 3,
            ..
        })
    ));
}

#[test]
fn concurrent_same_name_dirs_resolve_to_the_smallest_id() {
    // Replica 2 and replica 3 both create /d before seeing each other.
    let a = forest_as(2);
    let b = forest_as(3);
    add_by_path(&a, &["d"], name("from-a")).unwrap();
    add_by_path(&b, &["d"], name("from-b")).unwrap();
    let log_a = a.dump(&tree()).unwrap().log;
    let log_b = b.dump(&tree()).unwrap().log;
    apply(&a, &log_b);
    apply(&b, &log_a);
    assert_eq!(a.dump(&tree()).unwrap(), b.dump(&tree()).unwrap());
    let dir_a = make_timestamp(1, 2);
    for f in [&a, &b] {
        // Both directories exist; the smaller id is the one paths go through.
        let dirs = f
            .get_by_path(&tree(), ATTR_FILE_NAME, &path(&["d"]), false)
            .unwrap();
        assert_eq!(dirs.len(), 2);
        let WriteOutcome::AddedByPath { created, leaf, .. } =
            add_by_path(f, &["d"], name("n")).unwrap()
        else {
            panic!()
        };
        assert!(created.is_empty());
        assert_eq!(f.get_node(&tree(), leaf).unwrap().unwrap().parent, dir_a);
        let found = f
            .get_by_path(&tree(), ATTR_FILE_NAME, &path(&["d", "from-b"]), false)
            .unwrap();
        assert!(found.is_empty(), "from-b hangs under the other /d");
    }
}

#[test]
fn empty_file_name_is_a_valid_component() {
    let f = forest();
    let WriteOutcome::AddedByPath { leaf, created, .. } =
        add_by_path(&f, &["", "x"], name("")).unwrap()
    else {
        panic!()
    };
    assert_eq!(created.len(), 2);
    let found = f
        .get_by_path(&tree(), ATTR_FILE_NAME, &path(&["", "x", ""]), false)
        .unwrap();
    assert_eq!(found.iter().map(|n| n.id).collect::<Vec<_>>(), vec![leaf]);
    // A node without FileName is not matched by the empty name.
    let nameless = WriteOp::Move {
        parent: ROOT,
        child: None,
        items: vec![KeyValue::new("k", "v")],
    };
    write_one(&f, nameless).unwrap();
    let top = f
        .get_by_path(&tree(), ATTR_FILE_NAME, &path(&[""]), false)
        .unwrap();
    assert_eq!(
        top.iter().map(|n| n.id).collect::<Vec<_>>(),
        vec![created[0]]
    );
}

#[test]
fn move_under_own_descendant_is_logged_without_effect() {
    let f = forest();
    let (a, b, c) = (ts(1, 9), ts(2, 9), ts(3, 9));
    let ops = vec![
        op(a, ROOT, a, name("a")),
        op(b, a, b, name("b")),
        op(c, b, a, name("a2")),
    ];
    let results = apply(&f, &ops);
    assert!(results
        .iter()
        .all(|r| r == &Ok(WriteOutcome::Applied { fresh: true })));
    let dump = f.dump(&tree()).unwrap();
    assert_eq!(dump.log.len(), 3);
    let node_a = f.get_node(&tree(), a).unwrap().unwrap();
    assert_eq!((node_a.parent, node_a.meta.time), (ROOT, a));
    // Moving a node under itself is the shortest such cycle.
    apply(&f, &[op(ts(4, 9), a, a, name("self"))]);
    assert_eq!(f.get_node(&tree(), a).unwrap().unwrap().parent, ROOT);
    assert_eq!(dump_without_log(&f), model_nodes(&f));
    f.check_invariants(&tree()).unwrap();
}

#[test]
fn redo_reevaluates_the_cycle_check() {
    // c (newest) moves a under b; an older op that makes b a child of a
    // arrives later, so on redo c becomes a no-op.
    let (a, b) = (ts(1, 1), ts(2, 1));
    let ops = vec![
        op(a, ROOT, a, name("a")),
        op(b, ROOT, b, name("b")),
        op(ts(10, 1), b, a, name("a")),
        op(ts(5, 2), a, b, name("b")),
    ];
    let f = forest();
    apply(&f, &ops[..3]);
    assert_eq!(f.get_node(&tree(), a).unwrap().unwrap().parent, b);
    apply(&f, &ops[3..]);
    assert_eq!(f.get_node(&tree(), b).unwrap().unwrap().parent, a);
    assert_eq!(f.get_node(&tree(), a).unwrap().unwrap().parent, ROOT);
    assert_eq!(f.dump(&tree()).unwrap(), model_of(&ops).dump());
    f.check_invariants(&tree()).unwrap();
}

#[test]
fn child_attached_before_its_parent_exists() {
    let f = forest();
    let (parent, child) = (ts(5, 2), ts(6, 2));
    apply(&f, &[op(child, parent, child, name("c"))]);
    assert_eq!(f.get_children(&tree(), parent).unwrap(), vec![child]);
    assert_eq!(f.get_node(&tree(), parent).unwrap(), None);
    f.check_invariants(&tree()).unwrap();
    apply(&f, &[op(parent, ROOT, parent, name("p"))]);
    let found = f
        .get_by_path(&tree(), ATTR_FILE_NAME, &path(&["p", "c"]), false)
        .unwrap();
    assert_eq!(found.iter().map(|n| n.id).collect::<Vec<_>>(), vec![child]);
    f.check_invariants(&tree()).unwrap();
}

#[test]
fn op_older_than_the_whole_log() {
    let ops: Vec<Move> = (2..20u64)
        .map(|i| {
            op(
                ts(i, 1),
                ts(i - 1, 1) * u64::from(i > 2),
                ts(i, 1),
                name(&i.to_string()),
            )
        })
        .collect();
    let old = op(ts(1, 3), ROOT, ts(5, 1), name("moved-early"));
    let f = forest();
    apply(&f, &ops);
    let before = f.next_height(&tree()).unwrap();
    apply(&f, std::slice::from_ref(&old));
    assert_eq!(f.next_height(&tree()).unwrap(), before + 1);
    let mut all = ops.clone();
    all.push(old);
    assert_eq!(f.dump(&tree()).unwrap(), model_of(&all).dump());
    // The old op is overwritten by the later ops that set node 5.
    let node = f.get_node(&tree(), ts(5, 1)).unwrap().unwrap();
    assert_eq!(node.meta.time, ts(5, 1));
    f.check_invariants(&tree()).unwrap();
}

#[test]
fn reapplying_a_whole_log_changes_nothing() {
    let f = forest();
    for i in 0..20 {
        add_by_path(&f, &["a", &format!("d{}", i % 3)], name(&format!("f{i}"))).unwrap();
    }
    let dump = f.dump(&tree()).unwrap();
    let heights = f.next_height(&tree()).unwrap();
    let results = apply(&f, &dump.log);
    assert!(results
        .iter()
        .all(|r| r == &Ok(WriteOutcome::Applied { fresh: false })));
    assert_eq!(f.dump(&tree()).unwrap(), dump);
    assert_eq!(f.next_height(&tree()).unwrap(), heights);
    // A different op under a known timestamp is refused, not stored.
    let mut forged = dump.log[3].clone();
    forged.parent = TRASH;
    assert!(matches!(
        apply(&f, &[forged])[0],
        Err(Error::StampConflict(_))
    ));
    assert_eq!(f.dump(&tree()).unwrap(), dump);
}

#[test]
fn duplicates_inside_one_batch() {
    let f = forest();
    let a = op(ts(3, 2), ROOT, ts(3, 2), name("a"));
    let mut forged = a.clone();
    forged.parent = TRASH;
    let results = apply(&f, &[a.clone(), a.clone(), forged]);
    assert_eq!(results[0], Ok(WriteOutcome::Applied { fresh: true }));
    assert_eq!(results[1], Ok(WriteOutcome::Applied { fresh: false }));
    assert!(matches!(results[2], Err(Error::StampConflict(_))));
    assert_eq!(f.dump(&tree()).unwrap().log, vec![a]);
}

#[test]
fn remove_moves_to_trash_keeping_meta() {
    let f = forest();
    let items = vec![KeyValue::new(ATTR_FILE_NAME, "x"), KeyValue::new("k", "v")];
    let WriteOutcome::AddedByPath { leaf, .. } = add_by_path(&f, &["d"], items.clone()).unwrap()
    else {
        panic!()
    };
    let WriteOutcome::Moved { node, ts } = write_one(&f, WriteOp::Remove { node: leaf }).unwrap()
    else {
        panic!()
    };
    assert_eq!(node, leaf);
    let removed = f.get_node(&tree(), leaf).unwrap().unwrap();
    assert_eq!(removed.parent, TRASH);
    assert_eq!(removed.meta, Meta { time: ts, items });
    assert!(f
        .get_by_path(&tree(), ATTR_FILE_NAME, &path(&["d", "x"]), false)
        .unwrap()
        .is_empty());
    assert_eq!(f.get_children(&tree(), TRASH).unwrap(), vec![leaf]);
}

#[test]
fn local_timestamps_follow_the_largest_counter_seen() {
    let f = forest_as(4);
    apply(&f, &[op(ts(40, 9), ROOT, ts(40, 9), name("remote"))]);
    let out = write_one(
        &f,
        WriteOp::Move {
            parent: ROOT,
            child: None,
            items: name("local"),
        },
    )
    .unwrap();
    assert_eq!(
        out,
        WriteOutcome::Moved {
            node: ts(41, 4),
            ts: ts(41, 4)
        }
    );
    // The counter is per tree.
    let other = TreeKey::new(ContainerId([7; 32]), "other");
    let mut res = f
        .write_batch(&[WriteRequest {
            tree: other,
            op: WriteOp::Move {
                parent: ROOT,
                child: None,
                items: name("x"),
            },
        }])
        .unwrap()
        .results;
    assert_eq!(
        res.pop().unwrap().unwrap(),
        WriteOutcome::Moved {
            node: ts(1, 4),
            ts: ts(1, 4)
        }
    );
}

/// A tree dropped and written again starts above its dropped
/// incarnation's counter, so a replica that never held the old ops meets
/// a jump with nothing below it to arrive. Such an op pushed (`Apply`) is
/// held to `counter_jump_max`; pulled from the writer's log (`Pulled`) it
/// is taken, and the pushes after it are within reach again.
#[test]
fn a_log_above_a_drop_is_pulled_at_any_counter() {
    let options = |replica_id| ForestOptions {
        replica_id,
        counter_jump_max: 4,
        ..ForestOptions::default()
    };
    let writer = Forest::in_memory(options(1)).unwrap();
    let local = |f: &Forest, x: &str| match write_one(
        f,
        WriteOp::Move {
            parent: ROOT,
            child: None,
            items: name(x),
        },
    ) {
        Ok(WriteOutcome::Moved { ts, .. }) => ts,
        other => panic!("local write: {other:?}"),
    };
    for i in 0..10 {
        local(&writer, &format!("old-{i}"));
    }
    writer.tree_drop(&tree().cid, Some(&tree().tree)).unwrap();
    let first = local(&writer, "new-0");
    assert_eq!(timestamp_counter(first), 11, "starts above the drop");
    let log: Vec<Move> = writer
        .get_op_log(&tree(), 0, 100)
        .unwrap()
        .into_iter()
        .map(|entry| entry.op)
        .collect();
    assert_eq!(log.len(), 1);

    let reader = Forest::in_memory(options(2)).unwrap();
    let pushed = apply(&reader, &log);
    assert!(
        matches!(
            pushed[0],
            Err(Error::CounterTooFar {
                counter: 11,
                known: 0,
                limit: 4
            })
        ),
        "{pushed:?}"
    );
    let pulled = write_one(&reader, WriteOp::Pulled { op: log[0].clone() });
    assert_eq!(pulled.unwrap(), WriteOutcome::Applied { fresh: true });
    let next = local(&writer, "new-1");
    let next_op = op(next, ROOT, next, name("new-1"));
    assert_eq!(
        apply(&reader, &[next_op]),
        vec![Ok(WriteOutcome::Applied { fresh: true })]
    );
    // Far past everything, a push is still refused.
    let far = ts(100, 1);
    assert!(matches!(
        apply(&reader, &[op(far, ROOT, far, name("far"))])[0],
        Err(Error::CounterTooFar { .. })
    ));
}

/// Recognises the expected error of one bad request.
type ErrorCheck = fn(&Error) -> bool;

#[test]
fn typed_errors_for_bad_input() {
    let f = Forest::in_memory(ForestOptions {
        max_meta_bytes: 64,
        max_path_len: 3,
        ..Default::default()
    })
    .unwrap();
    let big = vec![KeyValue::new("k", vec![0u8; 100])];
    let cases: Vec<(WriteOp, ErrorCheck)> = vec![
        (
            WriteOp::Move {
                parent: ROOT,
                child: Some(ROOT),
                items: vec![],
            },
            |e| *e == Error::RootImmutable,
        ),
        (
            WriteOp::Move {
                parent: ROOT,
                child: Some(TRASH),
                items: vec![],
            },
            |e| matches!(e, Error::InvalidOp(_)),
        ),
        (
            WriteOp::Move {
                parent: ROOT,
                child: None,
                items: vec![KeyValue::new("k", vec![0u8; 100])],
            },
            |e| matches!(e, Error::TooLarge { .. }),
        ),
        (WriteOp::Remove { node: ROOT }, |e| {
            *e == Error::RootImmutable
        }),
        (
            WriteOp::AddByPath {
                attr: "Name".into(),
                path: path(&["a"]),
                items: vec![],
            },
            |e| matches!(e, Error::UnsupportedAttribute(_)),
        ),
        (
            WriteOp::AddByPath {
                attr: ATTR_FILE_NAME.into(),
                path: vec![],
                items: vec![],
            },
            |e| *e == Error::EmptyPath,
        ),
        (
            WriteOp::AddByPath {
                attr: ATTR_FILE_NAME.into(),
                path: path(&["a", "b", "c", "d"]),
                items: vec![],
            },
            |e| matches!(e, Error::TooLarge { .. }),
        ),
        (
            WriteOp::AddByPath {
                attr: ATTR_FILE_NAME.into(),
                path: path(&["a"]),
                items: big.clone(),
            },
            |e| matches!(e, Error::TooLarge { .. }),
        ),
        (
            WriteOp::Apply {
                op: op(0, ROOT, 5, vec![]),
            },
            |e| matches!(e, Error::InvalidOp(_)),
        ),
        (
            WriteOp::Apply {
                op: op(ts(1, 1), ROOT, ROOT, vec![]),
            },
            |e| matches!(e, Error::InvalidOp(_)),
        ),
        (
            WriteOp::Apply {
                op: op(ts(1, 1), ROOT, TRASH, vec![]),
            },
            |e| matches!(e, Error::InvalidOp(_)),
        ),
        (
            WriteOp::Apply {
                op: op(u64::MAX, ROOT, 5, vec![]),
            },
            |e| matches!(e, Error::InvalidOp(_)),
        ),
        (
            WriteOp::Apply {
                op: op(ts(1, 1), ROOT, 5, big),
            },
            |e| matches!(e, Error::TooLarge { .. }),
        ),
    ];
    let requests: Vec<WriteRequest> = cases
        .iter()
        .map(|(op, _)| WriteRequest {
            tree: tree(),
            op: op.clone(),
        })
        .chain(std::iter::once(WriteRequest {
            tree: tree(),
            op: WriteOp::Move {
                parent: ROOT,
                child: None,
                items: name("ok"),
            },
        }))
        .collect();
    let results = f.write_batch(&requests).unwrap().results;
    for (i, (result, (_, expected))) in results.iter().zip(&cases).enumerate() {
        let err = result.as_ref().expect_err(&format!("case {i} must fail"));
        assert!(expected(err), "case {i}: unexpected {err:?}");
    }
    // Bad requests do not fail the batch: the good one is stored alone.
    assert!(results.last().unwrap().is_ok());
    assert_eq!(f.dump(&tree()).unwrap().log.len(), 1);

    // Remove of an unknown node or tree.
    assert_eq!(
        write_one(&f, WriteOp::Remove { node: 12345 }),
        Err(Error::NodeNotFound(12345))
    );
    let missing = TreeKey::new(ContainerId([1; 32]), "missing");
    let res = f
        .write_batch(&[WriteRequest {
            tree: missing.clone(),
            op: WriteOp::Remove { node: 5 },
        }])
        .unwrap()
        .results;
    assert_eq!(res[0], Err(Error::TreeNotFound));
    assert!(!f.tree_exists(&missing).unwrap());

    // Reads.
    assert_eq!(
        f.get_by_path(&missing, ATTR_FILE_NAME, &path(&["a"]), false),
        Err(Error::TreeNotFound)
    );
    assert_eq!(
        f.get_by_path(&tree(), "Other", &path(&["a"]), false),
        Err(Error::UnsupportedAttribute("Other".into()))
    );
    assert_eq!(
        f.get_by_path(&tree(), ATTR_FILE_NAME, &[], false),
        Err(Error::EmptyPath)
    );
    assert_eq!(f.get_node(&missing, 1), Err(Error::TreeNotFound));
    assert_eq!(f.get_children(&missing, ROOT), Err(Error::TreeNotFound));
    assert_eq!(
        f.get_subtree(&missing, ROOT, 0, 10),
        Err(Error::TreeNotFound)
    );
    assert_eq!(f.get_op_log(&missing, 0, 10), Err(Error::TreeNotFound));
    assert_eq!(f.dump(&missing), Err(Error::TreeNotFound));
    assert_eq!(
        f.get_subtree(&tree(), 999, 0, 10),
        Err(Error::NodeNotFound(999))
    );
    assert_eq!(
        f.tree_drop(&missing.cid, Some("missing")),
        Err(Error::TreeNotFound)
    );
    assert_eq!(
        f.set_cursor(&missing, CursorKind::Pull, 1, 5),
        Err(Error::TreeNotFound)
    );
    assert_eq!(f.cursor(&missing, CursorKind::Pull, 1), Ok(0));
}

#[test]
fn subtree_is_depth_first_and_bounded() {
    let f = forest();
    for p in [&["a", "b"][..], &["a", "c"], &["d"]] {
        add_by_path(&f, p, name("leaf")).unwrap();
    }
    let all = f.get_subtree(&tree(), ROOT, 0, 100).unwrap();
    assert_eq!(all.len(), 1 + 7);
    assert_eq!(all[0].id, ROOT);
    let mut position = std::collections::BTreeMap::new();
    for (i, n) in all.iter().enumerate() {
        position.insert(n.id, i);
    }
    for n in &all[1..] {
        assert!(position[&n.parent] < position[&n.id], "parent after child");
    }
    // Depth 1 is the root alone; depth 2 adds its children.
    assert_eq!(f.get_subtree(&tree(), ROOT, 1, 100).unwrap().len(), 1);
    assert_eq!(f.get_subtree(&tree(), ROOT, 2, 100).unwrap().len(), 3);
    assert!(matches!(
        f.get_subtree(&tree(), ROOT, 0, 7),
        Err(Error::TooLarge { .. })
    ));
    assert_eq!(f.get_subtree(&tree(), ROOT, 0, 8).unwrap(), all);
}

#[test]
fn op_log_is_in_storage_order_with_heights() {
    let f = forest();
    let late = op(ts(1, 5), ROOT, ts(1, 5), name("late"));
    let early = op(ts(9, 5), ROOT, ts(9, 5), name("early"));
    apply(&f, std::slice::from_ref(&early));
    apply(&f, std::slice::from_ref(&late));
    let log = f.get_op_log(&tree(), 0, 10).unwrap();
    assert_eq!(
        log,
        vec![
            LogEntry {
                height: 0,
                op: early
            },
            LogEntry {
                height: 1,
                op: late.clone()
            }
        ]
    );
    assert_eq!(
        f.get_op_log(&tree(), 1, 10).unwrap(),
        vec![LogEntry {
            height: 1,
            op: late
        }]
    );
    assert_eq!(f.get_op_log(&tree(), 0, 1).unwrap().len(), 1);
    assert!(f.get_op_log(&tree(), 2, 10).unwrap().is_empty());
    assert_eq!(f.next_height(&tree()).unwrap(), 2);
}

#[test]
fn trees_list_and_drop() {
    let f = forest();
    let cid = ContainerId([3; 32]);
    for name_ in ["b", "", "a"] {
        let key = TreeKey::new(cid, name_);
        f.write_batch(&[WriteRequest {
            tree: key,
            op: WriteOp::Move {
                parent: ROOT,
                child: None,
                items: name("x"),
            },
        }])
        .unwrap();
    }
    add_by_path(&f, &["x"], name("y")).unwrap();
    assert_eq!(f.tree_list(&cid).unwrap(), vec!["", "a", "b"]);
    assert_eq!(f.all_trees().unwrap().len(), 4);
    f.set_cursor(&TreeKey::new(cid, "a"), CursorKind::Push, 2, 7)
        .unwrap();
    f.tree_drop(&cid, Some("a")).unwrap();
    assert_eq!(f.tree_list(&cid).unwrap(), vec!["", "b"]);
    assert_eq!(
        f.cursor(&TreeKey::new(cid, "a"), CursorKind::Push, 2)
            .unwrap(),
        0
    );
    f.tree_drop(&cid, None).unwrap();
    assert!(f.tree_list(&cid).unwrap().is_empty());
    assert_eq!(f.all_trees().unwrap(), vec![tree()]);
    // Only the remaining tree's rows are left.
    assert_eq!(
        f.log_rows().unwrap(),
        f.dump(&tree()).unwrap().log.len() as u64
    );
    // A dropped tree starts again with nothing of its own, but above the
    // counter and height its dropped incarnation reached: a peer may still
    // hold that incarnation's op 1 of replica 1, so a new op under the same
    // stamp would be a stamp conflict there (this asserted ts(1, 1) before
    // the dropped marks were kept), and a peer's pull cursor of the old log
    // would pass over the new log's first heights.
    let key = TreeKey::new(cid, "a");
    let res = f
        .write_batch(&[WriteRequest {
            tree: key.clone(),
            op: WriteOp::Move {
                parent: ROOT,
                child: None,
                items: name("x"),
            },
        }])
        .unwrap()
        .results;
    assert_eq!(
        res[0],
        Ok(WriteOutcome::Moved {
            node: ts(2, 1),
            ts: ts(2, 1)
        })
    );
    assert_eq!(f.dump(&key).unwrap().nodes.len(), 1);
    assert_eq!(
        f.next_height(&key),
        Ok(2),
        "heights go on from the dropped log's"
    );
    let page = f.get_op_log_stamps(&key, 0, 10).unwrap();
    let heights: Vec<u64> = page.stamps.iter().map(|s| s.height).collect();
    assert_eq!(
        heights,
        vec![1],
        "a page from below starts at the log's first height"
    );
    assert_eq!(page.first_height, 1, "and names it");
    assert_eq!(f.get_op_log_stamps(&tree(), 0, 10).unwrap().first_height, 0);
    assert_eq!(f.get_op_log(&key, 0, 10).unwrap()[0].height, 1);
    f.check_invariants(&key).unwrap();
}

#[test]
fn cursors_are_durable_and_monotonic() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("forest.redb");
    {
        let f = Forest::open(&file, ForestOptions::default()).unwrap();
        add_by_path(&f, &["a"], name("b")).unwrap();
        f.set_cursor(&tree(), CursorKind::Pull, 2, 10).unwrap();
        f.set_cursor(&tree(), CursorKind::Pull, 2, 10).unwrap();
        f.set_cursor(&tree(), CursorKind::Push, 2, 3).unwrap();
        f.set_cursor(&tree(), CursorKind::Pull, 3, 1).unwrap();
    }
    let f = Forest::open(&file, ForestOptions::default()).unwrap();
    assert_eq!(f.cursor(&tree(), CursorKind::Pull, 2).unwrap(), 10);
    assert_eq!(f.cursor(&tree(), CursorKind::Push, 2).unwrap(), 3);
    assert_eq!(f.cursor(&tree(), CursorKind::Pull, 3).unwrap(), 1);
    assert_eq!(f.cursor(&tree(), CursorKind::Push, 3).unwrap(), 0);
    let back = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        f.set_cursor(&tree(), CursorKind::Pull, 2, 9)
    }));
    assert!(back.is_err(), "a cursor moving backwards must panic");
}

#[test]
fn reopening_a_file_gives_the_same_state() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("forest.redb");
    let dump = {
        let f = Forest::open(&file, ForestOptions::default()).unwrap();
        for i in 0..30 {
            add_by_path(&f, &["a", &format!("{}", i % 4)], name(&format!("{i}"))).unwrap();
        }
        apply(&f, &[op(ts(2, 7), ROOT, ts(2, 7), name("old"))]);
        write_one(&f, WriteOp::Remove { node: ts(3, 1) }).unwrap();
        f.dump(&tree()).unwrap()
    };
    let f = Forest::open(&file, ForestOptions::default()).unwrap();
    assert_eq!(f.dump(&tree()).unwrap(), dump);
    f.check_invariants(&tree()).unwrap();
    let log = f.get_op_log(&tree(), 0, 1000).unwrap();
    assert_eq!(log.len(), dump.log.len());
}

#[test]
fn no_sync_forest_works() {
    let dir = tempfile::tempdir().unwrap();
    let f = Forest::open(
        &dir.path().join("f.redb"),
        ForestOptions {
            durable: false,
            ..Default::default()
        },
    )
    .unwrap();
    add_by_path(&f, &["a"], name("b")).unwrap();
    assert_eq!(
        f.get_by_path(&tree(), ATTR_FILE_NAME, &path(&["a", "b"]), false)
            .unwrap()
            .len(),
        1
    );
}

fn dump_without_log(f: &Forest) -> Vec<NodeInfo> {
    f.dump(&tree()).unwrap().nodes
}

fn model_nodes(f: &Forest) -> Vec<NodeInfo> {
    model_of(&f.dump(&tree()).unwrap().log).dump().nodes
}

#[test]
fn reserved_nodes_in_reads() {
    let f = forest();
    let WriteOutcome::AddedByPath { leaf, created, .. } =
        add_by_path(&f, &["d"], name("x")).unwrap()
    else {
        panic!()
    };
    write_one(&f, WriteOp::Remove { node: created[0] }).unwrap();
    // ROOT and TRASH are not stored nodes, but subtrees hang from them.
    assert_eq!(f.get_node(&tree(), ROOT).unwrap(), None);
    assert_eq!(f.get_node(&tree(), TRASH).unwrap(), None);
    let trash = f.get_subtree(&tree(), TRASH, 0, 10).unwrap();
    assert_eq!(
        trash.iter().map(|n| n.id).collect::<Vec<_>>(),
        vec![TRASH, created[0], leaf]
    );
    assert_eq!(f.get_subtree(&tree(), ROOT, 0, 10).unwrap().len(), 1);
    assert_eq!(f.get_children(&tree(), ROOT).unwrap(), Vec::<NodeId>::new());
    // A removed directory no longer resolves, and a new one is created.
    let WriteOutcome::AddedByPath { created: again, .. } =
        add_by_path(&f, &["d"], name("y")).unwrap()
    else {
        panic!()
    };
    assert_eq!(again.len(), 1);
    assert_ne!(again[0], created[0]);
    f.check_invariants(&tree()).unwrap();
}

/// Storage shared between backend instances, so a database can be reopened
/// on what an earlier instance left, with a switch that fails every write
/// and a budget of reads after which every read fails (negative: none).
#[derive(Debug, Default)]
struct SharedDisk {
    bytes: std::sync::Mutex<Vec<u8>>,
    failing: std::sync::atomic::AtomicBool,
    reads_left: std::sync::atomic::AtomicI64,
}

#[derive(Debug)]
struct SharedBackend(std::sync::Arc<SharedDisk>);

impl redb::StorageBackend for SharedBackend {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.0.bytes.lock().unwrap().len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.0.reads_left.load(SeqCst) == 0 {
            return Err(std::io::Error::other("injected read failure"));
        }
        if self.0.reads_left.load(SeqCst) > 0 {
            self.0.reads_left.fetch_sub(1, SeqCst);
        }
        let bytes = self.0.bytes.lock().unwrap();
        let start = offset as usize;
        out.copy_from_slice(&bytes[start..start + out.len()]);
        Ok(())
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.0.bytes.lock().unwrap().resize(len as usize, 0);
        Ok(())
    }
    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.fail_if_switched()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.fail_if_switched()?;
        let mut bytes = self.0.bytes.lock().unwrap();
        let start = offset as usize;
        bytes[start..start + data.len()].copy_from_slice(data);
        Ok(())
    }
}

impl SharedBackend {
    fn fail_if_switched(&self) -> Result<(), std::io::Error> {
        if self.0.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::other("injected write failure"));
        }
        Ok(())
    }
}

/// A read that fails in the middle of the full invariant check is a
/// storage error, returned as an error, never a verdict that the tree is
/// broken. Every point of failure is tried: a fresh forest on the same
/// bytes, without a page cache, whose reads fail after `n` of them, for
/// each `n` up to what a clean check reads. (Storage-errors seed 200385:
/// the check folded such an error into its verdict.)
#[test]
fn a_read_error_during_the_check_is_not_a_broken_tree() {
    use std::sync::atomic::Ordering::SeqCst;
    let disk = std::sync::Arc::new(SharedDisk::default());
    disk.reads_left.store(-1, SeqCst);
    {
        let f = Forest::open_with_backend(SharedBackend(disk.clone()), ForestOptions::default())
            .unwrap();
        for i in 0..300 {
            let dir = format!("d{}", i % 7);
            add_by_path(&f, &[dir.as_str()], name(&format!("n{i}"))).unwrap();
        }
    }
    let mut checked_clean = false;
    for n in 0..2_000 {
        disk.reads_left.store(-1, SeqCst);
        // No page cache: the check's reads reach the backend.
        let db = redb::Builder::new()
            .set_cache_size(0)
            .create_with_backend(SharedBackend(disk.clone()))
            .unwrap();
        let f = Forest::from_database(db, ForestOptions::default()).unwrap();
        disk.reads_left.store(n, SeqCst);
        match f.check_invariants_if_changed(&tree(), None) {
            Ok(Recheck::Checked {
                verdict: Ok(()), ..
            }) => {
                checked_clean = true;
                break;
            }
            Err(Error::Storage(_)) => {}
            other => panic!("after {n} reads: {other:?}"),
        }
    }
    assert!(checked_clean, "the check never got through");
}

#[test]
fn failed_commit_stores_nothing_of_the_batch() {
    let disk = std::sync::Arc::new(SharedDisk::default());
    disk.reads_left
        .store(-1, std::sync::atomic::Ordering::SeqCst);
    let before = {
        let f = Forest::open_with_backend(SharedBackend(disk.clone()), ForestOptions::default())
            .unwrap();
        add_by_path(&f, &["a"], name("kept")).unwrap();
        let before = f.dump(&tree()).unwrap();
        disk.failing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let request = WriteRequest {
            tree: tree(),
            op: WriteOp::AddByPath {
                attr: ATTR_FILE_NAME.into(),
                path: path(&["b"]),
                items: name("lost"),
            },
        };
        let outcome = f.write_batch(&[request]);
        assert!(matches!(outcome, Err(Error::Storage(_))), "{outcome:?}");
        before
    };
    disk.failing
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let f = Forest::open_with_backend(SharedBackend(disk), ForestOptions::default()).unwrap();
    assert_eq!(f.dump(&tree()).unwrap(), before);
    f.check_invariants(&tree()).unwrap();
    // The reopened forest goes on from the committed state.
    let WriteOutcome::AddedByPath { created, .. } = add_by_path(&f, &["b"], name("again")).unwrap()
    else {
        panic!()
    };
    assert_eq!(created, vec![make_timestamp(3, 1)]);
}

#[test]
fn moved_and_removed_directories_are_not_reused_by_later_batches() {
    let f = forest();
    let WriteOutcome::AddedByPath { created, .. } = add_by_path(&f, &["d"], name("x")).unwrap()
    else {
        panic!()
    };
    let first = created[0];
    write_one(&f, WriteOp::Remove { node: first }).unwrap();
    let WriteOutcome::AddedByPath { created, leaf, .. } =
        add_by_path(&f, &["d"], name("y")).unwrap()
    else {
        panic!()
    };
    assert_eq!(created.len(), 1, "the removed /d is not a path component");
    let second = created[0];
    assert_eq!(f.get_node(&tree(), leaf).unwrap().unwrap().parent, second);
    // Renaming /d makes the next call create a third /d.
    write_one(
        &f,
        WriteOp::Move {
            parent: ROOT,
            child: Some(second),
            items: name("renamed"),
        },
    )
    .unwrap();
    let WriteOutcome::AddedByPath { created, .. } = add_by_path(&f, &["d"], name("z")).unwrap()
    else {
        panic!()
    };
    assert_eq!(created.len(), 1);
    assert_ne!(created[0], second);
    f.check_invariants(&tree()).unwrap();
}

#[test]
fn op_log_pages_across_batches_match_the_whole_log() {
    // Heights are stored in runs, one per batch: any page must cut runs
    // at the right place.
    let f = forest();
    for batch in 0..5usize {
        let requests: Vec<WriteRequest> = (0..batch + 1)
            .map(|i| WriteRequest {
                tree: tree(),
                op: WriteOp::AddByPath {
                    attr: ATTR_FILE_NAME.into(),
                    path: path(&["dir", &format!("sub{}", i % 2)]),
                    items: name(&format!("leaf-{batch}-{i}")),
                },
            })
            .collect();
        for outcome in f.write_batch(&requests).unwrap().results {
            outcome.unwrap();
        }
    }
    // One batch longer than a height run (512 timestamps): two runs.
    let long: Vec<WriteRequest> = (0..600)
        .map(|i| WriteRequest {
            tree: tree(),
            op: WriteOp::Move {
                parent: ROOT,
                child: None,
                items: name(&format!("flat-{i}")),
            },
        })
        .collect();
    for outcome in f.write_batch(&long).unwrap().results {
        outcome.unwrap();
    }
    let whole = f.get_op_log(&tree(), 0, usize::MAX).unwrap();
    assert!(whole.len() > 600);
    let heights: Vec<u64> = whole.iter().map(|e| e.height).collect();
    assert_eq!(heights, (0..whole.len() as u64).collect::<Vec<_>>());
    for from in (0..=whole.len()).filter(|h| h % 7 == 0 || h % 512 < 3 || *h < 40) {
        for limit in [1, 2, 3, 7, 600, usize::MAX] {
            let page = f.get_op_log(&tree(), from as u64, limit).unwrap();
            let end = whole.len().min(from.saturating_add(limit));
            assert_eq!(page, whole[from..end], "from {from} limit {limit}");
        }
    }
    f.check_invariants(&tree()).unwrap();
}

/// A log mixing three origins in storage order: local ops of replica 1
/// interleaved with ops applied from replicas 2 and 3.
fn mixed_origin_log() -> (Forest, Vec<LogEntry>) {
    let f = forest_as(1);
    for round in 0..40u64 {
        let remote: Vec<Move> = [2, 3]
            .iter()
            .filter(|&&r| !(round + r as u64).is_multiple_of(3))
            .map(|&r| op(ts(round * 10 + 5, r), ROOT, ts(round * 10 + 5, r), vec![]))
            .collect();
        for outcome in apply(&f, &remote) {
            outcome.unwrap();
        }
        if round % 4 != 1 {
            let local = WriteOp::Move {
                parent: ROOT,
                child: None,
                items: name(&format!("l{round}")),
            };
            write_one(&f, local).unwrap();
        }
    }
    let whole = f.get_op_log(&tree(), 0, usize::MAX).unwrap();
    (f, whole)
}

#[test]
fn op_log_of_origin_matches_filtering_the_whole_log() {
    let (f, whole) = mixed_origin_log();
    for origin in [1, 2, 3, 4] {
        let expected: Vec<LogEntry> = whole
            .iter()
            .filter(|e| timestamp_replica(e.op.ts()) == origin)
            .cloned()
            .collect();
        assert_eq!(expected.is_empty(), origin == 4);
        for (limit, scan_max) in [(1, 1), (1, 1000), (3, 5), (7, 2), (1000, 1000)] {
            // Page through the log the way a pusher does.
            let mut got = Vec::new();
            let mut from = 0;
            loop {
                let page = f
                    .get_op_log_of_origin(&tree(), from, limit, scan_max, origin)
                    .unwrap();
                assert!(page.entries.len() <= limit);
                assert!(page.next_height - from <= scan_max as u64);
                assert!(page.entries.iter().all(|e| e.height >= from));
                assert!(page.entries.iter().all(|e| e.height < page.next_height));
                if page.next_height == from {
                    assert!(page.entries.is_empty());
                    break;
                }
                got.extend(page.entries);
                from = page.next_height;
            }
            assert_eq!(from, whole.len() as u64, "origin {origin}");
            assert_eq!(
                got, expected,
                "origin {origin} limit {limit} scan {scan_max}"
            );
        }
    }
    let missing = TreeKey::new(ContainerId([9; 32]), "none");
    assert_eq!(
        f.get_op_log_of_origin(&missing, 0, 10, 10, 1),
        Err(Error::TreeNotFound)
    );
}

#[test]
fn stored_ops_recognises_exactly_the_logged_ops() {
    let (f, whole) = mixed_origin_log();
    let logged: Vec<&Move> = whole.iter().map(|e| &e.op).collect();
    assert!(f.stored_ops(&tree(), &logged).unwrap().iter().all(|s| *s));
    let first = whole[0].op.clone();
    let mut other_meta = first.clone();
    other_meta.meta.items = name("different");
    let mut other_parent = first.clone();
    other_parent.parent = 12345;
    let unknown = op(ts(9999, 2), ROOT, 77, vec![]);
    let probes = [&first, &other_meta, &other_parent, &unknown];
    assert_eq!(
        f.stored_ops(&tree(), &probes).unwrap(),
        vec![true, false, false, false]
    );
    let missing = TreeKey::new(ContainerId([9; 32]), "none");
    assert_eq!(f.stored_ops(&missing, &probes).unwrap(), vec![false; 4]);
}

#[test]
fn op_log_stamps_page_through_the_log_as_stored() {
    let (f, whole) = mixed_origin_log();
    let expected: Vec<LogStamp> = whole
        .iter()
        .map(|e| LogStamp {
            height: e.height,
            ts: e.op.ts(),
            digest: arbor::forest::records::move_digest(&e.op),
        })
        .collect();
    for limit in [1, 7, 64, 10_000] {
        for start in [0, 1, 33] {
            let mut from = start;
            let mut got = Vec::new();
            loop {
                let page = f.get_op_log_stamps(&tree(), from, limit).unwrap();
                assert!(page.stamps.len() <= limit);
                if page.stamps.is_empty() {
                    assert_eq!(page.next_height, from);
                    break;
                }
                assert_eq!(page.next_height, page.stamps.last().unwrap().height + 1);
                got.extend(page.stamps);
                from = page.next_height;
            }
            assert_eq!(
                got,
                expected[start as usize..],
                "limit {limit} from {start}"
            );
        }
    }
    let held: Vec<Timestamp> = expected.iter().map(|s| s.ts).collect();
    let digests: Vec<Option<u64>> = expected.iter().map(|s| Some(s.digest)).collect();
    assert_eq!(f.held_digests(&tree(), &held).unwrap(), digests);
    let probes = [held[3], ts(9999, 2), held[0], ts(1, 9)];
    assert_eq!(
        f.held_digests(&tree(), &probes).unwrap(),
        vec![digests[3], None, digests[0], None]
    );
    let missing = TreeKey::new(ContainerId([9; 32]), "none");
    assert_eq!(f.held_digests(&missing, &probes).unwrap(), vec![None; 4]);
    assert_eq!(
        f.get_op_log_stamps(&missing, 0, 10),
        Err(Error::TreeNotFound)
    );
}

#[test]
fn late_op_moving_a_node_that_already_has_children_is_redone_in_order() {
    // Node 10 is never created before the late op, but already has a
    // child: doing the late op on top of the newer ones would see a cycle
    // the timestamp order does not have.
    let f = forest_as(1);
    let early = [
        op(ts(1, 2), 10, 20, vec![]),
        op(ts(2, 2), ROOT, 30, vec![]),
        op(ts(10, 2), 20, 30, vec![]),
    ];
    for outcome in apply(&f, &early) {
        outcome.unwrap();
    }
    let late = op(ts(5, 3), 30, 10, vec![]);
    apply(&f, std::slice::from_ref(&late))[0].clone().unwrap();
    let mut model = TreeModel::new();
    let mut all = early.to_vec();
    all.push(late);
    all.sort_by_key(|op| op.ts());
    for op in &all {
        model.apply(op);
    }
    assert_eq!(f.dump(&tree()).unwrap(), model.dump());
    // In timestamp order the newest op is the no-op: 20 under 10 under 30.
    assert_eq!(f.get_node(&tree(), 10).unwrap().unwrap().parent, 30);
    assert_eq!(f.get_node(&tree(), 30).unwrap().unwrap().parent, ROOT);
    f.check_invariants(&tree()).unwrap();
}

#[test]
fn late_creations_behind_newer_ops_keep_undo_records_exact() {
    // Late ops that create fresh nodes skip the undo/redo of the newer
    // ones; their undo records must still be exact, which undoing them
    // for an even older op then checks.
    let f = forest_as(1);
    let newer: Vec<Move> = (20..30)
        .map(|c| op(ts(c, 2), ROOT, 100 + c, name(&format!("n{c}"))))
        .collect();
    for outcome in apply(&f, &newer) {
        outcome.unwrap();
    }
    let late: Vec<Move> = (10..15)
        .map(|c| op(ts(c, 3), 100 + c + 10, 200 + c, vec![]))
        .collect();
    for outcome in apply(&f, &late) {
        outcome.unwrap();
    }
    let oldest = [
        op(ts(3, 3), ROOT, 125, name("moved-early")),
        op(ts(4, 2), 214, 120, vec![]),
    ];
    for outcome in apply(&f, &oldest) {
        outcome.unwrap();
    }
    let mut model = TreeModel::new();
    let mut all: Vec<Move> = newer.iter().chain(&late).chain(&oldest).cloned().collect();
    all.sort_by_key(|op| op.ts());
    for op in &all {
        model.apply(op);
    }
    assert_eq!(f.dump(&tree()).unwrap(), model.dump());
    f.check_invariants(&tree()).unwrap();
    let heights: Vec<Timestamp> = f
        .get_op_log(&tree(), 0, usize::MAX)
        .unwrap()
        .iter()
        .map(|e| e.op.ts())
        .collect();
    let expected: Vec<Timestamp> = newer
        .iter()
        .chain(&late)
        .chain(&oldest)
        .map(Move::ts)
        .collect();
    assert_eq!(heights, expected);
}

/// `get_by_paths` answers each query as `get_by_path` does (duplicate
/// directories, `latest_only`, missing paths), and refuses a bad path.
#[test]
fn get_by_paths_agrees_with_get_by_path() {
    let f = forest();
    let (r1, r2) = (ts(1, 1), ts(1, 2));
    // Two directories named "a" (concurrent creation) with files under both.
    apply(
        &f,
        &[
            op(r1, ROOT, 10, name("a")),
            op(r2, ROOT, 11, name("a")),
            op(ts(2, 1), 10, 12, name("x")),
            op(ts(3, 1), 11, 13, name("x")),
            op(ts(4, 2), 10, 14, name("x")),
        ],
    );
    let paths = [
        path(&["a"]),
        path(&["a", "x"]),
        path(&["b"]),
        path(&["a", "x", "y"]),
    ];
    let queries: Vec<(&[String], bool)> = paths
        .iter()
        .flat_map(|p| [(p.as_slice(), false), (p.as_slice(), true)])
        .collect();
    let found = f.get_by_paths(&tree(), ATTR_FILE_NAME, &queries).unwrap();
    assert_eq!(found.len(), queries.len());
    for (&(p, latest_only), found) in queries.iter().zip(&found) {
        let one = f
            .get_by_path(&tree(), ATTR_FILE_NAME, p, latest_only)
            .unwrap();
        assert_eq!(found, &one, "path {p:?} latest_only {latest_only}");
    }
    assert_eq!(found[0].len(), 2, "both directories named a");
    assert_eq!(found[3].len(), 1, "the newest x under the chosen a");
    assert!(found[4].is_empty() && found[6].is_empty());
    let empty = path(&[]);
    assert!(f
        .get_by_paths(
            &tree(),
            ATTR_FILE_NAME,
            &[(&paths[0], false), (&empty, false)]
        )
        .is_err());
    assert!(f
        .get_by_paths(&tree(), "Color", &[(&paths[0], false)])
        .is_err());
}

/// A late op whose undo/redo pass changes some nodes, returns others to
/// where they were (an undone and redone creation, a move undone and
/// redone) and turns a logged move into a no-op: the stored state is the
/// model's, children index included, after the batch and after a further
/// write that reads it.
#[test]
fn undo_redo_pass_stores_exactly_the_final_state() {
    let f = forest_as(9);
    let early = [
        op(ts(1, 2), ROOT, 10, name("a")),
        op(ts(2, 2), ROOT, 11, name("b")),
        op(ts(3, 2), ROOT, 13, name("d")),
        // Newer than the late op: undone and redone around it.
        op(ts(5, 2), 10, 11, name("b2")),
        op(ts(6, 2), ROOT, 12, name("c")),
        op(ts(7, 2), 11, 13, name("d")),
    ];
    // Moves 10 under 11, so redoing "11 under 10" would close a cycle.
    let late = op(ts(4, 3), 11, 10, name("a2"));
    for one in &early {
        assert!(apply(&f, std::slice::from_ref(one))[0].is_ok());
    }
    assert_eq!(
        apply(&f, std::slice::from_ref(&late))[0],
        Ok(WriteOutcome::Applied { fresh: true })
    );
    let mut all: Vec<Move> = early.to_vec();
    all.push(late.clone());
    all.sort_by_key(|op| op.ts());
    let model = model_of(&all);
    let check = |f: &Forest, model: &TreeModel| {
        f.check_invariants(&tree()).unwrap();
        for id in [ROOT, 10, 11, 12, 13, TRASH] {
            assert_eq!(
                f.get_children(&tree(), id).unwrap(),
                model.children(id),
                "children of {id}"
            );
        }
        for id in [10, 11, 12, 13] {
            assert_eq!(
                f.get_node(&tree(), id).unwrap(),
                model.node(id),
                "node {id}"
            );
        }
    };
    check(&f, &model);
    // 11 stays under ROOT (its move under 10 became a no-op), 13 stayed
    // under 11 through the pass.
    assert_eq!(model.children(ROOT), vec![11, 12]);
    assert_eq!(model.children(11), vec![10, 13]);
    // The stored rows are what later writes build on: another late op
    // that undoes the same ops again and renames 10 where it is (a
    // change of meta alone).
    let later = op(ts(4, 4), 11, 10, name("a3"));
    assert!(apply(&f, std::slice::from_ref(&later))[0].is_ok());
    all.push(later);
    all.sort_by_key(|op| op.ts());
    check(&f, &model_of(&all));
    assert_eq!(f.dump(&tree()).unwrap().log, all);
}

/// A log with dense creations, a sparse stretch and moves (log rows
/// without node rows), and the set of its timestamps.
fn stamp_walk_log() -> (Forest, Vec<Timestamp>) {
    let f = forest_as(1);
    let created: Vec<u64> = (1..=120).chain((200..=1000).step_by(7)).collect();
    let mut ops: Vec<Move> = created
        .iter()
        .map(|&c| op(ts(c, 2), ROOT, ts(c, 2), vec![]))
        .collect();
    ops.extend(
        (1..=60)
            .step_by(3)
            .map(|c| op(ts(1000 + c, 3), ROOT, ts(c, 2), name("m"))),
    );
    for outcome in apply(&f, &ops) {
        outcome.unwrap();
    }
    let mut stored: Vec<Timestamp> = ops.iter().map(Move::ts).collect();
    stored.sort_unstable();
    (f, stored)
}

#[test]
fn held_digests_agree_with_a_lookup_per_stamp() {
    let (f, stored) = stamp_walk_log();
    let held = |probe: &[Timestamp]| -> Vec<Option<u64>> {
        let digests = f.held_digests(&tree(), &stored).unwrap();
        probe
            .iter()
            .map(|t| stored.binary_search(t).ok().map(|i| digests[i]))
            .map(|found| found.map(|d| d.expect("a stored op has a digest")))
            .collect()
    };
    let absent: Vec<Timestamp> = (1..1100).step_by(13).map(|c| ts(c, 9)).collect();
    let mut pages: Vec<Vec<Timestamp>> = vec![
        Vec::new(),
        stored.clone(),
        stored.iter().rev().copied().collect(),
        stored.iter().step_by(5).copied().collect(),
        stored.iter().step_by(40).copied().collect(),
        absent.clone(),
        stored
            .iter()
            .copied()
            .zip(absent.iter().copied())
            .flat_map(|(a, b)| [b, a])
            .collect(),
        vec![
            stored[9],
            stored[3],
            stored[9],
            ts(1, 9),
            stored[3],
            ts(5000, 1),
        ],
    ];
    // Pairs `walk_gap` rows or so apart, around the distance at which the
    // walk gives up and seeks: held and absent second stamps.
    let reach = 3 * STAMP_WALK_GAP_MAX + 4;
    for start in [0, 50, 118, 130] {
        for d in 0..reach {
            let (a, b) = (stored[start], stored[(start + d).min(stored.len() - 1)]);
            pages.push(vec![a, b]);
            pages.push(vec![a, b + 1, stored[start + 1]]);
            pages.push(vec![b, a]);
        }
    }
    for page in &pages {
        assert_eq!(
            f.held_digests(&tree(), page).unwrap(),
            held(page),
            "{page:?}"
        );
    }
}

/// Bytes written by each of the last `tail` of 40 durable commits of 100
/// AddByPath ops into one directory, the n-th object named `name(n)`, on
/// average.
fn bytes_per_commit_into_one_dir(name: impl Fn(u64) -> String, tail: u64) -> u64 {
    let (backend, written) = CountingBackend::new(redb::backends::InMemoryBackend::new());
    let forest = Forest::open_with_backend(backend, ForestOptions::default()).unwrap();
    let commits = 40u64;
    let mut before_tail = 0;
    for commit in 0..commits {
        if commit == commits - tail {
            before_tail = written.load(std::sync::atomic::Ordering::Relaxed);
        }
        let batch: Vec<WriteRequest> = (commit * 100..(commit + 1) * 100)
            .map(|n| WriteRequest {
                tree: tree(),
                op: WriteOp::AddByPath {
                    attr: ATTR_FILE_NAME.into(),
                    path: path(&["bucket", "uploads"]),
                    items: vec![
                        KeyValue::new(ATTR_FILE_NAME, name(n)),
                        KeyValue::new("OID", format!("{:064x}", n)),
                    ],
                },
            })
            .collect();
        let outcome = forest.write_batch(&batch).unwrap();
        assert!(outcome.results.iter().all(|r| r.is_ok()));
    }
    forest.check_invariants(&tree()).unwrap();
    (written.load(std::sync::atomic::Ordering::Relaxed) - before_tail) / tail
}

/// The children index is ordered by name, so objects created in name
/// order under one directory share index leaves: a commit of 100 of them
/// writes a few pages, where names in no order (or a hashed index, as
/// before format 6, whatever the names) write one index page per object.
/// Page writes are deterministic, so this compares counts, not times.
#[test]
fn children_created_in_name_order_share_index_pages() {
    let in_order = bytes_per_commit_into_one_dir(|n| format!("object-{n:08}"), 10);
    let scrambled = bytes_per_commit_into_one_dir(
        |n| format!("object-{:016x}", n.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        10,
    );
    assert!(
        in_order * 3 < scrambled,
        "per commit: {in_order} bytes with names in order, {scrambled} scrambled"
    );
}

/// A local Add or Move refused for its parent must not create the tree it
/// named: an unheld tree once came into being, empty, from such a refusal,
/// and then answered TreeList and reads as if it were held.
#[test]
fn a_refused_move_creates_no_tree() {
    let f = forest();
    let missing = TreeKey::new(ContainerId([3; 32]), "never");
    for parent in [42, TRASH] {
        let res = f
            .write_batch(&[WriteRequest {
                tree: missing.clone(),
                op: WriteOp::Move {
                    parent,
                    child: None,
                    items: name("x"),
                },
            }])
            .unwrap()
            .results;
        assert_eq!(res[0], Err(Error::ParentNotLive(parent)));
        assert!(!f.tree_exists(&missing).unwrap());
        assert_eq!(f.get_node(&missing, ROOT), Err(Error::TreeNotFound));
    }
    // Under ROOT the same write makes the tree, and the node is there.
    let res = f
        .write_batch(&[WriteRequest {
            tree: missing.clone(),
            op: WriteOp::Move {
                parent: ROOT,
                child: None,
                items: name("x"),
            },
        }])
        .unwrap()
        .results;
    let Ok(WriteOutcome::Moved { node, .. }) = res[0] else {
        panic!("{:?}", res[0]);
    };
    assert!(f.tree_exists(&missing).unwrap());
    assert_eq!(f.get_children(&missing, ROOT), Ok(vec![node]));
}
