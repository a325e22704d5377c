//! One evaluator of graphs, generic over the domain of values.
//!
//! The shape semantics of every op (broadcasting, batched matmul, keep-dim reductions,
//! transpose, split) are written once, here. What a value is and how the scalar operations act
//! on it is the [`Domain`]'s: real numbers in f64 for the reference interpreter
//! ([`crate::reference`]), and the finite ring of the search's fingerprints. So the executable
//! specification and the equivalence check cannot disagree about what a graph means, only
//! about the arithmetic.

use crate::graph::{BinaryOp, Bindings, Dim, DimKind, DimTable, Mask, Node, Op, ReduceOp, UnaryOp};

/// The values a graph is evaluated over and the scalar operations on them.
pub trait Domain {
    /// One element.
    type Value: Copy;
    /// Why an operation has no value (a division by zero in a finite ring).
    type Error;

    /// A constant of the graph.
    fn constant(&self, c: f64) -> Result<Self::Value, Self::Error>;
    /// The count `n` (what a mean divides by).
    fn count(&self, n: usize) -> Result<Self::Value, Self::Error>;
    /// The additive identity (a matmul's accumulator starts there).
    fn zero(&self) -> Self::Value;
    /// An elementwise op of one operand.
    fn unary(&self, op: UnaryOp, x: Self::Value) -> Result<Self::Value, Self::Error>;
    /// An elementwise op of two operands.
    fn binary(&self, op: BinaryOp, x: Self::Value, y: Self::Value) -> Result<Self::Value, Self::Error>;
    /// `acc + x · y`, the step of a matmul.
    fn mul_add(&self, acc: Self::Value, x: Self::Value, y: Self::Value) -> Self::Value;
    /// The value a reduction starts from before its first element; `None` starts from the
    /// first element (an empty reduction is then zero).
    fn reduce_start(&self, op: ReduceOp) -> Option<Self::Value>;
    /// `-inf`, what a mask puts in place of the elements it drops.
    fn neg_inf(&self) -> Self::Value;
    /// The `m×n` product of the row-major `m×k` matrix `a` and `k×n` matrix `b`, when the
    /// domain has a faster way to it whose every element is exactly what [`Domain::mul_add`]
    /// gives summing from [`Domain::zero`] in order of `k`; `None` takes that loop.
    fn matmul_fast(
        &self,
        _a: &[Self::Value],
        _b: &[Self::Value],
        _m: usize,
        _k: usize,
        _n: usize,
    ) -> Option<Vec<Self::Value>> {
        None
    }
}

/// A dense row-major tensor.
#[derive(Clone, PartialEq, Debug)]
pub struct Dense<V> {
    /// Extents, outermost first.
    pub shape: Vec<usize>,
    /// Elements in row-major order.
    pub data: Vec<V>,
}

impl<V> Default for Dense<V> {
    fn default() -> Self {
        Dense { shape: Vec::new(), data: Vec::new() }
    }
}

impl<V: Clone> Dense<V> {
    /// A tensor filled with `value`.
    pub fn full(shape: Vec<usize>, value: V) -> Dense<V> {
        let n = shape.iter().product();
        Dense { shape, data: vec![value; n] }
    }
}

impl<V> Dense<V> {
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
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum EvalError<E> {
    /// No tensor for an input.
    MissingInput(usize),
    /// An input tensor whose shape is not the one the bindings give.
    InputShape {
        /// The input's index.
        input: usize,
        /// The shape the bindings give.
        want: Vec<usize>,
        /// The tensor's shape.
        got: Vec<usize>,
    },
    /// A split whose count does not divide its axis.
    RaggedSplit {
        /// The split count.
        count: usize,
        /// The axis' extent.
        extent: usize,
    },
    /// A tensor above the evaluator's element limit.
    TooLarge(usize),
    /// The domain has no value for an operation.
    Domain(E),
}

/// Evaluates every node of `nodes` (an arena in topological order whose leaves are
/// `Op::Input(k)` → `inputs[k]` and constants) at `bindings` into `values`, which is cleared
/// and reused. No tensor may have more than `max_elems` elements. `table` is the dim table of
/// the nodes' shapes (a mask of a split tensor finds its columns' global positions there).
pub fn eval_into<D: Domain>(
    domain: &D,
    nodes: &[Node],
    table: &DimTable,
    bindings: &Bindings,
    inputs: &[Dense<D::Value>],
    max_elems: usize,
    values: &mut Vec<Dense<D::Value>>,
) -> Result<(), EvalError<D::Error>> {
    values.clear();
    for node in nodes {
        let shape = bindings.extents(&node.shape);
        let elems: usize = shape.iter().product();
        if elems > max_elems {
            return Err(EvalError::TooLarge(elems));
        }
        let arg = |i: usize| &values[node.args[i].index()];
        let t = match node.op {
            Op::Input(k) => {
                let k = k as usize;
                let t = inputs.get(k).ok_or(EvalError::MissingInput(k))?;
                if t.shape != shape {
                    return Err(EvalError::InputShape { input: k, want: shape, got: t.shape.clone() });
                }
                t.clone()
            }
            Op::Const(c) => Dense { shape, data: vec![domain.constant(c).map_err(EvalError::Domain)?] },
            Op::Unary(u) => {
                let data = arg(0).data.iter().map(|&x| domain.unary(u, x)).collect::<Result<_, _>>();
                Dense { shape, data: data.map_err(EvalError::Domain)? }
            }
            Op::Binary(b) => binary(domain, b, arg(0), arg(1), shape).map_err(EvalError::Domain)?,
            Op::Transpose => transpose(arg(0)),
            Op::MatMul => matmul(domain, arg(0), arg(1), shape),
            Op::Reduce(r, axis) => reduce(domain, arg(0), r, axis as usize).map_err(EvalError::Domain)?,
            Op::Split(axis) => split(arg(0), axis as usize, shape)?,
            Op::Mask(m) => mask(domain, m, arg(0), &node.shape, table, bindings),
        };
        debug_assert_eq!(t.shape, bindings.extents(&node.shape), "{:?}", node.op);
        values.push(t);
    }
    Ok(())
}

/// Per output axis, the stride of a broadcast operand of shape `x`: 0 where the operand
/// broadcasts or lacks the axis.
fn broadcast_strides(x: &[usize], out: &[usize]) -> Vec<usize> {
    let rank = out.len();
    let xs = strides(x);
    let off = rank - x.len();
    (0..rank).map(|i| if i < off || x[i - off] == 1 { 0 } else { xs[i - off] }).collect()
}

/// The linear index in the operand of the output's linear index `lin`.
fn operand_index(mut lin: usize, out_strides: &[usize], operand_strides: &[usize]) -> usize {
    let mut idx = 0;
    for (os, e) in out_strides.iter().zip(operand_strides) {
        let c = lin / os;
        lin %= os;
        idx += c * e;
    }
    idx
}

fn binary<D: Domain>(
    domain: &D,
    op: BinaryOp,
    x: &Dense<D::Value>,
    y: &Dense<D::Value>,
    shape: Vec<usize>,
) -> Result<Dense<D::Value>, D::Error> {
    let os = strides(&shape);
    let (ex, ey) = (broadcast_strides(&x.shape, &shape), broadcast_strides(&y.shape, &shape));
    let elems: usize = shape.iter().product();
    let mut data = Vec::with_capacity(elems);
    // Row by row: an operand's index is found once per row of the innermost axis, along which
    // it steps by its stride there (0 where it broadcasts).
    let inner = shape.last().copied().unwrap_or(1);
    let (sx, sy) = (ex.last().copied().unwrap_or(0), ey.last().copied().unwrap_or(0));
    if elems > 0 {
        for start in (0..elems).step_by(inner) {
            let (bx, by) = (operand_index(start, &os, &ex), operand_index(start, &os, &ey));
            for j in 0..inner {
                data.push(domain.binary(op, x.data[bx + j * sx], y.data[by + j * sy])?);
            }
        }
    }
    Ok(Dense { shape, data })
}

fn transpose<V: Copy>(x: &Dense<V>) -> Dense<V> {
    let r = x.shape.len();
    let mut shape = x.shape.clone();
    shape.swap(r - 1, r - 2);
    let (rows, cols) = (x.shape[r - 2], x.shape[r - 1]);
    let batch: usize = x.shape[..r - 2].iter().product();
    let mut data = x.data.clone();
    for b in 0..batch {
        for i in 0..rows {
            for j in 0..cols {
                data[b * rows * cols + j * rows + i] = x.data[b * rows * cols + i * cols + j];
            }
        }
    }
    Dense { shape, data }
}

fn matmul<D: Domain>(domain: &D, a: &Dense<D::Value>, b: &Dense<D::Value>, out: Vec<usize>) -> Dense<D::Value> {
    let r = out.len();
    let (m, n) = (out[r - 2], out[r - 1]);
    let k = a.shape[a.shape.len() - 1];
    let batch = &out[..r - 2];
    let nb: usize = batch.iter().product();
    let bs = strides(batch);
    let ea = broadcast_strides(&a.shape[..a.shape.len() - 2], batch);
    let eb = broadcast_strides(&b.shape[..b.shape.len() - 2], batch);
    let mut data = vec![domain.zero(); nb * m * n];
    for bt in 0..nb {
        let ao = operand_index(bt, &bs, &ea) * m * k;
        let bo = operand_index(bt, &bs, &eb) * k * n;
        let out = &mut data[bt * m * n..(bt + 1) * m * n];
        if let Some(fast) = domain.matmul_fast(&a.data[ao..ao + m * k], &b.data[bo..bo + k * n], m, k, n) {
            out.copy_from_slice(&fast);
            continue;
        }
        // i-p-j order walks B and the result row by row: the same sums, cache-friendly.
        for i in 0..m {
            let row = &mut out[i * n..(i + 1) * n];
            for p in 0..k {
                let x = a.data[ao + i * k + p];
                let brow = &b.data[bo + p * n..bo + (p + 1) * n];
                for (c, &y) in row.iter_mut().zip(brow) {
                    *c = domain.mul_add(*c, x, y);
                }
            }
        }
    }
    Dense { shape: out, data }
}

fn reduce<D: Domain>(domain: &D, x: &Dense<D::Value>, op: ReduceOp, axis: usize) -> Result<Dense<D::Value>, D::Error> {
    let outer: usize = x.shape[..axis].iter().product();
    let len = x.shape[axis];
    let inner: usize = x.shape[axis + 1..].iter().product();
    let mut shape = x.shape.clone();
    shape[axis] = 1;
    let combine = if op == ReduceOp::Max { BinaryOp::Max } else { BinaryOp::Add };
    let count = if op == ReduceOp::Mean { Some(domain.count(len)?) } else { None };
    let mut data = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let mut it = (0..len).map(|k| x.data[(o * len + k) * inner + i]);
            let start = match domain.reduce_start(op) {
                Some(v) => v,
                None => it.next().unwrap_or_else(|| domain.zero()),
            };
            let mut v = start;
            for e in it {
                v = domain.binary(combine, v, e)?;
            }
            if let Some(n) = count {
                v = domain.binary(BinaryOp::Div, v, n)?;
            }
            data.push(v);
        }
    }
    Ok(Dense { shape, data })
}

fn split<V: Copy, E>(x: &Dense<V>, axis: usize, out: Vec<usize>) -> Result<Dense<V>, EvalError<E>> {
    let (count, chunk) = (out[0], out[axis + 1]);
    let extent = x.shape[axis];
    if count * chunk != extent {
        return Err(EvalError::RaggedSplit { count, extent });
    }
    let outer: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis + 1..].iter().product();
    let mut data = Vec::with_capacity(x.data.len());
    for j in 0..count {
        for o in 0..outer {
            for c in 0..chunk {
                let src = (o * extent + j * chunk + c) * inner;
                data.extend_from_slice(&x.data[src..src + inner]);
            }
        }
    }
    Ok(Dense { shape: out, data })
}

/// The position of an index along axis `a` of a tensor of `shape` in its unsplit axis, and
/// that axis' extent: a split chunk's index counts from the start of its part, whose number is
/// the index along the split's count axis.
fn global_axis(shape: &[Dim], a: usize, table: &DimTable, bindings: &Bindings) -> (Option<usize>, usize, usize) {
    let d = shape[a];
    if let Dim::Var(v) = d {
        if let DimKind::SplitChunk { of, count } = table.get(v).kind {
            let part = shape.iter().position(|x| *x == Dim::Var(count));
            return (part, bindings.extent(d), bindings.extent(Dim::Var(of)));
        }
    }
    (None, 1, bindings.extent(d))
}

fn mask<D: Domain>(
    domain: &D,
    m: Mask,
    x: &Dense<D::Value>,
    shape: &[Dim],
    table: &DimTable,
    bindings: &Bindings,
) -> Dense<D::Value> {
    let r = shape.len();
    let st = x.strides();
    let (rpart, rchunk, rows) = global_axis(shape, r - 2, table, bindings);
    let (cpart, cchunk, cols) = global_axis(shape, r - 1, table, bindings);
    let coord = |lin: usize, a: usize| (lin / st[a]) % x.shape[a];
    let data = x
        .data
        .iter()
        .enumerate()
        .map(|(lin, &v)| {
            let i = rpart.map_or(0, |p| coord(lin, p) * rchunk) + coord(lin, r - 2);
            let j = cpart.map_or(0, |p| coord(lin, p) * cchunk) + coord(lin, r - 1);
            if m.keeps(i as u64, j as u64, rows as u64, cols as u64) {
                v
            } else {
                domain.neg_inf()
            }
        })
        .collect();
    Dense { shape: x.shape.clone(), data }
}
