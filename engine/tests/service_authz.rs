//! Who may call what, and what a replicated op must carry, through the
//! service with explicit callers (docs/design.md §9): refused calls change
//! nothing on any replica, forged and runaway stamps never get in or are
//! detected, and reads stop at their bound.

mod service_support;

use arbor::config::{AccessConfig, Config, ContainerAccess, Grants, Role};
use arbor::forest::ListOrder;
use arbor::proto::{Request, Response};
use arbor::service::Service;
use arbor::types::{timestamp_replica, COUNTER_MAX};
use arbor::{Caller, Error, KeyValue, TreeKey, ATTR_FILE_NAME, ROOT, TRASH};
use service_support::*;
use std::sync::Arc;
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(3600);

fn client(name: &str) -> Caller {
    Caller::Client(name.into())
}

/// `owner`, `writer` and `reader` hold their roles on `cid()`; nobody
/// else, anonymous included, holds anything.
fn strict_access() -> AccessConfig {
    let mut grants = Grants::default();
    grants.grant(Role::Owner, "owner");
    grants.grant(Role::Writer, "writer");
    grants.grant(Role::Reader, "reader");
    AccessConfig {
        containers: vec![ContainerAccess { cid: cid(), grants }],
        ..AccessConfig::default()
    }
}

fn configs(count: u16, access: &AccessConfig) -> Vec<Config> {
    let mut configs = cluster_configs(count);
    for config in &mut configs {
        config.access = access.clone();
    }
    configs
}

async fn add_as(node: &Service, caller: &Caller, tree: &TreeKey, name: &str) -> u64 {
    let request = Request::Add {
        tree: tree.clone(),
        parent: ROOT,
        items: file(name),
    };
    match node.handle(caller, request).await {
        Response::Added { node } => node,
        other => panic!("add failed: {other:?}"),
    }
}

/// One request of every kind the service answers, against tree `t`.
fn every_request(t: &TreeKey, node: u64) -> Vec<(&'static str, Request)> {
    vec![
        (
            "Add",
            Request::Add {
                tree: t.clone(),
                parent: ROOT,
                items: file("x"),
            },
        ),
        (
            "AddByPath",
            Request::AddByPath {
                tree: t.clone(),
                attr: ATTR_FILE_NAME.into(),
                path: vec!["d".into()],
                items: file("x"),
            },
        ),
        (
            "Move",
            Request::Move {
                tree: t.clone(),
                parent: ROOT,
                node,
                items: file("moved"),
            },
        ),
        (
            "Remove",
            Request::Remove {
                tree: t.clone(),
                node,
            },
        ),
        (
            "GetNodeByPath",
            Request::GetNodeByPath {
                tree: t.clone(),
                attr: ATTR_FILE_NAME.into(),
                path: vec!["a".into()],
                attributes: vec![],
                latest_only: false,
                all_attributes: true,
            },
        ),
        (
            "GetMeta",
            Request::GetMeta {
                tree: t.clone(),
                node,
            },
        ),
        (
            "GetSubTree",
            Request::GetSubTree {
                tree: t.clone(),
                root: ROOT,
                depth: 0,
            },
        ),
        (
            "ListChildren",
            Request::ListChildren {
                tree: t.clone(),
                parent: ROOT,
                order: ListOrder::Name,
                after: None,
                limit: 10,
            },
        ),
        (
            "GetSubTreePage",
            Request::GetSubTreePage {
                tree: t.clone(),
                root: ROOT,
                depth: 0,
                order: ListOrder::Id,
                after: None,
                limit: 10,
            },
        ),
        ("TreeList", Request::TreeList { cid: t.cid }),
        (
            "Apply",
            Request::Apply {
                tree: t.clone(),
                ops: vec![root_op(50, 2, "forged")],
            },
        ),
        (
            "GetOpLog",
            Request::GetOpLog {
                tree: t.clone(),
                from_height: 0,
                limit: 10,
            },
        ),
        (
            "GetOpLogStamps",
            Request::GetOpLogStamps {
                tree: t.clone(),
                from_height: 0,
                limit: 10,
            },
        ),
        (
            "Drop",
            Request::Drop {
                cid: t.cid,
                tree: None,
            },
        ),
    ]
}

/// The operations each caller may send, by the roles of `strict_access`
/// (replicas: the sync RPCs, with ops of their own).
fn allowed(caller: &Caller, operation: &str) -> bool {
    const READS: [&str; 6] = [
        "GetNodeByPath",
        "GetMeta",
        "GetSubTree",
        "ListChildren",
        "GetSubTreePage",
        "TreeList",
    ];
    const WRITES: [&str; 4] = ["Add", "AddByPath", "Move", "Remove"];
    const SYNC: [&str; 4] = ["Apply", "GetOpLog", "GetOpLogStamps", "TreeList"];
    let reads = READS.contains(&operation);
    let writes = WRITES.contains(&operation);
    match caller {
        Caller::Client(name) if name == "owner" => operation != "Apply",
        Caller::Client(name) if name == "writer" => reads || writes,
        Caller::Client(name) if name == "reader" => reads,
        Caller::Peer(2) => SYNC.contains(&operation),
        _ => false,
    }
}

/// Every RPC a caller lacks the right for gets `PermissionDenied` naming
/// it, and changes nothing on the node; what it holds is served.
#[tokio::test(start_paused = true)]
async fn each_rpc_without_the_right_is_refused_and_changes_nothing() {
    let net = LocalNet::new();
    let nodes = start_cluster(&net, configs(2, &strict_access()));
    net.set_down(2, true);
    let t = tree("t");
    let node = add_as(&nodes[0], &client("owner"), &t, "a").await;
    let callers = [
        client("reader"),
        client("writer"),
        client("owner"),
        client("stranger"),
        Caller::Anonymous,
        Caller::Peer(2),
        Caller::Peer(3),
    ];
    let mut refused = 0;
    for caller in &callers {
        for (operation, request) in every_request(&t, node) {
            if allowed(caller, operation) {
                continue;
            }
            let before = dump(&nodes[0], &t);
            let answer = nodes[0].handle(caller, request).await;
            let Response::Error(Error::PermissionDenied {
                operation: named,
                caller: who,
            }) = answer
            else {
                panic!("{caller} sent {operation}: {answer:?}");
            };
            assert!(named.starts_with(operation), "{named} for {operation}");
            assert_eq!(who, caller.to_string());
            assert_eq!(dump(&nodes[0], &t), before, "{caller} {operation}");
            refused += 1;
        }
    }
    assert_eq!(nodes[0].stats().requests_refused, refused);
    // What the roles hold is served.
    let meta = Request::GetMeta {
        tree: t.clone(),
        node,
    };
    let served = nodes[0].handle(&client("reader"), meta).await;
    assert!(matches!(served, Response::Nodes(n) if n.len() == 1));
    add_as(&nodes[0], &client("writer"), &t, "b").await;
}

/// Containers nobody listed and anonymous callers get nothing by default.
#[tokio::test(start_paused = true)]
async fn unknown_containers_and_anonymous_get_nothing_by_default() {
    let net = LocalNet::new();
    let nodes = start_cluster(&net, configs(1, &AccessConfig::default()));
    let t = tree("t");
    for caller in [client("owner"), Caller::Anonymous] {
        for (operation, request) in every_request(&t, 7) {
            let answer = nodes[0].handle(&caller, request).await;
            assert!(
                matches!(answer, Response::Error(Error::PermissionDenied { .. })),
                "{caller} {operation}: {answer:?}"
            );
        }
    }
    assert!(nodes[0].forest().tree_list(&cid()).unwrap().is_empty());
    let health = nodes[0]
        .handle(&Caller::Anonymous, Request::Healthcheck)
        .await;
    assert!(
        matches!(health, Response::Health { replica_id: 1, .. }),
        "{health:?}"
    );
}

/// A client never injects a replicated op, whatever its role; a peer
/// carries only its own ops.
#[tokio::test(start_paused = true)]
async fn apply_from_a_client_or_with_anothers_stamps_is_refused() {
    let net = LocalNet::new();
    let nodes = start_cluster(&net, configs(3, &strict_access()));
    let t = tree("t");
    let apply = |replica| Request::Apply {
        tree: t.clone(),
        ops: vec![root_op(1, replica, "forged")],
    };
    for caller in [client("owner"), Caller::Anonymous, Caller::Peer(3)] {
        let answer = nodes[0].handle(&caller, apply(2)).await;
        assert!(
            matches!(answer, Response::Error(Error::PermissionDenied { .. })),
            "{caller}: {answer:?}"
        );
    }
    // Its own op from replica 2 is fine.
    let own = nodes[0].handle(&Caller::Peer(2), apply(2)).await;
    assert_eq!(own, Response::Applied { fresh: 1 });
}

/// The max-counter probe: an op at the end of the counter space is
/// refused by every replica (CounterTooFar), so writes go on everywhere
/// and no replica ever holds it.
#[tokio::test(start_paused = true)]
async fn the_max_counter_op_changes_nothing_on_any_replica() {
    let net = LocalNet::new();
    let nodes = start_cluster(&net, configs(3, &strict_access()));
    let t = tree("t");
    add_as(&nodes[1], &client("writer"), &t, "first").await;
    let runaway = root_op(COUNTER_MAX, 2, "runaway");
    for node in &nodes {
        let apply = Request::Apply {
            tree: t.clone(),
            ops: vec![runaway.clone()],
        };
        let answer = node.handle(&Caller::Peer(2), apply).await;
        let refused = matches!(answer, Response::Error(Error::CounterTooFar { .. }));
        let not_a_replica = node.config().node.replica_id == 2
            && matches!(answer, Response::Error(Error::PermissionDenied { .. }));
        assert!(refused || not_a_replica, "{answer:?}");
    }
    for node in &nodes {
        add_as(node, &client("writer"), &t, "after").await;
    }
    for node in &nodes {
        node.sync_now().await;
    }
    eventually("replicas converge", PATIENCE, || {
        let first = dump(&nodes[0], &t);
        nodes.iter().all(|n| dump(n, &t) == first)
    })
    .await;
    for node in &nodes {
        let log = dump(node, &t).unwrap().log;
        assert_eq!(log.len(), 4);
        assert!(log.iter().all(|o| o.ts() != runaway.ts()));
    }
}

/// The next-stamp forgery: replica 2's next timestamp with other content,
/// sent to node 1. Refused from anyone but replica 2; where the node
/// trusts every anonymous caller it gets in, and the real op under that
/// stamp is then detected as a stamp conflict by push and by sync, never
/// kept apart silently.
#[tokio::test(start_paused = true)]
async fn the_next_stamp_forgery_is_refused_or_detected() {
    let t = tree("t");
    let forged = root_op(1, 2, "forged");
    let apply = Request::Apply {
        tree: t.clone(),
        ops: vec![forged.clone()],
    };
    let net = LocalNet::new();
    let nodes = start_cluster(&net, configs(3, &strict_access()));
    for caller in [client("owner"), Caller::Anonymous, Caller::Peer(3)] {
        let answer = nodes[0].handle(&caller, apply.clone()).await;
        assert!(matches!(
            answer,
            Response::Error(Error::PermissionDenied { .. })
        ));
    }
    assert!(dump(&nodes[0], &t).is_none());

    let net = LocalNet::new();
    let nodes = start_cluster(&net, configs(3, &AccessConfig::trusting_everyone()));
    let answer = nodes[0].handle(&Caller::Anonymous, apply).await;
    assert_eq!(answer, Response::Applied { fresh: 1 });
    let real = add_as(&nodes[1], &Caller::Anonymous, &t, "real").await;
    assert_eq!(
        real, forged.child,
        "the forgery took replica 2's next stamp"
    );
    eventually("the push is refused as a conflict", PATIENCE, || {
        nodes[0].stats().stamp_conflicts > 0
    })
    .await;
    let pushed_conflicts = nodes[0].stats().stamp_conflicts;
    nodes[0].sync_now().await;
    assert!(nodes[0].stats().stamp_conflicts > pushed_conflicts);
    // The forged op stays where it is; nothing overwrote either side.
    let held = |n: &Arc<Service>| dump(n, &t).unwrap().log[0].meta.items.clone();
    assert_eq!(held(&nodes[0]), file("forged"));
    assert_eq!(held(&nodes[1]), file("real"));
    assert_eq!(timestamp_replica(forged.ts()), 2);
}

/// A push the peer refuses with `StampConflict` is not retried for good:
/// after `limits.push_conflict_passes_max` passes in a row the (tree,
/// peer) pair is parked, reported in the stats, and the pusher calls that
/// peer for that tree no more; the tree's other peer still gets every op.
#[tokio::test(start_paused = true)]
async fn a_push_refused_by_a_stamp_conflict_is_parked() {
    let t = tree("t");
    let net = LocalNet::new();
    let configs = configs(3, &AccessConfig::trusting_everyone());
    let passes_max = configs[1].limits.push_conflict_passes_max as u64;
    let nodes = start_cluster(&net, configs);
    let forged = Request::Apply {
        tree: t.clone(),
        ops: vec![root_op(1, 2, "forged")],
    };
    let answer = nodes[0].handle(&Caller::Anonymous, forged).await;
    assert_eq!(answer, Response::Applied { fresh: 1 });
    add_as(&nodes[1], &Caller::Anonymous, &t, "real").await;
    eventually("the pair is parked", PATIENCE, || {
        nodes[1].stats().push_pairs_parked == 1
    })
    .await;
    let parked = nodes[1].stats();
    assert!(parked.push_failures >= passes_max, "{parked:?}");
    add_as(&nodes[1], &Caller::Anonymous, &t, "later").await;
    eventually("the other peer gets every op", PATIENCE, || {
        dump(&nodes[2], &t).is_some_and(|d| d.log.len() == 2)
    })
    .await;
    tokio::time::sleep(PATIENCE).await;
    let later = nodes[1].stats();
    assert_eq!(later.push_pairs_parked, 1, "{later:?}");
    assert_eq!(
        later.push_failures, parked.push_failures,
        "retried: {later:?}"
    );
    assert_eq!(
        dump(&nodes[0], &t).unwrap().log[0].meta.items,
        file("forged")
    );
}

/// Add or Move under a parent that does not exist or under TRASH is
/// refused with `ParentNotLive`, storing nothing.
#[tokio::test(start_paused = true)]
async fn add_under_a_missing_parent_or_trash_is_refused() {
    let net = LocalNet::new();
    let nodes = start_cluster(&net, configs(1, &strict_access()));
    let t = tree("t");
    let writer = client("writer");
    let dir = add_as(&nodes[0], &writer, &t, "dir").await;
    let removed = add_as(&nodes[0], &writer, &t, "removed").await;
    let remove = Request::Remove {
        tree: t.clone(),
        node: removed,
    };
    assert_eq!(nodes[0].handle(&writer, remove).await, Response::Done);
    let before = dump(&nodes[0], &t);
    for parent in [removed, TRASH, 987_654_321] {
        let add = Request::Add {
            tree: t.clone(),
            parent,
            items: file("orphan"),
        };
        let answer = nodes[0].handle(&writer, add).await;
        assert_eq!(answer, Response::Error(Error::ParentNotLive(parent)));
        let moved = Request::Move {
            tree: t.clone(),
            parent,
            node: dir,
            items: file("dir"),
        };
        let answer = nodes[0].handle(&writer, moved).await;
        assert_eq!(answer, Response::Error(Error::ParentNotLive(parent)));
    }
    assert_eq!(dump(&nodes[0], &t), before);
}

/// A subtree over the message budget is refused as soon as the answer
/// passes it: the size reported is the budget plus at most one node, not
/// the size of the whole subtree.
#[tokio::test(start_paused = true)]
async fn a_large_subtree_read_stops_at_the_limit() {
    let net = LocalNet::new();
    let (nodes, meta_bytes) = large_meta_node(&net);
    let t = tree("t");
    let count = 200;
    for i in 0..count {
        let mut items = file(&format!("n{i}"));
        items.push(KeyValue::new("blob", vec![7u8; meta_bytes]));
        let add = Request::Add {
            tree: t.clone(),
            parent: ROOT,
            items,
        };
        assert!(matches!(
            nodes[0].handle(&client("writer"), add).await,
            Response::Added { .. }
        ));
    }
    let read = Request::GetSubTree {
        tree: t.clone(),
        root: ROOT,
        depth: 0,
    };
    let answer = nodes[0].handle(&client("reader"), read).await;
    assert_stopped_at_limit(&answer, meta_bytes, count);
}

/// One node whose messages hold 1 MiB and whose metas may hold 32 KiB
/// (and a name): the node and that meta size.
fn large_meta_node(net: &Arc<LocalNet>) -> (Vec<Arc<Service>>, usize) {
    let mut configs = configs(1, &strict_access());
    configs[0].limits.max_message_bytes = 1 << 20;
    let meta_bytes = 32 << 10;
    configs[0].limits.max_meta_bytes = meta_bytes + 1024;
    (start_cluster(net, configs), meta_bytes)
}

/// `answer` refuses an answer of `count` metas of `meta_bytes` after
/// building at most the limit plus one node, not the whole answer.
fn assert_stopped_at_limit(answer: &Response, meta_bytes: usize, count: usize) {
    let Response::Error(Error::TooLarge { size, limit, .. }) = *answer else {
        panic!("{answer:?}");
    };
    assert!(limit < (count * meta_bytes) as u64);
    let one_node = (meta_bytes + 1024) as u64;
    assert!(
        size > limit && size <= limit + one_node,
        "built {size} for a limit of {limit}"
    );
}

/// Many large versions under one path: `GetNodeByPath` is refused as soon
/// as its answer passes the message budget, like `GetSubTree`; asking for
/// the names alone gets every version.
#[tokio::test(start_paused = true)]
async fn a_large_path_read_stops_at_the_limit() {
    let net = LocalNet::new();
    let (nodes, meta_bytes) = large_meta_node(&net);
    let t = tree("t");
    let count = 200;
    for _ in 0..count {
        let mut items = file("v");
        items.push(KeyValue::new("blob", vec![7u8; meta_bytes]));
        let add = Request::AddByPath {
            tree: t.clone(),
            attr: ATTR_FILE_NAME.into(),
            path: vec!["dir".into()],
            items,
        };
        let answer = nodes[0].handle(&client("writer"), add).await;
        assert!(matches!(answer, Response::AddedByPath { .. }), "{answer:?}");
    }
    let read = |all_attributes| Request::GetNodeByPath {
        tree: t.clone(),
        attr: ATTR_FILE_NAME.into(),
        path: vec!["dir".into(), "v".into()],
        attributes: vec![ATTR_FILE_NAME.into()],
        latest_only: false,
        all_attributes,
    };
    let answer = nodes[0].handle(&client("reader"), read(true)).await;
    assert_stopped_at_limit(&answer, meta_bytes, count);
    let names = nodes[0].handle(&client("reader"), read(false)).await;
    let Response::Nodes(found) = names else {
        panic!("{names:?}");
    };
    assert_eq!(found.len(), count);
}
