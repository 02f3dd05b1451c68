//! Where a simulated node keeps its database: a [`SimDisk`] that lives
//! outside the madsim node, so it survives a kill and a restart reopens it.

use crate::disk::{DiskConfig, SimDisk};
use arbor::forest::wal::WalStorage;
use arbor::forest::{Forest, ForestOptions};

/// Opens the forest on the disk's current contents, its write-ahead log
/// in the disk's `wal/` files. A reopen after a storage error gets a fresh
/// backend of the same power cycle, as a process reopening its file does.
/// `cache_bytes` sizes redb's page cache (redb's default when `None`).
pub fn open_forest(
    disk: &SimDisk,
    options: ForestOptions,
    cache_bytes: Option<usize>,
) -> arbor::Result<Forest> {
    let backend = disk.backend_factory();
    let wal = disk.wal();
    let disk = disk.clone();
    let opener = move || {
        if disk.len_bytes() == 0 {
            create_aside(&disk)?;
        }
        let mut builder = redb::Builder::new();
        if let Some(bytes) = cache_bytes {
            builder.set_cache_size(bytes);
        }
        Ok(builder.create_with_backend(backend()?)?)
    };
    let wal_opener = move || Ok(Box::new(wal.clone()) as Box<dyn WalStorage>);
    Forest::open_with_wal(Box::new(opener), Box::new(wal_opener), options)
}

/// What `Forest::open` does with a file (docs/design.md §5): an empty
/// database is created on the side and put in place whole, so a creation
/// that fails half way leaves the disk empty, never a file redb refuses.
fn create_aside(disk: &SimDisk) -> arbor::Result<()> {
    let scratch = SimDisk::new(DiskConfig::reliable(0));
    drop(redb::Builder::new().create_with_backend(scratch.backend())?);
    disk.install(&scratch.durable_image())
        .map_err(|error| arbor::Error::Storage(format!("installing the new database: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::DiskFaults;

    // Regression: the first open of an empty (or just replaced) disk failed
    // on a sync error half way through redb's creation of the file, and
    // left a header without its magic number: every later open, on any
    // disk, answered "magic number mismatch" and the node never started.
    #[test]
    fn a_creation_that_failed_leaves_the_disk_empty_and_the_next_open_works() {
        let disk = SimDisk::new(DiskConfig::reliable(7));
        disk.set_faults(DiskFaults {
            sync_error_probability: 1.0,
            ..DiskFaults::default()
        });
        assert!(open_forest(&disk, ForestOptions::default(), None).is_err());
        assert_eq!(disk.len_bytes(), 0, "nothing half made is left");
        disk.set_faults(DiskFaults::default());
        let forest = open_forest(&disk, ForestOptions::default(), None)
            .expect("the next open creates the database");
        drop(forest);
        assert!(disk.len_bytes() > 0);
        disk.power_fail();
        open_forest(&disk, ForestOptions::default(), None).expect("it survives a power failure");
    }
}
