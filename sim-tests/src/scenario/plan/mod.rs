//! The plan of one run: the drawn configuration, the fault schedule and
//! each client's op stream, drawn from the seed before the run starts by a
//! generator of their own. The run reads the plan instead of drawing its
//! faults and ops as it goes, so a plan written to a capsule replays
//! exactly, and a plan edited by hand (a fault dropped, a client dropped,
//! one client's ops cut) still replays: the other faults keep their times
//! and the other clients their ops.
//!
//! `swarm` draws the configuration and the fault mix the plan starts from.

pub mod swarm;

use super::nemesis::members::{self, PlannedChange};
use crate::disk::SplitMix64;
use arbor::ReplicaId;
use madsim::rand::RngCore;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::future::Future;
use swarm::{FaultMix, Swarm};

/// Longest fault window and longest crash downtime.
pub const WINDOW_MS_MAX: u64 = 6_000;
pub const DOWNTIME_MS_MAX: u64 = 4_000;
/// Shortest downtime of a replaced node: longer than any message's flight
/// (latency spikes reach 1.5 s), so no answer of the destroyed disk's
/// process arrives once the new one runs (`scenario::nemesis::replace`).
pub const REPLACE_DOWNTIME_MS_MIN: u64 = 2_000;
/// Longest pause between healing two links of a partition.
const HEAL_GAP_MS_MAX: u64 = 200;
/// Most faults a plan holds: a capsule edited by hand is input.
pub const FAULTS_MAX: usize = 10_000;
/// Most replicas a plan holds.
pub const REPLICAS_MAX: usize = 7;
/// Most clients a plan holds.
pub const CLIENTS_MAX: usize = 64;
/// Most ops one client issues after its opening burst.
pub const CLIENT_OPS_MAX: u64 = 1_000_000;

/// One directed link that a cut blocks, and the pause after healing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub from: ReplicaId,
    pub to: ReplicaId,
    pub heal_gap_ms: u64,
}

/// What a fault does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum FaultKind {
    /// Blocks every listed link (a partition of a pair, one replica cut off,
    /// or every replica cut off at the start); healed link by link in order.
    Cut { links: Vec<Link> },
    /// Blocks one direction of one link.
    OneWay { from: ReplicaId, to: ReplicaId },
    /// Drops this share of every message.
    PacketLoss { rate: f64 },
    /// Message latency up to `high_ms`.
    LatencySpike { high_ms: u64 },
    /// A power failure of `replica` for the fault's window (skipped when
    /// the replica is down or being restarted at the time).
    Crash { replica: ReplicaId },
    /// The disk of `replica` fails writes and syncs for the window.
    DiskErrors { replica: ReplicaId },
    /// Pushes from `from` to `to` are dropped for the window.
    PushBlackout { from: ReplicaId, to: ReplicaId },
    /// The disk of `replica` is destroyed for good; the node starts again
    /// empty and rejoining after the window (skipped unless every replica
    /// is up and none is being restarted or has a failing disk).
    ReplaceDisk { replica: ReplicaId },
    /// `replica`'s machine runs, for the window, a process configured with
    /// `claims`'s replica id (two nodes with one id), then the replica
    /// again (`scenario::nemesis::misconfig`).
    Misconfig {
        replica: ReplicaId,
        claims: ReplicaId,
    },
}

impl FaultKind {
    /// The replicas the fault names.
    pub fn replicas(&self) -> Vec<ReplicaId> {
        match self {
            FaultKind::Cut { links } => links.iter().flat_map(|l| [l.from, l.to]).collect(),
            FaultKind::OneWay { from, to } | FaultKind::PushBlackout { from, to } => {
                vec![*from, *to]
            }
            FaultKind::Crash { replica }
            | FaultKind::DiskErrors { replica }
            | FaultKind::ReplaceDisk { replica } => vec![*replica],
            FaultKind::PacketLoss { .. } | FaultKind::LatencySpike { .. } => Vec::new(),
            FaultKind::Misconfig { replica, claims } => vec![*replica, *claims],
        }
    }

    /// A short name for reports and the timeline.
    pub fn name(&self) -> &'static str {
        match self {
            FaultKind::Cut { .. } => "partition",
            FaultKind::OneWay { .. } => "one-way",
            FaultKind::PacketLoss { .. } => "packet loss",
            FaultKind::LatencySpike { .. } => "latency",
            FaultKind::Crash { .. } => "crash",
            FaultKind::DiskErrors { .. } => "disk errors",
            FaultKind::PushBlackout { .. } => "push blackout",
            FaultKind::ReplaceDisk { .. } => "disk replaced",
            FaultKind::Misconfig { .. } => "misconfig",
        }
    }
}

/// One fault of the schedule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannedFault {
    /// Simulated time after the workload starts.
    pub at_ms: u64,
    /// How long the fault lasts (a crash: the downtime).
    pub window_ms: u64,
    #[serde(flatten)]
    pub kind: FaultKind,
}

/// One client: its name's number, its op stream and its op budget.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientPlan {
    /// The client is `client-{index}`; its opening burst picks its home
    /// replica from the index.
    pub index: usize,
    /// Seed of the client's own stream: every choice the client makes
    /// (think time, op, tree, replica, node) comes from it.
    pub stream: u64,
    /// Ops after the opening burst.
    pub ops: u64,
    /// Ops (by index, from 0) the client leaves out: it still draws their
    /// streams and waits their think time, so its other ops stay as they
    /// were. Shrinking fills it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skip: Vec<u64>,
}

impl ClientPlan {
    /// Ops the client issues after its opening burst.
    pub fn ops_issued(&self) -> u64 {
        let skipped = self.skip.iter().filter(|&&i| i < self.ops).count() as u64;
        self.ops - skipped
    }
}

/// Everything a run reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub swarm: Swarm,
    /// In order of `at_ms`.
    pub faults: Vec<PlannedFault>,
    pub clients: Vec<ClientPlan>,
    /// Replica sets changed mid-run (`members`), in time order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<PlannedChange>,
}

impl Plan {
    /// Client ops the plan issues after the opening bursts (what a shrunk
    /// plan left of them).
    pub fn ops_planned(&self) -> u64 {
        self.clients.iter().map(ClientPlan::ops_issued).sum()
    }
}

/// Why a plan cannot run.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("{what} {count} over the limit {limit}")]
    TooMany {
        what: &'static str,
        count: u64,
        limit: u64,
    },
    #[error("fault {index} names replica {replica}; the plan has {replicas}")]
    UnknownReplica {
        index: usize,
        replica: ReplicaId,
        replicas: usize,
    },
    #[error("faults out of time order at fault {index}")]
    Unordered { index: usize },
    #[error("{what} must be at least {min}")]
    TooFew { what: &'static str, min: u64 },
    #[error("client index {index} appears twice or is 0")]
    BadClient { index: usize },
    #[error("the plan has {skews} clock skews for {replicas} replicas")]
    Skews { skews: usize, replicas: usize },
    #[error("membership change {index} {why}")]
    BadChange { index: usize, why: &'static str },
}

fn range(rng: &mut SplitMix64, low: u64, high_inclusive: u64) -> u64 {
    low + rng.next_u64() % (high_inclusive - low + 1)
}

impl Plan {
    /// The plan of `swarm`'s seed. Pure: draws only from its own stream.
    pub fn draw(swarm: Swarm) -> Plan {
        let mut rng = SplitMix64::new(swarm.seed ^ 0x504c_414e_0000_0000);
        let ids: Vec<ReplicaId> = (1..=swarm.replicas as ReplicaId).collect();
        let mut faults = Vec::new();
        if let Some(window) = swarm.opening_partition {
            let links = all_links(&ids, &mut rng);
            faults.push(PlannedFault {
                at_ms: 0,
                window_ms: window.as_millis() as u64,
                kind: FaultKind::Cut { links },
            });
        }
        draw_faults(&swarm, &ids, &mut rng, &mut faults);
        let clients = (1..=swarm.size.clients)
            .map(|index| ClientPlan {
                index,
                stream: rng.next_u64(),
                ops: swarm.size.ops_total / swarm.size.clients as u64,
                skip: Vec::new(),
            })
            .collect();
        let changes = members::draw(&swarm);
        Plan {
            swarm,
            faults,
            clients,
            changes,
        }
    }

    /// Client ops the plan asks for (after the opening bursts).
    pub fn client_ops(&self) -> u64 {
        self.clients.iter().map(ClientPlan::ops_issued).sum()
    }

    /// Checks what a hand-edited capsule could get wrong.
    pub fn validate(&self) -> Result<(), PlanError> {
        let too_many = |what, count: usize, limit: usize| {
            (count > limit).then_some(PlanError::TooMany {
                what,
                count: count as u64,
                limit: limit as u64,
            })
        };
        if let Some(e) = too_many("faults", self.faults.len(), FAULTS_MAX).or(too_many(
            "clients",
            self.clients.len(),
            CLIENTS_MAX,
        )) {
            return Err(e);
        }
        let replicas = self.swarm.replicas;
        if let Some(e) = too_many("replicas", replicas, REPLICAS_MAX) {
            return Err(e);
        }
        if replicas < 2 {
            return Err(PlanError::TooFew {
                what: "replicas",
                min: 2,
            });
        }
        if self.swarm.skews.len() != replicas {
            return Err(PlanError::Skews {
                skews: self.swarm.skews.len(),
                replicas,
            });
        }
        self.validate_faults()?;
        self.validate_clients()?;
        members::validate(&self.swarm, &self.changes)
    }

    fn validate_faults(&self) -> Result<(), PlanError> {
        let replicas = self.swarm.replicas;
        let mut at_ms = 0;
        for (index, fault) in self.faults.iter().enumerate() {
            if fault.at_ms < at_ms {
                return Err(PlanError::Unordered { index });
            }
            at_ms = fault.at_ms;
            let unknown = fault
                .kind
                .replicas()
                .into_iter()
                .find(|&r| r == 0 || r as usize > replicas);
            if let Some(replica) = unknown {
                return Err(PlanError::UnknownReplica {
                    index,
                    replica,
                    replicas,
                });
            }
        }
        Ok(())
    }

    fn validate_clients(&self) -> Result<(), PlanError> {
        let mut seen = std::collections::BTreeSet::new();
        for client in &self.clients {
            if client.index == 0 || client.index > CLIENTS_MAX || !seen.insert(client.index) {
                return Err(PlanError::BadClient {
                    index: client.index,
                });
            }
            if client.ops > CLIENT_OPS_MAX || client.skip.len() as u64 > CLIENT_OPS_MAX {
                return Err(PlanError::TooMany {
                    what: "client ops",
                    count: client.ops.max(client.skip.len() as u64),
                    limit: CLIENT_OPS_MAX,
                });
            }
        }
        Ok(())
    }

    /// The plan with `replicas` replicas: faults naming a replica beyond
    /// them are dropped, and so are the extra clocks.
    pub fn with_replicas(&self, replicas: usize) -> Plan {
        let mut plan = self.clone();
        plan.swarm.replicas = replicas;
        plan.swarm.skews.truncate(replicas);
        plan.faults
            .retain(|f| f.kind.replicas().iter().all(|&r| r as usize <= replicas));
        if members::validate(&plan.swarm, &plan.changes).is_err() {
            plan.changes.clear();
        }
        plan
    }
}

/// Every directed link between `ids`, in a drawn healing order.
fn all_links(ids: &[ReplicaId], rng: &mut SplitMix64) -> Vec<Link> {
    let pairs: Vec<(ReplicaId, ReplicaId)> = ids
        .iter()
        .flat_map(|&a| ids.iter().filter(move |&&b| b != a).map(move |&b| (a, b)))
        .collect();
    healing_order(pairs, rng)
}

/// `pairs` as links in a drawn healing order, each with its pause.
fn healing_order(mut pairs: Vec<(ReplicaId, ReplicaId)>, rng: &mut SplitMix64) -> Vec<Link> {
    shuffle(&mut pairs, rng);
    pairs
        .into_iter()
        .map(|(from, to)| Link {
            from,
            to,
            heal_gap_ms: range(rng, 0, HEAL_GAP_MS_MAX - 1),
        })
        .collect()
}

fn shuffle<T>(items: &mut [T], rng: &mut SplitMix64) {
    for i in (1..items.len()).rev() {
        let j = range(rng, 0, i as u64) as usize;
        items.swap(i, j);
    }
}

/// Faults at drawn gaps over the workload's duration.
fn draw_faults(
    swarm: &Swarm,
    ids: &[ReplicaId],
    rng: &mut SplitMix64,
    faults: &mut Vec<PlannedFault>,
) {
    let gap_mean_ms = swarm.fault_gap_mean.as_millis() as u64;
    let end_ms = swarm.size.workload_duration.as_millis() as u64;
    let mut at_ms = 0;
    while faults.len() < FAULTS_MAX {
        at_ms += range(rng, 1, 2 * gap_mean_ms.max(1));
        if at_ms >= end_ms {
            return;
        }
        let Some(kind) = choose(&swarm.faults, ids, swarm.packet_loss_rate, rng) else {
            return;
        };
        let window_ms = match kind {
            FaultKind::Crash { .. } => range(rng, 10, DOWNTIME_MS_MAX),
            FaultKind::ReplaceDisk { .. } => range(rng, REPLACE_DOWNTIME_MS_MIN, DOWNTIME_MS_MAX),
            _ => range(rng, 100, WINDOW_MS_MAX),
        };
        faults.push(PlannedFault {
            at_ms,
            window_ms,
            kind,
        });
    }
}

fn choose(
    mix: &FaultMix,
    ids: &[ReplicaId],
    loss_rate: f64,
    rng: &mut SplitMix64,
) -> Option<FaultKind> {
    let weights = [
        mix.partition,
        mix.one_way,
        mix.packet_loss,
        mix.latency_spike,
        mix.crash,
        mix.disk_errors,
        mix.push_blackout,
        mix.replace_disk,
        mix.misconfig,
    ];
    let total: f64 = weights.iter().sum();
    if total <= 0.0 {
        return None;
    }
    let mut roll = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
    // The last fault before node replacement and misconfiguration came
    // in stays the fallback of a seed without them, so that its plan is
    // as it was.
    let mut chosen = if mix.misconfig > 0.0 {
        8
    } else if mix.replace_disk > 0.0 {
        7
    } else {
        6
    };
    for (i, w) in weights.iter().enumerate() {
        if roll < *w {
            chosen = i;
            break;
        }
        roll -= w;
    }
    let one = |rng: &mut SplitMix64| ids[range(rng, 0, ids.len() as u64 - 1) as usize];
    let pair = |rng: &mut SplitMix64| {
        let a = range(rng, 0, ids.len() as u64 - 1) as usize;
        let b = (a + 1 + range(rng, 0, ids.len() as u64 - 2) as usize) % ids.len();
        (ids[a], ids[b])
    };
    Some(match chosen {
        0 => FaultKind::Cut {
            links: partition_links(ids, rng),
        },
        1 => {
            let (from, to) = pair(rng);
            FaultKind::OneWay { from, to }
        }
        2 => FaultKind::PacketLoss { rate: loss_rate },
        3 => FaultKind::LatencySpike {
            high_ms: range(rng, 50, 1_500),
        },
        4 => FaultKind::Crash { replica: one(rng) },
        5 => FaultKind::DiskErrors { replica: one(rng) },
        7 => FaultKind::ReplaceDisk { replica: one(rng) },
        6 => {
            let (from, to) = pair(rng);
            FaultKind::PushBlackout { from, to }
        }
        _ => {
            let (replica, claims) = pair(rng);
            FaultKind::Misconfig { replica, claims }
        }
    })
}

/// A symmetric partition of one pair, or one replica cut off from all
/// others.
fn partition_links(ids: &[ReplicaId], rng: &mut SplitMix64) -> Vec<Link> {
    let lonely = ids[range(rng, 0, ids.len() as u64 - 1) as usize];
    let others: Vec<ReplicaId> = if rng.chance(0.5) {
        let rest: Vec<ReplicaId> = ids.iter().copied().filter(|&r| r != lonely).collect();
        vec![rest[range(rng, 0, rest.len() as u64 - 1) as usize]]
    } else {
        ids.iter().copied().filter(|&r| r != lonely).collect()
    };
    let pairs: Vec<(ReplicaId, ReplicaId)> = others
        .iter()
        .flat_map(|&o| [(lonely, o), (o, lonely)])
        .collect();
    healing_order(pairs, rng)
}

/// A client's streams: one seed per op drawn from `base`, so that the
/// k-th op of a client makes the same choices whatever the ops before it
/// drew (an op that found no node to move draws less than one that did).
struct ClientStreams {
    base: SplitMix64,
    op: SplitMix64,
    /// Ops begun so far.
    begun: u64,
    skip: std::collections::BTreeSet<u64>,
}

tokio::task_local! {
    /// The streams of the client whose task is running.
    static CLIENT_STREAMS: RefCell<ClientStreams>;
}

/// Runs `client` with its own op stream: `client_rng()` inside it draws
/// from `stream` only, whatever other clients and faults do meanwhile.
pub fn with_client_stream<F: Future>(
    plan: &ClientPlan,
    client: F,
) -> impl Future<Output = F::Output> {
    let streams = ClientStreams {
        base: SplitMix64::new(plan.stream),
        op: SplitMix64::new(!plan.stream),
        begun: 0,
        skip: plan.skip.iter().copied().collect(),
    };
    CLIENT_STREAMS.scope(RefCell::new(streams), client)
}

/// Starts the running client's next op on a fresh stream of its own.
pub fn begin_op() {
    CLIENT_STREAMS.with(|streams| {
        let mut streams = streams.borrow_mut();
        let seed = streams.base.next_u64();
        streams.op = SplitMix64::new(seed);
        streams.begun += 1;
    });
}

/// True when the plan leaves out the op the running client just began.
pub fn op_skipped() -> bool {
    CLIENT_STREAMS.with(|streams| {
        let streams = streams.borrow();
        streams.begun > 0 && streams.skip.contains(&(streams.begun - 1))
    })
}

/// The running client's op stream. Used outside a client task it panics:
/// a draw from nowhere would make the run depend on who else drew.
pub fn client_rng() -> ClientRng {
    ClientRng
}

/// A handle on the running client's op stream.
pub struct ClientRng;

impl RngCore for ClientRng {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    fn next_u64(&mut self) -> u64 {
        CLIENT_STREAMS.with(|streams| streams.borrow_mut().op.next_u64())
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), madsim::rand::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::plan::swarm::{Profile, Size};

    fn plan(seed: u64) -> Plan {
        Plan::draw(Swarm::draw(seed, Profile::Standard, Size::TEST, true))
    }

    /// The same seed draws the same plan; plans name only their replicas.
    #[test]
    fn plans_are_pure_and_valid() {
        for seed in 1..50 {
            let a = plan(seed);
            assert_eq!(a, plan(seed));
            assert_eq!(a.validate(), Ok(()));
            assert_eq!(a.clients.len(), Size::TEST.clients);
        }
        let faults: usize = (1..50).map(|s| plan(s).faults.len()).sum();
        assert!(faults > 0, "no seed drew a fault");
    }

    /// A plan survives JSON unchanged.
    #[test]
    fn plans_round_trip_through_json() {
        let a = plan(7);
        let json = serde_json::to_string(&a).unwrap();
        let b: Plan = serde_json::from_str(&json).unwrap();
        assert_eq!(a, b);
    }

    /// Edits a hand could make are caught before the run.
    #[test]
    fn bad_edits_are_typed_errors() {
        let mut a = plan(3);
        a.faults.push(PlannedFault {
            at_ms: u64::MAX,
            window_ms: 1,
            kind: FaultKind::Crash { replica: 9 },
        });
        assert!(matches!(
            a.validate(),
            Err(PlanError::UnknownReplica { replica: 9, .. })
        ));
        let mut b = plan(3);
        b.clients.push(b.clients[0].clone());
        assert!(matches!(b.validate(), Err(PlanError::BadClient { .. })));
        let c = plan(3).with_replicas(2);
        assert_eq!(c.validate(), Ok(()));
    }
}
