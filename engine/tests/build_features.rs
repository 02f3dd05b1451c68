//! The planted bugs and the branch counters stay out of the node binary
//! under every build command.
//!
//! They are features of `arbor-engine-sim` (engine-sim/), a second package
//! over these same sources, and `arbor-engine` declares neither: Cargo
//! unifies features per package, so `cargo build --workspace`,
//! `--all-features` or `cargo test --workspace` (which builds the simulator
//! in the same run) cannot turn them on in the library the `arbor` binary
//! links. This test links that same library, built by whatever command runs
//! it, and reads both manifests.

use std::collections::BTreeSet;
use std::path::Path;

/// The library the `arbor` binary links, in this very build, has neither.
#[test]
fn the_node_library_has_no_canaries_and_no_probes() {
    assert!(
        !arbor::canary::COMPILED,
        "planted bugs are compiled into arbor-engine"
    );
    assert!(
        !arbor::probe::ENABLED,
        "code probes are compiled into arbor-engine"
    );
    for &canary in arbor::canary::Canary::ALL {
        assert!(!arbor::canary::active(canary), "{canary:?} is on");
    }
}

/// The table of a manifest's section `[name]`: its non-empty lines without
/// comments, up to the next section.
fn section(manifest: &str, name: &str) -> BTreeSet<String> {
    let header = format!("[{name}]");
    manifest
        .lines()
        .skip_while(|line| line.trim() != header)
        .skip(1)
        .take_while(|line| !line.trim_start().starts_with('['))
        .map(|line| line.split('#').next().unwrap_or("").trim().to_string())
        .filter(|line| !line.is_empty())
        .collect()
}

fn manifest(dir: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(dir)
        .join("Cargo.toml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn no_feature_of_arbor_engine_can_plant_them() {
    let engine = manifest(".");
    assert!(
        section(&engine, "features").is_empty(),
        "arbor-engine declares features: {:?}",
        section(&engine, "features")
    );
    assert!(
        !engine.lines().any(|line| line.trim() == "[features]"),
        "arbor-engine has a [features] table"
    );
}

/// The simulator runs the sources the node runs, with the same
/// dependencies and build script, and does plant the bugs.
#[test]
fn the_simulator_build_compiles_the_same_sources_with_them() {
    let engine = manifest(".");
    let sim = manifest("../engine-sim");
    for table in ["dependencies", "build-dependencies"] {
        let (ours, theirs) = (section(&engine, table), section(&sim, table));
        assert!(!ours.is_empty(), "[{table}] of arbor-engine read as empty");
        assert_eq!(
            ours, theirs,
            "[{table}] of engine-sim differs from engine's"
        );
    }
    let package = section(&sim, "package");
    assert!(
        package.contains(r#"build = "../engine/build.rs""#),
        "{package:?}"
    );
    let lib = section(&sim, "lib");
    assert!(lib.contains(r#"path = "../engine/src/lib.rs""#), "{lib:?}");
    let features = section(&sim, "features");
    assert!(
        features.contains(r#"default = ["canary", "probes"]"#),
        "{features:?}"
    );
}
