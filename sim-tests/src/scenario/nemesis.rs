//! The nemesis: injects the seed's faults while the workload runs, and
//! sweeps the tree invariant over every live replica between faults.

use super::checkers::invariants::{InvariantSweep, Sweep};
use super::checkers::{durability, liveness};
use super::swarm::Swarm;
use super::workload::Workload;
use crate::disk::{DiskFaults, SimDisk};
use crate::world::clock::global_now;
use crate::world::transport::RequestKind;
use crate::world::{Heights, World};
use arbor::ReplicaId;
use madsim::net::NetSim;
use madsim::rand::{seq::SliceRandom, thread_rng, Rng};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Longest fault window and longest crash downtime.
const WINDOW_MAX: Duration = Duration::from_secs(6);
const DOWNTIME_MAX: Duration = Duration::from_secs(4);
/// Simulated time between two invariant sweeps over every replica.
const INVARIANT_SWEEP_INTERVAL: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Partition,
    OneWay,
    PacketLoss,
    LatencySpike,
    Crash,
    DiskErrors,
    PushBlackout,
}

pub struct Nemesis {
    pub world: Arc<World>,
    pub workload: Arc<Workload>,
    pub swarm: Swarm,
    pub disks: Vec<SimDisk>,
    pub faults_injected: Arc<AtomicU64>,
    /// Replicas the supervisor is draining and restarting; no other fault
    /// touches them meanwhile.
    pub supervised: Mutex<BTreeSet<ReplicaId>>,
    /// Set when the cluster is healed for the final checks: faults still
    /// scheduled to end by then do nothing (healing already ended them).
    pub stopped: std::sync::atomic::AtomicBool,
    /// The periodic sweeps of the tree invariant between faults.
    pub sweeps: InvariantSweep,
    /// The fault-ending tasks nobody awaits (restarts after a crash, heals
    /// after a window), aborted at the end of the run: madsim does not drop
    /// a pending task when its runtime goes (`World::shut_down`).
    pub detached: Mutex<Vec<madsim::task::AbortHandle>>,
}

fn window() -> Duration {
    Duration::from_millis(thread_rng().gen_range(100..=WINDOW_MAX.as_millis() as u64))
}

impl Nemesis {
    /// Strikes until `deadline`; every fault heals itself after its window.
    pub async fn run(self: Arc<Self>, deadline: Duration) {
        let gap_mean_ms = self.swarm.fault_gap_mean.as_millis() as u64;
        let mut next_sweep = global_now();
        while global_now() < deadline && !self.workload.verdict.failed() {
            let gap = Duration::from_millis(thread_rng().gen_range(1..=2 * gap_mean_ms));
            madsim::time::sleep(gap).await;
            // Full sweeps cost a pass over every tree; the acking replica is
            // checked after every write anyway.
            if global_now() >= next_sweep {
                if let Err(failure) = self.sweeps.check(&self.world, Sweep::SkipUnchanged) {
                    self.workload.verdict.fail(failure);
                }
                next_sweep = global_now() + INVARIANT_SWEEP_INTERVAL;
            }
            if let Some(fault) = self.choose() {
                self.faults_injected.fetch_add(1, Ordering::Relaxed);
                self.clone().strike(fault);
            }
        }
    }

    fn choose(&self) -> Option<Fault> {
        let f = &self.swarm.faults;
        let weighted = [
            (Fault::Partition, f.partition),
            (Fault::OneWay, f.one_way),
            (Fault::PacketLoss, f.packet_loss),
            (Fault::LatencySpike, f.latency_spike),
            (Fault::Crash, f.crash),
            (Fault::DiskErrors, f.disk_errors),
            (Fault::PushBlackout, f.push_blackout),
        ];
        let total: f64 = weighted.iter().map(|(_, w)| w).sum();
        if total <= 0.0 {
            return None;
        }
        let mut roll = thread_rng().gen_range(0.0..total);
        for (fault, w) in weighted {
            if roll < w {
                return Some(fault);
            }
            roll -= w;
        }
        None
    }

    fn random_pair(&self) -> (ReplicaId, ReplicaId) {
        let mut ids = self.world.replica_ids();
        ids.shuffle(&mut thread_rng());
        (ids[0], ids[1])
    }

    fn note(&self, what: String) {
        self.world.trace.record("nemesis", what);
    }

    /// Starts one fault and a task that heals it after its window.
    fn strike(self: Arc<Self>, fault: Fault) {
        let window = window();
        match fault {
            Fault::Partition => self.partition(window),
            Fault::OneWay => {
                let (from, to) = self.random_pair();
                self.note(format!(
                    "clog replica-{from} -> replica-{to} for {window:?}"
                ));
                self.world.clog_one_way(from, to);
                self.later(window, move |n| {
                    n.note(format!("unclog replica-{from} -> replica-{to}"));
                    n.world.unclog_one_way(from, to);
                });
            }
            Fault::PacketLoss => {
                let rate = self.swarm.packet_loss_rate;
                self.note(format!("packet loss {rate} for {window:?}"));
                NetSim::current().update_config(|c| c.packet_loss_rate = rate);
                self.later(window, |n| {
                    n.note("packet loss off".into());
                    NetSim::current().update_config(|c| c.packet_loss_rate = 0.0);
                });
            }
            Fault::LatencySpike => {
                let high_ms = thread_rng().gen_range(50..=1_500);
                self.note(format!("latency 1..{high_ms}ms for {window:?}"));
                NetSim::current().update_config(|c| {
                    c.send_latency = Duration::from_millis(1)..Duration::from_millis(high_ms)
                });
                self.later(window, |n| {
                    n.note("latency normal".into());
                    reset_latency();
                });
            }
            Fault::Crash => self.crash(),
            Fault::DiskErrors => {
                let index = thread_rng().gen_range(0..self.disks.len());
                let faults = DiskFaults {
                    torn_write_probability: self.swarm.torn_write_probability,
                    ..self.swarm.disk_faults
                };
                self.note(format!(
                    "disk errors on replica-{} for {window:?}",
                    index + 1
                ));
                self.disks[index].set_faults(faults);
                self.sweeps.forget(self.world.nodes[index].replica_id);
                self.later(window, move |n| {
                    n.note(format!("disk errors off on replica-{}", index + 1));
                    n.disks[index].set_faults(n.base_disk_faults());
                    n.sweeps.forget(n.world.nodes[index].replica_id);
                    // redb refuses every write after an I/O error until the
                    // database is reopened: the supervisor restarts it.
                    let replica = n.world.nodes[index].replica_id;
                    let fresh = n.supervised.lock().unwrap().insert(replica);
                    if fresh && n.world.is_up(replica) {
                        let nemesis = n.clone();
                        let guard = n.world.maintenance();
                        n.detach(async move {
                            let _guard = guard;
                            let (world, workload) = (&nemesis.world, &nemesis.workload);
                            check_drained(world, workload, replica).await;
                            let before = world.stored_heights(replica);
                            world.restart_process(replica).await;
                            check_nothing_lost(world, workload, replica, before, "process restart")
                                .await;
                            nemesis.supervised.lock().unwrap().remove(&replica);
                        });
                    } else if fresh {
                        n.supervised.lock().unwrap().remove(&replica);
                    }
                });
            }
            Fault::PushBlackout => {
                let (from, to) = self.random_pair();
                self.note(format!(
                    "drop pushes replica-{from} -> replica-{to} for {window:?}"
                ));
                self.world.filter.block(from, to, RequestKind::Push);
                self.later(window, move |n| {
                    n.note(format!("pushes replica-{from} -> replica-{to} flow again"));
                    n.world.filter.unblock(from, to, RequestKind::Push);
                });
            }
        }
    }

    pub fn base_disk_faults(&self) -> DiskFaults {
        DiskFaults {
            torn_write_probability: self.swarm.torn_write_probability,
            ..DiskFaults::default()
        }
    }

    /// Cuts every replica off from every other for `window` (clients still
    /// reach them), healed link by link in shuffled order.
    pub fn opening_partition(self: Arc<Self>, window: Duration) {
        let ids = self.world.replica_ids();
        let links: Vec<(ReplicaId, ReplicaId)> = ids
            .iter()
            .flat_map(|&a| ids.iter().filter(move |&&b| b != a).map(move |&b| (a, b)))
            .collect();
        self.faults_injected.fetch_add(1, Ordering::Relaxed);
        self.cut(links, window);
    }

    /// A symmetric partition of one pair, or one replica cut off from all
    /// others; healed link by link in shuffled order.
    fn partition(self: Arc<Self>, window: Duration) {
        let ids = self.world.replica_ids();
        let mut links = Vec::new();
        if thread_rng().gen_bool(0.5) {
            let (a, b) = self.random_pair();
            links.push((a, b));
            links.push((b, a));
        } else {
            let lonely = ids[thread_rng().gen_range(0..ids.len())];
            for &other in ids.iter().filter(|&&o| o != lonely) {
                links.push((lonely, other));
                links.push((other, lonely));
            }
        }
        self.cut(links, window);
    }

    fn cut(self: Arc<Self>, mut links: Vec<(ReplicaId, ReplicaId)>, window: Duration) {
        self.note(format!("partition {links:?} for {window:?}"));
        for &(from, to) in &links {
            self.world.clog_one_way(from, to);
        }
        let nemesis = self.clone();
        self.detach(async move {
            madsim::time::sleep(window).await;
            links.shuffle(&mut thread_rng());
            for (from, to) in links {
                nemesis.note(format!("unclog replica-{from} -> replica-{to}"));
                nemesis.world.unclog_one_way(from, to);
                let gap = thread_rng().gen_range(0..200);
                madsim::time::sleep(Duration::from_millis(gap)).await;
            }
        });
    }

    fn crash(self: Arc<Self>) {
        let up: Vec<ReplicaId> = self
            .world
            .replica_ids()
            .into_iter()
            .filter(|&r| self.world.is_up(r) && !self.supervised.lock().unwrap().contains(&r))
            .collect();
        let Some(&victim) = up.choose(&mut thread_rng()) else {
            return;
        };
        let downtime =
            Duration::from_millis(thread_rng().gen_range(10..=DOWNTIME_MAX.as_millis() as u64));
        self.note(format!("crash replica-{victim} for {downtime:?}"));
        let before = self.world.stored_heights(victim);
        self.world.crash(victim);
        self.clone().detach(async move {
            madsim::time::sleep(downtime).await;
            if !self.world.is_up(victim) && !self.stopped.load(Ordering::SeqCst) {
                self.world.restart(victim);
                check_nothing_lost(&self.world, &self.workload, victim, before, "power failure")
                    .await;
            }
        });
    }

    /// Runs `task` on its own, to be aborted by `abort_detached`.
    fn detach(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
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

    fn later(self: Arc<Self>, delay: Duration, heal: impl FnOnce(&Arc<Nemesis>) + Send + 'static) {
        self.clone().detach(async move {
            madsim::time::sleep(delay).await;
            if !self.stopped.load(Ordering::SeqCst) {
                heal(&self);
            }
        });
    }
}

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

/// Before the supervisor restarts a replica whose disk failed (which would
/// drop any caller it left hanging), its inbound traffic stops for a moment
/// and every caller must have had its answer by then.
async fn check_drained(world: &World, workload: &Workload, replica: ReplicaId) {
    let net = NetSim::current();
    let id = world.node(replica).madsim_id();
    net.clog_node_in(id);
    madsim::time::sleep(DRAIN_WINDOW).await;
    let pending = || {
        world
            .node(replica)
            .service()
            .map_or(0, |service| service.stats().pending_writes)
    };
    let grace_polls = LATE_ARRIVAL_GRACE.as_millis() / DRAIN_POLL.as_millis();
    for _ in 0..grace_polls {
        if pending() == 0 {
            break;
        }
        madsim::time::sleep(DRAIN_POLL).await;
    }
    net.unclog_node_in(id);
    let waited = DRAIN_WINDOW + LATE_ARRIVAL_GRACE;
    if let Err(failure) = liveness::drained(replica, pending(), waited) {
        workload.verdict.fail(failure);
    }
}

/// Every commit is durable (`Durability::Immediate`), so what a replica
/// had stored before a crash or restart must still be there after it.
async fn check_nothing_lost(
    world: &World,
    workload: &Workload,
    replica: ReplicaId,
    before: Option<Heights>,
    what: &str,
) {
    let Some(before) = before else { return };
    if !world.wait_up(replica, Duration::from_secs(10)).await {
        return;
    }
    let Some(after) = world.stored_heights(replica) else {
        return;
    };
    if let Err(failure) = durability::kept_across_restart(replica, &before, &after, what) {
        workload.verdict.fail(failure);
    }
}

pub fn reset_latency() {
    NetSim::current()
        .update_config(|c| c.send_latency = Duration::from_millis(1)..Duration::from_millis(10));
}
