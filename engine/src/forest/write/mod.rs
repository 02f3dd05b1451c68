//! The write path: one `Writer` per batch owns the open tables of the
//! batch's write transaction and runs undo/do/redo on them.
//!
//! Layout: this module loads and stores tree records; `remote` applies
//! replicated ops, `local` local ones, and `ops` holds the do and undo of
//! one op on the rows that both use.

pub(super) mod journal;
mod local;
mod ops;
mod remote;

use super::dir_cache::DirCache;
use super::overlay::Overlay;
use super::read;
use super::records::*;
use super::tree_numbers::TreeNumbers;
use super::{check, ForestOptions, InvariantCheck};
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

pub(super) struct Writer<'txn, 'c> {
    txn: &'txn WriteTransaction,
    /// Opened on first need: a batch on known trees finds their numbers
    /// in `numbers`.
    trees: Option<Table<'txn, &'static [u8], u64>>,
    numbers: &'c TreeNumbers,
    /// Every per-tree row (see `ROWS`).
    rows: Table<'txn, RowKey, &'static [u8]>,
    /// The children index (see `CHILDREN`).
    children: Table<'txn, ChildKey, &'static [u8]>,
    states: BTreeMap<TreeKey, TreeState>,
    replica_id: ReplicaId,
    /// `ForestOptions::counter_jump_max`.
    counter_jump_max: u64,
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
    /// What the batch stored, for the write-ahead log (when it has one).
    journal: Option<journal::Journal>,
}

/// Consecutive heights of one tree given out in this batch.
struct HeightRun {
    tree: u64,
    first: u64,
    /// Encoded timestamps and digests, one per height (see
    /// `RowKind::Height`).
    stamps: Vec<u8>,
}

/// Encoding buffers reused by every op of the batch.
#[derive(Default)]
struct Scratch {
    log: Vec<u8>,
    node: Vec<u8>,
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
        options: &ForestOptions,
        dirs: &'c mut DirCache,
        numbers: &'c TreeNumbers,
        journal: bool,
    ) -> Result<Self> {
        Ok(Self {
            txn,
            trees: None,
            numbers,
            rows: txn.open_table(ROWS)?,
            children: txn.open_table(CHILDREN)?,
            states: BTreeMap::new(),
            replica_id: options.replica_id,
            counter_jump_max: options.counter_jump_max,
            changed: false,
            dirs,
            scratch: Scratch::default(),
            height_runs: Vec::new(),
            overlay: None,
            journal: journal.then(journal::Journal::default),
        })
    }

    /// What the batch stored, as the write-ahead log keeps it (`None`
    /// unless asked for at `open`).
    pub fn take_journal(&mut self) -> Option<journal::Journal> {
        self.journal.take()
    }

    /// Writes back the height runs and the changed tree records; true
    /// when the batch changed anything (otherwise the transaction need not
    /// be committed). The tables stay open: `check` can look at the batch's result
    /// before it commits.
    pub fn flush(&mut self) -> Result<bool> {
        for run in std::mem::take(&mut self.height_runs) {
            assert!(
                height_run_len_valid(run.stamps.len()),
                "height run of {} bytes",
                run.stamps.len()
            );
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
        assert!(self.states.is_empty(), "a check runs after flush");
        let Some(rec) = self.flushed_tree(key)? else {
            return Ok(Err(Error::TreeNotFound.to_string()));
        };
        match check {
            InvariantCheck::Whole => check::check_tree_in(&self.rows, &self.children, &rec),
            InvariantCheck::Touched(nodes) => {
                check::check_touched_in(&self.rows, &self.children, &rec, nodes)
            }
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
            assert!(
                state
                    .stored
                    .is_none_or(|s| s.number == state.current.number),
                "a tree changed its number within a batch"
            );
            return Ok(Some(state.current));
        }
        let stored = self.stored_tree(key)?;
        let current = match stored {
            Some(record) => record,
            None if create => self.new_tree_record(key)?,
            None => return Ok(None),
        };
        if let Some(journal) = &mut self.journal {
            journal.touch(key, current.number, stored.is_none());
        }
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
    /// A tree created again after a drop starts at the marks its dropped
    /// incarnations reached ([`DROPPED`]).
    fn new_tree_record(&mut self, key: &TreeKey) -> Result<TreeRecord> {
        let mut meta = self.txn.open_table(META)?;
        let number = match self.numbers.hint(key) {
            // Planted bug: the dropped incarnation's number again.
            (_, Some(old)) if canary::active(Canary::DropKeepsDirCache) => old,
            _ => {
                let number = meta.get(NEXT_TREE_NUMBER)?.map_or(1, |g| g.value());
                if number == 0 {
                    return Err(Error::Malformed("next tree number 0".into()));
                }
                if number > TREE_NUMBER_MAX {
                    return Err(Error::Storage("tree numbers exhausted".into()));
                }
                meta.insert(NEXT_TREE_NUMBER, number + 1)?;
                number
            }
        };
        self.changed = true;
        let marks = self.txn.open_table(DROPPED)?;
        let (max_counter, next_height) = match marks.get(tree_key_bytes(key).as_slice())? {
            // Planted bug: the dropped incarnation's marks are ignored.
            Some(_) if canary::active(Canary::DropForgetsMarks) => (0, 0),
            found => found.map_or((0, 0), |g| g.value()),
        };
        Ok(TreeRecord {
            number,
            max_counter,
            next_height,
            node_count: 0,
            max_parent: 0,
        })
    }

    fn store_tree(&mut self, key: &TreeKey, record: TreeRecord) {
        let state = self.states.get_mut(key).expect("tree loaded in this batch");
        assert_eq!(
            state.current.number, record.number,
            "stored under another tree"
        );
        assert!(
            record.next_height >= state.current.next_height,
            "a batch took heights back"
        );
        state.current = record;
    }
}
