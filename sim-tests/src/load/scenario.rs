//! What the object gateway sends: two scenarios at once, as in the reference
//! k6 script. `system` adds nodes to tree "system" at a low fixed rate;
//! `user` adds object versions by path to tree "version" at the rate under
//! test. Every new node carries seven meta fields. [`Requests`] picks the
//! shapes: this crate's own (`default`), the reference tree loader's
//! (`loader`), or the S3 gateway's call sequences (`gateway`, see
//! `load::gateway`).

use super::gateway::GatewayOp;
use arbor::proto::Request;
use arbor::types::{ContainerId, KeyValue, TreeKey, ATTR_FILE_NAME, ROOT};
use serde::Serialize;
use std::time::Duration;

/// The container every load request of the default shapes addresses.
pub const LOAD_CID: ContainerId = ContainerId([0x4c; 32]);

/// The container of the reference tree loader's requests: all zeros.
pub const LOADER_CID: ContainerId = ContainerId([0; 32]);

/// Which requests the generator sends (`--requests`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Requests {
    /// `system` (Add) beside `user` (AddByPath of
    /// `bucket/prefix-P/object-N`), unique names, in container 0x4c...
    #[default]
    Default,
    /// The reference tree loader's requests: container all zeros; `system`
    /// Adds under the root with the same seven meta pairs every time,
    /// `user` AddByPaths of `test/only/path/N` with seven meta fields.
    Loader,
    /// The S3 gateway's call sequences, one scenario per S3 operation
    /// (`load::gateway`); `--rate` is split between them.
    Gateway,
}

impl Requests {
    pub fn name(self) -> &'static str {
        match self {
            Requests::Default => "default",
            Requests::Loader => "loader",
            Requests::Gateway => "gateway",
        }
    }

    /// The scenarios of a run: `system` at `system_rate` (0: none) beside
    /// `user` in `user_stages`, or the gateway's operations sharing the
    /// stages' rates.
    pub fn scenarios(
        self,
        system_rate: u64,
        user_stages: Vec<Stage>,
        prefixes: u32,
    ) -> Vec<Scenario> {
        let total: Duration = user_stages.iter().map(|s| s.duration).sum();
        let (system, user) = match self {
            Requests::Default => (Workload::SystemAdd, Workload::UserAddByPath { prefixes }),
            Requests::Loader => (Workload::LoaderAdd, Workload::LoaderAddByPath),
            Requests::Gateway => {
                return GatewayOp::ALL
                    .iter()
                    .map(|&op| {
                        let stages = user_stages
                            .iter()
                            .map(|s| Stage {
                                duration: s.duration,
                                rate: op.rate_of(s.rate),
                            })
                            .collect();
                        Scenario::constant(op.name(), Workload::Gateway(op), 1, total)
                            .with_stages(stages)
                    })
                    .collect();
            }
        };
        let mut scenarios = Vec::new();
        if system_rate > 0 {
            scenarios.push(Scenario::constant("system", system, system_rate, total));
        }
        scenarios.push(Scenario::constant("user", user, 1, total).with_stages(user_stages));
        scenarios
    }
}

/// A stretch of time at one arrival rate (k6's ramping stages, without the
/// ramp: the rate changes in steps).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Stage {
    pub duration: Duration,
    /// Iterations started per second.
    pub rate: u64,
}

/// Which requests a scenario sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Workload {
    /// `Add` under ROOT of tree "system".
    SystemAdd,
    /// `AddByPath` of `bucket/prefix-P/object-N` into tree "version".
    UserAddByPath {
        /// Objects are spread over this many prefixes (directories).
        prefixes: u32,
    },
    /// The reference loader's `Add` under ROOT of tree "system" in
    /// [`LOADER_CID`], with the same seven meta pairs every time.
    LoaderAdd,
    /// The reference loader's `AddByPath` of `test/only/path/N` into tree
    /// "version" of [`LOADER_CID`] (N the iteration: every call creates the
    /// directory N and the leaf in it), seven meta fields.
    LoaderAddByPath,
    /// One of the S3 gateway's call sequences per iteration.
    Gateway(GatewayOp),
}

impl Workload {
    /// The tree whose nodes an acknowledged iteration names (`--verify`
    /// looks them up there).
    pub fn tree(self) -> TreeKey {
        match self {
            Workload::SystemAdd => TreeKey::new(LOAD_CID, "system"),
            Workload::UserAddByPath { .. } => TreeKey::new(LOAD_CID, "version"),
            Workload::LoaderAdd => TreeKey::new(LOADER_CID, "system"),
            Workload::LoaderAddByPath => TreeKey::new(LOADER_CID, "version"),
            Workload::Gateway(_) => super::gateway::version_tree(),
        }
    }
}

/// One k6 scenario: a constant-arrival-rate executor per stage.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Scenario {
    pub name: String,
    pub workload: Workload,
    pub stages: Vec<Stage>,
    /// VUs available from the start.
    pub vus_prealloc: u64,
    /// The pool never grows beyond this many VUs.
    pub vus_max: u64,
}

impl Scenario {
    /// k6's `system` scenario of the reference script.
    pub fn system(rate: u64, duration: Duration) -> Self {
        Self::constant("system", Workload::SystemAdd, rate, duration)
    }

    /// k6's `user` scenario of the reference script.
    pub fn user(rate: u64, duration: Duration, prefixes: u32) -> Self {
        Self::constant("user", Workload::UserAddByPath { prefixes }, rate, duration)
    }

    /// One stage at `rate`; VUs preallocated for one second of arrivals and
    /// allowed to grow to five seconds' worth (= rate x the 5 s deadline, so
    /// a pool this size never runs dry before deadlines expire).
    pub fn constant(name: &str, workload: Workload, rate: u64, duration: Duration) -> Self {
        Self {
            name: name.to_string(),
            workload,
            stages: vec![Stage { duration, rate }],
            vus_prealloc: rate.max(1),
            vus_max: (rate * 5).max(1),
        }
    }

    pub fn duration(&self) -> Duration {
        self.stages.iter().map(|s| s.duration).sum()
    }

    /// Replaces the stages, resizing the VU pool to the highest rate.
    pub fn with_stages(mut self, stages: Vec<Stage>) -> Self {
        let rate_max = stages.iter().map(|s| s.rate).max().unwrap_or(1).max(1);
        self.stages = stages;
        self.vus_prealloc = rate_max;
        self.vus_max = rate_max * 5;
        self
    }

    /// The request of iteration `n` (0-based, unique within the scenario).
    /// A gateway scenario's iteration is a sequence of calls
    /// (`gateway::iteration`), never one request.
    pub fn request(&self, n: u64) -> Request {
        match self.workload {
            Workload::LoaderAdd => Request::Add {
                tree: self.workload.tree(),
                parent: ROOT,
                items: LOADER_SYSTEM_META
                    .iter()
                    .map(|(key, value)| KeyValue::new(*key, *value))
                    .collect(),
            },
            Workload::LoaderAddByPath => Request::AddByPath {
                tree: self.workload.tree(),
                attr: ATTR_FILE_NAME.to_string(),
                path: ["test", "only", "path"]
                    .into_iter()
                    .map(String::from)
                    .chain([n.to_string()])
                    .collect(),
                items: meta_items(&format!("object-{n}"), n),
            },
            Workload::Gateway(op) => {
                panic!(
                    "scenario {}: a {op:?} iteration is a call sequence, not one request",
                    self.name
                )
            }
            Workload::SystemAdd => Request::Add {
                tree: TreeKey::new(LOAD_CID, "system"),
                parent: ROOT,
                items: meta_items(&format!("system-{n}"), n),
            },
            Workload::UserAddByPath { prefixes } => Request::AddByPath {
                tree: TreeKey::new(LOAD_CID, "version"),
                attr: ATTR_FILE_NAME.to_string(),
                path: vec![
                    "bucket".to_string(),
                    format!("prefix-{}", n % u64::from(prefixes.max(1))),
                ],
                items: meta_items(&format!("object-{n}"), n),
            },
        }
    }
}

/// The seven meta pairs of every loader `Add` on tree "system": the same
/// keys and values each time, as the reference loader sends them.
const LOADER_SYSTEM_META: [(&str, &str); 7] = [
    (ATTR_FILE_NAME, "system-object"),
    (
        "OID",
        "7b1e0c9a3f2d4e6b8a5c1d0f9e8b7a6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a",
    ),
    ("Created", "1700000000000"),
    ("Owner", "NbUgTSFvPmsRxmGeWpuuGeJUoRoi6PErcM"),
    ("IsUnversioned", "true"),
    ("ETag", "d41d8cd98f00b204e9800998ecf8427e"),
    ("Size", "4096"),
];

/// The seven fields an S3 gateway stores per object version.
pub fn meta_items(file_name: &str, n: u64) -> Vec<KeyValue> {
    vec![
        KeyValue::new(ATTR_FILE_NAME, file_name.as_bytes()),
        KeyValue::new(
            "OID",
            format!("{:064x}", n.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        ),
        KeyValue::new("Created", (1_700_000_000_000u64 + n).to_string()),
        KeyValue::new("Owner", "NbUgTSFvPmsRxmGeWpuuGeJUoRoi6PErcM"),
        KeyValue::new("IsUnversioned", "false"),
        KeyValue::new("ETag", format!("{:032x}", n)),
        KeyValue::new("Size", (1024 + n % 4096).to_string()),
    ]
}

/// The iteration scheduled at `at` (since the scenario's start): how many
/// iterations were due strictly before `at`, stage by stage.
pub fn iterations_due(stages: &[Stage], at: Duration) -> u64 {
    let mut due = 0;
    let mut stage_start = Duration::ZERO;
    for stage in stages {
        let into = at.saturating_sub(stage_start).min(stage.duration);
        due += (into.as_nanos() * u128::from(stage.rate)).div_ceil(1_000_000_000) as u64;
        stage_start += stage.duration;
        if at <= stage_start {
            break;
        }
    }
    due
}

/// When iteration `n` is due, or `None` past the last stage.
pub fn iteration_start(stages: &[Stage], n: u64) -> Option<Duration> {
    let mut first = 0u64;
    let mut stage_start = Duration::ZERO;
    for stage in stages {
        let count = iterations_due(&[*stage], stage.duration);
        if n < first + count {
            let k = u128::from(n - first);
            let offset_ns = k * 1_000_000_000 / u128::from(stage.rate);
            return Some(stage_start + Duration::from_nanos(offset_ns as u64));
        }
        first += count;
        stage_start += stage.duration;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_is_exact_per_stage() {
        let stages = [
            Stage {
                duration: Duration::from_secs(2),
                rate: 3,
            },
            Stage {
                duration: Duration::from_millis(1500),
                rate: 2,
            },
        ];
        // 6 in the first stage, 3 in the second (at 0, 0.5, 1.0 s into it).
        assert_eq!(iterations_due(&stages, Duration::from_secs(10)), 9);
        assert_eq!(iteration_start(&stages, 0), Some(Duration::ZERO));
        assert_eq!(
            iteration_start(&stages, 5),
            Some(Duration::from_nanos(1_666_666_666))
        );
        assert_eq!(iteration_start(&stages, 6), Some(Duration::from_secs(2)));
        assert_eq!(iteration_start(&stages, 8), Some(Duration::from_secs(3)));
        assert_eq!(iteration_start(&stages, 9), None);
    }

    /// The reference loader's shapes: container all zeros, the system
    /// scenario's Adds identical (seven pairs), the user scenario's paths
    /// `test/only/path/N` with seven meta fields; the default shapes stay.
    #[test]
    fn loader_requests_have_the_reference_shapes() {
        let stages = vec![Stage {
            duration: Duration::from_secs(2),
            rate: 100,
        }];
        let scenarios = Requests::Loader.scenarios(10, stages.clone(), 1);
        let names: Vec<&str> = scenarios.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["system", "user"]);
        assert_eq!(scenarios[0].stages[0].rate, 10);
        assert_eq!(scenarios[1].stages, stages);
        let (system, user) = (&scenarios[0], &scenarios[1]);
        let first = system.request(0);
        assert_eq!(first, system.request(41), "every system Add is the same");
        match first {
            Request::Add {
                tree,
                parent,
                items,
            } => {
                assert_eq!(
                    (tree.cid, tree.tree.as_str(), parent),
                    (LOADER_CID, "system", ROOT)
                );
                assert_eq!(items.len(), 7);
            }
            other => panic!("unexpected {other:?}"),
        }
        for n in [0u64, 7, 12345] {
            match user.request(n) {
                Request::AddByPath {
                    tree,
                    attr,
                    path,
                    items,
                } => {
                    assert_eq!((tree.cid, tree.tree.as_str()), (LOADER_CID, "version"));
                    assert_eq!(attr, ATTR_FILE_NAME);
                    assert_eq!(path, ["test", "only", "path", &n.to_string()]);
                    assert_eq!(items.len(), 7);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        let default = Requests::Default.scenarios(10, stages, 1);
        assert_eq!(default[0].workload, Workload::SystemAdd);
        assert_eq!(default[1].workload, Workload::UserAddByPath { prefixes: 1 });
        assert_eq!(default[1].workload.tree().cid, LOAD_CID);
    }

    /// The gateway's operations share the rate by their weights, each at
    /// least once a second, and add up to the whole.
    #[test]
    fn gateway_scenarios_share_the_rate() {
        let stages = vec![Stage {
            duration: Duration::from_secs(3),
            rate: 1000,
        }];
        let scenarios = Requests::Gateway.scenarios(10, stages, 1);
        assert_eq!(scenarios.len(), GatewayOp::ALL.len());
        let total: u64 = scenarios.iter().map(|s| s.stages[0].rate).sum();
        assert_eq!(total, 1000);
        assert!(scenarios
            .iter()
            .all(|s| s.duration() == Duration::from_secs(3)));
        let slow = Requests::Gateway.scenarios(
            0,
            vec![Stage {
                duration: Duration::from_secs(1),
                rate: 3,
            }],
            1,
        );
        assert!(slow.iter().all(|s| s.stages[0].rate == 1));
    }

    #[test]
    fn user_paths_are_unique_and_meta_has_seven_fields() {
        let s = Scenario::user(10, Duration::from_secs(1), 4);
        let names: std::collections::BTreeSet<_> = (0..100)
            .map(|n| match s.request(n) {
                Request::AddByPath { path, items, .. } => {
                    assert_eq!(items.len(), 7);
                    assert_eq!(path.len(), 2);
                    (path, items[0].value.clone())
                }
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(names.len(), 100);
    }
}
