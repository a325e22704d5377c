//! The op vocabulary of a search: the ops of the target, plus `split` and `sum` (the combine).

use crate::graph::{BinaryOp, Dim, Graph, Mask, Op, ReduceOp, UnaryOp};

/// Which ops the search may insert.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Vocab {
    /// Elementwise unary ops.
    pub unary: Vec<UnaryOp>,
    /// Elementwise binary ops.
    pub binary: Vec<BinaryOp>,
    /// Reduction kinds (over any reducible axis).
    pub reduce: Vec<ReduceOp>,
    /// Batched matrix product.
    pub matmul: bool,
    /// Swap of the last two axes.
    pub transpose: bool,
    /// The target transposes a computed tensor (not only inputs).
    pub transpose_computed: bool,
    /// Inputs that are vectors laid out as a column or a row (a unit axis among their last
    /// two) may be transposed even when the target transposes nothing: a scale per row of a
    /// product's right operand (`matmul(x, w * sc)`, `sc: [k, 1]`) is the same as a scale per
    /// column of its left (`matmul(x * transpose(sc), w)`), which reads `w` once in one
    /// kernel instead of first writing the scaled copy. Such a transpose moves no data.
    pub transpose_vectors: bool,
    /// Split of a reducible axis.
    pub split: bool,
    /// Masks the target applies.
    pub masks: Vec<Mask>,
}

impl Vocab {
    /// The vocabulary of `target`; `split` adds the split op. Sum reductions are always
    /// available: they are the combine of a split.
    pub fn of(target: &Graph, split: bool) -> Vocab {
        let mut v = Vocab { split, reduce: vec![ReduceOp::Sum], ..Vocab::default() };
        for node in &target.nodes {
            match node.op {
                Op::Input(_) | Op::Const(_) | Op::Split(_) => {}
                Op::MatMul => v.matmul = true,
                Op::Transpose => {
                    v.transpose = true;
                    if !target.node(node.args[0]).op.is_leaf() {
                        v.transpose_computed = true;
                    }
                }
                Op::Unary(u) => {
                    push_unique(&mut v.unary, u);
                    // A log turns the product, quotient or reciprocal it takes into a sum,
                    // difference or negation of logs: `log(exp(x) / Σ exp(x))`, a log-softmax
                    // as written, is `x − log(Σ exp(x))`, one reduction a running max
                    // stabilizes, where the quotient's exps underflow.
                    if u == UnaryOp::Log {
                        match target.node(node.args[0]).op {
                            Op::Binary(BinaryOp::Mul) => push_unique(&mut v.binary, BinaryOp::Add),
                            Op::Binary(BinaryOp::Div) => push_unique(&mut v.binary, BinaryOp::Sub),
                            Op::Unary(UnaryOp::Recip) => push_unique(&mut v.unary, UnaryOp::Neg),
                            _ => {}
                        }
                    }
                }
                Op::Binary(b) => push_unique(&mut v.binary, b),
                Op::Reduce(r, _) => push_unique(&mut v.reduce, r),
                Op::Mask(m) => push_unique(&mut v.masks, m),
            }
        }
        v.transpose_vectors =
            v.matmul && target.nodes.iter().any(|n| matches!(n.op, Op::Input(_)) && is_laid_out_vector(&n.shape));
        v.unary.sort();
        v.binary.sort();
        v.reduce.sort();
        v.masks.sort();
        v
    }
}

/// Whether a tensor of `shape` is a vector laid out as a column or a row of a matrix: a unit
/// axis among its last two.
pub(super) fn is_laid_out_vector(shape: &[Dim]) -> bool {
    shape.len() >= 2 && shape[shape.len() - 2..].contains(&Dim::One)
}

fn push_unique<T: PartialEq>(v: &mut Vec<T>, x: T) {
    if !v.contains(&x) {
        v.push(x);
    }
}
