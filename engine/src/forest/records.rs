//! Stored record types, their tables and their byte encodings.
//!
//! Every table is declared here, once. Keys are redb tuples of integers,
//! which redb orders element by element numerically, so range scans by
//! prefix (`(tree, ..)`, `(tree, parent, ..)`) work without hand-made
//! big-endian keys. Each tree is mapped to a small `u64` tree number (never
//! reused) so that the per-tree tables do not repeat the 32-byte container
//! id and the tree name in every key.
//!
//! Every decoder returns `Error::Malformed` on bad bytes: a damaged record is
//! an operating error (disk, fuzzer), not a reason to panic.

use crate::error::{Error, Result};
use crate::types::*;
use redb::TableDefinition;
use serde::{Deserialize, Serialize};

/// `cid (32 bytes) ++ tree id (UTF-8)` -> encoded [`TreeRecord`]. Byte order
/// of the key sorts trees by container, then by tree id.
pub const TREES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("trees");
/// Forest-wide counters, e.g. [`NEXT_TREE_NUMBER`].
pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// `(tree number, timestamp)` -> encoded [`LogRecord`]: the op log in
/// timestamp order.
pub const LOG: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("log");
/// `(tree number, height)` -> timestamp: the log in this replica's storage
/// order.
pub const HEIGHTS: TableDefinition<(u64, u64), u64> = TableDefinition::new("heights");
/// `(tree number, node)` -> encoded [`NodeRecord`]: current parent of every
/// node and the timestamp of the op that set its meta.
pub const NODES: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("nodes");
/// `(tree number, parent, name key, child)` -> `(meta time, internal)`.
/// The name key is `[0]` for a node without `FileName` and `[1] ++ value`
/// otherwise, so one table serves both "children of p" (prefix range over
/// `(tree, parent)`) and path lookup (range over `(tree, parent, name)`).
pub const CHILDREN: TableDefinition<ChildKey, (u64, bool)> = TableDefinition::new("children");

/// Key of [`CHILDREN`]: `(tree number, parent, name key, child)`.
pub type ChildKey = (u64, u64, &'static [u8], u64);
/// `(tree number, cursor kind, peer)` -> cursor value.
pub const CURSORS: TableDefinition<(u64, u8, u16), u64> = TableDefinition::new("cursors");

/// Key of [`META`] holding the number the next new tree gets.
pub const NEXT_TREE_NUMBER: &str = "next_tree_number";

/// The key of a tree in [`TREES`].
pub fn tree_key_bytes(tree: &TreeKey) -> Vec<u8> {
    let mut key = Vec::with_capacity(32 + tree.tree.len());
    key.extend_from_slice(&tree.cid.0);
    key.extend_from_slice(tree.tree.as_bytes());
    key
}

/// Inverse of [`tree_key_bytes`].
pub fn decode_tree_key(bytes: &[u8]) -> Result<TreeKey> {
    if bytes.len() < 32 {
        return Err(Error::Malformed(
            "tree key shorter than a container id".into(),
        ));
    }
    let mut cid = [0u8; 32];
    cid.copy_from_slice(&bytes[..32]);
    let name = std::str::from_utf8(&bytes[32..])
        .map_err(|_| Error::Malformed("tree id is not UTF-8".into()))?;
    Ok(TreeKey::new(ContainerId(cid), name))
}

/// Per-tree bookkeeping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeRecord {
    /// The tree's number in the per-tree tables.
    pub number: u64,
    /// Largest Lamport counter of any op stored in the tree; a local op
    /// takes the next one.
    pub max_counter: u64,
    /// Height the next stored op gets (= ops stored).
    pub next_height: u64,
    /// Rows of [`NODES`] for this tree; bounds ancestor walks.
    pub node_count: u64,
    /// Largest parent id (TRASH aside) named by any stored op: a node id
    /// above it can have no children, which spares the cycle check's walk
    /// for freshly created nodes.
    pub max_parent: u64,
}

pub fn encode_tree(record: &TreeRecord) -> Vec<u8> {
    postcard::to_stdvec(record).expect("encoding a tree record cannot fail")
}

pub fn decode_tree(bytes: &[u8]) -> Result<TreeRecord> {
    decode_exact(bytes, "tree record")
}

/// How to undo one logged op. The previous meta is not stored: it is the
/// meta of the op at `old_ts`, which stays in the log (logs are never
/// truncated).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Undo {
    /// The op was a no-op (it would have created a cycle).
    NoEffect,
    /// The child did not exist before the op.
    Created,
    /// The child hung under `old_parent` with the meta set at `old_ts`.
    Moved {
        old_parent: NodeId,
        old_ts: Timestamp,
    },
}

/// The op part of a log record; its timestamp is the key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpBody {
    pub parent: NodeId,
    pub child: NodeId,
    pub items: Vec<KeyValue>,
}

/// Borrowing twin of [`OpBody`]; encodes to the same bytes.
#[derive(Serialize)]
struct OpBodyRef<'a> {
    parent: NodeId,
    child: NodeId,
    items: &'a [KeyValue],
}

/// The mutable part of a log record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogTail {
    pub height: u64,
    pub undo: Undo,
}

/// One entry of the op log. Encoded as `postcard(body) ++ postcard(tail)`:
/// the op bytes come first so that an incoming duplicate can be recognised
/// by comparing its encoded body with the stored prefix, without decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    pub body: OpBody,
    pub tail: LogTail,
}

impl LogRecord {
    pub fn to_move(&self, ts: Timestamp) -> Move {
        Move {
            parent: self.body.parent,
            child: self.body.child,
            meta: Meta {
                time: ts,
                items: self.body.items.clone(),
            },
        }
    }
}

/// The encoded op part of a log record.
pub fn encode_op_body(parent: NodeId, child: NodeId, items: &[KeyValue]) -> Vec<u8> {
    let body = OpBodyRef {
        parent,
        child,
        items,
    };
    postcard::to_stdvec(&body).expect("encoding an op cannot fail")
}

pub fn encode_log(parent: NodeId, child: NodeId, items: &[KeyValue], tail: LogTail) -> Vec<u8> {
    let mut bytes = encode_op_body(parent, child, items);
    append_tail(&mut bytes, tail);
    bytes
}

fn append_tail(bytes: &mut Vec<u8>, tail: LogTail) {
    let tail = postcard::to_stdvec(&tail).expect("encoding a log tail cannot fail");
    bytes.extend_from_slice(&tail);
}

pub fn decode_log(bytes: &[u8]) -> Result<LogRecord> {
    let (body, rest): (OpBody, _) = postcard::take_from_bytes(bytes)
        .map_err(|e| Error::Malformed(format!("log record op: {e}")))?;
    let tail = decode_exact(rest, "log record tail")?;
    Ok(LogRecord { body, tail })
}

/// Length of the op part of an encoded log record.
pub fn log_body_len(bytes: &[u8]) -> Result<usize> {
    let (_, rest): (OpBody, _) = postcard::take_from_bytes(bytes)
        .map_err(|e| Error::Malformed(format!("log record op: {e}")))?;
    Ok(bytes.len() - rest.len())
}

/// Replaces the tail of an encoded log record, keeping its op bytes.
pub fn replace_log_tail(bytes: &[u8], tail: LogTail) -> Result<Vec<u8>> {
    let body_len = log_body_len(bytes)?;
    let mut out = bytes[..body_len].to_vec();
    append_tail(&mut out, tail);
    Ok(out)
}

/// The children-index name of a meta: `[0]` without `FileName`, else
/// `[1] ++ value` (so an empty name differs from no name).
pub fn name_key(items: &[KeyValue]) -> Vec<u8> {
    match items.iter().find(|kv| kv.key == ATTR_FILE_NAME) {
        None => vec![0],
        Some(kv) => {
            let mut key = Vec::with_capacity(1 + kv.value.len());
            key.push(1);
            key.extend_from_slice(&kv.value);
            key
        }
    }
}

/// The name key of a path component.
pub fn component_key(component: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + component.len());
    key.push(1);
    key.extend_from_slice(component.as_bytes());
    key
}

/// True when `items` make a directory node (exactly `[FileName = x]`).
pub fn is_internal(items: &[KeyValue]) -> bool {
    items.len() == 1 && items[0].key == ATTR_FILE_NAME
}

/// Current state of a node. Encoded by hand as
/// `parent (8, BE) ++ time (8, BE) ++ internal (1) ++ name key`, so the
/// ancestor walk of the cycle check reads the parent without allocating.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRecord {
    pub parent: NodeId,
    /// Timestamp of the op that set the node's meta; that op is in the log.
    pub time: Timestamp,
    pub internal: bool,
    pub name_key: Vec<u8>,
}

const NODE_HEADER_BYTES: usize = 17;

pub fn encode_node(record: &NodeRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(NODE_HEADER_BYTES + record.name_key.len());
    out.extend_from_slice(&record.parent.to_be_bytes());
    out.extend_from_slice(&record.time.to_be_bytes());
    out.push(u8::from(record.internal));
    out.extend_from_slice(&record.name_key);
    out
}

pub fn decode_node(bytes: &[u8]) -> Result<NodeRecord> {
    let parent = node_parent(bytes)?;
    let time = u64::from_be_bytes(bytes[8..16].try_into().expect("checked length"));
    let internal = match bytes[16] {
        0 => false,
        1 => true,
        other => return Err(Error::Malformed(format!("node flag {other}"))),
    };
    let name_key = bytes[NODE_HEADER_BYTES..].to_vec();
    let name_ok = match name_key.first() {
        Some(0) => name_key.len() == 1,
        Some(1) => true,
        _ => false,
    };
    if !name_ok {
        return Err(Error::Malformed("node name key".into()));
    }
    Ok(NodeRecord {
        parent,
        time,
        internal,
        name_key,
    })
}

/// The parent of an encoded node, without decoding the rest.
pub fn node_parent(bytes: &[u8]) -> Result<NodeId> {
    if bytes.len() < NODE_HEADER_BYTES + 1 {
        return Err(Error::Malformed("node record too short".into()));
    }
    Ok(u64::from_be_bytes(
        bytes[..8].try_into().expect("checked length"),
    ))
}

fn decode_exact<T: for<'de> Deserialize<'de>>(bytes: &[u8], what: &str) -> Result<T> {
    let (value, rest) =
        postcard::take_from_bytes(bytes).map_err(|e| Error::Malformed(format!("{what}: {e}")))?;
    if !rest.is_empty() {
        return Err(Error::Malformed(format!("{what}: trailing bytes")));
    }
    Ok(value)
}
