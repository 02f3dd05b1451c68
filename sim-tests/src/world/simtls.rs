//! TLS in the simulation: real certificates made by `arbor::certs` and
//! the engine's own TLS (`arbor::tls`, rustls), with every random draw
//! taken from the run's seed.
//!
//! rustls with ring's provider is not deterministic under madsim as it
//! is: ring reads the kernel's random source by a raw `getrandom` system
//! call, which madsim's override of the libc function never sees, for the
//! handshake's random values, its ephemeral key exchange and every ECDSA
//! signature; and `arbor::certs` makes its keys and signs its
//! certificates the same way. So the simulator gives rustls a provider of
//! its own (`provider`): ring's cipher suites and signature checks, which
//! are deterministic, with
//! - `SecureRandom` drawn from madsim's seeded generator;
//! - the key exchange (secp256r1 only) by RustCrypto's `p256`, its
//!   ephemeral secret drawn from the same generator;
//! - signatures by `p256`'s deterministic ECDSA (RFC 6979), for the
//!   handshake and for the certificates the world issues (`Pki`).
//!
//! Time: rustls and the certificates read the system clock, which madsim
//! simulates (the world's base time plus simulated time), so certificates
//! issued in a run are valid in it.

use arbor::certs::{self, Issued, Validity};
use arbor::tls::{CertIdentity, PemFiles, TlsContext};
use madsim::rand::{thread_rng, RngCore};
use p256::ecdsa::signature::Signer as _;
use p256::pkcs8::{DecodePrivateKey, EncodePrivateKey, LineEnding};
use rustls::crypto::{
    ActiveKeyExchange, CryptoProvider, GetRandomFailed, KeyProvider, SecureRandom, SharedSecret,
    SupportedKxGroup,
};
use rustls::pki_types::PrivateKeyDer;
use rustls::sign::{Signer, SigningKey};
use rustls::{NamedGroup, SignatureAlgorithm, SignatureScheme};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// How long the certificates a world issues are valid: any run's end.
const VALIDITY_DAYS: u32 = 3650;

/// rustls's cryptography with every random draw from the run's seed.
pub fn provider() -> Arc<CryptoProvider> {
    let ring = rustls::crypto::ring::default_provider();
    Arc::new(CryptoProvider {
        kx_groups: vec![&SeededP256],
        secure_random: &SeededRandom,
        key_provider: &SeededKeys,
        ..ring
    })
}

/// 32 bytes of the run's randomness that make a P-256 secret key.
fn secret_key() -> p256::SecretKey {
    loop {
        let mut bytes = [0u8; 32];
        thread_rng().fill_bytes(&mut bytes);
        // All but about one draw in 2^32 is below the group order and
        // not zero.
        if let Ok(key) = p256::SecretKey::from_slice(&bytes) {
            return key;
        }
    }
}

#[derive(Debug)]
struct SeededRandom;

impl SecureRandom for SeededRandom {
    fn fill(&self, buf: &mut [u8]) -> Result<(), GetRandomFailed> {
        thread_rng().fill_bytes(buf);
        Ok(())
    }
}

/// ECDHE on secp256r1 by `p256`.
#[derive(Debug)]
struct SeededP256;

impl SupportedKxGroup for SeededP256 {
    fn start(&self) -> Result<Box<dyn ActiveKeyExchange>, rustls::Error> {
        let secret = secret_key();
        let public = secret.public_key();
        let encoded = p256::EncodedPoint::from(public);
        Ok(Box::new(P256Exchange {
            secret,
            public: encoded.as_bytes().to_vec(),
        }))
    }

    fn name(&self) -> NamedGroup {
        NamedGroup::secp256r1
    }
}

struct P256Exchange {
    secret: p256::SecretKey,
    /// Our share: the uncompressed point TLS 1.3 sends.
    public: Vec<u8>,
}

impl ActiveKeyExchange for P256Exchange {
    fn complete(self: Box<Self>, peer_pub_key: &[u8]) -> Result<SharedSecret, rustls::Error> {
        // TLS 1.3 allows only the uncompressed form of the peer's share.
        if peer_pub_key.first() != Some(&4) {
            return Err(rustls::PeerMisbehaved::InvalidKeyShare.into());
        }
        let peer = p256::PublicKey::from_sec1_bytes(peer_pub_key)
            .map_err(|_| rustls::Error::from(rustls::PeerMisbehaved::InvalidKeyShare))?;
        let shared = p256::ecdh::diffie_hellman(self.secret.to_nonzero_scalar(), peer.as_affine());
        Ok(SharedSecret::from(&shared.raw_secret_bytes()[..]))
    }

    fn pub_key(&self) -> &[u8] {
        &self.public
    }

    fn group(&self) -> NamedGroup {
        NamedGroup::secp256r1
    }
}

/// Loads PKCS#8 P-256 keys (the only kind a world issues) for signing by
/// `p256`.
#[derive(Debug)]
struct SeededKeys;

impl KeyProvider for SeededKeys {
    fn load_private_key(
        &self,
        key_der: PrivateKeyDer<'static>,
    ) -> Result<Arc<dyn SigningKey>, rustls::Error> {
        let PrivateKeyDer::Pkcs8(der) = key_der else {
            return Err(rustls::Error::General("a PKCS#8 key is needed".into()));
        };
        let key = p256::ecdsa::SigningKey::from_pkcs8_der(der.secret_pkcs8_der())
            .map_err(|e| rustls::Error::General(format!("not a P-256 key: {e}")))?;
        Ok(Arc::new(P256Signer(key)))
    }
}

/// An ECDSA P-256 key signing by RFC 6979 (no random draw at all), for
/// the handshake and for certificates.
#[derive(Clone, Debug)]
pub struct P256Signer(p256::ecdsa::SigningKey);

impl P256Signer {
    /// A new key from the run's randomness.
    pub fn generate() -> Self {
        Self(p256::ecdsa::SigningKey::from(secret_key()))
    }

    /// The key as PKCS#8 PEM, as `arbor certs` writes keys.
    pub fn pem(&self) -> String {
        self.0
            .to_pkcs8_pem(LineEnding::LF)
            .expect("a P-256 key encodes")
            .to_string()
    }

    fn sign_der(&self, message: &[u8]) -> Vec<u8> {
        let signature: p256::ecdsa::Signature = self.0.sign(message);
        signature.to_der().as_bytes().to_vec()
    }
}

impl SigningKey for P256Signer {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        offered
            .contains(&SignatureScheme::ECDSA_NISTP256_SHA256)
            .then(|| Box::new(self.clone()) as Box<dyn Signer>)
    }

    fn algorithm(&self) -> SignatureAlgorithm {
        SignatureAlgorithm::ECDSA
    }
}

impl Signer for P256Signer {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        Ok(self.sign_der(message))
    }

    fn scheme(&self) -> SignatureScheme {
        SignatureScheme::ECDSA_NISTP256_SHA256
    }
}

/// The public half as X.509 wants it from `rcgen`: the uncompressed
/// point.
struct RcgenKey {
    signer: P256Signer,
    point: Vec<u8>,
}

impl RcgenKey {
    fn new(signer: P256Signer) -> Self {
        let point = signer.0.verifying_key().to_encoded_point(false);
        Self {
            point: point.as_bytes().to_vec(),
            signer,
        }
    }
}

impl rcgen::PublicKeyData for RcgenKey {
    fn der_bytes(&self) -> &[u8] {
        &self.point
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

impl rcgen::SigningKey for RcgenKey {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, rcgen::Error> {
        Ok(self.signer.sign_der(message))
    }
}

/// A world's certificate authority: one cluster CA, and a certificate
/// for each identity asked for, made once and kept (a replica keeps its
/// certificate across restarts, as a machine keeps its files).
pub struct Pki {
    cluster_id: String,
    ca: Issued,
    ca_key: P256Signer,
    provider: Arc<CryptoProvider>,
    issued: Mutex<BTreeMap<String, Arc<TlsContext>>>,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pki({})", self.cluster_id)
    }
}

impl Pki {
    /// A new CA for `cluster_id`. Call inside the run's madsim runtime.
    pub fn new(cluster_id: &str) -> Self {
        let ca_key = P256Signer::generate();
        let validity = Validity::days_from_now(VALIDITY_DAYS);
        let pem = ca_key.pem();
        let ca = certs::create_ca_with(cluster_id, validity, &RcgenKey::new(ca_key.clone()), pem)
            .expect("the simulated CA is made");
        Self {
            cluster_id: cluster_id.to_string(),
            ca,
            ca_key,
            provider: provider(),
            issued: Mutex::new(BTreeMap::new()),
        }
    }

    /// The TLS context of `identity` (a certificate made on first use).
    pub fn context(&self, identity: &CertIdentity) -> Arc<TlsContext> {
        let mut issued = self.issued.lock().unwrap();
        issued
            .entry(identity.uri())
            .or_insert_with(|| Arc::new(self.issue(identity)))
            .clone()
    }

    /// The context of replica `replica_id` of this cluster.
    pub fn replica(&self, replica_id: arbor::ReplicaId) -> Arc<TlsContext> {
        self.context(&CertIdentity::Replica {
            cluster_id: self.cluster_id.clone(),
            replica_id,
        })
    }

    /// The context of the client named `name` in this cluster.
    pub fn client(&self, name: &str) -> Arc<TlsContext> {
        self.context(&CertIdentity::Client {
            cluster_id: self.cluster_id.clone(),
            name: name.to_string(),
        })
    }

    fn issue(&self, identity: &CertIdentity) -> TlsContext {
        let key = P256Signer::generate();
        let validity = Validity::days_from_now(VALIDITY_DAYS);
        let issued = certs::issue_with(
            &self.ca.cert_pem,
            RcgenKey::new(self.ca_key.clone()),
            identity,
            validity,
            &RcgenKey::new(key.clone()),
            key.pem(),
        )
        .expect("a simulated certificate is issued");
        let pem = PemFiles {
            ca: self.ca.cert_pem.as_bytes(),
            cert: issued.cert_pem.as_bytes(),
            key: issued.key_pem.as_bytes(),
        };
        TlsContext::from_pem_with(&pem, self.provider.clone())
            .expect("a simulated certificate loads")
    }
}
