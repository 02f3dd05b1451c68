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

/// A tree's table of rows, open in the batch's transaction.
type Rows<'txn> = Table<'txn, RowKey, &'static [u8]>;

/// The open table of rows of tree `$tree` (opened by `load_tree`): a
/// macro so that the borrow is of the `tables` field alone and the
/// writer's other fields (its scratch buffers) stay usable beside it.
macro_rules! rows_mut {
    ($writer:expr, $tree:expr) => {{
        let tree: u64 = $tree;
        $writer
            .tables
            .get_mut(&tree)
            .unwrap_or_else(|| panic!("tree {tree}'s table is not open"))
    }};
}
pub(super) use rows_mut;

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
    /// Held to `counter_jump_max` (`WriteOp::Apply`; not a pulled op).
    pub bounded: bool,
}

pub(super) struct Writer<'txn, 'c> {
    txn: &'txn WriteTransaction,
    /// Opened on first need: a batch on known trees finds their numbers
    /// in `numbers`.
    trees: Option<Table<'txn, &'static [u8], u64>>,
    numbers: &'c TreeNumbers,
    /// The tables of rows of the trees the batch loaded, by number.
    tables: BTreeMap<u64, Rows<'txn>>,
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
    /// A log row whose node holds its items.
    log_at_node: Vec<u8>,
    node: Vec<u8>,
    name: Vec<u8>,
    /// A children row's value.
    child: Vec<u8>,
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
            tables: BTreeMap::new(),
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

    /// The table of rows of tree `tree`, open in this transaction.
    fn rows(&self, tree: u64) -> &Rows<'txn> {
        self.tables
            .get(&tree)
            .unwrap_or_else(|| panic!("tree {tree}'s table is not open"))
    }

    /// Opens the table of rows of tree `tree` (creating it when the tree
    /// has none yet).
    fn open_rows(&mut self, tree: u64) -> Result<()> {
        if !self.tables.contains_key(&tree) {
            let table = self.txn.open_table(tree_table(&tree_table_name(tree)))?;
            self.tables.insert(tree, table);
        }
        Ok(())
    }

    /// Writes back the height runs and the changed tree records; true
    /// when the batch changed anything (otherwise the transaction need not
    /// be committed). The tables stay open: `check` can look at the batch's result
    /// before it commits.
    pub fn flush(&mut self) -> Result<bool> {
        for run in std::mem::take(&mut self.height_runs) {
            self.store_height_run(run)?;
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
            rows_mut!(self, number).insert(state_key(), encode_tree(&state.current).as_slice())?;
            self.changed = true;
        }
        Ok(self.changed)
    }

    /// Stores the heights of one run of the batch. The newest stored run
    /// of its tree grows by them while it has room, so that runs fill
    /// their leaves whatever the size of the batches; what does not fit
    /// starts new runs.
    fn store_height_run(&mut self, run: HeightRun) -> Result<()> {
        assert!(
            height_run_len_valid(run.stamps.len()),
            "height run of {} bytes",
            run.stamps.len()
        );
        let rows = rows_mut!(self, run.tree);
        let newest = match rows.range(region_range(RowKind::Height))?.next_back() {
            Some(row) => {
                let (key, stamps) = row?;
                Some((height_of_key(key.value()), stamps.value().to_vec()))
            }
            None => None,
        };
        let (mut first, mut stamps, mut grows) = (run.first, run.stamps, false);
        if let Some((newest_first, newest_stamps)) = newest {
            let len = newest_stamps.len() / HEIGHT_ENTRY_BYTES;
            assert!(
                newest_first + len as u64 <= run.first,
                "tree {}: height {} given twice",
                run.tree,
                run.first
            );
            if newest_first + len as u64 == run.first && len < HEIGHT_RUN_MAX {
                let mut joined = newest_stamps;
                joined.extend_from_slice(&stamps);
                (first, stamps, grows) = (newest_first, joined, true);
            }
        }
        for chunk in stamps.chunks(HEIGHT_ENTRY_BYTES * HEIGHT_RUN_MAX) {
            let previous = rows.insert(height_key(first), chunk)?;
            assert!(
                previous.is_some() == grows,
                "tree {}: height {first} given twice",
                run.tree
            );
            grows = false;
            first += (chunk.len() / HEIGHT_ENTRY_BYTES) as u64;
        }
        Ok(())
    }

    /// Runs an invariant check on a tree as this batch leaves it (call
    /// after `flush`). Outer error: storage; inner: the broken invariant.
    pub fn check(&mut self, key: &TreeKey, check: &InvariantCheck) -> Result<Result<(), String>> {
        assert!(self.states.is_empty(), "a check runs after flush");
        let Some(rec) = self.flushed_tree(key)? else {
            return Ok(Err(Error::TreeNotFound.to_string()));
        };
        self.open_rows(rec.number)?;
        let rows = self.rows(rec.number);
        match check {
            InvariantCheck::Whole => check::check_tree_in(rows, &self.children, &rec),
            InvariantCheck::Touched(nodes) => {
                check::check_touched_in(rows, &self.children, &rec, nodes)
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
            let opened = !self.tables.contains_key(&number);
            self.open_rows(number)?;
            if let Some(record) = read::tree_state_if_present(self.rows(number), number)? {
                return Ok(Some((record, false)));
            }
            if opened {
                // The table was made by the opening: the tree it named is
                // gone (every stored tree's table holds its state row, and
                // a tree this batch creates is found in `states`).
                self.tables.remove(&number);
                self.txn
                    .delete_table(tree_table(&tree_table_name(number)))
                    .map_err(|e| Error::Storage(e.to_string()))?;
            }
        }
        let number = self
            .trees()?
            .get(tree_key_bytes(key).as_slice())?
            .map(|guard| guard.value());
        let Some(number) = number else {
            return Ok(None);
        };
        self.open_rows(number)?;
        Ok(Some((read::tree_state(self.rows(number), number)?, true)))
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
        self.open_rows(current.number)?;
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
