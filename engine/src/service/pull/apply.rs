//! The apply side of a pull: the ops of a stamp page that the local log
//! lacks are fetched in runs, checked and submitted to the batcher, which
//! stores them like pushed ops.

use super::*;
use crate::batcher::NotTaken;

impl Puller {
    /// Fetches and applies the ops of a page of `peer`'s stamps, which
    /// starts at `from`, that the local log lacks, in height order. Held
    /// ops are neither fetched nor submitted: pushes deliver nearly all of
    /// a peer's log before a round.
    pub(super) async fn pull_missing(
        &self,
        tree: &TreeKey,
        peer: ReplicaId,
        from: u64,
        stamps: &[LogStamp],
    ) -> Result<Pulled> {
        assert_eq!(stamps[0].height, from, "a stamp page starts at its cursor");
        let timestamps: Vec<Timestamp> = stamps.iter().map(|s| s.ts).collect();
        let key = tree.clone();
        let held = (self.core)
            .storage(move |forest| forest.held_digests(&key, &timestamps))
            .await
            .inspect_err(|error| self.core.note_error(error))?;
        assert_eq!(held.len(), stamps.len(), "one answer per stamp");
        let mut missing = Vec::new();
        for (stamp, held) in stamps.iter().zip(held) {
            match held {
                None => missing.push(stamp.height),
                Some(digest) if digest == stamp.digest => {}
                Some(_) => self.stamp_conflict(tree, peer, stamp),
            }
        }
        let mut pulled = Pulled {
            applied_to: from,
            fresh: 0,
            stop: None,
            complete: true,
        };
        let runs = missing_runs(&missing, PULL_GAP_HEIGHTS_MAX);
        if runs.len() > 1 {
            probe::hit(Probe::PullSeveralRuns);
        }
        for (first, last) in runs {
            // Everything below `first` in this page is held or applied.
            pulled.reach(first);
            self.pull_run(tree, peer, first, last, &mut pulled).await?;
            if pulled.stop.is_some() || !pulled.complete {
                return Ok(pulled);
            }
        }
        pulled.reach(stamps.last().expect("a page is not empty").height + 1);
        Ok(pulled)
    }

    /// A timestamp held here with another op than `peer` holds under it:
    /// neither replica can repair that, so it is counted and reported, and
    /// the pull passes over it (docs/design.md §9).
    fn stamp_conflict(&self, tree: &TreeKey, peer: ReplicaId, stamp: &LogStamp) {
        let error = Error::StampConflict(stamp.ts);
        self.core.trust.note(&error);
        tracing::error!(
            peer,
            ts = stamp.ts,
            height = stamp.height,
            ?tree,
            "a peer holds another op under a timestamp held here"
        );
    }

    /// Fetches and applies heights `first..=last` of `peer`'s log, moving
    /// `pulled.applied_to` over what was applied. While a page applies,
    /// the one after it is fetched: a joiner's pull waits for the slower
    /// of the two, not for their sum. A page fetched ahead is used only
    /// once the page before it applied whole; an error fetching it counts
    /// only then, as it would have without the overlap.
    async fn pull_run(
        &self,
        tree: &TreeKey,
        peer: ReplicaId,
        first: u64,
        last: u64,
        pulled: &mut Pulled,
    ) -> Result<()> {
        assert!(
            first <= last && pulled.applied_to == first,
            "a run starts where the pull is"
        );
        let mut from = first;
        let mut ahead = None;
        while from <= last {
            if from > first {
                probe::hit(Probe::PullOpPageNext);
            }
            let fetched = match ahead.take() {
                Some(fetched) => fetched,
                None => self.fetch_page(tree, peer, from, last - from + 1).await,
            };
            let mut entries: Vec<LogEntry> = match fetched {
                Ok(fetched) => fetched.unwrap_or_default(),
                // What applied before stays applied, counted and passed.
                Err(error) => {
                    pulled.stop = Some(error);
                    return Ok(());
                }
            };
            entries.retain(|e| e.height <= last);
            let Some(end) = entries.last().map(|e| e.height + 1) else {
                // The peer dropped the tree since it listed the stamps:
                // end the pass, the cursor stays before what is unapplied.
                pulled.complete = false;
                return Ok(());
            };
            let apply = self.apply_page(tree, from, entries);
            let applied = if end <= last {
                let next = self.fetch_page(tree, peer, end, last - end + 1);
                let (applied, next) = futures::join!(apply, next);
                ahead = Some(next);
                applied
            } else {
                apply.await
            };
            let (applied_to, fresh, stop) = applied?;
            self.counters
                .sync_pages_pulled
                .fetch_add(1, Ordering::Relaxed);
            pulled.fresh += fresh;
            pulled.reach(applied_to);
            if stop.is_some() {
                pulled.stop = stop;
                return Ok(());
            }
            assert_eq!(
                applied_to, end,
                "a whole page applied moves the pull past it"
            );
            from = applied_to;
        }
        Ok(())
    }

    /// Applies a pulled page, which starts at `from`; returns the height
    /// the cursor may move to, how many ops were new, and the error that
    /// stopped it early, if any. Ops that can never apply (invalid) are
    /// passed over with a warning; ops the log already holds are passed
    /// over without a write transaction.
    async fn apply_page(
        &self,
        tree: &TreeKey,
        from: u64,
        entries: Vec<LogEntry>,
    ) -> Result<(u64, u64, Option<Error>)> {
        let heights: Vec<u64> = entries.iter().map(|e| e.height).collect();
        // Checked on arrival (`check_page`): a page applies from its first
        // height, one height after another.
        assert_eq!(heights[0], from, "a page applies from its first height");
        assert!(
            heights.windows(2).all(|w| w[1] == w[0] + 1),
            "a page has no gaps"
        );
        let (entries, submit) = self.ops_to_submit(tree, entries).await?;
        let requests: Vec<WriteRequest> = entries
            .into_iter()
            .zip(&submit)
            .filter(|(_, submit)| **submit)
            .map(|(entry, _)| WriteRequest {
                tree: tree.clone(),
                op: WriteOp::Pulled { op: entry.op },
            })
            .collect();
        let mut results = self.submit_pulled(requests).await?.into_iter();
        let mut applied_to = from;
        let mut fresh = 0;
        for (height, submitted) in heights.into_iter().zip(submit) {
            if submitted {
                match results.next().expect("one result per request") {
                    Ok(WriteOutcome::Applied { fresh: true }) => fresh += 1,
                    Ok(_) => {}
                    Err(error) if error.is_transient() => {
                        self.core.trust.note(&error);
                        return Ok((applied_to, fresh, Some(error)));
                    }
                    Err(error) => {
                        self.core.trust.note(&error);
                        tracing::warn!(%error, height, ?tree, "peer op refused")
                    }
                }
            }
            applied_to = height + 1;
        }
        assert!(results.next().is_none(), "one result per request");
        Ok((applied_to, fresh, None))
    }

    /// Hands a pulled page to the batcher. A full batcher is this node's
    /// own load (client writes, pushes, a second round), not the peer's
    /// failure: the page waits for room, by the retry schedule of pushes,
    /// for at most `tree.replication_timeout` in all, and only then stops
    /// the pass (which skips the peer for the rest of the round).
    async fn submit_pulled(
        &self,
        mut requests: Vec<WriteRequest>,
    ) -> Result<Vec<Result<WriteOutcome>>> {
        let cap = self.core.config.tree.replication_timeout;
        let mut waited = Duration::ZERO;
        let mut refusals = 0;
        loop {
            // A refused page comes back whole: it is offered again, not
            // copied for every offer.
            let error = match self.core.batcher.offer_all(requests).await {
                Ok(answer) => return answer,
                Err(NotTaken {
                    error: error @ Error::Overloaded(_),
                    requests: back,
                }) if waited < cap => {
                    requests = back;
                    error
                }
                Err(NotTaken { error, .. }) => return Err(error),
            };
            refusals += 1;
            let wait = backoff(refusals, cap).min(cap - waited);
            tracing::debug!(%error, ?wait, "pulled page waits for room in the batcher");
            if self.core.sleep_or_stop(wait).await {
                return Err(Error::ShuttingDown);
            }
            waited += wait;
        }
    }

    /// A pulled op must be stamped by a replica of its container, present
    /// or retired: a peer holds and hands out others' ops, but only ever
    /// those of the container's replicas (docs/design.md §6, §9).
    fn check_origin(&self, tree: &TreeKey, op: &Move) -> Result<()> {
        let origin = timestamp_replica(op.ts());
        if self.core.membership.may_stamp(&tree.cid, origin) {
            return Ok(());
        }
        self.core
            .trust
            .ops_refused_foreign
            .fetch_add(1, Ordering::Relaxed);
        Err(Error::InvalidOp(format!(
            "op {} stamped by replica {origin}, which does not hold the container",
            op.ts()
        )))
    }

    /// Which entries of a pulled page go to the batcher: the valid ones the
    /// local log does not hold yet. Most of a peer's log came here by push
    /// already; submitting it again would cost a lookup and a write
    /// transaction per page for nothing. Gives the entries back.
    async fn ops_to_submit(
        &self,
        tree: &TreeKey,
        entries: Vec<LogEntry>,
    ) -> Result<(Vec<LogEntry>, Vec<bool>)> {
        let limits = self.core.config.limits.input();
        let mut submit = Vec::with_capacity(entries.len());
        for entry in &entries {
            let valid =
                validate::replicated(&entry.op, limits).and(self.check_origin(tree, &entry.op));
            if let Err(error) = &valid {
                tracing::warn!(%error, height = entry.height, ?tree, "skipping invalid op from peer");
            }
            submit.push(valid.is_ok());
        }
        let key = tree.clone();
        let (entries, stored) = (self.core)
            .storage(move |forest| {
                let ops: Vec<&Move> = entries.iter().map(|e| &e.op).collect();
                let stored = forest.stored_ops(&key, &ops);
                (entries, stored)
            })
            .await;
        let stored = stored.inspect_err(|error| self.core.note_error(error))?;
        assert_eq!(stored.len(), entries.len(), "one answer per op");
        for (submit, stored) in submit.iter_mut().zip(stored) {
            *submit = *submit && !stored;
        }
        Ok((entries, submit))
    }
}
