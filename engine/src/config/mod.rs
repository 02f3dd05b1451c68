//! Node configuration: the keys of the modelled system (docs/design.md §7)
//! plus this node's identity, peers and container membership.
//!
//! The file is YAML. Every key is optional except `node.replica_id`;
//! missing keys, and keys given no value, take the docs/design.md §7
//! values. Unknown keys and bad values are refused with `Error::Config`
//! naming the key's full path (`tree.replication_timeout: ...`,
//! `node.peers[1].address: missing`), so a typo never silently falls back
//! to a default.

mod access;
mod parse;
#[cfg(test)]
mod tests;

use crate::error::{Error, Result};
use crate::forest::ForestOptions;
use crate::types::{ContainerId, ReplicaId};
use crate::validate::InputLimits;
pub use access::{AccessConfig, ContainerAccess, Grants, Role};
use serde::Deserialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub tree: TreeConfig,
    #[serde(default)]
    pub pilorama: PiloramaConfig,
    pub node: NodeConfig,
    #[serde(default)]
    pub limits: Limits,
    /// Who may call what (docs/design.md §9).
    #[serde(default)]
    pub access: AccessConfig,
    /// The gRPC front (docs/grpc.md).
    #[serde(default)]
    pub grpc: GrpcConfig,
}

/// `grpc:` section: the gRPC `tree.TreeService` front that gateways and
/// loaders call (docs/grpc.md).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrpcConfig {
    /// Where the front listens; `None` (absent): no gRPC front.
    pub listen: Option<String>,
    /// The certificate and key the gRPC port presents. Absent: the node's
    /// own (`node.tls`) when it has one, else plaintext (loopback only
    /// unless `node.insecure_plaintext`).
    pub tls: Option<GrpcTlsFiles>,
    /// Concurrent gRPC connections; a connection beyond waits in the
    /// listen backlog until one closes.
    pub max_connections: usize,
    /// Calls one connection may have in flight (HTTP/2 streams).
    pub max_concurrent_streams: u32,
    /// Nodes (GetSubTree) or ops (GetOpLog) read per page of a stream: a
    /// stream holds one page in memory, whatever it streams in all.
    pub stream_page_nodes: usize,
    /// Signing keys the configuration names (`access:`,
    /// `node.peers[].public_key`) that get a verification table (~0.27 MiB
    /// each, about ten times faster checks); other keys are checked the
    /// slower way.
    pub key_tables_max: usize,
}

/// `grpc.tls`: PEM files of the certificate (chain) and key of the gRPC
/// port. Gateways check it against their own trust store and host name,
/// so it may differ from the node's `arbor://` certificate.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Default for GrpcConfig {
    fn default() -> Self {
        Self {
            listen: None,
            tls: None,
            max_connections: 256,
            max_concurrent_streams: 128,
            stream_page_nodes: 1000,
            key_tables_max: 64,
        }
    }
}

/// `tree:` section.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TreeConfig {
    pub enabled: bool,
    pub cache_size: usize,
    pub replication_worker_count: usize,
    pub replication_channel_capacity: usize,
    #[serde(deserialize_with = "parse::duration")]
    pub replication_timeout: Duration,
    /// `None` (0 or absent in the file): background sync off.
    #[serde(deserialize_with = "parse::sync_interval")]
    pub sync_interval: Option<Duration>,
    /// Replicas that must hold a local write before it is answered: this
    /// node's commit plus `ack_replicas - 1` peers that acknowledged its
    /// push (docs/design.md §6). 1: answered once committed here.
    pub ack_replicas: usize,
}

/// `pilorama:` section.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PiloramaConfig {
    #[serde(deserialize_with = "parse::duration")]
    pub max_batch_delay: Duration,
    pub max_batch_size: usize,
    /// How long a batch holding only replicated ops (Apply, sync pages) may
    /// wait for more writes before it commits; any local write joining it
    /// brings its own, shorter deadline. Replicated ops have no client
    /// waiting, so grouping them saves a durable commit per push. 0: they
    /// batch like local writes.
    #[serde(deserialize_with = "parse::duration")]
    pub replicated_batch_delay: Duration,
    pub path: PathBuf,
    /// Acknowledge before the batch is durable (operator's choice).
    pub no_sync: bool,
    /// Tries to reopen the database after a storage error poisoned it,
    /// before the node gives up (until the next storage error).
    pub reopen_attempts_max: u32,
    /// Longest wait between two reopen tries (the wait doubles from 1/32
    /// of it).
    #[serde(deserialize_with = "parse::duration")]
    pub reopen_backoff_max: Duration,
    /// redb's page cache, in bytes. Pages beyond it are read again from
    /// the file (and so from the OS page cache).
    pub cache_bytes: usize,
    /// Batches go through the write-ahead log (docs/design.md §5): each
    /// syncs one appended record and commits to the database without
    /// durability. False: each batch is a durable database commit.
    pub wal: bool,
    /// The longest time between two checkpoints (durable database commits
    /// that let log segments go) while batches come in.
    #[serde(deserialize_with = "parse::duration")]
    pub checkpoint_interval: Duration,
    /// Log bytes after which the next batch is a checkpoint: bounds the
    /// log kept and what an open replays.
    pub checkpoint_bytes: usize,
    /// Size of a preallocated log segment.
    pub wal_segment_bytes: usize,
    /// Covered log segments kept to be written again instead of removed.
    pub wal_spare_segments: usize,
}

/// `node:` section: who this node is and who its peers are.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    pub replica_id: ReplicaId,
    #[serde(default = "parse::default_listen")]
    pub listen: String,
    #[serde(default)]
    pub peers: Vec<PeerConfig>,
    /// Containers with an explicit replica set. A container not listed is
    /// replicated on this node and every peer.
    #[serde(default)]
    pub containers: Vec<ContainerConfig>,
    /// The cluster this node belongs to: named in every certificate and
    /// exchanged in `Hello`, so that nodes of two clusters never mix.
    #[serde(default = "parse::default_cluster_id")]
    pub cluster_id: String,
    /// Mutual TLS on every connection; `None`: plaintext.
    #[serde(default)]
    pub tls: Option<TlsFiles>,
    /// Allows a plaintext listener on an address other than loopback.
    #[serde(default)]
    pub insecure_plaintext: bool,
    /// This node's disk was replaced: at every start it takes no local
    /// write until a sync round pulled every tree of every container it
    /// replicates from every peer (docs/design.md §6). Needs
    /// `tree.sync_interval`.
    #[serde(default)]
    pub rejoin: bool,
    /// Where the Prometheus metrics endpoint listens (plaintext HTTP:
    /// loopback only unless `insecure_plaintext`); `None`: no endpoint.
    #[serde(default)]
    pub metrics_listen: Option<String>,
    /// A node whose own certificate (`node.tls.cert`, `grpc.tls.cert`)
    /// expires within this time warns at start; an expired or not yet
    /// valid one stops it.
    #[serde(
        default = "parse::default_tls_expiry_warning",
        deserialize_with = "parse::duration"
    )]
    pub tls_expiry_warning: Duration,
}

/// `node.tls_expiry_warning` unless configured: 30 days.
pub const TLS_EXPIRY_WARNING_DEFAULT: Duration = Duration::from_secs(30 * 86_400);

/// Connections the metrics endpoint serves at once; a scraper beyond
/// waits in the listen backlog.
pub const METRICS_CONNECTIONS_MAX: usize = 4;

/// `node.tls`: PEM files of the cluster's CA and this node's certificate
/// (which must name `node.cluster_id` and `node.replica_id`) and key.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// `node.cluster_id` when the file does not name one.
pub const DEFAULT_CLUSTER_ID: &str = "arbor";

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    pub replica_id: ReplicaId,
    pub address: String,
    /// The public key this replica signs gRPC calls with (66 hex digits,
    /// compressed P-256, lowercase): a gRPC `Apply` or `GetOpLog` signed
    /// by it comes from this replica (docs/grpc.md).
    #[serde(default, deserialize_with = "parse::public_key")]
    pub public_key: Option<String>,
}

impl PeerConfig {
    /// A peer at `address` with no gRPC key.
    pub fn new(replica_id: ReplicaId, address: impl Into<String>) -> Self {
        Self {
            replica_id,
            address: address.into(),
            public_key: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerConfig {
    #[serde(deserialize_with = "parse::cid")]
    pub cid: ContainerId,
    #[serde(deserialize_with = "parse::replicas")]
    pub replicas: Vec<ReplicaId>,
    /// Replicas that held the container once and left it
    /// (docs/design.md §6, membership): neither peers nor served, but the
    /// ops they stamped while members are still the container's, so a
    /// pull accepts them.
    #[serde(default)]
    pub retired: Vec<ReplicaId>,
}

impl ContainerConfig {
    /// A container held by `replicas`, none retired.
    pub fn new(cid: ContainerId, replicas: Vec<ReplicaId>) -> Self {
        Self {
            cid,
            replicas,
            retired: Vec::new(),
        }
    }
}

/// `limits:` section: bounds on everything that could grow.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
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
    /// The most writes one group commit takes when a backlog is queued (one
    /// sync then serves all of them); below `pilorama.max_batch_size` it
    /// means `max_batch_size`. Bounds the length of one write transaction.
    pub max_commit_size: usize,
    /// Ops per GetOpLog page (sync) and per Apply push (replication).
    pub sync_page_size: usize,
    /// Heights of the local log a pusher looks at per page while it skips
    /// the ops other replicas originated (it sends only its own).
    pub push_scan_heights: usize,
    /// Push passes in a row a peer may refuse with `StampConflict` before
    /// the (tree, peer) pair is parked: no retry can resolve a conflict,
    /// only an operator (the pair resumes after a restart or a Drop).
    pub push_conflict_passes_max: usize,
    /// Stamps (height and timestamp, no op) per GetOpLogStamps page: a
    /// sync pull lists a peer's log this way and asks only for the ops it
    /// lacks.
    pub sync_stamp_page_size: usize,
    /// Recently stored local ops kept in memory (over all trees) so that
    /// the pushers of every peer share one log read of them; 0: off,
    /// every push pass reads the log.
    pub push_window_ops: usize,
    /// Largest GetSubTree answer, in nodes.
    pub max_subtree_nodes: usize,
    /// Most nodes in one page of a listing (`ListChildren`,
    /// `GetSubTreePage`); a larger page asked for gets this many.
    pub max_list_page_nodes: usize,
    /// Trees whose replication state is kept in memory (push bookkeeping,
    /// push windows, pull cursors), and tree names taken from one peer in
    /// one sync round. Beyond it the state of idle trees goes (their
    /// durable cursors are the truth) and a peer's further names wait for
    /// later rounds; a gateway makes trees per client, so without a bound
    /// this state would grow forever.
    pub max_tracked_trees: usize,
    /// Concurrent inbound connections (TCP).
    pub max_connections: usize,
    /// Connect timeout for outbound calls (TCP).
    #[serde(deserialize_with = "parse::duration")]
    pub connect_timeout: Duration,
    /// An inbound connection that starts no frame for this long is closed.
    #[serde(deserialize_with = "parse::duration")]
    pub idle_connection_timeout: Duration,
    /// Time an inbound TLS handshake may take.
    #[serde(deserialize_with = "parse::duration")]
    pub handshake_timeout: Duration,
    /// Bytes of frames being received, over all inbound connections; a
    /// frame waits for room (then gets `Overloaded`), never allocates past it.
    pub partial_frames_bytes_max: usize,
    /// How far the counter of a pushed op may be ahead of the largest
    /// counter its tree holds here (or of the ops before it in the same
    /// batch): ops beyond are refused with `CounterTooFar` until the tree
    /// has caught up, so that no pusher can drive a tree's counter to its
    /// end. Ops this replica pulls are not bounded (docs/design.md §9).
    pub counter_jump_max: u64,
}

/// The sync interval of the reference deployment (docs/design.md §7). An
/// absent key means "off", so this is only a named value for callers that
/// want it.
pub const REFERENCE_SYNC_INTERVAL: Duration = Duration::from_secs(5 * 60);

impl Default for TreeConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            // A connection carries one call at a time, so a pool that keeps
            // fewer idle connections than the calls a burst puts in flight
            // closes the rest and dials them again at the next burst: at
            // 15 the load gateway dialled for 23 % of its calls at
            // 10,000/s. 128 is what a client may have in flight to a node
            // (`tcp::client_share`, `limits.max_connections / 2`).
            cache_size: 128,
            replication_worker_count: 1000,
            replication_channel_capacity: 1000,
            replication_timeout: Duration::from_secs(5),
            sync_interval: None,
            ack_replicas: 1,
        }
    }
}

/// `pilorama.cache_bytes` unless configured: 256 MiB.
pub const PILORAMA_CACHE_BYTES_DEFAULT: usize = 256 << 20;

/// The smallest `pilorama.cache_bytes` accepted: 1 MiB.
pub const PILORAMA_CACHE_BYTES_MIN: usize = 1 << 20;

/// `pilorama.checkpoint_bytes` unless configured: 4 MiB. A checkpoint
/// writes every page dirtied since the last one while writes wait, so this
/// bounds that stall whatever the write rate, where the interval alone lets
/// it grow with the rate. One replica under 15,000 writes/s (30 s, p99 of
/// the writes): 111-130 ms at 64 MiB, where a 5 s interval made every
/// checkpoint; 26-48 ms at 1-4 MiB; the nodes' CPU per write moved by
/// less than the runs differed.
pub const PILORAMA_CHECKPOINT_BYTES_DEFAULT: u64 = 4 << 20;

/// `pilorama.wal_segment_bytes` unless configured: 16 MiB.
pub const PILORAMA_WAL_SEGMENT_BYTES_DEFAULT: u64 = 16 << 20;

/// `pilorama.wal_spare_segments` unless configured: 2. A roll into a new
/// segment writes it whole with zeros (writes into zeros sync faster than
/// writes into a hole or an unwritten extent: 160-170 us against 225-235
/// us per 40 KB append and `fdatasync` here), so a log that makes its
/// segments anew writes every byte twice; a spare is written already.
/// With the default checkpoint and segment sizes one spare is used per
/// segment; the second covers a checkpoint that frees two at once.
pub const PILORAMA_WAL_SPARE_SEGMENTS_DEFAULT: usize = 2;

/// The most `pilorama.wal_spare_segments` accepted: 64.
pub const PILORAMA_WAL_SPARE_SEGMENTS_MAX: usize = 64;

/// The smallest `pilorama.wal_segment_bytes` accepted: 4 KiB.
pub const PILORAMA_WAL_SEGMENT_BYTES_MIN: usize = 4 << 10;

impl Default for PiloramaConfig {
    fn default() -> Self {
        Self {
            max_batch_delay: Duration::from_millis(5),
            max_batch_size: 100,
            replicated_batch_delay: Duration::ZERO,
            path: PathBuf::from("./data/tree.db"),
            no_sync: false,
            reopen_attempts_max: 20,
            reopen_backoff_max: Duration::from_secs(2),
            // redb's own default is 1 GiB, which a node fills as its file
            // grows: memory the process must fault in and zero while it
            // grows, a copy beside the OS page cache. A 30 s load at
            // 25,000/s over 3 replicas in one process: 1 GiB peaked at
            // 2.5 GB RSS and avg 236-350 ms; 256 MiB at 1.2 GB and 9-11 ms.
            // 64 MiB did as well there but halved the re-apply of a
            // stored 100,000-op log, whose pages no longer fit.
            cache_bytes: PILORAMA_CACHE_BYTES_DEFAULT,
            wal: true,
            checkpoint_interval: Duration::from_secs(5),
            checkpoint_bytes: PILORAMA_CHECKPOINT_BYTES_DEFAULT as usize,
            wal_segment_bytes: PILORAMA_WAL_SEGMENT_BYTES_DEFAULT as usize,
            wal_spare_segments: PILORAMA_WAL_SPARE_SEGMENTS_DEFAULT,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_message_bytes: 4 << 20,
            max_meta_bytes: 64 << 10,
            max_path_len: 256,
            max_pending_writes: 10_000,
            max_commit_size: 1000,
            sync_page_size: 1000,
            push_scan_heights: 16_000,
            push_conflict_passes_max: 3,
            sync_stamp_page_size: 16_384,
            push_window_ops: 4096,
            max_subtree_nodes: 100_000,
            max_list_page_nodes: 10_000,
            max_tracked_trees: 10_000,
            max_connections: 256,
            connect_timeout: Duration::from_secs(2),
            idle_connection_timeout: Duration::from_secs(60),
            handshake_timeout: Duration::from_secs(10),
            partial_frames_bytes_max: 64 << 20,
            counter_jump_max: 1 << 20,
        }
    }
}

impl Limits {
    /// The bounds requests are checked against (see `validate`).
    pub fn input(&self) -> InputLimits {
        InputLimits {
            max_meta_bytes: self.max_meta_bytes,
            max_path_len: self.max_path_len,
        }
    }
}

impl NodeConfig {
    /// A node with no peers listening on a local ephemeral port.
    pub fn solo(replica_id: ReplicaId) -> Self {
        Self {
            replica_id,
            listen: "127.0.0.1:0".into(),
            peers: Vec::new(),
            containers: Vec::new(),
            cluster_id: DEFAULT_CLUSTER_ID.into(),
            tls: None,
            insecure_plaintext: false,
            rejoin: false,
            metrics_listen: None,
            tls_expiry_warning: TLS_EXPIRY_WARNING_DEFAULT,
        }
    }
}

impl Config {
    /// Defaults everywhere, no peers, sync off, and every caller trusted
    /// with everything (`access.anonymous: trusted`): a starting point for
    /// tests and the simulator, which then fill in peers, limits and, when
    /// they check rights, the rights their callers hold.
    pub fn default_for_test(replica_id: ReplicaId) -> Self {
        let access = AccessConfig::trusting_everyone();
        Self {
            tree: TreeConfig::default(),
            pilorama: PiloramaConfig::default(),
            node: NodeConfig::solo(replica_id),
            limits: Limits::default(),
            access,
            grpc: GrpcConfig::default(),
        }
    }

    /// Reads and parses a YAML file.
    pub fn load(path: &Path) -> Result<Self> {
        let text =
            crate::files::read_regular_text("--config", path, crate::files::CONFIG_FILE_BYTES_MAX)?;
        Self::from_yaml_str(&text)
    }

    /// Parses a YAML document; see the module comment for the rules.
    pub fn from_yaml_str(text: &str) -> Result<Self> {
        let config = parse::document(text)?;
        config.validate()?;
        Ok(config)
    }

    /// Cross-field checks; also useful for configs built in code.
    pub fn validate(&self) -> Result<()> {
        if self.pilorama.cache_bytes < PILORAMA_CACHE_BYTES_MIN {
            return Err(Error::Config(format!(
                "pilorama.cache_bytes: {} is below the minimum {PILORAMA_CACHE_BYTES_MIN}",
                self.pilorama.cache_bytes
            )));
        }
        if self.pilorama.wal_segment_bytes < PILORAMA_WAL_SEGMENT_BYTES_MIN {
            return Err(Error::Config(format!(
                "pilorama.wal_segment_bytes: {} is below the minimum {PILORAMA_WAL_SEGMENT_BYTES_MIN}",
                self.pilorama.wal_segment_bytes
            )));
        }
        if self.pilorama.wal_spare_segments > PILORAMA_WAL_SPARE_SEGMENTS_MAX {
            return Err(Error::Config(format!(
                "pilorama.wal_spare_segments: {} is above the maximum {PILORAMA_WAL_SPARE_SEGMENTS_MAX}",
                self.pilorama.wal_spare_segments
            )));
        }
        if self.pilorama.checkpoint_interval.is_zero() {
            return Err(Error::Config(
                "pilorama.checkpoint_interval: must not be 0".into(),
            ));
        }
        let positive = [
            ("pilorama.checkpoint_bytes", self.pilorama.checkpoint_bytes),
            (
                "tree.replication_worker_count",
                self.tree.replication_worker_count,
            ),
            (
                "tree.replication_channel_capacity",
                self.tree.replication_channel_capacity,
            ),
            ("pilorama.max_batch_size", self.pilorama.max_batch_size),
            ("tree.ack_replicas", self.tree.ack_replicas),
            ("limits.max_pending_writes", self.limits.max_pending_writes),
            ("limits.max_commit_size", self.limits.max_commit_size),
            ("limits.sync_page_size", self.limits.sync_page_size),
            ("limits.push_scan_heights", self.limits.push_scan_heights),
            (
                "limits.push_conflict_passes_max",
                self.limits.push_conflict_passes_max,
            ),
            (
                "limits.sync_stamp_page_size",
                self.limits.sync_stamp_page_size,
            ),
            ("limits.max_subtree_nodes", self.limits.max_subtree_nodes),
            (
                "limits.max_list_page_nodes",
                self.limits.max_list_page_nodes,
            ),
            ("limits.max_tracked_trees", self.limits.max_tracked_trees),
            ("limits.max_connections", self.limits.max_connections),
            ("limits.max_path_len", self.limits.max_path_len),
            (
                "limits.counter_jump_max",
                usize::from(self.limits.counter_jump_max != 0),
            ),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(Error::Config(format!("{key}: must be at least 1")));
            }
        }
        if self.pilorama.reopen_attempts_max == 0 || self.pilorama.reopen_backoff_max.is_zero() {
            return Err(Error::Config(
                "pilorama.reopen_attempts_max, reopen_backoff_max: must not be 0".into(),
            ));
        }
        if self.tree.replication_timeout.is_zero() {
            return Err(Error::Config(
                "tree.replication_timeout: must not be 0".into(),
            ));
        }
        // A push waits for the peer's commit within one replication
        // timeout; a window longer than half of it would time pushes out.
        if self.pilorama.replicated_batch_delay * 2 > self.tree.replication_timeout {
            return Err(Error::Config(
                "pilorama.replicated_batch_delay: must be at most half of tree.replication_timeout"
                    .into(),
            ));
        }
        // One node with the largest meta must fit into one message, or a
        // valid write could never be replicated.
        if self.limits.max_meta_bytes + MESSAGE_OVERHEAD_BYTES > self.limits.max_message_bytes {
            return Err(Error::Config(format!(
                "limits.max_message_bytes: must exceed limits.max_meta_bytes by at least {MESSAGE_OVERHEAD_BYTES}"
            )));
        }
        self.validate_transport()?;
        self.validate_grpc()?;
        self.validate_membership()?;
        self.validate_ack_replicas()?;
        self.access.validate()
    }

    /// The keys of the transport (docs/design.md §9).
    fn validate_transport(&self) -> Result<()> {
        if let Err(why) = check_cluster_id(&self.node.cluster_id) {
            return Err(Error::Config(format!("node.cluster_id: {why}")));
        }
        if self.node.tls.is_some() && self.node.insecure_plaintext {
            return Err(Error::Config(
                "node.insecure_plaintext: true contradicts node.tls".into(),
            ));
        }
        let timeouts = [
            (
                "limits.idle_connection_timeout",
                self.limits.idle_connection_timeout,
            ),
            ("limits.handshake_timeout", self.limits.handshake_timeout),
        ];
        for (key, value) in timeouts {
            if value.is_zero() {
                return Err(Error::Config(format!("{key}: must not be 0")));
            }
        }
        // A frame of the largest size must be able to arrive at all.
        let partial = self.limits.partial_frames_bytes_max;
        if partial > crate::tcp::FrameBudget::MAX_BYTES {
            return Err(Error::Config(format!(
                "limits.partial_frames_bytes_max: {partial} is more than the most ({})",
                crate::tcp::FrameBudget::MAX_BYTES
            )));
        }
        if partial < self.limits.max_message_bytes {
            return Err(Error::Config(
                "limits.partial_frames_bytes_max: must be at least limits.max_message_bytes".into(),
            ));
        }
        Ok(())
    }

    /// What `access:` cannot do on a node without `node.tls`, checked when
    /// `arbor node` starts: over plaintext no caller proves a certificate
    /// name, so rules naming clients by name match nobody, and a `Hello`
    /// claiming a configured peer is believed. Rules naming clients by
    /// name stop the start unless `node.insecure_plaintext` says the
    /// operator knows (then they are a warning), or `anonymous: trusted`
    /// opens everything to everyone anyway; a node with peers whose
    /// rules are not `anonymous: trusted` gets a warning that anyone who
    /// reaches its port holds the peers' rights. `Ok(None)`: nothing to say.
    /// (Callers of the gRPC front are named by keys that sign their
    /// requests, which plaintext does not weaken.)
    pub fn plaintext_access(&self) -> Result<Option<String>> {
        if self.node.tls.is_some() {
            return Ok(None);
        }
        let access = &self.access;
        let all = access.containers.iter().map(|c| &c.grants);
        let mut named = BTreeSet::new();
        for grants in all.chain([&access.default]) {
            let names = grants.owners.iter().chain(&grants.writers);
            for name in names.chain(&grants.readers) {
                if !crate::grpc::looks_like_key(name) {
                    named.insert(name.as_str());
                }
            }
        }
        // `anonymous: trusted` lets every caller do everything: rules
        // naming clients restrict nobody there, and nobody is led to think
        // they do.
        if !named.is_empty() && !access.anonymous_replicates {
            let names: Vec<&str> = named.into_iter().collect();
            let why = format!(
                "access: names clients by certificate ({}), but without node.tls no caller \
                 proves a name: those rules match nobody, and a Hello claiming a peer is believed",
                names.join(", ")
            );
            if !self.node.insecure_plaintext {
                return Err(Error::Config(format!(
                    "{why}; set node.tls, or node.insecure_plaintext: true to start anyway"
                )));
            }
            return Ok(Some(why));
        }
        if !self.node.peers.is_empty() && !access.anonymous_replicates {
            return Ok(Some(
                "node.tls is not set: a caller whose Hello claims a configured peer is believed, \
                 so anyone who reaches node.listen holds the peers' rights (replicating, reading op logs)"
                    .into(),
            ));
        }
        Ok(None)
    }

    /// The keys of the gRPC front (docs/grpc.md).
    fn validate_grpc(&self) -> Result<()> {
        let grpc = &self.grpc;
        let positive = [
            ("grpc.max_connections", grpc.max_connections),
            (
                "grpc.max_concurrent_streams",
                grpc.max_concurrent_streams as usize,
            ),
            ("grpc.stream_page_nodes", grpc.stream_page_nodes),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(Error::Config(format!("{key}: must be at least 1")));
            }
        }
        let mut keys = BTreeSet::new();
        for peer in &self.node.peers {
            let Some(key) = &peer.public_key else {
                continue;
            };
            if !keys.insert(key) {
                return Err(Error::Config(format!(
                    "node.peers: public_key {key} is given to two replicas"
                )));
            }
        }
        Ok(())
    }

    fn validate_membership(&self) -> Result<()> {
        if self.node.rejoin && self.tree.sync_interval.is_none() {
            return Err(Error::Config(
                "node.rejoin: needs tree.sync_interval (a rejoining node learns its peers' logs by sync)"
                    .into(),
            ));
        }
        let mut known = BTreeSet::from([self.node.replica_id]);
        for peer in &self.node.peers {
            if !known.insert(peer.replica_id) {
                return Err(Error::Config(format!(
                    "node.peers: replica_id {} appears twice (or is this node's own id)",
                    peer.replica_id
                )));
            }
        }
        let mut cids = BTreeSet::new();
        for container in &self.node.containers {
            if !cids.insert(container.cid) {
                return Err(Error::Config(format!(
                    "node.containers: cid {} listed twice",
                    container.cid
                )));
            }
            if let Some(unknown) = container.replicas.iter().find(|r| !known.contains(r)) {
                return Err(Error::Config(format!(
                    "node.containers: replica {unknown} of {} is neither this node nor a peer",
                    container.cid
                )));
            }
            if let Some(both) = container
                .retired
                .iter()
                .find(|r| container.replicas.contains(r))
            {
                return Err(Error::Config(format!(
                    "node.containers: replica {both} of {} is listed as a replica and as retired",
                    container.cid
                )));
            }
        }
        Ok(())
    }

    /// Every container this node may take a write for must have at least
    /// `tree.ack_replicas` replicas, or no write of it could ever be
    /// answered: such a config is refused rather than the promise
    /// silently weakened. A container not listed lives on this node and
    /// every peer.
    fn validate_ack_replicas(&self) -> Result<()> {
        let needed = self.tree.ack_replicas;
        if needed <= 1 {
            return Ok(());
        }
        let own = self.node.replica_id;
        let everyone = self.node.peers.len() + 1;
        if everyone < needed {
            return Err(Error::Config(format!(
                "tree.ack_replicas: {needed} but this node and its peers are {everyone} replicas"
            )));
        }
        let held = self
            .node
            .containers
            .iter()
            .filter(|c| c.replicas.contains(&own));
        if let Some(small) = held.into_iter().find(|c| c.replicas.len() < needed) {
            return Err(Error::Config(format!(
                "tree.ack_replicas: {needed} but container {} has {} replicas",
                small.cid,
                small.replicas.len()
            )));
        }
        Ok(())
    }

    /// The forest's identity and limits from this config.
    pub fn forest_options(&self) -> ForestOptions {
        ForestOptions {
            replica_id: self.node.replica_id,
            max_meta_bytes: self.limits.max_meta_bytes,
            max_path_len: self.limits.max_path_len,
            durable: !self.pilorama.no_sync,
            counter_jump_max: self.limits.counter_jump_max,
            cache_bytes: self.pilorama.cache_bytes,
            wal: crate::forest::wal::WalOptions {
                enabled: self.pilorama.wal,
                checkpoint_bytes: self.pilorama.checkpoint_bytes as u64,
                segment_bytes: self.pilorama.wal_segment_bytes as u64,
                spare_segments: self.pilorama.wal_spare_segments,
            },
        }
    }
}

/// A cluster id is one DNS label: 1-63 of `a-z`, `0-9` and `-`, not
/// starting or ending with `-`, so it fits certificate names unchanged.
pub fn check_cluster_id(id: &str) -> std::result::Result<(), String> {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    if id.is_empty() || id.len() > 63 {
        return Err(format!("{id:?} must be 1 to 63 characters"));
    }
    if !id.chars().all(allowed) || id.starts_with('-') || id.ends_with('-') {
        return Err(format!(
            "{id:?} may hold only a-z, 0-9 and '-', not at either end"
        ));
    }
    Ok(())
}

/// Room in a message for everything but one node's meta (ids, tree key,
/// framing). Tree ids are bounded by the same room.
pub const MESSAGE_OVERHEAD_BYTES: usize = 8 << 10;
