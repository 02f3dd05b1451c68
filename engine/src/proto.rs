//! The request/response messages of the service API and their wire format.
//!
//! A frame body is `[version: u8][postcard-encoded envelope]`. Decoding checks
//! the size limit before anything else and never panics on garbage.

use crate::error::{Error, Result};
use crate::forest::{ListCursor, ListOrder};
use crate::types::*;
use serde::{Deserialize, Serialize};

/// Wire format version; a frame with another version is refused.
/// Version 2: `Hello` opens a peer connection, and `LogStamp` carries the
/// op's digest. Version 3: `AddedByPath` names the leaf's parent.
pub const PROTOCOL_VERSION: u8 = 3;

/// A request of the service API (docs/design.md §4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    Add {
        tree: TreeKey,
        parent: NodeId,
        items: Vec<KeyValue>,
    },
    AddByPath {
        tree: TreeKey,
        attr: String,
        path: Vec<String>,
        items: Vec<KeyValue>,
    },
    Move {
        tree: TreeKey,
        parent: NodeId,
        node: NodeId,
        items: Vec<KeyValue>,
    },
    Remove {
        tree: TreeKey,
        node: NodeId,
    },
    GetNodeByPath {
        tree: TreeKey,
        attr: String,
        path: Vec<String>,
        attributes: Vec<String>,
        latest_only: bool,
        all_attributes: bool,
    },
    GetMeta {
        tree: TreeKey,
        node: NodeId,
    },
    GetSubTree {
        tree: TreeKey,
        root: NodeId,
        depth: u32,
    },
    TreeList {
        cid: ContainerId,
    },
    /// Replicated ops, each applied at its own timestamp; idempotent.
    Apply {
        tree: TreeKey,
        ops: Vec<Move>,
    },
    GetOpLog {
        tree: TreeKey,
        from_height: u64,
        limit: u32,
    },
    Healthcheck,
    Drop {
        cid: ContainerId,
        /// `None` drops every tree of the container.
        tree: Option<String>,
    },
    /// The heights and timestamps of the stored ops from `from_height` on,
    /// without the ops: a puller asks for the ops it lacks with `GetOpLog`.
    GetOpLogStamps {
        tree: TreeKey,
        from_height: u64,
        limit: u32,
    },
    /// The first frame of every outbound connection: the caller's cluster
    /// and, for a node, its replica id (docs/design.md §9).
    Hello {
        cluster_id: String,
        replica_id: Option<ReplicaId>,
    },
    /// One page of the children of `parent` in `order`, after `after`
    /// (the previous page's `next`; `None` starts): at most `limit` nodes,
    /// 0 or more meaning `limits.max_list_page_nodes` (docs/design.md §4).
    ListChildren {
        tree: TreeKey,
        parent: NodeId,
        order: ListOrder,
        after: Option<ListCursor>,
        limit: u32,
    },
    /// One page of the pre-order walk of `GetSubTree`, each node's
    /// children in `order`; `after` and `limit` as in `ListChildren`.
    GetSubTreePage {
        tree: TreeKey,
        root: NodeId,
        depth: u32,
        order: ListOrder,
        after: Option<ListCursor>,
        limit: u32,
    },
}

impl Request {
    /// Whether sending the request twice does what sending it once does:
    /// reads, the handshake, and replicated ops (`Apply`, known by their
    /// timestamps). A client write makes a new op each time it arrives,
    /// and a `Drop` sent again may drop a tree created in between.
    pub fn is_idempotent(&self) -> bool {
        match self {
            Request::Add { .. }
            | Request::AddByPath { .. }
            | Request::Move { .. }
            | Request::Remove { .. }
            | Request::Drop { .. } => false,
            Request::GetNodeByPath { .. }
            | Request::GetMeta { .. }
            | Request::GetSubTree { .. }
            | Request::TreeList { .. }
            | Request::Apply { .. }
            | Request::GetOpLog { .. }
            | Request::Healthcheck
            | Request::GetOpLogStamps { .. }
            | Request::Hello { .. }
            | Request::ListChildren { .. }
            | Request::GetSubTreePage { .. } => true,
        }
    }

    /// The container the request is about; `None` for `Healthcheck` and
    /// `Hello`, which are about no container.
    pub fn container(&self) -> Option<ContainerId> {
        match self {
            Request::Drop { cid, .. } | Request::TreeList { cid } => Some(*cid),
            Request::Add { tree, .. }
            | Request::AddByPath { tree, .. }
            | Request::Move { tree, .. }
            | Request::Remove { tree, .. }
            | Request::GetNodeByPath { tree, .. }
            | Request::GetMeta { tree, .. }
            | Request::GetSubTree { tree, .. }
            | Request::ListChildren { tree, .. }
            | Request::GetSubTreePage { tree, .. }
            | Request::Apply { tree, .. }
            | Request::GetOpLog { tree, .. }
            | Request::GetOpLogStamps { tree, .. } => Some(tree.cid),
            Request::Healthcheck | Request::Hello { .. } => None,
        }
    }

    /// The request's name (a label of the latency metrics).
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Add { .. } => "Add",
            Request::AddByPath { .. } => "AddByPath",
            Request::Move { .. } => "Move",
            Request::Remove { .. } => "Remove",
            Request::GetNodeByPath { .. } => "GetNodeByPath",
            Request::GetMeta { .. } => "GetMeta",
            Request::GetSubTree { .. } => "GetSubTree",
            Request::TreeList { .. } => "TreeList",
            Request::Apply { .. } => "Apply",
            Request::GetOpLog { .. } => "GetOpLog",
            Request::Healthcheck => "Healthcheck",
            Request::Drop { .. } => "Drop",
            Request::GetOpLogStamps { .. } => "GetOpLogStamps",
            Request::Hello { .. } => "Hello",
            Request::ListChildren { .. } => "ListChildren",
            Request::GetSubTreePage { .. } => "GetSubTreePage",
        }
    }
}

/// A response of the service API.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    Added {
        node: NodeId,
    },
    AddedByPath {
        leaf: NodeId,
        /// The directories the call created, parents first.
        created: Vec<NodeId>,
        /// The leaf's parent: the last directory of the path.
        parent: NodeId,
    },
    Done,
    Nodes(Vec<NodeInfo>),
    Trees(Vec<String>),
    /// How many of the applied ops were new to this replica.
    Applied {
        fresh: u32,
    },
    OpLog {
        entries: Vec<LogEntry>,
        /// The height after the last stored op: `from_height` of the next page.
        next_height: u64,
    },
    Health {
        replica_id: ReplicaId,
        /// The epoch of the log this replica serves: new with every
        /// database, so a log rebuilt on a replaced disk is told from the
        /// old one (docs/design.md §6).
        log_epoch: u64,
    },
    Error(Error),
    OpLogStamps {
        stamps: Vec<LogStamp>,
        /// The height after the last stamp: `from_height` of the next page.
        /// Without stamps, where the log ends, which is below `from_height`
        /// when the log was rebuilt on a replaced disk (docs/design.md §6).
        next_height: u64,
        /// The log's first height: 0, or for a tree created again after a
        /// drop the height its dropped incarnation reached (§6). A page
        /// asked from below it starts there, and nowhere else.
        first_height: u64,
    },
    /// The answer to an accepted `Hello`: who the receiver is.
    Hello {
        cluster_id: String,
        replica_id: ReplicaId,
    },
    /// A page of a listing (`ListChildren`, `GetSubTreePage`); `next`
    /// continues it, `None` once it is complete.
    Page {
        nodes: Vec<NodeInfo>,
        next: Option<ListCursor>,
    },
}

/// A request or response with the caller's correlation id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope<T> {
    pub id: u64,
    pub body: T,
}

/// Encodes an envelope into a frame body.
pub fn encode<T: Serialize>(id: u64, body: &T) -> Vec<u8> {
    encode_after(&[], id, body)
}

/// `prefix` followed by the frame body [`encode`] makes, in one buffer
/// allocated at its final size: the envelope's size is counted first, so
/// a large page of ops is neither grown step by step nor copied again
/// behind a header.
pub fn encode_after<T: Serialize>(prefix: &[u8], id: u64, body: &T) -> Vec<u8> {
    let envelope = Envelope { id, body };
    // Serialising our own in-memory types cannot fail.
    let size = postcard::experimental::serialized_size(&envelope).expect("postcard size");
    let mut out = Vec::with_capacity(prefix.len() + 1 + size);
    out.extend_from_slice(prefix);
    out.push(PROTOCOL_VERSION);
    let out = postcard::to_extend(&envelope, out).expect("postcard encode");
    assert_eq!(
        out.len(),
        prefix.len() + 1 + size,
        "postcard wrote a size other than it counted"
    );
    out
}

/// Decodes a frame body produced by `encode`; bytes beyond the envelope are
/// an error, so every accepted frame re-encodes to itself.
pub fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8], max_bytes: usize) -> Result<Envelope<T>> {
    if bytes.len() > max_bytes {
        return Err(Error::TooLarge {
            what: "frame".into(),
            size: bytes.len() as u64,
            limit: max_bytes as u64,
        });
    }
    let (&version, rest) = bytes
        .split_first()
        .ok_or_else(|| Error::Malformed("empty frame".into()))?;
    if version != PROTOCOL_VERSION {
        return Err(Error::Malformed(format!(
            "unsupported protocol version {version}"
        )));
    }
    let (envelope, tail) = postcard::take_from_bytes::<Envelope<T>>(rest)
        .map_err(|e| Error::Malformed(format!("undecodable frame: {e}")))?;
    if !tail.is_empty() {
        return Err(Error::Malformed(format!("{} trailing bytes", tail.len())));
    }
    Ok(envelope)
}
