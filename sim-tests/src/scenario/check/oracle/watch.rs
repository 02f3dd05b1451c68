//! The oracles that run during the run: `AnswerOracle` holds every answer
//! a client gets (and a sample of the sync reads peers get) to the model
//! of the answering replica's log, and keeps the clients' sessions;
//! `SyncWatch` checks each pull pass against the peer's log.

use super::expect::{check_read, is_read, tree_of, wrong_detail, Checked};
use super::TreeView;
use crate::coverage::{Coverage, CoverageCounter};
use crate::failure::{Failure, FailureKind, Verdict};
use crate::scenario::workload::summarize_request as brief;
use crate::world::hooks::{AnswerWatch, PullWatch, Seen};
use crate::world::World;
use arbor::forest::{CursorKind, Forest};
use arbor::proto::{Request, Response};
use arbor::service::{PullPass, Service};
use arbor::{Caller, ReplicaId, Timestamp, TreeKey};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// One in this many sync reads (peers' GetOpLog, GetOpLogStamps,
/// TreeList) is held to the model: they outnumber client reads ten to one,
/// and each check reads the whole tree. Client reads are all checked.
const PEER_READ_SAMPLE: u64 = 128;
/// One in this many of the clients' log and tree-list reads is checked
/// (every checkpoint pages through each whole log); their reads of the
/// tree itself are all checked.
const CLIENT_LOG_READ_SAMPLE: u64 = 4;

/// One in this many acknowledged AddByPaths has its choice of directories
/// held to the model (`AnswerOracle::path_choice`): each check rebuilds
/// the model of the replica's log as it stood before the write.
const PATH_CHECK_SAMPLE: u64 = 4;

/// The client a caller is: one named by its connection, or a gateway
/// named by the key that signed its gRPC call; `None` for a replica or
/// an anonymous caller.
fn client_name(caller: &Caller) -> Option<String> {
    match caller {
        Caller::Client(name) => Some(name.clone()),
        Caller::Key(key) => Some(format!("key {key}")),
        _ => None,
    }
}

/// The reads of a log or of the tree list, not of a tree's state.
fn is_log_read(request: &Request) -> bool {
    matches!(
        request,
        Request::GetOpLog { .. } | Request::GetOpLogStamps { .. } | Request::TreeList { .. }
    )
}
/// Ops read per page of a peer's log when a pull pass is checked.
const PEER_LOG_PAGE: usize = 1024;

/// A client's session with one replica and tree: the incarnation of the
/// tree it is about, and the ops the replica must still hold at the
/// client's next read there (its acknowledged creations, and everything an
/// earlier read was answered from). A drop ends the session: a read of
/// another incarnation starts a new one (docs/design.md §6).
type Sessions = BTreeMap<(String, ReplicaId, TreeKey), (u64, BTreeSet<Timestamp>)>;

/// The last view read of each (replica, tree), with the incarnation and
/// log height it was read at: within one incarnation a log of the same
/// height is the same log (a replica's log only grows), so the view, and
/// the model built for it, serve again.
type Views = BTreeMap<(ReplicaId, TreeKey), ((Option<u64>, u64), Arc<TreeView>)>;

pub struct AnswerOracle {
    verdict: Verdict,
    coverage: CoverageCounter,
    peer_reads: AtomicU64,
    /// Acknowledged AddByPaths seen, for `PATH_CHECK_SAMPLE`.
    paths_acked: AtomicU64,
    sessions: Mutex<Sessions>,
    views: Mutex<Views>,
    /// Clients whose answers are not this oracle's to judge: the intruder
    /// holds no right, so its refusals are checked by the intruder checker.
    strangers: BTreeSet<String>,
}

impl AnswerOracle {
    pub fn new(verdict: Verdict, coverage: CoverageCounter) -> Self {
        Self {
            verdict,
            coverage,
            peer_reads: AtomicU64::new(0),
            paths_acked: AtomicU64::new(0),
            sessions: Mutex::default(),
            views: Mutex::default(),
            strangers: BTreeSet::new(),
        }
    }

    /// Leaves the calls of client `name` unjudged.
    pub fn ignoring(mut self, name: String) -> Self {
        self.strangers.insert(name);
        self
    }

    /// The replica's tree as it is now; `Err` when it cannot be read.
    fn view(
        &self,
        replica: ReplicaId,
        forest: &Forest,
        tree: &TreeKey,
    ) -> Result<Option<Arc<TreeView>>, arbor::Error> {
        // A re-created tree may reach a height its dropped incarnation was
        // seen at: the incarnation is part of what a cached view is of.
        let at_now = (forest.tree_incarnation(tree)?, forest.next_height(tree)?);
        let height = at_now.1;
        let key = (replica, tree.clone());
        let cached = self.views.lock().unwrap().get(&key).cloned();
        let view = match cached {
            Some((at, view)) if at == at_now => return Ok(Some(view)),
            // The same incarnation, grown since: read only the new heights.
            Some(((incarnation, seen), view)) if incarnation == at_now.0 && seen < height => {
                let more = forest.get_op_log(tree, seen, (height - seen) as usize)?;
                assert!(
                    more.iter().map(|e| e.height).eq(seen..height),
                    "the log's heights {seen}..{height} are all stored"
                );
                let more: Vec<arbor::Move> = more.into_iter().map(|e| e.op).collect();
                view.extended(&more)
            }
            _ => match TreeView::read(forest, tree)? {
                Some(view) => view,
                None => return Ok(None),
            },
        };
        assert_eq!(
            view.first_height + view.log.len() as u64,
            height,
            "one read, one log"
        );
        let view = Arc::new(view);
        self.views
            .lock()
            .unwrap()
            .insert(key, (at_now, view.clone()));
        Ok(Some(view))
    }

    /// A client's write answer: the node it names carries what this caller
    /// sent (unless a newer op changed it already), and its creations join
    /// the session.
    fn acked(&self, client: &str, service: &Service, seen: &Seen, response: &Response) {
        let request = &seen.request;
        let replica = service.config().node.replica_id;
        let (tree, items, created): (&TreeKey, _, Vec<Timestamp>) = match (request, response) {
            (Request::Add { tree, items, .. }, Response::Added { node }) => {
                (tree, items, vec![*node])
            }
            (
                Request::AddByPath { tree, items, .. },
                Response::AddedByPath { leaf, created, .. },
            ) => (
                tree,
                items,
                created.iter().copied().chain([*leaf]).collect(),
            ),
            _ => return,
        };
        let leaf = *created.last().expect("a creation names its node");
        let forest = service.forest();
        // A drop since the write leaves nothing of it to check, or to hold.
        let Ok(Some(node)) = forest.get_node(tree, leaf) else {
            return;
        };
        let Ok(Some(incarnation)) = forest.tree_incarnation(tree) else {
            return;
        };
        if node.meta.time == leaf && node.meta.items != *items {
            self.verdict.fail(Failure::new(
                FailureKind::BrokenPromise,
                format!(
                    "replica-{replica} answered {client} with node {leaf}, which carries {:?}; the caller sent {items:?}",
                    node.meta.items
                ),
            ));
        }
        // The path is held to the incarnation the write went into, and
        // only one that stood through the whole call is known to be it: a
        // write that a drop overtook may come back by sync into the next
        // incarnation, its leaf alone, under a directory of the dropped
        // one.
        let one_incarnation = seen.before.and_then(|(before, _)| before) == Some(incarnation);
        if matches!(request, Request::AddByPath { .. })
            && self
                .paths_acked
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(PATH_CHECK_SAMPLE)
            && one_incarnation
        {
            if let Some(wrong) = self.path_choice(replica, forest, request, response) {
                self.verdict.fail(Failure::new(
                    FailureKind::WrongAnswer,
                    format!(
                        "replica-{replica} answered {client}'s {}: {wrong}",
                        brief(request)
                    ),
                ));
            }
        }
        let key = (client.to_string(), replica, tree.clone());
        let mut sessions = self.sessions.lock().unwrap();
        let session = sessions.entry(key).or_default();
        if session.0 != incarnation {
            *session = (incarnation, BTreeSet::new());
        }
        session.1.extend(created);
    }

    /// The path oracle: an acknowledged AddByPath put its leaf under the
    /// directories its path named in the replica's tree as it stood just
    /// before the write (the log below the write's first op), created
    /// exactly the missing ones, parents first, and answered the leaf's
    /// parent. The model resolves the path in that state (`find_dir`: an
    /// internal child of that name, the smallest id among duplicates) and
    /// its ops must match the logged ones op for op. `None`: agreed, or
    /// nothing to hold it to (a drop since, a disk error).
    fn path_choice(
        &self,
        replica: ReplicaId,
        forest: &Forest,
        request: &Request,
        response: &Response,
    ) -> Option<String> {
        let (
            Request::AddByPath {
                tree, path, items, ..
            },
            Response::AddedByPath {
                leaf,
                created,
                parent,
            },
        ) = (request, response)
        else {
            return None;
        };
        let written: Vec<Timestamp> = created.iter().copied().chain([*leaf]).collect();
        let height = forest.op_height(tree, written[0]).ok()??;
        let view = self.view(replica, forest, tree).ok()??;
        let end = view.first_height + view.log.len() as u64;
        if height < view.first_height || height >= end {
            return None;
        }
        let late = forest
            .get_op_log(tree, height, (end - height) as usize)
            .ok()?;
        let gone: BTreeSet<Timestamp> = late.iter().map(|entry| entry.op.ts()).collect();
        let before = view.without(&gone);
        let expected = before.model().add_by_path_ops(path, items, replica);
        if expected.len() != written.len() {
            return Some(format!(
                "created {} directories where the path {path:?} lacked {} in the tree before it",
                created.len(),
                expected.len() - 1
            ));
        }
        // The model numbers its ops from its own counter; the engine's are
        // the written ones (a re-created tree keeps its counter): map the
        // model's ids onto the written ones.
        let ids: BTreeMap<Timestamp, Timestamp> = expected
            .iter()
            .map(|op| op.ts())
            .zip(written.iter().copied())
            .collect();
        for (model_op, &ts) in expected.iter().zip(&written) {
            let logged = late.iter().find(|entry| entry.op.ts() == ts)?;
            let want_parent = ids
                .get(&model_op.parent)
                .copied()
                .unwrap_or(model_op.parent);
            if logged.op.parent != want_parent {
                return Some(format!(
                    "logged op {ts} under {}; in the tree before the write the model puts it under {want_parent}",
                    logged.op.parent
                ));
            }
            if logged.op.meta.items != model_op.meta.items {
                return Some(format!(
                    "logged op {ts} with {:?}; the model's op carries {:?}",
                    logged.op.meta.items, model_op.meta.items
                ));
            }
        }
        let leaf_parent = late.iter().find(|entry| entry.op.ts() == *leaf)?.op.parent;
        if *parent != leaf_parent {
            return Some(format!(
                "answered parent {parent} for a leaf logged under {leaf_parent}"
            ));
        }
        self.coverage.hit(Coverage::AddByPathResolved);
        None
    }

    /// Read-your-writes and monotonic reads: the log this read was
    /// answered from holds everything the session holds; it becomes the
    /// session. (Its answer was checked against the model of that log.)
    fn session_read(&self, client: &str, replica: ReplicaId, tree: &TreeKey, view: &TreeView) {
        let now = view.timestamps();
        let key = (client.to_string(), replica, tree.clone());
        let mut sessions = self.sessions.lock().unwrap();
        let session = sessions.entry(key).or_default();
        if session.0 != view.incarnation {
            *session = (view.incarnation, BTreeSet::new());
        }
        if let Some(lost) = session.1.difference(now).next() {
            self.verdict.fail(Failure::new(
                FailureKind::SessionGuarantee,
                format!(
                    "{client} read {:?}/{} on replica-{replica}, whose log lacks op {lost} \
                     that the client wrote or read there before",
                    tree.cid, tree.tree
                ),
            ));
        }
        session.1.clone_from(now);
    }
}

impl AnswerWatch for AnswerOracle {
    fn disk_replaced(&self, replica: ReplicaId) {
        self.sessions
            .lock()
            .unwrap()
            .retain(|(_, r, _), _| *r != replica);
        self.views.lock().unwrap().retain(|(r, _), _| *r != replica);
    }

    fn wants(&self, service: &Service, caller: &Caller, request: &Request) -> Option<Seen> {
        let sampled = |every: u64| {
            let count = self.peer_reads.fetch_add(1, Ordering::Relaxed);
            count.is_multiple_of(every)
        };
        let wanted = match client_name(caller) {
            Some(name) if self.strangers.contains(&name) => false,
            Some(_) if is_log_read(request) => sampled(CLIENT_LOG_READ_SAMPLE),
            Some(_) => {
                is_read(request)
                    || matches!(request, Request::Add { .. } | Request::AddByPath { .. })
            }
            None => is_read(request) && sampled(PEER_READ_SAMPLE),
        };
        // A write's tree too: its path is held to the incarnation it
        // went into (`acked`).
        let tree = match request {
            Request::Add { tree, .. } | Request::AddByPath { tree, .. } => Some(tree),
            _ => tree_of(request),
        };
        wanted.then(|| Seen {
            request: request.clone(),
            before: tree.and_then(|tree| tree_heights(service.forest(), tree)),
        })
    }

    fn answered(
        &self,
        replica: ReplicaId,
        service: &Service,
        caller: &Caller,
        seen: Seen,
        response: &Response,
    ) {
        let request = &seen.request;
        let client = client_name(caller);
        let client = client.as_deref();
        if !is_read(request) {
            if let Some(client) = client {
                self.acked(client, service, &seen, response);
            }
            return;
        }
        let forest = service.forest();
        let view = match tree_of(request).map(|tree| self.view(replica, forest, tree)) {
            None => None,
            Some(Ok(view)) => view,
            // A poisoned database (disk errors): nothing to compare with.
            Some(Err(_)) => return,
        };
        let now = view.clone();
        let (checked, view) = check_during_call(request, response, view, seen.before, forest);
        match checked {
            Checked::Agreed(kind) => {
                self.coverage.hit(kind);
                let earlier = match (&now, &view) {
                    (Some(now), Some(view)) => !Arc::ptr_eq(now, view),
                    _ => false,
                };
                if earlier {
                    self.coverage.hit(Coverage::ReadDuringCommits);
                }
            }
            Checked::Skipped => {}
            Checked::Wrong(wrong) => {
                let detail = wrong_detail(replica, request, &wrong);
                self.verdict
                    .fail(Failure::new(FailureKind::WrongAnswer, detail));
            }
        }
        if let (Some(client), Some(tree), Some(view)) = (client, tree_of(request), &view) {
            self.session_read(client, replica, tree, view);
        }
    }
}

/// A tree's incarnation and next height; `None` when they cannot be read.
fn tree_heights(forest: &Forest, tree: &TreeKey) -> Option<(Option<u64>, u64)> {
    Some((
        forest.tree_incarnation(tree).ok()?,
        forest.next_height(tree).ok()?,
    ))
}

/// Checks a read's answer against the state it was computed from: some
/// state of the call. With no commit meanwhile that is the tree `now`;
/// otherwise any state of the same incarnation from the height before the
/// call up to now (a read that spent simulated disk time slept after its
/// work), earliest first, and the state that agreed is the one returned. A
/// drop or re-creation during the call leaves nothing to compare with.
fn check_during_call(
    request: &Request,
    response: &Response,
    now: Option<Arc<TreeView>>,
    before: Option<(Option<u64>, u64)>,
    forest: &Forest,
) -> (Checked, Option<Arc<TreeView>>) {
    let checked = check_read(request, response, now.as_deref(), forest);
    let (Checked::Wrong(_), Some(view), Some((incarnation, height))) = (&checked, &now, before)
    else {
        return (checked, now);
    };
    let end = view.first_height + view.log.len() as u64;
    if height == end && incarnation == Some(view.incarnation) {
        return (checked, now);
    }
    let tree = tree_of(request).expect("a read of a tree");
    // Another incarnation, or a log that is not longer than at the call's
    // start: no states to go back through.
    if incarnation != Some(view.incarnation) || height >= end {
        return (Checked::Skipped, None);
    }
    let Ok(late) = forest.get_op_log(tree, height, (end - height) as usize) else {
        return (Checked::Skipped, None);
    };
    assert_eq!(late.len() as u64, end - height, "one read, one log");
    let mut gone: BTreeSet<Timestamp> = late.iter().map(|entry| entry.op.ts()).collect();
    for entry in &late {
        let earlier = view.without(&gone);
        let again = check_read(request, response, Some(&earlier), forest);
        if !matches!(again, Checked::Wrong(_)) {
            return (again, Some(Arc::new(earlier)));
        }
        gone.remove(&entry.op.ts());
    }
    (checked, now)
}

/// After each pull pass, every op of the peer below the puller's cursor,
/// in memory and durable, is in the puller's log: read from both forests
/// by the simulator, not taken from the service.
pub struct SyncWatch {
    world: Weak<World>,
    verdict: Verdict,
    coverage: CoverageCounter,
    /// Per (puller, tree, peer): heights of the peer's log below this
    /// were found in the puller's log already.
    checked: Mutex<BTreeMap<(ReplicaId, TreeKey, ReplicaId), u64>>,
}

impl SyncWatch {
    pub fn new(world: &Arc<World>, verdict: Verdict, coverage: CoverageCounter) -> Self {
        Self {
            world: Arc::downgrade(world),
            verdict,
            coverage,
            checked: Mutex::default(),
        }
    }

    /// The peer's next height, and its ops at heights `from..to` with
    /// their heights (none below its log's first height: a tree created
    /// again after a drop); `None` when they cannot be read (the peer is
    /// down, its database poisoned, or it holds no such tree) or its
    /// machine runs a stand-in (`World::stand_in`), whose log is not the
    /// peer's.
    fn peer_stamps(
        &self,
        peer: ReplicaId,
        tree: &TreeKey,
        from: u64,
        to: u64,
    ) -> Option<(u64, Vec<(u64, Timestamp)>)> {
        let world = self.world.upgrade()?;
        let node = world.node(peer);
        if node.is_stand_in() {
            return None;
        }
        let service = node.service()?;
        if !service.forest().tree_exists(tree).ok()? {
            return None;
        }
        let next_height = service.forest().next_height(tree).ok()?;
        let mut stamps = Vec::new();
        let mut at = from;
        while at < to {
            let limit = PEER_LOG_PAGE.min((to - at) as usize);
            let page = service.forest().get_op_log(tree, at, limit).ok()?;
            if page.is_empty() {
                break;
            }
            at = page.last().expect("not empty").height + 1;
            let below = page.iter().take_while(|e| e.height < to);
            stamps.extend(below.map(|e| (e.height, e.op.ts())));
        }
        Some((next_height, stamps))
    }

    /// The pass counted heights of a log the peer no longer has: its disk
    /// was replaced after the puller's round verified its log epoch. The
    /// puller's next round learns the new epoch and starts its cursors
    /// over (docs/design.md §6); until then its cursor says nothing about
    /// the rebuilt log.
    fn epoch_replaced(&self, pass: &PullPass) -> bool {
        let Some(world) = self.world.upgrade() else {
            return false;
        };
        let Some(service) = world.node(pass.peer).service() else {
            return false;
        };
        match (pass.log_epoch, service.forest().log_epoch()) {
            (Some(counted), Ok(Some(current))) => counted != current,
            _ => false,
        }
    }

    fn check(&self, puller: ReplicaId, forest: &Forest, pass: &PullPass) -> Result<(), String> {
        let Ok(durable) = forest.cursor(pass.tree, CursorKind::Pull, pass.peer) else {
            return Ok(());
        };
        let upto = pass.cursor.max(durable);
        let key = (puller, pass.tree.clone(), pass.peer);
        let from = self.checked.lock().unwrap().get(&key).copied().unwrap_or(0);
        if upto <= from {
            return Ok(());
        }
        if self.epoch_replaced(pass) {
            return Ok(());
        }
        let Some((peer_next, stamps)) = self.peer_stamps(pass.peer, pass.tree, from, upto) else {
            return Ok(());
        };
        if peer_next < upto {
            return Err(format!(
                "cursor {upto} beyond the peer's log, which ends at {peer_next}"
            ));
        }
        let timestamps: Vec<Timestamp> = stamps.iter().map(|&(_, ts)| ts).collect();
        let Ok(held) = forest.held_digests(pass.tree, &timestamps) else {
            return Ok(());
        };
        if let Some(at) = held.iter().position(|h| h.is_none()) {
            let (height, ts) = stamps[at];
            return Err(format!("the peer's op {ts} at height {height} is not here"));
        }
        self.checked.lock().unwrap().insert(key, upto);
        self.coverage.hit(Coverage::PullPassChecked);
        Ok(())
    }
}

impl PullWatch for SyncWatch {
    fn disk_replaced(&self, replica: ReplicaId) {
        let mut checked = self.checked.lock().unwrap();
        checked.retain(|(puller, _, peer), _| *puller != replica && *peer != replica);
    }

    fn pass_ended(&self, puller: ReplicaId, forest: &Arc<Forest>, pass: &PullPass) {
        self.coverage.add(Coverage::DeliveredBySync, pass.fresh);
        if let Err(wrong) = self.check(puller, forest, pass) {
            let tree = pass.tree;
            self.verdict.fail(Failure::new(
                FailureKind::SyncCursor,
                format!(
                    "replica-{puller} pulling {:?}/{} from replica-{} (cursor {}): {wrong}",
                    tree.cid, tree.tree, pass.peer, pass.cursor
                ),
            ));
        }
    }
}
