//! The gRPC front inside the simulator: three replicas of the world serve
//! `tree.TreeService` (`world/simgrpc.rs`: hyper's HTTP/2 on the simulated
//! TCP streams), and a gateway machine speaks gRPC to them with signed
//! requests, as an S3 gateway does: versions of one key put through
//! different replicas, the latest and every version read back, a
//! directory listed, a version deleted, a stranger's and an unsigned call
//! refused, and a replica restarted under its connection.

use arbor::config::{AccessConfig, Config, Role};
use arbor::grpc::client::GrpcClient;
use arbor::grpc::pb;
use arbor::grpc::Signer;
use arbor::{ContainerId, KeyValue, TreeKey, ATTR_FILE_NAME};
use arbor_sim::trace::{first_difference, Trace};
use arbor_sim::world::config::client_ip;
use arbor_sim::world::simgrpc::{connect, H2Channel};
use arbor_sim::world::simnet::SimNet;
use arbor_sim::world::{cluster_configs_with, Knobs, World};
use madsim::runtime::{Handle, Runtime};
use std::net::SocketAddr;
use std::time::Duration;
use tonic::Code;

/// Where each replica's front listens, beside its native port.
const GRPC_PORT: u16 = 8080;
const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// The gateway's key, a writer of every container.
fn gateway() -> Signer {
    Signer::from_seed(11)
}

/// A key the replicas know nothing of.
fn stranger() -> Signer {
    Signer::from_seed(12)
}

/// Three replicas of every container, each with a gRPC front; a write is
/// answered once all three hold it.
fn configs() -> Vec<Config> {
    let mut configs = cluster_configs_with(3, &Knobs::default(), &[]);
    for config in &mut configs {
        let native: SocketAddr = config.node.listen.parse().unwrap();
        config.grpc.listen = Some(format!("{}:{GRPC_PORT}", native.ip()));
        // The gateway's key writes; nobody else may do anything.
        config.access = AccessConfig::default();
        config
            .access
            .default
            .grant(Role::Writer, &gateway().public().hex());
        config.tree.ack_replicas = 3;
        config.validate().expect("a valid config");
    }
    configs
}

fn front_of(config: &Config) -> String {
    config.grpc.listen.clone().expect("a gRPC front")
}

fn version(name: &str, oid: &str) -> Vec<KeyValue> {
    vec![
        KeyValue::new(ATTR_FILE_NAME, name.as_bytes()),
        KeyValue::new("OID", oid.as_bytes()),
    ]
}

fn oid_of(meta: &[KeyValue]) -> String {
    meta.iter()
        .find(|kv| kv.key == "OID")
        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
        .unwrap_or_default()
}

async fn client(address: &str, signer: Signer) -> GrpcClient<H2Channel> {
    connect(&SimNet::default(), address, signer, MAX_MESSAGE_BYTES)
        .await
        .expect("the gateway reaches the front")
}

/// What a session gave: the gateway's answers in order, and the world's
/// trace (the replicas' own traffic, restarts) with its fingerprint.
struct Session {
    seen: Vec<String>,
    events: Vec<arbor_sim::trace::Event>,
    fingerprint: u64,
}

/// The gateway's session under `seed`.
fn session(seed: u64) -> Session {
    Runtime::with_seed_and_config(seed, madsim::Config::default()).block_on(async {
        let configs = configs();
        let fronts: Vec<String> = configs.iter().map(front_of).collect();
        let world = World::build_simple(configs, Trace::new(false));
        let machine = Handle::current()
            .create_node()
            .name("gateway")
            .ip(client_ip(1))
            .build();
        madsim::time::sleep(Duration::from_millis(100)).await;
        let mut seen = Vec::new();
        let tree = TreeKey::new(ContainerId([4; 32]), "version");

        // PUT three versions of one key, each through another replica.
        let (t, f) = (tree.clone(), fronts.clone());
        let put = machine.spawn(async move {
            let mut answers = Vec::new();
            for (i, front) in f.iter().enumerate() {
                let mut gw = client(front, gateway()).await;
                gw.healthcheck().await.expect("healthy");
                let oid = format!("v{}", i + 1);
                let meta = version("cat.jpg", &oid);
                let (nodes, parent) = gw.add_by_path(&t, &["photos"], &meta).await.unwrap();
                answers.push(format!("put {oid} via {front}: {} nodes", nodes.len()));
                assert!(parent != 0, "the version sits under its directory");
                madsim::time::sleep(Duration::from_millis(10)).await;
            }
            answers
        });
        seen.extend(put.await.unwrap());

        // HEAD, ListObjectVersions and LIST through the second replica.
        let (t, front) = (tree.clone(), fronts[1].clone());
        let read = machine.spawn(async move {
            let mut gw = client(&front, gateway()).await;
            let latest = gw
                .get_node_by_path(&t, &["photos", "cat.jpg"], true)
                .await
                .unwrap();
            let all = gw
                .get_node_by_path(&t, &["photos", "cat.jpg"], false)
                .await
                .unwrap();
            let dir = gw.get_node_by_path(&t, &["photos"], true).await.unwrap();
            let listed = gw.get_subtree(&t, dir[0].id, 2, true).await.unwrap();
            (latest, all, listed)
        });
        let (latest, all, listed) = read.await.unwrap();
        assert_eq!(latest.len(), 1);
        assert_eq!(oid_of(&latest[0].meta.items), "v3", "the newest version");
        let mut oids: Vec<String> = all.iter().map(|n| oid_of(&n.meta.items)).collect();
        oids.sort();
        assert_eq!(oids, ["v1", "v2", "v3"]);
        assert_eq!(listed.len(), 4, "the directory and its three versions");
        // Node ids and meta times come from the replicas' clocks and the
        // order the writes met: the seed's schedule.
        let listing: Vec<(u64, u64)> = listed.iter().map(|n| (n.id, n.meta.time)).collect();
        seen.push(format!(
            "latest {}, all {oids:?}, listed {listing:?}",
            latest[0].id
        ));

        // DeleteObject of the oldest version through the third replica,
        // seen by the first.
        let oldest = all
            .iter()
            .find(|n| oid_of(&n.meta.items) == "v1")
            .unwrap()
            .id;
        let (t, f) = (tree.clone(), fronts.clone());
        let delete = machine.spawn(async move {
            let mut gw = client(&f[2], gateway()).await;
            gw.remove(&t, oldest).await.unwrap();
            let mut gw = client(&f[0], gateway()).await;
            gw.get_node_by_path(&t, &["photos", "cat.jpg"], false)
                .await
                .unwrap()
        });
        let left = delete.await.unwrap();
        assert_eq!(left.len(), 2, "one version went");
        seen.push(format!("after delete {}", left.len()));

        // A stranger's signed write and an unsigned one are refused.
        let (t, front) = (tree.clone(), fronts[0].clone());
        let refused = machine.spawn(async move {
            let mut other = client(&front, stranger()).await;
            let denied = other.add_by_path(&t, &["photos"], &version("x", "x")).await;
            let mut gw = client(&front, gateway()).await;
            let unsigned = pb::AddRequest {
                body: Some(pb::add_request::Body {
                    container_id: t.cid.0.to_vec(),
                    tree_id: t.tree.clone(),
                    parent_id: 0,
                    meta: Vec::new(),
                    bearer_token: Vec::new(),
                }),
                signature: None,
            };
            let unsigned = gw.raw().add(unsigned).await;
            (denied.unwrap_err().code(), unsigned.unwrap_err().code())
        });
        let (denied, unsigned) = refused.await.unwrap();
        assert_eq!(denied, Code::PermissionDenied);
        assert_eq!(unsigned, Code::Unauthenticated);
        seen.push(format!("stranger {denied:?}, unsigned {unsigned:?}"));

        // The first replica restarts under the gateway's connection: the
        // call on it fails, a new connection is served.
        let front = fronts[0].clone();
        let mut gw = machine
            .spawn(async move { client(&front, gateway()).await })
            .await
            .unwrap();
        world.restart_process(1).await;
        let (t, front) = (tree.clone(), fronts[0].clone());
        let after = machine.spawn(async move {
            let stale = gw.get_node_by_path(&t, &["photos"], true).await;
            let mut fresh = client(&front, gateway()).await;
            let dir = fresh.get_node_by_path(&t, &["photos"], true).await;
            let code = |status: tonic::Status| status.code();
            (
                stale.map(|n| n.len()).map_err(code),
                dir.map(|n| n.len()).map_err(code),
            )
        });
        let (stale, fresh) = after.await.unwrap();
        assert!(stale.is_err(), "the old connection died with the process");
        assert_eq!(fresh, Ok(1));
        seen.push(format!("after restart: stale {stale:?}, fresh {fresh:?}"));
        Session {
            seen,
            events: world.trace.events(),
            fingerprint: world.trace.hash(),
        }
    })
}

#[test]
fn a_gateway_speaks_grpc_to_the_simulated_replicas() {
    let seen = session(1).seen;
    println!("{}", seen.join("\n"));
    assert_eq!(seen.len(), 7);
}

/// The same seed gives the same session; HTTP/2 and the front's tasks run
/// on the seed's schedule.
#[test]
fn a_grpc_session_replays_from_its_seed() {
    let (first, second) = (session(2), session(2));
    assert_eq!(first.seen, second.seen);
    if let Some((index, a, b)) = first_difference(&first.events, &second.events) {
        panic!("event {index} differs: {a:?} against {b:?}");
    }
    assert_eq!(first.fingerprint, second.fingerprint);
    assert!(!first.events.is_empty());
}
