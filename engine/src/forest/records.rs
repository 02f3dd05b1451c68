//! Stored record types, their tables and their byte encodings.
//!
//! Every table is declared here, once. Keys are tuples of integers
//! (redb's, or [`RowKey`] for the rows), ordered element by element
//! numerically, so range scans by
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

/// `cid (32 bytes) ++ tree id (UTF-8)` -> the tree's number. Byte order
/// of the key sorts trees by container, then by tree id. Written once, when
/// the tree is created: the tree's changing bookkeeping lives in [`ROWS`]
/// (a [`TreeRecord`] under [`state_key`]), next to the rows a batch writes.
pub const TREES: TableDefinition<&[u8], u64> = TableDefinition::new("trees");
/// Forest-wide counters, e.g. [`NEXT_TREE_NUMBER`].
pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

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
/// creations usually dirties one leaf for all four, plus the children
/// index leaf under each parent.
///
/// The key is four integers wide for the children index, which needs
/// `(parent, name hash, child)`; the other kinds pad with zeros.
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

const ROW_KEY_BYTES: usize = 32;

/// Integer `i` of an encoded row key. redb hands a fixed-width key
/// exactly `fixed_width()` bytes. Written to stay cheap in builds with
/// debug assertions too (the fuzz targets'): one bounds check, no
/// `copy_from_slice` precondition checks. Millions of calls per second:
/// every key comparison inside a b-tree page comes here.
fn row_key_word(bytes: &[u8], i: usize) -> u64 {
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
    /// Height region, a = `u64::MAX - first height`: the timestamps (8
    /// bytes each, BE) of the ops stored at heights `first, first + 1,
    /// ..`, the log in this replica's storage order. One row per run of
    /// consecutive heights written by one batch (at most
    /// [`HEIGHT_RUN_MAX`]) rather than one per op.
    Height,
    /// Children region, `(a, b, c) = (parent, name hash, child)`: the
    /// children index, an encoded [`ChildEntry`] (`meta time (8, BE) ++
    /// internal (1) ++ name key`). The name key is `[0]` for a node
    /// without `FileName` and `[1] ++ value` otherwise; the key holds only
    /// its [`name_hash`], so every key has the same fixed width and the
    /// full name in the value settles the rare hash collision. One range
    /// serves "children of p" (prefix `(parent)`) and path lookup (prefix
    /// `(parent, hash)`, filtered by name), and within one name rows are
    /// in child order, so the smallest id of a duplicated directory comes
    /// first.
    Child,
}

/// The low bits of a key's first element.
#[derive(Clone, Copy)]
enum Region {
    Ops = 0,
    State = 1,
    Height = 2,
    Child = 3,
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
        RowKind::Child => Region::Child,
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
        _ => Some(RowKind::Child),
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

/// Key of the children-index row of `child` under `parent`.
pub fn child_key(tree: u64, parent: NodeId, name_hash: u64, child: NodeId) -> RowKeyParts {
    (row_prefix(tree, Region::Child), parent, name_hash, child)
}

/// Every children-index row of `parent`.
pub fn children_range(tree: u64, parent: NodeId) -> std::ops::RangeInclusive<RowKeyParts> {
    child_key(tree, parent, 0, 0)..=child_key(tree, parent, u64::MAX, u64::MAX)
}

/// Every children-index row of `parent` whose name hashes to `name_hash`.
pub fn children_hash_range(
    tree: u64,
    parent: NodeId,
    name_hash: u64,
) -> std::ops::RangeInclusive<RowKeyParts> {
    child_key(tree, parent, name_hash, 0)..=child_key(tree, parent, name_hash, u64::MAX)
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
    let first = row_prefix(tree, Region::Ops);
    let last = row_prefix(tree, Region::Child);
    (first, 0, 0, 0)..=(last, u64::MAX, u64::MAX, u64::MAX)
}

/// Most timestamps in one height run (4 KiB of value).
pub const HEIGHT_RUN_MAX: usize = 512;

/// The timestamps of an encoded height run.
pub fn decode_height_run(bytes: &[u8]) -> Result<impl Iterator<Item = Timestamp> + '_> {
    if bytes.is_empty() || !bytes.len().is_multiple_of(8) || bytes.len() > 8 * HEIGHT_RUN_MAX {
        return Err(Error::Malformed(format!(
            "height run of {} bytes",
            bytes.len()
        )));
    }
    Ok(bytes.chunks_exact(8).map(be_u64))
}
/// `(tree number, cursor kind, peer)` -> cursor value.
pub const CURSORS: TableDefinition<(u64, u8, u16), u64> = TableDefinition::new("cursors");

/// Key of [`META`] holding the number the next new tree gets.
pub const NEXT_TREE_NUMBER: &str = "next_tree_number";

/// Key of [`META`] holding the layout version of the stored tables.
pub const FORMAT_VERSION: &str = "format_version";

/// Version 2: one [`ROWS`] table instead of separate log, node, height
/// tables and tree records. Version 3: the children index moved into
/// [`ROWS`] (four-integer keys), node and log rows share one region.
/// Version 4: [`ROWS`] keyed by [`RowKey`] (same bytes and order as
/// version 3's tuple, another redb type name).
pub const FORMAT_VERSION_CURRENT: u64 = 4;

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

/// Per-tree bookkeeping (the [`RowKind::State`] row).
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

/// The mutable part of a log record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogTail {
    pub height: u64,
    pub undo: Undo,
}

/// One entry of the op log, encoded by hand as `body ++ tail`:
///
/// - body: `parent (8) ++ child (8) ++ item count (4) ++ items`, each item
///   `key length (4) ++ key ++ value length (4) ++ value` (integers
///   big-endian);
/// - tail, fixed [`LOG_TAIL_BYTES`]: `height (8) ++ undo tag (1) ++
///   old parent (8) ++ old time (8)` (tag 0 no effect, 1 created, 2 moved;
///   the old fields are zero unless moved).
///
/// The op bytes come first and the tail has a fixed size, so a duplicate is
/// recognised by comparing the stored body with the incoming op without
/// decoding, and a redo rewrites the tail in place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    pub body: OpBody,
    pub tail: LogTail,
}

impl LogRecord {
    /// [`LogRecord::to_move`] without copying the items.
    pub fn into_move(self, ts: Timestamp) -> Move {
        Move {
            parent: self.body.parent,
            child: self.body.child,
            meta: Meta {
                time: ts,
                items: self.body.items,
            },
        }
    }

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

/// Size of the fixed tail of an encoded log record.
pub const LOG_TAIL_BYTES: usize = 25;
const LOG_BODY_HEADER_BYTES: usize = 20;

/// The encoded op part of a log record.
pub fn encode_op_body(parent: NodeId, child: NodeId, items: &[KeyValue]) -> Vec<u8> {
    let mut out = Vec::new();
    append_op_body(&mut out, parent, child, items);
    out
}

pub fn encode_log(parent: NodeId, child: NodeId, items: &[KeyValue], tail: LogTail) -> Vec<u8> {
    let mut out = Vec::new();
    encode_log_into(&mut out, parent, child, items, tail);
    out
}

/// [`encode_log`] into a buffer the caller reuses across ops.
pub fn encode_log_into(
    out: &mut Vec<u8>,
    parent: NodeId,
    child: NodeId,
    items: &[KeyValue],
    tail: LogTail,
) {
    out.clear();
    append_op_body(out, parent, child, items);
    out.extend_from_slice(&encode_tail(tail));
}

fn append_op_body(out: &mut Vec<u8>, parent: NodeId, child: NodeId, items: &[KeyValue]) {
    let items_len: usize = items
        .iter()
        .map(|kv| 8 + kv.key.len() + kv.value.len())
        .sum();
    out.reserve(LOG_BODY_HEADER_BYTES + items_len + LOG_TAIL_BYTES);
    out.extend_from_slice(&parent.to_be_bytes());
    out.extend_from_slice(&child.to_be_bytes());
    out.extend_from_slice(&length_u32(items.len()).to_be_bytes());
    for kv in items {
        out.extend_from_slice(&length_u32(kv.key.len()).to_be_bytes());
        out.extend_from_slice(kv.key.as_bytes());
        out.extend_from_slice(&length_u32(kv.value.len()).to_be_bytes());
        out.extend_from_slice(&kv.value);
    }
}

/// Every request is checked against `max_meta_bytes` long before it is
/// encoded, so lengths stay far below 4 GiB.
fn length_u32(len: usize) -> u32 {
    u32::try_from(len).expect("meta lengths are bounded by max_meta_bytes")
}

fn encode_tail(tail: LogTail) -> [u8; LOG_TAIL_BYTES] {
    let mut out = [0u8; LOG_TAIL_BYTES];
    out[..8].copy_from_slice(&tail.height.to_be_bytes());
    match tail.undo {
        Undo::NoEffect => out[8] = 0,
        Undo::Created => out[8] = 1,
        Undo::Moved { old_parent, old_ts } => {
            out[8] = 2;
            out[9..17].copy_from_slice(&old_parent.to_be_bytes());
            out[17..25].copy_from_slice(&old_ts.to_be_bytes());
        }
    }
    out
}

fn decode_tail(bytes: &[u8]) -> Result<LogTail> {
    let height = be_u64(&bytes[..8]);
    let (old_parent, old_ts) = (be_u64(&bytes[9..17]), be_u64(&bytes[17..25]));
    // Unused fields must be zero: one record, one encoding.
    let undo = match bytes[8] {
        2 => Undo::Moved { old_parent, old_ts },
        0 if old_parent == 0 && old_ts == 0 => Undo::NoEffect,
        1 if old_parent == 0 && old_ts == 0 => Undo::Created,
        tag => return Err(Error::Malformed(format!("log record undo tag {tag}"))),
    };
    Ok(LogTail { height, undo })
}

fn be_u64(bytes: &[u8]) -> u64 {
    u64::from_be_bytes(bytes.try_into().expect("caller checked the length"))
}

fn be_u32(bytes: &[u8]) -> usize {
    u32::from_be_bytes(bytes.try_into().expect("caller checked the length")) as usize
}

/// A validated, borrowed view of an encoded log record: the write path
/// reads parents, names and undo information through it without copying
/// the items.
#[derive(Clone, Copy, Debug)]
pub struct LogView<'a> {
    pub parent: NodeId,
    pub child: NodeId,
    pub tail: LogTail,
    item_count: usize,
    /// The encoded items (after the count).
    items: &'a [u8],
    /// The op bytes (the record without its tail).
    body: &'a [u8],
}

impl<'a> LogView<'a> {
    /// Checks every length and key of the record, so that nothing read
    /// through the view can fail later.
    pub fn parse(bytes: &'a [u8]) -> Result<Self> {
        if bytes.len() < LOG_BODY_HEADER_BYTES + LOG_TAIL_BYTES {
            return Err(Error::Malformed("log record too short".into()));
        }
        let (body, tail) = bytes.split_at(bytes.len() - LOG_TAIL_BYTES);
        let mut view = Self::parse_op(body)?;
        view.tail = decode_tail(tail)?;
        Ok(view)
    }

    /// A view of the op bytes alone ([`LogView::body`] of a record), as
    /// checked as by `parse`. They carry no tail: `tail` reads as height 0
    /// with no effect.
    pub fn parse_op(body: &'a [u8]) -> Result<Self> {
        if body.len() < LOG_BODY_HEADER_BYTES {
            return Err(Error::Malformed("log record too short".into()));
        }
        let item_count = be_u32(&body[16..20]);
        let items = &body[LOG_BODY_HEADER_BYTES..];
        let mut rest = items;
        for _ in 0..item_count {
            let (key, after_key) = take_field(rest)?;
            std::str::from_utf8(key)
                .map_err(|_| Error::Malformed("log record key is not UTF-8".into()))?;
            rest = take_field(after_key)?.1;
        }
        if !rest.is_empty() {
            return Err(Error::Malformed("log record op: trailing bytes".into()));
        }
        Ok(Self {
            parent: be_u64(&body[..8]),
            child: be_u64(&body[8..16]),
            tail: LogTail {
                height: 0,
                undo: Undo::NoEffect,
            },
            item_count,
            items,
            body,
        })
    }

    /// The op bytes (the record without its tail).
    pub fn body(&self) -> &'a [u8] {
        self.body
    }

    /// `(key, value)` pairs in order; keys are UTF-8 (checked by `parse`).
    pub fn items(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        let mut rest = self.items;
        (0..self.item_count).map(move |_| {
            let (key, after_key) = take_field(rest).expect("checked by parse");
            let (value, after_value) = take_field(after_key).expect("checked by parse");
            rest = after_value;
            (key, value)
        })
    }

    /// True when the items make a directory node (exactly `[FileName = x]`).
    pub fn is_internal(&self) -> bool {
        self.item_count == 1 && self.items().all(|(k, _)| k == ATTR_FILE_NAME.as_bytes())
    }

    /// The children-index name key of the items (see [`name_key`]).
    pub fn name_key_into(&self, out: &mut Vec<u8>) {
        let name = self.items().find(|(k, _)| *k == ATTR_FILE_NAME.as_bytes());
        name_key_into(name.map(|(_, v)| v), out);
    }

    /// True when the stored op is exactly `(parent, child, items)`.
    pub fn same_op(&self, parent: NodeId, child: NodeId, items: &[KeyValue]) -> bool {
        self.parent == parent
            && self.child == child
            && self.item_count == items.len()
            && self
                .items()
                .zip(items)
                .all(|((k, v), kv)| k == kv.key.as_bytes() && v == kv.value.as_slice())
    }

    pub fn to_record(&self) -> LogRecord {
        let items = self
            .items()
            .map(|(k, v)| KeyValue {
                key: String::from_utf8(k.to_vec()).expect("checked by parse"),
                value: v.to_vec(),
            })
            .collect();
        LogRecord {
            body: OpBody {
                parent: self.parent,
                child: self.child,
                items,
            },
            tail: self.tail,
        }
    }
}

/// Splits `length (4) ++ bytes` off the front.
fn take_field(bytes: &[u8]) -> Result<(&[u8], &[u8])> {
    if bytes.len() < 4 {
        return Err(Error::Malformed("log record item cut short".into()));
    }
    let (len, rest) = (be_u32(&bytes[..4]), &bytes[4..]);
    if rest.len() < len {
        return Err(Error::Malformed("log record item cut short".into()));
    }
    Ok(rest.split_at(len))
}

pub fn decode_log(bytes: &[u8]) -> Result<LogRecord> {
    Ok(LogView::parse(bytes)?.to_record())
}

/// Length of the op part of an encoded log record.
pub fn log_body_len(bytes: &[u8]) -> Result<usize> {
    Ok(LogView::parse(bytes)?.body.len())
}

/// Replaces the tail of an encoded log record, keeping its op bytes.
pub fn replace_log_tail(bytes: &[u8], tail: LogTail) -> Result<Vec<u8>> {
    let mut out = bytes[..log_body_len(bytes)?].to_vec();
    out.extend_from_slice(&encode_tail(tail));
    Ok(out)
}

/// Rewrites in place the tail of a record that `LogView::parse` accepted.
pub fn set_log_tail(bytes: &mut [u8], tail: LogTail) {
    let at = bytes.len() - LOG_TAIL_BYTES;
    bytes[at..].copy_from_slice(&encode_tail(tail));
}

/// The children-index name of a meta: `[0]` without `FileName`, else
/// `[1] ++ value` (so an empty name differs from no name).
pub fn name_key(items: &[KeyValue]) -> Vec<u8> {
    let mut key = Vec::new();
    name_key_from_items(items, &mut key);
    key
}

/// [`name_key`] into a buffer the caller reuses.
pub fn name_key_from_items(items: &[KeyValue], out: &mut Vec<u8>) {
    let name = items.iter().find(|kv| kv.key == ATTR_FILE_NAME);
    name_key_into(name.map(|kv| kv.value.as_slice()), out);
}

fn name_key_into(file_name: Option<&[u8]>, out: &mut Vec<u8>) {
    out.clear();
    match file_name {
        None => out.push(0),
        Some(value) => {
            out.push(1);
            out.extend_from_slice(value);
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

/// The hash of a name key in children-index keys: 64-bit FNV-1a, spelled out
/// here because it is part of the stored format and must never change
/// with a library version. Collisions cost a longer range scan, never a
/// wrong answer (the value holds the full name).
pub fn name_hash(name_key: &[u8]) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    name_key.iter().fold(OFFSET_BASIS, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
    })
}

/// The value of a children-index row ([`RowKind::Child`]), borrowed from the stored bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChildEntry<'a> {
    /// Meta time of the child (see [`NodeRecord::time`]).
    pub time: Timestamp,
    pub internal: bool,
    pub name_key: &'a [u8],
}

const CHILD_HEADER_BYTES: usize = 9;

/// `time (8, BE) ++ internal (1) ++ name key` into a reused buffer.
pub fn encode_child_into(out: &mut Vec<u8>, entry: ChildEntry<'_>) {
    out.clear();
    out.extend_from_slice(&entry.time.to_be_bytes());
    out.push(u8::from(entry.internal));
    out.extend_from_slice(entry.name_key);
}

pub fn decode_child(bytes: &[u8]) -> Result<ChildEntry<'_>> {
    if bytes.len() < CHILD_HEADER_BYTES + 1 {
        return Err(Error::Malformed("children row too short".into()));
    }
    let internal = match bytes[8] {
        0 => false,
        1 => true,
        other => return Err(Error::Malformed(format!("children row flag {other}"))),
    };
    Ok(ChildEntry {
        time: be_u64(&bytes[..8]),
        internal,
        name_key: &bytes[CHILD_HEADER_BYTES..],
    })
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
    let mut out = Vec::new();
    encode_node_into(
        &mut out,
        record.parent,
        record.time,
        record.internal,
        &record.name_key,
    );
    out
}

/// [`encode_node`] from parts, into a buffer the caller reuses.
pub fn encode_node_into(
    out: &mut Vec<u8>,
    parent: NodeId,
    time: Timestamp,
    internal: bool,
    name_key: &[u8],
) {
    out.clear();
    out.reserve(NODE_HEADER_BYTES + name_key.len());
    out.extend_from_slice(&parent.to_be_bytes());
    out.extend_from_slice(&time.to_be_bytes());
    out.push(u8::from(internal));
    out.extend_from_slice(name_key);
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
        // Children: one parent's rows form one range, names grouped,
        // children of one name in id order; TRASH's too.
        for parent in [ROOT, 42, TRASH] {
            let all = children_range(t, parent);
            let named = children_hash_range(t, parent, 77);
            assert!(all.contains(named.start()) && all.contains(named.end()));
            assert!(child_key(t, parent, 77, 1) < child_key(t, parent, 77, 2));
            assert!(all.contains(&child_key(t, parent, 0, 0)));
            assert!(!all.contains(&child_key(t, parent.wrapping_add(1), 0, 0)));
        }
        // Every kind of tree t is in its range, nothing of its neighbours.
        let rows = tree_rows(t);
        for key in [
            node_key(t, 0),
            log_key(t, u64::MAX),
            state_key(t),
            height_key(t, 0),
            child_key(t, TRASH, u64::MAX, u64::MAX),
        ] {
            assert!(rows.contains(&key), "{key:?}");
        }
        assert!(!rows.contains(&child_key(t - 1, TRASH, 0, 0)));
        assert!(!rows.contains(&node_key(t + 1, 0)));
        let last = tree_rows(TREE_NUMBER_MAX);
        assert!(last.contains(&child_key(TREE_NUMBER_MAX, TRASH, 1, 1)));
    }

    #[test]
    fn key_kinds_round_trip_and_unknown_ones_are_named() {
        assert_eq!(key_kind(node_key(3, 8)), Some(RowKind::Node));
        assert_eq!(key_kind(log_key(3, 8)), Some(RowKind::Log));
        assert_eq!(key_kind(state_key(3)), Some(RowKind::State));
        assert_eq!(key_kind(height_key(3, 8)), Some(RowKind::Height));
        assert_eq!(key_kind(child_key(3, 1, 2, 8)), Some(RowKind::Child));
        let (prefix, id, _, _) = node_key(3, 8);
        assert_eq!(key_kind((prefix, id, 2, 0)), None);
    }
}
