//! Per-tree exclusion between Drop and the replication passes, in a fixed
//! number of stripes so that it costs the same memory for ten trees or ten
//! million (a gateway makes a tree per multipart upload).
//!
//! A push or pull pass holds its tree's stripe shared and Drop holds it
//! exclusively, so a cursor of a dropped tree is never written back (it
//! would name heights of a tree created again under the same name); a sync
//! of one tree also holds the stripe's pull lock, so syncs of a tree run
//! one at a time. Trees that share a stripe only wait for each other's
//! Drop and sync.

use crate::types::TreeKey;
use std::collections::BTreeSet;
use tokio::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Stripes of tree locks.
const TREE_LOCK_STRIPES: usize = 256;

#[derive(Default)]
struct Stripe {
    drop_guard: RwLock<()>,
    pull: Mutex<()>,
}

pub(super) struct TreeLocks {
    stripes: Vec<Stripe>,
}

/// A pull pass's hold on its tree: one sync at a time, no Drop.
pub(super) struct PullGuard<'a> {
    _one_sync: MutexGuard<'a, ()>,
    _no_drop: RwLockReadGuard<'a, ()>,
}

impl TreeLocks {
    pub fn new() -> Self {
        Self {
            stripes: (0..TREE_LOCK_STRIPES).map(|_| Stripe::default()).collect(),
        }
    }

    /// The stripe of a tree: FNV-1a over its key, the same on every run
    /// (the simulator replays by seed).
    fn stripe_of(tree: &TreeKey) -> usize {
        let bytes = tree.cid.0.iter().chain(tree.tree.as_bytes());
        let hash = bytes.fold(0xcbf2_9ce4_8422_2325u64, |hash, &byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        (hash % TREE_LOCK_STRIPES as u64) as usize
    }

    /// Held by a push pass: the tree is not dropped meanwhile.
    pub async fn no_drop(&self, tree: &TreeKey) -> RwLockReadGuard<'_, ()> {
        self.stripes[Self::stripe_of(tree)].drop_guard.read().await
    }

    /// Held by a pull pass.
    pub async fn pull(&self, tree: &TreeKey) -> PullGuard<'_> {
        let stripe = &self.stripes[Self::stripe_of(tree)];
        let one_sync = stripe.pull.lock().await;
        let no_drop = stripe.drop_guard.read().await;
        PullGuard {
            _one_sync: one_sync,
            _no_drop: no_drop,
        }
    }

    /// Held by Drop: no pass runs on any of `trees`. Stripes are taken in
    /// ascending order, so two Drops never wait for each other in a cycle.
    pub async fn drop_all(&self, trees: &[TreeKey]) -> Vec<RwLockWriteGuard<'_, ()>> {
        let stripes: BTreeSet<usize> = trees.iter().map(Self::stripe_of).collect();
        self.drop_stripes(stripes).await
    }

    /// Held by the Drop of a whole container: no pass runs on any tree,
    /// so none can create a tree of the container between the listing of
    /// its trees and their drop (a pull pass creates a tree it applies
    /// ops to, and its cursor would outlive the tree the drop took).
    pub async fn drop_every_tree(&self) -> Vec<RwLockWriteGuard<'_, ()>> {
        self.drop_stripes((0..TREE_LOCK_STRIPES).collect()).await
    }

    async fn drop_stripes(&self, stripes: BTreeSet<usize>) -> Vec<RwLockWriteGuard<'_, ()>> {
        let mut guards = Vec::with_capacity(stripes.len());
        for stripe in stripes {
            guards.push(self.stripes[stripe].drop_guard.write().await);
        }
        guards
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ContainerId;

    #[test]
    fn stripes_are_fixed_by_the_key() {
        let key = |name: &str| TreeKey::new(ContainerId([5; 32]), name);
        assert_eq!(
            TreeLocks::stripe_of(&key("a")),
            TreeLocks::stripe_of(&key("a"))
        );
        let used: BTreeSet<usize> = (0..1000)
            .map(|i| TreeLocks::stripe_of(&key(&i.to_string())))
            .collect();
        assert!(
            used.len() > TREE_LOCK_STRIPES / 2,
            "trees spread over the stripes"
        );
    }
}
