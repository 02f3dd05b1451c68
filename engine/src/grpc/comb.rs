//! Faster ECDSA verification for keys known in advance: fixed-base comb
//! tables.
//!
//! Verifying `(r, s)` over a digest `z` computes `u1·G + u2·Q` for the
//! generator `G` and the signer's key `Q`, with `u1 = z/s`, `u2 = r/s`.
//! A general double-and-add costs ~256 doublings and additions per
//! scalar. With a table of `j·256^i·P` for every byte position `i` and
//! byte value `j`, a scalar times `P` is one addition per non-zero byte of
//! the scalar: 64 additions for both products, no doubling. A table costs
//! 32 × 255 affine points (about half a megabyte) and a few hundred
//! milliseconds to build, so only the generator's (built once) and those
//! of keys the configuration names (`access:`, `node.peers[].public_key`,
//! at most `grpc.key_tables_max`) are built; every other key is verified
//! by `p256`'s own routine.
//!
//! The table lookups depend on the scalars, so this runs in variable time:
//! fine for verification, whose inputs are all public. [`VariableTimeSigner`]
//! uses the generator's table to sign and leaks its nonce through timing;
//! it exists for load generators with throwaway keys, never for a key that
//! matters.

use p256::ecdsa::{Signature, SigningKey};
use p256::elliptic_curve::group::Curve;
use p256::elliptic_curve::ops::Reduce;
use p256::elliptic_curve::point::AffineCoordinates;
use p256::elliptic_curve::FieldBytesEncoding;
use p256::elliptic_curve::PrimeField;
use p256::{AffinePoint, FieldBytes, NistP256, ProjectivePoint, Scalar, U256};
use std::sync::LazyLock;

/// Byte positions of a scalar.
const WINDOWS: usize = 32;
/// Non-zero values of one byte.
const DIGITS: usize = 255;

/// `j·256^i·P` for `i < 32`, `1 <= j <= 255`, at `i·255 + j - 1`.
pub struct CombTable(Vec<AffinePoint>);

impl CombTable {
    pub fn new(point: ProjectivePoint) -> Self {
        let mut points = Vec::with_capacity(WINDOWS * DIGITS);
        let mut base = point;
        for _ in 0..WINDOWS {
            let mut multiple = base;
            for _ in 0..DIGITS {
                points.push(multiple);
                multiple += base;
            }
            // 256·base: the next byte position's base.
            base = multiple;
        }
        let mut affine = vec![AffinePoint::IDENTITY; points.len()];
        ProjectivePoint::batch_normalize(&points, &mut affine);
        Self(affine)
    }

    /// Adds `scalar·P` to `sum`.
    fn add_multiple(&self, sum: &mut ProjectivePoint, scalar: &Scalar) {
        let bytes = scalar.to_repr();
        for (i, &digit) in bytes.iter().rev().enumerate() {
            if digit != 0 {
                *sum += self.0[i * DIGITS + usize::from(digit) - 1];
            }
        }
    }
}

/// The generator's table, built at its first use.
static GENERATOR: LazyLock<CombTable> =
    LazyLock::new(|| CombTable::new(ProjectivePoint::GENERATOR));

/// The digest's leftmost 256 bits, as ECDSA takes a digest longer than
/// the group order.
fn digest_bits(digest: &[u8; 64]) -> FieldBytes {
    let mut bits = FieldBytes::default();
    bits.copy_from_slice(&digest[..32]);
    bits
}

/// The digest as a scalar: its leftmost 256 bits, reduced.
fn digest_scalar(digest: &[u8; 64]) -> Scalar {
    <Scalar as Reduce<U256>>::reduce_bytes(&digest_bits(digest))
}

/// Checks `signature` over `digest` (SHA-512) for the key whose table is
/// `key`; the same answer as `p256`'s verification.
pub fn verify(key: &CombTable, digest: &[u8; 64], signature: &Signature) -> bool {
    let (r, s) = signature.split_scalars();
    // `s` is not zero (a signature of zeros does not parse).
    let Some(s_inv) = Option::<Scalar>::from(s.invert()) else {
        return false;
    };
    let u1 = digest_scalar(digest) * s_inv;
    let u2 = *r * s_inv;
    let mut sum = ProjectivePoint::IDENTITY;
    GENERATOR.add_multiple(&mut sum, &u1);
    key.add_multiple(&mut sum, &u2);
    let x = sum.to_affine().x();
    // The identity has x = 0, which no non-zero r equals.
    <Scalar as Reduce<U256>>::reduce_bytes(&x) == *r
}

/// An ECDSA signer whose nonce point comes from the generator's comb
/// table: several times faster than a constant-time signer and leaking
/// its nonces through timing. For load generators' throwaway keys only.
pub struct VariableTimeSigner {
    key: SigningKey,
}

impl VariableTimeSigner {
    pub fn new(key: SigningKey) -> Self {
        LazyLock::force(&GENERATOR);
        Self { key }
    }

    /// `(r, s)` over `digest` (SHA-512), with the deterministic nonce of
    /// RFC 6979 (HMAC-SHA-256) that `p256`'s signer draws too, so both
    /// make the same signature.
    pub fn sign(&self, digest: &[u8; 64]) -> Signature {
        let secret = self.key.as_nonzero_scalar();
        let z = digest_bits(digest);
        let order = <NistP256 as p256::elliptic_curve::Curve>::ORDER.encode_field_bytes();
        let mut extra = 0u64;
        loop {
            // A retry (a nonce, r or s of zero: about never) mixes a
            // counter into the nonce.
            let extra_bytes = extra.to_be_bytes();
            let ad: &[u8] = if extra == 0 { &[] } else { &extra_bytes };
            extra += 1;
            let k_bytes = rfc6979::generate_k::<sha2::Sha256, _>(&secret.to_repr(), &order, &z, ad);
            let Some(k) = Option::<Scalar>::from(Scalar::from_repr(k_bytes)) else {
                continue;
            };
            let Some(k_inv) = Option::<Scalar>::from(k.invert()) else {
                continue;
            };
            let mut point = ProjectivePoint::IDENTITY;
            GENERATOR.add_multiple(&mut point, &k);
            let r = <Scalar as Reduce<U256>>::reduce_bytes(&point.to_affine().x());
            let s = k_inv * (digest_scalar(digest) + r * **secret);
            if let Ok(signature) = Signature::from_scalars(r, s) {
                return signature;
            }
        }
    }
}
