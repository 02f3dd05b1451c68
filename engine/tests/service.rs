//! The tree service over an in-process network, in virtual time: request
//! validation, replication (push), background sync (pull), restarts.

mod service_support;

use arbor::config::{Config, ContainerConfig};
use arbor::forest::{CursorKind, Forest};
use arbor::proto::{Request, Response};
use arbor::runtime::{BoxFuture, Env, Runtime};
use arbor::service::Service;
use arbor::system::TokioRuntime;
use arbor::Caller;
use arbor::{Error, KeyValue, Move, TreeKey, ATTR_FILE_NAME, ROOT, TRASH};
use service_support::*;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

const PATIENCE: Duration = Duration::from_secs(3600);

fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue::new(key, value.as_bytes())
}

async fn add(service: &Service, tree: &TreeKey, parent: u64, name: &str) -> u64 {
    let request = Request::Add {
        tree: tree.clone(),
        parent,
        items: vec![kv(ATTR_FILE_NAME, name), kv("k", name)],
    };
    match service.handle(&Caller::Anonymous, request).await {
        Response::Added { node } => node,
        other => panic!("add failed: {other:?}"),
    }
}

async fn add_by_path(service: &Service, tree: &TreeKey, path: &str) -> u64 {
    let request = Request::AddByPath {
        tree: tree.clone(),
        attr: ATTR_FILE_NAME.into(),
        path: path.split('/').map(str::to_string).collect(),
        items: vec![kv(ATTR_FILE_NAME, "leaf"), kv("size", "1")],
    };
    match service.handle(&Caller::Anonymous, request).await {
        Response::AddedByPath { leaf, .. } => leaf,
        other => panic!("add by path failed: {other:?}"),
    }
}

/// Every node holds the same tree and log as the first.
fn assert_converged(nodes: &[Arc<Service>], trees: &[TreeKey]) {
    for tree in trees {
        let reference = dump(&nodes[0], tree).expect("tree exists on the first node");
        assert!(!reference.log.is_empty());
        for node in &nodes[1..] {
            let other = dump(node, tree);
            assert_eq!(
                other.as_ref(),
                Some(&reference),
                "replica {} differs on {tree:?}",
                node.config().node.replica_id
            );
            node.forest().check_invariants(tree).unwrap();
        }
    }
}

fn all_idle(nodes: &[Arc<Service>]) -> bool {
    nodes.iter().all(|n| n.replication_idle())
}

/// Lists the test container on nodes 1 and 2, so that sync looks for its
/// trees on a node that does not hold them yet.
fn list_container_on_both(configs: &mut [Config]) {
    for c in configs {
        c.node
            .containers
            .push(ContainerConfig::new(cid(), vec![1, 2]));
    }
}

#[tokio::test(start_paused = true)]
async fn writes_replicate_to_every_replica() {
    let net = LocalNet::new();
    let nodes = start_cluster(&net, cluster_configs(3));
    let trees = [tree("a"), tree("b")];
    for (i, node) in nodes.iter().enumerate() {
        for t in &trees {
            let dir = add(node, t, ROOT, &format!("dir{i}")).await;
            add(node, t, dir, "file").await;
            add_by_path(node, t, &format!("x/y{i}/z")).await;
        }
    }
    eventually("replication idle", PATIENCE, || all_idle(&nodes)).await;
    assert_converged(&nodes, &trees);
    assert!(nodes.iter().all(|n| n.stats().ops_pushed > 0));
    assert!(nodes.iter().all(|n| n.stats().pending_writes == 0));
}

#[tokio::test(start_paused = true)]
async fn full_hint_queue_with_sync_off_still_delivers_everything() {
    let net = LocalNet::new();
    let nodes: Vec<_> = cluster_configs(3)
        .into_iter()
        .map(|mut c| {
            c.tree.replication_channel_capacity = 1;
            c.tree.replication_worker_count = 1;
            c.tree.sync_interval = None;
            let forest = memory_forest(&c);
            start_node(&net, c, forest)
        })
        .collect();
    let trees: Vec<TreeKey> = (0..6).map(|i| tree(&format!("t{i}"))).collect();
    // Many trees in each batch: one hint fits, the rest are dropped.
    let mut writers = Vec::new();
    for node in &nodes {
        for t in &trees {
            for n in 0..3 {
                let (node, t) = (node.clone(), t.clone());
                writers.push(tokio::spawn(async move {
                    add(&node, &t, ROOT, &format!("n{n}")).await
                }));
            }
        }
    }
    for w in writers {
        w.await.unwrap();
    }
    assert!(
        nodes.iter().all(|n| n.stats().hints_dropped > 0),
        "the queue never overflowed"
    );
    eventually("replication idle", PATIENCE, || all_idle(&nodes)).await;
    assert_converged(&nodes, &trees);
    assert!(nodes.iter().all(|n| n.stats().sync_rounds == 0));
}

#[tokio::test(start_paused = true)]
async fn peer_down_during_writes_catches_up_through_sync() {
    let net = LocalNet::new();
    let nodes = start_cluster(&net, cluster_configs(3));
    let t = tree("docs");
    add(&nodes[2], &t, ROOT, "before").await;
    eventually("first write replicated", PATIENCE, || all_idle(&nodes)).await;
    net.set_down(3, true);
    for i in 0..20 {
        add(&nodes[i % 2], &t, ROOT, &format!("while-down-{i}")).await;
    }
    net.set_down(3, false);
    // Pushes to node 3 are backing off; its own sync pulls the gap now.
    nodes[2].sync_now().await;
    assert!(nodes[2].stats().ops_pulled >= 20, "{:?}", nodes[2].stats());
    assert_eq!(dump(&nodes[2], &t), dump(&nodes[0], &t));
    eventually("pushes settle", PATIENCE, || all_idle(&nodes)).await;
    assert_converged(&nodes, &[t]);
}

/// Answers of a peer that breaks the sync protocol, one per way a page can
/// be wrong; each rewrites one of the two reads and leaves the other alone.
fn broken_sync_answers() -> Vec<(&'static str, SyncAnswerFilter)> {
    vec![
        ("another answer to GetOpLogStamps", |answer| match answer {
            Response::OpLogStamps { next_height, .. } => Response::OpLog {
                entries: Vec::new(),
                next_height,
            },
            other => other,
        }),
        ("another answer to GetOpLog", |answer| match answer {
            Response::OpLog { .. } => Response::Done,
            other => other,
        }),
        ("stamps out of order", |answer| {
            rewrite_stamps(answer, |stamps| stamps.reverse())
        }),
        ("ops out of order", |answer| {
            rewrite_ops(answer, |entries| entries.reverse())
        }),
        ("more stamps than asked for", |answer| {
            rewrite_stamps(answer, |stamps| {
                let last = *stamps.last().expect("the peer has ops");
                stamps.extend((1..=64).map(|i| arbor::LogStamp {
                    height: last.height + i,
                    ..last
                }));
            })
        }),
        ("more ops than asked for", |answer| {
            rewrite_ops(answer, |entries| {
                let last = entries.last().expect("the peer has ops").clone();
                entries.extend((1..=64).map(|i| arbor::LogEntry {
                    height: last.height + i,
                    ..last.clone()
                }));
            })
        }),
        // Regression: a page that skipped heights moved the pull cursor over
        // ops it never saw (the ops page) or was taken as given (stamps).
        ("stamps with a gap", |answer| {
            rewrite_stamps(answer, |stamps| {
                if stamps.len() > 1 {
                    stamps.remove(1);
                }
            })
        }),
        ("ops with a gap", |answer| {
            rewrite_ops(answer, |entries| {
                if entries.len() > 1 {
                    entries.remove(1);
                }
            })
        }),
        ("stamps from a later height", |answer| {
            rewrite_stamps(answer, |stamps| {
                if !stamps.is_empty() {
                    stamps.remove(0);
                }
            })
        }),
    ]
}

fn rewrite_stamps(answer: Response, change: fn(&mut Vec<arbor::LogStamp>)) -> Response {
    match answer {
        Response::OpLogStamps {
            mut stamps,
            next_height,
            first_height,
        } => {
            change(&mut stamps);
            Response::OpLogStamps {
                stamps,
                next_height,
                first_height,
            }
        }
        other => other,
    }
}

fn rewrite_ops(answer: Response, change: fn(&mut Vec<arbor::LogEntry>)) -> Response {
    match answer {
        Response::OpLog {
            mut entries,
            next_height,
        } => {
            change(&mut entries);
            Response::OpLog {
                entries,
                next_height,
            }
        }
        other => other,
    }
}

#[tokio::test(start_paused = true)]
async fn sync_refuses_malformed_pages_and_keeps_nothing_from_them() {
    let net = LocalNet::new();
    let mut configs = cluster_configs(2);
    for c in &mut configs {
        c.tree.sync_interval = None;
        c.limits.sync_stamp_page_size = 8;
        c.limits.sync_page_size = 8;
    }
    list_container_on_both(&mut configs);
    let nodes = start_cluster(&net, configs);
    let t = tree("t");
    // Pushes from node 1 to node 2 are lost: only sync can deliver.
    net.cut(1, 2, true);
    for i in 0..20 {
        add(&nodes[0], &t, ROOT, &format!("n{i}")).await;
    }
    for (what, filter) in broken_sync_answers() {
        net.set_sync_answer_filter(Some(filter));
        let errors_before = nodes[1].stats().sync_peer_errors;
        nodes[1].sync_now().await;
        let stats = nodes[1].stats();
        assert_eq!(stats.sync_peer_errors, errors_before + 1, "{what}");
        assert_eq!(stats.ops_pulled, 0, "{what}");
        assert_eq!(
            nodes[1].forest().cursor(&t, CursorKind::Pull, 1).unwrap(),
            0,
            "{what}"
        );
        assert!(
            dump(&nodes[1], &t).is_none(),
            "{what}: {:?}",
            dump(&nodes[1], &t)
        );
    }
    net.set_sync_answer_filter(None);
    nodes[1].sync_now().await;
    assert_eq!(nodes[1].stats().ops_pulled, 20);
    assert_eq!(dump(&nodes[1], &t), dump(&nodes[0], &t));
}

#[tokio::test(start_paused = true)]
async fn periodic_sync_repairs_without_pushes() {
    let net = LocalNet::new();
    let mut configs = cluster_configs(2);
    configs[1].tree.sync_interval = Some(Duration::from_secs(30));
    // Listed, so node 2 looks for its trees before it holds any of them.
    list_container_on_both(&mut configs);
    let nodes = start_cluster(&net, configs);
    let t = tree("t");
    // Node 1 cannot reach node 2 (its pushes are lost), but node 2 can
    // reach node 1: only node 2's periodic pull brings the data over.
    net.cut(1, 2, true);
    for i in 0..5 {
        add(&nodes[0], &t, ROOT, &format!("n{i}")).await;
    }
    let n2 = nodes[1].clone();
    eventually("periodic sync pulled", PATIENCE, || {
        dump(&n2, &t).is_some_and(|d| d.log.len() == 5)
    })
    .await;
    assert_eq!(dump(&nodes[0], &t), dump(&n2, &t));
    assert_eq!(nodes[0].stats().ops_pushed, 0);
    assert!(n2.stats().sync_rounds >= 1);
}

#[tokio::test(start_paused = true)]
async fn restart_resumes_cursors() {
    let dir = tempfile::tempdir().unwrap();
    let net = LocalNet::new();
    let mut configs = cluster_configs(2);
    for c in &mut configs {
        c.pilorama.path = dir.path().join(format!("node{}.db", c.node.replica_id));
        c.limits.sync_page_size = 16;
    }
    let open =
        |c: &arbor::config::Config| Forest::open(&c.pilorama.path, c.forest_options()).unwrap();
    let n1 = start_node(&net, configs[0].clone(), open(&configs[0]));
    let n2 = start_node(&net, configs[1].clone(), open(&configs[1]));
    let t = tree("t");
    for i in 0..100 {
        add(&n1, &t, ROOT, &format!("n{i}")).await;
    }
    eventually("pushed", PATIENCE, || n1.replication_idle()).await;
    n2.sync_now().await;
    // The push cursor is made durable lazily: 512 heights ahead, or at the
    // latest 16 replication timeouts (60 s here) after it last was.
    tokio::time::sleep(Duration::from_secs(17 * 60)).await;
    let push_cursor = n1.forest().cursor(&t, CursorKind::Push, 2).unwrap();
    let pull_cursor = n2.forest().cursor(&t, CursorKind::Pull, 1).unwrap();
    assert_eq!(push_cursor, 100);
    assert_eq!(pull_cursor, 100);

    stop_node(&net, n1).await;
    stop_node(&net, n2).await;
    let n1 = start_node(&net, configs[0].clone(), open(&configs[0]));
    let n2 = start_node(&net, configs[1].clone(), open(&configs[1]));
    let calls_before = net.calls();
    n2.sync_now().await;
    // One Healthcheck (the peer is who it is configured as), one
    // TreeList and one empty GetOpLog page: nothing is pulled again.
    assert_eq!(net.calls() - calls_before, 3);
    assert_eq!(n2.stats().ops_pulled, 0);
    // The restarted pusher found nothing behind its durable cursor.
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(n1.stats().ops_pushed, 0);
    assert!(n1.replication_idle());
    assert_eq!(dump(&n1, &t), dump(&n2, &t));
}

#[tokio::test(start_paused = true)]
async fn restart_pushes_what_was_not_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let net = LocalNet::new();
    let mut configs = cluster_configs(2);
    for c in &mut configs {
        c.pilorama.path = dir.path().join(format!("node{}.db", c.node.replica_id));
    }
    let open =
        |c: &arbor::config::Config| Forest::open(&c.pilorama.path, c.forest_options()).unwrap();
    let n1 = start_node(&net, configs[0].clone(), open(&configs[0]));
    let n2 = start_node(&net, configs[1].clone(), open(&configs[1]));
    net.set_down(2, true);
    let t = tree("t");
    for i in 0..10 {
        add(&n1, &t, ROOT, &format!("n{i}")).await;
    }
    assert!(!n1.replication_idle());
    // Node 1 restarts before any push got through; with sync off, only its
    // durable push cursor remembers what node 2 still lacks.
    stop_node(&net, n1).await;
    net.set_down(2, false);
    let n1 = start_node(&net, configs[0].clone(), open(&configs[0]));
    eventually("pushed after restart", PATIENCE, || n1.replication_idle()).await;
    assert_eq!(dump(&n1, &t), dump(&n2, &t));
    assert_eq!(n2.stats().sync_rounds, 0);
}

async fn expect_error(service: &Service, request: Request) -> Error {
    match service.handle(&Caller::Anonymous, request.clone()).await {
        Response::Error(error) => error,
        other => panic!("{request:?} answered {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn bad_requests_get_typed_errors() {
    let net = LocalNet::new();
    let mut config = cluster_configs(1).remove(0);
    config.limits.max_meta_bytes = 256;
    config.limits.max_path_len = 4;
    config
        .node
        .containers
        .push(ContainerConfig::new(arbor::ContainerId([9; 32]), vec![]));
    // A container listed without this node: it is not ours.
    config.node.containers[0].replicas = vec![];
    let forest = memory_forest(&config);
    let node = start_node(&net, config, forest);
    let t = tree("t");
    add(&node, &t, ROOT, "x").await;
    let unknown = tree("nope");
    let path = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    let get = |tree: TreeKey, attr: &str, p: Vec<String>| Request::GetNodeByPath {
        tree,
        attr: attr.into(),
        path: p,
        attributes: vec![],
        latest_only: false,
        all_attributes: true,
    };
    assert_eq!(
        expect_error(&node, get(unknown.clone(), ATTR_FILE_NAME, path(&["x"]))).await,
        Error::TreeNotFound
    );
    let subtree = Request::GetSubTree {
        tree: unknown.clone(),
        root: ROOT,
        depth: 0,
    };
    assert_eq!(expect_error(&node, subtree).await, Error::TreeNotFound);
    let meta = Request::GetMeta {
        tree: unknown.clone(),
        node: 1,
    };
    assert_eq!(expect_error(&node, meta).await, Error::TreeNotFound);
    let oplog = Request::GetOpLog {
        tree: unknown,
        from_height: 0,
        limit: 10,
    };
    assert_eq!(expect_error(&node, oplog).await, Error::TreeNotFound);
    assert!(matches!(
        expect_error(&node, get(t.clone(), "Size", path(&["x"]))).await,
        Error::UnsupportedAttribute(_)
    ));
    assert_eq!(
        expect_error(&node, get(t.clone(), ATTR_FILE_NAME, vec![])).await,
        Error::EmptyPath
    );
    let add_by_path = |attr: &str, p: Vec<String>, items: Vec<KeyValue>| Request::AddByPath {
        tree: t.clone(),
        attr: attr.into(),
        path: p,
        items,
    };
    assert_eq!(
        expect_error(&node, add_by_path(ATTR_FILE_NAME, vec![], vec![])).await,
        Error::EmptyPath
    );
    assert!(matches!(
        expect_error(&node, add_by_path("Other", path(&["a"]), vec![])).await,
        Error::UnsupportedAttribute(_)
    ));
    let long = path(&["a", "b", "c", "d", "e"]);
    assert!(matches!(
        expect_error(&node, add_by_path(ATTR_FILE_NAME, long, vec![])).await,
        Error::TooLarge { what, .. } if what == "path"
    ));
    let big = vec![kv("blob", &"x".repeat(300))];
    assert!(matches!(
        expect_error(&node, add_by_path(ATTR_FILE_NAME, path(&["a"]), big.clone())).await,
        Error::TooLarge { what, .. } if what == "meta"
    ));
    let add_big = Request::Add {
        tree: t.clone(),
        parent: ROOT,
        items: big,
    };
    assert!(matches!(
        expect_error(&node, add_big).await,
        Error::TooLarge { .. }
    ));
    let move_root = Request::Move {
        tree: t.clone(),
        parent: 5,
        node: ROOT,
        items: vec![],
    };
    assert_eq!(expect_error(&node, move_root).await, Error::RootImmutable);
    let remove_root = Request::Remove {
        tree: t.clone(),
        node: ROOT,
    };
    assert_eq!(expect_error(&node, remove_root).await, Error::RootImmutable);
    let remove_trash = Request::Remove {
        tree: t.clone(),
        node: TRASH,
    };
    assert!(matches!(
        expect_error(&node, remove_trash).await,
        Error::InvalidOp(_)
    ));
    let bad_op = Move {
        parent: ROOT,
        child: 77,
        meta: arbor::Meta {
            time: 5, // counter 0: not a valid timestamp
            items: vec![],
        },
    };
    let apply = Request::Apply {
        tree: t.clone(),
        ops: vec![bad_op],
    };
    assert!(matches!(
        expect_error(&node, apply).await,
        Error::InvalidOp(_)
    ));
    let foreign = arbor::ContainerId([9; 32]);
    let list = Request::TreeList { cid: foreign };
    assert!(matches!(
        expect_error(&node, list).await,
        Error::NotReplica(_)
    ));
    let write_foreign = Request::Add {
        tree: TreeKey::new(foreign, "t"),
        parent: ROOT,
        items: vec![],
    };
    assert!(matches!(
        expect_error(&node, write_foreign).await,
        Error::NotReplica(_)
    ));
    let meta = Request::GetMeta {
        tree: t.clone(),
        node: 12345,
    };
    assert_eq!(expect_error(&node, meta).await, Error::NodeNotFound(12345));
    // Nothing of the above changed the tree.
    assert_eq!(dump(&node, &t).unwrap().log.len(), 1);
    assert!(matches!(
        node.handle(&Caller::Anonymous, Request::Healthcheck).await,
        Response::Health { replica_id: 1, .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn reads_are_bounded_and_filtered() {
    let net = LocalNet::new();
    let mut config = cluster_configs(1).remove(0);
    config.limits.sync_page_size = 4;
    config.limits.max_subtree_nodes = 5;
    let forest = memory_forest(&config);
    let node = start_node(&net, config, forest);
    let t = tree("t");
    for i in 0..10 {
        add(&node, &t, ROOT, &format!("n{i}")).await;
    }
    let oplog = Request::GetOpLog {
        tree: t.clone(),
        from_height: 2,
        limit: 1000,
    };
    match node.handle(&Caller::Anonymous, oplog).await {
        Response::OpLog {
            entries,
            next_height,
        } => {
            assert_eq!(
                entries.iter().map(|e| e.height).collect::<Vec<_>>(),
                vec![2, 3, 4, 5]
            );
            assert_eq!(next_height, 6);
        }
        other => panic!("{other:?}"),
    }
    let subtree = Request::GetSubTree {
        tree: t.clone(),
        root: ROOT,
        depth: 0,
    };
    assert!(matches!(
        expect_error(&node, subtree).await,
        Error::TooLarge { .. }
    ));
    let shallow = Request::GetSubTree {
        tree: t.clone(),
        root: ROOT,
        depth: 1,
    };
    assert!(
        matches!(node.handle(&Caller::Anonymous, shallow).await, Response::Nodes(n) if n.len() == 1)
    );

    let get = |attributes: Vec<String>, all_attributes: bool| Request::GetNodeByPath {
        tree: t.clone(),
        attr: ATTR_FILE_NAME.into(),
        path: vec!["n3".into()],
        attributes,
        latest_only: true,
        all_attributes,
    };
    let Response::Nodes(filtered) = node
        .handle(&Caller::Anonymous, get(vec!["k".into()], false))
        .await
    else {
        panic!()
    };
    assert_eq!(filtered.len(), 1);
    assert_eq!(filtered[0].meta.items, vec![kv("k", "n3")]);
    let Response::Nodes(none) = node.handle(&Caller::Anonymous, get(vec![], false)).await else {
        panic!()
    };
    assert!(none[0].meta.items.is_empty());
    let Response::Nodes(all) = node.handle(&Caller::Anonymous, get(vec![], true)).await else {
        panic!()
    };
    assert_eq!(all[0].meta.items.len(), 2);
    assert_eq!(
        node.handle(&Caller::Anonymous, Request::TreeList { cid: cid() })
            .await,
        Response::Trees(vec!["t".into()])
    );
}

#[tokio::test(start_paused = true)]
async fn apply_is_idempotent_and_drop_removes_trees() {
    let net = LocalNet::new();
    let configs = cluster_configs(2);
    let source = memory_forest(&configs[0]);
    let n1 = start_node(&net, configs[0].clone(), source);
    let n2 = start_node(&net, configs[1].clone(), memory_forest(&configs[1]));
    net.set_down(2, true);
    let t = tree("t");
    for i in 0..5 {
        add(&n1, &t, ROOT, &format!("n{i}")).await;
    }
    let ops = n1.forest().dump(&t).unwrap().log;
    let apply = Request::Apply {
        tree: t.clone(),
        ops: ops.clone(),
    };
    assert_eq!(
        n2.handle(&Caller::Anonymous, apply.clone()).await,
        Response::Applied { fresh: 5 }
    );
    assert_eq!(
        n2.handle(&Caller::Anonymous, apply).await,
        Response::Applied { fresh: 0 }
    );
    assert_eq!(dump(&n1, &t), dump(&n2, &t));
    let drop = Request::Drop {
        cid: cid(),
        tree: Some("t".into()),
    };
    assert_eq!(n2.handle(&Caller::Anonymous, drop).await, Response::Done);
    assert!(dump(&n2, &t).is_none());
    assert_eq!(
        n2.handle(&Caller::Anonymous, Request::TreeList { cid: cid() })
            .await,
        Response::Trees(vec![])
    );
}

#[tokio::test(start_paused = true)]
async fn sync_survives_dropped_calls() {
    let net = LocalNet::new();
    let nodes = start_cluster(&net, cluster_configs(3));
    let t = tree("t");
    add(&nodes[0], &t, ROOT, "first").await;
    eventually("first write replicated", PATIENCE, || all_idle(&nodes)).await;
    net.set_down(3, true);
    for i in 0..6 {
        add(&nodes[i % 2], &t, ROOT, &format!("n{i}")).await;
    }
    net.set_down(3, false);
    // Calls to node 1 are lost: node 3 skips it this round and keeps what
    // it got from node 2; nothing local is dropped.
    net.drop_calls_to(1, 1000);
    nodes[2].sync_now().await;
    assert!(nodes[2].stats().sync_peer_errors > 0);
    let partial = dump(&nodes[2], &t).unwrap();
    assert_eq!(partial.log.len(), 7, "node 2 holds every op already");
    net.drop_calls_to(1, 0);
    nodes[2].sync_now().await;
    // Node 2's pushes to node 1 were lost too; they are sent again.
    eventually("replication idle", PATIENCE, || all_idle(&nodes)).await;
    assert_converged(&nodes, &[t]);
}

/// A node that holds the first op of a tree and missed the 100 after it
/// while its peer could not push to it, pulling in pages of 16.
async fn joiner_behind_by_100(net: &Arc<LocalNet>) -> (Vec<Arc<Service>>, TreeKey) {
    let mut configs = cluster_configs(2);
    for c in &mut configs {
        c.limits.sync_page_size = 16;
    }
    let nodes = start_cluster(net, configs);
    let t = tree("t");
    add(&nodes[0], &t, ROOT, "first").await;
    eventually("first write replicated", PATIENCE, || all_idle(&nodes)).await;
    // Node 1's pushes are lost; node 2's calls to it get through.
    net.cut(1, 2, true);
    for i in 0..100 {
        add(&nodes[0], &t, ROOT, &format!("n{i}")).await;
    }
    (nodes, t)
}

/// The heights node 2's GetOpLog calls asked from, each with the height
/// node 2's own log had reached when the call was sent.
fn watch_pulls(
    net: &LocalNet,
    joiner: &Arc<Service>,
    t: &TreeKey,
) -> Arc<std::sync::Mutex<Vec<(u64, u64)>>> {
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (seen, joiner, t) = (asked.clone(), Arc::downgrade(joiner), t.clone());
    net.watch_oplog_calls(Some(Arc::new(move |from, height| {
        let held = joiner
            .upgrade()
            .map(|j| j.forest().next_height(&t).unwrap_or(0));
        if let (2, Some(held)) = (from, held) {
            seen.lock().unwrap().push((height, held));
        }
    })));
    asked
}

/// A pull asks for the next page of a run while the page before it
/// applies: every GetOpLog call but the first is sent before the joiner's
/// log reaches the height it asks from. It ends with the whole log.
#[tokio::test(start_paused = true)]
async fn a_pull_fetches_the_next_page_while_one_applies() {
    let net = LocalNet::new();
    let (nodes, t) = joiner_behind_by_100(&net).await;
    let asked = watch_pulls(&net, &nodes[1], &t);
    nodes[1].sync_now().await;
    let asked = asked.lock().unwrap().clone();
    let heights: Vec<u64> = asked.iter().map(|&(height, _)| height).collect();
    let pages: Vec<u64> = (1..101).step_by(16).collect();
    assert_eq!(heights, pages, "one call a page, in height order");
    let ahead = asked
        .iter()
        .filter(|&&(height, held)| held < height)
        .count();
    assert_eq!(ahead, pages.len() - 1, "{asked:?}");
    assert_eq!(nodes[1].stats().ops_pulled, 100);
    assert_eq!(dump(&nodes[1], &t), dump(&nodes[0], &t));
}

/// A page asked for ahead whose call fails stops the pass only once the
/// page before it has applied, as it would have without the overlap; the
/// next round goes on from there.
#[tokio::test(start_paused = true)]
async fn a_page_asked_for_ahead_that_fails_keeps_the_page_before() {
    let net = LocalNet::new();
    let (nodes, t) = joiner_behind_by_100(&net).await;
    let weak = Arc::downgrade(&net);
    net.watch_oplog_calls(Some(Arc::new(move |from, height| {
        if let (2, 33, Some(net)) = (from, height, weak.upgrade()) {
            net.cut(2, 1, true);
        }
    })));
    nodes[1].sync_now().await;
    assert!(nodes[1].stats().sync_peer_errors > 0);
    assert_eq!(nodes[1].forest().next_height(&t).unwrap(), 33);
    assert_eq!(nodes[1].stats().ops_pulled, 32);
    net.watch_oplog_calls(None);
    net.cut(2, 1, false);
    nodes[1].sync_now().await;
    assert_eq!(nodes[1].stats().ops_pulled, 100);
    assert_eq!(dump(&nodes[1], &t), dump(&nodes[0], &t));
}

/// Adds `count` nodes to `t`, retrying each add that a full batcher
/// refused: a client load that keeps the node's write queue full.
async fn add_through_overload(service: Arc<Service>, t: TreeKey, name: String, count: usize) {
    for i in 0..count {
        let request = Request::Add {
            tree: t.clone(),
            parent: ROOT,
            items: vec![kv(ATTR_FILE_NAME, &format!("{name}-{i}"))],
        };
        loop {
            match service.handle(&Caller::Anonymous, request.clone()).await {
                Response::Added { .. } => break,
                Response::Error(Error::Overloaded(_)) => {
                    tokio::time::sleep(Duration::from_millis(1)).await
                }
                other => panic!("add failed: {other:?}"),
            }
        }
    }
}

/// Regression (sync-only seed 341): a sync round on a node whose batcher
/// was full took the refusal of a pulled page as the peer's failure and
/// skipped the peer for the rest of the round, so one round did not bring
/// the node the peer's ops. A full batcher is the node's own load; the
/// page waits for room. Failed before the fix: `t` stayed empty on node 2.
#[tokio::test(start_paused = true)]
async fn sync_waits_out_its_own_full_batcher() {
    let net = LocalNet::new();
    let mut configs = cluster_configs(2);
    for c in &mut configs {
        c.limits.max_pending_writes = 4;
        c.limits.sync_page_size = 4;
    }
    list_container_on_both(&mut configs);
    let nodes = start_cluster(&net, configs);
    let t = tree("t");
    net.cut(1, 2, true);
    for i in 0..12 {
        add(&nodes[0], &t, ROOT, &format!("n{i}")).await;
    }
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let load = add_through_overload(nodes[1].clone(), tree("load"), format!("w{w}"), 10);
            tokio::spawn(load)
        })
        .collect();
    nodes[1].sync_now().await;
    let pulled = dump(&nodes[1], &t).map_or(0, |d| d.log.len());
    assert_eq!(pulled, 12, "one round pulls the whole log of the peer");
    assert_eq!(dump(&nodes[1], &t), dump(&nodes[0], &t));
    for writer in writers {
        writer.await.unwrap();
    }
    assert!(
        nodes[1].stats().writes_rejected_overload > 0,
        "the batcher was never full: the test proves nothing"
    );
    assert_eq!(nodes[1].stats().sync_peer_errors, 0);
}

/// Regression (found by service_random): a peer with a smaller page limit
/// refused every push as too large, forever.
#[tokio::test(start_paused = true)]
async fn pushes_adapt_to_a_peer_with_smaller_pages() {
    let net = LocalNet::new();
    let mut configs = cluster_configs(2);
    configs[0].limits.sync_page_size = 8;
    configs[1].limits.sync_page_size = 2;
    let nodes = start_cluster(&net, configs);
    net.set_down(2, true);
    let t = tree("t");
    for i in 0..10 {
        add(&nodes[0], &t, ROOT, &format!("n{i}")).await;
    }
    net.set_down(2, false);
    eventually("replication idle", PATIENCE, || all_idle(&nodes)).await;
    assert_converged(&nodes, &[t]);
}

#[tokio::test(start_paused = true)]
async fn sync_does_not_resubmit_ops_pushes_delivered() {
    let net = LocalNet::new();
    let nodes: Vec<_> = cluster_configs(3)
        .into_iter()
        .map(|mut c| {
            c.limits.sync_page_size = 4;
            let forest = memory_forest(&c);
            start_node(&net, c, forest)
        })
        .collect();
    let t = tree("t");
    for i in 0..15 {
        add(&nodes[i % 3], &t, ROOT, &format!("n{i}")).await;
    }
    eventually("replication idle", PATIENCE, || all_idle(&nodes)).await;
    let before = nodes[2].stats();
    nodes[2].sync_now().await;
    let after = nodes[2].stats();
    // Both peers' logs hold all 15 ops, all of them already here.
    assert_eq!(after.sync_rounds, before.sync_rounds + 1);
    assert_eq!(after.ops_pulled, before.ops_pulled);
    assert_eq!(after.writes_committed, before.writes_committed);
    assert_eq!(after.batches_committed, before.batches_committed);
    assert_eq!(after.sync_peer_errors, 0);
    assert_converged(&nodes, &[t]);
}

/// A pull lists the peer's log by stamps and fetches only what it lacks:
/// here node 3 holds node 2's ops (pushed) and lacks node 1's (its pushes
/// to node 3 are lost), scattered between them in both peers' logs.
#[tokio::test(start_paused = true)]
async fn sync_fetches_only_the_ops_it_lacks() {
    let net = LocalNet::new();
    let mut configs = cluster_configs(3);
    for c in &mut configs {
        c.limits.sync_page_size = 4;
        c.limits.sync_stamp_page_size = 16;
    }
    let nodes = start_cluster(&net, configs);
    let t = tree("t");
    net.cut(1, 3, true);
    let mut lacking = 0;
    for (from_2, from_1) in [(40, 1), (40, 2), (5, 1), (3, 0)] {
        for i in 0..from_2 {
            add(&nodes[1], &t, ROOT, &format!("b{lacking}-{i}")).await;
        }
        for i in 0..from_1 {
            add(&nodes[0], &t, ROOT, &format!("a{lacking}-{i}")).await;
            lacking += 1;
        }
        // Node 1's ops reach node 2, so both peers' logs interleave them.
        eventually("node 2 pushed", PATIENCE, || nodes[1].replication_idle()).await;
    }
    let log_len = dump(&nodes[0], &t).unwrap().log.len() as u64;
    assert_eq!(
        dump(&nodes[2], &t).unwrap().log.len() as u64,
        log_len - lacking
    );
    let sent_before = net.oplog_entries();
    nodes[2].sync_now().await;
    assert_eq!(nodes[2].stats().ops_pulled, lacking);
    assert_eq!(nodes[2].stats().sync_peer_errors, 0);
    assert_eq!(dump(&nodes[2], &t), dump(&nodes[0], &t));
    // The four missing ops sit in two runs of node 1's log (one alone, three
    // within 8 heights); node 2's log then lacks nothing. Pulling whole
    // logs would have sent 2 x 92 ops.
    let sent = net.oplog_entries() - sent_before;
    assert!((lacking..=12).contains(&sent), "{sent} ops fetched");
    net.cut(1, 3, false);
    eventually("replication idle", PATIENCE, || all_idle(&nodes)).await;
    assert_converged(&nodes, &[t]);
}

#[tokio::test(start_paused = true)]
async fn replica_restored_from_nothing_pulls_its_own_ops_back() {
    let net = LocalNet::new();
    let mut configs = cluster_configs(2);
    // Listed, so the emptied node looks for the tree it no longer holds.
    list_container_on_both(&mut configs);
    let n1 = start_node(&net, configs[0].clone(), memory_forest(&configs[0]));
    let n2 = start_node(&net, configs[1].clone(), memory_forest(&configs[1]));
    let t = tree("t");
    for i in 0..9 {
        add(&n1, &t, ROOT, &format!("n{i}")).await;
    }
    add(&n2, &t, ROOT, "from-2").await;
    eventually("replication idle", PATIENCE, || {
        n1.replication_idle() && n2.replication_idle()
    })
    .await;
    // Node 1 loses its disk: only node 2 still holds node 1's ops.
    stop_node(&net, n1).await;
    let n1 = start_node(&net, configs[0].clone(), memory_forest(&configs[0]));
    n1.sync_now().await;
    assert_eq!(n1.stats().ops_pulled, 10);
    assert_eq!(dump(&n1, &t), dump(&n2, &t));
}

#[tokio::test(start_paused = true)]
async fn idle_trees_cost_no_push_passes() {
    let net = LocalNet::new();
    let nodes = start_cluster(&net, cluster_configs(2));
    let t = tree("t");
    for i in 0..3 {
        add(&nodes[0], &t, ROOT, &format!("n{i}")).await;
    }
    eventually("replication idle", PATIENCE, || all_idle(&nodes)).await;
    // Node 2's first sweep after applying looks once for ops of its own.
    tokio::time::sleep(Duration::from_secs(2 * 60)).await;
    let passes: Vec<u64> = nodes.iter().map(|n| n.stats().push_passes).collect();
    assert!(passes[0] > 0);
    // Ten sweeps (one per replication timeout) over a tree nothing changed.
    tokio::time::sleep(Duration::from_secs(10 * 60)).await;
    let later: Vec<u64> = nodes.iter().map(|n| n.stats().push_passes).collect();
    assert_eq!(later, passes);
    // A new write is still pushed.
    add(&nodes[0], &t, ROOT, "late").await;
    eventually("replication idle", PATIENCE, || all_idle(&nodes)).await;
    assert!(nodes[0].stats().push_passes > passes[0]);
    assert_converged(&nodes, &[t]);
}

#[tokio::test(start_paused = true)]
async fn pull_cursor_is_made_durable_lazily() {
    let net = LocalNet::new();
    let mut configs = cluster_configs(2);
    // Listed, so node 2 looks for the tree before it holds it.
    list_container_on_both(&mut configs);
    let nodes = start_cluster(&net, configs);
    let t = tree("t");
    // Only pulls carry node 1's ops to node 2.
    net.cut(1, 2, true);
    for i in 0..3 {
        add(&nodes[0], &t, ROOT, &format!("a{i}")).await;
    }
    let n2 = &nodes[1];
    let durable = || n2.forest().cursor(&t, CursorKind::Pull, 1).unwrap();
    n2.sync_now().await;
    assert_eq!(durable(), 3, "the first pass writes the cursor");
    for i in 0..2 {
        add(&nodes[0], &t, ROOT, &format!("b{i}")).await;
    }
    n2.sync_now().await;
    assert_eq!(n2.stats().ops_pulled, 5);
    assert_eq!(durable(), 3, "a recent durable cursor is not rewritten");
    // Pulling again goes on from the in-memory cursor: nothing is fetched
    // twice, and once the durable copy is old enough it is written.
    tokio::time::sleep(Duration::from_secs(17 * 60)).await;
    n2.sync_now().await;
    assert_eq!(n2.stats().ops_pulled, 5);
    assert_eq!(durable(), 5);
    assert_eq!(dump(&nodes[0], &t), dump(n2, &t));
}

/// What a `BlockingGate` waits for.
type GateCondition = Box<dyn Fn() -> bool + Send>;

/// Blocking work whose end is held once on demand: the first work after
/// which `hold_after` holds (checked on its thread right after it ran)
/// waits for `release` before its caller goes on, so a test can act
/// between a storage commit and what its caller does next.
#[derive(Default)]
struct BlockingGate {
    hold_after: std::sync::Mutex<Option<GateCondition>>,
    held: Notify,
    release: Notify,
}

struct GatedRuntime {
    inner: TokioRuntime,
    gate: Arc<BlockingGate>,
}

impl Runtime for GatedRuntime {
    fn spawn(&self, name: &'static str, task: BoxFuture<'static, ()>) {
        self.inner.spawn(name, task);
    }

    fn run_blocking(&self, work: Box<dyn FnOnce() + Send + 'static>) -> BoxFuture<'static, ()> {
        let gate = self.gate.clone();
        let hold = Arc::new(AtomicBool::new(false));
        let done = self.inner.run_blocking(Box::new({
            let (gate, hold) = (gate.clone(), hold.clone());
            move || {
                work();
                let mut condition = gate.hold_after.lock().unwrap();
                if condition.as_ref().is_some_and(|holds| holds()) {
                    *condition = None;
                    hold.store(true, AtomicOrdering::SeqCst);
                }
            }
        }));
        Box::pin(async move {
            done.await;
            if hold.load(AtomicOrdering::SeqCst) {
                gate.held.notify_one();
                gate.release.notified().await;
            }
        })
    }

    fn log_epoch_fresh(&self) -> u64 {
        self.inner.log_epoch_fresh()
    }
}

// Regression (misconfig seed 509 of the simulator): a client's write that
// created a tree again after a Drop's commit, but before the Drop ended,
// lost its push state to the Drop's forgetting, and nothing pushed it any
// more (replication never went idle). Failed before the fix.
#[tokio::test(start_paused = true)]
async fn a_tree_created_again_while_its_drop_ends_is_still_pushed() {
    for whole_container in [false, true] {
        let net = LocalNet::new();
        let configs = cluster_configs(2);
        let gate = Arc::new(BlockingGate::default());
        let env = Env {
            runtime: Arc::new(GatedRuntime {
                inner: TokioRuntime::default(),
                gate: gate.clone(),
            }),
            ..test_env()
        };
        let forest = Arc::new(memory_forest(&configs[0]));
        let watched = forest.clone();
        let n1 = Service::start(configs[0].clone(), forest, env, net.transport(1)).unwrap();
        net.attach(1, n1.clone());
        let n2 = start_node(&net, configs[1].clone(), memory_forest(&configs[1]));
        let nodes = [n1.clone(), n2.clone()];
        let t = tree("t");
        add(&n1, &t, ROOT, "before").await;
        eventually("replication idle", PATIENCE, || all_idle(&nodes)).await;
        // The gate holds the work that committed the drop.
        let gone = t.clone();
        *gate.hold_after.lock().unwrap() = Some(Box::new(move || watched.dump(&gone).is_err()));
        let drop = Request::Drop {
            cid: cid(),
            tree: (!whole_container).then(|| "t".to_string()),
        };
        let dropping = tokio::spawn({
            let n1 = n1.clone();
            async move { n1.handle(&Caller::Anonymous, drop).await }
        });
        gate.held.notified().await;
        assert!(dump(&n1, &t).is_none(), "the drop committed");
        let after = add(&n1, &t, ROOT, "after").await;
        gate.release.notify_one();
        assert_eq!(dropping.await.unwrap(), Response::Done);
        eventually("replication idle", PATIENCE, || all_idle(&nodes)).await;
        let held = dump(&n2, &t).expect("node 2 keeps its tree");
        assert!(
            held.log.iter().any(|op| op.child == after),
            "the write after the drop reached node 2 (whole container: {whole_container})"
        );
    }
}
