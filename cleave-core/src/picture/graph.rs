//! Pictures of graphs: the declared one, and the one the search chose with what it rewrote
//! highlighted.

use std::collections::{BTreeMap, BTreeSet};

use super::layout::layered;
use super::svg::{text_width, Svg, LINE_H};
use crate::graph::{format_const, BinaryOp, Dim, Graph, NodeId, Op};

const MARGIN: f64 = 16.0;
const PAD: f64 = 10.0;
const BOX_H: f64 = 2.0 * LINE_H + 10.0;

/// Draws `g` top to bottom: inputs, ops (constant operands folded into their op's label) and
/// outputs, each op labelled with its name and shape.
///
/// With `declared`, the picture is of a graph the search found for that declaration: every op
/// whose value the declaration does not compute (up to the order of commutative operands) is
/// marked `rewritten`, so a division moved after a matmul stands out; `split` ops and the
/// reductions over a split's new axis, which merge the partial results, are marked `split`.
pub fn graph_svg(g: &Graph, title: &str, declared: Option<&Graph>) -> String {
    let live = g.live();
    let mut keys = Interner::default();
    let reference: BTreeSet<usize> = match declared {
        Some(d) => {
            let dl = d.live();
            let ks = keys.graph(d);
            d.ids().filter(|id| dl[id.index()]).map(|id| ks[id.index()]).collect()
        }
        None => BTreeSet::new(),
    };
    let own = keys.graph(g);
    let split_axes: BTreeSet<Dim> =
        g.nodes.iter().filter(|n| matches!(n.op, Op::Split(_))).filter_map(|n| n.shape.first().copied()).collect();

    // Boxes: live non-constant nodes in arena order (topological), then one per output.
    let mut boxes: Vec<NodeBox> = Vec::new();
    let mut box_of: BTreeMap<usize, usize> = BTreeMap::new();
    for id in g.ids().filter(|id| live[id.index()]) {
        let node = g.node(id);
        let (label, detail, class, data_op) = match node.op {
            Op::Const(_) => continue,
            Op::Input(i) => {
                let d = &g.inputs[i as usize].decl;
                (d.name.clone(), format!("{}{}", d.dtype, g.dims.show(&d.shape)), "node input".to_string(), None)
            }
            op => {
                let mut class = "node op".to_string();
                let split = match op {
                    Op::Split(_) => true,
                    Op::Reduce(_, axis) => node
                        .args
                        .first()
                        .and_then(|a| g.shape(*a).get(axis as usize))
                        .is_some_and(|d| split_axes.contains(d)),
                    _ => false,
                };
                let rewritten = declared.is_some() && !reference.contains(&own[id.index()]);
                if rewritten {
                    class.push_str(" rewritten");
                }
                if split {
                    class.push_str(" split");
                }
                (op_label(g, id), g.dims.show(&node.shape), class, Some(op.name()))
            }
        };
        box_of.insert(id.index(), boxes.len());
        boxes.push(NodeBox { label, detail, class, data_op, tooltip: tooltip(g, id) });
    }
    let first_output = boxes.len();
    for o in &g.outputs {
        boxes.push(NodeBox {
            label: o.decl.name.clone(),
            detail: format!("{}{}", o.decl.dtype, g.dims.show(&o.decl.shape)),
            class: "node output".to_string(),
            data_op: None,
            tooltip: format!("output {} <- {}", o.decl.name, g.label(o.node)),
        });
    }
    let mut edges = Vec::new();
    for id in g.ids().filter(|id| live[id.index()]) {
        let Some(&to) = box_of.get(&id.index()) else { continue };
        for a in &g.node(id).args {
            if let Some(&from) = box_of.get(&a.index()) {
                edges.push((from, to));
            }
        }
    }
    for (k, o) in g.outputs.iter().enumerate() {
        if let Some(&from) = box_of.get(&o.node.index()) {
            edges.push((from, first_output + k));
        }
    }

    let sizes: Vec<(f64, f64)> =
        boxes.iter().map(|b| (text_width(&b.label).max(text_width(&b.detail)) + 2.0 * PAD, BOX_H)).collect();
    let head = header_lines(title, declared.is_some());
    let top = MARGIN + head.len() as f64 * LINE_H + 8.0;
    let placed = layered(&sizes, &edges, (MARGIN, top));

    let mut svg = Svg::new();
    for (i, (class, line)) in head.iter().enumerate() {
        svg.text(MARGIN, MARGIN + (i as f64 + 0.8) * LINE_H, class, false, line);
    }
    for (route, &(a, b)) in placed.routes.iter().zip(&edges) {
        svg.edge(route, &[("data-from", &a.to_string()), ("data-to", &b.to_string())]);
    }
    for (i, b) in boxes.iter().enumerate() {
        let (cx, cy) = placed.centers[i];
        let (w, h) = sizes[i];
        let id = i.to_string();
        let mut attrs = vec![("data-box", id.as_str())];
        if let Some(op) = b.data_op {
            attrs.push(("data-op", op));
        }
        svg.open(&b.class, &attrs);
        svg.title(&b.tooltip);
        svg.rect(cx - w / 2.0, cy - h / 2.0, w, h, "", true);
        svg.text(cx, cy - 2.0, "", true, &b.label);
        svg.text(cx, cy + LINE_H - 2.0, "note", true, &b.detail);
        svg.close();
    }
    svg.finish(placed.width.max(header_width(&head)), placed.height)
}

struct NodeBox {
    label: String,
    detail: String,
    class: String,
    data_op: Option<&'static str>,
    tooltip: String,
}

fn header_lines(title: &str, chosen: bool) -> Vec<(&'static str, String)> {
    let mut lines = vec![("title", title.to_string())];
    if chosen {
        lines.push((
            "note",
            "orange: computed differently from the declaration (a moved division, a reassociation)".into(),
        ));
        lines.push(("note", "purple: split, and the reductions that merge the splits".into()));
    }
    lines
}

fn header_width(head: &[(&str, String)]) -> f64 {
    head.iter().map(|(_, l)| text_width(l) * 1.1).fold(0.0, f64::max) + 2.0 * MARGIN
}

/// An op's box label: its name, its axis, and any constant operands in place.
fn op_label(g: &Graph, id: NodeId) -> String {
    let node = g.node(id);
    let args: Vec<String> = node
        .args
        .iter()
        .map(|a| match g.node(*a).op {
            Op::Const(c) => format_const(c),
            _ => "·".to_string(),
        })
        .collect();
    match node.op {
        Op::Reduce(_, axis) | Op::Split(axis) => format!("{}(axis={axis})", node.op.name()),
        _ if node.args.iter().any(|a| matches!(g.node(*a).op, Op::Const(_))) => {
            format!("{}({})", node.op.name(), args.join(", "))
        }
        op => op.name().to_string(),
    }
}

fn tooltip(g: &Graph, id: NodeId) -> String {
    let node = g.node(id);
    if node.op.is_leaf() {
        return format!("input {}", g.label(id));
    }
    let args: Vec<String> = node.args.iter().map(|a| g.label(*a)).collect();
    format!("{} = {}({})  {}", g.label(id), node.op.name(), args.join(", "), g.dims.show(&node.shape))
}

/// Structural keys shared by two graphs: two nodes get the same key when they compute the same
/// expression of the same inputs, commutative operands in either order.
#[derive(Default)]
struct Interner {
    ids: BTreeMap<String, usize>,
}

impl Interner {
    fn graph(&mut self, g: &Graph) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::with_capacity(g.nodes.len());
        for node in &g.nodes {
            let mut args: Vec<usize> = node.args.iter().map(|a| out[a.index()]).collect();
            if matches!(node.op, Op::Binary(BinaryOp::Add | BinaryOp::Mul | BinaryOp::Max)) {
                args.sort_unstable();
            }
            let head = match node.op {
                Op::Input(i) => format!("input {}", g.inputs[i as usize].decl.name),
                Op::Const(c) => format!("const {}", format_const(c)),
                Op::Reduce(_, axis) | Op::Split(axis) => format!("{} {axis}", node.op.name()),
                op => op.name().to_string(),
            };
            let key = format!("{head}({args:?})");
            let next = self.ids.len();
            out.push(*self.ids.entry(key).or_insert(next));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::check_source;

    fn kernel(src: &str) -> Graph {
        let module = check_source(src.as_bytes()).unwrap_or_else(|d| panic!("{d:?}"));
        module.kernels[0].1.graph().clone()
    }

    const SOFTMAX_V: &str = "kernels:\n  - name: t\n    dims: {s: 64, l: 64, d: 16}\n    inputs:\n      q: f16[s, d]\n      k: f16[l, d]\n      v: f16[l, d]\n    outputs:\n      o: f16[s, d]\n    body: |\n      p = exp(matmul(q, transpose(k)))\n      o = matmul(p / sum(p, axis=-1), v)\n";

    const MOVED: &str = "kernels:\n  - name: t\n    dims: {s: 64, l: 64, d: 16}\n    inputs:\n      q: f16[s, d]\n      k: f16[l, d]\n      v: f16[l, d]\n    outputs:\n      o: f16[s, d]\n    body: |\n      p = transpose(exp(matmul(k, transpose(q))))\n      o = matmul(p, v) / sum(p, axis=-1)\n";

    #[test]
    fn a_graph_is_drawn_with_every_op_and_the_same_bytes_each_time() {
        let g = kernel(SOFTMAX_V);
        let a = graph_svg(&g, "declared", None);
        assert_eq!(a, graph_svg(&g, "declared", None));
        for op in ["matmul", "transpose", "exp", "sum", "div"] {
            assert!(a.contains(&format!("data-op=\"{op}\"")), "{op} missing:\n{a}");
        }
        assert!(!a.contains(" rewritten\""), "{a}");
        assert_eq!(a.matches("class=\"node input\"").count(), 3);
        assert_eq!(a.matches("class=\"node output\"").count(), 1);
    }

    #[test]
    fn what_the_declaration_does_not_compute_is_marked() {
        let declared = kernel(SOFTMAX_V);
        let same = graph_svg(&declared, "same", Some(&declared));
        assert!(!same.contains(" rewritten\""), "{same}");
        // A different graph: the division after the second matmul, and k @ q.T instead.
        let other = kernel(MOVED);
        let svg = graph_svg(&other, "other", Some(&declared));
        assert!(svg.contains("class=\"node op rewritten\" data-box=\"") && svg.contains("data-op=\"div\""), "{svg}");
        let div = svg.split("<g ").find(|g| g.contains("data-op=\"div\"")).unwrap_or_default();
        assert!(div.contains("rewritten"), "{div}");
        // exp(...) reads matmul(k, transpose(q)) here, which the declaration never computes.
        let exp = svg.split("<g ").find(|g| g.contains("data-op=\"exp\"")).unwrap_or_default();
        assert!(exp.contains("rewritten"), "{exp}");
    }
}
