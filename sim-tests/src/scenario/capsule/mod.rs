//! Failure capsules: one JSON file holding everything a run read (the
//! plan: configuration, fault schedule, client streams and budgets), the
//! seed madsim ran it on, the canary, the commit, what the run gave
//! (failure kind, trace fingerprint) and what the capsule is kept for.
//! `arbor-sim replay --capsule FILE` reruns it exactly; an edited capsule
//! (a fault or a client deleted, a budget cut) still runs, because the run
//! reads its faults and ops from the plan.
//!
//! What a capsule is kept for (`KeptFor`) is what its replay must still
//! reach: a failure kind (under the capsule's canary, if it names one), or,
//! for a bug since fixed, a clean run that reaches the coverage events of
//! the situation that used to fail. `replay --check` replays and says
//! whether it does; when it does not, it names the command that records
//! the capsule anew.
//!
//! `shrink` cuts a failing run down to a minimal capsule.

pub mod shrink;

use super::plan::{Plan, PlanError};
use super::{run_plan, Options, Report};
use crate::coverage::Coverage;
use crate::failure::FailureKind;
use crate::world::Network;
use arbor::canary::Canary;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

/// The capsule format this build reads and writes. Format 2 names the
/// network its run was on (tcp or tls); format 1 capsules may have run on
/// a datagram network the simulator no longer has, and are not read.
pub const CAPSULE_FORMAT: u32 = 2;
/// Largest capsule file read: a plan with every limit at its maximum is
/// far below it.
pub const CAPSULE_BYTES_MAX: u64 = 16 << 20;

/// One run, as data.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Capsule {
    pub format: u32,
    /// The madsim seed (network and scheduling randomness); also the
    /// seed the plan was drawn from before any edit.
    pub seed: u64,
    /// The commit of the build that wrote the capsule.
    pub commit: String,
    /// "standard", "small" or "custom" (the plan holds the numbers).
    pub size: String,
    pub faults: bool,
    /// The planted bug switched on (engine/src/canary.rs), by name.
    pub canary: Option<String>,
    /// The network the run's nodes were on.
    pub network: Network,
    /// What the run gave when the capsule was written.
    pub outcome: Outcome,
    /// What a replay must still reach. Every capsule written has it; a
    /// capsule without it (written before it existed) replays, and
    /// `replay --check` refuses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_for: Option<KeptFor>,
    pub plan: Plan,
}

/// What a capsule was kept for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum KeptFor {
    /// The run fails with this kind (with the capsule's canary on, when
    /// it names one): a planted bug, or a real one not yet fixed.
    Failure(FailureKind),
    /// A real bug since fixed: the run fails no more, and still reaches
    /// every coverage event of `reaches`, which together name the
    /// situation in which it failed with `failed_with`. A replay that
    /// misses one of them no longer tests the fix.
    Fixed {
        failed_with: FailureKind,
        reaches: Vec<Coverage>,
    },
}

impl fmt::Display for KeptFor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeptFor::Failure(kind) => write!(f, "failing with {kind}"),
            KeptFor::Fixed {
                failed_with,
                reaches,
            } => {
                let names: Vec<String> = reaches.iter().map(|c| format!("{c:?}")).collect();
                write!(
                    f,
                    "the fixed {failed_with} failure: a clean run reaching {}",
                    names.join(", ")
                )
            }
        }
    }
}

/// Why a replay does not reach what its capsule was kept for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Missed {
    /// The capsule says nothing of what it was kept for.
    NoKeptFor,
    /// The run did not fail with the kind (`None`: it passed).
    Kind {
        wanted: FailureKind,
        got: Option<FailureKind>,
    },
    /// The fixed bug's run failed (the bug, or another, is back).
    FailsAgain { failure: String },
    /// The fixed bug's run no longer reaches these coverage events.
    Unreached(Vec<Coverage>),
}

impl fmt::Display for Missed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Missed::NoKeptFor => f.write_str("the capsule has no kept_for"),
            Missed::Kind { wanted, got: None } => {
                write!(f, "passed instead of failing with {wanted}")
            }
            Missed::Kind {
                wanted,
                got: Some(got),
            } => write!(f, "failed with {got} instead of {wanted}"),
            Missed::FailsAgain { failure } => write!(f, "fails again: {failure}"),
            Missed::Unreached(missing) => {
                let names: Vec<String> = missing.iter().map(|c| format!("{c:?}")).collect();
                write!(f, "never reached {}", names.join(", "))
            }
        }
    }
}

impl KeptFor {
    /// What a failing or passing run of a capsule was kept for: the
    /// failure's kind (a passing run is kept for nothing yet).
    pub fn of(report: &Report) -> Option<KeptFor> {
        report.failure.as_ref().map(|f| KeptFor::Failure(f.kind))
    }

    /// `Ok` when `report` reaches it.
    pub fn reached_by(&self, report: &Report) -> Result<(), Missed> {
        let got = report.failure.as_ref().map(|f| f.kind);
        match self {
            KeptFor::Failure(wanted) if got == Some(*wanted) => Ok(()),
            KeptFor::Failure(wanted) => Err(Missed::Kind {
                wanted: *wanted,
                got,
            }),
            KeptFor::Fixed { reaches, .. } => {
                if let Some(failure) = &report.failure {
                    return Err(Missed::FailsAgain {
                        failure: failure.to_string(),
                    });
                }
                let missing: Vec<Coverage> = reaches
                    .iter()
                    .copied()
                    .filter(|&c| report.coverage.get(c) == 0)
                    .collect();
                if missing.is_empty() {
                    Ok(())
                } else {
                    Err(Missed::Unreached(missing))
                }
            }
        }
    }
}

/// What a run gave.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// `None` when the run passed.
    pub failure_kind: Option<String>,
    pub failure: Option<String>,
    pub trace_fingerprint: String,
    pub faults_injected: u64,
    pub ops_sent: u64,
}

/// Why a capsule cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum CapsuleError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {size} bytes, over the limit of {CAPSULE_BYTES_MAX}")]
    TooLarge { path: PathBuf, size: u64 },
    #[error("{path}: not a capsule: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error(
        "{path}: capsule format {found}, this build reads {CAPSULE_FORMAT}; record its seed \
         anew with `arbor-sim replay --seed S --out FILE` (and `shrink` it again)"
    )]
    Format { path: PathBuf, found: u32 },
    #[error("{path}: unknown canary {name:?}")]
    Canary { path: PathBuf, name: String },
    #[error("{path}: {source}")]
    Plan { path: PathBuf, source: PlanError },
}

impl Outcome {
    pub fn of(report: &Report) -> Outcome {
        Outcome {
            failure_kind: report.failure.as_ref().map(|f| f.kind.name().to_string()),
            failure: report.failure.as_ref().map(|f| f.detail.clone()),
            trace_fingerprint: format!("{:016x}", report.trace_hash),
            faults_injected: report.faults_injected,
            ops_sent: report.ops_sent,
        }
    }

    /// True when `kind` is the kind this outcome failed with.
    pub fn failed_with(&self, kind: Option<FailureKind>) -> bool {
        self.failure_kind.as_deref() == kind.map(FailureKind::name)
    }
}

impl Capsule {
    /// The capsule of a finished run.
    pub fn of(report: &Report, faults: bool, commit: &str) -> Capsule {
        Capsule {
            format: CAPSULE_FORMAT,
            seed: report.seed,
            commit: commit.to_string(),
            size: report.plan.swarm.size.name().to_string(),
            faults,
            canary: report.canary.map(|c| format!("{c:?}")),
            network: report.network,
            outcome: Outcome::of(report),
            kept_for: KeptFor::of(report),
            plan: report.plan.clone(),
        }
    }

    /// `Ok` when `report`, a replay of this capsule, reaches what the
    /// capsule was kept for.
    pub fn check(&self, report: &Report) -> Result<(), Missed> {
        match &self.kept_for {
            None => Err(Missed::NoKeptFor),
            Some(kept_for) => kept_for.reached_by(report),
        }
    }

    /// The capsule with `report` (a replay of it that reaches what it was
    /// kept for) as its outcome, recorded by `commit`.
    pub fn recorded(&self, report: &Report, commit: &str) -> Result<Capsule, Missed> {
        self.check(report)?;
        Ok(Capsule {
            commit: commit.to_string(),
            outcome: Outcome::of(report),
            ..self.clone()
        })
    }

    /// The command that records the capsule at `path` anew. A canary's
    /// capsule is its first failing seed shrunk again (`scripts/results.sh
    /// --only shrink` does it for every canary, finding the seed anew);
    /// any other is replayed and recorded if it still reaches what it was
    /// kept for, else it has to be found again (regressions/README.md).
    pub fn rerecord_command(&self, path: &Path) -> String {
        match &self.canary {
            Some(canary) => format!(
                "cargo run --release -p arbor-sim -- shrink --seed {} --small --jobs 2 --profile {} --canary {canary}{} --out {} (or scripts/results.sh --only shrink)",
                self.seed,
                self.plan.swarm.profile.name(),
                match self.network.is_default() {
                    true => String::new(),
                    false => format!(" --network {}", self.network.name()),
                },
                path.display()
            ),
            None => format!(
                "cargo run --release -p arbor-sim -- replay --quiet --capsule {} --record",
                path.display()
            ),
        }
    }

    /// Reads and checks a capsule; every problem is a typed error.
    pub fn read(path: &Path) -> Result<Capsule, CapsuleError> {
        let io = |source| CapsuleError::Io {
            path: path.to_path_buf(),
            source,
        };
        let size = std::fs::metadata(path).map_err(io)?.len();
        if size > CAPSULE_BYTES_MAX {
            return Err(CapsuleError::TooLarge {
                path: path.to_path_buf(),
                size,
            });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        Capsule::parse(&text).map_err(|e| e.at(path))
    }

    /// Parses and checks a capsule's text (errors name no path yet).
    pub fn parse(text: &str) -> Result<Capsule, CapsuleError> {
        let path = PathBuf::new();
        let json = |source| CapsuleError::Json {
            path: PathBuf::new(),
            source,
        };
        // The format first: another format's fields may not parse.
        let value: serde_json::Value = serde_json::from_str(text).map_err(json)?;
        let found = value.get("format").and_then(serde_json::Value::as_u64);
        if found != Some(u64::from(CAPSULE_FORMAT)) {
            let found = found.map_or(0, |f| u32::try_from(f).unwrap_or(u32::MAX));
            return Err(CapsuleError::Format { path, found });
        }
        let capsule: Capsule = serde_json::from_value(value).map_err(json)?;
        capsule.canary()?;
        capsule
            .plan
            .validate()
            .map_err(|source| CapsuleError::Plan { path, source })?;
        Ok(capsule)
    }

    /// The canary the capsule names.
    pub fn canary(&self) -> Result<Option<Canary>, CapsuleError> {
        match &self.canary {
            None => Ok(None),
            Some(name) => super::parse_canary(name)
                .map(Some)
                .map_err(|_| CapsuleError::Canary {
                    path: PathBuf::new(),
                    name: name.clone(),
                }),
        }
    }

    /// The options the run needs besides its plan.
    pub fn options(&self, echo_trace: bool) -> Options {
        Options {
            profile: self.plan.swarm.profile,
            size: self.plan.swarm.size,
            faults: self.faults,
            canary: self.canary().ok().flatten(),
            echo_trace,
            network: self.network,
        }
    }

    /// Reruns the capsule on madsim seed `self.seed`, on its network.
    pub fn run(&self, echo_trace: bool) -> Report {
        self.run_over(echo_trace, self.network)
    }

    /// Reruns the capsule's plan on `network`: on another network than
    /// the one it was recorded on, its fingerprint does not hold, but
    /// whether it still reaches what it was kept for can be checked.
    pub fn run_over(&self, echo_trace: bool, network: Network) -> Report {
        let mut plan = self.plan.clone();
        // The madsim seed is the capsule's; the plan's own seed field
        // also seeds the disks, and an edit may not change it apart.
        plan.swarm.seed = self.seed;
        let options = Options {
            network,
            ..self.options(echo_trace)
        };
        run_plan(&plan, &options)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a capsule always serializes")
    }

    /// Writes the capsule to `path`, creating its directory.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        use std::io::Write as _;
        let mut file = crate::files::create_file(path)?;
        file.write_all(self.to_json().as_bytes())?;
        file.write_all(b"\n")
    }

    /// A file name that says what the capsule holds.
    pub fn file_name(&self, suffix: &str) -> String {
        let canary = self.canary.as_deref().unwrap_or("no-canary");
        format!(
            "{}-{canary}-seed-{}{suffix}.json",
            self.plan.swarm.profile.name(),
            self.seed
        )
    }
}

impl CapsuleError {
    fn at(self, path: &Path) -> CapsuleError {
        let path = path.to_path_buf();
        match self {
            CapsuleError::Json { source, .. } => CapsuleError::Json { path, source },
            CapsuleError::Format { found, .. } => CapsuleError::Format { path, found },
            CapsuleError::Canary { name, .. } => CapsuleError::Canary { path, name },
            CapsuleError::Plan { source, .. } => CapsuleError::Plan { path, source },
            other => other,
        }
    }
}

/// The command that replays a capsule file.
pub fn replay_command(path: &Path) -> String {
    format!(
        "cargo run --release -p arbor-sim -- replay --capsule {}",
        path.display()
    )
}
