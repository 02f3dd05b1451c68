//! Three real `arbor node` processes on 127.0.0.1, plaintext and over
//! mutual TLS with certificates from `arbor certs`: writes through each,
//! one node killed and restarted mid-way, and all three end with identical
//! trees and logs. Then the operations side of one process: SIGTERM
//! commits what was acknowledged and exits 0; a bad configuration fails
//! before any file exists. Children are killed and temp dirs removed even
//! on failure.

use arbor::config::{Config, PeerConfig};
use arbor::proto::{Request, Response};
use arbor::tcp::{Connection, Dialer};
use arbor::tls::{PemFiles, TlsContext};
use arbor::{ContainerId, KeyValue, Move, NodeInfo, TreeKey, ATTR_FILE_NAME, ROOT};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Bounds every wait; a healthy run needs a small fraction of it.
const PATIENCE: Duration = Duration::from_secs(60);
const MAX_MESSAGE: usize = 4 << 20;

struct Node {
    config_path: PathBuf,
    address: String,
    child: Option<Child>,
}

/// Owns the children: dropping it (also while unwinding) kills them all.
struct Cluster {
    nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }
}

impl Node {
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process and waits until it reports its listening address.
    fn start(&mut self) {
        assert!(self.child.is_none());
        let mut child = Command::new(env!("CARGO_BIN_EXE_arbor"))
            .args(["node", "--config"])
            .arg(&self.config_path)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn arbor node");
        let stdout = child.stdout.take().unwrap();
        self.child = Some(child);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = rx
            .recv_timeout(PATIENCE)
            .expect("node never reported its address");
        assert!(
            line.ends_with(&self.address),
            "unexpected first line {line:?}"
        );
    }
}

/// A port nobody listens on right now (bind to 0, read it, release it).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `arbor` with `args`; panics with its stderr unless it succeeds.
fn arbor(args: &[&str]) {
    let output = Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(args)
        .output()
        .unwrap();
    assert!(output.status.success(), "arbor {args:?}: {output:?}");
}

/// A CA, nodes 1..=count and client `test` in `dir`, made by `arbor certs`.
fn make_certs(dir: &Path, count: u16) {
    let dir = dir.to_str().unwrap();
    arbor(&["certs", "create-ca", "--dir", dir]);
    for id in 1..=count {
        let id = id.to_string();
        arbor(&["certs", "create-node", "--dir", dir, "--replica-id", &id]);
    }
    arbor(&["certs", "create-client", "--dir", dir, "--name", "test"]);
}

/// How the test reaches the nodes: plaintext, or as client `test`.
fn client_dialer(certs: Option<&Path>) -> Dialer {
    let mut dialer = Dialer::plaintext(Duration::from_secs(2), MAX_MESSAGE);
    if let Some(dir) = certs {
        let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
        let (ca, cert, key) = (
            read("ca.crt"),
            read("client-test.crt"),
            read("client-test.key"),
        );
        let pem = PemFiles {
            ca: &ca,
            cert: &cert,
            key: &key,
        };
        dialer.tls = Some(Arc::new(TlsContext::from_pem(&pem).unwrap()));
        dialer.hello = true;
    }
    dialer
}

/// `node.tls` of replica `id` with the certificates in `certs`.
fn tls_yaml(certs: Option<&Path>, id: u16) -> String {
    let Some(dir) = certs else {
        return String::new();
    };
    let file = |name: String| dir.join(name).display().to_string();
    format!(
        "  tls:\n    ca: {}\n    cert: {}\n    key: {}\n",
        file("ca.crt".into()),
        file(format!("node-{id}.crt")),
        file(format!("node-{id}.key")),
    )
}

fn write_configs(dir: &Path, count: u16, certs: Option<&Path>) -> Vec<Node> {
    let ports: Vec<u16> = (0..count).map(|_| free_port()).collect();
    let address = |i: u16| format!("127.0.0.1:{}", ports[i as usize - 1]);
    (1..=count)
        .map(|id| {
            let mut config = Config::default_for_test(id);
            config.node.listen = address(id);
            config.node.peers = (1..=count)
                .filter(|p| *p != id)
                .map(|p| PeerConfig::new(p, address(p)))
                .collect();
            let yaml = format!(
                "tree:\n  replication_timeout: 1s\n  sync_interval: 1s\n\
                 pilorama:\n  path: {db}\n\
                 node:\n  replica_id: {id}\n  listen: \"{listen}\"\n{tls}  peers:\n{peers}\
                 access:\n  anonymous: trusted\n  default:\n    owners: [test]\n",
                db = dir.join(format!("node{id}/tree.db")).display(),
                tls = tls_yaml(certs, id),
                listen = config.node.listen,
                peers = config
                    .node
                    .peers
                    .iter()
                    .map(|p| format!(
                        "    - {{ replica_id: {}, address: \"{}\" }}\n",
                        p.replica_id, p.address
                    ))
                    .collect::<String>(),
            );
            let config_path = dir.join(format!("node{id}.yaml"));
            // The file must parse to the config meant here.
            let parsed = Config::from_yaml_str(&yaml).unwrap();
            assert_eq!(parsed.node.peers, config.node.peers);
            assert_eq!(parsed.node.tls.is_some(), certs.is_some());
            assert_eq!(parsed.access.default.owners, ["test"]);
            std::fs::write(&config_path, yaml).unwrap();
            Node {
                config_path,
                address: config.node.listen,
                child: None,
            }
        })
        .collect()
}

async fn call(via: &Dialer, address: &str, request: &Request) -> arbor::Result<Response> {
    let call = async {
        let mut connection = Connection::open(address, None, via).await?;
        connection.call(request).await
    };
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .unwrap_or(Err(arbor::Error::Timeout))
}

fn tree(name: &str) -> TreeKey {
    TreeKey::new(ContainerId([0x5a; 32]), name)
}

async fn write(via: &Dialer, address: &str, tree: &TreeKey, dir: &str, file: &str) {
    let request = Request::AddByPath {
        tree: tree.clone(),
        attr: ATTR_FILE_NAME.into(),
        path: vec!["root".into(), dir.into()],
        items: vec![
            KeyValue::new(ATTR_FILE_NAME, file.as_bytes()),
            KeyValue::new("writer", address.as_bytes()),
        ],
    };
    match call(via, address, &request).await {
        Ok(Response::AddedByPath { .. }) => {}
        other => panic!("write through {address} failed: {other:?}"),
    }
}

/// The tree (every node, parents first) and the log (sorted by timestamp)
/// of one replica; `None` while it cannot answer.
async fn snapshot(
    via: &Dialer,
    address: &str,
    tree: &TreeKey,
) -> Option<(Vec<NodeInfo>, Vec<Move>)> {
    let subtree = Request::GetSubTree {
        tree: tree.clone(),
        root: ROOT,
        depth: 0,
    };
    let Ok(Response::Nodes(mut nodes)) = call(via, address, &subtree).await else {
        return None;
    };
    nodes.sort_by_key(|n| n.id);
    let mut log = Vec::new();
    let mut from_height = 0;
    loop {
        let page = Request::GetOpLog {
            tree: tree.clone(),
            from_height,
            limit: 1000,
        };
        let Ok(Response::OpLog {
            entries,
            next_height,
        }) = call(via, address, &page).await
        else {
            return None;
        };
        if entries.is_empty() {
            break;
        }
        log.extend(entries.into_iter().map(|e| e.op));
        from_height = next_height;
    }
    log.sort_by_key(|op| op.meta.time);
    Some((nodes, log))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_converge_across_a_kill_and_restart() {
    converge_across_a_kill_and_restart(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_tls_processes_converge_across_a_kill_and_restart() {
    converge_across_a_kill_and_restart(true).await;
}

async fn converge_across_a_kill_and_restart(tls: bool) {
    let dir = tempfile::tempdir().unwrap();
    let certs = tls.then(|| dir.path().join("certs"));
    if let Some(certs) = &certs {
        make_certs(certs, 3);
    }
    let via = &client_dialer(certs.as_deref());
    let nodes = write_configs(dir.path(), 3, certs.as_deref());
    let mut cluster = Cluster { nodes, _dir: dir };
    for node in &mut cluster.nodes {
        node.start();
    }
    if tls {
        // A plaintext caller gets nothing from a TLS node.
        let plain = client_dialer(None);
        let refused = call(&plain, &cluster.nodes[0].address, &Request::Healthcheck).await;
        assert!(refused.is_err(), "{refused:?}");
    }
    let addresses: Vec<String> = cluster.nodes.iter().map(|n| n.address.clone()).collect();
    let trees = [tree("a"), tree("b")];

    for (i, address) in addresses.iter().enumerate() {
        for t in &trees {
            write(via, address, t, &format!("d{i}"), "before").await;
        }
    }
    cluster.nodes[2].kill();
    for round in 0..5 {
        for address in &addresses[..2] {
            for t in &trees {
                write(via, address, t, "shared", &format!("during-{round}")).await;
            }
        }
    }
    cluster.nodes[2].start();
    for t in &trees {
        write(via, &addresses[2], t, "late", "after").await;
    }

    let deadline = Instant::now() + PATIENCE;
    for t in &trees {
        loop {
            let mut snapshots = Vec::new();
            for address in &addresses {
                snapshots.push(snapshot(via, address, t).await);
            }
            let first = snapshots[0].clone();
            // Per tree: 3 "before" + 10 "during" + 1 "after" leaves.
            let leaves = |log: &Vec<Move>| {
                log.iter()
                    .filter(|op| op.meta.get("writer").is_some())
                    .count()
            };
            let complete = first.as_ref().is_some_and(|(_, log)| leaves(log) == 14);
            if complete && snapshots.iter().all(|s| *s == first) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "replicas did not converge on {t:?}: {snapshots:#?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[test]
fn a_node_with_the_tree_disabled_exits_without_serving_or_creating_its_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("data/tree.db");
    let config_path = dir.path().join("node.yaml");
    let yaml = format!(
        "tree:\n  enabled: false\npilorama:\n  path: {}\nnode:\n  replica_id: 1\n  listen: \"127.0.0.1:{}\"\n",
        db.display(),
        free_port()
    );
    std::fs::write(&config_path, yaml).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_arbor"))
        .arg("node")
        .arg("--config")
        .arg(&config_path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("tree.enabled is false"), "{stderr}");
    assert!(!db.exists());
}

/// A lone node's config file in `dir`, with `extra` lines under `node:`.
fn lone_config(dir: &Path, db: &Path, listen: &str, extra: &str) -> PathBuf {
    let yaml = format!(
        "pilorama:\n  path: {}\nnode:\n  replica_id: 1\n  listen: \"{listen}\"\n{extra}",
        db.display()
    );
    let path = dir.join("node.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

/// Runs `arbor node` on `config`, expecting it to fail: its stderr.
fn failing_node(config: &Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(["node", "--config"])
        .arg(config)
        .output()
        .unwrap();
    assert!(!output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_bad_configuration_fails_before_any_file_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let db = data.join("tree.db");
    let loopback = format!("127.0.0.1:{}", free_port());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let a_file = dir.path().join("a-file");
    std::fs::write(&a_file, b"").unwrap();
    let missing = dir.path().join("missing/ca.crt");
    let tls = format!(
        "  tls:\n    ca: {0}\n    cert: {0}\n    key: {0}\n",
        missing.display()
    );
    let missing_named = format!("node.tls.ca: {}", missing.display());
    let cases = [
        (db.clone(), taken.clone(), String::new(), "node.listen"),
        (db.clone(), loopback.clone(), tls, missing_named.as_str()),
        (
            db.clone(),
            format!("0.0.0.0:{}", free_port()),
            String::new(),
            "insecure_plaintext",
        ),
        (
            a_file.join("tree.db"),
            loopback,
            String::new(),
            "pilorama.path",
        ),
    ];
    for (db, listen, extra, named) in cases {
        let config = lone_config(dir.path(), &db, &listen, &extra);
        let stderr = failing_node(&config);
        assert!(stderr.contains(named), "{named}: {stderr}");
        assert!(!data.exists(), "{named}: {} was created", data.display());
    }
}

/// Writes `file-<writer>-<n>` until the first failure; the acknowledged names.
async fn write_until_refused(via: Dialer, address: String, writer: usize) -> Vec<String> {
    let mut acknowledged = Vec::new();
    for n in 0.. {
        let name = format!("file-{writer}-{n}");
        let request = Request::AddByPath {
            tree: tree("t"),
            attr: ATTR_FILE_NAME.into(),
            path: vec!["root".into()],
            items: vec![KeyValue::new(ATTR_FILE_NAME, name.as_bytes())],
        };
        match call(&via, &address, &request).await {
            Ok(Response::AddedByPath { .. }) => acknowledged.push(name),
            _ => break,
        }
    }
    acknowledged
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_commits_what_was_acknowledged_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("data/tree.db");
    let address = format!("127.0.0.1:{}", free_port());
    // Plaintext on loopback: the anonymous test client needs the rights.
    let config = lone_config(dir.path(), &db, &address, "access:\n  anonymous: trusted\n");
    let mut child = Command::new(env!("CARGO_BIN_EXE_arbor"))
        .args(["node", "--config"])
        .arg(&config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.trim_end().ends_with(&address), "{line:?}");

    let via = client_dialer(None);
    let writers: Vec<_> = (0..4)
        .map(|w| tokio::spawn(write_until_refused(via.clone(), address.clone(), w)))
        .collect();
    // Stop it while writes are in flight.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = child.id().to_string();
    let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(status.success());
    let mut acknowledged = Vec::new();
    for writer in writers {
        acknowledged.extend(writer.await.unwrap());
    }
    let (sender, exited) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    let output = exited.recv_timeout(PATIENCE).expect("node exits").unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
    assert!(stderr.contains("stopping"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "ANSI codes in a piped log: {stderr:?}"
    );
    assert!(!acknowledged.is_empty(), "no write was acknowledged");

    // Every acknowledged write is there after a restart.
    let mut node = Node {
        config_path: config,
        address: address.clone(),
        child: None,
    };
    let stored = stored_after_restart(&mut node, &via).await;
    for name in &acknowledged {
        assert!(stored.contains(name), "{name} acknowledged, then lost");
    }
}

/// SIGTERM to the running `node`; once `writers` all ended, the node must
/// exit 0 (within the patience). What the writers returned.
async fn stop_while_running<T>(
    node: &mut Node,
    writers: Vec<tokio::task::JoinHandle<T>>,
) -> Vec<T> {
    let mut child = node.child.take().expect("a running node");
    let pid = child.id().to_string();
    let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(status.success());
    let mut outcomes = Vec::new();
    for writer in writers {
        outcomes.push(writer.await.unwrap());
    }
    let (sender, exited) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait());
    });
    let status = exited.recv_timeout(PATIENCE).expect("node exits").unwrap();
    assert!(status.success(), "{status:?}");
    outcomes
}

/// Starts `node` again and reads the name of every op of tree `t` it
/// holds, then kills it.
async fn stored_after_restart(node: &mut Node, via: &Dialer) -> std::collections::BTreeSet<String> {
    node.start();
    let (_, log) = snapshot(via, &node.address, &tree("t"))
        .await
        .expect("a snapshot");
    node.kill();
    log.iter()
        .filter_map(|op| op.meta.get(ATTR_FILE_NAME))
        .map(|name| String::from_utf8_lossy(name).into_owned())
        .collect()
}

/// What one writer's calls got before its connection ended.
#[derive(Default)]
struct WriterOutcome {
    acknowledged: Vec<String>,
    /// Answered `ShuttingDown` (not stored, safe to retry elsewhere).
    refused: usize,
    /// The last write sent, and what the connection did instead of
    /// answering it (EOF, reset, a timeout): unanswered.
    unanswered: Option<(String, String)>,
}

/// Writes `file-<writer>-<n>` over one connection until the node stops
/// answering; says on `started` once its first write was acknowledged.
async fn write_over_one_connection(
    via: Dialer,
    address: String,
    writer: usize,
    started: tokio::sync::mpsc::Sender<()>,
) -> WriterOutcome {
    let mut outcome = WriterOutcome::default();
    let mut connection = Connection::open(&address, None, &via).await.unwrap();
    for n in 0.. {
        let name = format!("file-{writer}-{n}");
        let request = Request::AddByPath {
            tree: tree("t"),
            attr: ATTR_FILE_NAME.into(),
            path: vec!["root".into()],
            items: vec![KeyValue::new(ATTR_FILE_NAME, name.as_bytes())],
        };
        let answer = tokio::time::timeout(PATIENCE, connection.call(&request)).await;
        match answer {
            Ok(Ok(Response::AddedByPath { .. })) => {
                outcome.acknowledged.push(name);
                if outcome.acknowledged.len() == 1 {
                    started.send(()).await.unwrap();
                }
            }
            Ok(Ok(Response::Error(arbor::Error::ShuttingDown)))
            | Ok(Err(arbor::Error::ShuttingDown)) => {
                outcome.refused += 1;
                break;
            }
            Ok(other) => {
                outcome.unanswered = Some((name, format!("{other:?}")));
                break;
            }
            Err(_) => {
                outcome.unanswered = Some((name, "no answer within the patience".into()));
                break;
            }
        }
    }
    outcome
}

/// SIGTERM while 16 writers each have a write in flight on their own
/// connection: every write sent is answered, with its result or with
/// `ShuttingDown`, before the connection closes; every acknowledged write
/// is there after a restart. A node that closed a connection without
/// answering left its client to guess (a gateway that retries creates the
/// object twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_every_write_in_flight() {
    for tls in [false, true] {
        sigterm_answers_every_write_in_flight_over(tls).await;
    }
}

async fn sigterm_answers_every_write_in_flight_over(tls: bool) {
    const WRITERS: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let certs = tls.then(|| {
        make_certs(&certs, 1);
        certs.as_path()
    });
    let db = dir.path().join("data/tree.db");
    let address = format!("127.0.0.1:{}", free_port());
    // A batch waits 20 ms for company, so most writers are in flight
    // whenever the signal lands.
    let extra = format!(
        "{}access:\n  anonymous: trusted\n  default:\n    owners: [test]\npilorama:\n  path: {}\n  max_batch_delay: 20ms\n",
        tls_yaml(certs, 1),
        db.display()
    );
    let yaml = format!("node:\n  replica_id: 1\n  listen: \"{address}\"\n{extra}");
    let config = dir.path().join("node.yaml");
    std::fs::write(&config, yaml).unwrap();
    let mut node = Node {
        config_path: config,
        address: address.clone(),
        child: None,
    };
    node.start();
    let via = client_dialer(certs);
    let (started, mut first_acks) = tokio::sync::mpsc::channel(WRITERS);
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let run = write_over_one_connection(via.clone(), address.clone(), w, started.clone());
            tokio::spawn(run)
        })
        .collect();
    for _ in 0..WRITERS {
        first_acks
            .recv()
            .await
            .expect("every writer got its first answer");
    }
    let outcomes = stop_while_running(&mut node, writers).await;
    let stored = stored_after_restart(&mut node, &via).await;
    let acknowledged: usize = outcomes.iter().map(|o| o.acknowledged.len()).sum();
    let refused: usize = outcomes.iter().map(|o| o.refused).sum();
    let unanswered: Vec<_> = outcomes
        .iter()
        .filter_map(|o| o.unanswered.clone())
        .collect();
    let unanswered_stored = unanswered
        .iter()
        .filter(|(name, _)| stored.contains(name))
        .count();
    eprintln!(
        "tls {tls}: {WRITERS} writers, {acknowledged} acknowledged, {refused} answered \
         ShuttingDown, {} unanswered ({unanswered_stored} of them stored)",
        unanswered.len()
    );
    for outcome in &outcomes {
        for name in &outcome.acknowledged {
            assert!(stored.contains(name), "{name} acknowledged, then lost");
        }
    }
    assert!(
        unanswered.is_empty(),
        "tls {tls}: writes sent but never answered: {unanswered:?}"
    );
}

/// What one gRPC writer's calls got before the node stopped.
#[derive(Default)]
struct GrpcOutcome {
    acknowledged: Vec<String>,
    /// The write that failed, and its status.
    failed: Option<(String, tonic::Status)>,
}

async fn grpc_write_until_refused(
    address: String,
    signer: arbor::grpc::Signer,
    writer: usize,
    started: tokio::sync::mpsc::Sender<()>,
) -> GrpcOutcome {
    let target = arbor::grpc::client::Target::plaintext(address);
    let mut client = arbor::grpc::client::GrpcClient::connect(&target, signer)
        .await
        .unwrap();
    let mut outcome = GrpcOutcome::default();
    let t = tree("t");
    for n in 0.. {
        let name = format!("grpc-{writer}-{n}");
        let meta = [KeyValue::new(ATTR_FILE_NAME, name.as_bytes())];
        let call = client.add_by_path(&t, &["root"], &meta);
        match tokio::time::timeout(PATIENCE, call).await {
            Ok(Ok(_)) => {
                outcome.acknowledged.push(name);
                if outcome.acknowledged.len() == 1 {
                    started.send(()).await.unwrap();
                }
            }
            Ok(Err(status)) => {
                outcome.failed = Some((name, status));
                break;
            }
            Err(_) => {
                outcome.failed = Some((name, tonic::Status::deadline_exceeded("no answer")));
                break;
            }
        }
    }
    outcome
}

/// SIGTERM while 16 gRPC callers each have a write in flight: every call
/// the node took is answered before it exits (tonic's graceful shutdown
/// lets them finish); a call that failed was not stored, so a gateway
/// that retries it creates nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_every_grpc_call_in_flight() {
    const WRITERS: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("data/tree.db");
    let address = format!("127.0.0.1:{}", free_port());
    let grpc_address = format!("127.0.0.1:{}", free_port());
    let signer = arbor::grpc::Signer::from_seed(7);
    let key = signer.public().hex();
    let yaml = format!(
        "node:\n  replica_id: 1\n  listen: \"{address}\"\ngrpc:\n  listen: \"{grpc_address}\"\n\
         access:\n  anonymous: trusted\n  default:\n    writers: [\"{key}\"]\n\
         pilorama:\n  path: {}\n  max_batch_delay: 20ms\n",
        db.display()
    );
    let config = dir.path().join("node.yaml");
    std::fs::write(&config, yaml).unwrap();
    let mut node = Node {
        config_path: config,
        address: address.clone(),
        child: None,
    };
    node.start();
    let (started, mut first_acks) = tokio::sync::mpsc::channel(WRITERS);
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let run =
                grpc_write_until_refused(grpc_address.clone(), signer.clone(), w, started.clone());
            tokio::spawn(run)
        })
        .collect();
    for _ in 0..WRITERS {
        first_acks
            .recv()
            .await
            .expect("every writer got its first answer");
    }
    let outcomes = stop_while_running(&mut node, writers).await;
    let stored = stored_after_restart(&mut node, &client_dialer(None)).await;
    let acknowledged: usize = outcomes.iter().map(|o| o.acknowledged.len()).sum();
    let failed: Vec<_> = outcomes.iter().filter_map(|o| o.failed.clone()).collect();
    let shutting_down = failed
        .iter()
        .filter(|(_, status)| status.message().contains("shutting down"))
        .count();
    // A call is answered (ShuttingDown), or the node never took it: its
    // channel found the port closed when it dialled again after the
    // node's GOAWAY; the call was still queued in the client when the
    // connection closed (hyper's `Canceled`); or its stream came after the
    // last one the GOAWAY let in (HTTP/2 says such a stream was not
    // processed). Anything else cut a call the node had taken. And no
    // failed call may have been stored (below).
    let never_sent = |status: &tonic::Status| {
        let debug = format!("{status:?}");
        status.message().contains("tcp connect error")
            || (status.code() == tonic::Code::Cancelled
                && debug.contains("Canceled, \"connection closed\""))
            || debug.contains("GoAway(b\"\", NO_ERROR, Remote)")
    };
    let cut: Vec<_> = failed
        .iter()
        .filter(|(_, status)| !status.message().contains("shutting down") && !never_sent(status))
        .collect();
    assert!(cut.is_empty(), "calls cut without an answer: {cut:?}");
    let failed_stored: Vec<_> = failed
        .iter()
        .filter(|(name, _)| stored.contains(name))
        .collect();
    eprintln!(
        "gRPC: {WRITERS} writers, {acknowledged} acknowledged, {} failed ({shutting_down} answered \
         ShuttingDown, {} of the failed stored)",
        failed.len(),
        failed_stored.len()
    );
    for outcome in &outcomes {
        for name in &outcome.acknowledged {
            assert!(stored.contains(name), "{name} acknowledged, then lost");
        }
    }
    assert!(
        failed_stored.is_empty(),
        "calls stored but answered with an error: {failed_stored:?}"
    );
}
