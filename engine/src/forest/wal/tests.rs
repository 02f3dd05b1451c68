//! The log's format and the forest's use of it, on an in-memory file
//! system that loses everything not synced when it "crashes".

use super::*;
use crate::forest::{Forest, ForestOptions, WriteOp, WriteOutcome, WriteRequest};
use crate::types::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// One file: what reads see, and what survives a crash.
#[derive(Clone, Default)]
struct MemFile {
    current: Vec<u8>,
    durable: Vec<u8>,
    /// Its name is in the directory now / durably.
    linked: bool,
    durable_linked: bool,
}

#[derive(Default)]
struct Fs {
    files: BTreeMap<String, MemFile>,
    /// Bumped by a crash: handles of an earlier one fail.
    generation: u64,
    /// Syncs of files named `wal-*` fail from now on.
    fail_wal_syncs: bool,
    /// Called before each sync of a `wal-*` file.
    on_wal_sync: Option<Arc<dyn Fn() + Send + Sync>>,
}

/// A crashable in-memory file system shared by handles.
#[derive(Clone, Default)]
struct MemFs(Arc<Mutex<Fs>>);

impl MemFs {
    fn lock(&self) -> std::sync::MutexGuard<'_, Fs> {
        self.0.lock().unwrap()
    }

    /// The power goes out: only synced bytes and synced names stay.
    fn crash(&self) {
        let mut fs = self.lock();
        fs.generation += 1;
        fs.files.retain(|_, f| f.durable_linked);
        for file in fs.files.values_mut() {
            file.current = file.durable.clone();
            file.linked = true;
        }
    }

    fn handle(&self, name: &str) -> MemHandle {
        let mut fs = self.lock();
        let generation = fs.generation;
        let file = fs.files.entry(name.to_string()).or_default();
        file.linked = true;
        MemHandle {
            fs: self.clone(),
            name: name.to_string(),
            generation,
        }
    }

    /// Gives file `from` the name `to`; until the directory is synced a
    /// crash brings the old name back and drops the new one.
    fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
        let mut fs = self.lock();
        let file = fs
            .files
            .get_mut(from)
            .filter(|f| f.linked)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
        file.linked = false;
        let renamed = MemFile {
            linked: true,
            durable_linked: false,
            ..file.clone()
        };
        fs.files.insert(to.to_string(), renamed);
        Ok(())
    }

    /// Spare segments present now.
    fn spare_segments(&self) -> usize {
        let fs = self.lock();
        fs.files
            .iter()
            .filter(|(n, f)| n.starts_with("spare-") && f.linked)
            .count()
    }

    fn wal_segments(&self) -> usize {
        let fs = self.lock();
        fs.files
            .iter()
            .filter(|(n, f)| n.starts_with("wal-") && f.linked)
            .count()
    }

    /// A forest whose database is the file `db` and whose log is here.
    fn forest(&self, options: ForestOptions) -> crate::Result<Forest> {
        let (db_fs, wal_fs) = (self.clone(), self.clone());
        Forest::open_with_wal(
            Box::new(move || {
                let handle = db_fs.handle("db");
                Ok(redb::Builder::new().create_with_backend(handle)?)
            }),
            Box::new(move || Ok(Box::new(MemWal(wal_fs.clone())) as Box<dyn WalStorage>)),
            options,
        )
    }
}

#[derive(Debug)]
struct MemHandle {
    fs: MemFs,
    name: String,
    generation: u64,
}

impl std::fmt::Debug for MemFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MemFs")
    }
}

impl MemHandle {
    fn with<T>(
        &self,
        op: impl FnOnce(&mut Fs, &mut MemFile) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        let mut fs = self.fs.lock();
        if fs.generation != self.generation {
            return Err(std::io::Error::other("crashed"));
        }
        let mut file = fs.files.get(&self.name).cloned().unwrap_or_default();
        let out = op(&mut fs, &mut file);
        fs.files.insert(self.name.clone(), file);
        out
    }
}

impl redb::StorageBackend for MemHandle {
    fn len(&self) -> std::io::Result<u64> {
        self.with(|_, f| Ok(f.current.len() as u64))
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.with(|_, f| {
            let end = offset as usize + out.len();
            out.copy_from_slice(&f.current[offset as usize..end]);
            Ok(())
        })
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.with(|_, f| {
            f.current.resize(len as usize, 0);
            Ok(())
        })
    }
    fn sync_data(&self) -> std::io::Result<()> {
        let wal = self.name.starts_with("wal-");
        let hook = self.fs.lock().on_wal_sync.clone().filter(|_| wal);
        if let Some(hook) = hook {
            hook();
        }
        self.with(|fs, f| {
            if wal && fs.fail_wal_syncs {
                return Err(std::io::Error::other("injected sync failure"));
            }
            f.durable = f.current.clone();
            Ok(())
        })
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.with(|_, f| {
            f.current[offset as usize..offset as usize + data.len()].copy_from_slice(data);
            Ok(())
        })
    }
}

/// The log's directory on a [`MemFs`].
struct MemWal(MemFs);

impl WalStorage for MemWal {
    fn segments(&self) -> std::io::Result<Vec<u64>> {
        let fs = self.0.lock();
        Ok(fs
            .files
            .iter()
            .filter(|(_, f)| f.linked)
            .filter_map(|(n, _)| n.strip_prefix("wal-")?.parse().ok())
            .collect())
    }
    fn open(&self, number: u64) -> std::io::Result<Box<dyn redb::StorageBackend>> {
        Ok(Box::new(self.0.handle(&format!("wal-{number}"))))
    }
    fn remove(&self, number: u64) -> std::io::Result<()> {
        if let Some(f) = self.0.lock().files.get_mut(&format!("wal-{number}")) {
            f.linked = false;
        }
        Ok(())
    }
    fn sync_dir(&self) -> std::io::Result<()> {
        let mut fs = self.0.lock();
        fs.files.retain(|_, f| f.linked);
        for file in fs.files.values_mut() {
            file.durable_linked = true;
        }
        Ok(())
    }
    fn spares(&self) -> std::io::Result<Vec<u64>> {
        let fs = self.0.lock();
        Ok(fs
            .files
            .iter()
            .filter(|(_, f)| f.linked)
            .filter_map(|(n, _)| n.strip_prefix("spare-")?.parse().ok())
            .collect())
    }
    fn retire(&self, number: u64) -> std::io::Result<()> {
        self.0
            .rename(&format!("wal-{number}"), &format!("spare-{number}"))
    }
    fn reuse(&self, spare: u64, number: u64) -> std::io::Result<()> {
        self.0
            .rename(&format!("spare-{spare}"), &format!("wal-{number}"))
    }
    fn remove_spare(&self, spare: u64) -> std::io::Result<()> {
        if let Some(f) = self.0.lock().files.get_mut(&format!("spare-{spare}")) {
            f.linked = false;
        }
        Ok(())
    }
}

/// Options without spares: covered segments are removed.
fn options(checkpoint_bytes: u64, segment_bytes: u64) -> WalOptions {
    WalOptions {
        enabled: true,
        checkpoint_bytes,
        segment_bytes,
        spare_segments: 0,
    }
}

fn open_with_spares(fs: &MemFs, checkpointed: u64, spares: usize) -> (Wal, Vec<Replayed>) {
    let options = WalOptions {
        spare_segments: spares,
        ..options(u64::MAX, 4096)
    };
    Wal::open(Box::new(MemWal(fs.clone())), options, checkpointed).unwrap()
}

fn open_log(fs: &MemFs, checkpointed: u64) -> (Wal, Vec<Replayed>) {
    Wal::open(
        Box::new(MemWal(fs.clone())),
        options(u64::MAX, 4096),
        checkpointed,
    )
    .unwrap()
}

fn seqs(records: &[Replayed]) -> Vec<u64> {
    records.iter().map(|r| r.seq).collect()
}

#[test]
fn records_come_back_in_order_after_a_crash_and_the_checkpoint_is_passed_over() {
    let fs = MemFs::default();
    let (mut wal, replay) = open_log(&fs, 0);
    assert!(replay.is_empty());
    for i in 0..40u64 {
        // Sizes that make the log roll over several 4 KiB segments.
        assert_eq!(wal.append(&vec![i as u8; 300 + i as usize]).unwrap(), i + 1);
    }
    assert!(
        wal.segment_numbers().len() > 2,
        "{:?}",
        wal.segment_numbers()
    );
    drop(wal);
    fs.crash();
    let (wal, replay) = open_log(&fs, 0);
    assert_eq!(seqs(&replay), (1..=40).collect::<Vec<_>>());
    assert_eq!(replay[39].payload, vec![39u8; 339]);
    assert_eq!(wal.last_seq(), 40);
    drop(wal);
    let (_, replay) = open_log(&fs, 25);
    assert_eq!(seqs(&replay), (26..=40).collect::<Vec<_>>());
}

#[test]
fn replay_stops_at_a_torn_record_and_never_skips_to_a_good_one() {
    let fs = MemFs::default();
    let (mut wal, _) = open_log(&fs, 0);
    for i in 0..5u8 {
        wal.append(&[i; 100]).unwrap();
    }
    drop(wal);
    // Record 3 (0-based 2) damaged in the middle of its payload: 4 and 5
    // after it are good but must not be replayed.
    let at = 2 * (RECORD_HEADER_BYTES as usize + 100) + RECORD_HEADER_BYTES as usize + 50;
    fs.lock().files.get_mut("wal-0").unwrap().current[at] ^= 0xff;
    let (mut wal, replay) = open_log(&fs, 0);
    assert_eq!(seqs(&replay), vec![1, 2]);
    // The next record takes the damaged one's place and number.
    assert_eq!(wal.append(&[9; 10]).unwrap(), 3);
    drop(wal);
    let (_, replay) = open_log(&fs, 0);
    assert_eq!(seqs(&replay), vec![1, 2, 3]);
    assert_eq!(replay[2].payload, vec![9; 10]);
}

#[test]
fn a_torn_header_ends_the_log() {
    let fs = MemFs::default();
    let (mut wal, _) = open_log(&fs, 0);
    for i in 0..3u8 {
        wal.append(&[i; 64]).unwrap();
    }
    drop(wal);
    // The sequence number of record 3 torn.
    let at = 2 * (RECORD_HEADER_BYTES as usize + 64) + 5;
    fs.lock().files.get_mut("wal-0").unwrap().current[at] ^= 1;
    let (_, replay) = open_log(&fs, 0);
    assert_eq!(seqs(&replay), vec![1, 2]);
}

#[test]
fn a_good_segment_after_a_damaged_one_is_an_error() {
    let fs = MemFs::default();
    let (mut wal, _) = open_log(&fs, 0);
    for i in 0..30u8 {
        wal.append(&[i; 500]).unwrap();
    }
    assert!(wal.segment_numbers().len() >= 3);
    drop(wal);
    fs.lock().files.get_mut("wal-0").unwrap().current[RECORD_HEADER_BYTES as usize] ^= 1;
    let error = Wal::open(Box::new(MemWal(fs.clone())), options(u64::MAX, 4096), 0)
        .err()
        .expect("damage before good records is refused");
    assert!(error.to_string().contains("after a damaged one"), "{error}");
}

#[test]
fn a_checkpoint_removes_only_segments_it_covers() {
    let fs = MemFs::default();
    let (mut wal, _) = open_log(&fs, 0);
    for i in 0..30u8 {
        wal.append(&[i; 500]).unwrap();
    }
    let before = wal.segment_numbers();
    wal.checkpointed(10).unwrap();
    let after = wal.segment_numbers();
    assert!(
        after.len() < before.len() && after.len() > 1,
        "{before:?} {after:?}"
    );
    drop(wal);
    fs.crash();
    // Removals were synced; what is left still holds 11..=30.
    assert_eq!(fs.wal_segments(), after.len());
    let (mut wal, replay) = open_log(&fs, 10);
    assert_eq!(seqs(&replay), (11..=30).collect::<Vec<_>>());
    wal.checkpointed(30).unwrap();
    assert_eq!(wal.segment_numbers().len(), 1, "the written segment stays");
}

/// A log of 30 records of 500 bytes (over 4 KiB segments) checkpointed
/// at its last record: the covered segments become spares, two at most.
fn log_with_spares(fs: &MemFs) -> Wal {
    let (mut wal, _) = open_with_spares(fs, 0, 2);
    for i in 0..30u8 {
        wal.append(&[i; 500]).unwrap();
    }
    let live = wal.segment_numbers().len();
    assert!(live >= 4, "{live} segments");
    wal.checkpointed(30).unwrap();
    assert_eq!(wal.segment_numbers().len(), 1, "the written segment stays");
    assert_eq!(wal.stats.segments_retired, 2);
    assert_eq!(wal.stats.segments_removed as usize, live - 3);
    assert_eq!(wal.spare_numbers().len(), 2);
    assert_eq!(fs.spare_segments(), 2);
    wal
}

#[test]
fn a_roll_into_a_spare_writes_no_zeros_and_its_old_records_are_never_replayed() {
    let fs = MemFs::default();
    let mut wal = log_with_spares(&fs);
    let (created, preallocated) = (wal.stats.segments_created, wal.stats.preallocated);
    // Shorter records than the spares hold, so the new ones end in the
    // middle of old ones.
    let mut last = 30;
    while wal.stats.segments_reused < 2 {
        last = wal.append(&[last as u8; 300]).unwrap();
    }
    assert!(last > 40, "{last}");
    assert_eq!(
        (wal.stats.segments_created, wal.stats.preallocated),
        (created, preallocated),
        "a spare is written already"
    );
    assert_eq!(fs.spare_segments(), 0);
    drop(wal);
    fs.crash();
    let (mut wal, replay) = open_with_spares(&fs, 30, 2);
    assert_eq!(seqs(&replay), (31..=last).collect::<Vec<_>>());
    assert!(replay
        .iter()
        .all(|r| r.payload == vec![r.seq as u8 - 1; 300]));
    assert_eq!(wal.last_seq(), last);
    assert_eq!(wal.append(&[1; 10]).unwrap(), last + 1);
    drop(wal);
    let (_, replay) = open_with_spares(&fs, 40, 2);
    assert_eq!(seqs(&replay), (41..=last + 1).collect::<Vec<_>>());
}

#[test]
fn a_torn_first_record_of_a_spare_ends_the_log_before_its_old_records() {
    let fs = MemFs::default();
    let mut wal = log_with_spares(&fs);
    let written = *wal.segment_numbers().last().unwrap();
    // Fill the written segment, then one record rolls into a spare.
    let mut seq = 30;
    while wal.segment_numbers().len() == 1 {
        seq = wal.append(&[7; 300]).unwrap();
    }
    let spare = *wal.segment_numbers().last().unwrap();
    assert!(spare > written);
    drop(wal);
    fs.lock()
        .files
        .get_mut(&format!("wal-{spare}"))
        .unwrap()
        .current[30] ^= 1;
    let (mut wal, replay) = open_with_spares(&fs, 30, 2);
    assert_eq!(seqs(&replay), (31..seq).collect::<Vec<_>>());
    assert_eq!(
        wal.append(&[8; 10]).unwrap(),
        seq,
        "the torn record's number"
    );
    drop(wal);
    let (_, replay) = open_with_spares(&fs, 30, 2);
    assert_eq!(replay.last().unwrap().payload, vec![8; 10]);
}

#[test]
fn a_spare_after_a_damaged_segment_holds_only_old_records_and_is_no_error() {
    let fs = MemFs::default();
    let mut wal = log_with_spares(&fs);
    for i in 0..3u8 {
        wal.append(&[i; 200]).unwrap();
    }
    let written = *wal.segment_numbers().last().unwrap();
    let spare = wal.spare_numbers()[0];
    drop(wal);
    // A roll renamed a spare into the log, then the last record before it
    // was found torn: the spare's first record is an old one.
    MemWal(fs.clone()).reuse(spare, written + 1).unwrap();
    let tail = {
        let fs = fs.lock();
        let file = &fs.files[&format!("wal-{written}")];
        let end = file.current.iter().rposition(|b| *b != 0).unwrap();
        end - 10
    };
    fs.lock()
        .files
        .get_mut(&format!("wal-{written}"))
        .unwrap()
        .current[tail] ^= 1;
    let (wal, replay) = open_with_spares(&fs, 30, 2);
    assert_eq!(seqs(&replay), vec![31, 32]);
    assert_eq!(wal.segment_numbers(), vec![written]);
    // A good record after the damage is still refused.
    drop(wal);
    let (mut wal, _) = open_with_spares(&fs, 30, 2);
    while wal.segment_numbers().len() == 1 {
        wal.append(&[5; 300]).unwrap();
    }
    drop(wal);
    fs.lock()
        .files
        .get_mut(&format!("wal-{written}"))
        .unwrap()
        .current[tail] ^= 1;
    let error = Wal::open(
        Box::new(MemWal(fs.clone())),
        WalOptions {
            spare_segments: 2,
            ..options(u64::MAX, 4096)
        },
        30,
    )
    .err()
    .expect("damage before good records is refused");
    assert!(error.to_string().contains("after a damaged one"), "{error}");
}

#[test]
fn spares_over_the_limit_are_removed_on_open() {
    let fs = MemFs::default();
    drop(log_with_spares(&fs));
    let (wal, _) = open_with_spares(&fs, 30, 1);
    assert_eq!(wal.spare_numbers().len(), 1);
    drop(wal);
    fs.crash();
    assert_eq!(fs.spare_segments(), 1, "the removal was synced");
    let (wal, _) = open_with_spares(&fs, 30, 0);
    assert!(wal.spare_numbers().is_empty());
    assert_eq!(fs.spare_segments(), 0);
}

// ---- the forest on its log ----

fn tree(name: &str) -> TreeKey {
    TreeKey::new(ContainerId([7; 32]), name)
}

fn add(tree_name: &str, path: &[&str], leaf: &str) -> WriteRequest {
    WriteRequest {
        tree: tree(tree_name),
        op: WriteOp::AddByPath {
            attr: ATTR_FILE_NAME.into(),
            path: path
                .iter()
                .map(|s| s.to_string())
                .chain([leaf.to_string()])
                .collect(),
            items: vec![KeyValue::new("k", leaf.as_bytes())],
        },
    }
}

/// Everything replay must reproduce, per tree: its number, dump, stamps
/// (heights, timestamps, digests) and next height.
fn state(forest: &Forest, names: &[&str]) -> Vec<String> {
    names
        .iter()
        .map(|name| {
            let key = tree(name);
            let stamps = forest.get_op_log_stamps(&key, 0, usize::MAX).unwrap();
            format!(
                "{:?} {:?} {:?} {}",
                forest.tree_incarnation(&key).unwrap(),
                forest.dump(&key).unwrap(),
                stamps,
                forest.next_height(&key).unwrap()
            )
        })
        .collect()
}

fn wal_forest_options(checkpoint_bytes: u64, segment_bytes: u64) -> ForestOptions {
    ForestOptions {
        wal: options(checkpoint_bytes, segment_bytes),
        ..ForestOptions::default()
    }
}

/// Batches of local writes to trees created in an order other than
/// their names', and replicated ops older than the local ones (an undo
/// and redo), and a local remove.
fn run_batches(forest: &Forest, rounds: usize) {
    for round in 0..rounds {
        let mut batch = vec![
            add(
                "t-b",
                &["d", &format!("r{}", round % 3)],
                &format!("x{round}"),
            ),
            add("t-a", &["e"], &format!("y{round}")),
        ];
        // A remote op from replica 9, older than what the tree holds.
        batch.push(WriteRequest {
            tree: tree("t-a"),
            op: WriteOp::Apply {
                op: Move {
                    parent: ROOT,
                    child: make_timestamp(1 + round as u64, 9),
                    meta: Meta {
                        time: make_timestamp(1 + round as u64, 9),
                        items: vec![KeyValue::new(
                            ATTR_FILE_NAME,
                            format!("z{round}").as_bytes(),
                        )],
                    },
                },
            },
        });
        let committed = forest.write_batch(&batch).unwrap();
        if round % 4 == 3 {
            let Ok(WriteOutcome::AddedByPath { leaf, .. }) = committed.results[0] else {
                panic!("{:?}", committed.results[0]);
            };
            forest
                .write_batch(&[WriteRequest {
                    tree: tree("t-b"),
                    op: WriteOp::Remove { node: leaf },
                }])
                .unwrap();
        }
    }
}

#[test]
fn replay_after_a_crash_gives_the_same_numbers_heights_and_counters() {
    let fs = MemFs::default();
    let forest = fs.forest(wal_forest_options(u64::MAX, 1 << 20)).unwrap();
    assert!(forest.has_wal());
    forest.write_batch(&[add("t-c", &[], "first")]).unwrap();
    forest.checkpoint().unwrap();
    run_batches(&forest, 12);
    let names = ["t-a", "t-b", "t-c"];
    let before = state(&forest, &names);
    let records = forest.wal_stats().records;
    assert!(records >= 12, "{:?}", forest.wal_stats());
    fs.crash();
    drop(forest);
    let forest = fs.forest(wal_forest_options(u64::MAX, 1 << 20)).unwrap();
    // Every record but the first batch's, which the checkpoint covers.
    assert_eq!(forest.wal_stats().replayed, records - 1);
    assert_eq!(state(&forest, &names), before);
    // The counters went on from where the first run left them: the same
    // write on a forest that never crashed gets the same timestamps.
    let reference = Forest::in_memory(ForestOptions::default()).unwrap();
    reference.write_batch(&[add("t-c", &[], "first")]).unwrap();
    run_batches(&reference, 12);
    assert_eq!(state(&reference, &names), before);
    let next = [add("t-b", &["d"], "after"), add("t-a", &[], "after")];
    assert_eq!(
        forest.write_batch(&next).unwrap().results,
        reference.write_batch(&next).unwrap().results
    );
    // The replay was checkpointed: a second crash replays nothing more.
    let after = state(&forest, &names);
    fs.crash();
    drop(forest);
    let forest = fs.forest(wal_forest_options(u64::MAX, 1 << 20)).unwrap();
    assert_eq!(
        forest.wal_stats().replayed,
        1,
        "only the write after the replay"
    );
    assert_eq!(state(&forest, &names), after);
}

#[test]
fn checkpoints_by_bytes_let_segments_go_and_a_crash_loses_nothing() {
    for spares in [0, 2] {
        let fs = MemFs::default();
        let mut options = wal_forest_options(6000, 4096);
        options.wal.spare_segments = spares;
        let open = || fs.forest(options.clone()).unwrap();
        let forest = open();
        run_batches(&forest, 40);
        let stats = forest.wal_stats();
        assert!(stats.checkpoints >= 2, "{stats:?}");
        let gone = stats.segments_removed + stats.segments_retired;
        assert!(stats.segments_created >= 2 && gone >= 2, "{stats:?}");
        if spares > 0 {
            assert!(stats.segments_reused >= 1, "{stats:?}");
        } else {
            assert_eq!(stats.segments_reused + stats.segments_retired, 0);
        }
        assert!(
            fs.wal_segments() <= 4 && fs.spare_segments() <= spares,
            "{} segments and {} spares left",
            fs.wal_segments(),
            fs.spare_segments()
        );
        let names = ["t-a", "t-b"];
        let before = state(&forest, &names);
        fs.crash();
        drop(forest);
        let forest = open();
        assert_eq!(state(&forest, &names), before, "spares {spares}");
    }
}

#[test]
fn a_graceful_close_then_open_replays_without_diverging() {
    // redb makes pending non-durable commits durable when it closes: the
    // position stored with each batch says which records it then holds.
    let fs = MemFs::default();
    let forest = fs.forest(wal_forest_options(u64::MAX, 1 << 20)).unwrap();
    run_batches(&forest, 6);
    let before = state(&forest, &["t-a", "t-b"]);
    drop(forest);
    let forest = fs.forest(wal_forest_options(u64::MAX, 1 << 20)).unwrap();
    assert_eq!(state(&forest, &["t-a", "t-b"]), before);
}

#[test]
fn nothing_of_a_batch_is_visible_before_its_record_is_synced() {
    let fs = MemFs::default();
    let forest = Arc::new(fs.forest(wal_forest_options(u64::MAX, 1 << 20)).unwrap());
    forest.write_batch(&[add("t-a", &["d"], "old")]).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (weak, seen_in) = (Arc::downgrade(&forest), seen.clone());
    fs.lock().on_wal_sync = Some(Arc::new(move || {
        let forest = weak.upgrade().expect("the forest lives");
        let path = ["d".to_string(), "new".to_string()];
        let found = forest
            .get_by_path(&tree("t-a"), ATTR_FILE_NAME, &path, false)
            .unwrap();
        seen_in.lock().unwrap().push(found.len());
    }));
    forest.write_batch(&[add("t-a", &["d"], "new")]).unwrap();
    fs.lock().on_wal_sync = None;
    assert_eq!(*seen.lock().unwrap(), vec![0], "not visible while syncing");
    let path = ["d".to_string(), "new".to_string()];
    let found = forest
        .get_by_path(&tree("t-a"), ATTR_FILE_NAME, &path, false)
        .unwrap();
    assert_eq!(found.len(), 1, "visible once committed");
}

#[test]
fn a_failed_log_sync_fails_the_batch_and_a_reopen_recovers() {
    let fs = MemFs::default();
    let forest = fs.forest(wal_forest_options(u64::MAX, 1 << 20)).unwrap();
    forest.write_batch(&[add("t-a", &[], "kept")]).unwrap();
    fs.lock().fail_wal_syncs = true;
    let error = forest
        .write_batch(&[add("t-a", &[], "failed")])
        .unwrap_err();
    assert!(matches!(error, crate::Error::Storage(_)), "{error:?}");
    let path = ["failed".to_string()];
    let found = forest
        .get_by_path(&tree("t-a"), ATTR_FILE_NAME, &path, false)
        .unwrap();
    assert!(found.is_empty(), "a failed batch is not visible");
    // The log refuses appends until the forest is reopened.
    fs.lock().fail_wal_syncs = false;
    assert!(forest.write_batch(&[add("t-a", &[], "refused")]).is_err());
    forest.reopen().unwrap();
    forest.write_batch(&[add("t-a", &[], "later")]).unwrap();
    let before = state(&forest, &["t-a"]);
    fs.crash();
    drop(forest);
    let forest = fs.forest(wal_forest_options(u64::MAX, 1 << 20)).unwrap();
    assert_eq!(state(&forest, &["t-a"]), before);
}

#[test]
fn what_a_torn_append_left_after_a_shorter_record_never_ends_the_log_early() {
    // Without spares: segments are made with zeros, but a reopen writes
    // over a torn record from its start, and a shorter record leaves the
    // rest of it behind.
    let fs = MemFs::default();
    let (mut wal, _) = open_log(&fs, 0);
    for i in 0..3u8 {
        wal.append(&[i; 200]).unwrap();
    }
    drop(wal);
    // Record 4, 3,300 bytes, torn: its header and most of its payload
    // made it to the disk, synced; its checksum fails.
    let mut torn = Vec::new();
    torn.extend_from_slice(&3300u32.to_le_bytes());
    torn.extend_from_slice(&4u64.to_le_bytes());
    torn.extend_from_slice(&0x1234u64.to_le_bytes());
    torn.extend_from_slice(&[0xee; 3200]);
    let at = 3 * (RECORD_HEADER_BYTES as usize + 200);
    {
        let mut fs = fs.lock();
        let file = fs.files.get_mut("wal-0").unwrap();
        file.current[at..at + torn.len()].copy_from_slice(&torn);
        file.durable = file.current.clone();
    }
    let (mut wal, replay) = open_log(&fs, 0);
    assert_eq!(seqs(&replay), vec![1, 2, 3]);
    assert_eq!(wal.append(&[4; 10]).unwrap(), 4);
    // Records too long to fit after record 4: the log rolls, leaving the
    // rest of the torn one after record 4.
    let mut last = 4;
    while wal.segment_numbers().len() < 3 {
        last = wal.append(&[5; 3500]).unwrap();
    }
    drop(wal);
    let (wal, replay) = open_log(&fs, 0);
    assert_eq!(seqs(&replay), (1..=last).collect::<Vec<_>>());
    assert_eq!(wal.last_seq(), last);
}
