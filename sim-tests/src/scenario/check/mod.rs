//! The checkers that hold a simulated cluster to what Arbor promises. A
//! checker looks at one checkpoint (the world once its faults have healed,
//! the ledger of what the clients were acknowledged, and every replica's
//! trees captured in one pass) and returns a typed failure. A new checker
//! (an answer oracle, say) implements `Checker` and joins `standard()`.
//!
//! `invariants` holds the tree invariant (after every write, in periodic
//! sweeps and at every checkpoint), `convergence` equal replicas and equal
//! reads, `durability` acknowledged writes kept, `answers` state and
//! answers equal to the reference model's and what callers were promised,
//! `liveness` deadlines and callers answered, `trust` nothing kept of the
//! intruder and no stamp conflicts, `impostor` nothing kept of a process
//! that claimed another replica's id.
//!
//! What they judge by: `ledger` (what the clients were acknowledged, and
//! what they sent) and `oracle` (the reference model's answer to a read, also
//! applied to every answer during the run). `claims` holds each profile
//! to the situations its sweeps must reach.

pub mod answers;
pub mod claims;
pub mod convergence;
pub mod durability;
pub mod impostor;
pub mod invariants;
pub mod ledger;
pub mod liveness;
pub mod oracle;
pub mod outcome;
pub mod rights;
pub mod trust;

use crate::failure::Failure;
use crate::world::World;
use arbor::forest::ReplicaContent;
use arbor::runtime::BoxFuture;
use arbor::{ReplicaId, TreeKey};
use ledger::Ledger;
use std::collections::BTreeMap;

/// Every tree of every replica, as the full invariant check captured it.
pub type Contents = BTreeMap<ReplicaId, BTreeMap<TreeKey, ReplicaContent>>;

/// What a checker sees.
pub struct Checkpoint<'a> {
    pub world: &'a World,
    pub ledger: &'a Ledger,
    pub contents: Contents,
    /// When it was taken, for failure details ("after a sync round ...").
    pub when: &'a str,
    empty: ReplicaContent,
}

impl<'a> Checkpoint<'a> {
    pub fn new(world: &'a World, ledger: &'a Ledger, contents: Contents, when: &'a str) -> Self {
        Self {
            world,
            ledger,
            contents,
            when,
            empty: ReplicaContent::default(),
        }
    }

    /// The content of `tree` on `replica`; empty where it has no such tree.
    pub fn content(&self, replica: ReplicaId, tree: &TreeKey) -> &ReplicaContent {
        self.contents
            .get(&replica)
            .and_then(|trees| trees.get(tree))
            .unwrap_or(&self.empty)
    }
}

/// One property the cluster must have at a checkpoint.
pub trait Checker: Send + Sync {
    fn check<'a>(&'a self, at: &'a Checkpoint<'a>) -> BoxFuture<'a, Result<(), Failure>>;
}

/// The checkers of every checkpoint, in the order they run: what the
/// replicas detected themselves (stamp conflicts, a replica id twice) and
/// the intruder's traces before the divergence they cause; a divergence
/// before the writes it lost, and both before reads that differ because
/// of them.
pub fn standard() -> Vec<Box<dyn Checker>> {
    vec![
        Box::new(trust::IntruderLeftNoTrace),
        Box::new(impostor::ImpostorLeftNoTrace),
        Box::new(convergence::SameState),
        Box::new(answers::ModelState),
        Box::new(durability::AckedWrites),
        Box::new(answers::Promises),
        Box::new(convergence::SameReads),
        Box::new(answers::ConvergedReads),
    ]
}

/// Captures a checkpoint (checking the tree invariant of every tree on
/// the way) and runs `checkers` on it.
pub async fn check_at(
    world: &World,
    ledger: &Ledger,
    when: &str,
    checkers: &[Box<dyn Checker>],
) -> Result<(), Failure> {
    let contents = invariants::capture(world)?;
    let at = Checkpoint::new(world, ledger, contents, when);
    for checker in checkers {
        checker.check(&at).await?;
    }
    world.trace.record("world", format!("converged {when}"));
    Ok(())
}
