//! The gRPC listener: plaintext on loopback only (unless
//! `node.insecure_plaintext`), TLS 1.3 otherwise, at most
//! `grpc.max_connections` connections (a connection beyond waits in the
//! listen backlog), `grpc.max_concurrent_streams` calls per connection
//! (and as many calls cancelled before the server took them),
//! messages up to `limits.max_message_bytes`.

use super::front::Front;
use super::pb::tree_service_server::TreeServiceServer;
use crate::config::Config;
use crate::error::{Error, Result};
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

/// Binds `grpc.listen`; `None` when the node has no gRPC front. A
/// plaintext front must be on loopback unless `node.insecure_plaintext`.
pub async fn listen(config: &Config, tls: bool) -> Result<Option<TcpListener>> {
    let Some(listen) = &config.grpc.listen else {
        return Ok(None);
    };
    let bad = |why: String| Error::Config(format!("grpc.listen: {listen}: {why}"));
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host(listen.as_str())
        .await
        .map_err(|e| bad(e.to_string()))?
        .collect();
    if !tls && !config.node.insecure_plaintext {
        if let Some(open) = addresses.iter().find(|a| !a.ip().is_loopback()) {
            return Err(bad(format!(
                "{open} is not a loopback address; set node.tls or grpc.tls, or \
                 node.insecure_plaintext: true to serve plaintext gRPC on it"
            )));
        }
    }
    let listener = TcpListener::bind(addresses.as_slice())
        .await
        .map_err(|e| bad(e.to_string()))?;
    Ok(Some(listener))
}

/// The TLS acceptor of the gRPC port: `grpc.tls`, else the node's own
/// certificate and key (`node.tls`); `None`: plaintext.
pub fn tls_for(config: &Config) -> Result<Option<TlsAcceptor>> {
    let (cert, key, section) = match (&config.grpc.tls, &config.node.tls) {
        (Some(files), _) => (&files.cert, &files.key, "grpc.tls"),
        (None, Some(files)) => (&files.cert, &files.key, "node.tls"),
        (None, None) => return Ok(None),
    };
    let read = |part: &str, path: &std::path::Path| {
        let key = format!("{section}.{part}");
        crate::files::read_regular(&key, path, crate::files::TLS_FILE_BYTES_MAX)
    };
    let (cert_pem, key_pem) = (read("cert", cert)?, read("key", key)?);
    crate::tls::grpc_acceptor(&cert_pem, &key_pem)
        .map(Some)
        .map_err(|error| Error::Config(format!("{section}.{error}")))
}

/// Refused handshakes logged by the gRPC ports of the process.
static REFUSALS: crate::metrics::WarnLimit =
    crate::metrics::WarnLimit::new(crate::metrics::REFUSALS_LOGGED_PER_MINUTE);

/// What the gRPC server has done.
#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    handshakes_failed: AtomicU64,
}

/// A running gRPC server.
pub struct GrpcServer {
    pub local_addr: SocketAddr,
    handle: GrpcHandle,
    done: tokio::task::JoinHandle<()>,
}

/// Stops a running gRPC server and tells what it did.
#[derive(Clone)]
pub struct GrpcHandle {
    stop: watch::Sender<bool>,
    counters: Arc<Counters>,
}

impl GrpcHandle {
    /// Stops taking connections; calls in flight are answered.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.counters.accepted.load(Ordering::Relaxed)
    }

    /// TLS handshakes that failed or timed out.
    pub fn handshakes_failed(&self) -> u64 {
        self.counters.handshakes_failed.load(Ordering::Relaxed)
    }
}

impl GrpcServer {
    pub fn handle(&self) -> GrpcHandle {
        self.handle.clone()
    }

    /// Stops taking connections and waits until every call in flight is
    /// answered and its connection closed.
    pub async fn shutdown(self) {
        self.handle.stop();
        let _ = self.done.await;
    }
}

/// Serves `front` on `listener` until stopped.
pub fn serve(
    config: &Config,
    listener: TcpListener,
    front: Front,
    tls: Option<TlsAcceptor>,
) -> io::Result<GrpcServer> {
    let local_addr = listener.local_addr()?;
    let (stop, _) = watch::channel(false);
    let counters = Arc::new(Counters::default());
    let handle = GrpcHandle {
        stop: stop.clone(),
        counters: counters.clone(),
    };
    let (sender, connections) = mpsc::channel(16);
    let accept = Accept {
        listener,
        tls,
        slots: Arc::new(Semaphore::new(config.grpc.max_connections)),
        handshake_timeout: config.limits.handshake_timeout,
        counters,
        sender,
        stop: stop.subscribe(),
    };
    tokio::spawn(accept.run());
    let max = config.limits.max_message_bytes;
    let service = TreeServiceServer::new(front)
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    let streams = config.grpc.max_concurrent_streams;
    let mut http2 = http2::Builder::new(TokioExecutor::new());
    http2
        .timer(TokioTimer::new())
        .max_concurrent_streams(streams)
        // A call its client cancels before the server has taken it off the
        // connection (a deadline that passes under load) counts against
        // h2's guard on rapid resets, 20 by default, past which h2 closes
        // the connection and fails every call on it. The bound is the
        // calls a connection may have in flight instead.
        .max_pending_accept_reset_streams(streams as usize)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20))
        // gRPC has no use for a `date` header on every answer.
        .auto_date_header(false);
    let done = tokio::spawn(serve_connections(
        connections,
        http2,
        service,
        stop.subscribe(),
    ));
    Ok(GrpcServer {
        local_addr,
        handle,
        done,
    })
}

/// Serves each connection `connections` yields on its own task, until
/// stopped; then asks every connection to finish (the calls in flight are
/// answered, no new call is taken) and waits until all have closed.
///
/// Each connection is served by hyper's HTTP/2 directly, with tonic's
/// generated service as the only layer: no router in between (the server
/// has one service), and a call whose client gives up is dropped when
/// the client resets its stream.
async fn serve_connections(
    mut connections: mpsc::Receiver<Connection>,
    http2: http2::Builder<TokioExecutor>,
    service: TreeServiceServer<Front>,
    mut stop: watch::Receiver<bool>,
) {
    let mut open = tokio::task::JoinSet::new();
    loop {
        let connection = tokio::select! {
            biased;
            _ = stop.wait_for(|stop| *stop) => break,
            connection = connections.recv() => match connection {
                Some(connection) => connection,
                None => break,
            },
            // Reaps the tasks of closed connections as they end.
            Some(_) = open.join_next(), if !open.is_empty() => continue,
        };
        let serving = http2.serve_connection(
            TokioIo::new(connection),
            TowerToHyperService::new(service.clone()),
        );
        let mut stop = stop.clone();
        open.spawn(async move {
            let mut serving = std::pin::pin!(serving);
            let served = tokio::select! {
                served = serving.as_mut() => served,
                // (The guard `wait_for` returns is dropped at once.)
                _ = async { drop(stop.wait_for(|stop| *stop).await) } => {
                    serving.as_mut().graceful_shutdown();
                    serving.await
                }
            };
            if let Err(error) = served {
                tracing::debug!(%error, "gRPC connection ended");
            }
        });
    }
    drop(connections);
    while open.join_next().await.is_some() {}
}

/// The accept loop: takes a slot, then a connection, then (with TLS) its
/// handshake, and hands the connection to the server.
struct Accept {
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    slots: Arc<Semaphore>,
    handshake_timeout: Duration,
    counters: Arc<Counters>,
    sender: mpsc::Sender<Connection>,
    stop: watch::Receiver<bool>,
}

impl Accept {
    async fn run(mut self) {
        loop {
            let slot = tokio::select! {
                biased;
                _ = self.stop.wait_for(|stop| *stop) => return,
                slot = self.slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            };
            let accepted = tokio::select! {
                biased;
                _ = self.stop.wait_for(|stop| *stop) => return,
                accepted = self.listener.accept() => accepted,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of descriptors and the like: back off, do not spin.
                    tracing::warn!(%error, "gRPC accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            self.counters.accepted.fetch_add(1, Ordering::Relaxed);
            let _ = stream.set_nodelay(true);
            match &self.tls {
                None => {
                    let connection = Connection::new(Box::new(stream), slot);
                    if self.sender.send(connection).await.is_err() {
                        return;
                    }
                }
                Some(acceptor) => {
                    let handshake = Handshake {
                        acceptor: acceptor.clone(),
                        timeout: self.handshake_timeout,
                        counters: self.counters.clone(),
                        sender: self.sender.clone(),
                    };
                    tokio::spawn(handshake.run(stream, slot));
                }
            }
        }
    }
}

struct Handshake {
    acceptor: TlsAcceptor,
    timeout: Duration,
    counters: Arc<Counters>,
    sender: mpsc::Sender<Connection>,
}

impl Handshake {
    async fn run(self, stream: TcpStream, slot: OwnedSemaphorePermit) {
        let remote = stream.peer_addr().ok();
        let accepted = tokio::time::timeout(self.timeout, self.acceptor.accept(stream)).await;
        match accepted {
            Ok(Ok(tls)) => {
                let _ = self.sender.send(Connection::new(Box::new(tls), slot)).await;
            }
            Ok(Err(error)) => {
                self.counters
                    .handshakes_failed
                    .fetch_add(1, Ordering::Relaxed);
                if let Some(held_back) = REFUSALS.admit() {
                    tracing::warn!(?remote, %error, held_back, "gRPC TLS handshake refused");
                }
            }
            Err(_) => {
                self.counters
                    .handshakes_failed
                    .fetch_add(1, Ordering::Relaxed);
                if let Some(held_back) = REFUSALS.admit() {
                    tracing::warn!(?remote, held_back, "gRPC TLS handshake refused: timed out");
                }
            }
        }
    }
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// One accepted connection, holding its slot until it closes.
struct Connection {
    io: Box<dyn Io>,
    _slot: OwnedSemaphorePermit,
}

impl Connection {
    fn new(io: Box<dyn Io>, slot: OwnedSemaphorePermit) -> Self {
        Self { io, _slot: slot }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
