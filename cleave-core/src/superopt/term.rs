//! Abstract terms: the shape-free meaning of a tensor that the e-graph reasons about.
//!
//! `matmul(a, b)` is `sum(C, a * b)` over the atoms `C` of the contracted axis; `transpose` and
//! `split` are the identity on terms (they move or regroup indices, never values); a reduction
//! is `sum`/`rmax`/`mean` over the atoms of its axis; `square(x)` is `x * x`. Functions are
//! constructors the rules interpret only as far as they say (`exp` and `log` through their
//! homomorphisms between `+` and `*`; `sqrt`, `sigmoid`, … not at all). Index sets are
//! leaves ([`AtomSet`]), so the rules can compute unions and splits of them.

use std::fmt;
use std::str::FromStr;

use egg::{define_language, Analysis, DidMerge, EGraph, Id, Language};

use super::atoms::{AtomMask, Atoms};
use crate::graph::{BinaryOp, Dim, Op, ReduceOp, UnaryOp};

/// A set of index atoms, as a leaf of a term.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct AtomSet(pub AtomMask);

impl fmt::Display for AtomSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{:x}", self.0)
    }
}

impl FromStr for AtomSet {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        let hex = s.strip_prefix('#').ok_or(())?;
        u64::from_str_radix(hex, 16).map(AtomSet).map_err(|_| ())
    }
}

/// A leaf value: a graph input or a scalar constant (by its bits).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Leaf {
    /// The graph input with this index.
    Input(u32),
    /// A constant, as `f64::to_bits`.
    Const(u64),
}

impl fmt::Display for Leaf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Leaf::Input(i) => write!(f, "in{i}"),
            Leaf::Const(bits) => write!(f, "c{bits:x}"),
        }
    }
}

impl FromStr for Leaf {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        if let Some(i) = s.strip_prefix("in") {
            return i.parse().map(Leaf::Input).map_err(|_| ());
        }
        if let Some(b) = s.strip_prefix('c') {
            return u64::from_str_radix(b, 16).map(Leaf::Const).map_err(|_| ());
        }
        Err(())
    }
}

define_language! {
    /// The term language of the abstract-expression check.
    pub enum Term {
        "+" = Add([Id; 2]),
        "-" = Sub([Id; 2]),
        "*" = Mul([Id; 2]),
        "/" = Div([Id; 2]),
        "max" = Max([Id; 2]),
        "neg" = Neg(Id),
        "recip" = Recip(Id),
        "exp" = Exp(Id),
        "log" = Log(Id),
        "sqrt" = Sqrt(Id),
        "rsqrt" = Rsqrt(Id),
        "sigmoid" = Sigmoid(Id),
        "silu" = Silu(Id),
        "gelu" = Gelu(Id),
        // Reductions: child 0 is the index set, child 1 the body.
        "sum" = Sum([Id; 2]),
        "rmax" = RMax([Id; 2]),
        "mean" = Mean([Id; 2]),
        // 1 / |A| for an index set A: what turns a sum into a mean.
        "invsize" = InvSize(Id),
        // A causal mask over the rows and columns whose atoms are child 0, with the diagonal
        // offset child 1 (a constant), of the body child 2.
        "causal" = Causal([Id; 3]),
        Set(AtomSet),
        Leaf(Leaf),
    }
}

/// Per e-class facts: the atoms its value may depend on, and the index set if it is one.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Facts {
    /// Free atoms: the indices the value depends on (an over-approximation).
    pub free: AtomMask,
    /// For a class holding an index-set leaf: the set.
    pub set: Option<AtomMask>,
}

/// The free-atoms analysis.
#[derive(Clone, Debug, Default)]
pub struct FreeAtoms {
    /// The free atoms of each graph input.
    pub inputs: Vec<AtomMask>,
}

impl Analysis<Term> for FreeAtoms {
    type Data = Facts;

    fn make(egraph: &mut EGraph<Term, Self>, enode: &Term, _id: Id) -> Facts {
        let free = |id: &Id| egraph[*id].data.free;
        match enode {
            Term::Set(s) => Facts { free: 0, set: Some(s.0) },
            Term::Leaf(Leaf::Input(i)) => {
                Facts { free: egraph.analysis.inputs.get(*i as usize).copied().unwrap_or(0), set: None }
            }
            Term::Leaf(Leaf::Const(_)) | Term::InvSize(_) => Facts::default(),
            Term::Sum([a, x]) | Term::RMax([a, x]) | Term::Mean([a, x]) => {
                let set = egraph[*a].data.set.unwrap_or(0);
                Facts { free: free(x) & !set, set: None }
            }
            // The mask depends on the positions along its rows and columns.
            Term::Causal([a, _, x]) => Facts { free: free(x) | egraph[*a].data.set.unwrap_or(0), set: None },
            other => Facts { free: other.children().iter().fold(0, |m, c| m | free(c)), set: None },
        }
    }

    fn merge(&mut self, to: &mut Facts, from: Facts) -> DidMerge {
        // Equal values depend on at most the atoms both forms depend on.
        let merged = Facts { free: to.free & from.free, set: to.set.or(from.set) };
        let changed_to = merged != *to;
        let changed_from = merged != from;
        *to = merged;
        DidMerge(changed_to, changed_from)
    }
}

/// The e-graph type of the abstract-expression check.
pub(super) type TermGraph = EGraph<Term, FreeAtoms>;

/// Builds the e-node(s) of an op applied to operand classes: `node` either adds (seeding) or
/// looks up (searching) one e-node and returns its class. `arg_shapes` are the operands'
/// shapes; they give the atoms of reduced and contracted axes.
pub(super) fn op_term(
    op: &Op,
    args: &[Id],
    arg_shapes: &[&[Dim]],
    atoms: &Atoms,
    mut node: impl FnMut(Term) -> Option<Id>,
) -> Option<Id> {
    match *op {
        Op::Input(i) => node(Term::Leaf(Leaf::Input(i))),
        Op::Const(c) => node(Term::Leaf(Leaf::Const(c.to_bits()))),
        Op::Transpose | Op::Split(_) => Some(args[0]),
        Op::Mask(m) => {
            // The rows and columns as whole axes: a mask of a split tensor masks by the
            // positions in the unsplit axis, the same term as the mask before the split.
            let x = arg_shapes[0];
            let r = x.len();
            let positions = atoms.of_whole_dim(x[r - 2]) | atoms.of_whole_dim(x[r - 1]);
            let set = node(Term::Set(AtomSet(positions)))?;
            match m {
                crate::graph::Mask::Causal { diagonal } => {
                    let diagonal = node(Term::Leaf(Leaf::Const(f64::from(diagonal).to_bits())))?;
                    node(Term::Causal([set, diagonal, args[0]]))
                }
            }
        }
        Op::MatMul => {
            let a = arg_shapes[0];
            let contracted = atoms.of_dim(a[a.len() - 1]);
            let product = node(Term::Mul([args[0], args[1]]))?;
            if contracted == 0 {
                return Some(product);
            }
            let set = node(Term::Set(AtomSet(contracted)))?;
            node(Term::Sum([set, product]))
        }
        Op::Reduce(r, axis) => {
            let reduced = atoms.of_dim(arg_shapes[0][axis as usize]);
            if reduced == 0 {
                // A reduction over an axis of extent 1 is the identity (mean and max too).
                return Some(args[0]);
            }
            let set = node(Term::Set(AtomSet(reduced)))?;
            node(match r {
                ReduceOp::Sum => Term::Sum([set, args[0]]),
                ReduceOp::Max => Term::RMax([set, args[0]]),
                ReduceOp::Mean => Term::Mean([set, args[0]]),
            })
        }
        Op::Unary(u) => {
            let x = args[0];
            node(match u {
                UnaryOp::Exp => Term::Exp(x),
                UnaryOp::Log => Term::Log(x),
                UnaryOp::Sqrt => Term::Sqrt(x),
                UnaryOp::Rsqrt => Term::Rsqrt(x),
                UnaryOp::Square => Term::Mul([x, x]),
                UnaryOp::Recip => Term::Recip(x),
                UnaryOp::Silu => Term::Silu(x),
                UnaryOp::Sigmoid => Term::Sigmoid(x),
                UnaryOp::Gelu => Term::Gelu(x),
                UnaryOp::Neg => Term::Neg(x),
            })
        }
        Op::Binary(b) => {
            let ab = [args[0], args[1]];
            node(match b {
                BinaryOp::Add => Term::Add(ab),
                BinaryOp::Sub => Term::Sub(ab),
                BinaryOp::Mul => Term::Mul(ab),
                BinaryOp::Div => Term::Div(ab),
                BinaryOp::Max => Term::Max(ab),
            })
        }
    }
}
