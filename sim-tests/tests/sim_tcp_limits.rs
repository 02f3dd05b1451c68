//! The limits of the engine's TCP server and transport on simulated time:
//! the idle timeout, connection slots and the eviction of idle ones, the
//! frame budget against a flood of half-sent frames, and the calls a
//! transport has in flight per peer. `arbor::tcp` runs here unchanged on
//! the simulator's sockets (`SimListener`, `SimNet`) and clock, so every
//! wait is simulated time taken from a seed: a timeout is checked to the
//! millisecond it is due, no test waits on the wall clock, and a run
//! repeats exactly. The last tests strike connections as the nemesis
//! does (`simnet::StreamFault`): a reset, a reset after the request ran,
//! a connection gone half-open. `engine/tests/tcp.rs` keeps the checks of framing and
//! hostile bytes on real sockets, the production runtime's smoke test.

use arbor::config::{Config, PeerConfig, DEFAULT_CLUSTER_ID};
use arbor::net::{Net, Stream, Transport};
use arbor::proto::{self, Request, Response};
use arbor::runtime::{BoxFuture, Clock, Env};
use arbor::tcp::{self, Connection, Dialer, Handler, Server, ServerHandle, ServerOptions};
use arbor::tcp::{ServerStats, TcpTransport};
use arbor::tls::TlsContext;
use arbor::{Caller, Error};
use arbor_sim::world::caller_at;
use arbor_sim::world::clock::{ClockSkew, SimClock};
use arbor_sim::world::config::client_ip;
use arbor_sim::world::runtime::SimRuntime;
use arbor_sim::world::simnet::{Kernels, SimListener, SimNet, StreamFault};
use arbor_sim::world::simtls::Pki;
use madsim::runtime::{Handle, NodeHandle, Runtime};
use madsim::time::Instant;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{oneshot, watch, Semaphore};

const MAX: usize = 64 * 1024;
/// Bounds every wait; none is expected to come close.
const PATIENCE: Duration = Duration::from_secs(60);
/// Where the server under test listens.
const SERVER: &str = "10.0.0.9:7000";
const HEALTH: Response = Response::Health {
    replica_id: 9,
    log_epoch: 0,
};

/// Answers a health check, nothing else.
struct Fake;

impl Handler for Fake {
    fn handle<'a>(&'a self, _caller: &'a Caller, request: Request) -> BoxFuture<'a, Response> {
        Box::pin(async move {
            match request {
                Request::Healthcheck => HEALTH,
                _ => Response::Error(Error::InvalidOp("fake".into())),
            }
        })
    }
}

/// Holds every request until released; counts what arrived.
struct Gate {
    arrived: watch::Sender<usize>,
    release: Semaphore,
}

impl Gate {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            arrived: watch::channel(0).0,
            release: Semaphore::new(0),
        })
    }
}

impl Handler for Gate {
    fn handle<'a>(&'a self, _caller: &'a Caller, _request: Request) -> BoxFuture<'a, Response> {
        Box::pin(async move {
            self.arrived.send_modify(|n| *n += 1);
            self.release.acquire().await.unwrap().forget();
            Response::Done
        })
    }
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(SimClock::new(ClockSkew::default()))
}

fn options(max_connections: usize) -> ServerOptions {
    ServerOptions {
        max_message_bytes: MAX,
        max_connections,
        frame_timeout: Duration::from_secs(5),
        ..ServerOptions::from_config(&Config::default_for_test(9))
    }
}

/// Runs `test` under `seed` in a fresh simulated world.
fn simulate<F: Future>(seed: u64, test: impl FnOnce() -> F) -> F::Output {
    Runtime::with_seed_and_config(seed, madsim::Config::default()).block_on(test())
}

/// A machine serving `handler` through `tcp::Server` at `SERVER`, on the
/// simulated clock; the server's handle once it listens.
async fn start_server(handler: Arc<dyn Handler>, options: ServerOptions) -> ServerHandle {
    start_server_with(handler, options, None).await
}

/// `start_server`, with TLS when `tls` is given.
async fn start_server_with(
    handler: Arc<dyn Handler>,
    options: ServerOptions,
    tls: Option<Arc<TlsContext>>,
) -> ServerHandle {
    start_server_in(handler, options, tls, Kernels::default()).await
}

/// `start_server_with`, its streams entered in `kernels` (where the
/// connection faults strike).
async fn start_server_in(
    handler: Arc<dyn Handler>,
    options: ServerOptions,
    tls: Option<Arc<TlsContext>>,
    kernels: Kernels,
) -> ServerHandle {
    start_server_on(handler, options, tls, kernels).await.0
}

/// `start_server_in`; also the server's machine.
async fn start_server_on(
    handler: Arc<dyn Handler>,
    options: ServerOptions,
    tls: Option<Arc<TlsContext>>,
    kernels: Kernels,
) -> (ServerHandle, madsim::task::NodeId) {
    let addr: SocketAddr = SERVER.parse().unwrap();
    let node = Handle::current()
        .create_node()
        .name("server")
        .ip(addr.ip())
        .build();
    let (sender, listening) = oneshot::channel();
    node.spawn(async move {
        let listener = SimListener::bind(addr, caller_at, kernels)
            .await
            .expect("binds");
        let env = Env {
            clock: clock(),
            runtime: Arc::new(SimRuntime::new(None)),
        };
        let server = Server::with_env(Box::new(listener), handler, options, tls, env);
        let _ = sender.send(server.handle());
        server.run().await
    });
    (listening.await.expect("the server starts"), node.id())
}

/// The client machine; its tasks dial from its address.
fn client_machine() -> NodeHandle {
    Handle::current()
        .create_node()
        .name("client-1")
        .ip(client_ip(1))
        .build()
}

/// Runs `task` on `machine` and waits for it.
async fn on<T: Send + 'static>(
    machine: &NodeHandle,
    task: impl Future<Output = T> + Send + 'static,
) -> T {
    machine.spawn(task).await.expect("the task runs")
}

/// A raw socket to the server, no `Hello`.
async fn raw_socket() -> Box<dyn Stream> {
    SimNet::default()
        .connect(SERVER.to_string())
        .await
        .expect("connects")
}

/// A framed connection to the server, no `Hello`.
async fn connection() -> Connection {
    connection_as(Dialer::plaintext(PATIENCE, MAX)).await
}

/// A connection to the server as `dialer` says.
async fn connection_as(dialer: Dialer) -> Connection {
    Connection::open_via(&SimNet::default(), &*clock(), SERVER, None, &dialer)
        .await
        .expect("connects")
}

/// A client that holds the certificate of `client-2` from `pki`, without
/// `Hello`.
fn tls_dialer(pki: &Pki) -> Dialer {
    Dialer {
        cluster_id: DEFAULT_CLUSTER_ID.into(),
        replica_id: None,
        tls: Some(pki.client("client-2")),
        connect_timeout: PATIENCE,
        max_message_bytes: MAX,
        hello: false,
    }
}

/// Waits (in simulated time, a bounded while) until the server's stats
/// satisfy `done`.
async fn settled(handle: &ServerHandle, done: impl Fn(&ServerStats) -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done(&handle.stats()) {
        assert!(Instant::now() < deadline, "{:?}", handle.stats());
        madsim::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A connection that starts no frame is closed when `idle_timeout` has
/// passed since it opened, not before, saying nothing; one that keeps
/// talking is never closed for idling.
#[test]
fn a_silent_connection_is_closed_when_its_idle_timeout_is_up() {
    let idle_timeout = Duration::from_secs(30);
    simulate(1, || async move {
        let mut options = options(4);
        options.idle_timeout = idle_timeout;
        let handle = start_server(Arc::new(Fake), options).await;
        let client = client_machine();
        let (held, received) = on(&client, async move {
            let mut silent = raw_socket().await;
            let opened = Instant::now();
            let mut received = Vec::new();
            madsim::time::timeout(PATIENCE, silent.read_to_end(&mut received))
                .await
                .expect("the server closes an idle connection")
                .expect("a clean close");
            (opened.elapsed(), received)
        })
        .await;
        assert!(received.is_empty(), "an idle close says nothing");
        assert!(held >= idle_timeout, "closed after {held:?}");
        assert!(
            held < idle_timeout + Duration::from_secs(1),
            "closed after {held:?}"
        );
        assert_eq!(handle.stats().idle_closed, 1);

        let answers = on(&client, async move {
            let mut busy = connection().await;
            let mut answers = Vec::new();
            for _ in 0..4 {
                madsim::time::sleep(idle_timeout * 2 / 3).await;
                answers.push(busy.call(&Request::Healthcheck).await);
            }
            answers
        })
        .await;
        assert_eq!(answers, vec![Ok(HEALTH); 4]);
        assert_eq!(handle.stats().idle_closed, 1);
    })
}

/// Twelve sockets that never send a byte against a server of four slots,
/// then a client, under `seed`, over TLS when `tls`: when the client was
/// answered (simulated time since its dial), its answer, and the server's
/// counters then.
fn idle_socket_storm(seed: u64, tls: bool) -> (Duration, Result<Response, Error>, ServerStats) {
    simulate(seed, move || async move {
        let idle_timeout = Duration::from_secs(30);
        let mut options = options(4);
        options.idle_timeout = idle_timeout;
        options.handshake_timeout = idle_timeout;
        let pki = tls.then(|| Arc::new(Pki::new(DEFAULT_CLUSTER_ID)));
        let server_tls = pki.as_ref().map(|pki| pki.replica(9));
        let handle = start_server_with(Arc::new(Fake), options, server_tls).await;
        // Three times the limit, all taken in (in a slot, or closed at
        // once) before the client comes.
        let storm = client_machine();
        let idle = on(&storm, async {
            let mut idle = Vec::new();
            for _ in 0..12 {
                idle.push(raw_socket().await);
            }
            idle
        })
        .await;
        settled(&handle, |s| {
            s.connections_accepted + s.connections_refused == 12
        })
        .await;
        let client = Handle::current()
            .create_node()
            .name("client-2")
            .ip(client_ip(2))
            .build();
        let dialer = match &pki {
            Some(pki) => tls_dialer(pki),
            None => Dialer::plaintext(PATIENCE, MAX),
        };
        let (waited, answer) = on(&client, async move {
            let dialled = Instant::now();
            let mut connection = connection_as(dialer).await;
            let answer = connection.call(&Request::Healthcheck).await;
            (dialled.elapsed(), answer)
        })
        .await;
        drop(idle);
        (waited, answer, handle.stats())
    })
}

/// Idle sockets beyond the slot limit do not keep a client out: it is
/// served by closing idle ones, well within the idle timeout, and the
/// server never has more open than its limit. Over TLS the sockets never
/// start a handshake, and the handshake timeout is as long.
#[test]
fn idle_sockets_beyond_the_limit_do_not_lock_a_client_out() {
    for tls in [false, true] {
        let (waited, answer, stats) = idle_socket_storm(2, tls);
        assert_eq!(answer, Ok(HEALTH), "tls {tls}");
        assert!(
            waited < Duration::from_secs(30),
            "tls {tls}: served after {waited:?}"
        );
        assert!(stats.idle_evicted >= 1, "tls {tls}: {stats:?}");
        assert!(stats.connections_open <= 4, "tls {tls}: {stats:?}");
    }
}

/// The same seed gives the same run, to the simulated nanosecond, TLS
/// handshakes included.
#[test]
fn a_storm_replays_from_its_seed() {
    let show = |(waited, answer, stats): (Duration, Result<Response, Error>, ServerStats)| {
        format!("{waited:?} {answer:?} {stats:?}")
    };
    for tls in [false, true] {
        assert_eq!(
            show(idle_socket_storm(7, tls)),
            show(idle_socket_storm(7, tls))
        );
    }
}

/// A connection in the middle of a largest frame: busy, not idle, and
/// holding room in the frame budget.
async fn mid_frame() -> Box<dyn Stream> {
    let mut stream = raw_socket().await;
    stream.write_all(&(MAX as u32).to_be_bytes()).await.unwrap();
    stream
        .write_all(&[proto::PROTOCOL_VERSION, 0])
        .await
        .unwrap();
    // The simulated socket sends what was written on a flush.
    stream.flush().await.unwrap();
    stream
}

/// When every slot holds a connection mid-frame, a new one is refused
/// with `Overloaded`; once one closes, its slot serves the next.
#[test]
fn connections_beyond_the_limit_are_refused_when_none_is_idle() {
    simulate(3, || async move {
        let handle = start_server(Arc::new(Fake), options(2)).await;
        let client = client_machine();
        let busy = on(&client, async {
            vec![mid_frame().await, mid_frame().await]
        })
        .await;
        settled(&handle, |s| s.partial_frame_bytes >= 2 * MAX as u64).await;
        let refused = on(&client, async {
            let mut stream = raw_socket().await;
            let mut received = Vec::new();
            let _ = madsim::time::timeout(PATIENCE, stream.read_to_end(&mut received)).await;
            let mut reader = &received[..];
            let mut responses = Vec::new();
            while let Ok(Some(body)) = tcp::read_frame(&mut reader, MAX).await {
                responses.push(proto::decode::<Response>(&body, MAX).unwrap().body);
            }
            responses
        })
        .await;
        assert!(
            matches!(refused.as_slice(), [Response::Error(Error::Overloaded(_))]),
            "{refused:?}"
        );
        let mut busy = busy.into_iter();
        drop(busy.next());
        settled(&handle, |s| s.connections_open == 1).await;
        let answer = on(&client, async {
            connection().await.call(&Request::Healthcheck).await
        });
        assert_eq!(answer.await, Ok(HEALTH));
        drop(busy);
    })
}

/// With every slot idle, a new connection takes the slot of the one idle
/// longest, which is closed.
#[test]
fn a_new_connection_closes_the_one_idle_longest() {
    simulate(4, || async move {
        let handle = start_server(Arc::new(Fake), options(2)).await;
        let client = client_machine();
        let (first, second) = on(&client, async {
            let mut first = connection().await;
            assert_eq!(first.call(&Request::Healthcheck).await, Ok(HEALTH));
            madsim::time::sleep(Duration::from_millis(100)).await;
            let mut second = connection().await;
            assert_eq!(second.call(&Request::Healthcheck).await, Ok(HEALTH));
            (first, second)
        })
        .await;
        let third = on(&client, async {
            connection().await.call(&Request::Healthcheck).await
        });
        assert_eq!(third.await, Ok(HEALTH));
        assert_eq!(handle.stats().idle_evicted, 1);
        let (first, second) = on(&client, async move {
            let (mut first, mut second) = (first, second);
            (
                first.call(&Request::Healthcheck).await,
                second.call(&Request::Healthcheck).await,
            )
        })
        .await;
        assert!(first.is_err(), "the longest idle was closed: {first:?}");
        assert_eq!(second, Ok(HEALTH));
    })
}

/// Opens a connection that sends `sent` bytes of a frame claiming
/// `claimed`, then stalls; the socket stays open while the task runs.
async fn half_frame(claimed: usize, sent: usize) {
    let Ok(mut stream) = SimNet::default().connect(SERVER.to_string()).await else {
        return;
    };
    let mut bytes = (claimed as u32).to_be_bytes().to_vec();
    bytes.push(proto::PROTOCOL_VERSION);
    bytes.resize(4 + sent, 0);
    if stream.write_all(&bytes).await.is_ok() && stream.flush().await.is_ok() {
        let mut sink = Vec::new();
        let _ = stream.read_to_end(&mut sink).await;
    }
}

/// Forty connections each send half of a largest frame, 20 MiB claimed
/// against a 2 MiB budget: small requests are still answered while the
/// flood holds the budget, frames that found no room are refused when
/// their frame timeout is up and not before, and the bytes held never
/// pass the budget.
#[test]
fn a_half_frame_flood_stays_within_the_frame_budget() {
    simulate(5, || async move {
        let message_max = 1 << 20;
        let budget = 2 << 20;
        let frame_timeout = Duration::from_secs(5);
        let mut options = options(64);
        options.max_message_bytes = message_max;
        options.partial_frames_bytes_max = budget;
        options.frame_timeout = frame_timeout;
        let handle = start_server(Arc::new(Fake), options).await;
        let flood = client_machine();
        let started = Instant::now();
        for _ in 0..40 {
            flood.spawn(half_frame(message_max, message_max / 2));
        }
        settled(&handle, |s| s.partial_frame_bytes_peak >= budget as u64 / 2).await;
        let client = Handle::current()
            .create_node()
            .name("client-2")
            .ip(client_ip(2))
            .build();
        let answers = on(&client, async {
            let mut connection = connection().await;
            let mut answers = Vec::new();
            for _ in 0..3 {
                answers.push(connection.call(&Request::Healthcheck).await);
            }
            answers
        })
        .await;
        assert_eq!(answers, vec![Ok(HEALTH); 3]);
        let stats = handle.stats();
        assert_eq!(stats.partial_frames_refused, 0, "{stats:?}");
        assert!(stats.partial_frame_bytes >= budget as u64 / 2, "{stats:?}");
        settled(&handle, |s| s.partial_frames_refused > 0).await;
        assert!(
            started.elapsed() >= frame_timeout,
            "refused after {:?}",
            started.elapsed()
        );
        let stats = handle.stats();
        assert!(stats.partial_frame_bytes_peak <= budget as u64, "{stats:?}");
        assert!(stats.partial_frame_bytes <= budget as u64, "{stats:?}");
    })
}

/// A transport from replica 1 to a gated server as peer 2, its config
/// adjusted by `adjust`, on the simulated network and clock.
fn gated_transport(adjust: impl FnOnce(&mut Config)) -> Arc<TcpTransport> {
    transport_in(adjust, Kernels::default())
}

/// `gated_transport`, dialling with the streams entered in `kernels`.
fn transport_in(adjust: impl FnOnce(&mut Config), kernels: Kernels) -> Arc<TcpTransport> {
    let mut config = Config::default_for_test(1);
    config
        .node
        .peers
        .push(PeerConfig::new(2, SERVER.to_string()));
    adjust(&mut config);
    let dialer = Dialer::plaintext(
        config.limits.connect_timeout,
        config.limits.max_message_bytes,
    );
    let transport = TcpTransport::with_dialer(&config, dialer);
    Arc::new(transport.with_net(Arc::new(SimNet::new(kernels)), clock()))
}

/// Calls held by the gate until `calls` arrived; the tasks holding them.
async fn hold(
    client: &NodeHandle,
    gate: &Gate,
    transport: &Arc<TcpTransport>,
    calls: usize,
) -> Vec<madsim::task::JoinHandle<Result<Response, Error>>> {
    let held = (0..calls)
        .map(|_| {
            let t = transport.clone();
            client.spawn(async move { t.call(2, Request::Healthcheck, PATIENCE).await })
        })
        .collect();
    let mut arrived = gate.arrived.subscribe();
    madsim::time::timeout(PATIENCE, arrived.wait_for(|&n| n >= calls))
        .await
        .expect("the calls arrive")
        .expect("the gate is alive");
    held
}

/// With its share of calls to a peer in flight, a transport's next call
/// waits for a slot, never reaches the peer, and fails at its own
/// deadline to the millisecond; slots given back serve the next call.
/// The share comes from `limits.max_connections`, or is set directly.
#[test]
fn a_transport_caps_its_calls_in_flight_per_peer() {
    for (set, share) in [(None, 2), (Some(1), 1)] {
        simulate(6, move || async move {
            let gate = Gate::new();
            let _server = start_server(gate.clone(), options(256)).await;
            let mut transport = gated_transport(|config| {
                config.limits.max_connections = 4;
                assert_eq!(tcp::client_share(config), 2);
            });
            if let Some(calls) = set {
                let own = Arc::try_unwrap(transport).ok().expect("one owner");
                transport = Arc::new(own.with_calls_per_peer(calls));
            }
            let client = client_machine();
            let held = hold(&client, &gate, &transport, share).await;
            let deadline = Duration::from_millis(200);
            let waited = {
                let t = transport.clone();
                on(&client, async move {
                    let asked = Instant::now();
                    let answer = t.call(2, Request::Healthcheck, deadline).await;
                    (answer, asked.elapsed())
                })
                .await
            };
            assert_eq!(waited.0, Err(Error::Timeout));
            assert!(waited.1 >= deadline, "gave up after {:?}", waited.1);
            assert!(
                waited.1 < deadline + Duration::from_millis(10),
                "{:?}",
                waited.1
            );
            assert_eq!(*gate.arrived.borrow(), share);
            gate.release.add_permits(share + 1);
            for call in held {
                assert_eq!(call.await.unwrap(), Ok(Response::Done));
            }
            let t = transport.clone();
            let next = on(&client, async move {
                t.call(2, Request::Healthcheck, PATIENCE).await
            });
            assert_eq!(next.await, Ok(Response::Done));
        })
    }
}

/// Counts the requests it carried out; answers each at once.
struct Counting {
    ran: watch::Sender<usize>,
}

impl Handler for Counting {
    fn handle<'a>(&'a self, _caller: &'a Caller, request: Request) -> BoxFuture<'a, Response> {
        Box::pin(async move {
            self.ran.send_modify(|n| *n += 1);
            match request {
                Request::Healthcheck => HEALTH,
                _ => Response::Done,
            }
        })
    }
}

/// The server's address as the machine the faults strike.
fn server_ip() -> std::net::IpAddr {
    SERVER.parse::<SocketAddr>().unwrap().ip()
}

/// What a fault against a pooled connection did to the transport's next
/// call (a write, `Remove`, which the transport never sends twice) and to
/// the server.
struct AfterFault {
    /// Stream ends the fault struck.
    struck: usize,
    outcome: Result<Response, Error>,
    /// Simulated time the call took.
    took: Duration,
    /// Requests the server ran, the call before the fault included.
    ran: usize,
    /// Simulated time from the fault until the server held no connection
    /// but those the transport pools.
    freed: Duration,
    stats: ServerStats,
    /// Connections the transport dialled, for both calls.
    opened: u64,
}

/// Strikes `fault` at the server's machine once a call has left its
/// connection in the transport's pool, then makes the next call.
fn call_after_fault(seed: u64, fault: StreamFault, idle_timeout: Duration) -> AfterFault {
    simulate(seed, || async move {
        let kernels = Kernels::default();
        let ran = watch::channel(0).0;
        let seen = ran.subscribe();
        let handler = Arc::new(Counting { ran });
        let options = ServerOptions {
            idle_timeout,
            ..options(4)
        };
        let handle = start_server_in(handler, options, None, kernels.clone()).await;
        let transport = transport_in(|_| {}, kernels.clone());
        let client = client_machine();
        let t = transport.clone();
        let first = on(&client, async move {
            t.call(2, Request::Healthcheck, PATIENCE).await
        });
        assert_eq!(first.await, Ok(HEALTH));
        assert_eq!(transport.idle_connections(2), 1, "the connection is pooled");
        let struck_at = Instant::now();
        let struck = kernels.strike(server_ip(), fault);
        let write = Request::Remove {
            tree: arbor::TreeKey::new(arbor::ContainerId([1; 32]), "t"),
            node: 7,
        };
        let t = transport.clone();
        let outcome = on(&client, async move {
            t.call(2, write, Duration::from_millis(300)).await
        })
        .await;
        let took = struck_at.elapsed();
        // The server holds no connection but those the transport pools.
        let pooled = transport.idle_connections(2) as u64;
        settled(&handle, |s| s.connections_open == pooled).await;
        let freed = struck_at.elapsed();
        let ran = *seen.borrow();
        AfterFault {
            struck,
            outcome,
            took,
            ran,
            freed,
            stats: handle.stats(),
            opened: transport.connections_opened(),
        }
    })
}

/// A reset connection is seen to be closed before the next call goes out
/// on it: the call, a write, takes a fresh connection and runs once, and
/// the reset connection's slot comes back at once. The transport used to
/// write on it and fail the call with a network error, its outcome
/// unknown to the caller though the request never left.
#[test]
fn a_reset_pooled_connection_is_not_used_and_frees_its_slot() {
    let after = call_after_fault(41, StreamFault::Reset, Duration::from_secs(60));
    assert_eq!(after.struck, 2, "both ends of the one connection");
    assert_eq!(after.outcome, Ok(Response::Done));
    assert!(after.took < Duration::from_millis(50), "{:?}", after.took);
    assert_eq!(after.ran, 2, "the write ran, once");
    assert!(after.freed < Duration::from_millis(50), "{:?}", after.freed);
    assert_eq!(after.opened, 2, "a fresh connection for the write");
}

/// A pooled connection the server closed to make room for another (its
/// only slot, the connection idle longest) carries no further call: the
/// next write takes a fresh connection and runs once. The transport used
/// to write on the closed one and fail the call with a network error.
#[test]
fn a_pooled_connection_the_server_evicted_is_not_used() {
    simulate(44, || async move {
        let ran = watch::channel(0).0;
        let seen = ran.subscribe();
        let handle = start_server(Arc::new(Counting { ran }), options(1)).await;
        let transport = gated_transport(|_| {});
        let client = client_machine();
        let t = transport.clone();
        let first = on(&client, async move {
            t.call(2, Request::Healthcheck, PATIENCE).await
        });
        assert_eq!(first.await, Ok(HEALTH));
        assert_eq!(transport.idle_connections(2), 1, "the connection is pooled");
        // Another connection takes the only slot; the pooled one is closed.
        let other = on(&client, async {
            connection().await.call(&Request::Healthcheck).await
        });
        assert_eq!(other.await, Ok(HEALTH));
        assert_eq!(handle.stats().idle_evicted, 1);
        madsim::time::sleep(Duration::from_millis(10)).await;
        let write = Request::Remove {
            tree: arbor::TreeKey::new(arbor::ContainerId([1; 32]), "t"),
            node: 7,
        };
        let t = transport.clone();
        let outcome = on(&client, async move { t.call(2, write, PATIENCE).await }).await;
        assert_eq!(outcome, Ok(Response::Done));
        assert_eq!(*seen.borrow(), 3, "each call ran once");
        assert_eq!(transport.connections_opened(), 2);
    })
}

/// A reset on answer lets the request run and breaks the connection as
/// the answer goes out: the write ran once, its caller heard an error,
/// and, a write, it was not sent again on a fresh connection.
#[test]
fn a_reset_on_answer_runs_the_write_once_and_fails_its_caller() {
    let after = call_after_fault(42, StreamFault::ResetOnAnswer, Duration::from_secs(60));
    assert_eq!(after.struck, 1, "the accepted end only");
    assert!(
        matches!(after.outcome, Err(Error::Network(_))),
        "{:?}",
        after.outcome
    );
    assert!(after.took < Duration::from_millis(50), "{:?}", after.took);
    assert_eq!(after.ran, 2, "the write ran, once");
    assert!(after.freed < Duration::from_millis(50), "{:?}", after.freed);
}

/// A half-open connection answers nothing: the call ends at its deadline
/// to the millisecond, and the server closes its end when its idle
/// timeout is up, not before, giving its slot back.
#[test]
fn a_half_open_connection_ends_the_call_at_its_deadline_and_idles_out() {
    let idle_timeout = Duration::from_secs(2);
    let after = call_after_fault(43, StreamFault::Silence, idle_timeout);
    assert_eq!(after.struck, 2);
    assert_eq!(after.outcome, Err(Error::Timeout));
    let deadline = Duration::from_millis(300);
    let within = after.took >= deadline && after.took < deadline + Duration::from_millis(1);
    assert!(within, "{:?}", after.took);
    assert_eq!(after.ran, 1, "the request never arrived");
    // Idle since the first answer, a few simulated milliseconds before
    // the fault; `settled` looks every 10 ms.
    let early = idle_timeout - Duration::from_millis(50);
    let late = idle_timeout + Duration::from_millis(10);
    assert!(
        after.freed > early && after.freed <= late,
        "{:?}",
        after.freed
    );
    assert_eq!(after.stats.idle_closed, 1);
}

/// A server whose process stalls past its idle timeout (the nemesis's
/// pause): a call made meanwhile ends at its deadline, to the
/// millisecond; when the process goes on, the idle timers that fell due
/// fire at once and close the connections idle since before the stall,
/// giving their slots back; the pool sees its connection closed and the
/// next call is served on a fresh one.
#[test]
fn a_server_stalled_past_its_idle_timeout_closes_its_idle_connections() {
    simulate(45, || async move {
        let idle_timeout = Duration::from_secs(2);
        let options = ServerOptions {
            idle_timeout,
            ..options(4)
        };
        let (handle, machine) =
            start_server_on(Arc::new(Fake), options, None, Kernels::default()).await;
        let transport = gated_transport(|_| {});
        let client = client_machine();
        let call = |deadline: Duration| {
            let t = transport.clone();
            on(&client, async move {
                let began = Instant::now();
                (
                    t.call(2, Request::Healthcheck, deadline).await,
                    began.elapsed(),
                )
            })
        };
        assert_eq!(call(PATIENCE).await.0, Ok(HEALTH));
        assert_eq!(handle.stats().connections_open, 1);

        Handle::current().pause(machine);
        let deadline = Duration::from_millis(300);
        let (stalled, took) = call(deadline).await;
        assert_eq!(stalled, Err(Error::Timeout));
        assert!(
            took >= deadline && took < deadline + Duration::from_millis(1),
            "{took:?}"
        );
        madsim::time::sleep(idle_timeout).await;
        assert_eq!(handle.stats().idle_closed, 0, "nothing ran while stalled");
        Handle::current().resume(machine);

        settled(&handle, |s| s.connections_open == 0).await;
        assert!(handle.stats().idle_closed >= 1, "{:?}", handle.stats());
        let (after, _) = call(PATIENCE).await;
        assert_eq!(after, Ok(HEALTH));
        assert_eq!(transport.connections_opened(), 2);
    })
}

/// Answers every request with an error carrying `ANSWER_TEXT_BYTES`
/// bytes of text: an answer several windows long.
struct Long;

const ANSWER_TEXT_BYTES: usize = 20_000;

impl Handler for Long {
    fn handle<'a>(&'a self, _caller: &'a Caller, _request: Request) -> BoxFuture<'a, Response> {
        Box::pin(async move { Response::Error(Error::InvalidOp("x".repeat(ANSWER_TEXT_BYTES))) })
    }
}

/// A call with a request and an answer each longer than the connections'
/// window; the writes that found the window full.
fn long_call(window: Option<usize>) -> (Result<Response, Error>, u64) {
    simulate(17, || async move {
        let kernels = Kernels::default();
        kernels.set_window(window);
        start_server_in(Arc::new(Long), options(4), None, kernels.clone()).await;
        let net = SimNet::new(kernels.clone());
        let answer = on(&client_machine(), async move {
            let dialer = Dialer::plaintext(PATIENCE, MAX);
            let mut connection = Connection::open_via(&net, &*clock(), SERVER, None, &dialer)
                .await
                .expect("connects");
            let request = Request::Hello {
                cluster_id: "c".repeat(10_000),
                replica_id: None,
            };
            connection.call(&request).await
        })
        .await;
        (answer, kernels.writes_stalled())
    })
}

/// With a window of 4 KiB a 10 KB request and a 20 KB answer go in parts,
/// their writers waiting for the reader, and arrive whole; without one
/// no write waits.
#[test]
fn frames_longer_than_the_window_go_in_parts_and_arrive_whole() {
    let long = Response::Error(Error::InvalidOp("x".repeat(ANSWER_TEXT_BYTES)));
    let (answer, stalled) = long_call(Some(4 << 10));
    assert_eq!(answer, Ok(long.clone()));
    assert!(stalled >= 4, "writes that waited: {stalled}");
    let (answer, stalled) = long_call(None);
    assert_eq!(answer, Ok(long));
    assert_eq!(stalled, 0);
}

/// A client that sends requests without end and never reads an answer
/// fills its connection's window; the server's next answer then waits,
/// and the connection is closed when the frame timeout is up, not before,
/// its slot given back while the client still holds its socket. Another
/// client is served while the answer waits.
#[test]
fn answers_never_read_close_their_connection_at_the_frame_timeout() {
    simulate(23, || async move {
        let window = 4 << 10;
        let kernels = Kernels::default();
        kernels.set_window(Some(window));
        let frame_timeout = Duration::from_secs(5);
        let options = ServerOptions {
            frame_timeout,
            idle_timeout: Duration::from_secs(60),
            ..options(2)
        };
        let handle = start_server_in(Arc::new(Fake), options, None, kernels.clone()).await;
        let net = SimNet::new(kernels.clone());
        let frame = tcp::encode_frame(0, &Request::Healthcheck).unwrap();
        let burst = frame.as_bytes().repeat(8 * window / frame.as_bytes().len());
        let started = Instant::now();
        let (held, holding) = oneshot::channel::<()>();
        client_machine().spawn(async move {
            let mut stream = net.connect(SERVER.to_string()).await.expect("connects");
            let _ = stream.write_all(&burst).await;
            let _ = holding.await;
            drop(stream);
        });
        while kernels.writes_stalled() == 0 {
            assert!(started.elapsed() < frame_timeout, "no write waited");
            madsim::time::sleep(Duration::from_millis(1)).await;
        }
        let other = Handle::current()
            .create_node()
            .name("client-2")
            .ip(client_ip(2))
            .build();
        let net = SimNet::new(kernels.clone());
        let answer = on(&other, async move {
            let dialer = Dialer::plaintext(PATIENCE, MAX);
            let clock = clock();
            let connection = Connection::open_via(&net, &*clock, SERVER, None, &dialer);
            connection
                .await
                .expect("connects")
                .call(&Request::Healthcheck)
                .await
        });
        assert_eq!(answer.await, Ok(HEALTH));
        assert_eq!(handle.stats().answers_timed_out, 0);
        settled(&handle, |s| s.answers_timed_out == 1).await;
        let closed_after = started.elapsed();
        assert!(
            closed_after >= frame_timeout,
            "closed after {closed_after:?}"
        );
        assert!(
            closed_after < frame_timeout + Duration::from_secs(1),
            "closed after {closed_after:?}"
        );
        settled(&handle, |s| s.connections_open == 0).await;
        drop(held);
    })
}
