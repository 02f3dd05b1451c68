//! The gateway profile's op mix: what an S3 gateway asks of the tree
//! service, drawn from each client's own stream.
//!
//! - PUT: AddByPath of `dir/key` where keys come from a small set per
//!   directory, so most PUTs after the first add another version of a key
//!   that already has some (a versioned bucket keeps every version as a
//!   sibling with the same FileName; the newest meta time is the latest).
//! - DELETE of a key: a delete marker, one more version with
//!   `IsDeleteMarker` set.
//! - Overwrite in place: GetNodeByPath (latest only) and a Move of the node
//!   it answered to the same parent with new meta.
//! - Tags: a child node under a version, read back with GetSubTree of
//!   depth 2 (the version and its children).
//! - Multipart: an upload record in the `system` tree and parts under it.
//! - Reads: HEAD/GET (latest only), ListObjectVersions of a key (all
//!   versions), LIST of a directory (GetSubTree of depth 2 from it).
//!
//! Every answer goes through the answer oracle (`check::oracle::watch`)
//! and every acknowledged write into the ledger, as for the other
//! profiles.

use crate::coverage::Coverage;
use crate::scenario::check::ledger::MOVE_TAG_KEY;
use crate::scenario::plan::client_rng;
use crate::scenario::workload::{
    add_system, call, containers, object_meta, read_request, system_tree, version_tree, write,
    Workload,
};
use crate::world::Client;
use arbor::proto::{Request, Response};
use arbor::{KeyValue, NodeId, ReplicaId, TreeKey, ATTR_FILE_NAME, ROOT};
use madsim::rand::Rng;

/// Directories of the gateway's keys, and keys per directory: few, so
/// that keys get several versions within a test-sized run.
const DIRECTORIES: u64 = 3;
const KEYS_PER_DIRECTORY: u64 = 5;
/// Most parts one multipart upload gets.
const PARTS_MAX: u64 = 3;

/// The signing key of gateway `client-{index}` when it speaks gRPC
/// (`Swarm::grpc`): fixed per index, so that every seed's replicas name
/// the same keys.
pub fn gateway_signer(index: usize) -> arbor::grpc::Signer {
    arbor::grpc::Signer::from_seed(GATEWAY_KEY_SEED + index as u64)
}

/// Where the gateways' key seeds start.
const GATEWAY_KEY_SEED: u64 = 0x6761_7465_0000;

fn random_key() -> Vec<String> {
    let dir = client_rng().gen_range(0..DIRECTORIES);
    let key = client_rng().gen_range(0..KEYS_PER_DIRECTORY);
    vec![format!("gw-{dir}"), format!("key-{key}")]
}

/// A delete marker of `name`: a version that says the key is deleted.
fn delete_marker(name: &str, op: u64) -> Vec<KeyValue> {
    vec![
        KeyValue::new(ATTR_FILE_NAME, name.as_bytes()),
        KeyValue::new("OID", format!("marker-{op:08x}").into_bytes()),
        KeyValue::new("Created", (1_700_000_000 + op).to_string().into_bytes()),
        KeyValue::new("IsDeleteMarker", b"true".to_vec()),
    ]
}

/// One gateway call sequence, picked at random.
pub async fn gateway_op(workload: &Workload, client: &Client) {
    let cids = containers();
    let cid = cids[client_rng().gen_range(0..cids.len())];
    let replica = workload.random_replica(&cid);
    let op = workload.op_id();
    let tree = version_tree(cid);
    match client_rng().gen_range(0..100) {
        0..=29 => {
            let path = random_key();
            let items = object_meta(&path[1], op);
            put(workload, client, replica, tree, path, items, op).await;
        }
        30..=36 => {
            let path = random_key();
            let items = delete_marker(&path[1], op);
            if put(workload, client, replica, tree, path, items, op).await {
                workload.world.hooks.coverage.hit(Coverage::DeleteMarker);
            }
        }
        37..=46 => overwrite(workload, client, replica, tree, op).await,
        47..=53 => tag(workload, client, replica, tree, op).await,
        54..=61 => multipart(workload, client, replica, system_tree(cid), op).await,
        62..=65 => {
            // DeleteObject of one version: the version node goes to TRASH.
            if let Some(node) = workload.random_known(&tree) {
                let request = Request::Remove { tree, node };
                write(workload, client, replica, op, request).await;
            }
        }
        66..=83 => {
            // HEAD/GET, or ListObjectVersions of one key.
            let latest_only = client_rng().gen_bool(0.6);
            let request = read_request(tree, random_key(), latest_only);
            let _ = call(workload, client, replica, op, request).await;
        }
        _ => list(workload, client, replica, tree, op).await,
    }
}

/// AddByPath of one version; true when acknowledged.
async fn put(
    workload: &Workload,
    client: &Client,
    replica: ReplicaId,
    tree: TreeKey,
    mut path: Vec<String>,
    items: Vec<KeyValue>,
    op: u64,
) -> bool {
    path.pop();
    let request = Request::AddByPath {
        tree,
        attr: ATTR_FILE_NAME.into(),
        path,
        items,
    };
    write(workload, client, replica, op, request)
        .await
        .is_some()
}

/// The latest version of a random key as `replica` answers it.
async fn latest(
    workload: &Workload,
    client: &Client,
    replica: ReplicaId,
    tree: &TreeKey,
    op: u64,
) -> Option<(NodeId, NodeId, String)> {
    let path = random_key();
    let request = read_request(tree.clone(), path.clone(), true);
    match call(workload, client, replica, op, request).await? {
        Response::Nodes(nodes) => nodes.first().map(|n| (n.id, n.parent, path[1].clone())),
        _ => None,
    }
}

/// An overwrite in place: the latest version moved to its own parent with
/// new meta (the same FileName).
async fn overwrite(
    workload: &Workload,
    client: &Client,
    replica: ReplicaId,
    tree: TreeKey,
    op: u64,
) {
    let Some((node, parent, name)) = latest(workload, client, replica, &tree, op).await else {
        return;
    };
    let op = workload.op_id();
    let mut items = object_meta(&name, op);
    items.push(KeyValue::new(MOVE_TAG_KEY, op.to_string().into_bytes()));
    let request = Request::Move {
        tree,
        parent,
        node,
        items,
    };
    if write(workload, client, replica, op, request)
        .await
        .is_some()
    {
        workload.world.hooks.coverage.hit(Coverage::OverwriteByMove);
    }
}

/// PutObjectTagging then GetObjectTagging: a tag node under the latest
/// version, and the version read back with its children.
async fn tag(workload: &Workload, client: &Client, replica: ReplicaId, tree: TreeKey, op: u64) {
    let Some((node, _, _)) = latest(workload, client, replica, &tree, op).await else {
        return;
    };
    let op = workload.op_id();
    let request = Request::Add {
        tree: tree.clone(),
        parent: node,
        items: vec![
            KeyValue::new(ATTR_FILE_NAME, format!("tag-{op}").into_bytes()),
            KeyValue::new("Value", format!("v{}", op % 3).into_bytes()),
        ],
    };
    write(workload, client, replica, op, request).await;
    read_two_levels(workload, client, replica, tree, node).await;
}

/// GetSubTree of depth 2 from `root`: the node and its children.
async fn read_two_levels(
    workload: &Workload,
    client: &Client,
    replica: ReplicaId,
    tree: TreeKey,
    root: NodeId,
) {
    let op = workload.op_id();
    let request = Request::GetSubTree {
        tree,
        root,
        depth: 2,
    };
    let _ = call(workload, client, replica, op, request).await;
}

/// CreateMultipartUpload and UploadPart: an upload record and its parts.
async fn multipart(
    workload: &Workload,
    client: &Client,
    replica: ReplicaId,
    tree: TreeKey,
    op: u64,
) {
    let Some(upload) = add_system(workload, client, replica, tree.clone(), op, ROOT).await else {
        return;
    };
    for number in 1..=client_rng().gen_range(1..=PARTS_MAX) {
        let op = workload.op_id();
        let request = Request::Add {
            tree: tree.clone(),
            parent: upload,
            items: vec![
                KeyValue::new(ATTR_FILE_NAME, format!("part-{op}").into_bytes()),
                KeyValue::new("Number", number.to_string().into_bytes()),
                KeyValue::new("OID", format!("part-oid-{op:08x}").into_bytes()),
            ],
        };
        if write(workload, client, replica, op, request)
            .await
            .is_some()
        {
            workload.world.hooks.coverage.hit(Coverage::MultipartPart);
        }
    }
}

/// LIST of a directory: its node by path, then its children and theirs.
async fn list(workload: &Workload, client: &Client, replica: ReplicaId, tree: TreeKey, op: u64) {
    let dir = random_key().swap_remove(0);
    let request = read_request(tree.clone(), vec![dir], true);
    let Some(Response::Nodes(nodes)) = call(workload, client, replica, op, request).await else {
        return;
    };
    let Some(root) = nodes.first().map(|n| n.id) else {
        return;
    };
    read_two_levels(workload, client, replica, tree, root).await;
}
