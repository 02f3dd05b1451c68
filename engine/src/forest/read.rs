//! Lookups shared by the read API and the write path (path resolution needs
//! them inside the write transaction too), generic over redb's readable
//! tables.

use super::records::*;
use crate::canary::{self, Canary};
use crate::error::{Error, Result};
use crate::types::*;
use redb::ReadableTable;

/// The children table as readers and the writer hold it.
pub(crate) trait ChildRows: ReadableTable<ChildKey, &'static [u8]> {}

impl<T: ReadableTable<ChildKey, &'static [u8]>> ChildRows for T {}

/// A tree's table of rows as readers and the writer hold it.
pub(crate) trait TreeRows: ReadableTable<RowKey, &'static [u8]> {}

impl<T: ReadableTable<RowKey, &'static [u8]>> TreeRows for T {}

/// Children of `parent` as `(id, meta time, internal)`, in index order
/// (name, then id).
pub(crate) fn children_of(
    children: &impl ChildRows,
    tree: u64,
    parent: NodeId,
) -> Result<Vec<(NodeId, Timestamp, bool)>> {
    let mut out = Vec::new();
    for row in children.range(children_range(tree, parent))? {
        let (key, value) = row?;
        let key = key.value();
        let entry = decode_child(key, value.value())?;
        out.push((key.3, entry.time, entry.internal));
    }
    Ok(out)
}

/// Children of `parent` whose name key is `name`, as `(id, meta time,
/// internal)`, ascending by id.
pub(crate) fn children_named(
    children: &impl ChildRows,
    tree: u64,
    parent: NodeId,
    name: &[u8],
) -> Result<Vec<(NodeId, Timestamp, bool)>> {
    let mut out = Vec::new();
    for row in children.range(children_named_range(tree, parent, name))? {
        let (key, value) = row?;
        let key = key.value();
        let entry = decode_child(key, value.value())?;
        out.push((key.3, entry.time, entry.internal));
    }
    Ok(out)
}

/// The directory with name key `name_key` under `parent`. Concurrent creation of a
/// same-name directory on two replicas leaves both; every replica must
/// pick the same one, so the smallest id wins.
pub(crate) fn find_dir(
    rows: &impl TreeRows,
    children: &impl ChildRows,
    tree: u64,
    parent: NodeId,
    name_key: &[u8],
) -> Result<Option<NodeId>> {
    let candidates = children_named(children, tree, parent, name_key)?;
    let mut dirs = candidates.into_iter().filter(|c| c.2);
    if canary::active(Canary::PathByArrivalOrder) {
        return first_stored(rows, tree, dirs.collect());
    }
    Ok(dirs.next().map(|c| c.0))
}

/// Planted bug: the directory whose current meta was stored first here.
fn first_stored(
    rows: &impl TreeRows,
    tree: u64,
    dirs: Vec<(NodeId, Timestamp, bool)>,
) -> Result<Option<NodeId>> {
    let mut best: Option<(u64, NodeId)> = None;
    for (id, time, _) in dirs {
        let height = LogView::parse(log_row(rows, tree, time)?.value())?
            .tail
            .height;
        if best.is_none_or(|b| height < b.0) {
            best = Some((height, id));
        }
    }
    Ok(best.map(|b| b.1))
}

/// Follows `dirs` from ROOT. Returns the deepest directory found and how
/// many components were resolved.
pub(crate) fn resolve_dirs(
    rows: &impl TreeRows,
    children: &impl ChildRows,
    tree: u64,
    dirs: &[String],
) -> Result<(NodeId, usize)> {
    let mut current = ROOT;
    for (i, component) in dirs.iter().enumerate() {
        match find_dir(rows, children, tree, current, &component_key(component))? {
            Some(next) => current = next,
            None => return Ok((current, i)),
        }
    }
    Ok((current, dirs.len()))
}

/// A row's id (or timestamp) and its stored value.
pub(crate) type KeyedRow<'t> = (u64, redb::AccessGuard<'t, &'static [u8]>);

/// The rows of `kind` (node or log rows, which share a region) of one
/// tree in key order.
pub(crate) fn rows_of_kind<'t>(
    rows: &'t impl ReadableTable<RowKey, &'static [u8]>,
    tree: u64,
    kind: RowKind,
) -> Result<impl Iterator<Item = Result<KeyedRow<'t>>> + 't> {
    let range = rows.range(region_range(kind))?;
    Ok(range.filter_map(move |row| {
        let (key, value) = match row {
            Ok(row) => row,
            Err(e) => return Some(Err(e.into())),
        };
        let key = key.value();
        match key_kind(key) {
            Some(found) if found == kind => Some(Ok((key.a, value))),
            Some(_) => None,
            None => Some(Err(Error::Malformed(format!(
                "tree {tree}: row key {key:?} of no kind"
            )))),
        }
    }))
}

/// The log row at `ts`; its absence means a node or undo entry points
/// at an op that was never stored, a broken invariant.
pub(crate) fn log_row<'t>(
    rows: &'t impl TreeRows,
    tree: u64,
    ts: Timestamp,
) -> Result<redb::AccessGuard<'t, &'static [u8]>> {
    let guard = rows.get(log_key(ts))?;
    Ok(guard.unwrap_or_else(|| panic!("tree {tree}: log entry {ts} is missing")))
}

/// The whole op at `ts` with its undo record: its items from its log row,
/// or from its child's children row when the op set the child's current
/// meta (`LogView::at_node`). The rows must be those of one state: a
/// snapshot, or the writer's tables outside an undo/redo pass.
pub(crate) fn log_op(
    rows: &impl TreeRows,
    children: &impl ChildRows,
    tree: u64,
    ts: Timestamp,
) -> Result<LogRecord> {
    let guard = log_row(rows, tree, ts)?;
    let view = LogView::parse(guard.value())?;
    if !view.at_node() {
        return Ok(view.to_record());
    }
    Ok(LogRecord {
        body: OpBody {
            parent: view.parent,
            child: view.child,
            items: items_at_node(rows, children, tree, ts, view.child)?,
        },
        tail: view.tail,
    })
}

/// The items of the op at `ts` that its child `child`'s children row
/// holds. The child must be stored with its meta from that op; otherwise
/// the row is damaged (`Malformed`).
pub(crate) fn items_at_node(
    rows: &impl TreeRows,
    children: &impl ChildRows,
    tree: u64,
    ts: Timestamp,
    child: NodeId,
) -> Result<Vec<KeyValue>> {
    let node = node_record(rows, tree, child)?;
    match node {
        Some(node) if node.time == ts => node_items(children, tree, child, &node),
        _ => Err(Error::Malformed(format!(
            "tree {tree}: op {ts} leaves its items to node {child}, whose meta is another op's"
        ))),
    }
}

/// The meta items of stored node `id` (state `node`), from its children
/// row.
pub(crate) fn node_items(
    children: &impl ChildRows,
    tree: u64,
    id: NodeId,
    node: &NodeRecord,
) -> Result<Vec<KeyValue>> {
    let key = child_key(tree, node.parent, &node.name_key, id);
    let Some(guard) = children.get(key)? else {
        return Err(Error::Malformed(format!(
            "tree {tree}: node {id} has no children row under {}",
            node.parent
        )));
    };
    let entry = decode_child(key, guard.value())?;
    if entry.time != node.time {
        return Err(Error::Malformed(format!(
            "tree {tree}: node {id}'s children row has meta time {}, its node {}",
            entry.time, node.time
        )));
    }
    child_items(&entry)
}

pub(crate) fn node_record(
    rows: &impl TreeRows,
    tree: u64,
    node: NodeId,
) -> Result<Option<NodeRecord>> {
    match rows.get(node_key(node))? {
        None => Ok(None),
        Some(guard) => decode_node(guard.value()).map(Some).map_err(|e| match e {
            Error::Malformed(what) => Error::Malformed(format!("tree {tree}: node {node}: {what}")),
            other => other,
        }),
    }
}

/// The state row of tree `number` if its table holds one (a table
/// created for a remembered number that is only a hint holds none, see
/// `tree_numbers`).
pub(crate) fn tree_state_if_present(
    rows: &impl TreeRows,
    number: u64,
) -> Result<Option<TreeRecord>> {
    match rows.get(state_key())? {
        Some(guard) => checked_state(guard.value(), number).map(Some),
        None => Ok(None),
    }
}

/// The state row of tree `number`, which the trees table names: its
/// absence or another number in it is damage, not a missing tree.
pub(crate) fn tree_state(rows: &impl TreeRows, number: u64) -> Result<TreeRecord> {
    let Some(guard) = rows.get(state_key())? else {
        return Err(Error::Malformed(format!("tree {number} has no state row")));
    };
    checked_state(guard.value(), number)
}

/// Decodes the state row stored under tree `number`'s key.
fn checked_state(bytes: &[u8], number: u64) -> Result<TreeRecord> {
    let record = decode_tree(bytes)?;
    if record.number != number {
        return Err(Error::Malformed(format!(
            "state row of tree {number} names tree {}",
            record.number
        )));
    }
    Ok(record)
}

/// A node with its meta (from its children row).
pub(crate) fn node_info(
    rows: &impl TreeRows,
    children: &impl ChildRows,
    tree: u64,
    node: NodeId,
) -> Result<Option<NodeInfo>> {
    let Some(record) = node_record(rows, tree, node)? else {
        return Ok(None);
    };
    let items = node_items(children, tree, node, &record)?;
    Ok(Some(NodeInfo {
        id: node,
        parent: record.parent,
        meta: Meta {
            time: record.time,
            items,
        },
    }))
}
