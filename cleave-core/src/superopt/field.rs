//! Arithmetic in the fingerprint ring Z_p × Z_q, with p = 2q + 1 a safe prime.
//!
//! A fingerprint value is a pair `(x mod p, y mod q)`. Addition and multiplication act on both
//! components, so every polynomial identity of the real numbers holds exactly. `exp` is the
//! homomorphism `(Z_q, +) → (Z_p^*, ·)`, `y ↦ g^y`, where `g` generates the subgroup of order
//! `q` (the quadratic residues mod p): `exp(a + b) = exp(a) · exp(b)` holds exactly on the
//! `p`-component. The `q`-component of an `exp` result has no homomorphic image (the
//! multiplicative group of Z_q has order `q − 1`, coprime to `q`), so it is marked
//! [`UNKNOWN`] and every value computed from it inherits the mark; comparisons treat an unknown
//! component as matching anything and rely on the `p`-component.
//!
//! Masks need one value outside the ring: `-inf`, what a masked score is. It is a sentinel
//! ([`Fp::NEG_INF`]) that the interpreter treats as the extended reals do where they are
//! defined (`exp(-inf) = 0`, `max(-inf, x) = x`, `-inf + x = -inf`), and everything else
//! (`-inf · x`, whose sign the field cannot tell, `x - (-inf)`, `-inf - (-inf)`) is
//! [`Fp::POISON`]: undefined, matching anything where the target is undefined and nothing
//! where it is not.
//!
//! Functions with no algebraic model here (`log`, `sqrt`, `sigmoid`, `gelu`, `exp` of a value
//! whose `q`-component is unknown, and the order that `max` selects by) are *consistent
//! uninterpreted functions*: keyed hashes of the argument's `p`-component, which is exact for
//! any two algebraically equal computations. Keys are drawn per trial, so independent trials
//! use independent random functions.

/// The large prime: p = 2q + 1.
pub const P: u32 = 2_147_481_143;
/// The prime order of the exponent group: q = (p − 1) / 2.
pub const Q: u32 = 1_073_740_571;
/// A quadratic residue ≠ 1 mod p, hence of order exactly q.
pub const G: u32 = 4;
/// Marks a `q`-component that no homomorphism determines (downstream of `exp`).
pub const UNKNOWN: u32 = u32::MAX;

/// One fingerprint value.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Fp {
    /// The component mod p.
    pub p: u32,
    /// The component mod q, or [`UNKNOWN`].
    pub q: u32,
}

/// A value the verifier cannot use: a division by zero in the field. The trial is
/// inconclusive and is drawn again.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ZeroDivisor;

/// Bits of the exponent each table of [`pow_g`] covers; two tables cover every `q < Q < 2^30`.
const POW_BITS: u32 = 15;

/// `G^q mod P` for `q < 2^30`, from two tables of `2^15` powers: `G^q = G^lo · G^(hi·2^15)`.
/// `exp` of a known value is the hot operation of fingerprinting (a square-and-multiply takes
/// about 60 modular products), so the tables, built once, make it two lookups and one product.
/// The result is exactly `pow_mod(G, q, P)`.
pub fn pow_g(q: u32) -> u32 {
    static TABLES: std::sync::OnceLock<(Vec<u32>, Vec<u32>)> = std::sync::OnceLock::new();
    let (lo, hi) = TABLES.get_or_init(|| {
        let n = 1usize << POW_BITS;
        let powers = |base: u64| {
            let mut t = Vec::with_capacity(n);
            let mut r = 1u64;
            for _ in 0..n {
                t.push(r as u32);
                r = r * base % u64::from(P);
            }
            t
        };
        let step = pow_mod(u64::from(G), 1 << POW_BITS, u64::from(P));
        (powers(u64::from(G)), powers(step))
    });
    let mask = (1u32 << POW_BITS) - 1;
    let (l, h) = ((q & mask) as usize, (q >> POW_BITS) as usize);
    debug_assert!(h < hi.len(), "exponents are below Q < 2^30");
    (u64::from(lo[l]) * u64::from(hi[h]) % u64::from(P)) as u32
}

/// `base^exp mod m`.
pub fn pow_mod(base: u64, mut exp: u64, m: u64) -> u64 {
    let mut b = base % m;
    let mut r = 1 % m;
    while exp > 0 {
        if exp & 1 == 1 {
            r = r * b % m;
        }
        b = b * b % m;
        exp >>= 1;
    }
    r
}

/// Deterministic Miller–Rabin, exact for every `n < 3 215 031 751` (bases 2, 3, 5, 7).
pub fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    for p in [2u64, 3, 5, 7] {
        if n % p == 0 {
            return n == p;
        }
    }
    assert!(n < 3_215_031_751, "the four bases decide primality only below 3 215 031 751");
    let (mut d, mut s) = (n - 1, 0);
    while d % 2 == 0 {
        d /= 2;
        s += 1;
    }
    'bases: for a in [2u64, 3, 5, 7] {
        let mut x = pow_mod(a, d, n);
        if x == 1 || x == n - 1 {
            continue;
        }
        for _ in 1..s {
            x = x * x % n;
            if x == n - 1 {
                continue 'bases;
            }
        }
        return false;
    }
    true
}

/// A 64-bit mixing function (splitmix64's finalizer) keyed by `key`.
pub fn mix(key: u64, x: u64) -> u64 {
    let mut z = x ^ key.rotate_left(17);
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15).wrapping_add(key);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Fp {
    /// The value 0.
    pub const ZERO: Fp = Fp { p: 0, q: 0 };
    /// The value 1.
    pub const ONE: Fp = Fp { p: 1, q: 1 };
    /// `-inf`: a masked element (no ring value has this `p`-component).
    pub const NEG_INF: Fp = Fp { p: u32::MAX, q: UNKNOWN };
    /// An undefined value (NaN or `+inf` in the reals).
    pub const POISON: Fp = Fp { p: u32::MAX - 1, q: UNKNOWN };

    /// True for [`Fp::NEG_INF`].
    pub fn is_neg_inf(self) -> bool {
        self.p == Fp::NEG_INF.p
    }

    /// True for [`Fp::POISON`].
    pub fn is_poison(self) -> bool {
        self.p == Fp::POISON.p
    }

    /// True for either sentinel: the value is not a ring element.
    pub fn is_special(self) -> bool {
        self.p >= Fp::POISON.p
    }

    /// True for the ring's zero (a `q`-component that is unknown counts as zero).
    pub fn is_zero(self) -> bool {
        self.p == 0 && (self.q == 0 || !self.q_known())
    }

    /// The image of a non-negative integer.
    pub fn from_u64(n: u64) -> Fp {
        Fp { p: (n % u64::from(P)) as u32, q: (n % u64::from(Q)) as u32 }
    }

    /// The exact image of a finite double: every finite double is `m · 2^e` with integer `m`,
    /// and 2 is invertible in both fields, so the embedding is a ring homomorphism on the
    /// dyadic rationals (`0.125 · 8 = 1` holds in the field too). Non-finite values have no
    /// image.
    pub fn from_f64(c: f64) -> Option<Fp> {
        if !c.is_finite() {
            return None;
        }
        if c == 0.0 {
            return Some(Fp::ZERO);
        }
        let bits = c.to_bits();
        let negative = bits >> 63 == 1;
        let exp_bits = ((bits >> 52) & 0x7ff) as i64;
        let frac = bits & ((1u64 << 52) - 1);
        // Normal numbers carry the implicit leading one; subnormals have exponent 1 − 1075.
        let (m, e) = if exp_bits == 0 { (frac, -1074) } else { (frac | (1u64 << 52), exp_bits - 1075) };
        let component = |modulus: u32| -> u32 {
            let md = u64::from(modulus);
            let mut v = m % md;
            let two_pow =
                if e >= 0 { pow_mod(2, e as u64, md) } else { pow_mod(pow_mod(2, md - 2, md), (-e) as u64, md) };
            v = v * two_pow % md;
            if negative && v != 0 {
                v = md as u32 as u64 - v;
            }
            v as u32
        };
        Some(Fp { p: component(P), q: component(Q) })
    }

    /// True when the `q`-component is known.
    pub fn q_known(self) -> bool {
        self.q != UNKNOWN
    }

    /// Multiplicative inverse; a zero component makes the trial inconclusive.
    pub fn inv(self) -> Result<Fp, ZeroDivisor> {
        if self.p == 0 || self.q == 0 {
            return Err(ZeroDivisor);
        }
        let p = pow_mod(u64::from(self.p), u64::from(P) - 2, u64::from(P)) as u32;
        let q =
            if self.q_known() { pow_mod(u64::from(self.q), u64::from(Q) - 2, u64::from(Q)) as u32 } else { UNKNOWN };
        Ok(Fp { p, q })
    }

    /// Quotient; a zero divisor makes the trial inconclusive.
    pub fn checked_div(self, o: Fp) -> Result<Fp, ZeroDivisor> {
        Ok(self * o.inv()?)
    }
}

impl std::ops::Add for Fp {
    type Output = Fp;

    fn add(self, o: Fp) -> Fp {
        let p = ((u64::from(self.p) + u64::from(o.p)) % u64::from(P)) as u32;
        let q = if self.q_known() && o.q_known() {
            ((u64::from(self.q) + u64::from(o.q)) % u64::from(Q)) as u32
        } else {
            UNKNOWN
        };
        Fp { p, q }
    }
}

impl std::ops::Neg for Fp {
    type Output = Fp;

    fn neg(self) -> Fp {
        let p = if self.p == 0 { 0 } else { P - self.p };
        let q = match self.q {
            UNKNOWN => UNKNOWN,
            0 => 0,
            q => Q - q,
        };
        Fp { p, q }
    }
}

impl std::ops::Sub for Fp {
    type Output = Fp;

    fn sub(self, o: Fp) -> Fp {
        self + -o
    }
}

impl std::ops::Mul for Fp {
    type Output = Fp;

    fn mul(self, o: Fp) -> Fp {
        let p = (u64::from(self.p) * u64::from(o.p) % u64::from(P)) as u32;
        let q = if self.q_known() && o.q_known() {
            (u64::from(self.q) * u64::from(o.q) % u64::from(Q)) as u32
        } else {
            UNKNOWN
        };
        Fp { p, q }
    }
}

/// The keys of the uninterpreted functions of one trial.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keys {
    exp_nested: u64,
    log: u64,
    sqrt: u64,
    sigmoid: u64,
    gelu: u64,
    order: u64,
}

/// The uninterpreted functions the fingerprint interpreter needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uninterpreted {
    /// Natural logarithm.
    Log,
    /// Square root (`rsqrt` is its inverse, matching `rsqrt(x) = recip(sqrt(x))`).
    Sqrt,
    /// Logistic sigmoid (`silu(x)` is `x · sigmoid(x)`).
    Sigmoid,
    /// GELU.
    Gelu,
}

impl Keys {
    /// Keys drawn from a seed.
    pub fn new(seed: u64) -> Keys {
        let k = |i: u64| mix(seed, 0x5eed_0000 + i);
        Keys { exp_nested: k(1), log: k(2), sqrt: k(3), sigmoid: k(4), gelu: k(5), order: k(6) }
    }

    /// `exp`: the homomorphism on a known `q`-component, an uninterpreted function otherwise.
    pub fn exp(&self, x: Fp) -> Fp {
        if x.q_known() {
            Fp { p: pow_g(x.q), q: UNKNOWN }
        } else {
            // exp is never zero, so its uninterpreted image avoids zero too.
            let h = mix(self.exp_nested, u64::from(x.p));
            Fp { p: (h % (u64::from(P) - 1)) as u32 + 1, q: UNKNOWN }
        }
    }

    /// A consistent uninterpreted function of the `p`-component.
    pub fn apply(&self, f: Uninterpreted, x: Fp) -> Fp {
        let key = match f {
            Uninterpreted::Log => self.log,
            Uninterpreted::Sqrt => self.sqrt,
            Uninterpreted::Sigmoid => self.sigmoid,
            Uninterpreted::Gelu => self.gelu,
        };
        let h = mix(key, u64::from(x.p));
        let q = if x.q_known() { (mix(key ^ 0xa5a5, h) % u64::from(Q)) as u32 } else { UNKNOWN };
        Fp { p: (h % u64::from(P)) as u32, q }
    }

    /// The rank of a value in this trial's random total order, used by `max`: a selection
    /// function with a total order is associative, commutative and idempotent, so a maximum
    /// over a row equals the maximum of the maxima of any partition of the row.
    pub fn rank(&self, x: Fp) -> (u64, u32) {
        (mix(self.order, u64::from(x.p)), x.p)
    }

    /// `max(a, b)` under the trial's order.
    pub fn max(&self, a: Fp, b: Fp) -> Fp {
        if self.rank(b) > self.rank(a) {
            b
        } else {
            a
        }
    }
}

/// True when a candidate's value `a` agrees with the target's `b`: equal `p`-components and
/// equal `q`-components where both are known. Where the target is undefined
/// ([`Fp::POISON`]) any value agrees; an undefined candidate agrees with nothing else.
pub fn agree(a: Fp, b: Fp) -> bool {
    if b.is_poison() {
        return true;
    }
    a.p == b.p && (a.q == b.q || !a.q_known() || !b.q_known())
}

/// A uniformly random value with both components known.
pub fn random(rng: &mut crate::reference::Rng) -> Fp {
    Fp { p: rng.below(u64::from(P)) as u32, q: rng.below(u64::from(Q)) as u32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_moduli_are_a_safe_prime_pair_congruent_to_3_mod_4() {
        assert!(is_prime(u64::from(P)), "p is prime");
        assert!(is_prime(u64::from(Q)), "q is prime");
        assert_eq!(u64::from(P), 2 * u64::from(Q) + 1);
        assert_eq!(P % 4, 3);
        assert_eq!(Q % 4, 3);
        // The primality test itself rejects composites and accepts known primes.
        assert!(!is_prime(65_537 * 3) && !is_prime(46_341 * 46_337));
        assert!(!is_prime(561) && !is_prime(1_105) && is_prime(1_000_000_007));
    }

    #[test]
    fn the_exp_base_has_order_q() {
        assert_ne!(G, 1);
        assert_eq!(pow_mod(u64::from(G), u64::from(Q), u64::from(P)), 1);
        // Euler's criterion: g is a quadratic residue.
        assert_eq!(pow_mod(u64::from(G), (u64::from(P) - 1) / 2, u64::from(P)), 1);
    }

    #[test]
    fn the_power_tables_agree_with_square_and_multiply() {
        let mut rng = crate::reference::Rng::new(17);
        let edges = [0, 1, (1 << POW_BITS) - 1, 1 << POW_BITS, Q - 1];
        for q in edges.into_iter().chain((0..2000).map(|_| rng.below(u64::from(Q)) as u32)) {
            assert_eq!(u64::from(pow_g(q)), pow_mod(u64::from(G), u64::from(q), u64::from(P)), "q = {q}");
        }
    }

    #[test]
    fn exp_is_a_homomorphism_on_the_p_component() {
        let keys = Keys::new(3);
        let mut rng = crate::reference::Rng::new(9);
        for _ in 0..100 {
            let (a, b) = (random(&mut rng), random(&mut rng));
            let lhs = keys.exp(a + b);
            let rhs = keys.exp(a) * keys.exp(b);
            assert!(agree(lhs, rhs));
            // exp(a - b) = exp(a) / exp(b): what max-subtraction in softmax relies on.
            assert!(agree(keys.exp(a - b), keys.exp(a).checked_div(keys.exp(b)).unwrap()));
        }
    }

    #[test]
    fn dyadic_constants_embed_exactly() {
        let c = Fp::from_f64(0.125).unwrap();
        assert_eq!(c * Fp::from_u64(8), Fp::ONE);
        assert_eq!(Fp::from_f64(-3.0).unwrap() + Fp::from_u64(3), Fp::ZERO);
        assert_eq!(Fp::from_f64(1.5).unwrap(), Fp::from_u64(3).checked_div(Fp::from_u64(2)).unwrap());
        assert_eq!(Fp::from_f64(f64::NAN), None);
        assert!(Fp::ZERO.inv().is_err());
    }

    #[test]
    fn nested_exp_is_consistent() {
        let keys = Keys::new(5);
        let mut rng = crate::reference::Rng::new(1);
        let (a, b) = (random(&mut rng), random(&mut rng));
        // exp(exp(a) · exp(b)) and exp(exp(a + b)) see equal p-components inside.
        let lhs = keys.exp(keys.exp(a) * keys.exp(b));
        let rhs = keys.exp(keys.exp(a + b));
        assert!(agree(lhs, rhs));
        assert!(!agree(keys.exp(keys.exp(a)), keys.exp(keys.exp(b))));
    }

    #[test]
    fn max_is_a_semilattice() {
        let keys = Keys::new(11);
        let mut rng = crate::reference::Rng::new(2);
        let xs: Vec<Fp> = (0..12).map(|_| random(&mut rng)).collect();
        let whole = xs.iter().copied().reduce(|a, b| keys.max(a, b)).unwrap();
        // Any partition into chunks, maxed per chunk and then combined, gives the same value.
        for chunk in [1, 2, 3, 4, 6] {
            let parts: Vec<Fp> =
                xs.chunks(chunk).map(|c| c.iter().copied().reduce(|a, b| keys.max(a, b)).unwrap()).collect();
            assert_eq!(parts.iter().copied().reduce(|a, b| keys.max(a, b)).unwrap(), whole);
        }
        assert_eq!(keys.max(xs[0], xs[1]), keys.max(xs[1], xs[0]));
        assert_eq!(keys.max(xs[0], xs[0]), xs[0]);
    }
}
