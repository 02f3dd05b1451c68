//! Tree numbers remembered across transactions.
//!
//! Every read of a tree and every batch used to open the trees table only to
//! turn the tree's key into its number; the pushers alone do that several
//! times per pass. A remembered number is only a hint: the caller looks up
//! the number's state row in its own snapshot, and falls back to the trees
//! table when the row is absent there (the tree was dropped, or is not
//! created yet in that snapshot).
//!
//! Within one epoch a number names at most one tree: numbers come from a
//! counter and are never given twice. Only two things restart the counter:
//! `Forest::clear`, and a `Forest::reopen` that lost non-durable commits.
//! Both hold the directory-cache lock, which every writer (and so every
//! creator of a tree) holds for its whole transaction, and call
//! [`TreeNumbers::new_epoch`] before letting go of it. A reader takes the
//! epoch before its snapshot and keeps a hint only if the epoch has not
//! moved after it; it learns a number only into the epoch it started in.

use crate::types::TreeKey;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// Bound on remembered trees; beyond it the map starts over, which costs
/// a trees-table lookup per tree and nothing else.
pub const TREE_NUMBERS_MAX: usize = 4096;

#[derive(Debug, Default)]
struct Inner {
    epoch: u64,
    numbers: BTreeMap<TreeKey, u64>,
}

#[derive(Debug, Default)]
pub(super) struct TreeNumbers {
    inner: Mutex<Inner>,
}

impl TreeNumbers {
    /// Only plain data is behind the lock: a panic elsewhere cannot leave
    /// it half-changed.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current epoch and the remembered number of `tree`.
    pub fn hint(&self, tree: &TreeKey) -> (u64, Option<u64>) {
        let inner = self.lock();
        (inner.epoch, inner.numbers.get(tree).copied())
    }

    pub fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    /// Remembers `number` for `tree`, read from a committed snapshot taken
    /// in `epoch`; ignored if the epoch has moved since.
    pub fn learn(&self, epoch: u64, tree: &TreeKey, number: u64) {
        let mut inner = self.lock();
        if inner.epoch != epoch {
            return;
        }
        if inner.numbers.len() >= TREE_NUMBERS_MAX && !inner.numbers.contains_key(tree) {
            inner.numbers.clear();
        }
        inner.numbers.insert(tree.clone(), number);
    }

    /// Forgets every number: the counter may give them again.
    pub fn new_epoch(&self) {
        let mut inner = self.lock();
        inner.epoch += 1;
        inner.numbers.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ContainerId;

    fn key(i: u32) -> TreeKey {
        TreeKey::new(ContainerId([1; 32]), i.to_string())
    }

    #[test]
    fn learns_within_an_epoch_only_and_stays_bounded() {
        let numbers = TreeNumbers::default();
        let (epoch, hint) = numbers.hint(&key(1));
        assert_eq!(hint, None);
        numbers.learn(epoch, &key(1), 7);
        assert_eq!(numbers.hint(&key(1)), (epoch, Some(7)));
        numbers.new_epoch();
        assert_eq!(numbers.hint(&key(1)), (epoch + 1, None));
        // A lookup that started before the new epoch is not kept.
        numbers.learn(epoch, &key(1), 7);
        assert_eq!(numbers.hint(&key(1)).1, None);
        for i in 0..TREE_NUMBERS_MAX as u32 + 10 {
            numbers.learn(epoch + 1, &key(i), u64::from(i));
            assert!(numbers.lock().numbers.len() <= TREE_NUMBERS_MAX);
        }
        let last = TREE_NUMBERS_MAX as u32 + 9;
        assert_eq!(numbers.hint(&key(last)).1, Some(u64::from(last)));
    }
}
