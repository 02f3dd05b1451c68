//! Node configuration: the keys of the modelled system (DESIGN §7) plus this
//! node's identity, peers and container membership.
//!
//! The file is YAML. Every key is optional except `node.replica_id`; missing
//! keys take the DESIGN §7 values. Unknown keys and bad values are refused
//! with `Error::Config` naming the key (`tree.replication_timeout: ...`), so
//! a typo never silently falls back to a default.

use crate::error::{Error, Result};
use crate::forest::ForestOptions;
use crate::types::{ContainerId, ReplicaId};
use crate::validate::InputLimits;
use serde_yaml_ng::{Mapping, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
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
    /// How long a batch holding only replicated ops (Apply, sync pages) may
    /// wait for more writes before it commits; any local write joining it
    /// brings its own, shorter deadline. Replicated ops have no client
    /// waiting, so grouping them saves a durable commit per push. 0: they
    /// batch like local writes.
    pub replicated_batch_delay: Duration,
    pub path: PathBuf,
    /// Acknowledge before the batch is durable (operator's choice).
    pub no_sync: bool,
    /// Tries to reopen the database after a storage error poisoned it,
    /// before the node gives up (until the next storage error).
    pub reopen_attempts_max: u32,
    /// Longest wait between two reopen tries (the wait doubles from 1/32
    /// of it).
    pub reopen_backoff_max: Duration,
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
    /// The most writes one group commit takes when a backlog is queued (one
    /// sync then serves all of them); below `pilorama.max_batch_size` it
    /// means `max_batch_size`. Bounds the length of one write transaction.
    pub max_commit_size: usize,
    /// Ops per GetOpLog page (sync) and per Apply push (replication).
    pub sync_page_size: usize,
    /// Heights of the local log a pusher looks at per page while it skips
    /// the ops other replicas originated (it sends only its own).
    pub push_scan_heights: usize,
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
    pub connect_timeout: Duration,
}

/// The sync interval of the reference deployment (DESIGN §7). An absent key
/// means "off", so this is only a named value for callers that want it.
pub const REFERENCE_SYNC_INTERVAL: Duration = Duration::from_secs(5 * 60);

impl Default for TreeConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            cache_size: 15,
            replication_worker_count: 1000,
            replication_channel_capacity: 1000,
            replication_timeout: Duration::from_secs(5),
            sync_interval: None,
        }
    }
}

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
            sync_stamp_page_size: 16_384,
            push_window_ops: 4096,
            max_subtree_nodes: 100_000,
            max_tracked_trees: 10_000,
            max_connections: 256,
            connect_timeout: Duration::from_secs(2),
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
        }
    }
}

impl Config {
    /// Defaults everywhere, no peers, sync off: a starting point for tests
    /// and the simulator, which then fill in peers and limits.
    pub fn default_for_test(replica_id: ReplicaId) -> Self {
        Self {
            tree: TreeConfig::default(),
            pilorama: PiloramaConfig::default(),
            node: NodeConfig::solo(replica_id),
            limits: Limits::default(),
        }
    }

    /// Reads and parses a YAML file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        Self::from_yaml_str(&text)
    }

    /// Parses a YAML document; see the module comment for the rules.
    pub fn from_yaml_str(text: &str) -> Result<Self> {
        let root: Value = serde_yaml_ng::from_str(text)
            .map_err(|e| Error::Config(format!("not valid YAML: {e}")))?;
        let mut root = Section::new("", root)?;
        let tree = parse_tree(root.section("tree")?)?;
        let pilorama = parse_pilorama(root.section("pilorama")?)?;
        let node = parse_node(root.section("node")?)?;
        let limits = parse_limits(root.section("limits")?)?;
        root.finish()?;
        let config = Config {
            tree,
            pilorama,
            node,
            limits,
        };
        config.validate()?;
        Ok(config)
    }

    /// Cross-field checks; also useful for configs built in code.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            (
                "tree.replication_worker_count",
                self.tree.replication_worker_count,
            ),
            (
                "tree.replication_channel_capacity",
                self.tree.replication_channel_capacity,
            ),
            ("pilorama.max_batch_size", self.pilorama.max_batch_size),
            ("limits.max_pending_writes", self.limits.max_pending_writes),
            ("limits.max_commit_size", self.limits.max_commit_size),
            ("limits.sync_page_size", self.limits.sync_page_size),
            ("limits.push_scan_heights", self.limits.push_scan_heights),
            (
                "limits.sync_stamp_page_size",
                self.limits.sync_stamp_page_size,
            ),
            ("limits.max_subtree_nodes", self.limits.max_subtree_nodes),
            ("limits.max_tracked_trees", self.limits.max_tracked_trees),
            ("limits.max_connections", self.limits.max_connections),
            ("limits.max_path_len", self.limits.max_path_len),
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
        self.validate_membership()
    }

    fn validate_membership(&self) -> Result<()> {
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
        }
    }
}

/// Room in a message for everything but one node's meta (ids, tree key,
/// framing). Tree ids are bounded by the same room.
pub const MESSAGE_OVERHEAD_BYTES: usize = 8 << 10;

fn parse_tree(mut s: Section) -> Result<TreeConfig> {
    let d = TreeConfig::default();
    let config = TreeConfig {
        enabled: s.bool("enabled")?.unwrap_or(d.enabled),
        cache_size: s.usize("cache_size")?.unwrap_or(d.cache_size),
        replication_worker_count: s
            .usize("replication_worker_count")?
            .unwrap_or(d.replication_worker_count),
        replication_channel_capacity: s
            .usize("replication_channel_capacity")?
            .unwrap_or(d.replication_channel_capacity),
        replication_timeout: s
            .duration("replication_timeout")?
            .unwrap_or(d.replication_timeout),
        sync_interval: s.duration("sync_interval")?.filter(|d| !d.is_zero()),
    };
    s.finish()?;
    Ok(config)
}

fn parse_pilorama(mut s: Section) -> Result<PiloramaConfig> {
    let d = PiloramaConfig::default();
    let config = PiloramaConfig {
        max_batch_delay: s.duration("max_batch_delay")?.unwrap_or(d.max_batch_delay),
        max_batch_size: s.usize("max_batch_size")?.unwrap_or(d.max_batch_size),
        replicated_batch_delay: s
            .duration("replicated_batch_delay")?
            .unwrap_or(d.replicated_batch_delay),
        path: s.string("path")?.map(PathBuf::from).unwrap_or(d.path),
        no_sync: s.bool("no_sync")?.unwrap_or(d.no_sync),
        reopen_attempts_max: s
            .usize("reopen_attempts_max")?
            .map_or(Ok(d.reopen_attempts_max), u32::try_from)
            .map_err(|_| Error::Config("pilorama.reopen_attempts_max: too large".into()))?,
        reopen_backoff_max: s
            .duration("reopen_backoff_max")?
            .unwrap_or(d.reopen_backoff_max),
    };
    s.finish()?;
    Ok(config)
}

fn parse_limits(mut s: Section) -> Result<Limits> {
    let d = Limits::default();
    let limits = Limits {
        max_message_bytes: s.usize("max_message_bytes")?.unwrap_or(d.max_message_bytes),
        max_meta_bytes: s.usize("max_meta_bytes")?.unwrap_or(d.max_meta_bytes),
        max_path_len: s.usize("max_path_len")?.unwrap_or(d.max_path_len),
        max_pending_writes: s
            .usize("max_pending_writes")?
            .unwrap_or(d.max_pending_writes),
        max_commit_size: s.usize("max_commit_size")?.unwrap_or(d.max_commit_size),
        sync_page_size: s.usize("sync_page_size")?.unwrap_or(d.sync_page_size),
        push_scan_heights: s.usize("push_scan_heights")?.unwrap_or(d.push_scan_heights),
        sync_stamp_page_size: s
            .usize("sync_stamp_page_size")?
            .unwrap_or(d.sync_stamp_page_size),
        push_window_ops: s.usize("push_window_ops")?.unwrap_or(d.push_window_ops),
        max_subtree_nodes: s.usize("max_subtree_nodes")?.unwrap_or(d.max_subtree_nodes),
        max_tracked_trees: s.usize("max_tracked_trees")?.unwrap_or(d.max_tracked_trees),
        max_connections: s.usize("max_connections")?.unwrap_or(d.max_connections),
        connect_timeout: s.duration("connect_timeout")?.unwrap_or(d.connect_timeout),
    };
    s.finish()?;
    Ok(limits)
}

fn parse_node(mut s: Section) -> Result<NodeConfig> {
    let replica_id = s
        .replica_id("replica_id")?
        .ok_or_else(|| Error::Config(format!("{}: missing", s.key("replica_id"))))?;
    let listen = s
        .string("listen")?
        .unwrap_or_else(|| "127.0.0.1:7000".into());
    let mut peers = Vec::new();
    for (i, item) in s.list("peers")?.into_iter().enumerate() {
        let mut p = Section::new(&format!("{}[{i}]", s.key("peers")), item)?;
        let replica_id = p
            .replica_id("replica_id")?
            .ok_or_else(|| Error::Config(format!("{}: missing", p.key("replica_id"))))?;
        let address = p
            .string("address")?
            .ok_or_else(|| Error::Config(format!("{}: missing", p.key("address"))))?;
        p.finish()?;
        peers.push(PeerConfig {
            replica_id,
            address,
        });
    }
    let mut containers = Vec::new();
    for (i, item) in s.list("containers")?.into_iter().enumerate() {
        let mut c = Section::new(&format!("{}[{i}]", s.key("containers")), item)?;
        let cid_key = c.key("cid");
        let cid_hex = c
            .string("cid")?
            .ok_or_else(|| Error::Config(format!("{cid_key}: missing")))?;
        let cid = ContainerId::from_hex(&cid_hex)
            .ok_or_else(|| Error::Config(format!("{cid_key}: expected 64 hex digits")))?;
        let replicas_key = c.key("replicas");
        let mut replicas = Vec::new();
        for (j, r) in c.list("replicas")?.into_iter().enumerate() {
            replicas.push(as_replica_id(&format!("{replicas_key}[{j}]"), &r)?);
        }
        if replicas.is_empty() {
            return Err(Error::Config(format!(
                "{replicas_key}: must list at least one replica"
            )));
        }
        c.finish()?;
        containers.push(ContainerConfig { cid, replicas });
    }
    s.finish()?;
    Ok(NodeConfig {
        replica_id,
        listen,
        peers,
        containers,
    })
}

fn as_replica_id(key: &str, value: &Value) -> Result<ReplicaId> {
    value
        .as_u64()
        .and_then(|v| ReplicaId::try_from(v).ok())
        .ok_or_else(|| Error::Config(format!("{key}: expected an integer 0..=65535")))
}

/// One mapping of the file being taken apart: every read removes its key, so
/// whatever is left at `finish` is unknown.
struct Section {
    name: String,
    map: Mapping,
}

impl Section {
    fn new(name: &str, value: Value) -> Result<Self> {
        let map = match value {
            Value::Null => Mapping::new(),
            Value::Mapping(map) => map,
            _ => {
                let what = if name.is_empty() { "document" } else { name };
                return Err(Error::Config(format!("{what}: expected a mapping")));
            }
        };
        Ok(Self {
            name: name.to_string(),
            map,
        })
    }

    fn key(&self, key: &str) -> String {
        if self.name.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.name)
        }
    }

    fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key).filter(|v| !v.is_null())
    }

    fn section(&mut self, key: &str) -> Result<Section> {
        let value = self.take(key).unwrap_or(Value::Null);
        Section::new(&self.key(key), value)
    }

    fn list(&mut self, key: &str) -> Result<Vec<Value>> {
        match self.take(key) {
            None => Ok(Vec::new()),
            Some(Value::Sequence(items)) => Ok(items),
            Some(_) => Err(Error::Config(format!("{}: expected a list", self.key(key)))),
        }
    }

    fn bool(&mut self, key: &str) -> Result<Option<bool>> {
        self.take(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.bad(key, "expected true or false"))
            })
            .transpose()
    }

    fn usize(&mut self, key: &str) -> Result<Option<usize>> {
        self.take(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| self.bad(key, "expected a non-negative integer"))
            })
            .transpose()
    }

    fn replica_id(&mut self, key: &str) -> Result<Option<ReplicaId>> {
        let full = self.key(key);
        self.take(key).map(|v| as_replica_id(&full, &v)).transpose()
    }

    fn string(&mut self, key: &str) -> Result<Option<String>> {
        self.take(key)
            .map(|v| match v {
                Value::String(s) => Ok(s),
                _ => Err(self.bad(key, "expected a string")),
            })
            .transpose()
    }

    /// `5ms`, `5s`, `5m`, `1h 30m`; a bare `0` is zero.
    fn duration(&mut self, key: &str) -> Result<Option<Duration>> {
        self.take(key)
            .map(|v| match v {
                Value::Number(n) if n.as_u64() == Some(0) => Ok(Duration::ZERO),
                Value::String(s) => humantime::parse_duration(s.trim())
                    .map_err(|e| self.bad(key, &format!("expected a duration like 5s: {e}"))),
                _ => Err(self.bad(key, "expected a duration like 5ms, 5s or 5m")),
            })
            .transpose()
    }

    fn bad(&self, key: &str, why: &str) -> Error {
        Error::Config(format!("{}: {why}", self.key(key)))
    }

    fn finish(self) -> Result<()> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(k) => {
                let name = k.as_str().map_or_else(|| format!("{k:?}"), str::to_string);
                Err(Error::Config(format!("{}: unknown key", self.key(&name))))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
tree:
  enabled: true
  cache_size: 15
  replication_worker_count: 8
  replication_channel_capacity: 2
  replication_timeout: 250ms
  sync_interval: 5m
pilorama:
  max_batch_delay: 5ms
  max_batch_size: 100
  replicated_batch_delay: 40ms
  path: /tmp/x.db
  no_sync: true
node:
  replica_id: 2
  listen: 127.0.0.1:7002
  peers:
    - { replica_id: 1, address: "127.0.0.1:7001" }
    - { replica_id: 3, address: "127.0.0.1:7003" }
  containers:
    - cid: "0101010101010101010101010101010101010101010101010101010101010101"
      replicas: [1, 2]
limits:
  max_pending_writes: 7
  max_commit_size: 300
  push_scan_heights: 40
  sync_stamp_page_size: 64
  push_window_ops: 0
  max_tracked_trees: 50
  connect_timeout: 1s
"#;

    #[test]
    fn full_file_parses() {
        let c = Config::from_yaml_str(FULL).unwrap();
        assert_eq!(c.tree.replication_worker_count, 8);
        assert_eq!(c.tree.replication_timeout, Duration::from_millis(250));
        assert_eq!(c.tree.sync_interval, Some(Duration::from_secs(300)));
        assert_eq!(c.pilorama.path, PathBuf::from("/tmp/x.db"));
        assert_eq!(c.pilorama.replicated_batch_delay, Duration::from_millis(40));
        assert!(c.pilorama.no_sync);
        assert!(!c.forest_options().durable);
        assert_eq!(c.node.replica_id, 2);
        assert_eq!(c.node.peers.len(), 2);
        assert_eq!(c.node.peers[1].address, "127.0.0.1:7003");
        assert_eq!(c.node.containers[0].cid, ContainerId([1; 32]));
        assert_eq!(c.node.containers[0].replicas, vec![1, 2]);
        assert_eq!(c.limits.max_pending_writes, 7);
        assert_eq!(c.limits.max_commit_size, 300);
        assert_eq!(c.limits.push_scan_heights, 40);
        assert_eq!(c.limits.sync_stamp_page_size, 64);
        assert_eq!(c.limits.push_window_ops, 0);
        assert_eq!(c.limits.max_tracked_trees, 50);
        assert_eq!(c.limits.connect_timeout, Duration::from_secs(1));
        assert_eq!(c.limits.sync_page_size, Limits::default().sync_page_size);
    }

    #[test]
    fn defaults_are_the_design_values() {
        let c = Config::from_yaml_str("node: { replica_id: 1 }").unwrap();
        assert_eq!(c.tree, TreeConfig::default());
        assert_eq!(c.tree.replication_timeout, Duration::from_secs(5));
        assert_eq!(c.tree.sync_interval, None);
        assert_eq!(c.pilorama.max_batch_delay, Duration::from_millis(5));
        assert_eq!(c.pilorama.max_batch_size, 100);
        assert_eq!(c.limits, Limits::default());
    }

    #[test]
    fn zero_sync_interval_is_off() {
        for v in ["0", "\"0\"", "0s"] {
            let text = format!("node: {{ replica_id: 1 }}\ntree: {{ sync_interval: {v} }}");
            assert_eq!(
                Config::from_yaml_str(&text).unwrap().tree.sync_interval,
                None,
                "{v}"
            );
        }
    }

    fn err(text: &str) -> String {
        match Config::from_yaml_str(text) {
            Err(Error::Config(m)) => m,
            other => panic!("expected a config error for {text:?}, got {other:?}"),
        }
    }

    #[test]
    fn errors_name_the_key() {
        let base = "node: { replica_id: 1 }\n";
        let cases = [
            (
                "tree: { replication_timeout: fast }",
                "tree.replication_timeout:",
            ),
            (
                "tree: { replication_timeout: 5 }",
                "tree.replication_timeout:",
            ),
            (
                "tree: { replication_worker_count: -1 }",
                "tree.replication_worker_count:",
            ),
            (
                "tree: { replication_worker_count: 0 }",
                "tree.replication_worker_count:",
            ),
            ("tree: { typo: 1 }", "tree.typo: unknown key"),
            (
                "pilorama: { max_batch_delay: [1] }",
                "pilorama.max_batch_delay:",
            ),
            ("pilorama: { path: 3 }", "pilorama.path:"),
            (
                "tree: { replication_timeout: 1s }\npilorama: { replicated_batch_delay: 600ms }",
                "pilorama.replicated_batch_delay:",
            ),
            (
                "limits: { max_message_bytes: 100 }",
                "limits.max_message_bytes:",
            ),
            (
                "limits: { sync_stamp_page_size: 0 }",
                "limits.sync_stamp_page_size:",
            ),
            (
                "limits: { max_tracked_trees: 0 }",
                "limits.max_tracked_trees:",
            ),
            ("extra: 1", "extra: unknown key"),
            ("tree: 3", "tree: expected a mapping"),
        ];
        for (text, want) in cases {
            let m = err(&format!("{base}{text}"));
            assert!(
                m.starts_with(want),
                "{text}: got {m:?}, want prefix {want:?}"
            );
        }
    }

    #[test]
    fn node_section_errors() {
        assert!(err("tree: {}").starts_with("node.replica_id: missing"));
        assert!(err("node: { replica_id: 70000 }").starts_with("node.replica_id:"));
        let dup = "node: { replica_id: 1, peers: [ { replica_id: 1, address: a } ] }";
        assert!(err(dup).starts_with("node.peers:"));
        let no_addr = "node: { replica_id: 1, peers: [ { replica_id: 2 } ] }";
        assert!(err(no_addr).starts_with("node.peers[0].address: missing"));
        let bad_cid = "node: { replica_id: 1, containers: [ { cid: abc, replicas: [1] } ] }";
        assert!(err(bad_cid).starts_with("node.containers[0].cid:"));
        let cid = "01".repeat(32);
        let stranger = format!(
            "node: {{ replica_id: 1, containers: [ {{ cid: \"{cid}\", replicas: [9] }} ] }}"
        );
        assert!(err(&stranger).starts_with("node.containers:"));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for text in ["[1, 2", "- a\n- b", "\u{0}\u{1}", "node: [1]", ": :"] {
            assert!(Config::from_yaml_str(text).is_err(), "{text:?}");
        }
    }
}
