//! The YAML file taken apart key by key: every read removes its key, so
//! whatever is left is unknown and refused, and every error names its key.

use super::*;
use serde_yaml_ng::{Mapping, Value};

/// The sections of a YAML document, not yet checked across fields.
pub(super) fn document(text: &str) -> Result<Config> {
    let root: Value =
        serde_yaml_ng::from_str(text).map_err(|e| Error::Config(format!("not valid YAML: {e}")))?;
    let mut root = Section::new("", root)?;
    let tree = parse_tree(root.section("tree")?)?;
    let pilorama = parse_pilorama(root.section("pilorama")?)?;
    let node = parse_node(root.section("node")?)?;
    let limits = parse_limits(root.section("limits")?)?;
    let access = access::parse_access(root.section("access")?)?;
    let grpc = parse_grpc(root.section("grpc")?)?;
    root.finish()?;
    Ok(Config {
        tree,
        pilorama,
        node,
        limits,
        access,
        grpc,
    })
}

fn parse_grpc(mut s: Section) -> Result<GrpcConfig> {
    let d = GrpcConfig::default();
    let tls = if s.has("tls") {
        let mut t = s.section("tls")?;
        let mut file = |key: &str| {
            t.string(key)?
                .map(PathBuf::from)
                .ok_or_else(|| Error::Config(format!("{}: missing", t.key(key))))
        };
        let files = GrpcTlsFiles {
            cert: file("cert")?,
            key: file("key")?,
        };
        t.finish()?;
        Some(files)
    } else {
        None
    };
    let streams_key = s.key("max_concurrent_streams");
    let config = GrpcConfig {
        listen: s.string("listen")?,
        tls,
        max_connections: s.usize("max_connections")?.unwrap_or(d.max_connections),
        max_concurrent_streams: s
            .usize("max_concurrent_streams")?
            .map_or(Ok(d.max_concurrent_streams), u32::try_from)
            .map_err(|_| Error::Config(format!("{streams_key}: too large")))?,
        stream_page_nodes: s.usize("stream_page_nodes")?.unwrap_or(d.stream_page_nodes),
        key_tables_max: s.usize("key_tables_max")?.unwrap_or(d.key_tables_max),
    };
    s.finish()?;
    Ok(config)
}

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
        ack_replicas: s.usize("ack_replicas")?.unwrap_or(d.ack_replicas),
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
        cache_bytes: s.usize("cache_bytes")?.unwrap_or(d.cache_bytes),
        wal: s.bool("wal")?.unwrap_or(d.wal),
        checkpoint_interval: s
            .duration("checkpoint_interval")?
            .unwrap_or(d.checkpoint_interval),
        checkpoint_bytes: s.usize("checkpoint_bytes")?.unwrap_or(d.checkpoint_bytes),
        wal_segment_bytes: s.usize("wal_segment_bytes")?.unwrap_or(d.wal_segment_bytes),
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
        push_conflict_passes_max: s
            .usize("push_conflict_passes_max")?
            .unwrap_or(d.push_conflict_passes_max),
        sync_stamp_page_size: s
            .usize("sync_stamp_page_size")?
            .unwrap_or(d.sync_stamp_page_size),
        push_window_ops: s.usize("push_window_ops")?.unwrap_or(d.push_window_ops),
        max_subtree_nodes: s.usize("max_subtree_nodes")?.unwrap_or(d.max_subtree_nodes),
        max_list_page_nodes: s
            .usize("max_list_page_nodes")?
            .unwrap_or(d.max_list_page_nodes),
        max_tracked_trees: s.usize("max_tracked_trees")?.unwrap_or(d.max_tracked_trees),
        max_connections: s.usize("max_connections")?.unwrap_or(d.max_connections),
        connect_timeout: s.duration("connect_timeout")?.unwrap_or(d.connect_timeout),
        idle_connection_timeout: s
            .duration("idle_connection_timeout")?
            .unwrap_or(d.idle_connection_timeout),
        handshake_timeout: s
            .duration("handshake_timeout")?
            .unwrap_or(d.handshake_timeout),
        partial_frames_bytes_max: s
            .usize("partial_frames_bytes_max")?
            .unwrap_or(d.partial_frames_bytes_max),
        counter_jump_max: s.u64("counter_jump_max")?.unwrap_or(d.counter_jump_max),
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
        let key_name = p.key("public_key");
        let public_key = p
            .string("public_key")?
            .map(|hex| public_key_hex(&key_name, &hex))
            .transpose()?;
        p.finish()?;
        peers.push(PeerConfig {
            replica_id,
            address,
            public_key,
        });
    }
    let mut containers = Vec::new();
    for (cid, mut c) in container_items(&mut s)? {
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
        let retired_key = c.key("retired");
        let mut retired = Vec::new();
        for (j, r) in c.list("retired")?.into_iter().enumerate() {
            retired.push(as_replica_id(&format!("{retired_key}[{j}]"), &r)?);
        }
        c.finish()?;
        containers.push(ContainerConfig {
            cid,
            replicas,
            retired,
        });
    }
    let cluster_id = s
        .string("cluster_id")?
        .unwrap_or_else(|| DEFAULT_CLUSTER_ID.into());
    let tls = parse_tls(&mut s)?;
    let insecure_plaintext = s.bool("insecure_plaintext")?.unwrap_or(false);
    let rejoin = s.bool("rejoin")?.unwrap_or(false);
    let metrics_listen = s.string("metrics_listen")?;
    let tls_expiry_warning = s
        .duration("tls_expiry_warning")?
        .unwrap_or(TLS_EXPIRY_WARNING_DEFAULT);
    s.finish()?;
    Ok(NodeConfig {
        replica_id,
        listen,
        peers,
        containers,
        cluster_id,
        tls,
        insecure_plaintext,
        rejoin,
        metrics_listen,
        tls_expiry_warning,
    })
}

/// `node.tls: { ca, cert, key }`, every file named.
fn parse_tls(node: &mut Section) -> Result<Option<TlsFiles>> {
    if !node.has("tls") {
        return Ok(None);
    }
    let mut t = node.section("tls")?;
    let mut file = |key: &str| {
        t.string(key)?
            .map(PathBuf::from)
            .ok_or_else(|| Error::Config(format!("{}: missing", t.key(key))))
    };
    let files = TlsFiles {
        ca: file("ca")?,
        cert: file("cert")?,
        key: file("key")?,
    };
    t.finish()?;
    Ok(Some(files))
}

/// The items of a `containers` list, each with its required `cid` taken
/// out and the rest of its mapping left to the caller.
pub(super) fn container_items(s: &mut Section) -> Result<Vec<(ContainerId, Section)>> {
    let mut items = Vec::new();
    for (i, item) in s.list("containers")?.into_iter().enumerate() {
        let mut c = Section::new(&format!("{}[{i}]", s.key("containers")), item)?;
        let cid_key = c.key("cid");
        let cid_hex = c
            .string("cid")?
            .ok_or_else(|| Error::Config(format!("{cid_key}: missing")))?;
        let cid = ContainerId::from_hex(&cid_hex)
            .ok_or_else(|| Error::Config(format!("{cid_key}: expected 64 hex digits")))?;
        items.push((cid, c));
    }
    Ok(items)
}

/// A compressed P-256 public key in hex, returned in lowercase.
pub(super) fn public_key_hex(key: &str, hex: &str) -> Result<String> {
    crate::grpc::PublicKey::from_hex(hex)
        .map(|k| k.hex())
        .ok_or_else(|| {
            Error::Config(format!(
                "{key}: {hex:?} is not a compressed P-256 public key (66 hex digits)"
            ))
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
pub(super) struct Section {
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

    pub(super) fn key(&self, key: &str) -> String {
        if self.name.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.name)
        }
    }

    fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key).filter(|v| !v.is_null())
    }

    /// Whether `key` is present (it stays for a later read).
    fn has(&self, key: &str) -> bool {
        self.map.get(key).is_some_and(|v| !v.is_null())
    }

    pub(super) fn section(&mut self, key: &str) -> Result<Section> {
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

    fn u64(&mut self, key: &str) -> Result<Option<u64>> {
        self.take(key)
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| self.bad(key, "expected a non-negative integer"))
            })
            .transpose()
    }

    /// A list of strings; absent is empty.
    pub(super) fn strings(&mut self, key: &str) -> Result<Vec<String>> {
        let full = self.key(key);
        self.list(key)?
            .into_iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s),
                _ => Err(Error::Config(format!("{full}[{i}]: expected a string"))),
            })
            .collect()
    }

    fn replica_id(&mut self, key: &str) -> Result<Option<ReplicaId>> {
        let full = self.key(key);
        self.take(key).map(|v| as_replica_id(&full, &v)).transpose()
    }

    pub(super) fn string(&mut self, key: &str) -> Result<Option<String>> {
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

    pub(super) fn finish(self) -> Result<()> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(k) => {
                let name = k.as_str().map_or_else(|| format!("{k:?}"), str::to_string);
                Err(Error::Config(format!("{}: unknown key", self.key(&name))))
            }
        }
    }
}
