//! Reductions down a column, computed as reductions along a row.
//!
//! A tile schedule reduces along the block's columns: its loops walk the last axis of what
//! they reduce. A reduction over the next-to-last axis (a column sum, a mean over a sequence,
//! batch statistics, a softmax down a column) has no such loop as written: it walks one row
//! per step, or falls back to the stage kernels. [`transpose_columns`] rewrites such a graph
//! so that every value is computed with its last two axes swapped:
//!
//! - each input is read through a transpose, which the lowering stages as a transposed tile
//!   (`LoadT`: the tensor's last axis becomes the block's rows);
//! - a reduction over either of the last two axes reduces the other one;
//! - each output is the transpose of the value that computes it, which the block holds in its
//!   own orientation and the store writes back in the declared one (`StoreT`).
//!
//! Every element is computed by the same operations from the same operands, so the rewrite
//! changes no result; it changes which axis the block's rows run along, so that the row
//! machinery (loops over the reduced axis, running maxima, row-first kernels, splits along the
//! row) serves columns too. The pipeline ranks the rewritten graph next to the declared one.

use crate::graph::{validate, Dim, Graph, NodeId, Op, ValidGraph};

/// `axis` of a rank-`rank` tensor after its last two axes trade places.
fn swapped(axis: u32, rank: usize) -> u32 {
    let a = axis as usize;
    if a + 1 == rank {
        axis - 1
    } else if a + 2 == rank {
        axis + 1
    } else {
        axis
    }
}

/// `g` computed with the last two axes of every value swapped (see the module), when some
/// live reduction runs down a column (over the next-to-last axis, of more than one element).
/// `None` where the rewrite does not apply: no such reduction; a product or a mask, whose
/// axes have fixed roles; or a value of rank one, which has no second axis to swap.
pub fn transpose_columns(g: &ValidGraph) -> Option<ValidGraph> {
    transpose_columns_traced(g).map(|(t, _)| t)
}

/// [`transpose_columns`], with the node of `g` each node of the rewrite computes (an input's
/// or an output's added transpose, the node it transposes).
pub fn transpose_columns_traced(g: &ValidGraph) -> Option<(ValidGraph, Vec<NodeId>)> {
    let live = g.live();
    let mut column = false;
    for id in g.ids().filter(|id| live[id.index()]) {
        let n = g.node(id);
        if g.shape(id).len() == 1 {
            return None;
        }
        match n.op {
            Op::MatMul | Op::Mask(_) => return None,
            Op::Reduce(_, axis) => {
                let shape = g.shape(n.args[0]);
                column |= axis as usize + 2 == shape.len() && matches!(shape[axis as usize], Dim::Var(_));
            }
            _ => {}
        }
    }
    if !column {
        return None;
    }
    let mut sg = Graph::new(g.name.clone(), g.dims.clone());
    let mut map: Vec<Option<NodeId>> = vec![None; g.nodes.len()];
    // A transpose of a transpose is the value itself: the rewrite never stacks two.
    let transpose = |sg: &mut Graph, x: NodeId| -> Option<NodeId> {
        match sg.node(x).op {
            Op::Transpose => Some(sg.node(x).args[0]),
            _ => sg.add(Op::Transpose, &[x]).ok(),
        }
    };
    for input in &g.inputs {
        let x = sg.add_input(input.decl.clone());
        let seen = if live[input.node.index()] && g.shape(input.node).len() >= 2 { transpose(&mut sg, x)? } else { x };
        map[input.node.index()] = Some(seen);
    }
    for id in g.ids() {
        if !live[id.index()] || map[id.index()].is_some() {
            continue;
        }
        let n = g.node(id);
        let args: Vec<NodeId> = n.args.iter().map(|a| map[a.index()]).collect::<Option<_>>()?;
        let new = match n.op {
            Op::Const(c) => sg.constant(c),
            Op::Transpose => transpose(&mut sg, args[0])?,
            Op::Reduce(op, axis) => sg.add(Op::Reduce(op, swapped(axis, g.shape(n.args[0]).len())), &args).ok()?,
            // The parts stack on a new leading axis, so the result's last two axes are the
            // operand's, swapped alike.
            Op::Split(axis) => sg.add(Op::Split(swapped(axis, g.shape(n.args[0]).len())), &args).ok()?,
            op @ (Op::Unary(_) | Op::Binary(_)) => sg.add(op, &args).ok()?,
            Op::Input(_) | Op::MatMul | Op::Mask(_) => return None,
        };
        map[id.index()] = Some(new);
    }
    for o in &g.outputs {
        let v = map[o.node.index()]?;
        let node = if sg.shape(v).len() >= 2 { transpose(&mut sg, v)? } else { v };
        sg.add_output(o.decl.clone(), node);
    }
    let mut origin: Vec<Option<NodeId>> = vec![None; sg.nodes.len()];
    for (input, seen) in g.inputs.iter().zip(&sg.inputs) {
        origin[seen.node.index()] = Some(input.node);
    }
    for (old, new) in map.iter().enumerate() {
        if let Some(new) = new {
            origin[new.index()].get_or_insert(NodeId(old as u32));
        }
    }
    // What is left are added transposes, each after the node it transposes.
    for i in 0..origin.len() {
        if origin[i].is_none() {
            origin[i] = sg.nodes[i].args.first().and_then(|a| origin[a.index()]);
        }
    }
    let origin = origin.into_iter().collect::<Option<Vec<NodeId>>>()?;
    Some((validate(sg).ok()?, origin))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::check_source;
    use crate::graph::Bindings;
    use crate::reference::{eval, max_rel_err, random_inputs, InputScale};

    fn graph(dims: &str, inputs: &str, outputs: &str, body: &str) -> ValidGraph {
        let text = format!(
            "kernels:\n  - name: t\n    dims: {{ {dims} }}\n    inputs: {{ {inputs} }}\n    \
             outputs: {{ {outputs} }}\n    body: |\n      {body}\n"
        );
        check_source(text.as_bytes()).expect("checks").kernels.remove(0).1
    }

    #[test]
    fn a_column_reduction_becomes_a_row_reduction_of_the_transposed_input() {
        let g = graph("n: 37, d: 5", "x: \"f32[n, d]\"", "y: \"f32[1, d]\"", "y = sum(x, axis=0)");
        let t = transpose_columns(&g).expect("a column sum");
        assert_eq!(t.expr(t.outputs[0].node), "transpose(sum(transpose(x), axis=1))");
        // Each node of the rewrite traces to the node it computes, an added transpose to what
        // it transposes.
        let (t, origin) = transpose_columns_traced(&g).expect("a column sum");
        let traced: Vec<(&str, &str)> =
            t.ids().map(|id| (t.node(id).op.name(), g.node(origin[id.index()]).op.name())).collect();
        let sum = g.node(g.outputs[0].node).op.name();
        assert_eq!(traced, [("input", "input"), ("transpose", "input"), (sum, sum), ("transpose", sum)]);
    }

    #[test]
    fn the_rewrite_computes_what_was_declared() {
        // Batch statistics, a softmax down a column, and a pooled mean over a sequence scaled
        // per column, each against the f64 reference of the declaration it came from.
        let cases = [
            graph(
                "n: 37, d: 5",
                "x: \"f32[n, d]\"",
                "m: \"f32[1, d]\", v: \"f32[1, d]\"",
                "m = mean(x, axis=0)\n      v = mean((x - m) * (x - m), axis=0)",
            ),
            graph("n: 37, d: 5", "x: \"f32[n, d]\"", "y: \"f32[n, d]\"", "y = softmax(x, axis=0)"),
            graph(
                "b: 3, n: 11, d: 4",
                "x: \"f16[b, n, d]\", w: \"f32[1, d]\"",
                "y: \"f32[b, 1, d]\"",
                "y = mean(x, axis=1) * w",
            ),
        ];
        for g in cases {
            let t = transpose_columns(&g).expect("a column reduction");
            let b = Bindings::of_table(&g.dims);
            let inputs = random_inputs(&g, &b, 7, &InputScale { default: 3.0, per_input: Vec::new() });
            let want = eval(&g, &b, &inputs).expect("the declared graph");
            let got = eval(&t, &b, &inputs).expect("the rewritten graph");
            for (w, x) in want.iter().zip(&got) {
                assert_eq!(w.data.len(), x.data.len());
                assert!(max_rel_err(&x.data, &w.data) < 1e-12, "{}", t.expr(t.outputs[0].node));
            }
        }
    }

    #[test]
    fn rows_products_and_vectors_are_left_as_they_are() {
        let row = graph("n: 37, d: 5", "x: \"f32[n, d]\"", "y: \"f32[n, 1]\"", "y = sum(x, axis=-1)");
        assert!(transpose_columns(&row).is_none());
        let product = graph(
            "n: 37, d: 16, e: 16",
            "x: \"f16[n, d]\", w: \"f16[d, e]\"",
            "y: \"f32[1, e]\"",
            "y = sum(matmul(x, w), axis=0)",
        );
        assert!(transpose_columns(&product).is_none());
        let vector =
            graph("n: 37, d: 5", "x: \"f32[n, d]\", s: \"f32[d]\"", "y: \"f32[1, d]\"", "y = sum(x * s, axis=0)");
        assert!(transpose_columns(&vector).is_none());
    }
}
