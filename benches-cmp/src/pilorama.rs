//! The key layout frostfs-node's pilorama keeps in bbolt, re-created on
//! redb so that only the layout differs from Arbor's side (same storage
//! engine, same durability, same batches). Written from what pilorama
//! stores per tree, not from its code:
//!
//! - log: timestamp (8 bytes, big-endian) -> child, parent (8 bytes each,
//!   little-endian) and the encoded meta;
//! - data: `'s'` + node -> parent, timestamp of first appearance, meta;
//!   `'o'` + timestamp -> the node's state before that op (deleted for a
//!   node that was not in the tree); `'c'` + parent + child -> 1; and for
//!   the path attribute, `'i'` + attribute + value + parent + node -> 1
//!   for a directory made by AddByPath (its only field), 0 otherwise.
//!
//! AddByPath walks the path through the `'i'` keys, takes the last log
//! timestamp, picks a random unused node id per new node and applies one
//! move per created directory plus one for the leaf, checking on each
//! that the child is not an ancestor of the new parent.

use crate::measure::{counting_file, timed, Row};
use crate::workload::{Object, FILE_NAME};
use redb::{Database, Durability, ReadableTable, Table, TableDefinition};
use std::sync::atomic::Ordering;

const DATA: TableDefinition<&[u8], &[u8]> = TableDefinition::new("bench/data");
const LOG: TableDefinition<&[u8], &[u8]> = TableDefinition::new("bench/log");

/// One of the two tables, open in a write transaction.
type Rows<'txn> = Table<'txn, &'static [u8], &'static [u8]>;

type Node = u64;
const ROOT: Node = 0;

struct Move<'a> {
    time: u64,
    parent: Node,
    child: Node,
    items: &'a [(String, String)],
}

/// Unsigned LEB128, as neo-go's var-uint is for the values used here.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Time, item count, then each key and value with its length.
fn encode_meta(time: u64, items: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        16 + items
            .iter()
            .map(|(k, v)| k.len() + v.len() + 2)
            .sum::<usize>(),
    );
    put_varint(&mut out, time);
    put_varint(&mut out, items.len() as u64);
    for (k, v) in items {
        put_varint(&mut out, k.len() as u64);
        out.extend_from_slice(k.as_bytes());
        put_varint(&mut out, v.len() as u64);
        out.extend_from_slice(v.as_bytes());
    }
    out
}

fn state_key(node: Node) -> [u8; 9] {
    let mut key = [b's'; 9];
    key[1..].copy_from_slice(&node.to_le_bytes());
    key
}

fn old_key(time: u64) -> [u8; 9] {
    let mut key = [b'o'; 9];
    key[1..].copy_from_slice(&time.to_le_bytes());
    key
}

fn children_key(parent: Node, child: Node) -> [u8; 17] {
    let mut key = [b'c'; 17];
    key[1..9].copy_from_slice(&parent.to_le_bytes());
    key[9..].copy_from_slice(&child.to_le_bytes());
    key
}

/// `'i'` + attribute + value + parent, without the node (a scan prefix).
fn attr_prefix(attr: &str, value: &str, parent: Node) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + 4 + attr.len() + value.len() + 16);
    key.push(b'i');
    key.extend_from_slice(&(attr.len() as u16).to_le_bytes());
    key.extend_from_slice(attr.as_bytes());
    key.extend_from_slice(&(value.len() as u16).to_le_bytes());
    key.extend_from_slice(value.as_bytes());
    key.extend_from_slice(&parent.to_le_bytes());
    key
}

fn parent_of(data: &Rows<'_>, node: Node) -> Option<Node> {
    let state = data.get(state_key(node).as_slice()).expect("read state")?;
    let bytes: [u8; 8] = state.value()[..8].try_into().expect("state holds a parent");
    Some(Node::from_le_bytes(bytes))
}

/// Whether `ancestor` is on the path from `node` up to the root.
fn is_ancestor(data: &Rows<'_>, ancestor: Node, mut node: Node) -> bool {
    while node != ancestor {
        match parent_of(data, node) {
            Some(parent) => node = parent,
            None => return false,
        }
    }
    true
}

/// The deepest existing directory along `dirs`: how many names matched
/// and the node reached.
fn path_prefix(data: &Rows<'_>, dirs: &[String]) -> (usize, Node) {
    let mut node = ROOT;
    'names: for (i, name) in dirs.iter().enumerate() {
        let prefix = attr_prefix(FILE_NAME, name, node);
        for row in data.range(prefix.as_slice()..).expect("scan attributes") {
            let (key, value) = row.expect("read attribute");
            let key = key.value();
            if !key.starts_with(&prefix) || key.len() != prefix.len() + 8 {
                break;
            }
            if value.value() == [1] {
                let bytes: [u8; 8] = key[prefix.len()..].try_into().expect("node id");
                node = Node::from_le_bytes(bytes);
                continue 'names;
            }
        }
        return (i, node);
    }
    (dirs.len(), node)
}

fn latest_time(log: &Rows<'_>) -> u64 {
    match log.last().expect("read log") {
        Some((key, _)) => u64::from_be_bytes(key.value().try_into().expect("8-byte log key")),
        None => 0,
    }
}

/// Stores the op in the log and applies it to the tree (a fresh node:
/// nothing to undo).
fn apply(data: &mut Rows<'_>, log: &mut Rows<'_>, op: &Move) {
    let meta = encode_meta(op.time, op.items);
    let mut record = Vec::with_capacity(16 + meta.len());
    record.extend_from_slice(&op.child.to_le_bytes());
    record.extend_from_slice(&op.parent.to_le_bytes());
    record.extend_from_slice(&meta);
    log.insert(op.time.to_be_bytes().as_slice(), record.as_slice())
        .expect("log insert");
    assert!(parent_of(data, op.child).is_none(), "spare ids are unused");
    data.remove(old_key(op.time).as_slice())
        .expect("old state delete");
    if op.child == op.parent || is_ancestor(data, op.child, op.parent) {
        return;
    }
    let mut state = Vec::with_capacity(16 + meta.len());
    state.extend_from_slice(&op.parent.to_le_bytes());
    state.extend_from_slice(&op.time.to_le_bytes());
    state.extend_from_slice(&meta);
    data.insert(state_key(op.child).as_slice(), state.as_slice())
        .expect("state insert");
    data.insert(
        children_key(op.parent, op.child).as_slice(),
        [1u8].as_slice(),
    )
    .expect("children insert");
    for (k, v) in op.items.iter().filter(|(k, _)| k == FILE_NAME) {
        let mut key = attr_prefix(k, v, op.parent);
        key.extend_from_slice(&op.child.to_le_bytes());
        let flag = u8::from(op.items.len() == 1);
        data.insert(key.as_slice(), [flag].as_slice())
            .expect("attribute insert");
    }
}

/// xorshift64*: node ids drawn at random, as pilorama draws them.
struct Ids(u64);

impl Ids {
    fn spare(&mut self, data: &Rows<'_>) -> Node {
        loop {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            let id = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 1;
            if id != ROOT && parent_of(data, id).is_none() {
                return id;
            }
        }
    }
}

fn add_by_path(data: &mut Rows<'_>, log: &mut Rows<'_>, ids: &mut Ids, object: &Object) {
    let (found, mut node) = path_prefix(data, &object.dirs);
    let mut time = latest_time(log) + 1;
    let dir_items: Vec<[(String, String); 1]> = object.dirs[found..]
        .iter()
        .map(|name| [(FILE_NAME.to_string(), name.clone())])
        .collect();
    let levels = dir_items.iter().map(|d| d.as_slice());
    for items in levels.chain(std::iter::once(object.meta.as_slice())) {
        let child = ids.spare(data);
        apply(
            data,
            log,
            &Move {
                time,
                parent: node,
                child,
                items,
            },
        );
        time += 1;
        node = child;
    }
}

pub fn run(objects: &[Object], batch: usize) -> Row {
    let dir = tempfile::tempdir().expect("temp dir");
    let (backend, written) = counting_file(dir.path());
    let db = Database::builder()
        .create_with_backend(backend)
        .expect("redb opens");
    let mut ids = Ids(0x9e37_79b9_7f4a_7c15);
    written.store(0, Ordering::Relaxed);
    let mut commits = 0;
    let (elapsed, cpu) = timed(objects.len(), batch, |first, len| {
        let mut txn = db.begin_write().expect("write transaction");
        txn.set_durability(Durability::Immediate)
            .expect("durable commit");
        {
            let mut data = txn.open_table(DATA).expect("data table");
            let mut log = txn.open_table(LOG).expect("log table");
            for object in &objects[first..first + len] {
                add_by_path(&mut data, &mut log, &mut ids, object);
            }
        }
        txn.commit().expect("commit");
        commits += 1;
    });
    Row {
        name: format!("pilorama layout on redb, durable, batch {batch}"),
        ops: objects.len(),
        commits,
        elapsed,
        cpu,
        written_bytes: Some(written.load(Ordering::Relaxed)),
        syncs: None,
        checkpoints: None,
    }
}
