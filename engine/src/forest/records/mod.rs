//! Stored record types, their tables and their byte encodings.
//!
//! Every table is declared here, once. Each tree is mapped to a small
//! `u64` tree number (never reused), which names the tree's own table of
//! rows ([`tree_table`]) and leads the keys of the shared tables, so that
//! no key repeats the 32-byte container id and the tree name.
//!
//! Every decoder returns `Error::Malformed` on bad bytes: a damaged record is
//! an operating error (disk, fuzzer), not a reason to panic.

mod children;
mod log;
mod node;
mod rows;

pub use children::*;
pub use log::*;
pub use node::*;
pub use rows::*;

use crate::error::{Error, Result};
use crate::types::*;
use redb::TableDefinition;
use serde::{Deserialize, Serialize};

/// `cid (32 bytes) ++ tree id (UTF-8)` -> the tree's number. Byte order
/// of the key sorts trees by container, then by tree id. Written once, when
/// the tree is created: the tree's changing bookkeeping lives in its own
/// table ([`tree_table`]: a [`TreeRecord`] under [`state_key`]), next to
/// the rows a batch writes.
pub const TREES: TableDefinition<&[u8], u64> = TableDefinition::new("trees");
/// `cid ++ tree id` (as in [`TREES`]) -> the marks the dropped
/// incarnations of that tree reached: `(largest counter, next height)`.
/// A tree created again under the key starts from both, so its stamps
/// never repeat one its dropped incarnation gave (a peer may still hold
/// it) and its heights never go below a peer's pull cursor of the old
/// log (docs/design.md §6). One row per tree key ever dropped.
pub const DROPPED: TableDefinition<&[u8], (u64, u64)> = TableDefinition::new("dropped");
/// Largest tree number given out.
pub const TREE_NUMBER_MAX: u64 = u64::MAX >> 2;

/// Forest-wide counters, e.g. [`NEXT_TREE_NUMBER`].
pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// `(tree number, cursor kind, peer)` -> cursor value.
pub const CURSORS: TableDefinition<(u64, u8, u16), u64> = TableDefinition::new("cursors");

/// Key of [`META`] holding the number the next new tree gets.
pub const NEXT_TREE_NUMBER: &str = "next_tree_number";

/// Key of [`META`] holding this database's log epoch: drawn when the
/// database got its first service, never reused by the replica, so a peer
/// tells a log rebuilt on a replaced disk from the one it pulled
/// (docs/design.md §6).
pub const LOG_EPOCH: &str = "log_epoch";

/// Key of [`META`] holding the sequence number of the last write-ahead
/// log record whose ops this database holds (docs/design.md §5): set in
/// the transaction of every batch that writes a record and of every
/// replayed one, so whatever commit survives a crash names the records
/// it holds, and a checkpoint (a durable commit) stores the position it
/// covers. Absent: 0.
pub const WAL_POSITION: &str = "wal_position";

/// Key of [`META`] holding the log epoch of `peer` that this database's
/// pull cursors of `peer` count heights in.
pub fn peer_log_epoch_key(peer: ReplicaId) -> String {
    format!("peer_log_epoch/{peer}")
}

/// Key of [`META`] holding the layout version of the stored tables.
pub const FORMAT_VERSION: &str = "format_version";

/// Version 2: one table of rows instead of separate log, node, height
/// tables and tree records. Version 3: the children index moved into
/// that table (four-integer keys), node and log rows share one region.
/// Version 4: the rows keyed by a type of Arbor's (same bytes and order as
/// version 3's tuple, another redb type name). Version 5: height runs
/// carry each op's digest beside its timestamp. Version 6: the children
/// index left the rows for [`CHILDREN`], ordered by name instead of a
/// hash of it. Version 7: a table of rows per tree ([`tree_table`], keys
/// of 10 bytes ordered so that appends go at its end), height runs that
/// grow until they fill a leaf, and each node's meta in its children row,
/// left out of the log row of the op that set it.
pub const FORMAT_VERSION_CURRENT: u64 = 7;

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

/// Per-tree bookkeeping (the [`RowKind::State`] row of its table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeRecord {
    /// The tree's number in the per-tree tables.
    pub number: u64,
    /// Largest Lamport counter of any op stored in the tree; a local op
    /// takes the next one.
    pub max_counter: u64,
    /// Height the next stored op gets (= ops stored).
    pub next_height: u64,
    /// Node rows of this tree; bounds ancestor walks.
    pub node_count: u64,
    /// Largest parent id (TRASH aside) named by any stored op: a node id
    /// above it can have no children, which spares the cycle check's walk
    /// for freshly created nodes.
    pub max_parent: u64,
}

impl TreeRecord {
    /// What every stored tree record satisfies; asserted before each write
    /// and checked (a typed error: disk damage) after each read.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.number == 0 || self.number > TREE_NUMBER_MAX {
            return Err(format!("tree number {} out of range", self.number));
        }
        if self.max_counter > COUNTER_MAX {
            return Err(format!("counter {} out of range", self.max_counter));
        }
        if (self.next_height == 0) != (self.max_counter == 0) {
            return Err(format!(
                "{} ops stored, newest counter {}",
                self.next_height, self.max_counter
            ));
        }
        if self.node_count > self.next_height {
            return Err(format!(
                "{} nodes made by {} ops",
                self.node_count, self.next_height
            ));
        }
        Ok(())
    }
}

pub fn encode_tree(record: &TreeRecord) -> Vec<u8> {
    if let Err(broken) = record.check() {
        panic!("writing a broken tree record {record:?}: {broken}");
    }
    postcard::to_stdvec(record).expect("encoding a tree record cannot fail")
}

pub fn decode_tree(bytes: &[u8]) -> Result<TreeRecord> {
    let record: TreeRecord = decode_exact(bytes, "tree record")?;
    record
        .check()
        .map_err(|broken| Error::Malformed(format!("tree record: {broken}")))?;
    Ok(record)
}

fn be_u64(bytes: &[u8]) -> u64 {
    u64::from_be_bytes(bytes.try_into().expect("caller checked the length"))
}

fn be_u32(bytes: &[u8]) -> usize {
    u32::from_be_bytes(bytes.try_into().expect("caller checked the length")) as usize
}

fn decode_exact<T: for<'de> Deserialize<'de>>(bytes: &[u8], what: &str) -> Result<T> {
    let (value, rest) =
        postcard::take_from_bytes(bytes).map_err(|e| Error::Malformed(format!("{what}: {e}")))?;
    if !rest.is_empty() {
        return Err(Error::Malformed(format!("{what}: trailing bytes")));
    }
    Ok(value)
}
