//! Faults of the connections themselves, through which the nodes talk
//! (the engine's own stack, `Network::Tcp` or `Network::Tls`).
//!
//! A run draws, from its seed alone, connection limits small enough
//! to bind (`WireKnobs`: a node's connection slots, the idle timeout) and a
//! list of connection faults, each against one replica's machine:
//! - a reset of every connection it has, in whatever state its frames are;
//! - a reset on answer: its accepted connections take their next request
//!   whole and break when it writes the answer, so the caller cannot tell
//!   whether the request was carried out;
//! - silence: every connection it has turns half-open, nothing arriving
//!   any more at either end and neither end told;
//! - a storm: a stranger opens many connections to it and holds them for
//!   the window, silent, each with half a frame sent, or (when the run's
//!   connections have a flow-control window, `Swarm::stream_window`)
//!   each sending requests without end and never reading an answer, so
//!   the replica's answers fill the window and its writes stall;
//! - a pause of its process (`Supervisor::pause`, a machine that stalls):
//!   it accepts nothing and reads nothing, its peers and clients time out
//!   against it, and when it goes on every timer that fell due meanwhile
//!   fires at once, its clock having jumped, as it sees it, just short of
//!   or just past its idle timeout or past its handshake timeout.
//!
//! What is held to account, besides every checker of the run:
//! - a server never holds more connection slots than connections: checked
//!   every second on every live node, and at the end of each storm;
//! - during a storm, a client is served within the idle timeout (plus the
//!   frame timeout when the storm holds half frames or stalls the
//!   replica's writes, and two attempts of
//!   1 s and the network's longest delay on each trip of a call: one may
//!   be lost to a connection silenced under it), unless the replica went
//!   down, was restarted or paused meanwhile;
//! - no call of a world client outlives its deadline (`world::Client::call`).

use super::super::plan::swarm::{pick, Swarm};
use crate::disk::SplitMix64;
use crate::failure::{Failure, FailureKind, Verdict};
use crate::world::clock::global_now;
use crate::world::simnet::{Accepted, Network, SimNet, StreamFault};
use crate::world::supervisor::Supervisor;
use crate::world::{Client, World};
use arbor::config::Config;
use arbor::net::{Net, Stream};
use arbor::proto::Request;
use arbor::tcp::encode_frame;
use arbor::ReplicaId;
use madsim::runtime::Handle;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Connection slots a run's nodes may draw: the smallest bind all
/// run long (each client and peer keeps connections), the largest never.
const MAX_CONNECTIONS: [usize; 5] = [4, 8, 16, 64, 4096];
/// Idle timeouts a run's nodes may draw, in milliseconds.
const IDLE_TIMEOUT_MS: [u64; 4] = [500, 2_000, 10_000, 60_000];
/// Connection faults per 15 s of workload: 1 up to this.
const FAULTS_PER_15S_MAX: u64 = 4;
/// Sockets a storm may open.
const STORM_SOCKETS: [usize; 4] = [2, 8, 32, 128];
/// What a pause may last.
const PAUSE_LENGTHS: [PauseLength; 4] = [
    PauseLength::BeforeIdle,
    PauseLength::PastIdle,
    PauseLength::PastHandshake,
    PauseLength::Brief,
];
/// How long a storm holds its sockets, in milliseconds.
const STORM_WINDOW_MS: [u64; 3] = [500, 2_000, 8_000];
/// Simulated time between two checks of every server's slots.
const SLOT_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// What a client served during a storm may take beyond its bound, besides
/// the network's delays.
const PROBE_MARGIN: Duration = Duration::from_secs(1);
/// One-way trips a probe call may make: the connection, a TLS handshake's
/// two round trips, the request and its answer, and one trip lost.
const PROBE_TRIPS: u32 = 8;
/// Between two attempts of the storm's probe client.
const PROBE_RETRY: Duration = Duration::from_millis(10);
/// How long before an unread storm's end its connections are checked.
const UNREAD_CHECK_LEAD: Duration = Duration::from_millis(100);
/// Between two bursts of an unread storm's socket.
const UNREAD_BURST_PAUSE: Duration = Duration::from_millis(10);
/// Most requests in one unread storm socket's burst.
const UNREAD_BURST_MAX: usize = 8_192;

/// The connection limits of every node of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireKnobs {
    pub max_connections: usize,
    pub idle_timeout: Duration,
}

impl WireKnobs {
    pub fn apply(&self, config: &mut Config) {
        config.limits.max_connections = self.max_connections;
        config.limits.idle_connection_timeout = self.idle_timeout;
    }
}

/// What a connection fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireKind {
    Reset,
    ResetOnAnswer,
    Silence,
    /// `sockets` connections held for the window.
    Storm {
        sockets: usize,
        mode: StormMode,
    },
    Pause(PauseLength),
}

/// What each socket of a storm does while it is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StormMode {
    /// Sends nothing.
    Silent,
    /// Sends half a frame: a header that claims the largest frame.
    HalfFrames,
    /// Sends requests as fast as the connection takes them and never
    /// reads an answer. Drawn only in runs whose connections have a
    /// window: without one, the answers pile up unread and no write stalls.
    Unread,
}

impl StormMode {
    fn name(self) -> &'static str {
        match self {
            StormMode::Silent => "silent",
            StormMode::HalfFrames => "half-frame",
            StormMode::Unread => "unread",
        }
    }
}

/// How long a pause lasts, against the paused node's own timeouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseLength {
    /// 50 ms short of its idle timeout.
    BeforeIdle,
    /// 50 ms past its idle timeout.
    PastIdle,
    /// 50 ms past its handshake timeout.
    PastHandshake,
    /// 300 ms.
    Brief,
}

impl PauseLength {
    /// The pause's length for a node configured as `config`.
    pub fn of(self, config: &Config) -> Duration {
        let margin = Duration::from_millis(50);
        let limits = &config.limits;
        match self {
            PauseLength::BeforeIdle => limits.idle_connection_timeout.saturating_sub(margin),
            PauseLength::PastIdle => limits.idle_connection_timeout + margin,
            PauseLength::PastHandshake => limits.handshake_timeout + margin,
            PauseLength::Brief => Duration::from_millis(300),
        }
    }
}

/// One connection fault against `replica`'s machine, `at_ms` after the
/// workload starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireFault {
    pub at_ms: u64,
    pub window_ms: u64,
    pub replica: ReplicaId,
    pub kind: WireKind,
}

/// A run's connection limits and faults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WirePlan {
    pub knobs: WireKnobs,
    pub faults: Vec<WireFault>,
    /// The longest one-way delay the run's network may have (its latency
    /// spikes): a probe during a storm may wait it out on each of its
    /// round trips.
    pub latency_max: Duration,
}

impl WirePlan {
    /// Drawn from the seed on a stream of its own, so that the swarm and
    /// the plan draw the same with or without it.
    pub fn draw(swarm: &Swarm, faults_on: bool) -> WirePlan {
        let mut rng = SplitMix64::new(swarm.seed ^ 0x5749_5245_0000_0000);
        let knobs = WireKnobs {
            max_connections: pick(&mut rng, &MAX_CONNECTIONS),
            idle_timeout: Duration::from_millis(pick(&mut rng, &IDLE_TIMEOUT_MS)),
        };
        let span_ms = swarm.size.workload_duration.as_millis() as u64;
        let most = FAULTS_PER_15S_MAX * span_ms.div_ceil(15_000);
        let count = match faults_on {
            true => 1 + rng.next_u64() % most,
            false => 0,
        };
        let mut faults: Vec<WireFault> = (0..count)
            .map(|_| {
                let at_ms = 500 + rng.next_u64() % (span_ms * 8 / 10).max(1);
                let replica = 1 + (rng.next_u64() % swarm.replicas as u64) as ReplicaId;
                let window_ms = pick(&mut rng, &STORM_WINDOW_MS);
                let kind = match rng.next_u64() % 12 {
                    0..=1 => WireKind::Reset,
                    2..=4 => WireKind::ResetOnAnswer,
                    5..=6 => WireKind::Silence,
                    7..=9 => {
                        let sockets = pick(&mut rng, &STORM_SOCKETS);
                        let roll = rng.next_u64();
                        let mode = match (roll % 2, swarm.stream_window) {
                            (0, _) => StormMode::HalfFrames,
                            (_, Some(_)) if roll / 2 % 3 != 0 => StormMode::Unread,
                            _ => StormMode::Silent,
                        };
                        WireKind::Storm { sockets, mode }
                    }
                    _ => WireKind::Pause(pick(&mut rng, &PAUSE_LENGTHS)),
                };
                WireFault {
                    at_ms,
                    window_ms,
                    replica,
                    kind,
                }
            })
            .collect();
        faults.sort_by_key(|f| f.at_ms);
        WirePlan {
            knobs,
            faults,
            latency_max: Duration::ZERO,
        }
    }

    /// With the longest one-way delay the run's network may have.
    pub fn with_latency_max(mut self, latency_max: Duration) -> Self {
        self.latency_max = latency_max;
        self
    }
}

/// The number of the client that checks a replica serves during a storm:
/// after the intruder and the misled client.
pub fn probe_client_index(clients: usize) -> usize {
    clients + 3
}

/// Strikes `plan`'s faults from `start` on and checks every server's slots
/// until `deadline`; fails `verdict` on the first broken bound.
pub async fn run(
    plan: WirePlan,
    supervisor: Arc<Supervisor>,
    verdict: Verdict,
    probe: Client,
    start: Duration,
    deadline: Duration,
) {
    let probe = Arc::new(probe);
    supervisor.world().trace.record(
        "wire",
        format!(
            "{} connection slots, idle timeout {:?}, window {:?}; faults {:?}",
            plan.knobs.max_connections,
            plan.knobs.idle_timeout,
            supervisor.world().stream_window(),
            plan.faults
        ),
    );
    let slots = {
        let (supervisor, verdict) = (supervisor.clone(), verdict.clone());
        async move {
            while global_now() + SLOT_CHECK_INTERVAL < deadline && !verdict.failed() {
                madsim::time::sleep(SLOT_CHECK_INTERVAL).await;
                if let Err(failure) = check_slots(supervisor.world()) {
                    verdict.fail(failure);
                }
            }
        }
    };
    let strikes = async {
        for (number, fault) in plan.faults.iter().enumerate() {
            let at = start + Duration::from_millis(fault.at_ms);
            if at >= deadline || verdict.failed() {
                break;
            }
            madsim::time::sleep(at.saturating_sub(global_now())).await;
            let strike = Strike {
                supervisor: supervisor.clone(),
                verdict: verdict.clone(),
                probe: probe.clone(),
                fault: fault.clone(),
                number,
                latency_max: plan.latency_max,
                deadline,
            };
            supervisor.detach(strike.run());
        }
    };
    futures::join!(slots, strikes);
}

/// A server that holds more slots than it holds connections: a slot kept
/// by a connection that is gone, which no later connection gets back. Or
/// more of its frame budget than its connections can be receiving: each
/// reads one frame at a time, of at most `limits.max_message_bytes`, and
/// holds budget only while it reads one, so budget beyond that is kept
/// for frames whose connections are gone.
pub fn check_slots(world: &World) -> Result<(), Failure> {
    for node in &world.nodes {
        let Some((stats, alive)) = node.server_connections() else {
            continue;
        };
        let frame_max = node.config.limits.max_message_bytes as u64;
        if stats.partial_frame_bytes > alive as u64 * frame_max {
            return Err(Failure::new(
                FailureKind::Connections,
                format!(
                    "{} holds {} bytes of its frame budget for {alive} connections \
                     of frames up to {frame_max} bytes (frames refused {})",
                    node.name, stats.partial_frame_bytes, stats.partial_frames_refused
                ),
            ));
        }
        if stats.connections_open > alive as u64 {
            return Err(Failure::new(
                FailureKind::Connections,
                format!(
                    "{} holds {} connection slots for {alive} connections \
                     (evicted {}, idle-closed {}, refused {})",
                    node.name,
                    stats.connections_open,
                    stats.idle_evicted,
                    stats.idle_closed,
                    stats.connections_refused
                ),
            ));
        }
    }
    Ok(())
}

/// One fault being struck.
struct Strike {
    supervisor: Arc<Supervisor>,
    verdict: Verdict,
    probe: Arc<Client>,
    fault: WireFault,
    /// Its place in the plan: names the storm's machine.
    number: usize,
    latency_max: Duration,
    /// The end of the workload: no pause outlasts it.
    deadline: Duration,
}

impl Strike {
    fn world(&self) -> &World {
        self.supervisor.world()
    }

    async fn run(self) {
        let replica = self.fault.replica;
        let ip = self.world().node(replica).addr.ip();
        let hit = |fault| self.world().kernels().strike(ip, fault);
        let what = match self.fault.kind {
            WireKind::Reset => format!("reset {} stream ends", hit(StreamFault::Reset)),
            WireKind::ResetOnAnswer => format!(
                "reset {} accepted connections at their next answer",
                hit(StreamFault::ResetOnAnswer)
            ),
            WireKind::Silence => format!(
                "silence {} stream ends (half-open)",
                hit(StreamFault::Silence)
            ),
            WireKind::Storm { sockets, mode } => return self.storm(sockets, mode).await,
            WireKind::Pause(length) => {
                let length = length.of(&self.world().node(replica).config);
                self.note(format!("replica-{replica}: process pause of {length:?}"));
                let paused = self.supervisor.pause(replica, length, self.deadline);
                match paused.await {
                    true => format!("process goes on after {length:?} (or at the workload's end)"),
                    false => "process pause skipped: down or supervised".into(),
                }
            }
        };
        self.note(format!("replica-{replica}: {what}"));
    }

    fn note(&self, what: String) {
        self.world().trace.record("wire", what);
    }

    /// Opens `sockets` connections to the replica from a machine of its
    /// own, holds them for the window while a client must still be
    /// served, then drops them and checks the replica's slots.
    async fn storm(self, sockets: usize, mode: StormMode) {
        let half_frames = mode == StormMode::HalfFrames;
        let replica = self.fault.replica;
        let node = self.world().node(replica);
        let (address, config) = (node.addr.to_string(), node.config.clone());
        let name = format!("storm-{}", self.number);
        let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 200, (self.number % 250) as u8 + 1));
        let machine = Handle::current().create_node().name(&name).ip(ip).build();
        let net = SimNet::new(self.world().kernels().clone());
        let claim = config.limits.max_message_bytes as u32;
        let connect_timeout = config.limits.connect_timeout;
        let opening = machine.spawn(async move {
            let mut held = Vec::new();
            for _ in 0..sockets {
                let connect = madsim::time::timeout(connect_timeout, net.connect(address.clone()));
                let Ok(Ok(mut stream)) = connect.await else {
                    continue;
                };
                if half_frames {
                    let mut half = claim.to_be_bytes().to_vec();
                    half.extend_from_slice(&[0; 8]);
                    let _ = stream.write_all(&half).await;
                    let _ = stream.flush().await;
                }
                held.push(stream);
            }
            held
        });
        let held = opening.await.unwrap_or_default();
        self.note(format!(
            "replica-{replica}: storm of {} {} sockets for {}ms",
            held.len(),
            mode.name(),
            self.fault.window_ms
        ));
        let began = global_now();
        let before = self.watch();
        // One attempt may be lost whole to a connection another fault
        // silences under it.
        let attempt = PROBE_MARGIN + self.latency_max * PROBE_TRIPS;
        // When every connection of an unread storm must be closed: each
        // stalled answer waits its frame timeout at most. Over TLS the
        // stranger's sockets never finish a handshake: the handshake
        // timeout ends them.
        let stalled_for = match self.world().network() {
            Network::Tls => config.limits.handshake_timeout,
            Network::Tcp => config.tree.replication_timeout,
        };
        let due = began + stalled_for + attempt;
        let mut window_end = began + Duration::from_millis(self.fault.window_ms);
        if mode == StormMode::Unread && due + UNREAD_CHECK_LEAD <= self.deadline {
            // Held until the check, in the workload.
            window_end = window_end.max(due + UNREAD_CHECK_LEAD);
        }
        let held = match mode {
            StormMode::Unread => {
                let burst = unread_burst(&config, self.world().stream_window());
                Held::Writing(machine.spawn(send_unread(held, burst, window_end)))
            }
            _ => Held::Here(held),
        };
        let mut bound = config.limits.idle_connection_timeout + attempt * 2;
        if mode != StormMode::Silent {
            // A half frame, or an answer the storm never reads, holds its
            // connection busy until the frame timeout ends it.
            bound += config.tree.replication_timeout;
        }
        if let Err(failure) = self.served_within(bound, attempt).await {
            self.verdict.fail(failure);
        }
        if mode == StormMode::Unread && due < window_end {
            madsim::time::sleep(due.saturating_sub(global_now())).await;
            if let Err(failure) = self.stalled_closed(ip, before, due - began) {
                self.verdict.fail(failure);
            }
        }
        madsim::time::sleep(window_end.saturating_sub(global_now())).await;
        match held {
            Held::Here(held) => drop(held),
            // It drops its sockets at the window's end.
            Held::Writing(task) => drop(task.await),
        }
        if let Err(failure) = check_slots(self.world()) {
            self.verdict.fail(failure);
        }
    }

    /// The probe client is answered by the replica within `bound`, each
    /// call given at most `attempt`, or the replica went down, was
    /// restarted or paused meanwhile.
    async fn served_within(&self, bound: Duration, attempt: Duration) -> Result<(), Failure> {
        let replica = self.fault.replica;
        let node = self.world().node(replica);
        let Some(before) = self.watch() else {
            return Ok(());
        };
        let hello = Request::Hello {
            cluster_id: node.config.node.cluster_id.clone(),
            replica_id: None,
        };
        let begin = global_now();
        let end = begin + bound;
        let mut last = None;
        while global_now() < end {
            let left = (end - global_now()).min(attempt);
            match self.probe.call(replica, hello.clone(), left).await {
                Ok(_) => return Ok(()),
                Err(error) => last = Some(error),
            }
            madsim::time::sleep(PROBE_RETRY.min(end.saturating_sub(global_now()))).await;
        }
        if !self.undisturbed_since(&before) {
            return Ok(());
        }
        Err(Failure::new(
            FailureKind::Connections,
            format!(
                "during a storm, replica-{replica} served no client within {bound:?} \
                 (last error: {last:?})"
            ),
        ))
    }

    /// The replica's incarnation and pauses now, to hold a bound to:
    /// `None` when it is down or paused, which excuses any bound.
    fn watch(&self) -> Option<Watched> {
        let replica = self.fault.replica;
        // Weak: a strong handle would keep a killed incarnation's forest.
        let service = self.world().node(replica).service()?;
        if self.supervisor.is_paused(replica) {
            return None;
        }
        Some(Watched {
            service: Arc::downgrade(&service),
            pauses: self.supervisor.pauses(replica),
        })
    }

    /// True when the replica ran as `before` saw it ever since: the same
    /// incarnation, no pause, no supervised restart under way.
    fn undisturbed_since(&self, before: &Watched) -> bool {
        let replica = self.fault.replica;
        let same = (self.world().node(replica).service()).is_some_and(|now| {
            before
                .service
                .upgrade()
                .is_some_and(|b| Arc::ptr_eq(&b, &now))
        });
        same && self.supervisor.pauses(replica) == before.pauses
            && !self.supervisor.is_supervised(replica)
    }

    /// The replica holds no connection of the storm at `storm`, whose
    /// sockets never read an answer, `after` the storm began to write
    /// (it is now): each answer it writes there waits at most its frame
    /// timeout (over TLS, a handshake its handshake timeout). Connections
    /// another fault silenced are left out. `before`: the replica when
    /// the storm began.
    fn stalled_closed(
        &self,
        storm: IpAddr,
        before: Option<Watched>,
        after: Duration,
    ) -> Result<(), Failure> {
        let replica = self.fault.replica;
        let ip = self.world().node(replica).addr.ip();
        // A connection another fault silenced takes every answer at once:
        // it waits for the idle timeout instead.
        let answering = Accepted::Answering {
            local: ip,
            remote: storm,
        };
        let open = self.world().kernels().accepted_alive(answering);
        if open == 0 || !before.is_some_and(|b| self.undisturbed_since(&b)) {
            return Ok(());
        }
        Err(Failure::new(
            FailureKind::Connections,
            format!(
                "replica-{replica} still holds {open} connections of a storm that reads none of \
                 its answers, {after:?} after the storm began to write"
            ),
        ))
    }
}

/// A replica as a bound began: its incarnation and its pauses so far.
struct Watched {
    service: std::sync::Weak<arbor::service::Service>,
    pauses: u64,
}

/// A storm's sockets while it holds them.
enum Held {
    /// Held by the strike, sending nothing more.
    Here(Vec<Box<dyn Stream>>),
    /// On the storm's machine, sending without end until the window's end.
    Writing(madsim::task::JoinHandle<()>),
}

/// Requests that one unread socket sends over and over: `Hello`s, which
/// any caller may send and each has an answer, about a window of them.
fn unread_burst(config: &Config, window: Option<usize>) -> Vec<u8> {
    let hello = Request::Hello {
        cluster_id: config.node.cluster_id.clone(),
        replica_id: None,
    };
    let frame = encode_frame(0, &hello).expect("a Hello fits a frame");
    let frame = frame.as_bytes();
    let count = (window.unwrap_or(0) / frame.len()).clamp(1, UNREAD_BURST_MAX);
    frame.repeat(count)
}

/// Sends `burst` on every socket over and over, as far as each connection
/// takes it, never reading, until a write fails or `window_end`; drops
/// the sockets then. Their answers pile up unread until they fill the
/// window and the replica's writes wait.
async fn send_unread(mut held: Vec<Box<dyn Stream>>, burst: Vec<u8>, window_end: Duration) {
    let writes = held.iter_mut().map(|stream| {
        let burst = &burst;
        async move {
            while stream.write_all(burst).await.is_ok() {
                // madsim sends on flush; the window holds the loop back,
                // and the pause a silenced connection, whose writes all
                // pass at once.
                if stream.flush().await.is_err() {
                    break;
                }
                madsim::time::sleep(UNREAD_BURST_PAUSE).await;
            }
        }
    });
    let left = window_end.saturating_sub(global_now());
    let _ = madsim::time::timeout(left, futures::future::join_all(writes)).await;
    madsim::time::sleep(window_end.saturating_sub(global_now())).await;
    drop(held);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::plan::swarm::{Profile, Size};

    fn swarm(seed: u64) -> Swarm {
        Swarm::draw(seed, Profile::Standard, Size::TEST, true)
    }

    /// A seed draws one plan; its faults fall inside the workload, in
    /// time order, against replicas of the run, and a run without faults
    /// draws none (its limits still bind). Storms of answers never read
    /// come only in runs whose connections have a window.
    #[test]
    fn plans_are_pure_and_stay_inside_the_run() {
        let mut kinds = std::collections::HashSet::new();
        let mut modes = std::collections::BTreeSet::new();
        for seed in 1..60 {
            let s = swarm(seed);
            let plan = WirePlan::draw(&s, true);
            assert_eq!(plan, WirePlan::draw(&s, true));
            let span = s.size.workload_duration.as_millis() as u64;
            assert!((1..=FAULTS_PER_15S_MAX as usize).contains(&plan.faults.len()));
            assert!(plan.faults.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
            for fault in &plan.faults {
                assert!(fault.at_ms < span, "{fault:?}");
                assert!((1..=s.replicas as ReplicaId).contains(&fault.replica));
                kinds.insert(std::mem::discriminant(&fault.kind));
                if let WireKind::Storm { mode, .. } = fault.kind {
                    // Without a window, answers never read stall nothing.
                    assert!(mode != StormMode::Unread || s.stream_window.is_some());
                    modes.insert(mode.name());
                }
            }
            assert!(MAX_CONNECTIONS.contains(&plan.knobs.max_connections));
            let quiet = WirePlan::draw(&s, false);
            assert!(quiet.faults.is_empty());
            assert_eq!(quiet.knobs, plan.knobs);
        }
        assert_eq!(kinds.len(), 5, "every kind of fault is drawn");
        assert_eq!(modes.len(), 3, "every kind of storm is drawn: {modes:?}");
    }

    /// The knobs reach the config and keep it valid.
    #[test]
    fn knobs_apply_to_a_valid_config() {
        let mut config = Config::default_for_test(1);
        let knobs = WireKnobs {
            max_connections: 4,
            idle_timeout: Duration::from_millis(500),
        };
        knobs.apply(&mut config);
        assert_eq!(config.limits.max_connections, 4);
        assert_eq!(config.limits.idle_connection_timeout, knobs.idle_timeout);
        config.validate().expect("valid");
    }
}
