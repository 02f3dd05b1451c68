//! The supervisor: the one owner of restarts, as an init system is on a
//! real host. It crashes a replica (power failure and kill) and starts it
//! again; it drains and restarts a replica whose disk failed, since redb
//! refuses writes after an I/O error until the database is reopened; and
//! when the run heals it starts what is down. Around each restart it
//! measures what the replica had stored, and before a drained restart how
//! many callers still wait; it judges both itself (`kept_across_restart`,
//! `drained`), so every run that has a supervisor is held to them, and a
//! failure goes to the run's verdict.

use super::clock::global_now;
use super::{poll_until, Heights, StandIn, World, BOOT_DEADLINE};
use crate::failure::{Failure, FailureKind, Verdict};
use arbor::ReplicaId;
use madsim::net::NetSim;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long `heal` waits for the drained restarts under way. The longest
/// takes a drain of 1 s plus up to 2 s for late writes, up to 1 s for the
/// old incarnation to go, and up to 10 s for the new one to serve before
/// its stored ops are compared. One second (the bound before) was shorter
/// than the drain alone: healing that began just after such a restart
/// started failed the seed (storage-errors seed 201270).
const RESTARTS_IN_FLIGHT_MAX: Duration = Duration::from_secs(15);

/// How long a replica cut off from new requests may take to answer every
/// caller it has: a batch waits at most `max_batch_delay` and a commit on a
/// failed database fails fast.
const DRAIN_WINDOW: Duration = Duration::from_secs(1);

/// Extra time, only when writes are still pending after `DRAIN_WINDOW`: a
/// request sent just before inbound traffic stopped may still be in flight
/// during a latency spike (up to 1.5 s per message) and be admitted late in
/// the window. A hung caller stays pending however long we wait.
const LATE_ARRIVAL_GRACE: Duration = Duration::from_secs(2);
const DRAIN_POLL: Duration = Duration::from_millis(10);

/// Why a replica restarted, in the words failures print.
const POWER_FAILURE: &str = "power failure";
const PROCESS_RESTART: &str = "process restart";
const STAND_IN: &str = "a stand-in process on its machine";

/// How long a stand-in waits for the clients' calls to the replica it
/// replaces (each bounded by its own timeout, 2 s for the workload's) and
/// for its own callers before it stops: a request the replica itself
/// never saw must not reach the stand-in, nor one sent to the stand-in
/// the replica. Well under `RESTARTS_IN_FLIGHT_MAX`.
const STAND_IN_CALLS_DRAIN_MAX: Duration = Duration::from_secs(5);
/// How long a check of the replica's own disk waits for a stand-in on its
/// machine to end (windows last seconds, and healing ends them).
const STAND_IN_OVER_MAX: Duration = Duration::from_secs(60);

pub struct Supervisor {
    world: Arc<World>,
    verdict: Verdict,
    /// Replicas being drained and restarted; no fault touches them meanwhile.
    supervised: Mutex<BTreeSet<ReplicaId>>,
    /// Replicas whose disk had an error window since their last drained
    /// restart: drained and restarted when the window ends or the run heals.
    poisoned: Mutex<BTreeSet<ReplicaId>>,
    /// What each crashed replica had stored when the power went (`None`
    /// when its database could not be read).
    crashed: Mutex<BTreeMap<ReplicaId, Option<Heights>>>,
    /// Drained restarts under way.
    in_flight: Arc<AtomicU64>,
    /// Set when the run heals: restarts scheduled for later do nothing.
    healing: AtomicBool,
    /// Replicas whose machine runs a stand-in, with what each had stored
    /// when it stopped (checked when it boots again).
    stand_ins: Mutex<BTreeMap<ReplicaId, Option<Heights>>>,
    /// Tasks nobody awaits (scheduled restarts, the nemesis's fault
    /// windows), aborted at the end of the run: madsim does not drop a
    /// pending task when its runtime goes (`World::shut_down`).
    detached: Mutex<Vec<madsim::task::AbortHandle>>,
}

impl Supervisor {
    pub fn new(world: Arc<World>, verdict: Verdict) -> Arc<Self> {
        Arc::new(Self {
            world,
            verdict,
            supervised: Mutex::default(),
            poisoned: Mutex::default(),
            crashed: Mutex::default(),
            stand_ins: Mutex::default(),
            in_flight: Arc::default(),
            healing: AtomicBool::new(false),
            detached: Mutex::default(),
        })
    }

    pub fn world(&self) -> &Arc<World> {
        &self.world
    }

    /// The run's verdict, which the supervisor's checks report to.
    pub fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// True once the run heals: faults still scheduled to end do nothing.
    pub fn healing(&self) -> bool {
        self.healing.load(Ordering::SeqCst)
    }

    /// True while the replica is being drained and restarted.
    pub fn is_supervised(&self, replica: ReplicaId) -> bool {
        self.supervised.lock().unwrap().contains(&replica)
    }

    /// Power failure and kill; what the replica had stored is remembered
    /// for the check after its restart.
    pub fn crash(&self, replica: ReplicaId) {
        let before = self.world.stored_heights(replica);
        self.crashed.lock().unwrap().insert(replica, before);
        self.world.crash(replica);
    }

    /// Starts a crashed replica again; once it serves, nothing it had
    /// stored may be missing.
    pub fn restart(self: &Arc<Self>, replica: ReplicaId) {
        let supervisor = self.clone();
        self.detach(async move { supervisor.start_and_check(replica).await });
    }

    /// Crashes the replica and starts it again after `downtime`, unless
    /// the run heals first (healing starts it).
    pub fn crash_for(self: &Arc<Self>, replica: ReplicaId, downtime: Duration) {
        self.crash(replica);
        let supervisor = self.clone();
        self.detach(async move {
            madsim::time::sleep(downtime).await;
            if !supervisor.world.is_up(replica) && !supervisor.healing() {
                supervisor.start_and_check(replica).await;
            }
        });
    }

    /// Destroys the replica's disk and starts it again, empty and
    /// rejoining, after `downtime`, unless the run heals first (healing
    /// starts it). Nothing it stored is kept, so nothing is checked.
    pub fn replace_disk_for(
        self: &Arc<Self>,
        replica: ReplicaId,
        downtime: Duration,
        containers: Vec<arbor::config::ContainerConfig>,
    ) {
        self.crashed.lock().unwrap().remove(&replica);
        self.world.replace_disk(replica, containers);
        let supervisor = self.clone();
        self.detach(async move {
            madsim::time::sleep(downtime).await;
            if !supervisor.world.is_up(replica) && !supervisor.healing() {
                supervisor.world.restart(replica);
            }
        });
    }

    /// True while the replica's disk had an error window since its last
    /// drained restart.
    pub fn is_poisoned(&self, replica: ReplicaId) -> bool {
        self.poisoned.lock().unwrap().contains(&replica)
    }

    async fn start_and_check(&self, replica: ReplicaId) {
        self.world.restart(replica);
        let before = self.crashed.lock().unwrap().remove(&replica).flatten();
        self.check_nothing_lost(replica, before, POWER_FAILURE)
            .await;
    }

    /// The replica's disk fails writes and syncs with these probabilities
    /// from now on, until `end_disk_errors` or healing.
    pub fn begin_disk_errors(&self, replica: ReplicaId, write: f64, sync: f64) {
        self.poisoned.lock().unwrap().insert(replica);
        self.world.begin_disk_errors(replica, write, sync);
    }

    /// Ends the replica's disk errors and drains and restarts it.
    pub fn end_disk_errors(self: &Arc<Self>, replica: ReplicaId) {
        self.world.end_disk_errors(replica);
        if self.poisoned.lock().unwrap().remove(&replica) {
            self.drain_and_restart(replica);
        }
    }

    /// Drains and restarts a live replica not already supervised, on its
    /// own task, once a pause of its process is over; `heal` waits for it.
    fn drain_and_restart(self: &Arc<Self>, replica: ReplicaId) {
        let guard = InFlight::enter(&self.in_flight);
        let supervisor = self.clone();
        if self.is_paused(replica) {
            self.detach(async move {
                let _guard = guard;
                while supervisor.is_paused(replica) {
                    madsim::time::sleep(DRAIN_POLL).await;
                }
                supervisor.drain_and_restart(replica);
            });
            return;
        }
        if !self.world.is_up(replica) || !self.supervised.lock().unwrap().insert(replica) {
            return;
        }
        self.detach(async move {
            let _guard = guard;
            supervisor.drain_and_restart_now(replica).await;
            supervisor.supervised.lock().unwrap().remove(&replica);
        });
    }

    /// Pauses the process of a live replica that nothing else supervises
    /// for `length`, or until `end` if that comes first: none of its tasks
    /// runs meanwhile, and every timer that fell due fires when it goes on,
    /// as after a stall of the machine (a VM paused, a process stopped).
    /// No other fault touches it meanwhile. False (and nothing done) when
    /// the replica is down, supervised or a stand-in runs on its machine.
    pub async fn pause(&self, replica: ReplicaId, length: Duration, end: Duration) -> bool {
        let node = self.world.node(replica);
        if !self.world.is_up(replica)
            || node.is_stand_in()
            || !self.supervised.lock().unwrap().insert(replica)
        {
            return false;
        }
        let _guard = InFlight::enter(&self.in_flight);
        let id = node.madsim_id();
        self.world.stalls.begin(id);
        madsim::runtime::Handle::current().pause(id);
        let until = (global_now() + length).min(end);
        madsim::time::sleep(until.saturating_sub(global_now())).await;
        madsim::runtime::Handle::current().resume(id);
        self.world.stalls.end(id);
        self.supervised.lock().unwrap().remove(&replica);
        true
    }

    /// True while the replica's process is paused.
    pub fn is_paused(&self, replica: ReplicaId) -> bool {
        let id = self.world.node(replica).madsim_id();
        self.world.stalls.is_paused(id)
    }

    /// How many pauses of its process the replica has had so far.
    pub fn pauses(&self, replica: ReplicaId) -> u64 {
        self.world
            .stalls
            .count(self.world.node(replica).madsim_id())
    }

    /// A drained restart that makes the replica take its new membership
    /// config (`World::set_node_containers`), once no other restart of it
    /// is under way. A replica that is down takes the config when it
    /// starts again, so there is nothing to do for it.
    pub async fn restart_for_membership(self: &Arc<Self>, replica: ReplicaId) {
        loop {
            if !self.world.is_up(replica) {
                return;
            }
            if self.supervised.lock().unwrap().insert(replica) {
                break;
            }
            madsim::time::sleep(DRAIN_POLL).await;
        }
        let _guard = InFlight::enter(&self.in_flight);
        self.drain_and_restart_now(replica).await;
        self.supervised.lock().unwrap().remove(&replica);
    }

    /// Before the restart, which would drop any caller the replica left
    /// hanging, its inbound traffic stops for a moment and every caller
    /// must have had its answer by then.
    async fn drain_and_restart_now(&self, replica: ReplicaId) {
        let (pending, waited) = self.drain(replica).await;
        if let Err(failure) = drained(replica, pending, waited) {
            self.verdict.fail(failure);
        }
        let before = self.world.stored_heights(replica);
        self.world.restart_process(replica).await;
        self.check_nothing_lost(replica, before, PROCESS_RESTART)
            .await;
    }

    /// Stops the replica's inbound traffic until its callers are answered
    /// (bounded): the writes still pending and how long it waited.
    async fn drain(&self, replica: ReplicaId) -> (u64, Duration) {
        let net = NetSim::current();
        let id = self.world.node(replica).madsim_id();
        net.clog_node_in(id);
        madsim::time::sleep(DRAIN_WINDOW).await;
        let pending = || {
            self.world
                .node(replica)
                .service()
                .map_or(0, |service| service.stats().pending_writes)
        };
        poll_until(LATE_ARRIVAL_GRACE, DRAIN_POLL, || pending() == 0).await;
        net.unclog_node_in(id);
        (pending(), DRAIN_WINDOW + LATE_ARRIVAL_GRACE)
    }

    /// Every commit is durable, so what a replica had stored before a
    /// restart must still be there once it serves again.
    /// A disk destroyed while the replica boots (`replace_disk_for`) keeps
    /// nothing by design: then nothing is checked.
    async fn check_nothing_lost(&self, replica: ReplicaId, before: Option<Heights>, cause: &str) {
        let Some(before) = before else { return };
        let disk = self.world.disk_generation(replica);
        if !self.world.wait_up(replica, BOOT_DEADLINE).await {
            return;
        }
        // A stand-in may have taken the machine since the replica booted:
        // it runs on a disk of its own, so the replica's disk is read once
        // the replica's own process runs there again.
        let own = || self.world.is_up(replica) && !self.world.node(replica).is_stand_in();
        if !poll_until(STAND_IN_OVER_MAX, DRAIN_POLL, own).await {
            return;
        }
        if self.world.disk_generation(replica) != disk {
            return;
        }
        let Some(after) = self.world.stored_heights(replica) else {
            return;
        };
        if let Err(failure) = kept_across_restart(replica, &before, &after, cause) {
            self.verdict.fail(failure);
        }
    }

    /// Takes the live replica out of the clients' rotation, waits for the
    /// calls still on their way to it, stops it and boots `stand_in` on
    /// its machine. False (and nothing done) when the replica is down or
    /// supervised already, or the run heals meanwhile.
    pub async fn begin_stand_in(&self, replica: ReplicaId, stand_in: StandIn) -> bool {
        if !self.world.is_up(replica) || !self.supervised.lock().unwrap().insert(replica) {
            return false;
        }
        let _guard = InFlight::enter(&self.in_flight);
        self.stand_ins.lock().unwrap().insert(replica, None);
        let rotation = &self.world.rotation;
        rotation.take_out(replica);
        poll_until(STAND_IN_CALLS_DRAIN_MAX, DRAIN_POLL, || {
            rotation.in_flight(replica) == 0
        })
        .await;
        if self.healing() || !self.world.is_up(replica) {
            self.stand_ins.lock().unwrap().remove(&replica);
            rotation.put_back(replica);
            self.supervised.lock().unwrap().remove(&replica);
            return false;
        }
        let before = self.world.stored_heights(replica);
        self.stand_ins.lock().unwrap().insert(replica, before);
        self.world.stand_in(replica, Some(stand_in)).await;
        true
    }

    /// True from `begin_stand_in` until the replica runs again.
    pub fn has_stand_in(&self, replica: ReplicaId) -> bool {
        self.stand_ins.lock().unwrap().contains_key(&replica)
    }

    /// Waits for the calls on their way to the stand-in (the misled
    /// client's), stops it and boots the replica from its own disk; once
    /// it serves, nothing it had stored may be missing, and clients call
    /// it again. Nothing when no stand-in runs there.
    pub async fn end_stand_in(&self, replica: ReplicaId) {
        let Some(before) = self.stand_ins.lock().unwrap().remove(&replica) else {
            return;
        };
        let _guard = InFlight::enter(&self.in_flight);
        let rotation = &self.world.rotation;
        poll_until(STAND_IN_CALLS_DRAIN_MAX, DRAIN_POLL, || {
            rotation.in_flight(replica) == 0
        })
        .await;
        self.world.stand_in(replica, None).await;
        self.check_nothing_lost(replica, before, STAND_IN).await;
        rotation.put_back(replica);
        self.supervised.lock().unwrap().remove(&replica);
    }

    /// The run heals: faults scheduled to end later do nothing, and every
    /// fault of the network and the disks ends now.
    pub fn end_faults(&self) {
        self.healing.store(true, Ordering::SeqCst);
        self.world.heal();
    }

    /// After `end_faults`: the drained restarts under way finish, every
    /// replica that is down starts, every replica whose disk failed is
    /// drained and restarted, and all must serve again.
    pub async fn restart_all(self: &Arc<Self>) -> Result<(), Failure> {
        assert!(self.healing(), "restart_all runs once the faults ended");
        self.wait_in_flight().await;
        let stand_ins: Vec<ReplicaId> = self.stand_ins.lock().unwrap().keys().copied().collect();
        for replica in stand_ins {
            self.end_stand_in(replica).await;
        }
        let poisoned = std::mem::take(&mut *self.poisoned.lock().unwrap());
        let mut started = Vec::new();
        for replica in self.world.replica_ids() {
            if !self.world.is_up(replica) {
                self.world.restart(replica);
                started.push(replica);
            } else if poisoned.contains(&replica) {
                self.drain_and_restart_now(replica).await;
            }
        }
        for replica in self.world.replica_ids() {
            if !self.world.wait_up(replica, BOOT_DEADLINE).await {
                return Err(Failure::new(
                    FailureKind::Liveness,
                    format!("replica-{replica} did not come back after healing"),
                ));
            }
        }
        for replica in started {
            let before = self.crashed.lock().unwrap().remove(&replica).flatten();
            self.check_nothing_lost(replica, before, POWER_FAILURE)
                .await;
        }
        Ok(())
    }

    /// Waits (bounded) until no drained restart is under way, so that
    /// healing does not race one.
    async fn wait_in_flight(&self) {
        let idle = || self.in_flight.load(Ordering::SeqCst) == 0;
        assert!(
            poll_until(RESTARTS_IN_FLIGHT_MAX, Duration::from_millis(1), idle).await,
            "a process restart never finished within {RESTARTS_IN_FLIGHT_MAX:?}"
        );
    }

    /// Runs `task` on its own, to be aborted by `abort_detached`.
    pub fn detach(&self, task: impl Future<Output = ()> + Send + 'static) {
        let handle = madsim::task::spawn(task);
        let mut detached = self.detached.lock().unwrap();
        detached.retain(|h| !h.is_finished());
        detached.push(handle.abort_handle());
    }

    /// Aborts every detached task still pending (the end of the run).
    pub fn abort_detached(&self) {
        for handle in self.detached.lock().unwrap().drain(..) {
            handle.abort();
        }
    }
}

/// Counts one thing under way (a drained restart, a client request being
/// served) for as long as it lives.
pub(crate) struct InFlight(Arc<AtomicU64>);

impl InFlight {
    pub(crate) fn enter(counter: &Arc<AtomicU64>) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Self(counter.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A replica whose inbound traffic stopped `waited` ago (the drain before
/// a supervised restart after disk errors) has answered every caller.
pub fn drained(replica: ReplicaId, pending: u64, waited: Duration) -> Result<(), Failure> {
    if pending == 0 {
        return Ok(());
    }
    Err(Failure::new(
        FailureKind::HungCallers,
        format!("replica-{replica} still has {pending} writes pending {waited:?} after its inbound traffic stopped (disk errors before)"),
    ))
}

/// No tree of `replica` holds fewer ops after a restart (`cause`) than
/// before it.
pub fn kept_across_restart(
    replica: ReplicaId,
    before: &Heights,
    after: &Heights,
    cause: &str,
) -> Result<(), Failure> {
    for (tree, &height) in before {
        let now = after.get(tree).copied().unwrap_or(0);
        if now < height {
            return Err(Failure::new(
                FailureKind::LostWrite,
                format!(
                    "replica-{replica} {:?}/{} stored {height} ops before a {cause}, {now} after",
                    tree.cid, tree.tree
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbor::{ContainerId, TreeKey};

    /// A tree that lost ops across a restart fails; one that gained or
    /// kept them does not.
    #[test]
    fn a_restart_may_not_lose_stored_ops() {
        let tree = |name: &str| TreeKey::new(ContainerId([3; 32]), name);
        let before = Heights::from([(tree("a"), 5), (tree("b"), 2)]);
        let grown = Heights::from([(tree("a"), 7), (tree("b"), 2)]);
        assert_eq!(kept_across_restart(1, &before, &grown, "crash"), Ok(()));
        let shrunk = Heights::from([(tree("a"), 5)]);
        let lost = kept_across_restart(1, &before, &shrunk, "crash").unwrap_err();
        assert_eq!(lost.kind, FailureKind::LostWrite);
        assert!(
            lost.detail.contains("stored 2 ops before a crash, 0 after"),
            "{lost}"
        );
    }
}
