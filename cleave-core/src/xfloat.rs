//! Floats with an extended exponent: a value is `m · 2^e` with a float mantissa `m` (zero, or
//! of magnitude in [1, 2)) and a 64-bit exponent `e`, so no intermediate ever overflows or
//! underflows where the true value does not.
//!
//! Two instances matter. With an f64 mantissa ([`X64`]) it is the number type of the f64
//! reference: `exp(800)` and a sum of such terms are exact to f64 precision, so a test at large
//! magnitudes compares against finite truth. With an f32 mantissa ([`X32`]) it is the
//! arithmetic of the fallback stage kernels (their CUDA twin is `cleave::xf` in
//! `include/cleave/tile.cuh`, with the same algorithms): f32 precision, no overflow.
//!
//! Every operation rounds once to the mantissa's precision, like the float it extends, except
//! `exp` and `log`, which go through f64 (as the device code does) and are accurate to a few
//! f64 ulps for arguments up to about 10^6.

use std::cmp::Ordering;

use num_traits::Float;

/// A float type that can be a mantissa: exact scaling by powers of two.
pub trait Mantissa: Float {
    /// Bits of precision (f32: 24, f64: 53).
    const BITS: i64;

    /// `(m, e)` with `self = m · 2^e` and `|m|` in [1, 2); zero and non-finite values come
    /// back unchanged with `e = 0`.
    fn split(self) -> (Self, i64);

    /// `self · 2^e`, exactly when the result is representable, saturating to zero or infinity.
    fn scale(self, e: i64) -> Self;

    /// From an f64, rounded to nearest.
    fn of_f64(x: f64) -> Self;

    /// To an f64, exactly.
    fn to_f64_exact(self) -> f64;
}

macro_rules! mantissa {
    ($t:ty, $bits:expr, $ebits:expr, $bias:expr, $ubits:ty) => {
        impl Mantissa for $t {
            const BITS: i64 = $bits;

            fn split(self) -> (Self, i64) {
                if self == 0.0 || !self.is_finite() {
                    return (self, 0);
                }
                let frac_bits = $bits - 1;
                let exp_mask: $ubits = (1 << $ebits) - 1;
                let raw = self.to_bits();
                let biased = ((raw >> frac_bits) & exp_mask) as i64;
                if biased == 0 {
                    // Subnormal: scale into the normal range first.
                    let (m, e) = (self * (2.0 as $t).powi($bits)).split();
                    return (m, e - $bits);
                }
                let e = biased - $bias;
                let m = <$t>::from_bits((raw & !(exp_mask << frac_bits)) | (($bias as $ubits) << frac_bits));
                (m, e)
            }

            fn scale(self, e: i64) -> Self {
                if self == 0.0 || !self.is_finite() {
                    return self;
                }
                // Steps of at most 2^(bias - 1) keep every factor a normal power of two.
                let step: i64 = $bias - 1;
                let mut x = self;
                let mut e = e;
                while e != 0 {
                    let k = e.clamp(-step, step);
                    x *= <$t>::from_bits(((k + $bias) as $ubits) << ($bits - 1));
                    e -= k;
                    if x == 0.0 || !x.is_finite() {
                        break;
                    }
                }
                x
            }

            fn of_f64(x: f64) -> Self {
                x as $t
            }

            fn to_f64_exact(self) -> f64 {
                f64::from(self)
            }
        }
    };
}

mantissa!(f32, 24, 8, 127, u32);
mantissa!(f64, 53, 11, 1023, u64);

/// `m · 2^e`; see the module documentation.
#[derive(Clone, Copy, Debug)]
pub struct XFloat<F> {
    m: F,
    e: i64,
}

/// The reference interpreter's numbers.
pub type X64 = XFloat<f64>;
/// The fallback kernels' numbers.
pub type X32 = XFloat<f32>;

/// Exponents saturate here: far beyond any value a graph can mean, and far from `i64` overflow
/// when two are added.
const E_LIMIT: i64 = 1 << 40;

impl<F: Mantissa> XFloat<F> {
    /// Zero.
    pub fn zero() -> Self {
        XFloat { m: F::zero(), e: 0 }
    }

    /// One.
    pub fn one() -> Self {
        XFloat { m: F::one(), e: 0 }
    }

    fn norm(m: F, e: i64) -> Self {
        let (m, k) = m.split();
        if m == F::zero() || !m.is_finite() {
            return XFloat { m, e: 0 };
        }
        let e = e + k;
        if e > E_LIMIT {
            XFloat { m: F::infinity().copysign(m), e: 0 }
        } else if e < -E_LIMIT {
            XFloat { m: F::zero().copysign(m), e: 0 }
        } else {
            XFloat { m, e }
        }
    }

    /// The value of a float.
    pub fn from_float(x: F) -> Self {
        Self::norm(x, 0)
    }

    /// The value of an f64, rounded to the mantissa.
    pub fn from_f64(x: f64) -> Self {
        // Split first so that an f64 outside the mantissa type's range keeps its magnitude.
        let (m, e) = x.split();
        Self::norm(F::of_f64(m), e)
    }

    /// The nearest f64 (zero or infinite beyond its range).
    pub fn to_f64(self) -> f64 {
        self.m.to_f64_exact().scale(self.e)
    }

    /// The value as an f64 when it is zero or of magnitude in [2^-400, 2^400). Products of two
    /// such values lie in [2^-800, 2^800), and sums of those products are zero or multiples of
    /// 2^-852: all normal f64s far from overflow, where f64 arithmetic rounds exactly as this
    /// type's does. `None` for every other value (huge, tiny, infinite or NaN).
    pub fn to_f64_if_moderate(self) -> Option<f64> {
        let moderate = self.m == F::zero() || (self.m.is_finite() && (-400..400).contains(&self.e));
        moderate.then(|| self.to_f64())
    }

    /// The nearest value of the mantissa type.
    pub fn to_float(self) -> F {
        self.m.scale(self.e)
    }

    /// True for NaN.
    pub fn is_nan(self) -> bool {
        self.m.is_nan()
    }

    /// True for zero (of either sign).
    pub fn is_zero(self) -> bool {
        self.m == F::zero()
    }

    /// The language's quotient: IEEE's, except that `0 / 0` is 0 (a softmax or an attention
    /// over a row with nothing unmasked is 0, as attention kernels define it).
    pub fn quotient(self, o: Self) -> Self {
        if self.is_zero() && o.is_zero() {
            Self::zero()
        } else {
            self / o
        }
    }

    fn sum(self, o: Self) -> Self {
        if !self.m.is_finite() || !o.m.is_finite() {
            return XFloat { m: self.m + o.m, e: 0 };
        }
        if o.m == F::zero() {
            return if self.m == F::zero() { XFloat { m: self.m + o.m, e: 0 } } else { self };
        }
        if self.m == F::zero() {
            return o;
        }
        let (big, small) = if self.e >= o.e { (self, o) } else { (o, self) };
        let d = big.e - small.e;
        if d > F::BITS + 2 {
            // The smaller term is below half an ulp of the larger: the sum rounds to it.
            return big;
        }
        Self::norm(big.m + small.m.scale(-d), big.e)
    }

    /// The larger; a NaN operand is ignored, as `fmaxf` does.
    pub fn max(self, o: Self) -> Self {
        if self.is_nan() {
            return o;
        }
        if o.is_nan() {
            return self;
        }
        if self.cmp_finite(o) == Ordering::Less {
            o
        } else {
            self
        }
    }

    fn cmp_finite(self, o: Self) -> Ordering {
        let sign = |x: F| {
            if x > F::zero() {
                1
            } else if x < F::zero() {
                -1
            } else {
                0
            }
        };
        let (sa, sb) = (sign(self.m), sign(o.m));
        if sa != sb {
            return sa.cmp(&sb);
        }
        if sa == 0 {
            return Ordering::Equal;
        }
        if !self.m.is_finite() || !o.m.is_finite() {
            return self.m.partial_cmp(&o.m).unwrap_or(Ordering::Equal);
        }
        let mag = self.e.cmp(&o.e).then(self.m.abs().partial_cmp(&o.m.abs()).unwrap_or(Ordering::Equal));
        if sa > 0 {
            mag
        } else {
            mag.reverse()
        }
    }

    /// `e^x`.
    pub fn exp(self) -> Self {
        if self.is_nan() {
            return self;
        }
        let x = self.to_f64();
        // Beyond |x| = 2^50 the result is far outside any exponent (and x·log2(e) loses its
        // fraction); saturate.
        if x > 1.0e15 {
            return XFloat { m: F::infinity(), e: 0 };
        }
        if x < -1.0e15 {
            return Self::zero();
        }
        // Within f64's own range its exp is the most accurate there is.
        if x.abs() < 700.0 {
            return Self::from_f64(x.exp());
        }
        // Beyond: x = n ln2 + r with |r| <= ln2 / 2, ln2 in two parts (Cody and Waite) so that
        // n ln2 is exact for |n| < 2^21 and e^r keeps f64 precision.
        const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
        const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
        let n = (x * std::f64::consts::LOG2_E).round();
        let r = (x - n * LN2_HI) - n * LN2_LO;
        Self::norm(F::of_f64(r.exp()), n as i64)
    }

    /// The natural logarithm.
    pub fn ln(self) -> Self {
        if self.m <= F::zero() || !self.m.is_finite() {
            return XFloat { m: self.m.ln(), e: 0 };
        }
        Self::from_f64(self.m.to_f64_exact().ln() + self.e as f64 * std::f64::consts::LN_2)
    }

    /// The square root.
    pub fn sqrt(self) -> Self {
        if self.m <= F::zero() || !self.m.is_finite() {
            return XFloat { m: self.m.sqrt(), e: 0 };
        }
        let (m, e) = if self.e % 2 != 0 { (self.m + self.m, self.e - 1) } else { (self.m, self.e) };
        Self::norm(m.sqrt(), e / 2)
    }

    /// `1 / (1 + e^-x)`.
    pub fn sigmoid(self) -> Self {
        Self::one() / (Self::one() + (-self).exp())
    }

    /// `x / (1 + e^-x)`.
    pub fn silu(self) -> Self {
        self / (Self::one() + (-self).exp())
    }

    /// `0.5 x (1 + erf(x / √2))`, the exact form.
    pub fn gelu(self) -> Self {
        // erf saturates to ±1 long before f64 runs out: evaluate it on the clamped value.
        let x = self.to_f64().clamp(-30.0, 30.0);
        let erf = crate::graph::erf(x / std::f64::consts::SQRT_2);
        Self::from_f64(0.5) * self * Self::from_f64(1.0 + erf)
    }
}

impl<F: Mantissa> std::ops::Neg for XFloat<F> {
    type Output = Self;
    fn neg(self) -> Self {
        XFloat { m: -self.m, e: self.e }
    }
}

impl<F: Mantissa> std::ops::Add for XFloat<F> {
    type Output = Self;
    fn add(self, o: Self) -> Self {
        self.sum(o)
    }
}

impl<F: Mantissa> std::ops::Sub for XFloat<F> {
    type Output = Self;
    fn sub(self, o: Self) -> Self {
        self.sum(-o)
    }
}

impl<F: Mantissa> std::ops::Mul for XFloat<F> {
    type Output = Self;
    fn mul(self, o: Self) -> Self {
        Self::norm(self.m * o.m, self.e + o.e)
    }
}

impl<F: Mantissa> std::ops::Div for XFloat<F> {
    type Output = Self;
    fn div(self, o: Self) -> Self {
        Self::norm(self.m / o.m, self.e - o.e)
    }
}

impl<F: Mantissa> PartialEq for XFloat<F> {
    fn eq(&self, o: &Self) -> bool {
        !self.is_nan() && !o.is_nan() && self.cmp_finite(*o) == Ordering::Equal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x64(v: f64) -> X64 {
        X64::from_f64(v)
    }

    #[test]
    fn split_and_scale_are_exact() {
        for v in [1.0f64, -3.5, 1e-310, 6.02e23, f64::MIN_POSITIVE, 0.1] {
            let (m, e) = v.split();
            assert!((1.0..2.0).contains(&m.abs()), "{v}");
            assert_eq!(m.scale(e), v);
        }
        for v in [1.0f32, -3.5, 1e-40, 3.4e38, 0.1] {
            let (m, e) = v.split();
            assert!((1.0..2.0).contains(&m.abs()), "{v}");
            assert_eq!(m.scale(e), v);
        }
        assert_eq!(1.0f32.scale(200), f32::INFINITY);
        assert_eq!(1.0f32.scale(-200), 0.0);
    }

    #[test]
    fn arithmetic_matches_the_float_where_it_is_in_range() {
        let vals = [0.0, 1.0, -2.5, 3.0e10, -7.25e-5, 123.456, 1e300];
        for &a in &vals {
            for &b in &vals {
                let (xa, xb) = (x64(a), x64(b));
                assert_eq!((xa + xb).to_f64(), a + b, "{a} + {b}");
                assert_eq!((xa - xb).to_f64(), a - b, "{a} - {b}");
                if (a * b).is_finite() {
                    assert_eq!((xa * xb).to_f64(), a * b, "{a} * {b}");
                }
                if b != 0.0 {
                    assert_eq!((xa / xb).to_f64(), a / b, "{a} / {b}");
                }
                assert_eq!(xa.max(xb).to_f64(), a.max(b), "max {a} {b}");
            }
        }
        let f = |v: f32| X32::from_float(v);
        assert_eq!((f(1.5) + f(1e-3)).to_float(), 1.5f32 + 1e-3);
        assert_eq!((f(3.0) * f(7.0)).to_float(), 21.0);
    }

    #[test]
    fn values_beyond_the_float_range_stay_exact() {
        // exp(800) / (exp(800) + exp(799)) = 1 / (1 + 1/e).
        let a = x64(800.0).exp();
        let b = x64(799.0).exp();
        let r = (a / (a + b)).to_f64();
        let want = 1.0 / (1.0 + (-1.0f64).exp());
        assert!((r - want).abs() < 4e-16, "{r} {want}");
        // ln(exp(5000)) = 5000, and the same through an f32 mantissa.
        assert!((x64(5000.0).exp().ln().to_f64() - 5000.0).abs() < 1e-9);
        let big = X32::from_float(300.0).exp();
        assert_eq!(big.to_float(), f32::INFINITY);
        assert!((big.ln().to_float() - 300.0).abs() < 1e-4);
        assert!(((big / (big + big)).to_float() - 0.5).abs() < 1e-7);
        // A tiny term below the larger one's ulp leaves it unchanged; zero stays zero.
        assert_eq!((x64(1.0) + x64(1e-30)).to_f64(), 1.0);
        assert_eq!((x64(-800.0).exp() * x64(0.0)).to_f64(), 0.0);
    }

    #[test]
    fn special_values_behave_like_floats() {
        assert!((x64(0.0) / x64(0.0)).is_nan());
        assert_eq!((x64(1.0) / x64(0.0)).to_f64(), f64::INFINITY);
        assert!(x64(-1.0).ln().is_nan());
        assert_eq!(x64(0.0).ln().to_f64(), f64::NEG_INFINITY);
        assert!(x64(-4.0).sqrt().is_nan());
        assert_eq!(x64(f64::NAN).max(x64(3.0)).to_f64(), 3.0);
        assert_eq!(x64(-1e200).max(x64(-1e300)).to_f64(), -1e200);
        assert_eq!(x64(1e18).exp().to_f64(), f64::INFINITY);
        assert_eq!(x64(-1e18).exp().to_f64(), 0.0);
        assert!((x64(8.0).sqrt().to_f64() - 8f64.sqrt()).abs() < 1e-15);
        assert!((x64(-50.0).sigmoid().to_f64() - 1.928749847963918e-22).abs() < 1e-35);
        assert!((x64(1.0).gelu().to_f64() - 0.841_344_746_068_542_9).abs() < 1e-14);
    }
}
