//! Parsing and checking config files.

use super::*;

const FULL: &str = r#"
tree:
  enabled: true
  cache_size: 15
  replication_worker_count: 8
  replication_channel_capacity: 2
  replication_timeout: 250ms
  sync_interval: 5m
  ack_replicas: 2
pilorama:
  max_batch_delay: 5ms
  max_batch_size: 100
  replicated_batch_delay: 40ms
  path: /tmp/x.db
  no_sync: true
  cache_bytes: 2097152
node:
  replica_id: 2
  listen: 127.0.0.1:7002
  peers:
    - { replica_id: 1, address: "127.0.0.1:7001" }
    - { replica_id: 3, address: "127.0.0.1:7003" }
  containers:
    - cid: "0101010101010101010101010101010101010101010101010101010101010101"
      replicas: [1, 2]
      retired: [3]
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
    assert_eq!(c.tree.ack_replicas, 2);
    assert_eq!(c.pilorama.path, PathBuf::from("/tmp/x.db"));
    assert_eq!(c.pilorama.replicated_batch_delay, Duration::from_millis(40));
    assert!(c.pilorama.no_sync);
    assert!(!c.forest_options().durable);
    assert_eq!(c.pilorama.cache_bytes, 2 << 20);
    assert_eq!(c.forest_options().cache_bytes, 2 << 20);
    assert_eq!(c.node.replica_id, 2);
    assert_eq!(c.node.peers.len(), 2);
    assert_eq!(c.node.peers[1].address, "127.0.0.1:7003");
    assert_eq!(c.node.containers[0].cid, ContainerId([1; 32]));
    assert_eq!(c.node.containers[0].replicas, vec![1, 2]);
    assert_eq!(c.node.containers[0].retired, vec![3]);
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
    assert_eq!(c.pilorama.cache_bytes, 256 << 20);
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
        ("tree: { typo: 1 }", "tree.typo: unknown field"),
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
        ("extra: 1", "extra: unknown field"),
        ("tree: 3", "tree: invalid type: integer"),
        ("tree: { enabled: \"yes\" }", "tree.enabled:"),
        ("grpc: { listen: 7000 }", "grpc.listen:"),
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
    assert!(err("tree: {}").starts_with("node: missing"));
    assert!(err("node: { listen: a }").starts_with("node.replica_id: missing"));
    assert!(err("node: { replica_id: 70000 }").starts_with("node.replica_id:"));
    let dup = "node: { replica_id: 1, peers: [ { replica_id: 1, address: a } ] }";
    assert!(err(dup).starts_with("node.peers:"));
    let no_addr = "node: { replica_id: 1, peers: [ { replica_id: 2 } ] }";
    assert!(err(no_addr).starts_with("node.peers[0].address: missing"));
    let bad_cid = "node: { replica_id: 1, containers: [ { cid: abc, replicas: [1] } ] }";
    assert!(err(bad_cid).starts_with("node.containers[0].cid:"));
    let cid = "01".repeat(32);
    let stranger =
        format!("node: {{ replica_id: 1, containers: [ {{ cid: \"{cid}\", replicas: [9] }} ] }}");
    assert!(err(&stranger).starts_with("node.containers:"));
    let both = format!(
        "node: {{ replica_id: 1, containers: [ {{ cid: \"{cid}\", replicas: [1], retired: [1] }} ] }}"
    );
    assert!(err(&both).contains("as a replica and as retired"));
}

/// `tree.ack_replicas` is at least 1 and at most the replicas of every
/// container this node holds: a container with fewer could never answer
/// a write, so the config is refused instead of the promise weakened.
#[test]
fn ack_replicas_fits_every_held_container() {
    let cid = "01".repeat(32);
    let node = |containers: &str| {
        format!(
            "node: {{ replica_id: 1, peers: [ {{ replica_id: 2, address: a }}, {{ replica_id: 3, address: b }} ]{containers} }}"
        )
    };
    let with =
        |k: usize, containers: &str| format!("tree: {{ ack_replicas: {k} }}\n{}", node(containers));
    assert!(err(&with(0, "")).starts_with("tree.ack_replicas: must be at least 1"));
    assert!(err(&with(4, "")).starts_with("tree.ack_replicas: 4 but this node and its peers are 3"));
    let accepted = |text: String| Config::from_yaml_str(&text).unwrap().tree.ack_replicas;
    let pair = format!(", containers: [ {{ cid: \"{cid}\", replicas: [1, 2] }} ]");
    assert_eq!(accepted(with(2, &pair)), 2);
    let m = err(&with(3, &pair));
    assert!(m.starts_with("tree.ack_replicas: 3 but container"), "{m}");
    assert!(m.ends_with("has 2 replicas"), "{m}");
    // A container this node does not hold takes no write here.
    let others = format!(", containers: [ {{ cid: \"{cid}\", replicas: [2] }} ]");
    assert_eq!(accepted(with(3, &others)), 3);
    assert_eq!(accepted(node("")), 1);
}

#[test]
fn a_page_cache_below_one_mebibyte_is_refused() {
    let with =
        |bytes: usize| format!("node: {{ replica_id: 1 }}\npilorama: {{ cache_bytes: {bytes} }}");
    let refused = Config::from_yaml_str(&with((1 << 20) - 1))
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("pilorama.cache_bytes: 1048575 is below the minimum 1048576"),
        "{refused}"
    );
    let accepted = Config::from_yaml_str(&with(1 << 20)).unwrap();
    assert_eq!(accepted.forest_options().cache_bytes, 1 << 20);
    assert!(Config::from_yaml_str(&with(0)).is_err());
}

#[test]
fn the_write_ahead_log_keys_reach_the_forest_and_are_bounded() {
    let with = |keys: &str| format!("node: {{ replica_id: 1 }}\npilorama: {{ {keys} }}");
    let c = Config::from_yaml_str(&with(
        "wal: false, checkpoint_interval: 250ms, checkpoint_bytes: 1000, wal_segment_bytes: 8192, wal_spare_segments: 5",
    ))
    .unwrap();
    assert!(!c.pilorama.wal);
    assert_eq!(c.pilorama.checkpoint_interval, Duration::from_millis(250));
    let wal = c.forest_options().wal;
    assert!(!wal.enabled);
    assert_eq!((wal.checkpoint_bytes, wal.segment_bytes), (1000, 8192));
    assert_eq!(wal.spare_segments, 5);
    let defaults = Config::from_yaml_str(&with("")).unwrap();
    assert!(defaults.forest_options().wal.enabled);
    assert_eq!(defaults.forest_options().wal.spare_segments, 2);
    let none = Config::from_yaml_str(&with("wal_spare_segments: 0")).unwrap();
    assert_eq!(none.forest_options().wal.spare_segments, 0);
    for (keys, key) in [
        ("checkpoint_interval: 0s", "pilorama.checkpoint_interval"),
        ("checkpoint_bytes: 0", "pilorama.checkpoint_bytes"),
        ("wal_segment_bytes: 4095", "pilorama.wal_segment_bytes"),
        ("wal_spare_segments: 65", "pilorama.wal_spare_segments"),
    ] {
        let refused = Config::from_yaml_str(&with(keys)).unwrap_err().to_string();
        assert!(refused.contains(key), "{keys}: {refused}");
    }
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    for text in ["[1, 2", "- a\n- b", "\u{0}\u{1}", "node: [1]", ": :"] {
        assert!(Config::from_yaml_str(text).is_err(), "{text:?}");
    }
}

/// A compressed P-256 public key (the generator's own point).
const KEY: &str = "036b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296";

#[test]
fn the_grpc_section_and_signing_keys() {
    let text = format!(
        "node:\n  replica_id: 1\n  peers:\n    - {{ replica_id: 2, address: \"a:1\", public_key: \"{}\" }}\n\
         grpc:\n  listen: 127.0.0.1:8080\n  tls: {{ cert: c.pem, key: k.pem }}\n  max_connections: 3\n  \
         max_concurrent_streams: 4\n  stream_page_nodes: 5\n\
         access:\n  default:\n    writers: [gw, \"{}\"]\n",
        KEY.to_uppercase(),
        KEY.to_uppercase()
    );
    let config = Config::from_yaml_str(&text).unwrap();
    let grpc = &config.grpc;
    assert_eq!(grpc.listen.as_deref(), Some("127.0.0.1:8080"));
    assert_eq!(
        grpc.tls,
        Some(GrpcTlsFiles {
            cert: "c.pem".into(),
            key: "k.pem".into()
        })
    );
    assert_eq!(
        (
            grpc.max_connections,
            grpc.max_concurrent_streams,
            grpc.stream_page_nodes
        ),
        (3, 4, 5)
    );
    // Keys are kept in lowercase, the form callers are named in.
    assert_eq!(config.node.peers[0].public_key.as_deref(), Some(KEY));
    assert_eq!(config.access.default.writers, ["gw", KEY]);
    let absent = Config::from_yaml_str("node:\n  replica_id: 1\n").unwrap();
    assert_eq!(absent.grpc, GrpcConfig::default());
    assert_eq!(absent.grpc.listen, None);
}

#[test]
fn bad_grpc_keys_are_refused_by_name() {
    let error = |text: &str| {
        Config::from_yaml_str(&format!("node:\n  replica_id: 1\n{text}"))
            .unwrap_err()
            .to_string()
    };
    assert!(error("grpc:\n  listne: x\n").contains("grpc.listne: unknown field"));
    assert!(error("grpc:\n  stream_page_nodes: 0\n").contains("grpc.stream_page_nodes"));
    assert!(error("grpc:\n  max_connections: 0\n").contains("grpc.max_connections"));
    assert!(error("grpc:\n  tls: { cert: c }\n").contains("grpc.tls.key: missing"));
    let not_a_point = format!("{}00", &KEY[..64]);
    let peer = |key: &str| {
        format!("  peers:\n    - {{ replica_id: 2, address: a, public_key: \"{key}\" }}\n")
    };
    let text = format!("node:\n  replica_id: 1\n{}", peer(&not_a_point));
    let refused = Config::from_yaml_str(&text).unwrap_err().to_string();
    assert!(refused.contains("node.peers[0].public_key"), "{refused}");
    let twice = format!(
        "node:\n  replica_id: 1\n  peers:\n    - {{ replica_id: 2, address: a, public_key: \"{KEY}\" }}\n    - {{ replica_id: 3, address: b, public_key: \"{KEY}\" }}\n"
    );
    let refused = Config::from_yaml_str(&twice).unwrap_err().to_string();
    assert!(refused.contains("given to two replicas"), "{refused}");
    let grant = format!("access:\n  default:\n    readers: [\"{not_a_point}\"]\n");
    assert!(error(&grant).contains("access.default.readers[0]"));
}

#[test]
fn the_metrics_endpoint_and_the_expiry_warning() {
    let config = Config::from_yaml_str(
        "node:\n  replica_id: 1\n  metrics_listen: 127.0.0.1:9100\n  tls_expiry_warning: 7d\n",
    )
    .unwrap();
    assert_eq!(
        config.node.metrics_listen.as_deref(),
        Some("127.0.0.1:9100")
    );
    assert_eq!(
        config.node.tls_expiry_warning,
        Duration::from_secs(7 * 86_400)
    );
    let defaults = Config::from_yaml_str("node:\n  replica_id: 1\n").unwrap();
    assert_eq!(defaults.node.metrics_listen, None);
    assert_eq!(defaults.node.tls_expiry_warning, TLS_EXPIRY_WARNING_DEFAULT);
    let error = Config::from_yaml_str("node:\n  replica_id: 1\n  tls_expiry_warning: soon\n")
        .unwrap_err()
        .to_string();
    assert!(error.contains("node.tls_expiry_warning"), "{error}");
}

/// Over plaintext a rule naming a client by certificate matches nobody:
/// the node refuses to start unless `node.insecure_plaintext` says the
/// operator knows, and then warns; rules naming gRPC keys only, or
/// `anonymous: trusted`, say nothing; peers with restricting rules warn.
#[test]
fn plaintext_access_rules_naming_clients_are_refused_unless_told() {
    let key = crate::grpc::Signer::from_seed(1).public().hex();
    let base = "node:\n  replica_id: 1\n";
    let named = "access:\n  default:\n    writers: [gateway-1]\n";
    let error = Config::from_yaml_str(&format!("{base}{named}"))
        .unwrap()
        .plaintext_access()
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("access:") && error.contains("gateway-1"),
        "{error}"
    );
    assert!(error.contains("node.insecure_plaintext"), "{error}");
    let told = format!("{base}  insecure_plaintext: true\n{named}");
    let warning = Config::from_yaml_str(&told).unwrap().plaintext_access();
    assert!(warning.unwrap().unwrap().contains("gateway-1"));
    let mut tls = Config::from_yaml_str(&format!("{base}{named}")).unwrap();
    tls.node.tls = Some(TlsFiles {
        ca: "ca".into(),
        cert: "c".into(),
        key: "k".into(),
    });
    assert_eq!(tls.plaintext_access().unwrap(), None);
    let trusted_named =
        format!("{base}access:\n  anonymous: trusted\n  default:\n    writers: [gw]\n");
    let trusted_named = Config::from_yaml_str(&trusted_named).unwrap();
    assert_eq!(trusted_named.plaintext_access().unwrap(), None);
    let keys_only = format!("{base}access:\n  default:\n    writers: [\"{key}\"]\n");
    let keys_only = Config::from_yaml_str(&keys_only).unwrap();
    assert_eq!(keys_only.plaintext_access().unwrap(), None);
    let peers = "  peers:\n    - { replica_id: 2, address: \"127.0.0.1:7002\" }\n";
    let trusted = format!("{base}{peers}access:\n  anonymous: trusted\n");
    let trusted = Config::from_yaml_str(&trusted).unwrap();
    assert_eq!(trusted.plaintext_access().unwrap(), None);
    let readers = format!("{base}{peers}access:\n  anonymous: reader\n");
    let warning = Config::from_yaml_str(&readers).unwrap().plaintext_access();
    assert!(warning
        .unwrap()
        .unwrap()
        .contains("Hello claims a configured peer"));
}

/// Every error names the full path of its key, however deep: an unknown
/// key, a wrong type inside a list, a duration that is not one.
#[test]
fn errors_name_the_full_key_path() {
    let cid = "01".repeat(32);
    let deep = format!(
        "node:\n  replica_id: 1\n  containers:\n    - cid: \"{cid}\"\n      replicas: [1]\n      spare: 2\n"
    );
    assert!(err(&deep).starts_with("node.containers[0].spare: unknown field"));
    assert!(
        err("node:\n  replica_id: 1\n  tls: { ca: a, cert: b, key: c, pin: d }\n")
            .starts_with("node.tls.pin: unknown field")
    );
    let peers = "node:\n  replica_id: 1\n  peers:\n    - { replica_id: 2, address: a }\n    - { replica_id: x, address: b }\n";
    let m = err(peers);
    assert!(
        m.starts_with("node.peers[1].replica_id: invalid type"),
        "{m}"
    );
    let replicas = format!(
        "node:\n  replica_id: 1\n  containers:\n    - cid: \"{cid}\"\n      replicas: [1, 70000]\n"
    );
    let m = err(&replicas);
    assert!(
        m.starts_with("node.containers[0].replicas[1]: invalid value"),
        "{m}"
    );
    let m =
        err("node: { replica_id: 1, peers: [ { replica_id: 2, address: a }, { replica_id: 3 } ] }");
    assert_eq!(m, "node.peers[1].address: missing");
    for bad in ["5 parsecs", "-1s", "1.5", "[1s]"] {
        let m = err(&format!(
            "node: {{ replica_id: 1 }}\nlimits: {{ handshake_timeout: {bad} }}"
        ));
        assert!(m.starts_with("limits.handshake_timeout: "), "{bad}: {m}");
        assert!(m.contains("a duration like 5"), "{bad}: {m}");
    }
}

/// A key with no value takes its default, as if it were absent.
#[test]
fn a_key_without_a_value_is_absent() {
    let text = "node:\n  replica_id: 1\n  listen:\n  tls: ~\ntree:\n  cache_size: ~\npilorama:\naccess:\n  anonymous:\n";
    let c = Config::from_yaml_str(text).unwrap();
    let defaults = Config::from_yaml_str("node: { replica_id: 1 }").unwrap();
    assert_eq!(c, defaults);
    assert_eq!(c.node.listen, "127.0.0.1:7000");
}
