//! Eventually-reduced dims by data-dependency analysis (paper §4 asks the user; we infer).
//!
//! An axis of an input is eventually reduced when some element of some output depends on
//! *every* index along that axis. For each input axis we track, per node, how the node's
//! elements depend on that axis: not at all, pointwise through some of the node's axes, or on
//! all of it ("full"). Reductions and matmul contractions turn pointwise into full; every other
//! op moves the pointwise axis where its index goes. A user's `reduce: [..]` replaces the
//! inferred set for that input.

use crate::graph::{Dim, Graph, Op};

/// How a node's elements depend on one input axis.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Dep {
    /// Not at all.
    None,
    /// Element `e` depends on the input index equal to `e`'s index along these axes.
    Point(Vec<usize>),
    /// Every element depends on every index.
    Full,
}

impl Dep {
    fn join(self, other: Dep) -> Dep {
        match (self, other) {
            (Dep::Full, _) | (_, Dep::Full) => Dep::Full,
            (Dep::None, d) | (d, Dep::None) => d,
            (Dep::Point(mut a), Dep::Point(b)) => {
                for x in b {
                    if !a.contains(&x) {
                        a.push(x);
                    }
                }
                a.sort_unstable();
                Dep::Point(a)
            }
        }
    }

    /// Maps axes through `f`; `None` from `f` means the index is consumed whole (full).
    fn map(&self, f: impl Fn(usize) -> Option<usize>) -> Dep {
        match self {
            Dep::None => Dep::None,
            Dep::Full => Dep::Full,
            Dep::Point(axes) => {
                let mut out = Vec::new();
                for &a in axes {
                    match f(a) {
                        Some(b) => out.push(b),
                        None => return Dep::Full,
                    }
                }
                out.sort_unstable();
                out.dedup();
                Dep::Point(out)
            }
        }
    }
}

/// Per input, per axis: eventually reduced or not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReducedAxes {
    /// Indexed by input, then axis.
    pub per_input: Vec<Vec<bool>>,
    /// Per input: true when the user's override decided it.
    pub overridden: Vec<bool>,
}

/// Infers the eventually-reduced axes of every input (honouring overrides).
pub fn eventually_reduced(g: &Graph) -> ReducedAxes {
    let mut per_input = Vec::new();
    let mut overridden = Vec::new();
    for input in &g.inputs {
        let shape = &input.decl.shape;
        if let Some(list) = &input.reduce_override {
            per_input.push(shape.iter().map(|d| d.var().is_some_and(|v| list.contains(&v))).collect());
            overridden.push(true);
            continue;
        }
        let row = (0..shape.len())
            .map(|axis| shape[axis] != Dim::One && axis_is_reduced(g, input.node.index(), axis))
            .collect();
        per_input.push(row);
        overridden.push(false);
    }
    ReducedAxes { per_input, overridden }
}

fn axis_is_reduced(g: &Graph, source: usize, axis: usize) -> bool {
    let mut deps: Vec<Dep> = Vec::with_capacity(g.nodes.len());
    for (ni, node) in g.nodes.iter().enumerate() {
        let rank = node.shape.len();
        let arg = |i: usize| &deps[node.args[i].index()];
        let d = match node.op {
            Op::Input(_) if ni == source => Dep::Point(vec![axis]),
            Op::Input(_) | Op::Const(_) => Dep::None,
            Op::Unary(_) | Op::Mask(_) => arg(0).clone(),
            Op::Binary(_) => {
                let mut acc = Dep::None;
                for i in 0..2 {
                    let ar = g.nodes[node.args[i].index()].shape.len();
                    acc = acc.join(arg(i).map(|a| Some(a + rank - ar)));
                }
                acc
            }
            Op::Transpose => arg(0).map(|a| {
                Some(if a == rank - 1 {
                    rank - 2
                } else if a == rank - 2 {
                    rank - 1
                } else {
                    a
                })
            }),
            Op::MatMul => {
                let ra = g.nodes[node.args[0].index()].shape.len();
                let rb = g.nodes[node.args[1].index()].shape.len();
                let a = arg(0).map(|x| if x == ra - 1 { None } else { Some(x + rank - ra) });
                let b = arg(1).map(|x| {
                    if x == rb - 2 {
                        None
                    } else if x == rb - 1 {
                        Some(rank - 1)
                    } else {
                        Some(x + rank - rb)
                    }
                });
                a.join(b)
            }
            Op::Reduce(_, r) => arg(0).map(|x| if x == r as usize { None } else { Some(x) }),
            Op::Split(s) => arg(0).map(|x| if x == s as usize { None } else { Some(x + 1) }),
        };
        deps.push(d);
    }
    g.outputs.iter().any(|o| deps[o.node.index()] == Dep::Full)
}
