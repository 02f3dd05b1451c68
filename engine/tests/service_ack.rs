//! `tree.ack_replicas` (docs/design.md §6): with k >= 2 a local write is
//! answered only once k replicas hold it (its own commit and k - 1 peers
//! that acknowledged its push); otherwise, after `tree.replication_timeout`,
//! with `NotReplicated`, the write stored here and still replicating.

mod service_support;

use arbor::config::Config;
use arbor::proto::{Request, Response};
use arbor::service::Service;
use arbor::{Caller, Error, NodeId, TreeKey, ATTR_FILE_NAME, ROOT, TRASH};
use service_support::*;
use std::sync::Arc;
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(3600);
const REPLICATION_TIMEOUT: Duration = Duration::from_secs(2);

fn configs(count: u16, ack_replicas: usize) -> Vec<Config> {
    let mut configs = cluster_configs(count);
    for config in &mut configs {
        config.tree.ack_replicas = ack_replicas;
        config.tree.replication_timeout = REPLICATION_TIMEOUT;
    }
    configs
}

async fn call(service: &Service, request: Request) -> Response {
    service.handle(&Caller::Anonymous, request).await
}

fn add(tree: &TreeKey, parent: NodeId, name: &str) -> Request {
    Request::Add {
        tree: tree.clone(),
        parent,
        items: file(name),
    }
}

/// The parent `node` hangs under on `service`, if it holds the node.
fn parent_on(service: &Service, tree: &TreeKey, node: NodeId) -> Option<NodeId> {
    let dump = dump(service, tree)?;
    dump.nodes.iter().find(|n| n.id == node).map(|n| n.parent)
}

/// Every kind of local write is answered only once the peer holds it:
/// each answer is checked against the peer's forest at once. The first
/// push of each write is lost, so a write answered on its own commit
/// would find the peer without it. A third replica that is down does not
/// hold anything up: one peer is enough for k = 2.
#[tokio::test(start_paused = true)]
async fn k2_answers_once_a_peer_holds_the_write() {
    let net = LocalNet::new();
    let nodes = start_cluster(&net, configs(3, 2));
    net.set_down(3, true);
    let t = tree("t");
    let (writer, peer) = (&nodes[0], &nodes[1]);

    net.drop_calls_to(2, 1);
    let Response::Added { node: dir } = call(writer, add(&t, ROOT, "dir")).await else {
        panic!("add refused");
    };
    assert_eq!(parent_on(peer, &t, dir), Some(ROOT));

    net.drop_calls_to(2, 1);
    let by_path = Request::AddByPath {
        tree: t.clone(),
        attr: ATTR_FILE_NAME.into(),
        path: vec!["a".into(), "b".into()],
        items: file("leaf"),
    };
    let Response::AddedByPath { leaf, created, .. } = call(writer, by_path).await else {
        panic!("add by path refused");
    };
    assert_eq!(parent_on(peer, &t, leaf), Some(created[1]));
    assert_eq!(parent_on(peer, &t, created[0]), Some(ROOT));

    net.drop_calls_to(2, 1);
    let moved = Request::Move {
        tree: t.clone(),
        parent: dir,
        node: leaf,
        items: file("moved"),
    };
    assert_eq!(call(writer, moved).await, Response::Done);
    assert_eq!(parent_on(peer, &t, leaf), Some(dir));

    net.drop_calls_to(2, 1);
    let removed = Request::Remove {
        tree: t.clone(),
        node: dir,
    };
    assert_eq!(call(writer, removed).await, Response::Done);
    assert_eq!(parent_on(peer, &t, dir), Some(TRASH));
    assert_eq!(parent_on(&nodes[2], &t, dir), None, "node 3 was down");
}

/// With its only peer down, a k = 2 write gets `NotReplicated` after the
/// replication timeout: it is stored on the node that took it (a
/// transient error, like a timeout: maybe applied), and reaches the peer
/// once the peer is back.
#[tokio::test(start_paused = true)]
async fn k2_without_a_peer_times_out_stored_here_and_replicates_later() {
    let net = LocalNet::new();
    let nodes = start_cluster(&net, configs(2, 2));
    let t = tree("t");
    net.set_down(2, true);
    let started = tokio::time::Instant::now();
    let answer = call(&nodes[0], add(&t, ROOT, "alone")).await;
    let expected = Error::NotReplicated { held: 1, needed: 2 };
    assert_eq!(answer, Response::Error(expected.clone()));
    assert!(expected.is_transient());
    assert!(started.elapsed() >= REPLICATION_TIMEOUT);
    let stored = dump(&nodes[0], &t).expect("stored on node 1");
    let node = stored.nodes.iter().find(|n| n.parent == ROOT).unwrap().id;
    assert_eq!(parent_on(&nodes[1], &t, node), None);
    assert_eq!(nodes[0].stats().pending_writes, 0);
    assert_eq!(nodes[0].stats().writes_awaiting_replicas, 0);

    net.set_down(2, false);
    eventually("the write reaches node 2", PATIENCE, || {
        parent_on(&nodes[1], &t, node) == Some(ROOT)
    })
    .await;
    // And with the peer back, writes are answered again.
    let answer = call(&nodes[0], add(&t, ROOT, "together")).await;
    let Response::Added { node } = answer else {
        panic!("refused with the peer up: {answer:?}");
    };
    assert_eq!(parent_on(&nodes[1], &t, node), Some(ROOT));
}

/// k = 1 (the default) answers on the local commit alone, whatever the
/// peers do.
#[tokio::test(start_paused = true)]
async fn k1_answers_on_the_local_commit() {
    let net = LocalNet::new();
    let nodes = start_cluster(&net, configs(2, 1));
    assert_eq!(Config::default_for_test(1).tree.ack_replicas, 1);
    net.set_down(2, true);
    let t = tree("t");
    let started = tokio::time::Instant::now();
    let answer = call(&nodes[0], add(&t, ROOT, "alone")).await;
    let Response::Added { node } = answer else {
        panic!("refused: {answer:?}");
    };
    assert!(started.elapsed() < REPLICATION_TIMEOUT);
    assert_eq!(parent_on(&nodes[1], &t, node), None);
}

/// A node whose config asks more replicas than it has does not start.
#[tokio::test(start_paused = true)]
async fn more_ack_replicas_than_replicas_is_refused_at_start() {
    let net = LocalNet::new();
    let config = configs(2, 3).remove(0);
    let forest = Arc::new(memory_forest(&config));
    let refused = Service::start(config, forest, test_env(), net.transport(1));
    let Err(Error::Config(message)) = refused else {
        panic!("started with ack_replicas above its replicas");
    };
    assert!(message.starts_with("tree.ack_replicas:"), "{message}");
}
