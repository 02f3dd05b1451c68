//! The engine's transport inside the simulation: one madsim datagram per
//! request and per response, encoded with the real wire format, so packet
//! loss, clogged links and latency all apply to it.
//!
//! Each answer also carries the replica id its server was configured with,
//! which a TCP connection's `Hello` would have named (docs/design.md §9):
//! a replica dialling a peer refuses an answer from another replica id or
//! its own, by the rule `tcp/client.rs` applies too
//! (`arbor::identity::check_answerer`), and counts it (`identities_refused`).
//! There is no connection to check once, so every answer is checked. The
//! simulated clients do not check (the gateway's check is the engine's).

use crate::trace::{RunEvent, Trace};
use arbor::config::DEFAULT_CLUSTER_ID;
use arbor::identity::{check_answerer, Dialler};
use arbor::net::Transport;
use arbor::proto::{self, Request, Response};
use arbor::runtime::{with_timeout, BoxFuture, Clock};
use arbor::tls::CertIdentity;
use arbor::{Caller, Error, ReplicaId};
use madsim::net::Endpoint;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A response datagram: the wire frame and the replica id its server was
/// configured with (0 for a server that is no replica).
struct Answer {
    replica_id: ReplicaId,
    frame: Vec<u8>,
}

/// Datagram tag of requests (server side) and of responses (caller side).
const TAG_REQUEST: u64 = 1;
const TAG_RESPONSE: u64 = 2;
/// Caller endpoints kept for reuse per transport; binding and closing one
/// per call was ~2 % of a seed's instructions.
const SPARE_ENDPOINTS_MAX: usize = 64;

/// Something that answers requests: a node's service, or a test double.
pub trait Handler: Send + Sync + 'static {
    /// Answers `request` from `caller`, as the network identified it.
    fn serve(self: Arc<Self>, caller: Caller, request: Request) -> BoxFuture<'static, Response>;
}

impl Handler for arbor::service::Service {
    fn serve(self: Arc<Self>, caller: Caller, request: Request) -> BoxFuture<'static, Response> {
        Box::pin(async move { arbor::service::Service::handle(&self, &caller, request).await })
    }
}

/// A handler that counts the client requests it is serving. A client that
/// timed out leaves its request running on the server (a `Drop` waiting
/// for its locks, say), and such a request may still change the replica:
/// the checks of a healed cluster wait until none is left.
pub struct Counted {
    pub inner: Arc<dyn Handler>,
    pub serving: Arc<AtomicU64>,
}

impl Handler for Counted {
    fn serve(self: Arc<Self>, caller: Caller, request: Request) -> BoxFuture<'static, Response> {
        if let Caller::Peer(_) = caller {
            return self.inner.clone().serve(caller, request);
        }
        let serving = super::supervisor::InFlight::enter(&self.serving);
        let answer = self.inner.clone().serve(caller, request);
        Box::pin(async move {
            let response = answer.await;
            drop(serving);
            response
        })
    }
}

/// A service whose answers an `AnswerWatch` sees before they leave.
pub struct Watched {
    pub replica: ReplicaId,
    pub service: Arc<arbor::service::Service>,
    pub watch: Arc<dyn super::hooks::AnswerWatch>,
}

impl Handler for Watched {
    fn serve(self: Arc<Self>, caller: Caller, request: Request) -> BoxFuture<'static, Response> {
        Box::pin(async move {
            let seen = self.watch.wants(&self.service, &caller, &request);
            let response = self.service.handle(&caller, request).await;
            if let Some(seen) = seen {
                let watch = &self.watch;
                watch.answered(self.replica, &self.service, &caller, seen, &response);
            }
            response
        })
    }
}

/// The kind of a request, for selective message faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RequestKind {
    /// Replication pushes (`Apply`).
    Push,
    /// Sync pulls (`GetOpLogStamps`, `GetOpLog`).
    Pull,
    /// Everything else.
    Other,
}

impl RequestKind {
    pub fn of(request: &Request) -> Self {
        match request {
            Request::Apply { .. } => RequestKind::Push,
            Request::GetOpLog { .. } | Request::GetOpLogStamps { .. } => RequestKind::Pull,
            _ => RequestKind::Other,
        }
    }
}

/// Most replica-to-replica calls a world remembers for the timeline.
pub const WIRE_CALLS_MAX: usize = 50_000;

/// One push or sync pull a replica started, for the timeline; not part
/// of the trace or its fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireCall {
    pub at: Duration,
    pub from: ReplicaId,
    pub to: ReplicaId,
    pub kind: RequestKind,
    /// The filter dropped it.
    pub dropped: bool,
}

/// Drops chosen request kinds between chosen replicas: a middlebox that
/// loses one message type, which the network layer alone cannot express.
/// It also notes the pushes and pulls it sees (`WireCall`).
#[derive(Debug, Default)]
pub struct MessageFilter {
    blocked: Mutex<BTreeMap<(ReplicaId, ReplicaId, RequestKind), ()>>,
    calls: Mutex<Vec<WireCall>>,
}

impl MessageFilter {
    /// Notes a push or pull between replicas, up to `WIRE_CALLS_MAX`.
    fn note(&self, from: ReplicaId, to: ReplicaId, kind: RequestKind, dropped: bool) {
        if from == 0 || kind == RequestKind::Other {
            return;
        }
        let mut calls = self.calls.lock().unwrap();
        if calls.len() < WIRE_CALLS_MAX {
            let at = crate::world::clock::global_now();
            calls.push(WireCall {
                at,
                from,
                to,
                kind,
                dropped,
            });
        }
    }

    /// Whether `request` from `from` to `to` is blocked, noted as a
    /// call either way.
    pub(crate) fn stops(&self, from: ReplicaId, to: ReplicaId, request: &Request) -> bool {
        let kind = RequestKind::of(request);
        let blocked = self.is_blocked(from, to, kind);
        self.note(from, to, kind, blocked);
        blocked
    }

    /// The pushes and pulls noted so far.
    pub fn calls(&self) -> Vec<WireCall> {
        self.calls.lock().unwrap().clone()
    }

    pub fn block(&self, from: ReplicaId, to: ReplicaId, kind: RequestKind) {
        self.blocked.lock().unwrap().insert((from, to, kind), ());
    }

    pub fn unblock(&self, from: ReplicaId, to: ReplicaId, kind: RequestKind) {
        self.blocked.lock().unwrap().remove(&(from, to, kind));
    }

    pub fn unblock_all(&self) {
        self.blocked.lock().unwrap().clear();
    }

    pub fn is_blocked(&self, from: ReplicaId, to: ReplicaId, kind: RequestKind) -> bool {
        self.blocked.lock().unwrap().contains_key(&(from, to, kind))
    }
}

/// The call ids of every transport of one simulated world. Shared, so that
/// an id never repeats, across nodes or across the incarnations of one
/// node: a late answer is told apart from the answer a caller waits for by
/// its call id alone, and a restarted replica whose ids began at 1 again
/// took the late answers of its killed incarnation, which madsim delivers
/// to the same port, for its own (sweep seed 100738).
#[derive(Clone, Debug, Default)]
pub struct CallIds(Arc<AtomicU64>);

impl CallIds {
    fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// Calls from one simulated node (a replica or a client) to replicas.
pub struct SimTransport {
    /// The caller's replica id (0 for clients), for the message filter.
    local: ReplicaId,
    peers: BTreeMap<ReplicaId, SocketAddr>,
    clock: Arc<dyn Clock>,
    max_message_bytes: usize,
    call_ids: CallIds,
    filter: Arc<MessageFilter>,
    /// Endpoints whose one call got its answer: nothing more can arrive at
    /// them, so the next call may use one instead of binding a new port.
    spare: Arc<Mutex<Vec<Endpoint>>>,
    /// Answers refused because another replica id than the dialled one
    /// (or this node's own) answered.
    refused: Arc<AtomicU64>,
}

impl SimTransport {
    pub fn new(
        local: ReplicaId,
        peers: BTreeMap<ReplicaId, SocketAddr>,
        clock: Arc<dyn Clock>,
        max_message_bytes: usize,
        filter: Arc<MessageFilter>,
        call_ids: CallIds,
    ) -> Self {
        Self {
            local,
            peers,
            clock,
            max_message_bytes,
            call_ids,
            filter,
            spare: Arc::default(),
            refused: Arc::default(),
        }
    }

    /// A replica refuses an answer that names another replica than the
    /// one it dialled, or itself, by the engine's one rule
    /// (`arbor::identity::check_answerer`); the answer names a replica of
    /// this world's one cluster. Clients do not check, and an answer that
    /// names no replica (0) has nothing to check.
    fn check_answerer(local: ReplicaId, peer: ReplicaId, answered: ReplicaId) -> Result<(), Error> {
        if local == 0 || answered == 0 {
            return Ok(());
        }
        let dialler = Dialler {
            cluster_id: DEFAULT_CLUSTER_ID,
            own: Some(local),
            expect: Some(peer),
        };
        let named = CertIdentity::Replica {
            cluster_id: DEFAULT_CLUSTER_ID.to_string(),
            replica_id: answered,
        };
        check_answerer(&dialler, &named)
            .map_err(|why| Error::IdentityRefused(format!("replica {local} dialled {peer}: {why}")))
    }

    async fn exchange(
        spare: &Mutex<Vec<Endpoint>>,
        addr: SocketAddr,
        call_id: u64,
        frame: Vec<u8>,
        max_message_bytes: usize,
    ) -> Result<(Response, ReplicaId), Error> {
        // An endpoint serves one call at a time, and goes back to the spares
        // only once that call was answered: the endpoint of a call that
        // timed out is dropped with it, so its late answer hits a closed
        // port (or a later endpoint on that port, which skips it by id)
        // instead of piling up in a mailbox that is used again.
        let reused = spare.lock().unwrap().pop();
        let endpoint = match reused {
            Some(endpoint) => endpoint,
            None => Endpoint::bind("0.0.0.0:0")
                .await
                .map_err(|e| Error::Network(format!("bind: {e}")))?,
        };
        endpoint
            .send_to_raw(addr, TAG_REQUEST, Box::new(frame))
            .await
            .map_err(|e| Error::Network(format!("send: {e}")))?;
        loop {
            let (payload, _) = endpoint
                .recv_from_raw(TAG_RESPONSE)
                .await
                .map_err(|e| Error::Network(format!("recv: {e}")))?;
            let answer = payload
                .downcast::<Answer>()
                .map_err(|_| Error::Malformed("response is not an answer frame".into()))?;
            let envelope = proto::decode::<Response>(&answer.frame, max_message_bytes)?;
            if envelope.id == call_id {
                let mut spare = spare.lock().unwrap();
                if spare.len() < SPARE_ENDPOINTS_MAX {
                    spare.push(endpoint);
                }
                return Ok((envelope.body, answer.replica_id));
            }
            // The late answer to a call that timed out on an endpoint that
            // had this port before (madsim gives freed ports out again):
            // nobody waits for it. Answered calls never leave one behind,
            // so a kept endpoint only ever sees such strays.
        }
    }
}

impl Transport for SimTransport {
    fn call(
        &self,
        peer: ReplicaId,
        request: Request,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Response, Error>> {
        let addr = self.peers.get(&peer).copied();
        let call_id = self.call_ids.next();
        let blocked = self.filter.stops(self.local, peer, &request);
        let frame = proto::encode(call_id, &request);
        let clock = self.clock.clone();
        let max_message_bytes = self.max_message_bytes;
        let spare = self.spare.clone();
        let (local, refused) = (self.local, self.refused.clone());
        Box::pin(async move {
            let Some(addr) = addr else {
                return Err(Error::Network(format!("unknown replica {peer}")));
            };
            if frame.len() > max_message_bytes {
                return Err(Error::TooLarge {
                    what: "request".into(),
                    size: frame.len() as u64,
                    limit: max_message_bytes as u64,
                });
            }
            let call = async {
                if blocked {
                    // A dropped message looks like silence to the caller.
                    futures::future::pending::<()>().await;
                }
                let exchange = Self::exchange(&spare, addr, call_id, frame, max_message_bytes);
                let (response, answered) = exchange.await?;
                let checked = Self::check_answerer(local, peer, answered);
                if let Err(error) = &checked {
                    refused.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(peer, %error, "peer answer refused");
                }
                checked.map(|()| response)
            };
            with_timeout(&*clock, timeout, call)
                .await
                .unwrap_or(Err(Error::Timeout))
        })
    }

    fn identities_refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// Serves requests arriving at `addr` until the node is killed; `identify`
/// names the caller by its source address. At most `max_inflight` requests
/// run at once; beyond that callers get `Overloaded` at once, so a flood
/// cannot grow the task set without bound. Answers name no replica.
pub async fn serve(
    addr: SocketAddr,
    handler: Arc<dyn Handler>,
    identify: fn(SocketAddr) -> Caller,
    max_message_bytes: usize,
    max_inflight: usize,
) {
    let limits = (max_message_bytes, max_inflight);
    serve_as(0, addr, handler, identify, limits, Trace::default()).await
}

/// `serve` for a replica configured as `replica_id`, which every answer
/// names; `limits` are the most bytes of a message and the requests in
/// flight. Every request it takes and every answer it sends, as their wire
/// frames, go into `trace`'s fingerprint.
pub async fn serve_as(
    replica_id: ReplicaId,
    addr: SocketAddr,
    handler: Arc<dyn Handler>,
    identify: fn(SocketAddr) -> Caller,
    (max_message_bytes, max_inflight): (usize, usize),
    trace: Trace,
) {
    let server = addr.to_string();
    let endpoint = match Endpoint::bind(addr).await {
        Ok(endpoint) => Arc::new(endpoint),
        Err(e) => panic!("simulated node cannot bind {addr}: {e}"),
    };
    let inflight = Arc::new(tokio::sync::Semaphore::new(max_inflight));
    loop {
        let (payload, from) = match endpoint.recv_from_raw(TAG_REQUEST).await {
            Ok(received) => received,
            Err(e) => {
                tracing::warn!(%addr, error = %e, "server endpoint closed");
                return;
            }
        };
        let Ok(bytes) = payload.downcast::<Vec<u8>>() else {
            tracing::warn!(%from, "dropping a non-byte frame");
            continue;
        };
        let caller = from.to_string();
        let parts: [&[u8]; 2] = [caller.as_bytes(), &bytes];
        trace.fingerprint(RunEvent::Request, &server, &parts);
        let envelope = match proto::decode::<Request>(&bytes, max_message_bytes) {
            Ok(envelope) => envelope,
            Err(e) => {
                // Without a decodable id there is nobody to answer.
                tracing::warn!(%from, error = %e, "dropping an undecodable request");
                continue;
            }
        };
        let endpoint = endpoint.clone();
        let Ok(permit) = inflight.clone().try_acquire_owned() else {
            let busy = Response::Error(Error::Overloaded("too many requests in flight".into()));
            let frame = proto::encode(envelope.id, &busy);
            let parts: [&[u8]; 2] = [caller.as_bytes(), &frame];
            trace.fingerprint(RunEvent::Answer, &server, &parts);
            let answer = Answer { replica_id, frame };
            let _ = endpoint
                .send_to_raw(from, TAG_RESPONSE, Box::new(answer))
                .await;
            continue;
        };
        let handler = handler.clone();
        let (trace, server) = (trace.clone(), server.clone());
        drop(madsim::task::spawn(async move {
            let response = handler.serve(identify(from), envelope.body).await;
            let frame = proto::encode(envelope.id, &response);
            let parts: [&[u8]; 2] = [caller.as_bytes(), &frame];
            trace.fingerprint(RunEvent::Answer, &server, &parts);
            let answer = Answer { replica_id, frame };
            let _ = endpoint
                .send_to_raw(from, TAG_RESPONSE, Box::new(answer))
                .await;
            drop(permit);
        }));
    }
}
