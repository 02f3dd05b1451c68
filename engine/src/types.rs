//! The data model shared by every layer: node ids, timestamps, metadata and
//! the single kind of operation, the move.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A node of a tree. Created nodes take the timestamp of the op that created
/// them as their id, so ids are unique without coordination.
pub type NodeId = u64;

/// The root every live node hangs from.
pub const ROOT: NodeId = 0;
/// Removed nodes are moved under this node; it is never a real node.
pub const TRASH: NodeId = u64::MAX;

/// A Lamport timestamp: `(counter << 16) | replica_id`. Totally ordered and
/// unique across replicas because every replica has its own stable id.
pub type Timestamp = u64;

/// A stable replica id from the membership configuration (never a list
/// position, which would collide when membership changes).
pub type ReplicaId = u16;

/// Bits of a timestamp that carry the replica id.
pub const REPLICA_BITS: u32 = 16;

/// The largest counter a timestamp can carry; the counter space is checked so
/// that a created node id can never equal `TRASH`.
pub const COUNTER_MAX: u64 = (u64::MAX >> REPLICA_BITS) - 1;

/// Builds a timestamp from a Lamport counter and a replica id.
pub fn make_timestamp(counter: u64, replica: ReplicaId) -> Timestamp {
    assert!((1..=COUNTER_MAX).contains(&counter), "counter out of range");
    (counter << REPLICA_BITS) | Timestamp::from(replica)
}

/// The Lamport counter part of a timestamp.
pub fn timestamp_counter(ts: Timestamp) -> u64 {
    ts >> REPLICA_BITS
}

/// The replica that issued a timestamp.
pub fn timestamp_replica(ts: Timestamp) -> ReplicaId {
    (ts & 0xffff) as ReplicaId
}

/// The key of the path attribute. A node whose meta is exactly
/// `[FileName = x]` is an internal (directory) node.
pub const ATTR_FILE_NAME: &str = "FileName";

/// A container id: 32 opaque bytes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub struct ContainerId(pub [u8; 32]);

impl fmt::Debug for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..4] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…")
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl ContainerId {
    /// Parses 64 hex digits.
    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 64 || !s.is_ascii() {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Self(out))
    }
}

/// Names one tree of the forest.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Debug)]
pub struct TreeKey {
    pub cid: ContainerId,
    /// Any UTF-8 string; "" is a valid tree id.
    pub tree: String,
}

impl TreeKey {
    pub fn new(cid: ContainerId, tree: impl Into<String>) -> Self {
        Self {
            cid,
            tree: tree.into(),
        }
    }
}

/// One key/value pair of a node's meta.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Debug)]
pub struct KeyValue {
    pub key: String,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
}

impl KeyValue {
    pub fn new(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
        }
    }
}

/// A node's meta: the timestamp of the op that last set it, and its ordered
/// key/value list.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Debug, Default)]
pub struct Meta {
    pub time: Timestamp,
    pub items: Vec<KeyValue>,
}

impl Meta {
    /// The value of the first item with this key.
    pub fn get(&self, key: &str) -> Option<&[u8]> {
        self.items
            .iter()
            .find(|kv| kv.key == key)
            .map(|kv| kv.value.as_slice())
    }

    /// The path attribute, if any.
    pub fn file_name(&self) -> Option<&[u8]> {
        self.get(ATTR_FILE_NAME)
    }

    /// True for a directory node: its meta is exactly `[FileName = x]`.
    pub fn is_internal(&self) -> bool {
        self.items.len() == 1 && self.items[0].key == ATTR_FILE_NAME
    }

    /// Encoded size used for the oversized-meta limit.
    pub fn size_bytes(&self) -> usize {
        self.items
            .iter()
            .map(|kv| kv.key.len() + kv.value.len() + 8)
            .sum()
    }
}

/// The one operation of the move CRDT. Its timestamp is `meta.time`.
/// Create = move of a fresh child; update = move to the same parent;
/// remove = move under `TRASH`.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Debug)]
pub struct Move {
    pub parent: NodeId,
    pub child: NodeId,
    pub meta: Meta,
}

impl Move {
    pub fn ts(&self) -> Timestamp {
        self.meta.time
    }
}

/// An op as stored in a replica's log, with its height: its position in this
/// replica's storage order (not its timestamp order).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, Debug)]
pub struct LogEntry {
    pub height: u64,
    pub op: Move,
}

/// Where an op sits in a replica's log, without the op: what a puller needs
/// to tell whether it already holds it (timestamps are unique), and the
/// op's digest, to tell whether what it holds under that timestamp is the
/// same op (docs/design.md §9).
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Debug)]
pub struct LogStamp {
    pub height: u64,
    pub ts: Timestamp,
    pub digest: u64,
}

/// A node as read back: id, parent and meta.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, Debug)]
pub struct NodeInfo {
    pub id: NodeId,
    pub parent: NodeId,
    pub meta: Meta,
}
