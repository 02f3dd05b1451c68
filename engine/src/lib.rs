//! Arbor's engine: the move-CRDT forest on redb, group commit, and the
//! replicated tree service on abstract clock, runtime and network.

pub mod batcher;
pub mod canary;
pub mod certs;
pub mod config;
pub mod drain;
pub mod error;
pub mod files;
pub mod forest;
pub mod grpc;
pub mod identity;
pub mod metrics;
pub mod model;
pub mod net;
pub mod probe;
pub mod proto;
pub mod runtime;
pub mod service;
pub mod system;
pub mod tcp;
pub mod tls;
pub mod types;
pub mod validate;

pub use error::{Error, Result};
pub use identity::Caller;
pub use types::*;
