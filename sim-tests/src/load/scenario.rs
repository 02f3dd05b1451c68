//! What the object gateway sends: two scenarios at once, as in the reference
//! k6 script. `system` adds nodes to tree "system" at a low fixed rate;
//! `user` adds object versions by path to tree "version" at the rate under
//! test. Every new node carries seven meta fields.

use arbor::proto::Request;
use arbor::types::{ContainerId, KeyValue, TreeKey, ATTR_FILE_NAME, ROOT};
use serde::Serialize;
use std::time::Duration;

/// The container every load request addresses.
pub const LOAD_CID: ContainerId = ContainerId([0x4c; 32]);

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
    fn constant(name: &str, workload: Workload, rate: u64, duration: Duration) -> Self {
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
    pub fn request(&self, n: u64) -> Request {
        match self.workload {
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

/// The seven fields an S3 gateway stores per object version.
fn meta_items(file_name: &str, n: u64) -> Vec<KeyValue> {
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
