//! The intruder: one more client machine on the network that sends random
//! calls of every kind a client can send: Drop of containers and trees,
//! forged `Apply` pages stamped as the replicas (their next stamps and
//! stamps at the end of the counter space), writes (`Add`, `AddByPath`,
//! `Move`, `Remove`), reads and op-log reads of the workload's containers.
//!
//! In most seeds its identity holds no right at all. In one seed of two
//! the swarm gives it a role on each container (`Swarm::intruder_roles`:
//! none, reader, writer or owner), and the rights model
//! (`check::rights`, the table of docs/security.md) judges every call:
//! one its role allows must not be refused for rights, one it does not
//! allow must be refused with `PermissionDenied`. A call its role allows
//! that would change data goes to the tree `MATRIX_TREE` of that
//! container, so the workload's trees stay the workload's. What the calls
//! got is recorded in the ledger, and `check::trust` proves that no
//! replica kept a trace of a refused one (docs/design.md §9).

use crate::coverage::Coverage;
use crate::scenario::check::rights;
use crate::scenario::plan::swarm::CallerRole;
use crate::scenario::workload::{containers, system_tree, version_tree, Workload};
use crate::world::Client;
use arbor::forest::ListOrder;
use arbor::proto::{Request, Response};
use arbor::types::{make_timestamp, COUNTER_MAX};
use arbor::{Error, KeyValue, Meta, Move, ReplicaId, TreeKey, ATTR_FILE_NAME, ROOT};
use madsim::rand::{thread_rng, Rng};
use std::time::Duration;

/// The meta key every op the intruder forges carries: no replica may ever
/// hold an op with it.
pub const INTRUDER_TAG_KEY: &str = "intruder";

/// The meta key of ops the intruder's role allowed it to write: any
/// replica may hold them.
pub const MATRIX_TAG_KEY: &str = "matrix";

/// The tree of each container that writes and drops the intruder's role
/// allows go to.
pub const MATRIX_TREE: &str = "matrix";

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
    /// Calls its role does not allow answered with anything but
    /// `PermissionDenied`.
    pub served: Vec<String>,
    /// Calls its role allows (`check::rights`).
    pub allowed: u64,
    /// Calls its role allows answered with `PermissionDenied`.
    pub wrongly_refused: Vec<String>,
}

/// The rights of the scenario: the workload's clients (`client-1` ..
/// `client-{clients}`) and the in-process checker own every container
/// (clients write, read op-log pages and drop trees, which need the owner
/// right); the intruder (`intruder`, a client name) holds `roles[i]` on
/// the `i`-th container of `containers()` (nothing where there is none);
/// nobody else, anonymous callers included, holds anything.
pub fn access_config(
    clients: usize,
    intruder: &str,
    roles: &[CallerRole],
) -> arbor::config::AccessConfig {
    use arbor::config::{AccessConfig, ContainerAccess, Role};
    let mut access = AccessConfig::default();
    for index in 1..=clients {
        access
            .default
            .grant(Role::Owner, &format!("client-{index}"));
    }
    // The checker pages through op logs, which clients may do as owners.
    access.default.grant(Role::Owner, CHECKER_CLIENT);
    for (cid, role) in containers().into_iter().zip(roles) {
        if let Some(role) = role.engine_role() {
            let mut grants = access.default.clone();
            grants.grant(role, intruder);
            access.containers.push(ContainerAccess { cid, grants });
        }
    }
    access
}

/// Runs the intruder's calls spread over about `span`.
pub async fn run_intruder(
    workload: std::sync::Arc<Workload>,
    client: Client,
    span: Duration,
    roles: Vec<CallerRole>,
) {
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
        let role = role_on(&roles, &request);
        if rights::client_may(role, &request) {
            // A drop is healed only by sync, as the workload's are
            // (`workload::drop_random`): without it the dropping replica
            // would keep lacking the tree.
            if matches!(request, Request::Drop { .. }) && !workload.world.sync_configured() {
                continue;
            }
            let request = within_matrix(request);
            allowed_call(&workload, &client, target, request, role).await;
        } else {
            call(&workload, &client, target, request).await;
        }
    }
}

/// The intruder's role on the container `request` names.
fn role_on(roles: &[CallerRole], request: &Request) -> CallerRole {
    let cid = match request {
        Request::Drop { cid, .. } | Request::TreeList { cid } => *cid,
        Request::Add { tree, .. }
        | Request::AddByPath { tree, .. }
        | Request::Move { tree, .. }
        | Request::Remove { tree, .. }
        | Request::GetNodeByPath { tree, .. }
        | Request::GetMeta { tree, .. }
        | Request::GetSubTree { tree, .. }
        | Request::ListChildren { tree, .. }
        | Request::GetSubTreePage { tree, .. }
        | Request::Apply { tree, .. }
        | Request::GetOpLog { tree, .. }
        | Request::GetOpLogStamps { tree, .. } => tree.cid,
        Request::Healthcheck | Request::Hello { .. } => return CallerRole::None,
    };
    containers()
        .iter()
        .position(|&c| c == cid)
        .and_then(|i| roles.get(i).copied())
        .unwrap_or(CallerRole::None)
}

/// An allowed call that changes data, moved to the container's
/// `MATRIX_TREE` with its tag renamed; reads stay as they are.
fn within_matrix(request: Request) -> Request {
    let matrix = |tree: TreeKey| TreeKey::new(tree.cid, MATRIX_TREE);
    let retag = |items: Vec<KeyValue>| -> Vec<KeyValue> {
        items
            .into_iter()
            .map(|kv| match kv.key.as_str() {
                INTRUDER_TAG_KEY => KeyValue::new(MATRIX_TAG_KEY, kv.value),
                _ => kv,
            })
            .collect()
    };
    match request {
        Request::Drop { cid, .. } => Request::Drop {
            cid,
            tree: Some(MATRIX_TREE.to_string()),
        },
        Request::Add {
            tree,
            parent,
            items,
        } => Request::Add {
            tree: matrix(tree),
            parent,
            items: retag(items),
        },
        Request::Move {
            tree,
            parent,
            node,
            items,
        } => Request::Move {
            tree: matrix(tree),
            parent,
            node,
            items: retag(items),
        },
        Request::Remove { tree, node } => Request::Remove {
            tree: matrix(tree),
            node,
        },
        Request::AddByPath {
            tree,
            attr,
            path,
            items,
        } => Request::AddByPath {
            tree: matrix(tree),
            attr,
            path,
            items: retag(items),
        },
        other => other,
    }
}

/// A call the intruder's role allows: anything but a refusal for rights.
async fn allowed_call(
    workload: &Workload,
    client: &Client,
    target: ReplicaId,
    request: Request,
    role: CallerRole,
) {
    let what = summarize(&request);
    workload.trace.record(
        &client.name,
        format!("as {role:?} {what} -> replica-{target}"),
    );
    let answer = client.call(target, request, workload.call_timeout).await;
    let mut ledger = workload.ledger.lock().unwrap();
    let record = &mut ledger.intruder;
    record.sent += 1;
    record.allowed += 1;
    match answer {
        Ok(Response::Error(error @ Error::PermissionDenied { .. })) => {
            let refused = format!("{what} as {role:?} on replica-{target}: {error}");
            workload
                .trace
                .record(&client.name, format!("WRONGLY REFUSED {refused}"));
            record.wrongly_refused.push(refused);
        }
        Ok(_) => workload.world.hooks.coverage.hit(Coverage::RightsAllowed),
        Err(_) => record.unanswered += 1,
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
    let path = vec!["dir".to_string(), format!("intruded-{n}")];
    match thread_rng().gen_range(0..15) {
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
        9 => Request::GetOpLogStamps {
            tree,
            from_height: 0,
            limit: 64,
        },
        10 => Request::AddByPath {
            tree,
            attr: ATTR_FILE_NAME.to_string(),
            path,
            items: tagged,
        },
        11 => Request::GetNodeByPath {
            tree,
            attr: ATTR_FILE_NAME.to_string(),
            path,
            attributes: Vec::new(),
            latest_only: thread_rng().gen_bool(0.5),
            all_attributes: true,
        },
        12 => Request::GetMeta { tree, node },
        13 => Request::ListChildren {
            tree,
            parent: ROOT,
            order: ListOrder::Name,
            after: None,
            limit: 16,
        },
        _ => Request::GetSubTreePage {
            tree,
            root: ROOT,
            depth: 2,
            order: ListOrder::Id,
            after: None,
            limit: 16,
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
