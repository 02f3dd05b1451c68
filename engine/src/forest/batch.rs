//! Group commits: one batch of writes in one write transaction, and the
//! summary of what it changed (docs/design.md §5).

use super::records::{META, WAL_POSITION};
use super::{
    closed_database, dir_cache, write, Forest, WriteOp, WriteOutcome, WriteRequest, WriteTxn,
};
use crate::canary::{self, Canary};
use crate::error::{Error, Result};
use crate::types::*;
use crate::validate;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

/// An invariant check that `write_batch_checked` runs on one tree inside
/// the batch's write transaction, after the batch and before its commit:
/// the same checks as `check_invariants_touched` and `check_invariants`
/// on the state the commit would store, without a read transaction of
/// their own (for checkers that test every batch, the fuzz targets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InvariantCheck {
    /// `check_invariants_touched` at these nodes.
    Touched(Vec<NodeId>),
    /// `check_invariants`: the whole tree.
    Whole,
}

/// What `write_batch_checked` returns when the transaction worked.
#[derive(Debug)]
pub struct CheckedBatch {
    /// One result per request, as `write_batch` gives them.
    pub results: Vec<Result<WriteOutcome>>,
    /// What the commit changed (nothing when `verdict` is an error).
    pub summary: CommitSummary,
    /// The first broken invariant; then nothing of the batch is stored.
    pub verdict: Result<(), String>,
}

/// What `write_batch` returns when the transaction worked.
#[derive(Debug)]
pub struct Committed {
    /// One result per request, in request order.
    pub results: Vec<Result<WriteOutcome>>,
    pub summary: CommitSummary,
}

/// What one batch's transaction changed, for whoever replicates it: the one
/// place that says which trees a commit stored ops in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommitSummary {
    /// Trees with at least one successful local write, ascending.
    pub local_trees: Vec<TreeKey>,
    /// Trees with at least one replicated op that was new here, ascending.
    pub applied_trees: Vec<TreeKey>,
    /// The error of a transaction that failed; then the lists above are
    /// empty and `unsure_trees` holds every tree of the batch.
    pub failure: Option<Error>,
    /// Trees of a failed transaction, ascending: whether it stored ops in
    /// them is unknown until the database is reopened.
    pub unsure_trees: Vec<TreeKey>,
}

impl CommitSummary {
    /// The summary of a transaction that committed with `results`.
    pub fn of(requests: &[WriteRequest], results: &[Result<WriteOutcome>]) -> Self {
        assert_eq!(requests.len(), results.len(), "one result per request");
        let mut local = std::collections::BTreeSet::new();
        let mut applied = std::collections::BTreeSet::new();
        for (request, result) in requests.iter().zip(results) {
            match (&request.op, result) {
                (WriteOp::Apply { .. } | WriteOp::Pulled { .. }, outcome) => {
                    if matches!(outcome, Ok(WriteOutcome::Applied { fresh: true })) {
                        applied.insert(&request.tree);
                    }
                }
                (_, Err(_)) => {}
                (_, Ok(_)) => {
                    local.insert(&request.tree);
                }
            }
        }
        Self {
            local_trees: local.into_iter().cloned().collect(),
            applied_trees: applied.into_iter().cloned().collect(),
            failure: None,
            unsure_trees: Vec::new(),
        }
    }

    /// The summary of a transaction that failed with `error`.
    pub fn failed(requests: &[WriteRequest], error: Error) -> Self {
        let trees: std::collections::BTreeSet<&TreeKey> =
            requests.iter().map(|r| &r.tree).collect();
        Self {
            failure: Some(error),
            unsure_trees: trees.into_iter().cloned().collect(),
            ..Self::default()
        }
    }

    /// Every tree the commit stored ops in, or may have.
    pub fn trees_written(&self) -> impl Iterator<Item = &TreeKey> {
        self.local_trees
            .iter()
            .chain(&self.applied_trees)
            .chain(&self.unsure_trees)
    }
}

impl Forest {
    /// Applies a batch in one write transaction. The outer error means the
    /// transaction failed and nothing of the batch is stored; otherwise each
    /// request has its own result, in request order.
    ///
    /// Replicated ops are applied first, per tree, merged in timestamp order
    /// with one undo back to the oldest new op; local ops follow in request
    /// order, each newer than everything before it.
    pub fn write_batch(&self, requests: &[WriteRequest]) -> Result<Committed> {
        let batch = self.write_batch_checked(requests, |_| Vec::new())?;
        assert!(batch.verdict.is_ok(), "no check was asked for");
        Ok(Committed {
            results: batch.results,
            summary: batch.summary,
        })
    }

    /// `write_batch`, plus the invariant checks `checks` asks for given
    /// the batch's results, run inside the batch's transaction before it
    /// commits. A broken invariant aborts the transaction (nothing of the
    /// batch is stored) and is reported in `verdict`.
    pub fn write_batch_checked(
        &self,
        requests: &[WriteRequest],
        checks: impl FnOnce(&[Result<WriteOutcome>]) -> Vec<(TreeKey, InvariantCheck)>,
    ) -> Result<CheckedBatch> {
        let mut dirs = self.lock_dir_cache();
        dirs.align_with_canary();
        let outcome = self.write_batch_with(requests, &mut dirs, checks);
        if !matches!(
            outcome,
            Ok(CheckedBatch {
                verdict: Ok(()),
                ..
            })
        ) {
            // Lookups made inside the failed transaction describe rows that
            // were never committed.
            dirs.clear();
        }
        outcome
    }

    fn write_batch_with(
        &self,
        requests: &[WriteRequest],
        dirs: &mut dir_cache::DirCache,
        checks: impl FnOnce(&[Result<WriteOutcome>]) -> Vec<(TreeKey, InvariantCheck)>,
    ) -> Result<CheckedBatch> {
        let refused: Vec<Option<Result<WriteOutcome>>> = requests
            .iter()
            .map(|r| {
                validate::write(&r.tree, &r.op, self.options.input_limits())
                    .err()
                    .map(Err)
            })
            .collect();
        let txn = self.begin_batch_write()?;
        let logged = self.wal_opener.is_some() && !txn.durable;
        let (changed, results, verdict, journal) = {
            let mut writer =
                write::Writer::open(&txn, &self.options, dirs, &self.tree_numbers, logged)?;
            let results = apply_requests(&mut writer, requests, refused)?;
            let changed = writer.flush()?;
            let mut verdict = Ok(());
            for (tree, check) in checks(&results) {
                verdict = writer.check(&tree, &check)?;
                if verdict.is_err() {
                    break;
                }
            }
            let journal = writer.take_journal();
            (changed && verdict.is_ok(), results, verdict, journal)
        };
        assert_eq!(results.len(), requests.len(), "one result per request");
        match (changed, journal) {
            (false, _) => txn.abort()?,
            (true, None) => txn.commit()?,
            (true, Some(journal)) => self.commit_logged(txn, &journal)?,
        }
        let summary = match verdict {
            Ok(()) => CommitSummary::of(requests, &results),
            Err(_) => CommitSummary::default(),
        };
        Ok(CheckedBatch {
            results,
            summary,
            verdict,
        })
    }
}

impl Forest {
    /// Commits a batch of a forest with a log: its record is appended and
    /// synced first, then the transaction commits without durability, so
    /// nothing of the batch is visible before its record is durable. Every
    /// `checkpoint_bytes` of log, or when asked (`request_checkpoint`), the
    /// batch commits durably instead, as a checkpoint, and writes no
    /// record, unless checkpoints are made between batches
    /// (`checkpoint_between_batches`). An error aborts the transaction;
    /// the log then refuses appends until the forest is reopened.
    fn commit_logged(
        &self,
        mut txn: WriteTxn<'_>,
        journal: &write::journal::Journal,
    ) -> Result<()> {
        let mut slot = self.lock_wal();
        let wal = slot.as_mut().ok_or_else(closed_database)?;
        let in_batch = !self.checkpoints_between.load(Ordering::SeqCst);
        if in_batch
            && (wal.checkpoint_due() || self.checkpoint_requested.swap(false, Ordering::SeqCst))
        {
            txn.set_durable(true)?;
            return super::checkpoint_commit(txn.txn, wal);
        }
        let seq = wal.last_seq() + 1;
        if !canary::active(Canary::CheckpointWithoutPosition) {
            txn.open_table(META)?.insert(WAL_POSITION, seq)?;
        }
        let appended = wal.append(&journal.encode())?;
        assert_eq!(appended, seq, "the record took the next sequence number");
        let committed = txn.txn.commit();
        if committed.is_err() {
            // The record is durable but the database does not hold it:
            // only a reopen (which replays it) makes the two agree.
            wal.fail();
        }
        Ok(committed?)
    }
}

/// Runs every request not `refused` yet through `writer`: replicated ops
/// first, per tree, then local ones in request order. The outer error
/// fails the batch.
fn apply_requests(
    writer: &mut write::Writer<'_, '_>,
    requests: &[WriteRequest],
    mut results: Vec<Option<Result<WriteOutcome>>>,
) -> Result<Vec<Result<WriteOutcome>>> {
    let mut applies: BTreeMap<&TreeKey, Vec<write::Incoming<'_>>> = BTreeMap::new();
    for (index, request) in requests.iter().enumerate() {
        if let (None, Some(op)) = (&results[index], request.op.replicated()) {
            let bounded = matches!(request.op, WriteOp::Apply { .. });
            let incoming = write::Incoming { index, op, bounded };
            applies.entry(&request.tree).or_default().push(incoming);
        }
    }
    for (tree, ops) in &applies {
        writer.apply_remote(tree, ops, &mut results)?;
    }
    for (index, request) in requests.iter().enumerate() {
        let local = request.op.replicated().is_none();
        if local && results[index].is_none() {
            results[index] = Some(writer.apply_local(&request.tree, &request.op)?);
        }
    }
    Ok(results
        .into_iter()
        .map(|r| r.expect("every request has a result"))
        .collect())
}
