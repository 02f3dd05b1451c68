//! Mutual TLS and `Hello` over loopback: who a certificate names is who
//! the handler is told is calling; certificates of another CA, expired
//! ones and ones naming the wrong replica or cluster are refused; two
//! nodes with one replica id, or of two clusters, refuse each other on
//! both sides. Certificates are made in memory for each test.

use arbor::certs::{self, Issued, Validity};
use arbor::config::{Config, PeerConfig};
use arbor::forest::Forest;
use arbor::net::Transport;
use arbor::proto::{Request, Response};
use arbor::runtime::BoxFuture;
use arbor::service::Service;
use arbor::system::system_env;
use arbor::tcp::{Connection, Dialer, Handler, Server, ServerHandle, ServerOptions, TcpTransport};
use arbor::tls::{CertIdentity, PemFiles, TlsContext};
use arbor::{Caller, Error, ReplicaId};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::net::TcpListener;

/// Bounds every wait; none is expected to come close.
const PATIENCE: Duration = Duration::from_secs(20);
const MAX: usize = 1 << 20;
const CLUSTER: &str = "test";
/// The replica every test server is; its configured peers are 2 and 3.
const SERVER_ID: ReplicaId = 1;

fn valid() -> Validity {
    Validity::days_from_now(1)
}

fn expired() -> Validity {
    let now = SystemTime::now();
    Validity {
        not_before: now - Duration::from_secs(10 * 86_400),
        not_after: now - Duration::from_secs(86_400),
    }
}

fn replica(cluster: &str, replica_id: ReplicaId) -> CertIdentity {
    CertIdentity::Replica {
        cluster_id: cluster.into(),
        replica_id,
    }
}

fn client(name: &str) -> CertIdentity {
    CertIdentity::Client {
        cluster_id: CLUSTER.into(),
        name: name.into(),
    }
}

fn new_ca() -> Issued {
    certs::create_ca(CLUSTER, valid()).unwrap()
}

/// A TLS context trusting `trust` for a certificate `signer` issues.
fn context(trust: &Issued, signer: &Issued, who: &CertIdentity, when: Validity) -> Arc<TlsContext> {
    let issued = certs::issue(signer, who, when).unwrap();
    let pem = PemFiles {
        ca: trust.cert_pem.as_bytes(),
        cert: issued.cert_pem.as_bytes(),
        key: issued.key_pem.as_bytes(),
    };
    Arc::new(TlsContext::from_pem(&pem).unwrap())
}

/// Remembers every caller it is handed; answers `Hello` as the service
/// does and everything else with `Health`.
struct Recorder {
    config: Config,
    callers: Mutex<Vec<Caller>>,
}

impl Handler for Recorder {
    fn handle<'a>(&'a self, caller: &'a Caller, request: Request) -> BoxFuture<'a, Response> {
        self.callers.lock().unwrap().push(caller.clone());
        let response = match request {
            Request::Hello {
                cluster_id,
                replica_id,
            } => arbor::service::hello::answer(&self.config.node, caller, &cluster_id, replica_id)
                .unwrap_or_else(Response::Error),
            _ => Response::Health {
                replica_id: self.config.node.replica_id,
                log_epoch: 0,
            },
        };
        Box::pin(async move { response })
    }
}

fn server_config(cluster: &str, id: ReplicaId, peers: &[(ReplicaId, String)]) -> Config {
    let mut config = Config::default_for_test(id);
    config.node.cluster_id = cluster.into();
    config.node.peers = peers
        .iter()
        .map(|(replica_id, address)| PeerConfig::new(*replica_id, address.clone()))
        .collect();
    config.limits.max_message_bytes = MAX;
    config
}

struct TestServer {
    address: SocketAddr,
    recorder: Arc<Recorder>,
    handle: ServerHandle,
}

impl TestServer {
    fn callers(&self) -> Vec<Caller> {
        self.recorder.callers.lock().unwrap().clone()
    }
}

/// Replica 1 of `test`, peers 2 and 3, over TLS with `tls`.
async fn start(tls: Arc<TlsContext>) -> TestServer {
    start_adjusted(tls, |_| {}).await
}

async fn start_adjusted(
    tls: Arc<TlsContext>,
    adjust: impl FnOnce(&mut ServerOptions),
) -> TestServer {
    let peers = [(2, "127.0.0.1:1".into()), (3, "127.0.0.1:1".into())];
    let config = server_config(CLUSTER, SERVER_ID, &peers);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let recorder = Arc::new(Recorder {
        config: config.clone(),
        callers: Mutex::default(),
    });
    let mut options = ServerOptions::from_config(&config);
    adjust(&mut options);
    let server = Server::new(listener, recorder.clone(), options, Some(tls));
    let handle = server.handle();
    tokio::spawn(server.run());
    TestServer {
        address,
        recorder,
        handle,
    }
}

fn dialer(tls: Arc<TlsContext>, replica_id: Option<ReplicaId>) -> Dialer {
    Dialer {
        cluster_id: CLUSTER.into(),
        replica_id,
        tls: Some(tls),
        connect_timeout: PATIENCE,
        max_message_bytes: MAX,
        hello: replica_id.is_some(),
    }
}

/// Connects as `dialer` says, expecting the server's replica, and sends
/// one health check.
async fn health(server: &TestServer, dialer: &Dialer) -> arbor::Result<Response> {
    let call = async {
        let address = server.address.to_string();
        let mut connection = Connection::open(&address, Some(SERVER_ID), dialer).await?;
        connection.call(&Request::Healthcheck).await
    };
    tokio::time::timeout(PATIENCE, call)
        .await
        .unwrap_or(Err(Error::Timeout))
}

fn healthy(response: arbor::Result<Response>) {
    assert_eq!(
        response,
        Ok(Response::Health {
            replica_id: SERVER_ID,
            log_epoch: 0,
        })
    );
}

fn is_refused(response: &arbor::Result<Response>) -> bool {
    matches!(response, Err(Error::IdentityRefused(_)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_names_the_caller_the_handler_is_handed() {
    let ca = new_ca();
    let server = start(context(&ca, &ca, &replica(CLUSTER, SERVER_ID), valid())).await;

    let gateway = context(&ca, &ca, &client("gw-1"), valid());
    healthy(health(&server, &dialer(gateway, None)).await);
    assert_eq!(server.callers(), [Caller::Client("gw-1".into())]);

    let peer = context(&ca, &ca, &replica(CLUSTER, 2), valid());
    healthy(health(&server, &dialer(peer, Some(2))).await);
    // Its Hello, then its health check: both from replica 2.
    assert_eq!(server.callers()[1..], [Caller::Peer(2), Caller::Peer(2)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_of_another_ca_is_refused_on_either_side() {
    let ca = new_ca();
    let stranger = new_ca();
    let server = start(context(&ca, &ca, &replica(CLUSTER, SERVER_ID), valid())).await;

    // A client certificate the server's CA did not sign.
    let forged = context(&ca, &stranger, &client("gw"), valid());
    assert!(health(&server, &dialer(forged, None)).await.is_err());
    // A server certificate the client's CA did not sign.
    let impostor = start(context(
        &ca,
        &stranger,
        &replica(CLUSTER, SERVER_ID),
        valid(),
    ))
    .await;
    let honest = context(&ca, &ca, &client("gw"), valid());
    assert!(health(&impostor, &dialer(honest, None)).await.is_err());

    assert_eq!(server.callers(), []);
    assert_eq!(impostor.callers(), []);
    assert!(server.handle.stats().handshakes_failed >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_is_refused_on_either_side() {
    let ca = new_ca();
    let server = start(context(&ca, &ca, &replica(CLUSTER, SERVER_ID), valid())).await;
    let stale_client = context(&ca, &ca, &client("gw"), expired());
    assert!(health(&server, &dialer(stale_client, None)).await.is_err());

    let stale_server = start(context(&ca, &ca, &replica(CLUSTER, SERVER_ID), expired())).await;
    let fresh_client = context(&ca, &ca, &client("gw"), valid());
    assert!(health(&stale_server, &dialer(fresh_client, None))
        .await
        .is_err());

    assert_eq!(server.callers(), []);
    assert_eq!(stale_server.callers(), []);
    assert!(server.handle.stats().handshakes_failed >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_claiming_another_replica_id_than_its_certificate_is_refused() {
    let ca = new_ca();
    let server = start(context(&ca, &ca, &replica(CLUSTER, SERVER_ID), valid())).await;

    // Certified as replica 2, says Hello as replica 3 (a configured peer).
    let liar = context(&ca, &ca, &replica(CLUSTER, 2), valid());
    let mut dial = dialer(liar, Some(3));
    let refused = health(&server, &dial).await;
    assert!(is_refused(&refused), "{refused:?}");
    // The same certificate with its own id is served.
    dial.replica_id = Some(2);
    healthy(health(&server, &dial).await);
    // A client certificate claiming a replica id in Hello.
    let gateway = context(&ca, &ca, &client("gw"), valid());
    let refused = health(&server, &dialer(gateway, Some(2))).await;
    assert!(is_refused(&refused), "{refused:?}");
    // Only the refused Hellos and the honest peer's calls reached the handler.
    assert!(!server.callers().contains(&Caller::Peer(3)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_naming_no_acceptable_replica_are_refused_before_any_request() {
    let ca = new_ca();
    let server = start(context(&ca, &ca, &replica(CLUSTER, SERVER_ID), valid())).await;
    let names = [
        replica(CLUSTER, 4),         // not a configured peer
        replica(CLUSTER, SERVER_ID), // the server's own id
        replica("other", 2),         // another cluster, same CA
    ];
    for name in &names {
        let tls = context(&ca, &ca, name, valid());
        // The dialler accepts the server; the server refuses the dialler.
        let refused = health(&server, &dialer(tls, None)).await;
        assert!(is_refused(&refused), "{name}: {refused:?}");
    }
    assert_eq!(server.callers(), []);
    assert_eq!(server.handle.stats().identities_refused, names.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dialler_refuses_a_server_that_is_not_the_replica_it_dialled() {
    let ca = new_ca();
    let server = start(context(&ca, &ca, &replica(CLUSTER, SERVER_ID), valid())).await;
    let peer = context(&ca, &ca, &replica(CLUSTER, 2), valid());
    let address = server.address.to_string();
    // Replica 3 was meant; replica 1 answers.
    let refused = Connection::open(&address, Some(3), &dialer(peer.clone(), Some(2))).await;
    assert!(matches!(refused, Err(Error::IdentityRefused(_))));
    // A server certified for another cluster is refused too.
    let foreign = start(context(&ca, &ca, &replica("other", SERVER_ID), valid())).await;
    let refused = health(&foreign, &dialer(peer, Some(2))).await;
    assert!(is_refused(&refused), "{refused:?}");
    assert_eq!(foreign.callers(), []);
}

// ----------------------------------------------------------------------------
// Hello between real services: both sides refuse, and both say so.

struct Node {
    service: Arc<Service>,
    transport: Arc<TcpTransport>,
    _server: ServerHandle,
}

/// A service on `listener`, dialling `peers` as `config` says.
fn start_node(listener: TcpListener, config: Config, tls: Option<Arc<TlsContext>>) -> Node {
    let forest = Forest::in_memory(config.forest_options()).unwrap();
    let transport = Arc::new(TcpTransport::new(&config, tls.clone()));
    let service = Service::start(
        config.clone(),
        Arc::new(forest),
        system_env(),
        transport.clone(),
    )
    .unwrap();
    let options = ServerOptions::from_config(&config);
    let server = Server::new(listener, service.clone(), options, tls);
    let handle = server.handle();
    tokio::spawn(server.run());
    Node {
        service,
        transport,
        _server: handle,
    }
}

/// The id `node` knows its peer by: the peer's own id, or 2 when both
/// nodes (wrongly) share one.
fn peer_id(own: ReplicaId, other: ReplicaId) -> ReplicaId {
    if own == other {
        2
    } else {
        other
    }
}

/// Two plaintext nodes, each the other's one peer: (cluster, id) of each.
async fn pair(a: (&str, ReplicaId), b: (&str, ReplicaId)) -> (Node, Node) {
    let listeners = [
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
    ];
    let addresses: Vec<String> = listeners
        .iter()
        .map(|l| l.local_addr().unwrap().to_string())
        .collect();
    let [first, second] = listeners;
    let config_a = server_config(a.0, a.1, &[(peer_id(a.1, b.1), addresses[1].clone())]);
    let config_b = server_config(b.0, b.1, &[(peer_id(b.1, a.1), addresses[0].clone())]);
    (
        start_node(first, config_a, None),
        start_node(second, config_b, None),
    )
}

/// `node` calls its one peer.
async fn dial_peer(node: &Node) -> arbor::Result<Response> {
    let peer = node.service.config().node.peers[0].replica_id;
    node.transport
        .call(peer, Request::Healthcheck, PATIENCE)
        .await
}

/// `node` refused a dial and a Hello, and counted both.
fn refused_both_ways(node: &Node, dialled: arbor::Result<Response>, why: &str) {
    match dialled {
        Err(Error::IdentityRefused(message)) => assert!(message.contains(why), "{message}"),
        other => panic!("expected a refusal naming {why:?}: {other:?}"),
    }
    let stats = node.service.stats();
    assert!(stats.peers_refused >= 1, "{stats:?}");
    assert!(stats.hellos_refused >= 1, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_with_one_replica_id_refuse_each_other() {
    let (a, b) = pair((CLUSTER, 1), (CLUSTER, 1)).await;
    let from_a = dial_peer(&a).await;
    let from_b = dial_peer(&b).await;
    refused_both_ways(&a, from_a, "share one node.replica_id");
    refused_both_ways(&b, from_b, "share one node.replica_id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_of_two_clusters_refuse_each_other() {
    let (a, b) = pair(("east", 1), ("west", 3)).await;
    let from_a = dial_peer(&a).await;
    let from_b = dial_peer(&b).await;
    refused_both_ways(&a, from_a, "cluster");
    refused_both_ways(&b, from_b, "cluster");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn correctly_configured_nodes_accept_each_other() {
    let (a, b) = pair((CLUSTER, 1), (CLUSTER, 2)).await;
    let answer = dial_peer(&a).await;
    assert!(
        matches!(answer, Ok(Response::Health { replica_id: 2, .. })),
        "{answer:?}"
    );
    let answer = dial_peer(&b).await;
    assert!(
        matches!(answer, Ok(Response::Health { replica_id: 1, .. })),
        "{answer:?}"
    );
    for node in [&a, &b] {
        let stats = node.service.stats();
        assert_eq!((stats.peers_refused, stats.hellos_refused), (0, 0));
    }
}
