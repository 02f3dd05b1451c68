//! The simulated disk: a redb StorageBackend with power failure, torn writes, I/O errors and latency (issue 4/5).
