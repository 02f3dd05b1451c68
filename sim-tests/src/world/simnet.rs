//! The engine's stream network (`arbor::net::Net`, `arbor::net::Listener`)
//! over madsim's simulated TCP, so that `arbor::tcp` (framing, pool,
//! `Hello`, connection slots, idle eviction, frame budgets) runs inside the
//! simulator as it runs on sockets.
//!
//! What madsim's streams are: a connection is two ordered, reliable
//! channels between the nodes. Bytes written are sent on `flush` only
//! (`arbor::tcp::write_frame` flushes every frame), and `shutdown` does
//! nothing: the other end reads the end of the stream once this end is
//! dropped. Faults act on them as follows:
//! - a clogged link (partition) refuses new connections at once, and holds
//!   what an open connection sends until the link is unclogged;
//! - packet loss refuses a connection attempt with the loss probability,
//!   and delays a chunk already sent: its delivery is retried after 1 ms,
//!   2 ms, ... (at most 10 s apart) until the link passes it, the chunks
//!   behind it waiting in order, as TCP retransmits;
//! - latency delays every chunk;
//! - a killed node drops its connections: the other end reads the end of
//!   the stream, after every chunk the node sent before it died. madsim
//!   keeps retrying those chunks for the dead node, so one held by a
//!   clogged link can arrive seconds after the kill.
//!
//! That last one is right for a process that stops while its machine keeps
//! power (a drained restart, a stand-in taking its place): the kernel still
//! delivers what the process wrote, then the end of the stream. A machine
//! that loses power (`World::crash`, `World::replace_disk`) cannot: its
//! retransmissions die with its kernel. So every stream here is a
//! `SimStream`, bound when it opens to the kernel incarnation of the
//! machine at each end (`Kernels`, which the world bumps on each power
//! loss; a dialled connection carries the dialler's incarnation at dial
//! time to the accepting end). Once either machine has lost power since,
//! every read of the stream fails with `ConnectionReset`, so nothing a dead
//! kernel sent arrives after its death, however long a clogged link held
//! it. Bytes that had reached the reader but were not yet read go too:
//! the same as if they had been lost on the way, which the engine must
//! survive anyway. Writes are madsim's: to a dead end they fail once madsim
//! dropped its stream, and are lost until then.

use super::transport::{Handler, MessageFilter};
use crate::trace::{RunEvent, Trace};
use arbor::net::{Listener, Net, Stream, Transport};
use arbor::proto::{self, Request, Response};
use arbor::runtime::{BoxFuture, Clock};
use arbor::{Caller, Error, ReplicaId};
use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How many times each simulated machine lost power (a crash, a destroyed
/// disk), by its address: the kernel incarnation its connections belong
/// to. A machine never named is in its first. Shared by a world and the
/// streams of its nodes and clients.
#[derive(Clone, Debug, Default)]
pub struct Kernels(Arc<Mutex<KernelBook>>);

#[derive(Debug, Default)]
struct KernelBook {
    /// Power losses so far, per machine.
    boots: BTreeMap<IpAddr, u64>,
    /// Connections dialled and not yet accepted, by (dialler, listener)
    /// address: the dialler's kernel incarnation when it dialled.
    dialled: BTreeMap<(SocketAddr, SocketAddr), u64>,
}

impl Kernels {
    /// The machine at `ip` lost power: its kernel, and every connection
    /// it had, is gone; so are the connections dialled to it that it had
    /// not accepted yet.
    pub fn power_lost(&self, ip: IpAddr) {
        let mut book = self.0.lock().unwrap();
        *book.boots.entry(ip).or_default() += 1;
        book.dialled.retain(|(_, listener), _| listener.ip() != ip);
    }

    /// The kernel incarnation the machine at `ip` runs.
    pub fn incarnation(&self, ip: IpAddr) -> u64 {
        let book = self.0.lock().unwrap();
        book.boots.get(&ip).copied().unwrap_or_default()
    }

    /// Records a connection `local` dialled to `remote` for the listener
    /// that accepts it.
    fn dialled(&self, local: SocketAddr, remote: SocketAddr) -> End {
        let incarnation = self.incarnation(local.ip());
        let mut book = self.0.lock().unwrap();
        book.dialled.insert((local, remote), incarnation);
        End {
            ip: local.ip(),
            incarnation,
        }
    }

    /// The dialling end of a connection from `remote` accepted at
    /// `local`: its kernel incarnation when it dialled.
    fn accepted(&self, local: SocketAddr, remote: SocketAddr) -> End {
        let dialled = self.0.lock().unwrap().dialled.remove(&(remote, local));
        End {
            ip: remote.ip(),
            incarnation: dialled.unwrap_or_else(|| self.incarnation(remote.ip())),
        }
    }

    /// The end at `ip`, in the kernel incarnation it runs now.
    fn end(&self, ip: IpAddr) -> End {
        End {
            ip,
            incarnation: self.incarnation(ip),
        }
    }
}

/// One end of a connection: its machine and the kernel incarnation it
/// belongs to.
#[derive(Clone, Copy, Debug)]
struct End {
    ip: IpAddr,
    incarnation: u64,
}

/// A madsim stream bound to the kernel incarnations of both its ends.
/// Once either machine lost power since the connection opened, reads
/// fail with `ConnectionReset`: what the dead kernel had sent but the
/// other end had not read is gone with it.
pub struct SimStream {
    inner: madsim::net::TcpStream,
    kernels: Kernels,
    ends: [End; 2],
}

impl SimStream {
    fn new(inner: madsim::net::TcpStream, kernels: Kernels, ends: [End; 2]) -> Self {
        Self {
            inner,
            kernels,
            ends,
        }
    }

    /// True once either end's machine lost power since the connection
    /// opened.
    fn severed(&self) -> bool {
        self.ends
            .iter()
            .any(|end| self.kernels.incarnation(end.ip) != end.incarnation)
    }
}

impl AsyncRead for SimStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.severed() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "the machine at the other end lost power",
            )));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Dials over madsim's simulated TCP from the node the calling task runs
/// on; its streams are bound to the kernel incarnations of both ends.
#[derive(Clone, Debug, Default)]
pub struct SimNet {
    kernels: Kernels,
}

impl SimNet {
    /// Dials with the kernel incarnations of `kernels`.
    pub fn new(kernels: Kernels) -> Self {
        Self { kernels }
    }
}

impl Net for SimNet {
    fn connect(&self, address: String) -> BoxFuture<'static, io::Result<Box<dyn Stream>>> {
        let kernels = self.kernels.clone();
        Box::pin(async move {
            let stream = madsim::net::TcpStream::connect(address.as_str()).await?;
            let (local, remote) = (stream.local_addr()?, stream.peer_addr()?);
            let ends = [kernels.dialled(local, remote), kernels.end(remote.ip())];
            Ok(Box::new(SimStream::new(stream, kernels, ends)) as Box<dyn Stream>)
        })
    }
}

/// Accepts madsim TCP connections for an `arbor::tcp::Server`, bound to
/// the kernel incarnations of both ends. Names a plaintext caller by its
/// source address (`identify`): the simulated network delivers only from
/// the address a node has, so the address stands for the certificate a
/// TLS connection would present, and the caller's `Hello` is checked
/// against it.
pub struct SimListener {
    listener: madsim::net::TcpListener,
    identify: fn(SocketAddr) -> Caller,
    kernels: Kernels,
}

impl SimListener {
    /// Binds `addr` on the node the calling task runs on.
    pub async fn bind(
        addr: SocketAddr,
        identify: fn(SocketAddr) -> Caller,
        kernels: Kernels,
    ) -> io::Result<SimListener> {
        let listener = madsim::net::TcpListener::bind(addr).await?;
        Ok(SimListener {
            listener,
            identify,
            kernels,
        })
    }
}

impl Listener for SimListener {
    fn accept(&self) -> BoxFuture<'_, io::Result<(Box<dyn Stream>, SocketAddr)>> {
        Box::pin(async move {
            let (stream, remote) = self.listener.accept().await?;
            let local = stream.local_addr()?;
            let ends = [
                self.kernels.end(local.ip()),
                self.kernels.accepted(local, remote),
            ];
            let stream = SimStream::new(stream, self.kernels.clone(), ends);
            Ok((Box::new(stream) as Box<dyn Stream>, remote))
        })
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    fn caller(&self, remote: SocketAddr) -> Caller {
        (self.identify)(remote)
    }
}

/// How the nodes of a world reach each other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Network {
    /// One madsim datagram per request and per answer (`transport.rs`):
    /// cheap, and every message can be lost on its own.
    #[default]
    Datagram,
    /// The engine's own stack (`arbor::tcp`) over madsim's simulated TCP:
    /// `tcp::Server` on a `SimListener`, `TcpTransport` over `SimNet`.
    Tcp,
    /// `Tcp` with mutual TLS on every connection (`simtls.rs`): real
    /// certificates of one cluster CA, and each caller named by the
    /// certificate it presents, not by its address.
    Tls,
}

impl Network {
    pub fn name(self) -> &'static str {
        match self {
            Network::Datagram => "datagram",
            Network::Tcp => "tcp",
            Network::Tls => "tls",
        }
    }

    /// True when the engine's own stack carries the calls (`Tcp`, `Tls`).
    pub fn is_stream(self) -> bool {
        self != Network::Datagram
    }

    pub fn parse(name: &str) -> Result<Network, String> {
        match name {
            "datagram" => Ok(Network::Datagram),
            "tcp" => Ok(Network::Tcp),
            "tls" => Ok(Network::Tls),
            other => Err(format!("unknown network {other:?}: datagram, tcp or tls")),
        }
    }
}

/// A transport whose calls between replicas pass the world's
/// `MessageFilter` first: a blocked request kind is never sent and its
/// caller hears nothing until its timeout, as on the datagram network.
pub struct Filtered {
    pub local: ReplicaId,
    pub filter: Arc<MessageFilter>,
    pub clock: Arc<dyn Clock>,
    pub inner: Arc<dyn Transport>,
}

impl Transport for Filtered {
    fn call(
        &self,
        peer: ReplicaId,
        request: Request,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Response, Error>> {
        if !self.filter.stops(self.local, peer, &request) {
            return self.inner.call(peer, request, timeout);
        }
        let silence = self.clock.sleep(timeout);
        Box::pin(async move {
            silence.await;
            Err(Error::Timeout)
        })
    }

    fn identities_refused(&self) -> u64 {
        self.inner.identities_refused()
    }
}

/// A world's handler (a node's service, watched and counted) behind
/// `arbor::tcp::Server`. Every request it takes and every answer it
/// gives, as wire frames beside the caller, go into the trace's
/// fingerprint, as `transport::serve_as` does for datagrams.
pub struct TcpHandler {
    pub inner: Arc<dyn Handler>,
    /// The server's address, where the trace places its events.
    pub server: String,
    pub trace: Trace,
}

impl arbor::tcp::Handler for TcpHandler {
    fn handle<'a>(&'a self, caller: &'a Caller, request: Request) -> BoxFuture<'a, Response> {
        let who = caller.to_string();
        let frame = proto::encode(0, &request);
        let parts: [&[u8]; 2] = [who.as_bytes(), &frame];
        self.trace
            .fingerprint(RunEvent::Request, &self.server, &parts);
        let answer = self.inner.clone().serve(caller.clone(), request);
        Box::pin(async move {
            let response = answer.await;
            let frame = proto::encode(0, &response);
            let parts: [&[u8]; 2] = [who.as_bytes(), &frame];
            self.trace
                .fingerprint(RunEvent::Answer, &self.server, &parts);
            response
        })
    }
}
