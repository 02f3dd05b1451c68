//! The build script's `git status` must leave `.git/index` alone: the
//! script watches that file, so a status that rewrote it made the first
//! `cargo run` after a `cargo build` rebuild arbor-sim.

use std::path::Path;
use std::process::Command;

#[allow(dead_code)]
#[path = "../build.rs"]
mod build;

fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
        .output()
        .expect("git runs");
    assert!(output.status.success(), "git {args:?}: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A repository whose index holds stale stat data for its one file (the
/// file was touched after it was staged), as after any edit-and-undo.
fn stale_repository() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    git(path, &["init", "--quiet"]);
    std::fs::write(path.join("file"), "same\n").unwrap();
    git(path, &["add", "file"]);
    git(path, &["commit", "--quiet", "-m", "one"]);
    // The index caches the file's stat data: a later mtime makes it stale.
    let file = std::fs::File::options()
        .write(true)
        .open(path.join("file"))
        .unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    file.set_modified(later).unwrap();
    dir
}

fn index_bytes(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join(".git/index")).unwrap()
}

#[test]
fn the_build_scripts_status_leaves_the_index_alone() {
    // A plain status rewrites the index of such a repository: the check
    // below can fail.
    let plain = stale_repository();
    let before = index_bytes(plain.path());
    git(
        plain.path(),
        &["status", "--porcelain", "--untracked-files=no"],
    );
    assert_ne!(
        index_bytes(plain.path()),
        before,
        "a plain status rewrote nothing"
    );

    let repo = stale_repository();
    let before = index_bytes(repo.path());
    let status = git(repo.path(), build::STATUS_ARGS);
    assert_eq!(status, "", "the file's content did not change");
    assert_eq!(
        index_bytes(repo.path()),
        before,
        "the build script's status rewrote the index"
    );
}
