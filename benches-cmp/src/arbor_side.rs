//! Arbor's forest as the service commits it: one `write_batch` (one redb
//! transaction, one fsync when durable) per batch of AddByPath calls. The
//! non-durable run (redb's `Durability::None`) is the same work with no
//! file writes and no fsync: beside the durable one it shows what
//! durability costs.

use crate::measure::{counting_file, timed, Row};
use crate::workload::{Object, FILE_NAME};
use arbor::forest::{Forest, ForestOptions, WriteOp, WriteRequest};
use arbor::types::{ContainerId, KeyValue, TreeKey};
use std::sync::atomic::Ordering;

fn request(tree: &TreeKey, object: &Object) -> WriteRequest {
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

pub fn run(objects: &[Object], batch: usize, durable: bool) -> Row {
    let dir = tempfile::tempdir().expect("temp dir");
    let (backend, written) = counting_file(dir.path());
    let options = ForestOptions {
        durable,
        ..ForestOptions::default()
    };
    let forest = Forest::open_with_backend(backend, options).expect("forest opens");
    let tree = TreeKey::new(ContainerId([0xab; 32]), "bench");
    let requests: Vec<WriteRequest> = objects.iter().map(|o| request(&tree, o)).collect();
    written.store(0, Ordering::Relaxed);
    let mut commits = 0;
    let (elapsed, cpu) = timed(requests.len(), batch, |first, len| {
        let results = forest
            .write_batch(&requests[first..first + len])
            .expect("batch commits")
            .results;
        assert!(results.iter().all(|r| r.is_ok()), "an AddByPath failed");
        commits += 1;
    });
    Row {
        name: match durable {
            true => format!("Arbor forest, durable, batch {batch}"),
            false => format!("Arbor forest, not durable, batch {batch}"),
        },
        ops: requests.len(),
        commits,
        elapsed,
        cpu,
        written_bytes: Some(written.load(Ordering::Relaxed)),
    }
}
