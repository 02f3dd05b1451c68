//! Real mode: wall clock, real redb files in a temporary directory, a tokio
//! multi-thread runtime, nodes in this process.

use super::driver::{self, RunSpec};
use super::env::wall_env;
use super::report::{RunReport, ServiceCounters, Verification};
use super::scenario::{Scenario, Workload, LOAD_CID};
use super::target::{NoPeers, ServiceTarget, Target};
use arbor::config::{Config, Limits, NodeConfig, PiloramaConfig, TreeConfig};
use arbor::forest::{Forest, ForestOptions};
use arbor::runtime::Env;
use arbor::service::Service;
use arbor::types::{NodeId, ReplicaId, TreeKey};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How many missing ids a verification report lists.
const MISSING_SAMPLE_MAX: usize = 10;

/// The service configuration of the reference run (DESIGN §7), for one
/// node storing its forest at `path`.
pub fn reference_config(
    replica_id: ReplicaId,
    path: PathBuf,
    sync_interval: Option<Duration>,
) -> Config {
    Config {
        tree: TreeConfig {
            enabled: true,
            cache_size: 15,
            replication_worker_count: 1000,
            replication_channel_capacity: 1000,
            replication_timeout: Duration::from_secs(5),
            sync_interval,
        },
        pilorama: PiloramaConfig {
            max_batch_delay: Duration::from_millis(5),
            max_batch_size: 100,
            path,
            no_sync: false,
        },
        node: NodeConfig {
            replica_id,
            listen: "127.0.0.1:0".to_string(),
            peers: Vec::new(),
            containers: Vec::new(),
        },
        limits: Limits {
            max_message_bytes: 4 << 20,
            max_meta_bytes: 64 << 10,
            max_path_len: 256,
            max_pending_writes: 10_000,
            sync_page_size: 1000,
            max_subtree_nodes: 100_000,
            max_connections: 1024,
            connect_timeout: Duration::from_secs(1),
        },
    }
}

pub fn forest_options(config: &Config) -> ForestOptions {
    ForestOptions {
        replica_id: config.node.replica_id,
        max_meta_bytes: config.limits.max_meta_bytes,
        max_path_len: config.limits.max_path_len,
        durable: !config.pilorama.no_sync,
    }
}

/// Which nodes real mode runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// One node, no peers.
    Single,
}

/// Real-mode settings besides the load itself.
#[derive(Clone, Debug)]
pub struct RealOptions {
    pub topology: Topology,
    /// The node's configuration; its `pilorama.path` is replaced by a file
    /// under `data_dir`.
    pub config: Config,
    /// Where the databases go; a fresh temporary directory when `None`.
    pub data_dir: Option<PathBuf>,
    pub worker_threads: usize,
    pub verify: bool,
}

/// Runs `spec` in real mode and reports.
pub fn run(spec: &RunSpec, options: &RealOptions) -> Result<RunReport, String> {
    let wall = Instant::now();
    let temp;
    let dir: &Path = match &options.data_dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| format!("create {}: {e}", d.display()))?;
            d
        }
        None => {
            temp = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
            temp.path()
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.worker_threads.max(1))
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let env = wall_env(runtime.handle().clone());
    let mut report = runtime.block_on(run_single(spec, options, dir, env))?;
    report.wall_time_s = wall.elapsed().as_secs_f64();
    Ok(report)
}

async fn run_single(
    spec: &RunSpec,
    options: &RealOptions,
    dir: &Path,
    env: Env,
) -> Result<RunReport, String> {
    let mut config = options.config.clone();
    config.pilorama.path = dir.join("node-1.redb");
    let forest = Arc::new(
        Forest::open(&config.pilorama.path, forest_options(&config))
            .map_err(|e| format!("open forest: {e}"))?,
    );
    let service = Service::start(config.clone(), forest, env.clone(), Arc::new(NoPeers))
        .map_err(|e| format!("start service: {e}"))?;
    let target: Arc<dyn Target> = Arc::new(ServiceTarget::new(vec![service.clone()]));
    let out = driver::run(spec, &env, target).await;
    let acked = out.acked.clone();
    let mut report = RunReport::new(
        "Arbor tree service under gateway load".to_string(),
        "real/single".to_string(),
        out,
    );
    report.params = params(spec, &config);
    report.service = Some(ServiceCounters::sum([&service.stats()]));
    if options.verify {
        let forest = service.forest().clone();
        let scenarios = spec.scenarios.clone();
        let verification =
            arbor::runtime::blocking(&*env.runtime, move || verify(&[forest], &scenarios, &acked))
                .await;
        report.verification = Some(verification);
    }
    service.shutdown();
    Ok(report)
}

/// The tree a scenario writes to.
pub fn scenario_tree(scenario: &Scenario) -> TreeKey {
    match scenario.workload {
        Workload::SystemAdd => TreeKey::new(LOAD_CID, "system"),
        Workload::UserAddByPath { .. } => TreeKey::new(LOAD_CID, "version"),
    }
}

/// Checks that every acknowledged node is present on every given forest.
pub fn verify(
    forests: &[Arc<Forest>],
    scenarios: &[Scenario],
    acked: &[Vec<NodeId>],
) -> Verification {
    let mut v = Verification {
        replicas_checked: forests.len() as u32,
        ..Verification::default()
    };
    for (scenario, ids) in scenarios.iter().zip(acked) {
        let tree = scenario_tree(scenario);
        for &id in ids {
            v.acked += 1;
            let present = forests
                .iter()
                .all(|f| matches!(f.get_node(&tree, id), Ok(Some(_))));
            if present {
                v.found += 1;
            } else {
                v.missing += 1;
                if v.missing_sample.len() < MISSING_SAMPLE_MAX {
                    v.missing_sample.push(id);
                }
            }
        }
    }
    v
}

/// The knobs of a run, for the report.
pub fn params(spec: &RunSpec, config: &Config) -> std::collections::BTreeMap<String, String> {
    let mut p = std::collections::BTreeMap::new();
    for s in &spec.scenarios {
        let stages: Vec<String> = s
            .stages
            .iter()
            .map(|st| {
                format!(
                    "{}/s for {}",
                    st.rate,
                    humantime::format_duration(st.duration)
                )
            })
            .collect();
        p.insert(format!("scenario.{}", s.name), stages.join(", "));
    }
    p.insert(
        "deadline".into(),
        humantime::format_duration(spec.deadline).to_string(),
    );
    p.insert(
        "tree.sync_interval".into(),
        super::matrix::sync_label(config.tree.sync_interval),
    );
    p.insert(
        "tree.replication".into(),
        format!(
            "{} workers, queue {}, timeout {}",
            config.tree.replication_worker_count,
            config.tree.replication_channel_capacity,
            humantime::format_duration(config.tree.replication_timeout)
        ),
    );
    p.insert(
        "pilorama.batch".into(),
        format!(
            "{} ops / {}",
            config.pilorama.max_batch_size,
            humantime::format_duration(config.pilorama.max_batch_delay)
        ),
    );
    p.insert(
        "pilorama.durable".into(),
        (!config.pilorama.no_sync).to_string(),
    );
    p.insert(
        "limits.max_pending_writes".into(),
        config.limits.max_pending_writes.to_string(),
    );
    p
}
