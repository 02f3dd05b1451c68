//! The part of the full check that a write to a few nodes can break, for
//! checkers that test every batch.

use super::*;

/// The part of `check_tree` a write to `touched` nodes can break, in
/// O(|touched| x depth x log n) instead of O(tree): each stored touched node
/// agrees with the op that set it, sits in the children index under
/// its parent, and its ancestor chain ends at ROOT, TRASH or a node not
/// stored yet without a cycle; the newest height points at the newest
/// stored op. The full check stays for the periodic sweeps.
pub(in crate::forest) fn check_touched(
    read: &TreeRead,
    touched: &[NodeId],
) -> Result<Result<(), String>> {
    check_touched_in(&read.rows, &read.children, &read.rec, touched)
}

/// `check_touched` on any view of the rows (see `check_tree_in`).
pub(in crate::forest) fn check_touched_in(
    table: &impl read::TreeRows,
    children: &impl read::ChildRows,
    rec: &TreeRecord,
    touched: &[NodeId],
) -> Result<Result<(), String>> {
    let log = table;
    let t = rec.number;
    for &id in touched {
        // A move of a node not seen here yet under itself is a logged
        // no-op: the node may legitimately be absent.
        let Some(guard) = table.get(node_key(id))? else {
            continue;
        };
        let node = decode_node(guard.value())?;
        let single = BTreeMap::from([(id, node.clone())]);
        if let Err(broken) = check_nodes_against_log(log, children, t, &single)? {
            return Ok(Err(broken));
        }
        let key = child_key(t, node.parent, &node.name_key, id);
        let same = match children.get(key)? {
            Some(row) => {
                let entry = decode_child(key, row.value())?;
                entry.time == node.time
                    && entry.internal == node.internal
                    && entry.name_key == node.name_key
            }
            None => false,
        };
        if !same {
            return Ok(Err(format!(
                "node {id}: children index row under {} missing or wrong",
                node.parent
            )));
        }
        if let Err(broken) = check_max_parent(rec, &single) {
            return Ok(Err(broken));
        }
        if let Err(broken) = check_ancestors(table, rec, id)? {
            return Ok(Err(broken));
        }
    }
    check_newest_height(log, children, rec)
}

/// Walks up from `id`; more steps than stored nodes means a cycle.
fn check_ancestors(
    table: &impl read::TreeRows,
    rec: &TreeRecord,
    id: NodeId,
) -> Result<Result<(), String>> {
    let mut current = id;
    for _ in 0..=rec.node_count {
        let Some(guard) = table.get(node_key(current))? else {
            return Ok(Ok(()));
        };
        current = node_parent(guard.value())?;
        if current == ROOT || current == TRASH {
            return Ok(Ok(()));
        }
    }
    Ok(Err(format!("cycle above node {id}")))
}

fn check_newest_height(
    log: &impl read::TreeRows,
    children: &impl read::ChildRows,
    rec: &TreeRecord,
) -> Result<Result<(), String>> {
    let t = rec.number;
    let last_run = log.range(region_range(RowKind::Height))?.next_back();
    let Some(row) = last_run else {
        if rec.next_height == 0 {
            return Ok(Ok(()));
        }
        return Ok(Err(format!("no heights, next height {}", rec.next_height)));
    };
    let (key, stamps) = row?;
    let first = height_of_key(key.value());
    let run: Vec<(Timestamp, u64)> = decode_height_run(stamps.value())?.collect();
    let newest = first + run.len() as u64 - 1;
    if newest + 1 != rec.next_height {
        return Ok(Err(format!(
            "newest height {newest}, next height {}",
            rec.next_height
        )));
    }
    let (ts, digest) = *run.last().expect("a height run is never empty");
    check_height_entry(log, children, t, newest, ts, digest)
}

/// The op the height index names at `height` is logged and agrees.
fn check_height_entry(
    log: &impl read::TreeRows,
    children: &impl read::ChildRows,
    t: u64,
    height: u64,
    ts: Timestamp,
    digest: u64,
) -> Result<Result<(), String>> {
    if log.get(log_key(ts))?.is_none() {
        return Ok(Err(format!("height {height} points at absent op {ts}")));
    }
    let record = read::log_op(log, children, t, ts)?;
    if record.tail.height != height {
        return Ok(Err(format!("op {ts} disagrees about its height {height}")));
    }
    let body = encode_op_body(record.body.parent, record.body.child, &record.body.items);
    if op_digest(&body) != digest {
        return Ok(Err(format!("op {ts} disagrees with its digest")));
    }
    Ok(Ok(()))
}
