//! The tree service: validation, the batcher, replication and background
//! sync around one forest.
//!
//! Layout: `api` answers requests; `push` sends this node's ops to its
//! peers and `pull` is background sync, each owning its own state; `cursor`
//! is the lazily persisted cursor both keep; `acks` holds a local write's
//! answer until `tree.ack_replicas` replicas have it; `membership` says who holds
//! which container; `locks` keeps Drop and replication passes apart;
//! `observer` hears of every commit; `recovery` reopens the database after
//! a storage error. `Core` is what they all share, and none of it reaches
//! push or pull state.
//!
//! Nothing acknowledged is ever dropped: the truth is a durable per-(tree,
//! peer) push cursor over the local log, moved only over what the peer
//! acknowledged, and a durable per-(tree, peer) pull cursor moved only over
//! ops applied here; everything kept in memory per tree is bounded
//! (`limits.max_tracked_trees`) and can be rebuilt from them.

mod access;
mod acks;
mod api;
mod backoff;
mod cursor;
pub mod hello;
mod locks;
mod membership;
mod observer;
mod pull;
mod push;
mod recovery;
mod rejoin;

pub use crate::validate::MAX_TREE_ID_BYTES;
pub use pull::{PullObserver, PullPass, MAX_PULL_PAGES_PER_ROUND};
pub use push::ITEM_OVERHEAD_BYTES;

use crate::batcher::{Batcher, BatcherOptions, CommitObserver};
use crate::config::{Config, MESSAGE_OVERHEAD_BYTES};
use crate::error::{Error, Result};
use crate::forest::{CursorKind, Forest};
use crate::net::Transport;
use crate::runtime::{blocking, Env};
use access::Access;
use acks::ReplicaAcks;
use locks::TreeLocks;
use membership::Membership;
use observer::CommitWatch;
use pull::Puller;
use push::book::{BookLimits, PushBook};
use push::window::PushWindows;
use push::Pusher;
use recovery::Recovery;
use rejoin::Rejoin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};

/// Counters and sizes a node exposes (checkers, load reports, tests).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceStats {
    pub writes_committed: u64,
    pub batches_committed: u64,
    pub batches_failed: u64,
    pub writes_rejected_overload: u64,
    pub ops_pushed: u64,
    pub ops_pulled: u64,
    /// `GetOpLog` pages a sync applied.
    pub sync_pages_pulled: u64,
    pub sync_rounds: u64,
    /// Writes admitted by the batcher and not answered yet (whether or not
    /// their caller still waits); a value that stays above 0 on an idle
    /// node means a write hangs.
    pub pending_writes: u64,
    /// Time the batcher spent in commit transactions and checkpoints
    /// (`BatcherStats`).
    pub commit_us: u64,
    /// What the write-ahead log did since the node started (zeros
    /// without one): records, bytes, syncs, checkpoints, replayed records.
    pub wal: crate::forest::wal::WalStats,
    /// Bytes of log records no checkpoint covers yet: at most what a
    /// reopen after a crash replays.
    pub wal_bytes_since_checkpoint: u64,
    /// Push calls that failed (retried later).
    pub push_failures: u64,
    /// Passes of pushers over the local log (each a read of the log), also
    /// the ones that found nothing to send.
    pub push_passes: u64,
    /// Peer calls during sync that failed (that peer is skipped this round).
    pub sync_peer_errors: u64,
    /// Tree names peers listed beyond `limits.max_tracked_trees` in one
    /// round (left for later rounds).
    pub sync_names_deferred: u64,
    /// Replication hints that found the push queue full (the pair waits in
    /// the backlog).
    pub hints_dropped: u64,
    /// Times the database was reopened after a storage error.
    pub reopens: u64,
    /// Trees with push state now (at most `limits.max_tracked_trees`).
    pub push_trees_tracked: u64,
    /// Of them, trees with nothing to push (the first to go for room).
    pub push_trees_settled: u64,
    /// (tree, peer) pairs queued for a push worker now.
    pub push_pairs_queued: u64,
    /// Pairs whose hint found the queue full, waiting for room now.
    pub push_pairs_backlog: u64,
    /// Failed pairs waiting out their backoff now.
    pub push_pairs_delayed: u64,
    /// Pairs parked after `limits.push_conflict_passes_max` stamp
    /// conflicts in a row: never 0 but by a fault (two replicas with one
    /// id, a forged op); they resume after a restart or a Drop.
    pub push_pairs_parked: u64,
    /// Push workers running now (at most `tree.replication_worker_count`).
    pub push_workers: u64,
    /// Push windows held now (at most `limits.max_tracked_trees`).
    pub push_windows: u64,
    /// Pull cursors held in memory now (at most `limits.max_tracked_trees`).
    pub pull_cursors: u64,
    /// `Hello`s refused: a foreign cluster, this node's own replica id, no
    /// configured peer, or a claim its certificate contradicts.
    pub hellos_refused: u64,
    /// Outbound connections refused because the other end was not the
    /// replica dialled, or refused this node's `Hello` (from the transport).
    pub peers_refused: u64,
    /// Requests refused with `PermissionDenied` (docs/design.md §9),
    /// Apply pages carrying another replica's ops included.
    pub requests_refused: u64,
    /// Replicated ops refused as `CounterTooFar` (pushed or pulled).
    pub ops_refused_too_far: u64,
    /// Pulled ops stamped by a replica that does not hold their container.
    pub ops_refused_foreign: u64,
    /// Timestamps found stored with different ops here and on a peer
    /// (pushed or seen in a peer's stamps). Never 0 but by a fault: two
    /// replicas with one id, or a forged op.
    pub stamp_conflicts: u64,
    /// Sync passes skipped because the peer answered as another replica.
    pub peer_identity_mismatches: u64,
    /// Peers whose log epoch changed (all their pull cursors started
    /// again from 0) plus single pull cursors started again because the
    /// peer's log ended below them: its disk was replaced.
    pub pull_cursors_reset: u64,
    /// True while a replaced node refuses local writes (`node.rejoin`).
    pub rejoining: bool,
    /// Local writes committed here that wait for `tree.ack_replicas`
    /// replicas now (at most `limits.max_pending_writes`).
    pub writes_awaiting_replicas: u64,
}

/// Counters of refusals and conflicts (see `ServiceStats`).
#[derive(Default)]
struct TrustCounters {
    requests_refused: AtomicU64,
    ops_refused_too_far: AtomicU64,
    ops_refused_foreign: AtomicU64,
    stamp_conflicts: AtomicU64,
    peer_identity_mismatches: AtomicU64,
}

impl TrustCounters {
    /// Counts what an error says about trust.
    fn note(&self, error: &Error) {
        let counter = match error {
            Error::PermissionDenied { .. } => &self.requests_refused,
            Error::CounterTooFar { .. } => &self.ops_refused_too_far,
            Error::StampConflict(_) => &self.stamp_conflicts,
            Error::WrongPeer { .. } => &self.peer_identity_mismatches,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a graceful stop did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StopReport {
    /// Push and pull cursors written because they ran ahead of their
    /// durable copies.
    pub cursors_persisted: usize,
}

/// What every part of a running service shares.
struct Core {
    config: Config,
    forest: Arc<Forest>,
    env: Env,
    transport: Arc<dyn Transport>,
    batcher: Batcher,
    membership: Arc<Membership>,
    access: Access,
    trust: TrustCounters,
    locks: TreeLocks,
    closed: AtomicBool,
    shutdown: watch::Sender<bool>,
    /// Signalled on every storage error; the recovery reopens the database
    /// (redb refuses all writes after an I/O error until then).
    storage_failed: Arc<Notify>,
    hellos_refused: std::sync::atomic::AtomicU64,
    /// Local writes wait while a replaced node learns its peers' logs.
    rejoin: Rejoin,
    /// Local writes wait until `tree.ack_replicas` replicas hold them.
    acks: ReplicaAcks,
    /// The epoch of this database's log, told to peers in `Health`; set
    /// once stored (a disk error at start leaves it to the first `Health`).
    log_epoch: std::sync::OnceLock<u64>,
    /// How long requests took to answer, by kind (the metrics endpoint).
    request_latency: crate::metrics::RequestLatency,
    /// How long commits that were checkpoints took (the metrics endpoint).
    checkpoint_latency: crate::metrics::Histogram,
}

impl Core {
    /// Runs `work` on the forest through the blocking pool: redb's reads
    /// and writes block, and the async workers serve requests.
    async fn storage<R, F>(&self, work: F) -> R
    where
        R: Send + 'static,
        F: FnOnce(&Forest) -> R + Send + 'static,
    {
        let forest = self.forest.clone();
        blocking(&*self.env.runtime, move || work(&forest)).await
    }

    /// This database's log epoch, stored first if it has none yet (a
    /// write, off the async workers like every read).
    fn log_epoch(&self) -> Result<u64> {
        if let Some(&epoch) = self.log_epoch.get() {
            return Ok(epoch);
        }
        let epoch = self
            .forest
            .log_epoch_init(self.env.runtime.log_epoch_fresh())?;
        Ok(*self.log_epoch.get_or_init(|| epoch))
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

    /// A local storage error may have poisoned the database: wake the
    /// recovery. Only local failures are reported here (a peer's storage
    /// error says nothing about this database).
    fn note_error(&self, error: &Error) {
        if matches!(error, Error::Storage(_)) {
            self.storage_failed.notify_one();
        }
    }

    /// Room for the payload of one answer.
    fn answer_budget_bytes(&self) -> usize {
        self.config.limits.max_message_bytes - MESSAGE_OVERHEAD_BYTES
    }

    fn spawn(
        &self,
        name: &'static str,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        self.env.runtime.spawn(name, Box::pin(task));
    }
}

/// One running node of the tree service.
pub struct Service {
    core: Arc<Core>,
    pusher: Arc<Pusher>,
    puller: Arc<Puller>,
    recovery: Arc<Recovery>,
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
        check_identity(&config, &forest)?;
        let log_epoch = std::sync::OnceLock::new();
        match forest.log_epoch_init(env.runtime.log_epoch_fresh()) {
            Ok(epoch) => drop(log_epoch.set(epoch)),
            Err(error) => tracing::warn!(%error, "log epoch not stored yet"),
        }
        let membership = Arc::new(Membership::from_config(&config.node));
        let limits = &config.limits;
        let windows = Arc::new(PushWindows::new(
            limits.push_window_ops,
            limits.max_tracked_trees,
        ));
        let book = Arc::new(PushBook::new(book_limits(&config), membership.clone()));
        let storage_failed = Arc::new(Notify::new());
        let observer = Arc::new(CommitWatch {
            book: book.clone(),
            windows: windows.clone(),
            storage_failed: storage_failed.clone(),
            #[cfg(feature = "canary")]
            forest: forest.clone(),
        });
        let checkpoint_latency = crate::metrics::latency_histogram();
        let batcher = start_batcher(&config, &forest, &env, observer, &checkpoint_latency);
        let access = Access::new(config.access.clone());
        let rejoin = Rejoin::new(config.node.rejoin);
        let acks = ReplicaAcks::new(config.limits.max_pending_writes);
        let core = Arc::new(Core {
            config,
            forest,
            env,
            transport,
            batcher,
            membership,
            access,
            trust: TrustCounters::default(),
            locks: TreeLocks::new(),
            closed: AtomicBool::new(false),
            shutdown: watch::channel(false).0,
            storage_failed,
            hellos_refused: Default::default(),
            rejoin,
            acks,
            log_epoch,
            request_latency: Default::default(),
            checkpoint_latency,
        });
        let service = Arc::new(Service {
            pusher: Pusher::start(core.clone(), book, windows.clone()),
            puller: Arc::new(Puller::new(core.clone())),
            recovery: Recovery::start(core.clone(), windows),
            core,
        });
        if let Some(interval) = service.core.config.tree.sync_interval {
            let sync = run_sync(service.puller.clone(), service.pusher.clone(), interval);
            service.core.spawn("sync", sync);
        }
        Ok(service)
    }

    /// Runs one full background-sync round now (every tree, every peer),
    /// whether or not periodic sync is enabled.
    pub async fn sync_now(&self) {
        sync_round(&self.puller, &self.pusher).await;
    }

    /// Tells `observer` about every pull pass from now on.
    pub fn observe_pulls(&self, observer: Arc<dyn PullObserver>) {
        self.puller.set_observer(observer);
    }

    /// True when every locally stored op that originated here has been
    /// acknowledged by every peer that should receive it.
    pub fn replication_idle(&self) -> bool {
        self.pusher.idle().unwrap_or(false)
    }

    pub fn stats(&self) -> ServiceStats {
        let batcher = self.core.batcher.stats();
        let push = &self.pusher.book().counters;
        let pull = &self.puller.counters;
        let sizes = self.pusher.book().sizes();
        let load = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
        ServiceStats {
            writes_committed: batcher.writes,
            batches_committed: batcher.batches,
            batches_failed: batcher.failed,
            writes_rejected_overload: batcher.rejected,
            ops_pushed: load(&push.ops_pushed),
            ops_pulled: load(&pull.ops_pulled),
            sync_pages_pulled: load(&pull.sync_pages_pulled),
            sync_rounds: load(&pull.sync_rounds),
            pending_writes: batcher.pending,
            commit_us: batcher.commit_us,
            wal: self.core.forest.wal_stats(),
            wal_bytes_since_checkpoint: self.core.forest.wal_bytes_since_checkpoint(),
            push_failures: load(&push.push_failures),
            push_passes: load(&push.push_passes),
            sync_peer_errors: load(&pull.sync_peer_errors),
            sync_names_deferred: load(&pull.sync_names_deferred),
            hints_dropped: load(&push.hints_dropped),
            reopens: load(&self.recovery.reopens),
            push_trees_tracked: sizes.trees as u64,
            push_trees_settled: sizes.settled as u64,
            push_pairs_queued: sizes.queued as u64,
            push_pairs_backlog: sizes.backlog as u64,
            push_pairs_delayed: sizes.delayed as u64,
            push_pairs_parked: sizes.parked as u64,
            push_workers: sizes.workers as u64,
            push_windows: self.pusher.windows_held() as u64,
            pull_cursors: self.puller.cursors_held() as u64,
            hellos_refused: load(&self.core.hellos_refused),
            peers_refused: self.core.transport.identities_refused(),
            requests_refused: load(&self.core.trust.requests_refused),
            ops_refused_too_far: load(&self.core.trust.ops_refused_too_far),
            ops_refused_foreign: load(&self.core.trust.ops_refused_foreign),
            stamp_conflicts: load(&self.core.trust.stamp_conflicts),
            peer_identity_mismatches: load(&self.core.trust.peer_identity_mismatches),
            pull_cursors_reset: load(&pull.logs_rebuilt),
            rejoining: self.core.rejoin.pending(),
            writes_awaiting_replicas: self.core.acks.waiting() as u64,
        }
    }

    pub fn forest(&self) -> &Arc<Forest> {
        &self.core.forest
    }

    /// Commit durations (the batcher's histogram, shared).
    pub fn commit_latency(&self) -> crate::metrics::Histogram {
        self.core.batcher.commit_latency()
    }

    /// Durations of the commits that were checkpoints (shared).
    pub fn checkpoint_latency(&self) -> crate::metrics::Histogram {
        self.core.checkpoint_latency.clone()
    }

    /// Request durations by kind, as `handle` answered them.
    pub fn request_latency(&self) -> &crate::metrics::RequestLatency {
        &self.core.request_latency
    }

    /// True while a replaced node refuses local writes (`node.rejoin`).
    pub fn rejoining(&self) -> bool {
        self.core.rejoin.pending()
    }

    pub fn config(&self) -> &Config {
        &self.core.config
    }

    /// Stops the node gracefully: new requests get `ShuttingDown`, every
    /// write already queued is committed and answered, background work
    /// stops, and every push and pull cursor that ran ahead of its durable
    /// copy is written, so a restart re-sends and re-pulls nothing.
    pub async fn shutdown_gracefully(&self) -> Result<StopReport> {
        self.core.closed.store(true, Ordering::SeqCst);
        self.core.batcher.drain().await;
        let _ = self.core.shutdown.send(true);
        let mut cursors = Vec::new();
        for ((tree, peer), position) in self.pusher.book().lagging_cursors() {
            cursors.push((tree, CursorKind::Push, peer, position));
        }
        for ((tree, peer), position) in self.puller.lagging_cursors() {
            cursors.push((tree, CursorKind::Pull, peer, position));
        }
        let forest = self.core.forest.clone();
        let persisted = blocking(&*self.core.env.runtime, move || {
            forest.raise_cursors(&cursors)
        })
        .await?;
        Ok(StopReport {
            cursors_persisted: persisted,
        })
    }

    /// Stops background work; in-flight callers get `ShuttingDown`.
    pub fn shutdown(&self) {
        self.core.closed.store(true, Ordering::SeqCst);
        self.core.batcher.shutdown();
        let _ = self.core.shutdown.send(true);
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The forest must be this node's.
fn check_identity(config: &Config, forest: &Forest) -> Result<()> {
    config.validate()?;
    if forest.options().replica_id != config.node.replica_id {
        return Err(Error::Config(format!(
            "node.replica_id: {} but the forest was opened as replica {}",
            config.node.replica_id,
            forest.options().replica_id
        )));
    }
    Ok(())
}

fn book_limits(config: &Config) -> BookLimits {
    BookLimits {
        trees_max: config.limits.max_tracked_trees,
        queue_max: config.tree.replication_channel_capacity,
        workers_max: config.tree.replication_worker_count,
        backoff_max: config.tree.replication_timeout,
        conflict_passes_max: u32::try_from(config.limits.push_conflict_passes_max)
            .unwrap_or(u32::MAX),
    }
}

fn start_batcher(
    config: &Config,
    forest: &Arc<Forest>,
    env: &Env,
    observer: Arc<dyn CommitObserver>,
    checkpoint_latency: &crate::metrics::Histogram,
) -> Batcher {
    let commits = crate::batcher::checkpointing(
        forest.clone(),
        env.clock.clone(),
        config.pilorama.checkpoint_interval,
        checkpoint_latency.clone(),
    );
    let options = BatcherOptions {
        max_batch_size: config.pilorama.max_batch_size,
        max_batch_delay: config.pilorama.max_batch_delay,
        replicated_batch_delay: config.pilorama.replicated_batch_delay,
        max_pending: config.limits.max_pending_writes,
        max_commit_size: config.limits.max_commit_size,
    };
    Batcher::start_with_commits(commits, observer, env.clone(), options)
}

/// Background sync every `interval` (from the start).
async fn run_sync(puller: Arc<Puller>, pusher: Arc<Pusher>, interval: Duration) {
    loop {
        sync_round(&puller, &pusher).await;
        if puller.core().sleep_or_stop(interval).await {
            return;
        }
    }
}

async fn sync_round(puller: &Puller, pusher: &Pusher) {
    let outcome = puller.sync_round().await;
    if puller.core().rejoin.round_ended(outcome.complete) {
        tracing::info!("rejoined: every peer's log pulled, local writes accepted");
    }
    if !outcome.dropped.is_empty() {
        // Only the planted bug `SyncDropsTreeOnPeerError` drops trees here.
        pusher.forget(&outcome.dropped).await;
    }
}
