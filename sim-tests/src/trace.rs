//! The event trace of one simulated run: every significant event with its
//! simulated time and node. Its hash proves determinism (same seed, same
//! hash); the events themselves are the replay output and locate the first
//! divergence when two runs of one seed differ.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Global simulated time.
    pub at: Duration,
    /// The node (or "world" for the harness itself).
    pub node: String,
    pub what: String,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{:>4}.{:06}s] {:<9} {}",
            self.at.as_secs(),
            self.at.subsec_micros(),
            self.node,
            self.what
        )
    }
}

#[derive(Default)]
struct Inner {
    events: Vec<Event>,
    hash: u64,
    echo: bool,
}

/// A shared, append-only trace.
#[derive(Clone, Default)]
pub struct Trace {
    inner: Arc<Mutex<Inner>>,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv(mut hash: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// FNV-1a of `bytes`, the hash traces use.
pub fn fnv_hash(bytes: &[u8]) -> u64 {
    fnv(FNV_OFFSET, bytes)
}

impl Trace {
    /// A trace that also prints every event through `tracing` (replay).
    pub fn new(echo: bool) -> Self {
        let trace = Self::default();
        {
            let mut inner = trace.inner.lock().unwrap();
            inner.echo = echo;
            inner.hash = FNV_OFFSET;
        }
        trace
    }

    /// Records an event at the current simulated time.
    pub fn record(&self, node: &str, what: impl Into<String>) {
        let event = Event {
            at: crate::world::clock::global_now(),
            node: node.to_string(),
            what: what.into(),
        };
        let mut inner = self.inner.lock().unwrap();
        if inner.echo {
            tracing::info!(target: "arbor_sim::trace", "{event}");
        }
        let mut hash = fnv(inner.hash, &event.at.as_nanos().to_le_bytes());
        hash = fnv(hash, event.node.as_bytes());
        hash = fnv(hash, &[0]);
        hash = fnv(hash, event.what.as_bytes());
        inner.hash = hash;
        inner.events.push(event);
    }

    pub fn hash(&self) -> u64 {
        self.inner.lock().unwrap().hash
    }

    pub fn len(&self) -> usize {
        self.inner.lock().unwrap().events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn events(&self) -> Vec<Event> {
        self.inner.lock().unwrap().events.clone()
    }

    /// The last `count` events, for failure reports.
    pub fn tail(&self, count: usize) -> Vec<Event> {
        let inner = self.inner.lock().unwrap();
        let start = inner.events.len().saturating_sub(count);
        inner.events[start..].to_vec()
    }
}

/// The index and both versions of the first event where two traces differ,
/// or `None` when they are identical.
pub fn first_difference(a: &[Event], b: &[Event]) -> Option<(usize, Option<Event>, Option<Event>)> {
    let common = a.len().min(b.len());
    if let Some(i) = (0..common).find(|&i| a[i] != b[i]) {
        return Some((i, Some(a[i].clone()), Some(b[i].clone())));
    }
    if a.len() == b.len() {
        return None;
    }
    Some((common, a.get(common).cloned(), b.get(common).cloned()))
}
