//! Arbor's forest as the service commits it: one `write_batch` per batch
//! of AddByPath calls. Durable, three ways: through the write-ahead log
//! (one appended record and one fsync per batch, a durable redb commit
//! every `pilorama.checkpoint_interval` as the service's batcher asks for
//! it, and one at the end, all timed), or one durable redb transaction per
//! batch (`pilorama.wal: false`). The non-durable run (redb's
//! `Durability::None`, `pilorama.no_sync`) is the same work with no fsync:
//! beside the durable ones it shows what durability costs.

use crate::measure::{counting_file, timed, Checkpoints, Row};
use crate::workload::{Object, FILE_NAME};
use arbor::batcher::checkpointing_commit;
use arbor::forest::wal::{DirStorage, WalOptions, WalStorage};
use arbor::forest::{Forest, ForestOptions, WriteOp, WriteRequest};
use arbor::system::SystemClock;
use arbor::types::{ContainerId, KeyValue, TreeKey};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a run commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Write-ahead log, checkpoint every `pilorama.checkpoint_interval`.
    Wal,
    /// One durable redb transaction per batch.
    PerBatch,
    /// `no_sync`.
    NotDurable,
}

pub fn request(tree: &TreeKey, object: &Object) -> WriteRequest {
    WriteRequest {
        tree: tree.clone(),
        op: WriteOp::AddByPath {
            attr: FILE_NAME.into(),
            path: object.dirs.clone(),
            items: object
                .meta
                .iter()
                .map(|(k, v)| KeyValue::new(k.as_str(), v.as_str()))
                .collect(),
        },
    }
}

pub fn run(objects: &[Object], batch: usize, mode: Mode) -> Row {
    let dir = tempfile::tempdir().expect("temp dir");
    let (backend, written) = counting_file(dir.path());
    let db_syncs = backend.sync_counter();
    let defaults = arbor::config::PiloramaConfig::default();
    let options = ForestOptions {
        durable: mode != Mode::NotDurable,
        wal: WalOptions {
            enabled: mode == Mode::Wal,
            ..WalOptions::default()
        },
        ..ForestOptions::default()
    };
    let backend = std::sync::Mutex::new(Some(backend));
    let wal_dir = dir.path().join("bench.redb.wal");
    let forest = Forest::open_with_wal(
        Box::new(move || {
            let backend = backend.lock().unwrap().take().expect("opened once");
            Ok(redb::Builder::new().create_with_backend(backend)?)
        }),
        Box::new(move || {
            let storage = DirStorage::open(&wal_dir).expect("log directory");
            Ok(Box::new(storage) as Box<dyn WalStorage>)
        }),
        options,
    )
    .expect("forest opens");
    let forest = Arc::new(forest);
    let commit = checkpointing_commit(
        forest.clone(),
        Arc::new(SystemClock::new()),
        defaults.checkpoint_interval,
        arbor::metrics::latency_histogram(),
    );
    let tree = TreeKey::new(ContainerId([0xab; 32]), "bench");
    let requests: Vec<WriteRequest> = objects.iter().map(|o| request(&tree, o)).collect();
    written.store(0, Ordering::Relaxed);
    db_syncs.store(0, Ordering::Relaxed);
    let start = forest.wal_stats();
    let mut commits = 0;
    let mut checkpoint_time = Duration::ZERO;
    let (elapsed, cpu) = timed(requests.len(), batch, |first, len| {
        let before = forest.wal_stats().checkpoints;
        let began = Instant::now();
        let results = commit(&requests[first..first + len])
            .expect("batch commits")
            .results;
        if forest.wal_stats().checkpoints > before {
            checkpoint_time += began.elapsed();
        }
        assert!(results.iter().all(|r| r.is_ok()), "an AddByPath failed");
        commits += 1;
        if first + len == requests.len() && mode == Mode::Wal {
            // Everything on the log is in the database, durably.
            let began = Instant::now();
            forest.checkpoint().expect("final checkpoint");
            checkpoint_time += began.elapsed();
        }
    });
    let log = forest.wal_stats();
    // Records plus the zeros each new segment was filled with.
    let log_bytes = log.bytes - start.bytes + log.preallocated - start.preallocated;
    let syncs = db_syncs.load(Ordering::Relaxed) + log.syncs - start.syncs;
    Row {
        name: match mode {
            Mode::Wal => format!("Arbor forest, durable (log), batch {batch}"),
            Mode::PerBatch => format!("Arbor forest, durable per batch, batch {batch}"),
            Mode::NotDurable => format!("Arbor forest, not durable, batch {batch}"),
        },
        ops: requests.len(),
        commits,
        elapsed,
        cpu,
        written_bytes: Some(written.load(Ordering::Relaxed) + log_bytes),
        syncs: Some(syncs),
        checkpoints: (mode == Mode::Wal).then_some(Checkpoints {
            count: log.checkpoints - start.checkpoints,
            time: checkpoint_time,
        }),
    }
}
