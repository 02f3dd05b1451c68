//! Where a simulated node keeps its database. The bytes live outside the
//! madsim node, so they survive a kill and a restart reopens them.

use arbor::forest::{Forest, ForestOptions};
use redb::StorageBackend;
use std::io::Error as BackendIoError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One node's persistent storage, seen by the world.
pub trait NodeDisk: Send + Sync + 'static {
    /// Opens the forest on the current disk contents.
    fn open(&self, options: ForestOptions) -> arbor::Result<Forest>;
    /// Power cut: unsynced writes are lost (or torn); handles opened before
    /// the cut fail from now on, so a dying process cannot write after it.
    fn power_fail(&self);
    /// Disk time consumed since the last call.
    fn take_latency(&self) -> Duration;
    /// Short description for traces and reports.
    fn describe(&self) -> String;
}

/// A fault-free disk: every write is durable at once. For load runs and
/// for worlds that test the network rather than the storage.
#[derive(Debug, Default)]
pub struct MemDisk {
    bytes: Arc<Mutex<Vec<u8>>>,
    generation: Arc<AtomicU64>,
}

impl MemDisk {
    pub fn new() -> Self {
        Self::default()
    }
}

#[derive(Debug)]
struct MemHandle {
    bytes: Arc<Mutex<Vec<u8>>>,
    generation: Arc<AtomicU64>,
    opened_in: u64,
}

impl MemHandle {
    fn check_alive(&self) -> Result<(), BackendIoError> {
        if self.generation.load(Ordering::SeqCst) == self.opened_in {
            Ok(())
        } else {
            Err(BackendIoError::other("power lost"))
        }
    }
}

impl StorageBackend for MemHandle {
    fn len(&self) -> Result<u64, BackendIoError> {
        self.check_alive()?;
        Ok(self.bytes.lock().unwrap().len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendIoError> {
        self.check_alive()?;
        let bytes = self.bytes.lock().unwrap();
        let start = offset as usize;
        let end = start + out.len();
        if end > bytes.len() {
            return Err(BackendIoError::other("read past end"));
        }
        out.copy_from_slice(&bytes[start..end]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), BackendIoError> {
        self.check_alive()?;
        self.bytes.lock().unwrap().resize(len as usize, 0);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), BackendIoError> {
        self.check_alive()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendIoError> {
        self.check_alive()?;
        let mut bytes = self.bytes.lock().unwrap();
        let start = offset as usize;
        let end = start + data.len();
        if end > bytes.len() {
            bytes.resize(end, 0);
        }
        bytes[start..end].copy_from_slice(data);
        Ok(())
    }
}

impl NodeDisk for MemDisk {
    fn open(&self, options: ForestOptions) -> arbor::Result<Forest> {
        let (bytes, generation) = (self.bytes.clone(), self.generation.clone());
        let opened_in = generation.load(Ordering::SeqCst);
        // Reopens stay in this power cycle, like the process that does them.
        let handle = move || {
            Ok(MemHandle {
                bytes: bytes.clone(),
                generation: generation.clone(),
                opened_in,
            })
        };
        Forest::open_with_backend_factory(handle, options)
    }

    fn power_fail(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    fn take_latency(&self) -> Duration {
        Duration::ZERO
    }

    fn describe(&self) -> String {
        "mem".into()
    }
}

impl NodeDisk for crate::disk::SimDisk {
    fn open(&self, options: ForestOptions) -> arbor::Result<Forest> {
        Forest::open_with_backend_factory(self.backend_factory(), options)
    }

    fn power_fail(&self) {
        crate::disk::SimDisk::power_fail(self);
    }

    fn take_latency(&self) -> Duration {
        crate::disk::SimDisk::take_latency(self)
    }

    fn describe(&self) -> String {
        format!("{:?}", self.faults())
    }
}
