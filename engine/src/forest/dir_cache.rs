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
#[cfg(feature = "canary")]
use crate::canary::{self, Canary};
#[cfg(feature = "probes")]
use crate::probe::{self, Probe};
use crate::types::NodeId;
use std::collections::BTreeMap;

/// Bounds on remembered lookups and on the names they hold (a name can be
/// as long as a meta); beyond either the cache starts over, which costs a
/// few range scans and nothing else.
pub const DIR_CACHE_ENTRIES_MAX: usize = 65_536;
pub const DIR_CACHE_NAME_BYTES_MAX: usize = 8 << 20;

/// `(tree, parent, name hash)`.
type Slot = (u64, NodeId, u64);

#[derive(Debug, Default)]
pub(super) struct DirCache {
    /// `(tree, parent, name hash)` -> `(name key, directory)`. Two names
    /// with one hash share a slot; the stored name tells them apart.
    entries: BTreeMap<Slot, (Box<[u8]>, Option<NodeId>)>,
    /// Total length of the names in `entries` (an upper bound: entries
    /// dropped one by one are not subtracted).
    name_bytes: usize,
    /// Whether the planted path-resolution bug was on when the entries
    /// were computed (it changes which directory a lookup picks).
    #[cfg(feature = "canary")]
    canary_path: bool,
    /// Trees in which an undo/redo pass ran since the cache was emptied
    /// (`Probe::DirCacheHitAfterUndo`); at most `DIR_CACHE_UNDONE_TREES_MAX`.
    #[cfg(feature = "probes")]
    undone: std::collections::BTreeSet<u64>,
}

/// Trees `DirCache::undone` remembers before it starts over.
#[cfg(feature = "probes")]
const DIR_CACHE_UNDONE_TREES_MAX: usize = 1024;

impl DirCache {
    /// Empties the cache if the path-resolution canary was switched since
    /// the entries were computed.
    pub fn align_with_canary(&mut self) {
        #[cfg(feature = "canary")]
        {
            let on = canary::active(Canary::PathByArrivalOrder);
            if on != self.canary_path {
                self.clear();
                self.canary_path = on;
            }
        }
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.name_bytes = 0;
        #[cfg(feature = "probes")]
        self.undone.clear();
    }

    /// An undo/redo pass ran in `tree`: later hits there count for
    /// `Probe::DirCacheHitAfterUndo`.
    pub fn note_undo(&mut self, _tree: u64) {
        #[cfg(feature = "probes")]
        {
            if self.undone.len() >= DIR_CACHE_UNDONE_TREES_MAX {
                self.undone.clear();
            }
            self.undone.insert(_tree);
        }
    }

    /// `Some(found)` when the lookup is remembered.
    pub fn get(&self, tree: u64, parent: NodeId, name_key: &[u8]) -> Option<Option<NodeId>> {
        let (name, found) = self.entries.get(&(tree, parent, name_hash(name_key)))?;
        let hit = **name == *name_key;
        #[cfg(feature = "probes")]
        if hit && self.undone.contains(&tree) {
            probe::hit(Probe::DirCacheHitAfterUndo);
        }
        hit.then_some(*found)
    }

    pub fn put(&mut self, tree: u64, parent: NodeId, name_key: &[u8], found: Option<NodeId>) {
        let full = self.entries.len() >= DIR_CACHE_ENTRIES_MAX
            || self.name_bytes + name_key.len() > DIR_CACHE_NAME_BYTES_MAX;
        if full {
            self.clear();
        }
        self.name_bytes += name_key.len();
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
        // Long names: bounded by bytes, not only by entries.
        let long = vec![1u8; 1 << 20];
        for parent in 0..20 {
            cache.put(1, parent, &long, Some(parent));
            assert!(cache.name_bytes <= DIR_CACHE_NAME_BYTES_MAX);
            assert!(cache.entries.len() <= DIR_CACHE_NAME_BYTES_MAX >> 20);
        }
        assert_eq!(cache.get(1, 19, &long), Some(Some(19)));
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
