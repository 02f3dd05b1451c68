//! Faster ECDSA verification for keys known in advance: fixed-base comb
//! tables.
//!
//! Verifying `(r, s)` over a digest `z` computes `u1·G + u2·Q` for the
//! generator `G` and the signer's key `Q`, with `u1 = z/s`, `u2 = r/s`.
//! A general double-and-add costs ~256 doublings and additions per
//! scalar. With a table of `j·2^(B·i)·P` for every window `i` of `B`
//! bits and digit `j`, a scalar times `P` is one addition per non-zero
//! digit of the scalar, and no doubling. Digits are signed (`-2^(B-1)`
//! up to `2^(B-1) - 1`; the negation of an affine point costs nothing), so
//! a table holds half the multiples. A configured key's table has 10-bit
//! windows: 26 × 512 affine points, about 0.8 MiB, 26 additions (8-bit
//! windows, a quarter of the size, verify ~8 % slower).
//! The generator's, one per process, has 12-bit windows: 2.9 MiB, 22
//! additions. Tables cost time to build, so only the generator's (built
//! once) and those of keys the configuration names (`access:`,
//! `node.peers[].public_key`, at most `grpc.key_tables_max`) are built;
//! every other key is verified by `p256`'s own routine.
//!
//! The sum is kept in Jacobian coordinates (`x = X/Z²`, `y = Y/Z³`) and
//! grown by the mixed addition of an affine table point (8 multiplications
//! and 3 squarings); the check `x mod n = r` is made as `X = r·Z²`, so no
//! field inversion is needed, and `1/s` is taken in variable time by a
//! GCD. That addition is incomplete: it cannot add a point to itself or
//! to its negation. When one of those cases comes up (inputs chosen to
//! reach it, or a chance of about 2^-200 otherwise) the answer comes from
//! `p256`'s complete routine instead, so every input gets `p256`'s answer.
//!
//! The table lookups depend on the scalars, so this runs in variable time:
//! fine for verification, whose inputs are all public. [`VariableTimeSigner`]
//! uses the generator's table to sign and leaks its nonce through timing;
//! it exists for load generators with throwaway keys, never for a key that
//! matters.

use p256::ecdsa::signature::hazmat::PrehashVerifier;
use p256::ecdsa::{Signature, SigningKey, VerifyingKey};
use p256::elliptic_curve::bigint::{CheckedAdd, Encoding};
use p256::elliptic_curve::group::Curve;
use p256::elliptic_curve::ops::Reduce;
use p256::elliptic_curve::point::AffineCoordinates;
use p256::elliptic_curve::sec1::ToEncodedPoint;
use p256::elliptic_curve::FieldBytesEncoding;
use p256::elliptic_curve::PrimeField;
use p256::{
    AffinePoint, FieldBytes, FieldElement, NistP256, NonZeroScalar, ProjectivePoint, Scalar, U256,
};
use std::sync::LazyLock;

/// Window width, in bits, of the tables of configured keys.
pub const KEY_BITS: u32 = 10;
/// Window width of the generator's table, of which a process has one.
const GENERATOR_BITS: u32 = 12;

/// The coordinates of an affine point other than the identity; one cache
/// line.
#[derive(Clone, Copy)]
#[repr(align(64))]
struct Affine {
    x: FieldElement,
    y: FieldElement,
}

/// A configured key's table.
pub type CombTable = Comb<KEY_BITS>;

/// `j·2^(B·i)·P` for `B = BITS`, every window `i < WINDOWS` and
/// `1 <= j <= 2^(B-1)`, at `i·DIGITS + j - 1`; and `P`.
pub struct Comb<const BITS: u32> {
    points: Vec<Affine>,
    base: AffinePoint,
}

impl<const BITS: u32> Comb<BITS> {
    /// Digit positions of a scalar in base `2^BITS` with signed digits:
    /// enough for 256 bits and a carry out of the top.
    const WINDOWS: usize = 256 / BITS as usize + 1;
    /// Absolute values of a non-zero signed digit, `-2^(B-1)..2^(B-1)`.
    const DIGITS: usize = 1 << (BITS - 1);

    /// The table of `point`, which must not be the identity.
    pub fn new(point: ProjectivePoint) -> Self {
        assert!(
            Self::WINDOWS <= WINDOWS_MAX,
            "{BITS}-bit windows are too narrow"
        );
        let mut points = Vec::with_capacity(Self::WINDOWS * Self::DIGITS);
        let mut base = point;
        for _ in 0..Self::WINDOWS {
            let mut multiple = base;
            for _ in 0..Self::DIGITS {
                points.push(multiple);
                multiple += base;
            }
            // The next window's base, 2^BITS·base: (DIGITS + 1)·base plus
            // (DIGITS - 1)·base.
            base = multiple + points[points.len() - 2];
        }
        let mut affine = vec![AffinePoint::IDENTITY; points.len()];
        ProjectivePoint::batch_normalize(&points, &mut affine);
        let points = affine.iter().map(coordinates).collect();
        Self {
            points,
            base: point.to_affine(),
        }
    }

    /// Adds `scalar·P` to `sum`; `Err` when an addition is one the
    /// incomplete formula does not cover.
    fn add_multiple(&self, sum: &mut Jacobian, scalar: &Scalar) -> Result<(), Exceptional> {
        self.add_picks(sum, &self.picks(scalar))
    }

    /// The table points whose sum is `scalar·P`.
    ///
    /// The scalar is written with digits `d_i` in `-2^(B-1)..2^(B-1)`,
    /// `scalar = Σ d_i·2^(B·i)`: a window of `2^(B-1)` or more becomes that
    /// minus `2^B` and carries one into the next window. Each non-zero
    /// digit picks the point of its window and absolute value, negated
    /// when the digit is.
    fn picks(&self, scalar: &Scalar) -> Picks {
        // Little-endian, with zero bytes past the top for the last window.
        let mut bytes = [0u8; 36];
        for (to, from) in bytes.iter_mut().zip(scalar.to_repr().iter().rev()) {
            *to = *from;
        }
        let mask = (1u32 << BITS) - 1;
        let half = 1i32 << (BITS - 1);
        let mut carry = 0i32;
        let mut picks = Picks::default();
        for i in 0..Self::WINDOWS {
            let bit = i * BITS as usize;
            let word =
                u32::from_le_bytes([bytes[bit / 8], bytes[bit / 8 + 1], bytes[bit / 8 + 2], 0]);
            let value = ((word >> (bit % 8)) & mask) as i32 + carry;
            carry = i32::from(value >= half);
            let digit = value - (carry << BITS);
            if digit != 0 {
                let at = i * Self::DIGITS + digit.unsigned_abs() as usize - 1;
                picks.push(at, digit < 0);
            }
        }
        assert_eq!(carry, 0, "the top window of a 256-bit scalar carries out");
        picks
    }

    /// Reads every picked point once, each load independent of the
    /// others, so that the processor fetches their cache lines side by
    /// side rather than one per addition. A table is megabytes and a
    /// verification's points are scattered over it: between two requests
    /// the node's other work evicts them, and fetched one at a time they
    /// cost as much as the arithmetic.
    fn touch(&self, picks: &Picks) -> bool {
        picks.iter().fold(false, |seen, (at, _)| {
            seen | bool::from(self.points[at].x.is_zero())
        })
    }

    /// Adds the picked points to `sum`.
    fn add_picks(&self, sum: &mut Jacobian, picks: &Picks) -> Result<(), Exceptional> {
        for (at, negated) in picks.iter() {
            let entry = &self.points[at];
            match negated {
                false => sum.add(entry)?,
                true => sum.add(&Affine {
                    x: entry.x,
                    y: -entry.y,
                })?,
            }
        }
        Ok(())
    }
}

/// Most windows a table has (5-bit windows, the narrowest the tests use).
const WINDOWS_MAX: usize = 256 / 5 + 1;

/// Table positions a scalar's multiple adds, each with whether the point
/// is negated.
struct Picks {
    at: [(u32, bool); WINDOWS_MAX],
    len: usize,
}

impl Default for Picks {
    fn default() -> Self {
        Self {
            at: [(0, false); WINDOWS_MAX],
            len: 0,
        }
    }
}

impl Picks {
    fn push(&mut self, at: usize, negated: bool) {
        let at = u32::try_from(at).expect("a table has fewer than 2^32 points");
        self.at[self.len] = (at, negated);
        self.len += 1;
    }

    fn iter(&self) -> impl Iterator<Item = (usize, bool)> + '_ {
        self.at[..self.len]
            .iter()
            .map(|&(at, negated)| (at as usize, negated))
    }
}

/// The affine coordinates of `point` (no identity in a table: every entry
/// is a non-zero multiple, below the group order, of a point of prime
/// order).
fn coordinates(point: &AffinePoint) -> Affine {
    let encoded = point.to_encoded_point(false);
    let field = |bytes: Option<&FieldBytes>| {
        let bytes = bytes.expect("a table point is not the identity");
        Option::<FieldElement>::from(FieldElement::from_bytes(bytes))
            .expect("a point's coordinate is below the field's modulus")
    };
    Affine {
        x: field(encoded.x()),
        y: field(encoded.y()),
    }
}

/// An addition of a point to itself or to its negation.
#[derive(Debug)]
struct Exceptional;

/// A sum of table points in Jacobian coordinates; `None`: the identity
/// (nothing added yet).
#[derive(Default)]
struct Jacobian(Option<(FieldElement, FieldElement, FieldElement)>);

impl Jacobian {
    /// Adds the affine point `q` (mixed addition with `Z2 = 1`).
    fn add(&mut self, q: &Affine) -> Result<(), Exceptional> {
        let Some((x1, y1, z1)) = self.0 else {
            self.0 = Some((q.x, q.y, FieldElement::ONE));
            return Ok(());
        };
        let z1z1 = z1.square();
        let u2 = q.x * z1z1;
        let s2 = q.y * z1 * z1z1;
        let h = u2 - x1;
        let r = s2 - y1;
        if bool::from(h.is_zero()) {
            // Same x: q is the sum itself (a doubling) or its negation.
            return Err(Exceptional);
        }
        let hh = h.square();
        let hhh = h * hh;
        let v = x1 * hh;
        let x3 = r.square() - hhh - v.double();
        let y3 = r * (v - x3) - y1 * hhh;
        let z3 = z1 * h;
        self.0 = Some((x3, y3, z3));
        Ok(())
    }

    /// Whether the sum's x coordinate, reduced mod the group order, is
    /// `r` (not zero). The identity has no x and matches nothing.
    fn x_reduces_to(&self, r: &Scalar) -> bool {
        let Some((x, _, z)) = self.0 else {
            return false;
        };
        let zz = z.square();
        // x < p and p < 2n, so x mod n = r means x = r or x = r + n.
        let r_uint = U256::from_be_slice(&r.to_repr());
        let candidates = [Some(r_uint), Option::from(r_uint.checked_add(&ORDER))];
        candidates.into_iter().flatten().any(|candidate| {
            Option::<FieldElement>::from(FieldElement::from_uint(candidate))
                .is_some_and(|candidate| candidate * zz == x)
        })
    }

    /// The affine x coordinate (`None`: the identity).
    fn affine_x(&self) -> Option<FieldBytes> {
        let (x, _, z) = self.0?;
        let zz_inv = invert_vartime(z.square().to_bytes().into(), &FIELD_MODULUS)?;
        let zz_inv = Option::<FieldElement>::from(FieldElement::from_bytes(&zz_inv.into()))
            .expect("an inverse mod p is below p");
        Some((x * zz_inv).to_bytes())
    }
}

/// The group order as an integer.
const ORDER: U256 = <NistP256 as p256::elliptic_curve::Curve>::ORDER;

/// The field's modulus `p` as an integer.
const FIELD_MODULUS: U256 =
    U256::from_be_hex("ffffffff00000001000000000000000000000000ffffffffffffffffffffffff");

/// The generator's table, built at its first use.
static GENERATOR: LazyLock<Comb<GENERATOR_BITS>> =
    LazyLock::new(|| Comb::new(ProjectivePoint::GENERATOR));

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
    fast_verify(key, digest, signature)
        .unwrap_or_else(|Exceptional| complete_verify(key, digest, signature))
}

/// [`verify`] with the comb tables and the incomplete addition; `Err` when
/// an addition is one it does not cover.
fn fast_verify(
    key: &CombTable,
    digest: &[u8; 64],
    signature: &Signature,
) -> Result<bool, Exceptional> {
    let (r, s) = signature.split_scalars();
    let s_inv = invert_public(&s);
    let u1 = digest_scalar(digest) * s_inv;
    let u2 = *r * s_inv;
    let (generator, key_picks) = (GENERATOR.picks(&u1), key.picks(&u2));
    std::hint::black_box(GENERATOR.touch(&generator) | key.touch(&key_picks));
    let mut sum = Jacobian::default();
    GENERATOR.add_picks(&mut sum, &generator)?;
    key.add_picks(&mut sum, &key_picks)?;
    Ok(sum.x_reduces_to(&r))
}

/// `1/s` mod the group order, in variable time (`s` is public).
fn invert_public(s: &NonZeroScalar) -> Scalar {
    let inverse = invert_vartime(s.to_repr().into(), &ORDER)
        .expect("a non-zero scalar is invertible mod the prime group order");
    Option::<Scalar>::from(Scalar::from_repr(inverse.into()))
        .expect("an inverse mod the order is below it")
}

/// `1/value` mod the prime `modulus` (big-endian bytes), `None` when
/// `value` is zero mod it: Lehmer's extended GCD of `ruint`, in variable
/// time, so for public values only. Several times faster than `p256`'s
/// variable-time inversion and tens of times faster than its
/// constant-time one (a Fermat power: ~256 squarings).
fn invert_vartime(value: [u8; 32], modulus: &U256) -> Option<[u8; 32]> {
    type Uint = ruint::aliases::U256;
    let value = Uint::from_be_bytes::<32>(value);
    let modulus = Uint::from_be_bytes::<32>(modulus.to_be_bytes());
    value
        .inv_mod(modulus)
        .map(|inverse| inverse.to_be_bytes::<32>())
}

/// `p256`'s own verification of the table's key.
fn complete_verify(key: &CombTable, digest: &[u8; 64], signature: &Signature) -> bool {
    VerifyingKey::from_affine(key.base)
        .and_then(|key| key.verify_prehash(digest, signature))
        .is_ok()
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
        let order = ORDER.encode_field_bytes();
        let mut extra = 0u64;
        loop {
            // A retry (a nonce, r or s of zero: about never) mixes a
            // counter into the nonce.
            let extra_bytes = extra.to_be_bytes();
            let ad: &[u8] = if extra == 0 { &[] } else { &extra_bytes };
            extra += 1;
            let k_bytes = rfc6979::generate_k::<sha2::Sha256, _>(&secret.to_repr(), &order, &z, ad);
            let Some(k) = Option::<NonZeroScalar>::from(NonZeroScalar::from_repr(k_bytes)) else {
                continue;
            };
            let k_inv = invert_public(&k);
            let mut point = Jacobian::default();
            let x = match GENERATOR.add_multiple(&mut point, &k) {
                Ok(()) => point.affine_x(),
                Err(Exceptional) => Some((ProjectivePoint::GENERATOR * *k).to_affine().x()),
            };
            let Some(x) = x else {
                continue;
            };
            let r = <Scalar as Reduce<U256>>::reduce_bytes(&x);
            let s = k_inv * (digest_scalar(digest) + r * **secret);
            if let Ok(signature) = Signature::from_scalars(r, s) {
                return signature;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::elliptic_curve::sec1::FromEncodedPoint;
    use p256::EncodedPoint;

    /// A digest whose leftmost 256 bits are `scalar`.
    fn digest_of(scalar: &Scalar) -> [u8; 64] {
        let mut digest = [0u8; 64];
        digest[..32].copy_from_slice(&scalar.to_repr());
        digest
    }

    fn p256_says(key: &AffinePoint, digest: &[u8; 64], signature: &Signature) -> bool {
        VerifyingKey::from_affine(*key)
            .unwrap()
            .verify_prehash(digest, signature)
            .is_ok()
    }

    /// Inputs chosen so that the incomplete addition meets a doubling or
    /// a point and its negation: the fast path gives up and the answer is
    /// `p256`'s, valid or not. The key is the generator itself (secret 1),
    /// so `u1·G + u2·Q` is `(u1 + u2)·G`.
    #[test]
    fn additions_the_formula_cannot_make_get_p256s_answer() {
        let key = CombTable::new(ProjectivePoint::GENERATOR);
        let z = digest_scalar(&[0x5a; 64]);
        let cases = [
            // u1 = u2 = 1: G + G, a doubling; x(2G) is not z, so invalid.
            (z, z, z, false),
            // u1 = 1, u2 = -1: the sum is the identity; invalid.
            (z, -z, z, false),
        ];
        let x_2g = <Scalar as Reduce<U256>>::reduce_bytes(
            &(ProjectivePoint::GENERATOR + ProjectivePoint::GENERATOR)
                .to_affine()
                .x(),
        );
        // u1 = u2 = 1 over a digest of x(2G): a valid signature whose
        // check needs a doubling.
        let cases = cases.into_iter().chain([(x_2g, x_2g, x_2g, true)]);
        for (digest, r, s, valid) in cases {
            let digest = digest_of(&digest);
            let signature = Signature::from_scalars(r, s).unwrap();
            assert!(fast_verify(&key, &digest, &signature).is_err());
            assert_eq!(p256_says(&key.base, &digest, &signature), valid);
            assert_eq!(verify(&key, &digest, &signature), valid);
        }
    }

    /// A point whose x coordinate is at least the group order: its
    /// signature's `r` is `x - n`, and the check must try `r + n`.
    /// The table's multiples are `p256`'s, for scalars whose signed digits
    /// carry (bytes of 128 and more, runs of 0xff, the order minus one)
    /// and for pseudo-random ones.
    #[test]
    fn the_table_multiplies_as_p256_does() {
        let point = ProjectivePoint::GENERATOR * Scalar::from(0x1234_5678u64);
        check_multiples(&CombTable::new(point), point);
        check_multiples(&Comb::<GENERATOR_BITS>::new(point), point);
        check_multiples(&Comb::<5>::new(point), point);
    }

    fn check_multiples<const BITS: u32>(table: &Comb<BITS>, point: ProjectivePoint) {
        let from_bytes =
            |bytes: [u8; 32]| <Scalar as Reduce<U256>>::reduce_bytes(&FieldBytes::from(bytes));
        let mut scalars = vec![
            Scalar::ONE,
            Scalar::from(127u64),
            Scalar::from(128u64),
            Scalar::from(2047u64),
            Scalar::from(2048u64),
            Scalar::from(0x800u64 << 12),
            Scalar::from(255u64),
            Scalar::from(256u64),
            Scalar::from(0x80ff_7f80u64),
            from_bytes([0x80; 32]),
            from_bytes([0xff; 32]),
            from_bytes([0x7f; 32]),
            -Scalar::ONE,
            -Scalar::from(128u64),
        ];
        let mut x = Scalar::from(3u64);
        for _ in 0..50 {
            x = x * x + Scalar::from(7u64);
            scalars.push(x);
        }
        for scalar in scalars {
            let mut sum = Jacobian::default();
            table.add_multiple(&mut sum, &scalar).unwrap();
            let (jx, jy, jz) = sum.0.unwrap();
            let z_inv = jz.invert().unwrap();
            let expected = coordinates(&(point * scalar).to_affine());
            assert!(jx * z_inv.square() == expected.x);
            assert!(jy * z_inv.square() * z_inv == expected.y);
        }
    }

    /// The GCD inversion agrees with `p256`'s.
    #[test]
    fn the_public_inversion_inverts() {
        let mut x = Scalar::from(0x9e37_79b9_7f4a_7c15u64);
        for _ in 0..200 {
            let s = NonZeroScalar::new(x).unwrap();
            let inverse = invert_public(&s);
            assert_eq!(inverse * x, Scalar::ONE);
            assert_eq!(inverse, x.invert().unwrap());
            x = x * x + Scalar::ONE;
        }
        let minus_one = NonZeroScalar::new(-Scalar::ONE).unwrap();
        assert_eq!(invert_public(&minus_one), -Scalar::ONE);
    }

    /// The same GCD inverts mod the field's prime (the signer's affine x),
    /// and the modulus is the field's: `p` itself is no field element,
    /// `p - 1` is minus one.
    #[test]
    fn the_field_inversion_inverts() {
        assert!(bool::from(FieldElement::from_uint(FIELD_MODULUS).is_none()));
        let p_minus_one = FIELD_MODULUS.wrapping_sub(&U256::ONE);
        assert_eq!(
            FieldElement::from_uint(p_minus_one).unwrap(),
            -FieldElement::ONE
        );
        let mut x = FieldElement::from_u64(0x9e37_79b9_7f4a_7c15);
        for _ in 0..200 {
            let inverse = invert_vartime(x.to_bytes().into(), &FIELD_MODULUS).unwrap();
            let inverse = FieldElement::from_bytes(&inverse.into()).unwrap();
            assert_eq!(inverse * x, FieldElement::ONE);
            assert_eq!(inverse, x.invert().unwrap());
            x = x * x + FieldElement::ONE;
        }
        assert_eq!(invert_vartime([0; 32], &FIELD_MODULUS), None);
        assert_eq!(
            invert_vartime(FIELD_MODULUS.to_be_bytes(), &FIELD_MODULUS),
            None
        );
    }

    #[test]
    fn an_x_above_the_group_order_is_matched_as_r_plus_n() {
        // The curve is y² = x³ - 3x + b; b from the generator's coordinates.
        let g = coordinates(&AffinePoint::GENERATOR);
        let b = g.y.square() - g.x.square() * g.x + g.x.double() + g.x;
        let point = (1u64..)
            .find_map(|t| {
                let x_uint = ORDER.checked_add(&U256::from_u64(t)).unwrap();
                let x = Option::<FieldElement>::from(FieldElement::from_uint(x_uint))?;
                let y2 = x.square() * x - x.double() - x + b;
                let y = Option::<FieldElement>::from(y2.sqrt())?;
                let encoded =
                    EncodedPoint::from_affine_coordinates(&x.to_bytes(), &y.to_bytes(), false);
                Option::<AffinePoint>::from(AffinePoint::from_encoded_point(&encoded))
            })
            .unwrap();
        let key = CombTable::new(point.into());
        // z = 0 and r = s: u1 = 0, u2 = 1, so the sum is the key itself.
        let r = <Scalar as Reduce<U256>>::reduce_bytes(&point.x());
        let signature = Signature::from_scalars(r, r).unwrap();
        let digest = [0u8; 64];
        assert!(p256_says(&point, &digest, &signature));
        assert!(fast_verify(&key, &digest, &signature).unwrap());
        // The same without the r + n candidate would fail: x is not r.
        assert_ne!(FieldBytes::from(r.to_repr()), point.x());
        let other = Signature::from_scalars(r + Scalar::ONE, r).unwrap();
        assert!(!verify(&key, &digest, &other));
        assert!(!p256_says(&point, &digest, &other));
    }
}
