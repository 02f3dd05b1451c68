//! The full O(n) consistency check of one stored tree, for tests and the
//! simulator's checkers. The write path asserts the cheap local versions of
//! the same facts on every op.

#[cfg(test)]
mod tests;
mod touched;

pub(super) use touched::{check_touched, check_touched_in};

use super::read;
use super::records::*;
use super::TreeRead;
use crate::error::Result;
use crate::types::*;
use redb::ReadableTable;
use std::collections::{BTreeMap, BTreeSet};

/// Outer error: storage failed; inner error: the violated invariant.
/// Reads the log once, in order: the per-node and per-height agreement is
/// checked against that one pass instead of a point lookup per node and
/// per height (the simulator runs this on every tree every few seconds).
pub(super) fn check_tree(read: &TreeRead) -> Result<Result<(), String>> {
    check_tree_in(&read.rows, &read.children, &read.rec)
}

/// `check_tree` on any view of the rows (a read snapshot, or a write
/// transaction before it commits), for the tree whose record is `rec`.
pub(super) fn check_tree_in(
    log: &impl read::TreeRows,
    children: &impl read::ChildRows,
    rec: &TreeRecord,
) -> Result<Result<(), String>> {
    check_tree_capturing(log, children, rec, None)
}

/// What every replica of a tree must hold alike, as bytes, captured by the
/// full check while it reads the rows anyway: every logged op (timestamp
/// and op bytes, without the tail of height and undo, which depend on the
/// order ops arrived in) and every node row, in key order, each entry
/// length-prefixed. The encodings are canonical, so two replicas hold the
/// same log and the same tree exactly when their contents are equal, and
/// comparing them needs no decoding.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaContent {
    log: Vec<u8>,
    nodes: Vec<u8>,
}

impl ReplicaContent {
    fn push_entry(out: &mut Vec<u8>, key: u64, bytes: &[u8]) {
        out.extend_from_slice(&key.to_be_bytes());
        let len = u32::try_from(bytes.len()).expect("a stored row is shorter than 4 GiB");
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(bytes);
    }

    /// The logged ops in timestamp order: timestamp and op bytes (read
    /// them with [`LogView::parse_op`]).
    pub fn ops(&self) -> impl Iterator<Item = (Timestamp, &[u8])> {
        let mut rest = self.log.as_slice();
        std::iter::from_fn(move || {
            let (key, after_key) = rest.split_first_chunk::<8>()?;
            let (len, after_len) = after_key.split_first_chunk::<4>()?;
            let (op, after_op) = after_len.split_at(u32::from_be_bytes(*len) as usize);
            rest = after_op;
            Some((u64::from_be_bytes(*key), op))
        })
    }
}

fn check_tree_capturing(
    log: &impl read::TreeRows,
    children: &impl read::ChildRows,
    rec: &TreeRecord,
    mut capture: Option<&mut ReplicaContent>,
) -> Result<Result<(), String>> {
    // A storage error is the outer error, never a verdict: a database
    // poisoned by an I/O error is an operating error, not a broken tree.
    // (Folding it into the verdict made a sweep report one as a broken
    // invariant: storage-errors seed 200385.)
    let t = rec.number;
    let nodes = load_nodes(log, t, capture.as_deref_mut().map(|c| &mut c.nodes))?;
    if let Err(broken) = check_node_count(rec, &nodes).and_then(|()| check_max_parent(rec, &nodes))
    {
        return Ok(Err(broken));
    }
    let mut heights_by_ts = Vec::new();
    let log_capture = capture.map(|c| &mut c.log);
    if let Err(broken) = scan_log(log, children, t, &nodes, &mut heights_by_ts, log_capture)? {
        return Ok(Err(broken));
    }
    if let Err(broken) = check_children_index(children, t, &nodes)? {
        return Ok(Err(broken));
    }
    if let Err(broken) = check_acyclic(&nodes) {
        return Ok(Err(broken));
    }
    check_heights(log, rec, &heights_by_ts)
}

/// One pass over the tree's log: every node's state was set by the op at
/// its meta time (nodes visited in time order, alongside the log), whose
/// log row leaves its items to the node, while every other log row holds
/// its own; `heights_by_ts` gets each logged op's height and digest,
/// ascending by timestamp.
fn scan_log(
    log: &impl read::TreeRows,
    children: &impl read::ChildRows,
    t: u64,
    nodes: &BTreeMap<NodeId, NodeRecord>,
    heights_by_ts: &mut Vec<(Timestamp, u64, u64)>,
    mut capture: Option<&mut Vec<u8>>,
) -> Result<Result<(), String>> {
    if let Some(id) = [ROOT, TRASH].into_iter().find(|id| nodes.contains_key(id)) {
        return Ok(Err(format!("reserved id {id} stored as a node")));
    }
    let mut by_time: Vec<(Timestamp, NodeId)> = nodes.iter().map(|(&id, n)| (n.time, id)).collect();
    by_time.sort_unstable();
    let mut unmatched = by_time.into_iter().peekable();
    for row in read::rows_of_kind(log, t, RowKind::Log)? {
        let (ts, value) = row?;
        let op = LogView::parse(value.value())?;
        let mut sets = None;
        while let Some(&(time, id)) = unmatched.peek() {
            if time < ts {
                return Ok(Err(format!("node {id}: meta time {time} not in the log")));
            }
            if time > ts {
                break;
            }
            unmatched.next();
            sets = Some(id);
        }
        let op_body: std::borrow::Cow<'_, [u8]> = match sets {
            None if op.at_node() => {
                return Ok(Err(format!(
                    "op {ts} leaves its items to node {}, whose meta is another op's",
                    op.child
                )))
            }
            None => op.body().into(),
            Some(id) => {
                let node = &nodes[&id];
                if !op.at_node() {
                    return Ok(Err(format!(
                        "node {id}: the op at {ts} that set its meta keeps its items"
                    )));
                }
                let items = node_meta(children, t, id, node)?;
                let consistent = op.child == id
                    && op.parent == node.parent
                    && items.as_ref().is_some_and(|items| {
                        name_key(items) == node.name_key && is_internal(items) == node.internal
                    });
                let Some(items) = items.filter(|_| consistent) else {
                    return Ok(Err(format!("node {id}: state differs from the op at {ts}")));
                };
                encode_op_body(op.parent, op.child, &items).into()
            }
        };
        heights_by_ts.push((ts, op.tail.height, op_digest(&op_body)));
        if let Some(out) = capture.as_deref_mut() {
            ReplicaContent::push_entry(out, ts, &op_body);
        }
    }
    if let Some((time, id)) = unmatched.next() {
        return Ok(Err(format!("node {id}: meta time {time} not in the log")));
    }
    Ok(Ok(()))
}

/// The meta items of node `id` (state `node`) from the children row its
/// state names, `None` when no such row holds a meta of its meta time.
fn node_meta(
    children: &impl read::ChildRows,
    t: u64,
    id: NodeId,
    node: &NodeRecord,
) -> Result<Option<Vec<KeyValue>>> {
    let key = child_key(t, node.parent, &node.name_key, id);
    let Some(guard) = children.get(key)? else {
        return Ok(None);
    };
    let entry = decode_child(key, guard.value())?;
    if entry.time != node.time {
        return Ok(None);
    }
    Ok(Some(child_items(&entry)?))
}

fn load_nodes(
    table: &impl read::TreeRows,
    t: u64,
    mut capture: Option<&mut Vec<u8>>,
) -> Result<BTreeMap<NodeId, NodeRecord>> {
    // Rows come in id order: collecting builds the map in one pass.
    read::rows_of_kind(table, t, RowKind::Node)?
        .map(|row| {
            let (id, value) = row?;
            if let Some(out) = capture.as_deref_mut() {
                ReplicaContent::push_entry(out, id, value.value());
            }
            Ok((id, decode_node(value.value())?))
        })
        .collect()
}

fn check_node_count(rec: &TreeRecord, nodes: &BTreeMap<NodeId, NodeRecord>) -> Result<(), String> {
    if rec.node_count != nodes.len() as u64 {
        return Err(format!(
            "tree record counts {} nodes, table holds {}",
            rec.node_count,
            nodes.len()
        ));
    }
    Ok(())
}

/// Every parent is covered by the tree's `max_parent` (the write path
/// skips the child check of nodes above it).
fn check_max_parent(rec: &TreeRecord, nodes: &BTreeMap<NodeId, NodeRecord>) -> Result<(), String> {
    match nodes
        .iter()
        .find(|(_, n)| n.parent != TRASH && n.parent > rec.max_parent)
    {
        Some((id, n)) => Err(format!(
            "node {id} hangs under {} above the tree's max parent {}",
            n.parent, rec.max_parent
        )),
        None => Ok(()),
    }
}

/// Every node's state was set by the op at its meta time, whose log row
/// leaves its items to the node's children row.
fn check_nodes_against_log(
    log: &impl read::TreeRows,
    children: &impl read::ChildRows,
    t: u64,
    nodes: &BTreeMap<NodeId, NodeRecord>,
) -> Result<Result<(), String>> {
    for (&id, node) in nodes {
        if id == ROOT || id == TRASH {
            return Ok(Err(format!("reserved id {id} stored as a node")));
        }
        let Some(guard) = log.get(log_key(node.time))? else {
            return Ok(Err(format!(
                "node {id}: meta time {} not in the log",
                node.time
            )));
        };
        let op = LogView::parse(guard.value())?;
        if !op.at_node() {
            return Ok(Err(format!(
                "node {id}: the op at {} that set its meta keeps its items",
                node.time
            )));
        }
        let items = node_meta(children, t, id, node)?;
        let consistent = op.child == id
            && op.parent == node.parent
            && items.is_some_and(|items| {
                name_key(&items) == node.name_key && is_internal(&items) == node.internal
            });
        if !consistent {
            return Ok(Err(format!(
                "node {id}: state differs from the op at {}",
                node.time
            )));
        }
    }
    Ok(Ok(()))
}

/// The children index holds exactly one row per node, under its parent.
fn check_children_index(
    children: &impl read::ChildRows,
    t: u64,
    nodes: &BTreeMap<NodeId, NodeRecord>,
) -> Result<Result<(), String>> {
    let mut seen = BTreeSet::new();
    for row in children.range(tree_children(t))? {
        let (key, value) = row?;
        let key = key.value();
        let (_, parent, _, id) = key;
        let entry = decode_child(key, value.value())?;
        let Some(node) = nodes.get(&id) else {
            return Ok(Err(format!("children index lists absent node {id}")));
        };
        let items = child_items(&entry)?;
        let same = node.parent == parent
            && node.name_key == entry.name_key
            && node.time == entry.time
            && node.internal == entry.internal
            && name_key(&items) == entry.name_key
            && is_internal(&items) == entry.internal;
        if !same || !seen.insert(id) {
            return Ok(Err(format!(
                "children index row of node {id} is wrong or repeated"
            )));
        }
    }
    if seen.len() != nodes.len() {
        return Ok(Err(format!(
            "children index holds {} nodes, node table {}",
            seen.len(),
            nodes.len()
        )));
    }
    // Path lookups go through the same rows; spot-check one read path.
    if let Some((&id, node)) = nodes.iter().next() {
        let found = read::children_of(children, t, node.parent)?;
        if !found.iter().any(|c| c.0 == id) {
            return Ok(Err(format!(
                "node {id} not found among its parent's children"
            )));
        }
    }
    Ok(Ok(()))
}

/// Every node reaches ROOT, TRASH or a parent that is not stored (an op
/// that arrived before its parent's creation) without a cycle. Each node
/// is walked over once: a walk stops at a node an earlier walk anchored,
/// and meeting a node of its own path again is a cycle. Nodes are named by
/// their position in id order, so the walk needs no map lookups.
fn check_acyclic(nodes: &BTreeMap<NodeId, NodeRecord>) -> Result<(), String> {
    const UNSEEN: u8 = 0;
    const ON_PATH: u8 = 1;
    const ANCHORED: u8 = 2;
    let ids: Vec<NodeId> = nodes.keys().copied().collect();
    let parent_at: Vec<Option<usize>> = nodes
        .values()
        .map(|n| ids.binary_search(&n.parent).ok())
        .collect();
    let mut state = vec![UNSEEN; ids.len()];
    let mut path = Vec::new();
    for start in 0..ids.len() {
        let mut current = Some(start);
        while let Some(at) = current {
            match state[at] {
                ANCHORED => break,
                ON_PATH => return Err(format!("cycle through node {}", ids[at])),
                _ => {}
            }
            state[at] = ON_PATH;
            path.push(at);
            current = parent_at[at];
        }
        for at in path.drain(..) {
            state[at] = ANCHORED;
        }
    }
    Ok(())
}

/// Heights number the log densely from its first height (0, or the height
/// a dropped incarnation of the tree reached) and agree with the log records
/// and their digests (`heights_by_ts`, from `scan_log`).
fn check_heights(
    heights: &impl read::TreeRows,
    rec: &TreeRecord,
    heights_by_ts: &[(Timestamp, u64, u64)],
) -> Result<Result<(), String>> {
    let mut first = None;
    let mut expected = 0;
    for row in heights.range(region_range(RowKind::Height))? {
        let (key, stamps) = row?;
        // The oldest run starts the log: 0, or where a drop left it.
        let start = *first.get_or_insert(height_of_key(key.value()));
        expected = expected.max(start);
        if height_of_key(key.value()) != expected {
            return Ok(Err(format!("height {expected} missing")));
        }
        for (ts, digest) in decode_height_run(stamps.value())? {
            let height = expected;
            match heights_by_ts.binary_search_by_key(&ts, |&(ts, _, _)| ts) {
                Err(_) => return Ok(Err(format!("height {height} points at absent op {ts}"))),
                Ok(i) if heights_by_ts[i].1 != height => {
                    return Ok(Err(format!("op {ts} disagrees about its height {height}")))
                }
                Ok(i) if heights_by_ts[i].2 != digest => {
                    return Ok(Err(format!("op {ts} disagrees with its digest")))
                }
                Ok(_) => {}
            }
            if timestamp_counter(ts) > rec.max_counter {
                return Ok(Err(format!("op {ts} is newer than the tree's counter")));
            }
            expected += 1;
        }
    }
    let log_len = heights_by_ts.len() as u64;
    let first = first.unwrap_or(rec.next_height);
    if expected.max(first) != rec.next_height || rec.next_height.checked_sub(first) != Some(log_len)
    {
        return Ok(Err(format!(
            "heights {first}..{expected}, {log_len} log entries, next height {}",
            rec.next_height
        )));
    }
    Ok(Ok(()))
}

/// What a full check of one tree found, and the record it saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recheck {
    /// The tree's record equals the one given: not checked again.
    Unchanged,
    /// Checked in full; the verdict and the record of that snapshot.
    Checked {
        rec: TreeRecord,
        verdict: Result<(), String>,
    },
}

impl super::Forest {
    /// The full check of `check_invariants`, skipped when the tree's record
    /// (op count, node count, newest counter, largest parent) equals
    /// `seen`, the record of an earlier full check of this forest. Every
    /// change the write path makes logs an op, which moves the record, so
    /// an equal record means no op was stored since. One read snapshot for
    /// the comparison and the check. The outer error is a storage error.
    pub fn check_invariants_if_changed(
        &self,
        tree: &TreeKey,
        seen: Option<&TreeRecord>,
    ) -> Result<Recheck> {
        let read = self.read_tree(tree)?;
        if seen == Some(&read.rec) {
            return Ok(Recheck::Unchanged);
        }
        let verdict = check_tree(&read)?;
        Ok(Recheck::Checked {
            rec: read.rec,
            verdict,
        })
    }

    /// The full check of `check_invariants`, and from the same read
    /// snapshot what replicas of the tree must hold alike (see
    /// [`ReplicaContent`]). The outer error is a storage error.
    pub fn check_invariants_capturing(
        &self,
        tree: &TreeKey,
    ) -> Result<(Result<(), String>, ReplicaContent)> {
        let read = self.read_tree(tree)?;
        let mut content = ReplicaContent::default();
        let verdict =
            check_tree_capturing(&read.rows, &read.children, &read.rec, Some(&mut content))?;
        Ok((verdict, content))
    }

    /// Breaks the tree invariant on purpose for checker tests: node `node`
    /// gets a meta time no logged op has, written straight to its row,
    /// outside the op path (so the tree's record does not change).
    #[doc(hidden)]
    pub fn plant_broken_node(&self, tree: &TreeKey, node: NodeId) -> Result<()> {
        self.rewrite_row(tree, node_key(node), node, |bytes| {
            let mut record = decode_node(bytes)?;
            record.time += 1;
            *bytes = encode_node(&record);
            Ok(())
        })
    }

    /// Changes a logged op on purpose for checker tests: the last byte of
    /// the op at `ts` (the end of its last item's value, which must be
    /// neither empty nor the file name) flips, outside the op path, in its
    /// log row or in the children row of the node whose meta it set, and
    /// its digest follows. The tree invariant still holds; replicas of the
    /// tree now hold two different ops under one timestamp, as two
    /// replicas with one id would.
    #[doc(hidden)]
    pub fn plant_changed_op(&self, tree: &TreeKey, ts: Timestamp) -> Result<()> {
        let read = self.read_tree(tree)?;
        let t = read.rec.number;
        let Some(guard) = read.rows.get(log_key(ts))? else {
            return Err(crate::error::Error::NodeNotFound(ts));
        };
        let view = LogView::parse(guard.value())?;
        let (height, child, at_node) = (view.tail.height, view.child, view.at_node());
        drop(guard);
        let node = read::node_record(&read.rows, t, child)?;
        let first = super::stamps::run_holding(&read.rows, height)?;
        drop(read);
        let txn = self.begin_write()?;
        let digest = {
            let mut rows = txn.open_table(tree_table(&tree_table_name(t)))?;
            let digest = if at_node {
                let node = node.expect("an op whose node holds its items has its node");
                let key = child_key(t, node.parent, &node.name_key, child);
                let mut children = txn.open_table(CHILDREN)?;
                let mut bytes = children.get(key)?.expect("its row").value().to_vec();
                *bytes.last_mut().expect("a meta with a last value") ^= 1;
                children.insert(key, bytes.as_slice())?;
                let items = child_items(&decode_child(key, &bytes)?)?;
                let view = read::log_row(&rows, t, ts)?.value().to_vec();
                let view = LogView::parse(&view)?;
                op_digest(&encode_op_body(view.parent, view.child, &items))
            } else {
                let mut bytes = read::log_row(&rows, t, ts)?.value().to_vec();
                let body_len = log_body_len(&bytes)?;
                bytes[body_len - 1] ^= 1;
                rows.insert(log_key(ts), bytes.as_slice())?;
                op_digest(&bytes[..body_len])
            };
            let mut run = rows
                .get(height_key(first))?
                .expect("its run")
                .value()
                .to_vec();
            let at = (height - first) as usize * HEIGHT_ENTRY_BYTES + 8;
            run[at..at + 8].copy_from_slice(&digest.to_be_bytes());
            rows.insert(height_key(first), run.as_slice())?;
            digest
        };
        let _ = digest;
        txn.commit()
    }

    /// Rewrites the row `key` of `tree` in one commit, outside the op
    /// path; `NodeNotFound(id)` when it is absent.
    fn rewrite_row(
        &self,
        tree: &TreeKey,
        key: RowKeyParts,
        id: NodeId,
        change: impl FnOnce(&mut Vec<u8>) -> Result<()>,
    ) -> Result<()> {
        let t = self.read_tree(tree)?.rec.number;
        let txn = self.begin_write()?;
        {
            let mut rows = txn.open_table(tree_table(&tree_table_name(t)))?;
            let Some(mut bytes) = rows.get(key)?.map(|guard| guard.value().to_vec()) else {
                return Err(crate::error::Error::NodeNotFound(id));
            };
            change(&mut bytes)?;
            rows.insert(key, bytes.as_slice())?;
        }
        txn.commit()
    }
}
