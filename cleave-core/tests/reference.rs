//! The f64 reference interpreter against hand-computed cases.

mod common;

use cleave_core::graph::Bindings;
use cleave_core::reference::{eval, random_inputs, InputScale, Tensor};

fn t(shape: &[usize], data: &[f64]) -> Tensor {
    Tensor { shape: shape.to_vec(), data: data.to_vec() }
}

#[test]
fn softmax_rows_sum_to_one_even_for_large_logits() {
    let g = common::graph(
        r#"
kernels:
  - name: k
    dims: { m: 5, n: 37 }
    inputs: { x: "f32[m, n]" }
    outputs: { y: "f32[m, n]" }
    body: "y = softmax(x * 40.0, axis=-1)"
"#,
    );
    let b = Bindings::of_table(&g.dims);
    let x = random_inputs(&g, &b, 11, &InputScale { default: 3.0, per_input: vec![] });
    let y = &eval(&g, &b, &x).unwrap()[0];
    for row in y.data.chunks(37) {
        let s: f64 = row.iter().sum();
        assert!((s - 1.0).abs() < 1e-12, "row sums to {s}");
        assert!(row.iter().all(|p| *p >= 0.0));
    }
}

#[test]
fn batched_matmul_matches_a_naive_loop_with_broadcast_batch() {
    let g = common::graph(
        r#"
kernels:
  - name: k
    dims: { b: 3, m: 4, k: 5, n: 2 }
    inputs: { x: "f32[b, m, k]", w: "f32[1, k, n]" }
    outputs: { y: "f32[b, m, n]" }
    body: "y = matmul(x, w)"
"#,
    );
    let bind = Bindings::of_table(&g.dims);
    let ins = random_inputs(&g, &bind, 3, &InputScale::default());
    let y = &eval(&g, &bind, &ins).unwrap()[0];
    let (x, w) = (&ins[0].data, &ins[1].data);
    for bt in 0..3 {
        for i in 0..4 {
            for j in 0..2 {
                let mut acc = 0.0;
                for p in 0..5 {
                    acc += x[bt * 20 + i * 5 + p] * w[p * 2 + j];
                }
                assert!((y.data[bt * 8 + i * 2 + j] - acc).abs() < 1e-12);
            }
        }
    }
    assert_eq!(y.shape, vec![3, 4, 2]);
}

#[test]
fn broadcasting_reductions_and_transpose_by_hand() {
    let g = common::graph(
        r#"
kernels:
  - name: k
    dims: { m: 2, n: 3 }
    inputs: { a: "f32[m, 1]", c: "f32[n]", x: "f32[m, n]" }
    outputs: { y: "f32[m, n]", r: "f32[n, 1]", z: "f32[m, 1]" }
    body: |
      y = a + c
      r = max(transpose(x), axis=-1)
      z = mean(x, axis=1) - sum(x, axis=-1)
"#,
    );
    let b = Bindings::of_table(&g.dims);
    let ins = [t(&[2, 1], &[10.0, 20.0]), t(&[3], &[1.0, 2.0, 3.0]), t(&[2, 3], &[1.0, 5.0, 3.0, 4.0, 2.0, 6.0])];
    let out = eval(&g, &b, &ins).unwrap();
    assert_eq!(out[0].data, vec![11.0, 12.0, 13.0, 21.0, 22.0, 23.0]);
    assert_eq!(out[1], t(&[3, 1], &[4.0, 5.0, 6.0]));
    assert_eq!(out[2], t(&[2, 1], &[3.0 - 9.0, 4.0 - 12.0]));
}

#[test]
fn rmsnorm_and_silu_by_hand() {
    let g = common::graph(
        r#"
kernels:
  - name: k
    dims: { m: 1, n: 2 }
    inputs: { x: "f32[m, n]" }
    outputs: { y: "f32[m, n]", z: "f32[m, n]" }
    body: |
      y = rmsnorm(x, eps=0.5)
      z = silu(x)
"#,
    );
    let b = Bindings::of_table(&g.dims);
    let out = eval(&g, &b, &[t(&[1, 2], &[3.0, 4.0])]).unwrap();
    let r = 1.0 / (12.5f64 + 0.5).sqrt();
    assert_eq!(out[0].data, vec![3.0 * r, 4.0 * r]);
    let silu = |x: f64| x / (1.0 + (-x).exp());
    assert_eq!(out[1].data, vec![silu(3.0), silu(4.0)]);
}

#[test]
fn random_inputs_are_seeded_and_rounded_to_their_dtype() {
    let g = common::shipped("mha_d64_prefill");
    let mut b = Bindings::of_table(&g.dims);
    for (v, d) in g.dims.iter() {
        if d.dynamic {
            b.values[v.index()] = 7;
        }
    }
    let a = random_inputs(&g, &b, 5, &InputScale::default());
    let c = random_inputs(&g, &b, 5, &InputScale::default());
    let d = random_inputs(&g, &b, 6, &InputScale::default());
    assert_eq!(a, c);
    assert_ne!(a, d);
    assert_eq!(a[0].shape, vec![32, 7, 64]);
    for x in &a[0].data {
        assert_eq!(half::f16::from_f64(*x).to_f64(), *x, "inputs are exactly representable in f16");
    }
    assert!(a[0].data.iter().any(|x| *x != 0.0));
}

#[test]
fn exps_past_the_f64_range_give_finite_truth() {
    // A softmax over logits near 800 and a log-sum-exp near 5000: every exp is beyond f64, the
    // results are ordinary numbers.
    let g = common::graph(
        r#"
kernels:
  - name: k
    dims: { m: 1, n: 3 }
    inputs: { x: "f32[m, n]" }
    outputs: { p: "f32[m, n]", l: "f32[m, 1]" }
    body: |
      p = softmax(x, axis=-1)
      l = log(sum(exp(x * 6.0), axis=-1))
"#,
    );
    let b = Bindings::of_table(&g.dims);
    let x = [800.0, 801.0, 799.0];
    let out = eval(&g, &b, &[t(&[1, 3], &x)]).unwrap();
    let z: f64 = x.iter().map(|v| (v - 801.0f64).exp()).sum();
    for (got, v) in out[0].data.iter().zip(x) {
        let want = (v - 801.0).exp() / z;
        assert!((got - want).abs() < 1e-15, "{got} {want}");
    }
    let lse = 4806.0 + x.iter().map(|v| (6.0 * v - 4806.0f64).exp()).sum::<f64>().ln();
    assert!((out[1].data[0] - lse).abs() < 1e-9, "{} {lse}", out[1].data[0]);
}

#[test]
fn products_past_the_f64_range_stay_exact() {
    // `p[0][0]` is 2^1200 + 1 - 1, beyond f64; the second product scales it back by 2^-600.
    // Neither product's operands are all within f64's moderate range, so both take the
    // reference's element loop, which must keep the value (f64 arithmetic would overflow).
    let g = common::graph(
        r#"
kernels:
  - name: k
    dims: { m: 2, k: 3, n: 2 }
    inputs: { a: "f32[m, k]", b: "f32[k, n]", c: "f32[n, 1]" }
    outputs: { y: "f32[m, 1]" }
    body: |
      p = matmul(a, b)
      y = matmul(p, c)
"#,
    );
    let bindings = Bindings::of_table(&g.dims);
    let big = 2f64.powi(600);
    let a = t(&[2, 3], &[big, 1.0, -1.0, 2.0, 0.5, big]);
    let b = t(&[3, 2], &[big, 1.0, 1.0, 1.0, 1.0, 1.0]);
    let c = t(&[2, 1], &[1.0 / big, 1.0 / big]);
    let y = eval(&g, &bindings, &[a, b, c]).expect("evaluates").remove(0);
    // y[0] = 2^600 + 1 and y[1] = (3 · 2^600 + 2^600) · 2^-600, each rounded as f64.
    assert_eq!(y.data, vec![big, 4.0]);
}
