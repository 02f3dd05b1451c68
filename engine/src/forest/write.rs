//! The write path: one `Writer` per batch owns the open tables of the
//! batch's write transaction and runs undo/do/redo on them.

use super::read;
use super::records::*;
use super::{WriteOp, WriteOutcome};
use crate::canary::{self, Canary};
use crate::error::{Error, Result};
use crate::types::*;
use redb::{ReadableTable, Table, WriteTransaction};
use std::collections::BTreeMap;

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

pub(super) struct Writer<'txn> {
    trees: Table<'txn, &'static [u8], &'static [u8]>,
    meta: Table<'txn, &'static str, u64>,
    log: Table<'txn, (u64, u64), &'static [u8]>,
    heights: Table<'txn, (u64, u64), u64>,
    nodes: Table<'txn, (u64, u64), &'static [u8]>,
    children: Table<'txn, ChildKey, (u64, bool)>,
    states: BTreeMap<TreeKey, TreeState>,
    replica_id: ReplicaId,
    changed: bool,
    /// Directory lookups of this batch: `dir_cache_key` -> the directory
    /// (or its absence). Invalidated whenever an internal row under that
    /// key changes.
    dir_cache: BTreeMap<Vec<u8>, Option<NodeId>>,
}

/// Consistency assertions on undo hold unless a planted bug that breaks
/// undo information on purpose is switched on.
fn strict() -> bool {
    !canary::active(Canary::StaleUndoOnRedo) && !canary::active(Canary::OldOpWrongPosition)
}

impl<'txn> Writer<'txn> {
    pub fn open(txn: &'txn WriteTransaction, replica_id: ReplicaId) -> Result<Self> {
        Ok(Self {
            trees: txn.open_table(TREES)?,
            meta: txn.open_table(META)?,
            log: txn.open_table(LOG)?,
            heights: txn.open_table(HEIGHTS)?,
            nodes: txn.open_table(NODES)?,
            children: txn.open_table(CHILDREN)?,
            states: BTreeMap::new(),
            replica_id,
            changed: false,
            dir_cache: BTreeMap::new(),
        })
    }

    /// Writes back the changed tree records; true when the batch changed
    /// anything (otherwise the transaction need not be committed).
    pub fn finish(mut self) -> Result<bool> {
        let states = std::mem::take(&mut self.states);
        for (key, state) in states {
            if state.stored != Some(state.current) {
                let key_bytes = tree_key_bytes(&key);
                self.trees
                    .insert(key_bytes.as_slice(), encode_tree(&state.current).as_slice())?;
                self.changed = true;
            }
        }
        Ok(self.changed)
    }

    /// The tree's record, created (with a fresh tree number) when `create`.
    fn load_tree(&mut self, key: &TreeKey, create: bool) -> Result<Option<TreeRecord>> {
        if let Some(state) = self.states.get(key) {
            return Ok(Some(state.current));
        }
        let stored = match self.trees.get(tree_key_bytes(key).as_slice())? {
            Some(guard) => Some(decode_tree(guard.value())?),
            None => None,
        };
        let current = match stored {
            Some(record) => record,
            None if create => self.new_tree_record()?,
            None => return Ok(None),
        };
        self.states
            .insert(key.clone(), TreeState { stored, current });
        Ok(Some(current))
    }

    fn new_tree_record(&mut self) -> Result<TreeRecord> {
        let number = self.meta.get(NEXT_TREE_NUMBER)?.map_or(1, |g| g.value());
        self.meta.insert(NEXT_TREE_NUMBER, number + 1)?;
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
        let mut fresh = self.filter_known(rec.number, ops, results)?;
        if fresh.is_empty() {
            return Ok(());
        }
        if canary::active(Canary::OldOpWrongPosition) {
            fresh = self.apply_older_than_log_at_end(&mut rec, fresh, results)?;
        }
        if let Some(first) = fresh.first() {
            let undone = self.undo_after(&mut rec, first.op.ts())?;
            self.redo_merged(&mut rec, undone, &fresh)?;
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
        tree: u64,
        ops: &[Incoming<'a>],
        results: &mut [Option<Result<WriteOutcome>>],
    ) -> Result<Vec<Incoming<'a>>> {
        let mut fresh: Vec<Incoming<'a>> = Vec::with_capacity(ops.len());
        for incoming in ops {
            let op = incoming.op;
            let body = encode_op_body(op.parent, op.child, &op.meta.items);
            let stored = self.log.get((tree, op.ts()))?;
            let known = stored.map(|guard| guard.value().starts_with(&body));
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

    /// Undoes, newest first, every logged op newer than `ts`; returns them
    /// oldest first for the redo.
    fn undo_after(
        &mut self,
        rec: &mut TreeRecord,
        ts: Timestamp,
    ) -> Result<Vec<(Timestamp, LogRecord)>> {
        let tree = rec.number;
        let mut undone = Vec::new();
        for row in self.log.range((tree, ts)..=(tree, u64::MAX))? {
            let (key, value) = row?;
            undone.push((key.value().1, decode_log(value.value())?));
        }
        for (op_ts, record) in undone.iter().rev() {
            self.undo_op(rec, *op_ts, record)?;
        }
        Ok(undone)
    }

    /// Redoes the undone ops and does the new ones, in timestamp order.
    fn redo_merged(
        &mut self,
        rec: &mut TreeRecord,
        undone: Vec<(Timestamp, LogRecord)>,
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
                let (ts, record) = old.next().expect("peeked");
                self.redo_op(rec, ts, record)?;
            } else {
                let op = new.next().expect("peeked").op;
                self.append(rec, op.ts(), op.parent, op.child, &op.meta.items)?;
            }
        }
    }

    /// Re-evaluates an undone op; its undo information is recomputed (the
    /// state it was computed against may have changed) and it keeps its
    /// height.
    fn redo_op(&mut self, rec: &mut TreeRecord, ts: Timestamp, record: LogRecord) -> Result<()> {
        let body = &record.body;
        let mut undo = self.do_op(rec, ts, body.parent, body.child, &body.items)?;
        if canary::active(Canary::StaleUndoOnRedo) {
            undo = record.tail.undo;
        }
        if undo != record.tail.undo {
            let tail = LogTail {
                height: record.tail.height,
                undo,
            };
            let bytes = encode_log(body.parent, body.child, &body.items, tail);
            self.log.insert((rec.number, ts), bytes.as_slice())?;
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
        let oldest = match self.log.range((tree, 0)..=(tree, u64::MAX))?.next() {
            Some(row) => row?.0.value().1,
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
        let undo = self.do_op(rec, ts, parent, child, items)?;
        let tail = LogTail {
            height: rec.next_height,
            undo,
        };
        let bytes = encode_log(parent, child, items, tail);
        let previous = self.log.insert((rec.number, ts), bytes.as_slice())?;
        assert!(previous.is_none(), "timestamp {ts} stored twice");
        self.heights.insert((rec.number, rec.next_height), ts)?;
        rec.next_height += 1;
        rec.max_counter = rec.max_counter.max(timestamp_counter(ts));
        if parent != TRASH {
            rec.max_parent = rec.max_parent.max(parent);
        }
        self.changed = true;
        Ok(())
    }

    /// The "do" step: moves `child` under `parent` with the op's meta unless
    /// that would make a cycle. Returns how to undo it.
    fn do_op(
        &mut self,
        rec: &mut TreeRecord,
        ts: Timestamp,
        parent: NodeId,
        child: NodeId,
        items: &[KeyValue],
    ) -> Result<Undo> {
        let existing = read::node_record(&self.nodes, rec.number, child)?;
        // A child that is not stored and has no children cannot be above
        // `parent` (unless it is `parent`): skip the ancestor walk.
        let may_be_above = existing.is_some()
            || (child <= rec.max_parent && self.has_children(rec.number, child)?);
        if child == parent || (may_be_above && self.is_ancestor_or_self(rec, child, parent)?) {
            return Ok(Undo::NoEffect);
        }
        let undo = match existing {
            Some(old) => {
                self.remove_child_entry(rec.number, child, &old)?;
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
        let node = NodeRecord {
            parent,
            time: ts,
            internal: is_internal(items),
            name_key: name_key(items),
        };
        self.put_node(rec.number, child, &node)?;
        Ok(undo)
    }

    /// Reverts one op, given that every newer op is already undone.
    fn undo_op(&mut self, rec: &mut TreeRecord, ts: Timestamp, record: &LogRecord) -> Result<()> {
        let tree = rec.number;
        let child = record.body.child;
        if record.tail.undo == Undo::NoEffect {
            return Ok(());
        }
        let current = read::node_record(&self.nodes, tree, child)?;
        if strict() {
            let matches = current
                .as_ref()
                .is_some_and(|n| n.parent == record.body.parent && n.time == ts);
            assert!(
                matches,
                "tree {tree}: undo of {ts} finds node {child} in another state"
            );
        }
        if let Some(current) = &current {
            self.remove_child_entry(tree, child, current)?;
        }
        match record.tail.undo {
            Undo::NoEffect => unreachable!("handled above"),
            Undo::Created => {
                if current.is_some() {
                    self.nodes.remove((tree, child))?;
                    rec.node_count -= 1;
                }
            }
            Undo::Moved { old_parent, old_ts } => {
                let old_items = read::log_record(&self.log, tree, old_ts)?.body.items;
                let node = NodeRecord {
                    parent: old_parent,
                    time: old_ts,
                    internal: is_internal(&old_items),
                    name_key: name_key(&old_items),
                };
                if current.is_none() {
                    rec.node_count += 1;
                }
                self.put_node(tree, child, &node)?;
            }
        }
        Ok(())
    }

    fn has_children(&self, tree: u64, node: NodeId) -> Result<bool> {
        let (lower, upper) = read::children_bounds(tree, node);
        let mut range = self
            .children
            .range::<ChildKey>((std::ops::Bound::Included(lower), upper))?;
        Ok(range.next().transpose()?.is_some())
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
            let Some(guard) = self.nodes.get((rec.number, current))? else {
                return Ok(false);
            };
            current = node_parent(guard.value())?;
            steps += 1;
            assert!(
                steps <= rec.node_count,
                "tree {}: cycle above node {node}",
                rec.number
            );
        }
    }

    fn put_node(&mut self, tree: u64, id: NodeId, node: &NodeRecord) -> Result<()> {
        self.nodes
            .insert((tree, id), encode_node(node).as_slice())?;
        let key = (tree, node.parent, node.name_key.as_slice(), id);
        let fresh = self
            .children
            .insert(key, (node.time, node.internal))?
            .is_none();
        assert!(fresh, "tree {tree}: node {id} indexed twice");
        if node.internal {
            self.forget_dir(tree, node.parent, &node.name_key);
        }
        Ok(())
    }

    /// Drops the cached directory lookup that a changed internal row of
    /// `(tree, parent, name)` may invalidate.
    fn forget_dir(&mut self, tree: u64, parent: NodeId, name_key: &[u8]) {
        if !self.dir_cache.is_empty() {
            self.dir_cache
                .remove(&dir_cache_key(tree, parent, name_key));
        }
    }

    /// `read::resolve_dirs` through the batch's directory cache: the ops of
    /// one batch mostly share their directories.
    fn resolve_dirs(&mut self, tree: u64, dirs: &[String]) -> Result<(NodeId, usize)> {
        let mut current = ROOT;
        for (i, component) in dirs.iter().enumerate() {
            let key = dir_cache_key(tree, current, &component_key(component));
            let found = match self.dir_cache.get(&key) {
                Some(found) => *found,
                None => {
                    let found =
                        read::find_dir(&self.children, &self.log, tree, current, component)?;
                    self.dir_cache.insert(key, found);
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

    /// Drops the children-index row of `node` (its current state).
    fn remove_child_entry(&mut self, tree: u64, id: NodeId, node: &NodeRecord) -> Result<()> {
        let key = (tree, node.parent, node.name_key.as_slice(), id);
        let removed = self.children.remove(key)?.is_some();
        assert!(
            removed,
            "tree {tree}: node {id} missing from the children index"
        );
        if node.internal {
            self.forget_dir(tree, node.parent, &node.name_key);
        }
        Ok(())
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
        let Some(current) = read::node_record(&self.nodes, rec.number, node)? else {
            return Ok(Err(Error::NodeNotFound(node)));
        };
        let items = read::log_record(&self.log, rec.number, current.time)?
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
            self.append(rec, ts, parent, ts, &dir)?;
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

/// `tree (8, BE) ++ parent (8, BE) ++ name key`.
fn dir_cache_key(tree: u64, parent: NodeId, name_key: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(16 + name_key.len());
    key.extend_from_slice(&tree.to_be_bytes());
    key.extend_from_slice(&parent.to_be_bytes());
    key.extend_from_slice(name_key);
    key
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
