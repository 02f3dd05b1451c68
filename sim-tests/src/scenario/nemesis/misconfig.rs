//! The misconfiguration fault (docs/design.md §9, "A replica id twice"):
//! for a window, replica X's machine runs a process whose config claims
//! replica Y's id, on a data directory of its own, then X again.
//!
//! How the run treats it:
//! - The clients' gateway takes X out of rotation for the window (its
//!   health check would name Y) and waits for the calls on their way to X
//!   before the stand-in starts; none of the workload's writes reaches the
//!   stand-in, and the ledger's promises stay the correct replicas' own.
//! - One misled client, whose route was never updated, writes objects to
//!   the stand-in, each tagged `MISCONFIG_TAG_KEY`. Their acknowledgements
//!   are counted as written to a misconfigured node (`MisconfigRecord`,
//!   coverage `MisconfigAcked`), never held against any replica.
//! - The stand-in's ops are stamped as Y from X's address: peers refuse
//!   its pushes, refuse every answer it gives them (the simulated
//!   transport checks the replica id an answer names, as a connection's
//!   `Hello` is checked), and their sync does not pull from a peer
//!   answering as another replica. So no op it wrote may ever reach a
//!   correct replica:
//!   `check::impostor` fails the run when any replica holds a tagged
//!   op. Every op the stand-in wrote is one of those (only clients write).
//! - The stand-in's disk is dropped with it; X boots from its own disk,
//!   which must still hold what it stored (the supervisor checks), and sync
//!   brings it what peers pushed to the stand-in meanwhile.
//! - A window in which a correct replica counted a peer answering as
//!   another replica is counted as detected (coverage `MisconfigDetected`);
//!   such counts fail the run only in a run without a window.

use crate::coverage::Coverage;
use crate::disk::{DiskConfig, SimDisk};
use crate::scenario::workload::{containers, summarize_response, version_tree, Workload};
use crate::world::supervisor::Supervisor;
use crate::world::{Client, StandIn, World};
use arbor::config::Role;
use arbor::proto::{Request, Response};
use arbor::{KeyValue, ReplicaId, ATTR_FILE_NAME, ROOT};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The meta key of every object the misled client writes: no correct
/// replica may ever hold an op with it.
pub const MISCONFIG_TAG_KEY: &str = "misconfig";

/// Objects the misled client writes to one stand-in, spread over its
/// window.
pub const MISLED_WRITES_PER_WINDOW: u64 = 6;

/// Timeout of the misled client's calls.
const MISLED_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// What the misconfiguration windows of a run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MisconfigRecord {
    /// Windows in which a stand-in ran.
    pub windows: u64,
    /// Windows in which some correct replica counted a peer answering as
    /// another replica.
    pub detected: u64,
    pub writes_sent: u64,
    /// Writes the stand-in acknowledged: written to a misconfigured node.
    pub writes_acked: u64,
}

/// The misled client's number: after the intruder's.
pub fn misled_client_index(clients: usize) -> usize {
    clients + 2
}

/// The config of a process on `replica`'s machine that claims to be
/// `claims`: the replica's own file with another id, so it lists neither
/// `claims` as a peer nor `replica` in the containers' replica sets (a
/// file naming a replica that is neither the node nor a peer is refused),
/// granting the misled client the writer's right.
pub fn stand_in(world: &World, replica: ReplicaId, claims: ReplicaId, misled: &str) -> StandIn {
    let mut config = world.node(replica).config.clone();
    config.node.replica_id = claims;
    config.node.peers.retain(|p| p.replica_id != claims);
    for container in &mut config.node.containers {
        container.replicas.retain(|&r| r != replica);
    }
    config.access.default.grant(Role::Writer, misled);
    let seed = 0x4d49_5343_0000_0000 ^ (u64::from(replica) << 16) ^ u64::from(claims);
    StandIn {
        config,
        disk: SimDisk::new(DiskConfig::reliable(seed)),
    }
}

/// One window: the stand-in boots, the misled client writes to it, the
/// replica comes back. Runs on a task of its own.
pub struct Window {
    pub supervisor: Arc<Supervisor>,
    pub workload: Arc<Workload>,
    pub client: Arc<Client>,
    pub replica: ReplicaId,
    pub claims: ReplicaId,
    pub window: Duration,
}

impl Window {
    pub async fn run(self) {
        let world = self.supervisor.world().clone();
        let stand_in = stand_in(&world, self.replica, self.claims, &self.client.name);
        let before = identity_mismatches(&world, self.replica);
        if !self.supervisor.begin_stand_in(self.replica, stand_in).await {
            let what = format!("misconfig of replica-{} skipped: not up", self.replica);
            world.trace.record("nemesis", what);
            return;
        }
        world.hooks.coverage.hit(Coverage::MisconfigWindow);
        self.workload.ledger.lock().unwrap().misconfig.windows += 1;
        self.write_to_stand_in().await;
        let detected = identity_mismatches(&world, self.replica)
            .iter()
            .any(|(replica, &count)| count > before.get(replica).copied().unwrap_or(0));
        if detected {
            world.hooks.coverage.hit(Coverage::MisconfigDetected);
            self.workload.ledger.lock().unwrap().misconfig.detected += 1;
        }
        world.trace.record(
            "nemesis",
            format!(
                "replica-{} restored (stand-in as replica-{} {})",
                self.replica,
                self.claims,
                if detected { "detected" } else { "not detected" }
            ),
        );
        self.supervisor.end_stand_in(self.replica).await;
    }

    /// The misled client's writes, evenly over the window, while the
    /// stand-in runs (healing may end it early).
    async fn write_to_stand_in(&self) {
        let gap = self.window / (MISLED_WRITES_PER_WINDOW as u32 + 1);
        let windows = self.workload.ledger.lock().unwrap().misconfig.windows;
        for k in 0..MISLED_WRITES_PER_WINDOW {
            madsim::time::sleep(gap).await;
            if !self.supervisor.has_stand_in(self.replica) {
                return;
            }
            let mark = format!("{windows}-{k}");
            let tree = version_tree(containers()[0]);
            let request = Request::Add {
                tree,
                parent: ROOT,
                items: vec![
                    KeyValue::new(ATTR_FILE_NAME, format!("misconfig-{mark}").into_bytes()),
                    KeyValue::new(MISCONFIG_TAG_KEY, mark.into_bytes()),
                ],
            };
            self.workload.ledger.lock().unwrap().misconfig.writes_sent += 1;
            let answer = self
                .client
                .call(self.replica, request, MISLED_CALL_TIMEOUT)
                .await;
            let acked = matches!(answer, Ok(Response::Added { .. }));
            let got = match &answer {
                Ok(response) => summarize_response(response),
                Err(error) => format!("{error}"),
            };
            self.workload.trace.record(
                &self.client.name,
                format!("misled write {k} -> replica-{}: {got}", self.replica),
            );
            if acked {
                self.workload.ledger.lock().unwrap().misconfig.writes_acked += 1;
                let coverage = &self.supervisor.world().hooks.coverage;
                coverage.hit(Coverage::MisconfigAcked);
            }
        }
    }
}

/// Peers every live replica but `stand_in`'s refused for answering as
/// another replica: its sync check's and its transport's counts.
fn identity_mismatches(world: &World, stand_in: ReplicaId) -> BTreeMap<ReplicaId, u64> {
    let refused = |r: ReplicaId| {
        let stats = world.node(r).service()?.stats();
        Some((r, stats.peer_identity_mismatches + stats.peers_refused))
    };
    world
        .replica_ids()
        .into_iter()
        .filter(|&r| r != stand_in)
        .filter_map(refused)
        .collect()
}
