//! What a batch stored, as the write-ahead log keeps it: per tree, in the
//! order the batch first touched the trees, the tree's number, whether the
//! batch created it, and every op it appended, in height order, as its log
//! row (body and tail). Replaying a record through [`Writer::replay_tree`]
//! on the state the batch started from stores the same rows: the same
//! tree numbers, counters and heights (docs/design.md §5).
//!
//! Payload: `tree count (4)`, then per tree `key length (4) ++ key ++
//! number (8) ++ created (1) ++ op count (4)` and per op `timestamp (8) ++
//! row length (4) ++ row`; integers little-endian.

use super::super::records::*;
use super::{Incoming, Writer};
use crate::error::{Error, Result};
use crate::forest::WriteOutcome;
use crate::types::*;
use redb::ReadableTable;

/// The trees of one batch as the log will keep them.
#[derive(Default)]
pub(crate) struct Journal {
    trees: Vec<JournalTree>,
}

struct JournalTree {
    key: TreeKey,
    number: u64,
    created: bool,
    ops: u32,
    /// The encoded ops.
    bytes: Vec<u8>,
}

/// One tree of a decoded record.
pub(crate) struct ReplayTree {
    pub key: TreeKey,
    pub number: u64,
    pub created: bool,
    /// Timestamp and log row of each op, in height order.
    pub ops: Vec<(Timestamp, Vec<u8>)>,
}

impl Journal {
    /// The batch loaded a tree (created by it when `created`).
    pub fn touch(&mut self, key: &TreeKey, number: u64, created: bool) {
        if self.trees.iter().any(|t| t.number == number) {
            return;
        }
        self.trees.push(JournalTree {
            key: key.clone(),
            number,
            created,
            ops: 0,
            bytes: Vec::new(),
        });
    }

    /// The batch appended the op `ts` to tree `number` as `row`.
    pub fn op(&mut self, number: u64, ts: Timestamp, row: &[u8]) {
        // Most batches touch one tree or few; the last one is the likeliest.
        let tree = self
            .trees
            .iter_mut()
            .rev()
            .find(|t| t.number == number)
            .expect("an op of a tree the batch loaded");
        tree.ops += 1;
        tree.bytes.extend_from_slice(&ts.to_le_bytes());
        tree.bytes
            .extend_from_slice(&(row.len() as u32).to_le_bytes());
        tree.bytes.extend_from_slice(row);
    }

    /// The record's payload; trees the batch did not change are left out.
    pub fn encode(&self) -> Vec<u8> {
        let kept: Vec<&JournalTree> = self
            .trees
            .iter()
            .filter(|t| t.created || t.ops > 0)
            .collect();
        let size = 4 + kept
            .iter()
            .map(|t| 17 + 32 + t.key.tree.len() + t.bytes.len())
            .sum::<usize>();
        let mut out = Vec::with_capacity(size);
        out.extend_from_slice(&(kept.len() as u32).to_le_bytes());
        for tree in kept {
            let key = tree_key_bytes(&tree.key);
            out.extend_from_slice(&(key.len() as u32).to_le_bytes());
            out.extend_from_slice(&key);
            out.extend_from_slice(&tree.number.to_le_bytes());
            out.push(u8::from(tree.created));
            out.extend_from_slice(&tree.ops.to_le_bytes());
            out.extend_from_slice(&tree.bytes);
        }
        out
    }
}

/// Reads a payload front to back; every short read is `Malformed`.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.bytes.len() < n {
            return Err(Error::Malformed("write-ahead log record cut short".into()));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
}

/// Decodes a record's payload.
pub(crate) fn decode(payload: &[u8]) -> Result<Vec<ReplayTree>> {
    let mut r = Reader { bytes: payload };
    let count = r.u32()?;
    let mut trees = Vec::new();
    for _ in 0..count {
        let key_len = r.u32()? as usize;
        let key = decode_tree_key(r.take(key_len)?)?;
        let number = r.u64()?;
        let created = match r.take(1)?[0] {
            0 => false,
            1 => true,
            other => return Err(Error::Malformed(format!("journal: created flag {other}"))),
        };
        let op_count = r.u32()?;
        let mut ops = Vec::new();
        for _ in 0..op_count {
            let ts = r.u64()?;
            let len = r.u32()? as usize;
            ops.push((ts, r.take(len)?.to_vec()));
        }
        trees.push(ReplayTree {
            key,
            number,
            created,
            ops,
        });
    }
    if !r.bytes.is_empty() {
        return Err(Error::Malformed(
            "journal: bytes after the last tree".into(),
        ));
    }
    Ok(trees)
}

fn diverged(what: String) -> Error {
    Error::Malformed(format!("write-ahead log replay: {what}"))
}

impl Writer<'_, '_> {
    /// Stores one tree of a replayed record: creates it when the batch
    /// did (it must get the same number), then applies its ops as
    /// replicated ones, which puts them at the heights the batch gave
    /// them; checks that it did.
    pub fn replay_tree(&mut self, tree: &ReplayTree) -> Result<()> {
        let existed = self.load_tree(&tree.key, false)?.is_some();
        if existed == tree.created {
            return Err(diverged(format!(
                "tree {:?} exists: {existed}, created by the batch: {}",
                tree.key, tree.created
            )));
        }
        let rec = self.load_tree(&tree.key, true)?.expect("created on demand");
        if rec.number != tree.number {
            return Err(diverged(format!(
                "tree {:?} numbered {}, the batch gave it {}",
                tree.key, rec.number, tree.number
            )));
        }
        let mut moves = Vec::with_capacity(tree.ops.len());
        let mut heights = Vec::with_capacity(tree.ops.len());
        for (ts, row) in &tree.ops {
            let record = decode_log(row)?;
            heights.push(record.tail.height);
            moves.push(record.into_move(*ts));
        }
        let incoming: Vec<Incoming<'_>> = moves
            .iter()
            .enumerate()
            // The batch held them to the limits already.
            .map(|(index, op)| Incoming {
                index,
                op,
                bounded: false,
            })
            .collect();
        let mut results = vec![None; moves.len()];
        self.apply_remote(&tree.key, &incoming, &mut results)?;
        for (result, op) in results.iter().zip(&moves) {
            if !matches!(result, Some(Ok(WriteOutcome::Applied { fresh: true }))) {
                return Err(diverged(format!(
                    "op {} of tree {:?}: {result:?}",
                    op.ts(),
                    tree.key
                )));
            }
        }
        for (op, height) in moves.iter().zip(heights) {
            let stored = self
                .rows(rec.number)
                .get(log_key(op.ts()))?
                .map(|g| LogView::parse(g.value()).map(|v| v.tail.height))
                .transpose()?;
            if stored != Some(height) {
                return Err(diverged(format!(
                    "op {} of tree {:?} at height {stored:?}, the batch gave it {height}",
                    op.ts(),
                    tree.key
                )));
            }
        }
        Ok(())
    }
}
