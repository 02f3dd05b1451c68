//! Paged listings (`Forest::list_children_page`, `Forest::get_subtree_page`):
//! every page concatenated equals the reference model's whole answer in
//! the same order, pages keep to their node and byte bounds, and a
//! listing that writes interleave with either lists every node that kept
//! its place exactly once or is refused with `CursorRefused`.

use arbor::forest::*;
use arbor::model::TreeModel;
use arbor::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

fn tree() -> TreeKey {
    TreeKey::new(ContainerId([3; 32]), "list")
}

fn forest() -> Forest {
    Forest::in_memory(ForestOptions {
        durable: false,
        ..ForestOptions::default()
    })
    .unwrap()
}

fn apply(forest: &Forest, model: &mut TreeModel, ops: &[Move]) {
    let requests: Vec<WriteRequest> = ops
        .iter()
        .map(|op| WriteRequest {
            tree: tree(),
            op: WriteOp::Apply { op: op.clone() },
        })
        .collect();
    for result in forest.write_batch(&requests).unwrap().results {
        result.unwrap();
    }
    for op in ops {
        model.apply(op);
    }
}

fn pages_of(nodes_max: usize) -> AnswerBounds {
    AnswerBounds {
        nodes_max,
        ..AnswerBounds::UNBOUNDED
    }
}

/// A listing, page by page: what one call returns for a cursor.
type PageFn<'a> = dyn FnMut(Option<&ListCursor>) -> Result<ListPage> + 'a;

/// Every page of a listing concatenated, checking each against `page`
/// nodes; `limit_pages` guards against a listing that never ends.
fn concatenate(next_page: &mut PageFn, page: usize, limit_pages: usize) -> Result<Vec<NodeInfo>> {
    let mut out = Vec::new();
    let mut after: Option<ListCursor> = None;
    for _ in 0..limit_pages {
        let got = next_page(after.as_ref())?;
        assert!(
            got.nodes.len() <= page,
            "{} nodes in a page of {page}",
            got.nodes.len()
        );
        if got.next.is_some() {
            assert!(
                !got.nodes.is_empty(),
                "a page with a continuation but no node"
            );
        }
        out.extend(got.nodes);
        match got.next {
            Some(cursor) => {
                // A cursor survives its token form unchanged.
                let token = cursor.to_bytes();
                assert_eq!(ListCursor::from_bytes(&token).unwrap(), cursor);
                after = Some(cursor);
            }
            None => return Ok(out),
        }
    }
    panic!("listing did not end within {limit_pages} pages");
}

fn subtree_pages(
    forest: &Forest,
    root: NodeId,
    depth: u32,
    order: ListOrder,
    page: usize,
) -> Result<Vec<NodeInfo>> {
    let mut call = |after: Option<&ListCursor>| {
        forest.get_subtree_page(&tree(), root, depth, order, after, pages_of(page))
    };
    concatenate(&mut call, page, 10_000)
}

fn children_pages(
    forest: &Forest,
    parent: NodeId,
    order: ListOrder,
    page: usize,
) -> Result<Vec<NodeInfo>> {
    let mut call = |after: Option<&ListCursor>| {
        forest.list_children_page(&tree(), parent, order, after, pages_of(page))
    };
    concatenate(&mut call, page, 10_000)
}

fn items() -> impl Strategy<Value = Vec<KeyValue>> {
    let file_name = prop_oneof![Just("a"), Just("b"), Just("ab"), Just("")]
        .prop_map(|n| KeyValue::new(ATTR_FILE_NAME, n));
    let extra = Just(KeyValue::new("Size", "1"));
    (proptest::option::of(file_name), proptest::option::of(extra))
        .prop_map(|(f, e)| f.into_iter().chain(e).collect())
}

/// Ops on a few ids (so that names repeat, nodes move, some under TRASH
/// and some under parents that do not exist), with unique timestamps.
fn ops(counters: std::ops::Range<u64>, max: usize) -> impl Strategy<Value = Vec<Move>> {
    let parent = prop_oneof![3 => Just(ROOT), 1 => Just(TRASH), 5 => 1u64..=14];
    let one = (counters, 1u16..=2, parent, 1u64..=24, items());
    proptest::collection::vec(one, 1..max).prop_map(|raw| {
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

/// Nodes `1..=count`, each under ROOT or an earlier node (so every one
/// hangs under ROOT), names drawn from a few.
fn connected_tree(count: u64) -> impl Strategy<Value = Vec<Move>> {
    let nodes: Vec<_> = (1..=count)
        .map(|child| {
            let name = prop_oneof![Just("a"), Just("b"), Just("c"), Just("")];
            (0..child, name).prop_map(move |(parent, name)| {
                let time = make_timestamp(child, 1);
                Move {
                    parent,
                    child,
                    meta: Meta {
                        time,
                        items: vec![KeyValue::new(ATTR_FILE_NAME, name)],
                    },
                }
            })
        })
        .collect();
    nodes
}

fn order() -> impl Strategy<Value = ListOrder> {
    prop_oneof![Just(ListOrder::Name), Just(ListOrder::Id)]
}

fn root() -> impl Strategy<Value = NodeId> {
    prop_oneof![2 => Just(ROOT), 1 => Just(TRASH), 4 => 1u64..=24]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Pages of every size, concatenated, give the model's subtree in
    /// the same order; in id order that is also the one-shot answer. A
    /// root the tree lacks is `NodeNotFound`, as in `get_subtree`.
    #[test]
    fn pages_concatenate_to_the_whole_subtree(
        ops in ops(1..80, 60),
        queries in proptest::collection::vec((root(), 0u32..=4, order(), 1usize..=6), 1..8),
    ) {
        let forest = forest();
        let mut model = TreeModel::new();
        apply(&forest, &mut model, &ops);
        for (root, depth, order, page) in queries {
            let listed = subtree_pages(&forest, root, depth, order, page);
            match model.subtree(root, depth, order) {
                None => prop_assert_eq!(listed, Err(Error::NodeNotFound(root))),
                Some(expected) => {
                    let listed = listed.unwrap();
                    prop_assert_eq!(&listed, &expected, "root {} depth {} {:?} pages of {}", root, depth, order, page);
                    if order == ListOrder::Id {
                        let one_shot = forest.get_subtree(&tree(), root, depth, usize::MAX).unwrap();
                        prop_assert_eq!(&listed, &one_shot);
                    }
                }
            }
        }
    }

    /// Pages of a node's children, concatenated, are its children sorted
    /// by the order.
    #[test]
    fn children_pages_concatenate_to_the_sorted_children(
        ops in ops(1..80, 60),
        queries in proptest::collection::vec((root(), order(), 1usize..=6), 1..8),
    ) {
        let forest = forest();
        let mut model = TreeModel::new();
        apply(&forest, &mut model, &ops);
        for (parent, order, page) in queries {
            let listed = children_pages(&forest, parent, order, page);
            let exists = matches!(parent, ROOT | TRASH) || model.node(parent).is_some();
            if exists {
                prop_assert_eq!(listed.unwrap(), model.children_in(parent, order));
            } else {
                prop_assert_eq!(listed, Err(Error::NodeNotFound(parent)));
            }
        }
    }

    /// Writes between the pages of a subtree listing: every node listed
    /// stood where the page says in that page's snapshot; a node whose
    /// path from the root stayed the same in every snapshot is listed
    /// exactly once, in order, unless the listing was refused with
    /// `CursorRefused`. The listing always ends.
    #[test]
    fn writes_between_pages_never_skip_or_repeat_a_node_that_kept_its_place(
        start in connected_tree(30),
        between in proptest::collection::vec(ops(1..5, 4), 1..12),
        root in prop_oneof![3 => Just(ROOT), 1 => 1u64..=8],
        depth in 0u32..=4,
        order in order(),
        page in 1usize..=4,
    ) {
        let forest = forest();
        let mut model = TreeModel::new();
        apply(&forest, &mut model, &start);
        let mut counter = model.max_counter();
        let mut between = between.into_iter();
        let mut listed: Vec<NodeInfo> = Vec::new();
        let mut snapshots: Vec<TreeModel> = Vec::new();
        let mut after: Option<ListCursor> = None;
        let mut refused = false;
        let mut ended = false;
        for _ in 0..1000 {
            let got = match forest.get_subtree_page(&tree(), root, depth, order, after.as_ref(), pages_of(page)) {
                Ok(got) => got,
                Err(Error::CursorRefused(_)) => {
                    refused = true;
                    break;
                }
                Err(Error::NodeNotFound(id)) if id == root && snapshots.is_empty() => return Ok(()),
                Err(other) => panic!("page failed: {other}"),
            };
            prop_assert!(got.nodes.len() <= page);
            let whole = model.subtree(root, depth, order).expect("the root exists");
            for node in &got.nodes {
                prop_assert!(whole.contains(node), "{node:?} is not in its page's snapshot");
            }
            listed.extend(got.nodes);
            snapshots.push(model.clone());
            let Some(cursor) = got.next else {
                ended = true;
                break;
            };
            after = Some(cursor);
            // Writes after this page: ops of the generated set moved to
            // timestamps above the tree's.
            if let Some(ops) = between.next() {
                let fresh: Vec<Move> = ops
                    .into_iter()
                    .map(|op| {
                        counter += 1;
                        let time = make_timestamp(counter, 1);
                        Move { meta: Meta { time, items: op.meta.items }, ..op }
                    })
                    .collect();
                apply(&forest, &mut model, &fresh);
            }
        }
        prop_assert!(refused || ended, "the listing did not end in 1000 pages");
        // Paths from the root in each snapshot; stable nodes keep theirs.
        let paths: Vec<Paths> =
            snapshots.iter().map(|m| paths_under(m, root, depth, order)).collect();
        let stable: Vec<NodeId> = paths[0]
            .iter()
            .filter(|(id, path)| paths.iter().all(|p| p.get(id) == Some(path)))
            .map(|(id, _)| *id)
            .collect();
        let stable_set: BTreeSet<NodeId> = stable.iter().copied().collect();
        let listed_stable: Vec<NodeId> =
            listed.iter().map(|n| n.id).filter(|id| stable_set.contains(id)).collect();
        eprintln!("STAT refused={refused} pages={} listed={} stable={} total0={}", snapshots.len(), listed.len(), stable.len(), paths[0].len());
        if refused {
            // What was listed before the refusal: each stable node once,
            // in the order of the listing.
            let unique: BTreeSet<NodeId> = listed_stable.iter().copied().collect();
            prop_assert_eq!(unique.len(), listed_stable.len());
        } else {
            let mut expected = stable.clone();
            expected.sort_by(|a, b| paths[0][a].cmp(&paths[0][b]));
            prop_assert_eq!(listed_stable, expected);
        }
    }
}

/// Each node's path from the listing's root: `(name key, id)` per level.
type Paths = BTreeMap<NodeId, Vec<(Vec<u8>, NodeId)>>;

/// Each node of the listed subtree with its path from the root (name key
/// in name order, and id per level; the root's is empty), which orders
/// nodes as the pre-order walk does.
fn paths_under(model: &TreeModel, root: NodeId, depth: u32, order: ListOrder) -> Paths {
    let mut out = BTreeMap::new();
    let mut stack = vec![(root, Vec::new(), 1u32)];
    while let Some((id, path, level)) = stack.pop() {
        if depth == 0 || level < depth {
            for child in model.children_in(id, order) {
                let key = match order {
                    ListOrder::Name => records::name_key(&child.meta.items),
                    ListOrder::Id => Vec::new(),
                };
                let mut below = path.clone();
                below.push((key, child.id));
                stack.push((child.id, below, level + 1));
            }
        }
        out.insert(id, path);
    }
    out
}

/// Builds `count` children under one new directory, named out of
/// creation order; returns the directory.
fn wide_directory(forest: &Forest, count: usize) -> NodeId {
    let dir = make_timestamp(1, 1);
    let mut model = TreeModel::new();
    apply(forest, &mut model, &[create(ROOT, dir, "wide")]);
    let ops: Vec<Move> = (0..count)
        .map(|i| {
            let name = format!("obj-{:06}", (i * 7919) % count);
            create(dir, make_timestamp(2 + i as u64, 1), &name)
        })
        .collect();
    for chunk in ops.chunks(1000) {
        apply(forest, &mut model, chunk);
    }
    dir
}

/// A directory of 20,000 children listed in pages of 100: every page
/// but the last holds exactly 100 nodes, in name order without a gap; the
/// subtree walk pages it the same way after its root. Id order, which
/// scans the directory per page, in pages of 2,000.
#[test]
fn a_wide_directory_lists_in_full_pages() {
    let forest = forest();
    let count = 20_000;
    let dir = wide_directory(&forest, count);
    let mut after: Option<ListCursor> = None;
    let mut names = Vec::new();
    let mut pages = 0;
    loop {
        let page = forest
            .list_children_page(&tree(), dir, ListOrder::Name, after.as_ref(), pages_of(100))
            .unwrap();
        pages += 1;
        if pages <= count / 100 {
            assert_eq!(page.nodes.len(), 100, "page {pages}");
        } else {
            assert!(page.nodes.is_empty() && page.next.is_none(), "page {pages}");
        }
        names.extend(
            page.nodes
                .iter()
                .map(|n| n.meta.file_name().unwrap().to_vec()),
        );
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(pages, count / 100 + 1);
    let expected: Vec<Vec<u8>> = (0..count)
        .map(|i| format!("obj-{i:06}").into_bytes())
        .collect();
    assert_eq!(names, expected);

    let subtree = subtree_pages(&forest, dir, 2, ListOrder::Name, 100).unwrap();
    assert_eq!(subtree.len(), count + 1);
    assert_eq!(subtree[0].id, dir);
    let by_id = children_pages(&forest, dir, ListOrder::Id, 2000).unwrap();
    let ids: Vec<NodeId> = by_id.iter().map(|n| n.id).collect();
    assert_eq!(ids, forest.get_children(&tree(), dir).unwrap());
}

/// Pages stop before the node that would pass the byte bound (metas,
/// per-node overhead and the cursor counted); a node that alone passes it
/// is `TooLarge`, and so is a page of no node.
#[test]
fn pages_keep_to_the_byte_bound() {
    let forest = forest();
    let mut model = TreeModel::new();
    let ops: Vec<Move> = (1..=40u64)
        .map(|i| {
            let ts = make_timestamp(i, 1);
            let filler = "x".repeat((i as usize * 37) % 300);
            Move {
                // Groups of four: a child of ROOT and three below it.
                parent: match (i - 1) % 4 {
                    0 => ROOT,
                    _ => make_timestamp(i - (i - 1) % 4, 1),
                },
                child: ts,
                meta: Meta {
                    time: ts,
                    items: vec![
                        KeyValue::new(ATTR_FILE_NAME, format!("n{}", 100 - i)),
                        KeyValue::new("Fill", filler),
                    ],
                },
            }
        })
        .collect();
    apply(&forest, &mut model, &ops);
    for order in [ListOrder::Name, ListOrder::Id] {
        let bounds = AnswerBounds {
            nodes_max: 1000,
            bytes_max: 700,
            node_overhead_bytes: 16,
        };
        let mut after: Option<ListCursor> = None;
        let mut listed = Vec::new();
        loop {
            let page = forest
                .get_subtree_page(&tree(), ROOT, 0, order, after.as_ref(), bounds)
                .unwrap();
            let used: usize = page
                .nodes
                .iter()
                .map(|n| n.meta.size_bytes() + bounds.node_overhead_bytes)
                .sum();
            let cursor = page.next.as_ref().map_or(0, |c| c.to_bytes().len());
            assert!(used + cursor <= bounds.bytes_max, "{used} + {cursor}");
            assert!(!page.nodes.is_empty());
            listed.extend(page.nodes);
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(listed, model.subtree(ROOT, 0, order).unwrap());
    }
    let tight = AnswerBounds {
        nodes_max: 10,
        bytes_max: 50,
        node_overhead_bytes: 0,
    };
    let big = forest.list_children_page(&tree(), ROOT, ListOrder::Name, None, tight);
    assert!(matches!(big, Err(Error::TooLarge { .. })), "{big:?}");
    let none = forest.list_children_page(&tree(), ROOT, ListOrder::Name, None, pages_of(0));
    assert!(matches!(none, Err(Error::TooLarge { .. })), "{none:?}");
}

/// A small tree for the interleaving cases: `d` under ROOT with children
/// `c0`..`c4`, each with leaves `l0`..`l2`. Returns the model (ids by
/// name through `find`).
fn small_tree(forest: &Forest) -> TreeModel {
    let mut model = TreeModel::new();
    let mut counter = 0;
    let mut add = |model: &mut TreeModel, parent: NodeId, name: &str| {
        counter += 1;
        let ts = make_timestamp(counter, 1);
        apply(forest, model, &[create(parent, ts, name)]);
        ts
    };
    let d = add(&mut model, ROOT, "d");
    for c in 0..5 {
        let child = add(&mut model, d, &format!("c{c}"));
        for l in 0..3 {
            add(&mut model, child, &format!("l{l}"));
        }
    }
    model
}

fn find(model: &TreeModel, path: &[&str]) -> NodeId {
    let path: Vec<String> = path.iter().map(|s| s.to_string()).collect();
    model.get_by_path(&path, false)[0].id
}

fn next_ts(model: &TreeModel) -> Timestamp {
    make_timestamp(model.max_counter() + 1, 1)
}

/// A replicated op creating node `ts` (its own timestamp) named `name`
/// under `parent`.
fn create(parent: NodeId, ts: Timestamp, name: &str) -> Move {
    Move {
        parent,
        child: ts,
        meta: Meta {
            time: ts,
            items: vec![KeyValue::new(ATTR_FILE_NAME, name)],
        },
    }
}

fn move_op(model: &TreeModel, node: NodeId, parent: NodeId, name: &str) -> Move {
    Move {
        parent,
        child: node,
        meta: Meta {
            time: next_ts(model),
            items: vec![KeyValue::new(ATTR_FILE_NAME, name)],
        },
    }
}

fn names(nodes: &[NodeInfo]) -> Vec<String> {
    nodes
        .iter()
        .map(|n| String::from_utf8_lossy(n.meta.file_name().unwrap_or(b"-")).into_owned())
        .collect()
}

/// Writes between two pages, case by case: the last node removed, moved
/// ahead or renamed, nodes added before and after the place, and the
/// place's parent removed or renamed.
#[test]
fn writes_between_pages_case_by_case() {
    // Pages of 5 of `d`'s subtree in name order: d c0 l0 l1 l2 | c1 ...
    let first_page = |forest: &Forest, model: &TreeModel| {
        let d = find(model, &["d"]);
        let page = forest
            .get_subtree_page(&tree(), d, 0, ListOrder::Name, None, pages_of(5))
            .unwrap();
        assert_eq!(names(&page.nodes), ["d", "c0", "l0", "l1", "l2"]);
        (d, page.next.unwrap())
    };
    let rest = |forest: &Forest, d: NodeId, after: ListCursor| {
        let mut listed = Vec::new();
        let mut after = Some(after);
        while let Some(cursor) = after.take() {
            let page = forest.get_subtree_page(
                &tree(),
                d,
                0,
                ListOrder::Name,
                Some(&cursor),
                pages_of(5),
            )?;
            listed.extend(page.nodes);
            after = page.next;
        }
        Ok::<_, Error>(names(&listed))
    };
    let tail = |from: usize| -> Vec<String> {
        (from..5)
            .flat_map(|c| [format!("c{c}"), "l0".into(), "l1".into(), "l2".into()])
            .collect()
    };

    // The last node removed: the walk goes on after its old place.
    let forest = forest();
    let mut model = small_tree(&forest);
    let (d, cursor) = first_page(&forest, &model);
    let l2 = find(&model, &["d", "c0", "l2"]);
    let op = move_op(&model, l2, TRASH, "l2");
    apply(&forest, &mut model, &[op]);
    assert_eq!(rest(&forest, d, cursor).unwrap(), tail(1));

    // The last node moved ahead (under c3, as "l9"): listed again there.
    let forest = self::forest();
    let mut model = small_tree(&forest);
    let (d, cursor) = first_page(&forest, &model);
    let (l2, c3) = (find(&model, &["d", "c0", "l2"]), find(&model, &["d", "c3"]));
    let op = move_op(&model, l2, c3, "l9");
    apply(&forest, &mut model, &[op]);
    let mut expected = tail(1);
    expected.insert(
        expected.iter().position(|n| n == "c4").unwrap(),
        "l9".into(),
    );
    assert_eq!(rest(&forest, d, cursor).unwrap(), expected);

    // Nodes added before the place (under c0, "a") and after it (under
    // c0, "z"; under c2): only those after it are listed.
    let forest = self::forest();
    let mut model = small_tree(&forest);
    let (d, cursor) = first_page(&forest, &model);
    let (c0, c2) = (find(&model, &["d", "c0"]), find(&model, &["d", "c2"]));
    for (parent, name) in [(c0, "a"), (c0, "z"), (c2, "l5")] {
        let op = create(parent, next_ts(&model), name);
        apply(&forest, &mut model, &[op]);
    }
    let mut expected = vec!["z".to_string()];
    let mut after_c0 = tail(1);
    after_c0.insert(
        after_c0.iter().position(|n| n == "c3").unwrap(),
        "l5".into(),
    );
    expected.extend(after_c0);
    assert_eq!(rest(&forest, d, cursor).unwrap(), expected);

    // The last node's parent removed, or renamed: the place is gone, and
    // the next page says so rather than guess.
    for renamed in [false, true] {
        let forest = self::forest();
        let mut model = small_tree(&forest);
        let (d, cursor) = first_page(&forest, &model);
        let c0 = find(&model, &["d", "c0"]);
        let op = match renamed {
            true => move_op(&model, c0, d, "c9"),
            false => move_op(&model, c0, TRASH, "c0"),
        };
        apply(&forest, &mut model, &[op]);
        let refused = rest(&forest, d, cursor);
        assert!(
            matches!(refused, Err(Error::CursorRefused(_))),
            "{refused:?}"
        );
    }

    // A children listing stands in one directory: its own move changes
    // nothing, its last child's removal neither.
    let forest = self::forest();
    let mut model = small_tree(&forest);
    let d = find(&model, &["d"]);
    let page = forest
        .list_children_page(&tree(), d, ListOrder::Name, None, pages_of(2))
        .unwrap();
    assert_eq!(names(&page.nodes), ["c0", "c1"]);
    let c1 = find(&model, &["d", "c1"]);
    let moves = [move_op(&model, c1, TRASH, "c1")];
    apply(&forest, &mut model, &moves);
    let renamed = [move_op(&model, d, TRASH, "gone")];
    apply(&forest, &mut model, &renamed);
    let mut call = |after: Option<&ListCursor>| {
        let after = after.or(page.next.as_ref());
        forest.list_children_page(&tree(), d, ListOrder::Name, after, pages_of(2))
    };
    assert_eq!(
        names(&concatenate(&mut call, 2, 10).unwrap()),
        ["c2", "c3", "c4"]
    );
}

/// A cursor continues only its own listing; a damaged token is
/// `Malformed`.
#[test]
fn a_cursor_of_another_listing_is_refused() {
    let forest = forest();
    let model = small_tree(&forest);
    let d = find(&model, &["d"]);
    let page = |root, depth, order, after| {
        forest.get_subtree_page(&tree(), root, depth, order, after, pages_of(3))
    };
    let cursor = page(d, 0, ListOrder::Name, None).unwrap().next.unwrap();
    let other_root = page(ROOT, 0, ListOrder::Name, Some(&cursor));
    let other_depth = page(d, 3, ListOrder::Name, Some(&cursor));
    let other_order = page(d, 0, ListOrder::Id, Some(&cursor));
    let children =
        forest.list_children_page(&tree(), d, ListOrder::Name, Some(&cursor), pages_of(3));
    for refused in [other_root, other_depth, other_order, children] {
        assert!(
            matches!(refused, Err(Error::CursorRefused(_))),
            "{refused:?}"
        );
    }
    let token = cursor.to_bytes();
    assert!(matches!(
        ListCursor::from_bytes(&token[..token.len() - 1]),
        Err(Error::Malformed(_))
    ));
    let mut longer = token.clone();
    longer.push(0);
    assert!(matches!(
        ListCursor::from_bytes(&longer),
        Err(Error::Malformed(_))
    ));
    assert!(matches!(
        forest.list_children_page(
            &TreeKey::new(ContainerId([9; 32]), "x"),
            ROOT,
            ListOrder::Id,
            None,
            pages_of(3)
        ),
        Err(Error::TreeNotFound)
    ));
}
