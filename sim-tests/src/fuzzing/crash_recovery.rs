//! Fuzz target `crash_recovery`: batches of writes go to a forest on the
//! simulated disk, with power failures between batches and in the middle of
//! commits, torn unsynced writes and injected I/O errors. After every crash
//! the forest must reopen holding every acknowledged batch, plus at most the
//! one batch that was in flight (all of it or none of it), with its tree
//! invariant intact and its nodes equal to the paper's model of its log.
//!
//! The forest runs on its write-ahead log (or, per input, with a durable
//! commit per batch): power cuts land inside log appends, checkpoints and
//! segment rolls as well as redb commits; I/O errors hit the log and the
//! database alike, and may strike again while the reopened forest replays
//! its log. A batch that failed may also be followed by a reopen without
//! a power failure (the service's recovery), which replays the log.
//!
//! The expected state comes from a second, in-memory forest fed only the
//! acknowledged batches: local ops take their timestamps from the history,
//! so the same history gives the same ids on both.

use super::ops::{
    clear_between_inputs, dump_or_empty, empty_forest_image, fuzz_tree, memory_forest_no_sync,
    FuzzMove, NODE_IDS,
};
use crate::disk::{DiskConfig, DiskFaults, SimDisk};
use arbitrary::{Arbitrary, Unstructured};
use arbor::forest::wal::{WalOptions, WalStorage};
use arbor::forest::{Forest, ForestOptions, TreeDump, WriteOp, WriteRequest};
use arbor::model::TreeModel;
use arbor::{KeyValue, LogEntry, NodeId, ROOT};
use std::cell::Cell;

/// Bounds on one input: batches per run, ops per batch, path components.
pub const MAX_BATCHES: usize = 12;
pub const MAX_BATCH_OPS: usize = 8;
pub const MAX_PATH: usize = 4;

/// The replica id of the forest under test (and of its reference).
const REPLICA_ID: u16 = 1;

#[derive(Arbitrary, Debug)]
pub struct Input {
    pub seed: u64,
    /// Chance (in 1/255) that an unsynced write is torn rather than lost.
    pub torn: u8,
    pub log: Log,
    pub batches: Vec<Batch>,
}

/// How the forest commits its batches.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Log {
    /// A durable redb commit per batch.
    PerBatch,
    /// The write-ahead log, with a checkpoint every `checkpoint * 64`
    /// bytes of log (plus 64), segments of `segment * 64` bytes (plus
    /// 1 KiB, below what a node may configure, so that a few batches fill
    /// one) and `(checkpoint ^ segment) % 3` spare segments: small, so
    /// checkpoints, rolls, removals and rolls into spares happen.
    Wal { checkpoint: u8, segment: u8 },
}

#[derive(Arbitrary, Debug)]
pub struct Batch {
    pub ops: Vec<CrashOp>,
    pub crash: Crash,
    /// The batch commits as a checkpoint (`Forest::request_checkpoint`).
    pub checkpoint: bool,
}

/// What goes wrong around one batch.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crash {
    Nothing,
    /// The power fails after the batch was acknowledged.
    PowerFailAfter,
    /// The power fails on its own after this many disk writes/syncs of the
    /// batch: inside the commit (nothing happens if the commit is shorter).
    CutDuring(u8),
    /// The disk returns I/O errors during the batch (chances in 1/255).
    IoErrors {
        write: u8,
        sync: u8,
    },
    /// The power fails after the batch, and again after this many disk
    /// writes/syncs of the reopen (its log replay and checkpoint).
    CutDuringReplay(u8),
    /// The power fails after the batch, and the reopen meets I/O errors
    /// (chances in 1/255) until it succeeds.
    IoErrorsDuringReplay {
        write: u8,
        sync: u8,
    },
}

/// A write; node operands index the nodes the tree has (ROOT included), so
/// local ops hit real nodes whatever ids their creation gave them.
#[derive(Arbitrary, Debug, Clone)]
pub enum CrashOp {
    Add { parent: u8, meta: u8 },
    Move { parent: u8, node: u8 },
    Remove { node: u8 },
    AddByPath { path: Vec<u8> },
    Apply(FuzzMove),
}

pub fn check(data: &[u8]) {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    run(&input);
}

fn options(log: Log) -> ForestOptions {
    let wal = match log {
        Log::PerBatch => WalOptions {
            enabled: false,
            ..WalOptions::default()
        },
        Log::Wal {
            checkpoint,
            segment,
        } => WalOptions {
            enabled: true,
            checkpoint_bytes: 64 + 64 * u64::from(checkpoint),
            segment_bytes: 1024 + 64 * u64::from(segment),
            spare_segments: usize::from((checkpoint ^ segment) % 3),
        },
    };
    ForestOptions {
        replica_id: REPLICA_ID,
        durable: true,
        wal,
        ..ForestOptions::default()
    }
}

/// Opens the forest on the disk's current power cycle, its log beside it.
fn open(disk: &SimDisk, log: Log) -> arbor::Result<Forest> {
    let backend = disk.backend_factory();
    let wal = disk.wal();
    Forest::open_with_wal(
        Box::new(move || Ok(redb::Builder::new().create_with_backend(backend()?)?)),
        Box::new(move || Ok(Box::new(wal.clone()) as Box<dyn WalStorage>)),
        options(log),
    )
}

/// Attempts at reopening under faults before they are switched off.
const REOPEN_TRIES_UNDER_FAULTS: usize = 4;

/// The forest under test, its disk, and the reference holding exactly the
/// acknowledged (or recovered) batches.
struct Run<'r> {
    disk: SimDisk,
    log: Log,
    /// A failed batch is followed by a reopen without a power failure.
    reopen_in_place: bool,
    forest: Option<Forest>,
    reference: &'r Forest,
    summary: Summary,
}

/// What a run went through, so tests can show both outcomes of an
/// unacknowledged batch really occur.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub recoveries: u64,
    /// Unacknowledged batches found committed after the crash.
    pub in_flight_kept: u64,
    /// Unacknowledged batches found absent after the crash.
    pub in_flight_lost: u64,
    pub writes_torn: u64,
    /// Reopens that failed (under injected faults) before one worked.
    pub failed_reopens: u64,
    /// Log records replayed by reopens, and checkpoints taken.
    pub replayed: u64,
    pub checkpoints: u64,
    pub segments_removed: u64,
    /// Rolls into a spare segment.
    pub segments_reused: u64,
}

thread_local! {
    /// The reference forest, opened once per thread and emptied before
    /// every input (`Forest::clear` restarts tree numbering too, so local
    /// ops get the same timestamps as on a fresh forest).
    static REFERENCE: Forest = memory_forest_no_sync(REPLICA_ID);
    /// Inputs run on this thread's reference forest.
    static INPUTS_RUN: Cell<u64> = const { Cell::new(0) };
}

pub fn run(input: &Input) -> Summary {
    let number = INPUTS_RUN.with(|n| n.replace(n.get() + 1));
    REFERENCE.with(|reference| {
        clear_between_inputs(reference, number);
        run_with(input, reference)
    })
}

fn run_with(input: &Input, reference: &Forest) -> Summary {
    let mut config = DiskConfig::reliable(input.seed);
    config.faults.torn_write_probability = f64::from(input.torn) / 255.0;
    // The disk starts with an empty forest already created and closed.
    let disk = SimDisk::with_image(config, empty_forest_image());
    let forest = open(&disk, input.log).expect("a forest opens on an empty disk");
    let mut run = Run {
        disk,
        log: input.log,
        reopen_in_place: input.seed & 1 == 1,
        forest: Some(forest),
        reference,
        summary: Summary::default(),
    };
    for batch in input.batches.iter().take(MAX_BATCHES) {
        run.batch(batch);
    }
    run.recover(None, Crash::Nothing);
    run.count_log();
    run.summary.writes_torn = run.disk.stats().writes_torn;
    run.summary
}

impl Run<'_> {
    fn batch(&mut self, batch: &Batch) {
        let requests = build_requests(&batch.ops, &dump_or_empty(self.reference));
        let power_failures = self.disk.stats().power_failures;
        arm(&self.disk, batch.crash);
        let forest = self.forest.as_ref().expect("forest open between batches");
        if batch.checkpoint {
            forest.request_checkpoint();
        }
        let result = forest.write_batch(&requests).map(|c| c.results);
        self.disk.set_power_cut_after(None);
        self.disk.set_faults(DiskFaults {
            torn_write_probability: self.disk.faults().torn_write_probability,
            ..DiskFaults::default()
        });
        let cut = self.disk.stats().power_failures > power_failures;
        match result {
            Ok(results) => {
                let expected = self
                    .reference
                    .write_batch(&requests)
                    .expect("the reference commits")
                    .results;
                assert_eq!(
                    results, expected,
                    "per-op results differ from the reference"
                );
                let replay_fault = matches!(
                    batch.crash,
                    Crash::CutDuringReplay(_) | Crash::IoErrorsDuringReplay { .. }
                );
                if cut || batch.crash == Crash::PowerFailAfter || replay_fault {
                    self.recover(None, batch.crash);
                }
            }
            // Not acknowledged: the batch may or may not have committed.
            Err(_) => {
                self.check_failed_batch_invisible();
                if self.reopen_in_place && !cut {
                    self.reopen_in_place(requests);
                } else {
                    self.recover(Some(requests), batch.crash);
                }
            }
        }
    }

    /// Adds the closing forest's log counts to the summary.
    fn count_log(&mut self) {
        if let Some(forest) = &self.forest {
            let stats = forest.wal_stats();
            self.summary.replayed += stats.replayed;
            self.summary.checkpoints += stats.checkpoints;
            self.summary.segments_removed += stats.segments_removed;
            self.summary.segments_reused += stats.segments_reused;
        }
    }

    /// The service's recovery after a failed batch: the database (and its
    /// log) reopened in place, no power failure. The forest must then
    /// hold the acknowledged state, or that plus the whole failed batch.
    fn reopen_in_place(&mut self, requests: Vec<WriteRequest>) {
        let forest = self.forest.as_ref().expect("forest open between batches");
        forest
            .reopen()
            .unwrap_or_else(|e| panic!("the forest does not reopen in place: {e}"));
        let state = stored_state(forest);
        check_consistent(forest, &state.0);
        if state != stored_state(self.reference) {
            self.summary.in_flight_kept += 1;
            self.reference
                .write_batch(&requests)
                .expect("the reference commits");
            assert_eq!(
                state,
                stored_state(self.reference),
                "a reopen left part of a failed batch, or something never written"
            );
        } else {
            self.summary.in_flight_lost += 1;
        }
    }

    /// Reopens after a power failure, under the faults `crash` asks for
    /// during the reopen: a reopen that fails is tried again (after
    /// another power failure when the cut struck), the faults switched off
    /// after a few tries.
    fn reopen_after_crash(&mut self, crash: Crash) -> Forest {
        for attempt in 0.. {
            let under_faults = attempt < REOPEN_TRIES_UNDER_FAULTS;
            match crash {
                Crash::CutDuringReplay(ops) if under_faults => {
                    self.disk.set_power_cut_after(Some(u64::from(ops % 16)))
                }
                Crash::IoErrorsDuringReplay { write, sync } if under_faults => {
                    arm(&self.disk, Crash::IoErrors { write, sync })
                }
                _ => {}
            }
            let opened = open(&self.disk, self.log);
            self.disk.set_power_cut_after(None);
            let torn = self.disk.faults().torn_write_probability;
            self.disk.set_faults(DiskFaults {
                torn_write_probability: torn,
                ..DiskFaults::default()
            });
            match opened {
                Ok(forest) => return forest,
                Err(e) if under_faults => {
                    self.summary.failed_reopens += 1;
                    tracing::debug!(%e, attempt, "reopen under faults failed");
                    // Whatever the failed open wrote is gone with the
                    // power, or left for the next open to read.
                    self.disk.power_fail();
                }
                Err(e) => panic!("the forest does not reopen after a power failure: {e}"),
            }
        }
        unreachable!("the loop returns")
    }

    /// Until the crash, a batch that reported failure must not be visible:
    /// reads either fail too or show the acknowledged state.
    fn check_failed_batch_invisible(&self) {
        let forest = self.forest.as_ref().expect("forest open between batches");
        if let Ok(state) = try_stored_state(forest) {
            assert_eq!(
                state,
                stored_state(self.reference),
                "a failed batch is visible to readers"
            );
        }
    }

    /// Power failure and restart: the reopened forest must hold the
    /// acknowledged state, or that state plus the whole in-flight batch.
    fn recover(&mut self, in_flight: Option<Vec<WriteRequest>>, crash: Crash) {
        self.disk.power_fail();
        self.count_log();
        // The old forest's destructor runs against a dead backend, as a
        // crashed process's would never run at all.
        drop(self.forest.take());
        let forest = self.reopen_after_crash(crash);
        let state = stored_state(&forest);
        check_consistent(&forest, &state.0);
        self.summary.recoveries += 1;
        if state == stored_state(self.reference) {
            self.summary.in_flight_lost += u64::from(in_flight.is_some());
        } else {
            self.summary.in_flight_kept += 1;
            let Some(requests) = in_flight else {
                panic!("acknowledged writes lost or changed by the crash: {state:?}");
            };
            self.reference
                .write_batch(&requests)
                .expect("the reference commits");
            assert_eq!(
                state,
                stored_state(self.reference),
                "the crash left part of a batch, or something never written"
            );
        }
        self.forest = Some(forest);
    }
}

/// Arms the fault this batch runs under.
fn arm(disk: &SimDisk, crash: Crash) {
    match crash {
        Crash::Nothing
        | Crash::PowerFailAfter
        | Crash::CutDuringReplay(_)
        | Crash::IoErrorsDuringReplay { .. } => {}
        Crash::CutDuring(ops) => disk.set_power_cut_after(Some(u64::from(ops % 32))),
        Crash::IoErrors { write, sync } => disk.set_faults(DiskFaults {
            write_error_probability: f64::from(write) / 255.0 / 4.0,
            sync_error_probability: f64::from(sync) / 255.0,
            torn_write_probability: disk.faults().torn_write_probability,
        }),
    }
}

type State = (TreeDump, Vec<LogEntry>);

/// The durable state that matters: the tree and its log in storage order.
fn stored_state(forest: &Forest) -> State {
    try_stored_state(forest).expect("reading a healthy forest")
}

fn try_stored_state(forest: &Forest) -> arbor::Result<State> {
    let tree = fuzz_tree();
    if !forest.tree_exists(&tree)? {
        let empty = TreeDump {
            nodes: Vec::new(),
            log: Vec::new(),
        };
        return Ok((empty, Vec::new()));
    }
    let log = forest.get_op_log(&tree, 0, 100_000)?;
    Ok((forest.dump(&tree)?, log))
}

/// The stored nodes are what the paper's model makes of the stored log,
/// and the stored indexes agree with them.
fn check_consistent(forest: &Forest, dump: &TreeDump) {
    let tree = fuzz_tree();
    if forest.tree_exists(&tree).expect("tree_exists") {
        if let Err(e) = forest.check_invariants(&tree) {
            panic!("invariant broken after recovery: {e}");
        }
    }
    let mut model = TreeModel::new();
    for op in &dump.log {
        model.apply(op);
    }
    assert_eq!(
        model.dump(),
        *dump,
        "stored nodes disagree with the stored log"
    );
}

/// Turns fuzz ops into requests against the nodes `state` holds.
fn build_requests(ops: &[CrashOp], state: &TreeDump) -> Vec<WriteRequest> {
    let mut known: Vec<NodeId> = vec![ROOT];
    known.extend(state.nodes.iter().map(|n| n.id));
    let pick = |i: u8| known[usize::from(i) % known.len()];
    ops.iter()
        .take(MAX_BATCH_OPS)
        .map(|op| WriteRequest {
            tree: fuzz_tree(),
            op: match op {
                CrashOp::Add { parent, meta } => WriteOp::Move {
                    parent: pick(*parent),
                    child: None,
                    items: vec![KeyValue::new("FileName", vec![b'a' + meta % 3])],
                },
                CrashOp::Move { parent, node } => WriteOp::Move {
                    parent: pick(*parent),
                    child: Some(pick(*node)),
                    items: Vec::new(),
                },
                CrashOp::Remove { node } => WriteOp::Remove { node: pick(*node) },
                CrashOp::AddByPath { path } => WriteOp::AddByPath {
                    attr: "FileName".into(),
                    path: path
                        .iter()
                        .take(MAX_PATH)
                        .map(|c| char::from(b'a' + c % NODE_IDS.min(3)).to_string())
                        .collect(),
                    items: vec![KeyValue::new("FileName", "leaf")],
                },
                CrashOp::Apply(m) => WriteOp::Apply { op: m.to_move() },
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(parent: u8) -> CrashOp {
        CrashOp::Add { parent, meta: 0 }
    }

    /// Power cuts at every point of a commit, and failing syncs that may or
    /// may not have persisted, must reach both outcomes of an
    /// unacknowledged batch (lost, and committed without an acknowledgement)
    /// so the target's all-or-nothing check has teeth.
    #[test]
    fn power_cuts_reach_both_outcomes_of_a_batch() {
        let mut total = Summary::default();
        for cut in 0..24u8 {
            let batches = (0..3)
                .map(|i| Batch {
                    ops: vec![add(i), add(i + 1), CrashOp::Remove { node: 1 }],
                    crash: if i == 1 {
                        Crash::CutDuring(cut)
                    } else {
                        Crash::Nothing
                    },
                    checkpoint: false,
                })
                .collect();
            let summary = run(&Input {
                seed: u64::from(cut),
                torn: 128,
                log: if cut % 3 == 0 {
                    Log::PerBatch
                } else {
                    Log::Wal {
                        checkpoint: cut,
                        segment: 0,
                    }
                },
                batches,
            });
            total.recoveries += summary.recoveries;
            total.in_flight_kept += summary.in_flight_kept;
            total.in_flight_lost += summary.in_flight_lost;
            total.writes_torn += summary.writes_torn;
        }
        for seed in 0..32 {
            let batches = (0..3)
                .map(|i| Batch {
                    ops: vec![add(i), add(i + 1)],
                    crash: if i == 1 {
                        Crash::IoErrors {
                            write: 0,
                            sync: 128,
                        }
                    } else {
                        Crash::Nothing
                    },
                    checkpoint: false,
                })
                .collect();
            let summary = run(&Input {
                seed,
                torn: 0,
                log: Log::Wal {
                    checkpoint: 200,
                    segment: 0,
                },
                batches,
            });
            total.in_flight_kept += summary.in_flight_kept;
            total.in_flight_lost += summary.in_flight_lost;
        }
        assert!(total.in_flight_lost > 0, "{total:?}");
        assert!(total.in_flight_kept > 0, "{total:?}");
        assert!(total.writes_torn > 0, "{total:?}");
        assert!(total.recoveries > 24, "{total:?}");
    }

    /// The log's own paths are reached: records replayed after crashes
    /// (also while the power fails or the disk errs during the replay),
    /// checkpoints by size and on request, segments removed.
    #[test]
    fn crashes_reach_the_logs_replay_checkpoints_and_segment_removal() {
        let mut total = Summary::default();
        for seed in 0..24u64 {
            let crash = |i: u64| match (i + seed) % 6 {
                0 => Crash::PowerFailAfter,
                1 => Crash::CutDuringReplay((seed % 9) as u8),
                2 => Crash::IoErrorsDuringReplay {
                    write: 60,
                    sync: 120,
                },
                3 => Crash::CutDuring((seed % 7) as u8),
                _ => Crash::Nothing,
            };
            let batches = (0..MAX_BATCHES as u64)
                .map(|i| Batch {
                    ops: (0..MAX_BATCH_OPS as u8)
                        .map(|j| CrashOp::AddByPath {
                            path: vec![i as u8, j, 1],
                        })
                        .collect(),
                    crash: crash(i),
                    checkpoint: i == 5,
                })
                .collect();
            let summary = run(&Input {
                seed,
                torn: 200,
                // Two spares in even seeds, none in odd ones.
                log: Log::Wal {
                    checkpoint: 8,
                    segment: (seed % 2) as u8,
                },
                batches,
            });
            total.replayed += summary.replayed;
            total.checkpoints += summary.checkpoints;
            total.segments_removed += summary.segments_removed;
            total.segments_reused += summary.segments_reused;
            total.failed_reopens += summary.failed_reopens;
            total.in_flight_kept += summary.in_flight_kept;
        }
        assert!(total.replayed > 0, "{total:?}");
        assert!(total.checkpoints > 0, "{total:?}");
        assert!(total.segments_removed > 0, "{total:?}");
        assert!(total.segments_reused > 0, "{total:?}");
        assert!(total.failed_reopens > 0, "{total:?}");
    }
}
