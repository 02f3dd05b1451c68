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
