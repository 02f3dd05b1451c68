//! Lookups shared by the read API and the write path (path resolution needs
//! them inside the write transaction too), generic over redb's readable
//! tables.

use super::records::*;
use crate::canary::{self, Canary};
use crate::error::{Error, Result};
use crate::types::*;
use redb::ReadableTable;

/// Bounds of every children-index row of `(tree, parent)`.
pub(crate) fn children_bounds(tree: u64, parent: NodeId) -> (ChildKey, std::ops::Bound<ChildKey>) {
    let lower = (tree, parent, 0, 0);
    // TRASH is u64::MAX: its upper bound is the start of the next tree.
    let upper = match parent.checked_add(1) {
        Some(next) => std::ops::Bound::Excluded((tree, next, 0, 0)),
        None => std::ops::Bound::Excluded((tree + 1, 0, 0, 0)),
    };
    (lower, upper)
}

/// Children of `parent` as `(id, meta time, internal)`, in index order
/// (name hash, then id).
pub(crate) fn children_of(
    children: &impl ReadableTable<ChildKey, &'static [u8]>,
    tree: u64,
    parent: NodeId,
) -> Result<Vec<(NodeId, Timestamp, bool)>> {
    let (lower, upper) = children_bounds(tree, parent);
    let range = children.range::<ChildKey>((std::ops::Bound::Included(lower), upper))?;
    let mut out = Vec::new();
    for row in range {
        let (key, value) = row?;
        let entry = decode_child(value.value())?;
        out.push((key.value().3, entry.time, entry.internal));
    }
    Ok(out)
}

/// Children of `parent` whose name key is `name`, as `(id, meta time,
/// internal)`, ascending by id.
pub(crate) fn children_named(
    children: &impl ReadableTable<ChildKey, &'static [u8]>,
    tree: u64,
    parent: NodeId,
    name: &[u8],
) -> Result<Vec<(NodeId, Timestamp, bool)>> {
    let hash = name_hash(name);
    let range = children.range((tree, parent, hash, 0)..=(tree, parent, hash, u64::MAX))?;
    let mut out = Vec::new();
    for row in range {
        let (key, value) = row?;
        let entry = decode_child(value.value())?;
        if entry.name_key == name {
            out.push((key.value().3, entry.time, entry.internal));
        }
    }
    Ok(out)
}

/// The directory with name key `name_key` under `parent`. Concurrent creation of a
/// same-name directory on two replicas leaves both; every replica must
/// pick the same one, so the smallest id wins.
pub(crate) fn find_dir(
    children: &impl ReadableTable<ChildKey, &'static [u8]>,
    log: &impl ReadableTable<RowKey, &'static [u8]>,
    tree: u64,
    parent: NodeId,
    name_key: &[u8],
) -> Result<Option<NodeId>> {
    let candidates = children_named(children, tree, parent, name_key)?;
    let mut dirs = candidates.into_iter().filter(|c| c.2);
    if canary::active(Canary::PathByArrivalOrder) {
        return first_stored(log, tree, dirs.collect());
    }
    Ok(dirs.next().map(|c| c.0))
}

/// Planted bug: the directory whose current meta was stored first here.
fn first_stored(
    log: &impl ReadableTable<RowKey, &'static [u8]>,
    tree: u64,
    dirs: Vec<(NodeId, Timestamp, bool)>,
) -> Result<Option<NodeId>> {
    let mut best: Option<(u64, NodeId)> = None;
    for (id, time, _) in dirs {
        let height = log_record(log, tree, time)?.tail.height;
        if best.is_none_or(|b| height < b.0) {
            best = Some((height, id));
        }
    }
    Ok(best.map(|b| b.1))
}

/// Follows `dirs` from ROOT. Returns the deepest directory found and how
/// many components were resolved.
pub(crate) fn resolve_dirs(
    children: &impl ReadableTable<ChildKey, &'static [u8]>,
    log: &impl ReadableTable<RowKey, &'static [u8]>,
    tree: u64,
    dirs: &[String],
) -> Result<(NodeId, usize)> {
    let mut current = ROOT;
    for (i, component) in dirs.iter().enumerate() {
        match find_dir(children, log, tree, current, &component_key(component))? {
            Some(next) => current = next,
            None => return Ok((current, i)),
        }
    }
    Ok((current, dirs.len()))
}

/// The log record at `ts`; its absence means a node or undo entry points
/// at an op that was never stored, a broken invariant.
pub(crate) fn log_record(
    log: &impl ReadableTable<RowKey, &'static [u8]>,
    tree: u64,
    ts: Timestamp,
) -> Result<LogRecord> {
    let guard = log.get(log_key(tree, ts))?;
    let guard = guard.unwrap_or_else(|| panic!("tree {tree}: log entry {ts} is missing"));
    decode_log(guard.value())
}

pub(crate) fn node_record(
    nodes: &impl ReadableTable<RowKey, &'static [u8]>,
    tree: u64,
    node: NodeId,
) -> Result<Option<NodeRecord>> {
    match nodes.get(node_key(tree, node))? {
        None => Ok(None),
        Some(guard) => decode_node(guard.value()).map(Some),
    }
}

/// The state row of tree `number` if the snapshot holds it (a remembered
/// number is only a hint, see `tree_numbers`).
pub(crate) fn tree_state_if_present(
    rows: &impl ReadableTable<RowKey, &'static [u8]>,
    number: u64,
) -> Result<Option<TreeRecord>> {
    if rows.get(state_key(number))?.is_none() {
        return Ok(None);
    }
    tree_state(rows, number).map(Some)
}

/// The state row of tree `number`, which the trees table names: its
/// absence or another number in it is damage, not a missing tree.
pub(crate) fn tree_state(
    rows: &impl ReadableTable<RowKey, &'static [u8]>,
    number: u64,
) -> Result<TreeRecord> {
    let Some(guard) = rows.get(state_key(number))? else {
        return Err(Error::Malformed(format!("tree {number} has no state row")));
    };
    let record = decode_tree(guard.value())?;
    if record.number != number {
        return Err(Error::Malformed(format!(
            "state row of tree {number} names tree {}",
            record.number
        )));
    }
    Ok(record)
}

/// A node with its meta (read from the op that set it).
pub(crate) fn node_info(
    nodes: &impl ReadableTable<RowKey, &'static [u8]>,
    log: &impl ReadableTable<RowKey, &'static [u8]>,
    tree: u64,
    node: NodeId,
) -> Result<Option<NodeInfo>> {
    let Some(record) = node_record(nodes, tree, node)? else {
        return Ok(None);
    };
    let items = log_record(log, tree, record.time)?.body.items;
    Ok(Some(NodeInfo {
        id: node,
        parent: record.parent,
        meta: Meta {
            time: record.time,
            items,
        },
    }))
}

/// Checks the request-level arguments of a path lookup.
pub(crate) fn check_path(attr: &str, path: &[String], max_path_len: usize) -> Result<()> {
    if attr != ATTR_FILE_NAME {
        return Err(Error::UnsupportedAttribute(attr.to_string()));
    }
    if path.is_empty() {
        return Err(Error::EmptyPath);
    }
    if path.len() > max_path_len {
        return Err(Error::TooLarge {
            what: "path".into(),
            size: path.len() as u64,
            limit: max_path_len as u64,
        });
    }
    Ok(())
}
