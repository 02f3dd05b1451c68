//! The metrics endpoint in process: a write and a read show up in the
//! latency histograms by kind and in the counters; the endpoint serves at
//! most `METRICS_CONNECTIONS_MAX` connections at once and closes one that
//! sends nothing within its timeout.

use arbor::config::{Config, METRICS_CONNECTIONS_MAX};
use arbor::forest::Forest;
use arbor::metrics::{self, Sources};
use arbor::proto::{Request, Response};
use arbor::service::Service;
use arbor::system::system_env;
use arbor::tcp::{Connection, Server, ServerOptions, TcpTransport};
use arbor::{ContainerId, KeyValue, TreeKey, ATTR_FILE_NAME};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn get(address: &str) -> String {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    let mut page = String::new();
    stream.read_to_string(&mut page).await.unwrap();
    page
}

/// A node on `forest` with its TCP server and metrics endpoint (closing
/// silent connections after `timeout`); gives the service, a connection
/// to the server and the endpoint's address.
async fn node_with_metrics(
    config: &Config,
    forest: Forest,
    timeout: Duration,
) -> (Arc<Service>, Connection, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let transport = Arc::new(TcpTransport::new(config, None));
    let service =
        Service::start(config.clone(), Arc::new(forest), system_env(), transport).unwrap();
    let server = Server::new(
        listener,
        service.clone(),
        ServerOptions::from_config(config),
        None,
    );
    let handle = server.handle();
    tokio::spawn(server.run());
    let connection = Connection::connect(&address, Duration::from_secs(2), 4 << 20)
        .await
        .unwrap();
    let metrics_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_address = metrics_listener.local_addr().unwrap().to_string();
    let sources = Sources {
        service: service.clone(),
        tcp: handle,
        grpc: None,
        certificates: Vec::new(),
    };
    let registry = Arc::new(metrics::registry(sources));
    tokio::spawn(metrics::serve(metrics_listener, registry, timeout));
    (service, connection, metrics_address)
}

fn add(tree: &TreeKey, name: &str) -> Request {
    Request::Add {
        tree: tree.clone(),
        parent: 0,
        items: vec![KeyValue::new(ATTR_FILE_NAME, name.as_bytes())],
    }
}

/// The value of the sample `name` on `page`.
fn sample(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing:\n{page}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_commits_are_measured_and_the_endpoint_is_bounded() {
    let config = Config::default_for_test(1);
    let forest = Forest::in_memory(config.forest_options()).unwrap();
    let timeout = Duration::from_secs(2);
    let (_service, mut connection, metrics_address) =
        node_with_metrics(&config, forest, timeout).await;
    let tree = TreeKey::new(ContainerId([7; 32]), "t");
    assert!(matches!(
        connection.call(&add(&tree, "a")).await.unwrap(),
        Response::Added { .. }
    ));
    let list = Request::TreeList { cid: tree.cid };
    assert!(matches!(
        connection.call(&list).await.unwrap(),
        Response::Trees(_)
    ));

    let page = get(&metrics_address).await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    for line in [
        "arbor_request_seconds_count{kind=\"Add\"} 1",
        "arbor_request_seconds_count{kind=\"TreeList\"} 1",
        "arbor_commit_seconds_count 1",
        "arbor_writes_committed_total 1",
        "arbor_batches_committed_total 1",
        "arbor_tcp_connections_accepted_total 1",
        "arbor_tcp_connections_open 1",
    ] {
        assert!(page.lines().any(|l| l == line), "{line} missing:\n{page}");
    }
    assert!(!page.contains("arbor_grpc_"), "no gRPC port here:\n{page}");
    // An in-memory forest has no log.
    assert_eq!(sample(&page, "arbor_wal_records_total"), 0.0);
    assert_eq!(sample(&page, "arbor_checkpoint_seconds_count"), 0.0);

    // Every slot held by a connection that sends nothing: the next
    // scrape waits for a slot, and gets one when the endpoint closes a
    // silent connection at its timeout.
    let mut silent = Vec::new();
    for _ in 0..METRICS_CONNECTIONS_MAX {
        silent.push(TcpStream::connect(&metrics_address).await.unwrap());
    }
    let started = tokio::time::Instant::now();
    let page = tokio::time::timeout(timeout * 5, get(&metrics_address))
        .await
        .expect("answered once a silent connection timed out");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(
        started.elapsed() >= timeout / 2,
        "answered beside {METRICS_CONNECTIONS_MAX} held connections"
    );
    let mut closed = 0;
    for mut stream in silent {
        let mut byte = [0u8; 1];
        if matches!(stream.read(&mut byte).await, Ok(0) | Err(_)) {
            closed += 1;
        }
    }
    assert_eq!(
        closed, METRICS_CONNECTIONS_MAX,
        "silent connections closed at the timeout"
    );
}

/// A durable node's write-ahead log: each batch appends a record, a
/// checkpoint commits durably between batches (timed in
/// `arbor_checkpoint_seconds`) and covers every record before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_ahead_log_and_its_checkpoints_are_measured() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default_for_test(1);
    config.pilorama.no_sync = false;
    config.pilorama.checkpoint_interval = Duration::from_secs(3600);
    config.pilorama.path = dir.path().join("node.db");
    let forest = Forest::open(&config.pilorama.path, config.forest_options()).unwrap();
    assert!(forest.has_wal());
    let (service, mut connection, metrics_address) =
        node_with_metrics(&config, forest, Duration::from_secs(2)).await;
    // Opening the node may checkpoint (outside the batcher, untimed).
    let opened = service.stats().wal.checkpoints;
    let tree = TreeKey::new(ContainerId([7; 32]), "t");
    for name in ["a", "b"] {
        let answer = connection.call(&add(&tree, name)).await.unwrap();
        assert!(matches!(answer, Response::Added { .. }), "{answer:?}");
    }
    let page = get(&metrics_address).await;
    assert_eq!(sample(&page, "arbor_wal_records_total"), 2.0);
    assert!(sample(&page, "arbor_wal_bytes_total") > 0.0);
    assert!(
        sample(&page, "arbor_wal_syncs_total") >= 2.0,
        "a sync a record"
    );
    assert_eq!(sample(&page, "arbor_checkpoints_total"), opened as f64);
    let wal = service.stats().wal;
    assert!(wal.segments_created >= 1, "{wal:?}");
    for (name, value) in [
        ("arbor_wal_segments_created_total", wal.segments_created),
        ("arbor_wal_segments_reused_total", wal.segments_reused),
        ("arbor_wal_segments_retired_total", wal.segments_retired),
        ("arbor_wal_segments_removed_total", wal.segments_removed),
    ] {
        assert_eq!(sample(&page, name), value as f64, "{name}");
    }
    assert_eq!(sample(&page, "arbor_checkpoint_seconds_count"), 0.0);
    let uncovered = sample(&page, "arbor_wal_bytes_since_checkpoint");
    assert_eq!(uncovered, sample(&page, "arbor_wal_bytes_total"));

    // The checkpoint asked for runs between batches, once the next batch
    // is answered: that batch goes to the log like the others, and the
    // batch after it is committed after the checkpoint.
    service.forest().request_checkpoint();
    let answer = connection.call(&add(&tree, "c")).await.unwrap();
    assert!(matches!(answer, Response::Added { .. }), "{answer:?}");
    let logged = service.stats().wal;
    assert_eq!(logged.records, 3);
    let answer = connection.call(&add(&tree, "d")).await.unwrap();
    assert!(matches!(answer, Response::Added { .. }), "{answer:?}");
    let page = get(&metrics_address).await;
    assert_eq!(
        sample(&page, "arbor_checkpoints_total"),
        opened as f64 + 1.0
    );
    assert_eq!(sample(&page, "arbor_checkpoint_seconds_count"), 1.0);
    assert_eq!(sample(&page, "arbor_wal_records_total"), 4.0);
    // The checkpoint covered the first three records; only the fourth is
    // left for a reopen to replay.
    assert_eq!(
        sample(&page, "arbor_wal_bytes_since_checkpoint"),
        sample(&page, "arbor_wal_bytes_total") - logged.bytes as f64
    );
    assert_eq!(sample(&page, "arbor_commit_seconds_count"), 4.0);
    let stats = service.stats();
    assert_eq!((stats.wal.records, stats.wal.checkpoints), (4, opened + 1));
}
