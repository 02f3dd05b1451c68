//! The rows of one tree, in a table of its own ([`tree_table`]): its
//! state, its height runs, its node rows and its log rows, under one key
//! type ordered so that what a batch appends lands at the table's end.

use super::be_u64;
use crate::error::{Error, Result};
use crate::types::*;
use redb::TableDefinition;

/// Names of the per-tree tables start with this; the rest is the tree's
/// number in decimal.
pub const TREE_TABLE_PREFIX: &str = "tree/";

/// The name of tree `number`'s table.
pub fn tree_table_name(number: u64) -> String {
    format!("{TREE_TABLE_PREFIX}{number}")
}

/// The definition of the table named `name` (a [`tree_table_name`]).
///
/// Why a table per tree: a b-tree splits a full leaf in two halves unless
/// the key goes after every key it holds, in which case redb starts a new
/// leaf and leaves the full one packed. Node and log rows are appended at
/// the end of their tree's op region (a created node's id is its op's
/// timestamp, and local ops take the newest timestamps), so in a table of
/// their own they are appended at the table's end and every leaf they
/// leave behind is full. In a table shared by several trees every tree but
/// the last appends in the middle, and each of its leaves ended half full
/// (format version 6 kept 0.54 bytes of rows per byte of leaf). A batch
/// touching one tree still opens two tables, its own and the children
/// index ([`super::CHILDREN`]); dropping a tree deletes its table.
pub fn tree_table(name: &str) -> TableDefinition<'_, RowKey, &'static [u8]> {
    TableDefinition::new(name)
}

/// Where a row sits in its tree's table: `region`, then `a`, then
/// `kind`, compared in that order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RowKeyParts {
    pub region: u8,
    pub a: u64,
    pub kind: u8,
}

/// Key type of a tree's table: [`RowKeyParts`] stored as 10 bytes,
/// `region (1) ++ a (8, big-endian) ++ kind (1)`, compared bytewise, which
/// is the parts' order.
#[derive(Debug)]
pub struct RowKey;

/// Bytes of an encoded [`RowKey`].
pub const ROW_KEY_BYTES: usize = 10;

impl redb::Value for RowKey {
    type SelfType<'a> = RowKeyParts;
    type AsBytes<'a> = [u8; ROW_KEY_BYTES];

    fn fixed_width() -> Option<usize> {
        Some(ROW_KEY_BYTES)
    }

    fn from_bytes<'a>(data: &'a [u8]) -> RowKeyParts
    where
        Self: 'a,
    {
        // redb hands a fixed-width key exactly `fixed_width()` bytes.
        RowKeyParts {
            region: data[0],
            a: be_u64(&data[1..9]),
            kind: data[9],
        }
    }

    fn as_bytes<'a, 'b: 'a>(value: &'a RowKeyParts) -> [u8; ROW_KEY_BYTES]
    where
        Self: 'b,
    {
        let mut out = [0; ROW_KEY_BYTES];
        out[0] = value.region;
        out[1..9].copy_from_slice(&value.a.to_be_bytes());
        out[9] = value.kind;
        out
    }

    fn type_name() -> redb::TypeName {
        redb::TypeName::new("arbor::TreeRowKey")
    }
}

impl redb::Key for RowKey {
    fn compare(left: &[u8], right: &[u8]) -> std::cmp::Ordering {
        left.cmp(right)
    }
}

/// What a row of a tree's table holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowKind {
    /// State region, a = 0: encoded [`super::TreeRecord`].
    State,
    /// Height region, a = the first height: the timestamps and digests
    /// ([`super::op_digest`], 8 + 8 bytes each, BE) of the ops stored at
    /// heights `first, first + 1, ..`, the log in this replica's storage
    /// order. Runs follow each other without gaps; the newest one grows
    /// with later batches until it holds [`HEIGHT_RUN_MAX`], so that each
    /// fills a leaf.
    Height,
    /// Ops region, `(a, kind) = (node, 0)`: encoded [`super::NodeRecord`],
    /// the node's current state.
    Node,
    /// Ops region, `(a, kind) = (timestamp, 1)`: encoded log record (see
    /// [`super::LogRecord`]), the op log in timestamp order. A created
    /// node's row sits right before its op's.
    Log,
}

const REGION_STATE: u8 = 0;
const REGION_HEIGHT: u8 = 1;
const REGION_OPS: u8 = 2;
const OPS_NODE: u8 = 0;
const OPS_LOG: u8 = 1;

/// What the row under `key` holds; `None` for a key no kind uses (damage).
pub fn key_kind(key: RowKeyParts) -> Option<RowKind> {
    match (key.region, key.a, key.kind) {
        (REGION_STATE, 0, 0) => Some(RowKind::State),
        (REGION_HEIGHT, _, 0) => Some(RowKind::Height),
        (REGION_OPS, _, OPS_NODE) => Some(RowKind::Node),
        (REGION_OPS, _, OPS_LOG) => Some(RowKind::Log),
        _ => None,
    }
}

pub fn node_key(node: NodeId) -> RowKeyParts {
    RowKeyParts {
        region: REGION_OPS,
        a: node,
        kind: OPS_NODE,
    }
}

pub fn log_key(ts: Timestamp) -> RowKeyParts {
    RowKeyParts {
        region: REGION_OPS,
        a: ts,
        kind: OPS_LOG,
    }
}

pub fn state_key() -> RowKeyParts {
    RowKeyParts {
        region: REGION_STATE,
        a: 0,
        kind: 0,
    }
}

/// Key of the height run starting at `first`.
pub fn height_key(first: u64) -> RowKeyParts {
    RowKeyParts {
        region: REGION_HEIGHT,
        a: first,
        kind: 0,
    }
}

/// The first height of the run stored under `key` (a [`height_key`]).
pub fn height_of_key(key: RowKeyParts) -> u64 {
    key.a
}

/// Every row of the region that holds `kind`. Node and log rows share a
/// region: a scan for either meets both and tells them apart with
/// [`key_kind`].
pub fn region_range(kind: RowKind) -> std::ops::RangeInclusive<RowKeyParts> {
    let region = match kind {
        RowKind::State => REGION_STATE,
        RowKind::Height => REGION_HEIGHT,
        RowKind::Node | RowKind::Log => REGION_OPS,
    };
    let at = |a, kind| RowKeyParts { region, a, kind };
    at(0, 0)..=at(u64::MAX, u8::MAX)
}

/// Log rows from `ts` on (node rows in between are passed over by
/// [`key_kind`]).
pub fn log_range_from(ts: Timestamp) -> std::ops::RangeInclusive<RowKeyParts> {
    log_key(ts)..=log_key(u64::MAX)
}

/// Most entries in one height run: one run fills a 4 KiB leaf
/// (3,968 bytes of value).
pub const HEIGHT_RUN_MAX: usize = 248;

/// Bytes of one height run entry: timestamp and digest.
pub const HEIGHT_ENTRY_BYTES: usize = 16;

/// Whether an encoded height run may be `len` bytes long: asserted before
/// a run is written, checked after one is read.
pub fn height_run_len_valid(len: usize) -> bool {
    len > 0 && len.is_multiple_of(HEIGHT_ENTRY_BYTES) && len <= HEIGHT_ENTRY_BYTES * HEIGHT_RUN_MAX
}

/// Appends one height run entry.
pub fn encode_height_entry(out: &mut Vec<u8>, ts: Timestamp, digest: u64) {
    out.extend_from_slice(&ts.to_be_bytes());
    out.extend_from_slice(&digest.to_be_bytes());
}

/// The `(timestamp, digest)` entries of an encoded height run.
pub fn decode_height_run(bytes: &[u8]) -> Result<impl Iterator<Item = (Timestamp, u64)> + '_> {
    if !height_run_len_valid(bytes.len()) {
        return Err(Error::Malformed(format!(
            "height run of {} bytes",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(HEIGHT_ENTRY_BYTES)
        .map(|entry| (be_u64(&entry[..8]), be_u64(&entry[8..]))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{Key, Value};

    /// The stored bytes order keys as their parts order.
    #[test]
    fn row_keys_encode_and_order_as_their_parts() {
        let edges = [0, 1, 255, 256, 1 << 32, u64::MAX - 1, u64::MAX];
        let mut parts = Vec::new();
        for region in [0u8, 1, 2, 255] {
            for &a in &edges {
                for kind in [0u8, 1, 255] {
                    parts.push(RowKeyParts { region, a, kind });
                }
            }
        }
        for x in &parts {
            let bytes = RowKey::as_bytes(x);
            assert_eq!(RowKey::from_bytes(&bytes), *x);
            for y in &parts {
                let order = RowKey::compare(&bytes, &RowKey::as_bytes(y));
                assert_eq!(order, x.cmp(y), "{x:?} {y:?}");
            }
        }
    }

    #[test]
    fn appends_go_last_and_kinds_round_trip() {
        // A created node sits right before its creating op's log row, and
        // both after every older op: an appending batch writes at the end.
        assert!(node_key(9) < log_key(9));
        assert!(log_key(9) < node_key(10));
        assert!(state_key() < height_key(0));
        assert!(height_key(u64::MAX) < node_key(0));
        assert!(height_key(3) < height_key(7));
        for (key, kind) in [
            (node_key(8), RowKind::Node),
            (log_key(8), RowKind::Log),
            (state_key(), RowKind::State),
            (height_key(8), RowKind::Height),
        ] {
            assert_eq!(key_kind(key), Some(kind));
            assert!(region_range(kind).contains(&key));
        }
        let stray = RowKeyParts {
            region: 3,
            a: 0,
            kind: 0,
        };
        assert_eq!(key_kind(stray), None);
        assert_eq!(
            key_kind(RowKeyParts {
                kind: 2,
                ..node_key(8)
            }),
            None
        );
        assert_eq!(tree_table_name(42), "tree/42");
    }
}
