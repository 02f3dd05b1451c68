//! Coverage: how often a run reached the situations its checkers exist
//! for. A sweep adds the counts of its runs and prints them; a test fails
//! when a standard sweep never reaches one, so the scenario cannot quietly
//! stop exercising something. A new situation is a new `Coverage` variant
//! (and its place in `ALL`). The vocabulary lives below the world, whose
//! hooks carry a run's `CoverageCounter` for everything that adds to it.

use arbor::probe::Probe;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// A situation worth reaching. Capsules name one by its variant name
/// (`"LeaveCalledOff"`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Coverage {
    /// An op arrived at a replica older than some op it held: undo/redo.
    UndoRedo,
    /// An undo/redo pass over at least `DEEP_UNDO_OPS` newer ops.
    UndoRedoDeep,
    /// An op arrived at a replica older than every op it held.
    OlderThanLog,
    /// A logged op left its node where it was: it would have made a cycle.
    CycleRefused,
    /// Two directories with one name under one parent.
    SameNameDirectories,
    /// Ops a replica got from a pull pass (not by push).
    DeliveredBySync,
    /// Pushes between two replicas dropped for a window (or the whole run).
    PushBlackout,
    /// A replica's disk failed writes, then the replica reopened it.
    DiskErrorReopen,
    /// A write torn at a power failure.
    TornWrite,
    /// A write whose call timed out, found applied at a checkpoint.
    TimeoutLaterApplied,
    /// A write refused with a definite error.
    DefiniteFailure,
    /// Answers checked against the reference model, per read RPC.
    GetNodeByPathLatest,
    GetNodeByPathAll,
    GetSubTree,
    GetMeta,
    TreeList,
    GetOpLog,
    GetOpLogStamps,
    /// Pages of a listing (`GetSubTreePage`, what a gRPC GetSubTree
    /// stream reads) held to the model: first pages, and pages that go on
    /// from a cursor.
    GetSubTreePage,
    SubTreePageContinued,
    /// gRPC reads whose answer, as the gateway got it, was held to the
    /// model (`check::oracle::end_to_end`).
    GrpcAnswer,
    /// Reads whose answer agreed with a state the tree passed through
    /// during the call, not with the tree at its end (commits landed
    /// meanwhile).
    ReadDuringCommits,
    /// Pull passes whose cursor was checked against the peer's log.
    PullPassChecked,
    /// Drops of one tree carried out, and of a whole container.
    DropTree,
    DropContainer,
    /// Drops whose call timed out (the drop may still run later), and
    /// drops answered with a storage error (its commit may have reached
    /// the disk): the caller does not know whether they took place.
    DropTimedOut,
    DropStorageError,
    /// Writes acknowledged on a tree created again after a drop of it.
    WriteAfterDrop,
    /// Acknowledged writes a drop erased (at each checkpoint).
    ErasedByDrop,
    /// Disks destroyed for good, their nodes replaced.
    DiskReplaced,
    /// Local writes a replaced node refused while rejoining.
    RejoinRefused,
    /// Acknowledged writes only a destroyed disk held when it died (at
    /// each checkpoint), and of them the ones missing: lost by design.
    WritesAtRisk,
    LostAtRisk,
    /// Windows in which a process claiming another replica's id ran on a
    /// replica's machine (`scenario::nemesis::misconfig`).
    MisconfigWindow,
    /// Such windows in which a correct replica refused to pull from it.
    MisconfigDetected,
    /// Writes that process acknowledged (to a misconfigured node).
    MisconfigAcked,
    /// Replicas that joined a container, and left one.
    MemberJoined,
    MemberLeft,
    /// Leaves called off: the leaver's ops did not reach the others in time.
    LeaveCalledOff,
    /// Joiners that held their members' ops with pushes into them dropped.
    JoinerSyncedAlone,
    /// `GetOpLog` pages such joiners had pulled by then.
    JoinerPages,
    /// Writes acknowledged once `tree.ack_replicas` >= 2 replicas held
    /// them.
    AckedByReplicas,
    /// Writes answered `NotReplicated`: stored, not yet on enough replicas.
    NotReplicated,
    /// GetNodeByPath answers (latest only) checked where the model held
    /// several nodes of that name: versions of one key.
    LatestOfVersions,
    /// Acknowledged delete markers, overwrites in place by Move and
    /// multipart parts (`scenario::workload::gateway_mix`).
    DeleteMarker,
    OverwriteByMove,
    MultipartPart,
    /// Acknowledged AddByPaths whose choice of directories the path oracle
    /// held to the model of the tree before them (`scenario::check::oracle::watch`).
    AddByPathResolved,
    /// Calls of the intruder that the role the swarm gave it allows,
    /// served (`scenario::workload::intruder`, `scenario::check::rights`).
    RightsAllowed,
    /// Calls of the caller at a replica's address (`scenario::workload::rogue`)
    /// its replication rights allow, served as the model predicted.
    ReplicaCallerServed,
    /// Its replication calls for a container it does not hold (it holds
    /// the other), refused.
    OtherContainerReplicaRefused,
    /// Calls the rights allow, refused with the typed error the model of
    /// the input rules predicted (`scenario::check::outcome`): a missing
    /// parent or node, `ROOT` or `TRASH` moved, a bad path, a counter
    /// beyond reach, a reserved child, a replica that does not hold the
    /// container.
    RefusedAsModelled,
    /// Moves of a node under its own descendant, accepted and found to
    /// leave the node where it was.
    CycleMoveSkipped,
    /// Writes acknowledged once three replicas held them
    /// (`tree.ack_replicas: 3`).
    AckedByThree,
    /// Branches inside the engine, counted by its probes
    /// (`arbor::probe::Probe`, whose variant of the same name says which).
    PullStampPageNext,
    PullOpPageNext,
    PullSeveralRuns,
    PullCursorPersistedByLag,
    OpLogCutByBytes,
    StampsCutByBytes,
    PushCutByBytes,
    AdmissionRefused,
    AwaitingReplicasFull,
    CounterTooFar,
    DirCacheHitAfterUndo,
    LatestAmongSeveral,
    AnswerTooLarge,
    AnswerTimedOut,
    /// Writes on a connection that found its flow-control window full
    /// and waited for the reader (`world::simnet`).
    WriteStalled,
}

/// Undo/redo passes at least this deep count as deep.
pub const DEEP_UNDO_OPS: usize = 4;

impl Coverage {
    pub const ALL: [Coverage; 69] = [
        Coverage::UndoRedo,
        Coverage::UndoRedoDeep,
        Coverage::OlderThanLog,
        Coverage::CycleRefused,
        Coverage::SameNameDirectories,
        Coverage::DeliveredBySync,
        Coverage::PushBlackout,
        Coverage::DiskErrorReopen,
        Coverage::TornWrite,
        Coverage::TimeoutLaterApplied,
        Coverage::DefiniteFailure,
        Coverage::GetNodeByPathLatest,
        Coverage::GetNodeByPathAll,
        Coverage::GetSubTree,
        Coverage::GetMeta,
        Coverage::TreeList,
        Coverage::GetOpLog,
        Coverage::GetOpLogStamps,
        Coverage::GetSubTreePage,
        Coverage::SubTreePageContinued,
        Coverage::GrpcAnswer,
        Coverage::ReadDuringCommits,
        Coverage::PullPassChecked,
        Coverage::DropTree,
        Coverage::DropContainer,
        Coverage::DropTimedOut,
        Coverage::DropStorageError,
        Coverage::WriteAfterDrop,
        Coverage::ErasedByDrop,
        Coverage::DiskReplaced,
        Coverage::RejoinRefused,
        Coverage::WritesAtRisk,
        Coverage::LostAtRisk,
        Coverage::MisconfigWindow,
        Coverage::MisconfigDetected,
        Coverage::MisconfigAcked,
        Coverage::MemberJoined,
        Coverage::MemberLeft,
        Coverage::LeaveCalledOff,
        Coverage::JoinerSyncedAlone,
        Coverage::JoinerPages,
        Coverage::AckedByReplicas,
        Coverage::NotReplicated,
        Coverage::LatestOfVersions,
        Coverage::DeleteMarker,
        Coverage::OverwriteByMove,
        Coverage::MultipartPart,
        Coverage::AddByPathResolved,
        Coverage::RightsAllowed,
        Coverage::ReplicaCallerServed,
        Coverage::OtherContainerReplicaRefused,
        Coverage::RefusedAsModelled,
        Coverage::CycleMoveSkipped,
        Coverage::AckedByThree,
        Coverage::PullStampPageNext,
        Coverage::PullOpPageNext,
        Coverage::PullSeveralRuns,
        Coverage::PullCursorPersistedByLag,
        Coverage::OpLogCutByBytes,
        Coverage::StampsCutByBytes,
        Coverage::PushCutByBytes,
        Coverage::AdmissionRefused,
        Coverage::AwaitingReplicasFull,
        Coverage::CounterTooFar,
        Coverage::DirCacheHitAfterUndo,
        Coverage::LatestAmongSeveral,
        Coverage::AnswerTooLarge,
        Coverage::AnswerTimedOut,
        Coverage::WriteStalled,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Coverage::UndoRedo => "undo/redo passes",
            Coverage::UndoRedoDeep => "deep undo/redo passes",
            Coverage::OlderThanLog => "ops older than the whole log",
            Coverage::CycleRefused => "cycles refused",
            Coverage::SameNameDirectories => "same-name directories",
            Coverage::DeliveredBySync => "ops delivered by sync",
            Coverage::PushBlackout => "push blackouts",
            Coverage::DiskErrorReopen => "disk errors then reopen",
            Coverage::TornWrite => "torn writes",
            Coverage::TimeoutLaterApplied => "timed-out writes applied",
            Coverage::DefiniteFailure => "definite failures",
            Coverage::GetNodeByPathLatest => "GetNodeByPath latest answers",
            Coverage::GetNodeByPathAll => "GetNodeByPath all answers",
            Coverage::GetSubTree => "GetSubTree answers",
            Coverage::GetMeta => "GetMeta answers",
            Coverage::TreeList => "TreeList answers",
            Coverage::GetOpLog => "GetOpLog answers",
            Coverage::GetOpLogStamps => "GetOpLogStamps answers",
            Coverage::GetSubTreePage => "first pages of subtree listings",
            Coverage::SubTreePageContinued => "subtree listing pages from a cursor",
            Coverage::GrpcAnswer => "gRPC answers checked as the gateway read them",
            Coverage::ReadDuringCommits => "reads answered from a state during commits",
            Coverage::PullPassChecked => "pull passes checked",
            Coverage::DropTree => "trees dropped",
            Coverage::DropContainer => "containers dropped",
            Coverage::DropTimedOut => "drops timed out",
            Coverage::DropStorageError => "drops answered with a storage error",
            Coverage::WriteAfterDrop => "writes after a drop",
            Coverage::ErasedByDrop => "writes erased by drops",
            Coverage::DiskReplaced => "disks replaced",
            Coverage::RejoinRefused => "writes refused while rejoining",
            Coverage::WritesAtRisk => "writes at risk",
            Coverage::LostAtRisk => "writes lost at risk",
            Coverage::MisconfigWindow => "misconfiguration windows",
            Coverage::MisconfigDetected => "misconfigurations detected",
            Coverage::MisconfigAcked => "writes acked by a misconfigured node",
            Coverage::MemberJoined => "replicas joined",
            Coverage::MemberLeft => "replicas left",
            Coverage::LeaveCalledOff => "leaves called off",
            Coverage::JoinerSyncedAlone => "joiners caught up by sync alone",
            Coverage::JoinerPages => "pages joiners pulled",
            Coverage::AckedByReplicas => "writes acked by ack_replicas >= 2",
            Coverage::NotReplicated => "writes not on ack_replicas in time",
            Coverage::LatestOfVersions => "latest answers among versions",
            Coverage::DeleteMarker => "delete markers",
            Coverage::OverwriteByMove => "overwrites by Move",
            Coverage::MultipartPart => "multipart parts",
            Coverage::AddByPathResolved => "AddByPath directories checked",
            Coverage::RightsAllowed => "calls a drawn role allowed, served",
            Coverage::ReplicaCallerServed => "calls as a replica allowed, served",
            Coverage::OtherContainerReplicaRefused => "replica calls for another container refused",
            Coverage::RefusedAsModelled => "allowed calls refused as the input rules predict",
            Coverage::CycleMoveSkipped => "moves under a descendant left as they were",
            Coverage::AckedByThree => "writes acked by ack_replicas 3",
            Coverage::PullStampPageNext => "pulls past one stamp page",
            Coverage::PullOpPageNext => "pull runs past one op page",
            Coverage::PullSeveralRuns => "stamp pages with several runs",
            Coverage::PullCursorPersistedByLag => "pull cursors persisted by lag",
            Coverage::OpLogCutByBytes => "GetOpLog pages cut by bytes",
            Coverage::StampsCutByBytes => "stamp pages cut by bytes",
            Coverage::PushCutByBytes => "push pages cut by bytes",
            Coverage::AdmissionRefused => "writes refused at admission",
            Coverage::AwaitingReplicasFull => "writes refused, replica waits full",
            Coverage::CounterTooFar => "ops refused as CounterTooFar",
            Coverage::DirCacheHitAfterUndo => "dir cache hits after an undo",
            Coverage::LatestAmongSeveral => "latest-only lookups among several",
            Coverage::AnswerTooLarge => "answers refused as too large",
            Coverage::AnswerTimedOut => "answers left unread past the frame timeout",
            Coverage::WriteStalled => "writes stalled on a full connection window",
        }
    }

    /// The situation an engine probe counts.
    pub fn of_probe(probe: Probe) -> Coverage {
        match probe {
            Probe::PullStampPageNext => Coverage::PullStampPageNext,
            Probe::PullOpPageNext => Coverage::PullOpPageNext,
            Probe::PullSeveralRuns => Coverage::PullSeveralRuns,
            Probe::PullCursorPersistedByLag => Coverage::PullCursorPersistedByLag,
            Probe::OpLogCutByBytes => Coverage::OpLogCutByBytes,
            Probe::StampsCutByBytes => Coverage::StampsCutByBytes,
            Probe::PushCutByBytes => Coverage::PushCutByBytes,
            Probe::AdmissionRefused => Coverage::AdmissionRefused,
            Probe::AwaitingReplicasFull => Coverage::AwaitingReplicasFull,
            Probe::CounterTooFar => Coverage::CounterTooFar,
            Probe::DirCacheHitAfterUndo => Coverage::DirCacheHitAfterUndo,
            Probe::LatestAmongSeveral => Coverage::LatestAmongSeveral,
            Probe::AnswerTooLarge => Coverage::AnswerTooLarge,
            Probe::AnswerTimedOut => Coverage::AnswerTimedOut,
        }
    }
}

/// Counts per situation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CoverageCounts(pub BTreeMap<Coverage, u64>);

impl CoverageCounts {
    pub fn get(&self, what: Coverage) -> u64 {
        self.0.get(&what).copied().unwrap_or(0)
    }

    pub fn add(&mut self, what: Coverage, count: u64) {
        if count > 0 {
            *self.0.entry(what).or_default() += count;
        }
    }

    pub fn merge(&mut self, other: &CoverageCounts) {
        for (&what, &count) in &other.0 {
            self.add(what, count);
        }
    }

    /// Adds the counts of the engine's probes (`arbor::probe::take`).
    pub fn add_probes(&mut self, counts: &arbor::probe::ProbeCounts) {
        for (probe, &count) in Probe::ALL.iter().zip(counts) {
            self.add(Coverage::of_probe(*probe), count);
        }
    }

    /// The situations never reached.
    pub fn missing(&self) -> Vec<Coverage> {
        Coverage::ALL
            .into_iter()
            .filter(|&c| self.get(c) == 0)
            .collect()
    }
}

impl fmt::Display for CoverageCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, what) in Coverage::ALL.into_iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{} {}", what.name(), self.get(what))?;
        }
        Ok(())
    }
}

/// The counters of one run, shared by everything that sees a situation.
#[derive(Clone, Default)]
pub struct CoverageCounter(Arc<Mutex<CoverageCounts>>);

impl CoverageCounter {
    pub fn hit(&self, what: Coverage) {
        self.add(what, 1);
    }

    pub fn add(&self, what: Coverage, count: u64) {
        self.0.lock().unwrap().add(what, count);
    }

    pub fn counts(&self) -> CoverageCounts {
        self.0.lock().unwrap().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_and_name_what_is_missing() {
        let counter = CoverageCounter::default();
        counter.hit(Coverage::UndoRedo);
        counter.add(Coverage::UndoRedo, 2);
        counter.add(Coverage::TornWrite, 0);
        let mut total = counter.counts();
        assert_eq!(total.get(Coverage::UndoRedo), 3);
        total.merge(&counter.counts());
        assert_eq!(total.get(Coverage::UndoRedo), 6);
        assert!(total.missing().contains(&Coverage::TornWrite));
        assert!(!total.missing().contains(&Coverage::UndoRedo));
        assert_eq!(total.missing().len(), Coverage::ALL.len() - 1);
    }
}
