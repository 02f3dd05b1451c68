//! The simulator's layers depend one way: `world` (the simulated cluster)
//! below `scenario` (one seed's run: plan, workload, nemesis, checks,
//! capsules) below `cli`, `load` and `fuzzing`, which may use any layer
//! under them. The crate-level modules (`coverage`, `disk`, `failure`,
//! `files`, `trace`, ...) sit below all of them. This test reads
//! sim-tests/src and fails, naming file and line, where a lower layer names
//! a higher one, and where two source files share a name (`mod.rs` aside),
//! so that a file name says which module it is.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A directory of src/ and the modules its files must not name.
const FORBIDDEN: &[(&str, &[&str])] = &[
    (
        "world",
        &[
            "crate::scenario",
            "crate::cli",
            "crate::load",
            "crate::fuzzing",
        ],
    ),
    ("scenario", &["crate::cli", "crate::load", "crate::fuzzing"]),
];

/// Every `.rs` file under `dir`, as paths relative to `root`.
fn sources(root: &Path, dir: &Path, found: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(root, &path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path.strip_prefix(root).expect("under root").to_path_buf());
        }
    }
}

/// Whether `line` names `module` (`crate::cli` but not `crate::client`).
fn names(line: &str, module: &str) -> bool {
    line.match_indices(module).any(|(at, _)| {
        let next = line[at + module.len()..].chars().next();
        !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// "file:line: names module" for each line of `text` (the file at `path`,
/// relative to src/) that names a module its layer must not.
fn layer_violations(path: &Path, text: &str) -> Vec<String> {
    let Some(top) = path
        .components()
        .next()
        .and_then(|c| c.as_os_str().to_str())
    else {
        return Vec::new();
    };
    let forbidden: &[&str] = FORBIDDEN
        .iter()
        .find(|(dir, _)| *dir == top && path.components().count() > 1)
        .map_or(&[], |(_, modules)| modules);
    let mut found = Vec::new();
    for (index, line) in text.lines().enumerate() {
        for module in forbidden {
            if names(line, module) {
                found.push(format!(
                    "src/{}:{}: {top}/ names {module}: {}",
                    path.display(),
                    index + 1,
                    line.trim()
                ));
            }
        }
    }
    found
}

/// "name: path, path" for each file name (`mod.rs` aside) that more than
/// one of `paths` has.
fn shared_names(paths: &[PathBuf]) -> Vec<String> {
    let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for path in paths {
        let name = path
            .file_name()
            .expect("a file")
            .to_string_lossy()
            .into_owned();
        if name != "mod.rs" {
            by_name
                .entry(name)
                .or_default()
                .push(format!("src/{}", path.display()));
        }
    }
    by_name
        .into_iter()
        .filter(|(_, paths)| paths.len() > 1)
        .map(|(name, mut paths)| {
            paths.sort();
            format!("{name}: {}", paths.join(", "))
        })
        .collect()
}

fn src_files() -> (PathBuf, Vec<PathBuf>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    sources(&root, &root, &mut found);
    found.sort();
    (root, found)
}

#[test]
fn lower_layers_name_no_higher_one() {
    let (root, files) = src_files();
    assert!(
        files.iter().any(|f| f.starts_with("world"))
            && files.iter().any(|f| f.starts_with("scenario")),
        "sim-tests/src has no world/ or scenario/: {files:?}"
    );
    let mut found = Vec::new();
    for file in &files {
        let path = root.join(file);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        found.extend(layer_violations(file, &text));
    }
    assert!(
        found.is_empty(),
        "a lower layer names a higher one (world <- scenario <- cli, load, fuzzing):\n{}",
        found.join("\n")
    );
}

#[test]
fn no_two_source_files_share_a_name() {
    let (_, files) = src_files();
    let shared = shared_names(&files);
    assert!(
        shared.is_empty(),
        "source files sharing a name (rename one to say what it holds):\n{}",
        shared.join("\n")
    );
}

/// The rules above catch what they forbid, and only that.
#[test]
fn the_rules_flag_what_they_forbid() {
    let world = Path::new("world/hooks.rs");
    let text =
        "//! doc\nuse crate::coverage::CoverageCounter;\nuse crate::scenario::check::ledger;\n";
    let found = layer_violations(world, text);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("src/world/hooks.rs:3: world/ names crate::scenario"),
        "{found:?}"
    );

    let scenario = Path::new("scenario/capsule/mod.rs");
    let text =
        "let x = crate::cli::parse(name);\nuse crate::client::Thing;\nuse crate::world::World;\n";
    let found = layer_violations(scenario, text);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("src/scenario/capsule/mod.rs:1:"),
        "{found:?}"
    );

    // Higher layers may name any lower one.
    let cli = Path::new("cli/mod.rs");
    assert!(layer_violations(
        cli,
        "use crate::scenario::run_seed;\nuse crate::world::World;\n"
    )
    .is_empty());

    let paths: Vec<PathBuf> = ["a/mod.rs", "b/mod.rs", "a/x.rs", "b/x.rs", "y.rs"]
        .into_iter()
        .map(PathBuf::from)
        .collect();
    assert_eq!(
        shared_names(&paths),
        vec!["x.rs: src/a/x.rs, src/b/x.rs".to_string()]
    );
}
