//! Shape inference: the rules every op's operands must satisfy.
//!
//! These are the only shape rules in the project; the front end, the superoptimizer and the
//! validator all call them, so a graph is well-shaped in one place or nowhere.

use super::dim::{Dim, DimTable, Shape};
use super::op::Op;

/// Why an op's operands do not fit together. Messages name dims by their table names.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum ShapeError {
    /// Two axes neither equal nor broadcastable.
    Broadcast { axis: usize, a: Dim, b: Dim, lhs: Shape, rhs: Shape },
    /// The contracted axes of a matmul differ.
    MatMulInner { a: Dim, b: Dim, lhs: Shape, rhs: Shape },
    /// A matmul or transpose operand has fewer than two axes.
    RankTooLow { op: &'static str, rank: usize },
    /// An axis index outside the operand's rank.
    AxisOutOfRange { axis: i64, rank: usize },
    /// A split of an axis of extent 1, or of an axis that is itself a split chunk.
    BadSplit { reason: &'static str },
    /// Wrong number of operands.
    Arity { op: &'static str, want: usize, got: usize },
}

impl ShapeError {
    /// A readable message, naming dims through `table`.
    pub fn message(&self, table: &DimTable) -> String {
        match self {
            ShapeError::Broadcast { axis, a, b, lhs, rhs } => format!(
                "shapes {} and {} do not broadcast: axis {axis} is {} on the left and {} on the right",
                table.show(lhs),
                table.show(rhs),
                table.show(&[*a]).trim_matches(['[', ']']),
                table.show(&[*b]).trim_matches(['[', ']'])
            ),
            ShapeError::MatMulInner { a, b, lhs, rhs } => format!(
                "matmul inner dimensions differ: {} × {} contracts {} with {}",
                table.show(lhs),
                table.show(rhs),
                table.show(&[*a]).trim_matches(['[', ']']),
                table.show(&[*b]).trim_matches(['[', ']'])
            ),
            ShapeError::RankTooLow { op, rank } => {
                format!("{op} needs an operand of rank 2 or more, got rank {rank}")
            }
            ShapeError::AxisOutOfRange { axis, rank } => {
                format!("axis {axis} is out of range for a tensor of rank {rank}")
            }
            ShapeError::BadSplit { reason } => format!("cannot split: {reason}"),
            ShapeError::Arity { op, want, got } => format!("{op} takes {want} operand(s), got {got}"),
        }
    }
}

/// Normalizes a possibly negative axis against `rank`.
pub fn normalize_axis(axis: i64, rank: usize) -> Result<u32, ShapeError> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(ShapeError::AxisOutOfRange { axis, rank });
    }
    Ok(a as u32)
}

/// NumPy broadcasting with rank extension: shapes align at the right; each axis pair must be
/// equal or contain a 1.
pub fn broadcast(lhs: &[Dim], rhs: &[Dim]) -> Result<Shape, ShapeError> {
    let rank = lhs.len().max(rhs.len());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let a = if i + lhs.len() >= rank { lhs[i + lhs.len() - rank] } else { Dim::One };
        let b = if i + rhs.len() >= rank { rhs[i + rhs.len() - rank] } else { Dim::One };
        out.push(match (a, b) {
            (x, y) if x == y => x,
            (Dim::One, y) => y,
            (x, Dim::One) => x,
            _ => return Err(ShapeError::Broadcast { axis: i, a, b, lhs: lhs.to_vec(), rhs: rhs.to_vec() }),
        });
    }
    Ok(out)
}

/// Infers the output shape of `op` applied to operands of the given shapes.
///
/// `table` is needed only by `split`, which creates (or reuses) the split variables of the cut
/// axis; every other rule is pure.
pub fn infer(op: &Op, args: &[&[Dim]], table: &mut DimTable) -> Result<Shape, ShapeError> {
    if args.len() != op.arity() {
        return Err(ShapeError::Arity { op: op.name(), want: op.arity(), got: args.len() });
    }
    match *op {
        Op::Input(_) => unreachable!("inputs carry their declared shape"),
        Op::Const(_) => Ok(Vec::new()),
        Op::Unary(_) => Ok(args[0].to_vec()),
        Op::Mask(_) => {
            if args[0].len() < 2 {
                return Err(ShapeError::RankTooLow { op: "a mask", rank: args[0].len() });
            }
            Ok(args[0].to_vec())
        }
        Op::Binary(_) => broadcast(args[0], args[1]),
        Op::Transpose => {
            let x = args[0];
            if x.len() < 2 {
                return Err(ShapeError::RankTooLow { op: "transpose", rank: x.len() });
            }
            let mut out = x.to_vec();
            let n = out.len();
            out.swap(n - 1, n - 2);
            Ok(out)
        }
        Op::MatMul => {
            let (a, b) = (args[0], args[1]);
            for x in [a, b] {
                if x.len() < 2 {
                    return Err(ShapeError::RankTooLow { op: "matmul", rank: x.len() });
                }
            }
            let (m, ka) = (a[a.len() - 2], a[a.len() - 1]);
            let (kb, n) = (b[b.len() - 2], b[b.len() - 1]);
            if ka != kb {
                return Err(ShapeError::MatMulInner { a: ka, b: kb, lhs: a.to_vec(), rhs: b.to_vec() });
            }
            let mut out = broadcast(&a[..a.len() - 2], &b[..b.len() - 2]).map_err(|_| batch_error(a, b))?;
            out.push(m);
            out.push(n);
            Ok(out)
        }
        Op::Reduce(_, axis) => {
            let x = args[0];
            let a = axis as usize;
            if a >= x.len() {
                return Err(ShapeError::AxisOutOfRange { axis: i64::from(axis), rank: x.len() });
            }
            let mut out = x.to_vec();
            out[a] = Dim::One;
            Ok(out)
        }
        Op::Split(axis) => {
            let x = args[0];
            let a = axis as usize;
            if a >= x.len() {
                return Err(ShapeError::AxisOutOfRange { axis: i64::from(axis), rank: x.len() });
            }
            let Dim::Var(v) = x[a] else {
                return Err(ShapeError::BadSplit { reason: "the axis has extent 1" });
            };
            if !matches!(table.get(v).kind, super::dim::DimKind::Plain) {
                return Err(ShapeError::BadSplit { reason: "the axis is already a split part" });
            }
            let (count, chunk) = table.split_vars(v);
            let mut out = Vec::with_capacity(x.len() + 1);
            out.push(Dim::Var(count));
            out.extend_from_slice(x);
            out[a + 1] = Dim::Var(chunk);
            Ok(out)
        }
    }
}

/// Reports the first batch axis pair of a matmul that does not broadcast.
fn batch_error(a: &[Dim], b: &[Dim]) -> ShapeError {
    let (ba, bb) = (&a[..a.len() - 2], &b[..b.len() - 2]);
    let rank = ba.len().max(bb.len());
    for i in 0..rank {
        let x = if i + ba.len() >= rank { ba[i + ba.len() - rank] } else { Dim::One };
        let y = if i + bb.len() >= rank { bb[i + bb.len() - rank] } else { Dim::One };
        if x != y && x != Dim::One && y != Dim::One {
            return ShapeError::Broadcast { axis: i, a: x, b: y, lhs: a.to_vec(), rhs: b.to_vec() };
        }
    }
    unreachable!("called only when the batch axes fail to broadcast")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::dim::DimTable;

    fn dims(t: &mut DimTable, names: &[&str]) -> Vec<Dim> {
        names
            .iter()
            .map(|n| if *n == "1" { Dim::One } else { Dim::Var(t.find(n).unwrap_or_else(|| t.plain(*n, 7, false))) })
            .collect()
    }

    #[test]
    fn broadcasting_extends_rank_and_expands_ones() {
        let mut t = DimTable::new();
        let a = dims(&mut t, &["b", "1", "n"]);
        let b = dims(&mut t, &["m", "1"]);
        let out = broadcast(&a, &b).unwrap();
        assert_eq!(t.show(&out), "[b, m, n]");
        let c = dims(&mut t, &["k"]);
        let err = broadcast(&a, &c).unwrap_err();
        assert!(err.message(&t).contains("axis 2 is n on the left and k on the right"), "{}", err.message(&t));
    }

    #[test]
    fn matmul_broadcasts_batch_axes() {
        let mut t = DimTable::new();
        let a = dims(&mut t, &["b", "m", "k"]);
        let b = dims(&mut t, &["1", "k", "n"]);
        let out = infer(&Op::MatMul, &[&a, &b], &mut t).unwrap();
        assert_eq!(t.show(&out), "[b, m, n]");
        let b2 = dims(&mut t, &["k", "n"]);
        let out2 = infer(&Op::MatMul, &[&a, &b2], &mut t).unwrap();
        assert_eq!(t.show(&out2), "[b, m, n]");
        let bad = dims(&mut t, &["n", "k"]);
        let err = infer(&Op::MatMul, &[&a, &bad], &mut t).unwrap_err();
        assert!(matches!(err, ShapeError::MatMulInner { .. }));
        let g = dims(&mut t, &["g", "k", "n"]);
        let err = infer(&Op::MatMul, &[&a, &g], &mut t).unwrap_err();
        assert!(err.message(&t).contains("b on the left and g on the right"), "{}", err.message(&t));
    }

    #[test]
    fn split_adds_a_leading_count_axis() {
        let mut t = DimTable::new();
        let x = dims(&mut t, &["m", "k"]);
        let out = infer(&Op::Split(1), &[&x], &mut t).unwrap();
        assert_eq!(t.show(&out), "[s_k, m, k/s_k]");
        // A second split of the same variable reuses the same count.
        let out2 = infer(&Op::Split(1), &[&x], &mut t).unwrap();
        assert_eq!(out, out2);
        let again = infer(&Op::Split(2), &[&out], &mut t);
        assert!(matches!(again, Err(ShapeError::BadSplit { .. })));
    }

    #[test]
    fn reductions_keep_the_axis() {
        let mut t = DimTable::new();
        let x = dims(&mut t, &["m", "k"]);
        let out = infer(&Op::Reduce(super::super::op::ReduceOp::Sum, 1), &[&x], &mut t).unwrap();
        assert_eq!(t.show(&out), "[m, 1]");
        assert_eq!(normalize_axis(-1, 2), Ok(1));
        assert!(normalize_axis(2, 2).is_err());
        assert!(normalize_axis(-3, 2).is_err());
    }
}
