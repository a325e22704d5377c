//! What a register value holds in the columns past a ragged tile's end.
//!
//! A tile of a contraction that does not divide its axis (a dynamic axis, or a static one
//! rounded up to the MMA depth) is loaded with zeros past the axis' end. The right operand's
//! rows there are zero, so a left operand computed in registers contributes nothing there as
//! long as it is finite: `x · 0` is 0, but `inf · 0` is NaN. `recip(x)` of the zero fill is
//! infinite, and without a mask it would turn the whole row of the product into NaN. This
//! module decides, without running anything, whether a value is certainly finite past the end,
//! so that only the values that are not get masked (a softmax's probabilities are already 0
//! there: their scores are masked to -inf before the exp).

use super::Lowerer;
use crate::graph::{BinaryOp, UnaryOp};
use crate::index::Limit;
use crate::plan::program::{BufKind, Expr, Src};

/// A value in the columns past a tile's end, as far as it is known.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum Pad {
    /// The same value in every such column.
    Known(f64),
    /// Finite, the value unknown (a row's own value broadcast across the columns).
    Finite,
    /// Anything, infinities and NaN included.
    Any,
}

impl Pad {
    pub(super) fn is_finite(self) -> bool {
        match self {
            Pad::Known(v) => v.is_finite(),
            Pad::Finite => true,
            Pad::Any => false,
        }
    }

    /// One of two values.
    fn either(self, other: Pad) -> Pad {
        match (self, other) {
            (Pad::Known(a), Pad::Known(b)) if a == b => self,
            (a, b) if a.is_finite() && b.is_finite() => Pad::Finite,
            _ => Pad::Any,
        }
    }
}

fn unary(op: UnaryOp, x: Pad) -> Pad {
    match x {
        // The op's own evaluation, whose finiteness is the kernels'.
        Pad::Known(v) => Pad::Known(op.eval(v)),
        // Of a finite argument these are finite; the others can overflow or leave their
        // domain.
        Pad::Finite => match op {
            UnaryOp::Neg | UnaryOp::Sigmoid | UnaryOp::Silu | UnaryOp::Gelu => Pad::Finite,
            _ => Pad::Any,
        },
        Pad::Any => Pad::Any,
    }
}

fn binary(op: BinaryOp, a: Pad, b: Pad) -> Pad {
    match (a, b) {
        (Pad::Known(x), Pad::Known(y)) => Pad::Known(op.eval(x, y)),
        (Pad::Known(z), f) | (f, Pad::Known(z)) if op == BinaryOp::Mul && z == 0.0 && f.is_finite() => Pad::Known(0.0),
        (a, b) if !a.is_finite() || !b.is_finite() => Pad::Any,
        // Both finite: only a division can leave the finite values (by zero).
        (_, Pad::Known(y)) if op == BinaryOp::Div => {
            if y != 0.0 && y.is_finite() {
                Pad::Finite
            } else {
                Pad::Any
            }
        }
        _ if op == BinaryOp::Div => Pad::Any,
        _ => Pad::Finite,
    }
}

impl Lowerer<'_> {
    /// What `e` holds in the columns its tile's `limits` put past the end.
    pub(super) fn pad(&self, e: &Expr, limits: &[Limit]) -> Pad {
        match e {
            Expr::Src(Src::Const(c)) => Pad::Known(*c),
            Expr::Src(Src::Scalar(_) | Src::Extent(_)) => Pad::Finite,
            Expr::Src(Src::Tile(b)) => match self.bufs[b.0 as usize].kind {
                // One column broadcast across the row: the row's own value.
                BufKind::Smem { cols: 1, .. } => Pad::Finite,
                // Loaded with zeros past the end.
                _ => Pad::Known(0.0),
            },
            // A vector read across the columns: its rows past the end are the loads' zeros.
            Expr::Src(Src::Column(_)) => Pad::Known(0.0),
            Expr::Src(Src::Reg(b)) => match self.bufs[b.0 as usize].kind {
                BufKind::Rows => Pad::Finite,
                _ => self.assigned.get(b).map_or(Pad::Any, |e| self.pad(e, limits)),
            },
            Expr::Unary(op, a) => unary(*op, self.pad(a, limits)),
            Expr::Binary(op, a, b) => binary(*op, self.pad(a, limits), self.pad(b, limits)),
            // `exp(a - m)`, 0 where `a` is -inf; at most 1 elsewhere, since the running max
            // includes `a`.
            Expr::ExpDiff(a, _) => match self.pad(a, limits) {
                Pad::Known(v) if v == f64::NEG_INFINITY => Pad::Known(0.0),
                p if p.is_finite() => Pad::Finite,
                _ => Pad::Any,
            },
            Expr::MaskCols(a, l, fill) if !l.is_empty() && l == limits => Pad::Known(*fill),
            Expr::MaskCols(a, _, fill) | Expr::MaskSlice(a, _, fill) => self.pad(a, limits).either(Pad::Known(*fill)),
            Expr::Mask(a, _) => self.pad(a, limits).either(Pad::Known(f64::NEG_INFINITY)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_zero_fill_stays_finite_through_most_ops_and_not_through_a_reciprocal() {
        let zero = Pad::Known(0.0);
        assert_eq!(unary(UnaryOp::Exp, zero), Pad::Known(1.0));
        assert_eq!(unary(UnaryOp::Recip, zero), Pad::Known(f64::INFINITY));
        assert!(!unary(UnaryOp::Log, zero).is_finite());
        assert!(!unary(UnaryOp::Rsqrt, zero).is_finite());
        assert_eq!(binary(BinaryOp::Mul, zero, Pad::Finite), zero);
        assert_eq!(binary(BinaryOp::Add, zero, Pad::Finite), Pad::Finite);
        assert_eq!(binary(BinaryOp::Div, Pad::Finite, zero), Pad::Any);
        assert_eq!(binary(BinaryOp::Div, Pad::Finite, Pad::Known(2.0)), Pad::Finite);
        assert_eq!(binary(BinaryOp::Div, Pad::Finite, Pad::Finite), Pad::Any);
        assert_eq!(unary(UnaryOp::Exp, Pad::Finite), Pad::Any, "an exp can overflow");
        assert_eq!(Pad::Known(0.0).either(Pad::Known(f64::NEG_INFINITY)), Pad::Any);
        assert_eq!(Pad::Known(1.0).either(Pad::Known(2.0)), Pad::Finite);
    }
}
