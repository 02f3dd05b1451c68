//! The forest: every tree of a node, stored in one redb database, updated by
//! the undo/do/redo algorithm of the move CRDT (Kleppmann et al., TPDS 2021).
//!
//! Layout: `records` declares the tables and the stored encodings, `read`
//! holds the lookups shared by reads and writes, `write` the undo/do/redo
//! write path, `check` the full invariant check.

mod batch;
mod check;
mod counting;
mod dir_cache;
mod epochs;
mod list;
mod overlay;
mod query;
mod read;
pub mod records;
mod stamps;
mod stats;
#[cfg(test)]
mod tests;
mod tree_numbers;
mod trees;
pub mod wal;
mod write;

use crate::error::{Error, Result};
use crate::types::*;
use crate::validate::InputLimits;
use records::*;
use redb::{Database, ReadableDatabase, ReadableTable};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use wal::{Wal, WalOpener, WalOptions, WalStats};

pub use batch::{CheckedBatch, CommitSummary, Committed, InvariantCheck};
pub use check::{Recheck, ReplicaContent};
pub use counting::CountingBackend;
pub use dir_cache::{DIR_CACHE_ENTRIES_MAX, DIR_CACHE_NAME_BYTES_MAX};
pub use list::{ListCursor, ListOrder, ListPage, CURSOR_OVERHEAD_BYTES};
pub use query::{AnswerBounds, PathAnswer};
pub use stamps::{StampPage, STAMP_WALK_GAP_MAX};
pub use stats::{KindUse, StorageStats, TableUse};

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
    /// How far a pushed op's counter (`WriteOp::Apply`) may be ahead of
    /// its tree's (`limits.counter_jump_max`, docs/design.md §9).
    pub counter_jump_max: u64,
    /// redb's page cache of a file-backed forest (`pilorama.cache_bytes`).
    pub cache_bytes: usize,
    /// The write-ahead log of a durable forest opened with one
    /// (`Forest::open`, `Forest::open_with_wal`).
    pub wal: WalOptions,
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
            counter_jump_max: 1 << 20,
            cache_bytes: crate::config::PILORAMA_CACHE_BYTES_DEFAULT,
            wal: WalOptions::default(),
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
    /// A replicated op applied at its own timestamp; idempotent. Its
    /// counter may be at most `counter_jump_max` ahead of its tree's.
    Apply { op: Move },
    /// A replicated op this replica took from a peer's log by its own
    /// sync: as `Apply`, without the counter bound. A peer's log may
    /// begin above every counter this replica holds (a tree dropped and
    /// written again starts above its dropped incarnation's counter,
    /// and the ops below went with the drop), so the ops between that
    /// the bound waits for may never come (docs/design.md §9).
    Pulled { op: Move },
}

impl WriteOp {
    /// The op of a replicated write (`Apply`, `Pulled`); `None` for a
    /// local one.
    pub fn replicated(&self) -> Option<&Move> {
        match self {
            WriteOp::Apply { op } | WriteOp::Pulled { op } => Some(op),
            _ => None,
        }
    }
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
        /// The leaf's parent: the last directory of the path.
        parent: NodeId,
        ts: Timestamp,
    },
    /// Apply: `fresh` is false when the op was already in the log.
    Applied { fresh: bool },
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
    /// Opens the write-ahead log again with the database; `None`: every
    /// batch is a commit of its own durability (no log).
    wal_opener: Option<WalOpener>,
    /// The open log; `None` in a forest with one only while the database
    /// is closed. Locked inside write transactions only.
    wal: Mutex<Option<Wal>>,
    /// Stats of logs closed by reopens.
    wal_stats_closed: Mutex<WalStats>,
    /// The next batch commits durably, as a checkpoint (with checkpoints
    /// between batches: the next `checkpoint` is due).
    checkpoint_requested: AtomicBool,
    /// Batches never commit as checkpoints: whoever set it
    /// (`checkpoint_between_batches`) makes them with `checkpoint`.
    checkpoints_between: AtomicBool,
}

/// A read snapshot of one existing tree.
pub(crate) struct TreeRead {
    /// The tree's table of rows in that snapshot (the table keeps the
    /// snapshot alive on its own).
    rows: redb::ReadOnlyTable<RowKey, &'static [u8]>,
    /// The children index in the same snapshot.
    children: redb::ReadOnlyTable<ChildKey, &'static [u8]>,
    rec: TreeRecord,
}

/// The table of rows of tree `number` in a read snapshot; `None` when
/// there is none (a remembered number of a tree since dropped).
fn open_tree_rows(
    txn: &redb::ReadTransaction,
    number: u64,
) -> Result<Option<redb::ReadOnlyTable<RowKey, &'static [u8]>>> {
    match txn.open_table(tree_table(&tree_table_name(number))) {
        Ok(table) => Ok(Some(table)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The table of rows of tree `number`, which the trees table names: its
/// absence is damage.
fn tree_rows_named(
    txn: &redb::ReadTransaction,
    number: u64,
) -> Result<redb::ReadOnlyTable<RowKey, &'static [u8]>> {
    open_tree_rows(txn, number)?
        .ok_or_else(|| Error::Malformed(format!("tree {number} has no table of rows")))
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
    /// Commits durably; in a forest with a log, as a checkpoint.
    durable: bool,
    forest: &'a Forest,
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
    /// Commits; a durable commit of a forest with a log is a checkpoint.
    pub(crate) fn commit(self) -> Result<()> {
        if !self.durable || self.forest.wal_opener.is_none() {
            return Ok(self.txn.commit()?);
        }
        let mut slot = self.forest.lock_wal();
        let wal = slot.as_mut().ok_or_else(closed_database)?;
        checkpoint_commit(self.txn, wal)
    }

    /// Makes the commit durable or not.
    pub(crate) fn set_durable(&mut self, durable: bool) -> Result<()> {
        let durability = if durable {
            redb::Durability::Immediate
        } else {
            redb::Durability::None
        };
        self.txn
            .set_durability(durability)
            .map_err(|e| Error::Storage(e.to_string()))?;
        self.durable = durable;
        Ok(())
    }

    pub(crate) fn abort(self) -> Result<()> {
        Ok(self.txn.abort()?)
    }
}

/// Creates an empty database at `path` when nothing (or an empty file) is
/// there. redb writes a new file's header in two steps, its magic number
/// last; a failure or crash in between leaves a file it refuses to open
/// from then on. So the database is made under a temporary name, synced,
/// renamed over `path` and the directory synced: `path` is either empty
/// or a whole database. A temporary file left by an earlier try is
/// replaced.
fn create_aside(path: &std::path::Path) -> Result<()> {
    let io = |what: &str, error: std::io::Error| Error::Storage(format!("{what}: {error}"));
    match std::fs::metadata(path) {
        Ok(meta) if meta.len() > 0 => return Ok(()),
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(io("reading the database file", error)),
    }
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".creating");
    let aside = path.with_file_name(name);
    match std::fs::remove_file(&aside) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(io("removing an unfinished database", error)),
    }
    drop(redb::Builder::new().create(&aside)?);
    std::fs::File::open(&aside)
        .and_then(|file| file.sync_all())
        .map_err(|error| io("syncing the new database", error))?;
    std::fs::rename(&aside, path).map_err(|error| io("installing the new database", error))?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => std::path::Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|error| io("syncing the database directory", error))
}

/// How every opener of a forest configures redb: its page cache from
/// `ForestOptions::cache_bytes`.
fn redb_builder(cache_bytes: usize) -> redb::Builder {
    let mut builder = redb::Builder::new();
    builder.set_cache_size(cache_bytes);
    builder
}

/// The last log record a database (or transaction) holds.
fn wal_position(meta: &impl ReadableTable<&'static str, u64>) -> Result<u64> {
    Ok(meta.get(WAL_POSITION)?.map_or(0, |g| g.value()))
}

fn closed_database() -> Error {
    Error::Storage("database closed after a storage error; reopening".into())
}

/// Commits `txn`, which must be durable, as a checkpoint of `wal`: the
/// log position the transaction holds ([`WAL_POSITION`]) is durable with
/// it, and the segments it covers can go. A failure to remove them only
/// leaves them for the next checkpoint.
fn checkpoint_commit(txn: redb::WriteTransaction, wal: &mut Wal) -> Result<()> {
    let seq = wal_position(&txn.open_table(META)?)?;
    txn.commit()?;
    if let Err(error) = wal.checkpointed(seq) {
        tracing::warn!(%error, "removing covered log segments");
    }
    Ok(())
}

impl Forest {
    /// Opens (or creates) a forest in a file; `reopen` opens the file again.
    /// A missing or empty file is first created whole on the side
    /// (`create_aside`), so a creation cut short leaves no file redb refuses.
    /// A durable forest keeps its write-ahead log in the directory
    /// `<path>.wal` (`wal::wal_dir_of`) unless `options.wal.enabled` is
    /// false.
    pub fn open(path: &std::path::Path, options: ForestOptions) -> Result<Self> {
        let db_path = path.to_path_buf();
        let cache_bytes = options.cache_bytes;
        let opener: DatabaseOpener = Box::new(move || {
            create_aside(&db_path)?;
            Ok(redb_builder(cache_bytes).create(&db_path)?)
        });
        let dir = wal::wal_dir_of(path);
        let wal: WalOpener = Box::new(move || {
            let storage = wal::DirStorage::open(&dir)
                .map_err(|e| Error::Storage(format!("write-ahead log directory: {e}")))?;
            Ok(Box::new(storage) as Box<dyn wal::WalStorage>)
        });
        Self::open_with_wal(opener, wal, options)
    }

    /// Opens (or creates) a forest with `opener` and its write-ahead log
    /// with `wal` (both called again by `reopen`), replaying the records
    /// the database's last checkpoint does not cover. Without
    /// `options.durable` or `options.wal.enabled` the log is not used.
    pub fn open_with_wal(
        opener: DatabaseOpener,
        wal: WalOpener,
        options: ForestOptions,
    ) -> Result<Self> {
        let db = opener()?;
        let use_wal = options.durable && options.wal.enabled;
        let mut forest = Self::bare(options);
        forest.opener = Some(opener);
        forest.wal_opener = use_wal.then_some(wal);
        forest.start(db)?;
        Ok(forest)
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
        let cache_bytes = options.cache_bytes;
        Self::open_reopenable(
            Box::new(move || Ok(redb_builder(cache_bytes).create_with_backend(backend()?)?)),
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
        // Lost non-durable commits may have created trees whose numbers
        // the counter now gives again. Still under the directory lock.
        self.tree_numbers.new_epoch();
        // The log is read again too: a record whose append reported an
        // error may be whole, and is then replayed like any other.
        self.recover_wal(&db, &mut dirs)?;
        *slot = Some(db);
        Ok(())
    }

    /// Opens (or creates) a forest on any redb storage backend (the
    /// simulator's disk, an in-memory backend).
    pub fn open_with_backend(
        backend: impl redb::StorageBackend,
        options: ForestOptions,
    ) -> Result<Self> {
        let db = redb_builder(options.cache_bytes).create_with_backend(backend)?;
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
        let forest = Self::bare(options);
        forest.start(db)?;
        Ok(forest)
    }

    /// A forest with no database yet.
    fn bare(options: ForestOptions) -> Self {
        Self {
            db: std::sync::RwLock::new(None),
            opener: None,
            options,
            dir_cache: Mutex::default(),
            tree_numbers: tree_numbers::TreeNumbers::default(),
            wal_opener: None,
            wal: Mutex::new(None),
            wal_stats_closed: Mutex::default(),
            checkpoint_requested: AtomicBool::new(false),
            checkpoints_between: AtomicBool::new(false),
        }
    }

    /// Puts `db` in place after creating its tables and replaying the log
    /// into it.
    fn start(&self, db: Database) -> Result<()> {
        create_tables(&db)?;
        let mut dirs = self.lock_dir_cache();
        self.recover_wal(&db, &mut dirs)?;
        *self.db.write().unwrap_or_else(|e| e.into_inner()) = Some(db);
        Ok(())
    }

    /// Opens the write-ahead log (when the forest has one) and replays
    /// into `db`, in a non-durable commit each, the records its last
    /// checkpoint does not cover, then checkpoints them. Nobody else can
    /// write to `db` meanwhile: it is not in place yet.
    fn recover_wal(&self, db: &Database, dirs: &mut dir_cache::DirCache) -> Result<()> {
        let Some(opener) = &self.wal_opener else {
            return Ok(());
        };
        let retired = self.lock_wal().take();
        if let Some(old) = retired {
            let mut closed = self.lock_wal_stats();
            *closed = closed.plus(&old.stats);
        }
        let storage = opener()?;
        let checkpointed = wal_position(&db.begin_read()?.open_table(META)?)?;
        let (mut wal, records) = Wal::open(storage, self.options.wal, checkpointed)?;
        let replayed = self.replay(db, dirs, &records);
        if replayed.is_err() {
            dirs.clear();
        }
        replayed?;
        if !records.is_empty() {
            let mut txn = db.begin_write()?;
            txn.set_durability(redb::Durability::Immediate)
                .map_err(|e| Error::Storage(e.to_string()))?;
            checkpoint_commit(txn, &mut wal)?;
            tracing::info!(records = records.len(), "write-ahead log replayed");
        }
        *self.lock_wal() = Some(wal);
        Ok(())
    }

    /// Stores each record as its batch did, one non-durable commit each.
    fn replay(
        &self,
        db: &Database,
        dirs: &mut dir_cache::DirCache,
        records: &[wal::Replayed],
    ) -> Result<()> {
        // Checked when the batch ran; a limit changed since must not
        // refuse what was acknowledged.
        let options = ForestOptions {
            counter_jump_max: u64::MAX,
            ..self.options.clone()
        };
        for record in records {
            let trees = write::journal::decode(&record.payload)?;
            let mut txn = db.begin_write()?;
            txn.set_durability(redb::Durability::None)
                .map_err(|e| Error::Storage(e.to_string()))?;
            {
                let mut writer =
                    write::Writer::open(&txn, &options, dirs, &self.tree_numbers, false)?;
                for tree in &trees {
                    writer.replay_tree(tree)?;
                }
                writer.flush()?;
            }
            txn.open_table(META)?.insert(WAL_POSITION, record.seq)?;
            txn.commit()?;
        }
        Ok(())
    }

    fn lock_wal(&self) -> MutexGuard<'_, Option<Wal>> {
        self.wal.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_wal_stats(&self) -> MutexGuard<'_, WalStats> {
        self.wal_stats_closed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// What the write-ahead log did since the forest was opened (zeros
    /// without a log).
    pub fn wal_stats(&self) -> WalStats {
        let closed = *self.lock_wal_stats();
        match self.lock_wal().as_ref() {
            Some(wal) => closed.plus(&wal.stats),
            None => closed,
        }
    }

    /// Bytes of log records no checkpoint covers yet (0 without a log):
    /// at most what a reopen after a crash would replay.
    pub fn wal_bytes_since_checkpoint(&self) -> u64 {
        self.lock_wal().as_ref().map_or(0, Wal::since_checkpoint)
    }

    /// True when batches go through a write-ahead log.
    pub fn has_wal(&self) -> bool {
        self.wal_opener.is_some()
    }

    /// Makes the next batch commit durably, as a checkpoint (the service
    /// asks every `pilorama.checkpoint_interval`).
    pub fn request_checkpoint(&self) {
        self.checkpoint_requested.store(true, Ordering::SeqCst);
    }

    /// From now on no batch commits as a checkpoint, when asked to or
    /// after `pilorama.checkpoint_bytes` of log: the caller makes every
    /// checkpoint with [`Forest::checkpoint`], between batches, when
    /// [`Forest::checkpoint_due`] says so (`batcher::checkpointing`).
    pub fn checkpoint_between_batches(&self) {
        self.checkpoints_between.store(true, Ordering::SeqCst);
    }

    /// True when a checkpoint was asked for (`request_checkpoint`) or
    /// `pilorama.checkpoint_bytes` of log were written since the last one;
    /// false without a log.
    pub fn checkpoint_due(&self) -> bool {
        self.wal_opener.is_some()
            && (self.checkpoint_requested.load(Ordering::SeqCst)
                || self.lock_wal().as_ref().is_some_and(Wal::checkpoint_due))
    }

    /// A durable commit now that covers every log record so far and lets
    /// whole segments go; nothing to do without a log. It answers a
    /// pending `request_checkpoint`.
    pub fn checkpoint(&self) -> Result<()> {
        if self.wal_opener.is_none() {
            return Ok(());
        }
        let txn = self.begin_write()?;
        self.checkpoint_requested.store(false, Ordering::SeqCst);
        txn.commit()
    }

    fn begin_read(&self) -> Result<redb::ReadTransaction> {
        let db = self.db.read().unwrap_or_else(|e| e.into_inner());
        Ok(db.as_ref().ok_or_else(closed_database)?.begin_read()?)
    }

    pub fn options(&self) -> &ForestOptions {
        &self.options
    }

    /// A write transaction that commits durably unless the operator chose
    /// `no_sync`; with a log, its durable commit is a checkpoint.
    fn begin_write(&self) -> Result<WriteTxn<'_>> {
        self.begin_write_as(self.options.durable)
    }

    /// A batch's write transaction: with a log, it commits without
    /// durability after its log record is synced (`write_batch`).
    fn begin_batch_write(&self) -> Result<WriteTxn<'_>> {
        self.begin_write_as(self.options.durable && self.wal_opener.is_none())
    }

    fn begin_write_as(&self, durable: bool) -> Result<WriteTxn<'_>> {
        let db = self.db.read().unwrap_or_else(|e| e.into_inner());
        let txn = db.as_ref().ok_or_else(closed_database)?.begin_write()?;
        let mut txn = WriteTxn {
            txn,
            durable,
            forest: self,
            _db: db,
        };
        txn.set_durable(durable)?;
        Ok(txn)
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
        let children = txn.open_table(CHILDREN)?;
        // A hint from an epoch that ended after it was taken may name
        // another tree in this snapshot (see `tree_numbers`).
        if let Some(number) = hint.filter(|_| self.tree_numbers.epoch() == epoch) {
            if let Some(rows) = open_tree_rows(&txn, number)? {
                if let Some(rec) = read::tree_state_if_present(&rows, number)? {
                    return Ok(TreeRead {
                        rows,
                        children,
                        rec,
                    });
                }
            }
        }
        let number = tree_number(&txn.open_table(TREES)?, tree)?;
        let rows = tree_rows_named(&txn, number)?;
        let rec = read::tree_state(&rows, number)?;
        self.tree_numbers.learn(epoch, tree, number);
        Ok(TreeRead {
            rows,
            children,
            rec,
        })
    }
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
    txn.open_table(CHILDREN)?;
    txn.open_table(CURSORS)?;
    txn.open_table(DROPPED)?;
    Ok(())
}
