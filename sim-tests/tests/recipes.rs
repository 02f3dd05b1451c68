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
