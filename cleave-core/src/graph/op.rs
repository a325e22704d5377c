//! The closed set of graph operations.

use std::fmt;

use num_traits::Float;

/// Elementwise operations of one operand.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum UnaryOp {
    /// e^x
    Exp,
    /// natural logarithm
    Log,
    /// square root
    Sqrt,
    /// 1 / sqrt(x)
    Rsqrt,
    /// x * x
    Square,
    /// 1 / x
    Recip,
    /// x * sigmoid(x)
    Silu,
    /// 1 / (1 + e^-x)
    Sigmoid,
    /// x * Φ(x), the exact (erf) form
    Gelu,
    /// -x
    Neg,
}

/// Elementwise operations of two operands, with NumPy broadcasting.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum BinaryOp {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a * b
    Mul,
    /// a / b
    Div,
    /// max(a, b)
    Max,
}

/// Reductions over one axis; the reduced axis is kept with extent 1.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum ReduceOp {
    /// Σ
    Sum,
    /// max
    Max,
    /// Σ / n
    Mean,
}

/// The largest `|diagonal|` of a causal mask.
pub const MAX_DIAGONAL: i32 = 1 << 14;

/// Masks over the last two axes of a tensor (rows `i`, columns `j`). A masked element is
/// `-inf`: an `exp` makes it 0 and a `max` ignores it, so it takes no part in a softmax or a
/// log-sum-exp.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum Mask {
    /// Keeps `j <= i + (L - S) + diagonal` for `S` rows and `L` columns: the causal mask
    /// aligned at the bottom right, so that with more columns than rows (a prefix of earlier
    /// keys) the last row sees every column. With per-request (ragged) extents, `S` and `L` are
    /// the request's. `diagonal` moves the boundary: -1 also hides each row's own column.
    Causal {
        /// Columns past the bottom-right diagonal that stay visible (negative: hidden).
        diagonal: i32,
    },
}

impl Mask {
    /// The declaration-language name.
    pub fn name(self) -> &'static str {
        match self {
            Mask::Causal { .. } => "causal",
        }
    }

    /// The arguments after the tensor, as the declaration language writes them (none when
    /// they are the defaults).
    pub fn arguments(self) -> String {
        match self {
            Mask::Causal { diagonal: 0 } => String::new(),
            Mask::Causal { diagonal } => format!(", diagonal={diagonal}"),
        }
    }

    /// A small distinct number per mask (the search's canonical order packs it into a key):
    /// the diagonal zigzagged, below 2^15 for the diagonals the front end accepts.
    pub fn code(self) -> u64 {
        match self {
            Mask::Causal { diagonal } => u64::from((diagonal << 1 ^ (diagonal >> 31)) as u32),
        }
    }

    /// The column offset of the boundary: element `(i, j)` is kept when
    /// `j <= i + cols - rows + shift()`.
    pub fn shift(self) -> i64 {
        match self {
            Mask::Causal { diagonal } => i64::from(diagonal),
        }
    }

    /// Whether element `(i, j)` of a `rows × cols` matrix is kept. `i` and `j` may run past
    /// the extents (a tile of a ragged axis); the rule is the same affine bound.
    pub fn keeps(self, i: u64, j: u64, rows: u64, cols: u64) -> bool {
        match self {
            Mask::Causal { diagonal } => (j as i128) <= i as i128 + cols as i128 - rows as i128 + i128::from(diagonal),
        }
    }
}

/// One operation of a [`Graph`](super::Graph).
///
/// Axes are stored normalized (non-negative). Every op produces one tensor.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Op {
    /// The graph input with this index in [`Graph::inputs`](super::Graph::inputs).
    Input(u32),
    /// A scalar constant (rank 0).
    Const(f64),
    /// Batched matrix product over the last two axes; leading axes broadcast.
    MatMul,
    /// Swaps the last two axes. A view: no data moves.
    Transpose,
    /// Elementwise, one operand.
    Unary(UnaryOp),
    /// Elementwise, two operands, broadcasting.
    Binary(BinaryOp),
    /// Reduction over `axis`, keeping it with extent 1.
    Reduce(ReduceOp, u32),
    /// Cuts `axis` into `s` equal parts and stacks them on a new leading axis of extent `s`
    /// (the split count of the axis' variable); the cut axis becomes the chunk `K/s`.
    Split(u32),
    /// Elementwise: the operand, or `-inf` where the mask drops the element (by its position
    /// in the last two axes).
    Mask(Mask),
}

impl Eq for Op {}

impl std::hash::Hash for Op {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            Op::Input(i) => i.hash(state),
            Op::Const(c) => c.to_bits().hash(state),
            Op::MatMul | Op::Transpose => {}
            Op::Unary(u) => u.hash(state),
            Op::Binary(b) => b.hash(state),
            Op::Reduce(r, a) => (r, a).hash(state),
            Op::Split(a) => a.hash(state),
            Op::Mask(m) => m.hash(state),
        }
    }
}

impl UnaryOp {
    /// Every unary op, in a fixed order.
    pub const ALL: [UnaryOp; 10] = [
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Square,
        UnaryOp::Recip,
        UnaryOp::Silu,
        UnaryOp::Sigmoid,
        UnaryOp::Gelu,
        UnaryOp::Neg,
    ];

    /// The name used in the declaration language and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Square => "square",
            UnaryOp::Recip => "recip",
            UnaryOp::Silu => "silu",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Gelu => "gelu",
            UnaryOp::Neg => "neg",
        }
    }

    /// Looks a unary function up by its declaration-language name.
    pub fn from_name(s: &str) -> Option<UnaryOp> {
        UnaryOp::ALL.into_iter().find(|u| u.name() == s && *u != UnaryOp::Neg)
    }

    /// Evaluates the op in a float type: f64 for the reference semantics, f32 for the tile
    /// interpreter, which computes as the kernels do. `gelu` is evaluated in f64 either way (f32
    /// has no `erf`) and rounded.
    pub fn eval<F: Float>(self, x: F) -> F {
        let one = F::one();
        match self {
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => one / x.sqrt(),
            UnaryOp::Square => x * x,
            UnaryOp::Recip => one / x,
            UnaryOp::Silu => x / (one + (-x).exp()),
            UnaryOp::Sigmoid => one / (one + (-x).exp()),
            UnaryOp::Gelu => {
                let x = x.to_f64().unwrap_or(f64::NAN);
                F::from(0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))).unwrap_or_else(F::nan)
            }
            UnaryOp::Neg => -x,
        }
    }
}

impl BinaryOp {
    /// Every binary op, in a fixed order.
    pub const ALL: [BinaryOp; 5] = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max];

    /// The JSON name.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Max => "max",
        }
    }

    /// Infix symbol for printing (`max` prints as a call).
    pub fn symbol(self) -> Option<&'static str> {
        match self {
            BinaryOp::Add => Some("+"),
            BinaryOp::Sub => Some("-"),
            BinaryOp::Mul => Some("*"),
            BinaryOp::Div => Some("/"),
            BinaryOp::Max => None,
        }
    }

    /// True when operands may be swapped.
    pub fn is_commutative(self) -> bool {
        matches!(self, BinaryOp::Add | BinaryOp::Mul | BinaryOp::Max)
    }

    /// Evaluates the op in a float type (f64 for the reference, f32 for the tile interpreter).
    pub fn eval<F: Float>(self, a: F, b: F) -> F {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            // 0 / 0 is 0 in the language (a row with nothing unmasked); see `reference::divide`.
            BinaryOp::Div if a == F::zero() && b == F::zero() => F::zero(),
            BinaryOp::Div => a / b,
            BinaryOp::Max => a.max(b),
        }
    }
}

impl ReduceOp {
    /// The JSON name (`sum`, `reduce_max`, `mean`).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "reduce_max",
            ReduceOp::Mean => "mean",
        }
    }

    /// The declaration-language function name (`sum`, `max`, `mean`).
    pub fn surface_name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Mean => "mean",
        }
    }
}

impl Op {
    /// The JSON name of the op (DESIGN §7.2).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input(_) | Op::Const(_) => "input",
            Op::MatMul => "matmul",
            Op::Transpose => "transpose",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Reduce(r, _) => r.name(),
            Op::Split(_) => "split",
            Op::Mask(m) => m.name(),
        }
    }

    /// Number of operands.
    pub fn arity(&self) -> usize {
        match self {
            Op::Input(_) | Op::Const(_) => 0,
            Op::Transpose | Op::Unary(_) | Op::Reduce(..) | Op::Split(_) | Op::Mask(_) => 1,
            Op::MatMul | Op::Binary(_) => 2,
        }
    }

    /// True for ops that combine many elements into one (the scheduler tiles these).
    pub fn is_reduction(&self) -> bool {
        matches!(self, Op::MatMul | Op::Reduce(..))
    }

    /// True for leaves (inputs and constants).
    pub fn is_leaf(&self) -> bool {
        self.arity() == 0
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Input(i) => write!(f, "input#{i}"),
            Op::Const(c) => write!(f, "{c}"),
            Op::Reduce(r, a) => write!(f, "{}[axis={a}]", r.name()),
            Op::Split(a) => write!(f, "split[axis={a}]"),
            Op::Mask(Mask::Causal { diagonal }) if *diagonal != 0 => write!(f, "causal[diagonal={diagonal}]"),
            other => f.write_str(other.name()),
        }
    }
}

/// The error function in double precision: its Taylor series near zero and the continued
/// fraction of erfc in the tails, where the series would cancel catastrophically.
pub fn erf(x: f64) -> f64 {
    // Taylor series near zero, continued fraction for erfc in the tails.
    let ax = x.abs();
    let r = if ax < 2.5 {
        // erf(x) = 2/sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1))
        let mut term = ax;
        let mut sum = ax;
        let x2 = ax * ax;
        // At |x| < 2.5 the terms fall below 1e-17 of the sum well within 100 steps.
        for n in 1..100 {
            let n = f64::from(n);
            term *= -x2 / n;
            let add = term / (2.0 * n + 1.0);
            sum += add;
            if add.abs() <= 1e-17 * sum.abs() {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else {
        // erfc(x) = exp(-x^2)/sqrt(pi) * 1/(x + 1/2/(x + 1/(x + 3/2/(x + ...))))
        let mut f = ax;
        for k in (1..60).rev() {
            f = ax + (k as f64 / 2.0) / f;
        }
        1.0 - (-ax * ax).exp() / (f * std::f64::consts::PI.sqrt())
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_tabulated_values() {
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.0, 0.999_977_909_503_001_4),
            (-1.0, -0.842_700_792_949_714_9),
        ] {
            assert!((erf(x) - want).abs() < 1e-14, "erf({x}) = {} want {want}", erf(x));
        }
    }

    #[test]
    fn unary_ops_evaluate_their_definitions() {
        assert!((UnaryOp::Silu.eval(1.0) - 0.731_058_578_630_004_9).abs() < 1e-15);
        assert!((UnaryOp::Gelu.eval(1.0) - 0.841_344_746_068_542_9).abs() < 1e-14);
        assert_eq!(UnaryOp::Rsqrt.eval(4.0), 0.5);
        assert_eq!(UnaryOp::from_name("neg"), None, "neg is spelled as unary minus");
    }
}
