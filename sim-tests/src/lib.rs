//! Arbor's simulated world: madsim clusters of real Arbor nodes on a
//! simulated clock, network and disk, with faults, workloads and checkers;
//! plus the fuzz check functions and the load evaluator.

pub mod cli;
pub mod coverage;
pub mod disk;
pub mod failure;
pub mod files;
pub mod fuzzing;
pub mod grpc_calls;
pub mod host;
pub mod load;
pub mod scenario;
pub mod trace;
pub mod world;
