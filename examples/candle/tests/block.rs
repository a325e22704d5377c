//! The generated kernels through `candle_forward` against candle's own ops, on CPU tensors of
//! fresh random data, and misuse as `Err`.

use candle_core::{DType, Device, Tensor};
use cleave_candle_example::{attention_candle, head_views, kernels, rel_err, rmsnorm, Block, HEADS, HEAD_DIM, MODEL};

/// f16 inputs and outputs against an f32 reference.
const TOL: f32 = 2e-2;

fn randn(shape: &[usize], scale: f64) -> Tensor {
    (Tensor::randn(0f32, 1.0, shape, &Device::Cpu).unwrap() * scale).unwrap().to_dtype(DType::F16).unwrap()
}

#[test]
fn the_block_matches_candle_at_ragged_lengths() {
    // A gain of 0.5 puts the logits in the hundreds; the softmax must be stabilized.
    let block = Block::random(&Device::Cpu, 0.5).unwrap();
    for s in [1, 37, 100] {
        let x = randn(&[s, MODEL], 1.0);
        let ours = block.forward(&x).unwrap();
        assert_eq!(ours.dims(), [s, MODEL]);
        assert_eq!(ours.dtype(), DType::F16);
        let err = rel_err(&ours, &block.forward_candle(&x).unwrap()).unwrap();
        assert!(err < TOL, "s = {s}: relative error {err}");
    }
}

#[test]
fn each_kernel_matches_candle_alone() {
    let x = randn(&[53, MODEL], 3.0);
    let w = randn(&[MODEL, 3 * MODEL], 0.1);
    let ours = kernels::norm_qkv::candle_forward(&x, &w).unwrap();
    let theirs = rmsnorm(&x.to_dtype(DType::F32).unwrap()).unwrap().matmul(&w.to_dtype(DType::F32).unwrap()).unwrap();
    let err = rel_err(&ours, &theirs).unwrap();
    assert!(err < TOL, "norm_qkv: relative error {err}");

    // Logits up to about ±250.
    let [q, k, v] =
        [randn(&[HEADS, 71, HEAD_DIM], 5.0), randn(&[HEADS, 71, HEAD_DIM], 5.0), randn(&[HEADS, 71, HEAD_DIM], 1.0)];
    let peak = (q.to_dtype(DType::F32).unwrap().matmul(&k.to_dtype(DType::F32).unwrap().t().unwrap()).unwrap() * 0.125)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(peak > 50.0, "the test meant large logits, got {peak}");
    let ours = kernels::attention::candle_forward(&q, &k, &v).unwrap();
    let err = rel_err(&ours, &attention_candle(&q, &k, &v).unwrap()).unwrap();
    assert!(err < TOL, "attention: relative error {err} (logits up to {peak})");
}

#[test]
fn misuse_is_an_error_naming_the_argument() {
    let x = randn(&[8, MODEL], 1.0);
    let w = randn(&[MODEL, 3 * MODEL], 0.1);
    let err = |r: candle_core::Result<Tensor>| r.unwrap_err().to_string();

    let f32_x = x.to_dtype(DType::F32).unwrap();
    let e = err(kernels::norm_qkv::candle_forward(&f32_x, &w));
    assert!(e.contains("argument `x`: is a F32 tensor, but the kernel declares f16"), "{e}");

    let narrow = randn(&[8, 128], 1.0);
    let e = err(kernels::norm_qkv::candle_forward(&narrow, &w));
    assert!(e.contains("argument `x`: has shape [8, 128], but the kernel declares [s, k]: axis 1 must be 256"), "{e}");

    let e = err(kernels::norm_qkv::candle_forward(&x.unsqueeze(0).unwrap(), &w));
    assert!(e.contains("argument `x`: has shape [1, 8, 256] with 3 axes"), "{e}");

    // A view is read in place only where its rows are contiguous; this one's are not.
    let q = randn(&[HEADS, HEAD_DIM, 8], 1.0).transpose(1, 2).unwrap();
    let k = randn(&[HEADS, 8, HEAD_DIM], 1.0);
    let e = err(kernels::attention::candle_forward(&q, &k, &k));
    assert!(e.contains("argument `q`: has a strided last axis (shape [4, 8, 64], strides [512, 1, 8])"), "{e}");

    let short = randn(&[HEADS, 7, HEAD_DIM], 1.0);
    let e = err(kernels::attention::candle_forward(&k, &short, &k));
    assert!(e.contains("argument `k`: has shape [4, 7, 64], but the kernel declares [h, s, d]: axis 1 must be 8, the extent of `s` in `q`"), "{e}");
}

/// Views are read in place: heads that are a narrow and a transpose of a fused QKV tensor, a
/// K and V cache allocated for more positions than are used, and a weight that is one
/// column block of a wider one. Each input is checked to be a real strided view (not
/// contiguous), and the results match candle's ops on contiguous copies.
#[test]
fn strided_views_are_read_in_place() {
    let s = 45;
    let qkv = randn(&[s, 3 * MODEL], 4.0);
    let [q, k, v] = head_views(&qkv).unwrap();
    assert!(!q.is_contiguous() && !k.is_contiguous() && !v.is_contiguous());
    let ours = kernels::attention::candle_forward(&q, &k, &v).unwrap();
    let want = attention_candle(&q.contiguous().unwrap(), &k.contiguous().unwrap(), &v.contiguous().unwrap()).unwrap();
    let err = rel_err(&ours, &want).unwrap();
    assert!(err < TOL, "heads as views of qkv: relative error {err}");

    // A cache of 128 positions per head with the first `s` used: q, k and v all have s rows.
    let cap = 128;
    let kc = randn(&[HEADS, cap, HEAD_DIM], 4.0);
    let vc = randn(&[HEADS, cap, HEAD_DIM], 1.0);
    let q = randn(&[HEADS, s, HEAD_DIM], 4.0);
    let (k, v) = (kc.narrow(1, 0, s).unwrap(), vc.narrow(1, 0, s).unwrap());
    assert!(!k.is_contiguous());
    let ours = kernels::attention::candle_forward(&q, &k, &v).unwrap();
    let want = attention_candle(&q, &k.contiguous().unwrap(), &v.contiguous().unwrap()).unwrap();
    let err = rel_err(&ours, &want).unwrap();
    assert!(err < TOL, "cache with spare capacity: relative error {err}");

    // The projection's weight as the middle column block of a fused [MODEL, 5 · MODEL] one.
    let x = randn(&[s, MODEL], 2.0);
    let wide = randn(&[MODEL, 5 * MODEL], 0.1);
    let w = wide.narrow(1, MODEL, 3 * MODEL).unwrap();
    assert!(!w.is_contiguous());
    let ours = kernels::norm_qkv::candle_forward(&x, &w).unwrap();
    let theirs = rmsnorm(&x.to_dtype(DType::F32).unwrap())
        .unwrap()
        .matmul(&w.contiguous().unwrap().to_dtype(DType::F32).unwrap())
        .unwrap();
    let err = rel_err(&ours, &theirs).unwrap();
    assert!(err < TOL, "weight as a column block: relative error {err}");
}
