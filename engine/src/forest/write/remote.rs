//! Replicated ops: known ones are recognised and skipped, new ones merged
//! into the log in timestamp order with one undo back to the oldest of them
//! (docs/design.md §2).

use super::super::overlay::Overlay;
use super::super::read;
use super::super::records::*;
use super::super::WriteOutcome;
use super::{rows_mut, strict, Incoming, Writer};
use crate::canary::{self, Canary};
use crate::error::{Error, Result};
use crate::probe::{self, Probe};
use crate::types::*;
use redb::ReadableTable;
use std::collections::BTreeSet;

impl Writer<'_, '_> {
    /// Applies the replicated ops of one tree: known ones are recognised
    /// and skipped, the new ones are merged into the log with a single
    /// undo back to the oldest of them.
    pub fn apply_remote(
        &mut self,
        key: &TreeKey,
        ops: &[Incoming<'_>],
        results: &mut [Option<Result<WriteOutcome>>],
    ) -> Result<()> {
        let known_counter = self.load_tree(key, false)?.map_or(0, |r| r.max_counter);
        let ops = self.within_reach(known_counter, ops, results);
        if ops.is_empty() {
            // Nothing to store: a tree is not created for refused ops.
            return Ok(());
        }
        let mut rec = self.load_tree(key, true)?.expect("created on demand");
        let mut fresh = self.filter_known(&rec, &ops, results)?;
        if fresh.is_empty() {
            return Ok(());
        }
        if canary::active(Canary::OldOpWrongPosition) {
            fresh = self.apply_older_than_log_at_end(&mut rec, fresh, results)?;
        }
        if let Some(first) = fresh.first() {
            // Nothing stored is newer than an op whose counter is above the
            // tree's: an in-order stream undoes nothing and scans nothing.
            // Otherwise the logged ops are read in place for the commute
            // check and copied out only for an undo/redo pass.
            let in_order = timestamp_counter(first.op.ts()) > rec.max_counter;
            let newer = if in_order || (strict() && self.commutes_with_logged(&rec, &fresh)?) {
                Vec::new()
            } else {
                self.logged_from(&rec, first.op.ts())?
            };
            if newer.is_empty() {
                for incoming in &fresh {
                    let op = incoming.op;
                    self.append(&mut rec, op.ts(), op.parent, op.child, &op.meta.items)?;
                }
            } else {
                self.overlay = Some(Overlay::new(rec.number));
                self.dirs.note_undo(rec.number);
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

    /// The ops whose counter is at most `counter_jump_max` ahead of the
    /// tree's counter as the ops before them (in timestamp order) leave
    /// it, and every pulled op; the others get `CounterTooFar`. A local op
    /// takes the largest counter its tree holds plus one, so within one
    /// incarnation of a tree the counters form a run without gaps, and a
    /// receiver that takes ops in an order that brings an op's
    /// predecessors first meets no larger jump than the sender did: a
    /// pushed op refused here is taken once the ops between have arrived.
    /// A tree written again after a drop starts above its dropped
    /// incarnation's counter, with nothing below to arrive; pulled ops,
    /// which this replica asked a peer's log for, are therefore taken at
    /// any counter and carry the tree's counter up to theirs
    /// (docs/design.md §9).
    pub(super) fn within_reach<'a>(
        &self,
        known_counter: u64,
        ops: &[Incoming<'a>],
        results: &mut [Option<Result<WriteOutcome>>],
    ) -> Vec<Incoming<'a>> {
        let mut order: Vec<&Incoming<'a>> = ops.iter().collect();
        order.sort_by_key(|i| i.op.ts());
        let mut reach = known_counter;
        let mut kept = Vec::with_capacity(ops.len());
        for incoming in order {
            let counter = timestamp_counter(incoming.op.ts());
            if incoming.bounded && counter > reach.saturating_add(self.counter_jump_max) {
                probe::hit(Probe::CounterTooFar);
                results[incoming.index] = Some(Err(Error::CounterTooFar {
                    counter,
                    known: reach,
                    limit: self.counter_jump_max,
                }));
                continue;
            }
            reach = reach.max(counter);
            kept.push(Incoming { ..*incoming });
        }
        kept
    }

    /// Drops ops already in the log (or repeated in the batch) and returns
    /// the rest sorted by timestamp.
    pub(super) fn filter_known<'a>(
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
                self.stored_same_op(rec.number, op)?
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

    /// Whether the tree's log holds `op` under its timestamp: `None` when
    /// it holds nothing there, else whether the stored op is the same.
    fn stored_same_op(&self, tree: u64, op: &Move) -> Result<Option<bool>> {
        let Some(guard) = self.rows(tree).get(log_key(op.ts()))? else {
            return Ok(None);
        };
        let view = LogView::parse(guard.value())?;
        if !view.at_node() {
            return Ok(Some(view.same_op(op.parent, op.child, &op.meta.items)));
        }
        if view.parent != op.parent || view.child != op.child {
            return Ok(Some(false));
        }
        let items =
            read::items_at_node(self.rows(tree), &self.children, tree, op.ts(), view.child)?;
        Ok(Some(items == op.meta.items))
    }

    /// Every logged op from `ts` on (encoded), oldest first.
    pub(super) fn logged_from(
        &self,
        rec: &TreeRecord,
        ts: Timestamp,
    ) -> Result<Vec<(Timestamp, Vec<u8>)>> {
        assert!(
            timestamp_counter(ts) <= rec.max_counter,
            "nothing stored is that new"
        );
        let tree = rec.number;
        let mut newer = Vec::new();
        // Node rows share the range; they are passed over.
        for row in self.rows(tree).range(log_range_from(ts))? {
            let (key, value) = row?;
            match key_kind(key.value()) {
                Some(RowKind::Log) => newer.push((key.value().a, value.value().to_vec())),
                Some(_) => {}
                None => return Err(Error::Malformed(format!("tree {tree}: row key of no kind"))),
            }
        }
        Ok(newer)
    }

    /// True when undoing the logged ops from the oldest fresh op on
    /// (`newer`), doing `fresh` and redoing `newer` (the CRDT's order) ends
    /// in exactly the state, undo records and heights that doing `fresh`
    /// on top of the current state gives, so the undo and redo can be
    /// skipped. That holds when the fresh ops only move nodes `D` this
    /// tree has never stored, that have no children here, and that no op
    /// of `newer` names (as child, parent or undo parent): then no node
    /// outside `D` ever hangs under a node of `D`, so the fresh ops cannot
    /// change any cycle check or undo record of `newer` and vice versa;
    /// each pair commutes, and the fresh ops keep their relative order (and
    /// so their heights). Pushed creations of new nodes, the common case,
    /// pass. The logged ops are read in place, nothing is copied.
    pub(super) fn commutes_with_logged(
        &self,
        rec: &TreeRecord,
        fresh: &[Incoming<'_>],
    ) -> Result<bool> {
        let first = fresh.first().expect("nothing to commute").op.ts();
        let moved: BTreeSet<NodeId> = fresh.iter().map(|i| i.op.child).collect();
        for &node in &moved {
            if self.rows(rec.number).get(node_key(node))?.is_some() {
                return Ok(false);
            }
            if node <= rec.max_parent && self.has_children(rec.number, node)? {
                return Ok(false);
            }
        }
        let tree = rec.number;
        // Node rows share the range; they are passed over.
        for row in self.rows(tree).range(log_range_from(first))? {
            let (key, value) = row?;
            match key_kind(key.value()) {
                Some(RowKind::Log) => {}
                Some(_) => continue,
                None => return Err(Error::Malformed(format!("tree {tree}: row key of no kind"))),
            }
            let op = LogView::parse(value.value())?;
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
    pub(super) fn redo_merged(
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
    pub(super) fn redo_op(
        &mut self,
        rec: &mut TreeRecord,
        ts: Timestamp,
        mut bytes: Vec<u8>,
    ) -> Result<()> {
        assert!(self.overlay.is_some(), "a redo outside an undo/redo pass");
        let view = LogView::parse(&bytes)?;
        let (parent, child, stored) = (view.parent, view.child, view.tail);
        if stored.height >= rec.next_height {
            return Err(Error::Malformed(format!(
                "tree {}: op {ts} at height {} of {}",
                rec.number, stored.height, rec.next_height
            )));
        }
        let mut name = std::mem::take(&mut self.scratch.name);
        let undo = match self.op_name_key(rec.number, ts, &mut name) {
            // Inside the pass the children rows wait for its end: no items.
            Ok(internal) => self.do_op(rec, ts, parent, child, internal, &name, &[]),
            Err(e) => Err(e),
        };
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
            rows_mut!(self, rec.number).insert(log_key(ts), bytes.as_slice())?;
        }
        Ok(())
    }

    /// Planted bug: ops older than the whole log are done on top of the
    /// current state instead of before every logged op.
    pub(super) fn apply_older_than_log_at_end<'a>(
        &mut self,
        rec: &mut TreeRecord,
        fresh: Vec<Incoming<'a>>,
        results: &mut [Option<Result<WriteOutcome>>],
    ) -> Result<Vec<Incoming<'a>>> {
        let tree = rec.number;
        let oldest = match read::rows_of_kind(self.rows(tree), tree, RowKind::Log)?.next() {
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
}

fn known_outcome(same: bool, ts: Timestamp) -> Result<WriteOutcome> {
    if same {
        Ok(WriteOutcome::Applied { fresh: false })
    } else {
        Err(Error::StampConflict(ts))
    }
}
