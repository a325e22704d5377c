//! Attention prefill with a fused kernel Cleave searched and generated at build time.
//!
//! ```text
//! cargo run --release -p cleave-examples --bin attention
//! ```
//!
//! With a GPU (the NVIDIA driver and a device) it runs `kernels::attention::launch`; without
//! one it runs `run_host`, the host emulation of the same generated CUDA, at small odd sizes.
//! Either way it checks the output against an f64 reference on inputs whose logits reach
//! several hundred, prints the result and `max_rel_err`, and exits 1 above the tolerance.

// An example reports on stdout.
#![allow(clippy::print_stdout, clippy::print_stderr)]

cleave::include_kernels!();
mod common;

use std::process::ExitCode;
use std::time::Instant;

use cleave::runtime::cudarc::driver::{CudaContext, CudaSlice};
use cleave::{f16, Error};
use common::{attention_inputs, attention_ref, max_rel_err, on_gpu, to_f16, to_f64, TOLERANCE};
use kernels::attention;

/// The scale the declaration multiplies the logits by (1/sqrt(d)).
const SCALE: f64 = 0.125;

/// The static extent of dim `name`, as declared in kernels.yaml.
fn dim(name: &str) -> usize {
    attention::PLAN.dims.iter().find(|d| d.name == name).map_or(0, |d| d.value as usize)
}

fn main() -> ExitCode {
    println!("kernel `attention`: {} launch(es), {}", attention::PLAN.launches.len(), built_for());
    let result = match cleave::runtime::cuda::context(0) {
        Ok(ctx) => gpu(&ctx),
        Err(e) => {
            println!("no GPU: {e}");
            println!("running the host emulation of the same generated CUDA instead");
            host()
        }
    };
    match result {
        Ok(err) if err <= TOLERANCE => ExitCode::SUCCESS,
        Ok(err) => {
            eprintln!("max_rel_err {err:.3e} is above the tolerance {TOLERANCE:e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn built_for() -> String {
    match attention::FATBIN {
        Some(f) => format!("GPU code for {}", f.built_for),
        None => "no GPU code (built without nvcc)".to_string(),
    }
}

/// Runs `run_host` at `(s, l)` and returns the output.
fn host_run(inputs: &[Vec<f16>; 3], s: usize, l: usize) -> Result<Vec<f16>, Error> {
    let mut o = vec![f16::ZERO; dim("h") * s * dim("d")];
    attention::run_host(&inputs[0], &inputs[1], &inputs[2], &mut o, attention::Dims { s, l })?;
    Ok(o)
}

fn host() -> Result<f64, Error> {
    let (h, d, s, l) = (dim("h"), dim("d"), 37, 53);
    let inputs = attention_inputs(1, h, s, l, d);
    let halves = inputs.each_ref().map(|t| to_f16(t));
    let start = Instant::now();
    let o = host_run(&halves, s, l)?;
    println!("run_host h={h} s={s} l={l} d={d}: {:.2} s", start.elapsed().as_secs_f64());
    let (want, peak) = attention_ref(h, (s, l, d), SCALE, &inputs);
    Ok(report(&to_f64(&o), &want, peak))
}

fn gpu(ctx: &std::sync::Arc<CudaContext>) -> Result<f64, Error> {
    let (h, d) = (dim("h"), dim("d"));
    let launch = |s: usize, l: usize| {
        move |stream: &_, [q, k, v]: [&CudaSlice<f16>; 3], o: &mut CudaSlice<f16>| {
            attention::launch(
                stream,
                &q.as_view(),
                &k.as_view(),
                &v.as_view(),
                &mut o.as_view_mut(),
                attention::Dims { s, l },
            )
        }
    };

    // The GPU agrees with the host emulation of the same source, at odd sizes.
    let (s, l) = (37, 53);
    let small = attention_inputs(1, h, s, l, d).each_ref().map(|t| to_f16(t));
    let (got, _) = on_gpu(ctx, &small, h * s * d, 1, launch(s, l))?;
    let host = host_run(&small, s, l)?;
    let agree = max_rel_err(&to_f64(&got), &to_f64(&host));
    println!("launch vs run_host at h={h} s={s} l={l} d={d}: max_rel_err={agree:.3e}");

    // A prefill-sized problem, checked on two heads against the f64 reference.
    let (s, l) = (1024, 1024);
    let inputs = attention_inputs(2, h, s, l, d);
    let halves = inputs.each_ref().map(|t| to_f16(t));
    let (got, seconds) = on_gpu(ctx, &halves, h * s * d, 20, launch(s, l))?;
    let flops = 4.0 * (h * s * l * d) as f64;
    println!("launch h={h} s={s} l={l} d={d}: {:.1} us, {:.1} TFLOP/s", seconds * 1e6, flops / seconds / 1e12);
    let heads = 2;
    let (want, peak) = attention_ref(heads, (s, l, d), SCALE, &inputs);
    let err = report(&to_f64(&got[..heads * s * d]), &want, peak);
    Ok(err.max(agree))
}

/// Prints a few output values next to the reference and the error; returns the error.
fn report(got: &[f64], want: &[f64], peak: f64) -> f64 {
    let show = |x: &[f64]| x.iter().take(4).map(|v| format!("{v:8.4}")).collect::<Vec<_>>().join(" ");
    println!("largest |logit|: {peak:.0}");
    println!("o[0, 0, 0..4]  = {}", show(got));
    println!("reference      = {}", show(want));
    let err = max_rel_err(got, want);
    println!("max_rel_err={err:.3e}");
    err
}
