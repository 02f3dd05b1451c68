//! The write path: one `Writer` per batch owns the open tables of the
//! batch's write transaction and runs undo/do/redo on them.

use super::dir_cache::DirCache;
use super::overlay::Overlay;
use super::read;
use super::records::*;
use super::tree_numbers::TreeNumbers;
use super::{check, InvariantCheck, WriteOp, WriteOutcome};
use crate::canary::{self, Canary};
use crate::error::{Error, Result};
use crate::types::*;
use redb::{ReadableTable, Table, WriteTransaction};
use std::collections::{BTreeMap, BTreeSet};

/// A tree as loaded in this batch: its stored record (None if new) and the
/// record as the batch changed it.
struct TreeState {
    stored: Option<TreeRecord>,
    current: TreeRecord,
}

/// A replicated op of the batch waiting to be applied.
pub(super) struct Incoming<'a> {
    pub index: usize,
    pub op: &'a Move,
}

pub(super) struct Writer<'txn, 'c> {
    txn: &'txn WriteTransaction,
    /// Opened on first need: a batch on known trees finds their numbers
    /// in `numbers`.
    trees: Option<Table<'txn, &'static [u8], u64>>,
    numbers: &'c TreeNumbers,
    /// Every per-tree row (see `ROWS`).
    rows: Table<'txn, RowKey, &'static [u8]>,
    states: BTreeMap<TreeKey, TreeState>,
    replica_id: ReplicaId,
    changed: bool,
    /// The forest's directory lookups; kept exact by forgetting an entry
    /// whenever an internal row under its `(tree, parent, name)` changes.
    dirs: &'c mut DirCache,
    scratch: Scratch,
    /// Heights given out in this batch, written to `ROWS` by `finish`.
    height_runs: Vec<HeightRun>,
    /// Node states of an undo/redo pass, while one runs: node and
    /// children rows are then written once, at its end.
    overlay: Option<Overlay>,
}

/// Consecutive heights of one tree given out in this batch.
struct HeightRun {
    tree: u64,
    first: u64,
    /// Encoded timestamps, one per height (see `RowKind::Height`).
    stamps: Vec<u8>,
}

/// Encoding buffers reused by every op of the batch.
#[derive(Default)]
struct Scratch {
    log: Vec<u8>,
    node: Vec<u8>,
    child: Vec<u8>,
    name: Vec<u8>,
}

/// Consistency assertions on undo hold unless a planted bug that breaks
/// undo information on purpose is switched on.
fn strict() -> bool {
    !canary::active(Canary::StaleUndoOnRedo) && !canary::active(Canary::OldOpWrongPosition)
}

impl<'txn, 'c> Writer<'txn, 'c> {
    pub fn open(
        txn: &'txn WriteTransaction,
        replica_id: ReplicaId,
        dirs: &'c mut DirCache,
        numbers: &'c TreeNumbers,
    ) -> Result<Self> {
        Ok(Self {
            txn,
            trees: None,
            numbers,
            rows: txn.open_table(ROWS)?,
            states: BTreeMap::new(),
            replica_id,
            changed: false,
            dirs,
            scratch: Scratch::default(),
            height_runs: Vec::new(),
            overlay: None,
        })
    }

    /// Writes back the height runs and the changed tree records; true
    /// when the batch changed anything (otherwise the transaction need not
    /// be committed). The tables stay open: `check` can look at the batch's result
    /// before it commits.
    pub fn flush(&mut self) -> Result<bool> {
        for run in std::mem::take(&mut self.height_runs) {
            let previous = self
                .rows
                .insert(height_key(run.tree, run.first), run.stamps.as_slice())?;
            assert!(
                previous.is_none(),
                "tree {}: height {} given twice",
                run.tree,
                run.first
            );
        }
        let states = std::mem::take(&mut self.states);
        for (key, state) in states {
            if state.stored == Some(state.current) {
                continue;
            }
            let number = state.current.number;
            if state.stored.is_none() {
                self.trees()?
                    .insert(tree_key_bytes(&key).as_slice(), number)?;
            }
            self.rows
                .insert(state_key(number), encode_tree(&state.current).as_slice())?;
            self.changed = true;
        }
        Ok(self.changed)
    }

    /// Runs an invariant check on a tree as this batch leaves it (call
    /// after `flush`). Outer error: storage; inner: the broken invariant.
    pub fn check(&mut self, key: &TreeKey, check: &InvariantCheck) -> Result<Result<(), String>> {
        let Some(rec) = self.flushed_tree(key)? else {
            return Ok(Err(Error::TreeNotFound.to_string()));
        };
        match check {
            InvariantCheck::Whole => check::check_tree_in(&self.rows, &rec),
            InvariantCheck::Touched(nodes) => check::check_touched_in(&self.rows, &rec, nodes),
        }
    }

    /// The record of a tree as this batch leaves it (after `flush`). Unlike
    /// `stored_tree` it learns no number: a tree this batch created is not
    /// committed yet, and may never be.
    fn flushed_tree(&mut self, key: &TreeKey) -> Result<Option<TreeRecord>> {
        Ok(self.find_tree(key)?.map(|(record, _)| record))
    }

    /// A tree's record in this transaction, and whether its number came
    /// from the trees table (true) rather than a remembered hint.
    fn find_tree(&mut self, key: &TreeKey) -> Result<Option<(TreeRecord, bool)>> {
        if let (_, Some(number)) = self.numbers.hint(key) {
            if let Some(record) = read::tree_state_if_present(&self.rows, number)? {
                return Ok(Some((record, false)));
            }
        }
        let number = self
            .trees()?
            .get(tree_key_bytes(key).as_slice())?
            .map(|guard| guard.value());
        let Some(number) = number else {
            return Ok(None);
        };
        Ok(Some((read::tree_state(&self.rows, number)?, true)))
    }

    /// The tree's record, created (with a fresh tree number) when `create`.
    fn load_tree(&mut self, key: &TreeKey, create: bool) -> Result<Option<TreeRecord>> {
        if let Some(state) = self.states.get(key) {
            return Ok(Some(state.current));
        }
        let stored = self.stored_tree(key)?;
        let current = match stored {
            Some(record) => record,
            None if create => self.new_tree_record()?,
            None => return Ok(None),
        };
        self.states
            .insert(key.clone(), TreeState { stored, current });
        Ok(Some(current))
    }

    fn trees(&mut self) -> Result<&mut Table<'txn, &'static [u8], u64>> {
        if self.trees.is_none() {
            self.trees = Some(self.txn.open_table(TREES)?);
        }
        Ok(self.trees.as_mut().expect("opened above"))
    }

    /// The stored record of a tree, if it exists. The epoch of `numbers`
    /// cannot change during a batch: a new one starts only under the
    /// directory lock, which the batch holds.
    fn stored_tree(&mut self, key: &TreeKey) -> Result<Option<TreeRecord>> {
        let epoch = self.numbers.epoch();
        let found = self.find_tree(key)?;
        if let Some((record, true)) = found {
            // Committed before this batch (trees it creates are never
            // looked up here), so right whether or not the batch commits.
            self.numbers.learn(epoch, key, record.number);
        }
        Ok(found.map(|(record, _)| record))
    }

    /// The counter table is opened only here: most batches create no tree,
    /// and a table a transaction opens costs it a lookup even unchanged.
    fn new_tree_record(&mut self) -> Result<TreeRecord> {
        let mut meta = self.txn.open_table(META)?;
        let number = meta.get(NEXT_TREE_NUMBER)?.map_or(1, |g| g.value());
        if number > TREE_NUMBER_MAX {
            return Err(Error::Storage("tree numbers exhausted".into()));
        }
        meta.insert(NEXT_TREE_NUMBER, number + 1)?;
        self.changed = true;
        Ok(TreeRecord {
            number,
            max_counter: 0,
            next_height: 0,
            node_count: 0,
            max_parent: 0,
        })
    }

    fn store_tree(&mut self, key: &TreeKey, record: TreeRecord) {
        let state = self.states.get_mut(key).expect("tree loaded in this batch");
        state.current = record;
    }

    /// Applies the replicated ops of one tree: known ones are recognised
    /// and skipped, the new ones are merged into the log with a single
    /// undo back to the oldest of them.
    pub fn apply_remote(
        &mut self,
        key: &TreeKey,
        ops: &[Incoming<'_>],
        results: &mut [Option<Result<WriteOutcome>>],
    ) -> Result<()> {
        let mut rec = self.load_tree(key, true)?.expect("created on demand");
        let mut fresh = self.filter_known(&rec, ops, results)?;
        if fresh.is_empty() {
            return Ok(());
        }
        if canary::active(Canary::OldOpWrongPosition) {
            fresh = self.apply_older_than_log_at_end(&mut rec, fresh, results)?;
        }
        if let Some(first) = fresh.first() {
            // Nothing stored is newer than an op whose counter is above the
            // tree's: an in-order stream undoes nothing and scans nothing.
            let newer = if timestamp_counter(first.op.ts()) > rec.max_counter {
                Vec::new()
            } else {
                self.logged_from(&rec, first.op.ts())?
            };
            if newer.is_empty() || (strict() && self.commute_with(&rec, &newer, &fresh)?) {
                for incoming in &fresh {
                    let op = incoming.op;
                    self.append(&mut rec, op.ts(), op.parent, op.child, &op.meta.items)?;
                }
            } else {
                self.overlay = Some(Overlay::new(rec.number));
                for (op_ts, bytes) in newer.iter().rev() {
                    self.undo_op(&mut rec, *op_ts, &LogView::parse(bytes)?)?;
                }
                self.redo_merged(&mut rec, newer, &fresh)?;
                self.flush_overlay()?;
            }
        }
        for incoming in &fresh {
            results[incoming.index] = Some(Ok(WriteOutcome::Applied { fresh: true }));
        }
        self.store_tree(key, rec);
        Ok(())
    }

    /// Drops ops already in the log (or repeated in the batch) and returns
    /// the rest sorted by timestamp.
    fn filter_known<'a>(
        &self,
        rec: &TreeRecord,
        ops: &[Incoming<'a>],
        results: &mut [Option<Result<WriteOutcome>>],
    ) -> Result<Vec<Incoming<'a>>> {
        let mut fresh: Vec<Incoming<'a>> = Vec::with_capacity(ops.len());
        for incoming in ops {
            let op = incoming.op;
            // An op newer than every stored one cannot be stored: no lookup.
            let known = if timestamp_counter(op.ts()) > rec.max_counter {
                None
            } else {
                match self.rows.get(log_key(rec.number, op.ts()))? {
                    Some(guard) => Some(LogView::parse(guard.value())?.same_op(
                        op.parent,
                        op.child,
                        &op.meta.items,
                    )),
                    None => None,
                }
            };
            match known {
                Some(same) => results[incoming.index] = Some(known_outcome(same, op.ts())),
                None => fresh.push(Incoming { ..*incoming }),
            }
        }
        // Stable: of two requests with one timestamp the first one wins.
        fresh.sort_by_key(|i| i.op.ts());
        let mut unique: Vec<Incoming<'a>> = Vec::with_capacity(fresh.len());
        for incoming in fresh {
            match unique.last() {
                Some(last) if last.op.ts() == incoming.op.ts() => {
                    let same = last.op == incoming.op;
                    results[incoming.index] = Some(known_outcome(same, incoming.op.ts()));
                }
                _ => unique.push(incoming),
            }
        }
        assert!(
            unique.windows(2).all(|w| w[0].op.ts() < w[1].op.ts()),
            "batch not sorted by timestamp"
        );
        Ok(unique)
    }

    /// Every logged op from `ts` on (encoded), oldest first.
    fn logged_from(&self, rec: &TreeRecord, ts: Timestamp) -> Result<Vec<(Timestamp, Vec<u8>)>> {
        let tree = rec.number;
        let mut newer = Vec::new();
        // Node rows share the range; they are passed over.
        for row in self
            .rows
            .range(log_key(tree, ts)..=log_key(tree, u64::MAX))?
        {
            let (key, value) = row?;
            match key_kind(key.value()) {
                Some(RowKind::Log) => newer.push((key.value().1, value.value().to_vec())),
                Some(_) => {}
                None => return Err(Error::Malformed(format!("tree {tree}: row key of no kind"))),
            }
        }
        Ok(newer)
    }

    /// True when undoing `newer`, doing `fresh` and redoing `newer` (the
    /// CRDT's order) ends in exactly the state, undo records and heights
    /// that doing `fresh` on top of the current state gives, so the undo
    /// and redo can be skipped. That holds when the fresh ops only move
    /// nodes `D` this tree has never stored, that have no children here,
    /// and that no op of `newer` names (as child, parent or undo parent):
    /// then no node outside `D` ever hangs under a node of `D`, so the
    /// fresh ops cannot change any cycle check or undo record of `newer`
    /// and vice versa; each pair commutes, and the fresh ops keep their
    /// relative order (and so their heights). Pushed creations of new
    /// nodes, the common case, pass.
    fn commute_with(
        &self,
        rec: &TreeRecord,
        newer: &[(Timestamp, Vec<u8>)],
        fresh: &[Incoming<'_>],
    ) -> Result<bool> {
        let moved: BTreeSet<NodeId> = fresh.iter().map(|i| i.op.child).collect();
        for &node in &moved {
            if self.rows.get(node_key(rec.number, node))?.is_some() {
                return Ok(false);
            }
            if node <= rec.max_parent && self.has_children(rec.number, node)? {
                return Ok(false);
            }
        }
        for (_, bytes) in newer {
            let op = LogView::parse(bytes)?;
            let undo_parent = match op.tail.undo {
                Undo::Moved { old_parent, .. } => Some(old_parent),
                Undo::Created | Undo::NoEffect => None,
            };
            let names_moved = moved.contains(&op.child)
                || moved.contains(&op.parent)
                || undo_parent.is_some_and(|p| moved.contains(&p));
            if names_moved {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Redoes the undone ops and does the new ones, in timestamp order.
    fn redo_merged(
        &mut self,
        rec: &mut TreeRecord,
        undone: Vec<(Timestamp, Vec<u8>)>,
        fresh: &[Incoming<'_>],
    ) -> Result<()> {
        let mut old = undone.into_iter().peekable();
        let mut new = fresh.iter().peekable();
        loop {
            let take_old = match (old.peek(), new.peek()) {
                (Some(o), Some(n)) => o.0 < n.op.ts(),
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => return Ok(()),
            };
            if take_old {
                let (ts, bytes) = old.next().expect("peeked");
                self.redo_op(rec, ts, bytes)?;
            } else {
                let op = new.next().expect("peeked").op;
                self.append(rec, op.ts(), op.parent, op.child, &op.meta.items)?;
            }
        }
    }

    /// Re-evaluates an undone op; its undo information is recomputed (the
    /// state it was computed against may have changed) and it keeps its
    /// height.
    fn redo_op(&mut self, rec: &mut TreeRecord, ts: Timestamp, mut bytes: Vec<u8>) -> Result<()> {
        let view = LogView::parse(&bytes)?;
        let (parent, child, stored) = (view.parent, view.child, view.tail);
        let mut name = std::mem::take(&mut self.scratch.name);
        view.name_key_into(&mut name);
        let undo = self.do_op(rec, ts, parent, child, view.is_internal(), &name);
        self.scratch.name = name;
        let mut undo = undo?;
        if canary::active(Canary::StaleUndoOnRedo) {
            undo = stored.undo;
        }
        if undo != stored.undo {
            let tail = LogTail {
                height: stored.height,
                undo,
            };
            set_log_tail(&mut bytes, tail);
            self.rows
                .insert(log_key(rec.number, ts), bytes.as_slice())?;
        }
        Ok(())
    }

    /// Planted bug: ops older than the whole log are done on top of the
    /// current state instead of before every logged op.
    fn apply_older_than_log_at_end<'a>(
        &mut self,
        rec: &mut TreeRecord,
        fresh: Vec<Incoming<'a>>,
        results: &mut [Option<Result<WriteOutcome>>],
    ) -> Result<Vec<Incoming<'a>>> {
        let tree = rec.number;
        let oldest = match read::rows_of_kind(&self.rows, tree, RowKind::Log)?.next() {
            Some(row) => row?.0,
            None => return Ok(fresh),
        };
        let (older, rest): (Vec<_>, Vec<_>) = fresh.into_iter().partition(|i| i.op.ts() < oldest);
        for incoming in &older {
            let op = incoming.op;
            self.append(rec, op.ts(), op.parent, op.child, &op.meta.items)?;
            results[incoming.index] = Some(Ok(WriteOutcome::Applied { fresh: true }));
        }
        Ok(rest)
    }

    /// Does a new op and stores it with the tree's next height.
    fn append(
        &mut self,
        rec: &mut TreeRecord,
        ts: Timestamp,
        parent: NodeId,
        child: NodeId,
        items: &[KeyValue],
    ) -> Result<()> {
        let mut name = std::mem::take(&mut self.scratch.name);
        name_key_from_items(items, &mut name);
        let undo = self.do_op(rec, ts, parent, child, is_internal(items), &name);
        self.scratch.name = name;
        let tail = LogTail {
            height: rec.next_height,
            undo: undo?,
        };
        encode_log_into(&mut self.scratch.log, parent, child, items, tail);
        let stored_before = self
            .rows
            .insert(log_key(rec.number, ts), self.scratch.log.as_slice())?
            .is_some();
        assert!(!stored_before, "timestamp {ts} stored twice");
        self.record_height(rec.number, rec.next_height, ts);
        rec.next_height += 1;
        rec.max_counter = rec.max_counter.max(timestamp_counter(ts));
        if parent != TRASH {
            rec.max_parent = rec.max_parent.max(parent);
        }
        self.changed = true;
        Ok(())
    }

    /// Remembers that `ts` is stored at `height`: extends the current run
    /// when the height follows it, else starts a new one.
    fn record_height(&mut self, tree: u64, height: u64, ts: Timestamp) {
        let extends = self.height_runs.last().is_some_and(|run| {
            let len = run.stamps.len() / 8;
            run.tree == tree && run.first + len as u64 == height && len < HEIGHT_RUN_MAX
        });
        if !extends {
            self.height_runs.push(HeightRun {
                tree,
                first: height,
                stamps: Vec::with_capacity(8 * 128),
            });
        }
        let run = self.height_runs.last_mut().expect("pushed above");
        run.stamps.extend_from_slice(&ts.to_be_bytes());
    }

    /// The "do" step: moves `child` under `parent` with the op's meta
    /// (`internal`, `name_key`) unless that would make a cycle. Returns how
    /// to undo it.
    fn do_op(
        &mut self,
        rec: &mut TreeRecord,
        ts: Timestamp,
        parent: NodeId,
        child: NodeId,
        internal: bool,
        name_key: &[u8],
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
        // A child that was not stored and has no children cannot be above
        // `parent`: skip the ancestor walk.
        let may_be_above =
            old.is_some() || (child <= rec.max_parent && self.may_have_children(tree, child)?);
        if may_be_above && self.is_ancestor_or_self(rec, child, parent)? {
            self.restore_node(tree, child, old.as_ref())?;
            return Ok(Undo::NoEffect);
        }
        let undo = match old {
            Some(old) => {
                self.remove_child_entry(tree, child, &old)?;
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
        };
        self.insert_child_entry(tree, parent, child, entry)?;
        Ok(undo)
    }

    /// Puts back the row `do_op` overwrote for an op that turned out to be
    /// a no-op.
    fn restore_node(&mut self, tree: u64, id: NodeId, old: Option<&NodeRecord>) -> Result<()> {
        if self.overlay.is_some() {
            self.overlay_set(tree, id, old.cloned())?;
            return Ok(());
        }
        match old {
            Some(old) => {
                self.rows
                    .insert(node_key(tree, id), encode_node(old).as_slice())?;
            }
            None => {
                self.rows.remove(node_key(tree, id))?;
            }
        }
        Ok(())
    }

    /// Reverts one op, given that every newer op is already undone.
    fn undo_op(&mut self, rec: &mut TreeRecord, ts: Timestamp, op: &LogView<'_>) -> Result<()> {
        let tree = rec.number;
        let child = op.child;
        let mut restored_internal = false;
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
                let (current, internal) = self.restore_moved(tree, child, old_parent, old_ts)?;
                restored_internal = internal;
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
        if let Some(current) = &current {
            self.remove_child_entry(tree, child, current)?;
        }
        if let Undo::Moved { old_parent, old_ts } = op.tail.undo {
            let name = std::mem::take(&mut self.scratch.name);
            let entry = ChildEntry {
                time: old_ts,
                internal: restored_internal,
                name_key: &name,
            };
            let inserted = self.insert_child_entry(tree, old_parent, child, entry);
            self.scratch.name = name;
            inserted?;
        }
        Ok(())
    }

    /// Writes back the node state an op replaced (its meta is that of the
    /// op at `old_ts`); returns the state it overwrote and whether the
    /// restored node is internal, and leaves its name key in
    /// `scratch.name` for the children index.
    fn restore_moved(
        &mut self,
        tree: u64,
        child: NodeId,
        old_parent: NodeId,
        old_ts: Timestamp,
    ) -> Result<(Option<NodeRecord>, bool)> {
        let internal = {
            let guard = self.rows.get(log_key(tree, old_ts))?;
            let guard =
                guard.unwrap_or_else(|| panic!("tree {tree}: log entry {old_ts} is missing"));
            let old_op = LogView::parse(guard.value())?;
            old_op.name_key_into(&mut self.scratch.name);
            old_op.is_internal()
        };
        let name = std::mem::take(&mut self.scratch.name);
        let current = self.put_node(tree, child, old_parent, old_ts, internal, &name);
        self.scratch.name = name;
        Ok((current?, internal))
    }

    fn has_children(&self, tree: u64, node: NodeId) -> Result<bool> {
        let mut range = self.rows.range(children_range(tree, node))?;
        Ok(range.next().transpose()?.is_some())
    }

    /// False only when `node` has no children. During an undo/redo pass
    /// the stored children rows are stale, so a stored child that has
    /// moved away still counts: a wrong "yes" costs an ancestor walk, a
    /// wrong "no" would skip a needed one.
    fn may_have_children(&self, tree: u64, node: NodeId) -> Result<bool> {
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
    /// the overlay during an undo/redo pass, else into `ROWS` (one descent
    /// reads the old row and writes the new one).
    fn put_node(
        &mut self,
        tree: u64,
        id: NodeId,
        parent: NodeId,
        time: Timestamp,
        internal: bool,
        name_key: &[u8],
    ) -> Result<Option<NodeRecord>> {
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
        match self
            .rows
            .insert(node_key(tree, id), self.scratch.node.as_slice())?
        {
            Some(guard) => Ok(Some(decode_node(guard.value())?)),
            None => Ok(None),
        }
    }

    /// Deletes a node's state; returns the state it had.
    fn remove_node(&mut self, tree: u64, id: NodeId) -> Result<Option<NodeRecord>> {
        if self.overlay.is_some() {
            return self.overlay_set(tree, id, None);
        }
        match self.rows.remove(node_key(tree, id))? {
            Some(guard) => Ok(Some(decode_node(guard.value())?)),
            None => Ok(None),
        }
    }

    /// Sets a node's state in the overlay, reading its stored state on
    /// first touch; returns the state it replaces.
    fn overlay_set(
        &mut self,
        tree: u64,
        id: NodeId,
        state: Option<NodeRecord>,
    ) -> Result<Option<NodeRecord>> {
        let overlay = self.overlay.as_ref().expect("an undo/redo pass is running");
        assert_eq!(overlay.tree, tree, "overlay of another tree");
        if !overlay.contains(id) {
            let stored = read::node_record(&self.rows, tree, id)?;
            self.overlay
                .as_mut()
                .expect("checked above")
                .start(id, stored);
        }
        Ok(self.overlay.as_mut().expect("checked above").set(id, state))
    }

    /// The parent of a node now, `None` if it does not exist.
    fn parent_of(&self, tree: u64, id: NodeId) -> Result<Option<NodeId>> {
        if let Some(current) = self.overlay.as_ref().and_then(|o| o.current(id)) {
            return Ok(current.map(|record| record.parent));
        }
        match self.rows.get(node_key(tree, id))? {
            Some(guard) => Ok(Some(node_parent(guard.value())?)),
            None => Ok(None),
        }
    }

    /// Ends an undo/redo pass: writes the node and children rows of every
    /// node whose state differs from the stored one, and nothing for the
    /// nodes that ended where they started.
    fn flush_overlay(&mut self) -> Result<()> {
        let overlay = self.overlay.take().expect("an undo/redo pass is running");
        let tree = overlay.tree;
        for (id, change) in overlay.into_changes() {
            if change.stored == change.current {
                continue;
            }
            if let Some(stored) = &change.stored {
                self.remove_child_entry(tree, id, stored)?;
            }
            match &change.current {
                Some(now) => {
                    self.rows
                        .insert(node_key(tree, id), encode_node(now).as_slice())?;
                    let entry = ChildEntry {
                        time: now.time,
                        internal: now.internal,
                        name_key: &now.name_key,
                    };
                    self.insert_child_entry(tree, now.parent, id, entry)?;
                }
                None => {
                    let removed = self.rows.remove(node_key(tree, id))?.is_some();
                    assert!(removed, "tree {tree}: node {id} vanished during a pass");
                }
            }
        }
        Ok(())
    }

    /// True when `ancestor` is `node` or one of its ancestors. The walk is
    /// bounded by the node count: a longer walk means a cycle.
    fn is_ancestor_or_self(
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

    /// Adds the children-index row of `id` under `parent`.
    fn insert_child_entry(
        &mut self,
        tree: u64,
        parent: NodeId,
        id: NodeId,
        entry: ChildEntry<'_>,
    ) -> Result<()> {
        if self.overlay.is_some() {
            // Written by `flush_overlay` from the node's final state.
            return Ok(());
        }
        encode_child_into(&mut self.scratch.child, entry);
        let hash = name_hash(entry.name_key);
        let fresh = self
            .rows
            .insert(
                child_key(tree, parent, hash, id),
                self.scratch.child.as_slice(),
            )?
            .is_none();
        assert!(fresh, "tree {tree}: node {id} indexed twice");
        if entry.internal {
            self.dirs.forget(tree, parent, hash);
        }
        Ok(())
    }

    /// Drops the children-index row of `node` (its current state).
    fn remove_child_entry(&mut self, tree: u64, id: NodeId, node: &NodeRecord) -> Result<()> {
        if self.overlay.is_some() {
            return Ok(());
        }
        let hash = name_hash(&node.name_key);
        let removed = self
            .rows
            .remove(child_key(tree, node.parent, hash, id))?
            .is_some();
        assert!(
            removed,
            "tree {tree}: node {id} missing from the children index"
        );
        if node.internal {
            self.dirs.forget(tree, node.parent, hash);
        }
        Ok(())
    }

    /// Path resolution through the forest's directory cache: the
    /// directories of a workload are few and shared by many calls.
    fn resolve_dirs(&mut self, tree: u64, dirs: &[String]) -> Result<(NodeId, usize)> {
        let mut current = ROOT;
        for (i, component) in dirs.iter().enumerate() {
            let name = component_key(component);
            let found = match self.dirs.get(tree, current, &name) {
                Some(found) => found,
                None => {
                    let found = read::find_dir(&self.rows, tree, current, &name)?;
                    self.dirs.put(tree, current, &name, found);
                    found
                }
            };
            match found {
                Some(next) => current = next,
                None => return Ok((current, i)),
            }
        }
        Ok((current, dirs.len()))
    }

    /// A local op: it takes timestamps newer than everything in the tree.
    /// The outer error fails the batch; the inner one is this request's.
    pub fn apply_local(&mut self, key: &TreeKey, op: &WriteOp) -> Result<Result<WriteOutcome>> {
        let create = !matches!(op, WriteOp::Remove { .. });
        let Some(mut rec) = self.load_tree(key, create)? else {
            return Ok(Err(Error::TreeNotFound));
        };
        let outcome = match op {
            WriteOp::Move {
                parent,
                child,
                items,
            } => self.local_move(&mut rec, *parent, *child, items)?,
            WriteOp::AddByPath { path, items, .. } => {
                self.local_add_by_path(&mut rec, path, items)?
            }
            WriteOp::Remove { node } => self.local_remove(&mut rec, *node)?,
            WriteOp::Apply { .. } => unreachable!("replicated ops are applied per tree"),
        };
        self.store_tree(key, rec);
        Ok(outcome)
    }

    /// Reserves `count` consecutive local timestamps, oldest first.
    fn reserve_timestamps(
        &self,
        rec: &mut TreeRecord,
        count: u64,
    ) -> Result<Vec<Timestamp>, Error> {
        if rec.max_counter + count > COUNTER_MAX {
            return Err(Error::InvalidOp("timestamp counter space exhausted".into()));
        }
        let first = rec.max_counter + 1;
        Ok((first..first + count)
            .map(|counter| make_timestamp(counter, self.replica_id))
            .collect())
    }

    fn local_move(
        &mut self,
        rec: &mut TreeRecord,
        parent: NodeId,
        child: Option<NodeId>,
        items: &[KeyValue],
    ) -> Result<Result<WriteOutcome>> {
        let ts = match self.reserve_timestamps(rec, 1) {
            Ok(ts) => ts[0],
            Err(e) => return Ok(Err(e)),
        };
        let node = child.unwrap_or(ts);
        self.append(rec, ts, parent, node, items)?;
        Ok(Ok(WriteOutcome::Moved { node, ts }))
    }

    fn local_remove(&mut self, rec: &mut TreeRecord, node: NodeId) -> Result<Result<WriteOutcome>> {
        let Some(current) = read::node_record(&self.rows, rec.number, node)? else {
            return Ok(Err(Error::NodeNotFound(node)));
        };
        let items = read::log_record(&self.rows, rec.number, current.time)?
            .body
            .items;
        self.local_move(rec, TRASH, Some(node), &items)
    }

    fn local_add_by_path(
        &mut self,
        rec: &mut TreeRecord,
        path: &[String],
        items: &[KeyValue],
    ) -> Result<Result<WriteOutcome>> {
        let (mut parent, found) = self.resolve_dirs(rec.number, path)?;
        let missing = &path[found..];
        let stamps = match self.reserve_timestamps(rec, missing.len() as u64 + 1) {
            Ok(stamps) => stamps,
            Err(e) => return Ok(Err(e)),
        };
        let mut created = Vec::with_capacity(missing.len());
        for (component, &ts) in missing.iter().zip(&stamps) {
            let dir = [KeyValue::new(ATTR_FILE_NAME, component.as_bytes())];
            let nodes_before = rec.node_count;
            self.append(rec, ts, parent, ts, &dir)?;
            if created.is_empty() && rec.node_count > nodes_before {
                // The lookup just found no such directory and this op made
                // the only one: the next call need not scan for it.
                self.dirs
                    .put(rec.number, parent, &component_key(component), Some(ts));
            }
            created.push(ts);
            parent = ts;
        }
        let leaf = *stamps.last().expect("at least the leaf");
        self.append(rec, leaf, parent, leaf, items)?;
        Ok(Ok(WriteOutcome::AddedByPath {
            leaf,
            created,
            ts: leaf,
        }))
    }
}

fn known_outcome(same: bool, ts: Timestamp) -> Result<WriteOutcome> {
    if same {
        Ok(WriteOutcome::Applied { fresh: false })
    } else {
        Err(Error::InvalidOp(format!(
            "timestamp {ts} is already used by a different op"
        )))
    }
}
