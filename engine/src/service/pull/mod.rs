//! Background sync (docs/design.md §6): at start and every `sync_interval`
//! this node asks each peer for its log of every tree they share, from a
//! durable per-(tree, peer) pull cursor that moves only over heights
//! applied here, and applies what it lacks. A peer's pages are input like
//! any other: checked, and a bad one costs that peer the rest of the round.

mod apply;
mod epoch;
mod page;

use super::backoff::backoff;
use super::cursor::{self, persist_period, LazyCursor};
use super::Core;
use crate::canary::{self, Canary};
use crate::error::{Error, Result};
use crate::forest::{CursorKind, WriteOp, WriteOutcome, WriteRequest};
use crate::probe::{self, Probe};
use crate::proto::{Request, Response};
use crate::runtime::blocking;
use crate::types::*;
use crate::validate;
use lru::LruCache;
use page::{check_page, missing_runs, SyncPage};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Pages pulled from one peer for one tree in one sync round. Keeps a round
/// finite when a peer keeps writing; the next round goes on from the cursor.
pub const MAX_PULL_PAGES_PER_ROUND: usize = 10_000;

/// Where a pull pass stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PassEnd {
    /// At the end of the peer's log.
    LogEnd,
    /// Before it: a page limit, or the peer changed meanwhile.
    Partial,
    /// The peer's log ends below the cursor: it was rebuilt on a replaced
    /// disk, and the cursor's heights mean nothing there.
    LogRebuilt,
}

/// What one sync round did.
#[derive(Debug, Default)]
pub struct RoundOutcome {
    /// True when the round reached the end of every peer's log of every
    /// tree it covered, with no peer failing and no tree name deferred.
    pub complete: bool,
    /// Trees the planted bug `SyncDropsTreeOnPeerError` dropped.
    pub dropped: BTreeSet<TreeKey>,
}

/// Held heights between two missing ones that a puller fetches anyway, so
/// that scattered gaps cost one GetOpLog call, not one each. The held ops
/// in between are filtered out before any write.
const PULL_GAP_HEIGHTS_MAX: u64 = 32;

/// How many of the least recently used cursors an eviction looks at for one
/// that is durable, before it drops the oldest one whatever its lag.
const EVICTION_LOOK_MAX: usize = 8;

/// Counters of the pull side (see `ServiceStats`).
#[derive(Default)]
pub(super) struct PullCounters {
    pub ops_pulled: AtomicU64,
    pub sync_rounds: AtomicU64,
    pub sync_peer_errors: AtomicU64,
    /// Tree names a peer listed beyond `limits.max_tracked_trees`, left
    /// for later rounds.
    pub sync_names_deferred: AtomicU64,
    /// Pull cursors started again because the peer's log ended below them
    /// or its log epoch changed.
    pub logs_rebuilt: AtomicU64,
    /// `GetOpLog` pages applied (not the stamp pages).
    pub sync_pages_pulled: AtomicU64,
}

/// The pull cursors kept in memory, at most `limits.max_tracked_trees`,
/// least recently stored first out (the durable copies are the truth; an
/// evicted lagging cursor costs a re-listing of at most `CURSOR_LAG_MAX`
/// stamps, whose ops the log already holds). Reads do not count as uses.
struct PullCursors(LruCache<(TreeKey, ReplicaId), LazyCursor>);

impl Default for PullCursors {
    fn default() -> Self {
        // Bounded by `put`, which evicts with a preference of its own.
        Self(LruCache::unbounded())
    }
}

impl PullCursors {
    fn get(&self, key: &(TreeKey, ReplicaId)) -> Option<LazyCursor> {
        self.0.peek(key).copied()
    }

    fn put(&mut self, key: (TreeKey, ReplicaId), cursor: LazyCursor, max: usize) {
        self.0.push(key, cursor);
        while self.0.len() > max {
            self.evict_one();
        }
    }

    /// Among the `EVICTION_LOOK_MAX` least recently stored cursors, the
    /// oldest durable one goes; if all of them lag, the oldest.
    fn evict_one(&mut self) {
        let durable = self
            .0
            .iter()
            .rev()
            .take(EVICTION_LOOK_MAX)
            .find(|(_, cursor)| !cursor.lagging())
            .map(|(key, _)| key.clone());
        match durable {
            Some(key) => {
                self.0.pop(&key).expect("found above");
            }
            None => {
                self.0.pop_lru().expect("over the bound");
            }
        }
    }

    fn remove(&mut self, key: &(TreeKey, ReplicaId)) {
        self.0.pop(key);
    }

    fn forget(&mut self, trees: &BTreeSet<TreeKey>) {
        let gone: Vec<(TreeKey, ReplicaId)> = self
            .0
            .iter()
            .filter(|((tree, _), _)| trees.contains(tree))
            .map(|(key, _)| key.clone())
            .collect();
        for key in gone {
            self.0.pop(&key);
        }
    }

    /// The cursors ahead of their durable copies, by key.
    fn lagging(&self) -> Vec<((TreeKey, ReplicaId), u64)> {
        let mut lagging: Vec<_> = self
            .0
            .iter()
            .filter(|(_, cursor)| cursor.lagging())
            .map(|(key, cursor)| (key.clone(), cursor.position()))
            .collect();
        lagging.sort_by(|a, b| a.0.cmp(&b.0));
        lagging
    }
}

/// One ended pull pass (also a failed one), as a `PullObserver` sees it.
#[derive(Clone, Copy, Debug)]
pub struct PullPass<'a> {
    pub tree: &'a TreeKey,
    pub peer: ReplicaId,
    /// The position of the pull cursor of `(tree, peer)` after the pass.
    pub cursor: u64,
    /// Ops the pass applied that were new here.
    pub fresh: u64,
    /// The peer's log epoch the cursor counts heights of (`None` when the
    /// peer never said): a peer whose disk was replaced after this round
    /// verified it serves another epoch until the next round.
    pub log_epoch: Option<u64>,
}

/// Told about every pull pass once it ended. Tests and the simulator check
/// through it, with their own reads of both logs, that every op of the
/// peer below the cursor is held here.
pub trait PullObserver: Send + Sync {
    fn pass_ended(&self, pass: &PullPass);
}

/// What a pull of one stamp page did.
struct Pulled {
    /// Every height of the page below this is held or applied here.
    applied_to: u64,
    /// Ops that were new here.
    fresh: u64,
    /// The error that stopped the page early: applying or fetching ops.
    stop: Option<Error>,
    /// False when the pass should end without an error (the peer lost the
    /// tree meanwhile).
    complete: bool,
}

impl Pulled {
    /// Everything below `height` is held or applied.
    fn reach(&mut self, height: u64) {
        assert!(
            height >= self.applied_to,
            "pull moved back from {} to {height}",
            self.applied_to
        );
        self.applied_to = height;
    }
}

/// The pull side of one node.
pub(super) struct Puller {
    core: Arc<Core>,
    cursors: Mutex<PullCursors>,
    /// Per peer, the log epoch its pull cursors count heights of, as
    /// recorded durably by the last round that verified the peer.
    log_epochs: Mutex<BTreeMap<ReplicaId, u64>>,
    pub counters: PullCounters,
    observer: Mutex<Option<Arc<dyn PullObserver>>>,
    /// The (tree, peer) pairs the planted bug `JoinerStopsAfterFirstPage`
    /// stopped pulling.
    #[cfg(feature = "canary")]
    stalled: Mutex<BTreeSet<(TreeKey, ReplicaId)>>,
}

impl Puller {
    pub fn new(core: Arc<Core>) -> Self {
        Self {
            core,
            cursors: Mutex::default(),
            log_epochs: Mutex::default(),
            counters: PullCounters::default(),
            observer: Mutex::default(),
            #[cfg(feature = "canary")]
            stalled: Mutex::default(),
        }
    }

    pub fn set_observer(&self, observer: Arc<dyn PullObserver>) {
        *self.observer.lock().expect("pull observer") = Some(observer);
    }

    /// Pulls every tree this node replicates from every peer. A peer that
    /// fails is skipped for the rest of the round; nothing local is touched
    /// on failure. Says whether the round reached the end of every peer's
    /// log of every tree, and which trees the planted bug
    /// `SyncDropsTreeOnPeerError` dropped (none otherwise).
    pub async fn sync_round(&self) -> RoundOutcome {
        let mut failed_peers = BTreeSet::new();
        let mut outcome = RoundOutcome::default();
        let deferred_before = self.counters.sync_names_deferred.load(Ordering::Relaxed);
        self.verify_peers(&mut failed_peers).await;
        let trees = self.sync_trees(&mut failed_peers).await;
        let mut every_log_ended = true;
        for tree in trees {
            if self.core.stopped() {
                return outcome;
            }
            let _pulling = self.core.locks.pull(&tree).await;
            for &peer in self.core.membership.peers_of(&tree.cid) {
                if failed_peers.contains(&peer) {
                    continue;
                }
                match self.pull_from(&tree, peer).await {
                    Ok(ended) => every_log_ended &= ended,
                    Err(error) => {
                        every_log_ended = false;
                        let dropped = &mut outcome.dropped;
                        self.peer_failed(&tree, peer, &error, &mut failed_peers, dropped);
                    }
                }
            }
        }
        self.counters.sync_rounds.fetch_add(1, Ordering::Relaxed);
        let deferred = self.counters.sync_names_deferred.load(Ordering::Relaxed) > deferred_before;
        outcome.complete = every_log_ended && failed_peers.is_empty() && !deferred;
        assert!(
            outcome.dropped.is_empty() || canary::active(Canary::SyncDropsTreeOnPeerError),
            "sync dropped a tree"
        );
        outcome
    }

    fn peer_failed(
        &self,
        tree: &TreeKey,
        peer: ReplicaId,
        error: &Error,
        failed_peers: &mut BTreeSet<ReplicaId>,
        dropped: &mut BTreeSet<TreeKey>,
    ) {
        self.counters
            .sync_peer_errors
            .fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%error, peer, ?tree, "sync from peer failed");
        if !error.is_transient() {
            return;
        }
        failed_peers.insert(peer);
        if canary::active(Canary::SyncDropsTreeOnPeerError) {
            // Planted bug: discard local data on a peer's hiccup.
            let _ = self.core.forest.tree_drop(&tree.cid, Some(&tree.tree));
            dropped.insert(tree.clone());
            self.forget(&BTreeSet::from([tree.clone()]));
        }
    }

    /// Trees to sync: the local ones plus what peers list for the
    /// containers this node replicates (at most `limits.max_tracked_trees`
    /// names per peer and round, a different stretch each round).
    async fn sync_trees(&self, failed_peers: &mut BTreeSet<ReplicaId>) -> BTreeSet<TreeKey> {
        let membership = &self.core.membership;
        let listed = self.core.storage(|forest| forest.all_trees()).await;
        let mut trees: BTreeSet<TreeKey> = match listed {
            Ok(trees) => trees
                .into_iter()
                .filter(|t| membership.replicates(&t.cid))
                .collect(),
            Err(error) => {
                tracing::warn!(%error, "sync cannot list local trees");
                BTreeSet::new()
            }
        };
        let mut cids: BTreeSet<ContainerId> = trees.iter().map(|t| t.cid).collect();
        cids.extend(membership.listed_here());
        for cid in cids {
            for &peer in membership.peers_of(&cid) {
                if failed_peers.contains(&peer) {
                    continue;
                }
                match self.peer_trees(cid, peer).await {
                    Ok(names) => {
                        trees.extend(names.into_iter().map(|name| TreeKey::new(cid, name)))
                    }
                    Err(()) => {
                        self.counters
                            .sync_peer_errors
                            .fetch_add(1, Ordering::Relaxed);
                        failed_peers.insert(peer);
                    }
                }
            }
        }
        assert!(
            trees.iter().all(|t| membership.replicates(&t.cid)),
            "synced a foreign tree"
        );
        trees
    }

    /// The tree names `peer` lists for `cid`, bounded; `Err` when the peer
    /// failed (a peer that refuses the container lists nothing).
    async fn peer_trees(&self, cid: ContainerId, peer: ReplicaId) -> Result<Vec<String>, ()> {
        let timeout = self.core.config.tree.replication_timeout;
        let call = self
            .core
            .transport
            .call(peer, Request::TreeList { cid }, timeout);
        match call.await {
            Ok(Response::Trees(names)) => Ok(self.bounded_names(names)),
            Ok(Response::Error(error)) if !error.is_transient() => Ok(Vec::new()),
            Ok(_) | Err(_) => Err(()),
        }
    }

    /// At most `limits.max_tracked_trees` of `names`: a stretch that moves
    /// on every round, so that every name comes up in turn.
    fn bounded_names(&self, mut names: Vec<String>) -> Vec<String> {
        let max = self.core.config.limits.max_tracked_trees;
        names.sort_unstable();
        names.dedup();
        if names.len() <= max {
            return names;
        }
        let deferred = (names.len() - max) as u64;
        self.counters
            .sync_names_deferred
            .fetch_add(deferred, Ordering::Relaxed);
        let round = self.counters.sync_rounds.load(Ordering::Relaxed);
        let start = (round as usize).wrapping_mul(max) % names.len();
        names.rotate_left(start);
        names.truncate(max);
        assert_eq!(names.len(), max, "a full stretch of names");
        names
    }

    /// Pulls `peer`'s log of `tree` from the pull cursor, page by page,
    /// moving the cursor only over ops applied here. The durable cursor is
    /// written whenever it lags `CURSOR_LAG_MAX` behind, and at the end of
    /// a pass (also a failed one) when it was not written for the persist
    /// period. True when the pass reached the end of the peer's log. The
    /// caller holds the tree's pull lock.
    async fn pull_from(&self, tree: &TreeKey, peer: ReplicaId) -> Result<bool> {
        let cursor_peer = if canary::active(Canary::SharedSyncCursor) {
            0 // Planted bug: every peer's heights share one cursor.
        } else {
            peer
        };
        let key = (tree.clone(), cursor_peer);
        let known = self.cursors.lock().expect("pull cursors").get(&key);
        let mut cursor = match known {
            Some(cursor) => cursor,
            None => {
                let tree = tree.clone();
                let durable = self
                    .core
                    .storage(move |forest| forest.cursor(&tree, CursorKind::Pull, cursor_peer))
                    .await?;
                LazyCursor::loaded(durable)
            }
        };
        let start = cursor.position();
        let log_epoch = self
            .log_epochs
            .lock()
            .expect("log epochs")
            .get(&peer)
            .copied();
        let pulled_before = self.counters.ops_pulled.load(Ordering::Relaxed);
        let pages_max = match self.joiner_stalls(tree, peer, start)? {
            // Planted bug: a joining pair pulls its first page, then no more.
            true if start > 0 => 0,
            true => 1,
            false => MAX_PULL_PAGES_PER_ROUND,
        };
        let mut result = self
            .pull_pages(tree, peer, cursor_peer, &mut cursor, pages_max)
            .await;
        assert!(cursor.position() >= start, "pull cursor moved back");
        if let Ok(PassEnd::LogRebuilt) = result {
            result = self
                .forget_rebuilt(tree, peer, cursor_peer, &mut cursor)
                .await;
        }
        let now = self.core.env.clock.now();
        let period = persist_period(self.core.config.tree.replication_timeout);
        let persisted = if cursor.persist_due(now, period) {
            cursor::persist(&self.core, tree, CursorKind::Pull, cursor_peer, &mut cursor).await
        } else {
            Ok(())
        };
        let max = self.core.config.limits.max_tracked_trees;
        self.cursors
            .lock()
            .expect("pull cursors")
            .put(key, cursor, max);
        let observer = self.observer.lock().expect("pull observer").clone();
        if let Some(observer) = observer {
            let pulled = self.counters.ops_pulled.load(Ordering::Relaxed);
            observer.pass_ended(&PullPass {
                tree,
                peer,
                cursor: cursor.position(),
                fresh: pulled.saturating_sub(pulled_before),
                log_epoch,
            });
        }
        persisted.and(result.map(|end| end == PassEnd::LogEnd))
    }

    /// The peer's log of `tree` ends below the cursor: its disk was
    /// replaced and the log rebuilt from its peers, so the cursor's heights
    /// mean nothing there. The cursor starts again from 0, durably first
    /// (stamps of held ops cost no op transfer); the next pass pulls.
    async fn forget_rebuilt(
        &self,
        tree: &TreeKey,
        peer: ReplicaId,
        cursor_peer: ReplicaId,
        cursor: &mut LazyCursor,
    ) -> Result<PassEnd> {
        tracing::info!(
            peer,
            ?tree,
            at = cursor.position(),
            "peer's log rebuilt: pull cursor reset"
        );
        let forest = self.core.forest.clone();
        let key = tree.clone();
        blocking(&*self.core.env.runtime, move || {
            forest.reset_cursor(&key, CursorKind::Pull, cursor_peer)
        })
        .await?;
        *cursor = LazyCursor::loaded(0);
        self.counters.logs_rebuilt.fetch_add(1, Ordering::Relaxed);
        Ok(PassEnd::Partial)
    }

    /// The planted bug `JoinerStopsAfterFirstPage`: true when this pass
    /// pulls at most one page, for a tree not held here when its first
    /// pass from `peer` began; a stalled pair pulls nothing more.
    #[cfg(feature = "canary")]
    fn joiner_stalls(&self, tree: &TreeKey, peer: ReplicaId, start: u64) -> Result<bool> {
        if !canary::active(Canary::JoinerStopsAfterFirstPage) {
            return Ok(false);
        }
        let key = (tree.clone(), peer);
        let mut stalled = self.stalled.lock().expect("stalled pulls");
        if stalled.contains(&key) {
            return Ok(true);
        }
        let joining = start == 0 && !self.core.forest.tree_exists(tree)?;
        if joining {
            stalled.insert(key);
        }
        Ok(joining)
    }

    #[cfg(not(feature = "canary"))]
    fn joiner_stalls(&self, _tree: &TreeKey, _peer: ReplicaId, _start: u64) -> Result<bool> {
        Ok(false)
    }

    /// Forgets the in-memory pull cursors of dropped trees (their durable
    /// ones went with the tree).
    pub fn forget(&self, trees: &BTreeSet<TreeKey>) {
        self.cursors.lock().expect("pull cursors").forget(trees);
    }

    pub fn core(&self) -> &Core {
        &self.core
    }

    /// The pull cursors ahead of their durable copies, with positions.
    pub fn lagging_cursors(&self) -> Vec<((TreeKey, ReplicaId), u64)> {
        self.cursors.lock().expect("pull cursors").lagging()
    }

    /// Pull cursors held in memory.
    pub fn cursors_held(&self) -> usize {
        self.cursors.lock().expect("pull cursors").0.len()
    }

    async fn pull_pages(
        &self,
        tree: &TreeKey,
        peer: ReplicaId,
        cursor_peer: ReplicaId,
        cursor: &mut LazyCursor,
        pages_max: usize,
    ) -> Result<PassEnd> {
        for page in 0..pages_max {
            let asked = cursor.position();
            let stamps = match self.fetch_stamps(tree, peer, asked).await? {
                Some((stamps, _)) if !stamps.is_empty() => stamps,
                Some((_, log_end)) if log_end < asked => return Ok(PassEnd::LogRebuilt),
                _ => return Ok(PassEnd::LogEnd),
            };
            if page > 0 {
                probe::hit(Probe::PullStampPageNext);
            }
            // Above `asked` only when the peer's log starts above it (a
            // tree created again after a drop): nothing lies between.
            let from = stamps[0].height;
            let end = stamps.last().expect("a page is not empty").height + 1;
            if canary::active(Canary::PullCursorPersistedEarly) {
                // Planted bug: the cursor is made durable before the page.
                self.core
                    .forest
                    .set_cursor(tree, CursorKind::Pull, cursor_peer, end)?;
            }
            let pulled = match self.pull_missing(tree, peer, from, &stamps).await {
                Ok(pulled) => pulled,
                Err(error) => {
                    if canary::active(Canary::PullCursorPastFailedPage) {
                        cursor.advance(end); // Planted bug, as below.
                    }
                    return Err(error);
                }
            };
            if pulled.complete && pulled.stop.is_none() {
                assert_eq!(
                    pulled.applied_to, end,
                    "a whole page moves the pull past it"
                );
            }
            if pulled.stop.is_some() && canary::active(Canary::PullCursorPastFailedPage) {
                // Planted bug: a page that failed to apply is passed over.
                cursor.advance(end);
            }
            cursor.advance(pulled.applied_to.max(cursor.position()));
            if cursor.lag_exceeded() {
                probe::hit(Probe::PullCursorPersistedByLag);
                cursor::persist(&self.core, tree, CursorKind::Pull, cursor_peer, cursor).await?;
            }
            self.counters
                .ops_pulled
                .fetch_add(pulled.fresh, Ordering::Relaxed);
            if let Some(error) = pulled.stop {
                return Err(error);
            }
            if !pulled.complete {
                return Ok(PassEnd::Partial);
            }
            if self.core.stopped() {
                return Err(Error::ShuttingDown);
            }
        }
        Ok(PassEnd::Partial)
    }

    /// A sync read from `peer`: its answer, or `None` when the peer does
    /// not have the tree.
    async fn sync_call(&self, peer: ReplicaId, request: Request) -> Result<Option<Response>> {
        let timeout = self.core.config.tree.replication_timeout;
        match self.core.transport.call(peer, request, timeout).await? {
            Response::Error(Error::TreeNotFound) => Ok(None),
            Response::Error(error) => Err(error),
            answer => Ok(Some(answer)),
        }
    }

    /// One page of the heights and timestamps of a peer's log from
    /// `from_height`; `None` when the peer does not have the tree.
    /// With it, the `next_height` of the answer.
    async fn fetch_stamps(
        &self,
        tree: &TreeKey,
        peer: ReplicaId,
        from_height: u64,
    ) -> Result<Option<(Vec<LogStamp>, u64)>> {
        let limit = self.core.config.limits.sync_stamp_page_size;
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
            .min(self.core.config.limits.sync_page_size);
        let page = self.fetch_sync_page(tree, peer, from_height, limit).await?;
        Ok(page.map(|(entries, _)| entries))
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
    ) -> Result<Option<(Vec<P>, u64)>> {
        let wire_limit = limit.min(u32::MAX as usize) as u32;
        let request = P::request(tree.clone(), from_height, wire_limit);
        let (page, first_height, next_height) = match self.sync_call(peer, request).await? {
            None => return Ok(None),
            Some(answer) => P::from_answer(answer)
                .map_err(|other| page::unexpected_answer(peer, P::REQUEST, &other))?,
        };
        let heights = page.iter().map(P::height);
        check_page(peer, from_height, first_height, heights, limit)?;
        assert!(page.len() <= limit, "checked above");
        Ok(Some((page, next_height)))
    }
}
