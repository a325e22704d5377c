//! A small Llama-style attention block in candle, whose RMSNorm+QKV projection and attention
//! core are Cleave kernels called through `candle_forward`, next to the same block written
//! with candle's own ops.
//!
//! The generated kernels take candle tensors as they are: the sequence length is read from
//! the shapes, inputs are read in place at their own strides (the heads are views of the QKV
//! projection, never copied), the outputs come back as candle tensors on the inputs' device,
//! and a tensor of the wrong shape, dtype or layout is an `Err`.

use candle_core::{DType, Device, Result, Tensor, D};

cleave::include_kernels!();

/// Attention heads.
pub const HEADS: usize = 4;
/// The width of one head.
pub const HEAD_DIM: usize = 64;
/// The model width.
pub const MODEL: usize = HEADS * HEAD_DIM;
/// RMSNorm's epsilon, as declared in `kernels.yaml`.
pub const EPS: f64 = 1e-5;
/// The attention score scale, `1 / sqrt(HEAD_DIM)`, as declared in `kernels.yaml`.
pub const SCALE: f64 = 0.125;

/// The block's weights, in f16 like the activations.
pub struct Block {
    /// The QKV projection, `[MODEL, 3 * MODEL]`, with the RMSNorm gain folded in.
    pub wqkv: Tensor,
    /// The output projection, `[MODEL, MODEL]`.
    pub wo: Tensor,
}

impl Block {
    /// Fresh random weights on `device`, scaled by `gain` (a large gain gives large logits).
    pub fn random(device: &Device, gain: f64) -> Result<Self> {
        let wqkv = (Tensor::randn(0f32, 1.0, (MODEL, 3 * MODEL), device)? * gain)?.to_dtype(DType::F16)?;
        let wo = (Tensor::randn(0f32, 1.0, (MODEL, MODEL), device)? / (MODEL as f64).sqrt())?.to_dtype(DType::F16)?;
        Ok(Block { wqkv, wo })
    }

    /// The block with the generated kernels: `x` is `f16[s, MODEL]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let qkv = kernels::norm_qkv::candle_forward(x, &self.wqkv)?;
        // The heads are strided views of `qkv`: the attention kernel reads them in place.
        let [q, k, v] = head_views(&qkv)?;
        let o = kernels::attention::candle_forward(&q, &k, &v)?;
        merge_heads(&o)?.matmul(&self.wo)
    }

    /// The same block with candle's ops, in f32, rounding to f16 where the generated kernels
    /// store f16 (the projection and the attention output), so that each stage sees what the
    /// kernels see.
    pub fn forward_candle(&self, x: &Tensor) -> Result<Tensor> {
        let qkv = rmsnorm(&x.to_dtype(DType::F32)?)?.matmul(&self.wqkv.to_dtype(DType::F32)?)?;
        let [q, k, v] = split_heads(&round_f16(&qkv)?)?;
        let o = round_f16(&attention_candle(&q, &k, &v)?)?;
        merge_heads(&o)?.matmul(&self.wo.to_dtype(DType::F32)?)
    }
}

/// `x` rounded to f16 and back to f32.
pub fn round_f16(x: &Tensor) -> Result<Tensor> {
    x.to_dtype(DType::F16)?.to_dtype(DType::F32)
}

/// `x / sqrt(mean(x², last axis) + EPS)` with candle's ops.
pub fn rmsnorm(x: &Tensor) -> Result<Tensor> {
    x.broadcast_div(&(x.sqr()?.mean_keepdim(D::Minus1)? + EPS)?.sqrt()?)
}

/// `softmax(q kᵀ · SCALE) v` per head with candle's ops, in f32, with the max subtracted.
pub fn attention_candle(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let (q, k, v) = (q.to_dtype(DType::F32)?, k.to_dtype(DType::F32)?, v.to_dtype(DType::F32)?);
    let scores = (q.matmul(&k.t()?)? * SCALE)?;
    let shifted = scores.broadcast_sub(&scores.max_keepdim(D::Minus1)?)?.exp()?;
    let p = shifted.broadcast_div(&shifted.sum_keepdim(D::Minus1)?)?;
    p.matmul(&v)
}

/// `[s, 3 * MODEL]` to three `[HEADS, s, HEAD_DIM]` views of it, without a copy: each is a
/// narrow and a transpose of the outer axes, so its rows stay contiguous.
pub fn head_views(qkv: &Tensor) -> Result<[Tensor; 3]> {
    let s = qkv.dim(0)?;
    let t = qkv.reshape((s, 3, HEADS, HEAD_DIM))?;
    let part = |i: usize| t.narrow(1, i, 1)?.squeeze(1)?.transpose(0, 1);
    Ok([part(0)?, part(1)?, part(2)?])
}

/// [`head_views`] copied into three contiguous tensors, for candle's own ops.
pub fn split_heads(qkv: &Tensor) -> Result<[Tensor; 3]> {
    let [q, k, v] = head_views(qkv)?;
    Ok([q.contiguous()?, k.contiguous()?, v.contiguous()?])
}

/// `[HEADS, s, HEAD_DIM]` to `[s, MODEL]`.
pub fn merge_heads(o: &Tensor) -> Result<Tensor> {
    let s = o.dim(1)?;
    o.transpose(0, 1)?.contiguous()?.reshape((s, MODEL))
}

/// `max |a - b| / max |b|` over all elements, in f32.
pub fn rel_err(a: &Tensor, b: &Tensor) -> Result<f32> {
    let (a, b) = (a.to_dtype(DType::F32)?, b.to_dtype(DType::F32)?);
    let diff = (a - &b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
    let scale = b.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
    Ok(diff / scale)
}
