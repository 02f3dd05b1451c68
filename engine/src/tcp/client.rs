//! The dialling side: one connection per call in flight, pooled per peer.
//! Every connection a node or the gateway opens first checks who answered
//! (docs/design.md §9): over TLS the server's certificate must name the
//! replica dialled, of this cluster; then `Hello` says who the dialler is,
//! and the answer must name that same replica and cluster. A connection
//! that fails either check is never used.

use super::{buffered, encode_frame, read_frame, write_frame, Stream};
use crate::config::{Config, DEFAULT_CLUSTER_ID};
use crate::error::{Error, Result};
use crate::identity::{self, Dialler};
use crate::net::{Net, Transport};
use crate::proto::{self, Request, Response};
use crate::runtime::{with_timeout, BoxFuture, Clock};
use crate::system::{SystemClock, TokioNet};
use crate::tls::{server_name, CertIdentity, TlsContext};
use crate::types::ReplicaId;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

/// How a process dials nodes and who it says it is.
#[derive(Clone, Debug)]
pub struct Dialer {
    pub cluster_id: String,
    /// This node's replica id; `None` for a client.
    pub replica_id: Option<ReplicaId>,
    pub tls: Option<Arc<TlsContext>>,
    pub connect_timeout: Duration,
    pub max_message_bytes: usize,
    /// Open every connection with `Hello` (nodes and the gateway do).
    pub hello: bool,
}

impl Dialer {
    /// Plain TCP, no `Hello`: an anonymous client.
    pub fn plaintext(connect_timeout: Duration, max_message_bytes: usize) -> Self {
        Self {
            cluster_id: DEFAULT_CLUSTER_ID.into(),
            replica_id: None,
            tls: None,
            connect_timeout,
            max_message_bytes,
            hello: false,
        }
    }

    /// A node dialling its peers, as `config` says it is.
    pub fn for_node(config: &Config, tls: Option<Arc<TlsContext>>) -> Self {
        Self {
            cluster_id: config.node.cluster_id.clone(),
            replica_id: Some(config.node.replica_id),
            tls,
            connect_timeout: config.limits.connect_timeout,
            max_message_bytes: config.limits.max_message_bytes,
            hello: true,
        }
    }

    /// A client of the cluster its certificate names (or of
    /// `config`'s cluster without TLS), with `Hello`.
    pub fn for_client(config: &Config, tls: Option<Arc<TlsContext>>) -> Self {
        let cluster_id = match &tls {
            Some(tls) => tls.identity().cluster_id().to_string(),
            None => config.node.cluster_id.clone(),
        };
        Self {
            cluster_id,
            replica_id: None,
            tls,
            connect_timeout: config.limits.connect_timeout,
            max_message_bytes: config.limits.max_message_bytes,
            hello: true,
        }
    }
}

/// One client connection: one request at a time, answers matched by id.
pub struct Connection {
    stream: tokio::io::BufReader<Box<dyn Stream>>,
    next_id: u64,
    max_message_bytes: usize,
}

impl Connection {
    /// Connects within `connect_timeout`, plain TCP, no `Hello`.
    pub async fn connect(
        address: &str,
        connect_timeout: Duration,
        max_message_bytes: usize,
    ) -> Result<Self> {
        let dialer = Dialer::plaintext(connect_timeout, max_message_bytes);
        Self::open(address, None, &dialer).await
    }

    /// Connects to `address` over tokio TCP as `dialer` says, expecting
    /// replica `expect` (any replica of the cluster when `None`) to answer.
    pub async fn open(address: &str, expect: Option<ReplicaId>, dialer: &Dialer) -> Result<Self> {
        Self::open_via(&TokioNet, &SystemClock::new(), address, expect, dialer).await
    }

    /// `open` over `net`, its timeouts on `clock`.
    pub async fn open_via(
        net: &dyn Net,
        clock: &dyn Clock,
        address: &str,
        expect: Option<ReplicaId>,
        dialer: &Dialer,
    ) -> Result<Self> {
        let timeout = dialer.connect_timeout;
        let stream = with_timeout(clock, timeout, net.connect(address.to_string()))
            .await
            .ok_or_else(|| Error::Network(format!("connect to {address} timed out")))?
            .map_err(|e| Error::Network(format!("connect to {address}: {e}")))?;
        let stream: Box<dyn Stream> = match &dialer.tls {
            None => stream,
            Some(tls) => {
                let handshake = tls.connector().connect(server_name(), stream);
                let stream = with_timeout(clock, timeout, handshake)
                    .await
                    .ok_or_else(|| {
                        Error::Network(format!("TLS handshake with {address} timed out"))
                    })?
                    .map_err(|e| Error::Network(format!("TLS handshake with {address}: {e}")))?;
                let certs = stream.get_ref().1.peer_certificates().unwrap_or_default();
                let named = certs
                    .first()
                    .ok_or_else(|| Error::IdentityRefused(format!("{address} sent no certificate")))
                    .and_then(|cert| CertIdentity::from_certificate(cert))?;
                check_answerer(address, dialer, expect, &named)?;
                Box::new(stream)
            }
        };
        let mut connection = Self {
            stream: buffered(stream),
            next_id: 1,
            max_message_bytes: dialer.max_message_bytes,
        };
        if dialer.hello {
            connection.hello(clock, address, expect, dialer).await?;
        }
        Ok(connection)
    }

    /// Says who this end is and checks who the other end says it is.
    async fn hello(
        &mut self,
        clock: &dyn Clock,
        address: &str,
        expect: Option<ReplicaId>,
        dialer: &Dialer,
    ) -> Result<()> {
        let request = Request::Hello {
            cluster_id: dialer.cluster_id.clone(),
            replica_id: dialer.replica_id,
        };
        let call = with_timeout(clock, dialer.connect_timeout, self.call(&request));
        let answer = call.await.ok_or(Error::Timeout)??;
        match answer {
            Response::Hello {
                cluster_id,
                replica_id,
            } => {
                let named = CertIdentity::Replica {
                    cluster_id,
                    replica_id,
                };
                check_answerer(address, dialer, expect, &named)
            }
            Response::Error(error) => Err(error),
            other => Err(Error::Malformed(format!(
                "{address} answered Hello with {other:?}"
            ))),
        }
    }

    /// False once the other end has closed or broken the connection, or
    /// sent bytes nobody asked for; true while a read would wait. Looks
    /// without waiting, so that a pooled connection the peer already gave
    /// up (an idle one it closed to free its slot, one it reset) carries
    /// no request, whose fate its caller could then not know.
    pub fn is_open(&mut self) -> bool {
        use futures::FutureExt;
        use tokio::io::AsyncBufReadExt;
        self.stream.fill_buf().now_or_never().is_none()
    }

    /// Sends one request and reads its response. After an error the
    /// connection must not be reused.
    pub async fn call(&mut self, request: &Request) -> Result<Response> {
        let id = self.next_id;
        self.next_id += 1;
        write_frame(&mut self.stream, &encode_frame(id, request)?).await?;
        let body = read_frame(&mut self.stream, self.max_message_bytes)
            .await?
            .ok_or_else(|| Error::Network("connection closed by peer".into()))?;
        let envelope = proto::decode::<Response>(&body, self.max_message_bytes)?;
        if envelope.id != id {
            // Id 0 is the server's answer to a frame it could not read.
            if let Response::Error(error) = envelope.body {
                return Err(error);
            }
            return Err(Error::Malformed(format!(
                "response id {} for request {id}",
                envelope.id
            )));
        }
        Ok(envelope.body)
    }
}

/// Refuses the answering end `named` by the one rule of
/// `identity::check_answerer`, as an `IdentityRefused` naming `address`.
fn check_answerer(
    address: &str,
    dialer: &Dialer,
    expect: Option<ReplicaId>,
    named: &CertIdentity,
) -> Result<()> {
    let dialler = Dialler {
        cluster_id: &dialer.cluster_id,
        own: dialer.replica_id,
        expect,
    };
    identity::check_answerer(&dialler, named)
        .map_err(|why| Error::IdentityRefused(format!("{address}: {why}")))
}

/// A pooled connection and when it was last used.
struct Idle {
    connection: Connection,
    /// The transport clock's reading when it went idle.
    since: Duration,
}

/// `net::Transport` over TCP with a small pool of idle connections per peer.
///
/// A pooled connection the peer has closed or reset is dropped unused. An
/// idempotent call (`Request::is_idempotent`: reads, `Apply`) that fails
/// on a pooled connection (the peer may have gone since it was checked)
/// is retried once on a fresh one. Any other call's error is given to the
/// caller as it is: the request may have reached the peer before the
/// connection broke, so the outcome is unknown, and sending it again could
/// store it twice or answer for a process that never saw it.
pub struct TcpTransport {
    addresses: BTreeMap<ReplicaId, String>,
    /// Calls in flight per peer, so that this node alone never takes more
    /// than its share of a peer's `max_connections`.
    slots: BTreeMap<ReplicaId, Arc<Semaphore>>,
    pool: Arc<Mutex<BTreeMap<ReplicaId, Vec<Idle>>>>,
    /// Idle connections kept per peer for reuse (`tree.cache_size`, the
    /// modelled system's client connection cache); 0 disables reuse.
    idle_per_peer: usize,
    /// A pooled connection idle this long is not reused: the peer closes
    /// connections idle for `limits.idle_connection_timeout`.
    reuse_within: Duration,
    dialer: Arc<Dialer>,
    /// How connections are opened and the clock of every timeout.
    net: Arc<dyn Net>,
    clock: Arc<dyn Clock>,
    calls: AtomicU64,
    /// Connections dialled (a call that found no idle one opens one).
    opened: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
}

impl TcpTransport {
    /// A node's transport to its peers, as `config` says it is.
    pub fn new(config: &Config, tls: Option<Arc<TlsContext>>) -> Self {
        Self::with_dialer(config, Dialer::for_node(config, tls))
    }

    /// A transport to the peers of `config` that dials as `dialer` says
    /// (the gateway: a client).
    pub fn with_dialer(config: &Config, dialer: Dialer) -> Self {
        let addresses = config
            .node
            .peers
            .iter()
            .map(|p| (p.replica_id, p.address.clone()))
            .collect();
        let share = match dialer.replica_id {
            Some(_) => outbound_share(config),
            None => client_share(config),
        };
        Self {
            addresses,
            slots: BTreeMap::new(),
            pool: Arc::default(),
            idle_per_peer: config.tree.cache_size,
            reuse_within: config.limits.idle_connection_timeout / 2,
            dialer: Arc::new(dialer),
            net: Arc::new(TokioNet),
            clock: Arc::new(SystemClock::new()),
            calls: AtomicU64::new(0),
            opened: Arc::default(),
            refused: Arc::default(),
        }
        .with_calls_per_peer(share)
    }

    /// At most `calls` calls in flight to each peer.
    pub fn with_calls_per_peer(mut self, calls: usize) -> Self {
        assert!(calls >= 1, "a transport needs a call per peer");
        self.slots = self
            .addresses
            .keys()
            .map(|&peer| (peer, Arc::new(Semaphore::new(calls))))
            .collect();
        self
    }

    /// Dials over `net` with every timeout and idle age on `clock` (the
    /// simulator's); tokio TCP and the system clock otherwise.
    pub fn with_net(mut self, net: Arc<dyn Net>, clock: Arc<dyn Clock>) -> Self {
        self.net = net;
        self.clock = clock;
        self
    }

    /// At most `idle` idle connections kept per peer (0: none reused).
    pub fn with_idle_per_peer(mut self, idle: usize) -> Self {
        self.idle_per_peer = idle;
        self
    }

    /// Connections dialled so far: beside `calls`, how often a call found
    /// no idle connection to reuse.
    pub fn connections_opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// Calls made so far (for diagnostics).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Idle pooled connections to `peer` right now.
    pub fn idle_connections(&self, peer: ReplicaId) -> usize {
        let pool = self.pool.lock().expect("pool lock");
        pool.get(&peer).map_or(0, Vec::len)
    }
}

impl Transport for TcpTransport {
    fn call(
        &self,
        peer: ReplicaId,
        request: Request,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Response>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let Some(address) = self.addresses.get(&peer).cloned() else {
            return Box::pin(async move { Err(Error::Network(format!("unknown peer {peer}"))) });
        };
        let pool = Pool {
            idle: self.pool.clone(),
            idle_per_peer: self.idle_per_peer,
            reuse_within: self.reuse_within,
            clock: self.clock.clone(),
            net: self.net.clone(),
            dialer: self.dialer.clone(),
        };
        let refused = self.refused.clone();
        let opened = self.opened.clone();
        let slots = self.slots[&peer].clone();
        Box::pin(async move {
            let call = async {
                let _slot = slots.acquire().await.map_err(|_| Error::ShuttingDown)?;
                let result = call_pooled(&pool, peer, &address, &request, &opened).await;
                if let Err(error @ Error::IdentityRefused(_)) = &result {
                    refused.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(peer, %address, %error, "peer connection refused");
                }
                result
            };
            let clock = pool.clock.clone();
            with_timeout(&*clock, timeout, call)
                .await
                .unwrap_or(Err(Error::Timeout))
        })
    }

    fn identities_refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// Concurrent calls of a node to one peer: half of a node's inbound
/// connection limit, split between the peers that may all call it at
/// once; clients keep the other half.
pub fn outbound_share(config: &Config) -> usize {
    let callers = config.node.peers.len().max(1);
    (config.limits.max_connections / 2 / callers).max(1)
}

/// Concurrent calls of a client (a gateway) to each node it knows: the
/// clients' half of a node's inbound connection limit. Each node counts
/// only its own connections, so a client that reaches several nodes is
/// not divided between them; several clients share a node's half, and a
/// node beyond its limit evicts idle connections or refuses new ones.
/// Below this share a busy gateway runs out of calls before the nodes run
/// out of work: a call holds its connection until answered, so a node
/// answering in 8 ms serves at most `calls / 8 ms` of the gateway's
/// writes (42 calls: 5,250/s per node, and a backlog that grows
/// without bound above it).
pub fn client_share(config: &Config) -> usize {
    (config.limits.max_connections / 2).max(1)
}

/// The idle connections of a transport, their bounds, and how a new one
/// is opened.
struct Pool {
    idle: Arc<Mutex<BTreeMap<ReplicaId, Vec<Idle>>>>,
    idle_per_peer: usize,
    reuse_within: Duration,
    clock: Arc<dyn Clock>,
    net: Arc<dyn Net>,
    dialer: Arc<Dialer>,
}

impl Pool {
    /// The most recently used connection to `peer` still fresh enough and
    /// still open (`Connection::is_open`); the closed ones go.
    fn take(&self, peer: ReplicaId) -> Option<Connection> {
        let mut idle = self.idle.lock().expect("pool lock");
        let idle = idle.get_mut(&peer)?;
        let now = self.clock.now();
        idle.retain(|entry| now.saturating_sub(entry.since) < self.reuse_within);
        while let Some(mut entry) = idle.pop() {
            if entry.connection.is_open() {
                return Some(entry.connection);
            }
        }
        None
    }

    fn give_back(&self, peer: ReplicaId, connection: Connection) {
        let mut idle = self.idle.lock().expect("pool lock");
        let idle = idle.entry(peer).or_default();
        if idle.len() < self.idle_per_peer {
            idle.push(Idle {
                connection,
                since: self.clock.now(),
            });
        }
    }
}

/// The planted bug `RetriesAnyCall` (always false in a build without it).
fn retries_any_call() -> bool {
    crate::canary::active(crate::canary::Canary::RetriesAnyCall)
}

async fn call_pooled(
    pool: &Pool,
    peer: ReplicaId,
    address: &str,
    request: &Request,
    opened: &AtomicU64,
) -> Result<Response> {
    if let Some(mut connection) = pool.take(peer) {
        match connection.call(request).await {
            Ok(response) => {
                pool.give_back(peer, connection);
                return Ok(response);
            }
            Err(error) if !request.is_idempotent() && !retries_any_call() => return Err(error),
            Err(_) => {}
        }
    }
    opened.fetch_add(1, Ordering::Relaxed);
    let (net, clock, dialer) = (&*pool.net, &*pool.clock, &*pool.dialer);
    let mut connection = Connection::open_via(net, clock, address, Some(peer), dialer).await?;
    let response = connection.call(request).await?;
    pool.give_back(peer, connection);
    Ok(response)
}
