//! Recovery from a poisoned database: after an I/O error redb refuses every
//! later write ("Previous I/O error occurred") until the database is
//! reopened. The forest reopens from its backend factory, keeping every
//! committed op, and the service does so by itself after a storage error.

mod service_support;

use arbor::forest::{Forest, ForestOptions, WriteOutcome};
use arbor::proto::{Request, Response};
use arbor::service::Service;
use arbor::Caller;
use arbor::{Error, KeyValue, ROOT};
use redb::StorageBackend;
use service_support::{
    add_to_root as add, cid, cluster_configs, dump, eventually, list_container, memory_forest,
    start_node, test_env, tree, LocalNet,
};
use std::io::Error as BackendIoError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Bytes that outlive every backend opened on them, and a switch that makes
/// writes and syncs fail (a disk having a bad moment).
#[derive(Clone, Default)]
struct SharedDisk {
    bytes: Arc<Mutex<Vec<u8>>>,
    failing: Arc<AtomicBool>,
    /// Syncs fail although every write already reached the bytes: the
    /// write is durable and only its report failed.
    sync_failing: Arc<AtomicBool>,
}

impl SharedDisk {
    fn factory(&self) -> impl Fn() -> arbor::Result<SharedBackend> + Send + Sync + 'static {
        let disk = self.clone();
        move || Ok(SharedBackend(disk.clone()))
    }

    fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    fn set_sync_failing(&self, failing: bool) {
        self.sync_failing.store(failing, Ordering::SeqCst);
    }
}

#[derive(Debug)]
struct SharedBackend(SharedDisk);

impl std::fmt::Debug for SharedDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedDisk")
    }
}

impl SharedBackend {
    fn check(&self) -> Result<(), BackendIoError> {
        if self.0.failing.load(Ordering::SeqCst) {
            Err(BackendIoError::other("injected I/O error"))
        } else {
            Ok(())
        }
    }
}

impl StorageBackend for SharedBackend {
    fn len(&self) -> Result<u64, BackendIoError> {
        Ok(self.0.bytes.lock().unwrap().len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendIoError> {
        let bytes = self.0.bytes.lock().unwrap();
        let start = offset as usize;
        let source = bytes
            .get(start..start + out.len())
            .ok_or_else(|| BackendIoError::other("read past the end"))?;
        out.copy_from_slice(source);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), BackendIoError> {
        self.check()?;
        self.0.bytes.lock().unwrap().resize(len as usize, 0);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), BackendIoError> {
        self.check()?;
        if self.0.sync_failing.load(Ordering::SeqCst) {
            return Err(BackendIoError::other("injected sync error"));
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendIoError> {
        self.check()?;
        let mut bytes = self.0.bytes.lock().unwrap();
        let end = offset as usize + data.len();
        if bytes.len() < end {
            bytes.resize(end, 0);
        }
        bytes[offset as usize..end].copy_from_slice(data);
        Ok(())
    }
}

fn write_one(forest: &Forest, name: &str) -> arbor::Result<WriteOutcome> {
    let mut results = forest.write_batch(&[add(name)])?.results;
    results.pop().expect("one result")
}

#[test]
fn forest_reopen_clears_the_poison_and_keeps_committed_ops() {
    let disk = SharedDisk::default();
    let forest =
        Forest::open_with_backend_factory(disk.factory(), ForestOptions::default()).expect("open");
    assert!(forest.reopenable());
    for i in 0..5 {
        write_one(&forest, &format!("kept-{i}")).expect("healthy write");
    }
    let before = forest.dump(&tree("t")).expect("dump");

    disk.set_failing(true);
    assert!(matches!(write_one(&forest, "lost"), Err(Error::Storage(_))));
    disk.set_failing(false);
    // The disk is fine again, but redb remembers the I/O error.
    assert!(
        matches!(write_one(&forest, "still refused"), Err(Error::Storage(_))),
        "redb accepted a write after an I/O error without a reopen"
    );

    forest.reopen().expect("reopen");
    assert_eq!(forest.dump(&tree("t")).expect("dump"), before);
    write_one(&forest, "after").expect("write after reopen");
    assert_eq!(forest.dump(&tree("t")).unwrap().log.len(), 6);
}

#[test]
fn a_failed_reopen_leaves_the_forest_closed_until_one_succeeds() {
    let disk = SharedDisk::default();
    let forest =
        Forest::open_with_backend_factory(disk.factory(), ForestOptions::default()).expect("open");
    write_one(&forest, "kept").expect("healthy write");
    disk.set_failing(true);
    assert!(forest.reopen().is_err(), "reopen wrote nothing?");
    assert!(matches!(forest.dump(&tree("t")), Err(Error::Storage(_))));
    assert!(matches!(write_one(&forest, "x"), Err(Error::Storage(_))));
    disk.set_failing(false);
    forest.reopen().expect("reopen");
    assert_eq!(forest.dump(&tree("t")).unwrap().log.len(), 1);
}

#[test]
fn a_forest_without_a_factory_refuses_to_reopen() {
    let forest = Forest::in_memory(ForestOptions::default()).unwrap();
    assert!(!forest.reopenable());
    assert!(matches!(forest.reopen(), Err(Error::Storage(_))));
    // Still open and usable.
    write_one(&forest, "x").expect("write");
}

async fn add_via(service: &Service, name: &str) -> Response {
    service
        .handle(
            &Caller::Anonymous,
            Request::Add {
                tree: tree("t"),
                parent: ROOT,
                items: vec![KeyValue::new("FileName", name.as_bytes())],
            },
        )
        .await
}

#[tokio::test(start_paused = true)]
async fn service_reopens_its_database_after_an_io_error() {
    let disk = SharedDisk::default();
    let mut config = cluster_configs(1).remove(0);
    config.pilorama.reopen_attempts_max = 5;
    config.pilorama.reopen_backoff_max = Duration::from_millis(320);
    let forest =
        Forest::open_with_backend_factory(disk.factory(), config.forest_options()).expect("open");
    let net = LocalNet::new();
    let service = Service::start(config, Arc::new(forest), test_env(), net.transport(1)).unwrap();

    let Response::Added { node: kept } = add_via(&service, "kept").await else {
        panic!("healthy write failed");
    };

    // The disk fails while reopens are tried: callers get a typed storage
    // error, and the bounded retries run out.
    disk.set_failing(true);
    let failed = add_via(&service, "lost").await;
    assert!(
        matches!(failed, Response::Error(Error::Storage(_))),
        "{failed:?}"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(service.stats().reopens, 0);
    assert_eq!(service.stats().pending_writes, 0);

    // The disk recovers. The next storage error (redb still refuses, or
    // the database is closed after a failed reopen) starts a new round.
    disk.set_failing(false);
    let refused = add_via(&service, "refused").await;
    assert!(
        matches!(refused, Response::Error(Error::Storage(_))),
        "{refused:?}"
    );
    eventually(
        "the service reopened its database",
        Duration::from_secs(10),
        || service.stats().reopens >= 1,
    )
    .await;
    let after = add_via(&service, "after").await;
    assert!(matches!(after, Response::Added { .. }), "{after:?}");

    let dump = service.forest().dump(&tree("t")).unwrap();
    let ids: Vec<u64> = dump.nodes.iter().map(|n| n.id).collect();
    assert!(ids.contains(&kept), "a committed node was lost: {ids:?}");
    assert_eq!(dump.log.len(), 2, "only `kept` and `after` were stored");
    service.shutdown();
}

/// Regression (sync-heavy seed 836): a Drop whose commit reported a sync
/// error had in fact reached the disk, but the service kept the tree's
/// in-memory pull cursors, since it forgot them only after a successful
/// drop. After the reopen the tree was gone while the cursor still stood
/// past the peer's ops, so the next pull skipped them for good.
#[tokio::test(start_paused = true)]
async fn a_drop_whose_outcome_is_unknown_forgets_the_pull_cursors() {
    let disk = SharedDisk::default();
    let mut configs = cluster_configs(2);
    // Listed, so that sync looks for the tree after this node dropped it.
    list_container(&mut configs, cid(), vec![1, 2]);
    let peer_config = configs.remove(1);
    let mut config = configs.remove(0);
    config.pilorama.reopen_attempts_max = 5;
    let forest =
        Forest::open_with_backend_factory(disk.factory(), config.forest_options()).expect("open");
    let net = LocalNet::new();
    let peer = start_node(&net, peer_config.clone(), memory_forest(&peer_config));
    let node = start_node(&net, config, forest);
    for i in 0..5 {
        let added = add_via(&peer, &format!("peer-{i}")).await;
        assert!(matches!(added, Response::Added { .. }), "{added:?}");
    }
    node.sync_now().await;
    assert_eq!(dump(&node, &tree("t")).map(|d| d.log.len()), Some(5));

    // The drop reaches the disk; only the sync's report fails.
    disk.set_sync_failing(true);
    let drop = Request::Drop {
        cid: cid(),
        tree: Some("t".into()),
    };
    let dropped = node.handle(&Caller::Anonymous, drop).await;
    assert!(
        matches!(dropped, Response::Error(Error::Storage(_))),
        "{dropped:?}"
    );
    disk.set_sync_failing(false);
    eventually(
        "the node reopened its database",
        Duration::from_secs(10),
        || node.stats().reopens >= 1,
    )
    .await;
    assert!(
        dump(&node, &tree("t")).is_none(),
        "the drop did not reach the disk, so this test proves nothing"
    );

    // The peer pushed everything long ago: only a pull brings it back.
    node.sync_now().await;
    let log = dump(&node, &tree("t")).map(|d| d.log.len());
    assert_eq!(log, Some(5), "the pull skipped the peer's ops");
    node.shutdown();
    peer.shutdown();
}
