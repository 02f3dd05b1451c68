//! What each profile claims to reach: the situations (`Coverage`) a sweep
//! of the profile must come to, so that a bug living on that path meets
//! the checkers. A profile that stops reaching a claim (a workload change,
//! a bound drawn too large to bind, a refactor that moves a branch) fails
//! its check instead of passing quietly.
//!
//! Two sizes are held to claims: seeds `1..=CLAIM_SEEDS` of the full-size
//! scenario must reach every claim (`arbor-sim sweep --seeds 40
//! --check-claims`, in release), and seeds `1..=SMALL_CLAIM_SEEDS` of the
//! test-size scenario must reach the claims marked as reached at that size
//! (`cargo test`, tests/claims.rs). Claims are situations the profile
//! reached over those seeds when they were set, nearly all of them many
//! times over.

use crate::coverage::{Coverage, CoverageCounts};
use crate::scenario::plan::swarm::{Profile, Size};

/// Full-size seeds that must reach every claim.
pub const CLAIM_SEEDS: u64 = 40;
/// Test-size seeds that must reach the claims marked `SMALL`.
pub const SMALL_CLAIM_SEEDS: u64 = 20;

/// Reached by the test-size scenario too.
const SMALL: bool = true;
/// Reached by the full-size scenario only (longer logs, more trees).
const FULL: bool = false;

use Coverage as C;

/// Every profile: the model's reads, undo/redo, the path oracle, the
/// engine's branches on the write and read path, and calls that the
/// intruder's drawn roles allow.
const EVERY_PROFILE: &[(Coverage, bool)] = &[
    (C::UndoRedo, SMALL),
    (C::UndoRedoDeep, SMALL),
    (C::OlderThanLog, SMALL),
    (C::SameNameDirectories, SMALL),
    (C::DefiniteFailure, SMALL),
    (C::TimeoutLaterApplied, SMALL),
    (C::DiskErrorReopen, SMALL),
    (C::GetNodeByPathLatest, SMALL),
    (C::GetNodeByPathAll, SMALL),
    (C::GetSubTree, SMALL),
    (C::GetMeta, SMALL),
    (C::TreeList, SMALL),
    (C::GetOpLog, SMALL),
    (C::GetOpLogStamps, SMALL),
    (C::AddByPathResolved, SMALL),
    (C::AdmissionRefused, SMALL),
    (C::DirCacheHitAfterUndo, SMALL),
    (C::LatestAmongSeveral, SMALL),
    (C::AnswerTooLarge, SMALL),
    (C::RightsAllowed, SMALL),
];

/// Every profile with background sync: pulls over several pages, checked.
const SYNC: &[(Coverage, bool)] = &[
    (C::DeliveredBySync, SMALL),
    (C::PullPassChecked, SMALL),
    (C::PullStampPageNext, SMALL),
    (C::PullOpPageNext, SMALL),
    (C::StampsCutByBytes, SMALL),
    (C::PullCursorPersistedByLag, FULL),
];

/// The standard mix of client operations: cycles and drops.
const TREE_OPS: &[(Coverage, bool)] = &[
    (C::CycleRefused, SMALL),
    (C::DropTree, SMALL),
    (C::WriteAfterDrop, SMALL),
    (C::ErasedByDrop, SMALL),
    (C::DropContainer, FULL),
    (C::DropTimedOut, FULL),
];

/// Every profile that draws `tree.ack_replicas` 2 (all but members):
/// writes answered once two replicas hold them, writes not on two in
/// time, and the bound on writes waiting for replicas reached.
const ACKS: &[(Coverage, bool)] = &[
    (C::AckedByReplicas, SMALL),
    (C::NotReplicated, SMALL),
    (C::AwaitingReplicasFull, SMALL),
];

impl Profile {
    /// The situations this profile claims, each with whether the test-size
    /// scenario reaches it too.
    pub fn claims(self) -> Vec<(Coverage, bool)> {
        let own: &[(Coverage, bool)] = match self {
            // A quarter of its seeds run the gateway's clients; callers at
            // a replica's address and ack_replicas 3 need sets that stay
            // whole, which membership changes and misconfiguration
            // windows of other profiles break.
            Profile::Standard => &[
                (C::PullSeveralRuns, FULL),
                (C::OpLogCutByBytes, FULL),
                (C::PushCutByBytes, FULL),
                (C::LatestOfVersions, SMALL),
                (C::DeleteMarker, SMALL),
                (C::OverwriteByMove, SMALL),
                (C::MultipartPart, SMALL),
                (C::RefusedAsModelled, SMALL),
                (C::CycleMoveSkipped, FULL),
                (C::ReplicaCallerServed, SMALL),
                (C::OtherContainerReplicaRefused, SMALL),
                (C::AckedByThree, SMALL),
                (C::AnswerTimedOut, FULL),
                (C::WriteStalled, SMALL),
            ],
            Profile::PushOnly => &[(C::PushCutByBytes, FULL)],
            Profile::SyncHeavy => &[
                (C::PushBlackout, SMALL),
                (C::PullSeveralRuns, FULL),
                (C::OpLogCutByBytes, FULL),
            ],
            Profile::StorageErrors => &[
                (C::DropStorageError, SMALL),
                (C::TornWrite, FULL),
                (C::PullSeveralRuns, FULL),
                (C::OpLogCutByBytes, FULL),
                (C::PushCutByBytes, FULL),
            ],
            // Over TCP a stamp page with several runs is rare at test size
            // (reached in seeds 21-40, not in 1-20).
            Profile::SyncOnly => &[
                (C::PullSeveralRuns, FULL),
                (C::OpLogCutByBytes, FULL),
                (C::PushCutByBytes, FULL),
            ],
            Profile::Replace => &[
                (C::DiskReplaced, SMALL),
                (C::RejoinRefused, SMALL),
                (C::WritesAtRisk, SMALL),
                (C::LostAtRisk, SMALL),
                (C::PullSeveralRuns, FULL),
                (C::OpLogCutByBytes, FULL),
                (C::PushCutByBytes, FULL),
            ],
            Profile::Misconfig => &[
                (C::MisconfigWindow, SMALL),
                (C::MisconfigDetected, SMALL),
                (C::MisconfigAcked, SMALL),
                (C::PullSeveralRuns, FULL),
                (C::OpLogCutByBytes, FULL),
                (C::PushCutByBytes, FULL),
            ],
            Profile::Members => &[
                (C::MemberJoined, SMALL),
                (C::MemberLeft, SMALL),
                (C::JoinerSyncedAlone, SMALL),
                (C::JoinerPages, SMALL),
                (C::PullSeveralRuns, FULL),
            ],
            Profile::Gateway => &[
                (C::LatestOfVersions, SMALL),
                (C::GetSubTreePage, SMALL),
                (C::SubTreePageContinued, SMALL),
                (C::GrpcAnswer, SMALL),
                (C::DeleteMarker, SMALL),
                (C::OverwriteByMove, SMALL),
                (C::MultipartPart, SMALL),
                (C::OpLogCutByBytes, FULL),
                (C::PushCutByBytes, FULL),
            ],
        };
        let sync: &[(Coverage, bool)] = match self {
            Profile::PushOnly => &[],
            _ => SYNC,
        };
        let tree_ops: &[(Coverage, bool)] = match self {
            Profile::PushOnly | Profile::Gateway => &[],
            _ => TREE_OPS,
        };
        let acks = ACKS.iter().filter(|&&(c, _)| match self {
            Profile::Members => false,
            // Pulls alone rarely bring a second copy within the
            // replication timeout: such writes end NotReplicated.
            Profile::SyncOnly => c != C::AckedByReplicas,
            _ => true,
        });
        EVERY_PROFILE
            .iter()
            .chain(sync)
            .chain(tree_ops)
            .chain(acks)
            .chain(own)
            .copied()
            .collect()
    }

    /// The claims a sweep of `size` must reach: all of them at full size,
    /// those marked `SMALL` at test size.
    pub fn claims_at(self, size: Size) -> Vec<Coverage> {
        let small = size == Size::TEST;
        self.claims()
            .into_iter()
            .filter(|&(_, at_small)| at_small || !small)
            .map(|(c, _)| c)
            .collect()
    }

    /// The claims of `size` that `coverage` never reached.
    pub fn unreached_claims(self, size: Size, coverage: &CoverageCounts) -> Vec<Coverage> {
        self.claims_at(size)
            .into_iter()
            .filter(|&c| coverage.get(c) == 0)
            .collect()
    }
}

/// How many seeds a sweep of `size` needs before its claims are held to it.
pub fn claim_seeds(size: Size) -> u64 {
    if size == Size::TEST {
        SMALL_CLAIM_SEEDS
    } else {
        CLAIM_SEEDS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_distinct_and_small_ones_are_claimed_at_full_size() {
        for profile in Profile::ALL {
            let all = profile.claims_at(Size::STANDARD);
            let mut distinct = all.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), all.len(), "{}", profile.name());
            for claim in profile.claims_at(Size::TEST) {
                assert!(all.contains(&claim), "{}: {claim:?}", profile.name());
            }
            let mut none = CoverageCounts::default();
            assert_eq!(profile.unreached_claims(Size::STANDARD, &none), all);
            for &claim in &all {
                none.add(claim, 1);
            }
            assert!(profile.unreached_claims(Size::STANDARD, &none).is_empty());
        }
    }
}
