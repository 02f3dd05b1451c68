//! Real-mode load through the gRPC front: short runs on loopback, checked
//! for what they must show whatever the host's speed (every acknowledged
//! id stored on every replica, every call of a sequence counted, the CPU
//! accounts adding up), never for how fast they ran.

use arbor_sim::load::driver::RunSpec;
use arbor_sim::load::gateway::GatewayOp;
use arbor_sim::load::real::{self, reference_config, RealOptions};
use arbor_sim::load::report::RunReport;
use arbor_sim::load::scenario::{Requests, Stage};
use arbor_sim::load::target::GatewayTransport;
use std::path::PathBuf;
use std::time::Duration;

fn run(requests: Requests, replicas: usize, rate: u64) -> RunReport {
    let stages = vec![Stage {
        duration: Duration::from_secs(2),
        rate,
    }];
    let spec = RunSpec {
        scenarios: requests.scenarios(10, stages, 1),
        deadline: Duration::from_secs(5),
        window: Duration::from_secs(1),
        track_acks: true,
        progress: false,
    };
    let options = RealOptions {
        replicas,
        gateway: GatewayTransport::Grpc,
        config: reference_config(1, PathBuf::new(), None),
        data_dir: None,
        worker_threads: 2,
        generator_threads: 1,
        grpc_channels: 2,
        verify: true,
        gateway_calls: None,
        gateway_idle: None,
    };
    let report = real::run(&spec, &options).expect("the run completes");
    for s in &report.scenarios {
        assert_eq!(s.errors, 0, "{}: {:?}", s.name, s.errors_by_kind);
        assert!(s.ok > 0, "{}: nothing acknowledged", s.name);
    }
    let v = report.verification.as_ref().expect("verified");
    assert_eq!(v.missing, 0, "acknowledged but missing: {v:?}");
    assert_eq!(v.replicas_checked as usize, replicas);
    assert_eq!(report.stuck, 0);
    report
}

/// The nodes' and the generator's CPU are both counted, and together
/// never more than the whole process took over the same span (each
/// thread's count is rounded down to a tick, the process's once).
fn assert_cpu_adds_up(report: &RunReport) {
    let cpu = report.cpu.as_ref().expect("real mode on Linux counts CPU");
    assert!(cpu.nodes_s > 0.0 && cpu.generator_s > 0.0, "{cpu:?}");
    let rounding_s = 0.2;
    assert!(
        cpu.nodes_s + cpu.generator_s <= cpu.process_s + rounding_s,
        "{cpu:?}"
    );
    assert!(
        cpu.requests > 0 && cpu.nodes_us_per_request > 0.0,
        "{cpu:?}"
    );
    let expected = cpu.nodes_s * 1e6 / cpu.requests as f64;
    assert!(
        (cpu.nodes_us_per_request - expected).abs() < 1e-6,
        "{cpu:?}"
    );
}

/// The reference loader's requests over gRPC to a single node: every
/// acknowledged leaf is stored, in container zero.
#[test]
fn loader_requests_over_grpc_are_stored_and_costed() {
    let report = run(Requests::Loader, 1, 200);
    assert_eq!(report.gateway, "grpc");
    let user = report.scenario("user").expect("user scenario");
    assert!(user.calls.is_empty(), "one request per iteration");
    let cpu = report.cpu.as_ref().expect("cpu");
    let answered: u64 = report.scenarios.iter().map(|s| s.ok + s.errors).sum();
    assert_eq!(cpu.requests, answered);
    assert_cpu_adds_up(&report);
}

/// The S3 gateway's sequences over gRPC to two replicas: each operation
/// runs, every call of a sequence is counted under its method, and what
/// the writes acknowledged is on both replicas.
#[test]
fn gateway_sequences_over_grpc() {
    let report = run(Requests::Gateway, 2, 40);
    let calls = |op: GatewayOp, call: &str| {
        let s = report.scenario(op.name()).expect("scenario of every op");
        s.calls.iter().find(|c| c.call == call).map_or(0, |c| {
            assert_eq!(c.errors, 0, "{op:?} {call}");
            c.count
        })
    };
    let ok = |op: GatewayOp| report.scenario(op.name()).expect("scenario").ok;
    // A PUT looks the key up, then adds it.
    let put = ok(GatewayOp::Put);
    assert_eq!(calls(GatewayOp::Put, "GetNodeByPath"), put);
    assert_eq!(calls(GatewayOp::Put, "AddByPath"), put);
    // An overwrite: a lookup, a move, its subtree.
    let overwrite = ok(GatewayOp::Overwrite);
    for call in ["GetNodeByPath", "Move", "GetSubTree"] {
        assert_eq!(calls(GatewayOp::Overwrite, call), overwrite, "{call}");
    }
    assert_eq!(
        calls(GatewayOp::VersionedPut, "AddByPath"),
        ok(GatewayOp::VersionedPut)
    );
    assert_eq!(calls(GatewayOp::Get, "GetSubTree"), ok(GatewayOp::Get));
    // A LIST walks the prefix, then every object under it.
    let list = ok(GatewayOp::List);
    assert!(
        calls(GatewayOp::List, "GetSubTree") > list * 2,
        "{list} lists"
    );
    // A multipart upload: created, parts added, completed, removed.
    let multipart = ok(GatewayOp::Multipart);
    assert_eq!(calls(GatewayOp::Multipart, "Add"), 2 * multipart);
    assert_eq!(calls(GatewayOp::Multipart, "AddByPath"), 2 * multipart);
    assert_eq!(calls(GatewayOp::Multipart, "Remove"), multipart);
    let cpu = report.cpu.as_ref().expect("cpu");
    let answered: u64 = report
        .scenarios
        .iter()
        .flat_map(|s| &s.calls)
        .map(|c| c.count)
        .sum();
    assert_eq!(cpu.requests, answered);
    assert_cpu_adds_up(&report);
}

/// Calls a client gives up on before the node has taken them off the
/// connection (the generator's deadline under load, a gateway's alike)
/// leave the connection up for the calls after them. h2 closes a
/// connection on its 21st such reset unless told otherwise, failing
/// every call on it.
#[tokio::test]
async fn calls_cancelled_before_the_node_takes_them_keep_the_connection() {
    use arbor::config::Config;
    use arbor::forest::Forest;
    use arbor::service::Service;
    use arbor_sim::load::target::NoPeers;
    use std::sync::Arc;

    let config = Config::default_for_test(1);
    let forest = Forest::in_memory(config.forest_options()).expect("forest");
    let env = arbor::system::system_env();
    let service = Service::start(config.clone(), Arc::new(forest), env, Arc::new(NoPeers))
        .expect("service starts");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let front = arbor::grpc::Front::new(service);
    let server = arbor::grpc::serve(&config, listener, front, None).expect("serves");
    let tcp = tokio::net::TcpStream::connect(server.local_addr)
        .await
        .expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("HTTP/2");
    let connection = tokio::spawn(connection);
    let healthcheck = || {
        http::Request::post(format!(
            "http://{}/tree.TreeService/Healthcheck",
            server.local_addr
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request")
    };
    // An empty HealthcheckRequest: no compression, length 0.
    let empty_message = bytes::Bytes::from_static(&[0, 0, 0, 0, 0]);
    let mut client = client.ready().await.expect("ready");
    let answered = |response: http::Response<h2::RecvStream>| response.status() == 200;
    let (response, mut body) = client.send_request(healthcheck(), false).expect("send");
    body.send_data(empty_message.clone(), true).expect("body");
    assert!(answered(response.await.expect("first call answered")));
    // Opened and cancelled at once: this runtime has one thread, so every
    // HEADERS and RST_STREAM frame goes out in one burst once it awaits,
    // and the node reads them all before it takes any call.
    let cancelled = 100;
    for _ in 0..cancelled {
        client = client.ready().await.expect("ready");
        let (response, body) = client.send_request(healthcheck(), false).expect("send");
        drop((response, body));
    }
    client = client.ready().await.expect("ready");
    let (response, mut body) = client.send_request(healthcheck(), false).expect("send");
    body.send_data(empty_message, true).expect("body");
    let response = response.await;
    assert!(
        response.as_ref().is_ok_and(|r| r.status() == 200),
        "after {cancelled} cancelled calls: {response:?}"
    );
    assert!(!connection.is_finished(), "the connection was closed");
}
