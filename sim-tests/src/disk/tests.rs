//! The simulated disk's tests: its semantics against a flat model, and
//! redb on top of it.

use super::*;
use redb::{Database, ReadableDatabase, ReadableTable, StorageBackend, TableDefinition};

const TABLE: TableDefinition<u64, u64> = TableDefinition::new("t");

fn disk(seed: u64, torn: f64) -> SimDisk {
    let mut config = DiskConfig::reliable(seed);
    config.faults.torn_write_probability = torn;
    SimDisk::new(config)
}

#[test]
fn synced_data_survives_power_failure() {
    let d = disk(1, 0.0);
    let b = d.backend();
    b.set_len(1024).unwrap();
    b.write(0, &[7; 1024]).unwrap();
    b.sync_data().unwrap();
    d.power_fail();
    let b = d.backend();
    let mut out = [0; 1024];
    b.read(0, &mut out).unwrap();
    assert_eq!(out, [7; 1024]);
}

#[test]
fn unsynced_data_is_lost_without_tearing() {
    let d = disk(2, 0.0);
    let b = d.backend();
    b.set_len(1024).unwrap();
    b.sync_data().unwrap();
    b.write(0, &[9; 1024]).unwrap();
    d.power_fail();
    let b = d.backend();
    let mut out = [1; 1024];
    b.read(0, &mut out).unwrap();
    assert_eq!(out, [0; 1024]);
    assert_eq!(d.stats().writes_lost, 1);
}

#[test]
fn unsynced_growth_is_lost() {
    let d = disk(3, 1.0);
    let b = d.backend();
    b.set_len(4096).unwrap();
    b.write(0, &[5; 4096]).unwrap();
    d.power_fail();
    assert_eq!(d.backend().len().unwrap(), 0);
}

#[test]
fn torn_writes_keep_whole_blocks_only() {
    // Over several seeds some blocks must survive and some not, and each
    // block is either all old or all new.
    let mut survived = 0;
    let mut lost = 0;
    for seed in 0..8 {
        let d = disk(seed, 1.0);
        let b = d.backend();
        b.set_len(8 * 512).unwrap();
        b.sync_data().unwrap();
        b.write(100, &[3; 7 * 512]).unwrap();
        let written = {
            let mut out = vec![0; 8 * 512];
            b.read(0, &mut out).unwrap();
            out
        };
        d.power_fail();
        let image = d.durable_image();
        for (old, new) in image.chunks(512).zip(written.chunks(512)) {
            if old == new {
                survived += 1;
            } else {
                assert!(old.iter().all(|&x| x == 0), "block torn inside");
                lost += 1;
            }
        }
        assert_eq!(d.stats().writes_torn, 1);
    }
    assert!(survived > 0 && lost > 0, "survived {survived} lost {lost}");
}

#[test]
fn same_seed_same_tearing() {
    let image = |seed| {
        let d = disk(seed, 1.0);
        let b = d.backend();
        b.set_len(64 * 512).unwrap();
        b.sync_data().unwrap();
        for i in 0..64u64 {
            b.write(i * 512, &[i as u8 + 1; 512]).unwrap();
        }
        d.power_fail();
        d.durable_image()
    };
    assert_eq!(image(42), image(42));
    assert_ne!(image(42), image(43));
}

#[test]
fn sync_makes_the_durable_image_equal_the_written_one() {
    // Shrinks, regrowth and overlapping writes between syncs: the
    // incremental sync must still copy everything that changed.
    let d = disk(7, 0.0);
    let b = d.backend();
    let mut rng = SplitMix64::new(7);
    for round in 0..200u64 {
        match rng.next_u64() % 4 {
            0 => b.set_len(rng.next_u64() % 8192).unwrap(),
            1 => b.sync_data().unwrap(),
            _ => {
                let len = b.len().unwrap();
                if len > 0 {
                    let offset = rng.next_u64() % len;
                    let size = 1 + rng.next_u64() % (len - offset).min(700);
                    b.write(offset, &vec![round as u8; size as usize]).unwrap();
                }
            }
        }
    }
    b.sync_data().unwrap();
    let mut written = vec![0; b.len().unwrap() as usize];
    b.read(0, &mut written).unwrap();
    assert_eq!(d.durable_image(), written);
    d.power_fail();
    let mut after = vec![0; d.backend().len().unwrap() as usize];
    d.backend().read(0, &mut after).unwrap();
    assert_eq!(after, written);
}

#[test]
fn backends_of_an_earlier_power_cycle_are_dead() {
    let d = disk(4, 0.0);
    let old = d.backend();
    old.set_len(512).unwrap();
    old.sync_data().unwrap();
    d.power_fail();
    assert!(old.write(0, &[1; 512]).is_err());
    assert!(old.sync_data().is_err());
    let mut out = [9; 512];
    d.backend().read(0, &mut out).unwrap();
    assert_eq!(out, [0; 512]);
    assert_eq!(d.stats().stale_calls, 2);
}

#[test]
fn latency_is_charged_and_taken_once() {
    let mut config = DiskConfig::reliable(5);
    config.latency = DiskLatency {
        per_write: Duration::from_micros(10),
        per_sync: Duration::from_millis(1),
        per_byte_nanos: 1,
    };
    let d = SimDisk::new(config);
    let b = d.backend();
    b.set_len(1000).unwrap();
    b.write(0, &[0; 1000]).unwrap();
    b.sync_data().unwrap();
    assert_eq!(
        d.take_latency(),
        Duration::from_micros(10) + Duration::from_micros(1) + Duration::from_millis(1)
    );
    assert_eq!(d.take_latency(), Duration::ZERO);
}

/// The disk's semantics written the obvious way (flat byte images,
/// every pending write keeps a copy of its bytes), drawing its fault
/// decisions in the same order: the paged disk must agree with it on
/// every read, every durable image and every statistic.
struct FlatModel {
    block_size: u64,
    faults: DiskFaults,
    rng: SplitMix64,
    current: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<(u64, Vec<u8>)>,
    torn: u64,
}

impl FlatModel {
    fn new(config: &DiskConfig) -> Self {
        Self {
            block_size: config.block_size,
            faults: config.faults,
            rng: SplitMix64::new(config.seed),
            current: Vec::new(),
            durable: Vec::new(),
            pending: Vec::new(),
            torn: 0,
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> bool {
        if self.rng.chance(self.faults.write_error_probability) {
            return false;
        }
        let at = offset as usize;
        self.current[at..at + data.len()].copy_from_slice(data);
        self.pending.push((offset, data.to_vec()));
        true
    }

    fn sync(&mut self) -> bool {
        if self.rng.chance(self.faults.sync_error_probability) {
            if self.rng.chance(0.5) {
                self.durable = self.current.clone();
                self.pending.clear();
            }
            return false;
        }
        self.durable = self.current.clone();
        self.pending.clear();
        true
    }

    fn set_len(&mut self, len: u64) {
        self.current.resize(len as usize, 0);
    }

    fn power_fail(&mut self) {
        for (offset, data) in std::mem::take(&mut self.pending) {
            if !self.rng.chance(self.faults.torn_write_probability) {
                continue;
            }
            self.torn += 1;
            let end = offset + data.len() as u64;
            let mut start = offset;
            while start < end {
                let chunk_end = ((start / self.block_size + 1) * self.block_size).min(end);
                let keep = self.rng.chance(0.5);
                for at in start..chunk_end.min(self.durable.len() as u64) {
                    if keep {
                        self.durable[at as usize] = data[(at - offset) as usize];
                    }
                }
                start = chunk_end;
            }
        }
        self.current = self.durable.clone();
    }
}

fn read_all(b: &SimBackend) -> Vec<u8> {
    let mut out = vec![0xaa; b.len().unwrap() as usize];
    b.read(0, &mut out).unwrap();
    out
}

#[test]
fn paged_disk_agrees_with_the_flat_model() {
    // Block sizes that divide the page, equal it and do not divide it;
    // writes that straddle pages, overlap unsynced writes, shrink and
    // regrow the file, and fail.
    for (seed, block_size) in [(1, 512), (2, 4096), (3, 1000), (4, 3000), (5, 64)] {
        let mut config = DiskConfig::reliable(seed);
        config.block_size = block_size;
        config.faults = DiskFaults {
            write_error_probability: 0.05,
            sync_error_probability: 0.1,
            torn_write_probability: 0.7,
        };
        let disk = SimDisk::new(config);
        let mut model = FlatModel::new(&config);
        let mut b = disk.backend();
        let mut ops = SplitMix64::new(seed + 100);
        for round in 0..3000u64 {
            match ops.next_u64() % 16 {
                0 => {
                    let len = ops.next_u64() % 40_000;
                    b.set_len(len).unwrap();
                    model.set_len(len);
                }
                1 | 2 => assert_eq!(b.sync_data().is_ok(), model.sync(), "round {round}"),
                3 => {
                    disk.power_fail();
                    model.power_fail();
                    b = disk.backend();
                    assert_eq!(disk.durable_image(), model.durable, "round {round}");
                }
                _ => {
                    let len = b.len().unwrap();
                    if len == 0 {
                        continue;
                    }
                    let offset = match ops.next_u64() % 3 {
                        0 => (ops.next_u64() % len) / 4096 * 4096,
                        _ => ops.next_u64() % len,
                    };
                    let size = 1 + ops.next_u64() % (len - offset).min(9000);
                    let data: Vec<u8> = (0..size).map(|i| (round + i) as u8 | 1).collect();
                    assert_eq!(
                        b.write(offset, &data).is_ok(),
                        model.write(offset, &data),
                        "round {round}"
                    );
                }
            }
            assert_eq!(read_all(&b), model.current, "seed {seed} round {round}");
        }
        assert_eq!(disk.stats().writes_torn, model.torn);
        assert!(model.torn > 0, "seed {seed}: some writes were torn");
    }
}

fn commit(db: &Database, key: u64, durability: redb::Durability) -> Result<(), redb::Error> {
    let mut tx = db.begin_write()?;
    tx.set_durability(durability)
        .expect("no persistent savepoints in these tests");
    {
        let mut table = tx.open_table(TABLE)?;
        table.insert(key, key * 10)?;
    }
    tx.commit()?;
    Ok(())
}

fn keys(db: &Database) -> Vec<u64> {
    let tx = db.begin_read().unwrap();
    let table = match tx.open_table(TABLE) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return vec![],
        Err(e) => panic!("{e}"),
    };
    table
        .iter()
        .unwrap()
        .map(|r| {
            let (k, v) = r.unwrap();
            assert_eq!(v.value(), k.value() * 10);
            k.value()
        })
        .collect()
}

#[test]
fn redb_reopens_with_exactly_the_committed_state() {
    let mut torn = 0;
    for seed in 0..16 {
        let d = disk(seed, 0.5);
        // A tiny cache pushes the non-durable commits out to the disk.
        let db = Database::builder()
            .set_cache_size(0)
            .create_with_backend(d.backend())
            .unwrap();
        for key in 0..5 {
            commit(&db, key, redb::Durability::Immediate).unwrap();
        }
        // Not durable: must vanish at the power failure, torn or not.
        for key in 100..400 {
            commit(&db, key, redb::Durability::None).unwrap();
        }
        assert!(d.pending_writes() > 0);
        d.power_fail();
        torn += d.stats().writes_torn;
        drop(db);
        let db = Database::builder()
            .create_with_backend(d.backend())
            .unwrap();
        assert_eq!(keys(&db), vec![0, 1, 2, 3, 4], "seed {seed}");
    }
    assert!(torn > 0, "some unsynced writes were torn, not only lost");
}

#[test]
fn power_cut_inside_a_commit_keeps_a_prefix() {
    // Cut the power at every possible point of the third commit: the
    // database must reopen with the first two commits, plus the third
    // only when its commit had returned.
    let mut cut = 0;
    loop {
        let d = disk(cut, 0.5);
        let db = Database::builder()
            .create_with_backend(d.backend())
            .unwrap();
        commit(&db, 1, redb::Durability::Immediate).unwrap();
        commit(&db, 2, redb::Durability::Immediate).unwrap();
        d.set_power_cut_after(Some(cut));
        let acked = commit(&db, 3, redb::Durability::Immediate).is_ok();
        let fired = d.stats().power_failures > 0;
        d.power_fail();
        drop(db);
        let db = Database::builder()
            .create_with_backend(d.backend())
            .unwrap();
        let got = keys(&db);
        if acked {
            assert_eq!(got, vec![1, 2, 3], "cut {cut}");
        } else {
            assert!(
                got == vec![1, 2] || got == vec![1, 2, 3],
                "cut {cut}: {got:?}"
            );
        }
        if !fired {
            break;
        }
        cut += 1;
    }
    assert!(cut > 1, "the commit did at least two writes or syncs");
}

#[test]
fn injected_errors_surface_as_redb_errors() {
    let d = disk(6, 0.0);
    let db = Database::builder()
        .create_with_backend(d.backend())
        .unwrap();
    commit(&db, 1, redb::Durability::Immediate).unwrap();
    d.set_faults(DiskFaults {
        sync_error_probability: 1.0,
        ..DiskFaults::default()
    });
    assert!(commit(&db, 2, redb::Durability::Immediate).is_err());
    d.set_faults(DiskFaults {
        write_error_probability: 1.0,
        ..DiskFaults::default()
    });
    assert!(commit(&db, 3, redb::Durability::Immediate).is_err());
    let stats = d.stats();
    assert!(stats.sync_errors_injected >= 1);
    d.set_faults(DiskFaults::default());
    d.power_fail();
    drop(db);
    let db = Database::builder()
        .create_with_backend(d.backend())
        .unwrap();
    // The failed sync may have persisted commit 2 (only its report
    // failed); the failed write cannot have persisted commit 3.
    let got = keys(&db);
    assert!(got == vec![1] || got == vec![1, 2], "{got:?}");
}

/// The log's files share the disk's power cycle: an unsynced creation or
/// removal is undone by a power failure, synced data and names survive,
/// and a handle of the old cycle is dead.
#[test]
fn wal_files_need_a_synced_directory_to_survive_a_power_failure() {
    use arbor::forest::wal::WalStorage;
    let disk = SimDisk::new(DiskConfig::reliable(3));
    let wal = disk.wal();
    let kept = wal.open(0).unwrap();
    kept.set_len(4096).unwrap();
    kept.write(0, b"record").unwrap();
    kept.sync_data().unwrap();
    wal.sync_dir().unwrap();
    let unsynced_name = wal.open(1).unwrap();
    unsynced_name.set_len(4096).unwrap();
    unsynced_name.sync_data().unwrap();
    wal.remove(0).unwrap();
    assert_eq!(wal.segments().unwrap(), vec![1]);
    disk.power_fail();
    assert!(kept.write(0, b"x").is_err(), "a handle of the old cycle");
    let wal = disk.wal();
    assert_eq!(
        wal.segments().unwrap(),
        vec![0],
        "creation lost, removal undone"
    );
    let mut out = [0u8; 6];
    wal.open(0).unwrap().read(0, &mut out).unwrap();
    assert_eq!(&out, b"record");
    wal.remove(0).unwrap();
    wal.sync_dir().unwrap();
    disk.power_fail();
    assert!(disk.wal().segments().unwrap().is_empty());
    assert_eq!(disk.wal_files(), 0);
}

/// A segment kept as a spare and a spare taken back are renames: until the
/// directory is synced a power failure brings the old name back with its
/// synced contents; after the sync only the new name holds them.
#[test]
fn wal_renames_need_a_synced_directory_to_survive_a_power_failure() {
    use arbor::forest::wal::WalStorage;
    let disk = SimDisk::new(DiskConfig::reliable(4));
    let wal = disk.wal();
    let segment = wal.open(0).unwrap();
    segment.set_len(4096).unwrap();
    segment.write(0, b"old").unwrap();
    segment.sync_data().unwrap();
    wal.sync_dir().unwrap();
    drop(segment);
    wal.retire(0).unwrap();
    assert!(wal.segments().unwrap().is_empty());
    assert_eq!(wal.spares().unwrap(), vec![0]);
    disk.power_fail();
    let wal = disk.wal();
    assert_eq!(wal.segments().unwrap(), vec![0], "the rename undone");
    assert!(wal.spares().unwrap().is_empty());
    wal.retire(0).unwrap();
    wal.sync_dir().unwrap();
    wal.reuse(0, 5).unwrap();
    let reused = wal.open(5).unwrap();
    let mut out = [0u8; 3];
    reused.read(0, &mut out).unwrap();
    assert_eq!(&out, b"old", "a spare keeps what it held");
    assert_eq!(reused.len().unwrap(), 4096);
    reused.write(0, b"new").unwrap();
    disk.power_fail();
    let wal = disk.wal();
    assert_eq!(
        (wal.segments().unwrap(), wal.spares().unwrap()),
        (vec![], vec![0]),
        "the second rename undone, the first kept"
    );
    wal.reuse(0, 5).unwrap();
    wal.sync_dir().unwrap();
    let reused = wal.open(5).unwrap();
    reused.write(0, b"new").unwrap();
    reused.sync_data().unwrap();
    wal.remove_spare(7).unwrap();
    disk.power_fail();
    let wal = disk.wal();
    assert_eq!(
        (wal.segments().unwrap(), wal.spares().unwrap()),
        (vec![5], vec![])
    );
    wal.open(5).unwrap().read(0, &mut out).unwrap();
    assert_eq!(&out, b"new");
    assert_eq!(disk.wal_files(), 1);
}
