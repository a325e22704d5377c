//! Split-K: the search finds Split graphs whose combine sums over the split axis, recovery
//! lists the concrete split counts, and each Split graph is partitioned into a split kernel and
//! a combine kernel.

mod common;

use cleave_core::graph::{DimKind, Graph, Op, ReduceOp};
use cleave_core::plan::{partition, Part};
use cleave_core::superopt::{search, SearchOptions, SearchResult};

fn options() -> SearchOptions {
    SearchOptions { full_shape_budget_macs: 1 << 22, ..SearchOptions::default() }
}

fn run(g: &cleave_core::graph::ValidGraph) -> SearchResult {
    let r = search(g, &options()).expect("search runs");
    assert_eq!(r.stop_reason.name(), "exhausted");
    r
}

/// True when every reduction over a split count is a sum over axis 0 (the combine).
fn combines_sum_over_the_split_axis(g: &Graph) -> bool {
    let mut any = false;
    for n in &g.nodes {
        if let Op::Reduce(r, axis) = n.op {
            let d = g.shape(n.args[0])[axis as usize];
            if let Some(v) = d.var() {
                if matches!(g.dims.get(v).kind, DimKind::SplitCount { .. }) {
                    any = true;
                    if r != ReduceOp::Sum || axis != 0 {
                        return false;
                    }
                }
            }
        }
    }
    any
}

#[test]
fn decode_attention_gets_split_kv_graphs() {
    let r = run(&common::shipped("mha_d64_decode"));
    let split: Vec<_> = r.graphs.iter().filter(|f| f.has_split()).collect();
    assert!(!split.is_empty(), "{}", cleave_core::superopt::explain_text(&r));
    assert!(split.iter().all(|f| combines_sum_over_the_split_axis(&f.graph)));
    // The split-KV FlashAttention form: div(sum₀(matmul(exp, split v)), sum₀(sum(exp))).
    let flash_split = split.iter().find(|f| {
        let g = f.graph.graph();
        let n = g.node(g.outputs[0].node);
        if n.op != Op::Binary(cleave_core::graph::BinaryOp::Div) {
            return false;
        }
        let [num, den] = [n.args[0], n.args[1]].map(|a| g.node(a));
        num.op == Op::Reduce(ReduceOp::Sum, 0)
            && den.op == Op::Reduce(ReduceOp::Sum, 0)
            && g.node(num.args[0]).op == Op::MatMul
            && matches!(g.node(den.args[0]).op, Op::Reduce(ReduceOp::Sum, _))
    });
    let f = flash_split.expect("the split-KV FlashAttention form");
    // The context axis is dynamic: the ladder, predicated, with ragged chunks of ceil(l/s).
    let counts: Vec<u64> = f.concrete.iter().map(|c| c.splits[0].value).collect();
    assert_eq!(counts, vec![2, 4, 8, 16, 32]);
    for c in &f.concrete {
        let s = &c.splits[0];
        assert!(s.predicated);
        assert_eq!(c.graph.dims.get(s.of).name, "l");
        assert_eq!(c.graph.dims.get(s.count).value, s.value);
        let chunk = c
            .graph
            .dims
            .iter()
            .find(|(_, d)| matches!(d.kind, DimKind::SplitChunk { count, .. } if count == s.count))
            .expect("a chunk variable")
            .1;
        assert_eq!(chunk.value, 4096u64.div_ceil(s.value));
        assert!(chunk.dynamic);
        // The partition: the two sums over s_l start the combine kernel, which ends with the
        // division; exp, the row sum and the PV matmul are in the split kernel.
        let p = partition(&c.graph).expect("a partition");
        assert_eq!(p.combine_roots.len(), 2);
        assert_eq!(p.kernels.len(), 2, "a split kernel and a combine kernel");
        let g = c.graph.graph();
        assert_eq!(p.part[g.outputs[0].node.index()], Part::Combine);
        assert_eq!(p.workspaces.len(), 2, "the partial row sums and the partial PV products");
        for w in &p.workspaces {
            let node = w.node.expect("a partial");
            assert_eq!(g.shape(node)[0].var().map(|v| &g.dims.get(v).kind), Some(&DimKind::SplitCount { of: s.of }));
            assert_eq!(w.shape, g.shape(node));
        }
        assert!(g.ids().filter(|id| g.node(*id).op == Op::MatMul).all(|id| p.part[id.index()] == Part::Split));
    }
}

#[test]
fn small_row_matmul_gets_split_k() {
    let r = run(&common::shipped("matmul_decode"));
    let f = r.graphs.iter().find(|f| f.has_split()).expect("a Split-K graph");
    let g = f.graph.graph();
    assert_eq!(g.expr(g.outputs[0].node), "sum(matmul(split(x, axis=1), split(w, axis=0)), axis=0)");
    assert!(combines_sum_over_the_split_axis(g));
    // k = 4096 is static: divisors up to the cap, exact chunks.
    let counts: Vec<u64> = f.concrete.iter().map(|c| c.splits[0].value).collect();
    assert_eq!(counts, vec![2, 4, 8, 16, 32, 64]);
    for c in &f.concrete {
        let s = &c.splits[0];
        assert!(!s.predicated);
        let cg = c.graph.graph();
        let matmul = cg.ids().find(|id| cg.node(*id).op == Op::MatMul).expect("matmul");
        // [s_k, b, n] with s_k set to the split count.
        assert_eq!(cg.dims.show_values(cg.shape(matmul)), format!("[s_k={}, b=16, n=4096]", s.value));
        let p = partition(&c.graph).expect("a split graph has a partition");
        assert_eq!(p.nodes(Part::Split).len(), 3, "two splits and the matmul");
        assert_eq!(p.nodes(Part::Combine), p.combine_roots);
        assert_eq!(p.workspaces.iter().map(|w| w.node).collect::<Vec<_>>(), vec![Some(matmul)]);
    }
    // The plain matmul is found too, and has one concrete candidate without splits.
    let plain = r.graphs.iter().find(|f| !f.has_split()).expect("the declared form");
    assert_eq!(plain.concrete.len(), 1);
    assert!(plain.concrete[0].splits.is_empty());
    let p = partition(&plain.concrete[0].graph).expect("one kernel");
    assert!(p.kernels.len() == 1 && p.combine_roots.is_empty() && p.workspaces.is_empty());
    assert_eq!(r.candidates().count(), 7);
}

#[test]
fn non_divisible_dynamic_axes_are_predicated() {
    let g = common::graph(
        r#"
kernels:
  - name: k
    dims: { b: { value: 3, dynamic: true }, k: { value: 1000, dynamic: true }, n: 24 }
    inputs: { x: "f32[b, k]", w: "f32[k, n]" }
    outputs: { y: "f32[b, n]" }
    body: "y = matmul(x, w)"
"#,
    );
    let r = run(&g);
    let f = r.graphs.iter().find(|f| f.has_split()).expect("a split graph");
    let chunks: Vec<(u64, u64)> = f
        .concrete
        .iter()
        .map(|c| {
            let s = &c.splits[0];
            let chunk =
                c.graph.dims.iter().find(|(_, d)| matches!(d.kind, DimKind::SplitChunk { .. })).expect("chunk").1;
            assert!(chunk.dynamic);
            (s.value, chunk.value)
        })
        .collect();
    assert_eq!(chunks, vec![(2, 500), (4, 250), (8, 125), (16, 63), (32, 32)]);
}

#[test]
fn static_axes_use_divisors_only() {
    let g = common::graph(
        r#"
kernels:
  - name: k
    dims: { b: 3, k: 90, n: 5 }
    inputs: { x: "f32[b, k]", w: "f32[k, n]" }
    outputs: { y: "f32[b, n]" }
    body: "y = matmul(x, w)"
"#,
    );
    let r = run(&g);
    let f = r.graphs.iter().find(|f| f.has_split()).expect("a split graph");
    let counts: Vec<u64> = f.concrete.iter().map(|c| c.splits[0].value).collect();
    assert_eq!(counts, vec![2, 3, 5, 6, 9, 10, 15, 18, 30, 45]);
}

#[test]
fn a_mean_over_a_dynamic_split_gets_no_ragged_candidates() {
    // Averaging a ragged part would divide by the wrong count, so graphs that take a mean over
    // a split part of a dynamic axis keep no predicated split counts, and say why.
    let g = common::graph(
        r#"
kernels:
  - name: k
    dims: { b: 4, k: { value: 96, dynamic: true } }
    inputs: { x: "f32[b, k]" }
    outputs: { y: "f32[b, 1]" }
    body: "y = mean(x, axis=-1)"
"#,
    );
    let r = run(&g);
    let mean_split = r
        .graphs
        .iter()
        .find(|f| f.has_split() && f.graph.nodes.iter().any(|n| matches!(n.op, Op::Reduce(ReduceOp::Mean, 0))))
        .expect("mean(mean(split(x))) is equivalent on equal parts");
    assert!(mean_split.concrete.is_empty());
    assert!(mean_split.notes.iter().any(|n| n.contains("ragged")), "{:?}", mean_split.notes);
}

#[test]
fn split_off_finds_no_split_graphs() {
    let g = common::shipped("mha_d64_decode");
    let r = search(&g, &SearchOptions { split: false, ..options() }).expect("search runs");
    assert!(!r.graphs.is_empty());
    assert!(r.graphs.iter().all(|f| !f.has_split()));
    assert_eq!(r.max_ops, 7);
}

#[test]
fn a_split_search_cut_short_still_finds_every_graph_without_a_split() {
    // The space without Split is a corner of the space with it, searched last when the search
    // walks it depth-first to a larger size bound. MHA decode: 171 states without Split,
    // 21062 with it.
    let g = common::shipped("mha_d64_decode");
    let plain = search(&g, &SearchOptions { split: false, ..options() }).expect("search runs");
    assert_eq!(plain.stop_reason.name(), "exhausted");
    assert!(plain.without_split.is_none());
    let cut = search(&g, &SearchOptions { max_states: 1000, ..options() }).expect("search runs");
    assert_eq!(cut.stop_reason.name(), "state_limit");
    let phase = cut.without_split.as_ref().expect("the search without Split follows");
    assert_eq!(phase.stop_reason.name(), "exhausted");
    assert_eq!(phase.states_explored, plain.states_explored);
    for f in &plain.graphs {
        assert!(cut.graphs.iter().any(|c| c.graph == f.graph), "{}", cleave_core::superopt::explain_text(&plain));
    }
    // Found once each, fewest ops first.
    for (i, a) in cut.graphs.iter().enumerate() {
        assert!(cut.graphs[i + 1..].iter().all(|b| b.graph != a.graph), "a graph found twice");
    }
    assert!(cut.graphs.windows(2).all(|w| w[0].graph.op_count() <= w[1].graph.op_count()));
    // Its graphs without a split are exactly those of the smaller space, which it searched
    // whole; the second phase added those the first had not reached.
    let unsplit: Vec<_> = cut.graphs.iter().filter(|f| !f.has_split()).collect();
    assert_eq!(unsplit.len(), plain.graphs.len());
    assert!(phase.graphs_added >= 1 && phase.graphs_added <= plain.graphs.len(), "{phase:?}");
    // The search without the cut needs no second phase.
    assert!(run(&g).without_split.is_none());
    let text = cleave_core::superopt::summary_text(&cut);
    assert!(text.contains("then without split: "), "{text}");
    assert!(cleave_core::superopt::to_json(&cut).contains("\"without_split\""));
    assert!(!cleave_core::superopt::to_json(&plain).contains("\"without_split\""));
}
