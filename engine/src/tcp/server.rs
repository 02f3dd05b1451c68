//! The accepting side: at most `max_connections` connections, each closed
//! when it starts no frame for `idle_timeout`; when all slots are taken, a
//! new connection closes the one idle longest instead of being refused, so
//! sockets that send nothing cannot lock clients and peers out. With TLS,
//! the handshake must end within `handshake_timeout`, and the client's
//! certificate names the caller: a configured peer of this cluster becomes
//! `Caller::Peer`, a client of this cluster `Caller::Client`; anything else
//! is refused. Without TLS a caller is who the listener names by its
//! address (`Anonymous` for a socket listener) until it says `Hello` with
//! a replica id the service accepts.

use super::budget::FrameBudget;
use super::{buffered, check_length, encode_frame, io_error, write_frame, Handler, Stream};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::identity::Caller;
use crate::net::Listener;
use crate::proto::{self, Envelope, Request, Response};
use crate::runtime::{until, with_timeout, Env};
use crate::tls::{CertIdentity, TlsContext};
use crate::types::ReplicaId;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};

/// Refused handshakes and identities logged, over every server of the
/// process (`held_back` counts the lines left out since the last one).
static REFUSALS: crate::metrics::WarnLimit =
    crate::metrics::WarnLimit::new(crate::metrics::REFUSALS_LOGGED_PER_MINUTE);

/// Bounds and identity of the server side.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub max_message_bytes: usize,
    pub max_connections: usize,
    /// Time a frame may take to arrive once its first byte did, and a
    /// response to be written.
    pub frame_timeout: Duration,
    /// A connection that starts no frame for this long is closed.
    pub idle_timeout: Duration,
    pub handshake_timeout: Duration,
    pub partial_frames_bytes_max: usize,
    /// This node's cluster and replica id, and its configured peers: who a
    /// certificate may name.
    pub cluster_id: String,
    pub replica_id: ReplicaId,
    pub peers: BTreeSet<ReplicaId>,
}

impl ServerOptions {
    pub fn from_config(config: &Config) -> Self {
        let limits = &config.limits;
        Self {
            max_message_bytes: limits.max_message_bytes,
            max_connections: limits.max_connections,
            frame_timeout: config.tree.replication_timeout,
            idle_timeout: limits.idle_connection_timeout,
            handshake_timeout: limits.handshake_timeout,
            partial_frames_bytes_max: limits.partial_frames_bytes_max,
            cluster_id: config.node.cluster_id.clone(),
            replica_id: config.node.replica_id,
            peers: config.node.peers.iter().map(|p| p.replica_id).collect(),
        }
    }

    /// The caller a certificate names, or why it may not connect.
    fn caller_for(&self, identity: &CertIdentity) -> Result<Caller> {
        let refuse = |why: String| Err(Error::IdentityRefused(why));
        if identity.cluster_id() != self.cluster_id {
            return refuse(format!(
                "certificate {identity} is of another cluster than {:?}",
                self.cluster_id
            ));
        }
        match identity {
            CertIdentity::Client { name, .. } => Ok(Caller::Client(name.clone())),
            CertIdentity::Replica { replica_id, .. } if *replica_id == self.replica_id => refuse(
                format!("certificate {identity} names this node's own replica id"),
            ),
            CertIdentity::Replica { replica_id, .. } if self.peers.contains(replica_id) => {
                Ok(Caller::Peer(*replica_id))
            }
            CertIdentity::Replica { .. } => {
                refuse(format!("certificate {identity} names no configured peer"))
            }
        }
    }
}

/// What a server has done and holds now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    pub connections_open: u64,
    pub connections_accepted: u64,
    /// Refused at the limit with no idle connection to close.
    pub connections_refused: u64,
    /// Closed after `idle_timeout` without a frame.
    pub idle_closed: u64,
    /// Closed to make room for a new connection.
    pub idle_evicted: u64,
    /// TLS handshakes that failed or timed out.
    pub handshakes_failed: u64,
    /// Certificates that named no acceptable caller.
    pub identities_refused: u64,
    /// Bytes of frames being received now, and the most at once.
    pub partial_frame_bytes: u64,
    pub partial_frame_bytes_peak: u64,
    /// Frames refused (`Overloaded`) for finding no room in the budget.
    pub partial_frames_refused: u64,
    /// Answers the client did not take within the frame timeout (it
    /// stopped reading, or reads too slowly); each closed its connection.
    pub answers_timed_out: u64,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    refused: AtomicU64,
    idle_closed: AtomicU64,
    idle_evicted: AtomicU64,
    handshakes_failed: AtomicU64,
    identities_refused: AtomicU64,
    answers_timed_out: AtomicU64,
}

/// Connections waiting for their next frame (or for their handshake), in
/// the order they started waiting: the first is closed when room is needed.
#[derive(Default)]
struct IdleSet {
    next: u64,
    waiting: BTreeMap<u64, Arc<Eviction>>,
}

/// What the accept loop and every connection share.
struct Shared {
    handler: Arc<dyn Handler>,
    options: ServerOptions,
    tls: Option<tokio_rustls::TlsAcceptor>,
    slots: Arc<Semaphore>,
    idle: Mutex<IdleSet>,
    /// Connections waiting for the slot of an evicted one.
    handovers: AtomicUsize,
    budget: FrameBudget,
    counters: Counters,
    /// The clock every timeout here runs on, and where connections run.
    env: Env,
    stop: watch::Sender<bool>,
}

/// A listener and the connections it accepted.
pub struct Server {
    listener: Box<dyn Listener>,
    shared: Arc<Shared>,
}

/// Watches and stops a running server.
#[derive(Clone)]
pub struct ServerHandle {
    shared: Arc<Shared>,
}

impl Server {
    /// A server on a tokio listener, on the system clock and the ambient
    /// tokio runtime.
    pub fn new(
        listener: TcpListener,
        handler: Arc<dyn Handler>,
        options: ServerOptions,
        tls: Option<Arc<TlsContext>>,
    ) -> Self {
        let env = crate::system::system_env();
        Self::with_env(Box::new(listener), handler, options, tls, env)
    }

    /// A server on any listener, its timeouts on `env.clock` and its
    /// connections spawned on `env.runtime` (the simulator's).
    pub fn with_env(
        listener: Box<dyn Listener>,
        handler: Arc<dyn Handler>,
        options: ServerOptions,
        tls: Option<Arc<TlsContext>>,
        env: Env,
    ) -> Self {
        assert!(options.max_connections >= 1, "a server needs a connection");
        let shared = Arc::new(Shared {
            handler,
            tls: tls.map(|tls| tls.acceptor()),
            slots: Arc::new(Semaphore::new(options.max_connections)),
            idle: Mutex::default(),
            handovers: AtomicUsize::new(0),
            budget: FrameBudget::new(options.partial_frames_bytes_max),
            counters: Counters::default(),
            stop: watch::channel(false).0,
            options,
            env,
        });
        Self { listener, shared }
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn handle(&self) -> ServerHandle {
        ServerHandle {
            shared: self.shared.clone(),
        }
    }

    /// Accepts connections until stopped; each is served on its own task.
    pub async fn run(self) {
        let mut stop = self.shared.stop.subscribe();
        loop {
            let accepted = tokio::select! {
                biased;
                _ = stop.wait_for(|stop| *stop) => return,
                accepted = self.listener.accept() => accepted,
            };
            match accepted {
                Ok((stream, remote)) => {
                    let caller = self.listener.caller(remote);
                    self.shared.clone().admit(stream, remote, caller)
                }
                Err(error) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    self.shared.env.clock.sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

impl ServerHandle {
    pub fn stats(&self) -> ServerStats {
        let shared = &self.shared;
        let c = &shared.counters;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let open = shared.options.max_connections - shared.slots.available_permits();
        ServerStats {
            connections_open: open as u64,
            connections_accepted: load(&c.accepted),
            connections_refused: load(&c.refused),
            idle_closed: load(&c.idle_closed),
            idle_evicted: load(&c.idle_evicted),
            handshakes_failed: load(&c.handshakes_failed),
            identities_refused: load(&c.identities_refused),
            partial_frame_bytes: shared.budget.in_use_bytes() as u64,
            partial_frame_bytes_peak: shared.budget.peak_bytes() as u64,
            partial_frames_refused: shared.budget.refused() as u64,
            answers_timed_out: load(&c.answers_timed_out),
        }
    }

    /// Stops accepting; idle connections close at once, busy ones after
    /// answering the request they are serving.
    pub fn stop(&self) {
        let _ = self.shared.stop.send(true);
    }

    /// Waits until every connection has closed.
    pub async fn closed(&self) {
        let all = u32::try_from(self.shared.options.max_connections).unwrap_or(u32::MAX);
        let _ = self.shared.slots.acquire_many(all).await;
    }
}

/// Accepts connections on `listener` without TLS until the process ends.
pub async fn serve(listener: TcpListener, handler: Arc<dyn Handler>, options: ServerOptions) {
    Server::new(listener, handler, options, None).run().await
}

/// Binds `node.listen`. Without TLS only a loopback address is allowed,
/// unless `node.insecure_plaintext` says otherwise (docs/design.md §9).
pub async fn listen(config: &Config, tls: bool) -> Result<TcpListener> {
    let listen = &config.node.listen;
    let bad = |why: String| Error::Config(format!("node.listen: {listen}: {why}"));
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host(listen.as_str())
        .await
        .map_err(|e| bad(e.to_string()))?
        .collect();
    if !tls && !config.node.insecure_plaintext {
        if let Some(open) = addresses.iter().find(|a| !a.ip().is_loopback()) {
            return Err(bad(format!(
                "{open} is not a loopback address; set node.tls, or \
                 node.insecure_plaintext: true to serve plaintext on it"
            )));
        }
    }
    if !tls && config.node.insecure_plaintext {
        tracing::warn!(%listen, "node.insecure_plaintext: serving without TLS; anyone who reaches this port is trusted");
    }
    TcpListener::bind(addresses.as_slice())
        .await
        .map_err(|e| bad(e.to_string()))
}

impl Shared {
    /// Serves a new connection in a free slot, or in the slot of the
    /// connection idle longest; refuses it when every one is busy.
    /// `caller` is who a plaintext connection is until its `Hello`.
    fn admit(self: Arc<Self>, mut stream: Box<dyn Stream>, remote: SocketAddr, caller: Caller) {
        let runtime = self.env.runtime.clone();
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            let serve = self.serve(stream, remote, caller, slot);
            runtime.spawn("tcp connection", Box::pin(serve));
            return;
        }
        let max = self.options.max_connections;
        let handover = self.handovers.fetch_add(1, Ordering::SeqCst) < max && self.evict_idle();
        if !handover {
            self.handovers.fetch_sub(1, Ordering::SeqCst);
            self.refuse(&mut stream);
            return;
        }
        runtime.spawn(
            "tcp handover",
            Box::pin(async move {
                let slot = self.slots.clone().acquire_owned();
                let slot = with_timeout(&*self.env.clock, self.options.frame_timeout, slot).await;
                self.handovers.fetch_sub(1, Ordering::SeqCst);
                match slot {
                    Some(Ok(slot)) => self.serve(stream, remote, caller, slot).await,
                    _ => self.refuse(&mut stream),
                }
            }),
        );
    }

    /// Tells the connection idle longest to close; false when none is.
    fn evict_idle(&self) -> bool {
        let oldest = self.idle.lock().expect("idle set").waiting.pop_first();
        match oldest {
            Some((_, evict)) => {
                evict.done.store(true, Ordering::SeqCst);
                evict.notify.notify_one();
                self.counters.idle_evicted.fetch_add(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Tells a client over the connection limit why it is dropped, without
    /// ever waiting on it. Over TLS nothing can be said before a handshake,
    /// so the connection is just closed.
    fn refuse(&self, stream: &mut Box<dyn Stream>) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        if self.tls.is_some() {
            return;
        }
        let limit = self.options.max_connections;
        let error = Error::Overloaded(format!("connection limit {limit} reached"));
        if let Ok(frame) = encode_frame(0, &Response::Error(error)) {
            // One poll each: whatever the socket takes now, never a wait.
            use futures::FutureExt;
            use tokio::io::AsyncWriteExt;
            let _ = stream.write(frame.as_bytes()).now_or_never();
            let _ = stream.flush().now_or_never();
        }
    }

    async fn serve(
        self: Arc<Self>,
        stream: Box<dyn Stream>,
        remote: SocketAddr,
        plaintext_caller: Caller,
        slot: OwnedSemaphorePermit,
    ) {
        let _slot = slot;
        self.counters.accepted.fetch_add(1, Ordering::Relaxed);
        let evict = Arc::new(Eviction::default());
        let result = match &self.tls {
            None => {
                self.serve_requests(&mut buffered(stream), plaintext_caller, &evict)
                    .await
            }
            Some(acceptor) => match self.handshake(acceptor, stream, remote, &evict).await {
                Ok((stream, caller)) => {
                    self.serve_requests(&mut buffered(stream), caller, &evict)
                        .await
                }
                Err(error) => Err(error),
            },
        };
        if let Err(error) = result {
            tracing::debug!(%remote, %error, "connection closed");
        }
        if crate::canary::active(crate::canary::Canary::EvictedSlotKept)
            && evict.done.load(Ordering::SeqCst)
        {
            std::mem::forget(_slot);
        }
    }

    /// The TLS handshake, then who the client certificate names. A refused
    /// name is told to the client before the connection closes.
    async fn handshake(
        &self,
        acceptor: &tokio_rustls::TlsAcceptor,
        stream: Box<dyn Stream>,
        remote: SocketAddr,
        evict: &Arc<Eviction>,
    ) -> Result<(Box<dyn Stream>, Caller)> {
        let _idle = IdleTicket::enter(&self.idle, evict);
        let accept = acceptor.accept(stream);
        let mut stop = self.stop.subscribe();
        let outcome = tokio::select! {
            biased;
            _ = stop.wait_for(|stop| *stop) => return Err(Error::ShuttingDown),
            () = evict.notify.notified() => return Err(Error::Network("closed for room".into())),
            outcome = with_timeout(&*self.env.clock, self.options.handshake_timeout, accept) => outcome,
        };
        let mut stream = match outcome {
            Some(Ok(stream)) => stream,
            failed => {
                self.counters
                    .handshakes_failed
                    .fetch_add(1, Ordering::Relaxed);
                let error = match failed {
                    None => Error::Timeout,
                    Some(Err(e)) => Error::Network(format!("TLS handshake: {e}")),
                    Some(Ok(_)) => unreachable!("handled above"),
                };
                if let Some(held_back) = REFUSALS.admit() {
                    tracing::warn!(%remote, %error, held_back, "TLS handshake refused");
                }
                return Err(error);
            }
        };
        let identity = {
            let certs = stream.get_ref().1.peer_certificates().unwrap_or_default();
            let first = certs.first().ok_or_else(|| {
                Error::IdentityRefused("the client presented no certificate".into())
            });
            first.and_then(|cert| CertIdentity::from_certificate(cert))
        };
        match identity.and_then(|identity| self.options.caller_for(&identity)) {
            Ok(caller) => Ok((Box::new(stream), caller)),
            Err(error) => {
                self.counters
                    .identities_refused
                    .fetch_add(1, Ordering::Relaxed);
                if let Some(held_back) = REFUSALS.admit() {
                    tracing::warn!(%remote, %error, held_back, "TLS client refused");
                }
                self.answer(&mut stream, 0, Response::Error(error.clone()))
                    .await
                    .ok();
                Err(error)
            }
        }
    }

    /// Requests one at a time until the client leaves, idles out, sends a
    /// bad frame, is refused in `Hello`, or the server stops.
    async fn serve_requests<S: Stream>(
        &self,
        stream: &mut S,
        mut caller: Caller,
        evict: &Arc<Eviction>,
    ) -> Result<()> {
        loop {
            let request = match self.next_request(stream, evict).await {
                Ok(Some(request)) => request,
                Ok(None) => return Ok(()),
                Err(Error::ShuttingDown) => {
                    self.farewell(stream).await;
                    return Ok(());
                }
                Err(error) => {
                    let _ = self.answer(stream, 0, Response::Error(error.clone())).await;
                    return Err(error);
                }
            };
            let claim = match &request.body {
                Request::Hello { replica_id, .. } => Some(*replica_id),
                _ => None,
            };
            let response = self.handler.handle(&caller, request.body).await;
            let refused = match (&response, claim) {
                (Response::Hello { .. }, Some(Some(id))) if caller == Caller::Anonymous => {
                    // A plaintext connection is who its accepted Hello says.
                    caller = Caller::Peer(id);
                    false
                }
                (Response::Error(Error::IdentityRefused(_)), Some(_)) => true,
                _ => false,
            };
            self.answer(stream, request.id, response).await?;
            if refused {
                return Err(Error::IdentityRefused("Hello refused".into()));
            }
        }
    }

    /// The end of a connection when the server stops between two requests:
    /// a request the client may have sent meanwhile is not read, so it is
    /// answered `ShuttingDown` (id 0, the answer to whatever it sent), this
    /// end's writing half is closed, and what already arrived is read off
    /// so that closing sends no reset (a reset can destroy the answer
    /// before the client reads it). A request sent before the stop is
    /// never left without an answer.
    async fn farewell<S: Stream>(&self, stream: &mut S) {
        use futures::FutureExt;
        use tokio::io::AsyncWriteExt;
        if self
            .answer(stream, 0, Response::Error(Error::ShuttingDown))
            .await
            .is_err()
        {
            return;
        }
        let clock = &*self.env.clock;
        let _ = with_timeout(clock, self.options.frame_timeout, stream.shutdown()).await;
        let mut discard = [0u8; 4096];
        while let Some(Ok(read)) = stream.read(&mut discard).now_or_never() {
            if read == 0 {
                break;
            }
        }
    }

    /// Waits for the next frame to start (at most `idle_timeout`, and only
    /// until the connection is evicted or the server stops), then gives it
    /// `frame_timeout` to arrive whole. `None`: close quietly;
    /// `ShuttingDown`: the server stopped first.
    async fn next_request<S: Stream>(
        &self,
        stream: &mut S,
        evict: &Arc<Eviction>,
    ) -> Result<Option<Envelope<Request>>> {
        let mut first = [0u8; 1];
        let read = {
            let _idle = IdleTicket::enter(&self.idle, evict);
            let mut stop = self.stop.subscribe();
            let idle_timeout = self.options.idle_timeout;
            tokio::select! {
                biased;
                _ = stop.wait_for(|stop| *stop) => return Err(Error::ShuttingDown),
                () = evict.notify.notified() => return Ok(None),
                read = with_timeout(&*self.env.clock, idle_timeout, stream.read(&mut first)) => read,
            }
        };
        match read {
            None => {
                self.counters.idle_closed.fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            }
            Some(Ok(0)) => return Ok(None),
            Some(read) => read.map_err(io_error)?,
        };
        let clock = &*self.env.clock;
        let deadline = clock.now() + self.options.frame_timeout;
        let mut header = [first[0], 0, 0, 0];
        match until(clock, deadline, stream.read_exact(&mut header[1..])).await {
            None => return Err(Error::Timeout),
            Some(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(Error::Malformed("truncated frame header".into()))
            }
            Some(read) => read.map_err(io_error)?,
        };
        let max = self.options.max_message_bytes;
        let length = check_length(u32::from_be_bytes(header), max)?;
        let (body, _reserved) = self
            .budget
            .read_body(stream, length, clock, deadline)
            .await?;
        proto::decode::<Request>(&body, max).map(Some)
    }

    /// Writes one answer within `frame_timeout`; an answer too large for a
    /// message becomes an error in its place.
    async fn answer<S: Stream>(&self, stream: &mut S, id: u64, response: Response) -> Result<()> {
        let max = self.options.max_message_bytes;
        let mut frame = encode_frame(id, &response)?;
        if frame.body_len() > max {
            let error = Error::TooLarge {
                what: "response".into(),
                size: frame.body_len() as u64,
                limit: max as u64,
            };
            frame = encode_frame(id, &Response::Error(error))?;
        }
        let clock = &*self.env.clock;
        let written = with_timeout(
            clock,
            self.options.frame_timeout,
            write_frame(stream, &frame),
        );
        written.await.unwrap_or_else(|| {
            crate::probe::hit(crate::probe::Probe::AnswerTimedOut);
            self.counters
                .answers_timed_out
                .fetch_add(1, Ordering::Relaxed);
            Err(Error::Timeout)
        })
    }
}

/// How the server tells a waiting connection to close for room.
#[derive(Default)]
struct Eviction {
    notify: Notify,
    /// Set once the connection was chosen.
    done: AtomicBool,
}

/// A connection's place in the idle set while it waits; it leaves when the
/// wait ends.
struct IdleTicket<'a> {
    set: &'a Mutex<IdleSet>,
    ticket: u64,
}

impl<'a> IdleTicket<'a> {
    fn enter(set: &'a Mutex<IdleSet>, evict: &Arc<Eviction>) -> Self {
        let mut idle = set.lock().expect("idle set");
        idle.next += 1;
        let ticket = idle.next;
        idle.waiting.insert(ticket, evict.clone());
        Self { set, ticket }
    }
}

impl Drop for IdleTicket<'_> {
    fn drop(&mut self) {
        self.set
            .lock()
            .expect("idle set")
            .waiting
            .remove(&self.ticket);
    }
}
