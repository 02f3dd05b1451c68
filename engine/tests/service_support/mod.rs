//! Shared test support: a clock on tokio's (pausable) time and an in-process
//! network of services whose nodes can be taken down and whose calls can be
//! dropped.
#![allow(dead_code)]

use arbor::net::Transport;
use arbor::proto::{self, Request, Response};
use arbor::runtime::{BoxFuture, Clock, Env};
use arbor::service::Service;
use arbor::system::TokioRuntime;
use arbor::types::make_timestamp;
use arbor::Caller;
use arbor::{Error, KeyValue, Meta, Move, ReplicaId, ATTR_FILE_NAME, ROOT};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Time from tokio's clock, so `start_paused` tests run in virtual time.
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl Clock for TokioClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}

pub fn test_env() -> Env {
    Env {
        clock: Arc::new(TokioClock {
            origin: tokio::time::Instant::now(),
        }),
        runtime: Arc::new(TokioRuntime::default()),
    }
}

#[derive(Default)]
struct Slot {
    service: Option<Arc<Service>>,
    down: bool,
    /// Calls to this node still to be lost (they time out).
    calls_to_drop: u32,
}

/// Routes requests between in-process services, through the wire encoding.
#[derive(Default)]
pub struct LocalNet {
    slots: Mutex<BTreeMap<ReplicaId, Slot>>,
    calls: Mutex<u64>,
    /// One-way links that lose every call: (from, to).
    cut: Mutex<std::collections::BTreeSet<(ReplicaId, ReplicaId)>>,
    /// Nodes whose sync reads (GetOpLog, GetOpLogStamps) are lost
    /// (everything else gets through).
    oplog_down: Mutex<std::collections::BTreeSet<ReplicaId>>,
    /// Ops sent in GetOpLog answers.
    oplog_entries: Mutex<u64>,
    /// Rewrites every answer to a sync read: a broken or lying peer.
    sync_answer_filter: Mutex<Option<SyncAnswerFilter>>,
    /// Told of every GetOpLog call as it is sent: the caller and the
    /// height it asks from.
    oplog_watch: Mutex<Option<OplogWatch>>,
}

/// See `LocalNet::watch_oplog_calls`.
pub type OplogWatch = Arc<dyn Fn(ReplicaId, u64) + Send + Sync>;

/// A rewrite of a sync read's answer (see `LocalNet::set_sync_answer_filter`).
pub type SyncAnswerFilter = fn(Response) -> Response;

impl LocalNet {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn transport(self: &Arc<Self>, from: ReplicaId) -> Arc<dyn Transport> {
        Arc::new(LocalTransport {
            net: self.clone(),
            from,
        })
    }

    /// Loses (or lets through) every GetOpLog and GetOpLogStamps call to `id`.
    pub fn set_oplog_down(&self, id: ReplicaId, down: bool) {
        let mut nodes = self.oplog_down.lock().unwrap();
        if down {
            nodes.insert(id);
        } else {
            nodes.remove(&id);
        }
    }

    /// Passes every answer to a GetOpLog or GetOpLogStamps call through
    /// `filter` (`None`: answers arrive as sent).
    pub fn set_sync_answer_filter(&self, filter: Option<SyncAnswerFilter>) {
        *self.sync_answer_filter.lock().unwrap() = filter;
    }

    /// Calls `watch` with the caller and the first height of every
    /// GetOpLog call, when the call is sent (`None`: no more).
    pub fn watch_oplog_calls(&self, watch: Option<OplogWatch>) {
        *self.oplog_watch.lock().unwrap() = watch;
    }

    /// Cuts (or heals) the one-way link `from -> to`.
    pub fn cut(&self, from: ReplicaId, to: ReplicaId, cut: bool) {
        let mut links = self.cut.lock().unwrap();
        if cut {
            links.insert((from, to));
        } else {
            links.remove(&(from, to));
        }
    }

    pub fn attach(&self, id: ReplicaId, service: Arc<Service>) {
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(id).or_default();
        slot.service = Some(service);
        slot.down = false;
    }

    /// Takes a node off the network (calls to it fail) and returns it.
    pub fn detach(&self, id: ReplicaId) -> Option<Arc<Service>> {
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(id).or_default();
        slot.down = true;
        slot.service.take()
    }

    pub fn set_down(&self, id: ReplicaId, down: bool) {
        self.slots.lock().unwrap().entry(id).or_default().down = down;
    }

    pub fn drop_calls_to(&self, id: ReplicaId, count: u32) {
        self.slots
            .lock()
            .unwrap()
            .entry(id)
            .or_default()
            .calls_to_drop = count;
    }

    pub fn calls(&self) -> u64 {
        *self.calls.lock().unwrap()
    }

    /// Ops sent in GetOpLog answers so far.
    pub fn oplog_entries(&self) -> u64 {
        *self.oplog_entries.lock().unwrap()
    }

    fn route(&self, from: ReplicaId, peer: ReplicaId) -> Result<Arc<Service>, Error> {
        *self.calls.lock().unwrap() += 1;
        if self.cut.lock().unwrap().contains(&(from, peer)) {
            return Err(Error::Timeout);
        }
        let mut slots = self.slots.lock().unwrap();
        let slot = slots
            .get_mut(&peer)
            .ok_or_else(|| Error::Network(format!("no node {peer}")))?;
        if slot.down {
            return Err(Error::Network(format!("node {peer} is down")));
        }
        if slot.calls_to_drop > 0 {
            slot.calls_to_drop -= 1;
            return Err(Error::Timeout);
        }
        slot.service
            .clone()
            .ok_or_else(|| Error::Network(format!("node {peer} has no service")))
    }
}

struct LocalTransport {
    net: Arc<LocalNet>,
    from: ReplicaId,
}

const WIRE_MAX: usize = 64 << 20;

impl Transport for LocalTransport {
    fn call(
        &self,
        peer: ReplicaId,
        request: Request,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Response, Error>> {
        let sync_read = matches!(
            request,
            Request::GetOpLog { .. } | Request::GetOpLogStamps { .. }
        );
        let oplog_lost = sync_read && self.net.oplog_down.lock().unwrap().contains(&peer);
        let filter = match sync_read {
            true => *self.net.sync_answer_filter.lock().unwrap(),
            false => None,
        };
        if let Request::GetOpLog { from_height, .. } = &request {
            let watch = self.net.oplog_watch.lock().unwrap().clone();
            if let Some(watch) = watch {
                watch(self.from, *from_height);
            }
        }
        let routed = match oplog_lost {
            true => Err(Error::Timeout),
            false => self.net.route(self.from, peer),
        };
        let net = self.net.clone();
        // The calling node, as an authenticating transport names it.
        let caller = Caller::Peer(self.from);
        Box::pin(async move {
            let service = routed?;
            // Through the wire format, as TCP would.
            let request = proto::decode::<Request>(&proto::encode(7, &request), WIRE_MAX)?.body;
            let response = tokio::time::timeout(timeout, service.handle(&caller, request))
                .await
                .map_err(|_| Error::Timeout)?;
            let response = match filter {
                Some(filter) => filter(response),
                None => response,
            };
            if let Response::OpLog { entries, .. } = &response {
                *net.oplog_entries.lock().unwrap() += entries.len() as u64;
            }
            Ok(proto::decode::<Response>(&proto::encode(7, &response), WIRE_MAX)?.body)
        })
    }
}

/// Polls `done` on virtual time until it holds, at most `deadline`.
pub async fn eventually(what: &str, deadline: Duration, mut done: impl FnMut() -> bool) {
    let start = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(10);
    while !done() {
        assert!(
            start.elapsed() < deadline,
            "not reached within {deadline:?}: {what}"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

// ----------------------------------------------------------------------------
// Clusters of in-process services.

use arbor::config::{Config, PeerConfig};
use arbor::forest::{Forest, TreeDump};
use arbor::{ContainerId, TreeKey};

/// Configs for replicas `1..=count`, every one a peer of the others, sync
/// off, generous timeouts (virtual time makes them free).
pub fn cluster_configs(count: u16) -> Vec<Config> {
    (1..=count)
        .map(|id| {
            let mut config = Config::default_for_test(id);
            config.node.peers = (1..=count)
                .filter(|p| *p != id)
                .map(|p| PeerConfig::new(p, format!("local:{p}")))
                .collect();
            config.tree.replication_timeout = Duration::from_secs(60);
            config
        })
        .collect()
}

/// Lists container `cid`, held by `replicas`, in every config (so that
/// sync looks for its trees on peers).
pub fn list_container(configs: &mut [Config], cid: ContainerId, replicas: Vec<u16>) {
    for config in configs {
        (config.node.containers).push(arbor::config::ContainerConfig::new(cid, replicas.clone()));
    }
}

pub fn start_node(net: &Arc<LocalNet>, config: Config, forest: Forest) -> Arc<Service> {
    let id = config.node.replica_id;
    let service = Service::start(config, Arc::new(forest), test_env(), net.transport(id)).unwrap();
    net.attach(id, service.clone());
    service
}

/// Starts one node per config, each on an in-memory forest.
pub fn start_cluster(net: &Arc<LocalNet>, configs: Vec<Config>) -> Vec<Arc<Service>> {
    configs
        .into_iter()
        .map(|c| {
            let forest = memory_forest(&c);
            start_node(net, c, forest)
        })
        .collect()
}

pub fn memory_forest(config: &Config) -> Forest {
    Forest::in_memory(config.forest_options()).unwrap()
}

pub fn cid() -> ContainerId {
    ContainerId([0xab; 32])
}

pub fn tree(name: &str) -> TreeKey {
    TreeKey::new(cid(), name)
}

/// A write that adds a node named `name` under the root of tree "t".
pub fn add_to_root(name: &str) -> arbor::forest::WriteRequest {
    arbor::forest::WriteRequest {
        tree: tree("t"),
        op: arbor::forest::WriteOp::Move {
            parent: arbor::ROOT,
            child: None,
            items: vec![arbor::KeyValue::new("FileName", name.as_bytes())],
        },
    }
}

pub fn dump(service: &Service, tree: &TreeKey) -> Option<TreeDump> {
    service.forest().dump(tree).ok()
}

/// Stops a node and waits (virtual time) until nothing holds its forest,
/// so the file can be opened again.
pub async fn stop_node(net: &LocalNet, service: Arc<Service>) {
    let id = service.config().node.replica_id;
    net.detach(id);
    service.shutdown();
    let forest = Arc::downgrade(service.forest());
    drop(service);
    let start = tokio::time::Instant::now();
    while forest.strong_count() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "node {id} never let go of its forest"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ----------------------------------------------------------------------------
// A storage backend whose writes fail on demand.

use redb::backends::InMemoryBackend;
use redb::StorageBackend;
use std::io::Error as BackendIoError;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug)]
pub struct FlakyBackend {
    inner: InMemoryBackend,
    pub failing: Arc<AtomicBool>,
}

impl FlakyBackend {
    pub fn new() -> (Self, Arc<AtomicBool>) {
        let failing = Arc::new(AtomicBool::new(false));
        let backend = Self {
            inner: InMemoryBackend::new(),
            failing: failing.clone(),
        };
        (backend, failing)
    }

    fn check(&self) -> Result<(), BackendIoError> {
        if self.failing.load(Ordering::SeqCst) {
            Err(BackendIoError::other("injected write failure"))
        } else {
            Ok(())
        }
    }
}

impl StorageBackend for FlakyBackend {
    fn len(&self) -> Result<u64, BackendIoError> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendIoError> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), BackendIoError> {
        self.check()?;
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> Result<(), BackendIoError> {
        self.check()?;
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendIoError> {
        self.check()?;
        self.inner.write(offset, data)
    }
}

/// The meta of a file named `name`, as clients write it.
pub fn file(name: &str) -> Vec<KeyValue> {
    vec![KeyValue::new(ATTR_FILE_NAME, name.as_bytes())]
}

/// A replicated op placing file `name` under the root, stamped
/// (`counter`, `replica`): what a forger sends in an `Apply`.
pub fn root_op(counter: u64, replica: ReplicaId, name: &str) -> Move {
    let ts = make_timestamp(counter, replica);
    Move {
        parent: ROOT,
        child: ts,
        meta: Meta {
            time: ts,
            items: file(name),
        },
    }
}
