//! The service's per-tree state stays bounded: trees that come and go
//! (a gateway makes one per multipart upload) leave nothing behind, what
//! is kept never exceeds `limits.max_tracked_trees`, and a peer listing
//! more trees than that is synced over several rounds. Sizes are asserted
//! through `ServiceStats`, in virtual time.

mod service_support;

use arbor::config::Config;
use arbor::proto::{Request, Response};
use arbor::service::{Service, ServiceStats};
use arbor::Caller;
use arbor::{KeyValue, TreeKey, ATTR_FILE_NAME, ROOT};
use service_support::*;
use std::sync::Arc;
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(3600);
const TRACKED_MAX: usize = 8;

async fn add(service: &Service, tree: &TreeKey, name: &str) {
    let request = Request::Add {
        tree: tree.clone(),
        parent: ROOT,
        items: vec![KeyValue::new(ATTR_FILE_NAME, name.as_bytes())],
    };
    match service.handle(&Caller::Anonymous, request).await {
        Response::Added { .. } => {}
        other => panic!("add failed: {other:?}"),
    }
}

async fn drop_tree(service: &Service, tree: &TreeKey) {
    let request = Request::Drop {
        cid: tree.cid,
        tree: Some(tree.tree.clone()),
    };
    assert_eq!(
        service.handle(&Caller::Anonymous, request).await,
        Response::Done
    );
}

fn bounded_configs(count: u16) -> Vec<Config> {
    let mut configs = cluster_configs(count);
    for config in &mut configs {
        config.limits.max_tracked_trees = TRACKED_MAX;
        config.tree.replication_worker_count = 2;
        config.tree.replication_timeout = Duration::from_secs(1);
    }
    configs
}

/// Every size the stats report is within its bound.
fn assert_bounded(stats: &ServiceStats, peers: u64) {
    let max = TRACKED_MAX as u64;
    assert!(stats.push_trees_tracked <= max, "{stats:?}");
    assert!(stats.push_windows <= max, "{stats:?}");
    assert!(stats.pull_cursors <= max, "{stats:?}");
    let pairs = stats.push_pairs_queued + stats.push_pairs_backlog + stats.push_pairs_delayed;
    assert!(pairs <= max * peers, "{stats:?}");
    assert!(stats.push_workers <= 2, "{stats:?}");
}

/// Nothing per tree is left.
fn assert_empty(stats: &ServiceStats) {
    let sizes = [
        stats.push_trees_tracked,
        stats.push_pairs_queued,
        stats.push_pairs_backlog,
        stats.push_pairs_delayed,
        stats.push_windows,
        stats.pull_cursors,
    ];
    assert_eq!(sizes, [0; 6], "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn many_short_lived_trees_leave_no_state_behind() {
    let net = LocalNet::new();
    let nodes = start_cluster(&net, bounded_configs(3));
    let mut most = ServiceStats::default();
    for i in 0..2000 {
        let t = tree(&format!("upload-{i}"));
        for (n, node) in nodes.iter().enumerate().take(1 + i % 3) {
            add(node, &t, &format!("part-{n}")).await;
        }
        if i % 100 == 0 {
            // Pull cursors too, and a check while the trees are live.
            nodes[i % 3].sync_now().await;
        }
        eventually("replication idle", PATIENCE, || {
            nodes.iter().all(|n| n.replication_idle())
        })
        .await;
        for node in &nodes {
            let stats = node.stats();
            assert_bounded(&stats, 2);
            most.push_trees_tracked = most.push_trees_tracked.max(stats.push_trees_tracked);
            most.pull_cursors = most.pull_cursors.max(stats.pull_cursors);
            drop_tree(node, &t).await;
        }
    }
    assert!(
        most.push_trees_tracked > 0 && most.pull_cursors > 0,
        "{most:?}"
    );
    // A few sweeps: pairs that were only waiting to be settled are.
    tokio::time::sleep(Duration::from_secs(10)).await;
    for node in &nodes {
        assert_empty(&node.stats());
        assert!(node.forest().all_trees().unwrap().is_empty());
    }
}

#[tokio::test(start_paused = true)]
async fn more_live_trees_than_the_bound_all_replicate() {
    let net = LocalNet::new();
    let nodes = start_cluster(&net, bounded_configs(2));
    // Pushes from node 1 wait: its book fills and its commits find no room.
    net.cut(1, 2, true);
    let trees: Vec<TreeKey> = (0..5 * TRACKED_MAX)
        .map(|i| tree(&format!("t{i}")))
        .collect();
    for (i, t) in trees.iter().enumerate() {
        add(&nodes[0], t, &format!("n{i}")).await;
        assert_bounded(&nodes[0].stats(), 1);
    }
    net.cut(1, 2, false);
    eventually("replication idle", PATIENCE, || {
        nodes.iter().all(|n| n.replication_idle())
    })
    .await;
    for t in &trees {
        assert_eq!(dump(&nodes[0], t), dump(&nodes[1], t), "{t:?}");
    }
    assert_bounded(&nodes[0].stats(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_peer_listing_more_trees_than_the_bound_is_synced_over_rounds() {
    let net = LocalNet::new();
    let mut configs = bounded_configs(2);
    list_container(&mut configs, cid(), vec![1, 2]);
    let nodes: Vec<Arc<Service>> = start_cluster(&net, configs);
    // Only sync carries node 1's trees to node 2.
    net.cut(1, 2, true);
    let count = 3 * TRACKED_MAX + 1;
    let trees: Vec<TreeKey> = (0..count).map(|i| tree(&format!("t{i}"))).collect();
    for (i, t) in trees.iter().enumerate() {
        add(&nodes[0], t, &format!("n{i}")).await;
    }
    nodes[1].sync_now().await;
    let stats = nodes[1].stats();
    assert_eq!(nodes[1].forest().all_trees().unwrap().len(), TRACKED_MAX);
    assert_eq!(stats.sync_names_deferred, (count - TRACKED_MAX) as u64);
    // Each round takes the next stretch of the list.
    for _ in 0..3 {
        nodes[1].sync_now().await;
        assert_bounded(&nodes[1].stats(), 1);
    }
    for t in &trees {
        assert_eq!(dump(&nodes[0], t), dump(&nodes[1], t), "{t:?}");
    }
}
