//! The forest: every tree of a node, stored in one redb database, updated by
//! the undo/do/redo algorithm of the move CRDT (Kleppmann et al., TPDS 2021).
//!
//! Layout: `records` declares the tables and the stored encodings, `read`
//! holds the lookups shared by reads and writes, `write` the undo/do/redo
//! write path, `check` the full invariant check.

mod check;
mod dir_cache;
mod overlay;
mod read;
pub mod records;
mod stamps;
mod tree_numbers;
mod write;

use crate::error::{Error, Result};
use crate::types::*;
use crate::validate::{self, InputLimits};
use records::*;
use redb::{Database, ReadableDatabase, ReadableTable};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

pub use check::{Recheck, ReplicaContent};
pub use dir_cache::{DIR_CACHE_ENTRIES_MAX, DIR_CACHE_NAME_BYTES_MAX};
pub use stamps::{StampPage, STAMP_WALK_GAP_MAX};

/// Limits and identity of one forest.
#[derive(Clone, Debug)]
pub struct ForestOptions {
    /// This replica's stable id; the low 16 bits of every local timestamp.
    pub replica_id: ReplicaId,
    /// Largest accepted meta (see `Meta::size_bytes`).
    pub max_meta_bytes: usize,
    /// Largest accepted path (components).
    pub max_path_len: usize,
    /// Durable commits (`Durability::Immediate`); false = operator's `no_sync`.
    pub durable: bool,
}

impl ForestOptions {
    /// The bounds its writes and lookups are checked against.
    pub fn input_limits(&self) -> InputLimits {
        InputLimits {
            max_meta_bytes: self.max_meta_bytes,
            max_path_len: self.max_path_len,
        }
    }
}

impl Default for ForestOptions {
    fn default() -> Self {
        Self {
            replica_id: 1,
            max_meta_bytes: 64 * 1024,
            max_path_len: 256,
            durable: true,
        }
    }
}

/// One write of a batch. Local ops get their timestamp inside the batch's
/// write transaction (newer than everything the tree has seen); `Apply`
/// carries a replicated op at its own timestamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOp {
    /// Local move. `child: None` creates a fresh node whose id is the op's
    /// timestamp. Moving ROOT is an error.
    Move {
        parent: NodeId,
        child: Option<NodeId>,
        items: Vec<KeyValue>,
    },
    /// Walks `path` from ROOT through internal nodes, creating missing ones,
    /// then adds a leaf with `items`. `attr` must be `FileName`.
    AddByPath {
        attr: String,
        path: Vec<String>,
        items: Vec<KeyValue>,
    },
    /// Local remove: a move under TRASH keeping the node's meta. Removing ROOT
    /// is an error.
    Remove { node: NodeId },
    /// A replicated op applied at its own timestamp; idempotent.
    Apply { op: Move },
}

/// A write addressed to one tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteRequest {
    pub tree: TreeKey,
    pub op: WriteOp,
}

/// The result of one write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WriteOutcome {
    /// Move/Remove (and Add, a Move with a fresh child): the node and the
    /// op's timestamp.
    Moved { node: NodeId, ts: Timestamp },
    /// AddByPath: the leaf and the directories it created, parents first.
    AddedByPath {
        leaf: NodeId,
        created: Vec<NodeId>,
        ts: Timestamp,
    },
    /// Apply: `fresh` is false when the op was already in the log.
    Applied { fresh: bool },
}

/// An invariant check that `write_batch_checked` runs on one tree inside
/// the batch's write transaction, after the batch and before its commit:
/// the same checks as `check_invariants_touched` and `check_invariants`
/// on the state the commit would store, without a read transaction of
/// their own (for checkers that test every batch, the fuzz targets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InvariantCheck {
    /// `check_invariants_touched` at these nodes.
    Touched(Vec<NodeId>),
    /// `check_invariants`: the whole tree.
    Whole,
}

/// What `write_batch_checked` returns when the transaction worked.
#[derive(Debug)]
pub struct CheckedBatch {
    /// One result per request, as `write_batch` gives them.
    pub results: Vec<Result<WriteOutcome>>,
    /// What the commit changed (nothing when `verdict` is an error).
    pub summary: CommitSummary,
    /// The first broken invariant; then nothing of the batch is stored.
    pub verdict: Result<(), String>,
}

/// What `write_batch` returns when the transaction worked.
#[derive(Debug)]
pub struct Committed {
    /// One result per request, in request order.
    pub results: Vec<Result<WriteOutcome>>,
    pub summary: CommitSummary,
}

/// What one batch's transaction changed, for whoever replicates it: the one
/// place that says which trees a commit stored ops in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommitSummary {
    /// Trees with at least one successful local write, ascending.
    pub local_trees: Vec<TreeKey>,
    /// Trees with at least one replicated op that was new here, ascending.
    pub applied_trees: Vec<TreeKey>,
    /// The error of a transaction that failed; then the lists above are
    /// empty and `unsure_trees` holds every tree of the batch.
    pub failure: Option<Error>,
    /// Trees of a failed transaction, ascending: whether it stored ops in
    /// them is unknown until the database is reopened.
    pub unsure_trees: Vec<TreeKey>,
}

impl CommitSummary {
    /// The summary of a transaction that committed with `results`.
    pub fn of(requests: &[WriteRequest], results: &[Result<WriteOutcome>]) -> Self {
        assert_eq!(requests.len(), results.len(), "one result per request");
        let mut local = std::collections::BTreeSet::new();
        let mut applied = std::collections::BTreeSet::new();
        for (request, result) in requests.iter().zip(results) {
            match (&request.op, result) {
                (WriteOp::Apply { .. }, Ok(WriteOutcome::Applied { fresh: true })) => {
                    applied.insert(&request.tree);
                }
                (WriteOp::Apply { .. }, _) | (_, Err(_)) => {}
                (_, Ok(_)) => {
                    local.insert(&request.tree);
                }
            }
        }
        Self {
            local_trees: local.into_iter().cloned().collect(),
            applied_trees: applied.into_iter().cloned().collect(),
            failure: None,
            unsure_trees: Vec::new(),
        }
    }

    /// The summary of a transaction that failed with `error`.
    pub fn failed(requests: &[WriteRequest], error: Error) -> Self {
        let trees: std::collections::BTreeSet<&TreeKey> =
            requests.iter().map(|r| &r.tree).collect();
        Self {
            failure: Some(error),
            unsure_trees: trees.into_iter().cloned().collect(),
            ..Self::default()
        }
    }

    /// Every tree the commit stored ops in, or may have.
    pub fn trees_written(&self) -> impl Iterator<Item = &TreeKey> {
        self.local_trees
            .iter()
            .chain(&self.applied_trees)
            .chain(&self.unsure_trees)
    }
}

/// Which per-peer cursor: what we pulled from a peer (sync) or what a peer
/// has acknowledged of our pushes (replication).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CursorKind {
    Pull = 0,
    Push = 1,
}

/// The full observable state of one tree, for convergence checks: nodes
/// sorted by id and the log sorted by timestamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeDump {
    pub nodes: Vec<NodeInfo>,
    pub log: Vec<Move>,
}

/// A page of the op log filtered by origin (see
/// [`Forest::get_op_log_of_origin`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpLogPage {
    pub entries: Vec<LogEntry>,
    /// The first height not looked at.
    pub next_height: u64,
}

/// Opens the forest's database anew, over the same bytes each time.
pub type DatabaseOpener = Box<dyn Fn() -> Result<Database> + Send + Sync>;

/// The forest of one node.
pub struct Forest {
    /// `None` between closing a failed database and opening it again.
    /// Write transactions hold the read side for their whole life, so a
    /// reopen (the write side) never runs beside a live writer: two live
    /// databases on one file would corrupt it.
    db: std::sync::RwLock<Option<Database>>,
    /// How to open the database again after a storage error poisoned it
    /// (redb refuses every write after an I/O error until reopened).
    opener: Option<DatabaseOpener>,
    options: ForestOptions,
    /// Directory lookups of the write path. Every writer that can change
    /// directories holds this lock from before `begin_write` until after
    /// its commit, which keeps the cache equal to the committed state.
    dir_cache: Mutex<dir_cache::DirCache>,
    /// Tree key -> number hints (see `tree_numbers`); a new epoch starts
    /// under the `dir_cache` lock whenever numbers may be given again.
    tree_numbers: tree_numbers::TreeNumbers,
}

/// A read snapshot of one existing tree.
pub(crate) struct TreeRead {
    /// The forest's `ROWS` table in that snapshot (the table keeps the
    /// snapshot alive on its own).
    rows: redb::ReadOnlyTable<RowKey, &'static [u8]>,
    rec: TreeRecord,
}

/// The number of an existing tree.
fn tree_number(trees: &impl ReadableTable<&'static [u8], u64>, tree: &TreeKey) -> Result<u64> {
    match trees.get(tree_key_bytes(tree).as_slice())? {
        Some(guard) => Ok(guard.value()),
        None => Err(Error::TreeNotFound),
    }
}

/// A write transaction and the read side of the database lock, which it
/// keeps until it ends (fields drop in order: the transaction first).
pub(crate) struct WriteTxn<'a> {
    txn: redb::WriteTransaction,
    _db: std::sync::RwLockReadGuard<'a, Option<Database>>,
}

impl std::ops::Deref for WriteTxn<'_> {
    type Target = redb::WriteTransaction;
    fn deref(&self) -> &redb::WriteTransaction {
        &self.txn
    }
}

impl std::ops::DerefMut for WriteTxn<'_> {
    fn deref_mut(&mut self) -> &mut redb::WriteTransaction {
        &mut self.txn
    }
}

impl WriteTxn<'_> {
    pub(crate) fn commit(self) -> Result<()> {
        Ok(self.txn.commit()?)
    }

    pub(crate) fn abort(self) -> Result<()> {
        Ok(self.txn.abort()?)
    }
}

fn closed_database() -> Error {
    Error::Storage("database closed after a storage error; reopening".into())
}

impl Forest {
    /// Opens (or creates) a forest in a file; `reopen` opens the file again.
    pub fn open(path: &std::path::Path, options: ForestOptions) -> Result<Self> {
        let path = path.to_path_buf();
        Self::open_reopenable(
            Box::new(move || Ok(redb::Builder::new().create(&path)?)),
            options,
        )
    }

    /// Opens (or creates) a forest with `opener`, which `reopen` calls again
    /// after a storage error. Each call must open the same bytes (for
    /// example a fresh backend over the same disk).
    pub fn open_reopenable(opener: DatabaseOpener, options: ForestOptions) -> Result<Self> {
        let db = opener()?;
        let mut forest = Self::init(db, options)?;
        forest.opener = Some(opener);
        Ok(forest)
    }

    /// Like `open_reopenable` with a backend factory: every (re)open gets a
    /// fresh backend from `backend`.
    pub fn open_with_backend_factory<B: redb::StorageBackend>(
        backend: impl Fn() -> Result<B> + Send + Sync + 'static,
        options: ForestOptions,
    ) -> Result<Self> {
        Self::open_reopenable(
            Box::new(move || Ok(redb::Builder::new().create_with_backend(backend()?)?)),
            options,
        )
    }

    /// True when `reopen` can open the database again.
    pub fn reopenable(&self) -> bool {
        self.opener.is_some()
    }

    /// Closes the database and opens it again from its opener, which runs
    /// redb's recovery: every committed transaction is back, and a database
    /// poisoned by an I/O error accepts writes again. Waits for live write
    /// transactions to end first. On error the forest stays closed (every
    /// call fails with a storage error) until a later `reopen` succeeds.
    pub fn reopen(&self) -> Result<()> {
        let opener = self
            .opener
            .as_ref()
            .ok_or_else(|| Error::Storage("this forest cannot be reopened".into()))?;
        // A reopen may come back without commits that were not durable
        // (no_sync): lookups made after them would be stale. Taken before
        // `db`, in the order `write_batch` takes them.
        let mut dirs = self.lock_dir_cache();
        dirs.clear();
        let mut slot = self.db.write().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = slot.take() {
            // A poisoned database cannot flush; its close error is expected.
            if let Err(error) = old.close() {
                tracing::debug!(%error, "closing the failed database");
            }
        }
        let db = opener()?;
        create_tables(&db)?;
        *slot = Some(db);
        // Lost non-durable commits may have created trees whose numbers
        // the counter now gives again. Still under the directory lock.
        self.tree_numbers.new_epoch();
        Ok(())
    }

    /// Opens (or creates) a forest on any redb storage backend (the
    /// simulator's disk, an in-memory backend).
    pub fn open_with_backend(
        backend: impl redb::StorageBackend,
        options: ForestOptions,
    ) -> Result<Self> {
        let db = redb::Builder::new().create_with_backend(backend)?;
        Self::init(db, options)
    }

    /// A fresh in-memory forest (tests, fuzzing).
    pub fn in_memory(options: ForestOptions) -> Result<Self> {
        Self::open_with_backend(redb::backends::InMemoryBackend::new(), options)
    }

    /// A forest over a database the caller opened with its own redb
    /// settings (the fuzz harness picks a smaller page size). Such a
    /// forest cannot `reopen`.
    pub fn from_database(db: Database, options: ForestOptions) -> Result<Self> {
        Self::init(db, options)
    }

    fn init(db: Database, options: ForestOptions) -> Result<Self> {
        create_tables(&db)?;
        Ok(Self {
            db: std::sync::RwLock::new(Some(db)),
            opener: None,
            options,
            dir_cache: Mutex::default(),
            tree_numbers: tree_numbers::TreeNumbers::default(),
        })
    }

    fn begin_read(&self) -> Result<redb::ReadTransaction> {
        let db = self.db.read().unwrap_or_else(|e| e.into_inner());
        Ok(db.as_ref().ok_or_else(closed_database)?.begin_read()?)
    }

    pub fn options(&self) -> &ForestOptions {
        &self.options
    }

    fn begin_write(&self) -> Result<WriteTxn<'_>> {
        let db = self.db.read().unwrap_or_else(|e| e.into_inner());
        let mut txn = db.as_ref().ok_or_else(closed_database)?.begin_write()?;
        let durability = if self.options.durable {
            redb::Durability::Immediate
        } else {
            redb::Durability::None
        };
        txn.set_durability(durability)
            .map_err(|e| Error::Storage(e.to_string()))?;
        Ok(WriteTxn { txn, _db: db })
    }

    /// The directory cache, locked. After a panic in a batch (poisoned
    /// lock) its entries may come from an aborted transaction: emptied.
    fn lock_dir_cache(&self) -> MutexGuard<'_, dir_cache::DirCache> {
        match self.dir_cache.lock() {
            Ok(cache) => cache,
            Err(poisoned) => {
                let mut cache = poisoned.into_inner();
                cache.clear();
                cache
            }
        }
    }

    /// Applies a batch in one write transaction. The outer error means the
    /// transaction failed and nothing of the batch is stored; otherwise each
    /// request has its own result, in request order.
    ///
    /// Replicated ops are applied first, per tree, merged in timestamp order
    /// with one undo back to the oldest new op; local ops follow in request
    /// order, each newer than everything before it.
    pub fn write_batch(&self, requests: &[WriteRequest]) -> Result<Committed> {
        let batch = self.write_batch_checked(requests, |_| Vec::new())?;
        assert!(batch.verdict.is_ok(), "no check was asked for");
        Ok(Committed {
            results: batch.results,
            summary: batch.summary,
        })
    }

    /// `write_batch`, plus the invariant checks `checks` asks for given
    /// the batch's results, run inside the batch's transaction before it
    /// commits. A broken invariant aborts the transaction (nothing of the
    /// batch is stored) and is reported in `verdict`.
    pub fn write_batch_checked(
        &self,
        requests: &[WriteRequest],
        checks: impl FnOnce(&[Result<WriteOutcome>]) -> Vec<(TreeKey, InvariantCheck)>,
    ) -> Result<CheckedBatch> {
        let mut dirs = self.lock_dir_cache();
        dirs.align_with_canary();
        let outcome = self.write_batch_with(requests, &mut dirs, checks);
        if !matches!(
            outcome,
            Ok(CheckedBatch {
                verdict: Ok(()),
                ..
            })
        ) {
            // Lookups made inside the failed transaction describe rows that
            // were never committed.
            dirs.clear();
        }
        outcome
    }

    fn write_batch_with(
        &self,
        requests: &[WriteRequest],
        dirs: &mut dir_cache::DirCache,
        checks: impl FnOnce(&[Result<WriteOutcome>]) -> Vec<(TreeKey, InvariantCheck)>,
    ) -> Result<CheckedBatch> {
        let refused: Vec<Option<Result<WriteOutcome>>> = requests
            .iter()
            .map(|r| {
                validate::write(&r.tree, &r.op, self.options.input_limits())
                    .err()
                    .map(Err)
            })
            .collect();
        let txn = self.begin_write()?;
        let (changed, results, verdict) = {
            let mut writer =
                write::Writer::open(&txn, self.options.replica_id, dirs, &self.tree_numbers)?;
            let results = apply_requests(&mut writer, requests, refused)?;
            let changed = writer.flush()?;
            let mut verdict = Ok(());
            for (tree, check) in checks(&results) {
                verdict = writer.check(&tree, &check)?;
                if verdict.is_err() {
                    break;
                }
            }
            (changed && verdict.is_ok(), results, verdict)
        };
        if changed {
            txn.commit()?;
        } else {
            txn.abort()?;
        }
        let summary = match verdict {
            Ok(()) => CommitSummary::of(requests, &results),
            Err(_) => CommitSummary::default(),
        };
        Ok(CheckedBatch {
            results,
            summary,
            verdict,
        })
    }

    /// A read snapshot and the number of an existing tree, for lookups
    /// that need no tree state.
    fn read_tree_number(&self, tree: &TreeKey) -> Result<(redb::ReadTransaction, u64)> {
        let txn = self.begin_read()?;
        let number = tree_number(&txn.open_table(TREES)?, tree)?;
        Ok((txn, number))
    }

    /// A read snapshot of an existing tree: its rows table and record.
    fn read_tree(&self, tree: &TreeKey) -> Result<TreeRead> {
        let (epoch, hint) = self.tree_numbers.hint(tree);
        let txn = self.begin_read()?;
        let rows = txn.open_table(ROWS)?;
        // A hint from an epoch that ended after it was taken may name
        // another tree in this snapshot (see `tree_numbers`).
        if let Some(number) = hint.filter(|_| self.tree_numbers.epoch() == epoch) {
            if let Some(rec) = read::tree_state_if_present(&rows, number)? {
                return Ok(TreeRead { rows, rec });
            }
        }
        let number = tree_number(&txn.open_table(TREES)?, tree)?;
        let rec = read::tree_state(&rows, number)?;
        self.tree_numbers.learn(epoch, tree, number);
        Ok(TreeRead { rows, rec })
    }

    /// Nodes reached by `path` (see DESIGN §4); empty when nothing matches.
    pub fn get_by_path(
        &self,
        tree: &TreeKey,
        attr: &str,
        path: &[String],
        latest_only: bool,
    ) -> Result<Vec<NodeInfo>> {
        validate::path(attr, path, self.options.input_limits())?;
        let read = self.read_tree(tree)?;
        path_lookup(&read, path, latest_only)
    }

    /// `get_by_path` for many `(path, latest_only)` queries against one
    /// snapshot, for checkers that ask many paths of one state (the
    /// fuzz targets): one read transaction instead of one per query. The
    /// first invalid path fails the whole call.
    pub fn get_by_paths(
        &self,
        tree: &TreeKey,
        attr: &str,
        queries: &[(&[String], bool)],
    ) -> Result<Vec<Vec<NodeInfo>>> {
        for (path, _) in queries {
            validate::path(attr, path, self.options.input_limits())?;
        }
        let read = self.read_tree(tree)?;
        queries
            .iter()
            .map(|&(path, latest_only)| path_lookup(&read, path, latest_only))
            .collect()
    }

    /// One node, or `None` if the tree has no such node. ROOT and TRASH are
    /// not stored nodes: they give `None`.
    pub fn get_node(&self, tree: &TreeKey, node: NodeId) -> Result<Option<NodeInfo>> {
        let TreeRead { rows, rec, .. } = self.read_tree(tree)?;
        read::node_info(&rows, rec.number, node)
    }

    /// `get_node` for many nodes in one read transaction: a checker that
    /// looks up every acknowledged node would otherwise pay for a
    /// transaction per node.
    pub fn get_nodes(&self, tree: &TreeKey, nodes: &[NodeId]) -> Result<Vec<Option<NodeInfo>>> {
        let TreeRead { rows, rec, .. } = self.read_tree(tree)?;
        nodes
            .iter()
            .map(|&node| read::node_info(&rows, rec.number, node))
            .collect()
    }

    /// Children ids of a node, ascending.
    pub fn get_children(&self, tree: &TreeKey, node: NodeId) -> Result<Vec<NodeId>> {
        let TreeRead { rows, rec, .. } = self.read_tree(tree)?;
        let mut ids: Vec<NodeId> = read::children_of(&rows, rec.number, node)?
            .into_iter()
            .map(|c| c.0)
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// Depth-first, every parent before its children (children by ascending
    /// id); depth 0 = unlimited, 1 = the root alone. At most `limit` nodes
    /// (TooLarge beyond). ROOT and TRASH are reported with an empty meta
    /// and themselves as parent.
    pub fn get_subtree(
        &self,
        tree: &TreeKey,
        root: NodeId,
        depth: u32,
        limit: usize,
    ) -> Result<Vec<NodeInfo>> {
        let TreeRead { rows, rec, .. } = self.read_tree(tree)?;
        let first = match root {
            ROOT | TRASH => NodeInfo {
                id: root,
                parent: root,
                meta: Meta::default(),
            },
            _ => read::node_info(&rows, rec.number, root)?.ok_or(Error::NodeNotFound(root))?,
        };
        let mut out = Vec::new();
        let mut stack = vec![(first, 1u32)];
        while let Some((info, level)) = stack.pop() {
            if out.len() == limit {
                return Err(Error::TooLarge {
                    what: "subtree".into(),
                    size: limit as u64 + 1,
                    limit: limit as u64,
                });
            }
            if depth == 0 || level < depth {
                let mut ids: Vec<NodeId> = read::children_of(&rows, rec.number, info.id)?
                    .into_iter()
                    .map(|c| c.0)
                    .collect();
                ids.sort_unstable();
                for id in ids.into_iter().rev() {
                    let child = read::node_info(&rows, rec.number, id)?
                        .expect("children index points at a stored node");
                    stack.push((child, level + 1));
                }
            }
            out.push(info);
        }
        Ok(out)
    }

    /// Stored ops from `from_height` on, in this replica's storage order.
    pub fn get_op_log(
        &self,
        tree: &TreeKey,
        from_height: u64,
        limit: usize,
    ) -> Result<Vec<LogEntry>> {
        Ok(self
            .scan_op_log(tree, from_height, limit, limit, None)?
            .entries)
    }

    /// The stored ops that originated at replica `origin` (the low bits of
    /// their timestamps), from `from_height` on in storage order: at most
    /// `limit` of them, looking at no more than `scan_max` heights. The
    /// origin is read from the height index, so the ops of other replicas
    /// are skipped without a log lookup. `next_height` is where the next
    /// page starts: every height below it was looked at.
    pub fn get_op_log_of_origin(
        &self,
        tree: &TreeKey,
        from_height: u64,
        limit: usize,
        scan_max: usize,
        origin: ReplicaId,
    ) -> Result<OpLogPage> {
        self.scan_op_log(tree, from_height, limit, scan_max, Some(origin))
    }

    fn scan_op_log(
        &self,
        tree: &TreeKey,
        from_height: u64,
        limit: usize,
        scan_max: usize,
        origin: Option<ReplicaId>,
    ) -> Result<OpLogPage> {
        let TreeRead { rows, rec, .. } = self.read_tree(tree)?;
        let mut page = OpLogPage {
            entries: Vec::new(),
            next_height: from_height,
        };
        if from_height >= rec.next_height {
            return Ok(page);
        }
        let t = rec.number;
        let start = stamps::run_holding(&rows, t, from_height)?;
        let mut scanned = 0usize;
        for row in rows
            .range(height_key(t, u64::MAX)..=height_key(t, start))?
            .rev()
        {
            let (key, stamps) = row?;
            let first = height_of_key(key.value());
            for (height, ts) in (first..).zip(decode_height_run(stamps.value())?) {
                if height < from_height {
                    continue;
                }
                if page.entries.len() >= limit || scanned >= scan_max {
                    return Ok(page);
                }
                scanned += 1;
                page.next_height = height + 1;
                if origin.is_some_and(|o| timestamp_replica(ts) != o) {
                    continue;
                }
                let record = read::log_record(&rows, rec.number, ts)?;
                assert_eq!(record.tail.height, height, "height index out of sync");
                page.entries.push(LogEntry {
                    height,
                    op: record.into_move(ts),
                });
            }
        }
        Ok(page)
    }

    /// For each op, whether the tree's log already holds exactly that op
    /// (same timestamp, parent, child and meta): a puller need not submit
    /// those. An absent tree holds none.
    pub fn stored_ops(&self, tree: &TreeKey, ops: &[&Move]) -> Result<Vec<bool>> {
        let (txn, number) = match self.read_tree_number(tree) {
            Ok(found) => found,
            Err(Error::TreeNotFound) => return Ok(vec![false; ops.len()]),
            Err(e) => return Err(e),
        };
        let log = txn.open_table(ROWS)?;
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            let same = match log.get(log_key(number, op.ts()))? {
                Some(guard) => {
                    LogView::parse(guard.value())?.same_op(op.parent, op.child, &op.meta.items)
                }
                None => false,
            };
            out.push(same);
        }
        Ok(out)
    }

    /// The height the next stored op of this tree will get (= ops stored);
    /// 0 for a tree that does not exist.
    pub fn next_height(&self, tree: &TreeKey) -> Result<u64> {
        match self.read_tree(tree) {
            Ok(read) => Ok(read.rec.next_height),
            Err(Error::TreeNotFound) => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Tree ids of a container, ascending.
    pub fn tree_list(&self, cid: &ContainerId) -> Result<Vec<String>> {
        Ok(self
            .trees_from(&cid.0)?
            .into_iter()
            .take_while(|(key, _)| key.cid == *cid)
            .map(|(key, _)| key.tree)
            .collect())
    }

    /// Every tree of the forest, ascending.
    pub fn all_trees(&self) -> Result<Vec<TreeKey>> {
        Ok(self.trees_from(&[])?.into_iter().map(|t| t.0).collect())
    }

    /// At most `limit` trees after `after` (from the first with `None`),
    /// ascending: a walk over every tree in bounded steps.
    pub fn trees_after(&self, after: Option<&TreeKey>, limit: usize) -> Result<Vec<TreeKey>> {
        let txn = self.begin_read()?;
        let trees = txn.open_table(TREES)?;
        let from = after.map(tree_key_bytes).unwrap_or_default();
        let mut out = Vec::with_capacity(limit.min(1024));
        for row in trees.range(from.as_slice()..)? {
            if out.len() == limit {
                break;
            }
            let key = decode_tree_key(row?.0.value())?;
            if Some(&key) != after {
                out.push(key);
            }
        }
        Ok(out)
    }

    /// Every tree whose key is at least `from`, ascending, with its number.
    fn trees_from(&self, from: &[u8]) -> Result<Vec<(TreeKey, u64)>> {
        let txn = self.begin_read()?;
        let trees = txn.open_table(TREES)?;
        let mut out = Vec::new();
        for row in trees.range(from..)? {
            let (key, value) = row?;
            out.push((decode_tree_key(key.value())?, value.value()));
        }
        Ok(out)
    }

    pub fn tree_exists(&self, tree: &TreeKey) -> Result<bool> {
        match self.read_tree_number(tree) {
            Ok(_) => Ok(true),
            Err(Error::TreeNotFound) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Deletes one tree (`Some`; TreeNotFound if absent) or every tree of
    /// the container (`None`), with all their rows.
    pub fn tree_drop(&self, cid: &ContainerId, tree: Option<&str>) -> Result<()> {
        let victims: Vec<(TreeKey, u64)> = match tree {
            Some(name) => {
                let key = TreeKey::new(*cid, name);
                let (_, number) = self.read_tree_number(&key)?;
                vec![(key, number)]
            }
            None => self
                .trees_from(&cid.0)?
                .into_iter()
                .take_while(|(key, _)| key.cid == *cid)
                .collect(),
        };
        if victims.is_empty() {
            return Ok(());
        }
        // Tree numbers are never reused, so the dropped trees' lookups
        // could not be hit again; emptying the cache keeps it small.
        let mut dirs = self.lock_dir_cache();
        dirs.clear();
        let txn = self.begin_write()?;
        for (key, number) in &victims {
            delete_tree_rows(&txn, key, *number)?;
        }
        txn.commit()?;
        Ok(())
    }

    /// A durable per-peer cursor (0 when never set or the tree is absent).
    pub fn cursor(&self, tree: &TreeKey, kind: CursorKind, peer: ReplicaId) -> Result<u64> {
        let (txn, number) = match self.read_tree_number(tree) {
            Ok(found) => found,
            Err(Error::TreeNotFound) => return Ok(0),
            Err(e) => return Err(e),
        };
        let cursors = txn.open_table(CURSORS)?;
        Ok(cursors
            .get((number, kind as u8, peer))?
            .map_or(0, |g| g.value()))
    }

    /// Moves a cursor forward; moving it backwards is a programming error.
    /// TreeNotFound when the tree does not exist.
    pub fn set_cursor(
        &self,
        tree: &TreeKey,
        kind: CursorKind,
        peer: ReplicaId,
        value: u64,
    ) -> Result<()> {
        let txn = self.begin_write()?;
        let moved = {
            let number = tree_number(&txn.open_table(TREES)?, tree)?;
            let mut cursors = txn.open_table(CURSORS)?;
            let key = (number, kind as u8, peer);
            let current = cursors.get(key)?.map_or(0, |g| g.value());
            assert!(
                value >= current,
                "cursor {kind:?}/{peer} moved back from {current} to {value}"
            );
            if value > current {
                cursors.insert(key, value)?;
            }
            value > current
        };
        // A cursor already at `value` is durable as it is: a commit would
        // cost a flush and change nothing.
        if moved {
            txn.commit()?;
        } else {
            txn.abort()?;
        }
        Ok(())
    }

    /// Full state of a tree, for checkers: nodes by id, log by timestamp.
    /// The log is read once; each node's meta comes from the logged op at
    /// its time (found in that read, not by a lookup per node).
    pub fn dump(&self, tree: &TreeKey) -> Result<TreeDump> {
        let TreeRead { rows, rec, .. } = self.read_tree(tree)?;
        let t = rec.number;
        let mut dump = TreeDump {
            nodes: Vec::new(),
            log: Vec::new(),
        };
        for row in read::rows_of_kind(&rows, t, RowKind::Log)? {
            let (ts, value) = row?;
            dump.log.push(decode_log(value.value())?.into_move(ts));
        }
        for row in read::rows_of_kind(&rows, t, RowKind::Node)? {
            let (id, value) = row?;
            let node = decode_node(value.value())?;
            let Ok(at) = dump.log.binary_search_by_key(&node.time, |op| op.meta.time) else {
                panic!("tree {t}: log entry {} is missing", node.time);
            };
            dump.nodes.push(NodeInfo {
                id,
                parent: node.parent,
                meta: dump.log[at].meta.clone(),
            });
        }
        Ok(dump)
    }

    /// Checks the tree invariant over the whole stored tree: one parent per
    /// node, no cycle, indexes consistent with node state.
    pub fn check_invariants(&self, tree: &TreeKey) -> Result<(), String> {
        let read = self.read_tree(tree).map_err(|e| e.to_string())?;
        check::check_tree(&read).map_err(|e| e.to_string())?
    }

    /// The checks of `check_invariants` that a write to `touched` nodes can
    /// break, without reading the whole tree (see `check::check_touched`).
    pub fn check_invariants_touched(
        &self,
        tree: &TreeKey,
        touched: &[NodeId],
    ) -> Result<(), String> {
        let read = self.read_tree(tree).map_err(|e| e.to_string())?;
        check::check_touched(&read, touched).map_err(|e| e.to_string())?
    }

    /// Number of logged ops over all trees (bench, tests).
    pub fn log_rows(&self) -> Result<u64> {
        let txn = self.begin_read()?;
        let rows = txn.open_table(ROWS)?;
        let mut count = 0u64;
        for (_, number) in self.trees_from(&[])? {
            for row in read::rows_of_kind(&rows, number, RowKind::Log)? {
                row?;
                count += 1;
            }
        }
        Ok(count)
    }

    /// Empties every table, tree numbering included, so the forest behaves
    /// exactly like a freshly created one; one durable commit. For harnesses
    /// that run many short cases on one database (fuzzing), where opening
    /// and closing redb per case costs more than the case.
    pub fn clear(&self) -> Result<()> {
        self.clear_with(redb::Durability::Immediate)
    }

    /// `clear` in a commit without durability, for harnesses whose forests
    /// commit without it anyway (`ForestOptions::durable` false): redb
    /// frees the pages of non-durable commits at once, so this skips the
    /// flush of `clear` and nothing grows; a later `clear` makes it all
    /// durable.
    pub fn clear_without_sync(&self) -> Result<()> {
        self.clear_with(redb::Durability::None)
    }

    fn clear_with(&self, durability: redb::Durability) -> Result<()> {
        // Tree numbers start over, so a cached lookup would name a node of
        // a deleted tree. Taken before `db`, in the order `write_batch` does.
        let mut dirs = self.lock_dir_cache();
        dirs.clear();
        let mut txn = self.begin_write()?;
        txn.set_durability(durability)
            .map_err(|e| Error::Storage(e.to_string()))?;
        txn.delete_table(TREES)?;
        txn.delete_table(META)?;
        txn.delete_table(ROWS)?;
        txn.delete_table(CURSORS)?;
        // Recreated at once: reads never meet a missing table.
        open_all_tables(&txn)?;
        let committed = txn.commit();
        // Tree numbers start over (also after a commit that failed half
        // way). Still under the directory lock.
        self.tree_numbers.new_epoch();
        committed
    }
}

/// The body of `get_by_path` on an open snapshot (`path` already checked).
fn path_lookup(read: &TreeRead, path: &[String], latest_only: bool) -> Result<Vec<NodeInfo>> {
    let (rows, number) = (&read.rows, read.rec.number);
    let (dirs, last) = path.split_at(path.len() - 1);
    let (dir, found) = read::resolve_dirs(rows, number, dirs)?;
    if found < dirs.len() {
        return Ok(Vec::new());
    }
    let mut matches = read::children_named(rows, number, dir, &component_key(&last[0]))?;
    if latest_only {
        // Newest meta wins; times are unique, the id only breaks
        // impossible ties deterministically.
        matches.sort_by_key(|&(id, time, _)| (std::cmp::Reverse(time), id));
        matches.truncate(1);
    }
    let mut out = Vec::with_capacity(matches.len());
    for (id, time, _) in matches {
        let items = read::log_record(rows, number, time)?.body.items;
        out.push(NodeInfo {
            id,
            parent: dir,
            meta: Meta { time, items },
        });
    }
    Ok(out)
}

/// Runs every request not `refused` yet through `writer`: replicated ops
/// first, per tree, then local ones in request order. The outer error
/// fails the batch.
fn apply_requests(
    writer: &mut write::Writer<'_, '_>,
    requests: &[WriteRequest],
    mut results: Vec<Option<Result<WriteOutcome>>>,
) -> Result<Vec<Result<WriteOutcome>>> {
    let mut applies: BTreeMap<&TreeKey, Vec<write::Incoming<'_>>> = BTreeMap::new();
    for (index, request) in requests.iter().enumerate() {
        if let (None, WriteOp::Apply { op }) = (&results[index], &request.op) {
            let incoming = write::Incoming { index, op };
            applies.entry(&request.tree).or_default().push(incoming);
        }
    }
    for (tree, ops) in &applies {
        writer.apply_remote(tree, ops, &mut results)?;
    }
    for (index, request) in requests.iter().enumerate() {
        let local = !matches!(request.op, WriteOp::Apply { .. });
        if local && results[index].is_none() {
            results[index] = Some(writer.apply_local(&request.tree, &request.op)?);
        }
    }
    Ok(results
        .into_iter()
        .map(|r| r.expect("every request has a result"))
        .collect())
}

/// Creates every table up front so that reads never meet a missing one.
fn create_tables(db: &Database) -> Result<()> {
    let txn = db.begin_write()?;
    open_all_tables(&txn)?;
    txn.commit()?;
    Ok(())
}

/// Opens (creating if absent) every table of the forest in `txn`, and
/// refuses a database laid out by another format version. The version is
/// checked first: an older layout may hold a table of the same name with
/// other key types. (A file of the first layout, which had no version,
/// fails on its trees table, whose value type differs.)
fn open_all_tables(txn: &redb::WriteTransaction) -> Result<()> {
    {
        let mut meta = txn.open_table(META)?;
        let stored = meta.get(FORMAT_VERSION)?.map(|g| g.value());
        match stored {
            None => {
                meta.insert(FORMAT_VERSION, FORMAT_VERSION_CURRENT)?;
            }
            Some(FORMAT_VERSION_CURRENT) => {}
            Some(other) => {
                return Err(Error::Storage(format!(
                    "database format version {other}; this build reads version {FORMAT_VERSION_CURRENT}"
                )))
            }
        }
    }
    txn.open_table(TREES)?;
    txn.open_table(ROWS)?;
    txn.open_table(CURSORS)?;
    Ok(())
}

fn delete_tree_rows(txn: &redb::WriteTransaction, key: &TreeKey, t: u64) -> Result<()> {
    txn.open_table(ROWS)?
        .retain_in(tree_rows(t), |_, _| false)?;
    txn.open_table(CURSORS)?
        .retain_in((t, 0, 0)..=(t, u8::MAX, u16::MAX), |_, _| false)?;
    txn.open_table(TREES)?
        .remove(tree_key_bytes(key).as_slice())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_error(path: &std::path::Path) -> Error {
        match Forest::open(path, ForestOptions::default()) {
            Ok(_) => panic!("a database of another layout was opened"),
            Err(e) => e,
        }
    }

    fn add(forest: &Forest, tree: &TreeKey) {
        let request = WriteRequest {
            tree: tree.clone(),
            op: WriteOp::Move {
                parent: ROOT,
                child: None,
                items: vec![],
            },
        };
        let outcome = forest
            .write_batch(&[request])
            .unwrap()
            .results
            .pop()
            .unwrap();
        assert!(outcome.is_ok(), "{outcome:?}");
    }

    #[test]
    fn remembered_tree_numbers_never_name_another_tree() {
        let forest = Forest::in_memory(ForestOptions::default()).unwrap();
        let a = TreeKey::new(ContainerId([1; 32]), "a");
        let b = TreeKey::new(ContainerId([1; 32]), "b");
        add(&forest, &a);
        assert_eq!(forest.next_height(&a), Ok(1), "a is remembered as tree 1");
        forest.clear().unwrap();
        // Numbering starts over: b becomes tree 1.
        add(&forest, &b);
        add(&forest, &b);
        assert_eq!(forest.next_height(&b), Ok(2));
        assert_eq!(forest.next_height(&a), Ok(0), "a is gone, not b");
        assert!(!forest.tree_exists(&a).unwrap());
        // The write path too: a is created afresh, not appended to b.
        add(&forest, &a);
        assert_eq!(forest.next_height(&a), Ok(1));
        assert_eq!(forest.next_height(&b), Ok(2));
        // A dropped tree's number is not reused; its hint leads nowhere.
        forest.tree_drop(&a.cid, Some("a")).unwrap();
        assert_eq!(forest.next_height(&a), Ok(0));
        add(&forest, &a);
        assert_eq!(forest.next_height(&a), Ok(1));
        forest.check_invariants(&a).unwrap();
        forest.check_invariants(&b).unwrap();
    }

    /// A redb file written by plain redb in one commit of `fill`, in a
    /// fresh directory (kept alive by the returned handle).
    fn write_raw_file(
        fill: impl FnOnce(&redb::WriteTransaction),
    ) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("forest.redb");
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        fill(&txn);
        txn.commit().unwrap();
        (dir, path)
    }

    /// Writes a file that claims format `version`, with the tables
    /// `fill` creates in that version's layout, and asserts that opening it
    /// is refused by the version check with a typed error.
    fn assert_old_format_refused(version: u64, fill: impl FnOnce(&redb::WriteTransaction)) {
        let (_dir, path) = write_raw_file(|txn| {
            txn.open_table(META)
                .unwrap()
                .insert(FORMAT_VERSION, version)
                .unwrap();
            fill(txn);
        });
        let error = open_error(&path);
        let expected = format!("format version {version}");
        assert!(
            matches!(&error, Error::Storage(m) if m.contains(&expected)),
            "{error:?}"
        );
    }

    #[test]
    fn a_version_2_file_is_refused() {
        // Version 2 kept the children index in its own table and keyed
        // `rows` by two integers; the typed refusal must come before any
        // table of the new layout is opened over those.
        const V2_ROWS: redb::TableDefinition<(u64, u64), &[u8]> =
            redb::TableDefinition::new("rows");
        const V2_CHILDREN: redb::TableDefinition<(u64, u64, u64, u64), &[u8]> =
            redb::TableDefinition::new("children");
        assert_old_format_refused(2, |txn| {
            txn.open_table(V2_ROWS)
                .unwrap()
                .insert((4, 0), &[0u8; 40][..])
                .unwrap();
            txn.open_table(V2_CHILDREN)
                .unwrap()
                .insert((1, 0, 7, 9), &[0u8; 10][..])
                .unwrap();
        });
    }

    #[test]
    fn a_version_3_file_is_refused() {
        // Version 3 keyed `rows` by redb's four-integer tuple: the same
        // bytes as `RowKey`, another type name, so redb would refuse the
        // table with a type mismatch; the version check refuses first.
        const V3_ROWS: redb::TableDefinition<(u64, u64, u64, u64), &[u8]> =
            redb::TableDefinition::new("rows");
        assert_old_format_refused(3, |txn| {
            txn.open_table(V3_ROWS)
                .unwrap()
                .insert((4, 0, 0, 0), &[0u8; 40][..])
                .unwrap();
        });
    }

    #[test]
    fn dropping_a_tree_removes_its_children_rows_only() {
        let forest = Forest::in_memory(ForestOptions::default()).unwrap();
        let a = TreeKey::new(ContainerId([1; 32]), "a");
        let b = TreeKey::new(ContainerId([1; 32]), "b");
        for tree in [&a, &b] {
            add(&forest, tree);
            add(&forest, tree);
            // A child of TRASH (the largest parent id) too.
            let node = forest.get_children(tree, ROOT).unwrap()[0];
            let remove = WriteRequest {
                tree: tree.clone(),
                op: WriteOp::Remove { node },
            };
            forest
                .write_batch(&[remove])
                .unwrap()
                .results
                .pop()
                .unwrap()
                .unwrap();
            assert_eq!(forest.get_children(tree, TRASH).unwrap(), vec![node]);
        }
        let (_, number_a) = forest.read_tree_number(&a).unwrap();
        forest.tree_drop(&a.cid, Some("a")).unwrap();
        let txn = forest.begin_read().unwrap();
        let rows = txn.open_table(ROWS).unwrap();
        assert!(rows.range(tree_rows(number_a)).unwrap().next().is_none());
        assert_eq!(forest.get_children(&b, ROOT).unwrap().len(), 1);
        assert_eq!(forest.get_children(&b, TRASH).unwrap().len(), 1);
        forest.check_invariants(&b).unwrap();
    }

    #[test]
    fn a_row_key_of_no_kind_is_a_typed_error() {
        let forest = Forest::in_memory(ForestOptions::default()).unwrap();
        let tree = TreeKey::new(ContainerId([1; 32]), "a");
        add(&forest, &tree);
        let (_, t) = forest.read_tree_number(&tree).unwrap();
        let txn = forest.begin_write().unwrap();
        {
            let (prefix, _, _, _) = node_key(t, 0);
            let mut rows = txn.open_table(ROWS).unwrap();
            rows.insert((prefix, 1, 7, 0), &[0u8; 4][..]).unwrap();
        }
        txn.commit().unwrap();
        let error = forest.dump(&tree).unwrap_err();
        assert!(matches!(error, Error::Malformed(_)), "{error:?}");
        assert!(forest.check_invariants(&tree).is_err());
    }

    #[test]
    fn another_format_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("forest.redb");
        drop(Forest::open(&path, ForestOptions::default()).unwrap());
        {
            let db = redb::Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(META)
                .unwrap()
                .insert(FORMAT_VERSION, 1)
                .unwrap();
            txn.commit().unwrap();
        }
        let error = open_error(&path);
        assert!(
            matches!(&error, Error::Storage(m) if m.contains("format version 1")),
            "{error:?}"
        );
    }

    #[test]
    fn the_first_layout_is_refused() {
        // Version 1 kept whole tree records as the trees table's values.
        const OLD_TREES: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("trees");
        let (_dir, path) = write_raw_file(|txn| {
            txn.open_table(OLD_TREES)
                .unwrap()
                .insert(&[0u8; 33][..], &[1u8][..])
                .unwrap();
        });
        let error = open_error(&path);
        assert!(matches!(error, Error::Storage(_)), "{error:?}");
    }
}
