//! Storage-level tests of the forest: tree numbers, old layouts, row kinds.

use super::*;

fn open_error(path: &std::path::Path) -> Error {
    match Forest::open(path, ForestOptions::default()) {
        Ok(_) => panic!("a database of another layout was opened"),
        Err(e) => e,
    }
}

fn add(forest: &Forest, tree: &TreeKey) {
    let request = WriteRequest {
        tree: tree.clone(),
        op: WriteOp::Move {
            parent: ROOT,
            child: None,
            items: vec![],
        },
    };
    let outcome = forest
        .write_batch(&[request])
        .unwrap()
        .results
        .pop()
        .unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
}

#[test]
fn remembered_tree_numbers_never_name_another_tree() {
    let forest = Forest::in_memory(ForestOptions::default()).unwrap();
    let a = TreeKey::new(ContainerId([1; 32]), "a");
    let b = TreeKey::new(ContainerId([1; 32]), "b");
    add(&forest, &a);
    assert_eq!(forest.next_height(&a), Ok(1), "a is remembered as tree 1");
    forest.clear().unwrap();
    // Numbering starts over: b becomes tree 1.
    add(&forest, &b);
    add(&forest, &b);
    assert_eq!(forest.next_height(&b), Ok(2));
    assert_eq!(forest.next_height(&a), Ok(0), "a is gone, not b");
    assert!(!forest.tree_exists(&a).unwrap());
    // The write path too: a is created afresh, not appended to b.
    add(&forest, &a);
    assert_eq!(forest.next_height(&a), Ok(1));
    assert_eq!(forest.next_height(&b), Ok(2));
    // A dropped tree's number is not reused; its hint leads nowhere.
    forest.tree_drop(&a.cid, Some("a")).unwrap();
    assert_eq!(forest.next_height(&a), Ok(0));
    add(&forest, &a);
    assert_eq!(forest.next_height(&a), Ok(2), "heights go on past the drop");
    assert_eq!(forest.dump(&a).unwrap().log.len(), 1);
    forest.check_invariants(&a).unwrap();
    forest.check_invariants(&b).unwrap();
}

/// A redb file written by plain redb in one commit of `fill`, in a
/// fresh directory (kept alive by the returned handle).
fn write_raw_file(
    fill: impl FnOnce(&redb::WriteTransaction),
) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("forest.redb");
    let db = redb::Database::create(&path).unwrap();
    let txn = db.begin_write().unwrap();
    fill(&txn);
    txn.commit().unwrap();
    (dir, path)
}

/// Writes a file that claims format `version`, with the tables
/// `fill` creates in that version's layout, and asserts that opening it
/// is refused by the version check with a typed error.
fn assert_old_format_refused(version: u64, fill: impl FnOnce(&redb::WriteTransaction)) {
    let (_dir, path) = write_raw_file(|txn| {
        txn.open_table(META)
            .unwrap()
            .insert(FORMAT_VERSION, version)
            .unwrap();
        fill(txn);
    });
    let error = open_error(&path);
    let expected = format!("format version {version}");
    assert!(
        matches!(&error, Error::Storage(m) if m.contains(&expected)),
        "{error:?}"
    );
}

#[test]
fn a_version_2_file_is_refused() {
    // Version 2 kept the children index in its own table and keyed
    // `rows` by two integers; the typed refusal must come before any
    // table of the new layout is opened over those.
    const V2_ROWS: redb::TableDefinition<(u64, u64), &[u8]> = redb::TableDefinition::new("rows");
    const V2_CHILDREN: redb::TableDefinition<(u64, u64, u64, u64), &[u8]> =
        redb::TableDefinition::new("children");
    assert_old_format_refused(2, |txn| {
        txn.open_table(V2_ROWS)
            .unwrap()
            .insert((4, 0), &[0u8; 40][..])
            .unwrap();
        txn.open_table(V2_CHILDREN)
            .unwrap()
            .insert((1, 0, 7, 9), &[0u8; 10][..])
            .unwrap();
    });
}

#[test]
fn a_version_3_file_is_refused() {
    // Version 3 keyed `rows` by redb's four-integer tuple: the same
    // bytes as `RowKey`, another type name, so redb would refuse the
    // table with a type mismatch; the version check refuses first.
    const V3_ROWS: redb::TableDefinition<(u64, u64, u64, u64), &[u8]> =
        redb::TableDefinition::new("rows");
    assert_old_format_refused(3, |txn| {
        txn.open_table(V3_ROWS)
            .unwrap()
            .insert((4, 0, 0, 0), &[0u8; 40][..])
            .unwrap();
    });
}

#[test]
fn a_version_5_file_is_refused() {
    // Version 5 kept the children index in region 3 of `rows`, keyed by
    // name hash; this build has no reader for those rows.
    const V5_ROWS: redb::TableDefinition<(u64, u64, u64, u64), &[u8]> =
        redb::TableDefinition::new("rows");
    assert_old_format_refused(5, |txn| {
        txn.open_table(V5_ROWS)
            .unwrap()
            .insert((4 << 2 | 3, 0, 7, 9), &[0u8; 10][..])
            .unwrap();
    });
}

#[test]
fn a_version_6_file_is_refused() {
    // Version 6 kept every tree's rows in one table and each meta in the
    // log row of its op; this build reads a table per tree and metas from
    // the children index.
    const V6_ROWS: redb::TableDefinition<(u64, u64, u64, u64), &[u8]> =
        redb::TableDefinition::new("rows");
    assert_old_format_refused(6, |txn| {
        txn.open_table(V6_ROWS)
            .unwrap()
            .insert((4, 9, 1, 0), &[0u8; 45][..])
            .unwrap();
    });
}

#[test]
fn dropping_a_tree_removes_its_children_rows_only() {
    let forest = Forest::in_memory(ForestOptions::default()).unwrap();
    let a = TreeKey::new(ContainerId([1; 32]), "a");
    let b = TreeKey::new(ContainerId([1; 32]), "b");
    for tree in [&a, &b] {
        add(&forest, tree);
        add(&forest, tree);
        // A child of TRASH (the largest parent id) too.
        let node = forest.get_children(tree, ROOT).unwrap()[0];
        let remove = WriteRequest {
            tree: tree.clone(),
            op: WriteOp::Remove { node },
        };
        forest
            .write_batch(&[remove])
            .unwrap()
            .results
            .pop()
            .unwrap()
            .unwrap();
        assert_eq!(forest.get_children(tree, TRASH).unwrap(), vec![node]);
    }
    let (_, number_a) = forest.read_tree_number(&a).unwrap();
    forest.tree_drop(&a.cid, Some("a")).unwrap();
    let txn = forest.begin_read().unwrap();
    assert!(super::open_tree_rows(&txn, number_a).unwrap().is_none());
    assert_eq!(forest.get_children(&b, ROOT).unwrap().len(), 1);
    assert_eq!(forest.get_children(&b, TRASH).unwrap().len(), 1);
    forest.check_invariants(&b).unwrap();
}

#[test]
fn a_row_key_of_no_kind_is_a_typed_error() {
    let forest = Forest::in_memory(ForestOptions::default()).unwrap();
    let tree = TreeKey::new(ContainerId([1; 32]), "a");
    add(&forest, &tree);
    let (_, t) = forest.read_tree_number(&tree).unwrap();
    let txn = forest.begin_write().unwrap();
    {
        let mut rows = txn.open_table(tree_table(&tree_table_name(t))).unwrap();
        let stray = RowKeyParts {
            kind: 7,
            ..node_key(1)
        };
        rows.insert(stray, &[0u8; 4][..]).unwrap();
    }
    txn.commit().unwrap();
    let error = forest.dump(&tree).unwrap_err();
    assert!(matches!(error, Error::Malformed(_)), "{error:?}");
    assert!(forest.check_invariants(&tree).is_err());
}

#[test]
fn another_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("forest.redb");
    drop(Forest::open(&path, ForestOptions::default()).unwrap());
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert(FORMAT_VERSION, 1)
            .unwrap();
        txn.commit().unwrap();
    }
    let error = open_error(&path);
    assert!(
        matches!(&error, Error::Storage(m) if m.contains("format version 1")),
        "{error:?}"
    );
}

#[test]
fn the_first_layout_is_refused() {
    // Version 1 kept whole tree records as the trees table's values.
    const OLD_TREES: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("trees");
    let (_dir, path) = write_raw_file(|txn| {
        txn.open_table(OLD_TREES)
            .unwrap()
            .insert(&[0u8; 33][..], &[1u8][..])
            .unwrap();
    });
    let error = open_error(&path);
    assert!(matches!(error, Error::Storage(_)), "{error:?}");
}

#[test]
fn a_new_database_is_created_aside_and_renamed_in() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tree.db");
    // Left by a creation that died half way: replaced, never opened.
    let aside = dir.path().join("tree.db.creating");
    std::fs::write(&aside, [0u8; 4096]).unwrap();
    // An empty file at the path counts as nothing there.
    std::fs::write(&path, []).unwrap();
    let forest = Forest::open(&path, ForestOptions::default()).unwrap();
    let t = TreeKey::new(ContainerId([1; 32]), "t");
    add(&forest, &t);
    drop(forest);
    assert!(!aside.exists(), "the temporary file is renamed away");
    let forest = Forest::open(&path, ForestOptions::default()).unwrap();
    assert_eq!(forest.next_height(&t), Ok(1), "the database kept its write");
}

#[test]
fn a_file_that_is_not_a_database_is_refused_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tree.db");
    std::fs::write(&path, [0u8; 4096]).unwrap();
    let error = open_error(&path);
    assert!(
        matches!(&error, Error::Storage(m) if m.contains("magic")),
        "{error:?}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        vec![0u8; 4096],
        "left as it was"
    );
}
