//! Request signatures of the gRPC front: ECDSA on P-256 over the SHA-512 of
//! a message body's protobuf encoding. The signature travels as 65 bytes
//! `0x04 || r || s`, the public key as its 33-byte compressed SEC1 point
//! (the 65-byte uncompressed form is accepted too). The digest is longer
//! than the curve's order, so ECDSA takes its leftmost 256 bits, as every
//! implementation of the standard does.
//!
//! A verified key is the caller: [`PublicKey::hex`] is how `access:` and
//! `node.peers[].public_key` name it.

use super::comb::CombTable;
use p256::ecdsa::signature::hazmat::{PrehashSigner, PrehashVerifier};
use p256::ecdsa::{Signature as EcdsaSignature, SigningKey, VerifyingKey};
use sha2::{Digest, Sha512};
use std::fmt;

/// Bytes of a signature on the wire: the marker byte, then r and s.
pub const SIGNATURE_BYTES: usize = 65;
/// Bytes of a compressed public key.
pub const COMPRESSED_KEY_BYTES: usize = 33;
/// Hex digits of a compressed public key, the form configs name keys in.
pub const KEY_HEX_DIGITS: usize = 2 * COMPRESSED_KEY_BYTES;

/// Why a signature was not accepted. The texts go back to the caller.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the request carries no signature")]
    Missing,
    #[error("the signature's public key is not a P-256 point ({0} bytes)")]
    BadKey(usize),
    #[error("the signature is not 65 bytes starting with 0x04 ({0} bytes)")]
    BadEncoding(usize),
    #[error("the signature does not match the request body")]
    Mismatch,
}

/// A verified P-256 public key.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey(VerifyingKey);

impl PublicKey {
    /// A key in SEC1 form: 33 bytes compressed or 65 uncompressed.
    pub fn from_sec1(bytes: &[u8]) -> Result<Self, SignatureError> {
        if bytes.len() != COMPRESSED_KEY_BYTES && bytes.len() != 65 {
            return Err(SignatureError::BadKey(bytes.len()));
        }
        VerifyingKey::from_sec1_bytes(bytes)
            .map(Self)
            .map_err(|_| SignatureError::BadKey(bytes.len()))
    }

    /// A key written as 66 hex digits of its compressed form (either case).
    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != KEY_HEX_DIGITS {
            return None;
        }
        let bytes = hex::decode(hex).ok()?;
        Self::from_sec1(&bytes).ok()
    }

    /// The 33-byte compressed form.
    pub fn compressed(&self) -> Vec<u8> {
        self.0.to_encoded_point(true).as_bytes().to_vec()
    }

    /// The compressed form in lowercase hex: the name of this caller.
    pub fn hex(&self) -> String {
        hex::encode(self.compressed())
    }

    /// Checks `signature` (65 bytes, `0x04 || r || s`) over `body`.
    pub fn verify(&self, body: &[u8], signature: &[u8]) -> Result<(), SignatureError> {
        let signature = parse_signature(signature)?;
        let digest = Sha512::digest(body);
        self.0
            .verify_prehash(&digest, &signature)
            .map_err(|_| SignatureError::Mismatch)
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.hex())
    }
}

/// True when `name` has the shape of a key name (66 hex digits), which no
/// certificate's client name can have (those are at most 64 characters).
pub fn looks_like_key(name: &str) -> bool {
    name.len() == KEY_HEX_DIGITS && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Verifies one request: `key` and `sign` from its `Signature`, `body` the
/// encoding of its body. The verified key is returned.
pub fn verify(key: &[u8], sign: &[u8], body: &[u8]) -> Result<PublicKey, SignatureError> {
    if key.is_empty() && sign.is_empty() {
        return Err(SignatureError::Missing);
    }
    let public = PublicKey::from_sec1(key)?;
    public.verify(body, sign)?;
    Ok(public)
}

/// `r || s` of a wire signature (`0x04 || r || s`).
fn parse_signature(sign: &[u8]) -> Result<EcdsaSignature, SignatureError> {
    match sign.split_first() {
        Some((0x04, rs)) if sign.len() == SIGNATURE_BYTES => {
            EcdsaSignature::from_slice(rs).map_err(|_| SignatureError::BadEncoding(sign.len()))
        }
        _ => Err(SignatureError::BadEncoding(sign.len())),
    }
}

/// A key the configuration names, and its comb table once built.
struct KnownKey {
    public: PublicKey,
    table: std::sync::OnceLock<CombTable>,
}

/// Verifies request signatures. Keys the configuration names (at most
/// `tables_max` of them) are verified with comb tables, built at their
/// first use; any other key by `p256`'s routine. Both give the same
/// answers (see `comb`).
pub struct Verifier {
    /// By every encoding a client may send them in (compressed and
    /// uncompressed).
    known: std::collections::HashMap<Vec<u8>, std::sync::Arc<KnownKey>>,
}

impl Verifier {
    pub fn new(keys: impl IntoIterator<Item = PublicKey>, tables_max: usize) -> Self {
        let mut known = std::collections::HashMap::new();
        for public in keys.into_iter().take(tables_max) {
            let compressed = public.compressed();
            let uncompressed = public.0.to_encoded_point(false).as_bytes().to_vec();
            let key = std::sync::Arc::new(KnownKey {
                public,
                table: std::sync::OnceLock::new(),
            });
            known.insert(compressed, key.clone());
            known.insert(uncompressed, key);
        }
        Self { known }
    }

    /// Keys with tables (or waiting for their first use to build one).
    pub fn tabled_keys(&self) -> usize {
        self.known.len() / 2
    }

    /// As [`verify`].
    pub fn verify(
        &self,
        key: &[u8],
        sign: &[u8],
        body: &[u8],
    ) -> Result<PublicKey, SignatureError> {
        let Some(known) = self.known.get(key) else {
            return verify(key, sign, body);
        };
        let signature = parse_signature(sign)?;
        let digest: [u8; 64] = Sha512::digest(body).into();
        let table = known
            .table
            .get_or_init(|| CombTable::new(known.public.0.as_affine().into()));
        match super::comb::verify(table, &digest, &signature) {
            true => Ok(known.public.clone()),
            false => Err(SignatureError::Mismatch),
        }
    }
}

/// A private key that signs requests (clients: tests, the load generator,
/// the command line).
#[derive(Clone)]
pub struct Signer(SigningKey);

impl Signer {
    /// A key from 32 secret bytes; `None` for a value that is no valid
    /// scalar (zero, or not below the group order).
    pub fn from_secret(secret: &[u8; 32]) -> Option<Self> {
        SigningKey::from_bytes(secret.into()).ok().map(Self)
    }

    /// A key derived from `seed` (tests and simulations: deterministic).
    pub fn from_seed(seed: u64) -> Self {
        let mut counter = 0u64;
        loop {
            let mut hasher = Sha512::new();
            hasher.update(b"arbor-grpc-test-key");
            hasher.update(seed.to_le_bytes());
            hasher.update(counter.to_le_bytes());
            let digest = hasher.finalize();
            let mut secret = [0u8; 32];
            secret.copy_from_slice(&digest[..32]);
            if let Some(signer) = Self::from_secret(&secret) {
                return signer;
            }
            counter += 1;
        }
    }

    /// A key from a PEM file's text (PKCS#8 `PRIVATE KEY` or SEC1 `EC
    /// PRIVATE KEY`).
    pub fn from_pem(pem: &str) -> Result<Self, String> {
        use p256::pkcs8::DecodePrivateKey;
        if let Ok(key) = SigningKey::from_pkcs8_pem(pem) {
            return Ok(Self(key));
        }
        p256::SecretKey::from_sec1_pem(pem)
            .map(|secret| Self(secret.into()))
            .map_err(|_| "not a P-256 private key in PEM (PKCS#8 or SEC1)".to_string())
    }

    /// Encodes the key as PKCS#8 PEM.
    pub fn to_pem(&self) -> String {
        use p256::pkcs8::{EncodePrivateKey, LineEnding};
        self.0
            .to_pkcs8_pem(LineEnding::LF)
            .expect("a P-256 key encodes")
            .to_string()
    }

    pub fn public(&self) -> PublicKey {
        PublicKey(*self.0.verifying_key())
    }

    /// `(key, sign)` of a `Signature` over `body` (deterministic, RFC 6979).
    pub fn sign(&self, body: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let digest = Sha512::digest(body);
        let signature: EcdsaSignature = self
            .0
            .sign_prehash(&digest)
            .expect("signing a 64-byte digest cannot fail");
        let mut sign = Vec::with_capacity(SIGNATURE_BYTES);
        sign.push(0x04);
        sign.extend_from_slice(&signature.to_bytes());
        (self.public().compressed(), sign)
    }
}

impl Signer {
    /// A signer of the same key that is several times faster and leaks its
    /// nonces through timing: for load generators' throwaway keys only
    /// (see `comb`).
    pub fn variable_time(&self) -> VariableTimeSigner {
        VariableTimeSigner::new(self.0.clone())
    }
}

/// [`Signer::sign`] in variable time (see [`Signer::variable_time`]).
pub struct VariableTimeSigner {
    inner: super::comb::VariableTimeSigner,
    public: Vec<u8>,
}

impl VariableTimeSigner {
    fn new(key: SigningKey) -> Self {
        let public = PublicKey(*key.verifying_key()).compressed();
        Self {
            inner: super::comb::VariableTimeSigner::new(key),
            public,
        }
    }

    /// `(key, sign)` of a `Signature` over `body`, the same bytes
    /// [`Signer::sign`] makes.
    pub fn sign(&self, body: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let digest: [u8; 64] = Sha512::digest(body).into();
        let signature = self.inner.sign(&digest);
        let mut sign = Vec::with_capacity(SIGNATURE_BYTES);
        sign.push(0x04);
        sign.extend_from_slice(&signature.to_bytes());
        (self.public.clone(), sign)
    }
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signer({})", self.public().hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_over_its_body_only() {
        let signer = Signer::from_seed(7);
        let (key, sign) = signer.sign(b"body");
        assert_eq!(key.len(), COMPRESSED_KEY_BYTES);
        assert_eq!(sign.len(), SIGNATURE_BYTES);
        assert_eq!(verify(&key, &sign, b"body").unwrap(), signer.public());
        assert_eq!(verify(&key, &sign, b"bodY"), Err(SignatureError::Mismatch));
        let other = Signer::from_seed(8).public().compressed();
        assert_eq!(
            verify(&other, &sign, b"body"),
            Err(SignatureError::Mismatch)
        );
        let mut flipped = sign.clone();
        flipped[40] ^= 1;
        assert_eq!(
            verify(&key, &flipped, b"body"),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(verify(&[], &[], b"body"), Err(SignatureError::Missing));
        assert_eq!(
            verify(&key[..32], &sign, b"body"),
            Err(SignatureError::BadKey(32))
        );
        assert_eq!(
            verify(&key, &sign[1..], b"body"),
            Err(SignatureError::BadEncoding(64))
        );
        let mut marker = sign.clone();
        marker[0] = 0x02;
        assert_eq!(
            verify(&key, &marker, b"body"),
            Err(SignatureError::BadEncoding(65))
        );
    }

    /// The comb tables and the variable-time signer agree with `p256` on
    /// valid signatures, altered ones and random ones.
    #[test]
    fn comb_verification_and_signing_agree_with_p256() {
        let signers: Vec<Signer> = (0..3).map(Signer::from_seed).collect();
        let verifier = Verifier::new(signers[..2].iter().map(Signer::public), 8);
        assert_eq!(verifier.tabled_keys(), 2);
        let mut seed = 1u64;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            seed
        };
        for round in 0..40u64 {
            let signer = &signers[(round % 3) as usize];
            let body: Vec<u8> = (0..(next() % 200)).map(|_| next() as u8).collect();
            let (key, sign) = signer.sign(&body);
            assert_eq!(
                signer.variable_time().sign(&body),
                (key.clone(), sign.clone())
            );
            let uncompressed = signer
                .public()
                .0
                .to_encoded_point(false)
                .as_bytes()
                .to_vec();
            for key in [&key, &uncompressed] {
                assert_eq!(
                    verifier.verify(key, &sign, &body),
                    verify(key, &sign, &body)
                );
                assert!(verifier.verify(key, &sign, &body).is_ok());
            }
            let mut altered = body.clone();
            altered.push(1);
            assert_eq!(
                verifier.verify(&key, &sign, &altered),
                Err(SignatureError::Mismatch)
            );
            let mut random = vec![4u8];
            random.extend((0..64).map(|_| next() as u8));
            assert_eq!(
                verifier.verify(&key, &random, &body),
                verify(&key, &random, &body)
            );
            assert!(verifier.verify(&key, &random, &body).is_err());
            let other = signers[((round + 1) % 3) as usize].public().compressed();
            assert_eq!(
                verifier.verify(&other, &sign, &body),
                Err(SignatureError::Mismatch)
            );
        }
    }

    #[test]
    fn keys_round_trip_through_hex_and_pem() {
        let signer = Signer::from_seed(1);
        let hex = signer.public().hex();
        assert!(looks_like_key(&hex));
        assert_eq!(PublicKey::from_hex(&hex), Some(signer.public()));
        assert_eq!(
            PublicKey::from_hex(&hex.to_uppercase()),
            Some(signer.public())
        );
        assert_eq!(PublicKey::from_hex(&hex[..64]), None);
        let pem = signer.to_pem();
        assert_eq!(Signer::from_pem(&pem).unwrap().public(), signer.public());
        assert!(Signer::from_pem("not a key").is_err());
    }
}
