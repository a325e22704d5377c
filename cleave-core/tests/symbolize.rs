//! Symbolization snapshots: symbols, groups, eventually-reduced dims.

mod common;

use cleave_core::graph::{DimKind, ValidGraph};
use cleave_core::reference::Rng;
use cleave_core::symbolic::{eventually_reduced, small_bindings, symbolize};

/// The symbolic listing plus each symbol's origin and reducibility.
fn summary(g: &ValidGraph) -> String {
    let s = symbolize(g);
    let mut out = s.graph.listing();
    for (v, info) in s.graph.dims.iter() {
        out.push_str(&format!(
            "{} <- {}{}\n",
            info.name,
            g.dims.get(s.origin[v.index()]).name,
            if s.reduced[v.index()] { " (reduced)" } else { "" }
        ));
    }
    out
}

fn reduced(g: &ValidGraph) -> String {
    let r = eventually_reduced(g);
    g.inputs
        .iter()
        .zip(&r.per_input)
        .map(|(i, axes)| {
            let names: Vec<String> = i
                .decl
                .shape
                .iter()
                .zip(axes)
                .filter(|(_, r)| **r)
                .map(|(d, _)| g.dims.get(d.var().expect("reduced axes are not 1")).name.clone())
                .collect();
            format!("{}: {}", i.decl.name, names.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[test]
fn the_papers_matmul_example() {
    let g = common::graph(
        r#"
kernels:
  - name: k
    dims: { b: 8, m: 32, k: 64, n: 128 }
    inputs: { x: "f16[b, m, k]", w: "f16[1, k, n]" }
    outputs: { y: "f16[b, m, n]" }
    body: "y = matmul(x, w)"
"#,
    );
    let s = symbolize(&g);
    let dims = &s.graph.dims;
    assert_eq!(dims.show(s.graph.shape(s.graph.inputs[0].node)), "[b, m, k]");
    assert_eq!(dims.show(s.graph.shape(s.graph.inputs[1].node)), "[1, k, n]");
    insta::assert_snapshot!(summary(&g), @r"
    %2 = matmul(x, w)  [b, m, n]
    y <- %2
    b <- b
    m <- m
    k <- k (reduced)
    n <- n
    ");
}

#[test]
fn mha_and_gqa_symbols() {
    insta::assert_snapshot!(summary(&common::shipped("mha_d128_prefill")), @r"
    %3 = transpose(k)  [h, d, l]
    %4 = matmul(q, %3)  [h, s, l]
    %6 = mul(%4, 0.08838834764831845)  [h, s, l]
    %7 = exp(%6)  [h, s, l]
    %8 = sum(%7, axis=2)  [h, s, 1]
    %9 = div(%7, %8)  [h, s, l]
    %10 = matmul(%9, v)  [h, s, d']
    o <- %10
    h <- h
    s <- s
    d <- d (reduced)
    l <- l (reduced)
    d' <- d
    ");
    insta::assert_snapshot!(summary(&common::shipped("gqa_prefill")), @r"
    %3 = transpose(k)  [g, 1, d, l]
    %4 = matmul(q, %3)  [g, r, s, l]
    %6 = mul(%4, 0.08838834764831845)  [g, r, s, l]
    %7 = exp(%6)  [g, r, s, l]
    %8 = sum(%7, axis=3)  [g, r, s, 1]
    %9 = div(%7, %8)  [g, r, s, l]
    %10 = matmul(%9, v)  [g, r, s, d']
    o <- %10
    g <- g
    r <- r
    s <- s
    d <- d (reduced)
    l <- l (reduced)
    d' <- d
    ");
}

#[test]
fn eventually_reduced_dims_are_inferred() {
    assert_eq!(reduced(&common::shipped("mha_d64_prefill")), "q: d; k: l, d; v: l");
    assert_eq!(reduced(&common::shipped("mqa_decode")), "q: d; k: l, d; v: l");
    assert_eq!(reduced(&common::shipped("rmsnorm_matmul_prefill")), "x: k; w: k");
    assert_eq!(reduced(&common::shipped("swiglu_decode")), "x: k; w1: k; w2: k");
    assert_eq!(reduced(&common::shipped("matmul_rowsum_prefill")), "x: k; w: k, n");
    assert_eq!(reduced(&common::shipped("mla_decode")), "q: c; qpe: r; kv: l, c; kpe: l, r");
    // Elementwise-only graphs reduce nothing; a declared override wins over inference.
    let g = common::graph(
        r#"
kernels:
  - name: k
    dims: { m: 4, n: 8 }
    inputs:
      x: { type: "f16[m, n]", reduce: [m] }
      y: "f16[m, n]"
    outputs: { z: "f16[m, n]" }
    body: "z = exp(x) * y"
"#,
    );
    assert_eq!(reduced(&g), "x: m; y: ");
}

#[test]
fn small_instantiations_satisfy_the_constraints() {
    let g = common::shipped("mha_d64_decode");
    let mut sym = symbolize(&g).graph.into_inner();
    // Introduce a split of the context axis, as the search would.
    let l = sym.dims.find("l").expect("symbol l");
    let (count, chunk) = sym.dims.split_vars(l);
    let mut rng = Rng::new(1);
    for _ in 0..50 {
        let b = small_bindings(&sym.dims, &mut rng);
        let plain: Vec<u64> = sym
            .dims
            .iter()
            .filter(|(v, d)| d.kind == DimKind::Plain && *v != l)
            .map(|(v, _)| b.values[v.index()])
            .collect();
        let mut sorted = plain.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), plain.len(), "plain symbols get distinct values: {plain:?}");
        assert!(plain.iter().all(|v| *v >= 2));
        let (s, c, k) = (b.values[count.index()], b.values[chunk.index()], b.values[l.index()]);
        assert!(s >= 2 && c >= 2 && s * c == k, "s={s} c={c} l={k}");
    }
}
