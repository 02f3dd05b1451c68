//! The recently stored local-origin ops of each tree, kept in memory for the
//! pushers.
//!
//! Every commit to a tree wakes one pusher per peer, and each of them used to
//! read the same fresh stretch of the log from redb, then read it once more
//! to learn that nothing was left. A window holds the local-origin ops of a
//! stretch of heights `[start, end)` that is known completely (the heights in
//! it that hold other replicas' ops are simply absent), so the pushers of all
//! peers share one read of each stretch and the "nothing left" answer costs
//! no read while the tree has not changed.
//!
//! A window answers exactly what `Forest::get_op_log_of_origin` would answer
//! (same entries, same `next_height`), or nothing: the caller then reads the
//! log as before. It answers a query that reaches `end` only while it is
//! *fresh*: no commit stored anything in the tree since the read that
//! found `end` to be the tree's next height. Commits are numbered (the
//! epoch): the commit path notes each commit right after it (`note_stored`),
//! before its callers hear of it, and a window keeps the epoch of the last
//! commit to its tree; a refresh takes the epoch before it reads the log, so
//! a commit racing a refresh leaves the window stale, never wrong.
//!
//! Bounded by `limits.push_window_ops` ops over all trees and by
//! `limits.max_tracked_trees` windows; a tree whose window was evicted or
//! trimmed is read from the log as before.

use crate::error::Result;
use crate::forest::OpLogPage;
use crate::types::{LogEntry, TreeKey};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Mutex;

struct Window {
    /// Unique over the node's life: a refresh of a window that was
    /// dropped meanwhile finds no window with its id.
    id: u64,
    /// Every height in `[start, end)` is accounted for.
    start: u64,
    end: u64,
    /// The local-origin ops of `[start, end)`, by ascending height.
    ops: VecDeque<LogEntry>,
    /// The epoch at which a read found `end` to be the tree's next height.
    fresh_at: Option<u64>,
    /// The epoch of the last commit that stored (or may have stored) ops
    /// in the tree since the window exists.
    changed_at: u64,
}

impl Window {
    fn anchored_at(id: u64, height: u64) -> Window {
        Window {
            id,
            start: height,
            end: height,
            ops: VecDeque::new(),
            fresh_at: None,
            changed_at: 0,
        }
    }

    /// No commit stored in the tree since the read that found `end`.
    fn fresh(&self) -> bool {
        self.fresh_at.is_some_and(|at| at >= self.changed_at)
    }

    /// The page a log scan from `from` would return, if this window knows
    /// it. The scan looks at heights from `from` on and stops after the
    /// `limit`-th op found, after `scan_max` heights, or at the log's end.
    fn page(&self, from: u64, limit: usize, scan_max: usize) -> Option<OpLogPage> {
        if from < self.start || from > self.end {
            return None;
        }
        let first = self.ops.partition_point(|e| e.height < from);
        let by_scan = from.saturating_add(scan_max as u64);
        let by_limit = self
            .ops
            .get(first + limit - 1)
            .map_or(u64::MAX, |e| e.height + 1);
        let stop = match by_scan.min(by_limit) {
            stop if stop <= self.end => stop,
            _ if self.fresh() => self.end,
            _ => return None,
        };
        let entries: Vec<LogEntry> = self
            .ops
            .range(first..)
            .take_while(|e| e.height < stop)
            .cloned()
            .collect();
        assert!(entries.len() <= limit, "a window page over its limit");
        Some(OpLogPage {
            entries,
            next_height: stop.max(from),
        })
    }

    /// Appends what a scan of the log from `end` found, read from `epoch`
    /// on; returns how many ops it added.
    fn extend(&mut self, found: OpLogPage, complete: bool, epoch: u64) -> usize {
        for entry in &found.entries {
            assert!(
                entry.height >= self.end && entry.height < found.next_height,
                "log scan answered outside its range"
            );
        }
        assert!(found.next_height >= self.end, "log scan went backwards");
        let added = found.entries.len();
        self.ops.extend(found.entries);
        self.end = found.next_height;
        self.fresh_at = complete.then_some(epoch);
        added
    }

    /// Drops the oldest ops beyond `keep`; the heights they covered leave
    /// the window with them. Returns how many it dropped.
    fn trim_to(&mut self, keep: usize) -> usize {
        let mut dropped = 0;
        while self.ops.len() > keep {
            let oldest = self.ops.pop_front().expect("non-empty window");
            self.start = oldest.height + 1;
            dropped += 1;
        }
        dropped
    }
}

/// The windows of every tree of one node.
pub(crate) struct PushWindows {
    ops_max: usize,
    windows_max: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    trees: BTreeMap<TreeKey, Window>,
    /// Commits noted so far.
    epoch: u64,
    /// Ids given to windows so far.
    windows_made: u64,
    /// Ops held by all windows.
    ops_held: usize,
}

impl State {
    fn remove(&mut self, tree: &TreeKey) {
        if let Some(window) = self.trees.remove(tree) {
            assert!(self.ops_held >= window.ops.len(), "window ops miscounted");
            self.ops_held -= window.ops.len();
        }
    }
}

/// Where a refresh should read from, and what to check when it comes back.
pub(crate) struct RefreshTicket {
    pub from_height: u64,
    window: u64,
    epoch: u64,
}

impl PushWindows {
    /// `ops_max == 0` switches windows off: every query reads the log.
    pub fn new(ops_max: usize, windows_max: usize) -> PushWindows {
        assert!(windows_max >= 1, "room for one window at least");
        PushWindows {
            ops_max,
            windows_max,
            state: Mutex::default(),
        }
    }

    /// The page a log scan of `tree` from `from` would return now, when
    /// the window of `tree` knows it.
    pub fn page(
        &self,
        tree: &TreeKey,
        from: u64,
        limit: usize,
        scan_max: usize,
    ) -> Option<OpLogPage> {
        assert!(limit >= 1 && scan_max >= 1, "empty page asked of a window");
        let state = self.state.lock().expect("push windows");
        state.trees.get(tree)?.page(from, limit, scan_max)
    }

    /// Called by the commit path right after each commit (also a failed
    /// one, whose outcome is unknown) with the trees it may have stored
    /// ops in: their windows are no longer known to reach the log's end.
    pub fn note_stored<'a>(&self, trees: impl IntoIterator<Item = &'a TreeKey>) {
        if self.ops_max == 0 {
            return;
        }
        let mut state = self.state.lock().expect("push windows");
        state.epoch += 1;
        let epoch = state.epoch;
        for tree in trees {
            if let Some(window) = state.trees.get_mut(tree) {
                window.changed_at = epoch;
            }
        }
    }

    /// Where to read the log so that the window of `tree` covers `from`:
    /// its end, or `from` for a tree without a window. `None` when a read
    /// cannot help (windows off, or `from` below the window).
    pub fn refresh_ticket(&self, tree: &TreeKey, from: u64) -> Option<RefreshTicket> {
        if self.ops_max == 0 {
            return None;
        }
        let mut state = self.state.lock().expect("push windows");
        let epoch = state.epoch;
        // Asked on every stale pass: a known tree costs no key copy.
        if let Some(window) = state.trees.get(tree) {
            if from < window.start {
                return None;
            }
            return Some(RefreshTicket {
                from_height: window.end,
                window: window.id,
                epoch,
            });
        }
        self.make_room(&mut state, 1);
        state.windows_made += 1;
        let id = state.windows_made;
        state
            .trees
            .insert(tree.clone(), Window::anchored_at(id, from));
        Some(RefreshTicket {
            from_height: from,
            window: id,
            epoch,
        })
    }

    /// How many ops one refresh may read.
    pub fn refresh_limit(&self) -> usize {
        self.ops_max
    }

    /// Stores what a scan of the log from `ticket.from_height` found (read
    /// after the ticket was taken, with at most `refresh_limit` ops and
    /// `scan_max` heights). Dropped when the window moved or is gone.
    pub fn store(
        &self,
        tree: &TreeKey,
        ticket: RefreshTicket,
        found: Result<OpLogPage>,
        scan_max: usize,
    ) {
        let mut state = self.state.lock().expect("push windows");
        let current = state.trees.get(tree).map(|w| (w.id, w.end));
        if current != Some((ticket.window, ticket.from_height)) {
            return;
        }
        let Ok(found) = found else {
            state.remove(tree);
            return;
        };
        // The scan stopped at the log's end unless it hit one of its limits.
        let scanned = found.next_height - ticket.from_height;
        let complete = found.entries.len() < self.ops_max && scanned < scan_max as u64;
        let window = state.trees.get_mut(tree).expect("checked above");
        let added = window.extend(found, complete, ticket.epoch);
        let trimmed = window.trim_to(self.ops_max);
        state.ops_held = state.ops_held + added - trimmed;
        self.evict_beyond_bound(&mut state, tree);
    }

    /// Keeps the total under `ops_max` by dropping whole windows of other
    /// trees, in key order (deterministic).
    fn evict_beyond_bound(&self, state: &mut State, keep: &TreeKey) {
        while state.ops_held > self.ops_max {
            let victim = state
                .trees
                .keys()
                .find(|k| *k != keep)
                .cloned()
                .expect("one window alone is trimmed to the bound");
            state.remove(&victim);
        }
    }

    /// Drops windows, in key order, until `count` more fit.
    fn make_room(&self, state: &mut State, count: usize) {
        while state.trees.len() + count > self.windows_max {
            let victim = state
                .trees
                .keys()
                .next()
                .cloned()
                .expect("a window to drop");
            state.remove(&victim);
        }
    }

    /// Forgets the windows of `trees` (dropped: their heights start anew).
    pub fn forget(&self, trees: &BTreeSet<TreeKey>) {
        let mut state = self.state.lock().expect("push windows");
        for tree in trees {
            state.remove(tree);
        }
    }

    /// Forgets every window: the database was reopened, and a commit that
    /// reported failure may have been stored after all.
    pub fn clear(&self) {
        let mut state = self.state.lock().expect("push windows");
        state.trees.clear();
        state.ops_held = 0;
    }

    /// Windows held now.
    pub fn len(&self) -> usize {
        self.state.lock().expect("push windows").trees.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ContainerId, Meta, Move};

    impl PushWindows {
        fn new_for_test(ops_max: usize) -> PushWindows {
            PushWindows::new(ops_max, 100)
        }
    }

    fn entry(height: u64) -> LogEntry {
        LogEntry {
            height,
            op: Move {
                parent: 0,
                child: height + 1,
                meta: Meta {
                    time: (height + 1) << 16 | 1,
                    items: Vec::new(),
                },
            },
        }
    }

    /// A reference scan over a log given as (height, own?) pairs.
    fn scan(own: &[bool], from: u64, limit: usize, scan_max: usize) -> OpLogPage {
        let mut page = OpLogPage {
            entries: Vec::new(),
            next_height: from,
        };
        for (scanned, height) in (from..own.len() as u64).enumerate() {
            if page.entries.len() >= limit || scanned >= scan_max {
                break;
            }
            page.next_height = height + 1;
            if own[height as usize] {
                page.entries.push(entry(height));
            }
        }
        page
    }

    fn tree() -> TreeKey {
        TreeKey::new(ContainerId([7; 32]), "t")
    }

    fn own_pattern(len: usize) -> Vec<bool> {
        (0..len).map(|h| h % 3 == 0 || h % 7 == 2).collect()
    }

    fn filled(own: &[bool], anchor: u64, ops_max: usize) -> PushWindows {
        let windows = PushWindows::new_for_test(ops_max);
        let ticket = windows.refresh_ticket(&tree(), anchor).expect("ticket");
        let found = scan(own, ticket.from_height, ops_max, 1000);
        windows.store(&tree(), ticket, Ok(found), 1000);
        windows
    }

    #[test]
    fn fresh_window_answers_like_the_log_scan() {
        let own = own_pattern(40);
        let windows = filled(&own, 5, 100);
        for from in 5..=40 {
            for limit in [1, 2, 3, 50] {
                for scan_max in [1, 4, 1000] {
                    let page = windows.page(&tree(), from, limit, scan_max);
                    let expected = scan(&own, from, limit, scan_max);
                    assert_eq!(page, Some(expected), "{from} {limit} {scan_max}");
                }
            }
        }
        assert_eq!(windows.page(&tree(), 4, 1, 1000), None, "below the window");
    }

    #[test]
    fn stale_window_answers_only_what_stops_inside_it() {
        let own = own_pattern(40);
        let windows = filled(&own, 0, 100);
        // A commit stored ops in the tree: heights past 40 may exist now.
        windows.note_stored([&tree()]);
        assert_eq!(windows.page(&tree(), 30, 100, 1000), None);
        assert_eq!(windows.page(&tree(), 40, 1, 1000), None);
        let inside = windows.page(&tree(), 30, 1, 1000);
        assert_eq!(inside, Some(scan(&own, 30, 1, 1000)));
        let short = windows.page(&tree(), 30, 100, 4);
        assert_eq!(short, Some(scan(&own, 30, 100, 4)));
    }

    #[test]
    fn refresh_extends_from_the_end_and_trims_to_the_bound() {
        let own = own_pattern(60);
        let windows = PushWindows::new_for_test(8);
        let ticket = windows.refresh_ticket(&tree(), 0).expect("ticket");
        let first = scan(&own, 0, 8, 1000);
        let first_end = first.next_height;
        windows.store(&tree(), ticket, Ok(first), 1000);
        let ticket = windows.refresh_ticket(&tree(), 3).expect("ticket");
        assert_eq!(ticket.from_height, first_end);
        windows.store(&tree(), ticket, Ok(scan(&own, first_end, 8, 1000)), 1000);
        let (start, end) = {
            let state = windows.state.lock().unwrap();
            let window = &state.trees[&tree()];
            assert_eq!(window.ops.len(), 8);
            assert!(window.start <= window.ops[0].height);
            (window.start, window.end)
        };
        assert!(start > 0, "the oldest ops were trimmed");
        assert_eq!(windows.page(&tree(), start - 1, 3, 1000), None);
        assert!(windows.refresh_ticket(&tree(), start - 1).is_none());
        let mut answered = 0;
        for from in start..=end {
            if let Some(page) = windows.page(&tree(), from, 3, 1000) {
                assert_eq!(page, scan(&own, from, 3, 1000), "{from}");
                answered += 1;
            }
        }
        assert!(answered > 0);
    }

    #[test]
    fn a_refresh_that_hit_its_limit_leaves_the_window_stale() {
        let own = own_pattern(40);
        let windows = PushWindows::new_for_test(100);
        let ticket = windows.refresh_ticket(&tree(), 0).expect("ticket");
        windows.store(&tree(), ticket, Ok(scan(&own, 0, 100, 10)), 10);
        // Only heights 0..10 were looked at: the end of the log is unknown.
        assert_eq!(windows.page(&tree(), 10, 5, 1000), None);
    }

    #[test]
    fn cleared_windows_ignore_reads_from_before() {
        let own = own_pattern(40);
        let windows = PushWindows::new_for_test(100);
        let ticket = windows.refresh_ticket(&tree(), 0).expect("ticket");
        windows.clear();
        windows.store(&tree(), ticket, Ok(scan(&own, 0, 100, 1000)), 1000);
        assert_eq!(windows.page(&tree(), 0, 5, 1000), None);
        let windows = filled(&own, 0, 100);
        windows.forget(&BTreeSet::from([tree()]));
        assert_eq!(windows.page(&tree(), 0, 5, 1000), None);
    }

    #[test]
    fn a_commit_during_a_refresh_leaves_the_window_stale() {
        let own = own_pattern(40);
        let windows = PushWindows::new_for_test(100);
        let ticket = windows.refresh_ticket(&tree(), 0).expect("ticket");
        let found = scan(&own[..30], 0, 100, 1000);
        // Committed after the read: heights 30.. exist but were not seen.
        windows.note_stored([&tree()]);
        windows.store(&tree(), ticket, Ok(found), 1000);
        assert_eq!(windows.page(&tree(), 30, 1, 1000), None);
        assert_eq!(
            windows.page(&tree(), 20, 1, 1000),
            Some(scan(&own, 20, 1, 1000))
        );
    }

    #[test]
    fn windows_off_never_answer() {
        let windows = PushWindows::new_for_test(0);
        assert!(windows.refresh_ticket(&tree(), 0).is_none());
        assert_eq!(windows.page(&tree(), 0, 1, 1), None);
    }

    #[test]
    fn the_bound_covers_all_trees() {
        let own = own_pattern(40);
        let windows = PushWindows::new_for_test(10);
        let other = TreeKey::new(ContainerId([1; 32]), "a");
        let ticket = windows.refresh_ticket(&other, 0).expect("ticket");
        windows.store(&other, ticket, Ok(scan(&own, 0, 10, 1000)), 1000);
        let ticket = windows.refresh_ticket(&tree(), 0).expect("ticket");
        windows.store(&tree(), ticket, Ok(scan(&own, 0, 10, 1000)), 1000);
        let state = windows.state.lock().unwrap();
        assert!(state.ops_held <= 10);
        let held: usize = state.trees.values().map(|w| w.ops.len()).sum();
        assert_eq!(held, state.ops_held);
        assert!(state.trees.contains_key(&tree()));
    }

    #[test]
    fn windows_are_bounded_in_number_and_a_dropped_one_ignores_old_reads() {
        let own = own_pattern(40);
        let windows = PushWindows::new(100, 3);
        let key = |i: u8| TreeKey::new(ContainerId([i; 32]), "t");
        for i in 0..10 {
            let ticket = windows.refresh_ticket(&key(i), 0).expect("ticket");
            windows.store(&key(i), ticket, Ok(scan(&own, 0, 100, 1000)), 1000);
            assert!(windows.len() <= 3);
        }
        // A read taken before the tree was dropped and made again is not
        // stored into the new tree's window.
        let stale = windows.refresh_ticket(&tree(), 0).expect("ticket");
        windows.forget(&BTreeSet::from([tree()]));
        let fresh = windows.refresh_ticket(&tree(), 0).expect("ticket");
        windows.store(&tree(), stale, Ok(scan(&own, 0, 100, 1000)), 1000);
        assert_eq!(windows.page(&tree(), 0, 1, 1000), None);
        windows.store(&tree(), fresh, Ok(scan(&own, 0, 100, 1000)), 1000);
        assert_eq!(
            windows.page(&tree(), 0, 1, 1000),
            Some(scan(&own, 0, 1, 1000))
        );
    }
}
