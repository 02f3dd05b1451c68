//! The hostile-probe table of docs/security.md, replayed over the wire
//! against a real 3-node loopback cluster, once in plaintext and once with
//! mutual TLS: each probe asserts the refusal it gets and that nothing it
//! sent reached any replica.
//!
//! Who calls: over TLS a client is named by its certificate (`writer`,
//! `reader`, and `mallory`, who holds no right) and a peer by its replica
//! certificate. In plaintext nothing proves a name: every caller without
//! `Hello` is anonymous, and the cluster grants anonymous callers the
//! writer role (a plaintext cluster serves trusted gateways only), so the
//! probes there ask what a writer may not do; a caller whose `Hello` names
//! a peer is taken for it (docs/security.md, "Plaintext").

mod service_support;

use arbor::certs::{self, Issued, Validity};
use arbor::config::{AccessConfig, Config, ContainerAccess, Grants, PeerConfig, Role};
use arbor::forest::Forest;
use arbor::net::Transport;
use arbor::proto::{Request, Response};
use arbor::service::Service;
use arbor::system::system_env;
use arbor::tcp::{Connection, Dialer, Server, ServerHandle, ServerOptions, TcpTransport};
use arbor::tls::{CertIdentity, PemFiles, TlsContext};
use arbor::types::{make_timestamp, COUNTER_MAX};
use arbor::{ContainerId, Error, KeyValue, Move, ReplicaId, TreeKey, ATTR_FILE_NAME};
use arbor::{ROOT, TRASH};
use service_support::{file, root_op};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// Bounds every wait; none is expected to come close.
const PATIENCE: Duration = Duration::from_secs(30);
const CLUSTER: &str = "probes";
const MESSAGE_MAX: usize = 1 << 20;
const META_MAX: usize = 40 << 10;
const IDLE_TIMEOUT: Duration = Duration::from_secs(2);
const CONNECTIONS_MAX: usize = 64;
const PARTIAL_FRAMES_MAX: usize = 4 << 20;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Plaintext,
    Tls,
}

/// Who makes a call.
#[derive(Clone, Copy, Debug)]
enum Who {
    /// A client the access config names (TLS); anonymous in plaintext.
    Client(&'static str),
    /// A client with no right at all (TLS: a certificate of the cluster's
    /// CA naming nobody the config lists; plaintext: anonymous).
    Stranger,
    /// A replica, proven by its certificate (TLS) or claimed in `Hello`.
    Peer(ReplicaId),
}

fn cid() -> ContainerId {
    ContainerId([3; 32])
}

fn tree() -> TreeKey {
    TreeKey::new(cid(), "probed")
}

fn access(mode: Mode) -> AccessConfig {
    let mut grants = Grants::default();
    grants.grant(Role::Owner, "owner");
    grants.grant(Role::Writer, "writer");
    grants.grant(Role::Reader, "reader");
    AccessConfig {
        anonymous: (mode == Mode::Plaintext).then_some(Role::Writer),
        containers: vec![ContainerAccess { cid: cid(), grants }],
        ..AccessConfig::default()
    }
}

struct Node {
    service: Arc<Service>,
    transport: Arc<TcpTransport>,
    server: ServerHandle,
}

struct Cluster {
    ca: Option<Issued>,
    /// Certificates made so far, by the name they were made for.
    contexts: Mutex<BTreeMap<String, Arc<TlsContext>>>,
    addresses: Vec<String>,
    nodes: Vec<Node>,
}

fn tls_context(ca: &Issued, who: &CertIdentity) -> Arc<TlsContext> {
    let issued = certs::issue(ca, who, Validity::days_from_now(1)).unwrap();
    let pem = PemFiles {
        ca: ca.cert_pem.as_bytes(),
        cert: issued.cert_pem.as_bytes(),
        key: issued.key_pem.as_bytes(),
    };
    Arc::new(TlsContext::from_pem(&pem).unwrap())
}

fn replica_identity(replica_id: ReplicaId) -> CertIdentity {
    CertIdentity::Replica {
        cluster_id: CLUSTER.into(),
        replica_id,
    }
}

/// The config of the node listening at `addresses[index]`, which believes
/// it is replica `id`.
fn node_config(mode: Mode, addresses: &[String], index: usize, id: ReplicaId) -> Config {
    let mut config = Config::default_for_test(id);
    config.node.cluster_id = CLUSTER.into();
    config.node.peers = (1..=addresses.len() as ReplicaId)
        .filter(|&peer| peer != id)
        .map(|peer| PeerConfig::new(peer, addresses[peer as usize - 1].clone()))
        .collect();
    config.node.listen = addresses[index].clone();
    config.access = access(mode);
    config.limits.max_message_bytes = MESSAGE_MAX;
    config.limits.max_meta_bytes = META_MAX;
    config.limits.max_connections = CONNECTIONS_MAX;
    config.limits.idle_connection_timeout = IDLE_TIMEOUT;
    config.limits.partial_frames_bytes_max = PARTIAL_FRAMES_MAX;
    config.limits.handshake_timeout = IDLE_TIMEOUT;
    config.tree.replication_timeout = Duration::from_secs(1);
    config.tree.sync_interval = Some(Duration::from_secs(1));
    config
}

/// Three replicas on loopback; `ids[i]` is the replica id node `i` is
/// configured with (`[1, 2, 3]` unless a probe misconfigures one).
async fn start(mode: Mode, ids: [ReplicaId; 3]) -> Cluster {
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addresses: Vec<String> = listeners
        .iter()
        .map(|l| l.local_addr().unwrap().to_string())
        .collect();
    let ca =
        (mode == Mode::Tls).then(|| certs::create_ca(CLUSTER, Validity::days_from_now(1)).unwrap());
    let mut nodes = Vec::new();
    for (index, listener) in listeners.into_iter().enumerate() {
        let config = node_config(mode, &addresses, index, ids[index]);
        let tls = ca
            .as_ref()
            .map(|ca| tls_context(ca, &replica_identity(ids[index])));
        nodes.push(start_node(listener, config, tls));
    }
    Cluster {
        ca,
        contexts: Mutex::default(),
        addresses,
        nodes,
    }
}

fn start_node(listener: TcpListener, config: Config, tls: Option<Arc<TlsContext>>) -> Node {
    let forest = Forest::in_memory(config.forest_options()).unwrap();
    let transport = Arc::new(TcpTransport::new(&config, tls.clone()));
    let env = system_env();
    let service = Service::start(config.clone(), Arc::new(forest), env, transport.clone()).unwrap();
    let server = Server::new(
        listener,
        service.clone(),
        ServerOptions::from_config(&config),
        tls,
    );
    let handle = server.handle();
    tokio::spawn(server.run());
    Node {
        service,
        transport,
        server: handle,
    }
}

impl Cluster {
    /// A TLS context for `who`, made once per cluster (key generation is
    /// the slow part of a call).
    fn context(&self, ca: &Issued, who: &CertIdentity) -> Arc<TlsContext> {
        let key = format!("{who:?}");
        let mut contexts = self.contexts.lock().unwrap();
        let made = contexts.entry(key).or_insert_with(|| tls_context(ca, who));
        made.clone()
    }

    fn dialer(&self, who: Who) -> Dialer {
        let identity = |who| match who {
            Who::Client(name) => CertIdentity::Client {
                cluster_id: CLUSTER.into(),
                name: name.into(),
            },
            Who::Stranger => CertIdentity::Client {
                cluster_id: CLUSTER.into(),
                name: "mallory".into(),
            },
            Who::Peer(id) => replica_identity(id),
        };
        let replica_id = match who {
            Who::Peer(id) => Some(id),
            _ => None,
        };
        Dialer {
            cluster_id: CLUSTER.into(),
            replica_id,
            tls: self.ca.as_ref().map(|ca| self.context(ca, &identity(who))),
            connect_timeout: PATIENCE,
            max_message_bytes: MESSAGE_MAX,
            hello: replica_id.is_some(),
        }
    }

    /// One call of `who` to node `index` (replica `index + 1`) on a new
    /// connection.
    async fn call(&self, index: usize, who: Who, request: Request) -> Response {
        let dialer = self.dialer(who);
        let expect = Some(index as ReplicaId + 1);
        let call = async {
            let mut connection = Connection::open(&self.addresses[index], expect, &dialer).await?;
            connection.call(&request).await
        };
        match tokio::time::timeout(PATIENCE, call).await {
            Ok(Ok(response)) => response,
            other => panic!("{who:?} to node {index}: {other:?}"),
        }
    }

    /// `writer` adds a file under the root through node `index`.
    async fn add(&self, index: usize, items: Vec<KeyValue>) -> u64 {
        let request = Request::Add {
            tree: tree(),
            parent: ROOT,
            items,
        };
        match self.call(index, Who::Client("writer"), request).await {
            Response::Added { node } => node,
            other => panic!("add refused: {other:?}"),
        }
    }

    /// Every replica's log of the probed tree (empty when it has none).
    fn logs(&self) -> Vec<Vec<Move>> {
        let log = |node: &Node| match node.service.forest().dump(&tree()) {
            Ok(dump) => dump.log,
            Err(Error::TreeNotFound) => Vec::new(),
            Err(error) => panic!("{error}"),
        };
        self.nodes.iter().map(log).collect()
    }

    /// Waits until every replica holds `ops` ops of the probed tree.
    async fn converged(&self, ops: usize) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while self.logs().iter().any(|log| log.len() != ops) {
            assert!(tokio::time::Instant::now() < deadline, "{:?}", self.logs());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn denied(response: &Response) -> bool {
    matches!(response, Response::Error(Error::PermissionDenied { .. }))
}

/// Replays one probe against a fresh cluster in each mode.
macro_rules! probe {
    ($name:ident, $body:ident, [$($mode:ident),+]) => {
        mod $name {
            $(
                #[allow(non_snake_case)]
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $mode() {
                    super::$body(super::Mode::$mode).await;
                }
            )+
        }
    };
}

probe!(max_counter_apply, max_counter_apply, [Plaintext, Tls]);
probe!(next_stamp_forgery, next_stamp_forgery, [Plaintext, Tls]);
probe!(
    apply_as_another_replica,
    apply_as_another_replica,
    [Plaintext, Tls]
);
probe!(drop_without_rights, drop_without_rights, [Plaintext, Tls]);
probe!(reads_without_rights, reads_without_rights, [Tls]);
probe!(
    op_log_without_rights,
    op_log_without_rights,
    [Plaintext, Tls]
);
probe!(idle_sockets, idle_sockets, [Plaintext, Tls]);
probe!(
    two_nodes_one_replica_id,
    two_nodes_one_replica_id,
    [Plaintext, Tls]
);
probe!(half_frame_flood, half_frame_flood, [Plaintext]);
probe!(large_subtree, large_subtree, [Plaintext, Tls]);
probe!(
    add_under_missing_parent_or_trash,
    add_under_missing_parent_or_trash,
    [Plaintext, Tls]
);

/// An op at the top of the counter space: a stranger is refused; a real
/// peer carrying it gets `CounterTooFar`; writes go on everywhere.
async fn max_counter_apply(mode: Mode) {
    let cluster = start(mode, [1, 2, 3]).await;
    cluster.add(0, file("before")).await;
    cluster.converged(1).await;
    let apply = Request::Apply {
        tree: tree(),
        ops: vec![root_op(COUNTER_MAX, 2, "poison")],
    };
    let answer = cluster.call(0, Who::Stranger, apply.clone()).await;
    assert!(denied(&answer), "{answer:?}");
    let answer = cluster.call(0, Who::Peer(2), apply).await;
    assert!(
        matches!(answer, Response::Error(Error::CounterTooFar { .. })),
        "{answer:?}"
    );
    for index in 0..3 {
        cluster.add(index, file(&format!("after-{index}"))).await;
    }
    cluster.converged(4).await;
}

/// An op under replica 2's next stamp sent to replica 1 by anyone but
/// replica 2 is refused; replica 2's real write then reaches everyone.
async fn next_stamp_forgery(mode: Mode) {
    let cluster = start(mode, [1, 2, 3]).await;
    let first = cluster.add(1, file("first")).await;
    cluster.converged(1).await;
    let next = root_op(arbor::types::timestamp_counter(first) + 1, 2, "forged");
    let apply = Request::Apply {
        tree: tree(),
        ops: vec![next],
    };
    for who in [Who::Stranger, Who::Client("owner"), Who::Peer(3)] {
        let answer = cluster.call(0, who, apply.clone()).await;
        assert!(denied(&answer), "{who:?}: {answer:?}");
    }
    cluster.add(1, file("real")).await;
    cluster.converged(2).await;
    for log in cluster.logs() {
        assert!(log.iter().all(|op| op.meta.items != file("forged")));
    }
}

/// Replica 1 sending replica 3 an op stamped by replica 2 is refused.
async fn apply_as_another_replica(mode: Mode) {
    let cluster = start(mode, [1, 2, 3]).await;
    let apply = Request::Apply {
        tree: tree(),
        ops: vec![root_op(5, 2, "not-mine")],
    };
    let answer = cluster.call(2, Who::Peer(1), apply).await;
    assert!(denied(&answer), "{answer:?}");
    assert!(cluster.nodes[2].service.stats().requests_refused >= 1);
    assert!(cluster.logs().iter().all(Vec::is_empty));
}

/// `Drop` from a caller that does not own the container changes nothing.
async fn drop_without_rights(mode: Mode) {
    let cluster = start(mode, [1, 2, 3]).await;
    cluster.add(0, file("kept")).await;
    cluster.converged(1).await;
    let request = Request::Drop {
        cid: cid(),
        tree: None,
    };
    for index in 0..3 {
        for who in [Who::Stranger, Who::Client("writer")] {
            let answer = cluster.call(index, who, request.clone()).await;
            assert!(denied(&answer), "{who:?}: {answer:?}");
        }
    }
    cluster.converged(1).await;
}

/// Every read from a certificate without rights is refused.
async fn reads_without_rights(mode: Mode) {
    let cluster = start(mode, [1, 2, 3]).await;
    cluster.add(0, file("secret")).await;
    let reads = [
        Request::GetSubTree {
            tree: tree(),
            root: ROOT,
            depth: 0,
        },
        Request::GetNodeByPath {
            tree: tree(),
            attr: ATTR_FILE_NAME.into(),
            path: vec!["secret".into()],
            attributes: Vec::new(),
            latest_only: false,
            all_attributes: true,
        },
        Request::TreeList { cid: cid() },
    ];
    for read in reads {
        let answer = cluster.call(0, Who::Stranger, read.clone()).await;
        assert!(denied(&answer), "{read:?}: {answer:?}");
        let allowed = cluster.call(0, Who::Client("reader"), read.clone()).await;
        assert!(!matches!(allowed, Response::Error(_)), "{allowed:?}");
    }
}

/// The op log (history, including removed data) is for replicas and the
/// owner only.
async fn op_log_without_rights(mode: Mode) {
    let cluster = start(mode, [1, 2, 3]).await;
    cluster.add(0, file("history")).await;
    let request = Request::GetOpLog {
        tree: tree(),
        from_height: 0,
        limit: 100,
    };
    for who in [Who::Stranger, Who::Client("writer"), Who::Client("reader")] {
        let answer = cluster.call(0, who, request.clone()).await;
        assert!(denied(&answer), "{who:?}: {answer:?}");
    }
    let answer = cluster.call(0, Who::Peer(2), request).await;
    assert!(matches!(answer, Response::OpLog { .. }), "{answer:?}");
}

/// More idle sockets than the connection limit: a real client is still
/// served within the idle timeout, and so are the peers' pushes.
async fn idle_sockets(mode: Mode) {
    let cluster = start(mode, [1, 2, 3]).await;
    let address = cluster.addresses[0].clone();
    let mut silent = Vec::new();
    for _ in 0..CONNECTIONS_MAX * 5 {
        silent.push(TcpStream::connect(&address).await.unwrap());
    }
    let started = tokio::time::Instant::now();
    cluster.add(0, file("served")).await;
    assert!(
        started.elapsed() <= IDLE_TIMEOUT * 2,
        "{:?}",
        started.elapsed()
    );
    cluster.add(1, file("pushed")).await;
    cluster.converged(2).await;
    let stats = cluster.nodes[0].server.stats();
    assert!(
        stats.connections_open <= CONNECTIONS_MAX as u64,
        "{stats:?}"
    );
    assert!(stats.idle_evicted + stats.idle_closed >= 1, "{stats:?}");
    drop(silent);
}

/// The node at replica 3's address is configured as replica 2: every
/// replica that dials it refuses it, and nothing it stores spreads.
async fn two_nodes_one_replica_id(mode: Mode) {
    let cluster = start(mode, [1, 2, 2]).await;
    for index in [0, 1] {
        let node = &cluster.nodes[index];
        let answer = node.transport.call(3, Request::Healthcheck, PATIENCE).await;
        assert!(
            matches!(answer, Err(Error::IdentityRefused(_))),
            "node {index}: {answer:?}"
        );
        assert!(node.service.stats().peers_refused >= 1);
    }
    cluster.add(0, file("real")).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while cluster.logs()[1].len() != 1 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Many connections each sending half of a largest frame: the bytes held
/// for unfinished frames stay within `limits.partial_frames_bytes_max`,
/// frames that find no room are refused at their frame timeout, and a
/// real client is served meanwhile (small frames never wait for room).
async fn half_frame_flood(mode: Mode) {
    let cluster = start(mode, [1, 2, 3]).await;
    let half = vec![0u8; MESSAGE_MAX / 2];
    let mut flood = Vec::new();
    for _ in 0..CONNECTIONS_MAX / 2 {
        let mut stream = TcpStream::connect(&cluster.addresses[0]).await.unwrap();
        let header = (MESSAGE_MAX as u32 - 16).to_be_bytes();
        stream.write_all(&header).await.unwrap();
        // A refused frame may close the socket, or leave it unread.
        let write = stream.write_all(&half);
        let _ = tokio::time::timeout(Duration::from_millis(200), write).await;
        flood.push(stream);
    }
    cluster.add(0, file("served")).await;
    // Frames that found no room wait for it until their frame timeout
    // (`tree.replication_timeout` here), then get `Overloaded`.
    let server = &cluster.nodes[0].server;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while server.stats().partial_frames_refused == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            server.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = server.stats();
    let bound = PARTIAL_FRAMES_MAX as u64;
    assert!(stats.partial_frame_bytes_peak <= bound, "{stats:?}");
    assert!(stats.partial_frame_bytes_peak >= bound / 2, "{stats:?}");
    cluster.add(0, file("still served")).await;
    drop(flood);
}

/// A subtree far over the message limit is refused after building at most
/// the limit plus one node.
async fn large_subtree(mode: Mode) {
    let cluster = start(mode, [1, 2, 3]).await;
    let blob_bytes = 32 << 10;
    let count = 80;
    for i in 0..count {
        let mut items = file(&format!("n{i}"));
        items.push(KeyValue::new("blob", vec![5u8; blob_bytes]));
        cluster.add(0, items).await;
    }
    let read = Request::GetSubTree {
        tree: tree(),
        root: ROOT,
        depth: 0,
    };
    let reader = match mode {
        Mode::Tls => Who::Client("reader"),
        Mode::Plaintext => Who::Stranger,
    };
    let answer = cluster.call(0, reader, read).await;
    let Response::Error(Error::TooLarge { size, limit, .. }) = answer else {
        panic!("{answer:?}");
    };
    assert!(limit < (count * blob_bytes) as u64);
    assert!(size <= limit + META_MAX as u64, "built {size} for {limit}");
}

/// `Add` under a node that does not exist, or under the trash, is refused
/// and stores nothing.
async fn add_under_missing_parent_or_trash(mode: Mode) {
    let cluster = start(mode, [1, 2, 3]).await;
    cluster.add(0, file("anchor")).await;
    for parent in [make_timestamp(999, 7), TRASH] {
        let request = Request::Add {
            tree: tree(),
            parent,
            items: file("orphan"),
        };
        let answer = cluster.call(0, Who::Client("writer"), request).await;
        assert!(
            matches!(answer, Response::Error(Error::ParentNotLive(p)) if p == parent),
            "{answer:?}"
        );
    }
    cluster.converged(1).await;
}
