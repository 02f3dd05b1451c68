//! Real mode: wall clock, real redb files in a temporary directory, a tokio
//! multi-thread runtime, nodes in this process (one, or a cluster talking
//! over loopback TCP), reached by the generator over loopback TCP or, for
//! comparison, by direct calls.

use super::cpu::{self, CpuUse, ThreadGroup};
use super::driver::{self, RunSpec};
use super::grpc::{self, GrpcTarget};
use super::metrics::ScenarioSummary;
use super::node_timeline::{self, Watched};
use super::report::{RunReport, ServiceCounters, Verification};
use super::scenario::{Scenario, LOAD_CID};
use super::target::{GatewayTransport, NoPeers, ServiceTarget, Target, TransportTarget};
use arbor::certs::{self, Validity};
use arbor::config::{Config, PeerConfig, Role, TlsFiles};
use arbor::forest::Forest;
use arbor::grpc::GrpcServer;
use arbor::net::Transport;
use arbor::runtime::Env;
use arbor::service::Service;
use arbor::system::system_env_on;
use arbor::tcp::{Dialer, Server, ServerOptions, TcpTransport};
use arbor::tls::{CertIdentity, TlsContext};
use arbor::types::{NodeId, ReplicaId, TreeKey};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How many missing ids a verification report lists.
const MISSING_SAMPLE_MAX: usize = 10;

/// How long to wait after the load for replication to drain before
/// verifying every replica.
pub const REPLICATION_DRAIN_MAX: Duration = Duration::from_secs(120);

/// Transport-level bound on one gateway call (the generator's own deadline
/// is usually shorter and wins).
const GATEWAY_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The service configuration of the reference run (docs/design.md §7), for one
/// node storing its forest at `path`.
pub fn reference_config(
    replica_id: ReplicaId,
    path: PathBuf,
    sync_interval: Option<Duration>,
) -> Config {
    let mut config = Config::default_for_test(replica_id);
    config.tree.sync_interval = sync_interval;
    config.pilorama.path = path;
    config
}

/// Real-mode settings besides the load itself.
#[derive(Clone, Debug)]
pub struct RealOptions {
    /// 1: a single node; more: a cluster replicating over loopback TCP.
    pub replicas: usize,
    /// How the generator reaches the nodes (round-robin over replicas).
    pub gateway: GatewayTransport,
    /// The nodes' configuration; identity, peers, listen address and
    /// `pilorama.path` are filled in per node.
    pub config: Config,
    /// Where the databases go; a fresh temporary directory when `None`.
    pub data_dir: Option<PathBuf>,
    /// Tokio worker threads of the nodes' runtime.
    pub worker_threads: usize,
    /// Tokio worker threads of the generator's runtime.
    pub generator_threads: usize,
    /// gRPC gateway: HTTP/2 channels (connections) per node.
    pub grpc_channels: usize,
    pub verify: bool,
    /// The wire gateway's pool: calls in flight to each node and idle
    /// connections kept per node; `None`: as a client's transport has them
    /// (the clients' half of a node's connections, `tree.cache_size` idle).
    pub gateway_calls: Option<usize>,
    pub gateway_idle: Option<usize>,
}

/// Runs `spec` in real mode and reports.
///
/// The nodes (services, their TCP and gRPC servers, replication, commits
/// on blocking threads) run on one tokio runtime, the generator (the
/// scenarios and the gateway's client side) on another; the threads of
/// each are counted apart (`load::cpu`), so the report tells the nodes'
/// CPU from the generator's.
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
    let groups = Groups {
        nodes: ThreadGroup::new(),
        generator: ThreadGroup::new(),
    };
    let tokio = |e: std::io::Error| format!("tokio runtime: {e}");
    let nodes_runtime =
        cpu::counted_runtime(NODE_THREADS, options.worker_threads, groups.nodes.clone())
            .map_err(tokio)?;
    let load_runtime = cpu::counted_runtime(
        GENERATOR_THREADS,
        options.generator_threads,
        groups.generator.clone(),
    )
    .map_err(tokio)?;
    let runtimes = Runtimes {
        nodes_env: system_env_on(nodes_runtime.handle().clone()),
        load_env: system_env_on(load_runtime.handle().clone()),
        nodes: nodes_runtime,
        load: load_runtime,
    };
    let mut report = run_nodes(spec, options, dir, &runtimes, &groups)?;
    report.wall_time_s = wall.elapsed().as_secs_f64();
    report.host = crate::host::describe();
    Ok(report)
}

/// Thread names of the two runtimes (what `perf report --comms` selects).
pub const NODE_THREADS: &str = "arbor-node";
pub const GENERATOR_THREADS: &str = "arbor-load";

struct Groups {
    nodes: Arc<ThreadGroup>,
    generator: Arc<ThreadGroup>,
}

struct Runtimes {
    nodes: tokio::runtime::Runtime,
    load: tokio::runtime::Runtime,
    nodes_env: Env,
    load_env: Env,
}

/// The nodes under test and how the gateway reaches them.
struct Nodes {
    services: Vec<Arc<Service>>,
    /// Each service's database file, in the same order.
    files: Vec<PathBuf>,
    /// Each node's gRPC front (gateway `grpc` only).
    grpc: Vec<GrpcServer>,
}

/// How the generator reaches the nodes.
struct Gateway {
    target: Arc<dyn Target>,
    /// The wire gateway's transport, for its connection counters.
    tcp: Option<Arc<TcpTransport>>,
    grpc_channels: Option<usize>,
}

fn run_nodes(
    spec: &RunSpec,
    options: &RealOptions,
    dir: &Path,
    rt: &Runtimes,
    groups: &Groups,
) -> Result<RunReport, String> {
    assert!(options.replicas >= 1, "a run needs a node");
    let nodes = if options.replicas == 1 && !options.gateway.is_wire() {
        rt.nodes
            .block_on(async { start_single(&options.config, dir, &rt.nodes_env) })?
    } else {
        rt.nodes
            .block_on(start_served(options, dir, &rt.nodes_env))?
    };
    let gateway = connect_gateway(spec, options, dir, &nodes, rt)?;
    let target = gateway.target.clone();
    let prepared = rt.load.block_on(rt.load.spawn({
        let (spec, env, target) = (spec.clone(), rt.load_env.clone(), target.clone());
        async move { driver::prepare(&spec, &env, target).await }
    }));
    let prepared = prepared.map_err(|e| format!("preparing the load: {e}"))??;
    if prepared && nodes.services.len() > 1 {
        rt.nodes
            .block_on(drain_replication(&rt.nodes_env, &nodes.services));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let watched = Watched {
        services: nodes.services.clone(),
        files: nodes.files.clone(),
    };
    let sampler = {
        let stop = stop.clone();
        let interval = spec.window;
        std::thread::spawn(move || node_timeline::sample(watched, interval, stop))
    };
    let span = Instant::now();
    let start = CpuMark::now(groups);
    let out = rt.load.block_on(rt.load.spawn({
        let (spec, env) = (spec.clone(), rt.load_env.clone());
        async move { driver::run(&spec, &env, target).await }
    }));
    let out = out.map_err(|e| format!("the load generator failed: {e}"))?;
    let generator_end = groups.generator.ticks();
    stop.store(true, Ordering::SeqCst);
    let timeline = sampler.join().expect("the timeline sampler does not panic");
    // The nodes' CPU includes replicating the load's last writes.
    let drained = nodes.services.len() == 1
        || rt
            .nodes
            .block_on(drain_replication(&rt.nodes_env, &nodes.services));
    let end = CpuMark {
        generator: generator_end,
        ..CpuMark::now(groups)
    };
    let span_s = span.elapsed().as_secs_f64();
    let requests = answered_requests(&out.scenarios);
    let acked = out.acked.clone();
    let title = "Arbor tree service under gateway load".to_string();
    let mode = match options.replicas {
        1 => "real/single".to_string(),
        n => format!("real/cluster{n}-{}", options.gateway.name()),
    };
    let mut report = RunReport::new(title, mode, out);
    report.timeline = timeline;
    report.gateway = options.gateway.name().to_string();
    report.replicas = options.replicas;
    report.params = params(spec, &options.config);
    report.params.insert(
        "real.workers".into(),
        format!(
            "nodes {}, generator {} (tokio worker threads)",
            options.worker_threads, options.generator_threads
        ),
    );
    report.cpu = start.use_until(&end, requests, span_s);
    if groups.nodes.uncounted() + groups.generator.uncounted() > 0 {
        report.notes.push(
            "cpu: some threads' ids were unreadable (no /proc): their time is missing".into(),
        );
    }
    if let Some(tcp) = &gateway.tcp {
        let (calls, idle) = gateway_pool(options);
        report.params.insert(
            "gateway.pool".into(),
            format!("{calls} calls in flight per node, {idle} idle kept per node"),
        );
        report.notes.push(format!(
            "gateway: {} calls, {} connections opened",
            tcp.calls(),
            tcp.connections_opened()
        ));
    }
    if let Some(channels) = gateway.grpc_channels {
        report.params.insert(
            "gateway.grpc".into(),
            format!("{channels} HTTP/2 channel(s) per node, signed with the load's key"),
        );
    }
    if !drained {
        report.notes.push(format!(
            "replication still busy {REPLICATION_DRAIN_MAX:?} after the load; verified anyway"
        ));
    }
    if options.verify {
        let forests: Vec<Arc<Forest>> = nodes.services.iter().map(|s| s.forest().clone()).collect();
        let scenarios = spec.scenarios.clone();
        let check = move || verify(&forests, &scenarios, &acked);
        let env = &rt.nodes_env;
        report.verification = Some(
            rt.nodes
                .block_on(arbor::runtime::blocking(&*env.runtime, check)),
        );
    }
    let stats: Vec<_> = nodes.services.iter().map(|s| s.stats()).collect();
    report.service = Some(ServiceCounters::sum(&stats));
    for front in &nodes.grpc {
        front.handle().stop();
    }
    for s in &nodes.services {
        s.shutdown();
    }
    Ok(report)
}

/// Requests answered in a run: each iteration's, or each call of a
/// sequence.
fn answered_requests(scenarios: &[ScenarioSummary]) -> u64 {
    scenarios
        .iter()
        .map(|s| match s.calls.is_empty() {
            true => s.ok + s.errors,
            false => s.calls.iter().map(|c| c.count).sum(),
        })
        .sum()
}

/// CPU ticks of the nodes, the generator and the process at one moment.
struct CpuMark {
    nodes: u64,
    generator: u64,
    process: Option<u64>,
}

impl CpuMark {
    fn now(groups: &Groups) -> Self {
        Self {
            nodes: groups.nodes.ticks(),
            generator: groups.generator.ticks(),
            process: cpu::process_ticks(),
        }
    }

    fn use_until(&self, end: &CpuMark, requests: u64, span_s: f64) -> Option<CpuUse> {
        let process = (self.process?, end.process?);
        Some(CpuUse::of(
            (self.nodes, end.nodes),
            (self.generator, end.generator),
            process,
            requests,
            span_s,
        ))
    }
}

fn open_service(
    config: &Config,
    transport: Arc<dyn Transport>,
    env: &Env,
) -> Result<Arc<Service>, String> {
    let path = &config.pilorama.path;
    let forest = Forest::open(path, config.forest_options())
        .map_err(|e| format!("open {}: {e}", path.display()))?;
    Service::start(config.clone(), Arc::new(forest), env.clone(), transport)
        .map_err(|e| format!("start replica {}: {e}", config.node.replica_id))
}

fn start_single(base: &Config, dir: &Path, env: &Env) -> Result<Nodes, String> {
    let mut config = base.clone();
    config.node.peers.clear();
    config.pilorama.path = dir.join(format!("node-{}.redb", config.node.replica_id));
    let service = open_service(&config, Arc::new(NoPeers), env)?;
    Ok(Nodes {
        services: vec![service],
        files: vec![config.pilorama.path.clone()],
        grpc: Vec::new(),
    })
}

/// The client name the load's gateway has in its certificate.
pub const GATEWAY_CLIENT_NAME: &str = "load-gateway";

/// Certificates of a TLS run, made in `dir`: a CA, one per replica, one
/// for the gateway.
fn make_certs(dir: &Path, cluster_id: &str, replicas: &[ReplicaId]) -> Result<(), String> {
    let validity = Validity::days_from_now(1);
    let fail = |e: arbor::Error| format!("certificates in {}: {e}", dir.display());
    certs::write_ca(dir, cluster_id, validity).map_err(fail)?;
    let cluster_id = cluster_id.to_string();
    let mut identities: Vec<CertIdentity> = replicas
        .iter()
        .map(|&replica_id| CertIdentity::Replica {
            cluster_id: cluster_id.clone(),
            replica_id,
        })
        .collect();
    identities.push(CertIdentity::Client {
        cluster_id,
        name: GATEWAY_CLIENT_NAME.into(),
    });
    for identity in &identities {
        certs::write_issued(dir, identity, validity).map_err(fail)?;
    }
    Ok(())
}

/// The `node.tls` files of a certificate in `dir`.
fn tls_files(dir: &Path, (cert, key): (PathBuf, PathBuf)) -> TlsFiles {
    TlsFiles {
        ca: certs::ca_files(dir).0,
        cert,
        key,
    }
}

async fn bind_loopback() -> Result<(tokio::net::TcpListener, String), String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("bind: {e}"))?;
    let address = listener.local_addr().map_err(|e| format!("bind: {e}"))?;
    Ok((listener, address.to_string()))
}

/// Binds every listener first (ephemeral ports), then starts each node
/// with the others as peers and serves it over TCP (over mutual TLS with
/// certificates made in `dir/certs` when the gateway is `tls`), and, when
/// the gateway is `grpc`, its gRPC front too, where the load's key is
/// named a writer. Runs on the nodes' runtime: every task of a node is
/// spawned there.
async fn start_served(options: &RealOptions, dir: &Path, env: &Env) -> Result<Nodes, String> {
    let (base, replicas, gateway) = (&options.config, options.replicas, options.gateway);
    let mut listeners = Vec::new();
    for _ in 0..replicas {
        listeners.push(bind_loopback().await?);
    }
    let ids: Vec<ReplicaId> = (1..=replicas as ReplicaId).collect();
    let addresses: Vec<String> = listeners.iter().map(|(_, a)| a.clone()).collect();
    let peers_of = |me: ReplicaId| -> Vec<PeerConfig> { peers_of(&ids, &addresses, me) };
    let cert_dir = dir.join("certs");
    let tls = gateway == GatewayTransport::Tls;
    if tls {
        make_certs(&cert_dir, &base.node.cluster_id, &ids)?;
    }
    let mut nodes = Nodes {
        services: Vec::new(),
        files: Vec::new(),
        grpc: Vec::new(),
    };
    for ((id, address), (listener, _)) in ids.iter().zip(&addresses).zip(listeners) {
        let mut config = base.clone();
        config.node.replica_id = *id;
        config.node.listen = address.clone();
        config.node.peers = peers_of(*id);
        config.pilorama.path = dir.join(format!("node-{id}.redb"));
        if tls {
            config.node.tls = Some(tls_files(&cert_dir, certs::node_files(&cert_dir, *id)));
        }
        let grpc_listener = match gateway {
            GatewayTransport::Grpc => {
                let (listener, address) = bind_loopback().await?;
                config.grpc.listen = Some(address);
                // Named, so that its signatures are checked with a table.
                let key = grpc::load_signer().public().hex();
                config.access.default.grant(Role::Writer, &key);
                config.validate().map_err(|e| e.to_string())?;
                Some(listener)
            }
            _ => None,
        };
        let context = TlsContext::for_node(&config).map_err(|e| e.to_string())?;
        let transport = Arc::new(TcpTransport::new(&config, context.clone()));
        let service = open_service(&config, transport, env)?;
        let options = ServerOptions::from_config(&config);
        tokio::spawn(Server::new(listener, service.clone(), options, context).run());
        if let Some(listener) = grpc_listener {
            let front = arbor::grpc::Front::new(service.clone());
            let server = arbor::grpc::serve(&config, listener, front, None)
                .map_err(|e| format!("gRPC front of replica {id}: {e}"))?;
            nodes.grpc.push(server);
        }
        nodes.services.push(service);
        nodes.files.push(config.pilorama.path.clone());
    }
    Ok(nodes)
}

/// Each node's peers: every other replica at its address.
fn peers_of(ids: &[ReplicaId], addresses: &[String], me: ReplicaId) -> Vec<PeerConfig> {
    ids.iter()
        .zip(addresses)
        .filter(|(id, _)| **id != me)
        .map(|(id, address)| PeerConfig::new(*id, address.clone()))
        .collect()
}

/// The gateway's side: a client transport, a gRPC client or direct calls,
/// made on the generator's runtime (their connections' tasks run there).
fn connect_gateway(
    spec: &RunSpec,
    options: &RealOptions,
    dir: &Path,
    nodes: &Nodes,
    rt: &Runtimes,
) -> Result<Gateway, String> {
    let ids: Vec<ReplicaId> = (1..=nodes.services.len() as ReplicaId).collect();
    match options.gateway {
        GatewayTransport::Tcp | GatewayTransport::Tls => {
            let base = &options.config;
            let addresses: Vec<String> = nodes
                .services
                .iter()
                .map(|s| s.config().node.listen.clone())
                .collect();
            let mut config = base.clone();
            config.node.peers = peers_of(&ids, &addresses, 0);
            let context = match options.gateway == GatewayTransport::Tls {
                true => {
                    let cert_dir = dir.join("certs");
                    let files = certs::client_files(&cert_dir, GATEWAY_CLIENT_NAME);
                    let context = TlsContext::load(&tls_files(&cert_dir, files));
                    Some(Arc::new(context.map_err(|e| e.to_string())?))
                }
                false => None,
            };
            let dialer = Dialer::for_client(&config, context);
            let (calls, idle) = gateway_pool(options);
            let transport = TcpTransport::with_dialer(&config, dialer)
                .with_calls_per_peer(calls)
                .with_idle_per_peer(idle);
            let transport = Arc::new(transport);
            Ok(Gateway {
                target: Arc::new(TransportTarget::new(
                    transport.clone(),
                    ids,
                    GATEWAY_CALL_TIMEOUT,
                )),
                tcp: Some(transport),
                grpc_channels: None,
            })
        }
        GatewayTransport::Grpc => {
            let addresses: Vec<String> = nodes
                .grpc
                .iter()
                .map(|g| g.local_addr.to_string())
                .collect();
            let channels = options.grpc_channels.max(1);
            let signer = grpc::load_signer();
            let warm_tree = spec
                .scenarios
                .first()
                .map_or_else(|| TreeKey::new(LOAD_CID, "system"), |s| s.workload.tree());
            let target = rt.load.block_on(rt.load.spawn(async move {
                let target = GrpcTarget::connect(&addresses, channels, &signer).await?;
                target.warm_up(&warm_tree).await?;
                Ok::<_, String>(target)
            }));
            let target = target.map_err(|e| format!("connecting over gRPC: {e}"))??;
            Ok(Gateway {
                target: Arc::new(target),
                tcp: None,
                grpc_channels: Some(channels),
            })
        }
        GatewayTransport::InProcess => Ok(Gateway {
            target: Arc::new(ServiceTarget::new(
                nodes.services.clone(),
                rt.nodes.handle().clone(),
            )),
            tcp: None,
            grpc_channels: None,
        }),
    }
}

/// Calls in flight and idle connections per node of the wire gateway:
/// what `TcpTransport::with_dialer` gives a transport to every replica
/// unless `--gateway-calls`/`--gateway-idle` say otherwise.
fn gateway_pool(options: &RealOptions) -> (usize, usize) {
    (
        options
            .gateway_calls
            .unwrap_or(arbor::tcp::client_share(&options.config)),
        options
            .gateway_idle
            .unwrap_or(options.config.tree.cache_size),
    )
}

/// Waits until every node has pushed everything to its peers.
async fn drain_replication(env: &Env, services: &[Arc<Service>]) -> bool {
    let give_up = env.clock.now() + REPLICATION_DRAIN_MAX;
    while env.clock.now() < give_up {
        if services.iter().all(|s| s.replication_idle()) {
            return true;
        }
        env.clock.sleep(Duration::from_millis(50)).await;
    }
    false
}

/// The tree a scenario's acknowledged ids are in.
pub fn scenario_tree(scenario: &Scenario) -> TreeKey {
    scenario.workload.tree()
}

/// Acknowledged ids looked up per read transaction while verifying: one
/// transaction per id made verifying a 15-minute run cost as much as a
/// tenth of the run; one for all would hold every node's meta at once.
const VERIFY_CHUNK_IDS: usize = 4096;

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
        for chunk in ids.chunks(VERIFY_CHUNK_IDS) {
            let mut present = vec![true; chunk.len()];
            for forest in forests {
                match forest.get_nodes(&tree, chunk) {
                    Ok(found) => {
                        for (p, node) in present.iter_mut().zip(found) {
                            *p &= node.is_some();
                        }
                    }
                    Err(_) => present.fill(false),
                }
            }
            for (&id, ok) in chunk.iter().zip(present) {
                v.acked += 1;
                if ok {
                    v.found += 1;
                } else {
                    v.missing += 1;
                    if v.missing_sample.len() < MISSING_SAMPLE_MAX {
                        v.missing_sample.push(id);
                    }
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
    if !config.pilorama.replicated_batch_delay.is_zero() {
        p.insert(
            "pilorama.replicated_batch_delay".into(),
            humantime::format_duration(config.pilorama.replicated_batch_delay).to_string(),
        );
    }
    p.insert(
        "pilorama.durable".into(),
        (!config.pilorama.no_sync).to_string(),
    );
    p.insert(
        "limits.max_pending_writes".into(),
        config.limits.max_pending_writes.to_string(),
    );
    p.insert(
        "limits.max_commit_size".into(),
        config.limits.max_commit_size.to_string(),
    );
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbor::forest::{ForestOptions, WriteOp, WriteOutcome, WriteRequest};
    use arbor::types::KeyValue;

    /// Adds `count` nodes under ROOT of `tree`, returns their ids.
    fn add_nodes(forest: &Forest, tree: &TreeKey, count: usize) -> Vec<NodeId> {
        let requests: Vec<WriteRequest> = (0..count)
            .map(|i| WriteRequest {
                tree: tree.clone(),
                op: WriteOp::Move {
                    parent: arbor::types::ROOT,
                    child: None,
                    items: vec![KeyValue::new("FileName", format!("n{i}"))],
                },
            })
            .collect();
        forest
            .write_batch(&requests)
            .expect("batch commits")
            .results
            .into_iter()
            .map(|r| match r.expect("write succeeds") {
                WriteOutcome::Moved { node, .. } => node,
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }

    /// Verification spans several lookup chunks, counts a node missing on
    /// only one replica as missing, and samples the missing ids.
    #[test]
    fn verify_finds_nodes_missing_on_any_replica() {
        let scenario = Scenario::system(10, Duration::from_secs(1));
        let tree = scenario_tree(&scenario);
        let full = Arc::new(Forest::in_memory(ForestOptions::default()).expect("forest"));
        let partial = Arc::new(Forest::in_memory(ForestOptions::default()).expect("forest"));
        let count = VERIFY_CHUNK_IDS + 10;
        let ids = add_nodes(&full, &tree, count);
        // The same ids on the other replica except the last three.
        let copied: Vec<WriteRequest> = ids[..count - 3]
            .iter()
            .map(|&id| {
                let node = full.get_node(&tree, id).expect("read").expect("present");
                WriteRequest {
                    tree: tree.clone(),
                    op: WriteOp::Apply {
                        op: arbor::types::Move {
                            parent: node.parent,
                            child: id,
                            meta: node.meta,
                        },
                    },
                }
            })
            .collect();
        for r in partial.write_batch(&copied).expect("batch commits").results {
            r.expect("apply succeeds");
        }
        let scenarios = std::slice::from_ref(&scenario);
        let acked = std::slice::from_ref(&ids);
        let v = verify(std::slice::from_ref(&full), scenarios, acked);
        assert_eq!(
            (v.acked, v.found, v.missing),
            (count as u64, count as u64, 0)
        );
        let v = verify(&[full, partial], scenarios, acked);
        assert_eq!(
            (v.acked, v.found, v.missing),
            (count as u64, count as u64 - 3, 3)
        );
        assert_eq!(v.missing_sample, ids[count - 3..].to_vec());
    }
}
