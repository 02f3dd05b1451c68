//! The caller at a replica's address (`Swarm::rogue_replica`): a process
//! on one replica's machine, or at the address of a replica id that no
//! container lists, which the replicas therefore take for that replica. It
//! sends calls of every kind a replica or a client can send, to every
//! replica, for both containers: replicated pages of its own ops (counters
//! near the tree's and far beyond any the tree could hold), pages of ops
//! stamped by another replica, pages with a reserved child, op-log reads,
//! tree lists, client writes and reads, drops.
//!
//! Each call's outcome is predicted before it is sent, by the rights model
//! (`check::rights::replica_may`: a replica's rights are on the containers
//! it holds, at their other replicas, and it holds no client role) and the
//! input rules (`check::outcome`, docs/design.md §4), and its answer is
//! held to the prediction. What it may store goes to `ROGUE_TREE` of the
//! container, tagged `MATRIX_TAG_KEY`; what must be refused carries
//! `INTRUDER_TAG_KEY`, which no replica may ever hold (`check::trust`).
//! Its stamps are its own, each used once, and nothing else writes
//! `ROGUE_TREE`: no two ops ever share a timestamp. Sync carries what one
//! replica accepted to the others, the impersonated one included (so the
//! swarm draws it only with sync on).

use super::intruder::{renamed, summarize, INTRUDER_TAG_KEY, MATRIX_TAG_KEY};
use super::{version_tree, Workload};
use crate::coverage::Coverage;
use crate::scenario::check::outcome::{self, Expect, Judged, Refusal};
use crate::scenario::check::rights;
use crate::world::Client;
use arbor::proto::Request;
use arbor::types::{make_timestamp, COUNTER_MAX};
use arbor::{ContainerId, Error, KeyValue, Meta, Move, ReplicaId, TreeKey, ATTR_FILE_NAME, ROOT};
use madsim::rand::{thread_rng, Rng};
use std::sync::Arc;
use std::time::Duration;

/// The tree of each container that the caller's accepted pages go to.
pub const ROGUE_TREE: &str = "as-replica";

/// Calls it makes in one run.
pub const ROGUE_CALLS: u64 = 40;

/// Ops per replicated page it sends.
const OPS_PER_PAGE_MAX: usize = 3;

/// The most a counter it gives out is past the one before.
const COUNTER_STEP_MAX: u64 = 3;

/// Its counters: every page takes new ones, so no stamp is used twice.
struct Counters {
    /// The last counter given out.
    last: u64,
}

impl Counters {
    /// A new counter a few past the last: pages lost on the way leave
    /// gaps, which a tree's counter window allows.
    fn next(&mut self) -> u64 {
        self.last += thread_rng().gen_range(1..=COUNTER_STEP_MAX);
        self.last
    }

    /// A counter no replica can take: further ahead of every counter this
    /// caller gave out (the only ops of `ROGUE_TREE`) than `jump_max`.
    fn beyond(&self, jump_max: u64) -> u64 {
        let far = self.last.saturating_add(jump_max).saturating_add(1);
        far.saturating_add(thread_rng().gen_range(0..16))
            .min(COUNTER_MAX)
    }
}

/// What a page of its own ops gets. A replica that missed its earlier
/// pages (sent elsewhere, or lost) holds a lower counter of `ROGUE_TREE`
/// than the page's; under a `counter_jump_max` shorter than every counter
/// the caller can give out, the page may be refused as `CounterTooFar`
/// until sync has brought the pages between.
fn own_ops_expect(jump_max: u64) -> Expect {
    let span = ROGUE_CALLS * COUNTER_STEP_MAX * OPS_PER_PAGE_MAX as u64;
    if jump_max >= span {
        Expect::Accepted
    } else {
        Expect::AcceptedOr(Refusal::CounterTooFar)
    }
}

/// The kinds of calls it makes.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// A page of its own ops, counters in reach.
    OwnOps,
    /// A page of its own ops, counters beyond reach.
    FarOps,
    /// A page of ops stamped by another replica.
    ForeignOps,
    /// A page whose op moves `ROOT`.
    ReservedChild,
    LogRead,
    StampsRead,
    TreeList,
    ClientWrite,
    ClientRead,
    Drop,
}

const KINDS: [Kind; 10] = [
    Kind::OwnOps,
    Kind::FarOps,
    Kind::ForeignOps,
    Kind::ReservedChild,
    Kind::LogRead,
    Kind::StampsRead,
    Kind::TreeList,
    Kind::ClientWrite,
    Kind::ClientRead,
    Kind::Drop,
];

/// Runs its calls spread over about `span`, as replica `me`, the
/// workload's containers held by `sets`.
pub async fn run_rogue(
    workload: Arc<Workload>,
    client: Client,
    span: Duration,
    me: ReplicaId,
    sets: Vec<(ContainerId, Vec<ReplicaId>)>,
) {
    let think_ms = (span.as_millis() as u64 / ROGUE_CALLS).max(1);
    let jump_max = workload
        .world
        .nodes
        .first()
        .map_or(u64::MAX, |n| n.config.limits.counter_jump_max);
    let mut counters = Counters { last: 0 };
    for n in 0..ROGUE_CALLS {
        if workload.verdict.failed() {
            break;
        }
        let wait = thread_rng().gen_range(0..=2 * think_ms);
        madsim::time::sleep(Duration::from_millis(wait)).await;
        let replicas = workload.world.replica_ids();
        let target = replicas[thread_rng().gen_range(0..replicas.len())];
        let (cid, holders) = sets[thread_rng().gen_range(0..sets.len())].clone();
        let kind = KINDS[thread_rng().gen_range(0..KINDS.len())];
        let foreign = replicas.iter().copied().find(|&r| r != me).unwrap_or(me);
        let call = Call {
            me,
            target,
            holders: &holders,
            n,
        };
        let (request, expect) = call.shape(kind, cid, foreign, &mut counters, jump_max);
        // Its own process is down (a crash or a replaced disk): a call
        // spawned there would never run.
        let down = replicas.contains(&me) && workload.world.node(me).service().is_none();
        if down {
            continue;
        }
        send(&workload, &client, &call, request, expect).await;
    }
}

/// One call: who sends it where, about a container held by `holders`.
struct Call<'a> {
    me: ReplicaId,
    target: ReplicaId,
    holders: &'a [ReplicaId],
    n: u64,
}

impl Call<'_> {
    fn holds(&self) -> bool {
        self.holders.contains(&self.target)
    }

    /// The request of `kind` and its predicted outcome.
    fn shape(
        &self,
        kind: Kind,
        cid: ContainerId,
        foreign: ReplicaId,
        counters: &mut Counters,
        jump_max: u64,
    ) -> (Request, Expect) {
        let rogue_tree = TreeKey::new(cid, ROGUE_TREE);
        let (request, expect_allowed) = match kind {
            Kind::FarOps if counters.last.saturating_add(jump_max) < COUNTER_MAX => {
                let far = counters.beyond(jump_max);
                let ops = vec![self.op(make_timestamp(far, self.me), false)];
                let request = self.apply(rogue_tree, ops);
                (request, Expect::Refused(Refusal::CounterTooFar))
            }
            // With a window reaching the end of the counter space, no
            // counter is beyond reach: an ordinary page instead.
            Kind::OwnOps | Kind::FarOps => {
                let ops = self.page(|| make_timestamp(counters.next(), self.me));
                (self.apply(rogue_tree, ops), own_ops_expect(jump_max))
            }
            Kind::ForeignOps => {
                let ops = self.page(|| make_timestamp(counters.next(), foreign));
                (
                    self.apply(rogue_tree, ops),
                    Expect::Refused(Refusal::Rights),
                )
            }
            Kind::ReservedChild => {
                let ts = make_timestamp(counters.next(), self.me);
                let ops = vec![self.op(ts, true)];
                (
                    self.apply(rogue_tree, ops),
                    Expect::Refused(Refusal::InvalidOp),
                )
            }
            Kind::LogRead => {
                let tree = version_tree(cid);
                let request = Request::GetOpLog {
                    tree,
                    from_height: 0,
                    limit: 16,
                };
                (request, Expect::Served)
            }
            Kind::StampsRead => {
                let tree = version_tree(cid);
                let request = Request::GetOpLogStamps {
                    tree,
                    from_height: 0,
                    limit: 64,
                };
                (request, Expect::Served)
            }
            Kind::TreeList => (Request::TreeList { cid }, Expect::Served),
            Kind::ClientWrite => {
                let request = Request::Add {
                    tree: version_tree(cid),
                    parent: ROOT,
                    items: self.tagged(INTRUDER_TAG_KEY),
                };
                (request, Expect::Refused(Refusal::Rights))
            }
            Kind::ClientRead => {
                let request = Request::GetSubTree {
                    tree: version_tree(cid),
                    root: ROOT,
                    depth: 2,
                };
                (request, Expect::Refused(Refusal::Rights))
            }
            Kind::Drop => {
                let request = Request::Drop {
                    cid,
                    tree: Some(ROGUE_TREE.to_string()),
                };
                (request, Expect::Refused(Refusal::Rights))
            }
        };
        let expect = if rights::replica_may(self.me, self.target, self.holders, &request) {
            self.at_holder(kind, expect_allowed)
        } else {
            Expect::Refused(Refusal::Rights)
        };
        (retag(request, expect), expect)
    }

    /// A replicated page is checked for holding before anything about its
    /// ops (docs/design.md §4: rights, holding, the ops' shape, whose
    /// stamps they carry, their counters).
    fn at_holder(&self, kind: Kind, expect: Expect) -> Expect {
        match kind {
            Kind::OwnOps | Kind::FarOps | Kind::ForeignOps | Kind::ReservedChild
                if !self.holds() =>
            {
                Expect::Refused(Refusal::NotReplica)
            }
            _ => expect.at(self.holds()),
        }
    }

    fn apply(&self, tree: TreeKey, ops: Vec<Move>) -> Request {
        Request::Apply { tree, ops }
    }

    /// One to `OPS_PER_PAGE_MAX` ops, each with its own stamp from
    /// `stamp`.
    fn page(&self, mut stamp: impl FnMut() -> u64) -> Vec<Move> {
        let count = thread_rng().gen_range(1..=OPS_PER_PAGE_MAX);
        (0..count).map(|_| self.op(stamp(), false)).collect()
    }

    /// The op stamped `ts` that puts a node of that id under `ROOT`; with
    /// `reserved`, one that moves `ROOT` itself.
    fn op(&self, ts: u64, reserved: bool) -> Move {
        let child = if reserved { ROOT } else { ts };
        Move {
            parent: ROOT,
            child,
            meta: Meta {
                time: ts,
                items: self.tagged(INTRUDER_TAG_KEY),
            },
        }
    }

    fn tagged(&self, tag: &str) -> Vec<KeyValue> {
        vec![
            KeyValue::new(
                ATTR_FILE_NAME,
                format!("as-replica-{}-{}", self.me, self.n).into_bytes(),
            ),
            KeyValue::new(tag, self.n.to_string().into_bytes()),
        ]
    }
}

/// The tag of what a request would store: `MATRIX_TAG_KEY` where it is
/// predicted stored or possibly stored, `INTRUDER_TAG_KEY` (as built) where
/// it is predicted refused.
fn retag(request: Request, expect: Expect) -> Request {
    if expect.refused() {
        return request;
    }
    let matrix = |items| renamed(items, INTRUDER_TAG_KEY, MATRIX_TAG_KEY);
    match request {
        Request::Apply { tree, ops } => Request::Apply {
            tree,
            ops: ops
                .into_iter()
                .map(|op| Move {
                    meta: Meta {
                        time: op.meta.time,
                        items: matrix(op.meta.items),
                    },
                    ..op
                })
                .collect(),
        },
        other => other,
    }
}

async fn send(
    workload: &Workload,
    client: &Client,
    call: &Call<'_>,
    request: Request,
    expect: Expect,
) {
    let what = summarize(&request);
    let target = call.target;
    workload.trace.record(
        &client.name,
        format!("{what} -> replica-{target}, expects {expect:?}"),
    );
    // A call spawned on the machine as its process dies never ends.
    let bounded = madsim::time::timeout(
        2 * workload.call_timeout,
        client.call(target, request.clone(), workload.call_timeout),
    );
    let answer = bounded.await.unwrap_or(Err(Error::Timeout));
    let judged = outcome::judge(expect, &request, &answer);
    let coverage = &workload.world.hooks.coverage;
    let mut ledger = workload.ledger.lock().unwrap();
    let record = &mut ledger.intruder;
    record.sent += 1;
    match judged {
        Judged::Unknown => record.unanswered += 1,
        Judged::Agrees => match expect {
            Expect::Accepted | Expect::Served | Expect::AcceptedOr(_) => {
                coverage.hit(Coverage::ReplicaCallerServed)
            }
            Expect::Refused(Refusal::Rights) => {
                record.refused += 1;
                let other_container = !call.holders.contains(&call.me)
                    && workload.world.replica_ids().contains(&call.me);
                if other_container && is_replication(&request) {
                    coverage.hit(Coverage::OtherContainerReplicaRefused);
                }
            }
            Expect::Refused(_) => {
                record.refused += 1;
                coverage.hit(Coverage::RefusedAsModelled);
            }
        },
        Judged::Disagrees(why) => {
            let wrong = format!("{what} as replica-{} on replica-{target}: {why}", call.me);
            workload
                .trace
                .record(&client.name, format!("WRONG OUTCOME {wrong}"));
            record.wrong_outcomes.push(wrong);
        }
    }
}

/// A call only a replica may make.
fn is_replication(request: &Request) -> bool {
    matches!(
        request,
        Request::Apply { .. } | Request::GetOpLog { .. } | Request::GetOpLogStamps { .. }
    )
}
