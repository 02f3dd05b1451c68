//! Background sync (docs/design.md §6): at start and every `sync_interval`
//! this node asks each peer for its log of every tree they share, from a
//! durable per-(tree, peer) pull cursor that moves only over heights
//! applied here, and applies what it lacks. A peer's pages are input like
//! any other: checked, and a bad one costs that peer the rest of the round.

mod page;

use super::backoff::backoff;
use super::cursor::{self, persist_period, LazyCursor};
use super::Core;
use crate::canary::{self, Canary};
use crate::error::{Error, Result};
use crate::forest::{CursorKind, WriteOp, WriteOutcome, WriteRequest};
use crate::proto::{Request, Response};
use crate::runtime::blocking;
use crate::types::*;
use crate::validate;
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
/// least recently used first out (the durable copies are the truth; an
/// evicted lagging cursor costs a re-listing of at most `CURSOR_LAG_MAX`
/// stamps, whose ops the log already holds).
#[derive(Default)]
struct PullCursors {
    by_pair: BTreeMap<(TreeKey, ReplicaId), (LazyCursor, u64)>,
    by_use: BTreeMap<u64, (TreeKey, ReplicaId)>,
    uses: u64,
}

impl PullCursors {
    fn get(&self, key: &(TreeKey, ReplicaId)) -> Option<LazyCursor> {
        self.by_pair.get(key).map(|(cursor, _)| *cursor)
    }

    fn put(&mut self, key: (TreeKey, ReplicaId), cursor: LazyCursor, max: usize) {
        self.uses += 1;
        if let Some((_, used)) = self.by_pair.insert(key.clone(), (cursor, self.uses)) {
            self.by_use.remove(&used);
        }
        self.by_use.insert(self.uses, key);
        while self.by_pair.len() > max {
            self.evict_one();
        }
        assert_eq!(self.by_pair.len(), self.by_use.len(), "pull cursor index");
    }

    fn evict_one(&mut self) {
        let durable = self
            .by_use
            .iter()
            .take(EVICTION_LOOK_MAX)
            .find(|(_, key)| !self.by_pair[*key].0.lagging())
            .map(|(used, _)| *used);
        let used = durable.unwrap_or_else(|| *self.by_use.keys().next().expect("over the bound"));
        let key = self.by_use.remove(&used).expect("found above");
        self.by_pair.remove(&key);
    }

    fn remove(&mut self, key: &(TreeKey, ReplicaId)) {
        if let Some((_, used)) = self.by_pair.remove(key) {
            self.by_use.remove(&used);
        }
        assert_eq!(self.by_pair.len(), self.by_use.len(), "pull cursor index");
    }

    fn forget(&mut self, trees: &BTreeSet<TreeKey>) {
        self.by_pair.retain(|(tree, _), _| !trees.contains(tree));
        self.by_use.retain(|_, (tree, _)| !trees.contains(tree));
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
    /// The error that stopped the page early.
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
    /// stopped pulling; always empty without it.
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

    /// Asks every peer this round may call who it is: a peer that answers
    /// as another replica (a misconfigured `node.replica_id`, two nodes
    /// with one id) would hand out ops stamped in another replica's name,
    /// so it is not pulled from this round (docs/design.md §9). The answer
    /// also names the peer's log epoch, which the pull cursors of that
    /// peer must count heights in (§6): a peer that does not answer is not
    /// pulled from this round either.
    async fn verify_peers(&self, failed_peers: &mut BTreeSet<ReplicaId>) {
        let peers: BTreeSet<ReplicaId> = self.core.membership.all_peers().collect();
        let timeout = self.core.config.tree.replication_timeout;
        // All at once: a peer that is down costs one timeout, not one each.
        let calls = peers.iter().map(|&peer| async move {
            let answer = self
                .core
                .transport
                .call(peer, Request::Healthcheck, timeout);
            (peer, answer.await)
        });
        for (peer, answer) in futures::future::join_all(calls).await {
            let error = match answer {
                Ok(Response::Health {
                    replica_id,
                    log_epoch,
                }) if replica_id == peer => match self.follow_epoch(peer, log_epoch).await {
                    Ok(()) => continue,
                    Err(error) => error,
                },
                Ok(Response::Health { log_epoch, .. })
                    if canary::active(Canary::PeerIdentityUnchecked) =>
                {
                    match self.follow_epoch(peer, log_epoch).await {
                        Ok(()) => continue,
                        Err(error) => error,
                    }
                }
                Ok(Response::Health { replica_id, .. }) => Error::WrongPeer {
                    expected: peer,
                    answered: replica_id,
                },
                Ok(other) => page::unexpected_answer(peer, "Healthcheck", &other),
                Err(error) => error,
            };
            if let Error::WrongPeer { .. } = error {
                tracing::error!(%error, "peer not pulled from: it answers as another replica");
                self.core.trust.note(&error);
            } else {
                // Its log epoch is unknown (or could not be followed here),
                // so a cursor may count heights of a log it no longer has.
                tracing::debug!(%error, peer, "peer's log epoch unknown this round");
                self.core.note_error(&error);
            }
            self.counters
                .sync_peer_errors
                .fetch_add(1, Ordering::Relaxed);
            failed_peers.insert(peer);
        }
    }

    /// `peer` serves a log of epoch `epoch`. When the pull cursors of
    /// `peer` count another epoch's heights (its disk was replaced and the
    /// log rebuilt, which soon grows past them) or none was recorded, every
    /// one of them starts over from 0 before any pass, and the epoch is
    /// recorded (docs/design.md §6).
    async fn follow_epoch(&self, peer: ReplicaId, epoch: u64) -> Result<()> {
        if self.log_epochs.lock().expect("log epochs").get(&peer) == Some(&epoch) {
            return Ok(());
        }
        let forest = self.core.forest.clone();
        let runtime = &*self.core.env.runtime;
        let known = blocking(runtime, move || forest.peer_log_epoch(peer)).await?;
        if known == Some(epoch) {
            self.log_epochs
                .lock()
                .expect("log epochs")
                .insert(peer, epoch);
            return Ok(());
        }
        let trees = self.core.forest.all_trees()?;
        for tree in &trees {
            self.forget_cursor(tree, peer).await?;
        }
        let forest = self.core.forest.clone();
        blocking(runtime, move || forest.peer_log_epoch_set(peer, epoch)).await?;
        self.log_epochs
            .lock()
            .expect("log epochs")
            .insert(peer, epoch);
        if known.is_some() {
            tracing::info!(
                peer,
                epoch,
                "peer's log epoch changed: its pull cursors start over"
            );
            self.counters.logs_rebuilt.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Deletes the pull cursor of `(tree, peer)`, in memory and durably,
    /// under the tree's pull lock: a pass of an overlapping round either
    /// ended before (its cursor is deleted) or starts after (from 0).
    async fn forget_cursor(&self, tree: &TreeKey, peer: ReplicaId) -> Result<()> {
        let _pulling = self.core.locks.pull(tree).await;
        self.cursors
            .lock()
            .expect("pull cursors")
            .remove(&(tree.clone(), peer));
        let forest = self.core.forest.clone();
        let key = tree.clone();
        blocking(&*self.core.env.runtime, move || {
            forest.reset_cursor(&key, CursorKind::Pull, peer)
        })
        .await
    }

    /// Trees to sync: the local ones plus what peers list for the
    /// containers this node replicates (at most `limits.max_tracked_trees`
    /// names per peer and round, a different stretch each round).
    async fn sync_trees(&self, failed_peers: &mut BTreeSet<ReplicaId>) -> BTreeSet<TreeKey> {
        let membership = &self.core.membership;
        let mut trees: BTreeSet<TreeKey> = match self.core.forest.all_trees() {
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
            None => LazyCursor::loaded(self.core.forest.cursor(
                tree,
                CursorKind::Pull,
                cursor_peer,
            )?),
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
        let cursors = self.cursors.lock().expect("pull cursors");
        cursors
            .by_pair
            .iter()
            .filter(|(_, (cursor, _))| cursor.lagging())
            .map(|(key, (cursor, _))| (key.clone(), cursor.position()))
            .collect()
    }

    /// Pull cursors held in memory.
    pub fn cursors_held(&self) -> usize {
        self.cursors.lock().expect("pull cursors").by_pair.len()
    }

    async fn pull_pages(
        &self,
        tree: &TreeKey,
        peer: ReplicaId,
        cursor_peer: ReplicaId,
        cursor: &mut LazyCursor,
        pages_max: usize,
    ) -> Result<PassEnd> {
        for _ in 0..pages_max {
            let asked = cursor.position();
            let stamps = match self.fetch_stamps(tree, peer, asked).await? {
                Some((stamps, _)) if !stamps.is_empty() => stamps,
                Some((_, log_end)) if log_end < asked => return Ok(PassEnd::LogRebuilt),
                _ => return Ok(PassEnd::LogEnd),
            };
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

    /// Fetches and applies the ops of a page of `peer`'s stamps, which
    /// starts at `from`, that the local log lacks, in height order. Held
    /// ops are neither fetched nor submitted: pushes deliver nearly all of
    /// a peer's log before a round.
    async fn pull_missing(
        &self,
        tree: &TreeKey,
        peer: ReplicaId,
        from: u64,
        stamps: &[LogStamp],
    ) -> Result<Pulled> {
        assert_eq!(stamps[0].height, from, "a stamp page starts at its cursor");
        let timestamps: Vec<Timestamp> = stamps.iter().map(|s| s.ts).collect();
        let held = self
            .core
            .forest
            .held_digests(tree, &timestamps)
            .inspect_err(|error| self.core.note_error(error))?;
        assert_eq!(held.len(), stamps.len(), "one answer per stamp");
        let mut missing = Vec::new();
        for (stamp, held) in stamps.iter().zip(held) {
            match held {
                None => missing.push(stamp.height),
                Some(digest) if digest == stamp.digest => {}
                Some(_) => self.stamp_conflict(tree, peer, stamp),
            }
        }
        let mut pulled = Pulled {
            applied_to: from,
            fresh: 0,
            stop: None,
            complete: true,
        };
        for (first, last) in missing_runs(&missing, PULL_GAP_HEIGHTS_MAX) {
            // Everything below `first` in this page is held or applied.
            pulled.reach(first);
            self.pull_run(tree, peer, first, last, &mut pulled).await?;
            if pulled.stop.is_some() || !pulled.complete {
                return Ok(pulled);
            }
        }
        pulled.reach(stamps.last().expect("a page is not empty").height + 1);
        Ok(pulled)
    }

    /// A timestamp held here with another op than `peer` holds under it:
    /// neither replica can repair that, so it is counted and reported, and
    /// the pull passes over it (docs/design.md §9).
    fn stamp_conflict(&self, tree: &TreeKey, peer: ReplicaId, stamp: &LogStamp) {
        let error = Error::StampConflict(stamp.ts);
        self.core.trust.note(&error);
        tracing::error!(
            peer,
            ts = stamp.ts,
            height = stamp.height,
            ?tree,
            "a peer holds another op under a timestamp held here"
        );
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
        assert!(
            first <= last && pulled.applied_to == first,
            "a run starts where the pull is"
        );
        let mut from = first;
        while from <= last {
            let fetched = self.fetch_page(tree, peer, from, last - from + 1).await?;
            let mut entries = fetched.unwrap_or_default();
            entries.retain(|e| e.height <= last);
            if entries.is_empty() {
                // The peer dropped the tree since it listed the stamps:
                // end the pass, the cursor stays before what is unapplied.
                pulled.complete = false;
                return Ok(());
            }
            let (applied_to, fresh, stop) = self.apply_page(tree, from, entries).await?;
            self.counters
                .sync_pages_pulled
                .fetch_add(1, Ordering::Relaxed);
            pulled.fresh += fresh;
            pulled.reach(applied_to);
            if stop.is_some() {
                pulled.stop = stop;
                return Ok(());
            }
            assert!(applied_to > from, "a whole page applied moves the pull on");
            from = applied_to;
        }
        Ok(())
    }

    /// Applies a pulled page, which starts at `from`; returns the height
    /// the cursor may move to, how many ops were new, and the error that
    /// stopped it early, if any. Ops that can never apply (invalid) are
    /// passed over with a warning; ops the log already holds are passed
    /// over without a write transaction.
    async fn apply_page(
        &self,
        tree: &TreeKey,
        from: u64,
        entries: Vec<LogEntry>,
    ) -> Result<(u64, u64, Option<Error>)> {
        let heights: Vec<u64> = entries.iter().map(|e| e.height).collect();
        // Checked on arrival (`check_page`): a page applies from its first
        // height, one height after another.
        assert_eq!(heights[0], from, "a page applies from its first height");
        assert!(
            heights.windows(2).all(|w| w[1] == w[0] + 1),
            "a page has no gaps"
        );
        let submit = self.ops_to_submit(tree, &entries)?;
        let requests: Vec<WriteRequest> = entries
            .into_iter()
            .zip(&submit)
            .filter(|(_, submit)| **submit)
            .map(|(entry, _)| WriteRequest {
                tree: tree.clone(),
                op: WriteOp::Apply { op: entry.op },
            })
            .collect();
        let mut results = self.submit_pulled(requests).await?.into_iter();
        let mut applied_to = from;
        let mut fresh = 0;
        for (height, submitted) in heights.into_iter().zip(submit) {
            if submitted {
                match results.next().expect("one result per request") {
                    Ok(WriteOutcome::Applied { fresh: true }) => fresh += 1,
                    Ok(_) => {}
                    Err(error) if error.is_transient() => {
                        self.core.trust.note(&error);
                        return Ok((applied_to, fresh, Some(error)));
                    }
                    Err(error) => {
                        self.core.trust.note(&error);
                        tracing::warn!(%error, height, ?tree, "peer op refused")
                    }
                }
            }
            applied_to = height + 1;
        }
        assert!(results.next().is_none(), "one result per request");
        Ok((applied_to, fresh, None))
    }

    /// Hands a pulled page to the batcher. A full batcher is this node's
    /// own load (client writes, pushes, a second round), not the peer's
    /// failure: the page waits for room, by the retry schedule of pushes,
    /// for at most `tree.replication_timeout` in all, and only then stops
    /// the pass (which skips the peer for the rest of the round).
    async fn submit_pulled(
        &self,
        requests: Vec<WriteRequest>,
    ) -> Result<Vec<Result<WriteOutcome>>> {
        let cap = self.core.config.tree.replication_timeout;
        let mut waited = Duration::ZERO;
        let mut refusals = 0;
        loop {
            let error = match self.core.batcher.submit_all(requests.clone()).await {
                Err(error @ Error::Overloaded(_)) if waited < cap => error,
                answer => return answer,
            };
            refusals += 1;
            let wait = backoff(refusals, cap).min(cap - waited);
            tracing::debug!(%error, ?wait, "pulled page waits for room in the batcher");
            if self.core.sleep_or_stop(wait).await {
                return Err(Error::ShuttingDown);
            }
            waited += wait;
        }
    }

    /// A pulled op must be stamped by a replica of its container, present
    /// or retired: a peer holds and hands out others' ops, but only ever
    /// those of the container's replicas (docs/design.md §6, §9).
    fn check_origin(&self, tree: &TreeKey, op: &Move) -> Result<()> {
        let origin = timestamp_replica(op.ts());
        if self.core.membership.may_stamp(&tree.cid, origin) {
            return Ok(());
        }
        self.core
            .trust
            .ops_refused_foreign
            .fetch_add(1, Ordering::Relaxed);
        Err(Error::InvalidOp(format!(
            "op {} stamped by replica {origin}, which does not hold the container",
            op.ts()
        )))
    }

    /// Which entries of a pulled page go to the batcher: the valid ones the
    /// local log does not hold yet. Most of a peer's log came here by push
    /// already; submitting it again would cost a lookup and a write
    /// transaction per page for nothing.
    fn ops_to_submit(&self, tree: &TreeKey, entries: &[LogEntry]) -> Result<Vec<bool>> {
        let limits = self.core.config.limits.input();
        let mut submit = Vec::with_capacity(entries.len());
        for entry in entries {
            let valid =
                validate::replicated(&entry.op, limits).and(self.check_origin(tree, &entry.op));
            if let Err(error) = &valid {
                tracing::warn!(%error, height = entry.height, ?tree, "skipping invalid op from peer");
            }
            submit.push(valid.is_ok());
        }
        let ops: Vec<&Move> = entries.iter().map(|e| &e.op).collect();
        let stored = self
            .core
            .forest
            .stored_ops(tree, &ops)
            .inspect_err(|error| self.core.note_error(error))?;
        assert_eq!(stored.len(), entries.len(), "one answer per op");
        for (submit, stored) in submit.iter_mut().zip(stored) {
            *submit = *submit && !stored;
        }
        Ok(submit)
    }
}
