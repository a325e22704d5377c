//! What both examples share: deterministic inputs with large-magnitude logits, the f64
//! reference, the error metric, and running a kernel on the GPU through cudarc.

use std::sync::Arc;
use std::time::Instant;

use cleave::runtime::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cleave::{f16, Error};

/// A small deterministic generator (xorshift64*), so runs are reproducible.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `n` values uniform in `[-a, a]`, rounded to f16 so the reference sees what the kernel sees.
    fn tensor(&mut self, n: usize, a: f64) -> Vec<f64> {
        (0..n).map(|_| f16::from_f64((2.0 * self.next() - 1.0) * a).to_f64()).collect()
    }
}

/// Attention inputs `q[h, s, d]`, `k[h, l, d]`, `v[h, l, d]` whose logits reach several hundred
/// (|q|, |k| up to 14, and per head one key equal to a query and one equal to its negation), the
/// regime where an unstabilized softmax overflows.
pub(crate) fn attention_inputs(seed: u64, h: usize, s: usize, l: usize, d: usize) -> [Vec<f64>; 3] {
    let mut rng = Rng(seed);
    let q = rng.tensor(h * s * d, 14.0);
    let mut k = rng.tensor(h * l * d, 14.0);
    let v = rng.tensor(h * l * d, 4.0);
    for hh in 0..h {
        for (j, i, sign) in [(l / 3, 0, 1.0), (l - 1, s - 1, -1.0)] {
            for c in 0..d {
                k[(hh * l + j) * d + c] = sign * q[(hh * s + i) * d + c];
            }
        }
    }
    [q, k, v]
}

/// `softmax(q kᵀ · scale) v` for heads `0..heads`, in f64; also the largest |logit|.
pub(crate) fn attention_ref(
    heads: usize,
    (s, l, d): (usize, usize, usize),
    scale: f64,
    [q, k, v]: &[Vec<f64>; 3],
) -> (Vec<f64>, f64) {
    let mut out = vec![0.0; heads * s * d];
    let mut peak: f64 = 0.0;
    for h in 0..heads {
        for i in 0..s {
            let qi = &q[(h * s + i) * d..][..d];
            let logits: Vec<f64> = (0..l)
                .map(|j| qi.iter().zip(&k[(h * l + j) * d..][..d]).map(|(a, b)| a * b).sum::<f64>() * scale)
                .collect();
            let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            peak = logits.iter().fold(peak, |p, x| p.max(x.abs()));
            let w: Vec<f64> = logits.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = w.iter().sum();
            for c in 0..d {
                out[(h * s + i) * d + c] = (0..l).map(|j| w[j] * v[(h * l + j) * d + c]).sum::<f64>() / z;
            }
        }
    }
    (out, peak)
}

/// The largest error relative to each reference value, with a floor of a tenth of the
/// reference's RMS, as `cleave run` reports it; a NaN or infinity in the output is infinite.
pub(crate) fn max_rel_err(got: &[f64], want: &[f64]) -> f64 {
    let rms = (want.iter().map(|x| x * x).sum::<f64>() / want.len().max(1) as f64).sqrt();
    let floor = (0.1 * rms).max(f64::MIN_POSITIVE);
    got.iter().zip(want).fold(0.0, |worst, (g, w)| {
        if g.is_finite() {
            worst.max((g - w).abs() / w.abs().max(floor))
        } else {
            f64::INFINITY
        }
    })
}

/// The tolerance the examples hold the kernels to: f16 inputs and outputs, f32 accumulation.
pub(crate) const TOLERANCE: f64 = 2e-2;

pub(crate) fn to_f16(x: &[f64]) -> Vec<f16> {
    x.iter().map(|v| f16::from_f64(*v)).collect()
}

pub(crate) fn to_f64(x: &[f16]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// Runs an attention-shaped kernel on the GPU: uploads `q, k, v`, calls `launch` `reps`
/// times, and returns the output and the mean seconds per launch.
pub(crate) fn on_gpu(
    ctx: &Arc<CudaContext>,
    inputs: &[Vec<f16>; 3],
    out_len: usize,
    reps: usize,
    launch: impl Fn(&Arc<CudaStream>, [&CudaSlice<f16>; 3], &mut CudaSlice<f16>) -> Result<(), Error>,
) -> Result<(Vec<f16>, f64), Error> {
    let driver =
        |e: cleave::runtime::cudarc::driver::DriverError| Error::Launch { kernel: "example", message: e.to_string() };
    let stream = ctx.default_stream();
    let q = stream.clone_htod(&inputs[0]).map_err(driver)?;
    let k = stream.clone_htod(&inputs[1]).map_err(driver)?;
    let v = stream.clone_htod(&inputs[2]).map_err(driver)?;
    let mut o = stream.alloc_zeros::<f16>(out_len).map_err(driver)?;
    // One launch to load the module and warm up, then the timed ones.
    launch(&stream, [&q, &k, &v], &mut o)?;
    stream.synchronize().map_err(driver)?;
    let start = Instant::now();
    for _ in 0..reps {
        launch(&stream, [&q, &k, &v], &mut o)?;
    }
    stream.synchronize().map_err(driver)?;
    let seconds = start.elapsed().as_secs_f64() / reps.max(1) as f64;
    Ok((stream.clone_dtoh(&o).map_err(driver)?, seconds))
}
