//! Seeded random inputs: the same seed always gives the same tensors, and values are rounded
//! to the input's dtype so the reference sees exactly what a kernel sees.

use super::Tensor;
use crate::graph::{Bindings, ValidGraph};

/// A small, fast, seedable generator (xoshiro256**, seeded through splitmix64).
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Rng { s: [next(), next(), next(), next()] }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// How large the random inputs are: each element is `std * N(0, 1)`, per input by name, with a
/// default.
#[derive(Clone, Debug, PartialEq)]
pub struct InputScale {
    /// Standard deviation for inputs not listed.
    pub default: f64,
    /// Per-input standard deviations.
    pub per_input: Vec<(String, f64)>,
}

impl Default for InputScale {
    fn default() -> Self {
        InputScale { default: 1.0, per_input: Vec::new() }
    }
}

impl InputScale {
    fn of(&self, name: &str) -> f64 {
        self.per_input.iter().find(|(n, _)| n == name).map_or(self.default, |p| p.1)
    }
}

/// Random inputs for a graph at the given extents.
pub fn random_inputs(graph: &ValidGraph, bindings: &Bindings, seed: u64, scale: &InputScale) -> Vec<Tensor> {
    let mut rng = Rng::new(seed);
    graph
        .inputs
        .iter()
        .map(|input| {
            let shape = bindings.extents(&input.decl.shape);
            let n: usize = shape.iter().product();
            let std = scale.of(&input.decl.name);
            let data = (0..n).map(|_| input.decl.dtype.round(std * rng.normal())).collect();
            Tensor { shape, data }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn the_generator_is_deterministic_and_roughly_normal() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        assert_eq!(a.next_u64(), b.next_u64());
        let xs: Vec<f64> = (0..20000).map(|_| a.normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.03, "{mean}");
        assert!((var - 1.0).abs() < 0.05, "{var}");
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
        assert!((0..1000).all(|_| a.below(10) < 10));
    }
}
