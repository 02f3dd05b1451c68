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
use crate::scenario::check::outcome::{self, Expect, Judged, Refusal};
use crate::scenario::check::rights;
use crate::scenario::plan::swarm::CallerRole;
use crate::scenario::workload::{containers, system_tree, version_tree, Workload};
use crate::world::Client;
use arbor::forest::ListOrder;
use arbor::proto::{Request, Response};
use arbor::types::{make_timestamp, COUNTER_MAX};
use arbor::{ContainerId, Error, KeyValue, Meta, Move, NodeId, ReplicaId, TreeKey};
use arbor::{ATTR_FILE_NAME, ROOT, TRASH};
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
    /// Calls whose answer was not the outcome the input rules predict
    /// (`check::outcome`), here and from the caller at a replica's
    /// address (`workload::rogue`).
    pub wrong_outcomes: Vec<String>,
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

/// Runs the intruder's calls spread over about `span`. With `holders`
/// (the replica sets of the workload's containers, given where they stay
/// as configured all run long), the writes its role allows are shaped so
/// that the input rules predict their outcome (`check::outcome`), and
/// each answer is held to it.
pub async fn run_intruder(
    workload: std::sync::Arc<Workload>,
    client: Client,
    span: Duration,
    roles: Vec<CallerRole>,
    holders: Option<Vec<(ContainerId, Vec<ReplicaId>)>>,
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
            let holds = holders.as_ref().map(|sets| {
                let cid = request
                    .container()
                    .expect("a call a role allows names a container");
                sets.iter()
                    .any(|(c, set)| *c == cid && set.contains(&target))
            });
            match holds.map(|holds| shape(request.clone(), holds)) {
                Some(Shaped::Cycle) => cycle(&workload, &client, target, &request).await,
                Some(Shaped::Call(request, expect)) => {
                    let call = (target, request, role);
                    let _ = allowed_call(&workload, &client, call, Some(expect)).await;
                }
                None => {
                    let _ = allowed_call(&workload, &client, (target, request, role), None).await;
                }
            }
        } else {
            call(&workload, &client, target, request).await;
        }
    }
}

/// The intruder's role on the container `request` names.
fn role_on(roles: &[CallerRole], request: &Request) -> CallerRole {
    let Some(cid) = request.container() else {
        return CallerRole::None;
    };
    containers()
        .iter()
        .position(|&c| c == cid)
        .and_then(|i| roles.get(i).copied())
        .unwrap_or(CallerRole::None)
}

/// An allowed call that changes data, moved to the container's
/// `MATRIX_TREE` with its tag renamed; reads stay as they are.
fn within_matrix(mut request: Request) -> Request {
    match &mut request {
        Request::Drop { tree, .. } => *tree = Some(MATRIX_TREE.to_string()),
        Request::Add { tree, .. }
        | Request::Move { tree, .. }
        | Request::Remove { tree, .. }
        | Request::AddByPath { tree, .. } => *tree = TreeKey::new(tree.cid, MATRIX_TREE),
        _ => return request,
    }
    with_items(request, |items| {
        renamed(items, INTRUDER_TAG_KEY, MATRIX_TAG_KEY)
    })
}

/// A call the intruder's role allows: anything but a refusal for rights,
/// and with `expect`, the outcome the input rules predict.
async fn allowed_call(
    workload: &Workload,
    client: &Client,
    (target, request, role): (ReplicaId, Request, CallerRole),
    expect: Option<Expect>,
) -> Result<Response, Error> {
    let what = summarize(&request);
    let expecting = expect.map_or_else(String::new, |e| format!(", expects {e:?}"));
    workload.trace.record(
        &client.name,
        format!("as {role:?} {what} -> replica-{target}{expecting}"),
    );
    let answer = client
        .call(target, request.clone(), workload.call_timeout)
        .await;
    let coverage = &workload.world.hooks.coverage;
    let mut ledger = workload.ledger.lock().unwrap();
    let record = &mut ledger.intruder;
    record.sent += 1;
    record.allowed += 1;
    let judged = expect.map(|expect| outcome::judge(expect, &request, &answer));
    match &answer {
        Ok(Response::Error(error @ Error::PermissionDenied { .. })) => {
            let refused = format!("{what} as {role:?} on replica-{target}: {error}");
            workload
                .trace
                .record(&client.name, format!("WRONGLY REFUSED {refused}"));
            record.wrongly_refused.push(refused);
        }
        Ok(_) => coverage.hit(Coverage::RightsAllowed),
        Err(_) => record.unanswered += 1,
    }
    match judged {
        Some(Judged::Disagrees(why)) => {
            let wrong = format!("{what} as {role:?} on replica-{target}: {why}");
            workload
                .trace
                .record(&client.name, format!("WRONG OUTCOME {wrong}"));
            record.wrong_outcomes.push(wrong);
        }
        Some(Judged::Agrees) if matches!(expect, Some(Expect::Refused(_))) => {
            coverage.hit(Coverage::RefusedAsModelled)
        }
        _ => {}
    }
    answer
}

/// Ids no op of a run ever creates (their replica part is no replica's),
/// and ids the intruder's moves create (another such part).
const MISSING_ID_MARK: u64 = 0xfff0;
const MOVED_ID_MARK: u64 = 0xff00;

fn marked_id(mark: u64) -> NodeId {
    (thread_rng().gen_range(1..1u64 << 24) << 16) | mark
}

/// A write a role allows, as sent.
enum Shaped {
    /// One call and the outcome the input rules predict for it.
    Call(Request, Expect),
    /// A move of a node under its own child (`cycle`).
    Cycle,
}

/// Reshapes a write its role allows (already in `MATRIX_TREE`) into one
/// of the cases of docs/design.md §4 whose outcome is known beforehand,
/// at a replica that `holds` the container or not; reads are served. A
/// write predicted refused carries `INTRUDER_TAG_KEY`, which no replica
/// may hold afterwards.
fn shape(request: Request, holds: bool) -> Shaped {
    use Refusal::*;
    let pick = |n: u32| thread_rng().gen_range(0..n);
    let (request, expect) = match request {
        Request::Add { tree, items, .. } => match pick(2) {
            0 => (
                Request::Add {
                    tree,
                    parent: ROOT,
                    items,
                },
                Expect::Accepted,
            ),
            _ => {
                let parent = marked_id(MISSING_ID_MARK);
                (
                    Request::Add {
                        tree,
                        parent,
                        items,
                    },
                    Expect::Refused(ParentNotLive),
                )
            }
        },
        Request::Move { tree, items, .. } => {
            let (parent, node, expect) = match pick(5) {
                0 => (ROOT, marked_id(MOVED_ID_MARK), Expect::Accepted),
                1 => (ROOT, ROOT, Expect::Refused(RootImmutable)),
                2 => (ROOT, TRASH, Expect::Refused(InvalidOp)),
                3 => {
                    let parent = marked_id(MISSING_ID_MARK);
                    (
                        parent,
                        marked_id(MOVED_ID_MARK),
                        Expect::Refused(ParentNotLive),
                    )
                }
                _ if holds => return Shaped::Cycle,
                _ => (ROOT, marked_id(MOVED_ID_MARK), Expect::Accepted),
            };
            let request = Request::Move {
                tree,
                parent,
                node,
                items,
            };
            (request, expect)
        }
        Request::Remove { tree, .. } => {
            let (node, expect) = match pick(3) {
                0 => (marked_id(MISSING_ID_MARK), Expect::Refused(NodeNotFound)),
                1 => (ROOT, Expect::Refused(RootImmutable)),
                _ => (TRASH, Expect::Refused(InvalidOp)),
            };
            (Request::Remove { tree, node }, expect)
        }
        Request::AddByPath {
            tree, path, items, ..
        } => {
            let (attr, path, expect) = match pick(3) {
                0 => (ATTR_FILE_NAME.to_string(), path, Expect::Accepted),
                1 => (
                    ATTR_FILE_NAME.to_string(),
                    Vec::new(),
                    Expect::Refused(EmptyPath),
                ),
                _ => (
                    "Name".to_string(),
                    path,
                    Expect::Refused(UnsupportedAttribute),
                ),
            };
            let request = Request::AddByPath {
                tree,
                attr,
                path,
                items,
            };
            (request, expect)
        }
        Request::Drop { .. } => (request, Expect::Served),
        read => (read, Expect::Served),
    };
    let expect = expect.at(holds);
    let request = if expect.refused() {
        untag(request)
    } else {
        request
    };
    Shaped::Call(request, expect)
}

/// A write's `MATRIX_TAG_KEY` turned back into `INTRUDER_TAG_KEY`.
fn untag(request: Request) -> Request {
    with_items(request, |items| {
        renamed(items, MATRIX_TAG_KEY, INTRUDER_TAG_KEY)
    })
}

/// `items` with the key `from` renamed `to`.
pub fn renamed(items: Vec<KeyValue>, from: &str, to: &str) -> Vec<KeyValue> {
    items
        .into_iter()
        .map(|kv| match kv.key == from {
            true => KeyValue::new(to, kv.value),
            false => kv,
        })
        .collect()
}

/// A local write with `change` applied to its meta; other requests as
/// they are.
fn with_items(request: Request, change: impl Fn(Vec<KeyValue>) -> Vec<KeyValue>) -> Request {
    match request {
        Request::Add {
            tree,
            parent,
            items,
        } => Request::Add {
            tree,
            parent,
            items: change(items),
        },
        Request::Move {
            tree,
            parent,
            node,
            items,
        } => Request::Move {
            tree,
            parent,
            node,
            items: change(items),
        },
        Request::AddByPath {
            tree,
            attr,
            path,
            items,
        } => Request::AddByPath {
            tree,
            attr,
            path,
            items: change(items),
        },
        other => other,
    }
}

/// A move that would make a cycle, at a replica holding the container:
/// `a` under ROOT, `b` under `a`, then `a` under `b`. The move is
/// accepted (an op the tree logs, docs/design.md §2) and must leave `a`
/// under ROOT, which a read of `a` at the same replica shows. (A drop of
/// the tree meanwhile can refuse the later calls for a missing parent.)
async fn cycle(workload: &Workload, client: &Client, target: ReplicaId, request: &Request) {
    let Request::Move { tree, items, .. } = request else {
        unreachable!("a cycle is shaped from a Move");
    };
    let tree = tree.clone();
    let call = |request: Request| (target, request, CallerRole::Writer);
    let add = |parent| Request::Add {
        tree: tree.clone(),
        parent,
        items: items.clone(),
    };
    let added = |answer: Result<Response, Error>| match answer {
        Ok(Response::Added { node }) => Some(node),
        _ => None,
    };
    let first = allowed_call(workload, client, call(add(ROOT)), Some(Expect::Accepted)).await;
    let Some(a) = added(first) else { return };
    let gone = Expect::AcceptedOr(Refusal::ParentNotLive);
    let Some(b) = added(allowed_call(workload, client, call(add(a)), Some(gone)).await) else {
        return;
    };
    let back = Request::Move {
        tree: tree.clone(),
        parent: b,
        node: a,
        items: items.clone(),
    };
    match allowed_call(workload, client, call(back), Some(gone)).await {
        Ok(Response::Done | Response::Error(Error::NotReplicated { .. })) => {}
        _ => return,
    }
    let read = Request::GetMeta {
        tree: tree.clone(),
        node: a,
    };
    let answer = client.call(target, read, workload.call_timeout).await;
    let Ok(Response::Nodes(nodes)) = answer else {
        return;
    };
    let mut ledger = workload.ledger.lock().unwrap();
    match nodes.first() {
        Some(node) if node.parent == ROOT => workload
            .world
            .hooks
            .coverage
            .hit(Coverage::CycleMoveSkipped),
        other => {
            let wrong = format!(
                "Move of {a} under its child {b} on replica-{target} left it at {:?}",
                other.map(|n| n.parent)
            );
            workload
                .trace
                .record(&client.name, format!("WRONG OUTCOME {wrong}"));
            ledger.intruder.wrong_outcomes.push(wrong);
        }
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

/// A hostile call in brief for the trace: its kind, and the stamps of an
/// Apply or the tree of a Drop.
pub(super) fn summarize(request: &Request) -> String {
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
