//! Records the source commit the binary is built from (`ARBOR_BUILD_COMMIT`),
//! so that sweep records name the code that ran, not whatever the checkout
//! holds when they run.

use std::process::Command;

/// `git status` that only reads: a plain `git status` refreshes the
/// index's stat cache and rewrites `.git/index`, which this script
/// watches, so the next build (the first `cargo run` after a `cargo
/// build`) would run it again and rebuild the crate for nothing.
pub const STATUS_ARGS: &[&str] = &[
    "--no-optional-locks",
    "status",
    "--porcelain",
    "--untracked-files=no",
];

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=ARBOR_COMMIT");
    if let Ok(commit) = std::env::var("ARBOR_COMMIT") {
        println!("cargo:rustc-env=ARBOR_BUILD_COMMIT={commit}");
        return;
    }
    // A new commit, a checkout or a staged change moves these; an edit of
    // the sources moves the directories (dirty state).
    for name in ["HEAD", "index", "logs/HEAD"] {
        if let Some(path) = git(&["rev-parse", "--git-path", name]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    for dir in ["src", "../engine/src"] {
        println!("cargo:rerun-if-changed={dir}");
    }
    let commit = match git(&["rev-parse", "HEAD"]).filter(|h| !h.is_empty()) {
        None => "unknown".to_string(),
        Some(head) => match git(STATUS_ARGS) {
            Some(changes) if changes.is_empty() => head,
            _ => format!("{head}-dirty"),
        },
    };
    println!("cargo:rustc-env=ARBOR_BUILD_COMMIT={commit}");
}
