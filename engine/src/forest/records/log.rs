//! The op log's records: how an op and its undo information are encoded,
//! and the borrowed view the write path reads them through.

use super::node::name_key_into;
use super::{be_u32, be_u64};
use crate::error::{Error, Result};
use crate::types::*;
use serde::{Deserialize, Serialize};

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
///
/// The log row of the op that set a stored node's current meta leaves the
/// items out: its item count is [`ITEMS_AT_NODE`] and no items follow,
/// because the node's children row holds them (docs/design.md §5). When
/// another op replaces that meta (or an undo takes the op back), the items
/// return to the row. The op's bytes, as [`encode_op_body`] writes them,
/// are the same either way once the items are put back.
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

/// The digest of an op: 64-bit XXH3 of its encoded body (parent, child,
/// items; the timestamp is the key it is compared under). Two replicas
/// encode one op to the same bytes, so equal ops have equal digests and a
/// difference under one timestamp shows in the digests that sync compares
/// (docs/design.md §9). Part of the format: stored in the height runs.
pub fn op_digest(body: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(body)
}

/// [`op_digest`] of an op as it would be stored.
pub fn move_digest(op: &Move) -> u64 {
    op_digest(&encode_op_body(op.parent, op.child, &op.meta.items))
}

/// The body of an encoded log record (the op without its tail).
pub fn log_body(record: &[u8]) -> Result<&[u8]> {
    if record.len() < LOG_BODY_HEADER_BYTES + LOG_TAIL_BYTES {
        return Err(Error::Malformed("log record too short".into()));
    }
    Ok(&record[..record.len() - LOG_TAIL_BYTES])
}

/// Size of the fixed tail of an encoded log record.
pub const LOG_TAIL_BYTES: usize = 25;

/// The item count of a log record whose items its child's children row
/// holds (see [`LogRecord`]).
pub const ITEMS_AT_NODE: u32 = u32::MAX;

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

/// A log record whose items its child's children row holds.
pub fn encode_log_at_node_into(out: &mut Vec<u8>, parent: NodeId, child: NodeId, tail: LogTail) {
    out.clear();
    out.reserve(LOG_BODY_HEADER_BYTES + LOG_TAIL_BYTES);
    out.extend_from_slice(&parent.to_be_bytes());
    out.extend_from_slice(&child.to_be_bytes());
    out.extend_from_slice(&ITEMS_AT_NODE.to_be_bytes());
    out.extend_from_slice(&encode_tail(tail));
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
    /// The items are the child's children row's ([`ITEMS_AT_NODE`]).
    at_node: bool,
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
        let items = &body[LOG_BODY_HEADER_BYTES..];
        let at_node = be_u32(&body[16..20]) == ITEMS_AT_NODE as usize;
        if at_node && !items.is_empty() {
            return Err(Error::Malformed(
                "log record: items after the mark that its node holds them".into(),
            ));
        }
        let item_count = if at_node { 0 } else { be_u32(&body[16..20]) };
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
            at_node,
        })
    }

    /// True when the op's items are its child's children row's: the op
    /// set the child's current meta ([`ITEMS_AT_NODE`]). Then the items
    /// are not in the record, and the methods that read them must not be
    /// called.
    pub fn at_node(&self) -> bool {
        self.at_node
    }

    /// The op bytes (the record without its tail).
    pub fn body(&self) -> &'a [u8] {
        self.body
    }

    /// `(key, value)` pairs in order; keys are UTF-8 (checked by `parse`).
    /// Not for a record whose node holds its items ([`LogView::at_node`]).
    pub fn items(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        assert!(
            !self.at_node,
            "op of node {} read for items its node holds",
            self.child
        );
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

/// A whole log record; `Malformed` for one whose items its node holds
/// (read those through the node, `read::log_op`).
pub fn decode_log(bytes: &[u8]) -> Result<LogRecord> {
    let view = LogView::parse(bytes)?;
    if view.at_node() {
        return Err(Error::Malformed(
            "log record: its items are its node's".into(),
        ));
    }
    Ok(view.to_record())
}

/// The record `bytes` (either form) with its items left to its node.
pub fn log_items_to_node(bytes: &[u8]) -> Result<Vec<u8>> {
    let view = LogView::parse(bytes)?;
    let mut out = Vec::new();
    encode_log_at_node_into(&mut out, view.parent, view.child, view.tail);
    Ok(out)
}

/// The record `bytes` (either form) holding `items` again.
pub fn log_items_back(bytes: &[u8], items: &[KeyValue]) -> Result<Vec<u8>> {
    let view = LogView::parse(bytes)?;
    Ok(encode_log(view.parent, view.child, items, view.tail))
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
