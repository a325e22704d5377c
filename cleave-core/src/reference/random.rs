//! Seeded random inputs: the same seed always gives the same tensors, and values are rounded
//! to the input's dtype so the reference sees exactly what a kernel sees.

use super::{buffer_shape, Tensor};
use crate::graph::{Bindings, Dim, DimVar, PerRequestKind, StoreAxis, ValidGraph};

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

/// The extents a random workload's requests must have, by per-request dim: request `b` of
/// `dim` gets `lengths[b]`. Dims not listed are drawn.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Requests(pub Vec<(DimVar, Vec<u64>)>);

/// A random workload for a graph with layouts: its index tables, valid and shuffled, and its
/// value buffers (storage shape, row-major), in graph input order.
///
/// Each per-request dim's extents are `requests`' or drawn in `0..=2 · value` (its value in
/// `bindings`, so that some requests are empty and lengths are rarely multiples of a tile). A
/// ragged dim's rows are packed in order with 3 spare rows at the end; a paged dim's pages are
/// a random sample of a pool 5 pages larger than it needs, each request's in shuffled order,
/// and its table has 2 spare entries past the last request's. The dims those imply (the packed
/// axis' extent, the table's length, the pool's size) are written into `bindings`.
pub fn random_buffers(
    graph: &ValidGraph,
    bindings: &mut Bindings,
    seed: u64,
    scale: &InputScale,
    requests: &Requests,
) -> Vec<Tensor> {
    let mut rng = Rng::new(seed ^ 0x7ab1e5);
    let g = &graph;
    let mut tables: Vec<Option<Tensor>> = vec![None; g.inputs.len()];
    for (v, info) in g.dims.iter() {
        let Some(pr) = &info.per_request else { continue };
        let n = bindings.extent(Dim::Var(pr.batch));
        let rep = bindings.values[v.index()].max(1);
        let mut lens: Vec<u64> = match requests.0.iter().find(|(d, _)| *d == v) {
            Some((_, l)) => l.clone(),
            None => (0..n).map(|_| rng.below(2 * rep + 1)).collect(),
        };
        lens.resize(n, 0);
        let prefix = |sizes: &[u64]| -> Vec<f64> {
            let mut acc = 0u64;
            std::iter::once(0.0)
                .chain(sizes.iter().map(|s| {
                    acc += s;
                    acc as f64
                }))
                .collect()
        };
        match &pr.kind {
            PerRequestKind::Ragged { indptr, total } => {
                let p = prefix(&lens);
                if let Some(t) = total {
                    bindings.values[t.index()] = p[n] as u64 + 3;
                }
                tables[indptr.input as usize] = Some(Tensor { shape: vec![n + 1], data: p });
            }
            PerRequestKind::Paged { indptr, indices, page_size, last_page_len } => {
                let ps = *page_size;
                let pages: Vec<u64> = lens.iter().map(|l| l.div_ceil(ps)).collect();
                let used: u64 = pages.iter().sum();
                let pool = used + 5;
                let nnz = used + 2;
                // A random injective draw of the pool's pages for the requests' entries.
                let mut order: Vec<u64> = (0..pool).collect();
                for i in (1..order.len()).rev() {
                    let j = rng.below(i as u64 + 1) as usize;
                    order.swap(i, j);
                }
                let mut idx: Vec<f64> = order[..used as usize].iter().map(|p| *p as f64).collect();
                idx.extend((0..nnz - used).map(|_| rng.below(pool) as f64));
                tables[indptr.input as usize] = Some(Tensor { shape: vec![n + 1], data: prefix(&pages) });
                tables[indices.input as usize] = Some(Tensor { shape: vec![nnz as usize], data: idx });
                bindings.values[indices.len.index()] = nnz;
                for i in &g.inputs {
                    for a in i.decl.layout.iter().flat_map(|l| &l.axes) {
                        if let StoreAxis::Pages { pages: d, paged } = a {
                            if *paged == v {
                                bindings.values[d.index()] = pool;
                            }
                        }
                    }
                }
                if let Some(l) = last_page_len {
                    let last = lens.iter().zip(&pages).map(|(len, p)| if *p == 0 { 1 } else { len - (p - 1) * ps });
                    tables[l.input as usize] = Some(Tensor { shape: vec![n], data: last.map(|x| x as f64).collect() });
                }
            }
        }
    }
    bindings.complete(&g.dims);
    g.inputs
        .iter()
        .zip(tables)
        .map(|(input, table)| match table {
            Some(t) => t,
            None => {
                let shape = buffer_shape(&input.decl, bindings);
                let n: usize = shape.iter().product();
                let std = scale.of(&input.decl.name);
                let data = (0..n).map(|_| input.decl.dtype.round(std * rng.normal())).collect();
                Tensor { shape, data }
            }
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
