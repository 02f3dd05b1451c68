//! The object-gateway workload: S3-style clients adding objects by path into
//! "version" trees and system records into "system" trees, moving and
//! removing nodes (cycle-creating moves included), creating same-name
//! directories concurrently on different replicas, and reading. Every
//! acknowledged write goes into the ledger the checkers hold the cluster to.
//!
//! `gateway_mix` is the gateway profile's op mix; `intruder` a client with
//! no right on anything, whose every call must be refused.

pub mod gateway_mix;
pub mod intruder;
pub mod rogue;

use super::check::invariants;
use super::check::ledger::{self, Ledger, MOVE_TAG_KEY};
use super::check::oracle;
use super::plan::client_rng;
use crate::coverage::Coverage;
use crate::failure::Verdict;
use crate::trace::Trace;
use crate::world::{Client, World};
use arbor::proto::{Request, Response};
use arbor::{ContainerId, KeyValue, NodeId, ReplicaId, TreeKey, ATTR_FILE_NAME, ROOT};
use madsim::rand::Rng;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Directory names objects are spread over; few, so that replicas often
/// create the same one concurrently.
const DIRECTORIES: u64 = 6;
/// The directory every client writes to in the opening burst.
pub const SHARED_DIRECTORY: &str = "dir-shared";

/// The containers and trees of the workload.
pub fn containers() -> Vec<ContainerId> {
    (1..=2u8).map(|k| ContainerId([k; 32])).collect()
}

pub fn version_tree(cid: ContainerId) -> TreeKey {
    TreeKey::new(cid, "version")
}

pub fn system_tree(cid: ContainerId) -> TreeKey {
    TreeKey::new(cid, "system")
}

/// Written only by one client's opening burst: a multipart upload record
/// created through one gateway and completed through another. No other op
/// ever lands in this tree, so whatever the opening race leaves (an op
/// older than the whole log of the replica it reaches) stays visible.
pub fn multipart_tree(cid: ContainerId, client: usize) -> TreeKey {
    TreeKey::new(cid, format!("multipart-{client}"))
}

/// Everything a client needs.
pub struct Workload {
    pub world: Arc<World>,
    pub trace: Trace,
    pub ledger: Mutex<Ledger>,
    /// The run's first failure.
    pub verdict: Verdict,
    pub call_timeout: Duration,
    /// Clients issue the gateway's call sequences (`scenario::workload::gateway_mix`)
    /// instead of the standard mix.
    pub gateway: bool,
    next_op: Mutex<u64>,
}

impl Workload {
    pub fn new(world: Arc<World>, verdict: Verdict, call_timeout: Duration, gateway: bool) -> Self {
        Self {
            gateway,
            trace: world.trace.clone(),
            world,
            ledger: Mutex::default(),
            verdict,
            call_timeout,
            next_op: Mutex::new(0),
        }
    }

    pub(super) fn op_id(&self) -> u64 {
        let mut next = self.next_op.lock().unwrap();
        *next += 1;
        *next
    }

    /// The replicas holding a container.
    pub fn replicas_of(&self, cid: &ContainerId) -> Vec<ReplicaId> {
        self.world.replicas_of(cid)
    }

    pub(super) fn random_replica(&self, cid: &ContainerId) -> ReplicaId {
        let ids = self.replicas_of(cid);
        ids[client_rng().gen_range(0..ids.len())]
    }

    pub(super) fn random_known(&self, tree: &TreeKey) -> Option<NodeId> {
        let ledger = self.ledger.lock().unwrap();
        let known = ledger.known.get(tree)?;
        if known.is_empty() {
            return None;
        }
        Some(known[client_rng().gen_range(0..known.len())])
    }
}

/// Seven meta fields of an object version, the leaf's name first.
pub(super) fn object_meta(name: &str, op: u64) -> Vec<KeyValue> {
    vec![
        KeyValue::new(ATTR_FILE_NAME, name.as_bytes()),
        KeyValue::new("OID", format!("oid-{op:08x}").into_bytes()),
        KeyValue::new("Size", (op * 37 % 100_000).to_string().into_bytes()),
        KeyValue::new("Created", (1_700_000_000 + op).to_string().into_bytes()),
        KeyValue::new("Owner", b"sim-owner".to_vec()),
        KeyValue::new(
            "ETag",
            format!("{:032x}", u128::from(op) * 0x9e37_79b9).into_bytes(),
        ),
        KeyValue::new("IsUnversioned", b"false".to_vec()),
    ]
}

/// One client: a closed loop of `ops` random operations (the run may
/// outlast the fault phase when calls time out a lot; the op count is the
/// scenario's size, so it is kept).
pub async fn run_client(workload: Arc<Workload>, client: Client, ops: u64, think_mean: Duration) {
    opening_burst(&workload, &client).await;
    for _ in 0..ops {
        if workload.verdict.failed() {
            break;
        }
        super::plan::begin_op();
        let think_ms = client_rng().gen_range(0..=2 * think_mean.as_millis() as u64);
        madsim::time::sleep(Duration::from_millis(think_ms)).await;
        if super::plan::op_skipped() {
            continue;
        }
        random_op(&workload, &client).await;
    }
}

/// Every client creates an object in the same new directory at once, each
/// on a different replica: concurrent same-name directories. Then it starts
/// a multipart upload on its replica and at once completes it through the
/// next one, which may not have the record yet: the create reaches that
/// replica older than anything in its log.
async fn opening_burst(workload: &Workload, client: &Client) {
    let cid = containers()[0];
    let ids = workload.replicas_of(&cid);
    let index: usize = client
        .name
        .trim_start_matches("client-")
        .parse()
        .unwrap_or(0);
    let home = ids[index % ids.len()];
    let op = workload.op_id();
    let name = format!("obj-{op}");
    add_by_path(
        workload,
        client,
        home,
        version_tree(cid),
        SHARED_DIRECTORY.into(),
        name,
        op,
    )
    .await;

    let cid = containers()[1];
    let ids = workload.replicas_of(&cid);
    let home = ids[index % ids.len()];
    let next = ids[(index + 1) % ids.len()];
    let tree = multipart_tree(cid, index);
    let op = workload.op_id();
    if let Some(node) = add_system(workload, client, home, tree.clone(), op, ROOT).await {
        let op = workload.op_id();
        move_node(workload, client, next, tree, node, ROOT, op).await;
    }
}

async fn random_op(workload: &Workload, client: &Client) {
    if workload.gateway {
        return gateway_mix::gateway_op(workload, client).await;
    }
    let cids = containers();
    let cid = cids[client_rng().gen_range(0..cids.len())];
    let replica = workload.random_replica(&cid);
    let op = workload.op_id();
    let roll = client_rng().gen_range(0..100);
    match roll {
        0..=34 => {
            let dir = format!("dir-{}", client_rng().gen_range(0..DIRECTORIES));
            add_by_path(
                workload,
                client,
                replica,
                version_tree(cid),
                dir,
                format!("obj-{op}"),
                op,
            )
            .await;
        }
        35..=54 => {
            let tree = system_tree(cid);
            let parent = match workload.random_known(&tree) {
                Some(node) if client_rng().gen_bool(0.5) => node,
                _ => ROOT,
            };
            add_system(workload, client, replica, tree, op, parent).await;
        }
        55..=69 => {
            let tree = pick_tree(cid);
            move_random(workload, client, replica, tree, op).await;
        }
        70..=74 => cycle_race(workload, client, pick_tree(cid), op).await,
        75..=81 => remove_random(workload, client, replica, pick_tree(cid), op).await,
        82..=83 => refused_add(workload, client, replica, version_tree(cid), op).await,
        84 => drop_random(workload, client, cid, op).await,
        _ => read_random(workload, client, replica, op).await,
    }
}

fn pick_tree(cid: ContainerId) -> TreeKey {
    if client_rng().gen_bool(0.5) {
        version_tree(cid)
    } else {
        system_tree(cid)
    }
}

/// Sends one request and records it; `Some(response)` when the replica
/// answered with anything but an error.
pub(super) async fn call(
    workload: &Workload,
    client: &Client,
    replica: ReplicaId,
    op: u64,
    request: Request,
) -> Option<Response> {
    let summary = summarize_request(&request);
    workload.trace.record(
        &client.name,
        format!("op#{op} {summary} -> replica-{replica}"),
    );
    let mark = ledger::mark_of(&request);
    {
        let mut ledger = workload.ledger.lock().unwrap();
        ledger.ops_sent += 1;
        ledger.marks_sent.extend(mark.clone());
    }
    let end_to_end = client
        .speaks_grpc()
        .then(|| oracle::end_to_end::before(&workload.world, replica, &request))
        .flatten()
        .map(|before| (before, request.clone()));
    let result = client.call(replica, request, workload.call_timeout).await;
    if let (Some((before, request)), Ok(response)) = (end_to_end, &result) {
        let coverage = &workload.world.hooks.coverage;
        let judges = (&workload.verdict, coverage);
        oracle::end_to_end::check(&workload.world, judges, replica, &request, response, before);
    }
    let answered = result.is_ok();
    let outcome = match &result {
        Ok(Response::Error(e)) => Err(e.clone()),
        Ok(response) => Ok(response.clone()),
        Err(e) => Err(e.clone()),
    };
    match &outcome {
        Ok(response) => workload.trace.record(
            &client.name,
            format!("op#{op} ok {}", summarize_response(response)),
        ),
        Err(e) => workload
            .trace
            .record(&client.name, format!("op#{op} failed: {e}")),
    }
    let mut ledger = workload.ledger.lock().unwrap();
    match outcome {
        Ok(response) => {
            ledger.ops_acked += 1;
            Some(response)
        }
        Err(error) => {
            if error == arbor::Error::Rejoining {
                workload.world.hooks.coverage.hit(Coverage::RejoinRefused);
            }
            if matches!(error, arbor::Error::NotReplicated { .. }) {
                workload.world.hooks.coverage.hit(Coverage::NotReplicated);
            }
            ledger.ops_failed += 1;
            ledger.failed(mark, &error, answered);
            None
        }
    }
}

pub fn summarize_request(request: &Request) -> String {
    match request {
        Request::Add { tree, parent, .. } => {
            format!("Add {:?}/{} under {parent}", tree.cid, tree.tree)
        }
        Request::AddByPath {
            tree, path, items, ..
        } => {
            let leaf = items
                .first()
                .map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
            format!("AddByPath {:?}/{} {path:?} {leaf:?}", tree.cid, tree.tree)
        }
        Request::Move {
            tree, parent, node, ..
        } => format!("Move {:?}/{} {node} under {parent}", tree.cid, tree.tree),
        Request::Remove { tree, node } => format!("Remove {:?}/{} {node}", tree.cid, tree.tree),
        Request::GetNodeByPath { tree, path, .. } => {
            format!("GetNodeByPath {:?}/{} {path:?}", tree.cid, tree.tree)
        }
        Request::GetSubTree { tree, root, depth } => format!(
            "GetSubTree {:?}/{} {root} depth {depth}",
            tree.cid, tree.tree
        ),
        other => format!("{other:?}"),
    }
}

/// An answer in brief: node ids and parents, not their metas.
pub fn summarize_response(response: &Response) -> String {
    match response {
        Response::Nodes(nodes) => {
            let ids: Vec<String> = nodes
                .iter()
                .map(|n| format!("{}@{}", n.id, n.parent))
                .collect();
            format!("Nodes[{}]", ids.join(","))
        }
        other => format!("{other:?}"),
    }
}

/// Records what `replica` acknowledged to a write sent after
/// `drops_answered` drops of its tree had been answered there and
/// `drops_sent` sent to any replica, to its disk `disk`.
fn acknowledged(
    workload: &Workload,
    replica: ReplicaId,
    request: &Request,
    response: &Response,
    (drops_answered, drops_sent, disk): (u64, u64, u64),
) {
    let mut ledger = workload.ledger.lock().unwrap();
    let first = ledger.acked.len();
    ledger.record_after_drops(replica, request, response, drops_answered);
    ledger.sent_to_disk(first, disk);
    for index in first..ledger.acked.len() {
        ledger.drops.sent_before.insert(index, drops_sent);
    }
    if ledger.replaced.ack_replicas >= 2 {
        let coverage = &workload.world.hooks.coverage;
        let acked = (ledger.acked.len() - first) as u64;
        coverage.add(Coverage::AckedByReplicas, acked);
        if ledger.replaced.ack_replicas >= 3 {
            coverage.add(Coverage::AckedByThree, acked);
        }
    }
}

/// The tree a write goes to.
fn written_tree(request: &Request) -> Option<&TreeKey> {
    match request {
        Request::AddByPath { tree, .. }
        | Request::Add { tree, .. }
        | Request::Move { tree, .. }
        | Request::Remove { tree, .. } => Some(tree),
        _ => None,
    }
}

/// Checks on the acking replica the part of the tree invariant the write
/// could break (`check::invariants::after_write`).
fn check_after_write(
    workload: &Workload,
    replica: ReplicaId,
    request: &Request,
    response: &Response,
) {
    // The nodes the write touched, as a ledger records them.
    let touched = Ledger::default().record(replica, request, response);
    let Some(tree) = written_tree(request) else {
        return;
    };
    if let Err(failure) = invariants::after_write(&workload.world, replica, tree, &touched) {
        workload.verdict.fail(failure);
    }
}

/// Sends one write; once answered, records what it acknowledged and
/// checks the acking replica.
pub(super) async fn write(
    workload: &Workload,
    client: &Client,
    replica: ReplicaId,
    op: u64,
    request: Request,
) -> Option<Response> {
    let tree = written_tree(&request).cloned();
    // Drops of the tree answered and sent, by any replica and by this one.
    let drops_before = |ledger: &Ledger| {
        tree.as_ref().map_or((0, 0, 0), |tree| {
            let drops = &ledger.drops;
            let answered_here = drops.answered_by(tree, replica);
            (drops.answered_of(tree), drops.sent_of(tree), answered_here)
        })
    };
    let before = drops_before(&workload.ledger.lock().unwrap());
    let disk = workload.world.disk_generation(replica);
    let response = call(workload, client, replica, op, request.clone()).await?;
    if client.speaks_grpc() && matches!(request, Request::Remove { .. }) {
        // The gRPC Remove answers success for a node the replica does not
        // hold (not yet, or no longer): its answer promises nothing the
        // ledger could hold the replica to.
        return Some(response);
    }
    let after = drops_before(&workload.ledger.lock().unwrap());
    acknowledged(
        workload,
        replica,
        &request,
        &response,
        (before.2, before.1, disk),
    );
    // A drop in flight when the write was sent, sent meanwhile, or still
    // unanswered, may have taken the tree the write went to (then there is
    // nothing to check) or its nodes.
    let no_drop_in_flight = |(answered, sent, _): (u64, u64, u64)| answered == sent;
    if no_drop_in_flight(before) && before.1 == after.1 && no_drop_in_flight(after) {
        check_after_write(workload, replica, &request, &response);
    }
    if before.0 > 0 {
        workload.world.hooks.coverage.hit(Coverage::WriteAfterDrop);
    }
    Some(response)
}

async fn add_by_path(
    workload: &Workload,
    client: &Client,
    replica: ReplicaId,
    tree: TreeKey,
    dir: String,
    name: String,
    op: u64,
) {
    let request = Request::AddByPath {
        tree,
        attr: ATTR_FILE_NAME.into(),
        path: vec![dir],
        items: object_meta(&name, op),
    };
    write(workload, client, replica, op, request).await;
}

pub(super) async fn add_system(
    workload: &Workload,
    client: &Client,
    replica: ReplicaId,
    tree: TreeKey,
    op: u64,
    parent: NodeId,
) -> Option<NodeId> {
    let request = Request::Add {
        tree,
        parent,
        items: vec![
            KeyValue::new(ATTR_FILE_NAME, format!("sys-{op}").into_bytes()),
            KeyValue::new("Lock", format!("owner-{}", op % 7).into_bytes()),
        ],
    };
    match write(workload, client, replica, op, request).await {
        Some(Response::Added { node }) => Some(node),
        _ => None,
    }
}

fn move_items(op: u64) -> Vec<KeyValue> {
    vec![
        KeyValue::new(ATTR_FILE_NAME, format!("moved-{op}").into_bytes()),
        KeyValue::new(MOVE_TAG_KEY, op.to_string().into_bytes()),
    ]
}

async fn move_node(
    workload: &Workload,
    client: &Client,
    replica: ReplicaId,
    tree: TreeKey,
    node: NodeId,
    parent: NodeId,
    op: u64,
) {
    let request = Request::Move {
        tree,
        parent,
        node,
        items: move_items(op),
    };
    write(workload, client, replica, op, request).await;
}

async fn move_random(
    workload: &Workload,
    client: &Client,
    replica: ReplicaId,
    tree: TreeKey,
    op: u64,
) {
    let Some(node) = workload.random_known(&tree) else {
        return;
    };
    let parent = match workload.random_known(&tree) {
        Some(parent) if client_rng().gen_bool(0.9) => parent,
        _ => ROOT,
    };
    move_node(workload, client, replica, tree, node, parent, op).await;
}

/// Moves a under b on one replica while moving b under a on another: the
/// classic concurrent cycle that the CRDT must resolve the same everywhere.
async fn cycle_race(workload: &Workload, client: &Client, tree: TreeKey, op: u64) {
    let (Some(a), Some(b)) = (workload.random_known(&tree), workload.random_known(&tree)) else {
        return;
    };
    let ids = workload.replicas_of(&tree.cid);
    let first = ids[client_rng().gen_range(0..ids.len())];
    let second = ids[(ids.iter().position(|&r| r == first).unwrap() + 1) % ids.len()];
    let op2 = workload.op_id();
    futures::join!(
        move_node(workload, client, first, tree.clone(), a, b, op),
        move_node(workload, client, second, tree.clone(), b, a, op2),
    );
}

async fn remove_random(
    workload: &Workload,
    client: &Client,
    replica: ReplicaId,
    tree: TreeKey,
    op: u64,
) {
    let Some(node) = workload.random_known(&tree) else {
        return;
    };
    let request = Request::Remove { tree, node };
    write(workload, client, replica, op, request).await;
}

/// An AddByPath by another path attribute than FileName: the replica
/// must refuse it (`UnsupportedAttribute`, a definite error) and never
/// apply it.
async fn refused_add(
    workload: &Workload,
    client: &Client,
    replica: ReplicaId,
    tree: TreeKey,
    op: u64,
) {
    let request = Request::AddByPath {
        tree,
        attr: "Name".into(),
        path: vec![format!("dir-{}", op % DIRECTORIES)],
        items: object_meta(&format!("obj-{op}"), op),
    };
    if let Some(response) = call(workload, client, replica, op, request).await {
        workload.verdict.fail(crate::failure::Failure::new(
            crate::failure::FailureKind::BrokenPromise,
            format!("replica-{replica} accepted an AddByPath by attribute Name: {response:?}"),
        ));
    }
}

/// Drops a tree (or, one time in four, the whole container) the way a
/// gateway deletes a bucket: on every replica of the container at once,
/// or, one time in three, on one replica only, whose copy sync then
/// restores from the others (docs/design.md §6). Other clients go on
/// writing to the tree, which comes back as a new incarnation. Only where
/// sync runs: pushes carry each replica's own ops once, so without sync a
/// replica that dropped its copy never gets the others' ops back.
async fn drop_random(workload: &Workload, client: &Client, cid: ContainerId, op: u64) {
    if !workload.world.sync_configured() {
        return;
    }
    // The first container is a long-lived bucket: only its system tree
    // (short-lived records, like a gateway's multipart uploads) is ever
    // dropped, so the writes to its version tree stay under the full
    // promise of §6 whatever drops do elsewhere.
    let long_lived = cid == containers()[0];
    let tree = match client_rng().gen_range(0..4) {
        _ if long_lived => Some(system_tree(cid).tree),
        0 => None,
        1 => Some(version_tree(cid).tree),
        _ => Some(system_tree(cid).tree),
    };
    let replicas = match client_rng().gen_range(0..3) {
        0 => vec![workload.random_replica(&cid)],
        _ => workload.replicas_of(&cid),
    };
    let drops = replicas.into_iter().map(|replica| {
        let tree = tree.clone();
        async move { drop_on(workload, client, replica, cid, tree, op).await }
    });
    futures::future::join_all(drops).await;
}

/// One Drop on one replica, recorded in the ledger before it is sent and
/// when it is answered.
async fn drop_on(
    workload: &Workload,
    client: &Client,
    replica: ReplicaId,
    cid: ContainerId,
    tree: Option<String>,
    op: u64,
) {
    let scope = (cid, tree.clone());
    workload
        .ledger
        .lock()
        .unwrap()
        .drop_sent(scope.clone(), replica);
    let request = Request::Drop { cid, tree };
    workload.trace.record(
        &client.name,
        format!("op#{op} {request:?} -> replica-{replica}"),
    );
    let answer = client.call(replica, request, workload.call_timeout).await;
    let (answered, done) = match &answer {
        Ok(Response::Done) => (true, true),
        Ok(Response::Error(e)) => (ledger::definite(e), false),
        Ok(_) | Err(_) => (false, false),
    };
    workload
        .trace
        .record(&client.name, format!("op#{op} drop: {answer:?}"));
    let what = match &scope.1 {
        Some(_) => Coverage::DropTree,
        None => Coverage::DropContainer,
    };
    if answered {
        (workload.ledger.lock().unwrap()).drop_answered(scope, replica, done);
    }
    if done {
        workload.world.hooks.coverage.hit(what);
    }
    match &answer {
        Err(arbor::Error::Timeout) => workload.world.hooks.coverage.hit(Coverage::DropTimedOut),
        Ok(Response::Error(arbor::Error::Storage(_))) => workload
            .world
            .hooks
            .coverage
            .hit(Coverage::DropStorageError),
        _ => {}
    }
}

/// One read RPC of every kind in turn, picked at random: the answer
/// oracle (`check::oracle::watch`) holds each answer to the model.
async fn read_random(workload: &Workload, client: &Client, replica: ReplicaId, op: u64) {
    let cids: Vec<ContainerId> = containers()
        .into_iter()
        .filter(|cid| workload.replicas_of(cid).contains(&replica))
        .collect();
    let cid = cids[client_rng().gen_range(0..cids.len())];
    let tree = pick_tree(cid);
    let request = match client_rng().gen_range(0..6) {
        0 => match random_leaf_path(workload, &cid) {
            Some((tree, path)) => read_request(tree, path, client_rng().gen_bool(0.5)),
            None => return,
        },
        1 => {
            let root = match workload.random_known(&tree) {
                Some(node) if client_rng().gen_bool(0.5) => node,
                _ => ROOT,
            };
            let depth = client_rng().gen_range(0..=3);
            Request::GetSubTree { tree, root, depth }
        }
        2 => match workload.random_known(&tree) {
            Some(node) => Request::GetMeta { tree, node },
            None => return,
        },
        3 => Request::TreeList { cid },
        4 => Request::GetOpLog {
            tree,
            from_height: client_rng().gen_range(0..200),
            limit: client_rng().gen_range(1..=64),
        },
        _ => Request::GetOpLogStamps {
            tree,
            from_height: client_rng().gen_range(0..200),
            limit: client_rng().gen_range(1..=64),
        },
    };
    let _ = call(workload, client, replica, op, request).await;
}

/// The path of an acknowledged object (or its directory) of `cid`.
fn random_leaf_path(workload: &Workload, cid: &ContainerId) -> Option<(TreeKey, Vec<String>)> {
    let ledger = workload.ledger.lock().unwrap();
    let paths: Vec<&(TreeKey, Vec<String>)> = ledger
        .leaf_paths
        .iter()
        .filter(|(t, _)| t.cid == *cid)
        .collect();
    if paths.is_empty() {
        return None;
    }
    let (tree, path) = paths[client_rng().gen_range(0..paths.len())].clone();
    if client_rng().gen_bool(0.25) {
        return Some((tree, path[..1].to_vec()));
    }
    Some((tree, path))
}

/// The read the checkers compare across replicas.
pub fn read_request(tree: TreeKey, path: Vec<String>, latest_only: bool) -> Request {
    Request::GetNodeByPath {
        tree,
        attr: ATTR_FILE_NAME.into(),
        path,
        attributes: vec![ATTR_FILE_NAME.into(), "OID".into()],
        latest_only,
        all_attributes: false,
    }
}
