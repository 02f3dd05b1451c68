//! The push book's state machine, without a network or a forest.

use super::*;
use crate::config::NodeConfig;
use crate::types::ContainerId;

const PERIOD: Duration = Duration::from_secs(60);
const CONFLICTS_MAX: u32 = 3;

fn tree(name: &str) -> TreeKey {
    TreeKey::new(ContainerId([4; 32]), name)
}

/// A commit of local ops to `tree`; the trees whose hints were dropped.
fn commit_local(book: &PushBook, tree: &TreeKey) -> Vec<TreeKey> {
    book.note_commit(std::iter::once(tree), std::slice::from_ref(tree))
}

/// A book of node 1 with peers 2 and 3, over an empty forest (the
/// start's walk found nothing).
fn book(trees_max: usize, queue_max: usize) -> PushBook {
    let mut node = NodeConfig::solo(1);
    for peer in [2, 3] {
        node.peers
            .push(crate::config::PeerConfig::new(peer, String::new()));
    }
    let limits = BookLimits {
        trees_max,
        queue_max,
        workers_max: 4,
        backoff_max: Duration::from_secs(1),
        conflict_passes_max: CONFLICTS_MAX,
    };
    let book = PushBook::new(limits, Arc::new(Membership::from_config(&node)));
    book.walk_found(None, &[], true);
    book
}

/// Commits local ops to `t` and takes the first of its pairs for a pass.
fn commit_and_take(book: &PushBook, t: &TreeKey) -> (PushKey, u64, PassStart) {
    commit_local(book, t);
    book.dispatch(Duration::ZERO);
    let (key, ticket) = book.take().expect("a queued pair");
    let start = book.begin_pass(&key, ticket).expect("its ticket");
    (key, ticket, start)
}

/// Ends a pass with `cursor` (durable at `durable`, moved on to
/// `position`).
fn end(book: &PushBook, taken: &(PushKey, u64, PassStart), cursor: Option<(u64, u64)>, ok: bool) {
    let cursor = cursor.map(|(durable, position)| {
        let mut cursor = LazyCursor::loaded(durable);
        cursor.advance(position);
        cursor
    });
    let (key, ticket, start) = taken;
    book.end_pass(
        key,
        *ticket,
        start,
        PassEnd {
            cursor,
            ok,
            conflict: false,
        },
        Duration::ZERO,
    );
}

/// Takes and finishes every queued pass, cleanly, with cursors at
/// `position` made durable.
fn run_all(book: &PushBook, position: u64) -> usize {
    book.dispatch(Duration::ZERO);
    let mut passes = 0;
    // Every worker the dispatches started runs until it finds nothing.
    while book.sizes().workers > 0 {
        let Some((key, ticket)) = book.take() else {
            continue;
        };
        let start = book.begin_pass(&key, ticket).expect("ours");
        end(
            book,
            &(key, ticket, start),
            Some((position, position)),
            true,
        );
        passes += 1;
    }
    passes
}

/// Sizes of what is queued or running, which must drain to nothing.
fn busy(book: &PushBook) -> (usize, usize, usize, usize) {
    let sizes = book.sizes();
    (sizes.queued, sizes.backlog, sizes.delayed, sizes.workers)
}

#[test]
fn a_commit_queues_every_peer_once_and_a_settled_tree_stays_until_room_is_needed() {
    let book = book(1, 100);
    let (t, u) = (tree("t"), tree("u"));
    assert!(commit_local(&book, &t).is_empty());
    assert!(commit_local(&book, &t).is_empty());
    assert_eq!(book.sizes().queued, 2, "one entry per pair");
    assert_eq!(run_all(&book, 5), 2);
    assert_eq!(busy(&book), (0, 0, 0, 0));
    assert_eq!((book.sizes().trees, book.sizes().settled), (1, 1));
    // A clean tree costs a sweep nothing, and its cursors stay known.
    assert_eq!(book.sweep(Duration::ZERO, PERIOD), 0);
    assert_eq!(book.position(&(t.clone(), 2)), Some(5));
    // Another tree needs the room: the settled one goes.
    commit_local(&book, &u);
    assert_eq!(book.sizes().trees, 1);
    assert_eq!(book.position(&(t, 2)), None);
    assert_eq!(run_all(&book, 1), 2);
}

#[test]
fn new_ops_during_a_pass_queue_it_again() {
    let book = book(10, 100);
    let t = tree("t");
    let taken = commit_and_take(&book, &t);
    commit_local(&book, &t);
    end(&book, &taken, Some((0, 0)), true);
    // The other pair and this one again.
    assert_eq!(book.sizes().queued, 2);
    assert_eq!(run_all(&book, 0), 2);
    assert_eq!(book.sizes().settled, 1);
}

#[test]
fn a_failed_pass_backs_off_without_a_worker() {
    let book = book(10, 100);
    let taken = commit_and_take(&book, &tree("t"));
    end(&book, &taken, None, false);
    assert_eq!(book.sizes().delayed, 1);
    // The sweep leaves a delayed pair alone; its backoff queues it.
    book.sweep(Duration::ZERO, PERIOD);
    let (_, next) = book.dispatch(Duration::ZERO);
    let at = next.expect("a retry time");
    assert!(at > Duration::ZERO);
    book.dispatch(at);
    assert_eq!(book.sizes().delayed, 0);
    assert_eq!(run_all(&book, 0), 2);
}

#[test]
fn a_full_queue_backlogs_hints_and_workers_take_them() {
    let book = book(10, 1);
    let trees = [tree("a"), tree("b")];
    let dropped = book.note_commit(trees.iter(), &trees);
    assert_eq!(dropped, trees.to_vec());
    assert_eq!(book.sizes().queued, 1);
    assert_eq!(book.sizes().backlog, 3);
    assert_eq!(run_all(&book, 0), 4);
    assert_eq!(busy(&book), (0, 0, 0, 0));
}

#[test]
fn a_full_book_starts_a_walk_that_finds_the_untracked_tree() {
    let book = book(1, 100);
    let (a, b) = (tree("a"), tree("b"));
    commit_local(&book, &a);
    // No room for b: its commit is left to a walk.
    commit_local(&book, &b);
    assert_eq!(book.sizes().trees, 1);
    assert_eq!(book.walk_position(), None, "no room yet");
    run_all(&book, 1);
    assert_eq!(book.walk_position(), Some((None, 1)));
    book.walk_found(None, std::slice::from_ref(&a), false);
    run_all(&book, 1);
    assert_eq!(book.walk_position(), Some((Some(a.clone()), 1)));
    book.walk_found(Some(&a), std::slice::from_ref(&b), true);
    assert_eq!(book.sizes().queued, 2, "b's pairs");
    run_all(&book, 1);
    assert_eq!(book.walk_position(), None, "the walk is over");
}

#[test]
fn forgetting_a_tree_leaves_nothing_and_stales_its_running_pass() {
    let book = book(10, 1);
    let t = tree("t");
    let (key, ticket, _) = commit_and_take(&book, &t);
    book.forget(&BTreeSet::from([t.clone()]));
    assert_eq!(book.begin_pass(&key, ticket).map(|s| s.changes), None);
    let sizes = book.sizes();
    assert_eq!((sizes.trees, sizes.queued, sizes.backlog), (0, 0, 0));
    // Made again under the same name: a fresh pair, not the stale pass's.
    commit_local(&book, &t);
    assert!(book.begin_pass(&key, ticket).is_none());
}

#[test]
fn a_tree_tracked_again_after_forgetting_queues_fresh_pairs() {
    let book = book(1, 100);
    let (t, u) = (tree("t"), tree("u"));
    // A write made t again before the drop forgot it: its commit's hint
    // went to the state forgotten.
    let (key, ticket, _) = commit_and_take(&book, &t);
    book.forget(&BTreeSet::from([t.clone()]));
    assert_eq!(book.track_again(std::slice::from_ref(&t)), 2);
    assert_eq!(book.position(&key), None, "cursors are read afresh");
    assert!(book.begin_pass(&key, ticket).is_none(), "the stale pass");
    // Tracked already: nothing to do.
    assert_eq!(book.track_again(std::slice::from_ref(&t)), 0);
    assert_eq!(book.sizes().queued, 2);
    assert_eq!(run_all(&book, 1), 2);
    // No room (t has work): left to a walk that starts over.
    commit_local(&book, &t);
    assert_eq!(book.track_again(std::slice::from_ref(&u)), 0);
    assert_eq!(book.sizes().trees, 1);
    run_all(&book, 2);
    assert_eq!(book.walk_position(), Some((None, 1)));
}

#[test]
fn a_lagging_cursor_keeps_its_tree_until_written() {
    let book = book(100, 100);
    let t = tree("t");
    let first = commit_and_take(&book, &t);
    end(&book, &first, Some((0, 3)), true);
    let (key, ticket) = book.take().expect("the other pair");
    let start = book.begin_pass(&key, ticket).expect("its ticket");
    end(&book, &(key, ticket, start), Some((0, 3)), true);
    assert_eq!(
        book.sizes().trees,
        1,
        "the acknowledged heights are only here"
    );
    assert_eq!(book.position(&(t.clone(), 2)), Some(3));
    // Due to be written: the sweep queues both pairs.
    assert_eq!(book.sweep(Duration::ZERO, PERIOD), 2);
}

/// Takes the pair of `key` once its backoff ended and ends its pass as a
/// stamp conflict; returns the verdict.
fn conflicted_pass(book: &PushBook, key: &PushKey, now: Duration) -> PassVerdict {
    book.dispatch(now);
    let (taken, ticket) = book.take().expect("the pair is queued again");
    assert_eq!(&taken, key);
    let start = book.begin_pass(key, ticket).expect("its ticket");
    let end = PassEnd {
        cursor: Some(LazyCursor::loaded(0)),
        ok: false,
        conflict: true,
    };
    book.end_pass(key, ticket, &start, end, now)
}

/// A pair whose peer refuses it with stamp conflicts is retried with a
/// backoff `conflict_passes_max` times, then parked: no backoff, sweep or
/// later commit queues it again, the book reports it, and dropping the
/// tree forgets it. A failure of another kind in between starts the
/// count again.
#[test]
fn a_pair_refused_by_stamp_conflicts_is_parked() {
    let book = book(8, 8);
    let t = tree("t");
    let (key, ticket, start) = commit_and_take(&book, &t);
    let end = PassEnd {
        cursor: Some(LazyCursor::loaded(0)),
        ok: false,
        conflict: true,
    };
    assert_eq!(
        book.end_pass(&key, ticket, &start, end, Duration::ZERO),
        PassVerdict::Continues
    );
    // Let the other pair of the tree finish cleanly.
    let (other, ticket) = book.take().expect("the other peer's pair");
    let start = book.begin_pass(&other, ticket).expect("its ticket");
    end_pass_at(&book, &(other, ticket, start), true);
    let mut now = Duration::from_secs(10);
    assert_eq!(conflicted_pass(&book, &key, now), PassVerdict::Continues);
    now += Duration::from_secs(10);
    // A plain failure resets the count.
    book.dispatch(now);
    let (_, ticket) = book.take().expect("queued again");
    let start = book.begin_pass(&key, ticket).expect("its ticket");
    end_pass_at(&book, &(key.clone(), ticket, start), false);
    for _ in 1..CONFLICTS_MAX {
        now += Duration::from_secs(10);
        assert_eq!(conflicted_pass(&book, &key, now), PassVerdict::Continues);
    }
    now += Duration::from_secs(10);
    let verdict = conflicted_pass(&book, &key, now);
    assert_eq!(verdict, PassVerdict::Parked(CONFLICTS_MAX));
    let sizes = book.sizes();
    assert_eq!((sizes.parked, sizes.delayed, sizes.queued), (1, 0, 0));
    commit_local(&book, &t);
    book.sweep(now + PERIOD * 4, PERIOD);
    book.dispatch(now + PERIOD * 4);
    while let Some((taken, ticket)) = book.take() {
        assert_ne!(taken, key, "a parked pair was queued");
        let start = book.begin_pass(&taken, ticket).expect("its ticket");
        end_pass_at(&book, &(taken, ticket, start), true);
    }
    assert_eq!(book.sizes().parked, 1);
    book.forget(&BTreeSet::from([t]));
    assert_eq!(book.sizes().parked, 0);
}

fn end_pass_at(book: &PushBook, taken: &(PushKey, u64, PassStart), ok: bool) {
    end(book, taken, Some((0, 0)), ok);
}
