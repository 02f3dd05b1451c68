//! The write-ahead log in front of the forest's database
//! (docs/design.md §5).
//!
//! Each batch's resolved ops go to the log as one record, made durable by
//! one `sync_data`, before the batch's redb transaction commits without
//! durability. A checkpoint is a durable redb commit that stores the
//! sequence number of the last record it covers; records up to it are not
//! needed any more, and whole segments of them are removed.
//!
//! A record is `length (4) ++ sequence (8) ++ checksum (8) ++ payload`,
//! integers little-endian; the checksum is xxh3 of the payload seeded with
//! the length and the sequence number, so a torn header fails it as well
//! as a torn payload. Sequence numbers grow by one per record, across
//! segments. Segments are preallocated (zero-filled by `set_len`, synced,
//! their directory synced) when the log rolls into them; a zero header
//! ends a segment's records.
//!
//! A segment a checkpoint covers is kept as a spare (renamed) while fewer
//! than `spare_segments` are, and the log rolls into a spare before it
//! makes a new segment: the spare's blocks are written already, so the
//! roll writes no zeros. Its old records stay until new ones overwrite
//! them; each is older than every record the log held when the spare was
//! retired, so none can pass for the next one. Before the log rolls, a
//! zero header (synced) ends the segment it leaves, whatever bytes follow
//! its last record.
//!
//! Opening reads every segment in order and stops at the first record that
//! is torn, fails its checksum or breaks the sequence: what follows it in
//! its segment is never read, and a later segment that starts with a good
//! record (one newer than the last record kept) is an error (the log was
//! damaged in the middle), not something to skip to. Every record it kept
//! is synced again before new ones are written after it.

mod storage;
#[cfg(test)]
mod tests;

pub use storage::{wal_dir_of, DirStorage, WalOpener, WalStorage};

use crate::error::{Error, Result};
use redb::StorageBackend;

/// Bytes of a record's header.
pub const RECORD_HEADER_BYTES: u64 = 20;

/// How the log is laid out and when it is checkpointed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalOptions {
    /// Batches go through the log (false: every batch is a durable redb
    /// commit, `pilorama.wal`).
    pub enabled: bool,
    /// A batch that finds this many log bytes written since the last
    /// checkpoint commits durably itself, as a checkpoint
    /// (`pilorama.checkpoint_bytes`).
    pub checkpoint_bytes: u64,
    /// Size of a preallocated segment (`pilorama.wal_segment_bytes`); a
    /// record larger than it gets a segment of its own size.
    pub segment_bytes: u64,
    /// Covered segments kept to be written again instead of removed
    /// (`pilorama.wal_spare_segments`).
    pub spare_segments: usize,
}

impl Default for WalOptions {
    fn default() -> Self {
        Self {
            enabled: true,
            checkpoint_bytes: crate::config::PILORAMA_CHECKPOINT_BYTES_DEFAULT,
            segment_bytes: crate::config::PILORAMA_WAL_SEGMENT_BYTES_DEFAULT,
            spare_segments: crate::config::PILORAMA_WAL_SPARE_SEGMENTS_DEFAULT,
        }
    }
}

/// What the log did since the forest opened it (all opens added up).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalStats {
    /// Records appended.
    pub records: u64,
    /// Bytes appended, headers included.
    pub bytes: u64,
    /// `sync_data` calls on segments and syncs of the directory.
    pub syncs: u64,
    /// Durable redb commits that recorded a log position.
    pub checkpoints: u64,
    pub segments_created: u64,
    /// Bytes of the segments created (a file-system log writes them as
    /// zeros when it preallocates).
    pub preallocated: u64,
    pub segments_removed: u64,
    /// Rolls into a spare segment instead of a new one.
    pub segments_reused: u64,
    /// Covered segments kept as spares.
    pub segments_retired: u64,
    /// Records replayed into the database when it was opened.
    pub replayed: u64,
}

impl WalStats {
    /// Both counts added up.
    pub fn plus(&self, other: &WalStats) -> WalStats {
        WalStats {
            records: self.records + other.records,
            bytes: self.bytes + other.bytes,
            syncs: self.syncs + other.syncs,
            checkpoints: self.checkpoints + other.checkpoints,
            segments_created: self.segments_created + other.segments_created,
            preallocated: self.preallocated + other.preallocated,
            segments_removed: self.segments_removed + other.segments_removed,
            segments_reused: self.segments_reused + other.segments_reused,
            segments_retired: self.segments_retired + other.segments_retired,
            replayed: self.replayed + other.replayed,
        }
    }
}

/// One live segment.
struct Segment {
    number: u64,
    /// Sequence number of its first record; `None` while it holds none.
    first_seq: Option<u64>,
    /// The file's length.
    size: u64,
    file: Box<dyn StorageBackend>,
}

/// A record found on open that the last checkpoint does not cover.
#[derive(Debug)]
pub(crate) struct Replayed {
    pub seq: u64,
    pub payload: Vec<u8>,
}

pub(crate) struct Wal {
    storage: Box<dyn WalStorage>,
    options: WalOptions,
    /// Oldest first; never empty once open.
    segments: Vec<Segment>,
    /// Spare segments by number, at most `options.spare_segments`.
    spares: Vec<u64>,
    /// Where the next record goes in the last segment.
    offset: u64,
    /// The last record appended (or, before any, the checkpoint).
    last_seq: u64,
    /// The last record a durable redb commit covers.
    checkpointed: u64,
    /// Log bytes appended since the last checkpoint.
    since_checkpoint: u64,
    /// An append failed: what it left is unknown until the log is opened
    /// again (with the database, by `Forest::reopen`).
    failed: bool,
    pub stats: WalStats,
}

fn io(what: &str, error: std::io::Error) -> Error {
    Error::Storage(format!("write-ahead log: {what}: {error}"))
}

fn checksum(len: u32, seq: u64, payload: &[u8]) -> u64 {
    let seed = seq ^ (u64::from(len) << 40) ^ 0x5741_4c00_0000_0000;
    xxhash_rust::xxh3::xxh3_64_with_seed(payload, seed)
}

/// How a segment's scan ended.
enum ScanEnd {
    /// A zero header or the end of the file: the segment's records end.
    Clean,
    /// A torn or bad record at this offset.
    Bad,
}

impl Wal {
    /// Opens the log in `storage` for a database whose last checkpoint
    /// covers record `checkpointed`, and returns the records after it, in
    /// order. Creates the first segment when there is none.
    pub fn open(
        storage: Box<dyn WalStorage>,
        options: WalOptions,
        checkpointed: u64,
    ) -> Result<(Self, Vec<Replayed>)> {
        assert!(options.segment_bytes >= RECORD_HEADER_BYTES, "validated");
        let mut numbers = storage.segments().map_err(|e| io("listing", e))?;
        numbers.sort_unstable();
        let mut wal = Self {
            storage,
            options,
            segments: Vec::new(),
            spares: Vec::new(),
            offset: 0,
            last_seq: checkpointed,
            checkpointed,
            since_checkpoint: 0,
            failed: false,
            stats: WalStats::default(),
        };
        let mut replay = Vec::new();
        let mut previous: Option<u64> = None;
        let mut stopped = false;
        for number in numbers {
            let file = wal
                .storage
                .open(number)
                .map_err(|e| io("opening a segment", e))?;
            if stopped {
                if Self::first_record_follows(&*file, previous)? {
                    return Err(Error::Storage(format!(
                        "write-ahead log: segment {number} holds records after a damaged one"
                    )));
                }
                drop(file);
                wal.storage
                    .remove(number)
                    .map_err(|e| io("removing a segment after the end", e))?;
                wal.stats.segments_removed += 1;
                continue;
            }
            let size = file.len().map_err(|e| io("reading", e))?;
            let mut segment = Segment {
                number,
                first_seq: None,
                size,
                file,
            };
            let (end, offset) = wal.scan(&mut segment, &mut previous, &mut replay)?;
            wal.segments.push(segment);
            wal.offset = offset;
            stopped = matches!(end, ScanEnd::Bad);
        }
        if let Some(last) = previous {
            wal.last_seq = wal.last_seq.max(last);
        }
        wal.keep_spares()?;
        if wal.segments.is_empty() {
            wal.roll(0)?;
        } else {
            // What the scan accepted may sit in a cache that a failed sync
            // left unsynced: made durable before anything follows it.
            for segment in &wal.segments {
                segment
                    .file
                    .sync_data()
                    .map_err(|e| io("syncing a segment", e))?;
                wal.stats.syncs += 1;
            }
            wal.storage
                .sync_dir()
                .map_err(|e| io("syncing the directory", e))?;
            wal.stats.syncs += 1;
        }
        wal.since_checkpoint = replay
            .iter()
            .map(|r: &Replayed| RECORD_HEADER_BYTES + r.payload.len() as u64)
            .sum();
        wal.stats.replayed = replay.len() as u64;
        Ok((wal, replay))
    }

    /// Reads one header at `offset`, `None` past the end of the file.
    fn header(file: &dyn StorageBackend, offset: u64, len: u64) -> Result<Option<(u32, u64, u64)>> {
        if offset + RECORD_HEADER_BYTES > len {
            return Ok(None);
        }
        let mut header = [0u8; RECORD_HEADER_BYTES as usize];
        file.read(offset, &mut header)
            .map_err(|e| io("reading", e))?;
        let length = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
        let seq = u64::from_le_bytes(header[4..12].try_into().expect("8 bytes"));
        let sum = u64::from_le_bytes(header[12..20].try_into().expect("8 bytes"));
        Ok(Some((length, seq, sum)))
    }

    /// The whole record at `offset` when its checksum holds.
    fn record_at(
        file: &dyn StorageBackend,
        offset: u64,
        len: u64,
    ) -> Result<Option<(u64, Vec<u8>)>> {
        let Some((length, seq, sum)) = Self::header(file, offset, len)? else {
            return Ok(None);
        };
        let end = offset + RECORD_HEADER_BYTES + u64::from(length);
        if (length == 0 && seq == 0) || end > len {
            return Ok(None);
        }
        let mut payload = vec![0u8; length as usize];
        file.read(offset + RECORD_HEADER_BYTES, &mut payload)
            .map_err(|e| io("reading", e))?;
        Ok((checksum(length, seq, &payload) == sum).then_some((seq, payload)))
    }

    /// True when the segment's first record is good and newer than
    /// `previous` (a spare's old records are not).
    fn first_record_follows(file: &dyn StorageBackend, previous: Option<u64>) -> Result<bool> {
        let len = file.len().map_err(|e| io("reading", e))?;
        Ok(Self::record_at(file, 0, len)?.is_some_and(|(seq, _)| previous.is_none_or(|p| seq > p)))
    }

    /// Lists the spares found on open, keeping at most
    /// `options.spare_segments` of them and removing the rest.
    fn keep_spares(&mut self) -> Result<()> {
        let mut spares = self.storage.spares().map_err(|e| io("listing spares", e))?;
        spares.sort_unstable();
        let extra = spares.len().saturating_sub(self.options.spare_segments);
        for spare in spares.drain(..extra) {
            self.storage
                .remove_spare(spare)
                .map_err(|e| io("removing a spare segment", e))?;
            self.stats.segments_removed += 1;
        }
        if extra > 0 {
            self.storage
                .sync_dir()
                .map_err(|e| io("syncing the directory", e))?;
            self.stats.syncs += 1;
        }
        self.spares = spares;
        Ok(())
    }

    /// Reads a segment's records into `replay` (those after the
    /// checkpoint); returns how it ended and the offset after its last
    /// good record.
    fn scan(
        &mut self,
        segment: &mut Segment,
        previous: &mut Option<u64>,
        replay: &mut Vec<Replayed>,
    ) -> Result<(ScanEnd, u64)> {
        let file = &*segment.file;
        let len = segment.size;
        let mut offset = 0;
        loop {
            match Self::header(file, offset, len)? {
                None | Some((0, 0, _)) => return Ok((ScanEnd::Clean, offset)),
                Some(_) => {}
            }
            let Some((seq, payload)) = Self::record_at(file, offset, len)? else {
                return Ok((ScanEnd::Bad, offset));
            };
            // Past the checkpoint every record must follow the one before
            // it; older ones need only grow (they are not replayed).
            let in_order = previous.is_none_or(|p| seq > p);
            let follows =
                seq <= self.checkpointed || seq == previous.unwrap_or(0).max(self.checkpointed) + 1;
            if !in_order || !follows {
                if previous.is_none() && seq > self.checkpointed + 1 {
                    return Err(Error::Storage(format!(
                        "write-ahead log: begins at record {seq}, the checkpoint covers {}",
                        self.checkpointed
                    )));
                }
                return Ok((ScanEnd::Bad, offset));
            }
            segment.first_seq.get_or_insert(seq);
            *previous = Some(seq);
            offset += RECORD_HEADER_BYTES + payload.len() as u64;
            if seq > self.checkpointed {
                replay.push(Replayed { seq, payload });
            }
        }
    }

    /// Writes a zero header after the last segment's last record and syncs
    /// it, unless too little room is left for one: the segment's records
    /// end there whatever follows (a spare's old records, or what a torn
    /// append left before a reopen wrote over its start), so a scan passes
    /// on to the next segment.
    fn end_segment(&mut self) -> Result<()> {
        let Some(segment) = self.segments.last() else {
            return Ok(());
        };
        if segment.size.saturating_sub(self.offset) < RECORD_HEADER_BYTES {
            return Ok(());
        }
        self.stats.syncs += 1;
        segment
            .file
            .write(self.offset, &[0; RECORD_HEADER_BYTES as usize])
            .and_then(|()| segment.file.sync_data())
            .map_err(|e| io("ending a segment", e))
    }

    /// Starts segment `number` (preallocated to hold `need` bytes at
    /// least): a spare renamed when there is one and `need` fits a
    /// segment, else a new file.
    fn roll(&mut self, need: u64) -> Result<()> {
        let number = self.segments.last().map_or(0, |s| s.number + 1);
        let size = self.options.segment_bytes.max(need);
        let spare = if need <= self.options.segment_bytes {
            self.spares.pop()
        } else {
            None
        };
        let file = match spare {
            Some(spare) => self
                .storage
                .reuse(spare, number)
                .and_then(|()| self.storage.open(number))
                .map_err(|e| io("reusing a spare segment", e))?,
            None => self
                .storage
                .open(number)
                .map_err(|e| io("creating a segment", e))?,
        };
        let len = match spare {
            Some(_) => file.len().map_err(|e| io("reading", e))?,
            None => 0,
        };
        // A spare made while segments were smaller grows with zeros.
        let grow = len < size;
        let created = (if grow { file.set_len(size) } else { Ok(()) })
            .and_then(|()| file.sync_data())
            .and_then(|()| self.storage.sync_dir());
        let size = size.max(len);
        if spare.is_some() {
            self.stats.segments_reused += 1;
        } else {
            self.stats.segments_created += 1;
        }
        if grow {
            self.stats.preallocated += size - len;
        }
        self.stats.syncs += 2;
        self.segments.push(Segment {
            number,
            first_seq: None,
            size,
            file,
        });
        self.offset = 0;
        created.map_err(|e| io("preallocating a segment", e))
    }

    /// Appends one record and syncs it; returns its sequence number. After
    /// an error nothing more is appended until the log is opened again.
    pub fn append(&mut self, payload: &[u8]) -> Result<u64> {
        if self.failed {
            return Err(Error::Storage(
                "write-ahead log failed; waiting for a reopen".into(),
            ));
        }
        self.failed = true;
        let length = u32::try_from(payload.len())
            .map_err(|_| Error::Storage("write-ahead log: record over 4 GiB".into()))?;
        let total = RECORD_HEADER_BYTES + u64::from(length);
        let room = self
            .segments
            .last()
            .map_or(0, |s| s.size.saturating_sub(self.offset));
        if total > room {
            self.end_segment()?;
            self.roll(total)?;
        }
        let seq = self.last_seq + 1;
        let mut record = Vec::with_capacity(total as usize);
        record.extend_from_slice(&length.to_le_bytes());
        record.extend_from_slice(&seq.to_le_bytes());
        record.extend_from_slice(&checksum(length, seq, payload).to_le_bytes());
        record.extend_from_slice(payload);
        let segment = self.segments.last_mut().expect("rolled above");
        // Planted bug: the record is not synced before the batch commits.
        let sync = !crate::canary::active(crate::canary::Canary::WalAckBeforeSync);
        segment
            .file
            .write(self.offset, &record)
            .and_then(|()| {
                if sync {
                    segment.file.sync_data()
                } else {
                    Ok(())
                }
            })
            .map_err(|e| io("appending", e))?;
        segment.first_seq.get_or_insert(seq);
        self.offset += total;
        self.last_seq = seq;
        self.since_checkpoint += total;
        self.stats.records += 1;
        self.stats.bytes += total;
        self.stats.syncs += 1;
        self.failed = false;
        Ok(seq)
    }

    /// Refuses appends until the log is opened again.
    pub fn fail(&mut self) {
        self.failed = true;
    }

    /// The last record appended.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Bytes of records appended since a checkpoint last covered the
    /// whole log: at most what a reopen after a crash replays.
    pub fn since_checkpoint(&self) -> u64 {
        self.since_checkpoint
    }

    /// True when the next batch should commit durably, as a checkpoint.
    pub fn checkpoint_due(&self) -> bool {
        self.since_checkpoint >= self.options.checkpoint_bytes
    }

    /// A durable redb commit now covers every record up to `seq`: removes
    /// the segments holding only such records (never the one written to)
    /// and syncs the directory.
    pub fn checkpointed(&mut self, seq: u64) -> Result<()> {
        assert!(seq <= self.last_seq, "a checkpoint past the log");
        assert!(seq >= self.checkpointed, "a checkpoint went back");
        self.stats.checkpoints += 1;
        self.checkpointed = seq;
        if seq == self.last_seq {
            self.since_checkpoint = 0;
        }
        let mut covered = 0;
        while covered + 1 < self.segments.len() {
            // Every record of a segment is older than the next segment's
            // first one; a segment with none yet is covered too.
            match self.segments[covered + 1].first_seq {
                Some(next) if next <= seq + 1 => covered += 1,
                // The records of the segment before it run to the last one.
                None if seq == self.last_seq => covered += 1,
                _ => break,
            }
        }
        if covered == 0 {
            return Ok(());
        }
        // Forgotten before the files go: a failure half way leaves covered
        // segments behind, which the next open reads and passes over.
        let gone: Vec<Segment> = self.segments.drain(..covered).collect();
        for segment in gone {
            let number = segment.number;
            let whole = segment.size == self.options.segment_bytes;
            drop(segment);
            if whole && self.spares.len() < self.options.spare_segments {
                self.storage
                    .retire(number)
                    .map_err(|e| io("keeping a segment as a spare", e))?;
                self.spares.push(number);
                self.stats.segments_retired += 1;
            } else {
                self.storage
                    .remove(number)
                    .map_err(|e| io("removing a segment", e))?;
                self.stats.segments_removed += 1;
            }
        }
        self.stats.syncs += 1;
        self.storage
            .sync_dir()
            .map_err(|e| io("syncing the directory", e))
    }

    /// Live segments, oldest first (tests).
    #[cfg(test)]
    pub fn segment_numbers(&self) -> Vec<u64> {
        self.segments.iter().map(|s| s.number).collect()
    }

    /// Spare segments (tests).
    #[cfg(test)]
    pub fn spare_numbers(&self) -> Vec<u64> {
        self.spares.clone()
    }
}
