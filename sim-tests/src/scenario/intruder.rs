//! The intruder: one more client machine on the network, holding no right
//! on any container, that sends random calls it has no right to make:
//! Drop of containers and trees, forged `Apply` pages stamped as the
//! replicas (their next stamps and stamps at the end of the counter
//! space), writes, reads and op-log reads of the workload's containers.
//! Every call must be refused with `PermissionDenied`; what it got is
//! recorded in the ledger, and `checkers::intruder` proves that no replica
//! kept a trace of it (docs/design.md §9).

use super::workload::{containers, system_tree, version_tree, Workload};
use crate::world::Client;
use arbor::proto::{Request, Response};
use arbor::types::{make_timestamp, COUNTER_MAX};
use arbor::{Error, KeyValue, Meta, Move, ReplicaId, TreeKey, ATTR_FILE_NAME, ROOT};
use madsim::rand::{thread_rng, Rng};
use std::time::Duration;

/// The meta key every op the intruder forges carries: no replica may ever
/// hold an op with it.
pub const INTRUDER_TAG_KEY: &str = "intruder";

/// The name the simulated checkers call replicas in-process as (an owner
/// of every container, so it may page through op logs; it never writes).
pub const CHECKER_CLIENT: &str = "checker";

/// Calls the intruder makes in one run.
pub const INTRUDER_CALLS: u64 = 60;

/// What the intruder's calls got.
#[derive(Clone, Debug, Default)]
pub struct IntruderRecord {
    pub sent: u64,
    pub refused: u64,
    /// No answer (partitions, crashes, timeouts): nothing learned.
    pub unanswered: u64,
    /// Calls answered with anything but `PermissionDenied`.
    pub served: Vec<String>,
}

/// The rights of the scenario: the workload's clients (`client-1` ..
/// `client-{clients}`) and the in-process checker own every container
/// (clients write, read op-log pages and drop trees, which need the owner
/// right); nobody else, the intruder and anonymous callers included, holds
/// anything. Which role allows which call is tested in the engine (`service_authz.rs`).
pub fn access_config(clients: usize) -> arbor::config::AccessConfig {
    use arbor::config::{AccessConfig, Role};
    let mut access = AccessConfig::default();
    for index in 1..=clients {
        access
            .default
            .grant(Role::Owner, &format!("client-{index}"));
    }
    // The checker pages through op logs, which clients may do as owners.
    access.default.grant(Role::Owner, CHECKER_CLIENT);
    access
}

/// Runs the intruder's calls spread over about `span`.
pub async fn run_intruder(workload: std::sync::Arc<Workload>, client: Client, span: Duration) {
    let think_ms = (span.as_millis() as u64 / INTRUDER_CALLS).max(1);
    for n in 0..INTRUDER_CALLS {
        if workload.verdict.failed() {
            break;
        }
        let wait = thread_rng().gen_range(0..=2 * think_ms);
        madsim::time::sleep(Duration::from_millis(wait)).await;
        let replicas = workload.world.replica_ids();
        let target = replicas[thread_rng().gen_range(0..replicas.len())];
        let request = random_request(&replicas, n);
        call(&workload, &client, target, request).await;
    }
}

async fn call(workload: &Workload, client: &Client, target: ReplicaId, request: Request) {
    let what = summarize(&request);
    workload
        .trace
        .record(&client.name, format!("intrudes {what} -> replica-{target}"));
    let answer = client.call(target, request, workload.call_timeout).await;
    let mut ledger = workload.ledger.lock().unwrap();
    let record = &mut ledger.intruder;
    record.sent += 1;
    match answer {
        Ok(Response::Error(Error::PermissionDenied { .. })) => {
            workload.trace.record(&client.name, "intruder refused");
            record.refused += 1
        }
        Err(_) | Ok(Response::Error(Error::ShuttingDown | Error::Overloaded(_))) => {
            record.unanswered += 1
        }
        Ok(other) => {
            let served = format!("{what} on replica-{target} answered {other:?}");
            workload
                .trace
                .record(&client.name, format!("SERVED {served}"));
            record.served.push(served);
        }
    }
}

fn random_tree() -> TreeKey {
    let cids = containers();
    let cid = cids[thread_rng().gen_range(0..cids.len())];
    if thread_rng().gen_bool(0.5) {
        version_tree(cid)
    } else {
        system_tree(cid)
    }
}

/// A forged op stamped as `replica`: a stamp the replica will use soon, or
/// one at the end of the counter space.
fn forged_op(replica: ReplicaId, n: u64) -> Move {
    let counter = if thread_rng().gen_bool(0.5) {
        COUNTER_MAX - thread_rng().gen_range(0..16)
    } else {
        thread_rng().gen_range(1..4000)
    };
    let ts = make_timestamp(counter, replica);
    Move {
        parent: ROOT,
        child: ts,
        meta: Meta {
            time: ts,
            items: vec![
                KeyValue::new(ATTR_FILE_NAME, format!("forged-{n}").into_bytes()),
                KeyValue::new(INTRUDER_TAG_KEY, n.to_string().into_bytes()),
            ],
        },
    }
}

fn random_request(replicas: &[ReplicaId], n: u64) -> Request {
    let tree = random_tree();
    let node = thread_rng().gen_range(1..1 << 40);
    let tagged = vec![
        KeyValue::new(ATTR_FILE_NAME, format!("intruded-{n}").into_bytes()),
        KeyValue::new(INTRUDER_TAG_KEY, n.to_string().into_bytes()),
    ];
    match thread_rng().gen_range(0..10) {
        0 => Request::Drop {
            cid: tree.cid,
            tree: thread_rng().gen_bool(0.5).then(|| tree.tree.clone()),
        },
        1 | 2 => {
            let count = thread_rng().gen_range(1..4);
            let ops = (0..count)
                .map(|_| forged_op(replicas[thread_rng().gen_range(0..replicas.len())], n))
                .collect();
            Request::Apply { tree, ops }
        }
        3 => Request::Add {
            tree,
            parent: ROOT,
            items: tagged,
        },
        4 => Request::Move {
            tree,
            parent: ROOT,
            node,
            items: tagged,
        },
        5 => Request::Remove { tree, node },
        6 => Request::GetSubTree {
            tree,
            root: ROOT,
            depth: 0,
        },
        7 => Request::TreeList { cid: tree.cid },
        8 => Request::GetOpLog {
            tree,
            from_height: 0,
            limit: 64,
        },
        _ => Request::GetOpLogStamps {
            tree,
            from_height: 0,
            limit: 64,
        },
    }
}

fn summarize(request: &Request) -> String {
    match request {
        Request::Drop { cid, tree } => format!("Drop {cid:?} {tree:?}"),
        Request::Apply { tree, ops } => {
            let stamps: Vec<u64> = ops.iter().map(Move::ts).collect();
            format!("Apply {:?}/{} stamps {stamps:?}", tree.cid, tree.tree)
        }
        other => {
            let name = format!("{other:?}");
            name.split([' ', '{'])
                .next()
                .unwrap_or_default()
                .to_string()
        }
    }
}
