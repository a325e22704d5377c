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
//! `log` goes the other way: `|x| ↦ log_g(x²) / 2`, a homomorphism `(Z_p^*, ·) → (Z_q, +)`
//! (the discrete logarithm base `g`, by baby-step giant-step; `x²` is always a quadratic
//! residue). It inverts `exp` (`log(exp(y)) = y`) and turns products into sums
//! (`m + log(Σ exp(s − m)) = log(Σ exp(s))`, the log-sum-exp a user writes stabilized), but
//! only on the `q`-component: a `log` result's `p`-component is [`P_UNKNOWN`]. It models
//! `log |x|`, so `log(−x) = log(x)` in the field; the float check after the search is what
//! tells the two apart. A value may thus lack either component but never both: an operation
//! whose result would know neither (a product of a `log` and an `exp`, as in `p · log(p)`) is
//! a consistent uninterpreted function of its two operands instead ([`opaque`]), which loses
//! the identities through it but invents none. Because of that loss, a trial may also read
//! `log` the old way, as an uninterpreted function ([`LogReading`]); a verifier whose target
//! takes a log compares under both readings and accepts what either proves.
//!
//! Functions with no algebraic model here (`sqrt`, `sigmoid`, `gelu`, `exp` of a value whose
//! `q`-component is unknown, `log` of a value whose `p`-component is, and the order that `max`
//! selects by) are *consistent uninterpreted functions*: keyed hashes of the argument's known
//! component, which is exact for any two algebraically equal computations. Keys are drawn per
//! trial, so independent trials use independent random functions.

/// The large prime: p = 2q + 1.
pub const P: u32 = 2_147_481_143;
/// The prime order of the exponent group: q = (p − 1) / 2.
pub const Q: u32 = 1_073_740_571;
/// A quadratic residue ≠ 1 mod p, hence of order exactly q.
pub const G: u32 = 4;
/// Marks a `q`-component that no homomorphism determines (downstream of `exp`).
pub const UNKNOWN: u32 = u32::MAX;
/// Marks a `p`-component that no homomorphism determines (downstream of `log`). It lies
/// above every ring element and below the sentinels of [`Fp`].
pub const P_UNKNOWN: u32 = u32::MAX - 2;

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

    /// True for the ring's zero (a component that is unknown counts as zero).
    pub fn is_zero(self) -> bool {
        (self.p == 0 || !self.p_known()) && (self.q == 0 || !self.q_known()) && (self.p_known() || self.q_known())
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

    /// True when the `p`-component is known (or is a sentinel).
    pub fn p_known(self) -> bool {
        self.p != P_UNKNOWN
    }

    /// The value's known component, tagged by which it is: what a consistent uninterpreted
    /// function of the value hashes.
    fn known_part(self) -> u64 {
        if self.p_known() {
            u64::from(self.p)
        } else {
            (1 << 32) | u64::from(self.q)
        }
    }

    /// A value from components computed apart, either of which may be unknown; one knowing
    /// neither is replaced by [`opaque`] of the operands `a` and `b` of `op`.
    fn combine(op: u64, a: Fp, b: Fp, p: u32, q: u32) -> Fp {
        if p == P_UNKNOWN && q == UNKNOWN {
            opaque(op, a, b)
        } else {
            Fp { p, q }
        }
    }

    /// Multiplicative inverse; a zero component makes the trial inconclusive.
    pub fn inv(self) -> Result<Fp, ZeroDivisor> {
        if self.p == 0 || self.q == 0 {
            return Err(ZeroDivisor);
        }
        let p =
            if self.p_known() { pow_mod(u64::from(self.p), u64::from(P) - 2, u64::from(P)) as u32 } else { P_UNKNOWN };
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
        let p = if self.p_known() && o.p_known() {
            ((u64::from(self.p) + u64::from(o.p)) % u64::from(P)) as u32
        } else {
            P_UNKNOWN
        };
        let q = if self.q_known() && o.q_known() {
            ((u64::from(self.q) + u64::from(o.q)) % u64::from(Q)) as u32
        } else {
            UNKNOWN
        };
        Fp::combine(OPAQUE_ADD, self, o, p, q)
    }
}

impl std::ops::Neg for Fp {
    type Output = Fp;

    fn neg(self) -> Fp {
        let p = match self.p {
            P_UNKNOWN => P_UNKNOWN,
            0 => 0,
            p => P - p,
        };
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
        let p = if self.p_known() && o.p_known() {
            (u64::from(self.p) * u64::from(o.p) % u64::from(P)) as u32
        } else {
            P_UNKNOWN
        };
        let q = if self.q_known() && o.q_known() {
            (u64::from(self.q) * u64::from(o.q) % u64::from(Q)) as u32
        } else {
            UNKNOWN
        };
        Fp::combine(OPAQUE_MUL, self, o, p, q)
    }
}

/// The tags of [`opaque`] for a sum and a product (a difference is the sum with a negation).
const OPAQUE_ADD: u64 = 0x0add;
const OPAQUE_MUL: u64 = 0x0700;

/// The value of an operation whose result would have no known component: a hash of the
/// operation and its operands (in either order, as both operations commute) with a known
/// `p`-component, as `exp` of an unknown exponent is. Equal operands give equal results, so
/// no identity is invented; the identities through it (associativity, distributivity) are
/// lost. It is keyed by a constant rather than per trial because `+` and `·` see no keys; the
/// operands themselves are drawn per trial.
fn opaque(op: u64, a: Fp, b: Fp) -> Fp {
    let (x, y) = if (a.p, a.q) <= (b.p, b.q) { (a, b) } else { (b, a) };
    let h = mix(mix(op, x.known_part()), y.known_part());
    Fp { p: (h % u64::from(P)) as u32, q: UNKNOWN }
}

/// `log_g(y)` for `y` in the subgroup of order `q` (the quadratic residues): baby-step
/// giant-step over a table of `g^j`, `j < 2^20`, built once (16 MiB), then at most
/// `q / 2^20` (about 1024) steps of `g^(−2^20)`. Each thread remembers its recent answers,
/// since a search takes the log of the same few sums in candidate after candidate.
fn dlog_g(y: u32) -> u32 {
    const BABY_BITS: u32 = 20;
    const SLOT_BITS: u32 = BABY_BITS + 1;
    const MEMO: usize = 1 << 16;
    static TABLE: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();
    thread_local! {
        static SEEN: std::cell::RefCell<std::collections::HashMap<u32, u32>> = Default::default();
    }
    if let Some(x) = SEEN.with(|m| m.borrow().get(&y).copied()) {
        return x;
    }
    let slot = |v: u32| ((u64::from(v).wrapping_mul(0x9e37_79b9_7f4a_7c15)) >> (64 - SLOT_BITS)) as usize;
    let table = TABLE.get_or_init(|| {
        // Open addressing: an entry is `g^j << 32 | j`, and 0 (no power of g is 0) is empty.
        let mut t = vec![0u64; 1 << SLOT_BITS];
        let mut v = 1u64;
        for j in 0..1u64 << BABY_BITS {
            let mut i = slot(v as u32);
            while t[i] != 0 {
                i = (i + 1) & ((1 << SLOT_BITS) - 1);
            }
            t[i] = v << 32 | j;
            v = v * u64::from(G) % u64::from(P);
        }
        t
    });
    let find = |v: u32| -> Option<u32> {
        let mut i = slot(v);
        loop {
            match table[i] {
                0 => return None,
                e if (e >> 32) as u32 == v => return Some(e as u32),
                _ => i = (i + 1) & ((1 << SLOT_BITS) - 1),
            }
        }
    };
    let step = pow_mod(u64::from(G), u64::from(Q) - (1u64 << BABY_BITS) % u64::from(Q), u64::from(P));
    let mut v = u64::from(y);
    let mut x = None;
    for i in 0..=u64::from(Q) >> BABY_BITS {
        if let Some(j) = find(v as u32) {
            x = Some(((i << BABY_BITS) + u64::from(j)) % u64::from(Q));
            break;
        }
        v = v * step % u64::from(P);
    }
    let x = x.expect("every quadratic residue is a power of g") as u32;
    SEEN.with(|m| {
        let mut m = m.borrow_mut();
        if m.len() >= MEMO {
            m.clear();
        }
        m.insert(y, x);
    });
    x
}

/// `log |x|` in `Z_q` for a nonzero `x` of `Z_p`: `log_g(x²) / 2`. Writing `x = ±g^t`,
/// `x² = g^(2t)`, so the result is `t`, and `log(exp(y)) = log(g^y) = y`.
pub fn log_abs(x: u32) -> u32 {
    debug_assert!(x != 0 && x < P);
    let square = (u64::from(x) * u64::from(x) % u64::from(P)) as u32;
    // The inverse of 2 mod q.
    let half = u64::from(Q).div_ceil(2);
    (u64::from(dlog_g(square)) * half % u64::from(Q)) as u32
}

/// The keys of the uninterpreted functions of one trial, and its reading of `log`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keys {
    exp_nested: u64,
    log: u64,
    sqrt: u64,
    sigmoid: u64,
    gelu: u64,
    order: u64,
    log_reading: LogReading,
}

/// How a trial reads `log`. Each reading proves identities the other cannot, and neither
/// invents one, so a candidate that agrees with the target under either is equivalent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogReading {
    /// The homomorphism into the `q`-component: identities through the log
    /// (`m + log(Σ exp(s − m)) = log(Σ exp(s))`), at the price of results known mod q only,
    /// whose products with `exp` results are opaque (`(e / s) · log(p) ≠ (e · log(p)) / s`).
    Homomorphism,
    /// A consistent uninterpreted function of the argument, known in both components: no
    /// identity through the log, all of them around it.
    Opaque,
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
        Keys {
            exp_nested: k(1),
            log: k(2),
            sqrt: k(3),
            sigmoid: k(4),
            gelu: k(5),
            order: k(6),
            log_reading: LogReading::Homomorphism,
        }
    }

    /// The same keys with `log` read as `reading`.
    pub fn reading_log(self, reading: LogReading) -> Keys {
        Keys { log_reading: reading, ..self }
    }

    /// `exp`: the homomorphism on a known `q`-component, an uninterpreted function otherwise.
    pub fn exp(&self, x: Fp) -> Fp {
        if x.q_known() {
            Fp { p: pow_g(x.q), q: UNKNOWN }
        } else {
            // exp is never zero, so its uninterpreted image avoids zero too.
            let h = mix(self.exp_nested, x.known_part());
            Fp { p: (h % (u64::from(P) - 1)) as u32 + 1, q: UNKNOWN }
        }
    }

    /// `log`: under [`LogReading::Homomorphism`], the homomorphism into the `q`-component on a
    /// known `p`-component, an uninterpreted function otherwise; under
    /// [`LogReading::Opaque`], always the uninterpreted function. The log of zero is `-inf`;
    /// a `p`-component that is zero by chance, with a nonzero `q`, makes the trial
    /// inconclusive.
    pub fn log(&self, x: Fp) -> Result<Fp, ZeroDivisor> {
        if x.is_zero() {
            Ok(Fp::NEG_INF)
        } else if !x.p_known() || self.log_reading == LogReading::Opaque {
            Ok(self.apply(Uninterpreted::Log, x))
        } else if x.p == 0 {
            Err(ZeroDivisor)
        } else {
            Ok(Fp { p: P_UNKNOWN, q: log_abs(x.p) })
        }
    }

    /// A consistent uninterpreted function of the known component.
    pub fn apply(&self, f: Uninterpreted, x: Fp) -> Fp {
        let key = match f {
            Uninterpreted::Log => self.log,
            Uninterpreted::Sqrt => self.sqrt,
            Uninterpreted::Sigmoid => self.sigmoid,
            Uninterpreted::Gelu => self.gelu,
        };
        let h = mix(key, x.known_part());
        let q = if x.q_known() { (mix(key ^ 0xa5a5, h) % u64::from(Q)) as u32 } else { UNKNOWN };
        Fp { p: (h % u64::from(P)) as u32, q }
    }

    /// The rank of a value in this trial's random total order, used by `max`: a selection
    /// function with a total order is associative, commutative and idempotent, so a maximum
    /// over a row equals the maximum of the maxima of any partition of the row.
    pub fn rank(&self, x: Fp) -> (u64, u32) {
        (mix(self.order, x.known_part()), x.p)
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

/// True when a candidate's value `a` agrees with the target's `b`: equal components where
/// both know them, and at least one component known to both (a `log` result, known only mod
/// q, says nothing about an `exp` result, known only mod p). Where the target is undefined
/// ([`Fp::POISON`]) any value agrees; an undefined candidate agrees with nothing else.
pub fn agree(a: Fp, b: Fp) -> bool {
    if b.is_poison() {
        return true;
    }
    let p = a.p_known() && b.p_known();
    let q = a.q_known() && b.q_known();
    (p || q) && (!p || a.p == b.p) && (!q || a.q == b.q)
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
    fn the_discrete_log_inverts_the_powers_of_g() {
        let mut rng = crate::reference::Rng::new(23);
        // The ends of the range and of the baby-step table, then random exponents.
        let edges = [0, 1, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, Q - 1];
        for t in edges.into_iter().chain((0..200).map(|_| rng.below(u64::from(Q)) as u32)) {
            assert_eq!(dlog_g(pow_g(t)), t, "t = {t}");
            // Remembered answers are the same answers.
            assert_eq!(dlog_g(pow_g(t)), t, "t = {t}, again");
        }
    }

    #[test]
    fn log_is_a_homomorphism_into_the_q_component() {
        let keys = Keys::new(7);
        let mut rng = crate::reference::Rng::new(4);
        for _ in 0..50 {
            let (a, b) = (random(&mut rng), random(&mut rng));
            // log(exp(a)) = a, known mod q only.
            let back = keys.log(keys.exp(a)).unwrap();
            assert!(!back.p_known() && back.q_known());
            assert_eq!(back.q, a.q);
            assert!(agree(back, a) && agree(a, back));
            // log(a · b) = log(a) + log(b), log(1 / a) = −log(a), log(−a) = log(a).
            let (la, lb) = (keys.log(a).unwrap(), keys.log(b).unwrap());
            assert!(agree(keys.log(a * b).unwrap(), la + lb));
            assert!(agree(keys.log(a.inv().unwrap()).unwrap(), -la));
            assert!(agree(keys.log(-a).unwrap(), la));
            assert!(!agree(la, lb));
        }
        assert_eq!(keys.log(Fp::ZERO), Ok(Fp::NEG_INF));
        assert_eq!(keys.log(Fp::ONE).unwrap().q, 0);
        // A zero p-component by chance, under a nonzero q, has no log: the trial is redrawn.
        assert_eq!(keys.log(Fp { p: 0, q: 5 }), Err(ZeroDivisor));
    }

    #[test]
    fn a_log_sum_exp_agrees_with_its_stabilized_form() {
        // m + log(Σ exp(s − m)) = log(Σ exp(s)) for any m: what a user's max subtraction in a
        // log-sum-exp relies on. The sums are known mod p only, the logs mod q only.
        let keys = Keys::new(13);
        let mut rng = crate::reference::Rng::new(8);
        for _ in 0..20 {
            let s: Vec<Fp> = (0..7).map(|_| random(&mut rng)).collect();
            let m = random(&mut rng);
            let sum = |shift: Fp| s.iter().map(|&x| keys.exp(x - shift)).reduce(|a, b| a + b).unwrap();
            let plain = keys.log(sum(Fp::ZERO)).unwrap();
            let stable = m + keys.log(sum(m)).unwrap();
            assert!(agree(stable, plain) && agree(plain, stable));
            // Without the shift added back, they differ.
            assert!(!agree(keys.log(sum(m)).unwrap(), plain));
        }
    }

    #[test]
    fn a_value_known_in_neither_component_is_an_opaque_function_of_its_operands() {
        let keys = Keys::new(19);
        let mut rng = crate::reference::Rng::new(6);
        let (a, b, c) = (random(&mut rng), random(&mut rng), random(&mut rng));
        let (e, l) = (keys.exp(a), keys.log(b).unwrap());
        // An exp result is known mod p only, a log result mod q only: they share nothing to
        // compare, so they do not agree, even though nothing tells them apart.
        assert!(!agree(e, l) && !agree(l, e));
        // Their product and sum are known mod p (uninterpreted), commute, and depend on both.
        let (prod, sum) = (e * l, e + l);
        assert!(prod.p_known() && !prod.q_known() && sum.p_known() && prod != sum);
        assert_eq!(prod, l * e);
        assert_eq!(sum, l + e);
        assert_ne!(prod, keys.exp(c) * l);
        assert_ne!(prod, e * keys.log(c).unwrap());
        // Read as a random function, a log is known in both components, and the products
        // around it are ring products again.
        let opaque = keys.reading_log(LogReading::Opaque);
        let lo = opaque.log(b).unwrap();
        assert!(lo.p_known() && lo.q_known());
        assert_eq!(e * lo * e, e * (lo * e));
        // A function of a log result is a function of its q-component.
        let (sq, sq2) = (keys.apply(Uninterpreted::Sqrt, l), keys.apply(Uninterpreted::Sqrt, keys.log(c).unwrap()));
        assert!(sq.p_known() && sq != sq2);
        assert_ne!(keys.rank(l), keys.rank(keys.log(c).unwrap()));
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
