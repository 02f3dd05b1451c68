//! The TCP frame layer against hostile input: oversized, truncated, garbage
//! and lying frames get an error response or a clean close, and the server
//! keeps serving everyone else. Runs on real sockets on 127.0.0.1: the
//! production runtime's smoke test. The limits that play out over time
//! (idle timeout, connection slots, the frame budget, calls in flight per
//! peer) are tested on simulated time in `sim-tests/tests/sim_tcp_limits.rs`.

use arbor::config::Config;
use arbor::net::Transport;
use arbor::proto::{self, Request, Response};
use arbor::runtime::BoxFuture;
use arbor::tcp::{self, Connection, Dialer, Handler, ServerOptions, TcpTransport};
use arbor::{Caller, ContainerId, Error, TreeKey, ROOT};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MAX: usize = 64 * 1024;
/// Bounds every wait of these tests; none is expected to come close.
const PATIENCE: Duration = Duration::from_secs(20);

struct Fake;

impl Handler for Fake {
    fn handle<'a>(&'a self, _caller: &'a Caller, request: Request) -> BoxFuture<'a, Response> {
        Box::pin(async move {
            match request {
                Request::Healthcheck => Response::Health {
                    replica_id: 9,
                    log_epoch: 0,
                },
                Request::TreeList { .. } => Response::Trees(vec!["x".repeat(MAX)]),
                Request::GetOpLog { .. } => futures::future::pending().await,
                _ => Response::Error(Error::InvalidOp("fake".into())),
            }
        })
    }
}

async fn start(max_connections: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(tcp::serve(
        listener,
        Arc::new(Fake),
        options(max_connections),
    ));
    address
}

fn options(max_connections: usize) -> ServerOptions {
    ServerOptions {
        max_message_bytes: MAX,
        max_connections,
        frame_timeout: Duration::from_secs(5),
        ..ServerOptions::from_config(&Config::default_for_test(9))
    }
}

async fn connect(address: SocketAddr) -> Connection {
    Connection::connect(&address.to_string(), PATIENCE, MAX)
        .await
        .unwrap()
}

async fn healthy(address: SocketAddr) {
    let mut connection = connect(address).await;
    let response = tokio::time::timeout(PATIENCE, connection.call(&Request::Healthcheck))
        .await
        .unwrap();
    assert_eq!(
        response,
        Ok(Response::Health {
            replica_id: 9,
            log_epoch: 0
        })
    );
}

/// Sends raw bytes, then reads until the server closes: the frames it sent
/// back, decoded.
async fn raw_exchange(address: SocketAddr, bytes: &[u8], close_write: bool) -> Vec<Response> {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    if close_write {
        stream.shutdown().await.unwrap();
    }
    let mut received = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut received))
        .await
        .expect("server must close the connection")
        .ok();
    let mut responses = Vec::new();
    let mut reader = &received[..];
    while let Ok(Some(body)) = tcp::read_frame(&mut reader, MAX).await {
        responses.push(proto::decode::<Response>(&body, MAX).unwrap().body);
    }
    responses
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_round_trip_on_one_connection() {
    let address = start(8).await;
    let mut connection = connect(address).await;
    for _ in 0..3 {
        assert_eq!(
            connection.call(&Request::Healthcheck).await,
            Ok(Response::Health {
                replica_id: 9,
                log_epoch: 0
            })
        );
    }
    let other = Request::Remove {
        tree: arbor::TreeKey::new(ContainerId([1; 32]), "t"),
        node: 5,
    };
    assert_eq!(
        connection.call(&other).await,
        Ok(Response::Error(Error::InvalidOp("fake".into())))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frames_are_refused_without_reading_them() {
    let address = start(8).await;
    for claimed in [MAX as u32 + 1, u32::MAX] {
        // Only the header is sent: the claimed body is never waited for.
        let responses = raw_exchange(address, &claimed.to_be_bytes(), false).await;
        assert!(
            matches!(
                responses.as_slice(),
                [Response::Error(Error::TooLarge { .. })]
            ),
            "{claimed}: {responses:?}"
        );
    }
    healthy(address).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_frames_are_refused() {
    let address = start(8).await;
    let body = proto::encode(1, &Request::Healthcheck);
    let whole = frame(&body);
    for cut in [1, 3, 4, whole.len() - 1] {
        let responses = raw_exchange(address, &whole[..cut], true).await;
        assert!(
            matches!(responses.as_slice(), [Response::Error(Error::Malformed(_))]),
            "cut at {cut}: {responses:?}"
        );
    }
    healthy(address).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_gets_an_error_and_a_close() {
    let address = start(8).await;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut garbage = Vec::new();
    for _ in 0..200 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        garbage.push(seed as u8);
    }
    let cases: Vec<Vec<u8>> = vec![
        frame(&garbage),
        frame(&[]),
        frame(&[proto::PROTOCOL_VERSION + 1, 0, 0]),
        // A valid request followed by trailing junk inside the same frame.
        frame(&[proto::encode(1, &Request::Healthcheck), vec![1, 2, 3]].concat()),
    ];
    for bytes in cases {
        let responses = raw_exchange(address, &bytes, false).await;
        assert!(
            matches!(responses.as_slice(), [Response::Error(Error::Malformed(_))]),
            "{responses:?}"
        );
    }
    // A valid frame after garbage on another connection is served.
    healthy(address).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_request_before_garbage_is_answered() {
    let address = start(8).await;
    let good = frame(&proto::encode(5, &Request::Healthcheck));
    let bytes = [good, frame(b"\x01\xff\xff\xff")].concat();
    let responses = raw_exchange(address, &bytes, false).await;
    assert_eq!(responses.len(), 2, "{responses:?}");
    assert_eq!(
        responses[0],
        Response::Health {
            replica_id: 9,
            log_epoch: 0
        }
    );
    assert!(matches!(responses[1], Response::Error(Error::Malformed(_))));
}

/// Both ends read through a buffer (`tcp::READ_BUFFER_BYTES`): one read
/// may take several frames, and none of the bytes past the first frame
/// may be lost or reordered. Here twenty requests arrive in one write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_sent_back_to_back_are_all_answered_in_order() {
    let address = start(8).await;
    let mut stream = TcpStream::connect(address).await.unwrap();
    let ids: Vec<u64> = (100..120).collect();
    let bytes: Vec<u8> = ids
        .iter()
        .flat_map(|&id| frame(&proto::encode(id, &Request::Healthcheck)))
        .collect();
    stream.write_all(&bytes).await.unwrap();
    stream.shutdown().await.unwrap();
    let mut received = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut received))
        .await
        .expect("server must close the connection")
        .unwrap();
    let mut reader = &received[..];
    let mut answered = Vec::new();
    while let Some(body) = tcp::read_frame(&mut reader, MAX).await.unwrap() {
        let envelope = proto::decode::<Response>(&body, MAX).unwrap();
        assert!(
            matches!(envelope.body, Response::Health { .. }),
            "{envelope:?}"
        );
        answered.push(envelope.id);
    }
    assert_eq!(answered, ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_responses_become_errors() {
    let address = start(8).await;
    let mut connection = connect(address).await;
    let response = connection
        .call(&Request::TreeList {
            cid: ContainerId([0; 32]),
        })
        .await;
    assert!(
        matches!(response, Ok(Response::Error(Error::TooLarge { .. }))),
        "{response:?}"
    );
    // The connection stays usable: the error replaced the answer in step.
    assert_eq!(
        connection.call(&Request::Healthcheck).await,
        Ok(Response::Health {
            replica_id: 9,
            log_epoch: 0
        })
    );
}

fn transport_to(address: SocketAddr) -> TcpTransport {
    let mut config = Config::default_for_test(1);
    config
        .node
        .peers
        .push(arbor::config::PeerConfig::new(2, address.to_string()));
    config.limits.max_message_bytes = MAX;
    config.limits.max_meta_bytes = 1024;
    plaintext_transport(&config)
}

/// A transport that skips `Hello`: these servers answer nothing else.
fn plaintext_transport(config: &Config) -> TcpTransport {
    let dialer = Dialer::plaintext(
        config.limits.connect_timeout,
        config.limits.max_message_bytes,
    );
    TcpTransport::with_dialer(config, dialer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transport_calls_time_out_and_name_unknown_peers() {
    let address = start(8).await;
    let transport = transport_to(address);
    let ok = transport.call(2, Request::Healthcheck, PATIENCE).await;
    assert_eq!(
        ok,
        Ok(Response::Health {
            replica_id: 9,
            log_epoch: 0
        })
    );
    let tree = arbor::TreeKey::new(ContainerId([1; 32]), "t");
    let request = Request::GetOpLog {
        tree,
        from_height: 0,
        limit: 1,
    };
    assert_eq!(
        transport.call(2, request, Duration::from_millis(100)).await,
        Err(Error::Timeout)
    );
    assert!(matches!(
        transport.call(3, Request::Healthcheck, PATIENCE).await,
        Err(Error::Network(_))
    ));
    // A call after a timed-out one still works (the broken connection was
    // not returned to the pool).
    assert_eq!(
        transport.call(2, Request::Healthcheck, PATIENCE).await,
        Ok(Response::Health {
            replica_id: 9,
            log_epoch: 0
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transport_survives_a_closed_pooled_connection() {
    // A server that answers one request per connection, then closes it: the
    // pooled connection is stale on the next call.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                if let Ok(Some(body)) = tcp::read_frame(&mut stream, MAX).await {
                    let id = proto::decode::<Request>(&body, MAX).unwrap().id;
                    let answer = tcp::encode_frame(
                        id,
                        &Response::Health {
                            replica_id: 4,
                            log_epoch: 0,
                        },
                    )
                    .unwrap();
                    tcp::write_frame(&mut stream, &answer).await.unwrap();
                }
            });
        }
    });
    let transport = transport_to(address);
    for _ in 0..3 {
        assert_eq!(
            transport.call(2, Request::Healthcheck, PATIENCE).await,
            Ok(Response::Health {
                replica_id: 4,
                log_epoch: 0
            })
        );
    }
}

/// A client write whose pooled connection breaks after the request left
/// is not sent again on a fresh one: it reached the peer, so its caller
/// hears the error (an unknown outcome), where a retry could store it
/// twice or be answered by a process that never saw it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_pooled_connection_breaks_is_not_sent_again() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let arrived = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = arrived.clone();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let seen = seen.clone();
            tokio::spawn(async move {
                // Answers the first request of a connection; takes the
                // second and closes the connection without answering.
                for answered in [true, false] {
                    let Ok(Some(body)) = tcp::read_frame(&mut stream, MAX).await else {
                        return;
                    };
                    let id = proto::decode::<Request>(&body, MAX).unwrap().id;
                    seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if answered {
                        let answer = tcp::encode_frame(id, &Response::Added { node: 7 }).unwrap();
                        tcp::write_frame(&mut stream, &answer).await.unwrap();
                    }
                }
            });
        }
    });
    let transport = transport_to(address);
    let add = || Request::Add {
        tree: TreeKey::new(ContainerId([1; 32]), "t"),
        parent: ROOT,
        items: Vec::new(),
    };
    let count = || arrived.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        transport.call(2, add(), PATIENCE).await,
        Ok(Response::Added { node: 7 })
    );
    assert_eq!(count(), 1);
    // The pooled connection takes the write and breaks: it fails, unsent
    // again.
    let failed = transport.call(2, add(), PATIENCE).await;
    assert!(matches!(failed, Err(Error::Network(_))), "{failed:?}");
    assert_eq!(count(), 2, "the write arrived once");
    // The failed connection left the pool: the next call dials anew.
    assert_eq!(
        transport.call(2, add(), PATIENCE).await,
        Ok(Response::Added { node: 7 })
    );
    assert_eq!(count(), 3);
    assert_eq!(transport.connections_opened(), 2);
}

/// Holds every request until released; counts what arrived.
struct Gate {
    arrived: tokio::sync::watch::Sender<usize>,
    release: tokio::sync::Semaphore,
}

impl Gate {
    /// Waits until `calls` requests arrived.
    async fn reached(&self, calls: usize) {
        let mut arrived = self.arrived.subscribe();
        let reached = arrived.wait_for(|&n| n >= calls);
        tokio::time::timeout(PATIENCE, reached)
            .await
            .expect("the calls arrive")
            .expect("the gate is alive");
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

/// A gated server on 127.0.0.1 and a transport from replica 1 to it (as
/// peer 2), with the transport's config adjusted by `adjust`.
async fn gated_transport(adjust: impl FnOnce(&mut Config)) -> (Arc<Gate>, Arc<TcpTransport>) {
    let gate = Arc::new(Gate {
        arrived: tokio::sync::watch::channel(0).0,
        release: tokio::sync::Semaphore::new(0),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(tcp::serve(listener, gate.clone(), options(256)));
    let mut config = Config::default_for_test(1);
    config
        .node
        .peers
        .push(arbor::config::PeerConfig::new(2, address.to_string()));
    adjust(&mut config);
    (gate, Arc::new(plaintext_transport(&config)))
}

/// Starts `calls` concurrent calls through a transport whose connection
/// cache holds `cache_size`, lets all of them finish, and returns how many
/// idle connections the transport kept.
async fn idle_after_concurrent_calls(cache_size: usize, calls: usize) -> usize {
    let (gate, transport) = gated_transport(|config| {
        config.tree.cache_size = cache_size;
        config.limits.max_connections = 256;
    })
    .await;
    let held: Vec<_> = (0..calls)
        .map(|_| {
            let t = transport.clone();
            tokio::spawn(async move { t.call(2, Request::Healthcheck, PATIENCE).await })
        })
        .collect();
    // Every call holds its own connection until the gate opens.
    gate.reached(calls).await;
    gate.release.add_permits(calls);
    for h in held {
        assert_eq!(h.await.unwrap(), Ok(Response::Done));
    }
    transport.idle_connections(2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transport_keeps_at_most_cache_size_idle_connections() {
    assert_eq!(idle_after_concurrent_calls(2, 5).await, 2);
    assert_eq!(idle_after_concurrent_calls(15, 5).await, 5);
    assert_eq!(idle_after_concurrent_calls(0, 3).await, 0);
}

/// With the default `tree.cache_size` a burst of as many calls as a client
/// may have in flight to one node leaves all their connections pooled for
/// the next burst; a 3-replica node's share of a peer is smaller still.
/// Regression: the default kept 15, so every burst above 15 calls closed
/// the rest, and the load gateway at 10,000/s dialled a new connection
/// for about a quarter of its calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_pool_keeps_a_full_burst_of_connections() {
    let mut three = Config::default_for_test(1);
    for peer in [2, 3] {
        three.node.peers.push(arbor::config::PeerConfig::new(
            peer,
            format!("127.0.0.1:{peer}"),
        ));
    }
    let burst = tcp::client_share(&three);
    assert_eq!((burst, tcp::outbound_share(&three)), (128, 64));
    let cache_size = three.tree.cache_size;
    assert!(
        cache_size >= burst,
        "tree.cache_size {cache_size} < {burst}"
    );
    assert_eq!(idle_after_concurrent_calls(cache_size, burst).await, burst);
}

/// `connections_opened` counts dials: sequential calls reuse one idle
/// connection; without idle connections kept, each call dials. The
/// per-peer overrides replace what the config gave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transport_counts_the_connections_it_opens() {
    let address = start(8).await;
    let reusing = transport_to(address).with_idle_per_peer(1);
    let dialling = transport_to(address).with_idle_per_peer(0);
    for _ in 0..4 {
        let health = Ok(Response::Health {
            replica_id: 9,
            log_epoch: 0,
        });
        assert_eq!(
            reusing.call(2, Request::Healthcheck, PATIENCE).await,
            health
        );
        assert_eq!(
            dialling.call(2, Request::Healthcheck, PATIENCE).await,
            health
        );
    }
    assert_eq!((reusing.calls(), reusing.connections_opened()), (4, 1));
    assert_eq!((dialling.calls(), dialling.connections_opened()), (4, 4));
    assert_eq!(dialling.idle_connections(2), 0);
}

/// A frame encoded in place behind its header carries exactly the body
/// `proto::encode` makes, and reads back whole: the size counted before
/// encoding is the size written, for a small request and for a page of
/// ops large enough to have grown a buffer many times.
#[tokio::test]
async fn a_frame_encoded_in_place_is_the_header_and_the_encoded_body() {
    let op = |i: u64| arbor::Move {
        parent: 1,
        meta: arbor::Meta {
            time: i,
            items: vec![arbor::KeyValue::new("FileName", format!("object-{i:08}"))],
        },
        child: i,
    };
    let small = Request::Healthcheck;
    let big = Request::Apply {
        tree: arbor::TreeKey::new(ContainerId([1; 32]), "t"),
        ops: (1..=2000).map(op).collect(),
    };
    for (id, request) in [(3, &small), (9, &big)] {
        let body = proto::encode(id, request);
        let frame = tcp::encode_frame(id, request).unwrap();
        assert_eq!(frame.body_len(), body.len());
        let header = u32::try_from(body.len()).unwrap().to_be_bytes();
        assert_eq!(frame.as_bytes(), [&header[..], &body].concat());
        let mut written = Vec::new();
        tcp::write_frame(&mut written, &frame).await.unwrap();
        let read = tcp::read_frame(&mut written.as_slice(), usize::MAX).await;
        assert_eq!(read.unwrap(), Some(body));
    }
}
