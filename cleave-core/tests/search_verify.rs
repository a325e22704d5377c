//! The fingerprint verifier: equivalent rewrites are accepted, near misses are rejected.
//!
//! Candidates are built by hand over the symbolic target's dims, the way the search builds
//! them.

mod common;

use cleave_core::graph::{BinaryOp, Graph, Mask, NodeId, Op, ReduceOp, UnaryOp, ValidGraph};
use cleave_core::superopt::fingerprint::{equivalent, Verdict};
use cleave_core::symbolic::symbolize;

/// A candidate under construction over the target's symbols and inputs.
struct Cand {
    g: Graph,
    inputs: Vec<NodeId>,
}

impl Cand {
    fn new(target: &Graph) -> Cand {
        let mut g = Graph::new("candidate", target.dims.clone());
        let inputs = target.inputs.iter().map(|i| g.add_input(i.decl.clone())).collect();
        Cand { g, inputs }
    }
    fn i(&self, k: usize) -> NodeId {
        self.inputs[k]
    }
    fn c(&mut self, v: f64) -> NodeId {
        self.g.constant(v)
    }
    fn op(&mut self, op: Op, args: &[NodeId]) -> NodeId {
        self.g.add(op, args).unwrap_or_else(|e| panic!("{op}: {}", e.message(&self.g.dims)))
    }
    fn un(&mut self, u: UnaryOp, x: NodeId) -> NodeId {
        self.op(Op::Unary(u), &[x])
    }
    fn bin(&mut self, b: BinaryOp, x: NodeId, y: NodeId) -> NodeId {
        self.op(Op::Binary(b), &[x, y])
    }
    fn red(&mut self, r: ReduceOp, x: NodeId, axis: u32) -> NodeId {
        self.op(Op::Reduce(r, axis), &[x])
    }
    fn finish(mut self, target: &Graph, out: NodeId) -> Graph {
        self.g.add_output(target.outputs[0].decl.clone(), out);
        self.g
    }
}

fn symbolic(kernel_yaml_or_name: &str) -> ValidGraph {
    let concrete = if kernel_yaml_or_name.contains("kernels:") {
        common::graph(kernel_yaml_or_name)
    } else {
        common::shipped(kernel_yaml_or_name)
    };
    symbolize(&concrete).graph
}

fn verdict(target: &Graph, cand: &Graph) -> Verdict {
    // Two independent seeds, each with three instantiations.
    let a = equivalent(target, cand, 3, 1).expect("fingerprints");
    let b = equivalent(target, cand, 3, 2).expect("fingerprints");
    assert_eq!(a, b, "independent trials agree");
    a
}

const SCALE: f64 = 0.125;

/// Attention pieces over the symbolic `mha_d64_decode`: q, k, v are inputs 0, 1, 2.
fn scores(c: &mut Cand, scale: bool) -> NodeId {
    let kt = c.op(Op::Transpose, &[c.i(1)]);
    let s = c.op(Op::MatMul, &[c.i(0), kt]);
    if scale {
        let k = c.c(SCALE);
        c.bin(BinaryOp::Mul, s, k)
    } else {
        s
    }
}

#[test]
fn flash_attention_and_split_forms_are_accepted() {
    let t = symbolic("mha_d64_decode");
    // The FlashAttention form.
    let mut c = Cand::new(&t);
    let s = scores(&mut c, true);
    let e = c.un(UnaryOp::Exp, s);
    let r = c.red(ReduceOp::Sum, e, 2);
    let pv = c.op(Op::MatMul, &[e, c.i(2)]);
    let o = c.bin(BinaryOp::Div, pv, r);
    assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Equivalent);

    // The split-KV form: split k and v along l, combine both partial reductions with sums.
    let mut c = Cand::new(&t);
    let ks = c.op(Op::Split(1), &[c.i(1)]);
    let vs = c.op(Op::Split(1), &[c.i(2)]);
    let kt = c.op(Op::Transpose, &[ks]);
    let s = c.op(Op::MatMul, &[c.i(0), kt]);
    let k = c.c(SCALE);
    let s = c.bin(BinaryOp::Mul, s, k);
    let e = c.un(UnaryOp::Exp, s);
    let r = c.red(ReduceOp::Sum, e, 3);
    let r = c.red(ReduceOp::Sum, r, 0);
    let pv = c.op(Op::MatMul, &[e, vs]);
    let pv = c.red(ReduceOp::Sum, pv, 0);
    let o = c.bin(BinaryOp::Div, pv, r);
    assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Equivalent);

    // Max-stabilized softmax: exp(s − max s) / Σ exp(s − max s) equals the unstabilized one.
    let mut c = Cand::new(&t);
    let s = scores(&mut c, true);
    let m = c.red(ReduceOp::Max, s, 2);
    let d = c.bin(BinaryOp::Sub, s, m);
    let e = c.un(UnaryOp::Exp, d);
    let r = c.red(ReduceOp::Sum, e, 2);
    let p = c.bin(BinaryOp::Div, e, r);
    let o = c.op(Op::MatMul, &[p, c.i(2)]);
    assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Equivalent);
}

#[test]
fn attention_near_misses_are_rejected() {
    let t = symbolic("mha_d64_decode");
    let naive = |c: &mut Cand, s: NodeId, red: ReduceOp, axis: u32| {
        let e = c.un(UnaryOp::Exp, s);
        let r = c.red(red, e, axis);
        let p = c.bin(BinaryOp::Div, e, r);
        c.op(Op::MatMul, &[p, c.i(2)])
    };
    // Normalized over the wrong axis (the query rows instead of the keys).
    let mut c = Cand::new(&t);
    let s = scores(&mut c, true);
    let o = naive(&mut c, s, ReduceOp::Sum, 1);
    assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Different, "wrong axis");
    // The scale dropped.
    let mut c = Cand::new(&t);
    let s = scores(&mut c, false);
    let o = naive(&mut c, s, ReduceOp::Sum, 2);
    assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Different, "dropped scale");
    // A max where the sum is needed.
    let mut c = Cand::new(&t);
    let s = scores(&mut c, true);
    let o = naive(&mut c, s, ReduceOp::Max, 2);
    assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Different, "max for sum");
    // exp moved through the score matmul, where it does not commute.
    let mut c = Cand::new(&t);
    let k = c.c(SCALE);
    let qs = c.bin(BinaryOp::Mul, c.i(0), k);
    let eq = c.un(UnaryOp::Exp, qs);
    let kt = c.op(Op::Transpose, &[c.i(1)]);
    let ek = c.un(UnaryOp::Exp, kt);
    let e = c.op(Op::MatMul, &[eq, ek]);
    let r = c.red(ReduceOp::Sum, e, 2);
    let p = c.bin(BinaryOp::Div, e, r);
    let o = c.op(Op::MatMul, &[p, c.i(2)]);
    assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Different, "exp through a matmul");
    // The scale applied outside the exp: it cancels in the softmax, so this is the unscaled
    // attention, not the target.
    let mut c = Cand::new(&t);
    let s = scores(&mut c, false);
    let e = c.un(UnaryOp::Exp, s);
    let k = c.c(SCALE);
    let e = c.bin(BinaryOp::Mul, e, k);
    let r = c.red(ReduceOp::Sum, e, 2);
    let p = c.bin(BinaryOp::Div, e, r);
    let o = c.op(Op::MatMul, &[p, c.i(2)]);
    assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Different, "scale outside exp");
    // A split-KV form that forgets to combine the row sums (normalizes each part by its own).
    let mut c = Cand::new(&t);
    let ks = c.op(Op::Split(1), &[c.i(1)]);
    let vs = c.op(Op::Split(1), &[c.i(2)]);
    let kt = c.op(Op::Transpose, &[ks]);
    let s = c.op(Op::MatMul, &[c.i(0), kt]);
    let k = c.c(SCALE);
    let s = c.bin(BinaryOp::Mul, s, k);
    let e = c.un(UnaryOp::Exp, s);
    let r = c.red(ReduceOp::Sum, e, 3);
    let pv = c.op(Op::MatMul, &[e, vs]);
    let o = c.bin(BinaryOp::Div, pv, r);
    let o = c.red(ReduceOp::Sum, o, 0);
    assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Different, "per-part normalization");
}

#[test]
fn split_k_combines_with_a_sum_not_a_mean() {
    let t = symbolic("matmul_decode");
    let build = |red: ReduceOp, axis: u32| {
        let mut c = Cand::new(&t);
        let xs = c.op(Op::Split(1), &[c.i(0)]);
        let ws = c.op(Op::Split(0), &[c.i(1)]);
        let p = c.op(Op::MatMul, &[xs, ws]);
        let o = c.red(red, p, axis);
        c.finish(&t, o)
    };
    assert_eq!(verdict(&t, &build(ReduceOp::Sum, 0)), Verdict::Equivalent);
    assert_eq!(verdict(&t, &build(ReduceOp::Mean, 0)), Verdict::Different);
    assert_eq!(verdict(&t, &build(ReduceOp::Max, 0)), Verdict::Different);
}

#[test]
fn max_reductions_survive_any_split() {
    let t = symbolic(
        r#"
kernels:
  - name: k
    dims: { b: 4, k: 24 }
    inputs: { x: "f32[b, k]" }
    outputs: { y: "f32[b, 1]" }
    body: "y = max(x, axis=-1)"
"#,
    );
    let build = |combine: ReduceOp, inner: ReduceOp| {
        let mut c = Cand::new(&t);
        let xs = c.op(Op::Split(1), &[c.i(0)]);
        let m = c.red(inner, xs, 2);
        let o = c.red(combine, m, 0);
        c.finish(&t, o)
    };
    assert_eq!(verdict(&t, &build(ReduceOp::Max, ReduceOp::Max)), Verdict::Equivalent);
    assert_eq!(verdict(&t, &build(ReduceOp::Sum, ReduceOp::Max)), Verdict::Different);
    assert_eq!(verdict(&t, &build(ReduceOp::Max, ReduceOp::Sum)), Verdict::Different);
    // Binary max folds the same way as the reduction.
    let mut c = Cand::new(&t);
    let xs = c.op(Op::Split(1), &[c.i(0)]);
    let m = c.red(ReduceOp::Max, xs, 2);
    let o = c.red(ReduceOp::Max, m, 0);
    let o = c.bin(BinaryOp::Max, o, o);
    assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Equivalent);
}

#[test]
fn swapped_operands_of_a_square_matmul_are_rejected() {
    // `+ transpose(x)` forces every axis into one symbol, so swapping is shape-valid.
    let t = symbolic(
        r#"
kernels:
  - name: k
    dims: { n: 8 }
    inputs: { x: "f32[n, n]", w: "f32[n, n]" }
    outputs: { y: "f32[n, n]" }
    body: "y = matmul(x, w) + transpose(x)"
"#,
    );
    let mut c = Cand::new(&t);
    let m = c.op(Op::MatMul, &[c.i(1), c.i(0)]);
    let xt = c.op(Op::Transpose, &[c.i(0)]);
    let o = c.bin(BinaryOp::Add, m, xt);
    assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Different);
    // (x·w) = ((wᵀ·xᵀ))ᵀ is accepted.
    let mut c = Cand::new(&t);
    let wt = c.op(Op::Transpose, &[c.i(1)]);
    let xt = c.op(Op::Transpose, &[c.i(0)]);
    let m = c.op(Op::MatMul, &[wt, xt]);
    let m = c.op(Op::Transpose, &[m]);
    let o = c.bin(BinaryOp::Add, xt, m);
    assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Equivalent);
}

#[test]
fn reassociation_and_late_scaling_are_accepted() {
    let t = symbolic("matmul_matmul_decode");
    let mut c = Cand::new(&t);
    let kt = c.op(Op::Transpose, &[c.i(1)]);
    let kv = c.op(Op::MatMul, &[kt, c.i(2)]);
    let o = c.op(Op::MatMul, &[c.i(0), kv]);
    assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Equivalent);

    let t = symbolic("rmsnorm_matmul_decode");
    let eps = t.nodes.iter().find_map(|n| if let Op::Const(v) = n.op { Some(v) } else { None }).expect("eps");
    let late = |c: &mut Cand, mean: ReduceOp, split: bool| {
        let x = c.i(0);
        let sq = c.un(UnaryOp::Square, x);
        let ms = if split {
            let s = c.op(Op::Split(1), &[sq]);
            let inner = c.red(mean, s, 2);
            c.red(mean, inner, 0)
        } else {
            c.red(mean, sq, 1)
        };
        let e = c.c(eps);
        let a = c.bin(BinaryOp::Add, ms, e);
        let r = c.un(UnaryOp::Rsqrt, a);
        let m = c.op(Op::MatMul, &[x, c.i(1)]);
        c.bin(BinaryOp::Mul, m, r)
    };
    for (mean, split, want) in [
        (ReduceOp::Mean, false, Verdict::Equivalent),
        (ReduceOp::Mean, true, Verdict::Equivalent),
        (ReduceOp::Sum, false, Verdict::Different),
        (ReduceOp::Sum, true, Verdict::Different),
    ] {
        let mut c = Cand::new(&t);
        let o = late(&mut c, mean, split);
        let g = c.finish(&t, o);
        assert_eq!(verdict(&t, &g), want, "{}", g.expr(g.outputs[0].node));
    }
}

#[test]
fn nested_exp_is_fingerprinted_consistently() {
    let t = symbolic(
        r#"
kernels:
  - name: k
    dims: { m: 6, k: 9 }
    inputs: { x: "f32[m, k]", y: "f32[m, k]" }
    outputs: { z: "f32[m, 1]" }
    body: "z = sum(exp(exp(x) * exp(y)), axis=-1)"
"#,
    );
    // exp(exp(x)·exp(y)) = exp(exp(x + y)): the inner identity holds exactly, the outer exp is
    // a consistent function of it.
    let mut c = Cand::new(&t);
    let s = c.bin(BinaryOp::Add, c.i(0), c.i(1));
    let e = c.un(UnaryOp::Exp, s);
    let e = c.un(UnaryOp::Exp, e);
    let o = c.red(ReduceOp::Sum, e, 1);
    assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Equivalent);
    // exp(exp(x) + exp(y)) is different.
    let mut c = Cand::new(&t);
    let ex = c.un(UnaryOp::Exp, c.i(0));
    let ey = c.un(UnaryOp::Exp, c.i(1));
    let s = c.bin(BinaryOp::Add, ex, ey);
    let e = c.un(UnaryOp::Exp, s);
    let o = c.red(ReduceOp::Sum, e, 1);
    assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Different);
}

/// Causal attention with more keys than queries (a prefix): `q`, `k`, `v` are inputs 0, 1, 2.
const CAUSAL: &str = r#"
kernels:
  - name: k
    dims: { s: { value: 24, dynamic: true }, l: { value: 40, dynamic: true }, d: 16 }
    inputs: { q: "f16[s, d]", k: "f16[l, d]", v: "f16[l, d]" }
    outputs: { o: "f16[s, d]" }
    body: |
      o = matmul(softmax(causal(matmul(q, transpose(k)) * 0.125)), v)
"#;

/// `causal(q · kᵀ · 0.125)` with the given diagonal (`None`: no mask), over `k` (or its
/// split along the keys).
fn masked_scores(c: &mut Cand, diagonal: Option<i32>, k: NodeId) -> NodeId {
    let kt = c.op(Op::Transpose, &[k]);
    let s = c.op(Op::MatMul, &[c.i(0), kt]);
    let scale = c.c(SCALE);
    let s = c.bin(BinaryOp::Mul, s, scale);
    match diagonal {
        Some(diagonal) => c.op(Op::Mask(Mask::Causal { diagonal }), &[s]),
        None => s,
    }
}

#[test]
fn causal_flash_and_split_forms_are_accepted() {
    let t = symbolic(CAUSAL);
    // The FlashAttention form over masked scores.
    let mut c = Cand::new(&t);
    let k = c.i(1);
    let s = masked_scores(&mut c, Some(0), k);
    let e = c.un(UnaryOp::Exp, s);
    let r = c.red(ReduceOp::Sum, e, 1);
    let pv = c.op(Op::MatMul, &[e, c.i(2)]);
    let o = c.bin(BinaryOp::Div, pv, r);
    assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Equivalent);
    // Split-KV: the mask of a chunk of keys is the mask at the keys' global positions.
    let mut c = Cand::new(&t);
    let ks = c.op(Op::Split(0), &[c.i(1)]);
    let vs = c.op(Op::Split(0), &[c.i(2)]);
    let s = masked_scores(&mut c, Some(0), ks);
    let e = c.un(UnaryOp::Exp, s);
    let r = c.red(ReduceOp::Sum, e, 2);
    let r = c.red(ReduceOp::Sum, r, 0);
    let pv = c.op(Op::MatMul, &[e, vs]);
    let pv = c.red(ReduceOp::Sum, pv, 0);
    let o = c.bin(BinaryOp::Div, pv, r);
    assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Equivalent);
}

#[test]
fn causal_near_misses_are_rejected() {
    let t = symbolic(CAUSAL);
    let softmax_pv = |c: &mut Cand, s: NodeId| {
        let e = c.un(UnaryOp::Exp, s);
        let r = c.red(ReduceOp::Sum, e, 1);
        let p = c.bin(BinaryOp::Div, e, r);
        c.op(Op::MatMul, &[p, c.i(2)])
    };
    // The boundary one row up or down: each row sees one key more, or one fewer.
    for (diagonal, what) in [(Some(1), "one key more"), (Some(-1), "one key fewer"), (None, "no mask")] {
        let mut c = Cand::new(&t);
        let k = c.i(1);
        let s = masked_scores(&mut c, diagonal, k);
        let o = softmax_pv(&mut c, s);
        assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Different, "{what}");
    }
    // The mask of the transposed scores (aligned at the other corner), transposed back.
    let mut c = Cand::new(&t);
    let k = c.i(1);
    let s = masked_scores(&mut c, None, k);
    let st = c.op(Op::Transpose, &[s]);
    let m = c.op(Op::Mask(Mask::Causal { diagonal: 0 }), &[st]);
    let s = c.op(Op::Transpose, &[m]);
    let o = softmax_pv(&mut c, s);
    assert_eq!(verdict(&t, &c.finish(&t, o)), Verdict::Different, "mirrored mask");
    // Split-KV with each chunk masked as if it started at key 0 is not expressible: a mask
    // sees global positions. The mask after the exp leaves -inf in the sums instead of 0.
    let mut c = Cand::new(&t);
    let k = c.i(1);
    let s = masked_scores(&mut c, None, k);
    let e = c.un(UnaryOp::Exp, s);
    let e = c.op(Op::Mask(Mask::Causal { diagonal: 0 }), &[e]);
    let r = c.red(ReduceOp::Sum, e, 1);
    let p = c.bin(BinaryOp::Div, e, r);
    let o = c.op(Op::MatMul, &[p, c.i(2)]);
    assert_ne!(verdict(&t, &c.finish(&t, o)), Verdict::Equivalent, "mask after exp");
}

/// A row's log-sum-exp written with its own max, and `log(softmax(x))`: `x` is input 0.
const LSE: &str = r#"
kernels:
  - name: k
    dims: { m: 6, k: 9 }
    inputs: { x: "f32[m, k]" }
    outputs: { z: "f32[m, 1]" }
    body: |
      mx = max(x, axis=-1)
      z = mx + log(sum(exp(x - mx), axis=-1))
"#;

const LOG_SOFTMAX: &str = r#"
kernels:
  - name: k
    dims: { m: 6, k: 9 }
    inputs: { x: "f32[m, k]" }
    outputs: { y: "f32[m, k]" }
    body: "y = log(softmax(x, axis=-1))"
"#;

/// `log(Σ exp(x − shift))` over the last axis, plus `shift` when `add_back`.
fn lse_of(c: &mut Cand, shift: Option<NodeId>, add_back: bool) -> NodeId {
    let x = c.i(0);
    let d = match shift {
        Some(m) => c.bin(BinaryOp::Sub, x, m),
        None => x,
    };
    let e = c.un(UnaryOp::Exp, d);
    let r = c.red(ReduceOp::Sum, e, 1);
    let l = c.un(UnaryOp::Log, r);
    match (shift, add_back) {
        (Some(m), true) => c.bin(BinaryOp::Add, m, l),
        _ => l,
    }
}

#[test]
fn log_sum_exp_forms_are_accepted_whatever_the_shift() {
    // log is a homomorphism from products to sums in the fingerprints, so the max a user
    // subtracts and adds back cancels: the plain form, and a shift by any other row value.
    let t = symbolic(LSE);
    let mut c = Cand::new(&t);
    let z = lse_of(&mut c, None, false);
    assert_eq!(verdict(&t, &c.finish(&t, z)), Verdict::Equivalent, "unshifted");
    let mut c = Cand::new(&t);
    let m = c.red(ReduceOp::Sum, c.i(0), 1);
    let z = lse_of(&mut c, Some(m), true);
    assert_eq!(verdict(&t, &c.finish(&t, z)), Verdict::Equivalent, "shifted by the row sum");

    // log(softmax(x)) = x − log(Σ exp(x)) = x − m − log(Σ exp(x − m)).
    let t = symbolic(LOG_SOFTMAX);
    let mut c = Cand::new(&t);
    let l = lse_of(&mut c, None, false);
    let y = c.bin(BinaryOp::Sub, c.i(0), l);
    assert_eq!(verdict(&t, &c.finish(&t, y)), Verdict::Equivalent, "x − lse");
    let mut c = Cand::new(&t);
    let m = c.red(ReduceOp::Max, c.i(0), 1);
    let l = lse_of(&mut c, Some(m), true);
    let y = c.bin(BinaryOp::Sub, c.i(0), l);
    assert_eq!(verdict(&t, &c.finish(&t, y)), Verdict::Equivalent, "x − stabilized lse");
}

#[test]
fn log_sum_exp_near_misses_are_rejected() {
    let t = symbolic(LSE);
    // The shift subtracted and not added back.
    let mut c = Cand::new(&t);
    let m = c.red(ReduceOp::Max, c.i(0), 1);
    let z = lse_of(&mut c, Some(m), false);
    assert_eq!(verdict(&t, &c.finish(&t, z)), Verdict::Different, "shift not added back");
    // The max added to the unshifted log-sum-exp.
    let mut c = Cand::new(&t);
    let m = c.red(ReduceOp::Max, c.i(0), 1);
    let l = lse_of(&mut c, None, false);
    let z = c.bin(BinaryOp::Add, m, l);
    assert_eq!(verdict(&t, &c.finish(&t, z)), Verdict::Different, "max added twice");
    // A mean in place of the sum: off by log(k).
    let mut c = Cand::new(&t);
    let e = c.un(UnaryOp::Exp, c.i(0));
    let r = c.red(ReduceOp::Mean, e, 1);
    let z = c.un(UnaryOp::Log, r);
    assert_eq!(verdict(&t, &c.finish(&t, z)), Verdict::Different, "mean for sum");
    // The sum itself, with no log: known mod p only against a target known mod q only, so
    // the two share nothing to compare, which must not pass for agreement.
    let mut c = Cand::new(&t);
    let e = c.un(UnaryOp::Exp, c.i(0));
    let r = c.red(ReduceOp::Sum, e, 1);
    assert_eq!(verdict(&t, &c.finish(&t, r)), Verdict::Different, "no log");
}

#[test]
fn an_entropy_mixes_exp_and_log_results_consistently() {
    // Σ p · log(p) for p = softmax(x): under the homomorphic reading of log, each product of
    // a value known mod p (p) and one known mod q (its log) is an uninterpreted function of
    // the two, the same in both graphs.
    let t = symbolic(
        r#"
kernels:
  - name: k
    dims: { m: 6, k: 9 }
    inputs: { x: "f32[m, k]" }
    outputs: { h: "f32[m, 1]" }
    body: |
      p = softmax(x, axis=-1)
      h = sum(p * log(p), axis=-1)
"#,
    );
    let softmax = |c: &mut Cand| {
        let e = c.un(UnaryOp::Exp, c.i(0));
        let r = c.red(ReduceOp::Sum, e, 1);
        c.bin(BinaryOp::Div, e, r)
    };
    let mut c = Cand::new(&t);
    let p = softmax(&mut c);
    let l = c.un(UnaryOp::Log, p);
    let pl = c.bin(BinaryOp::Mul, l, p);
    let h = c.red(ReduceOp::Sum, pl, 1);
    assert_eq!(verdict(&t, &c.finish(&t, h)), Verdict::Equivalent, "operands swapped");
    // (exp(x) · log(p)) / Σ exp(x): the division moved past the opaque product, which only the
    // second reading of log, as a random function, proves.
    let mut c = Cand::new(&t);
    let p = softmax(&mut c);
    let l = c.un(UnaryOp::Log, p);
    let e = c.un(UnaryOp::Exp, c.i(0));
    let r = c.red(ReduceOp::Sum, e, 1);
    let el = c.bin(BinaryOp::Mul, e, l);
    let pl = c.bin(BinaryOp::Div, el, r);
    let h = c.red(ReduceOp::Sum, pl, 1);
    assert_eq!(verdict(&t, &c.finish(&t, h)), Verdict::Equivalent, "division moved");
    // log(2p) in place of log(p) changes every product.
    let mut c = Cand::new(&t);
    let p = softmax(&mut c);
    let p2 = c.bin(BinaryOp::Add, p, p);
    let l = c.un(UnaryOp::Log, p2);
    let pl = c.bin(BinaryOp::Mul, p, l);
    let h = c.red(ReduceOp::Sum, pl, 1);
    assert_eq!(verdict(&t, &c.finish(&t, h)), Verdict::Different, "log(2p)");
}
