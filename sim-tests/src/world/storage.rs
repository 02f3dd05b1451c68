//! Where a simulated node keeps its database: a [`SimDisk`] that lives
//! outside the madsim node, so it survives a kill and a restart reopens it.

use crate::disk::SimDisk;
use arbor::forest::{Forest, ForestOptions};

/// Opens the forest on the disk's current contents. A reopen after a
/// storage error gets a fresh backend of the same power cycle, as a process
/// reopening its file does. `cache_bytes` sizes redb's page cache (redb's
/// default when `None`).
pub fn open_forest(
    disk: &SimDisk,
    options: ForestOptions,
    cache_bytes: Option<usize>,
) -> arbor::Result<Forest> {
    let backend = disk.backend_factory();
    let opener = move || {
        let mut builder = redb::Builder::new();
        if let Some(bytes) = cache_bytes {
            builder.set_cache_size(bytes);
        }
        Ok(builder.create_with_backend(backend()?)?)
    };
    Forest::open_reopenable(Box::new(opener), options)
}
