//! The stabilization analysis: which exps of a loop level need a running maximum.
//!
//! A source is an `exp`, or an input holding scaled partials of an earlier kernel (values
//! stored as `x · exp(m)` next to their `m`). A source is stabilized when it reaches
//! reductions only through ops linear in it: negation, a split, a product or quotient by an
//! independent value, sums and differences of linear values, and, for a matmul, the left
//! operand (the running max is per row of the left operand); an exp's reductions must also
//! run along the last axis, the one a row's running max covers. Each such reduction then sees
//! values on one common scale, and rescaling its accumulator when the max grows keeps it
//! exact. Values computed from a reduction are tracked by the lowering's scale degrees and need
//! not be linear.
//!
//! One more form is stabilized: an exp whose every reduction is a loop's accumulation along a
//! non-last axis that the loop walks one slice at a time (a sum over the leading axis of
//! `[b, c, a]`). Each element of such an accumulator sums its own column of slices, so its
//! running max is per element ([`Cover::Element`]) rather than per row; a max shared by a
//! row would let one large element underflow the sums of the others.
//!
//! Every exp must be stabilized: one that reaches a reduction any other way, or reaches none
//! (whose f32 value could overflow where the true result, after later ops, would not), makes
//! the schedule fail, and the graph goes to the fallback kernels, whose extended exponent needs
//! no running max. Two sources need no reduction here: an exp whose running max over the
//! whole row an earlier kernel stored (a row-first softmax's second kernel computes
//! `exp(x - m)` with that `m`, which no element of the row exceeds), and a scaled input read
//! as it is, on its own stored max.
//!
//! The analysis is a pure function of the graph, one loop level and which inputs are scaled;
//! the lowering runs it once per level and [`rescale`](super::rescale) writes what it decides.

use std::collections::{BTreeMap, BTreeSet};

use super::KernelIo;
use crate::graph::{BinaryOp, Graph, NodeId, Op, ReduceOp, UnaryOp};
use crate::plan::error::PlanError;
use crate::plan::program::Binding;
use crate::schedule::itgraph::ItGraph;

/// How one source is stabilized at a level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stabilized {
    /// The accumulators of this level the source feeds (a running maximum across the loop's
    /// iterations); empty for a one-shot maximum within a single tile.
    pub accumulators: Vec<NodeId>,
    /// For a scaled partial input: an earlier partial of the same split whose running max this
    /// one shares.
    pub shares_max_with: Option<NodeId>,
    /// A source this level does not reduce, shifted by the running max an earlier kernel
    /// stored: the binding of that max.
    pub stored_max: Option<Binding>,
    /// What one value of the running max covers.
    pub cover: Cover,
}

/// What one value of a running max covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cover {
    /// A block row: the source is reduced along the last axis (or is the left operand of a
    /// product), and every element of a row shares the row's max.
    Row,
    /// One element: every reduction of the source accumulates slices along this non-last
    /// axis, one per loop iteration, so each element keeps a max of its own.
    Element {
        /// The reduced axis.
        axis: u32,
    },
}

impl Stabilized {
    fn new(accumulators: Vec<NodeId>, cover: Cover) -> Self {
        Stabilized { accumulators, shares_max_with: None, stored_max: None, cover }
    }
}

/// How a value depends on one source.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Dependence {
    /// Not at all.
    Independent,
    /// Linearly.
    Linear,
    /// Through a non-linear op.
    NonLinear,
    /// Through a reduction of the source (its scale is tracked, not its linearity).
    FromReduction,
}

/// The sources of `level` that feed reductions, keyed by node, with those an earlier kernel's
/// stored max stabilizes. `io` names the kernel's scaled partial inputs and its exps that
/// an earlier kernel stabilized.
pub fn analyze(g: &Graph, level: &ItGraph, io: &KernelIo) -> Result<BTreeMap<NodeId, Stabilized>, PlanError> {
    let ops: Vec<NodeId> = level.ops().collect();
    let accs: BTreeSet<NodeId> = level.accumulates.iter().copied().collect();
    let scaled_input = |id: NodeId| match g.node(id).op {
        Op::Input(i) => io.scaled_inputs.get(&(i as usize)).copied(),
        _ => None,
    };
    let mut sources: Vec<NodeId> = ops.iter().copied().filter(|id| g.node(*id).op == Op::Unary(UnaryOp::Exp)).collect();
    sources.extend(ops.iter().copied().filter(|id| scaled_input(*id).is_some()));
    let mut out: BTreeMap<NodeId, Stabilized> = BTreeMap::new();
    // Scaled partials stored with the same running max merge under one running max here.
    let mut first_with_max: BTreeMap<Binding, NodeId> = BTreeMap::new();
    for src in sources {
        // A scaled partial whose max was stored per element merges slice by slice too.
        let per_element_input = scaled_input(src).is_some_and(|b| io.element_maxima.contains(&b));
        let (reds, unstabilizable) = linear_reductions(g, src, per_element_input, level, &ops);
        if let Some(bad) = unstabilizable {
            return Err(PlanError::ExpReduction(bad));
        }
        // One running max serves every reduction of a source, so they must agree on what it
        // covers.
        let cover = reds.first().map_or(Cover::Row, |r| r.1);
        if let Some(other) = reds.iter().find(|r| r.1 != cover) {
            return Err(PlanError::ExpReduction(other.0));
        }
        let reds: Vec<NodeId> = reds.into_iter().map(|r| r.0).collect();
        if reds.is_empty() {
            // Read as stored, on its own max, a partial would need its max per row.
            if per_element_input {
                return Err(PlanError::UnreducedScaledPartial);
            }
            let stored = scaled_input(src).or_else(|| io.shifted_exps.get(&src).copied());
            let Some(stored) = stored else {
                if io.bounded_exps.contains(&src) {
                    // At most one, computed as written ([`bounded_exps`]).
                    continue;
                }
                return Err(PlanError::UnstabilizedExp(src));
            };
            out.insert(src, Stabilized { stored_max: Some(stored), ..Stabilized::new(Vec::new(), Cover::Row) });
            continue;
        }
        let in_loop: Vec<NodeId> = reds.iter().copied().filter(|r| accs.contains(r)).collect();
        if !in_loop.is_empty() && in_loop.len() != reds.len() {
            return Err(PlanError::MixedExpReductions);
        }
        let max_binding = scaled_input(src);
        match max_binding.and_then(|b| first_with_max.get(&b).copied()) {
            Some(first) => {
                if let Some(st) = out.get_mut(&first) {
                    st.accumulators.extend(in_loop);
                }
                out.insert(src, Stabilized { shares_max_with: Some(first), ..Stabilized::new(Vec::new(), cover) });
            }
            None => {
                if let Some(b) = max_binding {
                    first_with_max.insert(b, src);
                }
                out.insert(src, Stabilized::new(in_loop, cover));
            }
        }
    }
    Ok(out)
}

/// Per node of `g` (by [`NodeId::index`]): whether it is an exp that needs no running max, a
/// user's own `exp(x - max(x, axis))` ([`at_most_one`]) whose underflow far below the max no
/// later op turns into an infinity ([`underflow_harmless`]). Decided on the whole graph a
/// launch computes, before it is partitioned, so that ops in later kernels count too; each
/// kernel learns its share through [`KernelIo::bounded_exps`].
pub fn bounded_exps(g: &Graph) -> Vec<bool> {
    let users = g.users();
    // A graph computed transposed reads an input through a transpose per use: two nodes, one
    // class of elements.
    let class = crate::plan::rows::same_elements(g);
    g.ids()
        .map(|id| {
            g.node(id).op == Op::Unary(UnaryOp::Exp) && at_most_one(g, &class, id) && underflow_harmless(g, &users, id)
        })
        .collect()
}

/// Whether `exp` is `exp(x - max(x, axis))`, a user's own shift by the max along some axis
/// (the same `x`: one class of `class`, [`same_elements`](crate::plan::rows::same_elements)):
/// rounding is monotone, so no rounded `x - max` exceeds zero and the exp is at most one in
/// f32 as in exact arithmetic.
fn at_most_one(g: &Graph, class: &[NodeId], exp: NodeId) -> bool {
    let d = g.node(exp).args[0];
    let n = g.node(d);
    if n.op != Op::Binary(BinaryOp::Sub) {
        return false;
    }
    let (x, m) = (n.args[0], n.args[1]);
    matches!(g.node(m).op, Op::Reduce(ReduceOp::Max, _)) && class[g.node(m).args[0].index()] == class[x.index()]
}

/// Whether the values computed from `exp` element by element never become a divisor, a
/// reciprocal or a log, nor reach a reduction: far below its max, `exp(x - max)` underflows to
/// zero in f32, which such an op would turn into an infinity where the true result is finite.
/// Sums, products and the other functions of a zero stay within an absolute error the size of
/// the smallest f32.
fn underflow_harmless(g: &Graph, users: &[Vec<NodeId>], exp: NodeId) -> bool {
    let mut seen = vec![false; g.nodes.len()];
    let mut stack = vec![exp];
    while let Some(x) = stack.pop() {
        for &u in &users[x.index()] {
            let n = g.node(u);
            let harmful = match n.op {
                Op::Unary(UnaryOp::Log | UnaryOp::Recip | UnaryOp::Rsqrt) => true,
                Op::Binary(BinaryOp::Div) => n.args[1] == x,
                Op::Reduce(..) | Op::MatMul => true,
                _ => false,
            };
            if harmful {
                return false;
            }
            if !std::mem::replace(&mut seen[u.index()], true) {
                stack.push(u);
            }
        }
    }
    true
}

/// The reductions of `ops` (the nodes of `level`) that consume `src` linearly, each with what
/// its running max would cover, and the first reduction (if any) that consumes it in a way no
/// running max stabilizes. `per_element_input`: `src` is a scaled partial whose max was stored
/// per element, which only slice-by-slice reductions merge.
fn linear_reductions(
    g: &Graph,
    src: NodeId,
    per_element_input: bool,
    level: &ItGraph,
    ops: &[NodeId],
) -> (Vec<(NodeId, Cover)>, Option<NodeId>) {
    use Dependence::{FromReduction, Independent, Linear, NonLinear};
    let mut state: BTreeMap<NodeId, Dependence> = BTreeMap::new();
    let mut reds = Vec::new();
    let mut bad = None;
    for &id in ops {
        let n = g.node(id);
        let a: Vec<Dependence> = n.args.iter().map(|x| state.get(x).copied().unwrap_or(Independent)).collect();
        let is_reduction = matches!(n.op, Op::MatMul | Op::Reduce(..));
        let dep = if id == src {
            Linear
        } else if a.iter().all(|x| *x == Independent) {
            Independent
        } else if is_reduction {
            // A matmul must take the source as its left operand: the running max is per row of
            // the left operand.
            // A scaled partial input merges along any axis (the combine sums over the split);
            // an exp's running max covers a row, so its reductions must run along the last axis.
            let along_rows = |axis: u32| {
                !per_element_input && (axis as usize + 1 == g.shape(n.args[0]).len() || g.node(src).op.is_leaf())
            };
            // An exp (or a partial stored with a max per element) summed slice by slice along a
            // non-last axis the loop walks, at the source's own rank (so that the axis names
            // the same tile axis on both).
            let by_slices = |axis: u32| {
                level.accumulates.contains(&id)
                    && g.shape(n.args[0]).len() == g.shape(src).len()
                    && level
                        .tmaps
                        .get(&n.args[0])
                        .and_then(|tm| tm.axes.get(axis as usize))
                        .is_some_and(|x| x.extent == 1)
            };
            let cover = match n.op {
                Op::MatMul if a[0] == Linear && a[1] == Independent && !per_element_input => Some(Cover::Row),
                Op::Reduce(_, axis) if a[0] == Linear && along_rows(axis) => Some(Cover::Row),
                Op::Reduce(_, axis) if a[0] == Linear && by_slices(axis) => Some(Cover::Element { axis }),
                _ => None,
            };
            if let Some(cover) = cover {
                reds.push((id, cover));
                FromReduction
            } else if a.contains(&NonLinear) || a.contains(&Linear) {
                bad.get_or_insert(id);
                NonLinear
            } else {
                FromReduction
            }
        } else if a.contains(&NonLinear) {
            NonLinear
        } else if a.contains(&FromReduction) {
            FromReduction
        } else {
            match n.op {
                Op::Unary(UnaryOp::Neg) | Op::Split(_) => Linear,
                Op::Binary(BinaryOp::Mul) if a.contains(&Independent) => Linear,
                Op::Binary(BinaryOp::Div) if a[1] == Independent => Linear,
                Op::Binary(BinaryOp::Add | BinaryOp::Sub) if a[0] == Linear && a[1] == Linear => Linear,
                _ => NonLinear,
            }
        };
        state.insert(id, dep);
    }
    (reds, bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::check_source;
    use crate::graph::{ReduceOp, ValidGraph};
    use crate::schedule::{configs, schedule, ItNode};

    /// A kernel with output `y: f32[m, 1]`; `body` holds one statement per line.
    fn graph(dims: &str, inputs: &str, body: &str) -> ValidGraph {
        let body: String = body.lines().map(|l| format!("      {l}\n")).collect();
        let src = format!(
            "kernels:\n  - name: k\n    dims: {dims}\n    inputs: {inputs}\n    outputs: {{ y: \"f32[m, 1]\" }}\n    body: |\n{body}"
        );
        let mut module = check_source(src.as_bytes()).unwrap_or_else(|d| panic!("{d:?}"));
        module.kernels.remove(0).1
    }

    /// A kernel with the given outputs.
    fn graph_with_output(dims: &str, inputs: &str, outputs: &str, body: &str) -> ValidGraph {
        let src = format!(
            "kernels:\n  - name: k\n    dims: {dims}\n    inputs: {inputs}\n    outputs: {outputs}\n    body: |\n      {body}\n"
        );
        let mut module = check_source(src.as_bytes()).unwrap_or_else(|d| panic!("{d:?}"));
        module.kernels.remove(0).1
    }

    /// The graph and the loop level of its reductions, under the first configuration that
    /// iterates them in tiles smaller than their axis.
    fn loop_level(dims: &str, inputs: &str, body: &str) -> (ValidGraph, ItGraph) {
        let g = graph(dims, inputs, body);
        for cfg in configs(&g) {
            let Ok(top) = schedule(&g, &cfg) else { continue };
            let inner = top.nodes.iter().find_map(|n| match n {
                ItNode::Inner(i) => Some(i.as_ref().clone()),
                ItNode::Op(_) => None,
            });
            if let Some(inner) = inner {
                return (g, inner);
            }
        }
        panic!("no configuration puts a loop in {}", g.listing())
    }

    /// The graph and its top level under its first configuration, which has no loop.
    fn top_level(dims: &str, inputs: &str, body: &str) -> (ValidGraph, ItGraph) {
        let g = graph(dims, inputs, body);
        let top = schedule(&g, &configs(&g).remove(0)).expect("schedules");
        assert!(top.inners().next().is_none(), "the reductions fit one tile");
        (g, top)
    }

    fn node(g: &Graph, pred: impl Fn(&Op) -> bool) -> NodeId {
        g.ids().find(|id| pred(&g.node(*id).op)).expect("the node exists")
    }

    fn is_sum(op: &Op) -> bool {
        matches!(op, Op::Reduce(ReduceOp::Sum, _))
    }

    #[test]
    fn an_exp_feeding_a_row_sum_and_a_product_gets_one_running_max_over_both() {
        let (g, inner) = loop_level(
            "{ m: 64, l: 512, d: 64 }",
            "{ s: \"f32[m, l]\", v: \"f16[l, d]\", w: \"f16[d, 1]\" }",
            "e = exp(s)\ny = matmul(matmul(e, v) / sum(e, axis=-1), w)",
        );
        let stab = analyze(&g, &inner, &KernelIo::default()).expect("stabilizable");
        let st = &stab[&node(&g, |op| *op == Op::Unary(UnaryOp::Exp))];
        let mut accs = st.accumulators.clone();
        accs.sort();
        assert_eq!(accs, vec![node(&g, |op| *op == Op::MatMul), node(&g, is_sum)], "both are rescaled");
        assert_eq!(st.shares_max_with, None);
        assert_eq!(stab.len(), 1, "only the exp is a source: {stab:?}");
    }

    #[test]
    fn an_exp_reduced_within_one_tile_gets_a_one_shot_max() {
        let (g, top) = top_level("{ m: 64, l: 64 }", "{ s: \"f32[m, l]\" }", "y = log(sum(exp(s), axis=-1))");
        let stab = analyze(&g, &top, &KernelIo::default()).expect("stabilizable");
        let exp = node(&g, |op| *op == Op::Unary(UnaryOp::Exp));
        assert_eq!(stab[&exp], Stabilized::new(Vec::new(), Cover::Row));
    }

    #[test]
    fn an_exp_reduced_once_linearly_and_once_squared_is_refused() {
        let (g, inner) = loop_level(
            "{ m: 64, l: 512 }",
            "{ s: \"f32[m, l]\" }",
            "e = exp(s)\ny = sum(e, axis=-1) + sum(square(e), axis=-1)",
        );
        let squared = g.ids().filter(|id| is_sum(&g.node(*id).op)).last().expect("sums");
        assert_eq!(analyze(&g, &inner, &KernelIo::default()), Err(PlanError::ExpReduction(squared)));
    }

    #[test]
    fn an_exp_reaching_a_product_as_its_right_operand_is_refused() {
        // The running max is per row of a product's left operand; the right one has none.
        let (g, inner) = loop_level(
            "{ m: 64, l: 512 }",
            "{ s: \"f16[m, l]\", x: \"f32[m, l]\" }",
            "e = exp(x)\ny = sum(e, axis=-1) + sum(matmul(s, transpose(e)), axis=-1)",
        );
        let mm = node(&g, |op| *op == Op::MatMul);
        assert_eq!(analyze(&g, &inner, &KernelIo::default()), Err(PlanError::ExpReduction(mm)));
    }

    #[test]
    fn a_level_without_exps_has_no_sources_and_a_lone_exp_is_refused() {
        let (g, top) = top_level("{ m: 64, l: 64 }", "{ s: \"f32[m, l]\" }", "y = sum(s, axis=-1) * 2.0");
        assert_eq!(analyze(&g, &top, &KernelIo::default()), Ok(BTreeMap::new()));
        // exp(x) / (1 + exp(x)) overflows to inf / inf in f32 for x > 88 though the true value is
        // 1: an exp that no reduction stabilizes is the fallback's.
        let (g, top) =
            top_level("{ m: 64, l: 64 }", "{ s: \"f32[m, l]\" }", "e = exp(s)\ny = sum(e / (e + 1.0), axis=-1)");
        let sum = node(&g, is_sum);
        assert_eq!(analyze(&g, &top, &KernelIo::default()), Err(PlanError::ExpReduction(sum)));
        let (g, top) = top_level("{ m: 64, l: 64 }", "{ s: \"f32[m, l]\" }", "y = exp(sum(s, axis=-1))");
        let exp = node(&g, |op| *op == Op::Unary(UnaryOp::Exp));
        assert_eq!(analyze(&g, &top, &KernelIo::default()), Err(PlanError::UnstabilizedExp(exp)));
    }

    #[test]
    fn a_users_own_shift_by_the_max_is_computed_as_written_where_underflow_is_harmless() {
        let out = "{ y: \"f32[m, l]\" }";
        let level = |body: &str| {
            let g = graph_with_output("{ m: 64, l: 64 }", "{ s: \"f32[m, l]\", v: \"f32[m, l]\" }", out, body);
            let top = schedule(&g, &configs(&g).remove(0)).expect("schedules");
            let exp = node(&g, |op| *op == Op::Unary(UnaryOp::Exp));
            let bounded = bounded_exps(&g);
            let io =
                KernelIo { bounded_exps: g.ids().filter(|id| bounded[id.index()]).collect(), ..KernelIo::default() };
            (analyze(&g, &top, &io), exp)
        };
        // At most one: no running max, no source.
        for body in ["y = exp(s - max(s, axis=-1)) - v", "y = v * exp(s - max(s, axis=-1)) + sigmoid(v)"] {
            assert_eq!(level(body).0, Ok(BTreeMap::new()), "{body}");
        }
        // A shift by another tensor's max bounds nothing; a divisor or a log of the
        // underflowed exp is infinite where the true value is not.
        for body in [
            "y = exp(s - max(v, axis=-1))",
            "y = v / exp(s - max(s, axis=-1))",
            "y = log(exp(s - max(s, axis=-1))) * v",
            "y = recip(exp(s - max(s, axis=-1)) * v)",
        ] {
            let (got, exp) = level(body);
            assert_eq!(got, Err(PlanError::UnstabilizedExp(exp)), "{body}");
        }
    }

    /// Every loop level of `g`'s schedules that accumulates some reduction, under each
    /// configuration that has one.
    fn loop_levels(g: &ValidGraph) -> Vec<ItGraph> {
        configs(g)
            .iter()
            .filter_map(|cfg| schedule(g, cfg).ok())
            .filter_map(|top| {
                top.nodes.iter().find_map(|n| match n {
                    ItNode::Inner(i) if !i.accumulates.is_empty() => Some(i.as_ref().clone()),
                    _ => None,
                })
            })
            .collect()
    }

    #[test]
    fn an_exp_summed_slice_by_slice_gets_a_max_per_element() {
        // A loop that walks the column axis one row at a time accumulates each element's
        // column on its own: a running max per element stabilizes it, where a max per row
        // would let one column's large values underflow another's sums.
        let g = graph(
            "{ m: 64, n: 96 }",
            "{ x: \"f32[n, m]\", v: \"f32[n, m]\" }",
            "e = exp(x)\ny = transpose(sum(e * v, axis=0) / sum(e, axis=0))",
        );
        let exp = node(&g, |op| *op == Op::Unary(UnaryOp::Exp));
        let sums: Vec<NodeId> = g.ids().filter(|id| is_sum(&g.node(*id).op)).collect();
        let levels = loop_levels(&g);
        assert!(!levels.is_empty());
        for inner in levels {
            assert_eq!(inner.tmaps[&exp].axes[0].extent, 1, "the loop walks single rows");
            let stab = analyze(&g, &inner, &KernelIo::default()).expect("stabilizable slice by slice");
            let mut accs = stab[&exp].accumulators.clone();
            accs.sort();
            assert_eq!((accs, stab[&exp].cover), (sums.clone(), Cover::Element { axis: 0 }));
        }
    }

    #[test]
    fn an_exp_reduced_both_along_rows_and_slice_by_slice_is_refused() {
        // One running max serves all of a source's reductions; a row and an element cannot
        // share one.
        let g = graph(
            "{ m: 64, n: 96 }",
            "{ x: \"f32[n, m]\" }",
            "e = exp(x)\ny = transpose(sum(e, axis=0)) / sum(sum(e, axis=-1), axis=0)",
        );
        let mut seen = 0;
        for inner in loop_levels(&g) {
            let e = node(&g, |op| *op == Op::Unary(UnaryOp::Exp));
            if inner.tmaps.get(&e).is_some_and(|tm| tm.axes[0].extent == 1) {
                let got = analyze(&g, &inner, &KernelIo::default());
                assert!(matches!(got, Err(PlanError::ExpReduction(_))), "{got:?}");
                seen += 1;
            }
        }
        assert!(seen > 0, "no level walks the rows one at a time");
    }

    #[test]
    fn an_exp_whose_row_max_an_earlier_kernel_stored_needs_no_reduction() {
        // The second kernel of a row-first softmax: `exp(x) / s`, `s` stored with its max.
        let g = graph_with_output(
            "{ m: 64, l: 64 }",
            "{ x: \"f32[m, l]\", s: \"f32[m, 1]\" }",
            "{ y: \"f32[m, l]\" }",
            "y = exp(x) / s",
        );
        let top = schedule(&g, &configs(&g).remove(0)).expect("schedules");
        let exp = node(&g, |op| *op == Op::Unary(UnaryOp::Exp));
        let s = node(&g, |op| *op == Op::Input(1));
        assert_eq!(analyze(&g, &top, &KernelIo::default()), Err(PlanError::UnstabilizedExp(exp)));
        let max = Binding::Workspace(1);
        let io = KernelIo {
            scaled_inputs: [(1, max)].into_iter().collect(),
            shifted_exps: [(exp, max)].into_iter().collect(),
            ..KernelIo::default()
        };
        let stab = analyze(&g, &top, &io).expect("stabilizable");
        let on_stored = Stabilized { stored_max: Some(max), ..Stabilized::new(Vec::new(), Cover::Row) };
        assert_eq!((&stab[&exp], &stab[&s]), (&on_stored, &on_stored));
    }

    #[test]
    fn scaled_partials_sharing_a_max_share_one_running_max() {
        // Two partial sums of one split, both stored against the same running max.
        let (g, inner) = loop_level(
            "{ m: 64, p: 8 }",
            "{ a: \"f32[p, m, 1]\", b: \"f32[p, m, 1]\" }",
            "y = sum(a, axis=0) / sum(b, axis=0)",
        );
        let max = Binding::Workspace(9);
        let io = KernelIo { scaled_inputs: [(0, max), (1, max)].into_iter().collect(), ..KernelIo::default() };
        let stab = analyze(&g, &inner, &io).expect("stabilizable");
        let (a, b) = (node(&g, |op| *op == Op::Input(0)), node(&g, |op| *op == Op::Input(1)));
        assert_eq!(
            stab[&b],
            Stabilized { shares_max_with: Some(a), ..Stabilized::new(Vec::new(), Cover::Row) },
            "{stab:?}"
        );
        assert!(!stab[&a].accumulators.is_empty(), "the first partial's max rescales both sums");
    }
}
