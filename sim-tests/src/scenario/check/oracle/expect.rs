//! A read's answer held to the model: `check_read` says whether the answer
//! a replica gave agrees with what the model of that replica's log (a
//! `TreeView` read in the same step) prescribes.

use super::TreeView;
use crate::coverage::Coverage;
use crate::scenario::workload::summarize_response as brief;
use arbor::forest::{Forest, ListOrder};
use arbor::model::TreeModel;
use arbor::proto::{Request, Response};
use arbor::{Error, Meta, NodeId, NodeInfo, ReplicaId, TreeKey, ATTR_FILE_NAME, ROOT, TRASH};
use std::collections::BTreeSet;

/// The verdict on one answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Checked {
    /// The answer is the model's; the read it counts as.
    Agreed(Coverage),
    /// Nothing to hold it to: a transient error, a refused oversized
    /// answer, or not a read.
    Skipped,
    /// The answer differs from the model's.
    Wrong(String),
}

/// The tree a read asks about, if it asks about one.
pub fn tree_of(request: &Request) -> Option<&TreeKey> {
    match request {
        Request::GetNodeByPath { tree, .. }
        | Request::GetSubTree { tree, .. }
        | Request::GetSubTreePage { tree, .. }
        | Request::GetMeta { tree, .. }
        | Request::GetOpLog { tree, .. }
        | Request::GetOpLogStamps { tree, .. } => Some(tree),
        _ => None,
    }
}

/// True for the read requests the oracle knows.
pub fn is_read(request: &Request) -> bool {
    tree_of(request).is_some() || matches!(request, Request::TreeList { .. })
}

/// Holds `response` to the model of `view` (`None`: the replica has no
/// such tree). `forest` is the answering replica's, for TreeList.
pub fn check_read(
    request: &Request,
    response: &Response,
    view: Option<&TreeView>,
    forest: &Forest,
) -> Checked {
    if let Response::Error(error) = response {
        return check_error(request, error, view);
    }
    let Some(view) = view else {
        if let Request::TreeList { cid } = request {
            return check_tree_list(*cid, response, forest);
        }
        return Checked::Wrong(format!("answered {response:?} for a tree it does not hold"));
    };
    match request {
        Request::GetNodeByPath { .. } => check_by_path(request, response, view.model()),
        Request::GetSubTree { root, depth, .. } => {
            let kind = Coverage::GetSubTree;
            match subtree(view, *root, *depth) {
                Some(nodes) => same_nodes(kind, response, nodes),
                None => Checked::Wrong(format!("answered {response:?} for a missing root")),
            }
        }
        Request::GetSubTreePage { .. } => check_subtree_page(request, response, view),
        Request::GetMeta { node, .. } => match view.model().node(*node) {
            Some(found) => same_nodes(Coverage::GetMeta, response, vec![found]),
            None => Checked::Wrong(format!("answered {response:?} for a missing node")),
        },
        Request::GetOpLog { from_height, .. } => check_op_log(*from_height, response, view),
        Request::GetOpLogStamps { from_height, .. } => {
            check_op_log_stamps(*from_height, response, view)
        }
        Request::TreeList { cid } => check_tree_list(*cid, response, forest),
        _ => Checked::Skipped,
    }
}

/// An error answer: `TreeNotFound` and `NodeNotFound` must be true of the
/// model, and `TooLarge` must not refuse a node read whose whole answer
/// fits the smallest byte budget any seed draws; other transient errors
/// are not judged.
fn check_error(request: &Request, error: &Error, view: Option<&TreeView>) -> Checked {
    match (error, view) {
        (Error::TooLarge { .. }, Some(view)) => match answer_bytes_at_most(request, view) {
            Some(bytes) if bytes <= ANSWER_BUDGET_MIN_BYTES => Checked::Wrong(format!(
                "{error} for an answer of at most {bytes} bytes (every budget allows {ANSWER_BUDGET_MIN_BYTES})"
            )),
            _ => Checked::Skipped,
        },
        (Error::TreeNotFound, None) => Checked::Skipped,
        (Error::TreeNotFound, Some(view)) => {
            Checked::Wrong(format!("TreeNotFound for a tree of {} ops", view.log.len()))
        }
        (Error::NodeNotFound(node), Some(view)) => {
            let root = match request {
                Request::GetSubTree { root, .. } => root == node,
                Request::GetSubTreePage { root, after, .. } => root == node && after.is_none(),
                _ => false,
            };
            let meta = matches!(request, Request::GetMeta { node: n, .. } if n == node);
            if (root || meta) && view.model().node(*node).is_none() {
                Checked::Skipped
            } else {
                Checked::Wrong(format!("NodeNotFound({node}) for a node the model holds"))
            }
        }
        // A refusal by membership or rights says nothing of the tree: a
        // replica out of the container, or one whose config does not yet
        // list the caller while a membership change rolls out.
        (Error::NotReplica(_) | Error::PermissionDenied { .. }, _) => Checked::Skipped,
        (_, None) if tree_of(request).is_some() => {
            Checked::Wrong(format!("{error} for a tree it does not hold"))
        }
        _ => Checked::Skipped,
    }
}

/// The smallest answer byte budget of any seed (`Swarm`'s tight message
/// bounds); every answer within it must be given.
const ANSWER_BUDGET_MIN_BYTES: usize = crate::scenario::plan::swarm::ANSWER_BUDGET_MIN_BYTES;

/// What the model's answer to a node read costs against the engine's
/// answer budget with every attribute kept: an upper bound of the answer
/// the request asked for, which may keep fewer.
fn answer_bytes_at_most(request: &Request, view: &TreeView) -> Option<usize> {
    let nodes = match request {
        Request::GetSubTree { root, depth, .. } => subtree(view, *root, *depth)?,
        Request::GetMeta { node, .. } => vec![view.model().node(*node)?],
        Request::GetNodeByPath {
            path, latest_only, ..
        } => view.model().get_by_path(path, *latest_only),
        _ => return None,
    };
    let bytes = nodes
        .iter()
        .map(|n| n.meta.size_bytes() + arbor::service::ITEM_OVERHEAD_BYTES)
        .sum();
    Some(bytes)
}

fn check_by_path(request: &Request, response: &Response, model: &TreeModel) -> Checked {
    let Request::GetNodeByPath {
        path,
        attributes,
        latest_only,
        all_attributes,
        ..
    } = request
    else {
        unreachable!("a GetNodeByPath request");
    };
    let mut expected = model.get_by_path(path, *latest_only);
    if !all_attributes {
        for node in &mut expected {
            node.meta.items.retain(|kv| attributes.contains(&kv.key));
        }
    }
    let kind = if *latest_only && model.get_by_path(path, false).len() >= 2 {
        Coverage::LatestOfVersions
    } else if *latest_only {
        Coverage::GetNodeByPathLatest
    } else {
        Coverage::GetNodeByPathAll
    };
    same_nodes(kind, response, expected)
}

/// The answer is exactly `expected`, in the same order.
fn same_nodes(kind: Coverage, response: &Response, expected: Vec<NodeInfo>) -> Checked {
    match response {
        Response::Nodes(nodes) if *nodes == expected => Checked::Agreed(kind),
        other => Checked::Wrong(format!(
            "answered {}, the model says {}",
            brief(other),
            brief(&Response::Nodes(expected))
        )),
    }
}

/// GetSubTree as the API promises it: depth-first, a parent before its
/// children, children by ascending id; depth 0 = unlimited, 1 = the root
/// alone; ROOT and TRASH as themselves with an empty meta. `None` when the
/// root is no node.
pub fn subtree(view: &TreeView, root: NodeId, depth: u32) -> Option<Vec<NodeInfo>> {
    subtree_in(view, root, depth, ListOrder::Id)
}

/// `subtree`'s walk with each node's children in `order`: by ascending
/// id, or by name (nodes without a `FileName` first, then names
/// bytewise), ties by ascending id.
fn subtree_in(
    view: &TreeView,
    root: NodeId,
    depth: u32,
    order: ListOrder,
) -> Option<Vec<NodeInfo>> {
    let first = match root {
        ROOT | TRASH => NodeInfo {
            id: root,
            parent: root,
            meta: Meta::default(),
        },
        _ => view.model().node(root)?,
    };
    let mut out = Vec::new();
    let mut stack = vec![(first, 1u32)];
    while let Some((info, level)) = stack.pop() {
        if depth == 0 || level < depth {
            let mut children = view.children(info.id).to_vec();
            if order == ListOrder::Name {
                children.sort_by(|a, b| name_order(a).cmp(&name_order(b)));
            }
            for child in children.into_iter().rev() {
                stack.push((child, level + 1));
            }
        }
        out.push(info);
    }
    Some(out)
}

/// Where a node sorts among its siblings in name order.
fn name_order(node: &NodeInfo) -> (Option<&[u8]>, NodeId) {
    let name = node.meta.items.iter().find(|kv| kv.key == ATTR_FILE_NAME);
    (name.map(|kv| kv.value.as_slice()), node.id)
}

/// A page of a subtree listing: the model's walk (`subtree_in`) from
/// where the page starts, as many nodes as the page holds and no more
/// than it may; the whole rest of the walk when no cursor follows it, and
/// a cursor at its last node when one does. A first page starts at the
/// root. A page after a cursor starts after the cursor's node when that
/// node still hangs where the cursor saw it (same parent, and same name
/// in name order): a listing whose place still stands goes on from it. A
/// cursor whose node moved or went leaves the page unjudged here: its
/// place is the old one, which the model no longer has.
fn check_subtree_page(request: &Request, response: &Response, view: &TreeView) -> Checked {
    let Request::GetSubTreePage {
        root,
        depth,
        order,
        after,
        limit,
        ..
    } = request
    else {
        unreachable!("a GetSubTreePage request");
    };
    let Response::Page { nodes, next } = response else {
        return Checked::Wrong(format!("GetSubTreePage answered {}", brief(response)));
    };
    let Some(walk) = subtree_in(view, *root, *depth, *order) else {
        return match after {
            None => Checked::Wrong(format!("answered {} for a missing root", brief(response))),
            Some(_) => Checked::Skipped,
        };
    };
    let (start, kind) = match after {
        None => (0, Coverage::GetSubTreePage),
        Some(cursor) => {
            let last = cursor.last();
            let Some(here) = view.model().node(last).filter(|n| {
                n.parent == cursor.last_parent()
                    && (*order == ListOrder::Id || name_key_of(n) == cursor.last_name_key())
            }) else {
                return Checked::Skipped;
            };
            match walk.iter().position(|n| n.id == here.id) {
                Some(at) => (at + 1, Coverage::SubTreePageContinued),
                None => return Checked::Skipped,
            }
        }
    };
    if *limit > 0 && nodes.len() > *limit as usize {
        return Checked::Wrong(format!(
            "a page of {} nodes for a limit of {limit}",
            nodes.len()
        ));
    }
    let end = (start + nodes.len()).min(walk.len());
    let expected = &walk[start..end];
    if nodes.as_slice() != expected {
        return Checked::Wrong(format!(
            "a page from walk position {start} answered {}, the model says {}",
            brief(&Response::Nodes(nodes.clone())),
            brief(&Response::Nodes(expected.to_vec()))
        ));
    }
    match next {
        None if end < walk.len() => Checked::Wrong(format!(
            "the listing ended after {end} of the walk's {} nodes",
            walk.len()
        )),
        None => Checked::Agreed(kind),
        Some(_) if nodes.is_empty() && start < walk.len() => Checked::Wrong(format!(
            "an empty page with a cursor at walk position {start} of {}",
            walk.len()
        )),
        Some(cursor) => match nodes.last() {
            Some(last) if cursor.last() != last.id => Checked::Wrong(format!(
                "a page ending at node {} gave a cursor at node {}",
                last.id,
                cursor.last()
            )),
            _ => Checked::Agreed(kind),
        },
    }
}

/// The name key a listing in name order sorts a node by: `[0]` without a
/// `FileName`, else `[1]` and the name.
fn name_key_of(node: &NodeInfo) -> Vec<u8> {
    match node.meta.items.iter().find(|kv| kv.key == ATTR_FILE_NAME) {
        None => vec![0],
        Some(kv) => [&[1u8][..], &kv.value].concat(),
    }
}

/// A page of the log in storage order: heights from `from_height` (or the
/// log's first height, if higher) on without a gap, each op the logged op of its timestamp and none twice;
/// `next_height` after the last; an empty page only at the log's end.
fn check_op_log(from_height: u64, response: &Response, view: &TreeView) -> Checked {
    let Response::OpLog {
        entries,
        next_height,
    } = response
    else {
        return Checked::Wrong(format!("GetOpLog answered {response:?}"));
    };
    let heights = entries.iter().map(|e| e.height);
    let stamps: Vec<_> = entries.iter().map(|e| e.op.ts()).collect();
    if let Some(wrong) = page_problem(from_height, heights, *next_height, &stamps, view) {
        return Checked::Wrong(format!("GetOpLog from {from_height}: {wrong}"));
    }
    for entry in entries {
        if view.op_at(entry.op.ts()) != Some(&entry.op) {
            let wrong = format!("op {} differs from the logged one", entry.op.ts());
            return Checked::Wrong(format!("GetOpLog from {from_height}: {wrong}"));
        }
    }
    Checked::Agreed(Coverage::GetOpLog)
}

fn check_op_log_stamps(from_height: u64, response: &Response, view: &TreeView) -> Checked {
    let Response::OpLogStamps {
        stamps,
        next_height,
        first_height,
    } = response
    else {
        return Checked::Wrong(format!("GetOpLogStamps answered {response:?}"));
    };
    if *first_height != view.first_height {
        return Checked::Wrong(format!(
            "GetOpLogStamps named first height {first_height}, the log starts at {}",
            view.first_height
        ));
    }
    let heights = stamps.iter().map(|s| s.height);
    let ts: Vec<_> = stamps.iter().map(|s| s.ts).collect();
    match page_problem(from_height, heights, *next_height, &ts, view) {
        Some(wrong) => Checked::Wrong(format!("GetOpLogStamps from {from_height}: {wrong}")),
        None => Checked::Agreed(Coverage::GetOpLogStamps),
    }
}

/// What is wrong with a page's heights and timestamps, if anything.
fn page_problem(
    from_height: u64,
    heights: impl Iterator<Item = u64>,
    next_height: u64,
    stamps: &[u64],
    view: &TreeView,
) -> Option<String> {
    let log_len = view.log.len() as u64;
    // Heights below the log's first one (a tree created again after a
    // drop) hold nothing: a page from there starts at the first one.
    let start = from_height.max(view.first_height);
    let end = view.first_height + log_len;
    let mut expected = start;
    for height in heights {
        if height != expected {
            return Some(format!("height {height} where {expected} belongs"));
        }
        expected += 1;
    }
    if stamps.is_empty() && start < end {
        return Some(format!(
            "an empty page inside a log of heights {start}..{end}"
        ));
    }
    if !stamps.is_empty() && next_height != expected {
        return Some(format!(
            "next height {next_height} after height {}",
            expected - 1
        ));
    }
    if expected > end.max(from_height) {
        return Some(format!("height {} in a log ending at {end}", expected - 1));
    }
    let distinct: BTreeSet<_> = stamps.iter().collect();
    if distinct.len() != stamps.len() {
        return Some("an op twice in one page".into());
    }
    stamps
        .iter()
        .find(|&&ts| view.op_at(ts).is_none())
        .map(|ts| format!("op {ts} is not in the log"))
}

/// The trees of a container: sorted, each once, exactly the trees the
/// replica holds.
fn check_tree_list(cid: arbor::ContainerId, response: &Response, forest: &Forest) -> Checked {
    let Response::Trees(names) = response else {
        return Checked::Wrong(format!("TreeList answered {response:?}"));
    };
    let Ok(all) = forest.all_trees() else {
        return Checked::Skipped;
    };
    let held: Vec<String> = all
        .into_iter()
        .filter(|t| t.cid == cid)
        .map(|t| t.tree)
        .collect();
    let sorted: BTreeSet<&String> = names.iter().collect();
    if sorted.len() != names.len() || !names.windows(2).all(|w| w[0] < w[1]) {
        return Checked::Wrong(format!("TreeList not sorted or repeats: {names:?}"));
    }
    let held_set: BTreeSet<&String> = held.iter().collect();
    if sorted != held_set {
        return Checked::Wrong(format!("TreeList {names:?}, the replica holds {held:?}"));
    }
    Checked::Agreed(Coverage::TreeList)
}

/// Which replica and tree a failed check was about, for its detail.
pub fn wrong_detail(replica: ReplicaId, request: &Request, wrong: &str) -> String {
    let what = match request {
        Request::GetNodeByPath {
            path, latest_only, ..
        } => format!("GetNodeByPath {path:?} latest_only={latest_only}"),
        Request::GetSubTree { root, depth, .. } => format!("GetSubTree {root} depth {depth}"),
        Request::GetSubTreePage {
            root,
            depth,
            order,
            after,
            limit,
            ..
        } => format!(
            "GetSubTreePage {root} depth {depth} order {order:?} limit {limit} after {:?}",
            after.as_ref().map(|c| c.last())
        ),
        Request::GetMeta { node, .. } => format!("GetMeta {node}"),
        Request::GetOpLog {
            from_height, limit, ..
        } => format!("GetOpLog from {from_height} limit {limit}"),
        Request::GetOpLogStamps {
            from_height, limit, ..
        } => format!("GetOpLogStamps from {from_height} limit {limit}"),
        Request::TreeList { cid } => format!("TreeList {cid:?}"),
        other => format!("{other:?}"),
    };
    let tree = tree_of(request)
        .map(|t| format!(" {:?}/{}", t.cid, t.tree))
        .unwrap_or_default();
    format!("replica-{replica}{tree}: {what}: {wrong}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbor::forest::{AnswerBounds, ForestOptions, WriteOp, WriteRequest};
    use arbor::{ContainerId, KeyValue};

    /// A forest holding one directory with `names` under it (in that
    /// order), and the tree's view.
    fn directory(names: &[&str]) -> (Forest, TreeKey, TreeView, NodeId) {
        let forest = Forest::in_memory(ForestOptions::default()).expect("a forest in memory");
        let tree = TreeKey::new(ContainerId([7; 32]), "version");
        let add = |parent, name: &str| WriteRequest {
            tree: tree.clone(),
            op: WriteOp::Move {
                parent,
                child: None,
                items: vec![KeyValue::new(ATTR_FILE_NAME, name.as_bytes())],
            },
        };
        let committed = forest.write_batch(&[add(ROOT, "dir")]).expect("a write");
        let dir = match committed.results[0].as_ref().expect("the add") {
            arbor::forest::WriteOutcome::Moved { node, .. } => *node,
            other => panic!("{other:?}"),
        };
        for name in names {
            forest.write_batch(&[add(dir, name)]).expect("a write");
        }
        let view = TreeView::read(&forest, &tree)
            .expect("a read")
            .expect("the tree");
        (forest, tree, view, dir)
    }

    fn page_request(
        tree: &TreeKey,
        root: NodeId,
        order: ListOrder,
        after: Option<ListCursor>,
        limit: u32,
    ) -> Request {
        Request::GetSubTreePage {
            tree: tree.clone(),
            root,
            depth: 2,
            order,
            after,
            limit,
        }
    }

    use arbor::forest::ListCursor;

    /// Every page the forest gives of a listing, by id and by name, agrees
    /// with the model; the same page without its first node, ending the
    /// listing before the walk's end, or with a node too many for its
    /// limit, does not.
    #[test]
    fn a_listing_s_own_pages_agree_and_broken_ones_do_not() {
        let (forest, tree, view, dir) = directory(&["c", "a", "b", "a", "e"]);
        let bounds = AnswerBounds {
            nodes_max: 2,
            ..AnswerBounds::UNBOUNDED
        };
        for order in [ListOrder::Id, ListOrder::Name] {
            let mut after: Option<ListCursor> = None;
            let mut pages = 0;
            let mut listed = 0;
            loop {
                let page = forest
                    .get_subtree_page(&tree, dir, 2, order, after.as_ref(), bounds)
                    .expect("a page");
                let request = page_request(&tree, dir, order, after.clone(), 2);
                let response = Response::Page {
                    nodes: page.nodes.clone(),
                    next: page.next.clone(),
                };
                let kind = if after.is_none() {
                    Coverage::GetSubTreePage
                } else {
                    Coverage::SubTreePageContinued
                };
                assert_eq!(
                    check_read(&request, &response, Some(&view), &forest),
                    Checked::Agreed(kind),
                    "{order:?} page {pages}"
                );
                if page.nodes.len() == 2 {
                    let skipped = Response::Page {
                        nodes: page.nodes[1..].to_vec(),
                        next: page.next.clone(),
                    };
                    let wrong = check_read(&request, &skipped, Some(&view), &forest);
                    assert!(matches!(wrong, Checked::Wrong(_)), "{order:?}: {wrong:?}");
                    let request_one = page_request(&tree, dir, order, after.clone(), 1);
                    let too_many = check_read(&request_one, &response, Some(&view), &forest);
                    assert!(
                        matches!(too_many, Checked::Wrong(_)),
                        "{order:?}: {too_many:?}"
                    );
                }
                listed += page.nodes.len();
                // A page that ends on its bound carries a cursor even at
                // the walk's end: only one short of it must not end.
                if page.next.is_some() && listed < 6 {
                    let ended = Response::Page {
                        nodes: page.nodes.clone(),
                        next: None,
                    };
                    let wrong = check_read(&request, &ended, Some(&view), &forest);
                    assert!(matches!(wrong, Checked::Wrong(_)), "{order:?}: {wrong:?}");
                }
                pages += 1;
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            assert_eq!(listed, 6, "the directory and its five names");
            assert!(pages >= 3, "six nodes over pages of two: {pages}");
        }
    }

    /// In name order the walk is the names' order, ties by id: a page in
    /// id order is wrong for a listing by name.
    #[test]
    fn a_page_by_name_follows_the_names() {
        let (forest, tree, view, dir) = directory(&["c", "a", "b"]);
        let by_id = forest
            .get_subtree_page(&tree, dir, 2, ListOrder::Id, None, AnswerBounds::UNBOUNDED)
            .expect("a page");
        let request = page_request(&tree, dir, ListOrder::Name, None, 0);
        let response = Response::Page {
            nodes: by_id.nodes,
            next: None,
        };
        let checked = check_read(&request, &response, Some(&view), &forest);
        assert!(matches!(checked, Checked::Wrong(_)), "{checked:?}");
    }
}
