//! The f64 reference interpreter: the executable specification of a graph.
//!
//! Every op is evaluated exactly as its definition says, in double precision, with no
//! reassociation and no stabilization: `softmax` is `exp(x) / sum(exp(x))` literally. Later
//! stages (the itGraph interpreter, the host emulation of generated CUDA) are checked against
//! it. A `split` is evaluated only when its count divides the axis; ragged splits exist only
//! inside schedules, which are always checked against the original, unsplit graph.

mod random;

pub use random::{random_inputs, InputScale, Rng};

use crate::graph::{Bindings, Graph, NodeId, Op, ReduceOp, ValidGraph};

/// A dense row-major tensor of f64.
#[derive(Clone, PartialEq, Debug)]
pub struct Tensor {
    /// Extents, outermost first.
    pub shape: Vec<usize>,
    /// Elements in row-major order.
    pub data: Vec<f64>,
}

impl Tensor {
    /// A tensor filled with `value`.
    pub fn full(shape: Vec<usize>, value: f64) -> Tensor {
        let n = shape.iter().product();
        Tensor { shape, data: vec![value; n] }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Row-major strides.
    pub fn strides(&self) -> Vec<usize> {
        strides(&self.shape)
    }
}

/// Row-major strides of a shape.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
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
    let g: &Graph = graph;
    if inputs.len() != g.inputs.len() {
        return Err(RefError::InputCount { want: g.inputs.len(), got: inputs.len() });
    }
    let mut values: Vec<Tensor> = Vec::with_capacity(g.nodes.len());
    for id in g.ids() {
        let node = g.node(id);
        let shape = bindings.extents(&node.shape);
        let elems: usize = shape.iter().product();
        if elems > MAX_ELEMS {
            return Err(RefError::TooLarge(elems));
        }
        let arg = |i: usize| &values[node.args[i].index()];
        let t = match node.op {
            Op::Input(k) => {
                let t = &inputs[k as usize];
                if t.shape != shape {
                    return Err(RefError::InputShape {
                        name: g.inputs[k as usize].decl.name.clone(),
                        want: shape,
                        got: t.shape.clone(),
                    });
                }
                t.clone()
            }
            Op::Const(c) => Tensor { shape: Vec::new(), data: vec![c] },
            Op::Unary(u) => Tensor { shape, data: arg(0).data.iter().map(|&x| u.eval(x)).collect() },
            Op::Binary(b) => {
                let (x, y) = (arg(0), arg(1));
                let xi = broadcast_index(&x.shape, &shape);
                let yi = broadcast_index(&y.shape, &shape);
                let data = (0..elems).map(|i| b.eval(x.data[xi(i)], y.data[yi(i)])).collect();
                Tensor { shape, data }
            }
            Op::Transpose => transpose(arg(0)),
            Op::MatMul => matmul(arg(0), arg(1), &shape),
            Op::Reduce(r, axis) => reduce(arg(0), r, axis as usize),
            Op::Split(axis) => split(arg(0), axis as usize, &shape)?,
        };
        debug_assert_eq!(t.shape, bindings.extents(&node.shape), "node {id:?}");
        values.push(t);
    }
    Ok(values)
}

/// Maps a linear index of `out` to the linear index of a broadcast operand of shape `x`.
fn broadcast_index(x: &[usize], out: &[usize]) -> impl Fn(usize) -> usize {
    let rank = out.len();
    let xs = strides(x);
    let os = strides(out);
    // Per output axis: the operand stride, or 0 where the operand broadcasts or lacks the axis.
    let eff: Vec<usize> = (0..rank)
        .map(|i| {
            let off = rank - x.len();
            if i < off || x[i - off] == 1 {
                0
            } else {
                xs[i - off]
            }
        })
        .collect();
    move |mut lin| {
        let mut idx = 0;
        for (a, &os_a) in os.iter().enumerate() {
            let c = lin / os_a;
            lin %= os_a;
            idx += c * eff[a];
        }
        idx
    }
}

fn transpose(x: &Tensor) -> Tensor {
    let r = x.shape.len();
    let mut shape = x.shape.clone();
    shape.swap(r - 1, r - 2);
    let (rows, cols) = (x.shape[r - 2], x.shape[r - 1]);
    let batch: usize = x.shape[..r - 2].iter().product();
    let mut data = vec![0.0; x.len()];
    for b in 0..batch {
        for i in 0..rows {
            for j in 0..cols {
                data[b * rows * cols + j * rows + i] = x.data[b * rows * cols + i * cols + j];
            }
        }
    }
    Tensor { shape, data }
}

fn matmul(a: &Tensor, b: &Tensor, out_shape: &[usize]) -> Tensor {
    let r = out_shape.len();
    let (m, n) = (out_shape[r - 2], out_shape[r - 1]);
    let k = a.shape[a.shape.len() - 1];
    let batch_shape = &out_shape[..r - 2];
    let nb: usize = batch_shape.iter().product();
    let a_batch = &a.shape[..a.shape.len() - 2];
    let b_batch = &b.shape[..b.shape.len() - 2];
    let ai = broadcast_index(a_batch, batch_shape);
    let bi = broadcast_index(b_batch, batch_shape);
    let mut data = vec![0.0; nb * m * n];
    for bt in 0..nb {
        let ao = ai(bt) * m * k;
        let bo = bi(bt) * k * n;
        // i-p-j order walks B and the result row by row: the same sums, cache-friendly.
        for i in 0..m {
            let out = &mut data[bt * m * n + i * n..bt * m * n + (i + 1) * n];
            for p in 0..k {
                let x = a.data[ao + i * k + p];
                let row = &b.data[bo + p * n..bo + (p + 1) * n];
                for (o, y) in out.iter_mut().zip(row) {
                    *o += x * y;
                }
            }
        }
    }
    Tensor { shape: out_shape.to_vec(), data }
}

fn reduce(x: &Tensor, r: ReduceOp, axis: usize) -> Tensor {
    let outer: usize = x.shape[..axis].iter().product();
    let len = x.shape[axis];
    let inner: usize = x.shape[axis + 1..].iter().product();
    let mut shape = x.shape.clone();
    shape[axis] = 1;
    let mut data = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let it = (0..len).map(|k| x.data[(o * len + k) * inner + i]);
            data.push(match r {
                ReduceOp::Sum => it.sum(),
                ReduceOp::Mean => it.sum::<f64>() / len as f64,
                ReduceOp::Max => it.fold(f64::NEG_INFINITY, f64::max),
            });
        }
    }
    Tensor { shape, data }
}

fn split(x: &Tensor, axis: usize, out_shape: &[usize]) -> Result<Tensor, RefError> {
    let (count, chunk) = (out_shape[0], out_shape[axis + 1]);
    let extent = x.shape[axis];
    if count * chunk != extent {
        return Err(RefError::RaggedSplit { count, extent });
    }
    let outer: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis + 1..].iter().product();
    let mut data = Vec::with_capacity(x.len());
    for j in 0..count {
        for o in 0..outer {
            for c in 0..chunk {
                let src = (o * extent + j * chunk + c) * inner;
                data.extend_from_slice(&x.data[src..src + inner]);
            }
        }
    }
    Ok(Tensor { shape: out_shape.to_vec(), data })
}

/// The reference value of one node, for tests and diagnostics.
pub fn eval_node(graph: &ValidGraph, bindings: &Bindings, inputs: &[Tensor], node: NodeId) -> Result<Tensor, RefError> {
    Ok(eval_nodes(graph, bindings, inputs)?.swap_remove(node.index()))
}

/// Error metric used to compare a computed tensor with the reference: the largest elementwise
/// error relative to the reference's magnitude at that element, with a floor of
/// `0.1 × rms(reference)` so that elements that are zero up to cancellation are judged on an
/// absolute scale. Non-finite computed values make the error infinite; a non-finite reference
/// makes it NaN (the inputs overflowed the specification itself, and `NaN <= tol` fails).
pub fn max_rel_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "compared tensors differ in length");
    if want.is_empty() {
        return 0.0;
    }
    if want.iter().any(|w| !w.is_finite()) {
        return f64::NAN;
    }
    let rms = (want.iter().map(|x| x * x).sum::<f64>() / want.len() as f64).sqrt();
    let floor = (0.1 * rms).max(f64::MIN_POSITIVE);
    let mut worst: f64 = 0.0;
    for (g, w) in got.iter().zip(want) {
        if !g.is_finite() {
            return f64::INFINITY;
        }
        worst = worst.max((g - w).abs() / w.abs().max(floor));
    }
    worst
}
