//! Shrinking a failing run: delta debugging over the plan's faults and
//! clients, a search for each client's smallest op budget, then smaller
//! scalars (duration, replicas, batch size). A step is kept only when the
//! run still fails with the same `FailureKind`. Every trial is a whole
//! deterministic run; the trials of one step run on `jobs` threads.
//! `shrink_to_capsule` then replays the minimal capsule as a reader of its
//! file would and refuses one that does not fail with that kind.

use crate::disk::SplitMix64;
use crate::failure::FailureKind;
use crate::scenario::capsule::{Capsule, KeptFor};
use crate::scenario::plan::Plan;
use crate::scenario::{run_plan, Options, Report};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most trial runs one shrink spends by default; past its budget the
/// smallest plan so far is the answer.
pub const SHRINK_TRIALS_MAX: u64 = 600;
/// Most times the schedule is moved earlier.
const ADVANCE_ROUNDS_MAX: usize = 8;
/// Shortest workload duration a shrink tries.
const WORKLOAD_DURATION_MIN: Duration = Duration::from_secs(1);
/// Shares (in percent) of every client's ops that the random samples
/// keep, smallest first, and the samples tried at each share.
const SAMPLE_SHARES_PERCENT: [u64; 2] = [5, 10];
const SAMPLES_PER_SHARE: usize = 4;
/// Mixed into the plan's seed for the samples' own stream.
const SAMPLE_STREAM: u64 = 0x5348_5249_4e4b_0000;

/// Why a run cannot be shrunk.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShrinkError {
    #[error("the run passed: nothing to shrink")]
    Passed,
    #[error(
        "the shrunk capsule replays {} instead of failing with {kind}: not written",
        replayed.map_or("clean".to_string(), |k| format!("as {k}"))
    )]
    NotReproduced {
        kind: FailureKind,
        replayed: Option<FailureKind>,
    },
}

/// Which trial runs a shrink keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accept {
    /// Runs that fail with the first run's kind: the shrinker.
    SameKind,
    /// Every run, failing or not: a broken shrinker, which the test of
    /// `shrink_to_capsule`'s replay check plants.
    Anything,
}

/// A shrink's result.
pub struct Shrunk {
    pub kind: FailureKind,
    pub before: Plan,
    /// The smallest plan that still fails with `kind`, and its run.
    pub after: Plan,
    pub report: Report,
    pub trials: u64,
    pub wall: Duration,
}

/// The counts a shrink table shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    pub faults: usize,
    pub clients: usize,
    pub client_ops: u64,
    pub replicas: usize,
    pub workload_ms: u64,
}

impl Counts {
    pub fn of(plan: &Plan) -> Counts {
        Counts {
            faults: plan.faults.len(),
            clients: plan.clients.len(),
            client_ops: plan.client_ops(),
            replicas: plan.swarm.replicas,
            workload_ms: plan.swarm.size.workload_duration.as_millis() as u64,
        }
    }
}

struct Shrinker<'a> {
    options: &'a Options,
    jobs: usize,
    kind: FailureKind,
    accept: Accept,
    best: Plan,
    report: Report,
    trials: AtomicU64,
    trials_max: u64,
}

/// Shrinks a failing `plan` with at most `trials_max` trial runs after
/// the first.
pub fn shrink(
    plan: &Plan,
    options: &Options,
    jobs: usize,
    trials_max: u64,
) -> Result<Shrunk, ShrinkError> {
    shrink_with(plan, options, jobs, trials_max, Accept::SameKind)
}

/// Shrinks a failing `plan` into a capsule (`faults` and `commit` as
/// `Capsule::of` takes them), kept for the first run's failure kind. The
/// capsule is read back from its JSON and replayed; one that does not fail
/// with that kind proves nothing and is `ShrinkError::NotReproduced`.
pub fn shrink_to_capsule(
    plan: &Plan,
    options: &Options,
    (faults, commit): (bool, &str),
    jobs: usize,
    trials_max: u64,
    accept: Accept,
) -> Result<(Shrunk, Capsule), ShrinkError> {
    let shrunk = shrink_with(plan, options, jobs, trials_max, accept)?;
    let mut capsule = Capsule::of(&shrunk.report, faults, commit);
    capsule.kept_for = Some(KeptFor::Failure(shrunk.kind));
    let read = Capsule::parse(&capsule.to_json()).expect("a written capsule reads back");
    let replay = read.run(false);
    if read.check(&replay).is_err() {
        return Err(ShrinkError::NotReproduced {
            kind: shrunk.kind,
            replayed: replay.failure.map(|f| f.kind),
        });
    }
    Ok((shrunk, capsule))
}

fn shrink_with(
    plan: &Plan,
    options: &Options,
    jobs: usize,
    trials_max: u64,
    accept: Accept,
) -> Result<Shrunk, ShrinkError> {
    let started = Instant::now();
    let report = run_plan(plan, options);
    let kind = report.failure.as_ref().ok_or(ShrinkError::Passed)?.kind;
    let mut shrinker = Shrinker {
        options,
        jobs: jobs.max(1),
        kind,
        accept,
        best: plan.clone(),
        report,
        trials: AtomicU64::new(0),
        trials_max,
    };
    shrinker.cut_after_failure();
    shrinker.sample_ops();
    for _ in 0..2 {
        shrinker.faults();
        shrinker.clients();
        shrinker.client_ops();
    }
    shrinker.advance_faults();
    shrinker.scalars();
    shrinker.client_ops();
    shrinker.skip_ops();
    shrinker.faults();
    Ok(Shrunk {
        kind,
        before: plan.clone(),
        after: shrinker.best,
        report: shrinker.report,
        trials: shrinker.trials.into_inner(),
        wall: started.elapsed(),
    })
}

impl Shrinker<'_> {
    fn accepts(&self, report: &Report) -> bool {
        match self.accept {
            Accept::SameKind => report.failure.as_ref().map(|f| f.kind) == Some(self.kind),
            Accept::Anything => true,
        }
    }

    fn budget_left(&self) -> bool {
        self.trials.load(Ordering::Relaxed) < self.trials_max
    }

    /// Runs the candidates on `jobs` threads; the first (in order) that
    /// fails with the kind becomes the best plan. Candidates after a
    /// failing one are not started.
    fn try_first(&mut self, candidates: Vec<Plan>) -> bool {
        let found = AtomicUsize::new(usize::MAX);
        let next = AtomicUsize::new(0);
        let reports: Mutex<Vec<(usize, Report)>> = Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for _ in 0..self.jobs.min(candidates.len()) {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= candidates.len() || i > found.load(Ordering::Relaxed) {
                        return;
                    }
                    if self.trials.fetch_add(1, Ordering::Relaxed) >= self.trials_max {
                        return;
                    }
                    let report = run_plan(&candidates[i], self.options);
                    if self.accepts(&report) {
                        found.fetch_min(i, Ordering::Relaxed);
                        reports.lock().unwrap().push((i, report));
                    }
                });
            }
        });
        let best = reports
            .into_inner()
            .unwrap()
            .into_iter()
            .min_by_key(|r| r.0);
        match best {
            Some((i, report)) => {
                self.best = candidates[i].clone();
                self.report = report;
                true
            }
            None => false,
        }
    }

    /// Faults planned after the failure was seen cannot have caused it.
    fn cut_after_failure(&mut self) {
        let failed_at = self
            .report
            .events
            .iter()
            .find(|e| e.what.starts_with("FAILURE"))
            .map(|e| e.at);
        let Some(failed_at) = failed_at else { return };
        let mut plan = self.best.clone();
        // Fault times count from the workload's start, which is at or
        // after zero, so this keeps every fault that started before.
        plan.faults
            .retain(|f| Duration::from_millis(f.at_ms) <= failed_at);
        if plan.faults.len() < self.best.faults.len() {
            self.try_first(vec![plan]);
        }
    }

    /// Random samples of the clients' ops, a few at each share: a failure
    /// that needs a coincidence in time (an op pending while two faults
    /// overlap) rather than particular ops survives some of them, where
    /// delta debugging, which removes ops in order, moves every later op
    /// earlier (a skipped op keeps its think time, not its call's) and
    /// loses the coincidence at each step (docs/simulation.md, "Shrinking").
    fn sample_ops(&mut self) {
        let mut rng = SplitMix64::new(self.best.swarm.seed ^ SAMPLE_STREAM);
        for share_percent in SAMPLE_SHARES_PERCENT {
            if !self.budget_left() {
                return;
            }
            let candidates = (0..SAMPLES_PER_SHARE)
                .map(|_| sampled(&self.best, share_percent, &mut rng))
                .filter(|plan| plan.client_ops() < self.best.client_ops())
                .collect();
            if self.try_first(candidates) {
                return;
            }
        }
    }

    fn faults(&mut self) {
        let with = |plan: &Plan, faults| Plan {
            faults,
            ..plan.clone()
        };
        let best = self.best.clone();
        if let Some(faults) = self.ddmin(best.faults.clone(), 0, |items| with(&best, items)) {
            self.best.faults = faults;
        }
    }

    fn clients(&mut self) {
        let best = self.best.clone();
        let with = |clients| Plan {
            clients,
            ..best.clone()
        };
        if let Some(clients) = self.ddmin(best.clients.clone(), 1, with) {
            self.best.clients = clients;
        }
    }

    /// Delta debugging: tries the list without each of `n` chunks (and
    /// with none of it), keeps the first smaller list that still fails,
    /// and refines `n` until chunks are single items. `Some(list)` when
    /// it shrank.
    fn ddmin<T: Clone>(
        &mut self,
        mut items: Vec<T>,
        min_len: usize,
        plan_of: impl Fn(Vec<T>) -> Plan,
    ) -> Option<Vec<T>> {
        let original = items.len();
        if items.len() > min_len && min_len == 0 && self.try_first(vec![plan_of(Vec::new())]) {
            return Some(Vec::new());
        }
        let mut n = 2;
        while items.len() > min_len.max(1) && self.budget_left() {
            let chunk = items.len().div_ceil(n);
            let candidates: Vec<Vec<T>> = (0..n)
                .map(|i| {
                    let (start, end) = (i * chunk, ((i + 1) * chunk).min(items.len()));
                    [&items[..start.min(items.len())], &items[end..]].concat()
                })
                .filter(|c| c.len() >= min_len && c.len() < items.len())
                .collect();
            let plans = candidates.iter().cloned().map(&plan_of).collect();
            if self.try_first(plans) {
                items = self.current_list(&candidates, &plan_of);
                n = (n - 1).max(2);
            } else if n >= items.len() {
                break;
            } else {
                n = (2 * n).min(items.len());
            }
        }
        (items.len() < original).then_some(items)
    }

    /// The candidate list that became the best plan.
    fn current_list<T: Clone>(
        &self,
        candidates: &[Vec<T>],
        plan_of: impl Fn(Vec<T>) -> Plan,
    ) -> Vec<T> {
        candidates
            .iter()
            .find(|c| plan_of((*c).clone()) == self.best)
            .cloned()
            .expect("the best plan is one of the candidates")
    }

    /// For each client, the smallest op budget that still fails, by a
    /// search that tries `jobs` budgets at once.
    fn client_ops(&mut self) {
        for index in 0..self.best.clients.len() {
            let mut high = self.best.clients[index].ops;
            let mut low = 0;
            while high > low && self.budget_left() {
                let candidates = budgets(low, high, self.jobs);
                let plans = candidates
                    .iter()
                    .map(|&ops| {
                        let mut plan = self.best.clone();
                        plan.clients[index].ops = ops;
                        plan
                    })
                    .collect();
                if self.try_first(plans) {
                    let found = self.best.clients[index].ops;
                    low = candidates
                        .iter()
                        .copied()
                        .filter(|&c| c < found)
                        .max()
                        .map_or(low, |c| c + 1);
                    high = found;
                } else {
                    low = candidates.last().map_or(high, |&c| c + 1);
                }
            }
        }
    }

    /// Delta debugging over each client's ops one by one: the ops left
    /// out go to the client's `skip` list.
    fn skip_ops(&mut self) {
        for index in 0..self.best.clients.len() {
            let client = self.best.clients[index].clone();
            let issued: Vec<u64> = (0..client.ops)
                .filter(|i| !client.skip.contains(i))
                .collect();
            let best = self.best.clone();
            let with = |kept: Vec<u64>| {
                let mut plan = best.clone();
                plan.clients[index].skip = (0..client.ops).filter(|i| !kept.contains(i)).collect();
                plan
            };
            if let Some(kept) = self.ddmin(issued, 0, with) {
                self.best.clients[index].skip =
                    (0..client.ops).filter(|i| !kept.contains(i)).collect();
            }
        }
    }

    /// Moves the schedule earlier (a quarter of each time, the first
    /// fault at the start, half of each time), so that fewer ops and a
    /// shorter run may reach it.
    fn advance_faults(&mut self) {
        for _ in 0..ADVANCE_ROUNDS_MAX {
            let first_ms = self.best.faults.iter().map(|f| f.at_ms).min().unwrap_or(0);
            let last_ms = self.best.faults.iter().map(|f| f.at_ms).max().unwrap_or(0);
            if last_ms == 0 || !self.budget_left() {
                return;
            }
            let moved = |shift: &dyn Fn(u64) -> u64| {
                let mut plan = self.best.clone();
                for fault in &mut plan.faults {
                    fault.at_ms = shift(fault.at_ms);
                }
                plan
            };
            let mut candidates = vec![moved(&|at| at / 4)];
            if first_ms > 0 {
                candidates.push(moved(&|at| at - first_ms));
            }
            candidates.push(moved(&|at| at / 2));
            if !self.try_first(candidates) {
                return;
            }
        }
    }

    /// Shorter runs, fewer replicas, smaller batches and sync pages.
    fn scalars(&mut self) {
        while self.budget_left() {
            let mut plan = self.best.clone();
            let duration = plan.swarm.size.workload_duration / 2;
            if duration < WORKLOAD_DURATION_MIN {
                break;
            }
            plan.swarm.size.workload_duration = duration;
            let end_ms = duration.as_millis() as u64;
            plan.faults.retain(|f| f.at_ms < end_ms);
            if !self.try_first(vec![plan]) {
                break;
            }
        }
        for replicas in (2..self.best.swarm.replicas).rev() {
            let plan = self.best.with_replicas(replicas);
            if !self.budget_left() || !self.try_first(vec![plan]) {
                break;
            }
        }
        self.halve_knob(|plan| &mut plan.swarm.knobs.max_batch_size);
        // Smaller sync pages reach a paging bug with fewer ops.
        self.halve_knob(|plan| &mut plan.swarm.knobs.sync_page_size);
    }

    /// Halves one knob while the failure stays (down to 1).
    fn halve_knob(&mut self, knob: impl Fn(&mut Plan) -> &mut usize) {
        while *knob(&mut self.best.clone()) > 1 && self.budget_left() {
            let mut plan = self.best.clone();
            *knob(&mut plan) /= 2;
            if !self.try_first(vec![plan]) {
                break;
            }
        }
    }
}

/// `plan` with each client keeping a random `share_percent` of the ops it
/// issues (at least one); the others join its skip list.
fn sampled(plan: &Plan, share_percent: u64, rng: &mut SplitMix64) -> Plan {
    let mut plan = plan.clone();
    for client in &mut plan.clients {
        let skip: BTreeSet<u64> = client.skip.iter().copied().collect();
        let mut issued: Vec<u64> = (0..client.ops).filter(|i| !skip.contains(i)).collect();
        let keep = (issued.len() as u64 * share_percent / 100).max(1) as usize;
        // The first `keep` places of a partial Fisher-Yates shuffle.
        for i in 0..keep.min(issued.len()) {
            let j = i + (rng.next_u64() % (issued.len() - i) as u64) as usize;
            issued.swap(i, j);
        }
        let kept: BTreeSet<u64> = issued.into_iter().take(keep).collect();
        client.skip = (0..client.ops).filter(|i| !kept.contains(i)).collect();
    }
    plan
}

/// Up to `jobs` budgets spread over `low..high`, smallest first.
fn budgets(low: u64, high: u64, jobs: usize) -> Vec<u64> {
    let span = high - low;
    let parts = (jobs as u64 + 1).min(span.max(1));
    let mut points: Vec<u64> = (0..parts).map(|i| low + span * i / parts).collect();
    points.dedup();
    points
}

#[cfg(test)]
mod tests {
    use super::{budgets, sampled, SplitMix64};
    use crate::scenario::plan::swarm::{Profile, Size, Swarm};
    use crate::scenario::plan::Plan;

    /// A sample keeps the share asked of each client's issued ops (at
    /// least one), only ops the client issued, and is the same for the
    /// same stream.
    #[test]
    fn samples_keep_their_share_of_issued_ops() {
        let mut plan = Plan::draw(Swarm::draw(5, Profile::Standard, Size::TEST, true));
        plan.clients[0].skip = (0..10).collect();
        let issued_before: Vec<u64> = plan.clients.iter().map(|c| c.ops_issued()).collect();
        let a = sampled(&plan, 10, &mut SplitMix64::new(1));
        assert_eq!(a, sampled(&plan, 10, &mut SplitMix64::new(1)));
        for (client, before) in a.clients.iter().zip(issued_before) {
            assert_eq!(client.ops_issued(), (before * 10 / 100).max(1));
        }
        assert!((0..10).all(|i| a.clients[0].skip.contains(&i)));
    }

    /// The budget search always tries the low end and never the high one
    /// (already known to fail).
    #[test]
    fn budgets_cover_the_low_end() {
        assert_eq!(budgets(0, 100, 2), vec![0, 33, 66]);
        assert_eq!(budgets(5, 6, 2), vec![5]);
        assert_eq!(budgets(0, 3, 4), vec![0, 1, 2]);
        for (low, high) in [(0, 1), (3, 90), (10, 11)] {
            let b = budgets(low, high, 3);
            assert_eq!(b[0], low);
            assert!(b.iter().all(|&x| x < high));
        }
    }
}
