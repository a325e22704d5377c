//! `cleave-gpu-bench`: runs every kernel of the repository's `kernels.yaml` through its
//! generated `launch` on a GPU.
//!
//! - The check: fresh seeded random inputs at odd extents, one launch, and the inputs and
//!   outputs written as raw little-endian files with a JSON manifest; `compare.py` computes the
//!   PyTorch reference from them on the GPU machine.
//! - The timing: the paper's shapes, timed with CUDA events (warm-up, then the median of many
//!   runs); `compare.py` times the PyTorch baselines the same way.
//!
//! See `bench/gpu/README.md` for how to build it and run it on a GPU machine.

// A command-line tool: progress goes to stdout, errors to stderr.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cleave::runtime::cudarc::driver::sys::CUdevice_attribute;
use cleave::runtime::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cleave_core::reference::{eval, max_rel_err, Tensor};
use serde_json::{json, Value};

cleave::include_kernels!();

mod buffers;
mod error;
mod spec;
mod timing;

mod dispatch {
    //! The table build.rs generates: per kernel, its generated `launch` and `run_host` called
    //! with buffers taken from slices.

    use std::sync::Arc;

    use cleave::runtime::cudarc::driver::CudaStream;
    use cleave::runtime::LaunchPlan;

    use crate::buffers::{DevBuf, HostBuf};
    use crate::error::BenchError;

    /// A kernel's launch on a stream, with its split count pinned when one is given.
    pub(crate) type CudaFn =
        fn(&Arc<CudaStream>, &[DevBuf], &mut [DevBuf], &[usize], Option<u64>) -> Result<(), BenchError>;
    pub(crate) type HostFn = fn(&[HostBuf], &mut [HostBuf], &[usize]) -> Result<(), BenchError>;

    pub(crate) struct Dispatch {
        pub(crate) name: &'static str,
        /// The plan made for the declared extents, whose dims and tensors every plan shares.
        pub(crate) plan: &'static LaunchPlan,
        /// Every plan, by GPU and by the extents it was made for.
        pub(crate) plans: &'static [cleave::runtime::Variant],
        /// The embedded GPU binary the plan's functions come from.
        pub(crate) fatbin: Option<&'static cleave::runtime::cuda::Fatbin>,
        pub(crate) cuda: CudaFn,
        pub(crate) host: HostFn,
    }

    include!(concat!(env!("OUT_DIR"), "/dispatch.rs"));
}

use buffers::{DevBuf, HostBuf};
use error::BenchError;
use spec::{Extents, Kernel};
use timing::L2;

const USAGE: &str = "\
usage: cleave-gpu-bench [OPTIONS] [KERNEL...]

Checks and times the kernels of kernels.yaml (all of them, or the ones named) through their
generated `launch` on GPU 0.

options:
  --out DIR             results: manifest.json (check) and timings.json (timing); default bench-out
  --data DIR            raw input and output files of the check; default OUT/data
  --backend cuda|host   cuda (default): `launch` on the GPU; host: `run_host`, the CPU emulation
                        of the same generated CUDA (check only; for self-tests without a GPU)
  --no-check            skip the check
  --no-time             skip the timing
  --check-dims N=V,..   extents of the check (default s=333,l=1001,b=5)
  --bench-dims N=V,..   one timing case at these extents instead of the paper's shapes
                        (prefill s=l=4096 and s=l=1024; decode b=16 and b=64 at l=4096)
  --l2 cold|warm        cold (default): an L2-sized buffer is overwritten before every timed
                        launch; warm: back-to-back launches, inputs may stay in L2
  --reps N              most timed repetitions per case (default 50)
  --target-ms MS        timed GPU work per case, which sets the repetitions (default 200)
  --seed N              seed of the random inputs (default 17)
  --splits N,N,..       also time each case with its split count pinned to each N (kernels
                        whose launcher chooses a split count; counts the extents refuse are
                        recorded as refused)
  --reference           also write cleave's own f64 reference of each check output (CPU, slow:
                        for small --check-dims)
  --list                list the kernels with their check and timing extents
  -h, --help            this text

exit status: 0 all selected kernels ran, 1 some failed or no GPU, 2 bad arguments";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Backend {
    Cuda,
    Host,
}

struct Args {
    out: PathBuf,
    data: Option<PathBuf>,
    backend: Backend,
    check: bool,
    time: bool,
    check_dims: Option<Extents>,
    bench_dims: Option<Extents>,
    timing: timing::Options,
    seed: u64,
    reference: bool,
    list: bool,
    splits: Vec<u64>,
    kernels: Vec<String>,
}

impl Args {
    /// The parsed arguments, or `None` for `--help`.
    fn parse(args: &[String]) -> Result<Option<Args>, BenchError> {
        let mut a = Args {
            out: PathBuf::from("bench-out"),
            data: None,
            backend: Backend::Cuda,
            check: true,
            time: true,
            check_dims: None,
            bench_dims: None,
            timing: timing::Options {
                l2: L2::Cold,
                max_reps: 50,
                min_reps: 5,
                target: Duration::from_millis(200),
                warmup: Duration::from_millis(25),
            },
            seed: 17,
            reference: false,
            list: false,
            splits: Vec::new(),
            kernels: Vec::new(),
        };
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut value =
                |name: &str| it.next().cloned().ok_or_else(|| BenchError::new(format!("{name} needs a value")));
            match arg.as_str() {
                "-h" | "--help" => return Ok(None),
                "--out" => a.out = PathBuf::from(value("--out")?),
                "--data" => a.data = Some(PathBuf::from(value("--data")?)),
                "--backend" => {
                    a.backend = match value("--backend")?.as_str() {
                        "cuda" => Backend::Cuda,
                        "host" => Backend::Host,
                        other => {
                            return Err(BenchError::new(format!("--backend: expected cuda or host, got `{other}`")))
                        }
                    }
                }
                "--no-check" => a.check = false,
                "--no-time" => a.time = false,
                "--check-dims" => a.check_dims = Some(spec::parse_extents(&value("--check-dims")?)?),
                "--bench-dims" => a.bench_dims = Some(spec::parse_extents(&value("--bench-dims")?)?),
                "--l2" => {
                    a.timing.l2 = match value("--l2")?.as_str() {
                        "cold" => L2::Cold,
                        "warm" => L2::Warm,
                        other => return Err(BenchError::new(format!("--l2: expected cold or warm, got `{other}`"))),
                    }
                }
                "--reps" => {
                    let v = value("--reps")?;
                    a.timing.max_reps = v.parse().ok().filter(|n| (1..=100_000).contains(n)).ok_or_else(|| {
                        BenchError::new(format!("--reps: expected an integer in 1..100000, got `{v}`"))
                    })?;
                    a.timing.min_reps = a.timing.min_reps.min(a.timing.max_reps);
                }
                "--target-ms" => {
                    let v = value("--target-ms")?;
                    let ms: f64 =
                        v.parse().ok().filter(|x: &f64| x.is_finite() && *x > 0.0 && *x <= 600_000.0).ok_or_else(
                            || BenchError::new(format!("--target-ms: expected a positive number, got `{v}`")),
                        )?;
                    a.timing.target = Duration::from_secs_f64(ms / 1e3);
                }
                "--seed" => {
                    let v = value("--seed")?;
                    a.seed =
                        v.parse().map_err(|_| BenchError::new(format!("--seed: expected an integer, got `{v}`")))?;
                }
                "--splits" => {
                    let v = value("--splits")?;
                    a.splits = v
                        .split(',')
                        .map(|p| p.trim().parse::<u64>().ok().filter(|n| (1..=1024).contains(n)))
                        .collect::<Option<Vec<u64>>>()
                        .ok_or_else(|| {
                            BenchError::new(format!("--splits: expected split counts like 1,2,4,8, got `{v}`"))
                        })?;
                }
                "--reference" => a.reference = true,
                "--list" => a.list = true,
                flag if flag.starts_with('-') => return Err(BenchError::new(format!("unknown option `{flag}`"))),
                name => a.kernels.push(name.to_string()),
            }
        }
        if a.backend == Backend::Host && a.time {
            // Timing the CPU emulator would measure nothing about the kernels.
            a.time = false;
        }
        Ok(Some(a))
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = match Args::parse(&args) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("some kernels failed; see the status fields of the JSON files");
            ExitCode::from(1)
        }
        Err(Failure::Usage(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(Failure::Run(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

enum Failure {
    Usage(BenchError),
    Run(BenchError),
}

/// Runs the selected steps; `Ok(false)` when some kernel failed.
fn run(args: &Args) -> Result<bool, Failure> {
    let all = spec::kernels().map_err(Failure::Run)?;
    let selected = select(&all, &args.kernels).map_err(Failure::Usage)?;
    for (flag, extents) in [("--check-dims", &args.check_dims), ("--bench-dims", &args.bench_dims)] {
        for (name, _) in extents.iter().flatten() {
            if !selected.iter().any(|k| k.dynamic().contains(&name.as_str())) {
                return Err(Failure::Usage(BenchError::new(format!(
                    "{flag}: `{name}` is not a dynamic dim of any selected kernel"
                ))));
            }
        }
    }
    if args.list {
        for k in &selected {
            let show = |e: &Extents| e.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(",");
            let cases: Vec<String> = k.bench_cases(args.bench_dims.as_ref()).iter().map(show).collect();
            println!(
                "{:<24} check {:<18} time {}",
                k.name,
                show(&k.check_extents(args.check_dims.as_ref())),
                cases.join("  ")
            );
        }
        return Ok(true);
    }

    let gpu = match args.backend {
        Backend::Cuda => Some(Gpu::open().map_err(Failure::Run)?),
        Backend::Host => None,
    };
    let data = args.data.clone().unwrap_or_else(|| args.out.join("data"));
    for dir in [&args.out, &data] {
        std::fs::create_dir_all(dir)
            .map_err(|e| Failure::Run(BenchError::new(format!("creating {}: {e}", dir.display()))))?;
    }
    let mut ok = true;
    if args.check {
        ok &= check_all(args, &selected, gpu.as_ref(), &data).map_err(Failure::Run)?;
    }
    if args.time {
        if let Some(gpu) = &gpu {
            ok &= time_all(args, &selected, gpu).map_err(Failure::Run)?;
        }
    }
    Ok(ok)
}

fn select<'a>(all: &'a [Kernel], names: &[String]) -> Result<Vec<&'a Kernel>, BenchError> {
    if names.is_empty() {
        return Ok(all.iter().collect());
    }
    names
        .iter()
        .map(|n| {
            all.iter().find(|k| &k.name == n).ok_or_else(|| {
                let known: Vec<&str> = all.iter().map(|k| k.name.as_str()).collect();
                BenchError::new(format!("unknown kernel `{n}`; kernels.yaml declares {}", known.join(", ")))
            })
        })
        .collect()
}

/// The GPU: its primary context, the stream every launch goes to, and what it is.
struct Gpu {
    stream: Arc<CudaStream>,
    l2_bytes: usize,
    info: Value,
}

impl Gpu {
    fn open() -> Result<Gpu, BenchError> {
        let ctx: Arc<CudaContext> = cleave::runtime::cuda::context(0).map_err(|e| match e {
            cleave::Error::NoDriver => BenchError::new(format!(
                "no CUDA driver: {e}. This benchmark needs an NVIDIA GPU; `--backend host` runs the \
                 check through the CPU emulation instead"
            )),
            cleave::Error::NoDevice { .. } => BenchError::new(format!("no CUDA device: {e}")),
            other => BenchError::from(other),
        })?;
        let attr = |a: CUdevice_attribute| ctx.attribute(a).ok().and_then(|v| usize::try_from(v).ok());
        let l2_bytes = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE).unwrap_or(64 << 20);
        let cc = ctx.compute_capability().map(|(a, b)| format!("{a}.{b}")).ok();
        let info = json!({
            "name": ctx.name().ok(),
            "compute_capability": cc,
            "multiprocessors": attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            "l2_bytes": l2_bytes,
            "memory_bytes": ctx.total_mem().ok(),
            "fatbin_built_for": dispatch::built_for(),
        });
        // The default stream, as the examples use: with a single stream cudarc records no
        // per-buffer events, so a launch costs what an application's launch costs.
        Ok(Gpu { stream: ctx.default_stream(), l2_bytes, info })
    }

    fn sync(&self) -> Result<(), BenchError> {
        self.stream.synchronize().map_err(|e| BenchError::driver("running the kernel", e))
    }
}

/// The check of every selected kernel; writes `manifest.json` after each one, so an
/// interrupted run still leaves a usable manifest.
fn check_all(args: &Args, kernels: &[&Kernel], gpu: Option<&Gpu>, data: &Path) -> Result<bool, BenchError> {
    let mut records = Vec::new();
    let mut ok = true;
    for k in kernels {
        let started = Instant::now();
        let extents = k.check_extents(args.check_dims.as_ref());
        let b = k.bindings(&extents);
        let mut record = json!({
            "kernel": k.name,
            "body": k.body,
            "case": k.case_label(&b),
            "dims": k.dims_json(&b),
            "dynamic": k.dynamic(),
            "backend": match gpu { Some(_) => "cuda", None => "host" },
            "seed": args.seed,
            "input_std": k.input_std(),
        });
        match check_one(args, k, &b, gpu, data) {
            Ok(extra) => merge(&mut record, extra),
            Err(e) => {
                ok = false;
                merge(&mut record, json!({ "status": "error", "error": e.to_string() }));
            }
        }
        merge(&mut record, json!({ "seconds": started.elapsed().as_secs_f64() }));
        println!("check {:<24} {:<16} {}", k.name, k.case_label(&b), summary(&record));
        records.push(record);
        let manifest = json!({
            "tool": "cleave-gpu-bench",
            "format": "raw little-endian, row-major; files relative to data_dir",
            "data_dir": absolute(data),
            "device": gpu.map(|g| g.info.clone()),
            "kernels": records,
        });
        write_json(&args.out.join("manifest.json"), &manifest)?;
    }
    Ok(ok)
}

fn check_one(
    args: &Args,
    k: &Kernel,
    b: &cleave_core::graph::Bindings,
    gpu: Option<&Gpu>,
    data: &Path,
) -> Result<Value, BenchError> {
    let ins = k.inputs(b);
    let outs = k.outputs(b);
    let dynamic = k.dynamic_values(b);
    // N(0, σ²) rounded to the dtype, as `cleave run` draws them, but generated on all cores:
    // the weights of the SwiGLU and matmul kernels are hundreds of millions of values.
    let host_in: Vec<HostBuf> = ins
        .iter()
        .enumerate()
        .map(|(i, t)| HostBuf::random(t.dtype, t.len(), k.input_std(), args.seed.wrapping_add(i as u64)))
        .collect();
    let mut in_json = Vec::new();
    for (t, h) in ins.iter().zip(&host_in) {
        let file = format!("{}.in.{}.bin", k.name, t.name);
        h.write_raw(&data.join(&file))?;
        in_json.push(with_file(t.json(), &file));
    }

    let host_out: Vec<HostBuf> = match gpu {
        Some(g) => {
            let dev_in = host_in.iter().map(|h| h.upload(&g.stream)).collect::<Result<Vec<_>, _>>()?;
            let mut dev_out =
                outs.iter().map(|t| DevBuf::poisoned(&g.stream, t.dtype, t.len())).collect::<Result<Vec<_>, _>>()?;
            (k.dispatch.cuda)(&g.stream, &dev_in, &mut dev_out, &dynamic, None)?;
            g.sync()?;
            dev_out.iter().map(|d| d.download(&g.stream)).collect::<Result<Vec<_>, _>>()?
        }
        None => {
            let mut out: Vec<HostBuf> = outs.iter().map(|t| HostBuf::nan(t.dtype, t.len())).collect();
            (k.dispatch.host)(&host_in, &mut out, &dynamic)?;
            out
        }
    };

    let want = if args.reference {
        let tensors: Vec<Tensor> =
            ins.iter().zip(&host_in).map(|(t, h)| Tensor { shape: t.shape.clone(), data: h.to_f64() }).collect();
        Some(eval(&k.graph, b, &tensors).map_err(|e| BenchError::new(format!("cleave's f64 reference: {e}")))?)
    } else {
        None
    };
    let mut out_json = Vec::new();
    let mut nonfinite = 0;
    for (i, (t, h)) in outs.iter().zip(&host_out).enumerate() {
        let file = format!("{}.out.{}.bin", k.name, t.name);
        h.write_raw(&data.join(&file))?;
        nonfinite += h.count_nonfinite();
        let mut entry = with_file(t.json(), &file);
        if let Some(want) = &want {
            let ref_file = format!("{}.ref.{}.f64.bin", k.name, t.name);
            buffers::write_f64(&data.join(&ref_file), &want[i].data)?;
            let err = max_rel_err(&h.to_f64(), &want[i].data);
            merge(
                &mut entry,
                json!({ "cleave_reference": ref_file, "max_rel_err_vs_cleave_reference": finite_or_null(err) }),
            );
        }
        out_json.push(entry);
    }
    Ok(json!({
        "status": "ok",
        "inputs": in_json,
        "outputs": out_json,
        "nonfinite_outputs": nonfinite,
    }))
}

/// The timing of every selected kernel at each of its cases; writes `timings.json` after each
/// case.
fn time_all(args: &Args, kernels: &[&Kernel], gpu: &Gpu) -> Result<bool, BenchError> {
    let mut flush = match args.timing.l2 {
        L2::Cold => Some(timing::flush_buffer(&gpu.stream, gpu.l2_bytes)?),
        L2::Warm => None,
    };
    let flush_bytes = flush.as_ref().map_or(0, |f| f.len());
    let mut cases = Vec::new();
    let mut ok = true;
    for k in kernels {
        for (index, extents) in k.bench_cases(args.bench_dims.as_ref()).iter().enumerate() {
            let b = k.bindings(extents);
            // The plan this device runs at these extents (the declared one if it cannot say).
            let plan = cleave::runtime::cuda::select(gpu.stream.context(), k.dispatch.plans, &k.dynamic_values(&b))
                .unwrap_or(k.dispatch.plan);
            let launches: Vec<Value> = plan
                .launches
                .iter()
                .map(|l| json!({ "symbol": l.symbol, "threads": l.threads, "smem_bytes": l.smem_bytes }))
                .collect();
            let mut record = json!({
                "kernel": k.name,
                "body": k.body,
                "case": k.case_label(&b),
                "primary": index == 0,
                "dims": k.dims_json(&b),
                "dynamic": k.dynamic(),
                "input_std": k.input_std(),
                "inputs": k.inputs(&b).iter().map(|t| t.json()).collect::<Vec<_>>(),
                "outputs": k.outputs(&b).iter().map(|t| t.json()).collect::<Vec<_>>(),
                "launches": launches,
                "workspaces": plan.workspaces.len(),
            });
            let seed = args.seed ^ (0x5851_F42D_4C95_7F2D_u64.wrapping_mul(index as u64 + 1));
            match time_one(args, k, &b, gpu, &mut flush, seed) {
                Ok(extra) => merge(&mut record, extra),
                Err(e) => {
                    ok = false;
                    merge(&mut record, json!({ "status": "error", "error": e.to_string() }));
                }
            }
            println!("time  {:<24} {:<16} {}", k.name, k.case_label(&b), summary(&record));
            cases.push(record);
            let doc = json!({
                "tool": "cleave-gpu-bench",
                "device": gpu.info,
                "timing": args.timing.json(flush_bytes),
                "cases": cases,
            });
            write_json(&args.out.join("timings.json"), &doc)?;
        }
    }
    Ok(ok)
}

fn time_one(
    args: &Args,
    k: &Kernel,
    b: &cleave_core::graph::Bindings,
    gpu: &Gpu,
    flush: &mut Option<CudaSlice<u8>>,
    seed: u64,
) -> Result<Value, BenchError> {
    let ins = k.inputs(b);
    let outs = k.outputs(b);
    let dynamic = k.dynamic_values(b);
    let std = k.input_std();
    let mut dev_in = Vec::with_capacity(ins.len());
    for (i, t) in ins.iter().enumerate() {
        // Generated and uploaded one tensor at a time, so host memory holds at most one.
        let host = HostBuf::random(t.dtype, t.len(), std, seed.wrapping_add(i as u64));
        dev_in.push(host.upload(&gpu.stream)?);
    }
    let mut dev_out =
        outs.iter().map(|t| DevBuf::poisoned(&gpu.stream, t.dtype, t.len())).collect::<Result<Vec<_>, _>>()?;

    // One launch over poisoned outputs: every element must be written and finite.
    (k.dispatch.cuda)(&gpu.stream, &dev_in, &mut dev_out, &dynamic, None)?;
    gpu.sync()?;
    let mut nonfinite = 0;
    for d in &dev_out {
        nonfinite += d.download(&gpu.stream)?.count_nonfinite();
    }

    let t = timing::time(&gpu.stream, flush, &args.timing, || {
        (k.dispatch.cuda)(&gpu.stream, &dev_in, &mut dev_out, &dynamic, None)
    })?;
    let mut v = t.json();
    merge(&mut v, json!({ "status": "ok", "nonfinite_outputs": nonfinite }));
    // The same call with each split count pinned, where the launcher chooses one: what the
    // launcher's rule is measured against. A count these extents do not allow is recorded as
    // refused; the launcher's own choice is the count its extents hold.
    let plan = cleave::runtime::cuda::select(gpu.stream.context(), k.dispatch.plans, &dynamic)?;
    let derived = plan.dims.iter().position(|d| d.derive.is_some());
    if let (Some(at), false) = (derived, args.splits.is_empty()) {
        // The count a launch on this device chooses: for its SMs and for how many blocks of
        // the split kernel the driver says one SM holds.
        let chosen =
            cleave::runtime::cuda::launch_extents(&gpu.stream, k.dispatch.fatbin, plan, &dynamic).map(|e| e[at]).ok();
        let mut sweep = Vec::new();
        for &count in &args.splits {
            let record = match (k.dispatch.cuda)(&gpu.stream, &dev_in, &mut dev_out, &dynamic, Some(count)) {
                Err(e) => json!({ "count": count, "error": e.to_string() }),
                Ok(()) => {
                    gpu.sync()?;
                    let t = timing::time(&gpu.stream, flush, &args.timing, || {
                        (k.dispatch.cuda)(&gpu.stream, &dev_in, &mut dev_out, &dynamic, Some(count))
                    })?;
                    let mut r = t.json();
                    merge(&mut r, json!({ "count": count }));
                    r
                }
            };
            sweep.push(record);
        }
        merge(&mut v, json!({ "split_dim": plan.dims[at].name, "split_chosen": chosen, "split_sweep": sweep }));
    }
    Ok(v)
}

/// One line for the console: the status and the main number.
fn summary(record: &Value) -> String {
    if let Some(e) = record.get("error").and_then(Value::as_str) {
        return format!("FAILED: {e}");
    }
    let mut parts = Vec::new();
    if let Some(us) = record.get("median_us").and_then(Value::as_f64) {
        parts.push(format!("{us:.1} us median of {}", record.get("reps").and_then(Value::as_u64).unwrap_or(0)));
    }
    if let Some(n) = record.get("nonfinite_outputs").and_then(Value::as_u64) {
        parts.push(if n == 0 { "all outputs finite".to_string() } else { format!("{n} outputs NaN/inf or unwritten") });
    }
    for o in record.get("outputs").and_then(Value::as_array).into_iter().flatten() {
        if let Some(e) = o.get("max_rel_err_vs_cleave_reference") {
            parts.push(format!("{}: max_rel_err vs cleave f64 reference {e}", o["name"].as_str().unwrap_or("?")));
        }
    }
    parts.join(", ")
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(a), Value::Object(b)) = (into.as_object_mut(), from) {
        a.extend(b);
    }
}

fn with_file(mut v: Value, file: &str) -> Value {
    merge(&mut v, json!({ "file": file }));
    v
}

/// JSON has no NaN or infinity: those become `null`, with the text beside it.
fn finite_or_null(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

fn absolute(p: &Path) -> String {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()).display().to_string()
}

/// Writes through a temporary file and a rename, so that a run stopped at its time limit never
/// leaves a half-written JSON file for compare.py.
fn write_json(path: &Path, value: &Value) -> Result<(), BenchError> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| BenchError::new(format!("JSON: {e}")))?;
    text.push('\n');
    let tmp = path.with_extension("json.partial");
    buffers::write_file(&tmp, text.as_bytes())?;
    std::fs::rename(&tmp, path).map_err(|e| BenchError::new(format!("{}: {e}", path.display())))
}
