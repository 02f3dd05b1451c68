//! The service's planted bugs do what they claim, next to a control run
//! without them: each would be caught by a convergence or liveness check.
//! Canaries are process-wide switches, so this file holds a single test that
//! runs the scenarios one after another.
//!
//! `cargo test -p arbor-engine-sim --test service_canary`
#![cfg(feature = "canary")]

extern crate arbor_engine_sim as arbor;

#[path = "../../engine/tests/service_support/mod.rs"]
mod service_support;

use arbor::batcher::{Batcher, BatcherOptions, CommitFn, Unobserved};
use arbor::canary::{self, Canary};
use arbor::config::ContainerConfig;
use arbor::forest::{WriteOp, WriteRequest};
use arbor::proto::{Request, Response};
use arbor::service::Service;
use arbor::Caller;
use arbor::{Error, KeyValue, TreeKey, ROOT};
use service_support::*;
use std::sync::Arc;
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(3600);

async fn add(service: &Service, tree: &TreeKey, name: &str) {
    let request = Request::Add {
        tree: tree.clone(),
        parent: ROOT,
        items: vec![KeyValue::new("FileName", name.as_bytes())],
    };
    assert!(matches!(
        service.handle(&Caller::Anonymous, request).await,
        Response::Added { .. }
    ));
}

fn log_len(service: &Service, tree: &TreeKey) -> usize {
    dump(service, tree).map_or(0, |d| d.log.len())
}

async fn failed_batch(planted: bool) -> Option<Result<arbor::forest::WriteOutcome, Error>> {
    canary::set(planted.then_some(Canary::FailedBatchHangs));
    let commit: CommitFn = Arc::new(|_: &[WriteRequest]| Err(Error::Storage("broken".into())));
    let options = BatcherOptions {
        max_batch_size: 10,
        max_batch_delay: Duration::from_millis(5),
        replicated_batch_delay: Duration::ZERO,
        max_pending: 10,
        max_commit_size: 10,
    };
    let batcher = Batcher::start_with_commit(commit, Arc::new(Unobserved), test_env(), options);
    let request = WriteRequest {
        tree: tree("t"),
        op: WriteOp::Remove { node: 5 },
    };
    let result = tokio::time::timeout(PATIENCE, batcher.submit(request))
        .await
        .ok();
    if result.is_none() {
        assert_eq!(batcher.stats().pending, 1, "the hung caller is visible");
    }
    canary::set(None);
    result
}

/// Replicas that differ after replication went idle, with a one-slot hint
/// queue and sync off.
async fn dropped_hints(planted: bool) -> usize {
    canary::set(planted.then_some(Canary::ReplicationDropsOnFullQueue));
    let net = LocalNet::new();
    let nodes: Vec<_> = cluster_configs(2)
        .into_iter()
        .map(|mut c| {
            c.tree.replication_channel_capacity = 1;
            let forest = memory_forest(&c);
            start_node(&net, c, forest)
        })
        .collect();
    let trees: Vec<TreeKey> = (0..6).map(|i| tree(&format!("t{i}"))).collect();
    let mut writers = Vec::new();
    for t in &trees {
        for n in 0..3 {
            let (node, t) = (nodes[0].clone(), t.clone());
            writers.push(tokio::spawn(async move {
                add(&node, &t, &format!("n{n}")).await
            }));
        }
    }
    for w in writers {
        w.await.unwrap();
    }
    eventually("replication idle", PATIENCE, || {
        nodes.iter().all(|n| n.replication_idle())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    canary::set(None);
    trees
        .iter()
        .filter(|t| dump(&nodes[0], t) != dump(&nodes[1], t))
        .count()
}

/// Ops node 3 holds after one sync from two peers whose logs differ.
async fn shared_cursor(planted: bool) -> usize {
    let net = LocalNet::new();
    let mut configs = cluster_configs(3);
    for c in &mut configs {
        c.node
            .containers
            .push(ContainerConfig::new(cid(), vec![1, 2, 3]));
    }
    let nodes = start_cluster(&net, configs);
    // Nodes 1 and 2 cannot reach each other or node 3: their logs differ.
    for (from, to) in [(1, 2), (2, 1), (1, 3), (2, 3)] {
        net.cut(from, to, true);
    }
    let t = tree("t");
    for i in 0..3 {
        add(&nodes[0], &t, &format!("a{i}")).await;
    }
    for i in 0..6 {
        add(&nodes[1], &t, &format!("b{i}")).await;
    }
    canary::set(planted.then_some(Canary::SharedSyncCursor));
    nodes[2].sync_now().await;
    canary::set(None);
    log_len(&nodes[2], &t)
}

/// Whether node 2 still holds its own tree after a sync during which the
/// peer's GetOpLog timed out.
async fn sync_peer_error(planted: bool) -> bool {
    let net = LocalNet::new();
    let nodes = start_cluster(&net, cluster_configs(2));
    let t = tree("t");
    add(&nodes[1], &t, "mine").await;
    eventually("replicated", PATIENCE, || nodes[1].replication_idle()).await;
    net.set_oplog_down(1, true);
    canary::set(planted.then_some(Canary::SyncDropsTreeOnPeerError));
    nodes[1].sync_now().await;
    canary::set(None);
    assert!(nodes[1].stats().sync_peer_errors > 0);
    log_len(&nodes[1], &t) == 1
}

#[tokio::test(start_paused = true)]
async fn each_service_canary_breaks_what_it_claims() {
    assert!(matches!(
        failed_batch(false).await,
        Some(Err(Error::Storage(_)))
    ));
    assert_eq!(
        failed_batch(true).await,
        None,
        "FailedBatchHangs: caller must hang"
    );

    assert_eq!(dropped_hints(false).await, 0);
    assert!(
        dropped_hints(true).await > 0,
        "ReplicationDropsOnFullQueue: ops must be lost"
    );

    assert_eq!(shared_cursor(false).await, 9);
    assert!(
        shared_cursor(true).await < 9,
        "SharedSyncCursor: ops must be skipped"
    );

    assert!(sync_peer_error(false).await);
    assert!(
        !sync_peer_error(true).await,
        "SyncDropsTreeOnPeerError: tree must be dropped"
    );
}
