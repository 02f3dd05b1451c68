//! The simulated network against a trivial echo service served through
//! the engine's TCP stack (`tcp::Server` on a `SimListener`, `TcpTransport`
//! over `SimNet`, behind the world's message filter): round trips, clogged
//! links, one-way clogs, dropped request kinds, killed servers, and late
//! answers of timed-out calls on pooled connections.

use arbor::config::{Config, PeerConfig};
use arbor::net::Transport;
use arbor::proto::{Request, Response};
use arbor::runtime::{BoxFuture, Clock, Env};
use arbor::tcp::{Dialer, Server, ServerOptions, TcpTransport};
use arbor::Caller;
use arbor::{ContainerId, Error, ReplicaId, TreeKey};
use arbor_sim::trace::Trace;
use arbor_sim::world::caller_at;
use arbor_sim::world::clock::{ClockSkew, SimClock};
use arbor_sim::world::replica_addr;
use arbor_sim::world::runtime::SimRuntime;
use arbor_sim::world::simnet::{Filtered, Kernels, SimListener, SimNet, TcpHandler};
use arbor_sim::world::transport::{Handler, MessageFilter, RequestKind};
use madsim::runtime::{Handle, NodeHandle, Runtime};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Answers a health check with its replica id and echoes tree lists.
struct Echo {
    replica_id: u16,
}

impl Handler for Echo {
    fn serve(self: Arc<Self>, _caller: Caller, request: Request) -> BoxFuture<'static, Response> {
        Box::pin(async move {
            match request {
                Request::Healthcheck => Response::Health {
                    replica_id: self.replica_id,
                    log_epoch: 0,
                },
                Request::TreeList { cid } => Response::Trees(vec![format!("{cid}")]),
                _ => Response::Error(Error::InvalidOp("echo".into())),
            }
        })
    }
}

/// Serves `handler` at `addr` through `tcp::Server` until the node dies.
async fn serve(addr: SocketAddr, handler: Arc<dyn Handler>) {
    let listener = SimListener::bind(addr, caller_at, Kernels::default())
        .await
        .expect("binds");
    let handler = Arc::new(TcpHandler {
        inner: handler,
        server: addr.to_string(),
        trace: Trace::default(),
    });
    let env = Env {
        clock: Arc::new(SimClock::new(ClockSkew::default())),
        runtime: Arc::new(SimRuntime::new(None)),
    };
    let options = ServerOptions::from_config(&Config::default_for_test(1));
    Server::with_env(Box::new(listener), handler, options, None, env)
        .run()
        .await
}

/// A client's transport (replica id 0) to replicas 1 and 2, behind
/// `filter`, as the world's clients have.
fn transport(filter: Arc<MessageFilter>) -> Arc<dyn Transport> {
    let mut config = Config::default_for_test(1);
    config.node.peers = (1..=2u16)
        .map(|id| PeerConfig::new(id, replica_addr(usize::from(id) - 1).to_string()))
        .collect();
    let clock: Arc<dyn Clock> = Arc::new(SimClock::new(ClockSkew::default()));
    let limits = &config.limits;
    let dialer = Dialer::plaintext(limits.connect_timeout, limits.max_message_bytes);
    let tcp = TcpTransport::with_dialer(&config, dialer);
    Arc::new(Filtered {
        local: 0,
        filter,
        clock: clock.clone(),
        inner: Arc::new(tcp.with_net(Arc::new(SimNet::default()), clock)),
    })
}

fn start_server(id: ReplicaId, handler: Arc<dyn Handler>) -> NodeHandle {
    let addr = replica_addr(usize::from(id) - 1);
    Handle::current()
        .create_node()
        .name(format!("replica-{id}"))
        .ip(addr.ip())
        .init(move || serve(addr, handler.clone()))
        .build()
}

fn start_echo_servers() -> Vec<NodeHandle> {
    (1..=2u16)
        .map(|id| start_server(id, Arc::new(Echo { replica_id: id })))
        .collect()
}

fn start_client() -> NodeHandle {
    Handle::current()
        .create_node()
        .name("client")
        .ip("10.0.1.1".parse().unwrap())
        .build()
}

fn health(replica_id: u16) -> Result<Response, Error> {
    Ok(Response::Health {
        replica_id,
        log_epoch: 0,
    })
}

#[test]
fn round_trip_clog_and_filter() {
    let rt = Runtime::with_seed_and_config(7, Default::default());
    rt.block_on(async {
        let servers = start_echo_servers();
        let filter = Arc::new(MessageFilter::default());
        let client = start_client();
        madsim::time::sleep(Duration::from_millis(50)).await;
        let t = transport(filter.clone());
        let timeout = Duration::from_millis(500);

        let call = |peer: u16, req: Request| {
            let t = t.clone();
            client.spawn(async move { t.call(peer, req, timeout).await })
        };
        assert_eq!(call(2, Request::Healthcheck).await.unwrap(), health(2));
        let cid = ContainerId([7; 32]);
        let answer = call(1, Request::TreeList { cid }).await.unwrap();
        assert_eq!(answer, Ok(Response::Trees(vec![format!("{cid}")])));

        // Unknown peers fail fast with a typed error.
        let answer = call(9, Request::Healthcheck).await.unwrap();
        assert!(matches!(answer, Err(Error::Network(_))), "{answer:?}");

        // A clogged server holds what its pooled connection carries: the
        // call times out at the caller's deadline, not before.
        let net = madsim::net::NetSim::current();
        net.clog_node(servers[0].id());
        let started = madsim::time::Instant::now();
        let answer = call(1, Request::Healthcheck).await.unwrap();
        assert_eq!(answer, Err(Error::Timeout));
        assert!(started.elapsed() >= timeout);
        net.unclog_node(servers[0].id());
        assert_eq!(call(1, Request::Healthcheck).await.unwrap(), health(1));

        // One-way clog: the request arrives but the answer cannot return.
        net.clog_link(servers[1].id(), client.id());
        let answer = call(2, Request::Healthcheck).await.unwrap();
        assert_eq!(answer, Err(Error::Timeout));
        net.unclog_link(servers[1].id(), client.id());
        assert_eq!(call(2, Request::Healthcheck).await.unwrap(), health(2));

        // The filter drops one request kind only; it notes the pulls.
        filter.block(0, 1, RequestKind::Pull);
        let tree = TreeKey::new(cid, "t");
        let stamps = Request::GetOpLogStamps {
            tree: tree.clone(),
            from_height: 0,
            limit: 1,
        };
        assert_eq!(call(1, stamps).await.unwrap(), Err(Error::Timeout));
        let pull = Request::GetOpLog {
            tree,
            from_height: 0,
            limit: 1,
        };
        assert_eq!(call(1, pull).await.unwrap(), Err(Error::Timeout));
        assert_eq!(call(1, Request::Healthcheck).await.unwrap(), health(1));
        filter.unblock_all();
        assert!(!filter.is_blocked(0, 1, RequestKind::Pull));
    });
}

/// A killed server fails the call on its connection (no answer will come,
/// and the caller hears so before its deadline); the restarted server
/// answers on a new one.
#[test]
fn killed_server_fails_the_call_and_restarts() {
    let rt = Runtime::with_seed_and_config(11, Default::default());
    rt.block_on(async {
        let servers = start_echo_servers();
        let client = start_client();
        madsim::time::sleep(Duration::from_millis(50)).await;
        let t = transport(Arc::new(MessageFilter::default()));
        let timeout = Duration::from_millis(300);
        let call = |t: Arc<dyn Transport>| {
            client.spawn(async move { t.call(2, Request::Healthcheck, timeout).await })
        };
        assert_eq!(call(t.clone()).await.unwrap(), health(2));
        Handle::current().kill(servers[1].id());
        let answer = call(t.clone()).await.unwrap();
        assert!(matches!(answer, Err(Error::Network(_))), "{answer:?}");
        Handle::current().restart(servers[1].id());
        madsim::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(call(t).await.unwrap(), health(2));
    });
}

/// Answers tree lists with the container id it was asked for, so each
/// answer names its call; the first request is held until after the
/// caller's deadline.
struct SlowFirst {
    first_delay: Duration,
    later_delay: Duration,
    seen: AtomicU64,
}

impl Handler for SlowFirst {
    fn serve(self: Arc<Self>, _caller: Caller, request: Request) -> BoxFuture<'static, Response> {
        let first = self.seen.fetch_add(1, Ordering::Relaxed) == 0;
        let delay = if first {
            self.first_delay
        } else {
            self.later_delay
        };
        Box::pin(async move {
            madsim::time::sleep(delay).await;
            match request {
                Request::TreeList { cid } => Response::Trees(vec![format!("{cid}")]),
                _ => Response::Error(Error::InvalidOp("slow first".into())),
            }
        })
    }
}

/// Replica 1 as a [`SlowFirst`] server, and a client node to call it from.
async fn start_slow_first_and_client(first_delay: Duration, later_delay: Duration) -> NodeHandle {
    let handler = Arc::new(SlowFirst {
        first_delay,
        later_delay,
        seen: Default::default(),
    });
    start_server(1, handler);
    let client = start_client();
    madsim::time::sleep(Duration::from_millis(50)).await;
    client
}

/// When a timed-out call's late answer comes, relative to the next call.
#[derive(Clone, Copy, Debug)]
enum StaleArrives {
    /// While the next call still waits for its own.
    BeforeNextAnswer,
    /// After the next call was answered, before the call after it.
    AfterNextAnswer,
}

/// A late answer to a timed-out call must never pass for the answer of a
/// later call to the same replica, whichever connection of the pool that
/// later call takes.
fn stale_answer_is_skipped(order: StaleArrives) {
    let timeout = Duration::from_millis(500);
    // The stale answer leaves the server 300 ms after the timeout.
    let first_delay = timeout + Duration::from_millis(300);
    let later_delay = match order {
        // Answered after the stale answer comes in, before its own deadline.
        StaleArrives::BeforeNextAnswer => Duration::from_millis(400),
        StaleArrives::AfterNextAnswer => Duration::ZERO,
    };
    let rt = Runtime::with_seed_and_config(5, Default::default());
    rt.block_on(async move {
        let client = start_slow_first_and_client(first_delay, later_delay).await;
        let t = transport(Arc::new(MessageFilter::default()));
        let list = |byte: u8| {
            let t = t.clone();
            let cid = ContainerId([byte; 32]);
            let call =
                client.spawn(async move { t.call(1, Request::TreeList { cid }, timeout).await });
            async move { (call.await.unwrap(), Response::Trees(vec![format!("{cid}")])) }
        };

        let (answer, _) = list(1).await;
        assert_eq!(answer, Err(Error::Timeout));
        let (answer, own) = list(2).await;
        assert_eq!(answer, Ok(own), "second call, stale answer {order:?}");
        // Well past the stale answer's arrival, then one more call.
        madsim::time::sleep(first_delay).await;
        let (answer, own) = list(3).await;
        assert_eq!(answer, Ok(own), "third call, stale answer {order:?}");
    });
}

#[test]
fn stale_answer_arriving_while_the_next_call_waits_is_skipped() {
    stale_answer_is_skipped(StaleArrives::BeforeNextAnswer);
}

#[test]
fn stale_answer_arriving_after_the_next_call_is_skipped() {
    stale_answer_is_skipped(StaleArrives::AfterNextAnswer);
}

/// A caller killed while its call waits, then restarted with a new
/// transport (a replica's next incarnation): the old call's late answer
/// must not pass for the answer of the new incarnation's first call.
#[test]
fn stale_answer_to_a_killed_incarnation_is_skipped() {
    let timeout = Duration::from_secs(5);
    let rt = Runtime::with_seed_and_config(9, Default::default());
    rt.block_on(async move {
        let client =
            start_slow_first_and_client(Duration::from_millis(800), Duration::from_millis(1500))
                .await;
        let filter = Arc::new(MessageFilter::default());
        let old = transport(filter.clone());
        let cid = ContainerId([1; 32]);
        drop(client.spawn(async move { old.call(1, Request::TreeList { cid }, timeout).await }));
        madsim::time::sleep(Duration::from_millis(100)).await;
        Handle::current().kill(client.id());
        Handle::current().restart(client.id());
        // A handle from before the restart spawns on the dead incarnation.
        let client = Handle::current().get_node(client.id()).unwrap();
        let new = transport(filter);
        let cid = ContainerId([2; 32]);
        let answer = client
            .spawn(async move { new.call(1, Request::TreeList { cid }, timeout).await })
            .await
            .unwrap();
        assert_eq!(answer, Ok(Response::Trees(vec![format!("{cid}")])));
    });
}
