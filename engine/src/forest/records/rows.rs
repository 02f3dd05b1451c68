//! The one table of per-tree rows ([`ROWS`]): its key type, the kinds of
//! row it holds and the key of each kind.

use super::be_u64;
use crate::error::{Error, Result};
use crate::types::*;
use redb::TableDefinition;

/// Every per-tree row, in one b-tree, keyed by `(tree number << 2 |
/// region, a, b, c)` (see [`RowKind`] for each kind's region and `a, b,
/// c`).
///
/// Why one table: a commit pays per b-tree page it dirties (a fresh page,
/// its checksum, the write to storage, the old page's release) and per
/// table whose root changes (a table-tree update, a table open per
/// transaction). The batches of a replicated service are small (often one
/// op), and one op used to dirty a root-to-leaf path in each of six
/// tables. In one key space the paths share their branch pages, and the
/// rows an appending batch writes sit side by side: node and log rows
/// share one region ordered by id/timestamp, so the node a create op makes
/// (its id is the op's timestamp) lands next to the op's log row at the
/// region's end; the tree's state row follows, then the newest height run
/// (heights are keyed in descending order for this). An in-order batch of
/// creations usually dirties one leaf for all four. The children index is
/// keyed by name, which no fixed-width key holds: it has a table of its
/// own, [`super::CHILDREN`].
///
/// The key is four integers wide (region 3 is unused: it held the
/// children index before format version 6); kinds that need fewer pad
/// with zeros.
pub const ROWS: TableDefinition<RowKey, &[u8]> = TableDefinition::new("rows");

/// The four integers of a [`ROWS`] key, as code handles them.
pub type RowKeyParts = (u64, u64, u64, u64);

/// Key type of [`ROWS`]: [`RowKeyParts`] stored as 32 bytes, each integer
/// little-endian (the bytes redb gives the tuple `(u64, u64, u64, u64)`),
/// ordered element by element.
///
/// Its own type rather than redb's tuple, for the cost of every row
/// access: redb formats a tuple's type name anew on each table open (a
/// `String` per element and one for the whole), serialises each tuple key
/// into a fresh `Vec`, and compares tuples through per-element slices.
/// This one encodes into an array, compares four loaded integers, and
/// names itself with a constant. The stored type name differs from the
/// tuple's, hence format version 4.
#[derive(Debug)]
pub struct RowKey;

/// Bytes of an encoded [`RowKey`].
pub const ROW_KEY_BYTES: usize = 32;

/// Integer `i` of an encoded row key. redb hands a fixed-width key
/// exactly `fixed_width()` bytes. Written to stay cheap in builds with
/// debug assertions too (the fuzz targets'): one bounds check, no
/// `copy_from_slice` precondition checks. Millions of calls per second:
/// every key comparison inside a b-tree page comes here (the children
/// index's keys use it too).
pub(super) fn row_key_word(bytes: &[u8], i: usize) -> u64 {
    let word: &[u8; 8] = bytes[8 * i..8 * i + 8]
        .try_into()
        .expect("8 bytes make a word");
    u64::from_le_bytes(*word)
}

/// The four integers laid out as stored (each little-endian).
#[derive(Debug)]
pub struct RowKeyBytes([[u8; 8]; 4]);

impl AsRef<[u8]> for RowKeyBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.as_flattened()
    }
}

impl redb::Value for RowKey {
    type SelfType<'a> = RowKeyParts;
    type AsBytes<'a> = RowKeyBytes;

    fn fixed_width() -> Option<usize> {
        Some(ROW_KEY_BYTES)
    }

    fn from_bytes<'a>(data: &'a [u8]) -> RowKeyParts
    where
        Self: 'a,
    {
        let word = |i| row_key_word(data, i);
        (word(0), word(1), word(2), word(3))
    }

    fn as_bytes<'a, 'b: 'a>(value: &'a RowKeyParts) -> RowKeyBytes
    where
        Self: 'b,
    {
        let (a, b, c, d) = *value;
        RowKeyBytes([a, b, c, d].map(u64::to_le_bytes))
    }

    fn type_name() -> redb::TypeName {
        redb::TypeName::new("arbor::RowKey")
    }
}

impl redb::Key for RowKey {
    fn compare(left: &[u8], right: &[u8]) -> std::cmp::Ordering {
        // Rows of one tree share the first integer: decode only as far
        // as the keys agree.
        for i in 0..4 {
            let order = row_key_word(left, i).cmp(&row_key_word(right, i));
            if order.is_ne() {
                return order;
            }
        }
        std::cmp::Ordering::Equal
    }
}

/// What a [`ROWS`] row holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowKind {
    /// Ops region, `(a, b) = (node, 0)`: encoded [`NodeRecord`], the
    /// node's current state.
    Node,
    /// Ops region, `(a, b) = (timestamp, 1)`: encoded log record (see
    /// [`LogRecord`]), the op log in timestamp order.
    Log,
    /// State region, a = 0: encoded [`TreeRecord`].
    State,
    /// Height region, a = `u64::MAX - first height`: the timestamps and
    /// digests ([`super::op_digest`], 8 + 8 bytes each, BE) of the ops stored at
    /// heights `first, first + 1, ..`, the log in this replica's storage
    /// order. One row per run of
    /// consecutive heights written by one batch (at most
    /// [`HEIGHT_RUN_MAX`]) rather than one per op.
    Height,
}

/// The low bits of a key's first element.
#[derive(Clone, Copy)]
enum Region {
    Ops = 0,
    State = 1,
    Height = 2,
}

const REGION_BITS: u32 = 2;

/// The key's third element in the ops region.
const OPS_NODE: u64 = 0;

const OPS_LOG: u64 = 1;

/// Largest tree number that fits beside a region in a key.
pub const TREE_NUMBER_MAX: u64 = u64::MAX >> REGION_BITS;

fn row_prefix(tree: u64, region: Region) -> u64 {
    assert!(tree <= TREE_NUMBER_MAX, "tree number {tree} out of range");
    (tree << REGION_BITS) | region as u64
}

fn region_of(kind: RowKind) -> Region {
    match kind {
        RowKind::Node | RowKind::Log => Region::Ops,
        RowKind::State => Region::State,
        RowKind::Height => Region::Height,
    }
}

/// What the row under `key` holds; `None` for a key no kind uses (damage).
pub fn key_kind(key: RowKeyParts) -> Option<RowKind> {
    match (key.0 & ((1 << REGION_BITS) - 1), key.2) {
        (0, OPS_NODE) => Some(RowKind::Node),
        (0, OPS_LOG) => Some(RowKind::Log),
        (0, _) => None,
        (1, _) => Some(RowKind::State),
        (2, _) => Some(RowKind::Height),
        _ => None,
    }
}

pub fn node_key(tree: u64, node: NodeId) -> RowKeyParts {
    (row_prefix(tree, Region::Ops), node, OPS_NODE, 0)
}

pub fn log_key(tree: u64, ts: Timestamp) -> RowKeyParts {
    (row_prefix(tree, Region::Ops), ts, OPS_LOG, 0)
}

pub fn state_key(tree: u64) -> RowKeyParts {
    (row_prefix(tree, Region::State), 0, 0, 0)
}

/// Key of the height run starting at `first`: descending, so that the
/// newest run is the first row after the state row.
pub fn height_key(tree: u64, first: u64) -> RowKeyParts {
    (row_prefix(tree, Region::Height), u64::MAX - first, 0, 0)
}

/// The first height of the run stored under `key` (a [`height_key`]).
pub fn height_of_key(key: RowKeyParts) -> u64 {
    u64::MAX - key.1
}

/// Every row of the region that holds `kind` in one tree. Node and log
/// rows share a region: a scan for either meets both and tells them
/// apart with [`key_kind`].
pub fn region_range(tree: u64, kind: RowKind) -> std::ops::RangeInclusive<RowKeyParts> {
    let prefix = row_prefix(tree, region_of(kind));
    (prefix, 0, 0, 0)..=(prefix, u64::MAX, u64::MAX, u64::MAX)
}

/// Every [`ROWS`] row of one tree.
pub fn tree_rows(tree: u64) -> std::ops::RangeInclusive<RowKeyParts> {
    // Through region 3, which no kind uses, so that a stray row left there
    // by an older format goes with its tree.
    let first = row_prefix(tree, Region::Ops);
    let last = row_prefix(tree, Region::Height) + 1;
    (first, 0, 0, 0)..=(last, u64::MAX, u64::MAX, u64::MAX)
}

/// Most timestamps in one height run (8 KiB of value).
pub const HEIGHT_RUN_MAX: usize = 512;

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

    type Tuple = (u64, u64, u64, u64);

    /// `RowKey` stores the bytes redb gives the four-integer tuple and
    /// orders them as the tuple orders its integers (so version 3's rows
    /// sort the same, and the key functions' order is the stored one).
    #[test]
    fn row_keys_encode_and_order_as_the_tuple_did() {
        let edges = [0, 1, 2, 255, 256, 1 << 32, u64::MAX - 1, u64::MAX];
        let mut parts = Vec::new();
        for &a in &edges {
            for &b in &edges[..4] {
                parts.push((a, b, edges[(a % 8) as usize], edges[(b % 8) as usize]));
                parts.push((b, a, u64::MAX - a, a ^ b));
            }
        }
        for x in &parts {
            let encoded = RowKey::as_bytes(x);
            let bytes = encoded.as_ref();
            assert_eq!(bytes, Tuple::as_bytes(x).as_slice());
            assert_eq!(RowKey::from_bytes(bytes), *x);
            for y in &parts {
                let other = RowKey::as_bytes(y);
                let order = RowKey::compare(bytes, other.as_ref());
                assert_eq!(order, x.cmp(y), "{x:?} {y:?}");
                assert_eq!(order, Tuple::compare(bytes, other.as_ref()));
            }
        }
        assert_eq!(RowKey::fixed_width(), Tuple::fixed_width());
    }

    #[test]
    fn keys_keep_each_trees_rows_together_and_in_order() {
        let t = 5;
        // A created node sits right before its creating op's log row.
        assert!(node_key(t, 9) < log_key(t, 9));
        assert!(log_key(t, 9) < node_key(t, 10));
        // State after every op row, then heights newest first.
        assert!(log_key(t, u64::MAX) < state_key(t));
        assert!(state_key(t) < height_key(t, 7));
        assert!(height_key(t, 7) < height_key(t, 3));
        // Every kind of tree t is in its range, nothing of its neighbours.
        let rows = tree_rows(t);
        for key in [
            node_key(t, 0),
            log_key(t, u64::MAX),
            state_key(t),
            height_key(t, 0),
        ] {
            assert!(rows.contains(&key), "{key:?}");
        }
        assert!(!rows.contains(&(row_prefix(t - 1, Region::Height) + 1, 0, 0, 0)));
        assert!(!rows.contains(&node_key(t + 1, 0)));
        let last = tree_rows(TREE_NUMBER_MAX);
        assert!(last.contains(&height_key(TREE_NUMBER_MAX, 0)));
    }

    #[test]
    fn key_kinds_round_trip_and_unknown_ones_are_named() {
        assert_eq!(key_kind(node_key(3, 8)), Some(RowKind::Node));
        assert_eq!(key_kind(log_key(3, 8)), Some(RowKind::Log));
        assert_eq!(key_kind(state_key(3)), Some(RowKind::State));
        assert_eq!(key_kind(height_key(3, 8)), Some(RowKind::Height));
        assert_eq!(key_kind((row_prefix(3, Region::Height) + 1, 1, 2, 8)), None);
        let (prefix, id, _, _) = node_key(3, 8);
        assert_eq!(key_kind((prefix, id, 2, 0)), None);
    }
}
