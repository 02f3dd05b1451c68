//! The S3 gateway's call sequences: one iteration of a gateway scenario is
//! what the gateway asks the tree service for one S3 operation (uncached),
//! call after call, each waiting for the answer before it.
//!
//! | scenario | calls |
//! |---|---|
//! | `put` (new key) | GetNodeByPath (none yet), AddByPath |
//! | `overwrite` | GetNodeByPath, Move (new meta, same place), GetSubTree depth 2 |
//! | `versioned-put` | AddByPath of an existing FileName: a new version |
//! | `get` (GET/HEAD) | GetNodeByPath latest_only, GetSubTree depth 2 |
//! | `list` | GetNodeByPath of the prefix, GetSubTree depth 2 of it, GetSubTree depth 0 of each child |
//! | `multipart` (tree "system") | create: AddByPath {FileName, UploadId, Owner, Created}; per part: GetNodeByPath, GetSubTree depth 2, Add {Number, OID, Size, Created, ETag}; complete: GetSubTree of the upload, AddByPath of the object ("version"), Remove of the upload |
//!
//! The objects that overwrites, versioned PUTs, GETs and LISTs address are
//! made by [`prepare`] before the load. All calls of one iteration go to
//! one node (`Target::call_at`): the gateway reads its own writes, which a
//! round-robin over replicas would not let it do before replication.
//! Calls are written as the service's own requests; the gRPC target sends
//! each as the gateway's gRPC call (`load::grpc`).

use super::metrics::Outcome;
use super::scenario::meta_items;
use super::target::Target;
use arbor::error::Error;
use arbor::proto::{Request, Response};
use arbor::runtime::Clock;
use arbor::types::{ContainerId, KeyValue, NodeId, NodeInfo, TreeKey, ATTR_FILE_NAME};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

/// The container of the gateway's bucket.
pub const GATEWAY_CID: ContainerId = ContainerId([0x67; 32]);

/// The bucket's top directory in both trees.
const BUCKET: &str = "gw";
/// Objects that overwrites (unversioned) and versioned PUTs and GETs
/// (versioned) address, `obj-0` to `obj-63` in each directory.
const HOT_OBJECTS: u64 = 64;
/// Objects under the listed prefix: a LIST makes one call per object.
const LIST_OBJECTS: u64 = 8;
/// Parts of every multipart upload.
const MULTIPART_PARTS: u64 = 2;

/// The S3 operations of the gateway scenario, one scenario each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GatewayOp {
    Put,
    Overwrite,
    VersionedPut,
    Get,
    List,
    Multipart,
}

impl GatewayOp {
    pub const ALL: [GatewayOp; 6] = [
        GatewayOp::Put,
        GatewayOp::Overwrite,
        GatewayOp::VersionedPut,
        GatewayOp::Get,
        GatewayOp::List,
        GatewayOp::Multipart,
    ];

    /// The scenario's name.
    pub fn name(self) -> &'static str {
        match self {
            GatewayOp::Put => "put",
            GatewayOp::Overwrite => "overwrite",
            GatewayOp::VersionedPut => "versioned-put",
            GatewayOp::Get => "get",
            GatewayOp::List => "list",
            GatewayOp::Multipart => "multipart",
        }
    }

    /// This operation's share of the gateway's rate, in percent: reads
    /// outnumber writes, listings and multipart uploads are rarer.
    pub fn share_percent(self) -> u64 {
        match self {
            GatewayOp::Get => 40,
            GatewayOp::Put => 20,
            GatewayOp::Overwrite
            | GatewayOp::VersionedPut
            | GatewayOp::List
            | GatewayOp::Multipart => 10,
        }
    }

    /// Its rate when the gateway runs `total` S3 operations per second (at
    /// least 1/s, so that every operation runs).
    pub fn rate_of(self, total: u64) -> u64 {
        (total * self.share_percent() / 100).max(1)
    }
}

/// Tree "version" of the bucket: object versions.
pub fn version_tree() -> TreeKey {
    TreeKey::new(GATEWAY_CID, "version")
}

/// Tree "system" of the bucket: multipart uploads.
pub fn system_tree() -> TreeKey {
    TreeKey::new(GATEWAY_CID, "system")
}

/// Where each call's latency goes, by the call's name.
pub trait CallLog: Send + Sync {
    fn record_call(&self, call: &'static str, latency: Duration, ok: bool);
}

/// The gRPC method a request stands for.
pub fn call_name(request: &Request) -> &'static str {
    match request {
        Request::Add { .. } => "Add",
        Request::AddByPath { .. } => "AddByPath",
        Request::Move { .. } => "Move",
        Request::Remove { .. } => "Remove",
        Request::GetNodeByPath { .. } => "GetNodeByPath",
        Request::GetSubTree { .. } => "GetSubTree",
        Request::TreeList { .. } => "TreeList",
        Request::Healthcheck => "Healthcheck",
        _ => "other",
    }
}

/// One iteration's calls: all to the node `key` picks, each timed.
pub struct Session {
    pub target: Arc<dyn Target>,
    pub key: u64,
    pub clock: Arc<dyn Clock>,
    pub log: Arc<dyn CallLog>,
}

impl Session {
    async fn call(&self, request: Request) -> Result<Response, Error> {
        let name = call_name(&request);
        let started = self.clock.now();
        let response = self.target.call_at(self.key, request).await;
        let latency = self.clock.now().saturating_sub(started);
        self.log
            .record_call(name, latency, !matches!(response, Response::Error(_)));
        match response {
            Response::Error(error) => Err(error),
            response => Ok(response),
        }
    }

    async fn add_by_path(
        &self,
        tree: TreeKey,
        path: &[&str],
        items: Vec<KeyValue>,
    ) -> Result<NodeId, Error> {
        let request = Request::AddByPath {
            tree,
            attr: ATTR_FILE_NAME.to_string(),
            path: path.iter().map(|c| c.to_string()).collect(),
            items,
        };
        match self.call(request).await? {
            Response::AddedByPath { leaf, .. } | Response::Added { node: leaf } => Ok(leaf),
            other => Err(unexpected("AddByPath", &other)),
        }
    }

    async fn add(
        &self,
        tree: TreeKey,
        parent: NodeId,
        items: Vec<KeyValue>,
    ) -> Result<NodeId, Error> {
        match self
            .call(Request::Add {
                tree,
                parent,
                items,
            })
            .await?
        {
            Response::Added { node } => Ok(node),
            other => Err(unexpected("Add", &other)),
        }
    }

    /// The newest node at `path` (latest_only, every attribute), if any.
    async fn latest(&self, tree: TreeKey, path: &[&str]) -> Result<Option<NodeInfo>, Error> {
        let request = Request::GetNodeByPath {
            tree,
            attr: ATTR_FILE_NAME.to_string(),
            path: path.iter().map(|c| c.to_string()).collect(),
            attributes: Vec::new(),
            latest_only: true,
            all_attributes: true,
        };
        match self.call(request).await? {
            Response::Nodes(nodes) if nodes.len() <= 1 => Ok(nodes.into_iter().next()),
            other => Err(unexpected("GetNodeByPath latest_only", &other)),
        }
    }

    /// The newest node at `path`, which must be there.
    async fn existing(&self, tree: TreeKey, path: &[&str]) -> Result<NodeInfo, Error> {
        self.latest(tree, path)
            .await?
            .ok_or_else(|| Error::Malformed(format!("gateway: nothing at {}", path.join("/"))))
    }

    async fn subtree(
        &self,
        tree: TreeKey,
        root: NodeId,
        depth: u32,
    ) -> Result<Vec<NodeInfo>, Error> {
        match self.call(Request::GetSubTree { tree, root, depth }).await? {
            Response::Nodes(nodes) if nodes.first().is_some_and(|n| n.id == root) => Ok(nodes),
            other => Err(unexpected("GetSubTree", &other)),
        }
    }

    async fn done(&self, request: Request) -> Result<(), Error> {
        let name = call_name(&request);
        match self.call(request).await? {
            Response::Done => Ok(()),
            other => Err(unexpected(name, &other)),
        }
    }
}

/// An answer the gateway would not expect: the iteration fails as `other`.
fn unexpected(call: &str, response: &Response) -> Error {
    Error::Malformed(format!(
        "gateway: unexpected answer to {call}: {response:?}"
    ))
}

/// An object version's meta as the gateway stores it.
fn object_meta(name: &str, n: u64, unversioned: bool) -> Vec<KeyValue> {
    let mut items = meta_items(name, n);
    for item in &mut items {
        if item.key == "IsUnversioned" {
            item.value = unversioned.to_string().into_bytes();
        }
    }
    items
}

fn hot(n: u64) -> String {
    format!("obj-{}", n % HOT_OBJECTS)
}

/// Makes the objects the load addresses, on node 0, one call at a time.
/// The caller lets replication settle before the load.
pub async fn prepare(target: Arc<dyn Target>, clock: Arc<dyn Clock>) -> Result<(), String> {
    struct Nowhere;
    impl CallLog for Nowhere {
        fn record_call(&self, _: &'static str, _: Duration, _: bool) {}
    }
    let session = Session {
        target,
        key: 0,
        clock,
        log: Arc::new(Nowhere),
    };
    let fail = |e: Error| format!("preparing the gateway's objects: {e}");
    for k in 0..HOT_OBJECTS {
        let name = hot(k);
        let unversioned = [BUCKET, "unversioned"];
        session
            .add_by_path(version_tree(), &unversioned, object_meta(&name, k, true))
            .await
            .map_err(fail)?;
        let versioned = [BUCKET, "versioned"];
        session
            .add_by_path(version_tree(), &versioned, object_meta(&name, k, false))
            .await
            .map_err(fail)?;
    }
    for k in 0..LIST_OBJECTS {
        let name = format!("listed-{k}");
        session
            .add_by_path(
                version_tree(),
                &[BUCKET, "list"],
                object_meta(&name, k, true),
            )
            .await
            .map_err(fail)?;
    }
    // The directories that PUTs and uploads add to, made once here: made
    // by concurrent first calls on several replicas they would be
    // duplicates, which path resolution handles but the load need not.
    for (tree, dir) in [
        (version_tree(), "new"),
        (version_tree(), "mp"),
        (system_tree(), "mp"),
    ] {
        session
            .add_by_path(tree, &[BUCKET, dir], object_meta("placeholder", 0, true))
            .await
            .map_err(fail)?;
    }
    Ok(())
}

/// Runs iteration `n` of `op`: acknowledged with the object version it
/// made (tree "version"), or failed with the first call that failed.
pub async fn iteration(op: GatewayOp, n: u64, session: &Session) -> Outcome {
    let result = match op {
        GatewayOp::Put => put(n, session).await.map(Some),
        GatewayOp::Overwrite => overwrite(n, session).await.map(Some),
        GatewayOp::VersionedPut => versioned_put(n, session).await.map(Some),
        GatewayOp::Get => get(n, session).await.map(|()| None),
        GatewayOp::List => list(session).await.map(|()| None),
        GatewayOp::Multipart => multipart(n, session).await.map(Some),
    };
    match result {
        Ok(node) => Outcome::Ok { node },
        Err(error) => Outcome::from_response(Some(Response::Error(error))),
    }
}

/// PUT of a new key: the gateway looks for a version to replace, finds
/// none, adds the object.
async fn put(n: u64, s: &Session) -> Result<NodeId, Error> {
    let name = format!("put-{n}");
    if let Some(found) = s.latest(version_tree(), &[BUCKET, "new", &name]).await? {
        return Err(Error::Malformed(format!(
            "gateway: new key {name} exists as {}",
            found.id
        )));
    }
    s.add_by_path(
        version_tree(),
        &[BUCKET, "new"],
        object_meta(&name, n, true),
    )
    .await
}

/// PUT over an existing key of an unversioned bucket: the version is
/// found, given the new object's meta in place, and its tag node looked
/// for.
async fn overwrite(n: u64, s: &Session) -> Result<NodeId, Error> {
    let name = hot(n);
    let old = s
        .existing(version_tree(), &[BUCKET, "unversioned", &name])
        .await?;
    let moved = Request::Move {
        tree: version_tree(),
        parent: old.parent,
        node: old.id,
        items: object_meta(&name, n, true),
    };
    s.done(moved).await?;
    s.subtree(version_tree(), old.id, 2).await?;
    Ok(old.id)
}

/// PUT into a versioned bucket: one more version of an existing name.
async fn versioned_put(n: u64, s: &Session) -> Result<NodeId, Error> {
    let name = hot(n);
    s.add_by_path(
        version_tree(),
        &[BUCKET, "versioned"],
        object_meta(&name, n, false),
    )
    .await
}

/// GET or HEAD: the newest version, then its tags and lock (children).
async fn get(n: u64, s: &Session) -> Result<(), Error> {
    let name = hot(n);
    let version = s
        .existing(version_tree(), &[BUCKET, "versioned", &name])
        .await?;
    s.subtree(version_tree(), version.id, 2).await?;
    Ok(())
}

/// LIST of a prefix: the prefix's node, its children, then each child's
/// whole subtree.
async fn list(s: &Session) -> Result<(), Error> {
    let prefix = s.existing(version_tree(), &[BUCKET, "list"]).await?;
    let children = s.subtree(version_tree(), prefix.id, 2).await?;
    if (children.len() as u64) < 1 + LIST_OBJECTS {
        return Err(Error::Malformed(format!(
            "gateway: the listed prefix has {} children, {LIST_OBJECTS} were made",
            children.len() - 1
        )));
    }
    for child in &children[1..] {
        s.subtree(version_tree(), child.id, 0).await?;
    }
    Ok(())
}

/// A multipart upload of `MULTIPART_PARTS` parts: created in tree
/// "system", each part looked up and added under the upload, then
/// completed into an object of tree "version" and the upload removed.
async fn multipart(n: u64, s: &Session) -> Result<NodeId, Error> {
    let name = format!("mp-{n}");
    let created = (1_700_000_000_000u64 + n).to_string();
    let upload_meta = vec![
        KeyValue::new(ATTR_FILE_NAME, name.as_bytes()),
        KeyValue::new("UploadId", format!("upload-{n:016x}")),
        KeyValue::new("Owner", "NbUgTSFvPmsRxmGeWpuuGeJUoRoi6PErcM"),
        KeyValue::new("Created", created.as_bytes()),
    ];
    let upload = s
        .add_by_path(system_tree(), &[BUCKET, "mp"], upload_meta)
        .await?;
    for number in 1..=MULTIPART_PARTS {
        let found = s.existing(system_tree(), &[BUCKET, "mp", &name]).await?;
        if found.id != upload {
            return Err(Error::Malformed(format!(
                "gateway: upload {name} is {upload}, the lookup found {}",
                found.id
            )));
        }
        s.subtree(system_tree(), upload, 2).await?;
        let part = vec![
            KeyValue::new("Number", number.to_string()),
            KeyValue::new("OID", format!("{:064x}", n * MULTIPART_PARTS + number)),
            KeyValue::new("Size", "5242880"),
            KeyValue::new("Created", created.as_bytes()),
            KeyValue::new("ETag", format!("{:032x}", number)),
        ];
        s.add(system_tree(), upload, part).await?;
    }
    let parts = s.subtree(system_tree(), upload, 2).await?;
    if parts.len() as u64 != 1 + MULTIPART_PARTS {
        return Err(Error::Malformed(format!(
            "gateway: upload {name} holds {} parts, {MULTIPART_PARTS} were added",
            parts.len() - 1
        )));
    }
    let object = s
        .add_by_path(version_tree(), &[BUCKET, "mp"], object_meta(&name, n, true))
        .await?;
    s.done(Request::Remove {
        tree: system_tree(),
        node: upload,
    })
    .await?;
    Ok(object)
}
