//! The scale-out recipes shipped with the project (the GitHub Actions
//! workflow and the Kubernetes Indexed Job) run the sweep commands they
//! contain: each is parsed, its shell step run with the built `arbor-sim`
//! on a tiny seed range (test-sized scenario), and its slices checked to
//! cover the range once.

use serde_yaml_ng::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

#[allow(dead_code)] // the helpers other tests use
mod common;

use common::printed;

fn recipe(path: &str) -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join(path)).expect("recipe exists");
    serde_yaml_ng::from_str(&text).expect("recipe is YAML")
}

/// The sweep line of a recipe, aimed at the test binary and the small
/// scenario.
fn runnable(script: &str, binary_name: &str) -> String {
    let binary = env!("CARGO_BIN_EXE_arbor-sim");
    assert!(script.contains(&format!("{binary_name} sweep")), "{script}");
    script.replace(
        &format!("{binary_name} sweep"),
        &format!("{binary} sweep --small"),
    )
}

/// Runs `script` under `sh` with `env`, in `dir`; asserts it exits 0.
fn run(script: &str, dir: &Path, env: &[(&str, String)]) {
    let output = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("sh runs");
    assert!(output.status.success(), "{script}\n{}", printed(&output));
}

/// Seeds named by the JSON lines file at `path`.
fn seeds_in(path: &PathBuf) -> Vec<u64> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|line| {
            let record: serde_json::Value = serde_json::from_str(line).expect("JSON line");
            assert_eq!(record["verdict"], "pass", "{line}");
            record["seed"].as_u64().expect("seed")
        })
        .collect()
}

/// Every seed of `1..=seeds` once over all slices.
fn assert_covers_once(per_slice: Vec<Vec<u64>>, seeds: u64) {
    let mut all = BTreeSet::new();
    for seed in per_slice.into_iter().flatten() {
        assert!(all.insert(seed), "seed {seed} in two slices");
    }
    assert_eq!(all, (1..=seeds).collect());
}

#[test]
fn the_kubernetes_job_covers_the_range_once() {
    let job = recipe("deploy/sweep-job.yaml");
    assert_eq!(job["spec"]["completionMode"], "Indexed");
    let completions = job["spec"]["completions"].as_u64().expect("completions");
    let container = &job["spec"]["template"]["spec"]["containers"][0];
    let slices_env = container["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "SLICES")
        .expect("SLICES set");
    assert_eq!(
        slices_env["value"].as_str(),
        Some(&*completions.to_string())
    );

    let script = container["args"][0].as_str().expect("pod script");
    let dir = tempfile::tempdir().unwrap();
    let script = runnable(script, "arbor-sim").replace("/results", dir.path().to_str().unwrap());
    let script = script.replace("exec ", "");
    let (slices, seeds) = (2, 4);
    let per_slice = (0..slices)
        .map(|index| {
            let env = [
                ("JOB_COMPLETION_INDEX", index.to_string()),
                ("SLICES", slices.to_string()),
                ("SEEDS", seeds.to_string()),
                ("SEED_START", "1".to_string()),
                ("PROFILE", "standard".to_string()),
            ];
            run(&script, dir.path(), &env);
            let out = dir.path().join((index + 1).to_string());
            assert!(out.join("junit.xml").exists());
            seeds_in(&out.join("seeds.jsonl"))
        })
        .collect();
    assert_covers_once(per_slice, seeds);
}

#[test]
fn the_github_workflow_covers_the_range_once() {
    let workflow = recipe(".github/workflows/sweep.yml");
    let slices = workflow["env"]["SLICES"].as_u64().expect("SLICES");
    let job = &workflow["jobs"]["sweep"];
    assert_eq!(job["needs"], "build");
    let matrix: Vec<u64> = job["strategy"]["matrix"]["slice"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    assert_eq!(matrix, (1..=slices).collect::<Vec<_>>());
    let script = job["steps"]
        .as_sequence()
        .unwrap()
        .iter()
        .find_map(|step| step["run"].as_str())
        .expect("a run step");

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("arbor-sim"), "").unwrap();
    let seeds = 3;
    let per_slice = [1, 2, 3]
        .iter()
        .map(|slice| {
            let script =
                runnable(script, "./arbor-sim").replace("${{ matrix.slice }}", &slice.to_string());
            let env = [
                ("SLICES", "3".to_string()),
                ("SEEDS", seeds.to_string()),
                ("SEED_START", "1".to_string()),
                ("PROFILE", "standard".to_string()),
            ];
            run(&script, dir.path(), &env);
            assert!(dir.path().join(format!("out/junit-{slice}.xml")).exists());
            seeds_in(&dir.path().join(format!("out/seeds-{slice}.jsonl")))
        })
        .collect();
    assert_covers_once(per_slice, seeds);
}

/// A stand-in for `scripts/mutants.sh` in `dir`: it writes its arguments,
/// one a line, and the campaign's environment into `MUTANTS_OUT`, with the
/// outcome files cargo-mutants would leave there.
fn stub_mutants_script(dir: &Path) {
    let scripts = dir.join("scripts");
    std::fs::create_dir_all(&scripts).unwrap();
    let stub = scripts.join("mutants.sh");
    std::fs::write(
        &stub,
        "#!/bin/sh\nset -eu\nmkdir -p \"$MUTANTS_OUT/mutants.out\"\n\
         printf '%s\\n' \"$@\" > \"$MUTANTS_OUT/args\"\n\
         echo \"$ARBOR_MUTANTS_SEEDS\" > \"$MUTANTS_OUT/seeds\"\n\
         : > \"$MUTANTS_OUT/mutants.out/missed.txt\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The `k/n` after `--shard` in the arguments a stub recorded in `out`.
fn shard_of(out: &Path) -> (u64, u64) {
    let args = std::fs::read_to_string(out.join("args")).expect("the stub ran");
    let args: Vec<&str> = args.lines().collect();
    let at = args.iter().position(|a| *a == "--shard").expect("--shard");
    let (k, n) = args[at + 1].split_once('/').expect("k/n");
    (k.parse().unwrap(), n.parse().unwrap())
}

/// Shards `0..n` once each, all of `n`.
fn assert_shards_once(shards: Vec<(u64, u64)>, n: u64) {
    let mut seen = BTreeSet::new();
    for (k, of) in shards {
        assert_eq!(of, n, "shard {k}/{of} of a campaign in {n}");
        assert!(k < n, "shard {k}/{n} out of range (k counts from 0)");
        assert!(seen.insert(k), "shard {k} run twice");
    }
    assert_eq!(seen, (0..n).collect());
}

#[test]
fn the_kubernetes_mutants_job_runs_every_shard_once() {
    let job = recipe("deploy/mutants-job.yaml");
    assert_eq!(job["spec"]["completionMode"], "Indexed");
    let completions = job["spec"]["completions"].as_u64().expect("completions");
    let container = &job["spec"]["template"]["spec"]["containers"][0];
    let env = |name: &str| {
        container["env"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
            .unwrap_or_else(|| panic!("{name} set"))
            .to_string()
    };
    assert_eq!(env("SHARDS"), completions.to_string());
    let seeds = env("ARBOR_MUTANTS_SEEDS");

    let dir = tempfile::tempdir().unwrap();
    stub_mutants_script(dir.path());
    let script = container["args"][0].as_str().expect("pod script");
    assert!(script.contains("scripts/mutants.sh"), "{script}");
    let script = script
        .replace("/results", dir.path().to_str().unwrap())
        .replace("exec ", "");
    let shards = (0..completions)
        .map(|index| {
            let env = [
                ("JOB_COMPLETION_INDEX", index.to_string()),
                ("SHARDS", completions.to_string()),
                ("ARBOR_MUTANTS_SEEDS", seeds.clone()),
            ];
            run(&script, dir.path(), &env);
            let out = dir.path().join(index.to_string());
            assert!(out.join("mutants.out/missed.txt").exists());
            assert_eq!(
                std::fs::read_to_string(out.join("seeds")).unwrap().trim(),
                seeds
            );
            shard_of(&out)
        })
        .collect();
    assert_shards_once(shards, completions);
}

#[test]
fn the_github_mutants_workflow_runs_every_shard_once() {
    let workflow = recipe(".github/workflows/mutants.yml");
    let shards = workflow["env"]["SHARDS"].as_u64().expect("SHARDS");
    let job = &workflow["jobs"]["mutants"];
    let matrix: Vec<u64> = job["strategy"]["matrix"]["shard"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    assert_eq!(matrix, (0..shards).collect::<Vec<_>>());
    let steps = job["steps"].as_sequence().unwrap();
    let step = steps
        .iter()
        .find(|step| {
            step["run"]
                .as_str()
                .is_some_and(|r| r.contains("scripts/mutants.sh"))
        })
        .expect("a step runs scripts/mutants.sh");
    let script = step["run"].as_str().unwrap();
    let out_dir = step["env"]["MUTANTS_OUT"].as_str().expect("MUTANTS_OUT");
    // What the upload step takes is what the campaign writes.
    let uploaded = steps
        .iter()
        .find_map(|step| step["with"]["path"].as_str())
        .expect("an upload step");
    assert!(
        uploaded.contains(&format!("{out_dir}/mutants.out/missed.txt")),
        "{uploaded}"
    );

    let dir = tempfile::tempdir().unwrap();
    stub_mutants_script(dir.path());
    // A file the glob below would match if the shell expanded it.
    std::fs::create_dir_all(dir.path().join("engine/src/b")).unwrap();
    std::fs::write(dir.path().join("engine/src/b/c.rs"), "").unwrap();
    let per_shard = matrix
        .iter()
        .map(|shard| {
            let script = script.replace("${{ matrix.shard }}", &shard.to_string());
            let out = dir.path().join(format!("out-{shard}"));
            let env = [
                ("SHARDS", shards.to_string()),
                ("ARBOR_MUTANTS_SEEDS", "2".to_string()),
                ("FILES", "engine/src/a.rs engine/src/b/*.rs".to_string()),
                ("MUTANTS_OUT", out.to_str().unwrap().to_string()),
            ];
            run(&script, dir.path(), &env);
            let args = std::fs::read_to_string(out.join("args")).unwrap();
            // Each file input becomes its own --file, its glob unexpanded.
            assert!(
                args.contains("--file\nengine/src/a.rs\n--file\nengine/src/b/*.rs\n"),
                "{args}"
            );
            shard_of(&out)
        })
        .collect();
    assert_shards_once(per_shard, shards);
}
