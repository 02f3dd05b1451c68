//! Fuzz target `sim`: the bytes script a small madsim cluster (2 or 3
//! replicas): which client writes go to which replica, when, and which
//! faults strike between them (partitions, one-way clogs, packet loss,
//! dropped pushes, crashes with power failure, disk errors). Coverage then
//! steers the fault schedule, where the seed sweep of the scenario only
//! samples it. After the script the cluster goes through the scenario's own
//! lifecycle (`scenario::lifecycle`): it heals, the supervisor restarts
//! what is down or had disk errors, and the checkers (`scenario::check`)
//! hold it to the tree invariant on every replica, convergence by sync
//! alone (when sync is on) and by push, every acknowledged write present
//! everywhere, reads agreeing, nothing lost across a restart and nobody
//! waiting.
//!
//! Deterministic per input: the madsim seed comes from the input and
//! nothing else varies.

use crate::disk::DiskConfig;
use crate::failure::{Failure, Verdict};
use crate::scenario::check::ledger::{Ledger, MOVE_TAG_KEY};
use crate::scenario::lifecycle::{self, LeakProbe, CALL_TIMEOUT};
use crate::trace::Trace;
use crate::world::clock::ClockSkew;
use crate::world::supervisor::Supervisor;
use crate::world::transport::RequestKind;
use crate::world::{cluster_configs_with, Client, Knobs, World};
use arbitrary::{Arbitrary, Unstructured};
use arbor::config::ContainerConfig;
use arbor::proto::Request;
use arbor::{ContainerId, KeyValue, NodeId, ReplicaId, TreeKey, ATTR_FILE_NAME, ROOT};
use madsim::net::NetSim;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Steps per input; the rest of a long input is ignored.
pub const MAX_STEPS: usize = 40;
/// Simulated time after which a run counts as hung (a liveness failure).
const RUN_TIME_LIMIT: Duration = Duration::from_secs(600);

#[derive(Arbitrary, Debug, Clone)]
pub struct Input {
    /// Seeds madsim: message latencies, packet loss draws, task order.
    /// One byte: the schedule that matters comes from the steps, and a wide
    /// seed would let the fuzzer find "new coverage" in timing noise alone.
    pub seed: u8,
    /// Cluster shape and knobs, one choice per bit field (see `Setup`).
    pub setup: u16,
    pub steps: Vec<Step>,
}

/// One step of the script. Replica operands are taken modulo the replica
/// count; node operands index the nodes acknowledged so far. A write's
/// `kind` picks the op (`kind % 4`: AddByPath, Add, Move, Remove) and the
/// tree (`kind / 4 % 3`).
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Step {
    /// A client write, not awaited: later steps run while it is in flight.
    Write {
        replica: u8,
        kind: u8,
        a: u8,
        b: u8,
    },
    /// Lets simulated time pass (10 ms units).
    Pause(u8),
    /// Cuts two replicas off from each other in both directions.
    Partition {
        a: u8,
        b: u8,
    },
    /// Clogs one direction between two replicas.
    Clog {
        from: u8,
        to: u8,
    },
    /// Removes every clog and partition.
    HealNetwork,
    /// Packet loss on every link, in 1/256 (0 turns it off).
    PacketLoss(u8),
    /// Pushes from one replica to another are dropped (sync must carry).
    BlockPushes {
        from: u8,
        to: u8,
    },
    /// Power failure and kill; the replica stays down until `Restart`.
    Crash(u8),
    Restart(u8),
    /// The replica's disk fails writes and syncs with these chances
    /// (1/256); redb then refuses writes until the process restarts, which
    /// healing does.
    DiskErrors {
        replica: u8,
        write: u8,
        sync: u8,
    },
}

/// The cluster one input runs: drawn from `Input::setup`.
#[derive(Clone, Debug)]
struct Setup {
    replicas: usize,
    knobs: Knobs,
    torn_write_probability: f64,
    skews: Vec<ClockSkew>,
}

fn pick<T: Copy>(bits: u16, shift: u32, options: &[T]) -> T {
    options[usize::from(bits >> shift) % options.len()]
}

impl Setup {
    fn from_bits(bits: u16) -> Setup {
        let replicas = pick(bits, 0, &[2, 3]);
        let knobs = Knobs {
            max_batch_size: pick(bits, 1, &[1, 4, 16, 100]),
            max_batch_delay: Duration::from_millis(pick(bits, 3, &[0, 5])),
            // One slot: a batch touching two trees already overflows it.
            replication_channel_capacity: pick(bits, 4, &[1, 1000]),
            replication_worker_count: pick(bits, 5, &[1, 8]),
            replication_timeout: Duration::from_millis(pick(bits, 6, &[200, 1000])),
            sync_interval: pick(bits, 7, &[None, Some(300), Some(1_000), Some(5_000)])
                .map(Duration::from_millis),
            max_pending_writes: pick(bits, 9, &[8, 1000]),
            sync_page_size: pick(bits, 10, &[3, 256]),
            stamp_page_size: None,
            message_bytes: None,
            counter_jump_max: None,
        };
        let torn_write_probability = pick(bits, 11, &[0.0, 1.0]);
        // Clocks apart by seconds, so local timestamps of different
        // replicas interleave instead of following the arrival order.
        let skews = (0..replicas)
            .map(|i| ClockSkew {
                offset: Duration::from_millis(pick(bits, 12 + i as u32, &[0, 3_000])),
                drift_ppm: 0,
            })
            .collect();
        Setup {
            replicas,
            knobs,
            torn_write_probability,
            skews,
        }
    }
}

/// The container every write goes to, replicated on every replica.
fn fuzz_container() -> ContainerId {
    ContainerId([9; 32])
}

/// Three trees, so one batch can carry more replication hints than the
/// smallest replication queue holds.
fn trees() -> [TreeKey; 3] {
    [
        TreeKey::new(fuzz_container(), "objects"),
        TreeKey::new(fuzz_container(), "locks"),
        TreeKey::new(fuzz_container(), "uploads"),
    ]
}

pub fn check(data: &[u8]) {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    if let Err(failure) = run(&input).failure {
        panic!("sim: {failure}");
    }
}

/// The verdict of one input, and the hash of its event trace (the same
/// input must give the same hash).
pub struct Outcome {
    pub failure: Result<(), Failure>,
    pub trace_hash: u64,
    pub acked: usize,
}

pub fn run(input: &Input) -> Outcome {
    let setup = Setup::from_bits(input.setup);
    let trace = Trace::new(false);
    let steps: Vec<Step> = input.steps.iter().take(MAX_STEPS).copied().collect();
    let seed = u64::from(input.seed);
    let config = madsim::Config::default();
    let body = |probe| simulate(setup, &trace, probe, &steps);
    let ((failure, acked), leak) =
        lifecycle::run_in_runtime(seed, config, Some(RUN_TIME_LIMIT), body);
    Outcome {
        failure: failure.and(leak),
        trace_hash: trace.hash(),
        acked,
    }
}

/// The script's cluster through the lifecycle: boot, the steps, heal and
/// check, end. The failure, and the writes acknowledged.
async fn simulate(
    setup: Setup,
    trace: &Trace,
    probe: LeakProbe,
    steps: &[Step],
) -> (Result<(), Failure>, usize) {
    let script = Script::start(setup, trace);
    probe.watch(&script.world);
    let result = async {
        lifecycle::boot(&script.world).await?;
        script.play(steps).await
    }
    .await;
    let acked = script.ledger.lock().unwrap().acked.len();
    let ended = lifecycle::end(&script.supervisor).await;
    (result.and(ended), acked)
}

/// A running cluster and what the script did to it.
struct Script {
    setup: Setup,
    world: Arc<World>,
    supervisor: Arc<Supervisor>,
    ledger: Mutex<Ledger>,
    client: Client,
    writes: Mutex<Vec<madsim::task::JoinHandle<()>>>,
    next_op: Mutex<u64>,
}

impl Script {
    fn start(setup: Setup, trace: &Trace) -> Arc<Script> {
        // The container is in every node's membership config, as in the
        // scenario: a replica that never saw one of its trees still syncs it.
        let container = ContainerConfig::new(
            fuzz_container(),
            (1..=setup.replicas as ReplicaId).collect(),
        );
        let configs = cluster_configs_with(setup.replicas, &setup.knobs, &[container]);
        let disk_config = |i: usize| {
            let mut config = DiskConfig::reliable(i as u64 + 1);
            config.faults.torn_write_probability = setup.torn_write_probability;
            config
        };
        let mut world = World::build_on_disks(configs, &setup.skews, disk_config, trace.clone());
        let client = world.client();
        let world = Arc::new(world);
        Arc::new(Script {
            setup,
            supervisor: Supervisor::new(world.clone(), Verdict::new(trace.clone())),
            world,
            ledger: Mutex::default(),
            client,
            writes: Mutex::default(),
            next_op: Mutex::new(0),
        })
    }

    fn replica(&self, byte: u8) -> ReplicaId {
        1 + (usize::from(byte) % self.setup.replicas) as ReplicaId
    }

    fn note(&self, what: String) {
        self.world.trace.record("fuzz", what);
    }

    /// Plays the steps, then heals and checks; the writes still in flight
    /// finish once the faults have ended.
    async fn play(self: &Arc<Self>, steps: &[Step]) -> Result<(), Failure> {
        for &step in steps {
            self.step(step).await;
            // Every step takes a little time, so writes spread out unless
            // the script asks for bursts (Pause(0) between them does not).
            madsim::time::sleep(Duration::from_millis(2)).await;
        }
        let last_writes = async {
            let writes: Vec<_> = std::mem::take(&mut *self.writes.lock().unwrap());
            for write in writes {
                let _ = write.await;
            }
            self.ledger.lock().unwrap().clone()
        };
        lifecycle::heal_and_check(&self.supervisor, last_writes).await
    }

    async fn step(self: &Arc<Self>, step: Step) {
        match step {
            Step::Write {
                replica,
                kind,
                a,
                b,
            } => {
                let script = self.clone();
                let replica = self.replica(replica);
                let handle = madsim::task::spawn(async move {
                    script.write(replica, kind, a, b).await;
                });
                self.writes.lock().unwrap().push(handle);
            }
            Step::Pause(units) => {
                madsim::time::sleep(Duration::from_millis(10 * u64::from(units))).await;
            }
            Step::Partition { a, b } => self.partition(a, b),
            Step::Clog { from, to } => self.clog(from, to),
            Step::HealNetwork => {
                self.note("heal network".into());
                self.world.heal_network();
            }
            Step::PacketLoss(rate) => {
                let rate = f64::from(rate) / 256.0;
                self.note(format!("packet loss {rate}"));
                NetSim::current().update_config(|c| c.packet_loss_rate = rate);
            }
            Step::BlockPushes { from, to } => self.block_pushes(from, to),
            Step::Crash(replica) => {
                let replica = self.replica(replica);
                if self.world.is_up(replica) {
                    self.supervisor.crash(replica);
                }
            }
            Step::Restart(replica) => {
                let replica = self.replica(replica);
                if !self.world.is_up(replica) {
                    self.supervisor.restart(replica);
                }
            }
            Step::DiskErrors {
                replica,
                write,
                sync,
            } => self.disk_errors(replica, write, sync),
        }
    }

    fn partition(&self, a: u8, b: u8) {
        let (a, b) = (self.replica(a), self.replica(b));
        if a != b {
            self.note(format!("partition replica-{a} <-> replica-{b}"));
            self.world.partition_pair(a, b);
        }
    }

    fn clog(&self, from: u8, to: u8) {
        let (from, to) = (self.replica(from), self.replica(to));
        if from != to {
            self.note(format!("clog replica-{from} -> replica-{to}"));
            self.world.clog_one_way(from, to);
        }
    }

    fn block_pushes(&self, from: u8, to: u8) {
        let (from, to) = (self.replica(from), self.replica(to));
        if from != to {
            self.note(format!("drop pushes replica-{from} -> replica-{to}"));
            self.world.filter.block(from, to, RequestKind::Push);
        }
    }

    fn disk_errors(&self, replica: u8, write: u8, sync: u8) {
        let replica = self.replica(replica);
        let (write, sync) = (f64::from(write) / 256.0, f64::from(sync) / 256.0);
        self.note(format!(
            "disk errors on replica-{replica}: write {write}, sync {sync}"
        ));
        self.supervisor.begin_disk_errors(replica, write, sync);
    }

    fn op_id(&self) -> u64 {
        let mut next = self.next_op.lock().unwrap();
        *next += 1;
        *next
    }

    /// A node acknowledged in `tree` so far, chosen by `byte`; ROOT when
    /// none is, or for one byte value in eight.
    fn known(&self, tree: &TreeKey, byte: u8) -> NodeId {
        let ledger = self.ledger.lock().unwrap();
        match ledger.known.get(tree) {
            Some(nodes) if !nodes.is_empty() && !byte.is_multiple_of(8) => {
                nodes[usize::from(byte) % nodes.len()]
            }
            _ => ROOT,
        }
    }

    /// Sends one write and records what was acknowledged in the ledger the
    /// checkers hold the cluster to.
    async fn write(&self, replica: ReplicaId, kind: u8, a: u8, b: u8) {
        let op = self.op_id();
        let request = self.request(op, kind, a, b);
        self.note(format!("op#{op} -> replica-{replica}: {request:?}"));
        let answer = self
            .client
            .call(replica, request.clone(), CALL_TIMEOUT)
            .await;
        self.note(format!("op#{op} answer: {answer:?}"));
        let Ok(response) = answer else { return };
        let mut ledger = self.ledger.lock().unwrap();
        ledger.ops_acked += 1;
        ledger.record(replica, &request, &response);
    }

    /// The write `kind` picks (`kind % 4`: AddByPath, Add, Move, Remove;
    /// `kind / 4 % 3`: the tree), with operands `a` and `b`.
    fn request(&self, op: u64, kind: u8, a: u8, b: u8) -> Request {
        let tree = trees()[usize::from(kind / 4) % 3].clone();
        match kind % 4 {
            0 => Request::AddByPath {
                tree,
                attr: ATTR_FILE_NAME.into(),
                path: vec![format!("dir-{}", a % 3)],
                items: vec![
                    KeyValue::new(ATTR_FILE_NAME, format!("obj-{op}").into_bytes()),
                    KeyValue::new("OID", format!("oid-{op}").into_bytes()),
                ],
            },
            1 => Request::Add {
                parent: self.known(&tree, a),
                items: vec![KeyValue::new(
                    ATTR_FILE_NAME,
                    format!("n-{}", b % 4).into_bytes(),
                )],
                tree,
            },
            2 => Request::Move {
                parent: self.known(&tree, b),
                node: self.known(&tree, a | 1),
                items: vec![
                    KeyValue::new(ATTR_FILE_NAME, format!("m-{}", b % 4).into_bytes()),
                    KeyValue::new(MOVE_TAG_KEY, op.to_string().into_bytes()),
                ],
                tree,
            },
            _ => Request::Remove {
                node: self.known(&tree, a | 1),
                tree,
            },
        }
    }
}
