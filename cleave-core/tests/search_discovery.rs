//! The search discovers the rewrites the paper motivates, from naively written kernels, with a
//! generic rule set: FlashAttention's late division for every attention variant, RMSNorm's
//! row scaling after the matmul, and reassociation of a matmul chain.

mod common;

use cleave_core::graph::{BinaryOp, Graph, NodeId, Op, ReduceOp, UnaryOp};
use cleave_core::superopt::{search, Check, SearchOptions, SearchResult};

/// Options for tests: the defaults, with a small budget for the declared-shape checks.
fn options() -> SearchOptions {
    SearchOptions { full_shape_budget_macs: 1 << 22, ..SearchOptions::default() }
}

fn run(kernel: &str) -> SearchResult {
    let g = common::shipped(kernel);
    let r = search(&g, &options()).unwrap_or_else(|e| panic!("{kernel}: {e}"));
    assert_eq!(r.stop_reason.name(), "exhausted", "{kernel} must be searched completely");
    assert_eq!(r.counters.repeated, 0, "{kernel}: the canonical order reaches each graph once");
    assert!(r.rejected.is_empty(), "{kernel}: a graph passed the small fingerprints but failed a final check");
    for f in &r.graphs {
        assert_eq!(f.checks.float, Check::Passed, "{kernel}: {}", f.graph.expr(f.graph.outputs[0].node));
    }
    r
}

fn op(g: &Graph, id: NodeId) -> Op {
    g.node(id).op
}

/// Strips transposes and splits: the tensor a view reads.
fn unview(g: &Graph, mut id: NodeId) -> NodeId {
    while matches!(op(g, id), Op::Transpose | Op::Split(_)) {
        id = g.node(id).args[0];
    }
    id
}

/// The FlashAttention form: `div(matmul(e, V), sum(e, last axis))` with `e = exp(..)` and `V` an
/// input: the normalization applied after the second matmul.
fn is_flash_form(g: &Graph) -> bool {
    let out = g.outputs[0].node;
    let n = g.node(out);
    if n.op != Op::Binary(BinaryOp::Div) {
        return false;
    }
    let (num, den) = (g.node(n.args[0]), g.node(n.args[1]));
    if num.op != Op::MatMul || !matches!(den.op, Op::Reduce(ReduceOp::Sum, _)) {
        return false;
    }
    let e = num.args[0];
    let last = (g.shape(e).len() - 1) as u32;
    op(g, e) == Op::Unary(UnaryOp::Exp)
        && matches!(op(g, unview(g, num.args[1])), Op::Input(_))
        && den.args[0] == e
        && den.op == Op::Reduce(ReduceOp::Sum, last)
}

/// The naive form as declared: `matmul(div(e, sum(e)), V)`.
fn is_naive_form(g: &Graph) -> bool {
    let n = g.node(g.outputs[0].node);
    n.op == Op::MatMul && op(g, n.args[0]) == Op::Binary(BinaryOp::Div)
}

fn assert_flash(kernel: &str) {
    let r = run(kernel);
    let flash: Vec<&Graph> = r.graphs.iter().map(|f| f.graph.graph()).filter(|g| is_flash_form(g)).collect();
    assert!(
        !flash.is_empty(),
        "{kernel}: no FlashAttention form among {} graphs:\n{}",
        r.graphs.len(),
        cleave_core::superopt::explain_text(&r)
    );
    assert!(r.graphs.iter().any(|f| is_naive_form(&f.graph)), "{kernel}: the declared form is found too");
    // The late division changes the graph only: same op count as the declared form.
    assert!(flash.iter().any(|g| g.op_count() == r.symbolic.graph.op_count()));
    // Each found graph maps back to the declared dims.
    for f in &r.graphs {
        assert!(!f.concrete.is_empty(), "{kernel}: a found graph without concrete candidates");
    }
}

#[test]
fn flash_attention_form_mha_d64() {
    assert_flash("mha_d64_prefill");
}

#[test]
fn flash_attention_form_mha_d128() {
    assert_flash("mha_d128_prefill");
}

#[test]
fn flash_attention_form_gqa() {
    assert_flash("gqa_prefill");
}

#[test]
fn flash_attention_form_mqa() {
    assert_flash("mqa_prefill");
}

#[test]
fn flash_attention_form_mla_prefill() {
    assert_flash("mla_prefill");
}

#[test]
fn flash_attention_form_mla_absorbed_decode() {
    assert_flash("mla_decode");
}

#[test]
fn rmsnorm_row_scaling_moves_after_the_matmul() {
    let r = run("rmsnorm_matmul_prefill");
    // Fig. 1: y = matmul(x, w) * rsqrt(mean(x²) + eps).
    let late = r.graphs.iter().map(|f| f.graph.graph()).find(|g| {
        let n = g.node(g.outputs[0].node);
        if n.op != Op::Binary(BinaryOp::Mul) {
            return false;
        }
        let is_plain_matmul = |id: NodeId| {
            let m = g.node(id);
            m.op == Op::MatMul && m.args.iter().all(|a| matches!(op(g, *a), Op::Input(_)))
        };
        let is_scale = |id: NodeId| op(g, id) == Op::Unary(UnaryOp::Rsqrt);
        (is_plain_matmul(n.args[0]) && is_scale(n.args[1])) || (is_plain_matmul(n.args[1]) && is_scale(n.args[0]))
    });
    assert!(late.is_some(), "no late-scaling form:\n{}", cleave_core::superopt::explain_text(&r));
}

#[test]
fn a_matmul_chain_is_reassociated() {
    // A·(B·C) is exactly what Mirage's lexicographic order cannot reach.
    let r = run("matmul_matmul_prefill");
    let right = r.graphs.iter().map(|f| f.graph.graph()).find(|g| {
        let n = g.node(g.outputs[0].node);
        n.op == Op::MatMul && op(g, n.args[0]) == Op::Input(0) && op(g, n.args[1]) == Op::MatMul
    });
    assert!(right.is_some(), "no q·(kᵀ·v):\n{}", cleave_core::superopt::explain_text(&r));
}

#[test]
fn a_row_sum_of_a_matmul_becomes_a_matrix_vector_product() {
    // sum(x·w, axis=-1) = x · sum(w, axis=-1): the sum moves into the matmul's operand.
    let r = run("matmul_rowsum_prefill");
    let mv = r.graphs.iter().map(|f| f.graph.graph()).find(|g| {
        let n = g.node(g.outputs[0].node);
        n.op == Op::MatMul && matches!(op(g, n.args[1]), Op::Reduce(ReduceOp::Sum, _))
    });
    assert!(mv.is_some(), "{}", cleave_core::superopt::explain_text(&r));
}

#[test]
fn kernels_with_two_outputs_are_searched_together() {
    let g = common::graph(
        r#"
kernels:
  - name: k
    dims: { b: 4, k: 6, n: 5 }
    inputs: { x: "f32[b, k]", w: "f32[k, n]" }
    outputs: { y: "f32[b, n]", z: "f32[b, 1]" }
    body: |
      y = matmul(x, w)
      z = sum(x * x, axis=-1)
"#,
    );
    let r = search(&g, &options()).expect("search runs");
    assert!(r.graphs.len() > 2, "{}", cleave_core::superopt::explain_text(&r));
    for f in &r.graphs {
        assert_eq!(f.graph.outputs.len(), 2);
        assert_eq!(f.checks.float, Check::Passed);
    }
    // Some graph splits k for both outputs.
    assert!(r.graphs.iter().any(|f| {
        let g = f.graph.graph();
        g.outputs.iter().all(|o| matches!(g.node(o.node).op, Op::Reduce(ReduceOp::Sum, 0)))
    }));
}

/// True when the graph splits the dim named `name` (its chunks reduced in a second step).
fn splits_dim(g: &Graph, name: &str) -> bool {
    g.dims.iter().any(|(_, d)| match d.kind {
        cleave_core::graph::DimKind::SplitCount { of } => g.dims.get(of).name == name,
        _ => false,
    })
}

#[test]
fn causal_serving_attention_finds_the_flashattention_form_and_split_kv() {
    // The masked scores take part in the search like any other op: the late division and a
    // split of the context (whose chunks the mask sees at their global positions) are found,
    // not templated, for the ragged, paged and MLA prefill operators.
    for kernel in [
        "gqa_ragged_prefill_causal_h32_kv4_d128",
        "gqa_paged_prefill_causal_h32_kv8_d128_ps1",
        "mla_paged_prefill_causal_h16_ckv512_kpe64_ps1",
    ] {
        let r = run(kernel);
        let masked = |g: &Graph| g.nodes.iter().any(|n| matches!(n.op, Op::Mask(_)));
        assert!(r.graphs.iter().all(|f| masked(&f.graph)), "{kernel}: every form keeps the mask");
        assert!(
            r.graphs.iter().any(|f| is_flash_form(&f.graph)),
            "{kernel}: no FlashAttention form:\n{}",
            cleave_core::superopt::explain_text(&r)
        );
        assert!(
            r.graphs.iter().any(|f| splits_dim(&f.graph, "kv_len")),
            "{kernel}: no split-KV form:\n{}",
            cleave_core::superopt::explain_text(&r)
        );
    }
}

#[test]
fn paged_decode_finds_split_kv_and_chooses_it() {
    // Decode has one query row per request: the context split is what fills the GPU, and the
    // ranking over many workloads picks it, with its count left to the launch.
    for kernel in ["gqa_paged_decode_h32_kv8_d128_ps64", "mla_paged_decode_h16_ckv512_kpe64_ps1"] {
        let r = run(kernel);
        assert!(r.graphs.iter().any(|f| splits_dim(&f.graph, "kv_len")), "{kernel}");
        let c = cleave_core::pipeline::compile(&common::shipped(kernel), &Default::default()).expect("compiles");
        let best = c.best();
        assert_eq!(best.kernels.len(), 2, "{kernel}: a split kernel and its log-sum-exp combine");
        assert!(splits_dim(best.graph.graph(), "kv_len"), "{kernel}");
        let plan = cleave_core::codegen::plan::plan_data(best, kernel).expect("plan data");
        let derived: Vec<&str> = plan.dims.iter().filter(|d| d.derive.is_some()).map(|d| d.name.as_str()).collect();
        assert_eq!(derived.len(), 1, "{kernel}: the split count is the launcher's, from the lengths: {derived:?}");
    }
}

#[test]
fn a_max_a_user_subtracts_in_a_log_sum_exp_cancels_out() {
    // `m + log(Σ exp(x − m))` and `x − m − log(Σ exp(x − m))` (log-softmax) with `m = max(x)`:
    // log turns the shifted sum's factor `exp(−m)` into a term `−m` that cancels, so the search
    // finds each form without the max, whose exps the scheduler stabilizes itself.
    for (what, body, out) in [
        ("log-sum-exp", "m = max(x, axis=-1)\n      y = m + log(sum(exp(x - m), axis=-1))", "f32[t, 1]"),
        ("log-softmax", "m = max(x, axis=-1)\n      y = x - m - log(sum(exp(x - m), axis=-1))", "f32[t, v]"),
    ] {
        let g = common::graph(&format!(
            "kernels:\n  - name: k\n    dims: {{ t: 6, v: 40 }}\n    inputs: {{ x: \"f32[t, v]\" }}\n    \
             outputs: {{ y: \"{out}\" }}\n    body: |\n      {body}\n"
        ));
        let r = search(&g, &options()).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(r.stop_reason.name(), "exhausted", "{what}");
        assert!(r.rejected.is_empty(), "{what}");
        let unshifted = r.graphs.iter().find(|f| {
            let g = f.graph.graph();
            !g.nodes.iter().any(|n| matches!(n.op, Op::Reduce(ReduceOp::Max, _) | Op::Split(_)))
                && g.op_count() + 2 <= r.symbolic.graph.op_count()
        });
        let f = unshifted.unwrap_or_else(|| panic!("{what}: {}", cleave_core::superopt::explain_text(&r)));
        assert_eq!(f.checks.float, Check::Passed, "{what}");
    }
}

#[test]
fn the_log_of_a_softmax_is_found_as_a_difference() {
    // A log turns the quotient it takes into a difference of logs, so a search of
    // `log(softmax(x))` may subtract although the declaration never does, and finds
    // `x − log(Σ exp(x))`: no quotient, and no exp outside the reduction.
    let g = common::graph(
        "kernels:\n  - name: k\n    dims: { t: 6, v: 40 }\n    inputs: { x: \"f32[t, v]\" }\n    \
         outputs: { y: \"f32[t, v]\" }\n    body: |\n      y = log(softmax(x, axis=-1))\n",
    );
    let r = search(&g, &options()).expect("search");
    assert_eq!(r.stop_reason.name(), "exhausted");
    let difference = r.graphs.iter().find(|f| {
        let g = f.graph.graph();
        let count = |op: Op| g.nodes.iter().filter(|n| n.op == op).count();
        count(Op::Binary(BinaryOp::Sub)) == 1
            && count(Op::Binary(BinaryOp::Div)) == 0
            && count(Op::Unary(UnaryOp::Exp)) == 1
            && count(Op::Unary(UnaryOp::Log)) == 1
    });
    let f = difference.unwrap_or_else(|| panic!("{}", cleave_core::superopt::explain_text(&r)));
    assert_eq!(f.checks.float, Check::Passed);
    assert!(r.rejected.is_empty());
}
