//! Attention decode with a split-K kernel Cleave searched and generated at build time: few
//! queries over a long context, split along the context into chunks whose partial results a
//! second kernel merges with a log-sum-exp combine.
//!
//! ```text
//! cargo run --release -p cleave-examples --bin decode
//! ```
//!
//! With a GPU it runs `kernels::decode::launch`; without one it runs `run_host`, the host
//! emulation of the same generated CUDA, at small odd sizes. Either way it checks the output
//! against an f64 reference on inputs whose logits reach several hundred, prints the result and
//! `max_rel_err`, and exits 1 above the tolerance.

// An example reports on stdout.
#![allow(clippy::print_stdout, clippy::print_stderr)]

cleave::include_kernels!();
mod common;

use std::process::ExitCode;
use std::time::Instant;

use cleave::runtime::cuda::Workspace;
use cleave::runtime::cudarc::driver::{CudaContext, CudaSlice};
use cleave::{f16, Error};
use common::{attention_inputs, attention_ref, max_rel_err, on_gpu, to_f16, to_f64, TOLERANCE};
use kernels::decode;

/// The scale the declaration multiplies the logits by (1/sqrt(128)).
const SCALE: f64 = 0.08838834764831845;

/// The static extent of dim `name`, as declared in kernels.yaml.
fn dim(name: &str) -> usize {
    decode::PLAN.dims.iter().find(|d| d.name == name).map_or(0, |d| d.value as usize)
}

fn main() -> ExitCode {
    let plan = &decode::PLAN;
    let launches: Vec<&str> = plan.launches.iter().map(|l| l.symbol).collect();
    println!(
        "kernel `decode`: {} launch(es) ({}), {} workspace(s){}",
        launches.len(),
        launches.join(", "),
        plan.workspaces.len(),
        if plan.launches.len() > 1 { ": split-K with a combine kernel" } else { "" }
    );
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

fn host_run(inputs: &[Vec<f16>; 3], b: usize, l: usize) -> Result<Vec<f16>, Error> {
    let mut o = vec![f16::ZERO; dim("h") * b * dim("d")];
    decode::run_host(&inputs[0], &inputs[1], &inputs[2], &mut o, decode::Dims { b, l })?;
    Ok(o)
}

fn host() -> Result<f64, Error> {
    let (h, d, b, l) = (dim("h"), dim("d"), 3, 1001);
    let inputs = attention_inputs(3, h, b, l, d);
    let halves = inputs.each_ref().map(|t| to_f16(t));
    let start = Instant::now();
    let o = host_run(&halves, b, l)?;
    println!("run_host h={h} b={b} l={l} d={d}: {:.2} s", start.elapsed().as_secs_f64());
    let (want, peak) = attention_ref(h, (b, l, d), SCALE, &inputs);
    Ok(report(&to_f64(&o), &want, peak))
}

fn gpu(ctx: &std::sync::Arc<CudaContext>) -> Result<f64, Error> {
    let (h, d) = (dim("h"), dim("d"));
    let launch = |b: usize, l: usize| {
        move |stream: &_, [q, k, v]: [&CudaSlice<f16>; 3], o: &mut CudaSlice<f16>| {
            decode::launch(
                stream,
                &q.as_view(),
                &k.as_view(),
                &v.as_view(),
                &mut o.as_view_mut(),
                decode::Dims { b, l },
            )
        }
    };

    // The GPU agrees with the host emulation of the same source, at odd sizes.
    let (b, l) = (3, 1001);
    let small = attention_inputs(3, h, b, l, d).each_ref().map(|t| to_f16(t));
    let (got, _) = on_gpu(ctx, &small, h * b * d, 1, launch(b, l))?;
    let host = host_run(&small, b, l)?;
    let agree = max_rel_err(&to_f64(&got), &to_f64(&host));
    println!("launch vs run_host at h={h} b={b} l={l} d={d}: max_rel_err={agree:.3e}");

    // The serving-loop path at the same extents: loaded ahead of time, a workspace the caller
    // owns, captured into a CUDA graph (which fails if anything in it synchronizes) and
    // replayed; it must give exactly what `launch` gave.
    let replayed = captured(ctx, &small, decode::Dims { b, l })?;
    let same = replayed == got;
    println!(
        "load + Kernel::launch captured in a CUDA graph and replayed: {}",
        if same { "identical" } else { "DIFFERENT" }
    );
    let agree = if same { agree } else { f64::INFINITY };

    // A long context, checked against the f64 reference.
    let (b, l) = (1, 32768);
    let inputs = attention_inputs(4, h, b, l, d);
    let halves = inputs.each_ref().map(|t| to_f16(t));
    let (got, seconds) = on_gpu(ctx, &halves, h * b * d, 50, launch(b, l))?;
    let bytes = (2 * h * l * d * 2) as f64;
    println!("launch h={h} b={b} l={l} d={d}: {:.1} us, {:.0} GB/s of K and V", seconds * 1e6, bytes / seconds / 1e9);
    let (want, peak) = attention_ref(h, (b, l, d), SCALE, &inputs);
    let err = report(&to_f64(&got), &want, peak);
    Ok(err.max(agree))
}

/// Runs `decode` through `load` and `Kernel::launch` inside a CUDA graph capture on a fresh
/// stream, replays the graph twice, and returns the output.
fn captured(ctx: &std::sync::Arc<CudaContext>, inputs: &[Vec<f16>; 3], dims: decode::Dims) -> Result<Vec<f16>, Error> {
    use cleave::runtime::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let driver =
        |e: cleave::runtime::cudarc::driver::DriverError| Error::Launch { kernel: "decode", message: e.to_string() };
    let kernel = decode::load(ctx)?;
    let stream = ctx.new_stream().map_err(driver)?;
    let mut workspace = Workspace::alloc(&stream, decode::workspace_bytes(dims)?)?;
    let q = stream.clone_htod(&inputs[0]).map_err(driver)?;
    let k = stream.clone_htod(&inputs[1]).map_err(driver)?;
    let v = stream.clone_htod(&inputs[2]).map_err(driver)?;
    let mut o = stream.alloc_zeros::<f16>(dim("h") * dims.b * dim("d")).map_err(driver)?;
    stream.synchronize().map_err(driver)?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(driver)?;
    let launched = kernel.launch(&stream, &q, &k, &v, &mut o, &mut workspace, dims);
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).map_err(driver)?;
    launched?;
    let graph = graph.ok_or(Error::Launch { kernel: "decode", message: "the capture recorded nothing".into() })?;
    graph.launch().map_err(driver)?;
    graph.launch().map_err(driver)?;
    stream.synchronize().map_err(driver)?;
    stream.clone_dtoh(&o).map_err(driver)
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
