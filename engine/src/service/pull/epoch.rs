//! Who a peer is and which log its heights count: the check each sync
//! round starts with (docs/design.md §6 and §9), and the cursor resets a
//! rebuilt log calls for.

use super::*;

impl Puller {
    /// Asks every peer this round may call who it is: a peer that answers
    /// as another replica (a misconfigured `node.replica_id`, two nodes
    /// with one id) would hand out ops stamped in another replica's name,
    /// so it is not pulled from this round (docs/design.md §9). The answer
    /// also names the peer's log epoch, which the pull cursors of that
    /// peer must count heights in (§6): a peer that does not answer is not
    /// pulled from this round either.
    pub(super) async fn verify_peers(&self, failed_peers: &mut BTreeSet<ReplicaId>) {
        let peers: BTreeSet<ReplicaId> = self.core.membership.all_peers().collect();
        let timeout = self.core.config.tree.replication_timeout;
        // All at once: a peer that is down costs one timeout, not one each.
        let calls = peers.iter().map(|&peer| async move {
            let answer = self
                .core
                .transport
                .call(peer, Request::Healthcheck, timeout);
            (peer, answer.await)
        });
        for (peer, answer) in futures::future::join_all(calls).await {
            let error = match answer {
                Ok(Response::Health {
                    replica_id,
                    log_epoch,
                }) if replica_id == peer => match self.follow_epoch(peer, log_epoch).await {
                    Ok(()) => continue,
                    Err(error) => error,
                },
                Ok(Response::Health { log_epoch, .. })
                    if canary::active(Canary::PeerIdentityUnchecked) =>
                {
                    match self.follow_epoch(peer, log_epoch).await {
                        Ok(()) => continue,
                        Err(error) => error,
                    }
                }
                Ok(Response::Health { replica_id, .. }) => Error::WrongPeer {
                    expected: peer,
                    answered: replica_id,
                },
                Ok(other) => page::unexpected_answer(peer, "Healthcheck", &other),
                Err(error) => error,
            };
            if let Error::WrongPeer { .. } = error {
                tracing::error!(%error, "peer not pulled from: it answers as another replica");
                self.core.trust.note(&error);
            } else {
                // Its log epoch is unknown (or could not be followed here),
                // so a cursor may count heights of a log it no longer has.
                tracing::debug!(%error, peer, "peer's log epoch unknown this round");
                self.core.note_error(&error);
            }
            self.counters
                .sync_peer_errors
                .fetch_add(1, Ordering::Relaxed);
            failed_peers.insert(peer);
        }
    }

    /// `peer` serves a log of epoch `epoch`. When the pull cursors of
    /// `peer` count another epoch's heights (its disk was replaced and the
    /// log rebuilt, which soon grows past them) or none was recorded, every
    /// one of them starts over from 0 before any pass, and the epoch is
    /// recorded (docs/design.md §6).
    async fn follow_epoch(&self, peer: ReplicaId, epoch: u64) -> Result<()> {
        if self.log_epochs.lock().expect("log epochs").get(&peer) == Some(&epoch) {
            return Ok(());
        }
        let forest = self.core.forest.clone();
        let runtime = &*self.core.env.runtime;
        let known = blocking(runtime, move || forest.peer_log_epoch(peer)).await?;
        if known == Some(epoch) {
            self.log_epochs
                .lock()
                .expect("log epochs")
                .insert(peer, epoch);
            return Ok(());
        }
        let trees = self.core.storage(|forest| forest.all_trees()).await?;
        for tree in &trees {
            self.forget_cursor(tree, peer).await?;
        }
        let forest = self.core.forest.clone();
        blocking(runtime, move || forest.peer_log_epoch_set(peer, epoch)).await?;
        self.log_epochs
            .lock()
            .expect("log epochs")
            .insert(peer, epoch);
        if known.is_some() {
            tracing::info!(
                peer,
                epoch,
                "peer's log epoch changed: its pull cursors start over"
            );
            self.counters.logs_rebuilt.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Deletes the pull cursor of `(tree, peer)`, in memory and durably,
    /// under the tree's pull lock: a pass of an overlapping round either
    /// ended before (its cursor is deleted) or starts after (from 0).
    async fn forget_cursor(&self, tree: &TreeKey, peer: ReplicaId) -> Result<()> {
        let _pulling = self.core.locks.pull(tree).await;
        self.cursors
            .lock()
            .expect("pull cursors")
            .remove(&(tree.clone(), peer));
        let forest = self.core.forest.clone();
        let key = tree.clone();
        blocking(&*self.core.env.runtime, move || {
            forest.reset_cursor(&key, CursorKind::Pull, peer)
        })
        .await
    }
}
