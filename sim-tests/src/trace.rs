//! The event trace of one simulated run: every significant event with its
//! simulated time and node, and the run's fingerprint. The events are the
//! replay output, in words, and locate the first divergence when two runs
//! of one seed differ. The fingerprint proves determinism (same seed, same
//! fingerprint) and says whether a capsule still replays the run it was
//! kept for, so it takes in only what happened in the run, as data: every
//! request a simulated node took and every answer it sent (their wire
//! frames, with the caller's address), every client call's outcome, node
//! crashes and restarts, each at its simulated time, and the failure kind.
//! The events' words (a reworded message, a renamed type in a `Debug`
//! rendering, a failure's detail) do not go in: an edit that changes only
//! what the trace says, or code the run never reaches, leaves it as it was.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Test hook: every event's words get a suffix, as an edit of the
/// messages would give (`set_reworded`).
static REWORDED: AtomicBool = AtomicBool::new(false);

/// Test hook, process-wide: with `on`, every event recorded from now on
/// has " (reworded)" added to its words, which stands for an edit that
/// changes only what the trace says. The fingerprint must not move.
#[doc(hidden)]
pub fn set_reworded(on: bool) {
    REWORDED.store(on, Ordering::SeqCst);
}

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

/// What kind of run event goes into the fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunEvent {
    /// A request a node took off the network (caller address, frame).
    Request,
    /// An answer a node sent (caller address, frame).
    Answer,
    /// A client call's outcome (replica, encoded `Result`).
    Outcome,
    /// A node lost power, had its disk destroyed, or started again.
    Crash,
    DiskDestroyed,
    Restart,
}

impl RunEvent {
    fn tag(self) -> u8 {
        match self {
            RunEvent::Request => 1,
            RunEvent::Answer => 2,
            RunEvent::Outcome => 3,
            RunEvent::Crash => 4,
            RunEvent::DiskDestroyed => 5,
            RunEvent::Restart => 6,
        }
    }
}

#[derive(Default)]
struct Inner {
    events: Vec<Event>,
    /// The fingerprint of the run events so far.
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

    /// Records an event, in words, at the current simulated time. It is
    /// not part of the fingerprint.
    pub fn record(&self, node: &str, what: impl Into<String>) {
        let mut what = what.into();
        if REWORDED.load(Ordering::Relaxed) {
            what.push_str(" (reworded)");
        }
        let event = Event {
            at: crate::world::clock::global_now(),
            node: node.to_string(),
            what,
        };
        let mut inner = self.inner.lock().unwrap();
        if inner.echo {
            tracing::info!(target: "arbor_sim::trace", "{event}");
        }
        inner.events.push(event);
    }

    /// Takes one run event at `place` (a node's name or address) into the
    /// fingerprint with the current simulated time; `parts` are its data.
    pub fn fingerprint(&self, what: RunEvent, place: &str, parts: &[&[u8]]) {
        let at = crate::world::clock::global_now();
        let mut inner = self.inner.lock().unwrap();
        let mut hash = fnv(inner.hash, &at.as_nanos().to_le_bytes());
        hash = fnv(hash, &[what.tag()]);
        hash = fnv(hash, &(place.len() as u64).to_le_bytes());
        hash = fnv(hash, place.as_bytes());
        for part in parts {
            hash = fnv(hash, &(part.len() as u64).to_le_bytes());
            hash = fnv(hash, part);
        }
        inner.hash = hash;
    }

    /// The fingerprint of the run events so far.
    pub fn hash(&self) -> u64 {
        self.inner.lock().unwrap().hash
    }

    /// The run's fingerprint: its run events and how it ended (`None`
    /// passed, else the failure kind's name).
    pub fn run_fingerprint(&self, failure_kind: Option<&str>) -> u64 {
        let hash = self.hash();
        match failure_kind {
            None => fnv(hash, &[0]),
            Some(kind) => fnv(fnv(hash, &[1]), kind.as_bytes()),
        }
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

#[cfg(test)]
mod tests {
    use super::{RunEvent, Trace};

    /// The fingerprint follows the run events and ignores the words:
    /// traces with the same run events and other words agree, a run event
    /// with one byte more, another place or another kind does not, and
    /// neither does another outcome.
    #[test]
    fn the_fingerprint_takes_run_events_not_words() {
        let runtime = madsim::runtime::Runtime::with_seed_and_config(1, Default::default());
        runtime.block_on(async {
            let run = |words: &str, frame: &[u8], place: &str, what: RunEvent| {
                let trace = Trace::new(false);
                trace.record("client-1", format!("op#1 {words}"));
                trace.fingerprint(RunEvent::Request, "10.0.0.1:7000", &[b"10.1.0.1:1", frame]);
                trace.fingerprint(what, place, &[b"10.1.0.1:1", b"answer"]);
                trace
            };
            let a = run("Add under 0", b"frame", "10.0.0.1:7000", RunEvent::Answer);
            let b = run(
                "AddByPath renamed",
                b"frame",
                "10.0.0.1:7000",
                RunEvent::Answer,
            );
            assert_ne!(a.events(), b.events());
            assert_eq!(a.hash(), b.hash());
            assert_eq!(a.run_fingerprint(None), b.run_fingerprint(None));
            for other in [
                run("Add under 0", b"frame!", "10.0.0.1:7000", RunEvent::Answer),
                run("Add under 0", b"frame", "10.0.0.2:7000", RunEvent::Answer),
                run("Add under 0", b"frame", "10.0.0.1:7000", RunEvent::Request),
            ] {
                assert_ne!(a.hash(), other.hash());
            }
            assert_ne!(
                a.run_fingerprint(None),
                a.run_fingerprint(Some("divergence"))
            );
            assert_ne!(
                a.run_fingerprint(Some("liveness")),
                a.run_fingerprint(Some("divergence"))
            );
            // The parts are delimited: moving a byte from one to the next
            // is another event.
            let c = Trace::new(false);
            c.fingerprint(RunEvent::Request, "x", &[b"ab", b"c"]);
            let d = Trace::new(false);
            d.fingerprint(RunEvent::Request, "x", &[b"a", b"bc"]);
            assert_ne!(c.hash(), d.hash());
        });
    }
}
