//! Development certificates (`arbor certs`): a cluster CA, node
//! certificates naming `arbor://<cluster>/replica/<id>` and client
//! certificates naming `arbor://<cluster>/client/<name>` (see `tls`).
//! Keys are ECDSA P-256. Production deployments may use any CA that
//! issues the same names.

use crate::error::{Error, Result};
use crate::tls::{check_client_name, CertIdentity};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SigningKey,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// When a certificate is valid.
#[derive(Clone, Copy, Debug)]
pub struct Validity {
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl Validity {
    /// From an hour ago (clocks differ a little) for `days` days.
    pub fn days_from_now(days: u32) -> Self {
        let now = SystemTime::now();
        Self {
            not_before: now - Duration::from_secs(3600),
            not_after: now + Duration::from_secs(u64::from(days) * 86_400),
        }
    }
}

/// A certificate and its key, PEM.
#[derive(Clone, Debug)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

fn cert_error(e: rcgen::Error) -> Error {
    Error::Config(format!("certificate: {e}"))
}

fn params(common_name: &str, validity: Validity) -> CertificateParams {
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.not_before = validity.not_before.into();
    params.not_after = validity.not_after.into();
    params
}

/// A self-signed CA for `cluster_id`.
pub fn create_ca(cluster_id: &str, validity: Validity) -> Result<Issued> {
    let key = KeyPair::generate().map_err(cert_error)?;
    let key_pem = key.serialize_pem();
    create_ca_with(cluster_id, validity, &key, key_pem)
}

/// `create_ca` with a key made by the caller (`key_pem` is its PEM): the
/// simulator's keys and signatures come from the run's seed.
pub fn create_ca_with(
    cluster_id: &str,
    validity: Validity,
    key: &impl SigningKey,
    key_pem: String,
) -> Result<Issued> {
    let mut params = params(&format!("Arbor CA {cluster_id}"), validity);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(key).map_err(cert_error)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem,
    })
}

/// A certificate naming `identity`, signed by `ca`. Node certificates
/// serve and dial (server and client use); client certificates only dial.
pub fn issue(ca: &Issued, identity: &CertIdentity, validity: Validity) -> Result<Issued> {
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(cert_error)?;
    let key = KeyPair::generate().map_err(cert_error)?;
    let key_pem = key.serialize_pem();
    issue_with(&ca.cert_pem, ca_key, identity, validity, &key, key_pem)
}

/// `issue` by the CA certificate `ca_cert_pem` and its key `ca_key`, for
/// a key made by the caller (`key_pem` is its PEM).
pub fn issue_with(
    ca_cert_pem: &str,
    ca_key: impl SigningKey,
    identity: &CertIdentity,
    validity: Validity,
    key: &impl SigningKey,
    key_pem: String,
) -> Result<Issued> {
    let issuer = Issuer::from_ca_cert_pem(ca_cert_pem, ca_key).map_err(cert_error)?;
    let (common_name, usages) = match identity {
        CertIdentity::Replica { replica_id, .. } => (
            format!("replica {replica_id}"),
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        ),
        CertIdentity::Client { name, .. } => {
            (name.clone(), vec![ExtendedKeyUsagePurpose::ClientAuth])
        }
    };
    let mut params = params(&common_name, validity);
    let uri = identity.uri().try_into().map_err(cert_error)?;
    params.subject_alt_names = vec![SanType::URI(uri)];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = usages;
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(key, &issuer).map_err(cert_error)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem,
    })
}

/// File names inside a certificate directory.
pub fn ca_files(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("ca.crt"), dir.join("ca.key"))
}

pub fn node_files(dir: &Path, replica_id: crate::types::ReplicaId) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("node-{replica_id}.crt")),
        dir.join(format!("node-{replica_id}.key")),
    )
}

pub fn client_files(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("client-{name}.crt")),
        dir.join(format!("client-{name}.key")),
    )
}

/// Writes a new CA into `dir` (`ca.crt`, `ca.key`); refuses to replace one.
pub fn write_ca(dir: &Path, cluster_id: &str, validity: Validity) -> Result<PathBuf> {
    crate::config::check_cluster_id(cluster_id)
        .map_err(|why| Error::Config(format!("--cluster-id: {why}")))?;
    let issued = create_ca(cluster_id, validity)?;
    let (cert, key) = ca_files(dir);
    write_pair(dir, &issued, &cert, &key)?;
    Ok(cert)
}

/// Writes a certificate for `identity`, signed by the CA in `dir`.
pub fn write_issued(dir: &Path, identity: &CertIdentity, validity: Validity) -> Result<PathBuf> {
    crate::config::check_cluster_id(identity.cluster_id())
        .map_err(|why| Error::Config(format!("--cluster-id: {why}")))?;
    let (cert, key) = match identity {
        CertIdentity::Replica { replica_id, .. } => node_files(dir, *replica_id),
        CertIdentity::Client { name, .. } => {
            check_client_name(name).map_err(|why| Error::Config(format!("--name: {why}")))?;
            client_files(dir, name)
        }
    };
    let ca = read_ca(dir)?;
    let issued = issue(&ca, identity, validity)?;
    write_pair(dir, &issued, &cert, &key)?;
    Ok(cert)
}

fn read_ca(dir: &Path) -> Result<Issued> {
    let (cert, key) = ca_files(dir);
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|e| {
            Error::Config(format!(
                "{}: {e} (create the CA first: arbor certs create-ca)",
                path.display()
            ))
        })
    };
    Ok(Issued {
        cert_pem: read(&cert)?,
        key_pem: read(&key)?,
    })
}

/// Writes a certificate and its key (readable by the owner only); never
/// replaces an existing file.
fn write_pair(dir: &Path, issued: &Issued, cert: &Path, key: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
    for path in [cert, key] {
        if path.exists() {
            return Err(Error::Config(format!(
                "{}: exists; remove it to make a new one",
                path.display()
            )));
        }
    }
    write_new(key, issued.key_pem.as_bytes(), 0o600)?;
    write_new(cert, issued.cert_pem.as_bytes(), 0o644)
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(path).map_err(|e| io_error(path, e))?;
    file.write_all(bytes).map_err(|e| io_error(path, e))
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    Error::Config(format!("{}: {e}", path.display()))
}
