//! A running service reads its storage only through the runtime's blocking
//! pool (`Runtime::run_blocking`), never on an async worker: redb's reads
//! block on the disk, and a worker stalled on one stops serving requests.
//!
//! The forests sit on a backend that notes every read made outside
//! `run_blocking` (a thread-local mark set by the runtime below), with a
//! page cache too small to hide reads. The requests, pushes, pulls and the
//! drop below each read the log or the tree list.

mod service_support;

use arbor::config::ContainerConfig;
use arbor::forest::Forest;
use arbor::proto::{Request, Response};
use arbor::runtime::{BoxFuture, Env, Runtime};
use arbor::service::Service;
use arbor::system::TokioRuntime;
use arbor::{Caller, KeyValue, ATTR_FILE_NAME, ROOT};
use redb::backends::InMemoryBackend;
use redb::StorageBackend;
use service_support::*;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

thread_local! {
    /// Set while this thread runs work handed to `run_blocking`.
    static IN_BLOCKING: Cell<bool> = const { Cell::new(false) };
}

/// Tokio's runtime, marking the threads that run blocking work.
struct MarkingRuntime(TokioRuntime);

impl Runtime for MarkingRuntime {
    fn spawn(&self, name: &'static str, task: BoxFuture<'static, ()>) {
        self.0.spawn(name, task);
    }

    fn run_blocking(&self, work: Box<dyn FnOnce() + Send + 'static>) -> BoxFuture<'static, ()> {
        self.0.run_blocking(Box::new(move || {
            IN_BLOCKING.with(|mark| mark.set(true));
            work();
            IN_BLOCKING.with(|mark| mark.set(false));
        }))
    }

    fn log_epoch_fresh(&self) -> u64 {
        self.0.log_epoch_fresh()
    }
}

/// Reads seen while armed: how many ran on the blocking pool, and where
/// those outside it came from.
#[derive(Default)]
struct Watch {
    armed: AtomicBool,
    inside: AtomicU64,
    outside: Mutex<Vec<String>>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watch")
    }
}

#[derive(Debug)]
struct WatchedBackend {
    inner: InMemoryBackend,
    watch: Arc<Watch>,
}

impl StorageBackend for WatchedBackend {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let watch = &self.watch;
        let armed = watch.armed.load(Ordering::SeqCst);
        if armed && IN_BLOCKING.with(Cell::get) {
            watch.inside.fetch_add(1, Ordering::SeqCst);
        } else if armed {
            // The engine's frames above the forest name the read's site.
            let trace = std::backtrace::Backtrace::force_capture().to_string();
            let site: Vec<&str> = trace
                .lines()
                .map(str::trim)
                .filter(|l| l.starts_with("at ./src/") && !l.starts_with("at ./src/forest/"))
                .take(3)
                .collect();
            watch.outside.lock().unwrap().push(site.join(" <- "));
        }
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> std::io::Result<()> {
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.inner.write(offset, data)
    }
}

fn file(name: &str) -> Vec<KeyValue> {
    vec![KeyValue::new(ATTR_FILE_NAME, name.as_bytes())]
}

async fn ask(service: &Service, request: Request) -> Response {
    service.handle(&Caller::Anonymous, request).await
}

#[tokio::test(start_paused = true)]
async fn a_running_service_reads_storage_only_on_the_blocking_pool() {
    let net = LocalNet::new();
    let watch = Arc::new(Watch::default());
    let mut configs = cluster_configs(2);
    for config in &mut configs {
        // Listed on both, so node 2 pulls trees it does not hold yet.
        (config.node.containers).push(ContainerConfig::new(cid(), vec![1, 2]));
        // Windows of one op: pushes read the log.
        config.limits.push_window_ops = 1;
    }
    let mut nodes = Vec::new();
    for config in configs {
        let mut options = config.forest_options();
        options.cache_bytes = 0; // every page read reaches the backend
        let backend = WatchedBackend {
            inner: InMemoryBackend::new(),
            watch: watch.clone(),
        };
        let forest = Forest::open_with_backend(backend, options).unwrap();
        let env = Env {
            runtime: Arc::new(MarkingRuntime(TokioRuntime::default())),
            ..test_env()
        };
        let id = config.node.replica_id;
        let service = Service::start(config, Arc::new(forest), env, net.transport(id)).unwrap();
        net.attach(id, service.clone());
        nodes.push(service);
    }
    watch.armed.store(true, Ordering::SeqCst);

    // Writes, pushed to node 2; then some only pulls carry there.
    let (t, u) = (tree("t"), tree("u"));
    for i in 0..20 {
        let request = Request::Add {
            tree: if i % 2 == 0 { t.clone() } else { u.clone() },
            parent: ROOT,
            items: file(&format!("n{i}")),
        };
        assert!(matches!(
            ask(&nodes[0], request).await,
            Response::Added { .. }
        ));
    }
    net.cut(1, 2, true);
    for i in 0..5 {
        let request = Request::Add {
            tree: t.clone(),
            parent: ROOT,
            items: file(&format!("late{i}")),
        };
        assert!(matches!(
            ask(&nodes[0], request).await,
            Response::Added { .. }
        ));
    }
    nodes[1].sync_now().await;
    net.cut(1, 2, false);
    // Reads of every kind.
    for node in &nodes {
        let answer = ask(
            node,
            Request::GetSubTree {
                tree: t.clone(),
                root: ROOT,
                depth: 2,
            },
        )
        .await;
        assert!(matches!(answer, Response::Nodes(_)), "{answer:?}");
        let listed = ask(node, Request::TreeList { cid: cid() }).await;
        assert!(matches!(listed, Response::Trees(ref names) if names.len() == 2));
    }
    let page = ask(
        &nodes[1],
        Request::GetOpLog {
            tree: t.clone(),
            from_height: 0,
            limit: 100,
        },
    )
    .await;
    assert!(matches!(page, Response::OpLog { .. }), "{page:?}");
    // A drop of every tree of the container lists them first.
    let dropped = ask(
        &nodes[0],
        Request::Drop {
            cid: cid(),
            tree: None,
        },
    )
    .await;
    assert!(matches!(dropped, Response::Done), "{dropped:?}");
    // Sweeps and pulls go on over time.
    tokio::time::sleep(Duration::from_secs(5 * 60)).await;
    nodes[1].sync_now().await;
    watch.armed.store(false, Ordering::SeqCst);

    // The watch sees the reads (the cache hides none of them)...
    assert!(watch.inside.load(Ordering::SeqCst) > 0);
    // ...and none ran on an async worker.
    let outside = watch.outside.lock().unwrap().clone();
    assert!(
        outside.is_empty(),
        "{} storage reads ran on async workers, first sites:\n{}",
        outside.len(),
        outside
            .iter()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
