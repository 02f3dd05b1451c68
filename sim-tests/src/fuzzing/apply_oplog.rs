//! Fuzz target `apply_oplog`: two replicas receive the same replicated ops
//! in different orders and different batch splits; both must end equal to
//! each other and to the paper's model, keep the tree invariant after every
//! batch, refuse exactly the invalid ops, and treat every op they already
//! hold as known (no change, `fresh: false`).

use super::ops::{
    batch_sizes, clear_between_inputs, dump_or_empty, fast_small_page_forest, fuzz_tree, is_valid,
    memory_small_page_forest, model_of, shuffled, FuzzMove, MAX_OPS,
};
use arbitrary::{Arbitrary, Unstructured};
use arbor::forest::{Forest, InvariantCheck, WriteOp, WriteOutcome, WriteRequest};
use arbor::model::TreeModel;
use arbor::{Move, NodeId, NodeInfo, Timestamp};
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};

/// Field order matters: `ops` is last so that it takes all the remaining
/// bytes (arbitrary's `take_rest`), giving long op lists from short inputs.
#[derive(Arbitrary, Debug)]
pub struct Input {
    /// Replica B's delivery order is a permutation drawn from this.
    pub order_seed: u64,
    /// Batch sizes of each replica, cycled.
    pub batches_a: [u8; 3],
    pub batches_b: [u8; 3],
    pub ops: Vec<FuzzMove>,
}

/// The ops of one input sorted out: the first op with each timestamp, and
/// the later ones with a timestamp already taken by a different op.
struct OpSet {
    /// Delivered to both replicas, duplicates included.
    stream: Vec<Move>,
    /// First op per timestamp: what the replicas must converge to.
    canonical: Vec<Move>,
    /// Same timestamp as a canonical op but different content.
    conflicting: Vec<Move>,
}

fn sort_ops(ops: &[FuzzMove]) -> OpSet {
    let mut first: BTreeMap<Timestamp, Move> = BTreeMap::new();
    let mut set = OpSet {
        stream: Vec::new(),
        canonical: Vec::new(),
        conflicting: Vec::new(),
    };
    for op in ops.iter().take(MAX_OPS).map(|f| f.to_move()) {
        // A refused op does not take its timestamp.
        if !is_valid(&op) {
            set.stream.push(op);
            continue;
        }
        match first.get(&op.ts()) {
            Some(known) if *known != op => set.conflicting.push(op),
            Some(_) => set.stream.push(op),
            None => {
                first.insert(op.ts(), op.clone());
                set.canonical.push(op.clone());
                set.stream.push(op);
            }
        }
    }
    set
}

pub fn check(data: &[u8]) {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    run(&input);
}

thread_local! {
    /// The two replicas, opened once per thread and emptied before every
    /// input: opening and closing two redb databases per input cost more
    /// than the input itself. Clearing restarts tree numbering too, so an
    /// input sees exactly what a fresh forest would show it.
    static REPLICAS: (Forest, Forest) = (fast_small_page_forest(1), memory_small_page_forest(2));
    /// Inputs run on this thread's replicas.
    static INPUTS_RUN: Cell<u64> = const { Cell::new(0) };
}

pub fn run(input: &Input) {
    let number = INPUTS_RUN.with(|n| n.replace(n.get() + 1));
    REPLICAS.with(|(a, b)| {
        clear_between_inputs(a, number);
        clear_between_inputs(b, number);
        run_on(input, a, b);
    });
}

fn run_on(input: &Input, a: &Forest, b: &Forest) {
    let set = sort_ops(&input.ops);
    let order_b = shuffled(&set.stream, input.order_seed);

    let expected_fresh: BTreeSet<Timestamp> = set
        .canonical
        .iter()
        .filter(|op| is_valid(op))
        .map(|op| op.ts())
        .collect();
    for (forest, order, sizes) in [
        (a, &set.stream, &input.batches_a),
        (b, &order_b, &input.batches_b),
    ] {
        let delivery = deliver(forest, order, sizes, false);
        let fresh: BTreeSet<Timestamp> = delivery.fresh.into_iter().collect();
        assert_eq!(fresh, expected_fresh, "fresh ops differ from the new ones");
    }

    let dump_a = dump_or_empty(a);
    assert_eq!(dump_a, dump_or_empty(b), "replicas diverged");
    let model = model_of(&set.canonical);
    assert_eq!(dump_a, model.dump(), "forest differs from the model");
    if !expected_fresh.is_empty() {
        check_paths(a, b, &model);
    }

    let requests: Vec<WriteRequest> = set.conflicting.iter().map(apply_request).collect();
    let outcomes = if requests.is_empty() {
        Vec::new()
    } else {
        a.write_batch(&requests)
            .expect("a batch on a fault-free disk commits")
            .results
    };
    for (op, outcome) in set.conflicting.iter().zip(outcomes) {
        assert!(
            outcome.is_err(),
            "an op reusing timestamp {} with other content was accepted: {outcome:?}",
            op.ts()
        );
    }
    // One batch of everything (no sizes): every op is known or refused,
    // so a split would only repeat the same check in more transactions.
    let redelivered = deliver(a, &set.stream, &[], !expected_fresh.is_empty());
    assert!(
        redelivered.fresh.is_empty(),
        "known ops applied again: {:?}",
        redelivered.fresh
    );
    assert_eq!(dump_or_empty(a), dump_a, "re-delivery changed the tree");
}

/// Timestamps a replica reported as fresh, in order.
struct Delivery {
    fresh: Vec<Timestamp>,
}

/// Delivers `ops` in batches, checking each outcome and the tree
/// invariant: after every batch that applied something fresh, at the
/// nodes that batch can have changed (the checks of
/// `check_invariants_touched`, run inside the batch's own transaction
/// before it commits: `write_batch_checked`), and over the whole committed
/// tree once at the end (`check_invariants`). A batch of
/// known or refused ops must change nothing; if it broke the tree anyway,
/// the break persists into the final full check (the re-delivery pass
/// compares whole dumps as well). Every valid op must be reported fresh
/// exactly once over the replica's life; `deliver` checks the
/// once-per-call part. `tree_exists`: whether the forest holds the fuzz
/// tree already (from its first valid op on); known here, so no read
/// transaction asks.
///
/// The batches are `sizes`' split with each run of consecutive batches
/// that cannot change anything merged into one (see `merge_idle_runs`).
fn deliver(forest: &Forest, ops: &[Move], sizes: &[u8], mut tree_exists: bool) -> Delivery {
    let mut fresh = Vec::new();
    // Child of every op this call reported fresh, by timestamp.
    let mut applied: BTreeMap<Timestamp, NodeId> = BTreeMap::new();
    for batch in merge_idle_runs(ops, &batch_sizes(ops.len(), sizes)) {
        let requests: Vec<WriteRequest> = batch.iter().map(apply_request).collect();
        let mut touched = Vec::new();
        let checked = forest
            .write_batch_checked(&requests, |results| {
                touched = touched_by(&applied, batch, results);
                if touched.is_empty() {
                    return Vec::new();
                }
                vec![(fuzz_tree(), InvariantCheck::Touched(touched.clone()))]
            })
            .expect("a batch on a fault-free disk commits");
        if let Err(e) = checked.verdict {
            panic!("invariant broken after a batch at nodes {touched:?}: {e}");
        }
        let results = checked.results;
        assert_eq!(results.len(), batch.len(), "one result per request");
        for (op, result) in batch.iter().zip(results) {
            match (is_valid(op), result) {
                (true, Ok(WriteOutcome::Applied { fresh: true })) => {
                    fresh.push(op.ts());
                    applied.insert(op.ts(), op.child);
                }
                (true, Ok(WriteOutcome::Applied { fresh: false })) => {}
                (false, Err(_)) => {}
                (valid, other) => panic!("op {op:?} (valid: {valid}) got {other:?}"),
            }
        }
        tree_exists |= batch.iter().any(is_valid);
    }
    if tree_exists {
        check_tree(forest, "after the last batch");
    }
    let distinct: BTreeSet<Timestamp> = fresh.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        fresh.len(),
        "an op was fresh twice: {fresh:?}"
    );
    Delivery { fresh }
}

/// Cuts `ops` by `sizes`, then merges every run of consecutive batches
/// that cannot apply anything fresh (each op refused, or with a
/// timestamp an earlier batch of this call delivered) into one batch.
/// Such a batch changes nothing, so the runs of fresh batches, the states
/// between them and every check on those stay as the split gave them; the
/// idle batch is still delivered at the same point and each of its ops
/// still checked (known or refused), once per run instead of once per
/// batch. Fuzzed inputs repeat ops a lot (a committed corpus: 13 batches
/// per delivery, 8 of them idle, 6 of those right after another idle
/// one), and every batch is a write transaction. Which batches are idle
/// is predicted from the ops alone; a wrong prediction (a forest that
/// takes a known op as fresh) fails the per-op check all the same.
fn merge_idle_runs<'a>(ops: &'a [Move], sizes: &[usize]) -> Vec<&'a [Move]> {
    let mut seen: BTreeSet<Timestamp> = BTreeSet::new();
    let mut batches: Vec<(std::ops::Range<usize>, bool)> = Vec::new();
    let mut start = 0;
    for &size in sizes {
        let range = start..start + size;
        start += size;
        let mut idle = true;
        for op in ops[range.clone()].iter().filter(|op| is_valid(op)) {
            idle &= !seen.insert(op.ts());
        }
        match batches.last_mut() {
            Some((last, true)) if idle => last.end = range.end,
            _ => batches.push((range, idle)),
        }
    }
    batches.into_iter().map(|(range, _)| &ops[range]).collect()
}

/// The nodes a batch can have changed, given its `results`: none when it
/// applied nothing fresh; otherwise, with its oldest fresh op at `oldest`,
/// the children of every op from `oldest` on, the batch's own and those
/// `applied` before it (undo/redo only reaches ops from `oldest` on, and
/// an op only changes its child). `applied` holds every op of the
/// forest's log when the delivery started from an empty forest, as the
/// first deliveries do; the re-delivery, into a forest already holding
/// everything, must find nothing fresh at all.
fn touched_by(
    applied: &BTreeMap<Timestamp, NodeId>,
    batch: &[Move],
    results: &[arbor::Result<WriteOutcome>],
) -> Vec<NodeId> {
    let fresh_now: Vec<&Move> = batch
        .iter()
        .zip(results)
        .filter(|(_, result)| matches!(result, Ok(WriteOutcome::Applied { fresh: true })))
        .map(|(op, _)| op)
        .collect();
    let Some(oldest) = fresh_now.iter().map(|op| op.ts()).min() else {
        return Vec::new();
    };
    let mut children: BTreeSet<NodeId> = applied.range(oldest..).map(|(_, &c)| c).collect();
    children.extend(fresh_now.iter().map(|op| op.child));
    children.into_iter().collect()
}

fn check_tree(forest: &Forest, when: &str) {
    if let Err(e) = forest.check_invariants(&fuzz_tree()) {
        panic!("invariant broken {when}: {e}");
    }
}

fn apply_request(op: &Move) -> WriteRequest {
    WriteRequest {
        tree: fuzz_tree(),
        op: WriteOp::Apply { op: op.clone() },
    }
}

/// Paths over the names the ops use ("a", "b"): both replicas must resolve
/// them as the model does, duplicates and all, with and without
/// `latest_only`. Only for a tree that exists (the input had a valid op).
/// Each replica answers every query from one snapshot (`get_by_paths`).
fn check_paths(a: &Forest, b: &Forest, model: &TreeModel) {
    let paths: Vec<Vec<String>> = [
        &["a"][..],
        &["b"],
        &["a", "a"],
        &["a", "b"],
        &["b", "a"],
        &["a", "b", "a"],
    ]
    .iter()
    .map(|path| path.iter().map(|c| c.to_string()).collect())
    .collect();
    let queries: Vec<(&[String], bool)> = paths
        .iter()
        .flat_map(|path| [(path.as_slice(), false), (path.as_slice(), true)])
        .collect();
    let expected: Vec<Vec<NodeInfo>> = queries
        .iter()
        .map(|&(path, latest_only)| model.get_by_path(path, latest_only))
        .collect();
    for forest in [a, b] {
        let found = forest
            .get_by_paths(&fuzz_tree(), "FileName", &queries)
            .expect("get_by_paths");
        for ((path, latest_only), (found, expected)) in
            queries.iter().zip(found.iter().zip(&expected))
        {
            assert_eq!(found, expected, "path {path:?} latest_only {latest_only}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbor::{make_timestamp, Meta, ROOT};

    fn op(counter: u64, child: NodeId) -> Move {
        Move {
            parent: ROOT,
            child,
            meta: Meta {
                time: make_timestamp(counter, 1),
                items: Vec::new(),
            },
        }
    }

    /// Only runs of idle batches merge; a fresh batch keeps its bounds,
    /// and an idle batch between two fresh ones is still delivered alone.
    #[test]
    fn idle_runs_merge_and_fresh_batches_keep_their_bounds() {
        let refused = op(9, ROOT);
        let ops = [
            op(1, 1),
            op(1, 1), // idle: known
            refused.clone(),
            op(1, 1), // idle, after idle: merged
            op(2, 2), // fresh
            op(2, 2), // idle, alone between two fresh batches
            op(3, 3), // fresh, and a known op in the same batch
            op(1, 1),
        ];
        let batches = merge_idle_runs(&ops, &[1, 1, 1, 1, 1, 1, 2]);
        let lens: Vec<usize> = batches.iter().map(|b| b.len()).collect();
        assert_eq!(lens, [1, 3, 1, 1, 2]);
        assert_eq!(batches.concat(), ops, "every op delivered, in order");
        // Nothing idle: the split stays as given.
        let fresh: Vec<Move> = (1..=4).map(|c| op(c, c)).collect();
        let lens: Vec<usize> = merge_idle_runs(&fresh, &[1, 2, 1])
            .iter()
            .map(|b| b.len())
            .collect();
        assert_eq!(lens, [1, 2, 1]);
    }
}
