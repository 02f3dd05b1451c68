//! Membership change: a replica joins or leaves a container mid-run, the
//! way an operator does it (docs/design.md §6, membership). The new
//! replica sets go into every node's config and each affected node takes
//! them at a drained restart; the operator's map (`World::set_view`),
//! which clients and checkers go by, changes when the change takes effect
//! for clients: after the restarts for a join, before the leaver's drain
//! for a leave.
//!
//! - **Join.** The existing members restart first (from then on they take
//!   the joiner as a peer and push to it), then the joiner. With sync
//!   configured, pushes into the joiner are dropped until it holds every
//!   op its members held when it started: it catches up by sync alone.
//! - **Leave.** Clients stop sending the container's requests to the
//!   leaver; once every request sent before has had its answer, the leave
//!   waits until every op the leaver stamped in the container is held by
//!   every remaining member, all of them up, and every other op it holds
//!   there by one of them: the answer `arbor drain` gives an operator
//!   (`arbor::drain::judge`, on what `arbor::drain::held_ops_local` reads
//!   of each replica, as `held_ops` does over the network). It is called
//!   off when that
//!   does not happen within `LEAVE_DRAIN_MAX`. Then the leaver restarts
//!   out of the container (it answers its requests with `NotReplica`) and
//!   the remaining members restart without it as a peer, but with it as
//!   retired, so that its ops still travel by pull.
//!
//! The checks: after a leave, no op the leaver held in a tree nobody
//! dropped meanwhile may be missing from every remaining member; at the
//! end, the checkers hold the container's final members to every
//! acknowledged write (`World::replicas_of`).

use crate::coverage::Coverage;
use crate::disk::SplitMix64;
use crate::failure::{Failure, FailureKind};
use crate::scenario::check::oracle::TreeView;
use crate::scenario::plan::swarm::{Profile, Swarm};
use crate::scenario::plan::PlanError;
use crate::scenario::workload::{self, Workload};
use crate::world::supervisor::Supervisor;
use crate::world::transport::RequestKind;
use crate::world::World;
use arbor::config::ContainerConfig;
use arbor::drain;
use arbor::{ContainerId, ReplicaId, Timestamp, TreeKey};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// No change leaves a container with fewer replicas.
pub const MEMBERS_MIN: usize = 2;
/// Most changes a plan holds: a capsule edited by hand is input.
pub const CHANGES_MAX: usize = 16;
/// Chance that a standard seed changes one replica set.
const STANDARD_CHANGE_PROBABILITY: f64 = 0.3;
/// How long a leave waits for its leaver's ops to reach the others.
const LEAVE_DRAIN_MAX: Duration = Duration::from_secs(20);
/// How long pushes into a joiner stay dropped while it catches up.
const JOIN_CATCH_UP_MAX: Duration = Duration::from_secs(20);
/// How often the drain and the catch-up look at the replicas' logs.
const LOG_POLL: Duration = Duration::from_millis(250);

/// What a membership change does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ChangeKind {
    Join { replica: ReplicaId },
    Leave { replica: ReplicaId },
}

/// One membership change of the plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedChange {
    /// Simulated time after the workload starts.
    pub at_ms: u64,
    /// Index into `workload::containers()`.
    pub container: usize,
    #[serde(flatten)]
    pub kind: ChangeKind,
}

impl PlannedChange {
    pub fn replica(&self) -> ReplicaId {
        match self.kind {
            ChangeKind::Join { replica } | ChangeKind::Leave { replica } => replica,
        }
    }
}

/// The changes of `swarm`'s seed, from a stream of their own (so adding
/// them left every other draw of a seed as it was): one change in some
/// standard seeds; a join, and in half the seeds a leave after it, in the
/// members profile.
pub fn draw(swarm: &Swarm) -> Vec<PlannedChange> {
    let mut rng = SplitMix64::new(swarm.seed ^ 0x4d45_4d42_0000_0000);
    let end_ms = swarm.size.workload_duration.as_millis() as u64;
    let at = |rng: &mut SplitMix64, low: u64, high: u64| {
        let span = end_ms * (high - low) / 100;
        end_ms * low / 100 + rng.next_u64() % span.max(1)
    };
    let join = swarm.replicas > 3;
    let mut changes = Vec::new();
    match swarm.profile {
        Profile::Members => {
            let at_ms = at(&mut rng, 5, 25);
            changes.push(join_change(swarm, at_ms));
            if rng.chance(0.5) {
                let at_ms = at(&mut rng, 30, 50);
                changes.push(leave_change(swarm, 0, &mut rng, at_ms));
            }
        }
        Profile::Standard if rng.chance(STANDARD_CHANGE_PROBABILITY) => {
            let at_ms = at(&mut rng, 10, 40);
            if join && rng.chance(0.75) {
                changes.push(join_change(swarm, at_ms));
            } else {
                let container = (rng.next_u64() % 2) as usize;
                changes.push(leave_change(swarm, container, &mut rng, at_ms));
            }
        }
        _ => {}
    }
    changes
}

/// The last replica joins the second container (which, with four
/// replicas, the others hold).
fn join_change(swarm: &Swarm, at_ms: u64) -> PlannedChange {
    PlannedChange {
        at_ms,
        container: 1,
        kind: ChangeKind::Join {
            replica: swarm.replicas as ReplicaId,
        },
    }
}

fn leave_change(
    swarm: &Swarm,
    container: usize,
    rng: &mut SplitMix64,
    at_ms: u64,
) -> PlannedChange {
    let sets = crate::scenario::replica_sets(swarm.replicas);
    let members = &sets[container].1;
    let replica = members[(rng.next_u64() % members.len() as u64) as usize];
    PlannedChange {
        at_ms,
        container,
        kind: ChangeKind::Leave { replica },
    }
}

/// Checks what a hand-edited capsule could get wrong: each change must
/// apply to the replica sets the changes before it left, in time order.
pub fn validate(swarm: &Swarm, changes: &[PlannedChange]) -> Result<(), PlanError> {
    if changes.len() > CHANGES_MAX {
        return Err(PlanError::TooMany {
            what: "membership changes",
            count: changes.len() as u64,
            limit: CHANGES_MAX as u64,
        });
    }
    let mut sets: Vec<Vec<ReplicaId>> = crate::scenario::replica_sets(swarm.replicas)
        .into_iter()
        .map(|(_, set)| set)
        .collect();
    let mut at_ms = 0;
    for (index, change) in changes.iter().enumerate() {
        let bad = |why: &'static str| PlanError::BadChange { index, why };
        if change.at_ms < at_ms {
            return Err(bad("out of time order"));
        }
        at_ms = change.at_ms;
        let replica = change.replica();
        if replica == 0 || replica as usize > swarm.replicas {
            return Err(bad("names a replica the plan does not have"));
        }
        let set = sets
            .get_mut(change.container)
            .ok_or(bad("names a container the workload does not have"))?;
        match change.kind {
            ChangeKind::Join { .. } if set.contains(&replica) => {
                return Err(bad("joins a replica already a member"))
            }
            ChangeKind::Join { .. } => set.push(replica),
            ChangeKind::Leave { .. } if !set.contains(&replica) => {
                return Err(bad("leaves a replica not a member"))
            }
            ChangeKind::Leave { .. } if set.len() <= MEMBERS_MIN => {
                return Err(bad("would leave too few replicas"))
            }
            ChangeKind::Leave { .. } if set.len() <= swarm.ack_replicas => {
                return Err(bad("would leave fewer replicas than tree.ack_replicas"))
            }
            ChangeKind::Leave { .. } => set.retain(|&r| r != replica),
        }
    }
    Ok(())
}

/// Carries out `changes` at their times, one after the other; returns
/// when the last is done (the run heals only after it).
pub async fn run(
    changes: Vec<PlannedChange>,
    supervisor: Arc<Supervisor>,
    workload: Arc<Workload>,
    profile: Profile,
    start: Duration,
) {
    let driver = Driver {
        world: supervisor.world().clone(),
        supervisor,
        workload,
        keep_joiner_pushes_blocked: profile == Profile::Members,
    };
    for change in changes {
        let at = start + Duration::from_millis(change.at_ms);
        let now = crate::world::clock::global_now();
        if at > now {
            madsim::time::sleep(at - now).await;
        }
        let cid = workload::containers()[change.container];
        match change.kind {
            ChangeKind::Join { replica } => driver.join(replica, cid).await,
            ChangeKind::Leave { replica } => driver.leave(replica, cid).await,
        }
    }
}

struct Driver {
    world: Arc<World>,
    supervisor: Arc<Supervisor>,
    workload: Arc<Workload>,
    /// The members profile drops pushes into a joiner for the rest of the
    /// run: whatever it holds at the end came by sync.
    keep_joiner_pushes_blocked: bool,
}

/// The op timestamps of each tree of `cid` on `replica`; `None` when it
/// is down or its storage cannot be read.
fn stamps_of(
    world: &World,
    replica: ReplicaId,
    cid: &ContainerId,
) -> Option<BTreeMap<TreeKey, BTreeSet<Timestamp>>> {
    let node = world.node(replica);
    // A stand-in on the replica's machine runs on a disk of its own: what
    // it holds says nothing of the replica's.
    if node.is_stand_in() {
        return None;
    }
    let service = node.service()?;
    let forest = service.forest();
    let mut stamps = BTreeMap::new();
    for tree in forest.tree_list(cid).ok()? {
        let tree = TreeKey::new(*cid, tree);
        let view = TreeView::read(forest, &tree).ok()?;
        let held = view.map(|v| v.timestamps().clone()).unwrap_or_default();
        stamps.insert(tree, held);
    }
    Some(stamps)
}

/// What `replica` holds in `cid` as the operator reads it
/// (`arbor::drain::held_ops_local`); `None` while it is down or a
/// stand-in serves its address, or its read fails.
fn held_ops(world: &World, replica: ReplicaId, cid: &ContainerId) -> Option<drain::HeldOps> {
    let node = world.node(replica);
    if node.is_stand_in() {
        return None;
    }
    drain::held_ops_local(node.service()?.forest(), cid).ok()
}

/// Whether `holder` holds every op of `wanted` (trees it lacks hold none).
fn holds_all(
    holder: &BTreeMap<TreeKey, BTreeSet<Timestamp>>,
    wanted: &BTreeMap<TreeKey, BTreeSet<Timestamp>>,
) -> bool {
    wanted.iter().all(|(tree, stamps)| {
        stamps.is_empty()
            || holder
                .get(tree)
                .is_some_and(|held| held.is_superset(stamps))
    })
}

/// `sets` with `replica` in (`join`) or out of `cid`'s replica set.
fn changed(
    mut sets: Vec<ContainerConfig>,
    cid: ContainerId,
    replica: ReplicaId,
    join: bool,
) -> Vec<ContainerConfig> {
    let set = sets
        .iter_mut()
        .find(|c| c.cid == cid)
        .expect("every workload container is listed");
    set.replicas.retain(|&r| r != replica);
    set.retired.retain(|&r| r != replica);
    if join {
        set.replicas.push(replica);
        set.replicas.sort_unstable();
    } else {
        set.retired.push(replica);
        set.retired.sort_unstable();
    }
    assert!(
        set.replicas.len() >= MEMBERS_MIN,
        "a change kept too few replicas"
    );
    sets
}

impl Driver {
    fn note(&self, what: String) {
        self.world.trace.record("operator", what);
    }

    /// Every node starts with `sets` from its next start.
    fn configure_all(&self, sets: &[ContainerConfig]) {
        for replica in self.world.replica_ids() {
            self.world.set_node_containers(replica, sets.to_vec());
        }
    }

    async fn join(&self, joiner: ReplicaId, cid: ContainerId) {
        let members = self.world.replicas_of(&cid);
        self.note(format!(
            "replica-{joiner} joins {cid} (members {members:?})"
        ));
        let sets = changed(self.world.view(), cid, joiner, true);
        self.configure_all(&sets);
        let by_sync = self.world.sync_configured();
        if by_sync {
            for &member in &members {
                (self.world.filter).block(member, joiner, RequestKind::Push);
            }
        }
        for &member in &members {
            self.supervisor.restart_for_membership(member).await;
        }
        self.supervisor.restart_for_membership(joiner).await;
        self.world.set_view(sets);
        self.world.hooks.coverage.hit(Coverage::MemberJoined);
        if by_sync {
            self.catch_up(joiner, cid, &members).await;
            if !self.keep_joiner_pushes_blocked {
                for &member in &members {
                    (self.world.filter).unblock(member, joiner, RequestKind::Push);
                }
            }
        }
    }

    /// Waits (bounded) until the joiner holds every op its members held
    /// as it started, with pushes into it dropped: then it caught up by
    /// sync alone. Faults may keep it from that; it is no failure here,
    /// the checkers at the end judge it.
    async fn catch_up(&self, joiner: ReplicaId, cid: ContainerId, members: &[ReplicaId]) {
        let wanted: Vec<_> = members
            .iter()
            .filter_map(|&m| stamps_of(&self.world, m, &cid))
            .collect();
        let deadline = crate::world::clock::global_now() + JOIN_CATCH_UP_MAX;
        while crate::world::clock::global_now() < deadline {
            let held = stamps_of(&self.world, joiner, &cid);
            if held.is_some_and(|held| wanted.iter().all(|w| holds_all(&held, w))) {
                let service = self.world.node(joiner).service();
                let pages = service.map_or(0, |s| s.stats().sync_pages_pulled);
                self.note(format!(
                    "replica-{joiner} caught up by sync ({pages} pages)"
                ));
                let coverage = &self.world.hooks.coverage;
                coverage.hit(Coverage::JoinerSyncedAlone);
                coverage.add(Coverage::JoinerPages, pages);
                return;
            }
            madsim::time::sleep(LOG_POLL).await;
        }
        self.note(format!("replica-{joiner} did not catch up by sync in time"));
    }

    async fn leave(&self, leaver: ReplicaId, cid: ContainerId) {
        let before = self.world.view();
        let members = self.world.replicas_of(&cid);
        let remaining: Vec<ReplicaId> = members.into_iter().filter(|&r| r != leaver).collect();
        self.note(format!(
            "replica-{leaver} leaves {cid} (remaining {remaining:?})"
        ));
        let sets = changed(before.clone(), cid, leaver, false);
        self.world.set_view(sets.clone());
        // Every request sent to the leaver before the map changed has had
        // its answer, or its caller gave up, by now.
        madsim::time::sleep(self.workload.call_timeout * 2).await;
        let trees = stamps_of(&self.world, leaver, &cid).unwrap_or_default();
        let drops_before = self.drops_sent(trees.keys());
        if !self.drained(leaver, cid, &remaining).await {
            self.note(format!("leave of replica-{leaver} called off: not drained"));
            self.world.set_view(before);
            self.world.hooks.coverage.hit(Coverage::LeaveCalledOff);
            return;
        }
        // At the instant the drain was seen complete: the remaining members
        // hold what the leaver acknowledged, and only their drops can erase
        // it from now on (the leaver's copy is no longer served).
        self.note(format!(
            "replica-{leaver} drained into {remaining:?}: its leave takes effect"
        ));
        (self.workload.ledger.lock().unwrap()).handed_off(cid, leaver, remaining.clone());
        let held = stamps_of(&self.world, leaver, &cid);
        let handed: Vec<_> = (remaining.iter())
            .map(|&m| stamps_of(&self.world, m, &cid))
            .collect();
        self.configure_all(&sets);
        self.supervisor.restart_for_membership(leaver).await;
        let left = Left { held, handed };
        self.check_left_nothing(leaver, cid, &remaining, left, drops_before);
        for &member in &remaining {
            self.supervisor.restart_for_membership(member).await;
        }
        self.world.hooks.coverage.hit(Coverage::MemberLeft);
    }

    /// Drops sent so far per tree (whole-container drops count for every
    /// tree), and whether each was answered: an unanswered drop may still
    /// run at any time.
    fn drops_sent<'t>(
        &self,
        trees: impl Iterator<Item = &'t TreeKey>,
    ) -> BTreeMap<TreeKey, (u64, bool)> {
        let ledger = self.workload.ledger.lock().unwrap();
        trees
            .map(|tree| {
                let sent = ledger.drops.sent_of(tree);
                (tree.clone(), (sent, ledger.drops.answered_of(tree) == sent))
            })
            .collect()
    }

    /// Waits (bounded) until every remaining member is up and the leaver's
    /// copy of the container is drained into them (`arbor::drain::judge`,
    /// the rule `arbor drain` applies).
    async fn drained(&self, leaver: ReplicaId, cid: ContainerId, remaining: &[ReplicaId]) -> bool {
        let deadline = crate::world::clock::global_now() + LEAVE_DRAIN_MAX;
        loop {
            if let Some(held) = held_ops(&self.world, leaver, &cid) {
                let others: Option<Vec<_>> = (remaining.iter())
                    .map(|&m| held_ops(&self.world, m, &cid).map(|held| (m, held)))
                    .collect();
                if others.is_some_and(|others| drain::judge(cid, leaver, &held, &others).done()) {
                    return true;
                }
            }
            if crate::world::clock::global_now() >= deadline {
                return false;
            }
            madsim::time::sleep(LOG_POLL).await;
        }
    }

    /// After the leaver stopped serving the container: every op it held
    /// there, whoever stamped it, must be held by a remaining member,
    /// unless a drop of its tree was sent since the drain began or is
    /// still unanswered.
    fn check_left_nothing(
        &self,
        leaver: ReplicaId,
        cid: ContainerId,
        remaining: &[ReplicaId],
        left: Left,
        drops_before: BTreeMap<TreeKey, (u64, bool)>,
    ) {
        let Some(held) = left.held else { return };
        let drops_after = self.drops_sent(held.keys());
        // A member down now (a power failure since the drain) still has on
        // disk what it held then; the crash checks judge that disk.
        let others: Vec<_> = (remaining.iter().zip(left.handed))
            .filter_map(|(&m, then)| stamps_of(&self.world, m, &cid).or(then))
            .collect();
        let settled = |tree: &TreeKey| {
            let after = drops_after.get(tree);
            after == drops_before.get(tree) && after.is_none_or(|&(_, answered)| answered)
        };
        if let Some((tree, lost)) = first_unkept(&held, &others, settled) {
            self.workload.verdict.fail(Failure::new(
                FailureKind::LostWrite,
                format!(
                    "replica-{leaver} left {cid} holding op {lost} of {tree:?} that no remaining member {remaining:?} holds"
                ),
            ));
        }
    }
}

/// What a leave saw at the instant it took effect: the leaver's ops of
/// the container and, per remaining member, its own (`None` when down).
struct Left {
    held: Option<BTreeMap<TreeKey, BTreeSet<Timestamp>>>,
    handed: Vec<Option<BTreeMap<TreeKey, BTreeSet<Timestamp>>>>,
}

/// The first op of `held` (what a leaver held) that none of `others` (the
/// remaining members) holds, in a tree `settled` says no drop touched.
fn first_unkept<'h>(
    held: &'h BTreeMap<TreeKey, BTreeSet<Timestamp>>,
    others: &[BTreeMap<TreeKey, BTreeSet<Timestamp>>],
    settled: impl Fn(&TreeKey) -> bool,
) -> Option<(&'h TreeKey, Timestamp)> {
    held.iter()
        .filter(|(tree, _)| settled(tree))
        .find_map(|(tree, stamps)| {
            let kept = |ts: &Timestamp| {
                others
                    .iter()
                    .any(|o| o.get(tree).is_some_and(|s| s.contains(ts)))
            };
            stamps.iter().find(|ts| !kept(ts)).map(|&ts| (tree, ts))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::plan::swarm::Size;

    /// The leave check, fed the history of a leave that did not drain: an
    /// op the leaver alone held is reported, in a tree no drop touched
    /// only; once a remaining member holds it, nothing is.
    #[test]
    fn a_leave_that_did_not_drain_is_caught() {
        let tree = TreeKey::new(ContainerId([1; 32]), "t");
        let other = TreeKey::new(ContainerId([1; 32]), "u");
        let set = |stamps: &[Timestamp]| stamps.iter().copied().collect::<BTreeSet<_>>();
        let held = BTreeMap::from([(tree.clone(), set(&[5, 7])), (other.clone(), set(&[9]))]);
        let not_drained = vec![
            BTreeMap::from([(tree.clone(), set(&[5]))]),
            BTreeMap::from([(other.clone(), set(&[9]))]),
        ];
        let all = |_: &TreeKey| true;
        assert_eq!(first_unkept(&held, &not_drained, all), Some((&tree, 7)));
        let dropped_t = |t: &TreeKey| *t != tree;
        assert_eq!(first_unkept(&held, &not_drained, dropped_t), None);
        assert_eq!(first_unkept(&held, &[], all), Some((&tree, 5)));
        let drained = vec![BTreeMap::from([
            (tree.clone(), set(&[5, 7, 8])),
            (other.clone(), set(&[9])),
        ])];
        assert_eq!(first_unkept(&held, &drained, all), None);
    }

    /// Drawn changes are valid; a hand edit that breaks a set is refused.
    #[test]
    fn drawn_changes_are_valid_and_bad_edits_refused() {
        let mut joins = 0;
        for seed in 1..200 {
            for profile in [Profile::Standard, Profile::Members] {
                let swarm = Swarm::draw(seed, profile, Size::TEST, true);
                let changes = draw(&swarm);
                assert_eq!(validate(&swarm, &changes), Ok(()), "seed {seed}");
                joins += changes
                    .iter()
                    .filter(|c| matches!(c.kind, ChangeKind::Join { .. }))
                    .count();
            }
        }
        assert!(joins > 0, "no seed drew a join");
        let swarm = Swarm::draw(1, Profile::Members, Size::TEST, true);
        let mut changes = draw(&swarm);
        changes.push(changes[0].clone());
        assert!(matches!(
            validate(&swarm, &changes),
            Err(PlanError::BadChange { .. })
        ));
        let two = vec![
            PlannedChange {
                at_ms: 0,
                container: 1,
                kind: ChangeKind::Leave { replica: 1 },
            },
            PlannedChange {
                at_ms: 1,
                container: 1,
                kind: ChangeKind::Leave { replica: 2 },
            },
        ];
        assert!(matches!(
            validate(&swarm, &two),
            Err(PlanError::BadChange { index: 1, .. })
        ));
        // A leave that would leave fewer replicas than acknowledge a
        // write: the nodes' configs could not serve the container.
        let one = &two[..1];
        assert_eq!(validate(&swarm, one), Ok(()));
        let mut acked_by_three = swarm.clone();
        acked_by_three.ack_replicas = 3;
        assert!(matches!(
            validate(&acked_by_three, one),
            Err(PlanError::BadChange { index: 0, .. })
        ));
    }

    /// `tree.ack_replicas` 3 and the caller at a replica's address are
    /// drawn only where every container keeps its replica set, and both
    /// are drawn in some seeds.
    #[test]
    fn three_acks_and_the_replica_caller_need_whole_sets() {
        let (mut three, mut rogue) = (0, 0);
        for seed in 1..400 {
            for profile in Profile::ALL {
                let swarm = Swarm::draw(seed, profile, Size::TEST, true);
                let whole = swarm.sets_stay_whole();
                if swarm.ack_replicas == 3 {
                    assert!(whole, "seed {seed} {profile:?}");
                    three += 1;
                }
                if let Some(id) = swarm.rogue_replica {
                    assert!(whole && swarm.knobs.sync_interval.is_some());
                    assert!((1..=swarm.replicas + 1).contains(&usize::from(id)));
                    rogue += 1;
                }
            }
        }
        assert!(three > 0 && rogue > 0, "{three} {rogue}");
    }
}
