//! Rows that an output spans and also reduces, as a softmax's (`exp(x) / sum(exp(x), axis=-1)`):
//! one kernel cannot tile the output along the row and also loop the reduction over it, so for
//! rows longer than a tile the one-kernel partition has no schedule.
//!
//! Two answers, both weighed against the one-kernel partition and the fallback by the ranking:
//! - [`row_first`], a partition: a first kernel computes those row reductions and stores them
//!   (a sum of exps scaled by its running max, next to that max; a kernel per level when one
//!   reduction is computed from another); the last recomputes the elementwise values it needs
//!   from the inputs rather than reading them back, with each exp shifted by the max stored
//!   for it. It reads the row once per kernel. The same partition serves a statistic computed
//!   from another along the same row (a variance from its mean), whose output does not span
//!   the row: the inner one is stored first.
//! - [`split_rows`], a rewrite: the same reductions over chunks of the row (Split-K), so that
//!   few rows still fill the GPU. Its split kernel stores each chunk's partials, and its
//!   combine kernel merges them and computes the output against the merged max.

use super::partition::{computed_right_operands, extract, Part, Partition, PartitionError, Workspace, WorkspaceType};
use crate::graph::{validate, Dim, DimVar, Graph, NodeId, Op, ReduceOp, UnaryOp, ValidGraph};
use crate::schedule::build::transposed_output;

/// The row-first partition of a graph, when it has one: the row reductions that an output
/// reads back across the row they reduce ([`row_reductions`]) are computed
/// first, with everything they depend on, and stored; one kernel per level of them, since a
/// reduction of values computed from another (a layer norm's variance of `x - mean(x)`) needs
/// that one whole. The last kernel computes the rest. Each kernel recomputes from the inputs
/// every value of an earlier kernel it needs but those reductions. `None` for a graph without
/// such a reduction, or with a split or a computed right operand (their own partitions come
/// first).
pub fn row_first(g: &ValidGraph) -> Option<Result<Partition, PartitionError>> {
    let live = g.live();
    let mut roots = row_reductions(g, &live);
    for r in statistics_of_statistics(g, &live) {
        if !roots.contains(&r) {
            roots.push(r);
        }
    }
    roots.sort();
    if roots.is_empty() || g.has_split() || computed_right_operands(g, &live).iter().any(|&p| p) {
        return None;
    }
    let is_root = |id: NodeId| roots.contains(&id);
    // A root's level: one more than the deepest root it is computed from.
    let mut level = vec![0u8; g.nodes.len()];
    for id in g.ids() {
        let below =
            g.node(id).args.iter().map(|a| level[a.index()].saturating_add(u8::from(is_root(*a)))).max().unwrap_or(0);
        level[id.index()] = below;
    }
    let levels = roots.iter().map(|r| level[r.index()]).max().unwrap_or(0);
    if levels >= MAX_ROW_LEVELS {
        return None;
    }
    // Each node of a root's cone goes to the lowest level whose root needs it.
    let mut part = vec![Part::Unused; g.nodes.len()];
    for &r in &roots {
        let l = level[r.index()];
        let mut stack = vec![r];
        while let Some(x) = stack.pop() {
            if g.node(x).op.is_leaf() || (x != r && is_root(x)) {
                continue;
            }
            match part[x.index()] {
                Part::Rows(k) if k <= l => continue,
                _ => part[x.index()] = Part::Rows(l),
            }
            stack.extend(g.node(x).args.iter().copied());
        }
    }
    for id in g.ids() {
        if g.node(id).op.is_leaf() {
            part[id.index()] = Part::Leaf;
        } else if transposed_output(g, id) && is_root(g.node(id).args[0]) {
            // An output that is a root transposed is stored, transposed, by the root's kernel:
            // the block holds the root in its own orientation only there.
            part[id.index()] = part[g.node(id).args[0].index()];
        } else if live[id.index()] && part[id.index()] == Part::Unused {
            part[id.index()] = Part::Split;
        }
    }
    let kernel_parts: Vec<Part> = (0..=levels).map(Part::Rows).chain([Part::Split]).collect();
    // Per kernel: the values of earlier kernels it computes again, down to the inputs or to a
    // stored row reduction.
    let again: Vec<Vec<bool>> = kernel_parts
        .iter()
        .map(|&kp| {
            let mut again = vec![false; part.len()];
            let mut stack: Vec<NodeId> =
                g.ids().filter(|id| part[id.index()] == kp).flat_map(|id| g.node(id).args.clone()).collect();
            while let Some(x) = stack.pop() {
                let earlier = matches!(part[x.index()], Part::Rows(_)) && part[x.index()] != kp;
                if !earlier || is_root(x) || std::mem::replace(&mut again[x.index()], true) {
                    continue;
                }
                stack.extend(g.node(x).args.iter().copied());
            }
            again
        })
        .collect();
    let users = g.users();
    let mut workspaces = Vec::new();
    for &r in &roots {
        let read = kernel_parts.iter().zip(&again).any(|(&kp, again)| {
            kp != part[r.index()] && users[r.index()].iter().any(|u| part[u.index()] == kp || again[u.index()])
        });
        if read {
            let name = format!("ws{}", workspaces.len());
            workspaces.push(Workspace {
                name,
                shape: g.shape(r).to_vec(),
                node: Some(r),
                ty: WorkspaceType::F32,
                storage: None,
            });
        }
    }
    let kernels = kernel_parts
        .iter()
        .zip(&again)
        .enumerate()
        .map(|(k, (&p, again))| extract(g, &part, again, k, (p, k + 1 == kernel_parts.len()), &workspaces))
        .collect::<Result<Vec<_>, _>>();
    let recomputed = (0..part.len()).map(|i| again.iter().any(|a| a[i])).collect();
    let same_elements = same_elements(g);
    let bounded_exps = super::lower::stabilize::bounded_exps(g);
    Some(kernels.map(|kernels| Partition {
        part,
        same_elements,
        bounded_exps,
        recomputed,
        combine_roots: Vec::new(),
        kernels,
        workspaces,
    }))
}

/// The most levels of row reductions computed from one another that get a kernel each.
const MAX_ROW_LEVELS: u8 = 4;

/// The live reductions along a last axis (of more than one element) whose result an output
/// spanning that axis reads through elementwise ops alone: a softmax's sum, a log-softmax's
/// log-sum-exp, an rmsnorm's mean of squares. Each block of a single kernel would have to hold
/// the output's whole row to compute them.
pub(crate) fn row_reductions(g: &Graph, live: &[bool]) -> Vec<NodeId> {
    let mut roots = Vec::new();
    for r in g.ids() {
        let n = g.node(r);
        let Op::Reduce(_, axis) = n.op else { continue };
        let arg = g.shape(n.args[0]);
        if !live[r.index()] || axis as usize + 1 != arg.len() {
            continue;
        }
        let Some(&row @ Dim::Var(_)) = arg.last() else { continue };
        // Forward from the reduction through elementwise ops only.
        let mut reached = vec![false; g.nodes.len()];
        reached[r.index()] = true;
        for id in g.ids().skip(r.index() + 1) {
            let m = g.node(id);
            let elementwise = matches!(m.op, Op::Unary(_) | Op::Binary(_) | Op::Mask(_));
            if elementwise && m.args.iter().any(|a| reached[a.index()]) {
                reached[id.index()] = true;
            }
        }
        // An output stored transposed spans the rows of the value it transposes.
        let spans = |o: NodeId| {
            let v = if transposed_output(g, o) { g.node(o).args[0] } else { o };
            reached[v.index()] && g.shape(v).last() == Some(&row)
        };
        if g.outputs.iter().any(|o| spans(o.node)) {
            roots.push(r);
        }
    }
    roots
}

/// The live reductions along a last axis that another reduction along the same axis reads
/// through elementwise ops without exps or logs: a variance's mean, `mean((x - m)^2)` with
/// `m = mean(x)`. The variance's loop needs the mean whole, so one kernel cannot compute both
/// from one pass over the row. (A reduction whose cone has an exp or a log, an entropy's
/// `sum(p · log p)`, is left to one kernel: its error there stays within the tolerance the
/// stored-max form exceeds.)
fn statistics_of_statistics(g: &Graph, live: &[bool]) -> Vec<NodeId> {
    let row_of = |r: NodeId| match g.node(r).op {
        Op::Reduce(_, axis) if axis as usize + 1 == g.shape(g.node(r).args[0]).len() => {
            match g.shape(g.node(r).args[0]).last() {
                Some(&v @ Dim::Var(_)) => Some(v),
                _ => None,
            }
        }
        _ => None,
    };
    let mut found = Vec::new();
    for outer in g.ids().filter(|id| live[id.index()]) {
        let Some(row) = row_of(outer) else { continue };
        let mut inner = Vec::new();
        let mut stack = g.node(outer).args.clone();
        let mut seen = vec![false; g.nodes.len()];
        let mut plain = true;
        while let Some(x) = stack.pop() {
            if std::mem::replace(&mut seen[x.index()], true) {
                continue;
            }
            let n = g.node(x);
            match n.op {
                Op::Reduce(..) if row_of(x) == Some(row) => inner.push(x),
                Op::Unary(UnaryOp::Exp | UnaryOp::Log) => plain = false,
                Op::Unary(_) | Op::Binary(_) => stack.extend(n.args.iter().copied()),
                _ => {}
            }
        }
        if plain {
            found.extend(inner.into_iter().filter(|r| !found.contains(r)).collect::<Vec<_>>());
        }
    }
    found
}

/// A row split: the rewritten graph and its split count.
#[derive(Clone, Debug)]
pub struct RowSplit {
    /// The graph whose row reductions run over chunks of the row.
    pub graph: ValidGraph,
    /// The split-count variable in its dim table.
    pub count: DimVar,
    /// The row's dim.
    pub of: DimVar,
}

/// The graph that computes each row reduction an output reads back across its row
/// ([`row_reductions`]) in `count` chunks: `r = red(y, axis=-1)` becomes
/// `red(red(y', axis=-1), axis=0)`, where `y'` is `y` computed from the inputs split along the
/// row. Exact for a sum or a max at any chunking (a mean would average ragged chunks wrongly).
/// The reductions come first in the new graph, so that a combine kernel merges them before it
/// computes anything from them. `None` where it does not apply: no such reduction, a split
/// already, reductions over different rows, or a reduction computed from anything but
/// elementwise ops of inputs that hold the row as their last axis or not at all (or, read
/// transposed, as their next-to-last axis: a column computed as a row, [`super::columns`]).
pub fn split_rows(g: &ValidGraph, count: u64) -> Option<RowSplit> {
    let live = g.live();
    let roots = row_reductions(g, &live);
    let &first = roots.first()?;
    if g.has_split() || count < 2 {
        return None;
    }
    let row_of = |r: NodeId| g.shape(g.node(r).args[0]).last().copied();
    let Some(Dim::Var(row)) = row_of(first) else { return None };
    for &r in &roots {
        let Op::Reduce(op, _) = g.node(r).op else { return None };
        if row_of(r) != Some(Dim::Var(row)) || !matches!(op, ReduceOp::Sum | ReduceOp::Max) {
            return None;
        }
    }
    // Every node a reduction is computed from: elementwise, over the row as the last axis or
    // broadcast along it.
    let mut cone = vec![false; g.nodes.len()];
    let mut stack: Vec<NodeId> = roots.iter().flat_map(|r| g.node(*r).args.clone()).collect();
    while let Some(x) = stack.pop() {
        if std::mem::replace(&mut cone[x.index()], true) {
            continue;
        }
        let shape = g.shape(x);
        let along = shape.iter().position(|d| *d == Dim::Var(row));
        if along.is_some_and(|a| a + 1 != shape.len()) {
            return None;
        }
        match g.node(x).op {
            Op::Input(_) | Op::Const(_) => {}
            // An input read transposed is split as it is read: its row is the tensor's
            // next-to-last axis.
            Op::Transpose if matches!(g.node(g.node(x).args[0]).op, Op::Input(_)) => {}
            Op::Unary(_) | Op::Binary(_) => stack.extend(g.node(x).args.iter().copied()),
            _ => return None,
        }
    }
    let mut sg = Graph::new(g.name.clone(), g.dims.clone());
    let (count_var, chunk) = sg.dims.split_vars(row);
    let info = g.dims.get(row).clone();
    sg.dims.get_mut(count_var).value = count;
    let ch = sg.dims.get_mut(chunk);
    ch.value = info.value.div_ceil(count);
    ch.dynamic = info.dynamic;
    let mut map: Vec<Option<NodeId>> = vec![None; g.nodes.len()];
    for (i, input) in g.inputs.iter().enumerate() {
        map[input.node.index()] = Some(sg.add_input(input.decl.clone()));
        debug_assert_eq!(g.node(input.node).op, Op::Input(i as u32));
    }
    let add = |sg: &mut Graph, op: Op, args: &[NodeId]| sg.add(op, args).ok();
    // The reductions over chunks first.
    let mut split_of: Vec<Option<NodeId>> = vec![None; g.nodes.len()];
    for &r in &roots {
        for x in g.ids().filter(|x| cone[x.index()]) {
            if split_of[x.index()].is_some() {
                continue;
            }
            let n = g.node(x);
            let new = match n.op {
                Op::Input(_) if g.shape(x).last() == Some(&Dim::Var(row)) => {
                    let axis = g.shape(x).len() as u32 - 1;
                    add(&mut sg, Op::Split(axis), &[map[x.index()]?])?
                }
                Op::Input(_) => map[x.index()]?,
                // An input read transposed: split like an input, where the row is its last
                // axis, and broadcast along it otherwise.
                Op::Transpose => {
                    let t = add(&mut sg, Op::Transpose, &[map[n.args[0].index()]?])?;
                    if g.shape(x).last() == Some(&Dim::Var(row)) {
                        add(&mut sg, Op::Split(g.shape(x).len() as u32 - 1), &[t])?
                    } else {
                        t
                    }
                }
                Op::Const(c) => sg.constant(c),
                op => {
                    let args: Option<Vec<NodeId>> = n.args.iter().map(|a| split_of[a.index()]).collect();
                    add(&mut sg, op, &args?)?
                }
            };
            split_of[x.index()] = Some(new);
        }
        let Op::Reduce(op, _) = g.node(r).op else { return None };
        let y = split_of[g.node(r).args[0].index()]?;
        let last = sg.shape(y).len() as u32 - 1;
        let part = add(&mut sg, Op::Reduce(op, last), &[y])?;
        map[r.index()] = Some(add(&mut sg, Op::Reduce(op, 0), &[part])?);
    }
    // Then everything else the outputs need, the reductions replaced by their merges.
    let mut needed = vec![false; g.nodes.len()];
    let mut stack: Vec<NodeId> = g.outputs.iter().map(|o| o.node).collect();
    while let Some(x) = stack.pop() {
        if roots.contains(&x) || std::mem::replace(&mut needed[x.index()], true) {
            continue;
        }
        stack.extend(g.node(x).args.iter().copied());
    }
    let rest: Vec<NodeId> = g.ids().filter(|x| needed[x.index()] && map[x.index()].is_none()).collect();
    for x in rest {
        let n = g.node(x);
        let new = match n.op {
            Op::Const(c) => sg.constant(c),
            op => {
                let args: Vec<NodeId> = n.args.iter().map(|a| map[a.index()]).collect::<Option<_>>()?;
                // A merge keeps the split's leading unit axis, and what is computed from it
                // gains that axis too: an axis counted from the front moves by one.
                let gained = |a: usize| sg.shape(args[a]).len().saturating_sub(g.shape(n.args[a]).len()) as u32;
                let op = match op {
                    Op::Reduce(r, axis) => Op::Reduce(r, axis + gained(0)),
                    Op::Split(axis) => Op::Split(axis + gained(0)),
                    op => op,
                };
                add(&mut sg, op, &args)?
            }
        };
        map[x.index()] = Some(new);
    }
    for o in &g.outputs {
        sg.add_output(o.decl.clone(), map[o.node.index()]?);
    }
    let graph = validate(sg).ok()?;
    Some(RowSplit { graph, count: count_var, of: row })
}

/// Per node: the first node of the graph that computes the same elements, seen through
/// splits (a split is a view, so `exp(split(x))` holds the elements of `exp(x)`). How a
/// combine kernel finds the exp whose running max a split kernel stored.
pub fn same_elements(g: &Graph) -> Vec<NodeId> {
    let mut class: Vec<NodeId> = Vec::with_capacity(g.nodes.len());
    let mut seen: Vec<(Op, Vec<NodeId>, NodeId)> = Vec::new();
    for id in g.ids() {
        let n = g.node(id);
        let c = match n.op {
            Op::Split(_) => class[n.args[0].index()],
            op => {
                let args: Vec<NodeId> = n.args.iter().map(|a| class[a.index()]).collect();
                match seen.iter().find(|(o, a, _)| *o == op && *a == args && !matches!(op, Op::Input(_))) {
                    Some((_, _, first)) => *first,
                    None => {
                        seen.push((op, args, id));
                        id
                    }
                }
            }
        };
        class.push(c);
    }
    class
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::check_source;
    use crate::plan::partition::KernelGraph;
    use crate::plan::program::Binding;

    /// A graph over `x: f32[s, k]` (and `v: f16[k, s]` where the body reads it).
    fn rows_graph(body: &str, outputs: &str) -> ValidGraph {
        let v = if body.contains(", v)") { ", v: \"f16[k, s]\"" } else { "" };
        let text = format!(
            "kernels:\n  - name: t\n    dims: {{ s: 40, k: 3000 }}\n    \
             inputs: {{ x: \"f32[s, k]\"{v} }}\n    outputs: {outputs}\n    body: |\n      {body}\n"
        );
        check_source(text.as_bytes()).expect("checks").kernels.remove(0).1
    }

    #[test]
    fn a_row_reduction_read_back_across_its_row_is_computed_first() {
        let g = rows_graph("e = exp(x)\n      y = e / sum(e, axis=-1)", "{ y: \"f32[s, k]\" }");
        let p = row_first(&g).expect("offered").expect("partitions");
        assert_eq!(p.kernels.len(), 2);
        let sum = g.ids().find(|id| matches!(g.node(*id).op, Op::Reduce(..))).expect("the sum");
        let exp = g.node(sum).args[0];
        assert_eq!(p.workspaces.iter().map(|w| w.node).collect::<Vec<_>>(), [Some(sum)], "only the sum is stored");
        assert_eq!(
            (p.part[exp.index()], p.recomputed[exp.index()]),
            (Part::Rows(0), true),
            "the exp is computed again"
        );
        let (first, second) = (&p.kernels[0], &p.kernels[1]);
        assert_eq!((&first.inputs[..], &first.outputs[..]), (&[Binding::Input(0)][..], &[Binding::Workspace(0)][..]));
        assert_eq!(
            (&second.inputs[..], &second.outputs[..]),
            (&[Binding::Input(0), Binding::Workspace(0)][..], &[Binding::Output(0)][..])
        );
        // Each kernel's nodes name the node they came from: both compute the one exp.
        let exps = |k: &KernelGraph| -> Vec<NodeId> {
            k.graph.ids().filter(|id| k.graph.node(*id).op == g.node(exp).op).map(|id| k.origin[id.index()]).collect()
        };
        assert_eq!((exps(first), exps(second)), (vec![exp], vec![exp]));
        // An output of the first part is stored by the first kernel.
        let g = rows_graph(
            "e = exp(x)\n      s = sum(e, axis=-1)\n      y = e / s",
            "{ y: \"f32[s, k]\", s: \"f32[s, 1]\" }",
        );
        let p = row_first(&g).expect("offered").expect("partitions");
        assert_eq!(p.kernels[0].outputs, [Binding::Workspace(0), Binding::Output(1)]);
    }

    #[test]
    fn a_statistic_of_a_statistic_gets_a_kernel_per_level_and_an_entropy_does_not() {
        // The variance's loop needs the mean whole: the mean's kernel stores it (as the output
        // it also is, and as the workspace the variance's kernel reads).
        let g = rows_graph(
            "m = mean(x, axis=-1)\n      v = mean(square(x - m), axis=-1)",
            "{ m: \"f32[s, 1]\", v: \"f32[s, 1]\" }",
        );
        let p = row_first(&g).expect("offered").expect("partitions");
        assert_eq!(p.kernels.len(), 2);
        assert_eq!(p.kernels[0].outputs, [Binding::Workspace(0), Binding::Output(0)]);
        assert_eq!(
            (&p.kernels[1].inputs[..], &p.kernels[1].outputs[..]),
            (&[Binding::Input(0), Binding::Workspace(0)][..], &[Binding::Output(1)][..])
        );
        // Down a column, computed transposed: the mean's kernel stores its output transposed.
        let cols = declared(
            "{ n: 300, d: 40 }",
            "{ x: \"f32[n, d]\" }",
            "{ m: \"f32[1, d]\", v: \"f32[1, d]\" }",
            "m = mean(x, axis=0)\n      v = mean(square(x - m), axis=0)",
        );
        let t = crate::plan::columns::transpose_columns(&cols).expect("a column reduction");
        let p = row_first(&t).expect("offered").expect("partitions");
        assert_eq!(p.kernels[0].outputs, [Binding::Workspace(0), Binding::Output(0)]);
        // An entropy reads its row's max and sum through an exp and a log: not this rule's.
        let e = rows_graph("p = softmax(x, axis=-1)\n      h = -sum(p * log(p), axis=-1)", "{ h: \"f32[s, 1]\" }");
        assert!(row_first(&e).is_none());
    }

    /// A declaration of `body` over the given dims and inputs.
    fn declared(dims: &str, inputs: &str, outputs: &str, body: &str) -> ValidGraph {
        let text = format!(
            "kernels:\n  - name: t\n    dims: {dims}\n    inputs: {inputs}\n    outputs: {outputs}\n    body: |\n      {body}\n"
        );
        check_source(text.as_bytes()).expect("checks").kernels.remove(0).1
    }

    /// The largest relative difference between the outputs of `g` and of its row split at
    /// `count`, in the f64 reference, at the extents `at` (and the declared ones elsewhere).
    fn split_error(g: &ValidGraph, count: u64, at: &[(&str, u64)]) -> f64 {
        use crate::graph::Bindings;
        use crate::reference::{eval, max_rel_err, random_inputs, InputScale};
        let rs = split_rows(g, count).expect("a row split");
        let mut b = Bindings::of_table(&rs.graph.dims);
        for (name, n) in at {
            b.values[rs.graph.dims.find(name).expect("a dim").index()] = *n;
        }
        b.complete(&rs.graph.dims);
        let bg = Bindings { values: b.values[..g.dims.len()].to_vec() };
        let inputs = random_inputs(g, &bg, 3, &InputScale { default: 30.0, per_input: Vec::new() });
        let want = eval(g, &bg, &inputs).expect("the declared graph");
        let got = eval(&rs.graph, &b, &inputs).expect("the split graph");
        want.iter().zip(&got).map(|(w, x)| max_rel_err(&x.data, &w.data)).fold(0.0, f64::max)
    }

    #[test]
    fn a_row_split_reduces_chunks_of_the_row_and_merges_them_first() {
        let g = declared(
            "{ b: { value: 8, dynamic: true }, v: { value: 32000, dynamic: true } }",
            "{ x: \"f32[b, v]\" }",
            "{ p: \"f32[b, v]\" }",
            "e = exp(x * 0.5)\n      p = e / sum(e, axis=-1)",
        );
        let rs = split_rows(&g, 8).expect("applies");
        let sg = &rs.graph;
        assert_eq!((sg.dims.get(rs.count).value, sg.dims.get(rs.of).name.as_str()), (8, "v"));
        // The chunk sums, then their merge, then the rest: a combine kernel merges first.
        let ops: Vec<Op> = sg.ids().map(|id| sg.node(id).op).filter(|op| !op.is_leaf()).collect();
        let merge = ops.iter().position(|op| *op == Op::Reduce(ReduceOp::Sum, 0)).expect("the merge");
        assert_eq!(ops[merge - 1], Op::Reduce(ReduceOp::Sum, 2), "chunk sums along the row: {ops:?}");
        assert!(matches!(ops[0], Op::Split(1)), "{ops:?}");
        assert!(ops[merge + 1..].contains(&Op::Unary(UnaryOp::Exp)), "the numerator after it");
        // Exact in the reference (which takes even chunks only; the interpreter's tests
        // cover the ragged last chunk), at one row too.
        for at in [[("b", 5), ("v", 1000)], [("b", 1), ("v", 64)]] {
            let e = split_error(&g, 8, &at);
            assert!(e < 1e-12, "{at:?}: {e}");
        }
    }

    #[test]
    fn a_reduction_of_values_computed_from_another_gets_a_kernel_of_its_own() {
        // A layer norm: the variance reduces `x - mean(x)`, so the mean is whole first.
        let g = declared(
            "{ t: { value: 16, dynamic: true }, d: 4096 }",
            "{ x: \"f32[t, d]\" }",
            "{ y: \"f32[t, d]\" }",
            "c = x - mean(x, axis=-1)\n      y = c * rsqrt(mean(square(c), axis=-1) + 1e-5)",
        );
        let p = row_first(&g).expect("offered").expect("partitions");
        assert_eq!(p.kernels.len(), 3);
        let means: Vec<NodeId> = g.ids().filter(|id| matches!(g.node(*id).op, Op::Reduce(ReduceOp::Mean, _))).collect();
        assert_eq!(means.iter().map(|m| p.part[m.index()]).collect::<Vec<_>>(), [Part::Rows(0), Part::Rows(1)]);
        assert_eq!(p.workspaces.iter().map(|w| w.node).collect::<Vec<_>>(), [Some(means[0]), Some(means[1])]);
        // `x - mean(x)` belongs to the variance's kernel; the last kernel computes it again
        // from the stored mean.
        let c = g.node(g.node(means[1]).args[0]).args[0];
        assert_eq!((p.part[c.index()], p.recomputed[c.index()]), (Part::Rows(1), true));
        assert_eq!(p.kernels[1].inputs, [Binding::Input(0), Binding::Workspace(0)]);
        assert_eq!(p.kernels[2].inputs, [Binding::Input(0), Binding::Workspace(0), Binding::Workspace(1)]);
    }

    #[test]
    fn the_combine_of_a_row_split_computes_the_numerator_itself() {
        // Stored by the split kernel, `exp(x)` would be written and read back whole.
        let g = declared(
            "{ b: { value: 8, dynamic: true }, v: { value: 32000, dynamic: true } }",
            "{ x: \"f32[b, v]\" }",
            "{ p: \"f32[b, v]\" }",
            "e = exp(x)\n      p = e / sum(e, axis=-1)",
        );
        let sg = split_rows(&g, 8).expect("applies").graph;
        let p = crate::plan::partition(&sg).expect("partitions");
        let exp = UnaryOp::Exp;
        let unsplit = sg.ids().filter(|id| sg.node(*id).op == Op::Unary(exp)).last().expect("the numerator");
        assert_eq!(p.part[unsplit.index()], Part::Combine);
        assert_eq!(p.workspaces.len(), 1, "only the chunks' partial sums are stored");
        assert_eq!(p.kernels[1].inputs, [Binding::Input(0), Binding::Workspace(0)]);
    }

    #[test]
    fn a_column_is_split_as_its_input_is_read_transposed() {
        // A softmax down the columns, computed transposed: the sum runs along the rows of
        // `transpose(x)`, which the split cuts into chunks; the combine reads `x` transposed
        // itself for the numerator, rather than the split kernel storing that view.
        let g = declared(
            "{ n: { value: 100000, dynamic: true }, c: 8 }",
            "{ x: \"f32[n, c]\" }",
            "{ y: \"f32[n, c]\" }",
            "y = softmax(x, axis=0)",
        );
        let t = crate::plan::columns::transpose_columns(&g).expect("a column softmax");
        let sg = split_rows(&t, 8).expect("applies").graph;
        let split = sg.ids().find(|id| matches!(sg.node(*id).op, Op::Split(_))).expect("a split");
        assert_eq!(sg.node(split).op, Op::Split(1), "along the transposed rows");
        assert_eq!(sg.node(sg.node(split).args[0]).op, Op::Transpose);
        let p = crate::plan::partition(&sg).expect("partitions");
        let views: Vec<NodeId> = sg.ids().filter(|id| sg.node(*id).op == Op::Transpose).collect();
        let read_whole =
            views.iter().find(|v| sg.users()[v.index()].iter().all(|u| *u != split)).expect("the numerator's");
        assert_eq!(p.part[read_whole.index()], Part::Combine);
        assert_eq!(p.workspaces.len(), 1, "only the chunks' partial sums are stored");
        for at in [[("n", 4000)], [("n", 8)]] {
            let e = split_error(&t, 8, &at);
            assert!(e < 1e-12, "{at:?}: {e}");
        }
        // A weight per column, read transposed too, broadcasts along the split row: it is not
        // split itself.
        let g = declared(
            "{ n: { value: 100000, dynamic: true }, c: 8 }",
            "{ x: \"f32[n, c]\", w: \"f32[1, c]\" }",
            "{ y: \"f32[n, c]\" }",
            "y = softmax(x * w, axis=0)",
        );
        let t = crate::plan::columns::transpose_columns(&g).expect("a column softmax");
        let sg = split_rows(&t, 8).expect("applies").graph;
        assert_eq!(sg.ids().filter(|id| matches!(sg.node(*id).op, Op::Split(_))).count(), 1, "x only");
        for at in [[("n", 4000)], [("n", 8)]] {
            let e = split_error(&t, 8, &at);
            assert!(e < 1e-12, "{at:?}: {e}");
        }
    }

    #[test]
    fn a_reduction_after_the_merge_keeps_reducing_the_axis_it_named() {
        // The merge adds a leading unit axis: `rmsnorm(r, axis=0)` of the row max `r` must
        // still average over the rows, not over that unit axis.
        let g = declared(
            "{ b: { value: 3, dynamic: true }, d: 32 }",
            "{ x: \"f32[b, d]\", y: \"f32[b, d]\" }",
            "{ r: \"f32[b, 1]\", z: \"f32[b, d]\" }",
            "m = max(x, axis=1)\n      r = rmsnorm(m, axis=0, eps=1e-5)\n      z = max(x, m) + y",
        );
        for count in [2, 4] {
            let e = split_error(&g, count, &[("b", 4)]);
            assert!(e < 1e-12, "{count}: {e}");
        }
    }

    #[test]
    fn no_row_split_of_a_mean_or_of_a_reduction_of_a_product() {
        // A mean of ragged chunks averages them wrongly; a product's operands are no
        // elementwise cone of the row.
        let dims = "{ b: { value: 8, dynamic: true }, v: { value: 3000, dynamic: true } }";
        let g = declared(dims, "{ x: \"f32[b, v]\" }", "{ y: \"f32[b, v]\" }", "y = x - mean(x, axis=-1)");
        assert!(split_rows(&g, 4).is_none());
        let g = declared(
            dims,
            "{ x: \"f16[b, v]\", w: \"f16[v, v]\" }",
            "{ y: \"f32[b, v]\" }",
            "s = matmul(x, w)\n      y = s / sum(s, axis=-1)",
        );
        assert!(split_rows(&g, 4).is_none());
    }

    #[test]
    fn a_split_is_seen_through_when_matching_elements() {
        let g = declared(
            "{ b: 8, v: 64 }",
            "{ x: \"f32[b, v]\" }",
            "{ p: \"f32[b, v]\" }",
            "e = exp(x)\n      p = e / sum(e, axis=-1)",
        );
        let sg = split_rows(&g, 4).expect("applies").graph;
        let same = same_elements(&sg);
        let exps: Vec<NodeId> = sg.ids().filter(|id| sg.node(*id).op == Op::Unary(UnaryOp::Exp)).collect();
        assert_eq!(exps.len(), 2, "the chunks' exp and the row's");
        assert_eq!(same[exps[0].index()], same[exps[1].index()]);
        let x = sg.ids().find(|id| sg.node(*id).op == Op::Input(0)).expect("x");
        assert_ne!(same[exps[0].index()], same[x.index()]);
    }

    #[test]
    fn no_row_first_partition_where_no_output_spans_a_reduced_row() {
        // A row sum reduced again, or read by an output along another axis (attention's
        // normalizer divides a `[s, d]` product), fits one kernel's loop.
        for (body, out) in [
            ("y = sum(exp(x), axis=-1) * 2.0", "{ y: \"f32[s, 1]\" }"),
            ("e = exp(x)\n      y = matmul(e, v) / sum(e, axis=-1)", "{ y: \"f32[s, s]\" }"),
            ("y = exp(x) * 2.0", "{ y: \"f32[s, k]\" }"),
        ] {
            assert!(row_first(&rows_graph(body, out)).is_none(), "{body}");
        }
    }
}
