//! Shared test support: a clock on tokio's (pausable) time and an in-process
//! network of services whose nodes can be taken down and whose calls can be
//! dropped.
#![allow(dead_code)]

use arbor::net::Transport;
use arbor::proto::{self, Request, Response};
use arbor::runtime::{BoxFuture, Clock, Env};
use arbor::service::Service;
use arbor::system::TokioRuntime;
use arbor::{Error, ReplicaId};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Time from tokio's clock, so `start_paused` tests run in virtual time.
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl Clock for TokioClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}

pub fn test_env() -> Env {
    Env {
        clock: Arc::new(TokioClock {
            origin: tokio::time::Instant::now(),
        }),
        runtime: Arc::new(TokioRuntime),
    }
}

#[derive(Default)]
struct Slot {
    service: Option<Arc<Service>>,
    down: bool,
    /// Calls to this node still to be lost (they time out).
    calls_to_drop: u32,
}

/// Routes requests between in-process services, through the wire encoding.
#[derive(Default)]
pub struct LocalNet {
    slots: Mutex<BTreeMap<ReplicaId, Slot>>,
    calls: Mutex<u64>,
}

impl LocalNet {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn transport(self: &Arc<Self>) -> Arc<dyn Transport> {
        Arc::new(LocalTransport { net: self.clone() })
    }

    pub fn attach(&self, id: ReplicaId, service: Arc<Service>) {
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(id).or_default();
        slot.service = Some(service);
        slot.down = false;
    }

    /// Takes a node off the network (calls to it fail) and returns it.
    pub fn detach(&self, id: ReplicaId) -> Option<Arc<Service>> {
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(id).or_default();
        slot.down = true;
        slot.service.take()
    }

    pub fn set_down(&self, id: ReplicaId, down: bool) {
        self.slots.lock().unwrap().entry(id).or_default().down = down;
    }

    pub fn drop_calls_to(&self, id: ReplicaId, count: u32) {
        self.slots
            .lock()
            .unwrap()
            .entry(id)
            .or_default()
            .calls_to_drop = count;
    }

    pub fn calls(&self) -> u64 {
        *self.calls.lock().unwrap()
    }

    fn route(&self, peer: ReplicaId) -> Result<Arc<Service>, Error> {
        *self.calls.lock().unwrap() += 1;
        let mut slots = self.slots.lock().unwrap();
        let slot = slots
            .get_mut(&peer)
            .ok_or_else(|| Error::Network(format!("no node {peer}")))?;
        if slot.down {
            return Err(Error::Network(format!("node {peer} is down")));
        }
        if slot.calls_to_drop > 0 {
            slot.calls_to_drop -= 1;
            return Err(Error::Timeout);
        }
        slot.service
            .clone()
            .ok_or_else(|| Error::Network(format!("node {peer} has no service")))
    }
}

struct LocalTransport {
    net: Arc<LocalNet>,
}

const WIRE_MAX: usize = 64 << 20;

impl Transport for LocalTransport {
    fn call(
        &self,
        peer: ReplicaId,
        request: Request,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Response, Error>> {
        let routed = self.net.route(peer);
        Box::pin(async move {
            let service = routed?;
            // Through the wire format, as TCP would.
            let request = proto::decode::<Request>(&proto::encode(7, &request), WIRE_MAX)?.body;
            let response = tokio::time::timeout(timeout, service.handle(request))
                .await
                .map_err(|_| Error::Timeout)?;
            Ok(proto::decode::<Response>(&proto::encode(7, &response), WIRE_MAX)?.body)
        })
    }
}

/// Polls `done` on virtual time until it holds, at most `deadline`.
pub async fn eventually(what: &str, deadline: Duration, mut done: impl FnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() < deadline,
            "not reached within {deadline:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
