//! The `access:` section: which clients may do what with which container
//! (docs/design.md §7, §9). Clients are named as the transport reports
//! them: the name a client certificate carries, or, for callers of the
//! gRPC front, the public key their requests are signed with (66 hex
//! digits of the compressed P-256 key; no certificate name is that long).
//! Replicas need no entry: a container's configured replicas may
//! replicate it.
//!
//! ```yaml
//! access:
//!   anonymous: none           # none | reader | writer | owner | trusted
//!   default:                  # containers not listed below
//!     readers: [auditor]
//!   containers:
//!     - cid: "<64 hex digits>"
//!       owners: [gateway-1]
//!       writers: [gateway-2, 02b4...e1]   # a name or a public key
//!       readers: []
//! ```

use crate::error::{Error, Result};
use crate::types::ContainerId;
use serde::{Deserialize, Deserializer};
use std::collections::BTreeSet;

/// What a client may do with a container's trees; each role includes the
/// ones below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// GetNodeByPath, GetMeta, GetSubTree, TreeList.
    Reader,
    /// Add, AddByPath, Move, Remove, and reading.
    Writer,
    /// Everything a client can call: writing, reading, Drop, and reading
    /// the op log (GetOpLog, GetOpLogStamps) for operator tooling.
    Owner,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Writer => "writer",
            Role::Owner => "owner",
        }
    }
}

/// The clients holding each role on one container (or on the unlisted
/// ones).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Grants {
    #[serde(deserialize_with = "names")]
    pub owners: Vec<String>,
    #[serde(deserialize_with = "names")]
    pub writers: Vec<String>,
    #[serde(deserialize_with = "names")]
    pub readers: Vec<String>,
}

impl Grants {
    /// The highest role `client` holds here.
    pub fn role_of(&self, client: &str) -> Option<Role> {
        let holds = |names: &[String]| names.iter().any(|n| n == client);
        if holds(&self.owners) {
            Some(Role::Owner)
        } else if holds(&self.writers) {
            Some(Role::Writer)
        } else if holds(&self.readers) {
            Some(Role::Reader)
        } else {
            None
        }
    }

    /// Grants `role` on these containers to `client` (tests, the
    /// simulator's configs).
    pub fn grant(&mut self, role: Role, client: &str) {
        let names = match role {
            Role::Owner => &mut self.owners,
            Role::Writer => &mut self.writers,
            Role::Reader => &mut self.readers,
        };
        names.push(client.to_string());
    }
}

/// The rights of one listed container.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(from = "ContainerFile")]
pub struct ContainerAccess {
    pub cid: ContainerId,
    pub grants: Grants,
}

/// `access:` section. Empty by default: no client and no anonymous
/// caller may do anything but `Healthcheck`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "AccessFile")]
pub struct AccessConfig {
    /// The role every caller without credentials holds on every container
    /// (plaintext listeners); `None`: nothing.
    pub anonymous: Option<Role>,
    /// `anonymous: trusted`: every caller without credentials is also
    /// taken for a replica of every container (may `Apply` ops of the
    /// container's replicas, read op logs). What a plaintext cluster
    /// needs, whose peers cannot prove who they are; never set it where
    /// an untrusted process can reach the port (docs/security.md).
    pub anonymous_replicates: bool,
    /// The rights on containers not listed in `containers`.
    pub default: Grants,
    /// Containers with their own rights, which replace `default` for them.
    pub containers: Vec<ContainerAccess>,
}

impl AccessConfig {
    /// `anonymous: trusted`: every caller may do everything (in-process
    /// tests, plaintext loopback clusters).
    pub fn trusting_everyone() -> Self {
        Self {
            anonymous: Some(Role::Owner),
            anonymous_replicates: true,
            ..Self::default()
        }
    }

    /// The grants that apply to `cid`.
    pub fn grants_of(&self, cid: &ContainerId) -> &Grants {
        self.containers
            .iter()
            .find(|c| c.cid == *cid)
            .map_or(&self.default, |c| &c.grants)
    }

    /// A container listed twice or a role naming nobody is refused.
    pub fn validate(&self) -> Result<()> {
        let mut cids = BTreeSet::new();
        for container in &self.containers {
            if !cids.insert(container.cid) {
                return Err(Error::Config(format!(
                    "access.containers: cid {} listed twice",
                    container.cid
                )));
            }
        }
        let all = self.containers.iter().map(|c| &c.grants);
        for grants in all.chain([&self.default]) {
            let names = grants.owners.iter().chain(&grants.writers);
            for name in names.chain(&grants.readers) {
                if name.is_empty() {
                    return Err(Error::Config("access: an empty client name".into()));
                }
                let is_key =
                    crate::grpc::PublicKey::from_hex(name).is_some_and(|key| key.hex() == *name);
                if crate::grpc::looks_like_key(name) && !is_key {
                    return Err(Error::Config(format!(
                        "access: {name:?} is not a compressed P-256 public key in lowercase hex"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// `access:` as the file writes it.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct AccessFile {
    anonymous: Anonymous,
    default: Grants,
    containers: Vec<ContainerAccess>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Anonymous {
    #[default]
    None,
    Reader,
    Writer,
    Owner,
    Trusted,
}

impl From<AccessFile> for AccessConfig {
    fn from(file: AccessFile) -> Self {
        let (anonymous, anonymous_replicates) = match file.anonymous {
            Anonymous::None => (None, false),
            Anonymous::Reader => (Some(Role::Reader), false),
            Anonymous::Writer => (Some(Role::Writer), false),
            Anonymous::Owner => (Some(Role::Owner), false),
            Anonymous::Trusted => (Some(Role::Owner), true),
        };
        Self {
            anonymous,
            anonymous_replicates,
            default: file.default,
            containers: file.containers,
        }
    }
}

/// `access.containers[]`: a cid beside the grants.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ContainerFile {
    #[serde(deserialize_with = "super::parse::cid")]
    cid: ContainerId,
    #[serde(default, deserialize_with = "names")]
    owners: Vec<String>,
    #[serde(default, deserialize_with = "names")]
    writers: Vec<String>,
    #[serde(default, deserialize_with = "names")]
    readers: Vec<String>,
}

impl From<ContainerFile> for ContainerAccess {
    fn from(c: ContainerFile) -> Self {
        let (owners, writers, readers) = (c.owners, c.writers, c.readers);
        let grants = Grants {
            owners,
            writers,
            readers,
        };
        Self { cid: c.cid, grants }
    }
}

/// The client names of one role; public keys are kept in lowercase.
fn names<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Vec<String>, D::Error> {
    struct Name(String);
    impl<'de> Deserialize<'de> for Name {
        fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
            let name = String::deserialize(d)?;
            match crate::grpc::looks_like_key(&name) {
                true => super::parse::public_key_hex(&name)
                    .map(Name)
                    .map_err(serde::de::Error::custom),
                false => Ok(Name(name)),
            }
        }
    }
    Ok(Vec::<Name>::deserialize(d)?
        .into_iter()
        .map(|n| n.0)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const CID: &str = "abababababababababababababababababababababababababababababababab";

    fn parse(access: &str) -> Result<AccessConfig> {
        let text = format!("node:\n  replica_id: 1\naccess:\n{access}");
        Config::from_yaml_str(&text).map(|c| c.access)
    }

    #[test]
    fn the_access_section_names_roles_per_container() {
        let access = parse(&format!(
            "  anonymous: reader\n  default:\n    writers: [w]\n  containers:\n    - cid: \"{CID}\"\n      owners: [o]\n"
        ))
        .unwrap();
        assert_eq!(access.anonymous, Some(Role::Reader));
        assert!(!access.anonymous_replicates);
        let listed = ContainerId::from_hex(CID).unwrap();
        assert_eq!(access.grants_of(&listed).role_of("o"), Some(Role::Owner));
        assert_eq!(access.grants_of(&listed).role_of("w"), None);
        let other = ContainerId([1; 32]);
        assert_eq!(access.grants_of(&other).role_of("w"), Some(Role::Writer));
        let trusted = parse("  anonymous: trusted\n").unwrap();
        assert_eq!(trusted, AccessConfig::trusting_everyone());
        let absent = Config::from_yaml_str("node:\n  replica_id: 1\n").unwrap();
        assert_eq!(absent.access, AccessConfig::default());
    }

    #[test]
    fn access_errors_name_the_key() {
        let error = |text: &str| parse(text).unwrap_err().to_string();
        assert!(error("  anonymous: root\n").contains("access.anonymous"));
        assert!(error("  default:\n    admins: [x]\n").contains("access.default.admins"));
        assert!(error("  default:\n    owners: [1]\n").contains("access.default.owners[0]"));
        let twice = format!("  containers:\n    - cid: \"{CID}\"\n    - cid: \"{CID}\"\n");
        assert!(error(&twice).contains("listed twice"));
        assert!(error("  containers:\n    - owners: [x]\n").contains("access.containers[0].cid"));
    }
}
