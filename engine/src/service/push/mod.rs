//! Replication by push (docs/design.md §6): every op that originated here
//! is sent to every peer of its container, from a durable per-(tree, peer)
//! cursor that moves only over acknowledged heights.
//!
//! Nothing acknowledged is ever dropped: a commit's hint ("tree X has new
//! ops") only says *when* to look. Hints queue the tree's pairs for a fixed
//! pool of `replication_worker_count` workers; a hint that finds the queue
//! full (`replication_channel_capacity`) waits in a backlog, and a periodic
//! sweep (also at start, which covers restarts) finds whatever the hints
//! missed. `book` keeps which pairs have work; a failed pair backs off
//! there without holding a worker.

pub(crate) mod book;
pub(crate) mod window;

use super::cursor::{self, persist_period, LazyCursor};
use super::Core;
use crate::error::{Error, Result};
use crate::forest::{CursorKind, OpLogPage};
use crate::probe::{self, Probe};
use crate::proto::{Request, Response};
use crate::runtime::{blocking, BoxFuture};
use crate::types::*;
use book::{PassEnd, PassStart, PassVerdict, PushBook, PushKey};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use window::PushWindows;

/// Estimated encoded bytes of an op beyond its meta (ids, timestamp,
/// height, framing of the key/value list).
pub const ITEM_OVERHEAD_BYTES: usize = 64;

/// Trees the walk lists per sweep at most, beyond what the book has room
/// for: the listing is a read of the trees table.
const WALK_LIST_MAX: usize = 4096;

/// What every page of own ops satisfies, from the log or a window: no
/// more than asked, ascending heights in `[from, next_height)`, all of
/// this node's origin.
fn check_own_page(page: &OpLogPage, from: u64, limit: usize, own: ReplicaId) {
    assert!(page.entries.len() <= limit, "op log page over its limit");
    assert!(page.next_height >= from, "op log page before its start");
    let mut next_min = from;
    for entry in &page.entries {
        assert!(
            entry.height >= next_min && entry.height < page.next_height,
            "op log page out of order"
        );
        assert_eq!(
            timestamp_replica(entry.op.ts()),
            own,
            "foreign op in an own page"
        );
        next_min = entry.height + 1;
    }
}

/// The push side of one node.
pub(super) struct Pusher {
    core: Arc<Core>,
    book: Arc<PushBook>,
    windows: Arc<PushWindows>,
}

impl Pusher {
    /// Starts the dispatcher and the sweep.
    pub fn start(core: Arc<Core>, book: Arc<PushBook>, windows: Arc<PushWindows>) -> Arc<Self> {
        let pusher = Arc::new(Self {
            core,
            book,
            windows,
        });
        let dispatch = pusher.clone().run_dispatch();
        pusher.core.spawn("push-dispatch", dispatch);
        let sweeps = pusher.clone().run_sweeps();
        pusher.core.spawn("push-sweep", sweeps);
        pusher
    }

    pub fn book(&self) -> &PushBook {
        &self.book
    }

    /// Starts workers for queued pairs and queues failed pairs again when
    /// their backoff ends.
    async fn run_dispatch(self: Arc<Self>) {
        let mut shutdown = self.core.shutdown.subscribe();
        loop {
            let now = self.core.env.clock.now();
            let (start, next_retry) = self.book.dispatch(now);
            assert!(
                next_retry.is_none_or(|at| at > now),
                "a due retry left behind"
            );
            for _ in 0..start {
                self.core.spawn("push-worker", self.clone().run_worker());
            }
            let retry: BoxFuture<'static, ()> = match next_retry {
                Some(at) => self.core.env.clock.sleep(at.saturating_sub(now)),
                None => Box::pin(std::future::pending()),
            };
            tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop) => return,
                () = self.book.wake.notified() => {}
                () = retry => {}
            }
        }
    }

    /// Runs passes while pairs are queued; leaves the pool when none is.
    async fn run_worker(self: Arc<Self>) {
        loop {
            if self.core.stopped() {
                self.book.retire();
                return;
            }
            let Some((key, ticket)) = self.book.take() else {
                return;
            };
            assert!(ticket > 0, "tickets start at 1");
            self.pass(&key, ticket).await;
        }
    }

    /// One pass of a pair, under its tree's lock (no Drop meanwhile): the
    /// ops that originated here from its cursor on, page by page.
    async fn pass(self: &Arc<Self>, key: &PushKey, ticket: u64) {
        let counters = &self.book.counters;
        counters.push_passes.fetch_add(1, Ordering::Relaxed);
        let _no_drop = self.core.locks.no_drop(&key.0).await;
        let Some(start) = self.book.begin_pass(key, ticket) else {
            return; // dropped meanwhile
        };
        let (cursor, result) = self.push_from(key, &start).await;
        assert!(
            result.is_err() || cursor.is_some(),
            "a clean pass knows its cursor"
        );
        if let Err(error) = &result {
            counters.push_failures.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%error, peer = key.1, tree = ?key.0, "push failed");
        }
        let end = PassEnd {
            cursor,
            ok: result.is_ok(),
            conflict: matches!(result, Err(Error::StampConflict(_))),
        };
        let now = self.core.env.clock.now();
        let verdict = self.book.end_pass(key, ticket, &start, end, now);
        if let PassVerdict::Parked(passes) = verdict {
            // Retrying cannot help: the peer keeps its op under that stamp
            // until an operator repairs one side (docs/design.md §9).
            tracing::error!(
                peer = key.1,
                tree = ?key.0,
                passes,
                "push parked: the peer holds other ops under our stamps"
            );
        }
        if !end.ok {
            self.book.wake.notify_one();
        }
    }

    /// Sends what the peer has not acknowledged and writes the cursor when
    /// it is due; returns the cursor as the pass leaves it.
    async fn push_from(
        self: &Arc<Self>,
        (tree, peer): &PushKey,
        start: &PassStart,
    ) -> (Option<LazyCursor>, Result<()>) {
        let mut cursor = match start.cursor {
            Some(cursor) => cursor,
            None => match self.durable_cursor(tree, *peer).await {
                Ok(durable) => LazyCursor::loaded(durable),
                Err(error) => {
                    self.core.note_error(&error);
                    return (None, Err(error));
                }
            },
        };
        #[cfg(feature = "canary")]
        if let Some(skip) = start.skip.filter(|&skip| skip > cursor.position()) {
            cursor.advance(skip); // planted bug: the skipped ops count as sent
        }
        let from = cursor.position();
        let result = match self.push_pages(tree, *peer, &mut cursor).await {
            Err(Error::TreeNotFound) => Ok(()), // nothing left to push
            other => other,
        };
        let now = self.core.env.clock.now();
        let period = persist_period(self.core.config.tree.replication_timeout);
        let pressed = start.pressure && result.is_ok() && cursor.lagging();
        if cursor.persist_due(now, period) || pressed {
            let persisted =
                cursor::persist(&self.core, tree, CursorKind::Push, *peer, &mut cursor).await;
            if let Err(error) = persisted {
                return (Some(cursor), Err(error));
            }
            assert!(!cursor.lagging(), "a written cursor is durable");
        }
        assert!(cursor.position() >= from, "push cursor moved back");
        (Some(cursor), result)
    }

    /// Sends `peer` every op that originated here from `cursor` on, one
    /// page at a time; the cursor moves only over acknowledged pages.
    async fn push_pages(
        self: &Arc<Self>,
        tree: &TreeKey,
        peer: ReplicaId,
        cursor: &mut LazyCursor,
    ) -> Result<()> {
        let mut page_max = self.core.config.limits.sync_page_size;
        loop {
            let from = cursor.position();
            let (ops, next) = {
                // A window miss reads the log: off the async workers.
                let (this, tree) = (Arc::clone(self), tree.clone());
                blocking(&*self.core.env.runtime, move || {
                    this.next_page(&tree, from, page_max)
                })
                .await?
            };
            if next == from {
                return Ok(());
            }
            if !ops.is_empty() {
                match self.send_ops(tree, peer, ops).await {
                    // The peer has smaller limits than ours: smaller pages.
                    Err(Error::TooLarge { .. }) if page_max > 1 => {
                        page_max /= 2;
                        continue;
                    }
                    other => other?,
                }
            }
            // Every op below `next` was acknowledged (or is another
            // replica's, which this node does not push).
            assert!(next > from, "push cursor must advance");
            cursor.advance(next);
            self.core.acks.note(tree, peer, next);
            if self.core.stopped() {
                return Err(Error::ShuttingDown);
            }
        }
    }

    /// The next page of own ops from `from`, cut to fit one message: the
    /// ops and the height after the last one it covers.
    fn next_page(&self, tree: &TreeKey, from: u64, page_max: usize) -> Result<(Vec<Move>, u64)> {
        // Checked by `own_ops_page`: ascending own ops in [from, next).
        let found = self.own_ops_page(tree, from, page_max)?;
        let budget = self.core.answer_budget_bytes();
        let mut next = found.next_height;
        let mut ops = Vec::with_capacity(found.entries.len());
        let mut used = 0;
        for entry in found.entries {
            used += entry.op.meta.size_bytes() + ITEM_OVERHEAD_BYTES;
            if used > budget && !ops.is_empty() {
                probe::hit(Probe::PushCutByBytes);
                next = entry.height;
                break;
            }
            ops.push(entry.op);
        }
        assert!(
            next >= from && (ops.is_empty() || next > from),
            "a page covers its ops"
        );
        Ok((ops, next))
    }

    /// What `Forest::get_op_log_of_origin` answers for this node's own ops,
    /// from the tree's push window when it knows the answer: the pushers of
    /// all peers then share one log read per stretch of new heights.
    fn own_ops_page(&self, tree: &TreeKey, from: u64, limit: usize) -> Result<OpLogPage> {
        let own = self.core.membership.own();
        let scan_max = self.core.config.limits.push_scan_heights;
        if let Some(page) = self.windows.page(tree, from, limit, scan_max) {
            // The window must answer what the log scan would.
            check_own_page(&page, from, limit, own);
            return Ok(page);
        }
        if let Some(ticket) = self.windows.refresh_ticket(tree, from) {
            let limit_refresh = self.windows.refresh_limit();
            let found = self.core.forest.get_op_log_of_origin(
                tree,
                ticket.from_height,
                limit_refresh,
                scan_max,
                own,
            );
            let failed = found.as_ref().err().cloned();
            self.windows.store(tree, ticket, found, scan_max);
            if let Some(error) = failed {
                return Err(error);
            }
            if let Some(page) = self.windows.page(tree, from, limit, scan_max) {
                check_own_page(&page, from, limit, own);
                return Ok(page);
            }
        }
        let page = self
            .core
            .forest
            .get_op_log_of_origin(tree, from, limit, scan_max, own)?;
        check_own_page(&page, from, limit, own);
        Ok(page)
    }

    /// One Apply call; `Ok` only when the peer acknowledged every op.
    async fn send_ops(&self, tree: &TreeKey, peer: ReplicaId, ops: Vec<Move>) -> Result<()> {
        let count = ops.len();
        assert!(count > 0, "an empty push");
        let request = Request::Apply {
            tree: tree.clone(),
            ops,
        };
        let timeout = self.core.config.tree.replication_timeout;
        match self.core.transport.call(peer, request, timeout).await? {
            Response::Applied { fresh } if fresh as usize <= count => {
                let pushed = &self.book.counters.ops_pushed;
                pushed.fetch_add(count as u64, Ordering::Relaxed);
                Ok(())
            }
            Response::Error(error) => Err(error),
            other => Err(Error::Malformed(format!(
                "peer {peer} answered Apply of {count} ops with {other:?}"
            ))),
        }
    }

    /// At start and then every `replication_timeout`: queues every tracked
    /// pair that may have unsent ops (what makes a dropped hint harmless),
    /// and walks on over the forest's trees while a walk is under way.
    async fn run_sweeps(self: Arc<Self>) {
        let timeout = self.core.config.tree.replication_timeout;
        let period = persist_period(timeout);
        loop {
            let this = Arc::clone(&self);
            blocking(&*self.core.env.runtime, move || this.walk_step()).await;
            if self.book.sweep(self.core.env.clock.now(), period) > 0 {
                self.book.wake.notify_one();
            }
            if self.core.sleep_or_stop(timeout).await {
                return;
            }
        }
    }

    /// One stretch of the walk (see `book`).
    fn walk_step(&self) {
        let Some((after, room)) = self.book.walk_position() else {
            return;
        };
        let limit = room.min(WALK_LIST_MAX);
        match self.core.forest.trees_after(after.as_ref(), limit) {
            Ok(found) => {
                assert!(found.len() <= limit, "listed more trees than asked");
                let complete = found.len() < limit;
                self.book.walk_found(after.as_ref(), &found, complete);
                self.book.wake.notify_one();
            }
            Err(error) => tracing::warn!(%error, "replication sweep cannot list trees"),
        }
    }

    /// The durable cursor of a pair, read on the blocking pool.
    async fn durable_cursor(&self, tree: &TreeKey, peer: ReplicaId) -> Result<u64> {
        let tree = tree.clone();
        (self.core)
            .storage(move |forest| forest.cursor(&tree, CursorKind::Push, peer))
            .await
    }

    /// True when every locally stored op that originated here has been
    /// acknowledged by every peer that should receive it. Reads the log on
    /// the calling thread: an inspection for checks and tests, never on
    /// the path of a request or a pass.
    pub fn idle(&self) -> Result<bool> {
        for tree in self.core.forest.all_trees()? {
            if !self.core.membership.replicates(&tree.cid) {
                continue;
            }
            for &peer in self.core.membership.peers_of(&tree.cid) {
                if self.unsent(&tree, peer)? {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Whether `peer` lacks an op of `tree` that originated here.
    fn unsent(&self, tree: &TreeKey, peer: ReplicaId) -> Result<bool> {
        let mut cursor = match self.book.position(&(tree.clone(), peer)) {
            Some(position) => position,
            None => self.core.forest.cursor(tree, CursorKind::Push, peer)?,
        };
        loop {
            let found = match self.own_ops_page(tree, cursor, 1) {
                Err(Error::TreeNotFound) => return Ok(false),
                other => other?,
            };
            if !found.entries.is_empty() {
                return Ok(true);
            }
            assert!(found.next_height >= cursor, "op log scan went backwards");
            if found.next_height == cursor {
                return Ok(false);
            }
            cursor = found.next_height;
        }
    }

    /// Push windows held now.
    pub fn windows_held(&self) -> usize {
        self.windows.len()
    }

    /// Forgets the push state and windows of dropped trees, then tracks
    /// again those the forest holds all the same: a client's write may
    /// create a tree again between the drop's commit and this call, and
    /// the hint of its commit went to the state forgotten here (a drop
    /// whose commit failed may also have left its tree). An untracked tree
    /// must have nothing unsent (see `book`).
    pub async fn forget(&self, trees: &std::collections::BTreeSet<TreeKey>) {
        self.book.forget(trees);
        self.windows.forget(trees);
        let dropped = trees.clone();
        let held: Vec<TreeKey> = (self.core)
            .storage(move |forest| {
                dropped
                    .into_iter()
                    .filter(|tree| forest.tree_exists(tree).unwrap_or(true))
                    .collect()
            })
            .await;
        if self.book.track_again(&held) > 0 {
            self.book.wake.notify_one();
        }
    }
}
