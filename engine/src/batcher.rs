//! Group commit (docs/design.md §5): concurrent callers' writes are
//! collected until `max_batch_size` ops or `max_batch_delay` have passed and
//! committed in one write transaction; each caller gets its own result.
//!
//! Adaptive under load, because one commit costs a sync whatever its size:
//! - the delay window is measured from the arrival of the oldest write in the
//!   batch, so writes that queued while the previous commit ran are committed
//!   at once instead of waiting a second window;
//! - once the batch is due (full or out of time) it also takes everything
//!   else already queued, up to `max_commit_size` writes, so one sync serves
//!   a whole backlog;
//! - while a commit is in flight the next batch accumulates in the queue
//!   (at most `max_pending` writes), ready the moment the commit returns;
//! - replicated ops (a job of `Apply` writes only) have no client waiting on
//!   them: with `replicated_batch_delay` set, such a job neither makes a
//!   batch due by its size nor shortens its window below that delay, so the
//!   pushes of several peers and trees share one commit, and one with the
//!   next local write if it comes first.
//!
//! Guarantees, each relied on by the service and checked by the simulator:
//! - the queue is bounded (`max_pending` ops); a full queue refuses at once
//!   with `Overloaded` instead of making the caller wait out its deadline;
//! - a failed transaction fails every caller in it, and nobody gets a success
//!   for an op that was not stored;
//! - no caller waits forever: on shutdown, or if the worker task is dropped,
//!   every waiting caller gets `ShuttingDown`;
//! - the write transaction runs on `Runtime::run_blocking` and never spans an
//!   `.await` (redb's `begin_write` blocks the thread while another is live).

use crate::canary::{self, Canary};
use crate::error::{Error, Result};
use crate::forest::{CommitSummary, Committed, Forest, WriteOutcome, WriteRequest};
use crate::probe::{self, Probe};
use crate::runtime::{blocking, Env};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};

/// Commits one batch in one transaction; the outer error fails the batch.
/// `Forest::write_batch` in production; tests plug in failing commits.
pub type CommitFn = Arc<dyn Fn(&[WriteRequest]) -> Result<Committed> + Send + Sync>;

/// Work the batcher does between batches, after it has answered the last
/// one's callers (production: the checkpoint of a forest with a log, see
/// [`checkpointing`]). `None`: nothing was due; `Some(Err)` fails no
/// caller but is told to the observer as a failed commit, so a storage
/// error starts the same recovery as a failed batch.
pub type BetweenFn = Arc<dyn Fn() -> Option<Result<()>> + Send + Sync>;

/// What a batcher runs: the commit of each batch and, between batches,
/// work no caller should wait for.
#[derive(Clone)]
pub struct Commits {
    pub commit: CommitFn,
    pub between: Option<BetweenFn>,
}

/// Commits into `forest` with a checkpoint every `interval` on `clock`, or
/// once `pilorama.checkpoint_bytes` of log are written, whichever comes
/// first: with a write-ahead log, the log kept (and replayed after a
/// crash) never spans more than one interval of batches
/// (docs/design.md §5). The checkpoint runs between batches, after the
/// batch before it was answered: its callers' records are durable in the
/// log already, and they need not wait for every page of the interval to
/// reach the file. Its duration goes to `checkpoint_seconds`.
pub fn checkpointing(
    forest: Arc<Forest>,
    clock: Arc<dyn crate::runtime::Clock>,
    interval: Duration,
    checkpoint_seconds: crate::metrics::Histogram,
) -> Commits {
    forest.checkpoint_between_batches();
    let last = Arc::new(std::sync::Mutex::new(clock.now()));
    let commit: CommitFn = {
        let forest = forest.clone();
        Arc::new(move |requests| forest.write_batch(requests))
    };
    let between: BetweenFn = Arc::new(move || {
        if !forest.has_wal() {
            return None;
        }
        let began = clock.now();
        {
            let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
            if began.saturating_sub(*last) < interval && !forest.checkpoint_due() {
                return None;
            }
            *last = began;
        }
        let done = forest.checkpoint();
        let took = clock.now().saturating_sub(began);
        checkpoint_seconds.observe(took.as_secs_f64());
        Some(done)
    });
    Commits {
        commit,
        between: Some(between),
    }
}

/// `Forest::write_batch` for a caller that commits batches one after the
/// other with nothing between them, asking for a checkpoint whenever
/// `interval` passed on `clock` since the last one it asked for: the batch
/// that finds it asked for (or `pilorama.checkpoint_bytes` of log written)
/// commits durably itself, as the checkpoint. [`checkpointing`] moves the
/// checkpoint between batches instead. The duration of every commit that
/// was a checkpoint goes to `checkpoint_seconds`.
pub fn checkpointing_commit(
    forest: Arc<Forest>,
    clock: Arc<dyn crate::runtime::Clock>,
    interval: Duration,
    checkpoint_seconds: crate::metrics::Histogram,
) -> CommitFn {
    let last = std::sync::Mutex::new(clock.now());
    Arc::new(move |requests| {
        if !forest.has_wal() {
            return forest.write_batch(requests);
        }
        let began = clock.now();
        {
            let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
            if began.saturating_sub(*last) >= interval {
                forest.request_checkpoint();
                *last = began;
            }
        }
        let checkpoints = forest.wal_stats().checkpoints;
        let committed = forest.write_batch(requests);
        if forest.wal_stats().checkpoints > checkpoints {
            let took = clock.now().saturating_sub(began);
            checkpoint_seconds.observe(took.as_secs_f64());
        }
        committed
    })
}

/// Told once per commit what it changed (`Forest::write_batch`'s summary,
/// or `CommitSummary::failed` for a transaction that failed), right after
/// the transaction ended, in the same blocking call and so before any of
/// its callers hears of it. It must not block or wait.
pub trait CommitObserver: Send + Sync + 'static {
    fn committed(&self, summary: &CommitSummary);
}

/// An observer that ignores every commit.
pub struct Unobserved;

impl CommitObserver for Unobserved {
    fn committed(&self, _summary: &CommitSummary) {}
}

/// Counters of one batcher.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatcherStats {
    /// Batches committed.
    pub batches: u64,
    /// Writes in committed batches (including ones that failed on their own).
    pub writes: u64,
    /// Batches whose transaction failed.
    pub failed: u64,
    /// Writes refused with `Overloaded`.
    pub rejected: u64,
    /// Writes admitted and not answered yet.
    pub pending: u64,
    /// Time spent in commit transactions (failed ones too) and in the
    /// work between batches (checkpoints), on the node's clock: its growth
    /// per second is the share of time the batcher is busy, 1.0 when it
    /// is the bottleneck.
    pub commit_us: u64,
}

/// Bounds of one batcher.
#[derive(Clone, Copy, Debug)]
pub struct BatcherOptions {
    /// A batch with this many writes is committed without waiting further.
    pub max_batch_size: usize,
    pub max_batch_delay: Duration,
    /// The window of a job of replicated ops only; zero: the same rules as
    /// local writes (see the module comment).
    pub replicated_batch_delay: Duration,
    pub max_pending: usize,
    /// The most writes one commit takes from a backlog; values below
    /// `max_batch_size` mean `max_batch_size` (no growth under load).
    pub max_commit_size: usize,
}

impl BatcherOptions {
    /// The effective per-commit bound.
    pub fn commit_cap(&self) -> usize {
        self.max_commit_size.max(self.max_batch_size)
    }

    /// How long after it was queued a job makes its batch due.
    fn window(&self, replicated: bool) -> Duration {
        if replicated {
            self.max_batch_delay.max(self.replicated_batch_delay)
        } else {
            self.max_batch_delay
        }
    }

    /// How many of a job's writes count toward `max_batch_size`.
    fn urgent_writes(&self, replicated: bool, writes: usize) -> usize {
        if replicated && !self.replicated_batch_delay.is_zero() {
            0
        } else {
            writes
        }
    }
}

type JobReply = Result<Vec<Result<WriteOutcome>>>;

/// Requests the batcher did not queue, given back with the reason.
#[derive(Debug)]
pub struct NotTaken {
    pub error: Error,
    pub requests: Vec<WriteRequest>,
}

impl NotTaken {
    fn new(error: Error, requests: Vec<WriteRequest>) -> Self {
        NotTaken { error, requests }
    }
}

/// One caller's writes; they always go into the same batch.
struct Job {
    requests: Vec<WriteRequest>,
    reply: Reply,
    /// When the job was queued, on the node's clock: the batch's delay
    /// window starts at its oldest job.
    queued_at: Duration,
    /// Every request is a replicated op (`WriteOp::Apply`, `Pulled`).
    replicated: bool,
}

impl Job {
    fn deadline(&self, options: &BatcherOptions) -> Duration {
        self.queued_at + options.window(self.replicated)
    }

    fn urgent_writes(&self, options: &BatcherOptions) -> usize {
        options.urgent_writes(self.replicated, self.requests.len())
    }
}

/// The answer channel of a job and its share of the pending count, which
/// lasts until the answer is sent (not until the caller stops waiting), so
/// an unanswered job stays visible and keeps counting against the bound.
struct Reply {
    sender: oneshot::Sender<JobReply>,
    _pending: PendingToken,
}

impl Reply {
    fn send(self, reply: JobReply) {
        let _ = self.sender.send(reply);
    }
}

#[derive(Default)]
struct Counters {
    batches: AtomicU64,
    writes: AtomicU64,
    failed: AtomicU64,
    rejected: AtomicU64,
    pending: AtomicU64,
    commit_us: AtomicU64,
}

struct Shared {
    counters: Counters,
    closed: AtomicBool,
    /// Set by the worker when it has answered its last job.
    finished: watch::Sender<bool>,
    /// Duration of every commit transaction, in seconds (the metrics
    /// endpoint exports it).
    commit_seconds: crate::metrics::Histogram,
}

/// The group-commit front of one forest.
pub struct Batcher {
    shared: Arc<Shared>,
    queue: mpsc::Sender<Job>,
    shutdown: watch::Sender<bool>,
    /// Commit what is queued without waiting for batch deadlines, then stop.
    drain: watch::Sender<bool>,
    options: BatcherOptions,
    env: Env,
}

impl Batcher {
    /// Starts the worker on `env.runtime`, committing into `forest`, with
    /// no observer.
    pub fn start(
        forest: Arc<Forest>,
        env: Env,
        max_batch_size: usize,
        max_batch_delay: Duration,
        max_pending: usize,
    ) -> Batcher {
        let commit: CommitFn = Arc::new(move |requests| forest.write_batch(requests));
        let options = BatcherOptions {
            max_batch_size,
            max_batch_delay,
            replicated_batch_delay: Duration::ZERO,
            max_pending,
            max_commit_size: max_batch_size,
        };
        Self::start_with_commit(commit, Arc::new(Unobserved), env, options)
    }

    /// Starts the worker with any commit function; `observer` hears of
    /// every commit.
    pub fn start_with_commit(
        commit: CommitFn,
        observer: Arc<dyn CommitObserver>,
        env: Env,
        options: BatcherOptions,
    ) -> Batcher {
        let commits = Commits {
            commit,
            between: None,
        };
        Self::start_with_commits(commits, observer, env, options)
    }

    /// Starts the worker with a commit function and work between batches
    /// (`Commits`); `observer` hears of every commit and of every failure
    /// of the work between them.
    pub fn start_with_commits(
        commits: Commits,
        observer: Arc<dyn CommitObserver>,
        env: Env,
        options: BatcherOptions,
    ) -> Batcher {
        assert!(options.max_batch_size >= 1 && options.max_pending >= 1);
        let shared = Arc::new(Shared {
            counters: Counters::default(),
            closed: AtomicBool::new(false),
            finished: watch::channel(false).0,
            commit_seconds: crate::metrics::latency_histogram(),
        });
        let (queue, receiver) = mpsc::channel(options.max_pending);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (drain, drain_rx) = watch::channel(false);
        let worker = Worker {
            receiver,
            shutdown: shutdown_rx,
            drain: drain_rx,
            shared: shared.clone(),
            env: env.clone(),
            commit: commits.commit,
            between: commits.between,
            observer,
            options,
            carry: None,
            hung: Vec::new(),
        };
        env.runtime.spawn("batcher", Box::pin(worker.run()));
        Batcher {
            shared,
            queue,
            shutdown,
            drain,
            options,
            env,
        }
    }

    pub fn options(&self) -> BatcherOptions {
        self.options
    }

    /// The histogram of commit durations (shared, not a copy).
    pub fn commit_latency(&self) -> crate::metrics::Histogram {
        self.shared.commit_seconds.clone()
    }

    /// Writes one request in the next batch.
    pub async fn submit(&self, request: WriteRequest) -> Result<WriteOutcome> {
        let mut results = self.submit_all(vec![request]).await?;
        assert_eq!(results.len(), 1, "one result per request");
        results.pop().expect("one result")
    }

    /// Writes several requests in one batch (a replicated page). The outer
    /// error means none of them was stored.
    pub async fn submit_all(
        &self,
        requests: Vec<WriteRequest>,
    ) -> Result<Vec<Result<WriteOutcome>>> {
        match self.offer_all(requests).await {
            Ok(answer) => answer,
            Err(NotTaken { error, .. }) => Err(error),
        }
    }

    /// [`Batcher::submit_all`] for a caller that waits and offers the same
    /// requests again: a job the batcher does not take (bound reached,
    /// queue full, shutting down) comes back whole in [`NotTaken`], so the
    /// caller need not keep a copy. `Ok` holds the batch's answer.
    pub async fn offer_all(
        &self,
        requests: Vec<WriteRequest>,
    ) -> std::result::Result<Result<Vec<Result<WriteOutcome>>>, NotTaken> {
        if requests.is_empty() {
            return Ok(Ok(Vec::new()));
        }
        if self.shared.closed.load(Ordering::SeqCst) {
            return Err(NotTaken::new(Error::ShuttingDown, requests));
        }
        let count = requests.len() as u64;
        let pending = match self.admit(count) {
            Ok(pending) => pending,
            Err(error) => return Err(NotTaken::new(error, requests)),
        };
        let (sender, answer) = oneshot::channel();
        let reply = Reply {
            sender,
            _pending: pending,
        };
        let replicated = requests.iter().all(|r| r.op.replicated().is_some());
        let job = Job {
            requests,
            reply,
            queued_at: self.env.clock.now(),
            replicated,
        };
        match self.queue.try_send(job) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(job)) => {
                return Err(NotTaken::new(self.reject(count), job.requests))
            }
            Err(mpsc::error::TrySendError::Closed(job)) => {
                return Err(NotTaken::new(Error::ShuttingDown, job.requests))
            }
        }
        // A dropped sender means the worker is gone: the node is stopping.
        let results = answer.await.unwrap_or(Err(Error::ShuttingDown));
        if let Ok(results) = &results {
            assert_eq!(results.len() as u64, count, "one result per request");
        }
        Ok(results)
    }

    /// Counts `count` writes as pending, or refuses them when that would
    /// exceed the bound. A job larger than the bound is let in when nothing
    /// else waits, so a full replication page always makes progress.
    fn admit(&self, count: u64) -> Result<PendingToken> {
        assert!(count > 0, "an empty job");
        let max = self.options.max_pending as u64;
        let admitted = self.shared.counters.pending.fetch_update(
            Ordering::SeqCst,
            Ordering::SeqCst,
            |pending| (pending == 0 || pending + count <= max).then_some(pending + count),
        );
        match admitted {
            Ok(_) => Ok(PendingToken {
                shared: self.shared.clone(),
                count,
            }),
            Err(_) => Err(self.reject(count)),
        }
    }

    fn reject(&self, count: u64) -> Error {
        probe::hit(Probe::AdmissionRefused);
        self.shared
            .counters
            .rejected
            .fetch_add(count, Ordering::Relaxed);
        Error::Overloaded(format!(
            "{} writes pending, limit {}",
            self.shared.counters.pending.load(Ordering::Relaxed),
            self.options.max_pending
        ))
    }

    pub fn stats(&self) -> BatcherStats {
        let c = &self.shared.counters;
        BatcherStats {
            batches: c.batches.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            pending: c.pending.load(Ordering::SeqCst),
            commit_us: c.commit_us.load(Ordering::Relaxed),
        }
    }

    /// Refuses new writes, commits every queued one at once (no batch
    /// waits for its deadline) and answers its callers, then stops; returns
    /// when the last answer is sent. The graceful end of a node.
    pub async fn drain(&self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        let _ = self.drain.send(true);
        let mut finished = self.shared.finished.subscribe();
        let _ = finished.wait_for(|done| *done).await;
    }

    /// Refuses new writes; queued ones get `ShuttingDown`; a batch already
    /// committing finishes and answers its callers.
    pub fn shutdown(&self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        let _ = self.shutdown.send(true);
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Counts a job's writes as pending until it is dropped.
struct PendingToken {
    shared: Arc<Shared>,
    count: u64,
}

impl Drop for PendingToken {
    fn drop(&mut self) {
        let before = self
            .shared
            .counters
            .pending
            .fetch_sub(self.count, Ordering::SeqCst);
        assert!(before >= self.count, "pending write count underflow");
    }
}

struct Worker {
    receiver: mpsc::Receiver<Job>,
    shutdown: watch::Receiver<bool>,
    drain: watch::Receiver<bool>,
    shared: Arc<Shared>,
    env: Env,
    commit: CommitFn,
    between: Option<BetweenFn>,
    observer: Arc<dyn CommitObserver>,
    options: BatcherOptions,
    /// A job that did not fit into the previous batch; it opens the next.
    carry: Option<Job>,
    /// Canary `FailedBatchHangs`: answers deliberately never sent.
    hung: Vec<Reply>,
}

impl Worker {
    async fn run(mut self) {
        while let Some(first) = self.next_job().await {
            match self.collect(first).await {
                Ok(batch) => {
                    if self.commit(batch).await {
                        self.between().await;
                    }
                }
                Err(batch) => {
                    answer_all(batch, Error::ShuttingDown);
                    break;
                }
            }
        }
        self.receiver.close();
        while let Ok(job) = self.receiver.try_recv() {
            job.reply.send(Err(Error::ShuttingDown));
        }
        self.shared.finished.send_replace(true);
    }

    fn draining(&self) -> bool {
        *self.drain.borrow()
    }

    /// The job that opens the next batch; `None` once shutting down.
    async fn next_job(&mut self) -> Option<Job> {
        if let Some(job) = self.carry.take() {
            return Some(job);
        }
        if self.draining() {
            return self.receiver.try_recv().ok();
        }
        let shutdown = &mut self.shutdown;
        let drain = &mut self.drain;
        tokio::select! {
            biased;
            _ = shutdown.wait_for(|stop| *stop) => return None,
            _ = drain.wait_for(|drain| *drain) => {}
            job = self.receiver.recv() => return job,
        }
        self.receiver.try_recv().ok()
    }

    /// Adds jobs to `first` until the batch is due, then whatever else is
    /// already queued, up to the commit cap. A batch is due when it holds
    /// `max_batch_size` writes or `max_batch_delay` has passed since its
    /// oldest job was queued (on the node's clock); replicated jobs count
    /// with their own window and size (`BatcherOptions::window`). `Err`
    /// (with the jobs collected) on shutdown.
    async fn collect(&mut self, first: Job) -> Result<Vec<Job>, Vec<Job>> {
        let options = self.options;
        let mut deadline = first.deadline(&options);
        let cap = options.commit_cap();
        let mut size = first.requests.len();
        let mut urgent = first.urgent_writes(&options);
        let mut batch = vec![first];
        let mut due = urgent >= options.max_batch_size;
        while size < cap {
            let job = match self.receiver.try_recv() {
                Ok(job) => job,
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) if due || self.draining() => break,
                Err(mpsc::error::TryRecvError::Empty) => {
                    let now = self.env.clock.now();
                    if now >= deadline {
                        break;
                    }
                    let sleep = self.env.clock.sleep(deadline - now);
                    let shutdown = &mut self.shutdown;
                    let drain = &mut self.drain;
                    tokio::select! {
                        biased;
                        _ = shutdown.wait_for(|stop| *stop) => return Err(batch),
                        _ = drain.wait_for(|drain| *drain) => break,
                        job = self.receiver.recv() => match job {
                            Some(job) => job,
                            None => break,
                        },
                        () = sleep => break,
                    }
                }
            };
            if size + job.requests.len() > cap {
                self.carry = Some(job);
                break;
            }
            size += job.requests.len();
            urgent += job.urgent_writes(&options);
            deadline = deadline.min(job.deadline(&options));
            batch.push(job);
            due = due || urgent >= options.max_batch_size;
        }
        // One job larger than the cap is let in alone (see `admit`).
        assert!(
            size <= cap || batch.len() == 1,
            "batch of {size} over the cap {cap}"
        );
        Ok(batch)
    }

    /// The work between batches, if any is due (see [`BetweenFn`]). Its
    /// time counts as the batcher's busy time (`commit_us`).
    async fn between(&mut self) {
        let Some(between) = self.between.clone() else {
            return;
        };
        let observer = self.observer.clone();
        let started = self.env.clock.now();
        let done = blocking(&*self.env.runtime, move || {
            let done = between();
            if let Some(Err(error)) = &done {
                observer.committed(&CommitSummary::failed(&[], error.clone()));
            }
            done
        })
        .await;
        let Some(done) = done else {
            return;
        };
        let elapsed = self.env.clock.now().saturating_sub(started);
        self.shared
            .counters
            .commit_us
            .fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
        if let Err(error) = done {
            tracing::warn!(%error, "work between batches failed");
        }
    }

    /// Commits a batch and answers its callers; true when the commit
    /// succeeded.
    async fn commit(&mut self, batch: Vec<Job>) -> bool {
        let mut requests = Vec::with_capacity(batch.iter().map(|job| job.requests.len()).sum());
        let mut replies = Vec::with_capacity(batch.len());
        for job in batch {
            replies.push((job.requests.len(), job.reply));
            requests.extend(job.requests);
        }
        let commit = self.commit.clone();
        let observer = self.observer.clone();
        let started = self.env.clock.now();
        let (requests, result) = blocking(&*self.env.runtime, move || {
            let result = commit(&requests);
            let summary = match &result {
                Ok(committed) => committed.summary.clone(),
                Err(error) => CommitSummary::failed(&requests, error.clone()),
            };
            observer.committed(&summary);
            (requests, result)
        })
        .await;
        let counters = &self.shared.counters;
        let elapsed = self.env.clock.now().saturating_sub(started);
        counters
            .commit_us
            .fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
        self.shared.commit_seconds.observe(elapsed.as_secs_f64());
        match result {
            Ok(committed) => {
                assert_eq!(
                    committed.results.len(),
                    requests.len(),
                    "commit must answer every request"
                );
                counters.batches.fetch_add(1, Ordering::Relaxed);
                counters
                    .writes
                    .fetch_add(requests.len() as u64, Ordering::Relaxed);
                let mut results = committed.results.into_iter();
                let mut answers: Vec<Vec<Result<WriteOutcome>>> = replies
                    .iter()
                    .map(|(count, _)| results.by_ref().take(*count).collect())
                    .collect();
                if canary::active(Canary::ResultsToWrongCallers) {
                    swap_two_alike(&mut answers);
                }
                for ((_, reply), answer) in replies.into_iter().zip(answers) {
                    reply.send(Ok(answer));
                }
                true
            }
            Err(error) => {
                counters.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, writes = requests.len(), "batch failed");
                if canary::active(Canary::FailedBatchHangs) {
                    self.hung
                        .extend(replies.into_iter().map(|(_, reply)| reply));
                    return false;
                }
                for (_, reply) in replies {
                    reply.send(Err(error.clone()));
                }
                false
            }
        }
    }
}

/// Planted bug `ResultsToWrongCallers`: the first two single-write answers
/// of the same kind (two Adds, two AddByPaths) change callers.
fn swap_two_alike(answers: &mut [Vec<Result<WriteOutcome>>]) {
    let kind = |answer: &Vec<Result<WriteOutcome>>| match answer.as_slice() {
        [Ok(WriteOutcome::Moved { .. })] => Some(1),
        [Ok(WriteOutcome::AddedByPath { .. })] => Some(2),
        _ => None,
    };
    for i in 0..answers.len() {
        let Some(first) = kind(&answers[i]) else {
            continue;
        };
        if let Some(j) = (i + 1..answers.len()).find(|&j| kind(&answers[j]) == Some(first)) {
            answers.swap(i, j);
            return;
        }
    }
}

fn answer_all(batch: Vec<Job>, error: Error) {
    for job in batch {
        job.reply.send(Err(error.clone()));
    }
}
