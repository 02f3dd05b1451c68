//! Mutual TLS for every connection (docs/design.md §9): TLS 1.3 only,
//! the ring provider, one cluster CA.
//!
//! Who a certificate names is read from its URI subject alternative name:
//! `arbor://<cluster_id>/replica/<replica_id>` for a node and
//! `arbor://<cluster_id>/client/<name>` for a client. A certificate must
//! carry exactly one such name. Chain and validity are checked by webpki
//! during the handshake; the name is checked right after it, by the side
//! that knows whom it expects (`tcp`): a dialler wants one replica of its
//! cluster, a listener maps the name to a `Caller`. Host names play no
//! part: a replica is reached by address and recognised by its name.

use crate::config::{check_cluster_id, TlsFiles};
use crate::error::{Error, Result};
use crate::types::ReplicaId;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// The name a certificate carries.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CertIdentity {
    Replica {
        cluster_id: String,
        replica_id: ReplicaId,
    },
    Client {
        cluster_id: String,
        name: String,
    },
}

const URI_SCHEME: &str = "arbor://";

impl CertIdentity {
    /// The URI SAN that names this identity.
    pub fn uri(&self) -> String {
        match self {
            CertIdentity::Replica {
                cluster_id,
                replica_id,
            } => format!("{URI_SCHEME}{cluster_id}/replica/{replica_id}"),
            CertIdentity::Client { cluster_id, name } => {
                format!("{URI_SCHEME}{cluster_id}/client/{name}")
            }
        }
    }

    /// Parses an `arbor://` URI; `None` for anything else.
    pub fn from_uri(uri: &str) -> Option<Self> {
        let rest = uri.strip_prefix(URI_SCHEME)?;
        let mut parts = rest.split('/');
        let (cluster, kind, name) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || check_cluster_id(cluster).is_err() {
            return None;
        }
        let cluster_id = cluster.to_string();
        match kind {
            "replica" => {
                // Canonical decimal only, so one replica has one name.
                let replica_id: ReplicaId = name.parse().ok()?;
                (replica_id.to_string() == name).then_some(CertIdentity::Replica {
                    cluster_id,
                    replica_id,
                })
            }
            "client" => check_client_name(name).ok().map(|()| CertIdentity::Client {
                cluster_id,
                name: name.to_string(),
            }),
            _ => None,
        }
    }

    pub fn cluster_id(&self) -> &str {
        match self {
            CertIdentity::Replica { cluster_id, .. } | CertIdentity::Client { cluster_id, .. } => {
                cluster_id
            }
        }
    }

    /// The identity a DER certificate names: its one `arbor://` URI SAN.
    pub fn from_certificate(der: &[u8]) -> Result<Self> {
        let refuse = |why: String| Error::IdentityRefused(why);
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| refuse(format!("unreadable certificate: {e}")))?;
        let sans = cert
            .subject_alternative_name()
            .map_err(|e| refuse(format!("unreadable subject alternative names: {e}")))?;
        let mut found = Vec::new();
        for name in sans.iter().flat_map(|s| s.value.general_names.iter()) {
            if let x509_parser::extensions::GeneralName::URI(uri) = name {
                if uri.starts_with(URI_SCHEME) {
                    found.push(*uri);
                }
            }
        }
        match found.as_slice() {
            [uri] => Self::from_uri(uri)
                .ok_or_else(|| refuse(format!("certificate names {uri:?}, not an arbor identity"))),
            [] => Err(refuse("certificate carries no arbor:// name".into())),
            _ => Err(refuse(format!(
                "certificate carries several names: {found:?}"
            ))),
        }
    }
}

impl fmt::Display for CertIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.uri())
    }
}

/// A client name is 1-64 of `A-Z a-z 0-9 . _ -`: it goes into a URI path
/// segment and into logs as it is.
pub fn check_client_name(name: &str) -> std::result::Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || name.len() > 64 || !name.chars().all(allowed) {
        return Err(format!(
            "client name {name:?} must be 1 to 64 of A-Z, a-z, 0-9, '.', '_', '-'"
        ));
    }
    Ok(())
}

/// Everything a process needs to speak mutual TLS: configs for both ends
/// and the identity its own certificate names.
pub struct TlsContext {
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    identity: CertIdentity,
    /// The validity of this process's own certificate.
    dates: CertDates,
}

impl fmt::Debug for TlsContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TlsContext({})", self.identity)
    }
}

/// The PEM texts of a CA, a certificate (chain) and its key.
pub struct PemFiles<'a> {
    pub ca: &'a [u8],
    pub cert: &'a [u8],
    pub key: &'a [u8],
}

impl TlsContext {
    /// Reads the files of `node.tls` (errors name the file and the key).
    pub fn load(files: &TlsFiles) -> Result<Self> {
        let read = |key: &str, path: &Path| {
            let key = format!("node.tls.{key}");
            crate::files::read_regular(&key, path, crate::files::TLS_FILE_BYTES_MAX)
        };
        let (ca, cert, key) = (
            read("ca", &files.ca)?,
            read("cert", &files.cert)?,
            read("key", &files.key)?,
        );
        let pem = PemFiles {
            ca: &ca,
            cert: &cert,
            key: &key,
        };
        Self::from_pem(&pem).map_err(|error| match error {
            Error::Config(why) => Error::Config(name_file(&why, files)),
            other => other,
        })
    }

    /// Builds both configs from PEM text. Errors say which part failed
    /// (`ca: ...`, `cert: ...`, `key: ...`).
    pub fn from_pem(pem: &PemFiles<'_>) -> Result<Self> {
        Self::from_pem_with(pem, Arc::new(rustls::crypto::ring::default_provider()))
    }

    /// `from_pem` with the cryptography of `provider`: the simulator's
    /// draws its randomness from the run's seed.
    pub fn from_pem_with(pem: &PemFiles<'_>, provider: Arc<CryptoProvider>) -> Result<Self> {
        let bad = |part: &str, why: String| Error::Config(format!("{part}: {why}"));
        let roots = parse_roots(pem.ca).map_err(|why| bad("ca", why))?;
        let chain = parse_certs(pem.cert).map_err(|why| bad("cert", why))?;
        let key = PrivateKeyDer::from_pem_slice(pem.key)
            .map_err(|e| bad("key", format!("no private key: {e}")))?;
        let identity =
            CertIdentity::from_certificate(&chain[0]).map_err(|e| bad("cert", e.to_string()))?;
        let dates = CertDates::of_der(&chain[0]).map_err(|why| bad("cert", why))?;
        let server = server_config(&provider, roots.clone(), chain.clone(), key.clone_key())?;
        let client = client_config(&provider, roots, chain, key)?;
        Ok(Self {
            server: Arc::new(server),
            client: Arc::new(client),
            identity,
            dates,
        })
    }

    /// The identity this process's own certificate names.
    pub fn identity(&self) -> &CertIdentity {
        &self.identity
    }

    /// When this process's own certificate starts and stops being valid.
    pub fn dates(&self) -> CertDates {
        self.dates
    }

    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.server.clone())
    }

    pub fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(self.client.clone())
    }

    /// The TLS context of a node from `node.tls`, checked against its
    /// configured identity; `None` when the node runs plaintext.
    pub fn for_node(config: &crate::config::Config) -> Result<Option<Arc<Self>>> {
        let Some(files) = &config.node.tls else {
            return Ok(None);
        };
        let context = Self::load(files)?;
        context.check_node(&config.node.cluster_id, config.node.replica_id)?;
        Ok(Some(Arc::new(context)))
    }

    /// The node's own certificate must name the configured cluster and
    /// replica: a node never speaks under another node's name.
    pub fn check_node(&self, cluster_id: &str, replica_id: ReplicaId) -> Result<()> {
        let want = CertIdentity::Replica {
            cluster_id: cluster_id.into(),
            replica_id,
        };
        if self.identity != want {
            return Err(Error::Config(format!(
                "node.tls.cert: the certificate names {}, but node.cluster_id and \
                 node.replica_id say {want}",
                self.identity
            )));
        }
        Ok(())
    }
}

/// The validity of a node's own certificates, by the key naming each file.
pub type OwnCertificates = Vec<(&'static str, CertDates)>;

/// A node's own certificates (`node.tls.cert`, `grpc.tls.cert`) at
/// `now`: one that expired or is not valid yet is an error naming its
/// key and file (a node that started with it would be cut off from every
/// peer and client); each that expires within `node.tls_expiry_warning`
/// gives a warning. The dates are returned by key for the metrics gauge.
pub fn check_own_certificates(
    config: &crate::config::Config,
    node: Option<&TlsContext>,
    now: std::time::SystemTime,
) -> Result<(OwnCertificates, Vec<String>)> {
    let mut certificates = Vec::new();
    if let (Some(files), Some(node)) = (&config.node.tls, node) {
        certificates.push(("node.tls.cert", files.cert.clone(), node.dates()));
    }
    if let Some(files) = &config.grpc.tls {
        let pem = crate::files::read_regular(
            "grpc.tls.cert",
            &files.cert,
            crate::files::TLS_FILE_BYTES_MAX,
        )?;
        let dates = CertDates::of_pem(&pem).map_err(|why| {
            Error::Config(format!("grpc.tls.cert: {}: {why}", files.cert.display()))
        })?;
        certificates.push(("grpc.tls.cert", files.cert.clone(), dates));
    }
    let warn_within = config.node.tls_expiry_warning.as_secs();
    let mut warnings = Vec::new();
    for (key, path, dates) in &certificates {
        let left = dates
            .check(now)
            .map_err(|why| Error::Config(format!("{key}: {}: {why}", path.display())))?;
        if left < warn_within {
            warnings.push(format!(
                "{key}: {}: expires at {}, within node.tls_expiry_warning ({})",
                path.display(),
                dates.expires(),
                humantime::format_duration(config.node.tls_expiry_warning)
            ));
        }
    }
    let dates = certificates
        .into_iter()
        .map(|(key, _, dates)| (key, dates))
        .collect();
    Ok((dates, warnings))
}

/// The TLS side of the gRPC front: presents `cert` (a PEM chain) with its
/// `key`, TLS 1.3, HTTP/2 by ALPN, and asks for no client certificate (a
/// gRPC caller is named by the key that signs its requests, not by a
/// certificate). Errors say which part failed (`cert: ...`, `key: ...`).
pub fn grpc_acceptor(cert: &[u8], key: &[u8]) -> Result<tokio_rustls::TlsAcceptor> {
    let bad = |part: &str, why: String| Error::Config(format!("{part}: {why}"));
    let chain = parse_certs(cert).map_err(|why| bad("cert", why))?;
    let key = PrivateKeyDer::from_pem_slice(key)
        .map_err(|e| bad("key", format!("no private key: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_error("cert"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(tls_error("key"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// A client of the gRPC front: checks the server's chain against the CA in
/// `ca` (PEM), not its host name (node certificates carry `arbor://`
/// names), TLS 1.3, HTTP/2 by ALPN, no client certificate.
pub fn grpc_client_config(ca: &[u8]) -> Result<Arc<ClientConfig>> {
    let roots = parse_roots(ca).map_err(|why| Error::Config(format!("ca: {why}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(ChainVerifier {
        roots,
        provider: provider.clone(),
    });
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_error("ca"))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Puts the file's path into an error about one part of the TLS files.
fn name_file(why: &str, files: &TlsFiles) -> String {
    let (part, rest) = why.split_once(": ").unwrap_or(("cert", why));
    let path = match part {
        "ca" => &files.ca,
        "key" => &files.key,
        _ => &files.cert,
    };
    format!("node.tls.{part}: {}: {rest}", path.display())
}

/// The name the dialler puts into its ClientHello. Nothing checks it (see
/// the module comment); it only has to be a valid DNS name.
pub fn server_name() -> ServerName<'static> {
    ServerName::try_from("arbor.invalid").expect("a valid DNS name")
}

fn parse_certs(pem: &[u8]) -> std::result::Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| format!("unreadable PEM: {e}"))?;
    if certs.is_empty() {
        return Err("no certificate in the file".into());
    }
    Ok(certs)
}

fn parse_roots(pem: &[u8]) -> std::result::Result<Arc<RootCertStore>, String> {
    let mut roots = RootCertStore::empty();
    for (i, cert) in parse_certs(pem)?.into_iter().enumerate() {
        check_is_ca(&cert).map_err(|why| format!("certificate {} of the file: {why}", i + 1))?;
        roots
            .add(cert)
            .map_err(|e| format!("not a usable CA certificate: {e}"))?;
    }
    Ok(Arc::new(roots))
}

/// A trust anchor must be a CA: its basic constraints say so. A leaf
/// certificate given as the CA would otherwise be trusted to vouch for
/// itself only, and the node would refuse every peer without saying why.
fn check_is_ca(cert: &CertificateDer<'_>) -> std::result::Result<(), String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| format!("unreadable certificate: {e}"))?;
    match parsed.basic_constraints() {
        Ok(Some(constraints)) if constraints.value.ca => Ok(()),
        Ok(_) => Err(format!(
            "{} is not a CA (its basic constraints do not say CA): a leaf certificate given as the CA",
            parsed.subject()
        )),
        Err(e) => Err(format!("unreadable basic constraints: {e}")),
    }
}

/// When a certificate starts and stops being valid, in seconds since the
/// Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CertDates {
    pub not_before: i64,
    pub not_after: i64,
}

impl CertDates {
    /// The validity of the first certificate of a PEM file.
    pub fn of_pem(pem: &[u8]) -> std::result::Result<Self, String> {
        let chain = parse_certs(pem)?;
        Self::of_der(&chain[0])
    }

    pub fn of_der(der: &[u8]) -> std::result::Result<Self, String> {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| format!("unreadable certificate: {e}"))?;
        let validity = cert.validity();
        Ok(Self {
            not_before: validity.not_before.timestamp(),
            not_after: validity.not_after.timestamp(),
        })
    }

    /// Seconds from `now` until the certificate expires (negative once it
    /// has).
    pub fn seconds_left(&self, now: std::time::SystemTime) -> i64 {
        self.not_after - unix_seconds(now)
    }

    /// Refuses a certificate that is not valid at `now` (expired, or not
    /// yet valid); otherwise the time it has left.
    pub fn check(&self, now: std::time::SystemTime) -> std::result::Result<u64, String> {
        let now_s = unix_seconds(now);
        if now_s < self.not_before {
            return Err(format!(
                "not valid before {} (now {})",
                rfc3339(self.not_before),
                rfc3339(now_s)
            ));
        }
        if now_s >= self.not_after {
            return Err(format!(
                "expired at {} (now {})",
                rfc3339(self.not_after),
                rfc3339(now_s)
            ));
        }
        Ok((self.not_after - now_s) as u64)
    }

    /// The expiry as text (RFC 3339, UTC).
    pub fn expires(&self) -> String {
        rfc3339(self.not_after)
    }
}

fn unix_seconds(time: std::time::SystemTime) -> i64 {
    match time.duration_since(std::time::UNIX_EPOCH) {
        Ok(after) => after.as_secs() as i64,
        Err(before) => -(before.duration().as_secs() as i64),
    }
}

fn rfc3339(seconds: i64) -> String {
    let time = if seconds >= 0 {
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(seconds as u64)
    } else {
        std::time::UNIX_EPOCH - std::time::Duration::from_secs(seconds.unsigned_abs())
    };
    humantime::format_rfc3339_seconds(time).to_string()
}

fn tls_error(part: &str) -> impl Fn(rustls::Error) -> Error + '_ {
    move |e| Error::Config(format!("{part}: {e}"))
}

/// Requires a client certificate signed by the CA, TLS 1.3 only.
fn server_config(
    provider: &Arc<CryptoProvider>,
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<ServerConfig> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|e| Error::Config(format!("ca: {e}")))?;
    ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_error("ca"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(tls_error("key"))
}

/// Presents `chain` and checks the server's chain against the CA; its name
/// is checked after the handshake by the dialler.
fn client_config(
    provider: &Arc<CryptoProvider>,
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<ClientConfig> {
    let verifier = Arc::new(ChainVerifier {
        roots,
        provider: provider.clone(),
    });
    ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_error("ca"))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(chain, key)
        .map_err(tls_error("key"))
}

/// webpki's chain, validity and key-usage checks of a server certificate,
/// without the host-name check (an `arbor://` name replaces it).
#[derive(Debug)]
struct ChainVerifier {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for ChainVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_round_trip_and_odd_ones_are_refused() {
        let replica = CertIdentity::Replica {
            cluster_id: "prod-1".into(),
            replica_id: 7,
        };
        assert_eq!(replica.uri(), "arbor://prod-1/replica/7");
        assert_eq!(CertIdentity::from_uri(&replica.uri()), Some(replica));
        let client = CertIdentity::Client {
            cluster_id: "prod-1".into(),
            name: "gw.a_1".into(),
        };
        assert_eq!(CertIdentity::from_uri(&client.uri()), Some(client));
        for odd in [
            "arbor://prod-1/replica/07",
            "arbor://prod-1/replica/70000",
            "arbor://prod-1/replica/",
            "arbor://Prod/replica/1",
            "arbor://prod-1/client/a b",
            "arbor://prod-1/client/",
            "arbor://prod-1/admin/x",
            "arbor://prod-1/replica/1/x",
            "https://prod-1/replica/1",
        ] {
            assert_eq!(CertIdentity::from_uri(odd), None, "{odd}");
        }
    }
}
