//! Structured fuzz inputs for tree ops over deliberately tiny spaces: a
//! handful of node ids and timestamps, so that cycles, moves to TRASH,
//! missing parents, duplicates and same-timestamp collisions show up in
//! almost every input instead of almost never.

use crate::disk::{DiskConfig, SimDisk};
use arbitrary::Arbitrary;
use arbor::forest::{Forest, ForestOptions, TreeDump};
use arbor::model::TreeModel;
use arbor::Error;
use arbor::{make_timestamp, ContainerId, KeyValue, Meta, Move, NodeId, TreeKey, ROOT, TRASH};
use std::sync::OnceLock;

/// Upper bound on ops per input, so one input stays cheap however long the
/// fuzzer's byte string is.
pub const MAX_OPS: usize = 64;

/// Node ids 1..=NODE_IDS are real nodes; ROOT and TRASH come on top.
pub const NODE_IDS: u8 = 6;

/// Lamport counters 1..=COUNTERS; small so that timestamps interleave.
pub const COUNTERS: u8 = 24;

/// Replica ids 1..=REPLICAS.
pub const REPLICAS: u8 = 3;

/// The tree every fuzz op goes to.
pub fn fuzz_tree() -> TreeKey {
    TreeKey::new(ContainerId([7; 32]), "fuzz")
}

/// One replicated move, every field drawn from a tiny space.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub struct FuzzMove {
    pub parent: u8,
    pub child: u8,
    pub counter: u8,
    pub replica: u8,
    pub meta: u8,
}

impl FuzzMove {
    /// The op this input stands for. A few byte values give invalid ops
    /// (ROOT or TRASH as child, timestamp 0) that the forest must refuse.
    pub fn to_move(self) -> Move {
        let time = if self.counter == u8::MAX {
            0
        } else {
            make_timestamp(
                1 + u64::from(self.counter % COUNTERS),
                1 + u16::from(self.replica % REPLICAS),
            )
        };
        Move {
            parent: parent_id(self.parent),
            child: child_id(self.child),
            meta: Meta {
                time,
                items: items(self.meta),
            },
        }
    }
}

/// ROOT is the most common parent: paths start there, and duplicate
/// directory names need siblings.
fn parent_id(byte: u8) -> NodeId {
    match byte % (NODE_IDS + 4) {
        0..=2 => ROOT,
        3 => TRASH,
        k => NodeId::from(k - 3),
    }
}

fn child_id(byte: u8) -> NodeId {
    match byte {
        u8::MAX => ROOT,
        0xfe => TRASH,
        k => 1 + NodeId::from(k % NODE_IDS),
    }
}

/// A few metas: none, directory names (so path-index updates and duplicate
/// directories happen), and a leaf with a non-path attribute.
fn items(byte: u8) -> Vec<KeyValue> {
    match byte % 5 {
        0 => Vec::new(),
        1 | 2 => vec![KeyValue::new("FileName", "a")],
        3 => vec![KeyValue::new("FileName", "b")],
        _ => vec![
            KeyValue::new("FileName", "a"),
            KeyValue::new("Color", vec![byte]),
        ],
    }
}

/// True for ops the forest must accept; the rest must get a typed error.
pub fn is_valid(op: &Move) -> bool {
    op.ts() != 0 && op.child != ROOT && op.child != TRASH
}

/// The reference state: the paper's model fed the valid ops, first op per
/// timestamp wins (later ones with the same timestamp are refused).
pub fn model_of<'a>(ops: impl IntoIterator<Item = &'a Move>) -> TreeModel {
    let mut model = TreeModel::new();
    for op in ops.into_iter().filter(|op| is_valid(op)) {
        model.apply(op);
    }
    model
}

/// A forest in memory, as the fuzz targets need it: durable commits cost
/// nothing there.
pub fn memory_forest(replica_id: u16) -> Forest {
    Forest::in_memory(ForestOptions {
        replica_id,
        ..ForestOptions::default()
    })
    .expect("an in-memory forest opens")
}

/// An in-memory forest committing without durability, as `fast_forest`.
pub fn memory_forest_no_sync(replica_id: u16) -> Forest {
    Forest::in_memory(ForestOptions {
        replica_id,
        durable: false,
        ..ForestOptions::default()
    })
    .expect("an in-memory forest opens")
}

/// The durable image of a freshly created, cleanly closed empty forest,
/// built once per process: creating redb's tables is most of the cost of a
/// small fuzz input.
pub fn empty_forest_image() -> Vec<u8> {
    static EMPTY_FOREST: OnceLock<Vec<u8>> = OnceLock::new();
    EMPTY_FOREST
        .get_or_init(|| {
            let disk = SimDisk::new(DiskConfig::reliable(0));
            let forest = Forest::open_with_backend(disk.backend(), ForestOptions::default())
                .expect("a forest opens on an empty simulated disk");
            drop(forest);
            disk.durable_image()
        })
        .clone()
}

/// A forest on a fault-free simulated disk that starts from an empty forest
/// built once per process (creating redb's tables is most of the cost of a
/// small fuzz input). Commits are not durable: `apply_oplog` checks the
/// algorithm, `crash_recovery` checks durability.
pub fn fast_forest(replica_id: u16) -> Forest {
    let disk = SimDisk::with_image(DiskConfig::reliable(0), empty_forest_image());
    let options = ForestOptions {
        replica_id,
        durable: false,
        ..ForestOptions::default()
    };
    Forest::open_with_backend(disk.backend(), options).expect("the empty forest reopens")
}

/// redb page size of the `apply_oplog` forests. Their trees are tiny (at
/// most `MAX_OPS` ops), and every commit copies and zeroes each page it
/// touches: with redb's default 4 KiB pages that zeroing and copying was
/// an eighth of a run; 1 KiB pages cut the run by 8% (512 B pages split
/// the tables into more pages and cost more again). The forest does not
/// see pages (it talks to redb in keys and values); smaller pages only
/// make redb split and merge its B-trees more often. redb offers
/// `set_page_size` to fuzzing builds only (`cfg(fuzzing)`, set by
/// cargo-fuzz): the corpus replay of `cargo test` runs the same inputs on
/// the default 4 KiB pages, so both sizes see every committed input.
pub const FUZZ_PAGE_BYTES: usize = 1024;

#[cfg(fuzzing)]
fn small_page_builder() -> redb::Builder {
    let mut builder = redb::Builder::new();
    builder.set_page_size(FUZZ_PAGE_BYTES);
    builder
}

#[cfg(not(fuzzing))]
fn small_page_builder() -> redb::Builder {
    redb::Builder::new()
}

/// Options of a harness forest that commits without durability.
fn no_sync_options(replica_id: u16) -> ForestOptions {
    ForestOptions {
        replica_id,
        durable: false,
        ..ForestOptions::default()
    }
}

/// `fast_forest` with `FUZZ_PAGE_BYTES` pages: starts from the image of
/// an empty small-page forest (built once per process), reopenable over
/// the same simulated disk.
pub fn fast_small_page_forest(replica_id: u16) -> Forest {
    static EMPTY_IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    let image = EMPTY_IMAGE.get_or_init(|| {
        let disk = SimDisk::new(DiskConfig::reliable(0));
        drop(open_small_page_forest(&disk, ForestOptions::default()));
        disk.durable_image()
    });
    let disk = SimDisk::with_image(DiskConfig::reliable(0), image.clone());
    open_small_page_forest(&disk, no_sync_options(replica_id))
}

fn open_small_page_forest(disk: &SimDisk, options: ForestOptions) -> Forest {
    let disk = disk.clone();
    let opener = move || Ok(small_page_builder().create_with_backend(disk.backend())?);
    Forest::open_reopenable(Box::new(opener), options).expect("a small-page forest opens")
}

/// `memory_forest_no_sync` with `FUZZ_PAGE_BYTES` pages.
pub fn memory_small_page_forest(replica_id: u16) -> Forest {
    let db = small_page_builder()
        .create_with_backend(redb::backends::InMemoryBackend::new())
        .expect("an in-memory database opens");
    Forest::from_database(db, no_sync_options(replica_id)).expect("an in-memory forest opens")
}

/// Every this many inputs a harness forest is cleared durably; in between
/// without sync.
pub const DURABLE_CLEAR_EVERY: u64 = 64;

/// Empties a forest reused across inputs (`number` counts the inputs run
/// on it). The harness forests commit without durability anyway and redb
/// frees the pages of non-durable commits at once, so most clears skip
/// the flush of a durable commit, which was a fifth of an `apply_oplog`
/// run; the periodic durable one keeps the simulated disk's unsynced
/// writes bounded.
pub fn clear_between_inputs(forest: &Forest, number: u64) {
    let cleared = if number.is_multiple_of(DURABLE_CLEAR_EVERY) {
        forest.clear()
    } else {
        forest.clear_without_sync()
    };
    cleared.expect("a fault-free forest clears");
}

/// The dump of the fuzz tree, or an empty one if the tree was never
/// created (every op of the input was refused). One read transaction:
/// asking `tree_exists` first would cost a second one.
pub fn dump_or_empty(forest: &Forest) -> TreeDump {
    match forest.dump(&fuzz_tree()) {
        Ok(dump) => dump,
        Err(Error::TreeNotFound) => TreeDump {
            nodes: Vec::new(),
            log: Vec::new(),
        },
        Err(e) => panic!("dump: {e}"),
    }
}

/// Cuts `len` items into batch sizes taken from `sizes` (each a power of
/// two up to 16, so that small batches, where undo/redo crosses batch
/// boundaries, are common; cycling; one batch of everything when `sizes` is
/// empty).
pub fn batch_sizes(len: usize, sizes: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut left = len;
    let mut i = 0;
    while left > 0 {
        let size = match sizes.get(i % sizes.len().max(1)) {
            Some(&b) => 1 << (b % 5),
            None => left,
        };
        out.push(size.min(left));
        left -= size.min(left);
        i += 1;
    }
    out
}

/// A deterministic permutation of `items` from `seed` (Fisher-Yates).
pub fn shuffled<T: Clone>(items: &[T], seed: u64) -> Vec<T> {
    let mut rng = crate::disk::SplitMix64::new(seed);
    let mut out = items.to_vec();
    for i in (1..out.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        out.swap(i, j);
    }
    out
}
