//! Three real `arbor node` processes on 127.0.0.1: writes through each, one
//! node killed and restarted mid-way, and all three end with identical trees
//! and logs. Children are killed and temp dirs removed even on failure.

use arbor::config::{Config, PeerConfig};
use arbor::proto::{Request, Response};
use arbor::tcp::Connection;
use arbor::{ContainerId, KeyValue, Move, NodeInfo, TreeKey, ATTR_FILE_NAME, ROOT};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
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

fn write_configs(dir: &Path, count: u16) -> Vec<Node> {
    let ports: Vec<u16> = (0..count).map(|_| free_port()).collect();
    let address = |i: u16| format!("127.0.0.1:{}", ports[i as usize - 1]);
    (1..=count)
        .map(|id| {
            let mut config = Config::default_for_test(id);
            config.node.listen = address(id);
            config.node.peers = (1..=count)
                .filter(|p| *p != id)
                .map(|p| PeerConfig {
                    replica_id: p,
                    address: address(p),
                })
                .collect();
            let yaml = format!(
                "tree:\n  replication_timeout: 1s\n  sync_interval: 1s\n\
                 pilorama:\n  path: {db}\n\
                 node:\n  replica_id: {id}\n  listen: \"{listen}\"\n  peers:\n{peers}\
                 access:\n  anonymous: trusted\n",
                db = dir.join(format!("node{id}/tree.db")).display(),
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
            assert_eq!(parsed.node, config.node);
            assert_eq!(parsed.access, config.access);
            std::fs::write(&config_path, yaml).unwrap();
            Node {
                config_path,
                address: config.node.listen,
                child: None,
            }
        })
        .collect()
}

async fn call(address: &str, request: &Request) -> arbor::Result<Response> {
    let call = async {
        let mut connection =
            Connection::connect(address, Duration::from_secs(2), MAX_MESSAGE).await?;
        connection.call(request).await
    };
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .unwrap_or(Err(arbor::Error::Timeout))
}

fn tree(name: &str) -> TreeKey {
    TreeKey::new(ContainerId([0x5a; 32]), name)
}

async fn write(address: &str, tree: &TreeKey, dir: &str, file: &str) {
    let request = Request::AddByPath {
        tree: tree.clone(),
        attr: ATTR_FILE_NAME.into(),
        path: vec!["root".into(), dir.into()],
        items: vec![
            KeyValue::new(ATTR_FILE_NAME, file.as_bytes()),
            KeyValue::new("writer", address.as_bytes()),
        ],
    };
    match call(address, &request).await {
        Ok(Response::AddedByPath { .. }) => {}
        other => panic!("write through {address} failed: {other:?}"),
    }
}

/// The tree (every node, parents first) and the log (sorted by timestamp)
/// of one replica; `None` while it cannot answer.
async fn snapshot(address: &str, tree: &TreeKey) -> Option<(Vec<NodeInfo>, Vec<Move>)> {
    let subtree = Request::GetSubTree {
        tree: tree.clone(),
        root: ROOT,
        depth: 0,
    };
    let Ok(Response::Nodes(mut nodes)) = call(address, &subtree).await else {
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
        }) = call(address, &page).await
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
    let dir = tempfile::tempdir().unwrap();
    let nodes = write_configs(dir.path(), 3);
    let mut cluster = Cluster { nodes, _dir: dir };
    for node in &mut cluster.nodes {
        node.start();
    }
    let addresses: Vec<String> = cluster.nodes.iter().map(|n| n.address.clone()).collect();
    let trees = [tree("a"), tree("b")];

    for (i, address) in addresses.iter().enumerate() {
        for t in &trees {
            write(address, t, &format!("d{i}"), "before").await;
        }
    }
    cluster.nodes[2].kill();
    for round in 0..5 {
        for address in &addresses[..2] {
            for t in &trees {
                write(address, t, "shared", &format!("during-{round}")).await;
            }
        }
    }
    cluster.nodes[2].start();
    for t in &trees {
        write(&addresses[2], t, "late", "after").await;
    }

    let deadline = Instant::now() + PATIENCE;
    for t in &trees {
        loop {
            let mut snapshots = Vec::new();
            for address in &addresses {
                snapshots.push(snapshot(address, t).await);
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
