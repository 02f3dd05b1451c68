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
//!   clogged link can arrive seconds after the node was killed (a real
//!   machine's retransmissions die with its kernel).

use super::transport::{Handler, MessageFilter};
use crate::trace::{RunEvent, Trace};
use arbor::net::{Listener, Net, Stream, Transport};
use arbor::proto::{self, Request, Response};
use arbor::runtime::{BoxFuture, Clock};
use arbor::{Caller, Error, ReplicaId};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Dials over madsim's simulated TCP from the node the calling task runs
/// on.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimNet;

impl Net for SimNet {
    fn connect(&self, address: String) -> BoxFuture<'static, std::io::Result<Box<dyn Stream>>> {
        Box::pin(async move {
            let stream = madsim::net::TcpStream::connect(address.as_str()).await?;
            Ok(Box::new(stream) as Box<dyn Stream>)
        })
    }
}

/// Accepts madsim TCP connections for an `arbor::tcp::Server`. Names a
/// plaintext caller by its source address (`identify`): the simulated
/// network delivers only from the address a node has, so the address
/// stands for the certificate a TLS connection would present, and the
/// caller's `Hello` is checked against it.
pub struct SimListener {
    listener: madsim::net::TcpListener,
    identify: fn(SocketAddr) -> Caller,
}

impl SimListener {
    /// Binds `addr` on the node the calling task runs on.
    pub async fn bind(
        addr: SocketAddr,
        identify: fn(SocketAddr) -> Caller,
    ) -> std::io::Result<SimListener> {
        let listener = madsim::net::TcpListener::bind(addr).await?;
        Ok(SimListener { listener, identify })
    }
}

impl Listener for SimListener {
    fn accept(&self) -> BoxFuture<'_, std::io::Result<(Box<dyn Stream>, SocketAddr)>> {
        Box::pin(async move {
            let (stream, remote) = self.listener.accept().await?;
            Ok((Box::new(stream) as Box<dyn Stream>, remote))
        })
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
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
}

impl Network {
    pub fn name(self) -> &'static str {
        match self {
            Network::Datagram => "datagram",
            Network::Tcp => "tcp",
        }
    }

    pub fn parse(name: &str) -> Result<Network, String> {
        match name {
            "datagram" => Ok(Network::Datagram),
            "tcp" => Ok(Network::Tcp),
            other => Err(format!("unknown network {other:?}: datagram or tcp")),
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
