//! Group commit with a scripted commit function: who gets which result, what
//! a failed transaction does, overload and shutdown. Virtual time only.

mod service_support;

use arbor::batcher::{
    Batcher, BatcherOptions, BetweenFn, CommitFn, CommitObserver, Commits, Unobserved,
};
use arbor::forest::{CommitSummary, Committed, WriteOp, WriteOutcome, WriteRequest};
use arbor::{ContainerId, Error, TreeKey};
use service_support::test_env;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn tree(name: &str) -> TreeKey {
    TreeKey::new(ContainerId([7; 32]), name)
}

/// A write whose fake outcome is derived from `tag`.
fn request(tree_name: &str, tag: u64) -> WriteRequest {
    WriteRequest {
        tree: tree(tree_name),
        op: WriteOp::Move {
            parent: tag,
            child: None,
            items: vec![],
        },
    }
}

/// A commit's answer as the forest gives it: results and their summary.
fn committed(requests: &[WriteRequest], results: Vec<arbor::Result<WriteOutcome>>) -> Committed {
    Committed {
        summary: CommitSummary::of(requests, &results),
        results,
    }
}

/// Answers `Moved { node: parent }` for each request, records batch sizes,
/// and fails the whole transaction while `fail` is set. Tag 13 fails alone.
struct Script {
    fail: AtomicBool,
    batches: Mutex<Vec<usize>>,
}

impl Script {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            fail: AtomicBool::new(false),
            batches: Mutex::new(Vec::new()),
        })
    }

    fn commit_fn(self: &Arc<Self>) -> CommitFn {
        let script = self.clone();
        Arc::new(move |requests: &[WriteRequest]| {
            script.batches.lock().unwrap().push(requests.len());
            if script.fail.load(Ordering::SeqCst) {
                return Err(Error::Storage("disk on fire".into()));
            }
            let results = requests
                .iter()
                .map(|r| match r.op {
                    WriteOp::Move { parent: 13, .. } => Err(Error::NodeNotFound(13)),
                    WriteOp::Move { parent, .. } => Ok(WriteOutcome::Moved {
                        node: parent,
                        ts: parent,
                    }),
                    WriteOp::Apply { .. } => Ok(WriteOutcome::Applied { fresh: true }),
                    _ => unreachable!(),
                })
                .collect();
            Ok(committed(requests, results))
        })
    }
}

/// A replicated op (as a push delivers it).
fn replicated(tag: u64) -> WriteRequest {
    WriteRequest {
        tree: tree("t"),
        op: WriteOp::Apply {
            op: arbor::Move {
                parent: 0,
                child: tag,
                meta: arbor::Meta {
                    time: (tag << 16) | 2,
                    items: vec![],
                },
            },
        },
    }
}

/// Batch size 1 without delay for local writes; replicated ops wait 50 ms.
/// One commit takes up to 100 writes.
fn lingering_options() -> BatcherOptions {
    BatcherOptions {
        max_batch_delay: Duration::ZERO,
        replicated_batch_delay: Duration::from_millis(50),
        max_commit_size: 100,
        ..options(1, 100)
    }
}

fn start_lingering(script: &Arc<Script>, options: BatcherOptions) -> Arc<Batcher> {
    Arc::new(Batcher::start_with_commit(
        script.commit_fn(),
        Arc::new(Unobserved),
        test_env(),
        options,
    ))
}

fn submit_later(
    batcher: &Arc<Batcher>,
    after: Duration,
    requests: Vec<WriteRequest>,
) -> tokio::task::JoinHandle<usize> {
    let batcher = batcher.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        let results = batcher.submit_all(requests).await.unwrap();
        assert!(results.iter().all(Result::is_ok));
        results.len()
    })
}

#[tokio::test(start_paused = true)]
async fn replicated_ops_share_a_commit_within_their_delay() {
    let script = Script::new();
    let batcher = start_lingering(&script, lingering_options());
    let start = tokio::time::Instant::now();
    let pushes = [
        submit_later(&batcher, Duration::ZERO, vec![replicated(1)]),
        submit_later(&batcher, Duration::from_millis(20), vec![replicated(2)]),
        submit_later(&batcher, Duration::from_millis(40), vec![replicated(3)]),
        // After the first one's 50 ms: the next commit.
        submit_later(&batcher, Duration::from_millis(60), vec![replicated(4)]),
    ];
    for push in pushes {
        push.await.unwrap();
    }
    assert_eq!(script.batches.lock().unwrap().clone(), vec![3, 1]);
    assert_eq!(start.elapsed(), Duration::from_millis(110));
}

#[tokio::test(start_paused = true)]
async fn a_local_write_takes_waiting_replicated_ops_along_at_once() {
    let script = Script::new();
    let batcher = start_lingering(&script, lingering_options());
    let start = tokio::time::Instant::now();
    let push = submit_later(&batcher, Duration::ZERO, vec![replicated(1), replicated(2)]);
    let local = submit_later(&batcher, Duration::from_millis(10), vec![request("t", 7)]);
    assert_eq!(local.await.unwrap(), 1);
    // The local write did not wait for the replicated ops' window.
    assert_eq!(start.elapsed(), Duration::from_millis(10));
    assert_eq!(push.await.unwrap(), 2);
    assert_eq!(script.batches.lock().unwrap().clone(), vec![3]);
}

#[tokio::test(start_paused = true)]
async fn without_a_replicated_delay_replicated_ops_batch_like_local_ones() {
    let script = Script::new();
    let batcher = start_lingering(
        &script,
        BatcherOptions {
            replicated_batch_delay: Duration::ZERO,
            ..lingering_options()
        },
    );
    let first = submit_later(&batcher, Duration::ZERO, vec![replicated(1)]);
    let second = submit_later(&batcher, Duration::from_millis(20), vec![replicated(2)]);
    first.await.unwrap();
    second.await.unwrap();
    assert_eq!(script.batches.lock().unwrap().clone(), vec![1, 1]);
}

fn options(max_batch_size: usize, max_pending: usize) -> BatcherOptions {
    BatcherOptions {
        max_batch_size,
        max_batch_delay: Duration::from_millis(5),
        replicated_batch_delay: Duration::ZERO,
        max_pending,
        max_commit_size: max_batch_size,
    }
}

#[tokio::test(start_paused = true)]
async fn concurrent_callers_get_their_own_results() {
    let script = Script::new();
    let batcher = Arc::new(Batcher::start_with_commit(
        script.commit_fn(),
        Arc::new(Unobserved),
        test_env(),
        options(10, 100),
    ));
    let callers: Vec<_> = (100..150u64)
        .map(|tag| {
            let batcher = batcher.clone();
            tokio::spawn(async move { (tag, batcher.submit(request("t", tag)).await) })
        })
        .collect();
    for caller in callers {
        let (tag, result) = caller.await.unwrap();
        assert_eq!(result, Ok(WriteOutcome::Moved { node: tag, ts: tag }));
    }
    // 50 concurrent writes with room for 10 per batch: grouped, never more.
    let batches = script.batches.lock().unwrap().clone();
    assert_eq!(batches, vec![10; 5]);
    let stats = batcher.stats();
    assert_eq!(
        (stats.batches, stats.writes, stats.failed, stats.pending),
        (5, 50, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn one_bad_write_fails_alone() {
    let script = Script::new();
    let batcher = Arc::new(Batcher::start_with_commit(
        script.commit_fn(),
        Arc::new(Unobserved),
        test_env(),
        options(10, 100),
    ));
    let good = tokio::spawn({
        let b = batcher.clone();
        async move { b.submit(request("t", 12)).await }
    });
    let bad = tokio::spawn({
        let b = batcher.clone();
        async move { b.submit(request("t", 13)).await }
    });
    assert_eq!(bad.await.unwrap(), Err(Error::NodeNotFound(13)));
    assert_eq!(
        good.await.unwrap(),
        Ok(WriteOutcome::Moved { node: 12, ts: 12 })
    );
    assert_eq!(script.batches.lock().unwrap().clone(), vec![2]);
}

#[tokio::test(start_paused = true)]
async fn failed_transaction_fails_every_caller_in_it() {
    let script = Script::new();
    script.fail.store(true, Ordering::SeqCst);
    let batcher = Arc::new(Batcher::start_with_commit(
        script.commit_fn(),
        Arc::new(Unobserved),
        test_env(),
        options(100, 100),
    ));
    let callers: Vec<_> = (1..=8u64)
        .map(|tag| {
            let b = batcher.clone();
            tokio::spawn(async move { b.submit(request("t", tag)).await })
        })
        .collect();
    for caller in callers {
        assert_eq!(
            caller.await.unwrap(),
            Err(Error::Storage("disk on fire".into()))
        );
    }
    assert_eq!(batcher.stats().failed, 1);
    assert_eq!(batcher.stats().pending, 0);
    // The next batch is unaffected.
    script.fail.store(false, Ordering::SeqCst);
    assert_eq!(
        batcher.submit(request("t", 5)).await,
        Ok(WriteOutcome::Moved { node: 5, ts: 5 })
    );
}

#[tokio::test(start_paused = true)]
async fn writes_arriving_within_the_delay_share_a_batch() {
    let script = Script::new();
    let batcher = Arc::new(Batcher::start_with_commit(
        script.commit_fn(),
        Arc::new(Unobserved),
        test_env(),
        options(100, 100),
    ));
    let first = tokio::spawn({
        let b = batcher.clone();
        async move { b.submit(request("t", 1)).await }
    });
    tokio::time::sleep(Duration::from_millis(2)).await;
    let second = tokio::spawn({
        let b = batcher.clone();
        async move { b.submit(request("t", 2)).await }
    });
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    // A third write well after the delay opens a batch of its own.
    tokio::time::sleep(Duration::from_millis(50)).await;
    batcher.submit(request("t", 3)).await.unwrap();
    assert_eq!(script.batches.lock().unwrap().clone(), vec![2, 1]);
}

/// A commit that blocks (on a real blocking thread) until opened, and counts
/// the transactions that reached it.
#[derive(Clone, Default)]
struct Gate {
    open: Arc<(Mutex<bool>, std::sync::Condvar)>,
    entered: Arc<AtomicUsize>,
}

impl Gate {
    fn commit_fn(&self) -> CommitFn {
        let gate = self.clone();
        Arc::new(move |requests: &[WriteRequest]| {
            gate.entered.fetch_add(1, Ordering::SeqCst);
            let (open, cv) = &*gate.open;
            let mut open = open.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
            let results = requests
                .iter()
                .map(|_| Ok(WriteOutcome::Applied { fresh: true }))
                .collect();
            Ok(committed(requests, results))
        })
    }

    fn open(&self) {
        let (open, cv) = &*self.open;
        *open.lock().unwrap() = true;
        cv.notify_all();
    }

    fn entered(&self) -> usize {
        self.entered.load(Ordering::SeqCst)
    }
}

/// A batcher whose commits wait at `gate`.
fn gated_batcher(gate: &Gate, options: BatcherOptions) -> Arc<Batcher> {
    Arc::new(Batcher::start_with_commit(
        gate.commit_fn(),
        Arc::new(Unobserved),
        test_env(),
        options,
    ))
}

/// A batcher bounded at 2 pending writes, with two writes pending and
/// its commit stuck at `gate`; gives the two writers' tasks.
async fn at_its_bound(gate: &Gate) -> (Arc<Batcher>, Vec<Writer>) {
    let batcher = gated_batcher(gate, options(1, 2));
    let waiting = spawn_writes(&batcher, 1..3);
    while batcher.stats().pending < 2 || gate.entered() == 0 {
        tokio::task::yield_now().await;
    }
    (batcher, waiting)
}

#[tokio::test(start_paused = true)]
async fn full_queue_refuses_at_once() {
    let gate = Gate::default();
    let (batcher, waiting) = at_its_bound(&gate).await;
    // Both slots are taken and the commit is stuck: a third write is refused
    // without waiting for anything.
    let refused = futures::FutureExt::now_or_never(batcher.submit(request("t", 3)));
    assert!(
        matches!(refused, Some(Err(Error::Overloaded(_)))),
        "{refused:?}"
    );
    assert_eq!(batcher.stats().rejected, 1);
    gate.open();
    for caller in waiting {
        assert_eq!(
            caller.await.unwrap(),
            Ok(WriteOutcome::Applied { fresh: true })
        );
    }
    assert_eq!(batcher.stats().pending, 0);
}

#[tokio::test(start_paused = true)]
async fn a_refused_offer_gives_the_requests_back() {
    let gate = Gate::default();
    let (batcher, waiting) = at_its_bound(&gate).await;
    // The bound is reached: the page is refused and comes back whole, in
    // its order, so a caller can offer it again without a copy.
    let page: Vec<WriteRequest> = (10..13).map(|n| request("t", n)).collect();
    let refused = futures::FutureExt::now_or_never(batcher.offer_all(page.clone()))
        .expect("a refusal does not wait");
    let not_taken = refused.expect_err("the bound is reached");
    assert!(
        matches!(not_taken.error, Error::Overloaded(_)),
        "{:?}",
        not_taken.error
    );
    assert_eq!(not_taken.requests, page);
    assert_eq!(batcher.stats().rejected, 3);
    assert_eq!(batcher.stats().pending, 2, "the refused page holds no slot");
    gate.open();
    for caller in waiting {
        assert_eq!(
            caller.await.unwrap(),
            Ok(WriteOutcome::Applied { fresh: true })
        );
    }
    // Offered again once there is room, the same requests are taken.
    let answer = batcher.offer_all(not_taken.requests).await;
    let results = answer.expect("taken").expect("committed");
    assert_eq!(results.len(), 3);
    assert_eq!(batcher.stats().pending, 0);
}

#[tokio::test(start_paused = true)]
async fn shutdown_answers_every_waiting_caller() {
    let gate = Gate::default();
    let batcher = gated_batcher(&gate, options(1, 10));
    let callers = spawn_writes(&batcher, 1..5);
    while batcher.stats().pending < 4 || gate.entered() == 0 {
        tokio::task::yield_now().await;
    }
    batcher.shutdown();
    gate.open();
    let mut results = Vec::new();
    for caller in callers {
        results.push(caller.await.unwrap());
    }
    // The batch already committing finishes; the queued ones are refused.
    assert_eq!(results[0], Ok(WriteOutcome::Applied { fresh: true }));
    assert!(
        results[1..].iter().all(|r| *r == Err(Error::ShuttingDown)),
        "{results:?}"
    );
    assert_eq!(
        batcher.submit(request("t", 9)).await,
        Err(Error::ShuttingDown)
    );
    assert_eq!(batcher.stats().pending, 0);
}

/// Records every summary it hears of, and whether a caller had its answer
/// by then.
#[derive(Default)]
struct Listener {
    heard: Mutex<Vec<(CommitSummary, bool)>>,
    answered: AtomicBool,
}

impl CommitObserver for Listener {
    fn committed(&self, summary: &CommitSummary) {
        let answered = self.answered.load(Ordering::SeqCst);
        self.heard.lock().unwrap().push((summary.clone(), answered));
    }
}

#[tokio::test(start_paused = true)]
async fn the_observer_hears_of_each_commit_once_before_its_callers() {
    let script = Script::new();
    let listener = Arc::new(Listener::default());
    let batcher = Arc::new(Batcher::start_with_commit(
        script.commit_fn(),
        listener.clone(),
        test_env(),
        options(100, 100),
    ));
    let submit = |name: &'static str, tag| {
        let (b, listener) = (batcher.clone(), listener.clone());
        tokio::spawn(async move {
            let result = b.submit(request(name, tag)).await;
            listener.answered.store(true, Ordering::SeqCst);
            result
        })
    };
    let writes = [submit("b", 1), submit("a", 2), submit("z", 13)];
    let results: Vec<_> = futures::future::join_all(writes).await;
    assert_eq!(
        results
            .iter()
            .filter(|r| r.as_ref().unwrap().is_ok())
            .count(),
        2
    );
    script.fail.store(true, Ordering::SeqCst);
    listener.answered.store(false, Ordering::SeqCst);
    assert!(submit("c", 3).await.unwrap().is_err());
    let heard = listener.heard.lock().unwrap().clone();
    let stored = CommitSummary {
        local_trees: vec![tree("a"), tree("b")],
        ..CommitSummary::default()
    };
    let failed = CommitSummary {
        failure: Some(Error::Storage("disk on fire".into())),
        unsure_trees: vec![tree("c")],
        ..CommitSummary::default()
    };
    assert_eq!(heard, vec![(stored, false), (failed, false)]);
}

/// Work between batches (a forest's checkpoint) runs once the batch before
/// it is answered: no write of it is pending any more. Its failure fails
/// no caller; the observer hears of it as a failed commit, which starts a
/// node's recovery, and the next batch commits as usual.
#[tokio::test(start_paused = true)]
async fn work_between_batches_runs_after_the_batch_is_answered() {
    let script = Script::new();
    let listener = Arc::new(Listener::default());
    let fails = Arc::new(AtomicBool::new(false));
    let slot: Arc<std::sync::OnceLock<std::sync::Weak<Batcher>>> = Arc::default();
    let (ran, mut runs) = tokio::sync::mpsc::unbounded_channel();
    let between: BetweenFn = {
        let (fails, slot) = (fails.clone(), slot.clone());
        Arc::new(move || {
            let batcher = slot.get().and_then(std::sync::Weak::upgrade);
            let pending = batcher.expect("the batcher is running").stats().pending;
            let done = match fails.load(Ordering::SeqCst) {
                true => Err(Error::Storage("checkpoint on fire".into())),
                false => Ok(()),
            };
            ran.send(pending).unwrap();
            Some(done)
        })
    };
    let commits = Commits {
        commit: script.commit_fn(),
        between: Some(between),
    };
    let batcher = Arc::new(Batcher::start_with_commits(
        commits,
        listener.clone(),
        test_env(),
        options(100, 100),
    ));
    slot.set(Arc::downgrade(&batcher)).unwrap();

    for write in spawn_writes(&batcher, 1..4) {
        assert!(write.await.unwrap().is_ok());
    }
    assert_eq!(runs.recv().await, Some(0), "no write of the batch pending");
    assert_eq!(script.batches.lock().unwrap().clone(), vec![3]);

    fails.store(true, Ordering::SeqCst);
    let answer = batcher.submit(request("t", 4)).await;
    assert!(
        matches!(answer, Ok(WriteOutcome::Moved { node: 4, .. })),
        "{answer:?}"
    );
    assert_eq!(runs.recv().await, Some(0));
    // The next batch is taken only once the failed run was told.
    fails.store(false, Ordering::SeqCst);
    assert!(batcher.submit(request("t", 5)).await.is_ok());
    assert_eq!(script.batches.lock().unwrap().clone(), vec![3, 1, 1]);
    let heard: Vec<CommitSummary> = listener
        .heard
        .lock()
        .unwrap()
        .iter()
        .map(|(summary, _)| summary.clone())
        .collect();
    let failed = CommitSummary {
        failure: Some(Error::Storage("checkpoint on fire".into())),
        ..CommitSummary::default()
    };
    assert_eq!(
        heard.len(),
        4,
        "three commits and one failed run: {heard:?}"
    );
    assert_eq!(heard[2], failed);
    assert!([0, 1, 3].iter().all(|&i| heard[i].failure.is_none()));
    assert_eq!(batcher.stats().failed, 0, "no batch failed");
}

#[tokio::test(start_paused = true)]
async fn a_large_job_is_admitted_when_nothing_waits() {
    let script = Script::new();
    let batcher = Batcher::start_with_commit(
        script.commit_fn(),
        Arc::new(Unobserved),
        test_env(),
        options(4, 3),
    );
    let requests: Vec<_> = (20..30u64).map(|t| request("t", t)).collect();
    let results = batcher.submit_all(requests).await.unwrap();
    assert_eq!(results.len(), 10);
    assert_eq!(results[9], Ok(WriteOutcome::Moved { node: 29, ts: 29 }));
    // One caller's writes are never split across transactions.
    assert_eq!(script.batches.lock().unwrap().clone(), vec![10]);
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_write_counts_until_it_is_answered() {
    let gate = Gate::default();
    let batcher = gated_batcher(&gate, options(1, 1));
    let caller = tokio::spawn({
        let b = batcher.clone();
        async move { b.submit(request("t", 1)).await }
    });
    while gate.entered() == 0 {
        tokio::task::yield_now().await;
    }
    // The caller gives up, but its write is still being committed: it keeps
    // its slot (a hang stays visible) and the bound still holds.
    caller.abort();
    assert!(caller.await.unwrap_err().is_cancelled());
    assert_eq!(batcher.stats().pending, 1);
    let refused = futures::FutureExt::now_or_never(batcher.submit(request("t", 2)));
    assert!(
        matches!(refused, Some(Err(Error::Overloaded(_)))),
        "{refused:?}"
    );
    gate.open();
    while batcher.stats().pending > 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        batcher.submit(request("t", 3)).await,
        Ok(WriteOutcome::Applied { fresh: true })
    );
}

/// A gated commit that also records, per transaction, its size and the
/// virtual time at which it started.
struct Recorder {
    gate: Gate,
    commits: Arc<Mutex<Vec<(usize, tokio::time::Instant)>>>,
}

impl Recorder {
    fn new() -> Self {
        Self {
            gate: Gate::default(),
            commits: Arc::default(),
        }
    }

    fn commit_fn(&self, clock_origin: tokio::time::Instant) -> CommitFn {
        let gated = self.gate.commit_fn();
        let commits = self.commits.clone();
        let env = test_env();
        Arc::new(move |requests: &[WriteRequest]| {
            let at = clock_origin + env.clock.now();
            commits.lock().unwrap().push((requests.len(), at));
            gated(requests)
        })
    }

    fn sizes(&self) -> Vec<usize> {
        self.commits.lock().unwrap().iter().map(|c| c.0).collect()
    }
}

/// A task writing through a batcher.
type Writer = tokio::task::JoinHandle<arbor::Result<WriteOutcome>>;

fn spawn_writes(batcher: &Arc<Batcher>, tags: std::ops::Range<u64>) -> Vec<Writer> {
    tags.map(|tag| {
        let b = batcher.clone();
        tokio::spawn(async move { b.submit(request("t", tag)).await })
    })
    .collect()
}

/// One caller's batch of writes (committed together).
fn spawn_batch(
    batcher: &Arc<Batcher>,
    tags: std::ops::Range<u64>,
) -> tokio::task::JoinHandle<arbor::Result<Vec<arbor::Result<WriteOutcome>>>> {
    let b = batcher.clone();
    let requests = tags.map(|tag| request("t", tag)).collect();
    tokio::spawn(async move { b.submit_all(requests).await })
}

#[tokio::test(start_paused = true)]
async fn a_backlog_is_committed_in_transactions_up_to_the_commit_cap() {
    let recorder = Recorder::new();
    let options = BatcherOptions {
        max_commit_size: 25,
        ..options(10, 100)
    };
    let batcher = Arc::new(Batcher::start_with_commit(
        recorder.commit_fn(tokio::time::Instant::now()),
        Arc::new(Unobserved),
        test_env(),
        options,
    ));
    // A full batch commits at once and gets stuck.
    let full = spawn_batch(&batcher, 100..110);
    while recorder.gate.entered() == 0 {
        tokio::task::yield_now().await;
    }
    // 40 writes queue up behind it: more than max_batch_size.
    let callers = spawn_writes(&batcher, 1..41);
    while batcher.stats().pending < 50 {
        tokio::task::yield_now().await;
    }
    recorder.gate.open();
    assert_eq!(full.await.unwrap().unwrap().len(), 10);
    for caller in callers {
        assert_eq!(
            caller.await.unwrap(),
            Ok(WriteOutcome::Applied { fresh: true })
        );
    }
    // The backlog goes in as few transactions as the cap allows, not in
    // max_batch_size pieces (that would be 10, 10, 10, 10, 10).
    assert_eq!(recorder.sizes(), vec![10, 25, 15]);
    assert_eq!(batcher.stats().batches, 3);
}

#[tokio::test(start_paused = true)]
async fn the_cap_never_goes_below_max_batch_size() {
    let options = BatcherOptions {
        max_commit_size: 1,
        ..options(10, 100)
    };
    assert_eq!(options.commit_cap(), 10);
}

#[tokio::test(start_paused = true)]
async fn writes_that_waited_out_the_delay_during_a_commit_go_next_at_once() {
    let recorder = Recorder::new();
    let start = tokio::time::Instant::now();
    let batcher = Arc::new(Batcher::start_with_commit(
        recorder.commit_fn(start),
        Arc::new(Unobserved),
        test_env(),
        BatcherOptions {
            max_commit_size: 100,
            ..options(100, 200)
        },
    ));
    let full = spawn_batch(&batcher, 100..200);
    while recorder.gate.entered() == 0 {
        tokio::task::yield_now().await;
    }
    let callers = spawn_writes(&batcher, 1..4);
    while batcher.stats().pending < 103 {
        tokio::task::yield_now().await;
    }
    // The stuck commit outlasts the delay window of the queued writes.
    tokio::time::advance(Duration::from_millis(20)).await;
    let released = tokio::time::Instant::now();
    recorder.gate.open();
    full.await.unwrap().unwrap();
    for caller in callers {
        caller.await.unwrap().unwrap();
    }
    let commits = recorder.commits.lock().unwrap().clone();
    assert_eq!(recorder.sizes(), vec![100, 3]);
    // Their window started when they were queued, so the second commit
    // starts as soon as the first returns, not max_batch_delay later.
    assert_eq!(commits[1].1, released, "{commits:?}");
}
