//! The batcher on a real forest: a storage failure fails every caller of the
//! batch, and concurrent submitters build the same tree as one submitter.

mod service_support;

use arbor::batcher::{checkpointing, Batcher};
use arbor::forest::{Forest, ForestOptions, WriteOp, WriteOutcome, WriteRequest};
use arbor::{make_timestamp, Error, KeyValue, Meta, Move, ROOT, TRASH};
use service_support::{add_to_root as add, test_env, tree, FlakyBackend};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn storage_failure_fails_every_caller_of_the_batch() {
    let (backend, failing) = FlakyBackend::new();
    let forest = Arc::new(Forest::open_with_backend(backend, ForestOptions::default()).unwrap());
    let batcher = Arc::new(Batcher::start(
        forest.clone(),
        test_env(),
        100,
        Duration::from_millis(5),
        100,
    ));
    assert!(matches!(
        batcher.submit(add("kept")).await,
        Ok(WriteOutcome::Moved { .. })
    ));

    failing.store(true, Ordering::SeqCst);
    let callers: Vec<_> = (0..6)
        .map(|i| {
            let b = batcher.clone();
            tokio::spawn(async move { b.submit(add(&format!("lost{i}"))).await })
        })
        .collect();
    for caller in callers {
        let result = caller.await.unwrap();
        assert!(matches!(result, Err(Error::Storage(_))), "{result:?}");
    }
    let stats = batcher.stats();
    assert_eq!((stats.failed, stats.pending), (1, 0));

    // Nothing of the failed batch is visible; whatever redb decides about
    // later transactions, it never reports a lost write as stored.
    failing.store(false, Ordering::SeqCst);
    if let Ok(dump) = forest.dump(&tree("t")) {
        assert_eq!(dump.log.len(), 1, "only the first write was stored");
    }
    let after = batcher.submit(add("after")).await;
    if after.is_ok() {
        assert_eq!(forest.dump(&tree("t")).unwrap().log.len(), 2);
    }
}

/// A seeded xorshift, so the op set is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Replicated ops from four replicas over a small node pool, with moves that
/// would form cycles and removals, so undo/redo is exercised.
fn replicated_ops(count: usize, seed: u64) -> Vec<Move> {
    let mut rng = Rng(seed);
    let pool: Vec<u64> = (1..=12).map(|i| i * 1_000_003).collect();
    (0..count)
        .map(|i| {
            let replica = (i % 4) as u16 + 1;
            // Distinct per replica, but interleaved across replicas.
            let counter = (i / 4) as u64 * 3 + 1 + rng.below(3);
            let child = pool[rng.below(pool.len() as u64) as usize];
            let parent = match rng.below(8) {
                0 => ROOT,
                1 => TRASH,
                _ => pool[rng.below(pool.len() as u64) as usize],
            };
            Move {
                parent,
                child,
                meta: Meta {
                    time: make_timestamp(counter, replica),
                    items: vec![KeyValue::new("FileName", format!("n{i}").into_bytes())],
                },
            }
        })
        .collect()
}

fn apply(op: &Move) -> WriteRequest {
    WriteRequest {
        tree: tree("t"),
        op: WriteOp::Apply { op: op.clone() },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submitters_build_the_same_tree_as_one() {
    let ops = replicated_ops(400, 0x5eed);
    let reference = Forest::in_memory(ForestOptions::default()).unwrap();
    for op in &ops {
        reference
            .write_batch(&[apply(op)])
            .unwrap()
            .results
            .pop()
            .unwrap()
            .unwrap();
    }

    let forest = Arc::new(Forest::in_memory(ForestOptions::default()).unwrap());
    let env = arbor::system::system_env();
    let batcher = Arc::new(Batcher::start(
        forest.clone(),
        env,
        16,
        Duration::from_millis(1),
        1000,
    ));
    let submitters: Vec<_> = (0..4)
        .map(|k| {
            // Each submitter takes every fourth op, in reverse: arrival order
            // differs from timestamp order.
            let share: Vec<Move> = ops.iter().skip(k).step_by(4).rev().cloned().collect();
            let batcher = batcher.clone();
            tokio::spawn(async move {
                for op in share {
                    batcher.submit(apply(&op)).await.unwrap();
                }
            })
        })
        .collect();
    for s in submitters {
        s.await.unwrap();
    }
    assert!(batcher.stats().batches < 400, "writes were grouped");
    assert_eq!(
        forest.dump(&tree("t")).unwrap(),
        reference.dump(&tree("t")).unwrap()
    );
    forest.check_invariants(&tree("t")).unwrap();
}

/// With a write-ahead log, a checkpoint that falls due (asked for, after
/// `pilorama.checkpoint_bytes` of log, or once the interval passed) is not
/// made by a batch's commit, which its callers wait for, but between
/// batches; it covers every record written before it.
#[tokio::test(start_paused = true)]
async fn a_due_checkpoint_is_made_between_batches() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = ForestOptions::default();
    options.wal.checkpoint_bytes = 1;
    let forest = Arc::new(Forest::open(&dir.path().join("forest.db"), options).unwrap());
    assert!(forest.has_wal());
    let env = test_env();
    let interval = Duration::from_secs(60);
    let commits = checkpointing(
        forest.clone(),
        env.clock.clone(),
        interval,
        arbor::metrics::latency_histogram(),
    );
    let between = commits.between.clone().expect("work between batches");
    let opened = forest.wal_stats().checkpoints;
    assert!(between().is_none(), "nothing written, nothing due");

    // Past checkpoint_bytes: the commit logs the batch, the checkpoint
    // waits for the work between batches.
    forest.request_checkpoint();
    (commits.commit)(&[add("a")]).unwrap();
    let logged = forest.wal_stats();
    assert_eq!((logged.records, logged.checkpoints), (1, opened));
    assert!(forest.checkpoint_due());
    assert!(matches!(between(), Some(Ok(()))));
    assert_eq!(forest.wal_stats().checkpoints, opened + 1);
    assert_eq!(forest.wal_bytes_since_checkpoint(), 0);
    assert!(!forest.checkpoint_due(), "the request was answered too");
    assert!(between().is_none());

    // By time alone: with a threshold no batch reaches, the interval.
    drop(commits);
    drop(between);
    let forest = {
        let forest = Arc::into_inner(forest).expect("the only owner");
        forest.checkpoint().unwrap();
        drop(forest);
        let mut options = ForestOptions::default();
        options.wal.checkpoint_bytes = u64::MAX;
        Arc::new(Forest::open(&dir.path().join("forest.db"), options).unwrap())
    };
    let commits = checkpointing(
        forest.clone(),
        env.clock.clone(),
        interval,
        arbor::metrics::latency_histogram(),
    );
    let between = commits.between.clone().unwrap();
    let before = forest.wal_stats().checkpoints;
    (commits.commit)(&[add("b")]).unwrap();
    assert!(between().is_none(), "the interval has not passed");
    tokio::time::advance(interval).await;
    (commits.commit)(&[add("c")]).unwrap();
    assert_eq!(forest.wal_stats().checkpoints, before, "not in the commit");
    assert!(matches!(between(), Some(Ok(()))));
    assert_eq!(forest.wal_stats().checkpoints, before + 1);
    assert_eq!(forest.wal_bytes_since_checkpoint(), 0);
    assert_eq!(forest.dump(&tree("t")).unwrap().log.len(), 3);
}
