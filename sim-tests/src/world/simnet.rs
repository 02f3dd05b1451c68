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
//!   the stream.

use arbor::net::{Listener, Net, Stream};
use arbor::runtime::BoxFuture;
use arbor::Caller;
use std::net::SocketAddr;

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
