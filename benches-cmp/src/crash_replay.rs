//! `--crash-replay`: how long a forest takes to open after a crash, on
//! real files. A child process (this binary again) adds `--ops` objects by
//! path in batches of `--batch` through the write-ahead log, asking for a
//! checkpoint every `pilorama.checkpoint_interval` as the service's
//! batcher does, then aborts: no destructor runs, so redb keeps only its
//! last checkpoint and the log holds the batches after it. The parent then
//! times redb's own recovery of the file, then the forest's open (the log's
//! replay and a checkpoint), and prints what it replayed.

use crate::workload::Object;
use arbor::batcher::checkpointing_commit;
use arbor::forest::{Forest, ForestOptions};
use arbor::system::SystemClock;
use arbor::types::{ContainerId, TreeKey};
use std::sync::Arc;
use std::time::Instant;

const CHILD: &str = "ARBOR_CRASH_REPLAY_CHILD";

/// In the child: write, then abort. Never returns when it is the child.
pub fn child(objects: &[Object], batch: usize) {
    let Ok(path) = std::env::var(CHILD) else {
        return;
    };
    let forest = Arc::new(Forest::open(path.as_ref(), ForestOptions::default()).expect("open"));
    let commit = checkpointing_commit(
        forest.clone(),
        Arc::new(SystemClock::new()),
        arbor::config::PiloramaConfig::default().checkpoint_interval,
        arbor::metrics::latency_histogram(),
    );
    let tree = TreeKey::new(ContainerId([0xab; 32]), "bench");
    let requests: Vec<_> = objects
        .iter()
        .map(|o| crate::arbor_side::request(&tree, o))
        .collect();
    let started = Instant::now();
    for chunk in requests.chunks(batch) {
        commit(chunk).expect("batch commits");
    }
    let stats = forest.wal_stats();
    println!(
        "child: {} objects in {:.1} s, {} log records, {} checkpoints; aborting",
        requests.len(),
        started.elapsed().as_secs_f64(),
        stats.records,
        stats.checkpoints
    );
    std::process::abort();
}

/// In the parent: run the child, then time the open.
pub fn run(ops: usize, batch: usize) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("crash.redb");
    let status = std::process::Command::new(std::env::current_exe().expect("this binary"))
        .args(std::env::args().skip(1))
        .env(CHILD, &path)
        .status()
        .expect("child runs");
    assert!(!status.success(), "the child aborts");
    // redb's own recovery first (a database not closed cleanly is checked
    // and its allocator state rebuilt), then the forest's open on a clean
    // file: the log's replay and its checkpoint.
    let started = Instant::now();
    drop(redb::Database::create(&path).expect("redb opens after the crash"));
    let redb_recovery = started.elapsed();
    let started = Instant::now();
    let forest = Forest::open(&path, ForestOptions::default()).expect("open after the crash");
    let elapsed = started.elapsed();
    let stats = forest.wal_stats();
    let tree = TreeKey::new(ContainerId([0xab; 32]), "bench");
    let nodes = forest.next_height(&tree).expect("tree");
    println!(
        "crash replay: {ops} objects, batch {batch}: redb's recovery took {:.3} s, then the \
         forest's open {:.3} s, replaying {} records (about {} objects); the log holds {} ops",
        redb_recovery.as_secs_f64(),
        elapsed.as_secs_f64(),
        stats.replayed,
        stats.replayed as usize * batch,
        nodes
    );
}
