//! One op's do and undo on the rows: node state, the children index and
//! the log, through the overlay while an undo/redo pass runs.
//!
//! Where an op's items live: in its log row, except for the op that set a
//! stored node's current meta, whose items its node's children row holds
//! (docs/design.md §5). Outside a pass every change of a node's meta moves
//! them on the spot (`do_op`); a pass writes fresh ops whole and leaves the
//! rows of nodes alone, and its end moves the items of the nodes whose
//! meta changed (`flush_overlay`).

use super::super::read;
use super::super::records::*;
use super::{rows_mut, strict, HeightRun, Writer};
use crate::canary::{self, Canary};
use crate::error::Result;
use crate::types::*;
use redb::ReadableTable;

impl Writer<'_, '_> {
    /// Does a new op and stores it with the tree's next height.
    pub(super) fn append(
        &mut self,
        rec: &mut TreeRecord,
        ts: Timestamp,
        parent: NodeId,
        child: NodeId,
        items: &[KeyValue],
    ) -> Result<()> {
        // Checked on arrival (`validate`): never ROOT or TRASH.
        assert!(
            child != ROOT && child != TRASH,
            "op moves reserved node {child}"
        );
        let mut name = std::mem::take(&mut self.scratch.name);
        name_key_from_items(items, &mut name);
        let undo = self.do_op(rec, ts, parent, child, is_internal(items), &name, items);
        self.scratch.name = name;
        let undo = undo?;
        let tail = LogTail {
            height: rec.next_height,
            undo,
        };
        encode_log_into(&mut self.scratch.log, parent, child, items, tail);
        // Outside a pass an op that set its child's meta leaves its items
        // to the child's children row, which `do_op` wrote.
        let at_node = self.overlay.is_none() && undo != Undo::NoEffect;
        if at_node {
            encode_log_at_node_into(&mut self.scratch.log_at_node, parent, child, tail);
        }
        let row = match at_node {
            true => self.scratch.log_at_node.as_slice(),
            false => self.scratch.log.as_slice(),
        };
        let stored_before = rows_mut!(self, rec.number)
            .insert(log_key(ts), row)?
            .is_some();
        assert!(!stored_before, "timestamp {ts} stored twice");
        if let Some(journal) = &mut self.journal {
            journal.op(rec.number, ts, &self.scratch.log);
        }
        let digest = op_digest(log_body(&self.scratch.log)?);
        self.record_height(rec.number, rec.next_height, ts, digest);
        rec.next_height += 1;
        rec.max_counter = rec.max_counter.max(timestamp_counter(ts));
        if parent != TRASH {
            rec.max_parent = rec.max_parent.max(parent);
        }
        self.changed = true;
        Ok(())
    }

    /// Remembers that `ts` (with its op's `digest`) is stored at
    /// `height`: extends the current run when the height follows it, else
    /// starts a new one.
    pub(super) fn record_height(&mut self, tree: u64, height: u64, ts: Timestamp, digest: u64) {
        let extends = self.height_runs.last().is_some_and(|run| {
            let len = run.stamps.len() / HEIGHT_ENTRY_BYTES;
            run.tree == tree && run.first + len as u64 == height && len < HEIGHT_RUN_MAX
        });
        if !extends {
            self.height_runs.push(HeightRun {
                tree,
                first: height,
                stamps: Vec::with_capacity(HEIGHT_ENTRY_BYTES * 128),
            });
        }
        let run = self.height_runs.last_mut().expect("pushed above");
        encode_height_entry(&mut run.stamps, ts, digest);
        assert!(
            height_run_len_valid(run.stamps.len()),
            "height run overfull"
        );
    }

    /// The "do" step: moves `child` under `parent` with the op's meta
    /// (`internal`, `name_key`, `items`) unless that would make a cycle.
    /// Returns how to undo it. Inside a pass `items` are not used (the
    /// children rows are written at its end) and may be empty.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn do_op(
        &mut self,
        rec: &mut TreeRecord,
        ts: Timestamp,
        parent: NodeId,
        child: NodeId,
        internal: bool,
        name_key: &[u8],
        items: &[KeyValue],
    ) -> Result<Undo> {
        if child == parent {
            return Ok(Undo::NoEffect);
        }
        let tree = rec.number;
        // The new state is written before the cycle check, so that one
        // descent of the node table both reads the old state and writes the
        // new one. The check walks up from `parent` and stops on reaching
        // `child`, so it never reads the child's own (already new) row.
        let old = self.put_node(tree, child, parent, ts, internal, name_key)?;
        // Every op newer than this one is undone (or this one is the
        // newest): the state it replaces is older.
        if let Some(old) = old.as_ref().filter(|_| strict()) {
            assert!(
                old.time < ts,
                "tree {tree}: op {ts} replaces newer state {}",
                old.time
            );
        }
        // A child that was not stored and has no children cannot be above
        // `parent`: skip the ancestor walk.
        let may_be_above =
            old.is_some() || (child <= rec.max_parent && self.may_have_children(tree, child)?);
        // Planted bug `MovesNoOp`: a move of a stored node (not a remove)
        // is logged but leaves the node where it was.
        let planted = old.is_some() && parent != TRASH && canary::active(Canary::MovesNoOp);
        if planted || (may_be_above && self.is_ancestor_or_self(rec, child, parent)?) {
            self.restore_node(tree, child, old.as_ref())?;
            return Ok(Undo::NoEffect);
        }
        let undo = match old {
            Some(old) => {
                // The op that set the old meta no longer does: its items
                // go back to its log row.
                if let Some(old_items) = self.remove_child_entry(tree, child, &old)? {
                    self.items_back_to_log(tree, old.time, &old_items)?;
                }
                Undo::Moved {
                    old_parent: old.parent,
                    old_ts: old.time,
                }
            }
            None => {
                rec.node_count += 1;
                Undo::Created
            }
        };
        let entry = ChildEntry {
            time: ts,
            internal,
            name_key,
            items: &[],
        };
        self.insert_child_entry(tree, parent, child, entry, items)?;
        Ok(undo)
    }

    /// Puts back the row `do_op` overwrote for an op that turned out to be
    /// a no-op.
    pub(super) fn restore_node(
        &mut self,
        tree: u64,
        id: NodeId,
        old: Option<&NodeRecord>,
    ) -> Result<()> {
        assert!(
            old.is_none_or(|old| old.parent != id),
            "node {id} under itself"
        );
        if self.overlay.is_some() {
            self.overlay_set(tree, id, old.cloned())?;
            return Ok(());
        }
        match old {
            Some(old) => {
                rows_mut!(self, tree).insert(node_key(id), encode_node(old).as_slice())?;
            }
            None => {
                rows_mut!(self, tree).remove(node_key(id))?;
            }
        }
        Ok(())
    }

    /// Reverts one op, given that every newer op is already undone. Runs
    /// inside an undo/redo pass only.
    pub(super) fn undo_op(
        &mut self,
        rec: &mut TreeRecord,
        ts: Timestamp,
        op: &LogView<'_>,
    ) -> Result<()> {
        assert!(self.overlay.is_some(), "an undo outside an undo/redo pass");
        let tree = rec.number;
        let child = op.child;
        let current = match op.tail.undo {
            Undo::NoEffect => return Ok(()),
            Undo::Created => {
                let current = self.remove_node(tree, child)?;
                if current.is_some() {
                    rec.node_count -= 1;
                }
                current
            }
            Undo::Moved { old_parent, old_ts } => {
                let current = self.restore_moved(tree, child, old_parent, old_ts)?;
                if current.is_none() {
                    rec.node_count += 1;
                }
                current
            }
        };
        if strict() {
            let matches = current
                .as_ref()
                .is_some_and(|n| n.parent == op.parent && n.time == ts);
            assert!(
                matches,
                "tree {tree}: undo of {ts} finds node {child} in another state"
            );
        }
        Ok(())
    }

    /// Writes back the node state an op replaced (its meta is that of the
    /// op at `old_ts`); returns the state it overwrote.
    pub(super) fn restore_moved(
        &mut self,
        tree: u64,
        child: NodeId,
        old_parent: NodeId,
        old_ts: Timestamp,
    ) -> Result<Option<NodeRecord>> {
        let mut name = std::mem::take(&mut self.scratch.name);
        let internal = self.op_name_key(tree, old_ts, &mut name);
        let current = match internal {
            Ok(internal) => self.put_node(tree, child, old_parent, old_ts, internal, &name),
            Err(e) => Err(e),
        };
        self.scratch.name = name;
        current
    }

    /// The name key (into `out`) and the directory flag of the meta the op
    /// at `ts` sets. From its log row, or, for an op that set its child's
    /// meta as the tables hold it (inside a pass: as the pass found them),
    /// from the child's node row.
    pub(super) fn op_name_key(&self, tree: u64, ts: Timestamp, out: &mut Vec<u8>) -> Result<bool> {
        let guard = read::log_row(self.rows(tree), tree, ts)?;
        let op = LogView::parse(guard.value())?;
        if !op.at_node() {
            op.name_key_into(out);
            return Ok(op.is_internal());
        }
        match read::node_record(self.rows(tree), tree, op.child)? {
            Some(node) if node.time == ts => {
                out.clear();
                out.extend_from_slice(&node.name_key);
                Ok(node.internal)
            }
            _ => Err(crate::error::Error::Malformed(format!(
                "tree {tree}: op {ts} leaves its items to node {}, whose meta is another op's",
                op.child
            ))),
        }
    }

    pub(super) fn has_children(&self, tree: u64, node: NodeId) -> Result<bool> {
        assert_ne!(node, TRASH, "TRASH always may have children");
        let mut range = self.children.range(children_range(tree, node))?;
        Ok(range.next().transpose()?.is_some())
    }

    /// False only when `node` has no children. During an undo/redo pass
    /// the stored children rows are stale, so a stored child that has
    /// moved away still counts: a wrong "yes" costs an ancestor walk, a
    /// wrong "no" would skip a needed one.
    pub(super) fn may_have_children(&self, tree: u64, node: NodeId) -> Result<bool> {
        if self
            .overlay
            .as_ref()
            .is_some_and(|overlay| overlay.has_children_now(node))
        {
            return Ok(true);
        }
        self.has_children(tree, node)
    }

    /// Stores the state of a node; returns the state it replaces. Into
    /// the overlay during an undo/redo pass, else into the tree's table
    /// (one descent reads the old row and writes the new one).
    pub(super) fn put_node(
        &mut self,
        tree: u64,
        id: NodeId,
        parent: NodeId,
        time: Timestamp,
        internal: bool,
        name_key: &[u8],
    ) -> Result<Option<NodeRecord>> {
        assert!(
            id != parent && id != ROOT && id != TRASH,
            "node {id} put under {parent}"
        );
        if self.overlay.is_some() {
            let record = NodeRecord {
                parent,
                time,
                internal,
                name_key: name_key.to_vec(),
            };
            return self.overlay_set(tree, id, Some(record));
        }
        encode_node_into(&mut self.scratch.node, parent, time, internal, name_key);
        match rows_mut!(self, tree).insert(node_key(id), self.scratch.node.as_slice())? {
            Some(guard) => Ok(Some(decode_node(guard.value())?)),
            None => Ok(None),
        }
    }

    /// Deletes a node's state; returns the state it had.
    pub(super) fn remove_node(&mut self, tree: u64, id: NodeId) -> Result<Option<NodeRecord>> {
        assert!(id != ROOT && id != TRASH, "reserved node {id} removed");
        if self.overlay.is_some() {
            return self.overlay_set(tree, id, None);
        }
        match rows_mut!(self, tree).remove(node_key(id))? {
            Some(guard) => Ok(Some(decode_node(guard.value())?)),
            None => Ok(None),
        }
    }

    /// Sets a node's state in the overlay, reading its stored state on
    /// first touch; returns the state it replaces.
    pub(super) fn overlay_set(
        &mut self,
        tree: u64,
        id: NodeId,
        state: Option<NodeRecord>,
    ) -> Result<Option<NodeRecord>> {
        let overlay = self.overlay.as_ref().expect("an undo/redo pass is running");
        assert_eq!(overlay.tree, tree, "overlay of another tree");
        if !overlay.contains(id) {
            let stored = read::node_record(self.rows(tree), tree, id)?;
            self.overlay
                .as_mut()
                .expect("checked above")
                .start(id, stored);
        }
        Ok(self.overlay.as_mut().expect("checked above").set(id, state))
    }

    /// The parent of a node now, `None` if it does not exist.
    pub(super) fn parent_of(&self, tree: u64, id: NodeId) -> Result<Option<NodeId>> {
        if let Some(current) = self.overlay.as_ref().and_then(|o| o.current(id)) {
            return Ok(current.map(|record| record.parent));
        }
        match self.rows(tree).get(node_key(id))? {
            Some(guard) => Ok(Some(node_parent(guard.value())?)),
            None => Ok(None),
        }
    }

    /// Ends an undo/redo pass: writes the node and children rows of every
    /// node whose state differs from the stored one, and nothing for the
    /// nodes that ended where they started. A node whose meta now comes
    /// from another op gets that op's items in its children row, and the
    /// op that set its old meta gets its items back in its log row.
    pub(super) fn flush_overlay(&mut self) -> Result<()> {
        let overlay = self.overlay.take().expect("an undo/redo pass is running");
        let tree = overlay.tree;
        for (id, change) in overlay.into_changes() {
            if change.stored == change.current {
                continue;
            }
            // A node's state is its meta's op's (parent and meta): an
            // unchanged op would be an unchanged state.
            assert!(
                change.stored.as_ref().map(|n| n.time) != change.current.as_ref().map(|n| n.time),
                "tree {tree}: node {id} changed state under one op"
            );
            if let Some(stored) = &change.stored {
                let items = self.remove_child_entry(tree, id, stored)?;
                let items = items.expect("outside a pass the row is read");
                self.items_back_to_log(tree, stored.time, &items)?;
            }
            match &change.current {
                Some(now) => {
                    rows_mut!(self, tree).insert(node_key(id), encode_node(now).as_slice())?;
                    let items = self.items_from_log(tree, now.time)?;
                    let entry = ChildEntry {
                        time: now.time,
                        internal: now.internal,
                        name_key: &now.name_key,
                        items: &[],
                    };
                    self.insert_child_entry(tree, now.parent, id, entry, &items)?;
                }
                None => {
                    let removed = rows_mut!(self, tree).remove(node_key(id))?.is_some();
                    assert!(removed, "tree {tree}: node {id} vanished during a pass");
                }
            }
        }
        Ok(())
    }

    /// The op at `ts` no longer sets its child's meta: its log row, which
    /// left its items to the child, holds `items` again.
    fn items_back_to_log(&mut self, tree: u64, ts: Timestamp, items: &[KeyValue]) -> Result<()> {
        let rows = rows_mut!(self, tree);
        let bytes = read::log_row(&*rows, tree, ts)?.value().to_vec();
        assert!(
            LogView::parse(&bytes)?.at_node(),
            "tree {tree}: op {ts} held its items while it set its node's meta"
        );
        rows.insert(log_key(ts), log_items_back(&bytes, items)?.as_slice())?;
        Ok(())
    }

    /// The op at `ts` now sets its child's meta: its items leave its log
    /// row for the child's children row; returns them.
    fn items_from_log(&mut self, tree: u64, ts: Timestamp) -> Result<Vec<KeyValue>> {
        let rows = rows_mut!(self, tree);
        let bytes = read::log_row(&*rows, tree, ts)?.value().to_vec();
        let items = decode_log(&bytes)?.body.items;
        rows.insert(log_key(ts), log_items_to_node(&bytes)?.as_slice())?;
        Ok(items)
    }

    /// True when `ancestor` is `node` or one of its ancestors. The walk is
    /// bounded by the node count: a longer walk means a cycle.
    pub(super) fn is_ancestor_or_self(
        &self,
        rec: &TreeRecord,
        ancestor: NodeId,
        node: NodeId,
    ) -> Result<bool> {
        let mut current = node;
        let mut steps = 0u64;
        loop {
            if current == ancestor {
                return Ok(true);
            }
            let Some(parent) = self.parent_of(rec.number, current)? else {
                return Ok(false);
            };
            current = parent;
            steps += 1;
            assert!(
                steps <= rec.node_count,
                "tree {}: cycle above node {node}",
                rec.number
            );
        }
    }

    /// Adds the children-index row of `id` under `parent`, holding the
    /// node's meta `items`. Nothing inside a pass (its end writes it).
    pub(super) fn insert_child_entry(
        &mut self,
        tree: u64,
        parent: NodeId,
        id: NodeId,
        entry: ChildEntry<'_>,
        items: &[KeyValue],
    ) -> Result<()> {
        if self.overlay.is_some() {
            // Written by `flush_overlay` from the node's final state.
            return Ok(());
        }
        assert!(name_key_valid(entry.name_key), "writing a broken name key");
        encode_child_value(&mut self.scratch.child, entry.time, entry.internal, items);
        let fresh = self
            .children
            .insert(
                child_key(tree, parent, entry.name_key, id),
                self.scratch.child.as_slice(),
            )?
            .is_none();
        assert!(fresh, "tree {tree}: node {id} indexed twice");
        if entry.internal {
            self.dirs.forget(tree, parent, name_hash(entry.name_key));
        }
        Ok(())
    }

    /// Drops the children-index row of `node` (its current state) and
    /// returns the meta items it held; nothing inside a pass (`None`).
    pub(super) fn remove_child_entry(
        &mut self,
        tree: u64,
        id: NodeId,
        node: &NodeRecord,
    ) -> Result<Option<Vec<KeyValue>>> {
        if self.overlay.is_some() {
            return Ok(None);
        }
        let key = child_key(tree, node.parent, &node.name_key, id);
        let removed = self.children.remove(key)?;
        let Some(removed) = removed else {
            panic!("tree {tree}: node {id} missing from the children index");
        };
        let entry = decode_child(key, removed.value())?;
        assert_eq!(
            entry.time, node.time,
            "tree {tree}: node {id}'s children row holds another meta"
        );
        let items = child_items(&entry)?;
        drop(removed);
        // Planted bug: the cached lookup of a directory moved away stays.
        if node.internal && !canary::active(Canary::DirCacheKeptOnMove) {
            self.dirs
                .forget(tree, node.parent, name_hash(&node.name_key));
        }
        Ok(Some(items))
    }
}
