//! The tree service: validation, the batcher, replication and background
//! sync around one forest.
//!
//! Replication is built so that nothing acknowledged is ever dropped:
//! - the truth is a durable per-(tree, peer) push cursor over the local log;
//!   a pusher sends the ops that originated here from that cursor and moves
//!   it only after the peer acknowledged them;
//! - the post-commit hint ("tree X has new ops") only says *when* to look; a
//!   full hint queue drops the hint, never an op, and a periodic sweep (also
//!   at start, which covers restarts) finds whatever the hints missed;
//! - background sync pulls every peer's log from a durable per-peer pull
//!   cursor that moves only over ops applied here.

use crate::batcher::{Batcher, BatcherOptions, BatcherStats, CommitObserver};
use crate::canary::{self, Canary};
use crate::config::{Config, MESSAGE_OVERHEAD_BYTES};
use crate::error::{Error, Result};
use crate::forest::{
    CommitSummary, CursorKind, Forest, OpLogPage, WriteOp, WriteOutcome, WriteRequest,
};
use crate::net::Transport;
use crate::proto::{Request, Response};
use crate::push_window::PushWindows;
use crate::runtime::{blocking, Env};
use crate::types::*;
use crate::validate::{self, too_large, InputLimits};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch, Notify, Semaphore};

/// Pages pulled from one peer for one tree in one sync round. Keeps a round
/// finite when a peer keeps writing; the next round goes on from the cursor.
pub const MAX_PULL_PAGES_PER_ROUND: usize = 10_000;

/// How far (in heights) an in-memory cursor may run ahead of its durable
/// copy before it is written. A lagging durable cursor only costs re-sent
/// or re-pulled ops after a restart (Apply absorbs them); writing it after
/// every page cost a durable commit per page.
const CURSOR_LAG_MAX: u64 = 512;

/// A push or pull cursor ahead of its durable copy is written at the latest
/// after this many `replication_timeout`s, and not before
/// `CURSOR_PERSIST_PERIOD_MIN`, so that a quiet tree's resend or re-pull
/// after a restart is bounded in time too (`CURSOR_LAG_MAX` bounds it in
/// ops). Each write is a durable commit of its own.
const CURSOR_PERIODS: u32 = 16;
const CURSOR_PERSIST_PERIOD_MIN: Duration = Duration::from_secs(60);

/// Estimated encoded bytes of a node or op beyond its meta (ids, timestamp,
/// height, framing of the key/value list).
const ITEM_OVERHEAD_BYTES: usize = 64;

/// Largest encoding of one `LogStamp` (two varint-encoded u64).
const LOG_STAMP_BYTES_MAX: usize = 20;

/// Held heights between two missing ones that a puller fetches anyway, so
/// that scattered gaps cost one GetOpLog call, not one each. The held ops
/// in between are filtered out before any write.
const PULL_GAP_HEIGHTS_MAX: u64 = 32;

/// Counters a node exposes (checkers, load reports).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceStats {
    pub writes_committed: u64,
    pub batches_committed: u64,
    pub batches_failed: u64,
    pub writes_rejected_overload: u64,
    pub ops_pushed: u64,
    pub ops_pulled: u64,
    pub sync_rounds: u64,
    /// Writes admitted by the batcher and not answered yet (whether or not
    /// their caller still waits); a value that stays above 0 on an idle
    /// node means a write hangs.
    pub pending_writes: u64,
    /// Push calls that failed (retried later).
    pub push_failures: u64,
    /// Passes of pushers over the local log (each a read of the log), also
    /// the ones that found nothing to send.
    pub push_passes: u64,
    /// Peer calls during sync that failed (that peer is skipped this round).
    pub sync_peer_errors: u64,
    /// Replication hints dropped because their queue was full.
    pub hints_dropped: u64,
    /// Times the database was reopened after a storage error.
    pub reopens: u64,
}

#[derive(Default)]
struct Counters {
    ops_pushed: AtomicU64,
    ops_pulled: AtomicU64,
    sync_rounds: AtomicU64,
    push_failures: AtomicU64,
    push_passes: AtomicU64,
    sync_peer_errors: AtomicU64,
    hints_dropped: AtomicU64,
    reopens: AtomicU64,
}

/// Scheduling state of the pusher of one (tree, peer).
#[derive(Default)]
struct PushState {
    running: bool,
    dirty: bool,
    /// Acknowledged height known in memory; the durable cursor may lag
    /// behind it (a restart then re-sends a little, which Apply absorbs),
    /// so that replication does not add a durable commit per batch.
    acked: u64,
    /// The durable cursor as last read or written; `None` until read. Only
    /// this pusher and Drop write it, so a cached copy saves a read
    /// transaction per pass.
    durable: Option<u64>,
    /// When the cursor was last made durable.
    persisted_at: Option<Duration>,
    /// The tree's change count (`Inner::changes`) at the start of the last
    /// pass that left nothing to send: while it is current, a sweep has
    /// nothing to find for this peer.
    clean_at: Option<u64>,
}

impl PushState {
    /// Whether a sweep should start a pass: something may be unsent, or the
    /// durable cursor lags and is due to be written.
    fn wants_pass(&self, changes: u64, now: Duration, period: Duration) -> bool {
        let lagging = self.durable.is_some_and(|durable| self.acked > durable);
        let due = self
            .persisted_at
            .is_none_or(|at| now.saturating_sub(at) >= period);
        self.clean_at != Some(changes) || (lagging && due)
    }
}

/// The pull cursor of one (tree, peer), kept in memory and made durable
/// lazily like the push cursor: a lagging durable copy only costs a re-pull
/// after a restart, which is filtered against the log before any write.
#[derive(Clone, Copy, Default)]
struct PullState {
    cursor: u64,
    durable: u64,
    persisted_at: Option<Duration>,
}

/// Locks of one tree: `drop_guard` is held shared by push and pull passes and
/// exclusively by Drop, so a cursor of a dropped tree is never written back;
/// `pull` keeps syncs of one tree one at a time.
#[derive(Default, Clone)]
struct TreeLocks {
    drop_guard: Arc<tokio::sync::RwLock<()>>,
    pull: Arc<tokio::sync::Mutex<()>>,
}

type PushKey = (TreeKey, ReplicaId);

struct Inner {
    config: Config,
    forest: Arc<Forest>,
    env: Env,
    transport: Arc<dyn Transport>,
    batcher: Batcher,
    counters: Arc<Counters>,
    push_slots: Arc<Semaphore>,
    pushers: Mutex<BTreeMap<PushKey, PushState>>,
    /// Pull cursors by (tree, cursor peer).
    pulls: Mutex<BTreeMap<PushKey, PullState>>,
    /// Per tree, how many committed batches stored ops in it (local or
    /// replicated) since start; bumped by the commit hook before any hint.
    changes: Arc<Mutex<BTreeMap<TreeKey, u64>>>,
    tree_locks: Mutex<BTreeMap<TreeKey, TreeLocks>>,
    /// Recently stored local-origin ops per tree, shared by the pushers.
    windows: Arc<PushWindows>,
    /// Canary `ReplicationDropsOnFullQueue`: heights pushers skip to.
    push_skips: Arc<Mutex<BTreeMap<TreeKey, u64>>>,
    closed: AtomicBool,
    shutdown: watch::Sender<bool>,
    /// Signalled on every storage error; the recovery task reopens the
    /// database (redb refuses all writes after an I/O error until then).
    storage_failed: Arc<Notify>,
}

/// One running node of the tree service.
pub struct Service {
    inner: Arc<Inner>,
}

impl Service {
    /// Starts the batcher, replication and (if configured) background sync
    /// on `env`, serving `forest`. Peers are reached through `transport`.
    pub fn start(
        config: Config,
        forest: Arc<Forest>,
        env: Env,
        transport: Arc<dyn Transport>,
    ) -> Result<Arc<Service>> {
        config.validate()?;
        if forest.options().replica_id != config.node.replica_id {
            return Err(Error::Config(format!(
                "node.replica_id: {} but the forest was opened as replica {}",
                config.node.replica_id,
                forest.options().replica_id
            )));
        }
        let storage_failed = Arc::new(Notify::new());
        let windows = Arc::new(PushWindows::new(config.limits.push_window_ops));
        let (hints, hint_receiver) = mpsc::channel(config.tree.replication_channel_capacity);
        let observer = Arc::new(CommitWatch {
            windows: windows.clone(),
            storage_failed: storage_failed.clone(),
            changes: Arc::default(),
            hints,
            counters: Arc::default(),
            forest: forest.clone(),
            push_skips: Arc::default(),
        });
        let commit = {
            let forest = forest.clone();
            Arc::new(move |requests: &[WriteRequest]| forest.write_batch(requests))
        };
        let batcher = Batcher::start_with_commit(
            commit,
            observer.clone(),
            env.clone(),
            BatcherOptions {
                max_batch_size: config.pilorama.max_batch_size,
                max_batch_delay: config.pilorama.max_batch_delay,
                replicated_batch_delay: config.pilorama.replicated_batch_delay,
                max_pending: config.limits.max_pending_writes,
                max_commit_size: config.limits.max_commit_size,
            },
        );
        let (shutdown, _) = watch::channel(false);
        let inner = Arc::new(Inner {
            push_slots: Arc::new(Semaphore::new(config.tree.replication_worker_count)),
            windows,
            config,
            forest,
            env,
            transport,
            batcher,
            counters: observer.counters.clone(),
            pushers: Mutex::default(),
            pulls: Mutex::default(),
            changes: observer.changes.clone(),
            tree_locks: Mutex::default(),
            push_skips: observer.push_skips.clone(),
            closed: AtomicBool::new(false),
            shutdown,
            storage_failed,
        });
        spawn(
            &inner,
            "replication-hints",
            Inner::run_hints(inner.clone(), hint_receiver),
        );
        spawn(
            &inner,
            "replication-sweep",
            Inner::run_sweeps(inner.clone()),
        );
        if let Some(interval) = inner.config.tree.sync_interval {
            spawn(&inner, "sync", Inner::run_sync(inner.clone(), interval));
        }
        if inner.forest.reopenable() {
            spawn(
                &inner,
                "storage-recovery",
                Inner::run_recovery(inner.clone()),
            );
        }
        Ok(Arc::new(Service { inner }))
    }

    /// Answers one request; errors are `Response::Error`.
    pub async fn handle(&self, request: Request) -> Response {
        if self.inner.closed.load(Ordering::SeqCst) {
            return Response::Error(Error::ShuttingDown);
        }
        match self.inner.dispatch(request).await {
            Ok(response) => response,
            Err(error) => {
                self.inner.note_error(&error);
                Response::Error(error)
            }
        }
    }

    /// Runs one full background-sync round now (every tree, every peer),
    /// whether or not periodic sync is enabled.
    pub async fn sync_now(&self) {
        self.inner.sync_round().await;
    }

    /// True when every locally stored op that originated here has been
    /// acknowledged by every peer that should receive it.
    pub fn replication_idle(&self) -> bool {
        self.inner.replication_idle().unwrap_or(false)
    }

    pub fn stats(&self) -> ServiceStats {
        let batcher: BatcherStats = self.inner.batcher.stats();
        let c = &self.inner.counters;
        ServiceStats {
            writes_committed: batcher.writes,
            batches_committed: batcher.batches,
            batches_failed: batcher.failed,
            writes_rejected_overload: batcher.rejected,
            ops_pushed: c.ops_pushed.load(Ordering::Relaxed),
            ops_pulled: c.ops_pulled.load(Ordering::Relaxed),
            sync_rounds: c.sync_rounds.load(Ordering::Relaxed),
            pending_writes: batcher.pending,
            push_failures: c.push_failures.load(Ordering::Relaxed),
            push_passes: c.push_passes.load(Ordering::Relaxed),
            sync_peer_errors: c.sync_peer_errors.load(Ordering::Relaxed),
            hints_dropped: c.hints_dropped.load(Ordering::Relaxed),
            reopens: c.reopens.load(Ordering::Relaxed),
        }
    }

    pub fn forest(&self) -> &Arc<Forest> {
        &self.inner.forest
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Stops background work; in-flight callers get `ShuttingDown`.
    pub fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.batcher.shutdown();
        let _ = self.inner.shutdown.send(true);
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn spawn(
    inner: &Inner,
    name: &'static str,
    task: impl std::future::Future<Output = ()> + Send + 'static,
) {
    inner.env.runtime.spawn(name, Box::pin(task));
}

/// What the service does after every commit: the push windows learn which
/// trees may hold new ops, the change counts move (so a sweep no longer
/// takes a pusher's last clean pass as current), the pushers of trees with
/// new local ops get a hint, and a storage error wakes the recovery. It
/// must not block, so a full hint queue drops the hint (the sweep covers
/// it).
struct CommitWatch {
    windows: Arc<PushWindows>,
    storage_failed: Arc<Notify>,
    changes: Arc<Mutex<BTreeMap<TreeKey, u64>>>,
    hints: mpsc::Sender<TreeKey>,
    counters: Arc<Counters>,
    forest: Arc<Forest>,
    push_skips: Arc<Mutex<BTreeMap<TreeKey, u64>>>,
}

impl CommitObserver for CommitWatch {
    fn committed(&self, summary: &CommitSummary) {
        if let Some(Error::Storage(_)) = &summary.failure {
            self.storage_failed.notify_one();
        }
        self.windows.note_stored(summary.trees_written());
        // Replicated ops count too: a sync may bring back ops of our own
        // origin (a replica restored from nothing), which need pushing.
        {
            let mut changes = self.changes.lock().expect("changes");
            for tree in summary.trees_written() {
                *changes.entry(tree.clone()).or_default() += 1;
            }
        }
        for tree in &summary.local_trees {
            match self.hints.try_send(tree.clone()) {
                Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
                Err(mpsc::error::TrySendError::Full(_)) => self.hint_dropped(tree),
            }
        }
    }
}

impl CommitWatch {
    fn hint_dropped(&self, tree: &TreeKey) {
        self.counters.hints_dropped.fetch_add(1, Ordering::Relaxed);
        if canary::active(Canary::ReplicationDropsOnFullQueue) {
            // Planted bug: treat the ops behind a dropped hint as sent.
            if let Ok(height) = self.forest.next_height(tree) {
                self.push_skips
                    .lock()
                    .expect("push skips")
                    .insert(tree.clone(), height);
            }
        }
    }
}

// ----------------------------------------------------------------------------
// Request handling.

impl Inner {
    async fn dispatch(&self, request: Request) -> Result<Response> {
        match request {
            Request::Add {
                tree,
                parent,
                items,
            } => {
                validate::items(&items, self.input_limits())?;
                let op = WriteOp::Move {
                    parent,
                    child: None,
                    items,
                };
                match self.write(tree, op).await? {
                    WriteOutcome::Moved { node, .. } => Ok(Response::Added { node }),
                    other => Err(unexpected(other)),
                }
            }
            Request::AddByPath {
                tree,
                attr,
                path,
                items,
            } => {
                validate::path(&attr, &path, self.input_limits())?;
                validate::items(&items, self.input_limits())?;
                let op = WriteOp::AddByPath { attr, path, items };
                match self.write(tree, op).await? {
                    WriteOutcome::AddedByPath { leaf, created, .. } => {
                        Ok(Response::AddedByPath { leaf, created })
                    }
                    other => Err(unexpected(other)),
                }
            }
            Request::Move {
                tree,
                parent,
                node,
                items,
            } => {
                validate::movable(node)?;
                validate::items(&items, self.input_limits())?;
                let op = WriteOp::Move {
                    parent,
                    child: Some(node),
                    items,
                };
                self.write(tree, op).await.map(|_| Response::Done)
            }
            Request::Remove { tree, node } => {
                validate::movable(node)?;
                self.write(tree, WriteOp::Remove { node })
                    .await
                    .map(|_| Response::Done)
            }
            Request::Apply { tree, ops } => self.apply(tree, ops).await,
            Request::Drop { cid, tree } => self.drop_trees(cid, tree).await,
            read => self.read(read),
        }
    }

    fn read(&self, request: Request) -> Result<Response> {
        match request {
            Request::GetNodeByPath {
                tree,
                attr,
                path,
                attributes,
                latest_only,
                all_attributes,
            } => {
                validate::path(&attr, &path, self.input_limits())?;
                self.check_tree_readable(&tree)?;
                let mut nodes = self.forest.get_by_path(&tree, &attr, &path, latest_only)?;
                if !all_attributes {
                    for node in &mut nodes {
                        node.meta.items.retain(|kv| attributes.contains(&kv.key));
                    }
                }
                self.check_answer_size("nodes", &nodes)?;
                Ok(Response::Nodes(nodes))
            }
            Request::GetMeta { tree, node } => {
                self.check_tree_readable(&tree)?;
                let info = self
                    .forest
                    .get_node(&tree, node)?
                    .ok_or(Error::NodeNotFound(node))?;
                Ok(Response::Nodes(vec![info]))
            }
            Request::GetSubTree { tree, root, depth } => {
                self.check_tree_readable(&tree)?;
                let limit = self.config.limits.max_subtree_nodes;
                let nodes = self.forest.get_subtree(&tree, root, depth, limit)?;
                self.check_answer_size("subtree", &nodes)?;
                Ok(Response::Nodes(nodes))
            }
            Request::TreeList { cid } => {
                self.check_replica(&cid)?;
                Ok(Response::Trees(self.forest.tree_list(&cid)?))
            }
            Request::GetOpLog {
                tree,
                from_height,
                limit,
            } => self.op_log(&tree, from_height, limit),
            Request::GetOpLogStamps {
                tree,
                from_height,
                limit,
            } => self.op_log_stamps(&tree, from_height, limit),
            Request::Healthcheck => Ok(Response::Health {
                replica_id: self.config.node.replica_id,
            }),
            write => unreachable!("write request {write:?} routed to read"),
        }
    }

    async fn write(&self, tree: TreeKey, op: WriteOp) -> Result<WriteOutcome> {
        self.check_tree_key(&tree)?;
        self.batcher.submit(WriteRequest { tree, op }).await
    }

    /// Replicated ops: validated, then applied in one batch. Any failure is
    /// reported so the sender keeps them and retries.
    async fn apply(&self, tree: TreeKey, ops: Vec<Move>) -> Result<Response> {
        self.check_tree_key(&tree)?;
        let page = self.config.limits.sync_page_size;
        if ops.len() > page {
            return Err(too_large("apply ops", ops.len(), page));
        }
        for op in &ops {
            validate::replicated(op, self.input_limits())?;
        }
        let requests = ops
            .into_iter()
            .map(|op| WriteRequest {
                tree: tree.clone(),
                op: WriteOp::Apply { op },
            })
            .collect();
        let mut fresh = 0u32;
        for result in self.batcher.submit_all(requests).await? {
            if let WriteOutcome::Applied { fresh: true } = result? {
                fresh += 1;
            }
        }
        Ok(Response::Applied { fresh })
    }

    fn op_log(&self, tree: &TreeKey, from_height: u64, limit: u32) -> Result<Response> {
        self.check_tree_readable(tree)?;
        let limit = (limit as usize).min(self.config.limits.sync_page_size);
        let mut entries = self.forest.get_op_log(tree, from_height, limit)?;
        let budget = self.answer_budget_bytes();
        let mut used = 0;
        let keep = entries
            .iter()
            .take_while(|e| {
                used += e.op.meta.size_bytes() + ITEM_OVERHEAD_BYTES;
                used <= budget
            })
            .count()
            .max(1);
        entries.truncate(keep);
        let next_height = entries.last().map_or(from_height, |e| e.height + 1);
        Ok(Response::OpLog {
            entries,
            next_height,
        })
    }

    fn op_log_stamps(&self, tree: &TreeKey, from_height: u64, limit: u32) -> Result<Response> {
        self.check_tree_readable(tree)?;
        let fits = self.answer_budget_bytes() / LOG_STAMP_BYTES_MAX;
        let limit = (limit as usize)
            .min(self.config.limits.sync_stamp_page_size)
            .min(fits)
            .max(1);
        let page = self.forest.get_op_log_stamps(tree, from_height, limit)?;
        Ok(Response::OpLogStamps {
            stamps: page.stamps,
            next_height: page.next_height,
        })
    }

    async fn drop_trees(&self, cid: ContainerId, tree: Option<String>) -> Result<Response> {
        self.check_replica(&cid)?;
        let trees: Vec<TreeKey> = match &tree {
            Some(name) => vec![TreeKey::new(cid, name.clone())],
            None => self
                .forest
                .tree_list(&cid)?
                .into_iter()
                .map(|t| TreeKey::new(cid, t))
                .collect(),
        };
        let mut guards = Vec::with_capacity(trees.len());
        for key in &trees {
            guards.push(self.locks(key).drop_guard.write_owned().await);
        }
        let forest = self.forest.clone();
        blocking(&*self.env.runtime, move || {
            forest.tree_drop(&cid, tree.as_deref())
        })
        .await?;
        // A tree created again under the same name starts its heights anew.
        let mut pushers = self.pushers.lock().expect("pushers");
        for (key, state) in pushers.iter_mut() {
            if trees.contains(&key.0) {
                state.acked = 0;
                state.persisted_at = None;
                state.durable = None;
                state.clean_at = None;
            }
        }
        drop(pushers);
        self.forget_pull_cursors(&trees);
        self.windows.forget(&trees);
        Ok(Response::Done)
    }

    // ---- validation ----

    fn check_replica(&self, cid: &ContainerId) -> Result<()> {
        if self.replica_set(cid).contains(&self.config.node.replica_id) {
            Ok(())
        } else {
            Err(Error::NotReplica(cid.to_string()))
        }
    }

    fn check_tree_key(&self, tree: &TreeKey) -> Result<()> {
        self.check_replica(&tree.cid)?;
        validate::tree_id(tree)
    }

    /// A read needs no existence check of its own: every forest read
    /// answers `TreeNotFound` for a missing tree, inside the one read
    /// transaction it opens anyway.
    fn check_tree_readable(&self, tree: &TreeKey) -> Result<()> {
        self.check_tree_key(tree)
    }

    fn input_limits(&self) -> InputLimits {
        InputLimits {
            max_meta_bytes: self.config.limits.max_meta_bytes,
            max_path_len: self.config.limits.max_path_len,
        }
    }

    /// Room for the payload of one answer.
    fn answer_budget_bytes(&self) -> usize {
        self.config.limits.max_message_bytes - MESSAGE_OVERHEAD_BYTES
    }

    fn check_answer_size(&self, what: &str, nodes: &[NodeInfo]) -> Result<()> {
        let size: usize = nodes
            .iter()
            .map(|n| n.meta.size_bytes() + ITEM_OVERHEAD_BYTES)
            .sum();
        let budget = self.answer_budget_bytes();
        if size > budget {
            return Err(too_large(what, size, budget));
        }
        Ok(())
    }

    // ---- membership ----

    /// The replicas holding a container: its configured set, or this node
    /// and every peer when it is not listed.
    fn replica_set(&self, cid: &ContainerId) -> Vec<ReplicaId> {
        let node = &self.config.node;
        match node.containers.iter().find(|c| &c.cid == cid) {
            Some(container) => container.replicas.clone(),
            None => std::iter::once(node.replica_id)
                .chain(node.peers.iter().map(|p| p.replica_id))
                .collect(),
        }
    }

    /// The other replicas of a container, ascending.
    fn peers_of(&self, cid: &ContainerId) -> Vec<ReplicaId> {
        let own = self.config.node.replica_id;
        let peers: BTreeSet<ReplicaId> = self
            .replica_set(cid)
            .into_iter()
            .filter(|r| *r != own)
            .collect();
        peers.into_iter().collect()
    }

    fn replicates(&self, cid: &ContainerId) -> bool {
        self.check_replica(cid).is_ok()
    }

    fn locks(&self, tree: &TreeKey) -> TreeLocks {
        let mut locks = self.tree_locks.lock().expect("tree locks");
        // Every push pass asks: a known tree costs no key copy.
        if let Some(known) = locks.get(tree) {
            return known.clone();
        }
        locks.entry(tree.clone()).or_default().clone()
    }

    fn cursor_persist_period(&self) -> Duration {
        (self.config.tree.replication_timeout * CURSOR_PERIODS).max(CURSOR_PERSIST_PERIOD_MIN)
    }

    fn stopped(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Sleeps on the node's clock; true when the node stopped meanwhile.
    async fn sleep_or_stop(&self, duration: Duration) -> bool {
        let mut shutdown = self.shutdown.subscribe();
        let sleep = self.env.clock.sleep(duration);
        tokio::select! {
            biased;
            _ = shutdown.wait_for(|stop| *stop) => true,
            () = sleep => self.stopped(),
        }
    }
}

/// What a pull of one stamp page did.
struct Pulled {
    /// Every height of the page below this is held or applied here.
    applied_to: u64,
    /// Ops that were new here.
    fresh: u64,
    /// The error that stopped the page early.
    stop: Option<Error>,
    /// False when the pass should end without an error (the peer lost the
    /// tree meanwhile).
    complete: bool,
}

/// Runs `(first, last)` of ascending `missing` heights; a run also covers
/// gaps of at most `gap_max` heights between two missing ones.
fn missing_runs(missing: &[u64], gap_max: u64) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &height in missing {
        match runs.last_mut() {
            Some((_, last)) if height - *last <= gap_max + 1 => *last = height,
            _ => runs.push((height, height)),
        }
    }
    runs
}

fn unexpected_answer(peer: ReplicaId, request: &str, answer: &Response) -> Error {
    Error::Malformed(format!("peer {peer} answered {request} with {answer:?}"))
}

/// An item of a paged sync read: how it is asked for and found in the
/// answer, and its height in the peer's log.
trait SyncPage: Sized {
    /// The request's name, for errors.
    const REQUEST: &'static str;
    fn request(tree: TreeKey, from_height: u64, limit: u32) -> Request;
    /// The page of a matching answer; any other answer is given back.
    fn from_answer(answer: Response) -> std::result::Result<Vec<Self>, Response>;
    fn height(&self) -> u64;
}

impl SyncPage for LogStamp {
    const REQUEST: &'static str = "GetOpLogStamps";

    fn request(tree: TreeKey, from_height: u64, limit: u32) -> Request {
        Request::GetOpLogStamps {
            tree,
            from_height,
            limit,
        }
    }

    fn from_answer(answer: Response) -> std::result::Result<Vec<Self>, Response> {
        match answer {
            Response::OpLogStamps { stamps, .. } => Ok(stamps),
            other => Err(other),
        }
    }

    fn height(&self) -> u64 {
        self.height
    }
}

impl SyncPage for LogEntry {
    const REQUEST: &'static str = "GetOpLog";

    fn request(tree: TreeKey, from_height: u64, limit: u32) -> Request {
        Request::GetOpLog {
            tree,
            from_height,
            limit,
        }
    }

    fn from_answer(answer: Response) -> std::result::Result<Vec<Self>, Response> {
        match answer {
            Response::OpLog { entries, .. } => Ok(entries),
            other => Err(other),
        }
    }

    fn height(&self) -> u64 {
        self.height
    }
}

/// A peer's page is input like any other: heights ascending from
/// `from_height`, and no more than asked for.
fn check_page(
    peer: ReplicaId,
    from_height: u64,
    heights: impl ExactSizeIterator<Item = u64>,
    limit: usize,
) -> Result<()> {
    if heights.len() > limit {
        return Err(Error::Malformed(format!(
            "peer {peer} sent an oversized page"
        )));
    }
    let mut expected_min = from_height;
    for height in heights {
        if height < expected_min {
            return Err(Error::Malformed(format!(
                "peer {peer} sent heights out of order"
            )));
        }
        expected_min = height.saturating_add(1);
    }
    Ok(())
}

fn unexpected(outcome: WriteOutcome) -> Error {
    // The forest answers each op kind with its own outcome kind.
    panic!("forest answered with the wrong outcome kind: {outcome:?}")
}

// ----------------------------------------------------------------------------
// Replication (push).

impl Inner {
    async fn run_hints(self: Arc<Self>, mut hints: mpsc::Receiver<TreeKey>) {
        let mut shutdown = self.shutdown.subscribe();
        loop {
            let tree = tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop) => return,
                tree = hints.recv() => match tree {
                    Some(tree) => tree,
                    None => return,
                },
            };
            self.schedule_push(&tree);
        }
    }

    /// At start (which resumes pushes a restart interrupted) and then every
    /// `replication_timeout`, starts a pass for every (tree, peer) that may
    /// have unsent ops: this is what makes a dropped hint harmless. A pusher
    /// whose last clean pass saw the tree's current change count is skipped
    /// (the count moves before the hint is even sent).
    async fn run_sweeps(self: Arc<Self>) {
        loop {
            match self.forest.all_trees() {
                Ok(trees) => {
                    for tree in trees.iter().filter(|t| self.replicates(&t.cid)) {
                        self.sweep_tree(tree);
                    }
                }
                Err(error) => tracing::warn!(%error, "replication sweep cannot list trees"),
            }
            if self
                .sleep_or_stop(self.config.tree.replication_timeout)
                .await
            {
                return;
            }
        }
    }

    fn sweep_tree(self: &Arc<Self>, tree: &TreeKey) {
        let changes = self.changes_of(tree);
        let now = self.env.clock.now();
        let period = self.cursor_persist_period();
        for peer in self.peers_of(&tree.cid) {
            let key = (tree.clone(), peer);
            if self.push_state(&key, |s| s.wants_pass(changes, now, period)) {
                self.schedule_pusher(key);
            }
        }
    }

    /// Marks every pusher of `tree` as having work, starting the idle ones.
    fn schedule_push(self: &Arc<Self>, tree: &TreeKey) {
        for peer in self.peers_of(&tree.cid) {
            self.schedule_pusher((tree.clone(), peer));
        }
    }

    fn schedule_pusher(self: &Arc<Self>, key: PushKey) {
        if self.stopped() {
            return;
        }
        let start = {
            let mut pushers = self.pushers.lock().expect("pushers");
            let state = pushers.entry(key.clone()).or_default();
            state.dirty = true;
            !std::mem::replace(&mut state.running, true)
        };
        if start {
            spawn(self, "pusher", self.clone().run_pusher(key));
        }
    }

    fn changes_of(&self, tree: &TreeKey) -> u64 {
        let changes = self.changes.lock().expect("changes");
        changes.get(tree).copied().unwrap_or(0)
    }

    /// One task per (tree, peer) while it has work; failures back off
    /// exponentially up to `replication_timeout`.
    async fn run_pusher(self: Arc<Self>, key: PushKey) {
        let mut failures = 0u32;
        loop {
            {
                let mut pushers = self.pushers.lock().expect("pushers");
                let state = pushers.get_mut(&key).expect("pusher state");
                if !state.dirty || self.stopped() {
                    state.running = false;
                    return;
                }
                state.dirty = false;
            }
            match self.push_to_peer(&key).await {
                Ok(()) => failures = 0,
                Err(error) => {
                    failures = failures.saturating_add(1);
                    self.counters.push_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%error, peer = key.1, tree = ?key.0, failures, "push failed");
                    let delay = self.push_backoff(failures);
                    self.pushers
                        .lock()
                        .expect("pushers")
                        .get_mut(&key)
                        .expect("pusher state")
                        .dirty = true;
                    if self.sleep_or_stop(delay).await {
                        self.pushers
                            .lock()
                            .expect("pushers")
                            .get_mut(&key)
                            .expect("pusher state")
                            .running = false;
                        return;
                    }
                }
            }
        }
    }

    fn push_backoff(&self, failures: u32) -> Duration {
        let cap = self.config.tree.replication_timeout;
        let base = (cap / 32).max(Duration::from_millis(1));
        base.saturating_mul(1u32 << failures.min(16).saturating_sub(1))
            .min(cap)
    }

    /// Sends `peer` every op that originated here from its push cursor on,
    /// one page at a time; the cursor moves only over acknowledged pages.
    async fn push_to_peer(&self, key: &PushKey) -> Result<()> {
        self.counters.push_passes.fetch_add(1, Ordering::Relaxed);
        let (tree, peer) = (&key.0, key.1);
        let locks = self.locks(tree);
        let _no_drop = locks.drop_guard.read().await;
        // Read before the scan: a commit after this point moves the count
        // again, so the pass is not mistaken for covering it.
        let changes = self.changes_of(tree);
        let durable = match self.push_state(key, |s| s.durable) {
            Some(durable) => durable,
            None => {
                let durable = self.forest.cursor(tree, CursorKind::Push, peer)?;
                self.push_state(key, |s| s.durable = Some(durable));
                durable
            }
        };
        let start = durable.max(self.push_state(key, |s| s.acked));
        let mut cursor = start;
        if let Some(&skip) = self.push_skips.lock().expect("push skips").get(tree) {
            cursor = cursor.max(skip);
        }
        let result = match self.push_pages(tree, peer, &mut cursor).await {
            // Dropped meanwhile: nothing left to push.
            Err(Error::TreeNotFound) => Ok(()),
            other => other,
        };
        if self.should_persist(key, durable, cursor) {
            let forest = self.forest.clone();
            let tree = tree.clone();
            blocking(&*self.env.runtime, move || {
                forest.set_cursor(&tree, CursorKind::Push, peer, cursor)
            })
            .await
            .inspect_err(|error| self.note_error(error))?;
            self.push_state(key, |s| s.durable = Some(cursor));
        }
        if result.is_ok() {
            self.push_state(key, |s| s.clean_at = Some(changes));
        }
        result
    }

    fn push_state<T>(&self, key: &PushKey, read: impl FnOnce(&mut PushState) -> T) -> T {
        let mut pushers = self.pushers.lock().expect("pushers");
        // Several calls per push pass: a known pusher costs no key copy.
        if let Some(state) = pushers.get_mut(key) {
            return read(state);
        }
        read(pushers.entry(key.clone()).or_default())
    }

    /// Records `cursor` as acknowledged; true when it should also be made
    /// durable now: `CURSOR_LAG_MAX` or more ahead of the durable cursor, or
    /// not persisted for `cursor_persist_period` (the sweep
    /// starts a pass for a lagging cursor when it is due).
    fn should_persist(&self, key: &PushKey, durable: u64, cursor: u64) -> bool {
        let now = self.env.clock.now();
        let period = self.cursor_persist_period();
        self.push_state(key, |state| {
            state.acked = state.acked.max(cursor);
            let stale = state
                .persisted_at
                .is_none_or(|at| now.saturating_sub(at) >= period);
            let persist = cursor > durable && (cursor - durable >= CURSOR_LAG_MAX || stale);
            if persist {
                state.persisted_at = Some(now);
            }
            persist
        })
    }

    async fn push_pages(&self, tree: &TreeKey, peer: ReplicaId, cursor: &mut u64) -> Result<()> {
        let own = self.config.node.replica_id;
        let scan_max = self.config.limits.push_scan_heights;
        let mut page = self.config.limits.sync_page_size;
        let budget = self.answer_budget_bytes();
        loop {
            let found = self.own_ops_page(tree, *cursor, page, scan_max)?;
            if found.next_height == *cursor {
                return Ok(());
            }
            let mut next = found.next_height;
            let mut ops = Vec::with_capacity(found.entries.len());
            let mut used = 0;
            for entry in found.entries {
                assert!(entry.height >= *cursor, "op log went backwards");
                assert_eq!(timestamp_replica(entry.op.ts()), own, "foreign op pushed");
                used += entry.op.meta.size_bytes() + ITEM_OVERHEAD_BYTES;
                if used > budget && !ops.is_empty() {
                    next = entry.height;
                    break;
                }
                ops.push(entry.op);
            }
            if !ops.is_empty() {
                match self.send_ops(tree, peer, ops).await {
                    // The peer has smaller limits than ours: smaller pages.
                    Err(Error::TooLarge { .. }) if page > 1 => {
                        page /= 2;
                        continue;
                    }
                    other => other?,
                }
            }
            assert!(next > *cursor, "push cursor must advance");
            *cursor = next;
            if self.stopped() {
                return Err(Error::ShuttingDown);
            }
        }
    }

    /// What `Forest::get_op_log_of_origin` answers for this node's own ops,
    /// from the tree's push window when it knows the answer: the pushers of
    /// all peers then share one log read per stretch of new heights.
    fn own_ops_page(
        &self,
        tree: &TreeKey,
        from: u64,
        limit: usize,
        scan_max: usize,
    ) -> Result<OpLogPage> {
        let own = self.config.node.replica_id;
        if let Some(page) = self.windows.page(tree, from, limit, scan_max) {
            return Ok(page);
        }
        if let Some(ticket) = self.windows.refresh_ticket(tree, from) {
            let found = self.forest.get_op_log_of_origin(
                tree,
                ticket.from_height,
                self.windows.refresh_limit(),
                scan_max,
                own,
            );
            let failed = found.as_ref().err().cloned();
            self.windows.store(tree, ticket, found, scan_max);
            if let Some(error) = failed {
                return Err(error);
            }
            if let Some(page) = self.windows.page(tree, from, limit, scan_max) {
                return Ok(page);
            }
        }
        self.forest
            .get_op_log_of_origin(tree, from, limit, scan_max, own)
    }

    async fn send_ops(&self, tree: &TreeKey, peer: ReplicaId, ops: Vec<Move>) -> Result<()> {
        let count = ops.len() as u64;
        let _slot = self
            .push_slots
            .acquire()
            .await
            .map_err(|_| Error::ShuttingDown)?;
        let request = Request::Apply {
            tree: tree.clone(),
            ops,
        };
        let timeout = self.config.tree.replication_timeout;
        match self.transport.call(peer, request, timeout).await? {
            Response::Applied { .. } => {
                self.counters.ops_pushed.fetch_add(count, Ordering::Relaxed);
                Ok(())
            }
            Response::Error(error) => Err(error),
            other => Err(Error::Malformed(format!(
                "peer {peer} answered Apply with {other:?}"
            ))),
        }
    }

    fn replication_idle(&self) -> Result<bool> {
        let scan_max = self.config.limits.push_scan_heights;
        for tree in self.forest.all_trees()? {
            if !self.replicates(&tree.cid) {
                continue;
            }
            for peer in self.peers_of(&tree.cid) {
                let key = (tree.clone(), peer);
                let (acked, durable) = self.push_state(&key, |s| (s.acked, s.durable));
                let durable = match durable {
                    Some(durable) => durable,
                    None => self.forest.cursor(&tree, CursorKind::Push, peer)?,
                };
                let mut cursor = durable.max(acked);
                loop {
                    let found = match self.own_ops_page(&tree, cursor, 1, scan_max) {
                        Err(Error::TreeNotFound) => break,
                        other => other?,
                    };
                    if !found.entries.is_empty() {
                        return Ok(false);
                    }
                    if found.next_height == cursor {
                        break;
                    }
                    cursor = found.next_height;
                }
            }
        }
        Ok(true)
    }
}

// ----------------------------------------------------------------------------
// Background sync (pull).

impl Inner {
    async fn run_sync(self: Arc<Self>, interval: Duration) {
        loop {
            self.sync_round().await;
            if self.sleep_or_stop(interval).await {
                return;
            }
        }
    }

    /// Pulls every tree this node replicates from every peer. A peer that
    /// fails is skipped for the rest of the round; nothing local is touched
    /// on failure.
    async fn sync_round(&self) {
        let mut failed_peers = BTreeSet::new();
        let trees = self.sync_trees(&mut failed_peers).await;
        for tree in trees {
            if self.stopped() {
                return;
            }
            let locks = self.locks(&tree);
            let _one_sync = locks.pull.lock().await;
            let _no_drop = locks.drop_guard.read().await;
            for peer in self.peers_of(&tree.cid) {
                if failed_peers.contains(&peer) {
                    continue;
                }
                if let Err(error) = self.pull_from(&tree, peer).await {
                    self.counters
                        .sync_peer_errors
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%error, peer, ?tree, "sync from peer failed");
                    if error.is_transient() {
                        failed_peers.insert(peer);
                        if canary::active(Canary::SyncDropsTreeOnPeerError) {
                            // Planted bug: discard local data on a peer's hiccup.
                            let _ = self.forest.tree_drop(&tree.cid, Some(&tree.tree));
                            self.forget_pull_cursors(std::slice::from_ref(&tree));
                            self.windows.forget(std::slice::from_ref(&tree));
                        }
                    }
                }
            }
        }
        self.counters.sync_rounds.fetch_add(1, Ordering::Relaxed);
    }

    /// Trees to sync: the local ones plus whatever peers list for the
    /// containers this node replicates.
    async fn sync_trees(&self, failed_peers: &mut BTreeSet<ReplicaId>) -> BTreeSet<TreeKey> {
        let mut trees: BTreeSet<TreeKey> = match self.forest.all_trees() {
            Ok(trees) => trees
                .into_iter()
                .filter(|t| self.replicates(&t.cid))
                .collect(),
            Err(error) => {
                tracing::warn!(%error, "sync cannot list local trees");
                BTreeSet::new()
            }
        };
        let mut cids: BTreeSet<ContainerId> = trees.iter().map(|t| t.cid).collect();
        for container in &self.config.node.containers {
            if self.replicates(&container.cid) {
                cids.insert(container.cid);
            }
        }
        let timeout = self.config.tree.replication_timeout;
        for cid in cids {
            for peer in self.peers_of(&cid) {
                if failed_peers.contains(&peer) {
                    continue;
                }
                match self
                    .transport
                    .call(peer, Request::TreeList { cid }, timeout)
                    .await
                {
                    Ok(Response::Trees(names)) => {
                        trees.extend(names.into_iter().map(|name| TreeKey::new(cid, name)));
                    }
                    Ok(Response::Error(error)) if !error.is_transient() => {}
                    Ok(_) | Err(_) => {
                        self.counters
                            .sync_peer_errors
                            .fetch_add(1, Ordering::Relaxed);
                        failed_peers.insert(peer);
                    }
                }
            }
        }
        trees
    }

    /// Pulls `peer`'s log of `tree` from the pull cursor, page by page,
    /// moving the cursor only over ops applied here. The durable cursor is
    /// written whenever it lags `CURSOR_LAG_MAX` behind, and at the end of
    /// a pass (also a failed one) when it was not written for
    /// `cursor_persist_period`.
    async fn pull_from(&self, tree: &TreeKey, peer: ReplicaId) -> Result<()> {
        let cursor_peer = if canary::active(Canary::SharedSyncCursor) {
            0 // Planted bug: every peer's heights share one cursor.
        } else {
            peer
        };
        let key = (tree.clone(), cursor_peer);
        let known = self.pulls.lock().expect("pulls").get(&key).copied();
        let mut state = match known {
            Some(state) => state,
            None => {
                let durable = self.forest.cursor(tree, CursorKind::Pull, cursor_peer)?;
                PullState {
                    cursor: durable,
                    durable,
                    persisted_at: None,
                }
            }
        };
        let result = self.pull_pages(tree, peer, cursor_peer, &mut state).await;
        let period = self.cursor_persist_period();
        let due = state
            .persisted_at
            .is_none_or(|at| self.env.clock.now().saturating_sub(at) >= period);
        let persisted = if state.cursor > state.durable && due {
            self.persist_pull_cursor(tree, cursor_peer, &mut state)
                .await
        } else {
            Ok(())
        };
        self.pulls.lock().expect("pulls").insert(key, state);
        persisted.and(result)
    }

    /// Forgets the in-memory pull cursors of dropped trees (their durable
    /// ones went with the tree).
    fn forget_pull_cursors(&self, trees: &[TreeKey]) {
        let mut pulls = self.pulls.lock().expect("pulls");
        pulls.retain(|(tree, _), _| !trees.contains(tree));
    }

    async fn pull_pages(
        &self,
        tree: &TreeKey,
        peer: ReplicaId,
        cursor_peer: ReplicaId,
        state: &mut PullState,
    ) -> Result<()> {
        for _ in 0..MAX_PULL_PAGES_PER_ROUND {
            let stamps = match self.fetch_stamps(tree, peer, state.cursor).await? {
                Some(stamps) if !stamps.is_empty() => stamps,
                _ => return Ok(()),
            };
            let pulled = self.pull_missing(tree, peer, &stamps).await?;
            state.cursor = state.cursor.max(pulled.applied_to);
            if state.cursor - state.durable >= CURSOR_LAG_MAX {
                self.persist_pull_cursor(tree, cursor_peer, state).await?;
            }
            self.counters
                .ops_pulled
                .fetch_add(pulled.fresh, Ordering::Relaxed);
            if let Some(error) = pulled.stop {
                return Err(error);
            }
            if !pulled.complete {
                return Ok(());
            }
            if self.stopped() {
                return Err(Error::ShuttingDown);
            }
        }
        Ok(())
    }

    async fn persist_pull_cursor(
        &self,
        tree: &TreeKey,
        cursor_peer: ReplicaId,
        state: &mut PullState,
    ) -> Result<()> {
        let forest = self.forest.clone();
        let tree = tree.clone();
        let cursor = state.cursor;
        blocking(&*self.env.runtime, move || {
            forest.set_cursor(&tree, CursorKind::Pull, cursor_peer, cursor)
        })
        .await
        .inspect_err(|error| self.note_error(error))?;
        state.durable = cursor;
        state.persisted_at = Some(self.env.clock.now());
        Ok(())
    }

    /// A sync read from `peer`: its answer, or `None` when the peer does
    /// not have the tree.
    async fn sync_call(&self, peer: ReplicaId, request: Request) -> Result<Option<Response>> {
        let timeout = self.config.tree.replication_timeout;
        match self.transport.call(peer, request, timeout).await? {
            Response::Error(Error::TreeNotFound) => Ok(None),
            Response::Error(error) => Err(error),
            answer => Ok(Some(answer)),
        }
    }

    /// One page of the heights and timestamps of a peer's log from
    /// `from_height`; `None` when the peer does not have the tree.
    async fn fetch_stamps(
        &self,
        tree: &TreeKey,
        peer: ReplicaId,
        from_height: u64,
    ) -> Result<Option<Vec<LogStamp>>> {
        let limit = self.config.limits.sync_stamp_page_size;
        self.fetch_sync_page(tree, peer, from_height, limit).await
    }

    /// At most `limit` (and `sync_page_size`) ops of a peer's log from
    /// `from_height`; `None` when the peer does not have the tree.
    async fn fetch_page(
        &self,
        tree: &TreeKey,
        peer: ReplicaId,
        from_height: u64,
        limit: u64,
    ) -> Result<Option<Vec<LogEntry>>> {
        let limit = usize::try_from(limit)
            .unwrap_or(usize::MAX)
            .min(self.config.limits.sync_page_size);
        self.fetch_sync_page(tree, peer, from_height, limit).await
    }

    /// One page of `P` from `peer`, at most `limit` items from
    /// `from_height`, checked like any other input; `None` when the peer
    /// does not have the tree.
    async fn fetch_sync_page<P: SyncPage>(
        &self,
        tree: &TreeKey,
        peer: ReplicaId,
        from_height: u64,
        limit: usize,
    ) -> Result<Option<Vec<P>>> {
        let wire_limit = limit.min(u32::MAX as usize) as u32;
        let request = P::request(tree.clone(), from_height, wire_limit);
        let page = match self.sync_call(peer, request).await? {
            None => return Ok(None),
            Some(answer) => P::from_answer(answer)
                .map_err(|other| unexpected_answer(peer, P::REQUEST, &other))?,
        };
        check_page(peer, from_height, page.iter().map(P::height), limit)?;
        Ok(Some(page))
    }

    /// Fetches and applies the ops of a page of `peer`'s stamps that the
    /// local log lacks, in height order. Held ops are neither fetched nor
    /// submitted: pushes deliver nearly all of a peer's log before a round.
    async fn pull_missing(
        &self,
        tree: &TreeKey,
        peer: ReplicaId,
        stamps: &[LogStamp],
    ) -> Result<Pulled> {
        let timestamps: Vec<Timestamp> = stamps.iter().map(|s| s.ts).collect();
        let held = self
            .forest
            .stored_stamps(tree, &timestamps)
            .inspect_err(|error| self.note_error(error))?;
        let missing: Vec<u64> = stamps
            .iter()
            .zip(held)
            .filter(|(_, held)| !held)
            .map(|(stamp, _)| stamp.height)
            .collect();
        let mut pulled = Pulled {
            applied_to: stamps[0].height,
            fresh: 0,
            stop: None,
            complete: true,
        };
        for (first, last) in missing_runs(&missing, PULL_GAP_HEIGHTS_MAX) {
            // Everything below `first` in this page is held or applied.
            pulled.applied_to = pulled.applied_to.max(first);
            self.pull_run(tree, peer, first, last, &mut pulled).await?;
            if pulled.stop.is_some() || !pulled.complete {
                return Ok(pulled);
            }
        }
        let last = stamps.last().expect("a page is not empty");
        pulled.applied_to = last.height + 1;
        Ok(pulled)
    }

    /// Fetches and applies heights `first..=last` of `peer`'s log, moving
    /// `pulled.applied_to` over what was applied.
    async fn pull_run(
        &self,
        tree: &TreeKey,
        peer: ReplicaId,
        first: u64,
        last: u64,
        pulled: &mut Pulled,
    ) -> Result<()> {
        let mut from = first;
        while from <= last {
            let entries = match self.fetch_page(tree, peer, from, last - from + 1).await? {
                Some(mut entries) => {
                    entries.retain(|e| e.height <= last);
                    entries
                }
                None => Vec::new(),
            };
            if entries.is_empty() {
                // The peer dropped the tree since it listed the stamps:
                // end the pass, the cursor stays before what is unapplied.
                pulled.complete = false;
                return Ok(());
            }
            let (applied_to, fresh, stop) = self.apply_page(tree, entries).await?;
            pulled.fresh += fresh;
            pulled.applied_to = pulled.applied_to.max(applied_to);
            if stop.is_some() {
                pulled.stop = stop;
                return Ok(());
            }
            from = applied_to;
        }
        Ok(())
    }

    /// Applies a pulled page; returns the height the cursor may move to, how
    /// many ops were new, and the error that stopped it early, if any. Ops
    /// that can never apply (invalid) are passed over with a warning; ops
    /// the log already holds are passed over without a write transaction.
    async fn apply_page(
        &self,
        tree: &TreeKey,
        entries: Vec<LogEntry>,
    ) -> Result<(u64, u64, Option<Error>)> {
        let heights: Vec<u64> = entries.iter().map(|e| e.height).collect();
        let submit = self.ops_to_submit(tree, &entries)?;
        let mut requests = Vec::with_capacity(entries.len());
        for (entry, submit) in entries.into_iter().zip(&submit) {
            if *submit {
                requests.push(WriteRequest {
                    tree: tree.clone(),
                    op: WriteOp::Apply { op: entry.op },
                });
            }
        }
        let mut results = self.batcher.submit_all(requests).await?.into_iter();
        let mut applied_to = heights[0];
        let mut fresh = 0;
        for (height, submitted) in heights.into_iter().zip(submit) {
            if submitted {
                match results.next().expect("one result per request") {
                    Ok(WriteOutcome::Applied { fresh: true }) => fresh += 1,
                    Ok(_) => {}
                    Err(error) if error.is_transient() => {
                        return Ok((applied_to, fresh, Some(error)))
                    }
                    Err(error) => tracing::warn!(%error, height, ?tree, "peer op refused"),
                }
            }
            applied_to = height + 1;
        }
        Ok((applied_to, fresh, None))
    }

    /// Which entries of a pulled page go to the batcher: the valid ones the
    /// local log does not hold yet. Most of a peer's log came here by push
    /// already; submitting it again would cost a lookup and a write
    /// transaction per page for nothing.
    fn ops_to_submit(&self, tree: &TreeKey, entries: &[LogEntry]) -> Result<Vec<bool>> {
        let mut submit = Vec::with_capacity(entries.len());
        for entry in entries {
            let ok = validate::replicated(&entry.op, self.input_limits());
            if let Err(error) = &ok {
                tracing::warn!(%error, height = entry.height, ?tree, "skipping invalid op from peer");
            }
            submit.push(ok.is_ok());
        }
        let ops: Vec<&Move> = entries.iter().map(|e| &e.op).collect();
        let stored = self
            .forest
            .stored_ops(tree, &ops)
            .inspect_err(|error| self.note_error(error))?;
        for (submit, stored) in submit.iter_mut().zip(stored) {
            *submit = *submit && !stored;
        }
        Ok(submit)
    }
}

// ----------------------------------------------------------------------------
// Storage recovery.

impl Inner {
    /// A local storage error may have poisoned the database: wake the
    /// recovery. Only local failures are reported here (a peer's storage
    /// error says nothing about this database).
    fn note_error(&self, error: &Error) {
        if matches!(error, Error::Storage(_)) {
            self.storage_failed.notify_one();
        }
    }

    /// Reopens the database after each storage error. The callers of the
    /// failed batch already got the error; ops committed before it are kept
    /// by the reopen (redb's recovery), and writes fail with a storage
    /// error meanwhile.
    async fn run_recovery(self: Arc<Self>) {
        let mut shutdown = self.shutdown.subscribe();
        loop {
            tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop) => return,
                () = self.storage_failed.notified() => {}
            }
            if !self.reopen_with_retries().await {
                return;
            }
        }
    }

    /// Up to `reopen_attempts_max` tries with doubling waits; false when the
    /// node stopped meanwhile.
    async fn reopen_with_retries(&self) -> bool {
        let attempts = self.config.pilorama.reopen_attempts_max;
        for attempt in 1..=attempts {
            let forest = self.forest.clone();
            match blocking(&*self.env.runtime, move || forest.reopen()).await {
                Ok(()) => {
                    self.windows.clear();
                    self.counters.reopens.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(attempt, "database reopened after a storage error");
                    return true;
                }
                Err(error) => {
                    tracing::warn!(%error, attempt, "reopening the database failed");
                }
            }
            if attempt < attempts && self.sleep_or_stop(self.reopen_backoff(attempt)).await {
                return false;
            }
        }
        tracing::error!(
            attempts,
            "database still failing; waiting for the next error"
        );
        true
    }

    fn reopen_backoff(&self, attempt: u32) -> Duration {
        let cap = self.config.pilorama.reopen_backoff_max;
        let base = (cap / 32).max(Duration::from_millis(1));
        base.saturating_mul(1u32 << attempt.min(16).saturating_sub(1))
            .min(cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_runs_bridge_small_gaps_only() {
        assert_eq!(missing_runs(&[], 2), vec![]);
        assert_eq!(missing_runs(&[5], 2), vec![(5, 5)]);
        // 5 -> 8 skips two held heights (bridged), 8 -> 12 skips three.
        assert_eq!(
            missing_runs(&[5, 8, 12, 13, 100], 2),
            vec![(5, 8), (12, 13), (100, 100)]
        );
        assert_eq!(missing_runs(&[0, 1, 2], 0), vec![(0, 2)]);
    }

    #[test]
    fn peer_pages_are_checked() {
        assert!(check_page(2, 10, [10, 11, 15].into_iter(), 3).is_ok());
        assert!(check_page(2, 10, std::iter::empty(), 0).is_ok());
        let malformed = |r: Result<()>| matches!(r, Err(Error::Malformed(_)));
        assert!(malformed(check_page(2, 10, [10, 11].into_iter(), 1)));
        assert!(malformed(check_page(2, 10, [9].into_iter(), 5)));
        assert!(malformed(check_page(2, 10, [12, 12].into_iter(), 5)));
        assert!(malformed(check_page(2, 10, [13, 11].into_iter(), 5)));
    }
}
