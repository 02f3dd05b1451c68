//! `arbor drain`: whether a replica may leave a container, asked of three
//! running nodes over TCP. The leaver's writes cannot reach the others by
//! themselves (its peers' addresses lead nowhere), so it is not drained
//! until the test hands its log over with `Apply`: first to one remaining
//! member (its own ops must reach every one, so still not drained), then
//! to the other (drained). The command line and `arbor::drain` answer
//! alike.

use arbor::config::{Config, PeerConfig};
use arbor::drain::{self, judge};
use arbor::forest::Forest;
use arbor::proto::{Request, Response};
use arbor::service::Service;
use arbor::system::system_env;
use arbor::tcp::{Connection, Server, ServerOptions, TcpTransport};
use arbor::{ContainerId, KeyValue, Move, ReplicaId, TreeKey, ATTR_FILE_NAME};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

const CID: ContainerId = ContainerId([0xab; 32]);

/// Node `id` listening on `listener`, its peers at addresses nobody
/// serves: its pushes fail and are retried, nothing reaches them.
fn start_node(id: ReplicaId, listener: TcpListener, nowhere: &[String]) -> Arc<Service> {
    let mut config = Config::default_for_test(id);
    config.node.listen = listener.local_addr().unwrap().to_string();
    config.node.peers = (1..=3)
        .filter(|&peer| peer != id)
        .map(|peer| PeerConfig::new(peer, nowhere[peer as usize - 1].clone()))
        .collect();
    config.tree.replication_timeout = Duration::from_secs(1);
    let forest = Forest::in_memory(config.forest_options()).unwrap();
    let transport = Arc::new(TcpTransport::new(&config, None));
    let service =
        Service::start(config.clone(), Arc::new(forest), system_env(), transport).unwrap();
    let server = Server::new(
        listener,
        service.clone(),
        ServerOptions::from_config(&config),
        None,
    );
    tokio::spawn(server.run());
    service
}

async fn connect(address: &str) -> Connection {
    Connection::connect(address, Duration::from_secs(2), 4 << 20)
        .await
        .unwrap()
}

async fn call(address: &str, request: Request) -> Response {
    connect(address).await.call(&request).await.unwrap()
}

async fn add(address: &str, tree: &TreeKey, name: &str) {
    let request = Request::AddByPath {
        tree: tree.clone(),
        attr: ATTR_FILE_NAME.into(),
        path: vec!["dir".into()],
        items: vec![KeyValue::new(ATTR_FILE_NAME, name.as_bytes())],
    };
    match call(address, request).await {
        Response::AddedByPath { .. } => {}
        other => panic!("{other:?}"),
    }
}

async fn log_of(address: &str, tree: &TreeKey) -> Vec<Move> {
    let request = Request::GetOpLog {
        tree: tree.clone(),
        from_height: 0,
        limit: 1000,
    };
    match call(address, request).await {
        Response::OpLog { entries, .. } => entries.into_iter().map(|e| e.op).collect(),
        other => panic!("{other:?}"),
    }
}

/// `arbor drain` against the leaver and the remaining members: its exit
/// status and what it printed.
fn arbor_drain(leaver: &str, members: &[&str]) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_arbor"));
    command.args(["drain", "--addr", leaver, "--cid", &CID.to_string()]);
    for member in members {
        command.args(["--member", member]);
    }
    let output = command.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

async fn report(addresses: &[String]) -> drain::DrainReport {
    let timeout = Duration::from_secs(10);
    let held = drain::held_ops(&mut connect(&addresses[2]).await, CID, timeout)
        .await
        .unwrap();
    let mut remaining = Vec::new();
    for (id, address) in [(1, &addresses[0]), (2, &addresses[1])] {
        let held = drain::held_ops(&mut connect(address).await, CID, timeout)
            .await
            .unwrap();
        remaining.push((id, held));
    }
    judge(CID, 3, &held, &remaining)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaver_is_drained_only_once_every_op_it_holds_is_held_by_the_others() {
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addresses: Vec<String> = listeners
        .iter()
        .map(|l| l.local_addr().unwrap().to_string())
        .collect();
    // Addresses bound and released: nothing answers there.
    let mut nowhere = Vec::new();
    for _ in 0..3 {
        let spare = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        nowhere.push(spare.local_addr().unwrap().to_string());
    }
    let _nodes: Vec<_> = listeners
        .into_iter()
        .zip(1..)
        .map(|(listener, id)| start_node(id, listener, &nowhere))
        .collect();
    let tree = TreeKey::new(CID, "photos");
    for name in ["a", "b", "c"] {
        add(&addresses[2], &tree, name).await;
    }
    let members = [addresses[0].as_str(), addresses[1].as_str()];

    let before = report(&addresses).await;
    assert!(!before.done(), "{before}");
    assert_eq!((before.trees, before.ops), (1, 4), "{before}");
    assert_eq!(before.unkept, 4, "{before}");
    assert_eq!(before.own_missing, 8, "{before}");
    let (drained, text) = arbor_drain(&addresses[2], &members);
    assert!(!drained, "{text}");
    assert!(
        text.contains("not drained") && text.contains("replica 3"),
        "{text}"
    );

    // Node 3's log handed to node 1 alone: every op is kept somewhere,
    // but node 2 lacks node 3's own ops.
    let log = log_of(&addresses[2], &tree).await;
    assert_eq!(log.len(), 4, "{log:?}");
    let apply = Request::Apply {
        tree: tree.clone(),
        ops: log,
    };
    assert!(matches!(
        call(&addresses[0], apply.clone()).await,
        Response::Applied { .. }
    ));
    let half = report(&addresses).await;
    assert!(!half.done(), "{half}");
    assert_eq!(half.unkept, 0, "{half}");
    assert_eq!(half.own_missing, 4, "{half}");
    assert_eq!(half.first_own_missing.as_ref().map(|m| m.0), Some(2));
    assert!(!arbor_drain(&addresses[2], &members).0);

    assert!(matches!(
        call(&addresses[1], apply).await,
        Response::Applied { .. }
    ));
    let after = report(&addresses).await;
    assert!(after.done(), "{after}");
    let (drained, text) = arbor_drain(&addresses[2], &members);
    assert!(drained, "{text}");
    assert!(
        text.contains("drained: the 4 ops replica 3 holds in 1 trees"),
        "{text}"
    );
    // The leaver named as a remaining member is refused.
    let (ok, text) = arbor_drain(&addresses[2], &[addresses[2].as_str()]);
    assert!(!ok && text.contains("the leaving one"), "{text}");
}
