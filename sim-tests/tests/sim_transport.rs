//! The simulated transport against a trivial echo service: round trips,
//! clogged links, one-way clogs, dropped request kinds and deadlines.

use arbor::net::Transport;
use arbor::proto::{Request, Response};
use arbor::runtime::BoxFuture;
use arbor::{ContainerId, Error, TreeKey};
use arbor_sim::world::clock::{ClockSkew, SimClock};
use arbor_sim::world::replica_addr;
use arbor_sim::world::transport::{serve, Handler, MessageFilter, RequestKind, SimTransport};
use madsim::runtime::{Handle, Runtime};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Answers a health check with its replica id and echoes tree lists.
struct Echo {
    replica_id: u16,
}

impl Handler for Echo {
    fn serve(self: Arc<Self>, request: Request) -> BoxFuture<'static, Response> {
        Box::pin(async move {
            match request {
                Request::Healthcheck => Response::Health {
                    replica_id: self.replica_id,
                },
                Request::TreeList { cid } => Response::Trees(vec![format!("{cid}")]),
                _ => Response::Error(Error::InvalidOp("echo".into())),
            }
        })
    }
}

fn transport(local: u16, filter: Arc<MessageFilter>) -> Arc<SimTransport> {
    let peers: BTreeMap<u16, _> = (1..=2)
        .map(|id| (id, replica_addr(usize::from(id) - 1)))
        .collect();
    let clock = Arc::new(SimClock::new(ClockSkew::default()));
    Arc::new(SimTransport::new(local, peers, clock, 1 << 20, filter))
}

fn start_echo_servers() -> Vec<madsim::runtime::NodeHandle> {
    (1..=2u16)
        .map(|id| {
            let addr = replica_addr(usize::from(id) - 1);
            Handle::current()
                .create_node()
                .name(format!("replica-{id}"))
                .ip(addr.ip())
                .init(move || serve(addr, Arc::new(Echo { replica_id: id }), 1 << 20, 8))
                .build()
        })
        .collect()
}

#[test]
fn round_trip_clog_and_filter() {
    let rt = Runtime::with_seed_and_config(7, Default::default());
    rt.block_on(async {
        let servers = start_echo_servers();
        let filter = Arc::new(MessageFilter::default());
        let client = Handle::current()
            .create_node()
            .name("client")
            .ip("10.0.1.1".parse().unwrap())
            .build();
        madsim::time::sleep(Duration::from_millis(50)).await;
        let t = transport(0, filter.clone());
        let timeout = Duration::from_millis(500);

        let call = |peer: u16, req: Request| {
            let t = t.clone();
            client.spawn(async move { t.call(peer, req, timeout).await })
        };
        let answer = call(2, Request::Healthcheck).await.unwrap();
        assert_eq!(answer, Ok(Response::Health { replica_id: 2 }));
        let cid = ContainerId([7; 32]);
        let answer = call(1, Request::TreeList { cid }).await.unwrap();
        assert_eq!(answer, Ok(Response::Trees(vec![format!("{cid}")])));

        // Unknown peers fail fast with a typed error.
        let answer = call(9, Request::Healthcheck).await.unwrap();
        assert!(matches!(answer, Err(Error::Network(_))), "{answer:?}");

        // A clogged server times out at the caller's deadline.
        let net = madsim::net::NetSim::current();
        net.clog_node(servers[0].id());
        let started = madsim::time::Instant::now();
        let answer = call(1, Request::Healthcheck).await.unwrap();
        assert_eq!(answer, Err(Error::Timeout));
        assert!(started.elapsed() >= timeout);
        net.unclog_node(servers[0].id());
        let answer = call(1, Request::Healthcheck).await.unwrap();
        assert_eq!(answer, Ok(Response::Health { replica_id: 1 }));

        // One-way clog: the request arrives but the answer cannot return.
        net.clog_link(servers[1].id(), client.id());
        let answer = call(2, Request::Healthcheck).await.unwrap();
        assert_eq!(answer, Err(Error::Timeout));
        net.unclog_link(servers[1].id(), client.id());

        // The filter drops one request kind only.
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
        let answer = call(1, Request::Healthcheck).await.unwrap();
        assert_eq!(answer, Ok(Response::Health { replica_id: 1 }));
    });
}

#[test]
fn killed_server_times_out_and_restarts() {
    let rt = Runtime::with_seed_and_config(11, Default::default());
    rt.block_on(async {
        let servers = start_echo_servers();
        let client = Handle::current()
            .create_node()
            .name("client")
            .ip("10.0.1.1".parse().unwrap())
            .build();
        madsim::time::sleep(Duration::from_millis(50)).await;
        let t = transport(0, Arc::new(MessageFilter::default()));
        let timeout = Duration::from_millis(300);
        Handle::current().kill(servers[1].id());
        let t2 = t.clone();
        let answer = client
            .spawn(async move { t2.call(2, Request::Healthcheck, timeout).await })
            .await
            .unwrap();
        assert_eq!(answer, Err(Error::Timeout));
        Handle::current().restart(servers[1].id());
        madsim::time::sleep(Duration::from_millis(50)).await;
        let answer = client
            .spawn(async move { t.call(2, Request::Healthcheck, timeout).await })
            .await
            .unwrap();
        assert_eq!(answer, Ok(Response::Health { replica_id: 2 }));
    });
}
