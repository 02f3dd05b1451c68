//! Paged listings through the native API (`ListChildren`,
//! `GetSubTreePage`, docs/design.md §4): pages follow to the end of the
//! listing, keep to `limits.max_list_page_nodes` and to the message size,
//! and a cursor continues only its own listing.

mod service_support;

use arbor::forest::{ListCursor, ListOrder};
use arbor::proto::{Request, Response};
use arbor::service::Service;
use arbor::{Caller, Error, KeyValue, NodeInfo, TreeKey, ATTR_FILE_NAME, ROOT};
use service_support::*;

async fn add(node: &Service, tree: &TreeKey, parent: u64, name: &str, fill: usize) -> u64 {
    let request = Request::Add {
        tree: tree.clone(),
        parent,
        items: vec![
            KeyValue::new(ATTR_FILE_NAME, name),
            KeyValue::new("Fill", "f".repeat(fill)),
        ],
    };
    match node.handle(&Caller::Anonymous, request).await {
        Response::Added { node } => node,
        other => panic!("add failed: {other:?}"),
    }
}

/// Follows a listing to its end; `request` makes a page's request from
/// the previous page's cursor. Returns every page.
async fn pages(
    node: &Service,
    request: impl Fn(Option<ListCursor>) -> Request,
) -> Result<Vec<Vec<NodeInfo>>, Error> {
    let mut out = Vec::new();
    let mut after = None;
    for _ in 0..1000 {
        match node.handle(&Caller::Anonymous, request(after.take())).await {
            Response::Page { nodes, next } => {
                out.push(nodes);
                match next {
                    Some(cursor) => after = Some(cursor),
                    None => return Ok(out),
                }
            }
            Response::Error(error) => return Err(error),
            other => panic!("unexpected answer {other:?}"),
        }
    }
    panic!("listing did not end");
}

fn names(pages: &[Vec<NodeInfo>]) -> Vec<String> {
    pages
        .iter()
        .flatten()
        .map(|n| String::from_utf8_lossy(n.meta.file_name().unwrap_or(b"-")).into_owned())
        .collect()
}

/// Children pages in name and id order, a subtree in pages; a limit
/// above `limits.max_list_page_nodes` (or 0) gets that many.
#[tokio::test(start_paused = true)]
async fn listings_page_through_the_native_api() {
    let net = LocalNet::new();
    let mut config = cluster_configs(1).remove(0);
    config.limits.max_list_page_nodes = 4;
    let forest = memory_forest(&config);
    let node = start_node(&net, config, forest);
    let t = tree("t");
    let mut ids = Vec::new();
    for i in (0..11).rev() {
        let dir = add(&node, &t, ROOT, &format!("d{i:02}"), 0).await;
        add(&node, &t, dir, "leaf", 0).await;
        ids.push(dir);
    }
    let expected: Vec<String> = (0..11).map(|i| format!("d{i:02}")).collect();
    for limit in [3, 4, 0, 1000] {
        let listed = pages(&node, |after| Request::ListChildren {
            tree: t.clone(),
            parent: ROOT,
            order: ListOrder::Name,
            after,
            limit,
        })
        .await
        .unwrap();
        let page = if limit == 3 { 3 } else { 4 };
        assert!(listed.iter().all(|p| p.len() <= page), "limit {limit}");
        assert_eq!(listed[0].len(), page, "limit {limit}");
        assert_eq!(names(&listed), expected, "limit {limit}");
    }
    let by_id = pages(&node, |after| Request::ListChildren {
        tree: t.clone(),
        parent: ROOT,
        order: ListOrder::Id,
        after,
        limit: 2,
    })
    .await
    .unwrap();
    let listed_ids: Vec<u64> = by_id.iter().flatten().map(|n| n.id).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(listed_ids, sorted);

    let subtree = pages(&node, |after| Request::GetSubTreePage {
        tree: t.clone(),
        root: ROOT,
        depth: 0,
        order: ListOrder::Name,
        after,
        limit: 5,
    })
    .await
    .unwrap();
    let mut walk = vec!["-".to_string()];
    for name in &expected {
        walk.extend([name.clone(), "leaf".into()]);
    }
    assert_eq!(names(&subtree), walk);
    assert!(subtree.iter().all(|p| p.len() <= 4));
}

/// Pages stop at the message size: metas of 630 bytes, 2 KiB of answer.
#[tokio::test(start_paused = true)]
async fn pages_fit_the_message_size() {
    let net = LocalNet::new();
    let mut config = cluster_configs(1).remove(0);
    config.limits.max_meta_bytes = 1024;
    config.limits.max_message_bytes = arbor::config::MESSAGE_OVERHEAD_BYTES + 2048;
    config.validate().unwrap();
    let forest = memory_forest(&config);
    let node = start_node(&net, config, forest);
    let t = tree("t");
    for i in 0..9 {
        add(&node, &t, ROOT, &format!("n{i}"), 600).await;
    }
    let listed = pages(&node, |after| Request::ListChildren {
        tree: t.clone(),
        parent: ROOT,
        order: ListOrder::Name,
        after,
        limit: 100,
    })
    .await
    .unwrap();
    // A node takes 694 bytes (630 of meta, 64 of overhead): two and the
    // cursor fit in the 2 KiB, three do not.
    let sizes: Vec<usize> = listed.iter().map(Vec::len).collect();
    assert_eq!(sizes, [2, 2, 2, 2, 1]);
}

/// A cursor continues only its own listing; absent trees and parents are
/// told as by the other reads.
#[tokio::test(start_paused = true)]
async fn cursors_and_missing_things_are_refused() {
    let net = LocalNet::new();
    let node = start_cluster(&net, cluster_configs(1)).remove(0);
    let t = tree("t");
    for i in 0..3 {
        add(&node, &t, ROOT, &format!("n{i}"), 0).await;
    }
    let children = |after, parent| Request::ListChildren {
        tree: t.clone(),
        parent,
        order: ListOrder::Name,
        after,
        limit: 1,
    };
    let Response::Page {
        next: Some(cursor), ..
    } = node.handle(&Caller::Anonymous, children(None, ROOT)).await
    else {
        panic!("no cursor");
    };
    let other = Request::GetSubTreePage {
        tree: t.clone(),
        root: ROOT,
        depth: 2,
        order: ListOrder::Name,
        after: Some(cursor),
        limit: 1,
    };
    let answers = [
        node.handle(&Caller::Anonymous, other).await,
        node.handle(&Caller::Anonymous, children(None, 12345)).await,
        (node.handle(
            &Caller::Anonymous,
            Request::ListChildren {
                tree: tree("absent"),
                parent: ROOT,
                order: ListOrder::Id,
                after: None,
                limit: 1,
            },
        ))
        .await,
    ];
    assert!(
        matches!(&answers[0], Response::Error(Error::CursorRefused(_))),
        "{:?}",
        answers[0]
    );
    assert_eq!(answers[1], Response::Error(Error::NodeNotFound(12345)));
    assert_eq!(answers[2], Response::Error(Error::TreeNotFound));
}
