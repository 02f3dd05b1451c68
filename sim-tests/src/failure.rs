//! What went wrong in a simulated run: a typed kind and a detail, and the
//! run's first failure, which everything that watches the run reports to.

use crate::trace::Trace;
use std::fmt;
use std::sync::{Arc, Mutex};

/// The class of a failure. `Display` gives the words reports print.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FailureKind {
    /// A replica did not boot, serve, sync or go idle within its deadline.
    Liveness,
    /// A tree breaks the tree invariant (or a stored op cannot be decoded).
    TreeInvariant,
    /// Replicas of a tree hold different logs or trees after convergence.
    Divergence,
    /// Replicas of a tree answer the same read differently.
    DivergentRead,
    /// An acknowledged or stored write is missing.
    LostWrite,
    /// A caller still waits for an answer that should have come.
    HungCallers,
    /// A checker could not read a replica's storage.
    Storage,
    /// The simulation panicked (a broken engine assertion, say).
    Panic,
    /// Something of the simulated world outlived its run.
    Leak,
    /// A replica answered a read otherwise than the reference model of its
    /// own log says (or its stored state is not the model's).
    WrongAnswer,
    /// An acknowledged write does not carry what its caller sent or did
    /// not take effect, or a definitely refused write was applied.
    BrokenPromise,
    /// A client's read missed its own acknowledged write or something an
    /// earlier read of the same replica showed it.
    SessionGuarantee,
    /// A pull cursor passed an op of the peer that the puller lacks.
    SyncCursor,
    /// A call without the right was served, or left a trace on a replica.
    Intrusion,
    /// Two different ops under one timestamp, or a peer answering as
    /// another replica.
    StampConflict,
    /// A replica holds an op written by a process that claimed another
    /// replica's id.
    ImpostorOp,
    /// A call its caller's role allows was refused with `PermissionDenied`.
    WrongRefusal,
    /// A call whose rights hold got another answer than the input rules
    /// predict (docs/design.md §4): refused with another error, or
    /// accepted where a refusal was due, or the reverse.
    WrongOutcome,
    /// The network stack broke a bound: a server holds connection slots
    /// no connection uses, a client was not served within the bound
    /// during a connection storm, or a call was answered after its
    /// deadline.
    Connections,
}

impl FailureKind {
    pub const ALL: [FailureKind; 19] = [
        FailureKind::Liveness,
        FailureKind::TreeInvariant,
        FailureKind::Divergence,
        FailureKind::DivergentRead,
        FailureKind::LostWrite,
        FailureKind::HungCallers,
        FailureKind::Storage,
        FailureKind::Panic,
        FailureKind::Leak,
        FailureKind::WrongAnswer,
        FailureKind::BrokenPromise,
        FailureKind::SessionGuarantee,
        FailureKind::SyncCursor,
        FailureKind::Intrusion,
        FailureKind::StampConflict,
        FailureKind::ImpostorOp,
        FailureKind::WrongRefusal,
        FailureKind::WrongOutcome,
        FailureKind::Connections,
    ];

    /// The kind `name` (the words `name` gives) names.
    pub fn parse(name: &str) -> Option<FailureKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The words reports print for this kind.
    pub fn name(self) -> &'static str {
        match self {
            FailureKind::Liveness => "liveness",
            FailureKind::TreeInvariant => "tree invariant",
            FailureKind::Divergence => "divergence",
            FailureKind::DivergentRead => "divergent read",
            FailureKind::LostWrite => "lost write",
            FailureKind::HungCallers => "hung callers",
            FailureKind::Storage => "storage",
            FailureKind::Panic => "panic",
            FailureKind::Leak => "leak",
            FailureKind::WrongAnswer => "wrong answer",
            FailureKind::BrokenPromise => "broken promise",
            FailureKind::SessionGuarantee => "session guarantee",
            FailureKind::SyncCursor => "sync cursor",
            FailureKind::Intrusion => "intrusion",
            FailureKind::StampConflict => "stamp conflict",
            FailureKind::ImpostorOp => "impostor op",
            FailureKind::WrongRefusal => "wrong refusal",
            FailureKind::WrongOutcome => "wrong outcome",
            FailureKind::Connections => "connections",
        }
    }
}

/// Capsules and records spell a kind by its words.
impl serde::Serialize for FailureKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for FailureKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        FailureKind::parse(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown failure kind {name:?}")))
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What went wrong in a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub kind: FailureKind,
    pub detail: String,
}

impl Failure {
    pub fn new(kind: FailureKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.detail)
    }
}

/// The first failure of a run, shared by whoever sees one while the run
/// goes on (clients checking their writes, the nemesis's sweeps, the
/// supervisor's restarts); later failures are consequences and dropped.
#[derive(Clone)]
pub struct Verdict {
    first: Arc<Mutex<Option<Failure>>>,
    trace: Trace,
}

impl Verdict {
    pub fn new(trace: Trace) -> Self {
        Self {
            first: Arc::default(),
            trace,
        }
    }

    /// Records `failure` unless one came first.
    pub fn fail(&self, failure: Failure) {
        let mut first = self.first.lock().unwrap();
        if first.is_none() {
            self.trace.record("world", format!("FAILURE {failure}"));
            *first = Some(failure);
        }
    }

    pub fn failed(&self) -> bool {
        self.first.lock().unwrap().is_some()
    }

    /// `Err` with the first failure, if any.
    pub fn result(&self) -> Result<(), Failure> {
        match self.first.lock().unwrap().clone() {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reports read as they did when kinds were strings.
    #[test]
    fn kinds_print_their_words() {
        let failure = Failure::new(FailureKind::LostWrite, "op 7 is missing");
        assert_eq!(failure.to_string(), "lost write: op 7 is missing");
        assert_eq!(FailureKind::HungCallers.to_string(), "hung callers");
    }

    /// Every kind is in `ALL` once and reads back from its words.
    #[test]
    fn kinds_parse_from_their_words() {
        for kind in FailureKind::ALL {
            assert_eq!(FailureKind::parse(kind.name()), Some(kind));
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(serde_json::from_str::<FailureKind>(&json).unwrap(), kind);
        }
        let names: std::collections::BTreeSet<_> = FailureKind::ALL.iter().collect();
        assert_eq!(names.len(), FailureKind::ALL.len());
        assert_eq!(FailureKind::parse("lost writes"), None);
        assert!(serde_json::from_str::<FailureKind>("\"lost writes\"").is_err());
    }

    /// The first failure wins, and only it reaches the trace.
    #[test]
    fn the_first_failure_is_kept() {
        let runtime = madsim::runtime::Runtime::with_seed_and_config(1, Default::default());
        runtime.block_on(async {
            let trace = Trace::new(false);
            let verdict = Verdict::new(trace.clone());
            assert_eq!(verdict.result(), Ok(()));
            verdict.fail(Failure::new(FailureKind::Divergence, "first"));
            verdict.fail(Failure::new(FailureKind::Liveness, "second"));
            assert!(verdict.failed());
            let first = verdict.result().unwrap_err();
            assert_eq!(first.kind, FailureKind::Divergence);
            assert_eq!(first.detail, "first");
            assert_eq!(trace.events().len(), 1);
        });
    }
}
