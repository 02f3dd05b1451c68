//! Node state and the children index: the records that say where a node
//! hangs now, and the name keys path lookups find them by.

use crate::error::{Error, Result};
use crate::types::*;

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

pub(super) fn name_key_into(file_name: Option<&[u8]>, out: &mut Vec<u8>) {
    out.clear();
    match file_name {
        None => out.push(0),
        Some(value) => {
            out.push(1);
            out.extend_from_slice(value);
        }
    }
}

/// Whether `key` is a name key: `[0]`, or `[1] ++ name`. Asserted before a
/// node or children row is written, checked after one is read.
pub fn name_key_valid(key: &[u8]) -> bool {
    match key.first() {
        Some(0) => key.len() == 1,
        Some(1) => true,
        _ => false,
    }
}

/// The name key of a path component.
pub fn component_key(component: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + component.len());
    key.push(1);
    key.extend_from_slice(component.as_bytes());
    key
}

/// A 64-bit FNV-1a hash of a name key, for in-memory lookups keyed by
/// name (the directory cache).
pub fn name_hash(name_key: &[u8]) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    name_key.iter().fold(OFFSET_BASIS, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
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
    assert!(name_key_valid(name_key), "writing a broken name key");
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
    if !name_key_valid(&name_key) {
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
