//! A storage backend that counts the bytes redb hands to it: the write
//! amplification of a workload, measured in pages and headers written
//! rather than in time (deterministic, so tests can compare it), and
//! the reads it makes of pages its cache does not hold.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Wraps a redb backend and adds every write's length to a shared counter
/// (and counts its syncs and reads).
#[derive(Debug)]
pub struct CountingBackend<B> {
    inner: B,
    written_bytes: Arc<AtomicU64>,
    syncs: Arc<AtomicU64>,
    reads: Arc<AtomicU64>,
}

impl<B> CountingBackend<B> {
    /// The wrapped backend and the counter of bytes written through it.
    pub fn new(inner: B) -> (Self, Arc<AtomicU64>) {
        let written_bytes = Arc::new(AtomicU64::new(0));
        let backend = Self {
            inner,
            written_bytes: written_bytes.clone(),
            syncs: Arc::default(),
            reads: Arc::default(),
        };
        (backend, written_bytes)
    }

    /// The counter of `sync_data` calls through this backend.
    pub fn sync_counter(&self) -> Arc<AtomicU64> {
        self.syncs.clone()
    }

    /// The counter of reads through this backend (one per page or run of
    /// pages redb's cache did not hold).
    pub fn read_counter(&self) -> Arc<AtomicU64> {
        self.reads.clone()
    }
}

impl<B: redb::StorageBackend> redb::StorageBackend for CountingBackend<B> {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.written_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        self.inner.write(offset, data)
    }
    fn close(&self) -> Result<(), std::io::Error> {
        self.inner.close()
    }
}
