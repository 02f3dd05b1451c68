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
//!
//! madsim's streams have no flow control: a write never waits, however
//! little the other end reads. A world may set a window instead
//! (`Kernels::set_window`): each direction of a connection then carries
//! at most that many bytes its reader has not read yet, and a write past
//! it takes what fits and waits for the reader, as a TCP sender waits on
//! a full receive buffer. A reader that stops (a paused process, a client
//! that never reads its answers) so stalls its writer. Once the reading
//! end is closed, a write fails with a reset, as the other kernel answers
//! it; when that end's machine lost power, what is written is lost.
//!
//! The connection faults of the nemesis (`scenario::nemesis::wire`) act on
//! single streams, which `Kernels` keeps a register of while they live:
//! a reset fails every read and write of both ends at once (what arrived
//! and was not read goes, as with a TCP reset); a reset on answer lets a
//! server's connection take its next request whole and resets both ends
//! when the server writes the answer (the caller cannot know whether its
//! request was carried out); and silence turns both ends into a
//! half-open connection: reads never end, writes and flushes succeed and
//! carry nothing. The register also counts the streams each
//! listener accepted and still holds, which the checkers hold a server's
//! count of used connection slots to.

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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
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
    /// Every stream end alive now, by its number.
    streams: BTreeMap<u64, Registered>,
    /// Numbers given to stream ends and listeners so far.
    numbered: u64,
    /// The flow-control window of every connection opened from now on,
    /// in bytes each way; `None`: madsim's own streams, which never wait.
    window: Option<usize>,
    /// The window of each connection only one of whose ends has
    /// registered so far, by its address pair (lower first).
    windows: BTreeMap<(SocketAddr, SocketAddr), Weak<Window>>,
    /// Writes that found their window full, over every connection.
    stalled: Arc<AtomicU64>,
}

/// Flow control of one connection: per direction, the bytes its writer
/// wrote that its reader has not read yet, held to `limit`.
#[derive(Debug)]
struct Window {
    limit: usize,
    /// The world's count of writes that found a window full.
    stalled: Arc<AtomicU64>,
    /// Indexed by the writing end's side (`side_of`).
    directions: Mutex<[Direction; 2]>,
}

#[derive(Debug, Default)]
struct Direction {
    unread: usize,
    /// The writer waiting for room.
    writer: Option<Waker>,
    /// The reading end is gone: nothing holds the writer back any more.
    reader_gone: bool,
}

impl Window {
    /// Bytes the writer on `side` may write now (`None`: its reader is
    /// gone); when none, it is woken once the reader makes room.
    fn room(&self, side: usize, cx: &Context<'_>) -> Option<usize> {
        let mut directions = self.directions.lock().unwrap();
        let direction = &mut directions[side];
        if direction.reader_gone {
            return None;
        }
        let room = self.limit.saturating_sub(direction.unread);
        if room == 0 {
            direction.writer = Some(cx.waker().clone());
            self.stalled.fetch_add(1, Ordering::Relaxed);
        }
        Some(room)
    }

    /// The writer on `side` wrote `bytes`.
    fn wrote(&self, side: usize, bytes: usize) {
        let mut directions = self.directions.lock().unwrap();
        let direction = &mut directions[side];
        if !direction.reader_gone {
            direction.unread += bytes;
            assert!(
                direction.unread <= self.limit,
                "a write went past the window: {} of {} bytes unread",
                direction.unread,
                self.limit
            );
        }
    }

    /// The reader of what `side` writes read `bytes` (or, `gone`, went):
    /// room for the writer.
    fn read(&self, side: usize, bytes: usize, gone: bool) {
        let mut directions = self.directions.lock().unwrap();
        let direction = &mut directions[side];
        direction.unread = direction.unread.saturating_sub(bytes);
        direction.reader_gone |= gone;
        if let Some(writer) = direction.writer.take() {
            writer.wake();
        }
    }
}

/// The side of the end at `local` of the connection `pair`: 0 for the
/// lower address.
fn side_of(local: SocketAddr, pair: (SocketAddr, SocketAddr)) -> usize {
    usize::from(local != pair.0)
}

/// A live stream end in the register.
#[derive(Debug)]
struct Registered {
    /// The machines at both ends.
    ips: [IpAddr; 2],
    /// The listener that accepted it; `None` at the dialling end.
    listener: Option<u64>,
    /// The connection's two addresses, lower first: the same at both ends.
    pair: (SocketAddr, SocketAddr),
    fate: Arc<Fate>,
}

/// Accepted stream ends that `Kernels::accepted_alive` counts.
#[derive(Clone, Copy, Debug)]
pub enum Accepted {
    /// Those that listener accepted (`SimListener::number`), whatever
    /// their fate.
    By(u64),
    /// Those at `local` accepted from the machine at `remote` whose writes
    /// still reach it: not silenced (a silenced end's answers vanish, so
    /// they never wait for a reader).
    Answering { local: IpAddr, remote: IpAddr },
}

/// What the nemesis did to a stream end, and who waits on it.
#[derive(Debug, Default)]
struct Fate {
    state: Mutex<State>,
    /// The task last left waiting on a read, woken by a reset.
    reader: Mutex<Option<Waker>>,
}

/// The state of a stream end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    /// As madsim carries it.
    #[default]
    Open,
    /// Every read and write fails.
    Reset,
    /// Half-open: reads never end, writes and flushes carry nothing.
    Silent,
    /// Reset both ends at this end's next write.
    ResetOnWrite,
}

impl Fate {
    fn get(&self) -> State {
        *self.state.lock().unwrap()
    }

    /// Moves an open stream end to `state` (a reset also ends silence);
    /// true when it changed.
    fn strike(&self, state: State) -> bool {
        {
            let mut now = self.state.lock().unwrap();
            if *now == state || *now == State::Reset {
                return false;
            }
            *now = state;
        }
        if let Some(reader) = self.reader.lock().unwrap().take() {
            reader.wake();
        }
        true
    }
}

/// What the nemesis does to every stream of a machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamFault {
    /// Both ends fail every read and write from now on.
    Reset,
    /// Both ends become half-open: nothing arrives any more, writes
    /// vanish, and neither end learns of it.
    Silence,
    /// The connections the machine accepted are reset when it next
    /// writes on them (answers the request it is serving or takes next).
    ResetOnAnswer,
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

    /// Every connection opened from now on carries at most `window`
    /// unread bytes each way (`None`: no limit, as madsim's streams).
    pub fn set_window(&self, window: Option<usize>) {
        assert!(window != Some(0), "a window of no bytes carries nothing");
        self.0.lock().unwrap().window = window;
    }

    /// Writes that found their connection's window full so far.
    pub fn writes_stalled(&self) -> u64 {
        self.0.lock().unwrap().stalled.load(Ordering::Relaxed)
    }

    /// The window of connections opened now.
    pub fn window(&self) -> Option<usize> {
        self.0.lock().unwrap().window
    }

    /// Strikes every live stream with an end at `ip` (both ends of each
    /// connection); how many stream ends changed.
    pub fn strike(&self, ip: IpAddr, fault: StreamFault) -> usize {
        let (state, accepted_only) = match fault {
            StreamFault::Reset => (State::Reset, false),
            StreamFault::Silence => (State::Silent, false),
            StreamFault::ResetOnAnswer => (State::ResetOnWrite, true),
        };
        let book = self.0.lock().unwrap();
        (book.streams.values())
            .filter(|stream| match accepted_only {
                true => stream.listener.is_some() && stream.ips[0] == ip,
                false => stream.ips.contains(&ip),
            })
            .filter(|stream| stream.fate.strike(state))
            .count()
    }

    /// Resets both ends of the connection between `pair`.
    fn reset_pair(&self, pair: (SocketAddr, SocketAddr)) {
        let book = self.0.lock().unwrap();
        for stream in book.streams.values().filter(|s| s.pair == pair) {
            stream.fate.strike(State::Reset);
        }
    }

    /// Stream ends still alive that a listener accepted and that `which`
    /// picks.
    pub fn accepted_alive(&self, which: Accepted) -> usize {
        let book = self.0.lock().unwrap();
        (book.streams.values())
            .filter(|stream| match (which, stream.listener) {
                (_, None) => false,
                (Accepted::By(listener), Some(by)) => by == listener,
                (Accepted::Answering { local, remote }, Some(_)) => {
                    stream.ips == [local, remote] && stream.fate.get() != State::Silent
                }
            })
            .count()
    }

    /// A new number for a stream end or a listener.
    fn number(&self) -> u64 {
        let mut book = self.0.lock().unwrap();
        book.numbered += 1;
        book.numbered
    }

    /// Enters a new stream end between `ends` on the connection `pair`
    /// (its addresses, lower first); `listener` accepted it.
    fn register(
        &self,
        ends: [End; 2],
        pair: (SocketAddr, SocketAddr),
        listener: Option<u64>,
    ) -> (u64, Arc<Fate>, Option<Arc<Window>>) {
        let number = self.number();
        let fate = Arc::new(Fate::default());
        let entry = Registered {
            ips: [ends[0].ip, ends[1].ip],
            listener,
            pair,
            fate: fate.clone(),
        };
        let mut book = self.0.lock().unwrap();
        book.streams.insert(number, entry);
        // The first end of a connection to register makes its window and
        // the second takes it out of the book: a later connection between
        // the same two addresses (a port used again while an end of this
        // one lives on, silenced) gets a window of its own.
        let window = match book.windows.remove(&pair).and_then(|w| w.upgrade()) {
            Some(window) => Some(window),
            None => book.window.map(|limit| {
                let window = Arc::new(Window {
                    limit,
                    stalled: book.stalled.clone(),
                    directions: Mutex::default(),
                });
                book.windows.retain(|_, w| w.strong_count() > 0);
                book.windows.insert(pair, Arc::downgrade(&window));
                window
            }),
        };
        (number, fate, window)
    }

    fn unregister(&self, number: u64) {
        if let Ok(mut book) = self.0.lock() {
            book.streams.remove(&number);
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
    /// Its number in the register, its connection's addresses and what
    /// the nemesis did to it.
    number: u64,
    pair: (SocketAddr, SocketAddr),
    fate: Arc<Fate>,
    /// The connection's flow control, when the world has a window, and
    /// this end's side of it.
    window: Option<Arc<Window>>,
    side: usize,
}

impl SimStream {
    /// A stream end between `ends`, accepted by `listener` (`None` at the
    /// dialling end), entered in the register while it lives.
    fn new(
        inner: madsim::net::TcpStream,
        kernels: Kernels,
        ends: [End; 2],
        listener: Option<u64>,
    ) -> io::Result<Self> {
        let local = inner.local_addr()?;
        let pair = (local, inner.peer_addr()?);
        let pair = (pair.0.min(pair.1), pair.0.max(pair.1));
        let (number, fate, window) = kernels.register(ends, pair, listener);
        Ok(Self {
            inner,
            kernels,
            ends,
            number,
            pair,
            fate,
            window,
            side: side_of(local, pair),
        })
    }

    /// The fate of this end before a write: a pending reset on answer
    /// strikes both ends now.
    fn fate_of_write(&self) -> State {
        if self.fate.get() == State::ResetOnWrite {
            self.kernels.reset_pair(self.pair);
        }
        self.fate.get()
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
        match this.fate.get() {
            State::Reset => return Poll::Ready(Err(reset())),
            // Woken by nothing: the reader's own timeout ends its wait.
            State::Silent => return Poll::Pending,
            _ => {}
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        match (&read, &this.window) {
            (Poll::Pending, _) => *this.fate.reader.lock().unwrap() = Some(cx.waker().clone()),
            (Poll::Ready(Ok(())), Some(window)) => {
                let bytes = buf.filled().len() - before;
                window.read(1 - this.side, bytes, false);
            }
            _ => {}
        }
        read
    }
}

fn reset() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "connection reset")
}

impl AsyncWrite for SimStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.fate_of_write() {
            State::Reset => return Poll::Ready(Err(reset())),
            State::Silent => return Poll::Ready(Ok(buf.len())),
            _ => {}
        }
        let this = &mut *self;
        let Some(window) = this.window.clone() else {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        };
        let room = match window.room(this.side, cx) {
            Some(room) => room,
            // The other end closed while its machine runs: its kernel
            // answers what comes with a reset. A machine that lost power
            // says nothing, and what is written to it is lost.
            None if !this.severed() => return Poll::Ready(Err(reset())),
            None => buf.len(),
        };
        if room == 0 {
            // What this end holds unsent must go, or its reader could never
            // make room; madsim sends on flush, and never waits there.
            return match Pin::new(&mut this.inner).poll_flush(cx) {
                Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
                _ => Poll::Pending,
            };
        }
        let take = room.min(buf.len());
        let wrote = Pin::new(&mut this.inner).poll_write(cx, &buf[..take]);
        if let Poll::Ready(Ok(bytes)) = wrote {
            window.wrote(this.side, bytes);
        }
        wrote
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.fate_of_write() {
            State::Reset => Poll::Ready(Err(reset())),
            State::Silent => Poll::Ready(Ok(())),
            _ => Pin::new(&mut self.inner).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Drop for SimStream {
    fn drop(&mut self) {
        if let Some(window) = &self.window {
            window.read(1 - self.side, 0, true);
        }
        self.kernels.unregister(self.number);
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
            Ok(Box::new(SimStream::new(stream, kernels, ends, None)?) as Box<dyn Stream>)
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
    /// Its number, which the streams it accepts carry in the register.
    number: u64,
}

impl SimListener {
    /// Binds `addr` on the node the calling task runs on.
    pub async fn bind(
        addr: SocketAddr,
        identify: fn(SocketAddr) -> Caller,
        kernels: Kernels,
    ) -> io::Result<SimListener> {
        let listener = madsim::net::TcpListener::bind(addr).await?;
        let number = kernels.number();
        Ok(SimListener {
            listener,
            identify,
            kernels,
            number,
        })
    }

    /// Its number, for `Kernels::accepted_alive`.
    pub fn number(&self) -> u64 {
        self.number
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
            let stream = SimStream::new(stream, self.kernels.clone(), ends, Some(self.number))?;
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

/// How the nodes of a world reach each other: always through the engine's
/// own stack (`arbor::tcp`) over madsim's simulated TCP, `tcp::Server` on
/// a `SimListener` and `TcpTransport` over `SimNet`; in plaintext or with
/// mutual TLS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// Plaintext: each caller named by its address.
    #[default]
    Tcp,
    /// Mutual TLS on every connection (`simtls.rs`): real certificates of
    /// one cluster CA, and each caller named by the certificate it
    /// presents, not by its address.
    Tls,
}

impl Network {
    pub fn name(self) -> &'static str {
        match self {
            Network::Tcp => "tcp",
            Network::Tls => "tls",
        }
    }

    /// True for the network a run gets when none is named.
    pub fn is_default(&self) -> bool {
        *self == Network::default()
    }

    pub fn parse(name: &str) -> Result<Network, String> {
        match name {
            "tcp" => Ok(Network::Tcp),
            "tls" => Ok(Network::Tls),
            other => Err(format!("unknown network {other:?}: tcp or tls")),
        }
    }
}

/// A transport whose calls between replicas pass the world's
/// `MessageFilter` first: a blocked request kind is never sent and its
/// caller hears nothing until its timeout.
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
/// fingerprint.
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
