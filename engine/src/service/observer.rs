//! What the service does after every commit (the batcher's one observer).

use super::push::book::PushBook;
use super::push::window::PushWindows;
use crate::batcher::CommitObserver;
#[cfg(feature = "canary")]
use crate::canary::{self, Canary};
use crate::error::Error;
use crate::forest::CommitSummary;
#[cfg(feature = "canary")]
use crate::forest::Forest;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::Notify;

/// The push windows learn which trees may hold new ops, the push book
/// counts the change and queues the pushers of trees with new local ops,
/// and a storage error wakes the recovery. It holds nothing that owns the
/// batcher, which owns it.
pub(super) struct CommitWatch {
    pub book: Arc<PushBook>,
    pub windows: Arc<PushWindows>,
    pub storage_failed: Arc<Notify>,
    /// Read by the planted bug `ReplicationDropsOnFullQueue` only.
    #[cfg(feature = "canary")]
    pub forest: Arc<Forest>,
}

impl CommitObserver for CommitWatch {
    fn committed(&self, summary: &CommitSummary) {
        if let Some(Error::Storage(_)) = &summary.failure {
            self.storage_failed.notify_one();
        }
        self.windows.note_stored(summary.trees_written());
        // Replicated ops count as changes too: a sync may bring back ops of
        // our own origin (a replica restored from nothing), which need
        // pushing.
        let dropped = self
            .book
            .note_commit(summary.trees_written(), &summary.local_trees);
        let counters = &self.book.counters;
        counters
            .hints_dropped
            .fetch_add(dropped.len() as u64, Ordering::Relaxed);
        #[cfg(feature = "canary")]
        if canary::active(Canary::ReplicationDropsOnFullQueue) {
            // Planted bug: treat the ops behind a dropped hint as sent.
            for tree in &dropped {
                if let Ok(height) = self.forest.next_height(tree) {
                    self.book.set_skip(tree, height);
                }
            }
        }
        if !summary.local_trees.is_empty() {
            self.book.wake.notify_one();
        }
    }
}
