//! Fuzz check functions shared by cargo-fuzz targets and `cargo test` (issue 5).
