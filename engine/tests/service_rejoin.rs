//! Node replacement (docs/design.md §6): a node restarted on an empty
//! disk under its old replica id refuses local writes until it pulled its
//! peers' logs, then stamps above what its lost disk gave; a peer learns
//! from the new log epoch that its pull cursors count heights of a lost
//! log, and starts them again.

mod service_support;

use arbor::config::Config;
use arbor::forest::CursorKind;
use arbor::proto::{Request, Response};
use arbor::service::Service;
use arbor::{timestamp_counter, Caller, Error, KeyValue, TreeKey, ATTR_FILE_NAME, ROOT};
use service_support::*;
use std::sync::Arc;
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(3600);

async fn add(service: &Service, tree: &TreeKey, name: &str) -> Response {
    let request = Request::Add {
        tree: tree.clone(),
        parent: ROOT,
        items: vec![KeyValue::new(ATTR_FILE_NAME, name.as_bytes())],
    };
    service.handle(&Caller::Anonymous, request).await
}

async fn added(service: &Service, tree: &TreeKey, name: &str) -> u64 {
    match add(service, tree, name).await {
        Response::Added { node } => node,
        other => panic!("add failed: {other:?}"),
    }
}

/// Node 2's config once its disk was replaced: rejoining, sync on
/// (rounds are driven by `sync_now` here); its container is listed.
fn rejoin_config(mut config: Config) -> Config {
    config.node.rejoin = true;
    config.tree.sync_interval = Some(PATIENCE);
    config
}

/// Two nodes replicating `cid()`: node 2 writes ten ops of tree `t`,
/// node 1 pulls them (its pull cursor of node 2's log reaches 10), and
/// node 2 stops for good. Calls to node 1 then fail. Returns the configs,
/// node 1 alone and the tree.
async fn node_2_pulled_then_lost(net: &Arc<LocalNet>) -> (Vec<Config>, Vec<Arc<Service>>, TreeKey) {
    let mut configs = cluster_configs(2);
    list_container(&mut configs, cid(), vec![1, 2]);
    let mut nodes = start_cluster(net, configs.clone());
    let t = tree("t");
    for i in 0..10 {
        added(&nodes[1], &t, &format!("old-{i}")).await;
    }
    nodes[0].sync_now().await;
    assert_eq!(
        nodes[0].forest().cursor(&t, CursorKind::Pull, 2).unwrap(),
        10
    );
    eventually("old ops pushed", PATIENCE, || nodes[1].replication_idle()).await;
    let old = nodes.pop().expect("node 2");
    stop_node(net, old).await;
    net.set_down(1, true);
    (configs, nodes, t)
}

/// Node 2 writes ten ops, which node 1 pulls (its pull cursor of node 2's
/// log reaches 10), and loses its disk. Back on an empty one, while it
/// cannot reach node 1, it refuses writes (`Rejoining`) and takes node
/// 1's next op by push: its rebuilt log (a new log epoch) ends at 1,
/// below node 1's cursor, which node 1's next pull starts again from 0. Once node 2 pulled node 1's
/// log it writes again, with counters above the ten its lost disk gave,
/// and both nodes converge without a stamp conflict.
#[tokio::test(start_paused = true)]
async fn a_replaced_node_writes_only_above_the_stamps_its_peers_hold() {
    let net = LocalNet::new();
    let (configs, nodes, t) = node_2_pulled_then_lost(&net).await;
    let config = rejoin_config(configs[1].clone());
    let replaced = start_node(&net, config.clone(), memory_forest(&config));
    replaced.sync_now().await;
    assert!(replaced.stats().rejoining);
    let refused = add(&replaced, &t, "too-early").await;
    assert_eq!(refused, Response::Error(Error::Rejoining));

    // Node 1 still reaches node 2 (only calls to node 1 fail).
    added(&nodes[0], &t, "from-1").await;
    eventually("node 1's op pushed", PATIENCE, || {
        nodes[0].replication_idle()
    })
    .await;
    assert_eq!(replaced.forest().next_height(&t).unwrap(), 1);
    nodes[0].sync_now().await;
    assert_eq!(nodes[0].stats().pull_cursors_reset, 1);
    // Started over (node 2's log epoch changed) and pulled to its end.
    assert_eq!(
        nodes[0].forest().cursor(&t, CursorKind::Pull, 2).unwrap(),
        1
    );

    net.set_down(1, false);
    replaced.sync_now().await;
    assert!(!replaced.stats().rejoining, "{:?}", replaced.stats());
    let node = added(&replaced, &t, "new").await;
    assert!(
        timestamp_counter(node) > 11,
        "stamp {node} reuses a counter"
    );
    nodes[0].sync_now().await;
    eventually("new op pushed", PATIENCE, || replaced.replication_idle()).await;
    let both: Vec<Arc<Service>> = vec![nodes[0].clone(), replaced.clone()];
    let reference = dump(&both[0], &t).unwrap();
    assert_eq!(dump(&both[1], &t), Some(reference));
    for node in &both {
        assert_eq!(node.stats().stamp_conflicts, 0);
        node.forest().check_invariants(&t).unwrap();
    }
}

/// `node.rejoin` without background sync could never end: refused.
#[test]
fn rejoin_needs_sync() {
    let mut config = cluster_configs(2).remove(1);
    config.node.rejoin = true;
    config.tree.sync_interval = None;
    let refused = config.validate().unwrap_err();
    assert!(refused.to_string().contains("node.rejoin"), "{refused}");
}

/// Node 1 pulled node 2's log to height 10; node 2 then starts on an
/// empty disk under its old id (without the rejoin wait) and, while its
/// pushes to node 1 fail, takes node 1's next op by push (height 0, which
/// lifts its counters above the lost ones) and writes twelve ops (heights
/// 1..12). Its rebuilt log now ends past node 1's old cursor, so only its
/// log epoch tells node 1 that heights 1..9 are new: node 1's next pull
/// must start over and get every op of the rebuilt log. Before the epoch,
/// node 1 pulled heights 10..12 alone and missed nine ops.
#[tokio::test(start_paused = true)]
async fn a_rebuilt_log_grown_past_the_pull_cursor_is_pulled_from_the_start() {
    let net = LocalNet::new();
    let (configs, nodes, t) = node_2_pulled_then_lost(&net).await;
    let config = configs[1].clone();
    let replaced = start_node(&net, config.clone(), memory_forest(&config));
    added(&nodes[0], &t, "from-1").await;
    eventually("node 1's op pushed", PATIENCE, || {
        nodes[0].replication_idle()
    })
    .await;
    for i in 0..12 {
        added(&replaced, &t, &format!("new-{i}")).await;
    }
    assert_eq!(replaced.forest().next_height(&t).unwrap(), 13);

    nodes[0].sync_now().await;
    let puller = dump(&nodes[0], &t).unwrap();
    let rebuilt = dump(&replaced, &t).unwrap();
    let missing: Vec<_> = rebuilt
        .log
        .iter()
        .filter(|op| !puller.log.contains(op))
        .collect();
    assert!(missing.is_empty(), "not pulled: {missing:?}");
    assert_eq!(puller.log.len(), 10 + 1 + 12);
    assert_eq!(nodes[0].stats().pull_cursors_reset, 1);
    assert_eq!(nodes[0].stats().stamp_conflicts, 0);
    nodes[0].forest().check_invariants(&t).unwrap();
}
