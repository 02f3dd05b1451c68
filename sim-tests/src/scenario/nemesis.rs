//! The nemesis: injects the seed's faults while the workload runs, and
//! sweeps the tree invariant over every live replica between faults.
//! Crashes and restarts go through the supervisor, which owns them.

use super::checkers::invariants::{InvariantSweep, Sweep};
use super::swarm::Swarm;
use super::workload::Workload;
use crate::world::clock::global_now;
use crate::world::supervisor::Supervisor;
use crate::world::transport::RequestKind;
use crate::world::World;
use arbor::ReplicaId;
use madsim::net::NetSim;
use madsim::rand::{seq::SliceRandom, thread_rng, Rng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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
    supervisor: Arc<Supervisor>,
    workload: Arc<Workload>,
    swarm: Swarm,
    faults_injected: AtomicU64,
    /// The periodic sweeps of the tree invariant between faults.
    sweeps: InvariantSweep,
}

fn window() -> Duration {
    Duration::from_millis(thread_rng().gen_range(100..=WINDOW_MAX.as_millis() as u64))
}

impl Nemesis {
    pub fn new(supervisor: Arc<Supervisor>, workload: Arc<Workload>, swarm: Swarm) -> Arc<Self> {
        Arc::new(Self {
            supervisor,
            workload,
            swarm,
            faults_injected: AtomicU64::new(0),
            sweeps: InvariantSweep::default(),
        })
    }

    fn world(&self) -> &World {
        self.supervisor.world()
    }

    /// Faults started so far.
    pub fn faults_injected(&self) -> u64 {
        self.faults_injected.load(Ordering::Relaxed)
    }

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
                if let Err(failure) = self.sweeps.check(self.world(), Sweep::SkipUnchanged) {
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
        let mut ids = self.world().replica_ids();
        ids.shuffle(&mut thread_rng());
        (ids[0], ids[1])
    }

    fn note(&self, what: String) {
        self.world().trace.record("nemesis", what);
    }

    /// Starts one fault and a task that heals it after its window.
    fn strike(self: Arc<Self>, fault: Fault) {
        let window = window();
        match fault {
            Fault::Partition => self.partition(window),
            Fault::OneWay => self.one_way(window),
            Fault::PacketLoss => self.packet_loss(window),
            Fault::LatencySpike => self.latency_spike(window),
            Fault::Crash => self.crash(),
            Fault::DiskErrors => self.disk_errors(window),
            Fault::PushBlackout => self.push_blackout(window),
        }
    }

    fn one_way(self: Arc<Self>, window: Duration) {
        let (from, to) = self.random_pair();
        self.note(format!(
            "clog replica-{from} -> replica-{to} for {window:?}"
        ));
        self.world().clog_one_way(from, to);
        self.later(window, move |n| {
            n.note(format!("unclog replica-{from} -> replica-{to}"));
            n.world().unclog_one_way(from, to);
        });
    }

    fn packet_loss(self: Arc<Self>, window: Duration) {
        let rate = self.swarm.packet_loss_rate;
        self.note(format!("packet loss {rate} for {window:?}"));
        NetSim::current().update_config(|c| c.packet_loss_rate = rate);
        self.later(window, |n| {
            n.note("packet loss off".into());
            n.world().restore_packet_loss();
        });
    }

    fn latency_spike(self: Arc<Self>, window: Duration) {
        let high_ms = thread_rng().gen_range(50..=1_500);
        self.note(format!("latency 1..{high_ms}ms for {window:?}"));
        NetSim::current().update_config(|c| {
            c.send_latency = Duration::from_millis(1)..Duration::from_millis(high_ms)
        });
        self.later(window, |n| {
            n.note("latency normal".into());
            n.world().restore_latency();
        });
    }

    /// Disk errors on one replica for `window`; after it the supervisor
    /// drains and restarts the replica (redb refuses every write after an
    /// I/O error until the database is reopened).
    fn disk_errors(self: Arc<Self>, window: Duration) {
        let index = thread_rng().gen_range(0..self.world().nodes.len());
        let replica = self.world().nodes[index].replica_id;
        let faults = self.swarm.disk_faults;
        self.note(format!("disk errors on replica-{replica} for {window:?}"));
        self.supervisor.begin_disk_errors(
            replica,
            faults.write_error_probability,
            faults.sync_error_probability,
        );
        self.sweeps.forget(replica);
        self.later(window, move |n| {
            n.note(format!("disk errors off on replica-{replica}"));
            n.sweeps.forget(replica);
            n.supervisor.end_disk_errors(replica);
        });
    }

    fn push_blackout(self: Arc<Self>, window: Duration) {
        let (from, to) = self.random_pair();
        self.note(format!(
            "drop pushes replica-{from} -> replica-{to} for {window:?}"
        ));
        self.world().filter.block(from, to, RequestKind::Push);
        let coverage = &self.world().hooks.coverage;
        coverage.hit(crate::scenario::coverage::Coverage::PushBlackout);
        self.later(window, move |n| {
            n.note(format!("pushes replica-{from} -> replica-{to} flow again"));
            n.world().filter.unblock(from, to, RequestKind::Push);
        });
    }

    /// Cuts every replica off from every other for `window` (clients still
    /// reach them), healed link by link in shuffled order.
    pub fn opening_partition(self: Arc<Self>, window: Duration) {
        let ids = self.world().replica_ids();
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
        let ids = self.world().replica_ids();
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
            self.world().clog_one_way(from, to);
        }
        let nemesis = self.clone();
        self.supervisor.detach(async move {
            madsim::time::sleep(window).await;
            links.shuffle(&mut thread_rng());
            for (from, to) in links {
                nemesis.note(format!("unclog replica-{from} -> replica-{to}"));
                nemesis.world().unclog_one_way(from, to);
                let gap = thread_rng().gen_range(0..200);
                madsim::time::sleep(Duration::from_millis(gap)).await;
            }
        });
    }

    /// Crashes a live replica the supervisor is not restarting, for a
    /// downtime of up to `DOWNTIME_MAX`.
    fn crash(self: Arc<Self>) {
        let world = self.world();
        let up: Vec<ReplicaId> = world
            .replica_ids()
            .into_iter()
            .filter(|&r| world.is_up(r) && !self.supervisor.is_supervised(r))
            .collect();
        let Some(&victim) = up.choose(&mut thread_rng()) else {
            return;
        };
        let downtime =
            Duration::from_millis(thread_rng().gen_range(10..=DOWNTIME_MAX.as_millis() as u64));
        self.note(format!("crash replica-{victim} for {downtime:?}"));
        self.supervisor.crash_for(victim, downtime);
    }

    /// Runs `heal` after `delay`, unless the run healed first.
    fn later(self: Arc<Self>, delay: Duration, heal: impl FnOnce(&Arc<Nemesis>) + Send + 'static) {
        let nemesis = self.clone();
        self.supervisor.detach(async move {
            madsim::time::sleep(delay).await;
            if !nemesis.supervisor.healing() {
                heal(&nemesis);
            }
        });
    }
}
