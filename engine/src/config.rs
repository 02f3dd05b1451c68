//! Node configuration: the keys of the modelled system (DESIGN §7) plus this
//! node's identity, peers and container membership.
//!
//! SKELETON (issue 3 fills in YAML parsing, durations like `5ms`, and errors
//! that name the offending key). The struct shapes are the contract the
//! simulator and the load evaluator build configs with.

use crate::types::{ContainerId, ReplicaId};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub tree: TreeConfig,
    pub pilorama: PiloramaConfig,
    pub node: NodeConfig,
    pub limits: Limits,
}

/// `tree:` section.
#[derive(Clone, Debug, PartialEq)]
pub struct TreeConfig {
    pub enabled: bool,
    pub cache_size: usize,
    pub replication_worker_count: usize,
    pub replication_channel_capacity: usize,
    pub replication_timeout: Duration,
    /// `None` (0 or absent in the file): background sync off.
    pub sync_interval: Option<Duration>,
}

/// `pilorama:` section.
#[derive(Clone, Debug, PartialEq)]
pub struct PiloramaConfig {
    pub max_batch_delay: Duration,
    pub max_batch_size: usize,
    pub path: PathBuf,
    /// Acknowledge before the batch is durable (operator's choice).
    pub no_sync: bool,
}

/// `node:` section: who this node is and who its peers are.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeConfig {
    pub replica_id: ReplicaId,
    pub listen: String,
    pub peers: Vec<PeerConfig>,
    /// Containers with an explicit replica set. A container not listed is
    /// replicated on this node and every peer.
    pub containers: Vec<ContainerConfig>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PeerConfig {
    pub replica_id: ReplicaId,
    pub address: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ContainerConfig {
    pub cid: ContainerId,
    pub replicas: Vec<ReplicaId>,
}

/// `limits:` section: bounds on everything that could grow.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Largest frame or message, in bytes.
    pub max_message_bytes: usize,
    /// Largest meta of one node, in bytes.
    pub max_meta_bytes: usize,
    /// Longest path, in components.
    pub max_path_len: usize,
    /// Writes waiting for the batcher; beyond it requests fail fast with
    /// `Overloaded`.
    pub max_pending_writes: usize,
    /// Ops per GetOpLog page (sync) and per Apply push (replication).
    pub sync_page_size: usize,
    /// Largest GetSubTree answer, in nodes.
    pub max_subtree_nodes: usize,
    /// Concurrent inbound connections (TCP).
    pub max_connections: usize,
    /// Connect timeout for outbound calls (TCP).
    pub connect_timeout: Duration,
}
