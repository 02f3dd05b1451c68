//! The pushers' bookkeeping: which (tree, peer) pairs may have unsent ops,
//! which are queued, running or backing off, and their cursors. The commit
//! observer writes to it too, so it holds nothing that reaches the batcher;
//! every method takes its lock once and never across an await.
//!
//! At most `limits.max_tracked_trees` trees are tracked. A tree whose pairs
//! are all idle, clean and durable is *settled*: it stays (a sweep skips
//! it, and its next pass needs no cursor read) until the book needs room,
//! then the one settled longest ago goes (its durable cursors are the
//! truth). A sweep looks at tracked trees only; an untracked tree has
//! nothing unsent, because every commit to it tracks it again. Two cases
//! break that, and a walk over the forest's trees (a bounded stretch per
//! sweep) covers them: the start (a restart may have interrupted pushes),
//! and a commit to a tree that found the book full of unsettled trees. A
//! drop forgets its trees after its commit, when a write may already have
//! created one again; `track_again` restores those (see `Pusher::forget`).

use super::super::backoff::backoff;
use super::super::cursor::LazyCursor;
use super::super::membership::Membership;
use crate::types::{ReplicaId, TreeKey};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;

pub(crate) type PushKey = (TreeKey, ReplicaId);

/// Bounds of the book, from the configuration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BookLimits {
    /// Trees with push state (`limits.max_tracked_trees`).
    pub trees_max: usize,
    /// Pairs a commit's hints may queue; beyond it a hint waits in the
    /// backlog (`tree.replication_channel_capacity`).
    pub queue_max: usize,
    /// Passes at once (`tree.replication_worker_count`).
    pub workers_max: usize,
    /// The longest backoff of a failed pair (`tree.replication_timeout`).
    pub backoff_max: Duration,
    /// Passes in a row the peer refuses with `StampConflict` before the
    /// pair is parked (`limits.push_conflict_passes_max`).
    pub conflict_passes_max: u32,
}

/// What a pass starts from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PassStart {
    /// The tree's change count when the pass started.
    pub changes: u64,
    /// The pair's cursor; `None` until read from storage.
    pub cursor: Option<LazyCursor>,
    /// Write a lagging cursor at the end of the pass: the book is nearly
    /// full, and only durable pairs can leave it.
    pub pressure: bool,
    /// Canary `ReplicationDropsOnFullQueue`: the height to skip to.
    #[cfg(feature = "canary")]
    pub skip: Option<u64>,
}

/// How a pass ended.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PassEnd {
    pub cursor: Option<LazyCursor>,
    /// False when the pass failed (it is retried after a backoff).
    pub ok: bool,
    /// The peer refused a page with `StampConflict`: it holds another op
    /// under one of ours, and no retry can change that.
    pub conflict: bool,
}

/// What became of a pair at the end of a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PassVerdict {
    /// Idle, queued again, or backing off.
    Continues,
    /// Parked after this many conflicted passes in a row: no more passes
    /// until the tree is dropped or the node restarts.
    Parked(u32),
}

/// Counts a stats call reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BookSizes {
    pub trees: usize,
    /// Of them, found settled (evicted first when room is needed).
    pub settled: usize,
    pub queued: usize,
    pub backlog: usize,
    pub delayed: usize,
    /// Pairs parked by stamp conflicts.
    pub parked: usize,
    pub workers: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    Queued,
    /// Taken by a worker with this ticket.
    Running(u64),
    /// Failed; queued again at this time.
    Delayed(Duration),
    /// Refused by stamp conflicts `conflict_passes_max` times in a row:
    /// never queued again (see `PassVerdict::Parked`).
    Parked,
}

#[derive(Debug)]
struct Pair {
    peer: ReplicaId,
    phase: Phase,
    /// Local ops arrived since the pair was last taken.
    dirty: bool,
    failures: u32,
    /// Passes in a row that ended in a stamp conflict.
    conflicts: u32,
    cursor: Option<LazyCursor>,
    /// The tree's change count at the start of the last pass that left
    /// nothing to send: while it is current, there is nothing to find.
    clean_at: Option<u64>,
}

impl Pair {
    fn new(peer: ReplicaId) -> Self {
        Self {
            peer,
            phase: Phase::Idle,
            dirty: false,
            failures: 0,
            conflicts: 0,
            cursor: None,
            clean_at: None,
        }
    }

    fn lagging(&self) -> bool {
        self.cursor.is_some_and(|c| c.lagging())
    }

    /// Whether a sweep should queue it: something may be unsent, or its
    /// cursor lags and is due to be written.
    fn wants_pass(&self, changes: u64, now: Duration, period: Duration, pressure: bool) -> bool {
        let due = self
            .cursor
            .is_some_and(|c| c.lagging() && (pressure || c.stale(now, period)));
        self.dirty || self.clean_at != Some(changes) || due
    }

    /// Nothing to send, nothing to write, nothing running.
    fn settled(&self, changes: u64) -> bool {
        self.phase == Phase::Idle
            && !self.dirty
            && self.failures == 0
            && self.clean_at == Some(changes)
            && !self.lagging()
    }
}

#[derive(Debug)]
struct TrackedTree {
    /// Commits that stored (or may have stored) ops in it since tracked.
    changes: u64,
    pairs: Vec<Pair>,
    /// Its place in `Book::settled`, when it was last found settled.
    settled_at: Option<u64>,
}

impl TrackedTree {
    fn settled(&self) -> bool {
        self.pairs.iter().all(|pair| pair.settled(self.changes))
    }
}

/// The walk over the forest's trees (see the module comment).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Walk {
    Done,
    /// Trees after `after` are still to walk; `again`: start over once
    /// this walk ends (a tree could not be tracked meanwhile).
    Walking {
        after: Option<TreeKey>,
        again: bool,
    },
}

#[derive(Debug)]
struct Book {
    trees: BTreeMap<TreeKey, TrackedTree>,
    /// Pairs waiting for a worker, each once, oldest first.
    ready: VecDeque<PushKey>,
    /// Pairs whose hint found `ready` at `queue_max`: taken as soon as a
    /// worker finds `ready` empty (or by the next sweep).
    backlog: BTreeSet<PushKey>,
    /// Failed pairs by the time they are queued again.
    delayed: BTreeSet<(Duration, PushKey)>,
    workers: usize,
    tickets: u64,
    walk: Walk,
    /// Trees found settled, oldest first: the ones to evict. An entry goes
    /// stale when its tree gets work again; eviction checks it.
    settled: BTreeMap<u64, TreeKey>,
    settled_seen: u64,
    /// Canary `ReplicationDropsOnFullQueue`: heights pushers skip to.
    #[cfg(feature = "canary")]
    skips: BTreeMap<TreeKey, u64>,
}

impl Book {
    /// Records `tree` as settled now, if it is.
    fn mark_if_settled(&mut self, tree: &TreeKey) {
        let Some(tracked) = self.trees.get_mut(tree) else {
            return;
        };
        if !tracked.settled() {
            return;
        }
        self.settled_seen += 1;
        if let Some(before) = tracked.settled_at.replace(self.settled_seen) {
            self.settled.remove(&before);
        }
        self.settled.insert(self.settled_seen, tree.clone());
    }

    /// Drops the tree settled longest ago; false when none is.
    fn evict_settled(&mut self) -> bool {
        while let Some((seen, tree)) = self.settled.pop_first() {
            let Some(tracked) = self.trees.get_mut(&tree) else {
                continue;
            };
            assert_eq!(tracked.settled_at, Some(seen), "settled index out of step");
            tracked.settled_at = None;
            if tracked.settled() {
                self.trees.remove(&tree);
                return true;
            }
        }
        false
    }

    /// Trees that are not known to be settled.
    fn unsettled(&self) -> usize {
        self.trees.len().saturating_sub(self.settled.len())
    }
}

/// Counters of the push side (see `ServiceStats`).
#[derive(Default)]
pub(crate) struct PushCounters {
    pub ops_pushed: AtomicU64,
    pub push_failures: AtomicU64,
    pub push_passes: AtomicU64,
    pub hints_dropped: AtomicU64,
}

/// The pushers' shared state; see the module comment.
pub(crate) struct PushBook {
    state: Mutex<Book>,
    limits: BookLimits,
    membership: Arc<Membership>,
    /// Wakes the dispatcher: pairs were queued, or a backoff began.
    pub wake: Notify,
    pub counters: PushCounters,
}

impl PushBook {
    pub fn new(limits: BookLimits, membership: Arc<Membership>) -> Self {
        assert!(limits.trees_max >= 1 && limits.queue_max >= 1 && limits.workers_max >= 1);
        assert!(limits.conflict_passes_max >= 1, "a pair gets one pass");
        Self {
            state: Mutex::new(Book {
                trees: BTreeMap::new(),
                ready: VecDeque::new(),
                backlog: BTreeSet::new(),
                delayed: BTreeSet::new(),
                workers: 0,
                tickets: 0,
                walk: Walk::Walking {
                    after: None,
                    again: false,
                },
                settled: BTreeMap::new(),
                settled_seen: 0,
                #[cfg(feature = "canary")]
                skips: BTreeMap::new(),
            }),
            limits,
            membership,
            wake: Notify::new(),
            counters: PushCounters::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Book> {
        self.state.lock().expect("push book")
    }

    /// The book's bounds hold (checked as a method lets go of the book).
    fn check(&self, book: &Book) {
        assert!(
            book.trees.len() <= self.limits.trees_max,
            "book over its bound"
        );
        assert!(
            book.settled.len() <= book.trees.len(),
            "settled index over the book"
        );
        assert!(
            book.workers <= self.limits.workers_max,
            "workers over the pool"
        );
    }

    /// A commit stored (or may have stored) ops in `written`, of which
    /// `local` hold new local ops: their pairs are queued. Returns the
    /// trees whose hints found the queue full.
    pub fn note_commit<'a>(
        &self,
        written: impl Iterator<Item = &'a TreeKey>,
        local: &[TreeKey],
    ) -> Vec<TreeKey> {
        let mut book = self.lock();
        for tree in written.filter(|tree| self.pushes(tree)) {
            match self.track(&mut book, tree) {
                Some(tracked) => tracked.changes += 1,
                None => walk_again(&mut book.walk),
            }
        }
        let mut dropped = Vec::new();
        for tree in local {
            let Some(tracked) = book.trees.get_mut(tree) else {
                continue;
            };
            let mut idle = Vec::new();
            for pair in &mut tracked.pairs {
                pair.dirty = true;
                if pair.phase == Phase::Idle {
                    idle.push(pair.peer);
                }
            }
            for peer in idle {
                let key = (tree.clone(), peer);
                if book.ready.len() < self.limits.queue_max {
                    queue(&mut book, key);
                } else {
                    book.backlog.insert(key);
                    dropped.push(tree.clone());
                }
            }
        }
        dropped.dedup();
        self.check(&book);
        dropped
    }

    /// Whether this node pushes the tree's ops: it holds the container and
    /// the container has peers.
    fn pushes(&self, tree: &TreeKey) -> bool {
        self.membership.replicates(&tree.cid) && !self.membership.peers_of(&tree.cid).is_empty()
    }

    /// The entry of a tree this node pushes, made if absent (making room
    /// by evicting a settled tree); `None` when the book is full of trees
    /// with work.
    fn track<'b>(&self, book: &'b mut Book, tree: &TreeKey) -> Option<&'b mut TrackedTree> {
        assert!(self.pushes(tree), "tracked a tree this node does not push");
        if !book.trees.contains_key(tree) {
            if book.trees.len() >= self.limits.trees_max && !book.evict_settled() {
                return None;
            }
            let pairs = self
                .membership
                .peers_of(&tree.cid)
                .iter()
                .map(|&peer| Pair::new(peer))
                .collect();
            let tracked = TrackedTree {
                changes: 0,
                pairs,
                settled_at: None,
            };
            book.trees.insert(tree.clone(), tracked);
        }
        assert!(
            book.trees.len() <= self.limits.trees_max,
            "book over its bound"
        );
        book.trees.get_mut(tree)
    }

    /// Moves failed pairs whose backoff ended back to the queue, and
    /// counts the workers to start for the queue; returns that count and
    /// when the next backoff ends.
    pub fn dispatch(&self, now: Duration) -> (usize, Option<Duration>) {
        let mut book = self.lock();
        while let Some((at, key)) = book.delayed.first().cloned() {
            if at > now {
                break;
            }
            book.delayed.pop_first();
            let pair = pair_mut(&mut book, &key).expect("a delayed pair is tracked");
            assert_eq!(pair.phase, Phase::Delayed(at), "delayed twice");
            pair.phase = Phase::Idle;
            queue(&mut book, key);
        }
        let wanted = book.ready.len().min(self.limits.workers_max);
        let start = wanted.saturating_sub(book.workers);
        book.workers += start;
        self.check(&book);
        (start, book.delayed.first().map(|(at, _)| *at))
    }

    /// The next pair for a worker and its ticket; `None` (and the worker
    /// leaves the pool) when nothing waits.
    pub fn take(&self) -> Option<(PushKey, u64)> {
        let mut book = self.lock();
        if book.ready.is_empty() {
            self.refill(&mut book);
        }
        let Some(key) = book.ready.pop_front() else {
            assert!(book.workers > 0, "a worker left twice");
            book.workers -= 1;
            return None;
        };
        book.tickets += 1;
        let ticket = book.tickets;
        let pair = pair_mut(&mut book, &key).expect("a queued pair is tracked");
        assert_eq!(pair.phase, Phase::Queued, "a pair is queued once");
        pair.phase = Phase::Running(ticket);
        pair.dirty = false;
        Some((key, ticket))
    }

    /// A worker that stops with the node leaves the pool.
    pub fn retire(&self) {
        let mut book = self.lock();
        assert!(book.workers > 0, "a worker left twice");
        book.workers -= 1;
    }

    /// Queues backlogged pairs, up to `queue_max`.
    fn refill(&self, book: &mut Book) {
        assert!(book.ready.is_empty(), "refilled a queue with work");
        while book.ready.len() < self.limits.queue_max {
            let Some(key) = book.backlog.pop_first() else {
                return;
            };
            if pair_mut(book, &key).is_some_and(|pair| pair.phase == Phase::Idle) {
                queue(book, key);
            }
        }
    }

    /// The state a pass of `key` starts from, once its worker holds the
    /// tree's lock; `None` when the pair is no longer this ticket's (its
    /// tree was dropped meanwhile).
    pub fn begin_pass(&self, key: &PushKey, ticket: u64) -> Option<PassStart> {
        let mut book = self.lock();
        let pressure = book.unsettled() * 4 >= self.limits.trees_max * 3;
        #[cfg(feature = "canary")]
        let skip = book.skips.get(&key.0).copied();
        let tree = book.trees.get_mut(&key.0)?;
        let changes = tree.changes;
        let pair = tree.pairs.iter_mut().find(|p| p.peer == key.1)?;
        if pair.phase != Phase::Running(ticket) {
            return None;
        }
        // The change count only grows.
        assert!(
            pair.clean_at.is_none_or(|clean| clean <= changes),
            "clean in the future"
        );
        Some(PassStart {
            changes,
            cursor: pair.cursor,
            pressure,
            #[cfg(feature = "canary")]
            skip,
        })
    }

    /// Records how the pass of `key` that `begin_pass` started ended:
    /// queued again if new ops came meanwhile, backed off if it failed,
    /// parked after too many stamp conflicts in a row, and the tree
    /// forgotten once every pair of it is settled.
    pub fn end_pass(
        &self,
        key: &PushKey,
        ticket: u64,
        start: &PassStart,
        end: PassEnd,
        now: Duration,
    ) -> PassVerdict {
        assert!(!(end.ok && end.conflict), "a clean pass met no conflict");
        let mut book = self.lock();
        let pair = pair_mut(&mut book, key).expect("a running pair stays tracked");
        assert_eq!(
            pair.phase,
            Phase::Running(ticket),
            "one pass per pair at a time"
        );
        if let (Some(before), Some(after)) = (start.cursor, end.cursor) {
            assert!(
                after.position() >= before.position(),
                "push cursor moved back"
            );
        }
        pair.cursor = end.cursor.or(pair.cursor);
        pair.conflicts = if end.conflict { pair.conflicts + 1 } else { 0 };
        let mut verdict = PassVerdict::Continues;
        if pair.conflicts >= self.limits.conflict_passes_max {
            pair.failures = pair.failures.saturating_add(1);
            pair.phase = Phase::Parked;
            pair.dirty = true;
            verdict = PassVerdict::Parked(pair.conflicts);
        } else if end.ok {
            pair.failures = 0;
            pair.clean_at = Some(start.changes);
            if pair.dirty {
                queue(&mut book, key.clone());
            } else {
                pair.phase = Phase::Idle;
            }
        } else {
            pair.failures = pair.failures.saturating_add(1);
            let at = now + backoff(pair.failures, self.limits.backoff_max);
            pair.phase = Phase::Delayed(at);
            pair.dirty = true;
            book.delayed.insert((at, key.clone()));
        }
        book.mark_if_settled(&key.0);
        self.check(&book);
        verdict
    }

    /// Queues every tracked pair that may have unsent ops or a cursor due
    /// to be written; returns how many it queued.
    pub fn sweep(&self, now: Duration, period: Duration) -> usize {
        let mut book = self.lock();
        let pressure = book.unsettled() * 4 >= self.limits.trees_max * 3;
        let mut wanted = Vec::new();
        for (tree, tracked) in &book.trees {
            for pair in &tracked.pairs {
                if pair.phase == Phase::Idle
                    && pair.wants_pass(tracked.changes, now, period, pressure)
                {
                    wanted.push((tree.clone(), pair.peer));
                }
            }
        }
        let queued = wanted.len();
        for key in wanted {
            book.backlog.remove(&key);
            queue(&mut book, key);
        }
        assert!(book.ready.len() >= queued, "queued pairs wait");
        queued
    }

    /// Forgets everything about `trees` (dropped: their heights start
    /// anew).
    pub fn forget(&self, trees: &BTreeSet<TreeKey>) {
        let mut book = self.lock();
        for tree in trees {
            if let Some(seen) = book.trees.remove(tree).and_then(|t| t.settled_at) {
                book.settled.remove(&seen);
            }
            #[cfg(feature = "canary")]
            book.skips.remove(tree);
        }
        book.ready.retain(|key| !trees.contains(&key.0));
        book.backlog.retain(|key| !trees.contains(&key.0));
        book.delayed.retain(|(_, key)| !trees.contains(&key.0));
        self.check(&book);
    }

    /// The pair's acknowledged height, when the book knows it.
    pub fn position(&self, key: &PushKey) -> Option<u64> {
        let mut book = self.lock();
        let pair = pair_mut(&mut book, key)?;
        pair.cursor.map(|c| c.position())
    }

    /// The pairs whose cursor is ahead of its durable copy, with their
    /// positions.
    pub fn lagging_cursors(&self) -> Vec<(PushKey, u64)> {
        let book = self.lock();
        let mut lagging = Vec::new();
        for (tree, tracked) in &book.trees {
            for pair in &tracked.pairs {
                if let Some(cursor) = pair.cursor.filter(|c| c.lagging()) {
                    lagging.push(((tree.clone(), pair.peer), cursor.position()));
                }
            }
        }
        lagging
    }

    pub fn sizes(&self) -> BookSizes {
        let book = self.lock();
        let pairs = book.trees.values().flat_map(|tracked| &tracked.pairs);
        let parked = pairs.filter(|pair| pair.phase == Phase::Parked).count();
        BookSizes {
            trees: book.trees.len(),
            settled: book.settled.len(),
            queued: book.ready.len(),
            backlog: book.backlog.len(),
            delayed: book.delayed.len(),
            parked,
            workers: book.workers,
        }
    }

    /// Canary `ReplicationDropsOnFullQueue`: pushers of `tree` skip to
    /// `height`.
    #[cfg(feature = "canary")]
    pub fn set_skip(&self, tree: &TreeKey, height: u64) {
        self.lock().skips.insert(tree.clone(), height);
    }
}

fn pair_mut<'b>(book: &'b mut Book, key: &PushKey) -> Option<&'b mut Pair> {
    let tree = book.trees.get_mut(&key.0)?;
    tree.pairs.iter_mut().find(|p| p.peer == key.1)
}

/// Puts an idle pair at the end of the queue.
fn queue(book: &mut Book, key: PushKey) {
    let pair = pair_mut(book, &key).expect("a queued pair is tracked");
    assert!(
        matches!(pair.phase, Phase::Idle | Phase::Running(_)),
        "queued while {:?}",
        pair.phase
    );
    pair.phase = Phase::Queued;
    book.ready.push_back(key);
}

mod walk;
use walk::walk_again;

#[cfg(test)]
mod tests;
