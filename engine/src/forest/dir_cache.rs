//! Directory lookups remembered across batches.
//!
//! AddByPath walks its directories on every call, and the directories of a
//! workload are few next to its leaves: resolving each component with a
//! children-index range scan per call was a third of the cost of an
//! AddByPath. The cache maps `(tree, parent, name)` to the directory path
//! resolution picks there (or to its absence).
//!
//! It stays exact because every writer holds it for the whole of its write
//! transaction, commit included (`Forest::write_batch` locks it before
//! `begin_write`), and the write path forgets an entry whenever an internal
//! row under its `(tree, parent, name)` is added or removed. A batch that
//! fails (or panics) may have filled it from an aborted transaction, so it
//! is then emptied.

use super::records::name_hash;
use crate::canary::{self, Canary};
use crate::types::NodeId;
use std::collections::BTreeMap;

/// Bound on remembered lookups; beyond it the cache starts over, which
/// costs a few range scans and nothing else.
pub const DIR_CACHE_ENTRIES_MAX: usize = 65_536;

/// `(tree, parent, name hash)`.
type Slot = (u64, NodeId, u64);

#[derive(Debug, Default)]
pub(super) struct DirCache {
    /// `(tree, parent, name hash)` -> `(name key, directory)`. Two names
    /// with one hash share a slot; the stored name tells them apart.
    entries: BTreeMap<Slot, (Box<[u8]>, Option<NodeId>)>,
    /// Whether the planted path-resolution bug was on when the entries
    /// were computed (it changes which directory a lookup picks).
    canary_path: bool,
}

impl DirCache {
    /// Empties the cache if the path-resolution canary was switched since
    /// the entries were computed.
    pub fn align_with_canary(&mut self) {
        let on = canary::active(Canary::PathByArrivalOrder);
        if on != self.canary_path {
            self.entries.clear();
            self.canary_path = on;
        }
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// `Some(found)` when the lookup is remembered.
    pub fn get(&self, tree: u64, parent: NodeId, name_key: &[u8]) -> Option<Option<NodeId>> {
        let (name, found) = self.entries.get(&(tree, parent, name_hash(name_key)))?;
        (**name == *name_key).then_some(*found)
    }

    pub fn put(&mut self, tree: u64, parent: NodeId, name_key: &[u8], found: Option<NodeId>) {
        if self.entries.len() >= DIR_CACHE_ENTRIES_MAX {
            self.entries.clear();
        }
        let slot = (tree, parent, name_hash(name_key));
        self.entries.insert(slot, (name_key.into(), found));
    }

    /// Drops the lookup that a changed internal row of `(tree, parent,
    /// name)` may invalidate.
    pub fn forget(&mut self, tree: u64, parent: NodeId, name_hash: u64) {
        if !self.entries.is_empty() {
            self.entries.remove(&(tree, parent, name_hash));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_forgets_and_stays_bounded() {
        let mut cache = DirCache::default();
        assert_eq!(cache.get(1, 0, b"\x01a"), None);
        cache.put(1, 0, b"\x01a", Some(7));
        cache.put(1, 0, b"\x01b", None);
        assert_eq!(cache.get(1, 0, b"\x01a"), Some(Some(7)));
        assert_eq!(cache.get(1, 0, b"\x01b"), Some(None));
        assert_eq!(cache.get(2, 0, b"\x01a"), None, "another tree");
        assert_eq!(cache.get(1, 5, b"\x01a"), None, "another parent");
        cache.forget(1, 0, name_hash(b"\x01a"));
        assert_eq!(cache.get(1, 0, b"\x01a"), None);
        assert_eq!(cache.get(1, 0, b"\x01b"), Some(None));
        for parent in 0..DIR_CACHE_ENTRIES_MAX as u64 + 10 {
            cache.put(1, parent, b"\x01x", Some(parent));
            assert!(cache.entries.len() <= DIR_CACHE_ENTRIES_MAX);
        }
        cache.clear();
        assert_eq!(cache.get(1, 3, b"\x01x"), None);
    }

    #[test]
    fn a_slot_answers_only_for_its_own_name() {
        // Two names sharing a hash share a slot: the stored name decides.
        let mut cache = DirCache::default();
        let slot = (1, 0, name_hash(b"\x01a"));
        cache
            .entries
            .insert(slot, (b"\x01other".to_vec().into(), Some(9)));
        assert_eq!(cache.get(1, 0, b"\x01a"), None);
    }
}
