//! The f64 reference interpreter: the executable specification of a graph.
//!
//! Every op is evaluated exactly as its definition says, with f64 precision and no
//! reassociation and no stabilization: `softmax` is `exp(x) / sum(exp(x))` literally. Values
//! are [`X64`]s, f64 mantissas with an unbounded exponent, so `exp(800)` and sums of such
//! terms are finite and exact to f64 precision: a test at large magnitudes compares against
//! the true values, and nothing here depends on how the scheduler stabilizes. Later stages (the
//! tile interpreter, the host emulation of generated CUDA) are checked against it. A `split` is
//! evaluated only when its count divides the axis; ragged splits exist only inside schedules,
//! which are always checked against the original, unsplit graph.

mod buffers;
mod random;

use std::convert::Infallible;

use crate::xfloat::X64;

pub use buffers::{buffer_shape, eval_buffers, Evaluated};
pub use random::{random_buffers, random_inputs, InputScale, Requests, Rng};

pub use crate::eval::strides;
use crate::eval::{eval_into, Dense, Domain, EvalError};
use crate::graph::{BinaryOp, Bindings, Graph, NodeId, ReduceOp, UnaryOp, ValidGraph};

/// A dense row-major tensor of f64.
pub type Tensor = Dense<f64>;

/// The real numbers, with f64 precision and no exponent limit: every op exactly as its
/// definition says.
struct Real;

impl Domain for Real {
    type Value = X64;
    type Error = Infallible;

    fn constant(&self, c: f64) -> Result<X64, Infallible> {
        Ok(X64::from_f64(c))
    }

    fn count(&self, n: usize) -> Result<X64, Infallible> {
        Ok(X64::from_f64(n as f64))
    }

    fn zero(&self) -> X64 {
        X64::zero()
    }

    fn unary(&self, op: UnaryOp, x: X64) -> Result<X64, Infallible> {
        let one = X64::one();
        Ok(match op {
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => one / x.sqrt(),
            UnaryOp::Square => x * x,
            UnaryOp::Recip => one / x,
            UnaryOp::Silu => x.silu(),
            UnaryOp::Sigmoid => x.sigmoid(),
            UnaryOp::Gelu => x.gelu(),
            UnaryOp::Neg => -x,
        })
    }

    fn binary(&self, op: BinaryOp, x: X64, y: X64) -> Result<X64, Infallible> {
        Ok(match op {
            BinaryOp::Add => x + y,
            BinaryOp::Sub => x - y,
            BinaryOp::Mul => x * y,
            BinaryOp::Div => divide(x, y),
            BinaryOp::Max => x.max(y),
        })
    }

    fn mul_add(&self, acc: X64, x: X64, y: X64) -> X64 {
        acc + x * y
    }

    fn reduce_start(&self, op: ReduceOp) -> Option<X64> {
        Some(if op == ReduceOp::Max { X64::from_f64(f64::NEG_INFINITY) } else { X64::zero() })
    }

    fn neg_inf(&self) -> X64 {
        X64::from_f64(f64::NEG_INFINITY)
    }

    /// Plain f64 arithmetic where it rounds as X64 does (every operand zero or of moderate
    /// magnitude, see [`X64::to_f64_if_moderate`]): the same values, bit for bit, many times
    /// faster than stepping through X64 sums. The reference spends most of its time in matmuls.
    fn matmul_fast(&self, a: &[X64], b: &[X64], m: usize, k: usize, n: usize) -> Option<Vec<X64>> {
        let a: Vec<f64> = a.iter().map(|v| v.to_f64_if_moderate()).collect::<Option<_>>()?;
        let b: Vec<f64> = b.iter().map(|v| v.to_f64_if_moderate()).collect::<Option<_>>()?;
        Some(matmul_f64(&a, &b, m, k, n).into_iter().map(X64::from_f64).collect())
    }
}

/// `a · b` in f64, each element summed from zero in order of `k` (Rust never fuses the
/// multiply and the add, so each step rounds twice, as `acc + x · y` in X64 does).
fn matmul_f64(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for (i, row) in c.chunks_exact_mut(n.max(1)).enumerate().take(m) {
        for p in 0..k {
            let x = a[i * k + p];
            for (acc, &y) in row.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *acc += x * y;
            }
        }
    }
    c
}

/// Division as the language defines it: `0 / 0` is 0, so that a softmax or an attention over
/// a row with nothing unmasked (an empty request, a causal row before its first key) is 0
/// rather than NaN, as attention kernels define it; every other quotient is IEEE's.
pub fn divide(x: X64, y: X64) -> X64 {
    x.quotient(y)
}

/// Why a graph could not be evaluated.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum RefError {
    /// Wrong number of input tensors.
    #[error("expected {want} input tensors, got {got}")]
    InputCount { want: usize, got: usize },
    /// An input tensor whose shape does not match the bindings.
    #[error("input `{name}` has shape {got:?}, expected {want:?}")]
    InputShape { name: String, want: Vec<usize>, got: Vec<usize> },
    /// A split whose count does not divide its axis.
    #[error("split count {count} does not divide the axis extent {extent}")]
    RaggedSplit { count: usize, extent: usize },
    /// The result would be too large to materialize.
    #[error("a tensor of {0} elements is too large for the reference interpreter")]
    TooLarge(usize),
    /// An index tensor that breaks its rules.
    #[error("index tensor {0}")]
    Table(String),
}

/// Largest tensor the interpreter will materialize.
const MAX_ELEMS: usize = 1 << 28;

/// Evaluates the graph's outputs.
pub fn eval(graph: &ValidGraph, bindings: &Bindings, inputs: &[Tensor]) -> Result<Vec<Tensor>, RefError> {
    let values = eval_nodes(graph, bindings, inputs)?;
    Ok(graph.outputs.iter().map(|o| values[o.node.index()].clone()).collect())
}

/// Evaluates every node (outputs of dead nodes included), indexed by [`NodeId::index`].
pub fn eval_nodes(graph: &ValidGraph, bindings: &Bindings, inputs: &[Tensor]) -> Result<Vec<Tensor>, RefError> {
    if inputs.len() != graph.inputs.len() {
        return Err(RefError::InputCount { want: graph.inputs.len(), got: inputs.len() });
    }
    let inputs: Vec<Dense<X64>> = inputs
        .iter()
        .map(|t| Dense { shape: t.shape.clone(), data: t.data.iter().map(|&v| X64::from_f64(v)).collect() })
        .collect();
    let mut values = Vec::with_capacity(graph.nodes.len());
    eval_into(&Real, &graph.nodes, &graph.dims, bindings, &inputs, MAX_ELEMS, &mut values).map_err(|e| match e {
        EvalError::MissingInput(_) => RefError::InputCount { want: graph.inputs.len(), got: inputs.len() },
        EvalError::InputShape { input, want, got } => {
            RefError::InputShape { name: graph.inputs[input].decl.name.clone(), want, got }
        }
        EvalError::RaggedSplit { count, extent } => RefError::RaggedSplit { count, extent },
        EvalError::TooLarge(n) => RefError::TooLarge(n),
        EvalError::Domain(never) => match never {},
    })?;
    Ok(values
        .into_iter()
        .map(|t| Tensor { shape: t.shape, data: t.data.into_iter().map(X64::to_f64).collect() })
        .collect())
}

/// The reference value of one node, for tests and diagnostics.
pub fn eval_node(graph: &ValidGraph, bindings: &Bindings, inputs: &[Tensor], node: NodeId) -> Result<Tensor, RefError> {
    Ok(eval_nodes(graph, bindings, inputs)?.swap_remove(node.index()))
}

/// Unit roundoff of a dtype: half the distance from 1 to the next value (bf16 keeps 8 bits of
/// mantissa, f16 11, f32 24).
pub fn unit_roundoff(d: crate::graph::DType) -> f64 {
    use crate::graph::DType;
    match d {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        DType::F32 => 2f64.powi(-24),
        // Index tensors are never computed with; they lose nothing.
        DType::I32 => 0.0,
    }
}

/// The unit roundoff a kernel computing `g` cannot do better than: that of the least precise
/// type among the outputs and the types a computed matmul operand is rounded to for the tensor
/// cores ([`Graph::rounded_operand_type`]; inputs themselves, seen through transposes and
/// splits, are exact: the reference reads the same rounded values).
pub fn rounding_unit(g: &Graph) -> f64 {
    let mut u = g.outputs.iter().map(|o| unit_roundoff(o.decl.dtype)).fold(0.0, f64::max);
    for id in g.ids() {
        if let Some(t) = g.rounded_operand_type(id) {
            u = u.max(unit_roundoff(t));
        }
    }
    u
}

/// The tolerance on [`max_rel_err`] for a kernel computing `g` at `bindings`, whose exps see
/// arguments up to `max_exp_arg` in magnitude:
///
/// `40 u + 16 u_f32 (sqrt(K) + max |exp argument|)`
///
/// with `u` the [`rounding_unit`] of `g` and `K` the longest reduction. The first term is a few
/// roundings at the output's precision; the second is f32 accumulation, whose error grows with
/// the square root of a reduction's length and is multiplied by an exp by its argument's
/// magnitude.
pub fn tolerance(g: &Graph, bindings: &Bindings, max_exp_arg: f64) -> f64 {
    use crate::graph::Op;
    let u = rounding_unit(g);
    let mut longest = 1usize;
    for n in &g.nodes {
        match n.op {
            Op::MatMul => {
                let k = g.shape(n.args[0]);
                longest = longest.max(bindings.extent(k[k.len() - 1]));
            }
            Op::Reduce(_, axis) => longest = longest.max(bindings.extent(g.shape(n.args[0])[axis as usize])),
            _ => {}
        }
    }
    40.0 * u + 16.0 * unit_roundoff(crate::graph::DType::F32) * ((longest as f64).sqrt() + max_exp_arg.abs())
}

/// Error metric used to compare a computed tensor with the reference: the largest elementwise
/// error relative to the reference's magnitude at that element, with a floor of
/// `0.1 × rms(reference)` so that elements that are zero up to cancellation are judged on an
/// absolute scale. An infinite reference element (a log-sum-exp over a row with nothing
/// unmasked is `-inf`) must be matched exactly and stays out of the scale. Other non-finite
/// computed values make the error infinite; a NaN reference makes it NaN (the inputs overflowed
/// the specification itself, and `NaN <= tol` fails).
pub fn max_rel_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "compared tensors differ in length");
    if want.is_empty() {
        return 0.0;
    }
    if want.iter().any(|w| w.is_nan()) {
        return f64::NAN;
    }
    let finite: Vec<f64> = want.iter().copied().filter(|w| w.is_finite()).collect();
    let rms = (finite.iter().map(|x| x * x).sum::<f64>() / finite.len().max(1) as f64).sqrt();
    let floor = (0.1 * rms).max(f64::MIN_POSITIVE);
    let mut worst: f64 = 0.0;
    for (g, w) in got.iter().zip(want) {
        if w.is_infinite() {
            if g != w {
                return f64::INFINITY;
            }
            continue;
        }
        if !g.is_finite() {
            return f64::INFINITY;
        }
        worst = worst.max((g - w).abs() / w.abs().max(floor));
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random values `± u · 2^e` with `e` uniform in `[-spread, spread]`, one in five zero.
    fn spread(rng: &mut Rng, len: usize, spread: i32) -> Vec<X64> {
        (0..len)
            .map(|_| {
                if rng.below(5) == 0 {
                    return X64::zero();
                }
                let e = rng.below(2 * spread as u64 + 1) as i32 - spread;
                X64::from_f64(rng.normal() * 2f64.powi(e))
            })
            .collect()
    }

    /// The definition, written out apart from the evaluator: X64 products summed in order.
    fn by_elements(a: &[X64], b: &[X64], m: usize, k: usize, n: usize) -> Vec<X64> {
        let mut c = Vec::with_capacity(m * n);
        for i in 0..m {
            for j in 0..n {
                c.push((0..k).fold(X64::zero(), |acc, p| acc + a[i * k + p] * b[p * n + j]));
            }
        }
        c
    }

    #[test]
    fn the_fast_matmul_is_the_element_loop_bit_for_bit() {
        let mut rng = Rng::new(41);
        for (m, k, n) in [(1, 1, 1), (3, 17, 5), (16, 64, 9), (7, 300, 2)] {
            let (a, b) = (spread(&mut rng, m * k, 60), spread(&mut rng, k * n, 60));
            let fast = Real.matmul_fast(&a, &b, m, k, n).expect("moderate operands take the fast path");
            let slow = by_elements(&a, &b, m, k, n);
            for (f, s) in fast.iter().zip(&slow) {
                assert_eq!(f.to_f64().to_bits(), s.to_f64().to_bits(), "{m}x{k}x{n}");
            }
        }
    }

    #[test]
    fn huge_tiny_and_nan_operands_take_the_element_loop() {
        let one = X64::one();
        for odd in [X64::from_f64(2f64.powi(600)), X64::from_f64(2f64.powi(-600)), X64::from_f64(f64::NAN)] {
            assert!(Real.matmul_fast(&[one, odd], &[one, one], 1, 2, 1).is_none());
            assert!(Real.matmul_fast(&[one, one], &[odd, one], 1, 2, 1).is_none());
        }
        assert!(Real.matmul_fast(&[one, X64::zero()], &[one, one], 1, 2, 1).is_some());
    }
}
