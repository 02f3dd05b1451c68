//! Trust: the intruder (`scenario::workload::intruder`) and the caller at
//! a replica's address (`scenario::workload::rogue`) got nothing their
//! rights do not allow and left nothing of it, they were refused nothing
//! those allow, every call was answered as the input rules predict
//! (`check::outcome`), and no two replicas hold different ops under one
//! timestamp.
//! Every call its roles do not allow was refused or went unanswered; no replica's log
//! holds an op it forged or wrote (each carries `INTRUDER_TAG_KEY`); a
//! Drop it sent would show as lost acknowledged writes
//! (`durability::AckedWrites`). A stamp conflict, or a peer answering as
//! another replica in a run without a misconfiguration window, counted by
//! any replica, fails the run (docs/design.md §9).

use super::{Checker, Checkpoint};
use crate::failure::{Failure, FailureKind};
use crate::scenario::workload::intruder::INTRUDER_TAG_KEY;
use arbor::forest::records::LogView;
use arbor::runtime::BoxFuture;

type Result<T = ()> = std::result::Result<T, Failure>;

/// See the module documentation.
pub struct IntruderLeftNoTrace;

impl Checker for IntruderLeftNoTrace {
    fn check<'a>(&'a self, at: &'a Checkpoint<'a>) -> BoxFuture<'a, Result> {
        Box::pin(async move {
            nothing_served(at)?;
            nothing_wrongly_refused(at)?;
            outcomes_as_modelled(at)?;
            no_forged_op(at)?;
            no_stamp_conflict(at)
        })
    }
}

fn nothing_served(at: &Checkpoint) -> Result {
    let record = &at.ledger.intruder;
    match record.served.first() {
        None => Ok(()),
        Some(first) => Err(Failure::new(
            FailureKind::Intrusion,
            format!(
                "{} of the intruder's {} calls were served, first: {first}",
                record.served.len(),
                record.sent
            ),
        )),
    }
}

/// Every call the intruder's role allowed got past the rights check.
fn nothing_wrongly_refused(at: &Checkpoint) -> Result {
    let record = &at.ledger.intruder;
    match record.wrongly_refused.first() {
        None => Ok(()),
        Some(first) => Err(Failure::new(
            FailureKind::WrongRefusal,
            format!(
                "{} of the {} calls the intruder's roles allow were refused, first: {first}",
                record.wrongly_refused.len(),
                record.allowed
            ),
        )),
    }
}

/// Every answer the input rules predict (`check::outcome`) was that
/// answer.
fn outcomes_as_modelled(at: &Checkpoint) -> Result {
    let record = &at.ledger.intruder;
    match record.wrong_outcomes.first() {
        None => Ok(()),
        Some(first) => Err(Failure::new(
            FailureKind::WrongOutcome,
            format!(
                "{} calls were not answered as the input rules predict, first: {first}",
                record.wrong_outcomes.len()
            ),
        )),
    }
}

fn no_forged_op(at: &Checkpoint) -> Result {
    no_op_tagged(
        at,
        INTRUDER_TAG_KEY,
        FailureKind::Intrusion,
        "the intruder's",
    )
}

/// Fails with `kind` when any replica holds an op with a meta item keyed
/// `tag` (`whose` names its writer in the failure).
pub fn no_op_tagged(at: &Checkpoint, tag: &str, kind: FailureKind, whose: &str) -> Result {
    for (replica, trees) in &at.contents {
        for (tree, content) in trees {
            for (ts, op) in content.ops() {
                let op = LogView::parse_op(op).map_err(|e| {
                    let what = format!("{:?}/{}: op {ts}: {e}", tree.cid, tree.tree);
                    Failure::new(FailureKind::TreeInvariant, what)
                })?;
                if op.items().any(|(key, _)| key == tag.as_bytes()) {
                    return Err(Failure::new(
                        kind,
                        format!(
                            "replica-{replica} holds {whose} op {ts} in {:?}/{} {}",
                            tree.cid, tree.tree, at.when
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A peer answering as another replica is what a misconfiguration window
/// (`scenario::nemesis::misconfig`) is expected to make replicas count; outside
/// such a run it fails the run, as a stamp conflict always does.
fn no_stamp_conflict(at: &Checkpoint) -> Result {
    let windows = at.ledger.misconfig.windows;
    for replica in at.world.replica_ids() {
        let Some(service) = at.world.node(replica).service() else {
            continue;
        };
        let stats = service.stats();
        let mismatches = stats.peer_identity_mismatches + stats.peers_refused;
        if stats.stamp_conflicts > 0 || (windows == 0 && mismatches > 0) {
            return Err(Failure::new(
                FailureKind::StampConflict,
                format!(
                    "replica-{replica} counted {} stamp conflicts and {mismatches} peers answering as another replica {}",
                    stats.stamp_conflicts, at.when
                ),
            ));
        }
    }
    Ok(())
}
