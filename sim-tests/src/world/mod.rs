//! The simulated world: a madsim cluster of real Arbor nodes, each with a
//! skewed clock, a disk that outlives the node, and the engine's own TCP
//! stack over madsim's simulated streams (`simnet`; plaintext or mutual
//! TLS, `Network`); plus client nodes that call them. The scenario, the load evaluator's sim
//! mode and the tests all build on it.
//!
//! Everything here must run inside a madsim runtime
//! (`madsim::runtime::Runtime::with_seed_and_config(..).block_on(..)`).

pub mod clock;
pub mod config;
pub mod hooks;
pub mod rotation;
pub mod runtime;
pub mod simgrpc;
pub mod simnet;
pub mod simtls;
pub mod storage;
pub mod supervisor;
pub mod transport;

use crate::disk::{DiskConfig, DiskFaults, SimDisk, WeakDisk};
use crate::trace::{RunEvent, Trace};
use arbor::config::{Config, ContainerConfig};
use arbor::forest::Forest;
use arbor::proto::{Request, Response};
use arbor::runtime::{Clock, Env};
use arbor::service::Service;
use arbor::tls::TlsContext;
use arbor::{Error, ReplicaId, TreeKey};
use clock::{ClockSkew, SimClock};
use madsim::runtime::{Handle, NodeHandle};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use transport::MessageFilter;

pub use simnet::Network;

pub use config::{
    caller_at, cluster_configs, cluster_configs_with, replica_addr, Knobs, SERVICE_PORT,
};

/// How often a (re)starting node retries opening its disk, and how long it
/// waits between tries, before it gives up and stays down.
const OPEN_ATTEMPTS_MAX: u32 = 50;
const OPEN_RETRY_DELAY: Duration = Duration::from_millis(100);
/// How long a killed incarnation may take to drop its database (polled
/// every simulated millisecond), before a process restart or at the end.
const OLD_INCARNATION_DROP_MAX: Duration = Duration::from_secs(1);

/// Ops stored per tree on one replica.
pub type Heights = BTreeMap<TreeKey, u64>;

/// How far past its deadline a client's call may end: none, but for the
/// simulated clock's rounding.
const CALL_DEADLINE_SLACK: Duration = Duration::from_millis(1);

/// Time for a (re)started replica to serve (simulated).
pub const BOOT_DEADLINE: Duration = Duration::from_secs(10);

/// One replica to build.
pub struct NodeSpec {
    pub config: Config,
    pub skew: ClockSkew,
    pub disk: DiskConfig,
    /// redb's page cache (redb's default when `None`).
    pub redb_cache_bytes: Option<usize>,
}

/// A running (or crashed) replica of the world.
pub struct SimNode {
    pub name: String,
    pub replica_id: ReplicaId,
    pub addr: SocketAddr,
    pub config: Config,
    /// `node.containers` of the node's next start: `config`'s until a
    /// membership change (`World::set_node_containers`).
    containers: Arc<Mutex<Vec<ContainerConfig>>>,
    pub disk: SimDisk,
    /// The disk's faults outside error windows (torn writes, say).
    pub base_faults: DiskFaults,
    pub clock: Arc<SimClock>,
    node: NodeHandle,
    /// The service of the current incarnation; empty while down.
    service: Arc<Mutex<Option<Arc<Service>>>>,
    /// Counts the disks destroyed under this node (`replace_disk`).
    disk_generation: AtomicU64,
    /// Set once its disk was replaced: the containers every later start
    /// lists, with `node.rejoin` on.
    rejoin: Arc<Mutex<Option<Vec<ContainerConfig>>>>,
    /// What the node boots with: its own config and disk, or a stand-in's.
    boot: Arc<Boot>,
}

impl SimNode {
    /// The current incarnation's service, if the node is up.
    pub fn service(&self) -> Option<Arc<Service>> {
        self.service.lock().unwrap().clone()
    }

    pub fn madsim_id(&self) -> madsim::task::NodeId {
        self.node.id()
    }

    /// Client requests the current incarnation is still serving, answered
    /// or not (a caller that timed out leaves its request running); none
    /// while the node is down.
    pub fn client_requests_serving(&self) -> u64 {
        if self.service().is_none() {
            return 0;
        }
        self.boot.serving.lock().unwrap().load(Ordering::SeqCst)
    }

    /// The latest incarnation's server counts and the connections its
    /// listener accepted that are still alive; `None` while the node is
    /// down.
    pub fn server_connections(&self) -> Option<(arbor::tcp::ServerStats, usize)> {
        self.service()?;
        let (handle, listener) = self.boot.server.lock().unwrap().clone()?;
        let alive = (self.boot.kernels).accepted_alive(simnet::Accepted::By(listener));
        Some((handle.stats(), alive))
    }

    /// True while the node runs as a stand-in (`World::stand_in`).
    pub fn is_stand_in(&self) -> bool {
        self.boot.stand_in.lock().unwrap().is_some()
    }
}

/// Another process on a replica's machine and address: its own config
/// (a misconfigured one, say) on a disk of its own. The replica's own
/// disk stays as it was until the replica itself boots again.
pub struct StandIn {
    pub config: Config,
    pub disk: SimDisk,
}

/// A cluster of simulated replicas.
pub struct World {
    pub nodes: Vec<SimNode>,
    pub filter: Arc<MessageFilter>,
    pub trace: Trace,
    /// The scenario's observers of answers and pull passes.
    pub hooks: Arc<hooks::Hooks>,
    /// The replicas clients call (`rotation.rs`).
    pub rotation: Arc<rotation::Rotation>,
    /// The machines whose processes are paused (`Supervisor::pause`).
    pub stalls: Arc<Stalls>,
    clients: usize,
    /// The network's config when the world was built: what healing
    /// restores.
    base_net: madsim::net::Config,
    /// The replica sets clients and checkers go by (`replicas_of`): the
    /// operator's map, which a membership change rewrites.
    view: Mutex<Vec<ContainerConfig>>,
    /// How nodes and clients reach each other.
    network: Network,
    /// The kernel incarnation of every machine, which the streams of the
    /// TCP network are bound to (`simnet::Kernels`).
    kernels: simnet::Kernels,
    /// The certificates of the TLS network.
    pki: Option<Arc<simtls::Pki>>,
}

impl World {
    /// Creates and starts the replicas on the plaintext TCP network. Call
    /// inside a madsim runtime.
    pub fn build(specs: Vec<NodeSpec>, trace: Trace) -> World {
        Self::build_over(specs, trace, Network::Tcp)
    }

    /// Creates and starts the replicas on `network`. Call inside a madsim
    /// runtime.
    pub fn build_over(specs: Vec<NodeSpec>, trace: Trace, network: Network) -> World {
        let filter = Arc::new(MessageFilter::default());
        let hooks = Arc::new(hooks::Hooks::default());
        let kernels = simnet::Kernels::default();
        let view = specs
            .first()
            .map(|spec| spec.config.node.containers.clone())
            .unwrap_or_default();
        let pki = (network == Network::Tls).then(|| {
            let cluster_id = specs.first().map_or_else(
                || Config::default_for_test(1).node.cluster_id,
                |spec| spec.config.node.cluster_id.clone(),
            );
            Arc::new(simtls::Pki::new(&cluster_id))
        });
        let nodes = specs
            .into_iter()
            .map(|spec| {
                let shared = Shared {
                    filter: filter.clone(),
                    hooks: hooks.clone(),
                    kernels: kernels.clone(),
                    pki: pki.clone(),
                };
                build_node(spec, shared, trace.clone())
            })
            .collect();
        World {
            nodes,
            filter,
            trace,
            hooks,
            rotation: Arc::default(),
            stalls: Arc::default(),
            clients: 0,
            base_net: net_config(),
            view: Mutex::new(view),
            network,
            kernels,
            pki,
        }
    }

    /// How nodes and clients of this world reach each other.
    pub fn network(&self) -> Network {
        self.network
    }

    /// Every connection opened from now on carries at most `window` bytes
    /// its reader has not read, each way (`simnet::Kernels::set_window`).
    pub fn set_stream_window(&self, window: Option<usize>) {
        self.kernels.set_window(window);
    }

    /// The window connections open with now (`set_stream_window`).
    pub fn stream_window(&self) -> Option<usize> {
        self.kernels.window()
    }

    /// The kernels of the world's machines: where connection faults strike.
    pub fn kernels(&self) -> &simnet::Kernels {
        &self.kernels
    }

    /// Replicas with `configs` on fault-free disks without skew.
    pub fn build_simple(configs: Vec<Config>, trace: Trace) -> World {
        let skews = vec![ClockSkew::default(); configs.len()];
        Self::build_on_disks(configs, &skews, |i| DiskConfig::reliable(i as u64), trace)
    }

    /// Replicas with `configs` and clock `skews`, the `i`-th on a disk
    /// made from `disk_config(i)`.
    pub fn build_on_disks(
        configs: Vec<Config>,
        skews: &[ClockSkew],
        disk_config: impl Fn(usize) -> DiskConfig,
        trace: Trace,
    ) -> World {
        Self::build_on_disks_over(configs, skews, disk_config, trace, Network::Tcp)
    }

    /// `build_on_disks` on `network`.
    pub fn build_on_disks_over(
        configs: Vec<Config>,
        skews: &[ClockSkew],
        disk_config: impl Fn(usize) -> DiskConfig,
        trace: Trace,
        network: Network,
    ) -> World {
        assert_eq!(configs.len(), skews.len(), "one clock skew per replica");
        let specs = configs
            .into_iter()
            .zip(skews)
            .enumerate()
            .map(|(i, (config, &skew))| NodeSpec {
                config,
                skew,
                disk: disk_config(i),
                redb_cache_bytes: None,
            })
            .collect();
        Self::build_over(specs, trace, network)
    }

    /// Handles on every replica's disk that do not keep it alive: the leak
    /// check once the run's runtime is gone.
    pub fn disk_probes(&self) -> Vec<WeakDisk> {
        self.nodes.iter().map(|n| n.disk.downgrade()).collect()
    }

    pub fn node(&self, replica: ReplicaId) -> &SimNode {
        self.nodes
            .iter()
            .find(|n| n.replica_id == replica)
            .expect("no such replica")
    }

    pub fn replica_ids(&self) -> Vec<ReplicaId> {
        self.nodes.iter().map(|n| n.replica_id).collect()
    }

    /// The replicas holding a container, as the operator's map says
    /// (`view`): its own replica set, or every replica when it has none.
    pub fn replicas_of(&self, cid: &arbor::ContainerId) -> Vec<ReplicaId> {
        let view = self.view.lock().unwrap();
        match view.iter().find(|c| c.cid == *cid) {
            Some(container) => container.replicas.clone(),
            None => self.replica_ids(),
        }
    }

    /// The replica sets clients and checkers go by.
    pub fn view(&self) -> Vec<ContainerConfig> {
        self.view.lock().unwrap().clone()
    }

    /// Rewrites the map clients and checkers go by; the nodes keep their
    /// own until they restart (`set_node_containers`).
    pub fn set_view(&self, containers: Vec<ContainerConfig>) {
        self.trace.record(
            "world",
            format!("replica sets now {}", sets_text(&containers)),
        );
        *self.view.lock().unwrap() = containers;
    }

    /// The `node.containers` the replica starts with from its next start.
    pub fn set_node_containers(&self, replica: ReplicaId, containers: Vec<ContainerConfig>) {
        let node = self.node(replica);
        *node.containers.lock().unwrap() = containers;
    }

    /// True when the replicas run background sync.
    pub fn sync_configured(&self) -> bool {
        self.nodes
            .iter()
            .any(|n| n.config.tree.sync_interval.is_some())
    }

    /// A new client node that calls replicas over the simulated network.
    pub fn client(&mut self) -> Client {
        self.client_numbered(self.clients + 1)
    }

    /// The client `client-{index}`: a run's plan numbers its clients, and
    /// a client dropped from the plan leaves the others their names.
    pub fn client_numbered(&mut self, index: usize) -> Client {
        self.client_with(index, false)
    }

    /// The client `client-{index}` that calls a replica out of rotation
    /// too: one whose routes were never updated.
    pub fn misled_client(&mut self, index: usize) -> Client {
        self.client_with(index, true)
    }

    fn client_with(&mut self, index: usize, misled: bool) -> Client {
        let name = format!("client-{index}");
        let tls = self.pki.as_ref().map(|pki| pki.client(&name));
        let transport = self.caller_transport(tls);
        self.client_over(index, transport, misled)
    }

    /// The client `client-{index}` as a gateway that speaks gRPC to the
    /// replicas' fronts (`grpc.listen`), every call signed by `signer`
    /// (`simgrpc::GrpcTransport`). Its HTTP/2 runs in plaintext on either
    /// network: the signature, not the connection, names the caller.
    pub fn grpc_client(&mut self, index: usize, signer: &arbor::grpc::Signer) -> Client {
        let fronts = (self.nodes.iter())
            .filter_map(|n| Some((n.replica_id, n.config.grpc.listen.clone()?)))
            .collect();
        let max_message_bytes = self
            .nodes
            .first()
            .map_or(arbor::config::Limits::default().max_message_bytes, |n| {
                n.config.limits.max_message_bytes
            });
        let net = simnet::SimNet::new(self.kernels.clone());
        let transport = simgrpc::GrpcTransport::new(net, fronts, signer, max_message_bytes);
        let mut client = self.client_over(index, Arc::new(transport), false);
        client.grpc = true;
        client
    }

    fn client_over(
        &mut self,
        index: usize,
        transport: Arc<dyn arbor::net::Transport>,
        misled: bool,
    ) -> Client {
        self.clients = self.clients.max(index);
        let name = format!("client-{index}");
        let ip = config::client_ip(index);
        let node = Handle::current().create_node().name(&name).ip(ip).build();
        Client {
            name,
            node,
            transport,
            rotation: self.rotation.clone(),
            stalls: self.stalls.clone(),
            misled,
            grpc: false,
            trace: self.trace.clone(),
        }
    }

    /// A caller at the address of replica `replica`, so the replicas
    /// take it for that replica: its calls run on that replica's machine
    /// (and die with its process), or, for an id the world has no node
    /// for, on a machine of its own at the address that id would have.
    /// It calls replicas in and out of rotation alike.
    pub fn caller_as_replica(&mut self, replica: ReplicaId) -> Client {
        let name = format!("as-replica-{replica}");
        let node = match self.nodes.iter().find(|n| n.replica_id == replica) {
            Some(own) => own.node.clone(),
            None => {
                let ip = config::replica_addr(usize::from(replica) - 1).ip();
                Handle::current().create_node().name(&name).ip(ip).build()
            }
        };
        // Over TLS it holds that replica's certificate: a compromised
        // machine, not a stranger at its address.
        let tls = self.pki.as_ref().map(|pki| pki.replica(replica));
        Client {
            name,
            node,
            transport: self.caller_transport(tls),
            rotation: self.rotation.clone(),
            stalls: self.stalls.clone(),
            misled: true,
            grpc: false,
            trace: self.trace.clone(),
        }
    }

    /// The transport of a caller that is no replica: it checks no answerer
    /// on the plaintext network; over TLS it presents `tls` and checks the
    /// answerer's certificate.
    fn caller_transport(&self, tls: Option<Arc<TlsContext>>) -> Arc<dyn arbor::net::Transport> {
        let clock: Arc<dyn Clock> = Arc::new(SimClock::new(ClockSkew::default()));
        self.tcp_client_transport(clock, tls)
    }

    /// A client's transport over the engine's TCP stack, without `Hello`:
    /// plaintext, the replicas naming the client by its address, checking
    /// no answerer (the gateway's check is the engine's); or over TLS with `tls`'s certificate, which names
    /// it, the answerer's certificate checked against the replica
    /// dialled. Its limits are the first replica's (the test defaults in
    /// a world without replicas).
    fn tcp_client_transport(
        &self,
        clock: Arc<dyn Clock>,
        tls: Option<Arc<TlsContext>>,
    ) -> Arc<dyn arbor::net::Transport> {
        let mut config = self
            .nodes
            .first()
            .map_or_else(|| Config::default_for_test(1), |n| n.config.clone());
        config.node.peers = self
            .nodes
            .iter()
            .map(|n| arbor::config::PeerConfig::new(n.replica_id, n.addr.to_string()))
            .collect();
        let limits = &config.limits;
        let mut dialer =
            arbor::tcp::Dialer::plaintext(limits.connect_timeout, limits.max_message_bytes);
        if let Some(tls) = tls {
            dialer.cluster_id = tls.identity().cluster_id().to_string();
            dialer.tls = Some(tls);
        }
        let tcp = arbor::tcp::TcpTransport::with_dialer(&config, dialer);
        Arc::new(simnet::Filtered {
            local: 0,
            filter: self.filter.clone(),
            clock: clock.clone(),
            inner: Arc::new(
                tcp.with_net(Arc::new(simnet::SimNet::new(self.kernels.clone())), clock),
            ),
        })
    }

    /// Power cut and kill: unsynced writes may be lost or torn, destructors
    /// of the dying incarnation cannot reach the disk any more, and its
    /// connections die with its kernel (`simnet::Kernels`).
    pub fn crash(&self, replica: ReplicaId) {
        let node = self.node(replica);
        self.trace.record(&node.name, "crash (power failure)");
        self.trace.fingerprint(RunEvent::Crash, &node.name, &[]);
        kill_incarnation_after(node, || {
            node.disk.power_fail();
            self.kernels.power_lost(node.addr.ip());
        });
    }

    /// Ends the world at the end of a run: every replica is killed, as by
    /// a crash but without the power failure (abort the harness's own
    /// detached tasks first), and this waits (bounded) until
    /// each incarnation has dropped its forest. madsim's runtime does not
    /// cancel pending tasks when it is dropped (madsim issue #242): a
    /// service task still waiting on a timer keeps the runtime and the
    /// world, disks included, alive for the rest of the process, about
    /// 12 MB per seed of a sweep. Returns the replicas whose forest outlived
    /// the kill (none in a sound harness).
    pub async fn shut_down(&self) -> Vec<ReplicaId> {
        let forests: Vec<(ReplicaId, Weak<Forest>)> = self
            .nodes
            .iter()
            .filter_map(|node| Some((node.replica_id, kill_incarnation(node)?)))
            .collect();
        // One step for the executor to drop what was killed or aborted,
        // even when no forest is left to wait for.
        madsim::time::sleep(Duration::from_millis(1)).await;
        poll_until(OLD_INCARNATION_DROP_MAX, POLL, || {
            forests.iter().all(|(_, f)| f.strong_count() == 0)
        })
        .await;
        forests
            .into_iter()
            .filter(|(_, f)| f.strong_count() != 0)
            .map(|(replica, _)| replica)
            .collect()
    }

    /// The disk is destroyed for good while the node runs: the node dies
    /// (power and process, connections included) and its disk is replaced
    /// by an empty one. Every
    /// later start rejoins (`node.rejoin`) and lists `containers`, the
    /// containers it replicates, so that its sync rounds learn their trees
    /// from its peers (docs/design.md §6).
    pub fn replace_disk(&self, replica: ReplicaId, containers: Vec<ContainerConfig>) {
        let node = self.node(replica);
        self.trace
            .record(&node.name, "disk destroyed (node replacement)");
        self.trace
            .fingerprint(RunEvent::DiskDestroyed, &node.name, &[]);
        kill_incarnation_after(node, || self.kernels.power_lost(node.addr.ip()));
        node.disk.destroy();
        node.disk_generation.fetch_add(1, Ordering::SeqCst);
        *node.rejoin.lock().unwrap() = Some(containers);
        self.hooks.disk_replaced(replica);
    }

    /// How many disks of `replica` were destroyed so far: names the disk
    /// a request reaches.
    pub fn disk_generation(&self, replica: ReplicaId) -> u64 {
        self.node(replica).disk_generation.load(Ordering::SeqCst)
    }

    /// Process restart without a power failure (the OS keeps what was
    /// written): what a supervisor does to a process whose database hit an
    /// I/O error, since redb refuses further writes until it is reopened.
    /// The new process opens the disk only once the old one's database is
    /// gone, as the OS guarantees: two live databases on one file corrupt it.
    pub async fn restart_process(&self, replica: ReplicaId) {
        let node = self.node(replica);
        self.trace.record(&node.name, "process restart");
        self.trace.fingerprint(RunEvent::Restart, &node.name, &[]);
        stop_incarnation(node).await;
        Handle::current().restart(node.node.id());
    }

    /// Ops stored per tree on a live replica, `None` when down or its
    /// database cannot be read (poisoned by an I/O error).
    /// A dropped tree counts with the height it had reached when dropped
    /// (a tree created again goes on from there): a drop may come between
    /// two of these reads, and loses nothing a restart is answerable for.
    pub fn stored_heights(&self, replica: ReplicaId) -> Option<Heights> {
        let service = self.node(replica).service()?;
        let forest = service.forest();
        let mut heights: Heights = forest.dropped_heights().ok()?.into_iter().collect();
        for tree in forest.all_trees().ok()? {
            let height = forest.next_height(&tree).ok()?;
            let reached = heights.entry(tree).or_default();
            *reached = height.max(*reached);
        }
        Some(heights)
    }

    /// Stops the replica's process (no power failure) and starts `stand_in`
    /// on its machine in its place, or, with `None`, the replica itself
    /// again from its own disk. Returns once the old incarnation is gone.
    pub async fn stand_in(&self, replica: ReplicaId, stand_in: Option<StandIn>) {
        let node = self.node(replica);
        let what = match &stand_in {
            Some(s) => format!("stand-in claiming replica-{}", s.config.node.replica_id),
            None => "its own process again".to_string(),
        };
        self.trace.record(&node.name, format!("boots {what}"));
        self.trace.fingerprint(RunEvent::Restart, &node.name, &[]);
        stop_incarnation(node).await;
        *node.boot.stand_in.lock().unwrap() = stand_in;
        Handle::current().restart(node.node.id());
    }

    /// Starts a crashed node again; it reopens its forest from its disk.
    pub fn restart(&self, replica: ReplicaId) {
        let node = self.node(replica);
        self.trace.record(&node.name, "restart");
        self.trace.fingerprint(RunEvent::Restart, &node.name, &[]);
        // The kill is a no-op on a dead node; on a live one it frees its
        // sockets.
        kill_incarnation(node);
        Handle::current().restart(node.node.id());
    }

    pub fn is_up(&self, replica: ReplicaId) -> bool {
        self.node(replica).service().is_some()
    }

    /// Waits until the replica serves again, at most `timeout` (simulated).
    pub async fn wait_up(&self, replica: ReplicaId, timeout: Duration) -> bool {
        let deadline = clock::global_now() + timeout;
        while clock::global_now() < deadline {
            if self.is_up(replica) {
                return true;
            }
            madsim::time::sleep(Duration::from_millis(10)).await;
        }
        self.is_up(replica)
    }

    /// Runs `work` on the replica's own madsim node (so its network calls
    /// leave from that node), `None` when the node is down or died meanwhile.
    pub async fn on_node<F, T>(
        &self,
        replica: ReplicaId,
        work: impl FnOnce(Arc<Service>) -> F,
    ) -> Option<T>
    where
        F: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let node = self.node(replica);
        let service = node.service()?;
        // Fetched anew: a handle taken before a restart still points at the
        // killed incarnation, whose tasks never run.
        let current = Handle::current().get_node(node.node.id())?;
        current.spawn(work(service)).await.ok()
    }

    /// Clogs the link between two replicas in both directions.
    pub fn partition_pair(&self, a: ReplicaId, b: ReplicaId) {
        let net = madsim::net::NetSim::current();
        net.clog_link(self.node(a).node.id(), self.node(b).node.id());
        net.clog_link(self.node(b).node.id(), self.node(a).node.id());
    }

    /// Clogs one direction only.
    pub fn clog_one_way(&self, from: ReplicaId, to: ReplicaId) {
        madsim::net::NetSim::current()
            .clog_link(self.node(from).node.id(), self.node(to).node.id());
    }

    pub fn unclog_one_way(&self, from: ReplicaId, to: ReplicaId) {
        madsim::net::NetSim::current()
            .unclog_link(self.node(from).node.id(), self.node(to).node.id());
    }

    /// Removes every clog between replicas.
    pub fn heal_network(&self) {
        let net = madsim::net::NetSim::current();
        for a in &self.nodes {
            for b in &self.nodes {
                if a.replica_id != b.replica_id {
                    net.unclog_link(a.node.id(), b.node.id());
                }
            }
            net.unclog_node(a.node.id());
        }
    }

    /// Ends every fault of the network and the disks: links unclogged,
    /// loss and latency as built, no request kind blocked, every disk
    /// back to its base faults.
    pub fn heal(&self) {
        self.heal_network();
        let base = self.base_net.clone();
        madsim::net::NetSim::current().update_config(|c| *c = base);
        self.filter.unblock_all();
        for node in &self.nodes {
            node.disk.set_faults(node.base_faults);
        }
    }

    /// Packet loss as the world was built with.
    pub fn restore_packet_loss(&self) {
        let rate = self.base_net.packet_loss_rate;
        madsim::net::NetSim::current().update_config(|c| c.packet_loss_rate = rate);
    }

    /// Message latency as the world was built with.
    pub fn restore_latency(&self) {
        let latency = self.base_net.send_latency.clone();
        madsim::net::NetSim::current().update_config(|c| c.send_latency = latency);
    }

    /// The replica's disk fails writes and syncs with these probabilities
    /// (its other faults stay).
    pub fn begin_disk_errors(&self, replica: ReplicaId, write: f64, sync: f64) {
        let node = self.node(replica);
        node.disk.set_faults(DiskFaults {
            write_error_probability: write,
            sync_error_probability: sync,
            ..node.base_faults
        });
    }

    /// The replica's disk is back to its base faults.
    pub fn end_disk_errors(&self, replica: ReplicaId) {
        let node = self.node(replica);
        node.disk.set_faults(node.base_faults);
    }
}

/// Builds one madsim node whose init task opens the forest from the disk,
/// starts the service and serves requests; a restart runs it again.
/// Takes the replica's service and kills its madsim node (the executor
/// drops its tasks when it next runs); the old incarnation's forest, to
/// wait for.
fn kill_incarnation(node: &SimNode) -> Option<Weak<Forest>> {
    kill_incarnation_after(node, || {})
}

/// `kill_incarnation`, with `before_kill` run between taking the
/// service and the kill (what a power loss does to the machine).
fn kill_incarnation_after(node: &SimNode, before_kill: impl FnOnce()) -> Option<Weak<Forest>> {
    let old = node
        .service
        .lock()
        .unwrap()
        .take()
        .map(|service| Arc::downgrade(service.forest()));
    // The server's handle holds the service too.
    node.boot.server.lock().unwrap().take();
    before_kill();
    Handle::current().kill(node.node.id());
    // The gRPC front's tasks (`simgrpc::Stop`) end after the kill, not
    // before: the tasks it wakes then belong to the dead process. Woken
    // before it, they ran once more against the connections the kill was
    // closing, and the same seed's runs differed from one process to the
    // next.
    node.boot.grpc.lock().unwrap().take();
    old
}

/// Kills the node's incarnation and waits (bounded) until its database
/// is gone. Kill first: madsim's restart alone keeps the old sockets bound.
async fn stop_incarnation(node: &SimNode) {
    if let Some(old_forest) = kill_incarnation(node) {
        let gone = poll_until(OLD_INCARNATION_DROP_MAX, POLL, || {
            old_forest.strong_count() == 0
        });
        assert!(
            gone.await,
            "{}: the killed incarnation still holds its forest",
            node.name
        );
    }
}

/// How often the world polls for a state it waits for (simulated).
const POLL: Duration = Duration::from_millis(1);

/// Replica sets in brief, for the trace.
fn sets_text(containers: &[ContainerConfig]) -> String {
    let sets: Vec<String> = containers
        .iter()
        .map(|c| format!("{}: {:?} (retired {:?})", c.cid, c.replicas, c.retired))
        .collect();
    sets.join("; ")
}

/// Checks `done` every `poll` for at most `limit` (simulated); whether it
/// came true.
async fn poll_until(limit: Duration, poll: Duration, done: impl Fn() -> bool) -> bool {
    let deadline = clock::global_now() + limit;
    loop {
        if done() {
            return true;
        }
        if clock::global_now() >= deadline {
            return false;
        }
        madsim::time::sleep(poll).await;
    }
}

/// The current network config of the simulation.
fn net_config() -> madsim::net::Config {
    let mut config = None;
    madsim::net::NetSim::current().update_config(|c| config = Some(c.clone()));
    config.expect("update_config runs its closure")
}

/// What every node of a world shares.
struct Shared {
    filter: Arc<MessageFilter>,
    hooks: Arc<hooks::Hooks>,
    kernels: simnet::Kernels,
    pki: Option<Arc<simtls::Pki>>,
}

fn build_node(spec: NodeSpec, shared: Shared, trace: Trace) -> SimNode {
    let Shared {
        filter,
        hooks,
        kernels,
        pki,
    } = shared;
    let config = spec.config;
    let replica_id = config.node.replica_id;
    let name = format!("replica-{replica_id}");
    let addr: SocketAddr = config
        .node
        .listen
        .parse()
        .expect("a simulated node listens on an ip:port");
    let clock = Arc::new(SimClock::new(spec.skew));
    let service = Arc::new(Mutex::new(None));
    let containers = Arc::new(Mutex::new(config.node.containers.clone()));
    let disk = SimDisk::new(spec.disk);
    let base_faults = spec.disk.faults;
    let rejoin = Arc::new(Mutex::new(None));
    let boot = Boot {
        name: name.clone(),
        config: config.clone(),
        containers: containers.clone(),
        disk: disk.clone(),
        redb_cache_bytes: spec.redb_cache_bytes,
        clock: clock.clone(),
        filter,
        trace,
        hooks,
        slot: service.clone(),
        rejoin: rejoin.clone(),
        serving: Mutex::default(),
        stand_in: Mutex::new(None),
        kernels,
        pki,
        server: Mutex::new(None),
        grpc: Mutex::new(None),
    };
    let boot = Arc::new(boot);
    let init = boot.clone();
    let node = Handle::current()
        .create_node()
        .name(&name)
        .ip(addr.ip())
        .init(move || init.clone().run())
        .build();
    SimNode {
        name,
        replica_id,
        addr,
        config,
        containers,
        disk,
        base_faults,
        clock,
        node,
        service,
        disk_generation: AtomicU64::new(0),
        rejoin,
        boot,
    }
}

/// What a node needs to (re)start.
struct Boot {
    name: String,
    config: Config,
    /// Replaces `config`'s `node.containers` at each start.
    containers: Arc<Mutex<Vec<ContainerConfig>>>,
    disk: SimDisk,
    redb_cache_bytes: Option<usize>,
    clock: Arc<SimClock>,
    filter: Arc<MessageFilter>,
    trace: Trace,
    hooks: Arc<hooks::Hooks>,
    slot: Arc<Mutex<Option<Arc<Service>>>>,
    rejoin: Arc<Mutex<Option<Vec<ContainerConfig>>>>,
    /// Client requests the current incarnation serves (`Counted`).
    serving: Mutex<Arc<AtomicU64>>,
    /// Set while a stand-in runs on this machine instead of the replica.
    stand_in: Mutex<Option<StandIn>>,
    kernels: simnet::Kernels,
    pki: Option<Arc<simtls::Pki>>,
    /// The TCP server of the latest incarnation and its listener's number,
    /// dropped with the incarnation: it holds the
    /// service.
    server: Mutex<Option<(arbor::tcp::ServerHandle, u64)>>,
    /// The gRPC front's tasks of the latest incarnation, ended when it is
    /// dropped (`simgrpc::Stop`).
    grpc: Mutex<Option<simgrpc::Stop>>,
}

impl Boot {
    /// The TLS context of this machine over the TLS network: the
    /// certificate of the replica the machine is, whatever the config of
    /// the process running on it claims (a stand-in keeps the machine's
    /// certificate, so peers know it by it).
    fn tls(&self) -> Option<Arc<TlsContext>> {
        let pki = self.pki.as_ref()?;
        Some(pki.replica(self.config.node.replica_id))
    }

    /// The config of this start: the replica sets of its latest
    /// membership change; a node whose disk was replaced rejoins.
    fn config(&self) -> Config {
        let mut config = self.config.clone();
        config.node.containers = self.containers.lock().unwrap().clone();
        if let Some(containers) = self.rejoin.lock().unwrap().clone() {
            config.node.rejoin = true;
            for container in containers {
                if !config
                    .node
                    .containers
                    .iter()
                    .any(|c| c.cid == container.cid)
                {
                    config.node.containers.push(container);
                }
            }
        }
        config
    }

    /// The config and disk of the incarnation to start, and whether it is
    /// the replica itself (the scenario's observers watch only replicas).
    /// The replica starts with the replica sets of its latest membership
    /// change.
    fn incarnation(&self) -> (Config, SimDisk, bool) {
        match &*self.stand_in.lock().unwrap() {
            Some(s) => (s.config.clone(), s.disk.clone(), false),
            None => (self.config(), self.disk.clone(), true),
        }
    }

    async fn run(self: Arc<Self>) {
        let (config, disk, itself) = self.incarnation();
        let Some(forest) = self.open_forest(&config, &disk).await else {
            self.trace
                .record(&self.name, "gave up opening its disk; stays down");
            return;
        };
        let env = Env {
            clock: self.clock.clone(),
            runtime: Arc::new(runtime::SimRuntime::new(Some(Arc::new(move || {
                disk.take_latency()
            })))),
        };
        // The node's own dialler: `Hello` as its replica id, and the
        // answer's replica checked against the one dialled.
        let tcp = arbor::tcp::TcpTransport::new(&config, self.tls());
        let clock: Arc<dyn Clock> = self.clock.clone();
        let transport: Arc<dyn arbor::net::Transport> = Arc::new(simnet::Filtered {
            local: config.node.replica_id,
            filter: self.filter.clone(),
            clock: clock.clone(),
            inner: Arc::new(
                tcp.with_net(Arc::new(simnet::SimNet::new(self.kernels.clone())), clock),
            ),
        });
        let service = match Service::start(config.clone(), Arc::new(forest), env.clone(), transport)
        {
            Ok(service) => service,
            Err(e) => panic!("{}: service does not start: {e}", self.name),
        };
        if itself {
            self.hooks.attach_pulls(config.node.replica_id, &service);
        }
        *self.slot.lock().unwrap() = Some(service.clone());
        self.trace.record(&self.name, "up");
        let addr = config.node.listen.parse().expect("listen is ip:port");
        let handler: Arc<dyn transport::Handler> = match self.hooks.answers() {
            Some(watch) if itself => Arc::new(transport::Watched {
                replica: config.node.replica_id,
                service,
                watch,
            }),
            _ => service,
        };
        let serving = Arc::new(AtomicU64::new(0));
        *self.serving.lock().unwrap() = serving.clone();
        let handler = Arc::new(transport::Counted {
            inner: handler,
            serving,
        });
        if let Some(listen) = &config.grpc.listen {
            self.serve_grpc(&config, listen, handler.clone()).await;
        }
        self.serve_tcp(&config, addr, handler, env).await
    }

    /// Serves the gRPC front of the node at `listen` on a task of the
    /// node (`world/simgrpc.rs`), until the node is killed: its calls,
    /// translated, reach `handler` as the native protocol's do, so the
    /// answer oracle sees them and the trace takes them in.
    async fn serve_grpc(
        &self,
        config: &Config,
        listen: &str,
        handler: Arc<dyn transport::Handler>,
    ) {
        let addr: SocketAddr = listen.parse().expect("grpc.listen is ip:port");
        let (listener, handler) = self.listen_traced(addr, handler).await;
        let front = arbor::grpc::Front::through(config, handler);
        *self.grpc.lock().unwrap() = Some(simgrpc::serve(
            listener,
            front,
            config.limits.max_message_bytes,
            config.grpc.max_concurrent_streams,
        ));
    }

    /// Serves `handler` through `arbor::tcp::Server` on a `SimListener` at
    /// `addr`, plaintext or over TLS, with the node's own limits, until
    /// the node is killed.
    async fn serve_tcp(
        &self,
        config: &Config,
        addr: SocketAddr,
        handler: Arc<dyn transport::Handler>,
        env: Env,
    ) {
        let (listener, handler) = self.listen_traced(addr, handler).await;
        let options = arbor::tcp::ServerOptions::from_config(config);
        let number = listener.number();
        let server =
            arbor::tcp::Server::with_env(Box::new(listener), handler, options, self.tls(), env);
        *self.server.lock().unwrap() = Some((server.handle(), number));
        server.run().await
    }

    /// A listener at `addr` on the node, and `handler` behind it with
    /// every request and answer it serves there going into the trace.
    async fn listen_traced(
        &self,
        addr: SocketAddr,
        handler: Arc<dyn transport::Handler>,
    ) -> (simnet::SimListener, Arc<simnet::TcpHandler>) {
        let listener = match simnet::SimListener::bind(addr, caller_at, self.kernels.clone()).await
        {
            Ok(listener) => listener,
            Err(e) => panic!("simulated node cannot bind {addr}: {e}"),
        };
        let handler = Arc::new(simnet::TcpHandler {
            inner: handler,
            server: addr.to_string(),
            trace: self.trace.clone(),
        });
        (listener, handler)
    }

    async fn open_forest(&self, config: &Config, disk: &SimDisk) -> Option<arbor::forest::Forest> {
        let options = config.forest_options();
        for attempt in 1..=OPEN_ATTEMPTS_MAX {
            match storage::open_forest(disk, options.clone(), self.redb_cache_bytes) {
                Ok(forest) => return Some(forest),
                Err(e) => {
                    self.trace
                        .record(&self.name, format!("open attempt {attempt} failed: {e}"));
                    madsim::time::sleep(OPEN_RETRY_DELAY).await;
                }
            }
        }
        None
    }
}

/// The machines whose processes are paused now, and how many pauses each
/// has had (`Supervisor::pause`).
#[derive(Debug, Default)]
pub struct Stalls(Mutex<BTreeMap<madsim::task::NodeId, (bool, u64)>>);

impl Stalls {
    /// The machine's processes stop.
    pub fn begin(&self, machine: madsim::task::NodeId) {
        let mut stalls = self.0.lock().unwrap();
        let (paused, count) = stalls.entry(machine).or_default();
        *paused = true;
        *count += 1;
    }

    /// They go on.
    pub fn end(&self, machine: madsim::task::NodeId) {
        if let Some((paused, _)) = self.0.lock().unwrap().get_mut(&machine) {
            *paused = false;
        }
    }

    pub fn is_paused(&self, machine: madsim::task::NodeId) -> bool {
        self.0.lock().unwrap().get(&machine).is_some_and(|s| s.0)
    }

    /// Pauses the machine has had so far, the one under way included.
    pub fn count(&self, machine: madsim::task::NodeId) -> u64 {
        self.0.lock().unwrap().get(&machine).map_or(0, |s| s.1)
    }
}

/// A client machine calling replicas over the simulated network.
pub struct Client {
    pub name: String,
    node: NodeHandle,
    transport: Arc<dyn arbor::net::Transport>,
    rotation: Arc<rotation::Rotation>,
    /// Its machine's pauses end none of its calls' deadlines.
    stalls: Arc<Stalls>,
    /// Calls replicas out of rotation too.
    misled: bool,
    /// Speaks gRPC to the replicas' fronts (`World::grpc_client`).
    grpc: bool,
    /// Takes the outcome of every call into the run's fingerprint.
    trace: Trace,
}

impl Client {
    /// True for a gateway that speaks gRPC (`World::grpc_client`).
    pub fn speaks_grpc(&self) -> bool {
        self.grpc
    }

    /// One request to `replica`, answered or failed within `timeout`. A
    /// replica out of rotation is not called (unless the client is
    /// misled): the call fails at once as unreachable, its outcome known
    /// to be nothing but reported as unknown, as a network error is.
    pub async fn call(
        &self,
        replica: ReplicaId,
        request: Request,
        timeout: Duration,
    ) -> Result<Response, Error> {
        if !self.misled && self.rotation.is_out(replica) {
            return Err(Error::Network(format!(
                "replica-{replica} is out of rotation"
            )));
        }
        let _in_flight = self.rotation.enter(replica);
        let began = clock::global_now();
        let machine = self.node.id();
        let pauses = (self.stalls.is_paused(machine), self.stalls.count(machine));
        let call = self.transport.call(replica, request, timeout);
        let result = match self.node.spawn(call).await {
            Ok(result) => result,
            // The call's machine stopped (a caller at a replica's address
            // shares the replica's). Not `JoinError`'s words: they name
            // the task by a number madsim counts process-wide, which the
            // outcome's fingerprint would take in.
            Err(e) if e.is_panic() => Err(Error::Network("client task panicked".into())),
            Err(_) => Err(Error::Network("client task cancelled".into())),
        };
        // Every transport ends a call at its deadline, answered or not; a
        // caller left waiting longer is a broken bound, not a slow run.
        // A caller whose own machine stalled meanwhile (a caller at a
        // paused replica's address) is late by the stall.
        let took = clock::global_now() - began;
        let stalled = pauses.0 || self.stalls.count(machine) != pauses.1;
        assert!(
            took <= timeout + CALL_DEADLINE_SLACK || stalled,
            "{}: a call to replica-{replica} ended {took:?} after it began, beyond its deadline of {timeout:?}",
            self.name
        );
        let outcome = postcard::to_allocvec(&result).expect("an outcome always encodes");
        self.trace.fingerprint(
            RunEvent::Outcome,
            &self.name,
            &[&replica.to_le_bytes(), &outcome],
        );
        result
    }
}
