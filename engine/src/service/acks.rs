//! Writes answered only once `tree.ack_replicas` replicas hold them
//! (docs/design.md §6): this node's commit plus peers whose push of the
//! write's tree was acknowledged past the write's height. A peer answers
//! a push once its batch committed the ops, so its acknowledgement is a
//! copy on its disk.
//!
//! A waiting write watches its tree *before* it is submitted: every push
//! acknowledgement of the tree from then on is noted, so one that arrives
//! between the commit and the moment the write learns its height is not
//! missed (no acknowledgement before the watch can cover an op that did
//! not exist yet). At most `limits.max_pending_writes` writes wait at
//! once; beyond it a write is refused with `Overloaded` before it is
//! queued.

use super::Core;
use crate::error::{Error, Result};
use crate::probe::{self, Probe};
use crate::runtime::blocking;
use crate::types::{ReplicaId, Timestamp, TreeKey};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;

/// The push acknowledgements of the trees that writes wait on.
pub(super) struct ReplicaAcks {
    inner: Mutex<Watches>,
    waiters_max: usize,
}

#[derive(Default)]
struct Watches {
    trees: BTreeMap<TreeKey, Watched>,
    waiters: usize,
}

struct Watched {
    waiters: usize,
    /// Per peer, the largest acknowledged push cursor noted since the
    /// tree's first waiter came: the peer holds every own op below it.
    acked_below: BTreeMap<ReplicaId, u64>,
    changed: Arc<Notify>,
}

impl ReplicaAcks {
    pub fn new(waiters_max: usize) -> Self {
        assert!(waiters_max > 0, "no room for a waiting write");
        Self {
            inner: Mutex::new(Watches::default()),
            waiters_max,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Watches> {
        self.inner.lock().expect("acks lock poisoned")
    }

    /// Starts noting the push acknowledgements of `tree` for one write;
    /// `Overloaded` when `waiters_max` writes wait already.
    pub fn watch(&self, tree: &TreeKey) -> Result<AckWatch<'_>> {
        let mut watches = self.lock();
        if watches.waiters >= self.waiters_max {
            probe::hit(Probe::AwaitingReplicasFull);
            return Err(Error::Overloaded(format!(
                "{} writes wait for replicas",
                watches.waiters
            )));
        }
        watches.waiters += 1;
        let watched = watches
            .trees
            .entry(tree.clone())
            .or_insert_with(|| Watched {
                waiters: 0,
                acked_below: BTreeMap::new(),
                changed: Arc::new(Notify::new()),
            });
        watched.waiters += 1;
        let changed = watched.changed.clone();
        Ok(AckWatch {
            acks: self,
            tree: tree.clone(),
            changed,
        })
    }

    /// `peer` acknowledged every own op of `tree` below `next`.
    pub fn note(&self, tree: &TreeKey, peer: ReplicaId, next: u64) {
        let mut watches = self.lock();
        let Some(watched) = watches.trees.get_mut(tree) else {
            return;
        };
        let below = watched.acked_below.entry(peer).or_insert(0);
        if next > *below {
            *below = next;
            watched.changed.notify_waiters();
        }
    }

    /// Writes waiting now.
    pub fn waiting(&self) -> usize {
        self.lock().waiters
    }
}

/// One write's watch of its tree; dropping it ends the watch.
pub(super) struct AckWatch<'a> {
    acks: &'a ReplicaAcks,
    tree: TreeKey,
    changed: Arc<Notify>,
}

impl AckWatch<'_> {
    /// How many of `peers` acknowledged the op at `height`.
    pub fn peers_holding(&self, peers: &[ReplicaId], height: u64) -> usize {
        let watches = self.acks.lock();
        let watched = watches.trees.get(&self.tree).expect("a watched tree");
        let holds = |peer: &&ReplicaId| watched.acked_below.get(peer).is_some_and(|&b| b > height);
        peers.iter().filter(holds).count()
    }

    /// Woken by every new acknowledgement of the tree.
    pub fn changed(&self) -> &Notify {
        &self.changed
    }
}

impl Drop for AckWatch<'_> {
    fn drop(&mut self) {
        let mut watches = self.acks.lock();
        assert!(watches.waiters > 0, "a watch ended twice");
        watches.waiters -= 1;
        let watched = watches.trees.get_mut(&self.tree).expect("a watched tree");
        watched.waiters -= 1;
        if watched.waiters == 0 {
            watches.trees.remove(&self.tree);
        }
    }
}

impl Core {
    /// Waits until `tree.ack_replicas` replicas hold the local op stored
    /// under `ts` in `tree`, at most `tree.replication_timeout`;
    /// `NotReplicated` after that, or when the op is gone (a drop ran
    /// meanwhile).
    pub(super) async fn await_replicas(
        &self,
        watch: &AckWatch<'_>,
        tree: &TreeKey,
        ts: Timestamp,
    ) -> Result<()> {
        let needed = self.config.tree.ack_replicas;
        let deadline = self.env.clock.now() + self.config.tree.replication_timeout;
        let not_replicated = |held: usize| Error::NotReplicated {
            held: u32::try_from(held).unwrap_or(u32::MAX),
            needed: u32::try_from(needed).unwrap_or(u32::MAX),
        };
        let (forest, key) = (self.forest.clone(), tree.clone());
        let height = blocking(&*self.env.runtime, move || forest.op_height(&key, ts)).await?;
        let Some(height) = height else {
            return Err(not_replicated(0));
        };
        let peers = self.membership.peers_of(&tree.cid);
        let mut shutdown = self.shutdown.subscribe();
        loop {
            // Enabled before the count, so no acknowledgement in between
            // goes unheard.
            let changed = watch.changed().notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let held = 1 + watch.peers_holding(peers, height);
            if held >= needed {
                return Ok(());
            }
            let now = self.env.clock.now();
            if now >= deadline {
                return Err(not_replicated(held));
            }
            let sleep = self.env.clock.sleep(deadline - now);
            tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop) => return Err(Error::ShuttingDown),
                () = changed => {}
                () = sleep => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ContainerId;

    fn tree(name: &str) -> TreeKey {
        TreeKey::new(ContainerId([1; 32]), name)
    }

    /// Only acknowledgements past a height count, only those of the
    /// watched tree are kept, a cursor never counts backwards, and the
    /// watch of a tree ends with its last waiter.
    #[test]
    fn acknowledgements_past_the_height_count_per_peer() {
        let acks = ReplicaAcks::new(2);
        acks.note(&tree("t"), 2, 9); // before any watch: not kept
        let first = acks.watch(&tree("t")).unwrap();
        let second = acks.watch(&tree("t")).unwrap();
        assert!(matches!(acks.watch(&tree("u")), Err(Error::Overloaded(_))));
        acks.note(&tree("u"), 2, 9);
        assert_eq!(first.peers_holding(&[2, 3], 4), 0);
        acks.note(&tree("t"), 2, 5);
        acks.note(&tree("t"), 3, 4);
        assert_eq!(first.peers_holding(&[2, 3], 4), 1);
        acks.note(&tree("t"), 2, 3);
        assert_eq!(second.peers_holding(&[2, 3], 4), 1);
        assert_eq!(second.peers_holding(&[3], 3), 1);
        drop(first);
        assert_eq!(second.peers_holding(&[2], 4), 1);
        drop(second);
        assert_eq!(acks.waiting(), 0);
        let again = acks.watch(&tree("t")).unwrap();
        assert_eq!(again.peers_holding(&[2, 3], 0), 0);
    }
}
