//! The simulated disk: a redb `StorageBackend` that keeps what was written
//! apart from what was made durable, so a power failure can lose or tear the
//! unsynced part; plus injected I/O errors and simulated latency.
//!
//! The disk never names madsim and never reads a clock or the OS random
//! source: cargo-fuzz builds use it without `--cfg madsim`, and every fault it
//! injects must be replayable from the seed alone. Latency is only counted;
//! the simulator asks for it with [`SimDisk::take_latency`] and sleeps it on
//! its own clock.
//!
//! A [`SimDisk`] is a cheap, cloneable handle: the disk outlives the node
//! that uses it, like a real one does when the process crashes. Every
//! [`SimDisk::backend`] belongs to the power cycle it was made in; after
//! [`SimDisk::power_fail`] the old backends only return errors, so the
//! destructors of a crashed node (redb writes on drop) cannot reach the
//! platter after the power went out.

use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Probabilities of the faults the disk injects, each in `[0, 1]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DiskFaults {
    /// A `write` fails with an I/O error and stores nothing.
    pub write_error_probability: f64,
    /// A `sync_data` fails with an I/O error. Per the seed, either the
    /// unsynced writes stay unsynced (lost at the next power failure) or
    /// they became durable anyway and only the report failed.
    pub sync_error_probability: f64,
    /// At a power failure, an unsynced write is torn: each of its blocks
    /// independently reaches the durable image or not. Otherwise the whole
    /// unsynced write is lost.
    pub torn_write_probability: f64,
}

/// Simulated time the disk charges for its work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DiskLatency {
    pub per_write: Duration,
    pub per_sync: Duration,
    /// Added per byte written, so large commits cost more than small ones.
    pub per_byte_nanos: u64,
}

/// Everything that defines a simulated disk; the same config gives the same
/// behaviour for the same sequence of calls.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DiskConfig {
    /// Atomic unit of a write at power failure (a sector or page).
    pub block_size: u64,
    /// Seeds every fault decision of this disk.
    pub seed: u64,
    pub faults: DiskFaults,
    pub latency: DiskLatency,
    /// Largest length the disk accepts; beyond it `set_len` fails (a full
    /// disk), which keeps a runaway writer from exhausting the host's memory.
    pub capacity_bytes: u64,
}

impl Default for DiskConfig {
    fn default() -> Self {
        Self {
            block_size: 512,
            seed: 0,
            faults: DiskFaults::default(),
            latency: DiskLatency::default(),
            capacity_bytes: 1 << 30,
        }
    }
}

impl DiskConfig {
    /// A disk that never fails and takes no time: for tests that need a
    /// power-failable disk but no other faults.
    pub fn reliable(seed: u64) -> Self {
        Self {
            seed,
            ..Self::default()
        }
    }
}

/// What the disk did, for reports and for tests that a fault really fired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub writes: u64,
    pub bytes_written: u64,
    pub syncs: u64,
    pub reads: u64,
    pub write_errors_injected: u64,
    pub sync_errors_injected: u64,
    pub power_failures: u64,
    /// Unsynced writes dropped entirely at a power failure.
    pub writes_lost: u64,
    /// Unsynced writes of which only some blocks survived a power failure.
    pub writes_torn: u64,
    /// Calls refused because their backend belongs to an earlier power cycle.
    pub stale_calls: u64,
    /// Times the disk was destroyed and replaced by an empty one.
    pub disks_destroyed: u64,
}

/// SplitMix64: tiny, fast and good enough to draw fault decisions; chosen
/// over a crate so the disk's behaviour cannot change with a dependency bump.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// True with probability `p` (clamped to `[0, 1]`).
    pub fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        // 53 random bits give a uniform float in [0, 1).
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        unit < p
    }
}

/// One page of the disk's contents. Pages are shared between the written
/// image, the durable image and the pending writes, so a sync or a power
/// failure moves pointers instead of bytes; a page is copied only when a
/// write changes part of a page somebody else still holds.
///
/// The bytes are an allocation of their own, apart from the shared count:
/// a 4 KiB page behind the count would take 4 KiB and 16 bytes, which the
/// allocator (mimalloc) rounds up to 5 KiB, a quarter more memory than the
/// image holds.
type Page = Arc<Box<[u8]>>;

fn new_page(bytes: impl Into<Box<[u8]>>) -> Page {
    Arc::new(bytes.into())
}

/// The page a write may change in place: copied first if shared.
fn page_mut(page: &mut Page) -> &mut [u8] {
    if Arc::get_mut(page).is_none() {
        *page = new_page(&page[..]);
    }
    Arc::get_mut(page).expect("a fresh copy has no other owner")
}

/// A file's contents as pages. Bytes of the last page beyond `len` are
/// zero, so growing the file exposes zeros as the trait requires.
#[derive(Clone)]
struct Image {
    len: u64,
    pages: Vec<Page>,
}

impl Image {
    fn empty() -> Self {
        Self {
            len: 0,
            pages: Vec::new(),
        }
    }

    fn from_bytes(bytes: &[u8], page_bytes: u64) -> Self {
        let page_bytes = page_bytes as usize;
        let pages = bytes
            .chunks(page_bytes)
            .map(|chunk| {
                let mut page = vec![0; page_bytes];
                page[..chunk.len()].copy_from_slice(chunk);
                new_page(page)
            })
            .collect();
        Self {
            len: bytes.len() as u64,
            pages,
        }
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut bytes =
            Vec::with_capacity(self.pages.len() * self.pages.first().map_or(0, |p| p.len()));
        for page in &self.pages {
            bytes.extend_from_slice(page);
        }
        bytes.truncate(self.len as usize);
        bytes
    }
}

/// A write that reached the disk's cache but not yet its durable image.
/// Its bytes are the pages `pages_start..` of `DiskState::pending_pages`
/// as they were right after the write (later writes copy before changing
/// a page held here).
#[derive(Clone, Copy, Debug)]
struct PendingWrite {
    offset: u64,
    len: u64,
    pages_start: usize,
}

/// One file of the disk: what reads see, what survives a power failure,
/// and whether its name does.
#[derive(Clone)]
struct FileState {
    /// What reads see: every write so far, synced or not.
    current: Image,
    /// What survives a power failure.
    durable: Image,
    /// Writes since the last successful sync, oldest first.
    pending: Vec<PendingWrite>,
    pending_pages: Vec<Page>,
    /// Below this page `current` equals `durable` except where a pending
    /// write landed; above it a `set_len` may have changed anything. Lets a
    /// sync share only what changed instead of the whole image.
    unchanged_pages: usize,
    /// The name is in the directory now (false: removed).
    linked: bool,
    /// The name survives a power failure (the directory was synced since
    /// it was created).
    durable_linked: bool,
}

impl FileState {
    fn empty(durable_linked: bool) -> Self {
        Self {
            current: Image::empty(),
            durable: Image::empty(),
            pending: Vec::new(),
            pending_pages: Vec::new(),
            unchanged_pages: 0,
            linked: true,
            durable_linked,
        }
    }

    fn from_image(image: Image) -> Self {
        Self {
            unchanged_pages: image.pages.len(),
            current: image.clone(),
            durable: image,
            ..Self::empty(true)
        }
    }
}

/// The name of the database file on the disk; other files (the
/// write-ahead log's segments) have names of their own.
const DB_FILE: &str = "";

/// Names of the write-ahead log's segment files.
const WAL_PREFIX: &str = "wal/";
/// Spare segments of the write-ahead log: `spare/<n>`.
const SPARE_PREFIX: &str = "spare/";

struct DiskState {
    config: DiskConfig,
    /// Page size of the images: a multiple of the block size, so no block
    /// straddles two pages.
    page_bytes: u64,
    /// Shared by every page a `set_len` adds, so growth allocates nothing.
    zero_page: Page,
    rng: SplitMix64,
    /// Every file by name; the database file ([`DB_FILE`]) is always there.
    files: std::collections::BTreeMap<String, FileState>,
    /// Counts power cycles; a backend made in an earlier one is dead.
    generation: u64,
    /// When set, the disk loses power on its own after this many more
    /// writes and syncs: a crash in the middle of a commit.
    power_cut_after_ops: Option<u64>,
    latency_owed: Duration,
    stats: DiskStats,
}

/// A handle to one simulated disk; clones share the disk.
#[derive(Clone)]
pub struct SimDisk {
    state: Arc<Mutex<DiskState>>,
}

impl fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        let db = state.db();
        f.debug_struct("SimDisk")
            .field("len", &db.current.len)
            .field("durable_len", &db.durable.len)
            .field("pending_writes", &db.pending.len())
            .field("files", &state.files.len())
            .field("generation", &state.generation)
            .finish()
    }
}

/// A handle that does not keep the disk alive: it tells whether anything
/// still does (the leak check at the end of a simulated run).
#[derive(Clone, Debug)]
pub struct WeakDisk(std::sync::Weak<Mutex<DiskState>>);

impl WeakDisk {
    pub fn is_alive(&self) -> bool {
        self.0.strong_count() > 0
    }
}

/// Smallest page of the disk's images: redb's page, so its page writes
/// replace whole pages.
const PAGE_BYTES_MIN: u64 = 4096;

impl SimDisk {
    pub fn downgrade(&self) -> WeakDisk {
        WeakDisk(Arc::downgrade(&self.state))
    }

    pub fn new(config: DiskConfig) -> Self {
        assert!(config.block_size > 0, "block size must be positive");
        let page_bytes = config.block_size * PAGE_BYTES_MIN.div_ceil(config.block_size);
        let state = DiskState {
            config,
            page_bytes,
            zero_page: new_page(vec![0; page_bytes as usize]),
            rng: SplitMix64::new(config.seed),
            files: [(DB_FILE.to_string(), FileState::empty(true))].into(),
            generation: 0,
            power_cut_after_ops: None,
            latency_owed: Duration::ZERO,
            stats: DiskStats::default(),
        };
        Self {
            state: Arc::new(Mutex::new(state)),
        }
    }

    /// A disk whose durable content is already `image` (a copy of another
    /// disk's `durable_image`): lets a test start many runs from one
    /// prepared database without building it each time.
    pub fn with_image(config: DiskConfig, image: Vec<u8>) -> Self {
        let disk = Self::new(config);
        {
            let mut state = disk.lock();
            let image = Image::from_bytes(&image, state.page_bytes);
            state
                .files
                .insert(DB_FILE.into(), FileState::from_image(image));
        }
        disk
    }

    /// A storage backend for redb, bound to the current power cycle.
    pub fn backend(&self) -> SimBackend {
        let generation = self.lock().generation;
        SimBackend {
            disk: self.clone(),
            generation,
            file: DB_FILE.into(),
        }
    }

    /// The write-ahead log's directory on this disk, bound to the current
    /// power cycle.
    pub fn wal(&self) -> SimWal {
        SimWal {
            disk: self.clone(),
            generation: self.lock().generation,
        }
    }

    /// Segment files of the write-ahead log present now (for tests).
    pub fn wal_files(&self) -> usize {
        let state = self.lock();
        state
            .files
            .iter()
            .filter(|(name, f)| name.starts_with(WAL_PREFIX) && f.linked)
            .count()
    }

    /// Fresh backends over this disk, all bound to the current power cycle:
    /// what a process that reopens its database after an I/O error gets (a
    /// reopen never outlives a power cut).
    pub fn backend_factory(
        &self,
    ) -> impl Fn() -> arbor::Result<SimBackend> + Send + Sync + 'static {
        let first = self.backend();
        let (disk, generation) = (first.disk, first.generation);
        move || {
            Ok(SimBackend {
                disk: disk.clone(),
                generation,
                file: DB_FILE.into(),
            })
        }
    }

    /// The power goes out: every unsynced write is lost or torn (per the
    /// seed), the disk keeps only its durable image, and every backend made
    /// so far stops working.
    pub fn power_fail(&self) {
        self.lock().power_fail();
    }

    /// The disk is destroyed and replaced by an empty one: nothing written
    /// so far survives, and every backend made so far stops working (a
    /// node replacement; the node must be down).
    pub fn destroy(&self) {
        let mut state = self.lock();
        state.files = [(DB_FILE.to_string(), FileState::empty(true))].into();
        state.generation += 1;
        state.power_cut_after_ops = None;
        state.stats.disks_destroyed += 1;
    }

    /// Puts `image` in place of an empty disk in one step, as a rename of
    /// a fully written and synced file over a path holding nothing, then a
    /// sync of its directory: a database is created aside and installed
    /// only once whole (docs/design.md §5). A sync error (drawn like a
    /// `sync_data` error) installs nothing.
    pub fn install(&self, image: &[u8]) -> io::Result<()> {
        let mut state = self.lock();
        assert_eq!(
            state.db().current.len,
            0,
            "a database is installed on an empty disk"
        );
        let latency = state.config.latency;
        state.latency_owed += latency.per_write
            + latency.per_sync
            + Duration::from_nanos(latency.per_byte_nanos * image.len() as u64);
        let failure = state.config.faults.sync_error_probability;
        if state.rng.chance(failure) {
            state.stats.sync_errors_injected += 1;
            return Err(io::Error::other("simulated sync error (install)"));
        }
        let image = Image::from_bytes(image, state.page_bytes);
        state
            .files
            .insert(DB_FILE.into(), FileState::from_image(image));
        state.stats.syncs += 1;
        Ok(())
    }

    /// Simulated time consumed since the last call.
    pub fn take_latency(&self) -> Duration {
        std::mem::take(&mut self.lock().latency_owed)
    }

    /// Changes the fault probabilities from now on (swarm testing, or a
    /// fault phase of a scenario).
    pub fn set_faults(&self, faults: DiskFaults) {
        self.lock().config.faults = faults;
    }

    pub fn faults(&self) -> DiskFaults {
        self.lock().config.faults
    }

    /// Cuts the power by itself after `ops` more writes or syncs (`None`
    /// disarms): lets a test crash in the middle of a redb commit, where
    /// no caller could call `power_fail`.
    pub fn set_power_cut_after(&self, ops: Option<u64>) {
        self.lock().power_cut_after_ops = ops;
    }

    pub fn stats(&self) -> DiskStats {
        self.lock().stats
    }

    /// Bytes that would survive a power failure right now (for tests).
    pub fn durable_image(&self) -> Vec<u8> {
        self.lock().db().durable.to_bytes()
    }

    /// The disk's length as written, synced or not (for tests).
    pub fn len_bytes(&self) -> u64 {
        self.lock().db().current.len
    }

    /// Number of writes not yet made durable.
    pub fn pending_writes(&self) -> usize {
        self.lock().db().pending.len()
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        // A panic while holding the lock is a bug in this file; the state is
        // still consistent enough to report, so read through the poison.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl DiskState {
    fn db(&self) -> &FileState {
        self.files
            .get(DB_FILE)
            .expect("the database file is always there")
    }

    fn file(&mut self, name: &str) -> io::Result<&mut FileState> {
        self.files
            .get_mut(name)
            .filter(|f| f.linked)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "simulated file removed"))
    }

    fn power_fail(&mut self) {
        let names: Vec<String> = self.files.keys().cloned().collect();
        for name in names {
            let mut file = self.files.remove(&name).expect("listed");
            self.lose_unsynced(&mut file);
            // A name whose creation was never synced is gone; a removal
            // that was never synced is undone.
            if file.durable_linked {
                file.linked = true;
                self.files.insert(name, file);
            }
        }
        self.generation += 1;
        self.power_cut_after_ops = None;
        self.stats.power_failures += 1;
    }

    /// Every unsynced write of `file` is lost or torn (per the seed).
    fn lose_unsynced(&mut self, file: &mut FileState) {
        let pending = std::mem::take(&mut file.pending);
        let pages = std::mem::take(&mut file.pending_pages);
        for (i, write) in pending.iter().enumerate() {
            if self.rng.chance(self.config.faults.torn_write_probability) {
                let pages_end = pending.get(i + 1).map_or(pages.len(), |w| w.pages_start);
                self.persist_some_blocks(file, write, &pages[write.pages_start..pages_end]);
                self.stats.writes_torn += 1;
            } else {
                self.stats.writes_lost += 1;
            }
        }
        file.current = file.durable.clone();
        file.unchanged_pages = file.current.pages.len();
    }

    /// Copies a random subset of the write's blocks into the durable image.
    /// Blocks are aligned to the disk, not to the write, as on real hardware.
    /// `pages` are the write's pages as it left them, the first one being
    /// the page of its first byte.
    fn persist_some_blocks(&mut self, file: &mut FileState, write: &PendingWrite, pages: &[Page]) {
        let (block_size, page_bytes) = (self.config.block_size, self.page_bytes);
        let first_page = write.offset / page_bytes;
        let end = write.offset + write.len;
        let mut start = write.offset;
        while start < end {
            let block_end = ((start / block_size) + 1) * block_size;
            let chunk_end = block_end.min(end);
            if self.rng.chance(0.5) {
                // A block never straddles pages (pages are whole blocks).
                let page = &pages[(start / page_bytes - first_page) as usize];
                let from = (start % page_bytes) as usize;
                let to = from + (chunk_end - start) as usize;
                persist_range(file, page_bytes, start, &page[from..to]);
            }
            start = chunk_end;
        }
    }

    /// Counts one write or sync toward an armed power cut; true when the
    /// power has just gone out and the call must fail.
    fn tick_power_cut(&mut self) -> bool {
        match self.power_cut_after_ops {
            Some(0) => {
                self.power_fail();
                true
            }
            Some(n) => {
                self.power_cut_after_ops = Some(n - 1);
                false
            }
            None => false,
        }
    }

    fn write(&mut self, name: &str, offset: u64, data: &[u8]) -> io::Result<()> {
        let page_bytes = self.page_bytes;
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&end| self.files.get(name).is_some_and(|f| end <= f.current.len))
            .ok_or_else(|| invalid_input("write beyond the end of the disk"))?;
        self.latency_owed += self.config.latency.per_write
            + Duration::from_nanos(self.config.latency.per_byte_nanos * data.len() as u64);
        if self.rng.chance(self.config.faults.write_error_probability) {
            self.stats.write_errors_injected += 1;
            return Err(io::Error::other("simulated write error"));
        }
        let file = self.file(name)?;
        let pages_start = file.pending_pages.len();
        let mut at = offset;
        while at < end {
            let index = (at / page_bytes) as usize;
            let from = (at % page_bytes) as usize;
            let chunk_end = end.min((index as u64 + 1) * page_bytes);
            let chunk = &data[(at - offset) as usize..(chunk_end - offset) as usize];
            let page = &mut file.current.pages[index];
            match Arc::get_mut(page) {
                Some(bytes) => bytes[from..from + chunk.len()].copy_from_slice(chunk),
                // A whole page shared with the durable image or an older
                // pending write: a fresh page, no need to copy the old one.
                None if chunk.len() as u64 == page_bytes => *page = new_page(chunk),
                None => page_mut(page)[from..from + chunk.len()].copy_from_slice(chunk),
            }
            file.pending_pages.push(page.clone());
            at = chunk_end;
        }
        file.pending.push(PendingWrite {
            offset,
            len: data.len() as u64,
            pages_start,
        });
        self.stats.writes += 1;
        self.stats.bytes_written += data.len() as u64;
        Ok(())
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.file(name)?;
        self.latency_owed += self.config.latency.per_sync;
        let page_bytes = self.page_bytes;
        if self.rng.chance(self.config.faults.sync_error_probability) {
            self.stats.sync_errors_injected += 1;
            // A failed fsync says nothing about what reached the platter:
            // half the time everything did, and only the report failed.
            if self.rng.chance(0.5) {
                make_durable(self.file(name)?, page_bytes);
            }
            return Err(io::Error::other("simulated sync error"));
        }
        make_durable(self.file(name)?, page_bytes);
        self.stats.syncs += 1;
        Ok(())
    }

    fn set_len(&mut self, name: &str, len: u64) -> io::Result<()> {
        if len > self.config.capacity_bytes {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "simulated disk is full",
            ));
        }
        let (page_bytes, zero) = (self.page_bytes, self.zero_page.clone());
        let file = self.file(name)?;
        // Growth is zero-filled as the trait requires; the change becomes
        // durable at the next sync like any write.
        let page_count = len.div_ceil(page_bytes) as usize;
        if len < file.current.len {
            file.current.pages.truncate(page_count);
            let tail = (len % page_bytes) as usize;
            if let Some(last) = file.current.pages.last_mut().filter(|_| tail > 0) {
                if last[tail..].iter().any(|&b| b != 0) {
                    page_mut(last)[tail..].fill(0);
                }
            }
        } else {
            file.current.pages.resize_with(page_count, || zero.clone());
        }
        file.current.len = len;
        // A page cut in the middle is changed even if regrown.
        file.unchanged_pages = file.unchanged_pages.min((len / page_bytes) as usize);
        Ok(())
    }

    fn read(&mut self, name: &str, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let page_bytes = self.page_bytes;
        let file = self.file(name)?;
        let end = offset
            .checked_add(out.len() as u64)
            .filter(|&end| end <= file.current.len)
            .ok_or_else(|| invalid_input("read beyond the end of the disk"))?;
        let mut at = offset;
        while at < end {
            let index = (at / page_bytes) as usize;
            let from = (at % page_bytes) as usize;
            let chunk_end = end.min((index as u64 + 1) * page_bytes);
            let n = (chunk_end - at) as usize;
            let out_from = (at - offset) as usize;
            out[out_from..out_from + n].copy_from_slice(&file.current.pages[index][from..from + n]);
            at = chunk_end;
        }
        self.stats.reads += 1;
        Ok(())
    }

    /// Creates file `name` empty unless it is there; its name is durable
    /// only after `sync_dir`.
    fn create(&mut self, name: &str) {
        match self.files.get_mut(name) {
            Some(file) if file.linked => {}
            Some(file) => {
                // Removed without a synced directory, then made again.
                let durable_linked = file.durable_linked;
                *file = FileState::empty(durable_linked);
            }
            None => {
                self.files.insert(name.to_string(), FileState::empty(false));
            }
        }
    }

    /// Gives file `from` (its contents, synced or not) the name `to`,
    /// replacing any file of that name. Until the directory is synced a
    /// power failure brings the old name back, as it was durably, and
    /// drops the new one.
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        let file = self.file(from)?;
        file.linked = false;
        let renamed = FileState {
            linked: true,
            durable_linked: false,
            ..file.clone()
        };
        self.files.insert(to.to_string(), renamed);
        Ok(())
    }

    /// The directory's creations and removals become durable.
    fn sync_dir(&mut self) -> io::Result<()> {
        self.latency_owed += self.config.latency.per_sync;
        if self.rng.chance(self.config.faults.sync_error_probability) {
            self.stats.sync_errors_injected += 1;
            if self.rng.chance(0.5) {
                self.apply_dir();
            }
            return Err(io::Error::other("simulated directory sync error"));
        }
        self.apply_dir();
        self.stats.syncs += 1;
        Ok(())
    }

    fn apply_dir(&mut self) {
        self.files.retain(|_, f| f.linked);
        for file in self.files.values_mut() {
            file.durable_linked = true;
        }
    }
}

/// A block beyond the durable length only survives if the file's length
/// reached it durably: unsynced growth is lost with the power.
fn persist_range(file: &mut FileState, page_bytes: u64, offset: u64, data: &[u8]) {
    if offset >= file.durable.len {
        return;
    }
    let end = (offset + data.len() as u64).min(file.durable.len);
    let take = (end - offset) as usize;
    let page = &mut file.durable.pages[(offset / page_bytes) as usize];
    let from = (offset % page_bytes) as usize;
    page_mut(page)[from..from + take].copy_from_slice(&data[..take]);
}

fn make_durable(file: &mut FileState, page_bytes: u64) {
    // fdatasync makes the length durable together with the data, since
    // the data cannot be read back without it.
    let unchanged = file.unchanged_pages.min(file.current.pages.len());
    file.durable.len = file.current.len;
    file.durable.pages.truncate(unchanged);
    file.durable
        .pages
        .extend_from_slice(&file.current.pages[unchanged..]);
    for write in std::mem::take(&mut file.pending) {
        let first = (write.offset / page_bytes) as usize;
        let last = ((write.offset + write.len).div_ceil(page_bytes) as usize).min(unchanged);
        for index in first..last {
            file.durable.pages[index] = file.current.pages[index].clone();
        }
    }
    file.pending_pages.clear();
    file.unchanged_pages = file.current.pages.len();
}

fn invalid_input(message: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// redb's view of one file of a [`SimDisk`] for one power cycle.
pub struct SimBackend {
    disk: SimDisk,
    generation: u64,
    file: Arc<str>,
}

impl fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimBackend")
            .field("generation", &self.generation)
            .field("file", &self.file)
            .finish()
    }
}

impl SimBackend {
    /// Runs `op` on the disk unless the power went out since this backend
    /// was made; counting `op` toward an armed power cut when `counts`.
    fn with_state<T>(
        &self,
        counts: bool,
        op: impl FnOnce(&mut DiskState, &str) -> io::Result<T>,
    ) -> io::Result<T> {
        with_power(&self.disk, self.generation, counts, |s| op(s, &self.file))
    }
}

/// Runs `op` on the disk unless the power went out since `generation`.
fn with_power<T>(
    disk: &SimDisk,
    generation: u64,
    counts: bool,
    op: impl FnOnce(&mut DiskState) -> io::Result<T>,
) -> io::Result<T> {
    let mut state = disk.lock();
    if state.generation != generation || (counts && state.tick_power_cut()) {
        state.stats.stale_calls += 1;
        return Err(io::Error::new(
            io::ErrorKind::BrokenPipe,
            "simulated disk lost power",
        ));
    }
    op(&mut state)
}

impl redb::StorageBackend for SimBackend {
    fn len(&self) -> io::Result<u64> {
        self.with_state(false, |s, name| Ok(s.file(name)?.current.len))
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.with_state(false, |s, name| s.read(name, offset, out))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.with_state(true, |s, name| s.set_len(name, len))
    }

    fn sync_data(&self) -> io::Result<()> {
        self.with_state(true, |s, name| s.sync(name))
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.with_state(true, |s, name| s.write(name, offset, data))
    }
}

/// The write-ahead log's directory on a [`SimDisk`], for one power cycle:
/// segment `n` is the file `wal/<n>`. Creations and removals are lost at
/// a power failure unless the directory was synced after them.
#[derive(Clone, Debug)]
pub struct SimWal {
    disk: SimDisk,
    generation: u64,
}

impl arbor::forest::wal::WalStorage for SimWal {
    fn segments(&self) -> io::Result<Vec<u64>> {
        with_power(&self.disk, self.generation, false, |s| {
            Ok(s.files
                .iter()
                .filter(|(_, f)| f.linked)
                .filter_map(|(name, _)| name.strip_prefix(WAL_PREFIX)?.parse().ok())
                .collect())
        })
    }

    fn open(&self, number: u64) -> io::Result<Box<dyn redb::StorageBackend>> {
        let file: Arc<str> = format!("{WAL_PREFIX}{number}").into();
        with_power(&self.disk, self.generation, true, |s| {
            s.create(&file);
            Ok(())
        })?;
        Ok(Box::new(SimBackend {
            disk: self.disk.clone(),
            generation: self.generation,
            file,
        }))
    }

    fn remove(&self, number: u64) -> io::Result<()> {
        with_power(&self.disk, self.generation, true, |s| {
            if let Some(file) = s.files.get_mut(&format!("{WAL_PREFIX}{number}")) {
                file.linked = false;
            }
            Ok(())
        })
    }

    fn sync_dir(&self) -> io::Result<()> {
        with_power(&self.disk, self.generation, true, |s| s.sync_dir())
    }

    fn spares(&self) -> io::Result<Vec<u64>> {
        with_power(&self.disk, self.generation, false, |s| {
            Ok(s.files
                .iter()
                .filter(|(_, f)| f.linked)
                .filter_map(|(name, _)| name.strip_prefix(SPARE_PREFIX)?.parse().ok())
                .collect())
        })
    }

    fn retire(&self, number: u64) -> io::Result<()> {
        with_power(&self.disk, self.generation, true, |s| {
            s.rename(
                &format!("{WAL_PREFIX}{number}"),
                &format!("{SPARE_PREFIX}{number}"),
            )
        })
    }

    fn reuse(&self, spare: u64, number: u64) -> io::Result<()> {
        with_power(&self.disk, self.generation, true, |s| {
            s.rename(
                &format!("{SPARE_PREFIX}{spare}"),
                &format!("{WAL_PREFIX}{number}"),
            )
        })
    }

    fn remove_spare(&self, spare: u64) -> io::Result<()> {
        with_power(&self.disk, self.generation, true, |s| {
            if let Some(file) = s.files.get_mut(&format!("{SPARE_PREFIX}{spare}")) {
                file.linked = false;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests;
