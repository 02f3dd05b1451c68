//! The YAML file read through serde: the config structs derive
//! `Deserialize` and refuse unknown keys, `serde_path_to_error` names the
//! key path of whatever went wrong, and the helpers here read the values
//! whose file form differs from their type.

use super::*;
use serde::de::{Deserialize, Deserializer, Error as _, Unexpected, Visitor};
use serde_yaml_ng::Value;

/// The sections of a YAML document, not yet checked across fields.
pub(super) fn document(text: &str) -> Result<Config> {
    let mut root: Value =
        serde_yaml_ng::from_str(text).map_err(|e| Error::Config(format!("not valid YAML: {e}")))?;
    drop_nulls(&mut root);
    serde_path_to_error::deserialize(root).map_err(|e| {
        let path = match e.path().to_string() {
            // The root, or a key that is not a string there.
            root if root == "." || root == "?" => "document".to_string(),
            path => path,
        };
        let why = e.into_inner().to_string();
        // serde names a missing field beside the path of its mapping;
        // the key's own path reads better.
        Error::Config(
            match why
                .strip_prefix("missing field `")
                .and_then(|f| f.strip_suffix('`'))
            {
                Some(field) if path == "document" => format!("{field}: missing"),
                Some(field) => format!("{path}.{field}: missing"),
                None => format!("{path}: {why}"),
            },
        )
    })
}

/// A key with no value (`tree:`, `listen: ~`) is absent: it takes its
/// default.
fn drop_nulls(value: &mut Value) {
    match value {
        Value::Mapping(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_nulls);
        }
        Value::Sequence(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// `5ms`, `5s`, `5m`, `1h 30m`; a bare `0` is zero.
pub(super) fn duration<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Duration, D::Error> {
    struct Expected;
    impl Visitor<'_> for Expected {
        type Value = Duration;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a duration like 5ms, 5s or 5m")
        }
        fn visit_u64<E: serde::de::Error>(self, n: u64) -> std::result::Result<Duration, E> {
            match n {
                0 => Ok(Duration::ZERO),
                _ => Err(E::invalid_value(Unexpected::Unsigned(n), &self)),
            }
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> std::result::Result<Duration, E> {
            humantime::parse_duration(s.trim())
                .map_err(|e| E::custom(format!("expected a duration like 5s: {e}")))
        }
    }
    d.deserialize_any(Expected)
}

/// `tree.sync_interval`: a duration, 0 meaning off.
pub(super) fn sync_interval<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Duration>, D::Error> {
    Ok(Some(duration(d)?).filter(|d| !d.is_zero()))
}

/// A container id: 64 hex digits.
pub(super) fn cid<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<ContainerId, D::Error> {
    ContainerId::from_hex(&String::deserialize(d)?)
        .ok_or_else(|| D::Error::custom("expected 64 hex digits"))
}

/// `node.containers[].replicas`: at least one.
pub(super) fn replicas<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<ReplicaId>, D::Error> {
    let replicas = Vec::deserialize(d)?;
    match replicas.is_empty() {
        true => Err(D::Error::custom("must list at least one replica")),
        false => Ok(replicas),
    }
}

/// `node.peers[].public_key`, kept in lowercase.
pub(super) fn public_key<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<String>, D::Error> {
    public_key_hex(&String::deserialize(d)?)
        .map(Some)
        .map_err(D::Error::custom)
}

/// A compressed P-256 public key in hex, returned in lowercase.
pub(super) fn public_key_hex(hex: &str) -> std::result::Result<String, String> {
    crate::grpc::PublicKey::from_hex(hex)
        .map(|k| k.hex())
        .ok_or_else(|| format!("{hex:?} is not a compressed P-256 public key (66 hex digits)"))
}

pub(super) fn default_listen() -> String {
    "127.0.0.1:7000".into()
}

pub(super) fn default_cluster_id() -> String {
    DEFAULT_CLUSTER_ID.into()
}

pub(super) fn default_tls_expiry_warning() -> Duration {
    TLS_EXPIRY_WARNING_DEFAULT
}
