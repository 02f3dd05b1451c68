//! The production network: length-prefixed frames over TCP.
//!
//! A frame is `[length: u32 big-endian][body]`, the body being
//! `proto::encode` output. The length is checked against the message limit
//! before anything is read, and a body is read as it arrives rather than
//! allocated from the claimed length, so a lying header costs nothing.
//! A malformed, truncated or oversized frame gets one error response (id 0)
//! and the connection is closed: after a bad frame the byte stream cannot be
//! trusted to be in step. Other connections are unaffected.

use crate::config::{Config, Limits};
use crate::error::{Error, Result};
use crate::identity::Caller;
use crate::net::Transport;
use crate::proto::{self, Request, Response};
use crate::runtime::BoxFuture;
use crate::service::Service;
use crate::types::ReplicaId;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Answers requests; the service in production, anything in tests.
pub trait Handler: Send + Sync + 'static {
    /// Answers `request` from `caller`, as the connection authenticated it.
    fn handle<'a>(&'a self, caller: &'a Caller, request: Request) -> BoxFuture<'a, Response>;
}

impl Handler for Service {
    fn handle<'a>(&'a self, caller: &'a Caller, request: Request) -> BoxFuture<'a, Response> {
        Box::pin(Service::handle(self, caller, request))
    }
}

/// Reads one frame. `Ok(None)` is a clean end of stream between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_bytes: usize,
) -> Result<Option<Vec<u8>>> {
    let mut header = [0u8; 4];
    let mut filled = 0;
    while filled < header.len() {
        let n = reader.read(&mut header[filled..]).await.map_err(io_error)?;
        if n == 0 {
            return match filled {
                0 => Ok(None),
                _ => Err(Error::Malformed("truncated frame header".into())),
            };
        }
        filled += n;
    }
    read_body(reader, u32::from_be_bytes(header), max_bytes)
        .await
        .map(Some)
}

async fn read_body<R: AsyncRead + Unpin>(
    reader: &mut R,
    length: u32,
    max_bytes: usize,
) -> Result<Vec<u8>> {
    let length = length as usize;
    if length > max_bytes {
        return Err(Error::TooLarge {
            what: "frame".into(),
            size: length as u64,
            limit: max_bytes as u64,
        });
    }
    // Grows with the bytes that actually arrive, never with the claim.
    let mut body = Vec::new();
    reader
        .take(length as u64)
        .read_to_end(&mut body)
        .await
        .map_err(io_error)?;
    if body.len() != length {
        return Err(Error::Malformed(format!(
            "truncated frame: {} of {length} bytes",
            body.len()
        )));
    }
    Ok(body)
}

/// Writes one frame.
pub async fn write_frame<W: AsyncWrite + Unpin>(writer: &mut W, body: &[u8]) -> Result<()> {
    let length = u32::try_from(body.len()).map_err(|_| Error::TooLarge {
        what: "frame".into(),
        size: body.len() as u64,
        limit: u32::MAX as u64,
    })?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&length.to_be_bytes());
    frame.extend_from_slice(body);
    writer.write_all(&frame).await.map_err(io_error)?;
    writer.flush().await.map_err(io_error)
}

fn io_error(e: std::io::Error) -> Error {
    Error::Network(e.to_string())
}

/// Bounds of the server side.
#[derive(Clone, Copy, Debug)]
pub struct ServerOptions {
    pub max_message_bytes: usize,
    pub max_connections: usize,
    /// Time a frame may take to arrive once its first byte did, and a
    /// response to be written.
    pub frame_timeout: Duration,
}

impl ServerOptions {
    pub fn from_config(config: &Config) -> Self {
        Self {
            max_message_bytes: config.limits.max_message_bytes,
            max_connections: config.limits.max_connections,
            frame_timeout: config.tree.replication_timeout,
        }
    }
}

/// Accepts connections until the listener fails for good; each connection
/// is served on its own task, at most `max_connections` at once.
pub async fn serve(listener: TcpListener, handler: Arc<dyn Handler>, options: ServerOptions) {
    let slots = Arc::new(Semaphore::new(options.max_connections));
    loop {
        let (stream, remote) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors and the like: back off instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refuse(&stream, options.max_connections);
            continue;
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(error) = serve_connection(stream, &*handler, options).await {
                tracing::debug!(%remote, %error, "connection closed");
            }
        });
    }
}

/// Tells a client over the connection limit why it is dropped, without ever
/// waiting on it.
fn refuse(stream: &TcpStream, limit: usize) {
    let error = Error::Overloaded(format!("connection limit {limit} reached"));
    let body = proto::encode(0, &Response::Error(error));
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    let _ = stream.try_write(&frame);
}

async fn serve_connection(
    stream: TcpStream,
    handler: &dyn Handler,
    options: ServerOptions,
) -> Result<()> {
    stream.set_nodelay(true).map_err(io_error)?;
    let (mut reader, mut writer) = stream.into_split();
    // Plain TCP authenticates nobody.
    let caller = Caller::Anonymous;
    loop {
        let request = match next_request(&mut reader, options).await {
            Ok(Some(request)) => request,
            Ok(None) => return Ok(()),
            Err(error) => {
                let body = proto::encode(0, &Response::Error(error.clone()));
                let _ =
                    tokio::time::timeout(options.frame_timeout, write_frame(&mut writer, &body))
                        .await;
                return Err(error);
            }
        };
        let response = handler.handle(&caller, request.body).await;
        let mut body = proto::encode(request.id, &response);
        if body.len() > options.max_message_bytes {
            let error = Error::TooLarge {
                what: "response".into(),
                size: body.len() as u64,
                limit: options.max_message_bytes as u64,
            };
            body = proto::encode(request.id, &Response::Error(error));
        }
        tokio::time::timeout(options.frame_timeout, write_frame(&mut writer, &body))
            .await
            .map_err(|_| Error::Timeout)??;
    }
}

/// Waits (without limit: idle connections are bounded by count) for the
/// next frame to start, then gives it `frame_timeout` to arrive whole.
async fn next_request<R: AsyncRead + Unpin>(
    reader: &mut R,
    options: ServerOptions,
) -> Result<Option<proto::Envelope<Request>>> {
    let mut first = [0u8; 1];
    if reader.read(&mut first).await.map_err(io_error)? == 0 {
        return Ok(None);
    }
    let rest = async {
        let mut header = [first[0], 0, 0, 0];
        reader
            .read_exact(&mut header[1..])
            .await
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => {
                    Error::Malformed("truncated frame header".into())
                }
                _ => io_error(e),
            })?;
        read_body(
            reader,
            u32::from_be_bytes(header),
            options.max_message_bytes,
        )
        .await
    };
    let body = tokio::time::timeout(options.frame_timeout, rest)
        .await
        .map_err(|_| Error::Timeout)??;
    proto::decode::<Request>(&body, options.max_message_bytes).map(Some)
}

/// One client connection: one request at a time, answers matched by id.
pub struct Connection {
    stream: TcpStream,
    next_id: u64,
    max_message_bytes: usize,
}

impl Connection {
    /// Connects within `connect_timeout`.
    pub async fn connect(
        address: &str,
        connect_timeout: Duration,
        max_message_bytes: usize,
    ) -> Result<Self> {
        let stream = tokio::time::timeout(connect_timeout, TcpStream::connect(address))
            .await
            .map_err(|_| Error::Network(format!("connect to {address} timed out")))?
            .map_err(|e| Error::Network(format!("connect to {address}: {e}")))?;
        stream.set_nodelay(true).map_err(io_error)?;
        Ok(Self {
            stream,
            next_id: 1,
            max_message_bytes,
        })
    }

    /// Sends one request and reads its response. After an error the
    /// connection must not be reused.
    pub async fn call(&mut self, request: &Request) -> Result<Response> {
        let id = self.next_id;
        self.next_id += 1;
        write_frame(&mut self.stream, &proto::encode(id, request)).await?;
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

/// `net::Transport` over TCP with a small pool of idle connections per peer.
///
/// A call that fails on a pooled connection (the peer may have restarted
/// since) is retried once on a fresh one. The service only sends
/// idempotent requests to peers (Apply, GetOpLog, TreeList), so a duplicate
/// is harmless.
pub struct TcpTransport {
    addresses: BTreeMap<ReplicaId, String>,
    /// Calls in flight per peer, so that this node alone never takes more
    /// than its share of a peer's `max_connections`.
    slots: BTreeMap<ReplicaId, Arc<Semaphore>>,
    pool: Arc<Mutex<BTreeMap<ReplicaId, Vec<Connection>>>>,
    /// Idle connections kept per peer for reuse (`tree.cache_size`, the
    /// modelled system's client connection cache); 0 disables reuse.
    idle_per_peer: usize,
    limits: Limits,
    calls: AtomicU64,
}

impl TcpTransport {
    pub fn new(config: &Config) -> Self {
        let addresses = config
            .node
            .peers
            .iter()
            .map(|p| (p.replica_id, p.address.clone()))
            .collect();
        let share = outbound_share(config);
        let slots = config
            .node
            .peers
            .iter()
            .map(|p| (p.replica_id, Arc::new(Semaphore::new(share))))
            .collect();
        Self {
            addresses,
            slots,
            pool: Arc::default(),
            idle_per_peer: config.tree.cache_size,
            limits: config.limits.clone(),
            calls: AtomicU64::new(0),
        }
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
        let pool = self.pool.clone();
        let idle_per_peer = self.idle_per_peer;
        let limits = self.limits.clone();
        let slots = self.slots[&peer].clone();
        Box::pin(async move {
            let call = async {
                let _slot = slots.acquire().await.map_err(|_| Error::ShuttingDown)?;
                let pool = Pool {
                    idle: &pool,
                    idle_per_peer,
                };
                call_pooled(pool, peer, &address, &request, &limits).await
            };
            tokio::time::timeout(timeout, call)
                .await
                .unwrap_or(Err(Error::Timeout))
        })
    }
}

/// Concurrent calls to one peer: half of a node's inbound connection limit,
/// split between the peers that may all call it at once; clients keep the
/// other half.
pub fn outbound_share(config: &Config) -> usize {
    let callers = config.node.peers.len().max(1);
    (config.limits.max_connections / 2 / callers).max(1)
}

/// The idle connections of a transport and their per-peer bound.
#[derive(Clone, Copy)]
struct Pool<'a> {
    idle: &'a Mutex<BTreeMap<ReplicaId, Vec<Connection>>>,
    idle_per_peer: usize,
}

async fn call_pooled(
    pool: Pool<'_>,
    peer: ReplicaId,
    address: &str,
    request: &Request,
    limits: &Limits,
) -> Result<Response> {
    let pooled = pool
        .idle
        .lock()
        .expect("pool lock")
        .get_mut(&peer)
        .and_then(Vec::pop);
    if let Some(mut connection) = pooled {
        if let Ok(response) = connection.call(request).await {
            give_back(pool, peer, connection);
            return Ok(response);
        }
    }
    let mut connection =
        Connection::connect(address, limits.connect_timeout, limits.max_message_bytes).await?;
    let response = connection.call(request).await?;
    give_back(pool, peer, connection);
    Ok(response)
}

fn give_back(pool: Pool<'_>, peer: ReplicaId, connection: Connection) {
    let mut idle = pool.idle.lock().expect("pool lock");
    let idle = idle.entry(peer).or_default();
    if idle.len() < pool.idle_per_peer {
        idle.push(connection);
    }
}

/// Binds `config.node.listen` and serves `service` on it; returns the bound
/// address (useful with port 0) and the server future.
pub async fn bind(
    config: &Config,
    service: Arc<Service>,
) -> std::io::Result<(std::net::SocketAddr, impl std::future::Future<Output = ()>)> {
    let listener = TcpListener::bind(&config.node.listen).await?;
    let address = listener.local_addr()?;
    let options = ServerOptions::from_config(config);
    Ok((address, serve(listener, service, options)))
}
