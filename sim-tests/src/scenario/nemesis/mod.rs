//! The nemesis: strikes the plan's faults at their times while the
//! workload runs, and sweeps the tree invariant over every live replica
//! every few seconds. Crashes and restarts go through the supervisor,
//! which owns them. Nothing here draws at random: the plan holds every
//! choice (`scenario::plan`).
//!
//! The disruptions with more to them each have a module: `members`
//! (a replica joins or leaves a container), `replace` (a disk destroyed,
//! its node rejoining on an empty one) and `misconfig` (a process claiming
//! another replica's id); `wire` strikes the connections themselves.

pub mod members;
pub mod misconfig;
pub mod replace;
pub mod wire;

use super::check::invariants::{self, InvariantSweep, Sweep};
use super::plan::{FaultKind, Link, PlannedFault};
use super::workload::Workload;
use crate::disk::DiskFaults;
use crate::world::clock::global_now;
use crate::world::supervisor::Supervisor;
use crate::world::transport::RequestKind;
use crate::world::{Client, World};
use arbor::config::ContainerConfig;
use arbor::ReplicaId;
use madsim::net::NetSim;
use replace::Destruction;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Simulated time between two invariant sweeps over every replica.
const INVARIANT_SWEEP_INTERVAL: Duration = Duration::from_secs(3);

pub struct Nemesis {
    supervisor: Arc<Supervisor>,
    workload: Arc<Workload>,
    faults: Vec<PlannedFault>,
    /// Fault rates of a disk-error window.
    disk_faults: DiskFaults,
    faults_injected: AtomicU64,
    /// The periodic sweeps of the tree invariant between faults.
    sweeps: InvariantSweep,
    /// The client that writes to a misconfigured replica's stand-in.
    misled: Mutex<Option<Arc<Client>>>,
}

impl Nemesis {
    pub fn new(
        supervisor: Arc<Supervisor>,
        workload: Arc<Workload>,
        faults: Vec<PlannedFault>,
        disk_faults: DiskFaults,
    ) -> Arc<Self> {
        Arc::new(Self {
            supervisor,
            workload,
            faults,
            disk_faults,
            faults_injected: AtomicU64::new(0),
            sweeps: InvariantSweep::default(),
            misled: Mutex::default(),
        })
    }

    /// The client of misconfiguration windows (`scenario::nemesis::misconfig`).
    pub fn set_misled_client(&self, client: Client) {
        *self.misled.lock().unwrap() = Some(Arc::new(client));
    }

    fn world(&self) -> &World {
        self.supervisor.world()
    }

    /// Faults started so far.
    pub fn faults_injected(&self) -> u64 {
        self.faults_injected.load(Ordering::Relaxed)
    }

    /// Strikes the plan's faults (times count from `start`) and sweeps the
    /// invariant until `deadline`; every fault heals itself after its
    /// window. Stops striking once the run has failed.
    pub async fn run(self: Arc<Self>, start: Duration, deadline: Duration) {
        let strikes = async {
            for fault in &self.faults {
                let at = start + Duration::from_millis(fault.at_ms);
                if at >= deadline {
                    break;
                }
                sleep_until(at).await;
                if self.workload.verdict.failed() {
                    break;
                }
                self.faults_injected.fetch_add(1, Ordering::Relaxed);
                self.clone().strike(fault.clone());
            }
        };
        futures::join!(strikes, self.sweep_until(deadline));
    }

    /// Full sweeps cost a pass over every tree; the acking replica is
    /// checked after every write anyway.
    async fn sweep_until(&self, deadline: Duration) {
        loop {
            madsim::time::sleep(INVARIANT_SWEEP_INTERVAL).await;
            if global_now() >= deadline || self.workload.verdict.failed() {
                return;
            }
            if let Err(failure) = self.sweeps.check(self.world(), Sweep::SkipUnchanged) {
                self.workload.verdict.fail(failure);
            }
        }
    }

    fn note(&self, what: String) {
        self.world().trace.record("nemesis", what);
    }

    /// Starts one fault and a task that heals it after its window.
    fn strike(self: Arc<Self>, fault: PlannedFault) {
        let window = Duration::from_millis(fault.window_ms);
        match fault.kind {
            FaultKind::Cut { links } => self.cut(links, window),
            FaultKind::OneWay { from, to } => self.one_way(from, to, window),
            FaultKind::PacketLoss { rate } => self.packet_loss(rate, window),
            FaultKind::LatencySpike { high_ms } => self.latency_spike(high_ms, window),
            FaultKind::Crash { replica } => self.crash(replica, window),
            FaultKind::DiskErrors { replica } => self.disk_errors(replica, window),
            FaultKind::PushBlackout { from, to } => self.push_blackout(from, to, window),
            FaultKind::ReplaceDisk { replica } => self.replace_disk(replica, window),
            FaultKind::Misconfig { replica, claims } => self.misconfig(replica, claims, window),
        }
    }

    /// A stand-in claiming `claims`'s id on `replica`'s machine for
    /// `window`, the replica again after it (`scenario::nemesis::misconfig`).
    fn misconfig(self: Arc<Self>, replica: ReplicaId, claims: ReplicaId, window: Duration) {
        let Some(client) = self.misled.lock().unwrap().clone() else {
            self.note(format!(
                "misconfig of replica-{replica} skipped: no misled client"
            ));
            return;
        };
        self.note(format!(
            "replica-{replica}'s machine runs a process claiming replica-{claims} for {window:?}"
        ));
        self.sweeps.forget(replica);
        let run = misconfig::Window {
            supervisor: self.supervisor.clone(),
            workload: self.workload.clone(),
            client,
            replica,
            claims,
            window,
        };
        self.supervisor.detach(run.run());
    }

    fn one_way(self: Arc<Self>, from: ReplicaId, to: ReplicaId, window: Duration) {
        self.note(format!(
            "clog replica-{from} -> replica-{to} for {window:?}"
        ));
        self.world().clog_one_way(from, to);
        self.later(window, move |n| {
            n.note(format!("unclog replica-{from} -> replica-{to}"));
            n.world().unclog_one_way(from, to);
        });
    }

    fn packet_loss(self: Arc<Self>, rate: f64, window: Duration) {
        self.note(format!("packet loss {rate} for {window:?}"));
        NetSim::current().update_config(|c| c.packet_loss_rate = rate);
        self.later(window, |n| {
            n.note("packet loss off".into());
            n.world().restore_packet_loss();
        });
    }

    fn latency_spike(self: Arc<Self>, high_ms: u64, window: Duration) {
        self.note(format!("latency 1..{high_ms}ms for {window:?}"));
        NetSim::current().update_config(|c| {
            c.send_latency = Duration::from_millis(1)..Duration::from_millis(high_ms.max(2))
        });
        self.later(window, |n| {
            n.note("latency normal".into());
            n.world().restore_latency();
        });
    }

    /// Disk errors on one replica for `window`; after it the supervisor
    /// drains and restarts the replica (redb refuses every write after an
    /// I/O error until the database is reopened).
    fn disk_errors(self: Arc<Self>, replica: ReplicaId, window: Duration) {
        if self.supervisor.has_stand_in(replica) {
            self.note(format!(
                "disk errors on replica-{replica} skipped: a stand-in runs"
            ));
            return;
        }
        let faults = self.disk_faults;
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

    fn push_blackout(self: Arc<Self>, from: ReplicaId, to: ReplicaId, window: Duration) {
        self.note(format!(
            "drop pushes replica-{from} -> replica-{to} for {window:?}"
        ));
        self.world().filter.block(from, to, RequestKind::Push);
        let coverage = &self.world().hooks.coverage;
        coverage.hit(crate::coverage::Coverage::PushBlackout);
        self.later(window, move |n| {
            n.note(format!("pushes replica-{from} -> replica-{to} flow again"));
            n.world().filter.unblock(from, to, RequestKind::Push);
        });
    }

    /// Blocks every link for `window` (clients still reach the replicas),
    /// then heals them one by one in the plan's order.
    fn cut(self: Arc<Self>, links: Vec<Link>, window: Duration) {
        let pairs: Vec<(ReplicaId, ReplicaId)> = links.iter().map(|l| (l.from, l.to)).collect();
        self.note(format!("partition {pairs:?} for {window:?}"));
        for &(from, to) in &pairs {
            self.world().clog_one_way(from, to);
        }
        let nemesis = self.clone();
        self.supervisor.detach(async move {
            madsim::time::sleep(window).await;
            for link in links {
                let (from, to) = (link.from, link.to);
                nemesis.note(format!("unclog replica-{from} -> replica-{to}"));
                nemesis.world().unclog_one_way(from, to);
                madsim::time::sleep(Duration::from_millis(link.heal_gap_ms)).await;
            }
        });
    }

    /// Crashes `victim` for `downtime`, unless it is down or the supervisor
    /// is restarting it already.
    fn crash(self: Arc<Self>, victim: ReplicaId, downtime: Duration) {
        let world = self.world();
        if !world.is_up(victim) || self.supervisor.is_supervised(victim) {
            self.note(format!("crash of replica-{victim} skipped: not up"));
            return;
        }
        self.note(format!("crash replica-{victim} for {downtime:?}"));
        self.supervisor.crash_for(victim, downtime);
    }

    /// Destroys `victim`'s disk for good and starts it again, empty and
    /// rejoining, after `downtime`. What every replica holds, the victim
    /// included, is captured in the same step, for the at-risk count
    /// (`scenario::nemesis::replace`); so every replica must be up, none being
    /// restarted and none with a failing disk, or the fault is skipped.
    fn replace_disk(self: Arc<Self>, victim: ReplicaId, downtime: Duration) {
        let world = self.world();
        let ids = world.replica_ids();
        let busy = ids.iter().any(|&r| {
            !world.is_up(r)
                || world.node(r).is_stand_in()
                || self.supervisor.is_supervised(r)
                || self.supervisor.is_poisoned(r)
        });
        let captured = if busy {
            None
        } else {
            invariants::capture(world).ok()
        };
        let Some(held) = captured else {
            self.note(format!(
                "disk replacement of replica-{victim} skipped: not all up"
            ));
            return;
        };
        self.note(format!(
            "destroy the disk of replica-{victim}, replace it after {downtime:?}"
        ));
        let disk = world.disk_generation(victim);
        let mut ledger = self.workload.ledger.lock().unwrap();
        let drops_answered = ledger.drops.answered.clone();
        let drops_sent = ledger.drops.sent.clone();
        let members = (world.view().into_iter())
            .map(|container| (container.cid, container.replicas))
            .collect();
        ledger.replaced.destroyed.push(Destruction {
            replica: victim,
            disk,
            held,
            drops_answered,
            drops_sent,
            members,
        });
        drop(ledger);
        let containers = replicated_containers(world, victim);
        self.sweeps.forget(victim);
        self.supervisor
            .replace_disk_for(victim, downtime, containers);
        let coverage = &self.world().hooks.coverage;
        coverage.hit(crate::coverage::Coverage::DiskReplaced);
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

/// The workload's containers that `replica` holds, with their replica
/// sets: what a rejoining node lists, as an operator's network map would.
fn replicated_containers(world: &World, replica: ReplicaId) -> Vec<ContainerConfig> {
    let view = world.view();
    super::workload::containers()
        .into_iter()
        .map(|cid| match view.iter().find(|c| c.cid == cid) {
            Some(container) => container.clone(),
            None => ContainerConfig::new(cid, world.replica_ids()),
        })
        .filter(|c| c.replicas.contains(&replica))
        .collect()
}

async fn sleep_until(at: Duration) {
    let now = global_now();
    if at > now {
        madsim::time::sleep(at - now).await;
    }
}
