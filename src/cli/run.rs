//! `cleave run --backend emulate`: builds the generated CUDA (or, with `--source DIR`, the
//! `DIR/<kernel>.cu` that `cleave emit` wrote, edited or not) for the host emulator, runs it on
//! seeded random inputs with the emulator's race, hazard and bounds checks, and compares with
//! the f64 reference. Prints `max_rel_err=<x>` last; exits 1 above the tolerance or when a
//! check fails. `--inputs FILE` takes the inputs from a safetensors file instead (the dynamic
//! dims from their shapes) and `--outputs FILE` writes the emulated outputs to one.

use cleave::emulate::{self, RunShape};
use cleave::runtime::host::EmuOptions;
use cleave_core::codegen::plan::plan_data;
use cleave_core::graph::Bindings;
use cleave_core::graph::{Op, UnaryOp};
use cleave_core::plan::Kernel;
use cleave_core::reference::{
    eval_buffers, eval_nodes, max_rel_err, random_buffers, random_inputs, tolerance, InputScale, Requests, Tensor,
};

use super::compile::compile_kernel;
use super::{extent_pairs, with_progress, Opts, UserError};

/// Extents for dynamic dims when `--dims` does not name them: small, odd, not a multiple of
/// any tile size.
const DEFAULT_EXTENTS: [u64; 4] = [67, 133, 43, 29];

/// Elements over all of a graph's tensors that `cleave run` emulates: 2^29 (a few GiB of f64
/// and reference values).
const RUN_MAX_ELEMENTS: u128 = 1 << 29;

pub(crate) fn run(o: &Opts) -> Result<(), UserError> {
    match o.value("backend").unwrap_or("emulate") {
        "emulate" => {}
        other => return Err(UserError(format!("unknown backend `{other}`; this build supports `emulate`"))),
    }
    let seed: u64 = match o.value("seed") {
        Some(s) => s.parse().map_err(|_| UserError(format!("--seed expects an integer, got `{s}`")))?,
        None => 1,
    };
    let scale = match o.value("scale") {
        Some(s) => parse_scale(s)?,
        None => InputScale::default(),
    };
    // Flags win over the environment's CLEAVE_EMU_CHECKS and CLEAVE_EMU_SCHEDULE.
    let env = |name: &str| std::env::var(name).ok();
    let checks = o.value("checks").map(str::to_string).or_else(|| env("CLEAVE_EMU_CHECKS"));
    let schedule = o.value("schedule").map(str::to_string).or_else(|| env("CLEAVE_EMU_SCHEDULE"));
    let options = EmuOptions::parse(checks.as_deref(), schedule.as_deref()).map_err(|e| {
        UserError(e.replace("CLEAVE_EMU_CHECKS", "--checks").replace("CLEAVE_EMU_SCHEDULE", "--schedule"))
    })?;
    let split_count: Option<u64> = match o.value("split") {
        Some(s) => Some(s.parse().map_err(|_| UserError(format!("--split expects a positive integer, got `{s}`")))?),
        None => None,
    };
    let c = compile_kernel(o)?;
    let g = &c.declared;
    let mut b = Bindings::of_table(&g.dims);
    let mut k = 0;
    for (v, d) in g.dims.iter() {
        if d.dynamic {
            b.values[v.index()] = DEFAULT_EXTENTS[k % DEFAULT_EXTENTS.len()];
            k += 1;
        }
    }
    if let Some(spec) = o.value("dims") {
        for (name, x) in extent_pairs(spec).map_err(|e| UserError(format!("--dims: {e}")))? {
            let v =
                g.dims.find(name).ok_or_else(|| UserError(format!("--dims: `{name}` is not a dim of `{}`", g.name)))?;
            if !g.dims.get(v).dynamic {
                return Err(UserError(format!(
                    "--dims: `{name}` is static ({}) and cannot change",
                    g.dims.get(v).value
                )));
            }
            b.values[v.index()] = x;
        }
    }
    // Inputs from a file bind the dynamic dims from their shapes; random ones are made later.
    let given_inputs = match o.value("inputs") {
        Some(path) => {
            if o.value("scale").is_some() {
                return Err(UserError("--scale sets the magnitude of random inputs; --inputs gives the inputs".into()));
            }
            let fixed: Vec<&str> = o
                .value("dims")
                .map(|s| s.split(',').filter_map(|p| p.split_once('=')).map(|(n, _)| n.trim()).collect())
                .unwrap_or_default();
            Some(super::tensors::read_inputs(path, g, &mut b, &fixed)?)
        }
        None => None,
    };
    // The emulator holds every tensor of the graph twice (in f64 for the reference, and in its
    // dtype); refuse extents that would not fit rather than abort on allocation.
    let elements: u128 = g.nodes.iter().map(|n| n.shape.iter().map(|d| b.extent(*d) as u128).product::<u128>()).sum();
    if elements > RUN_MAX_ELEMENTS {
        return Err(UserError(format!(
            "--dims: at these extents the kernel's tensors hold {elements} elements, more than `cleave run` emulates ({RUN_MAX_ELEMENTS}); choose smaller extents"
        )));
    }
    // A kernel with layouts (packed or paged requests, merged axes) runs on buffers: random ones
    // come with valid, shuffled index tables, whose sizes set the extents of the axes they
    // index.
    let buffers = g.dims.has_per_request()
        || g.inputs.iter().map(|i| &i.decl).chain(g.outputs.iter().map(|o| &o.decl)).any(|t| t.layout.is_some());
    for (name, _) in &scale.per_input {
        if !g.inputs.iter().any(|i| &i.decl.name == name) {
            return Err(UserError(format!("--scale: `{name}` is not an input of `{}`", g.name)));
        }
    }
    let inputs = match given_inputs {
        Some(t) => t,
        None if buffers => random_buffers(g, &mut b, seed, &scale, &Requests::default()),
        None => random_inputs(g, &b, seed, &scale),
    };
    let launch = c.best();
    let mut lb = Bindings::of_table(launch.dims());
    lb.values[..b.values.len()].copy_from_slice(&b.values);
    lb.complete(launch.dims());
    let plan = plan_data(launch, &g.name).map_err(|e| UserError(format!("{}: {e}", g.name)))?;
    let lib = match o.value("source") {
        None => with_progress(format!("building the emulation of `{}`", g.name), || emulate::compile(launch, &plan)),
        Some(dir) => {
            let path = std::path::Path::new(dir).join(format!("{}.cu", g.name));
            let source = std::fs::read_to_string(&path)
                .map_err(|e| UserError(format!("--source: {}: cannot read: {e}", path.display())))?;
            // SAFETY: the user names the file to run, as they would a program of their own; it
            // must implement this plan, and the emulator's bounds checks (on unless
            // CLEAVE_EMU_CHECKS turns them off) report indexing past a tensor.
            unsafe { emulate::compile_source(&source, &plan) }
        }
    }
    .map_err(UserError)?;
    // The reference: over the buffers, request by request, for a kernel with layouts (a
    // malformed index table is refused there, as `run_host` refuses it); over the dense
    // tensors otherwise. `written` marks the output elements some request owns.
    let (want, written, exp_range): Reference = if buffers {
        let e = eval_buffers(g, &b, &inputs).map_err(|e| UserError(format!("reference: {e}")))?;
        (e.outputs, Some(e.written), Some((-e.max_exp_arg, e.max_exp_arg)))
    } else {
        let values = eval_nodes(g, &b, &inputs).map_err(|e| UserError(format!("reference: {e}")))?;
        // How large the exponents got: the point of large-magnitude inputs is to reach them.
        // Masked elements (-inf, whose exp is exactly 0) are not arguments of any size.
        let mut exp_range: Option<(f64, f64)> = None;
        for id in g.ids() {
            if g.node(id).op == Op::Unary(UnaryOp::Exp) {
                for x in values[g.node(id).args[0].index()].data.iter().filter(|x| x.is_finite()) {
                    let (lo, hi) = exp_range.unwrap_or((*x, *x));
                    exp_range = Some((lo.min(*x), hi.max(*x)));
                }
            }
        }
        (g.outputs.iter().map(|o| values[o.node.index()].clone()).collect(), None, exp_range)
    };
    let shape = RunShape { views: false, split_count };
    let got = lib
        .run_shaped(launch, &lb, &inputs, seed, &options, shape)
        .map_err(|e| UserError(format!("emulation failed: {e}")))?;
    let dims: Vec<String> =
        g.dims.iter().filter(|(_, d)| d.dynamic).map(|(v, d)| format!("{}={}", d.name, b.values[v.index()])).collect();
    // Which path each launch took: a tile program from a schedule, or a fallback stage.
    let kinds: Vec<&str> = launch
        .kernels
        .iter()
        .map(|k| match k {
            Kernel::Tile(_) => "tile",
            Kernel::Stage(_) => "stage",
        })
        .collect();
    println!(
        "kernel={} dims={} seed={seed} scale={} launches={} kinds={}",
        g.name,
        dims.join(","),
        o.value("scale").unwrap_or("1"),
        launch.kernels.len(),
        kinds.join(",")
    );
    if let Some((lo, hi)) = exp_range {
        println!("exp arguments range over [{lo:.1}, {hi:.1}]");
    }
    let mut worst: f64 = 0.0;
    for (k, ((o, gt), wt)) in g.outputs.iter().zip(&got).zip(&want).enumerate() {
        // Over buffers: only the elements some request owns are compared, and the others must
        // be as the emulator left them (NaN): a kernel writes nothing outside its requests.
        let (gt, wt) = match written.as_ref().map(|w| &w[k]) {
            Some(w) => {
                if let Some(at) = w.iter().zip(&gt.data).position(|(ok, x)| !ok && !x.is_nan()) {
                    return Err(UserError(format!(
                        "output {}: element {at} of its buffer, which no request owns, was written",
                        o.decl.name
                    )));
                }
                let pick =
                    |t: &Tensor| t.data.iter().zip(w).filter(|(_, ok)| **ok).map(|(x, _)| *x).collect::<Vec<f64>>();
                (pick(gt), pick(wt))
            }
            None => (gt.data.clone(), wt.data.clone()),
        };
        let (gt, wt) = (&Tensor { shape: vec![gt.len()], data: gt }, &Tensor { shape: vec![wt.len()], data: wt });
        let e = max_rel_err(&gt.data, &wt.data);
        let max_ref = wt.data.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        println!("output {} ({}): max_rel_err={e:.3e} max|ref|={max_ref:.3e}", o.decl.name, o.decl.dtype);
        worst = if e.is_nan() || worst.is_nan() { f64::NAN } else { worst.max(e) };
    }
    if let Some(path) = o.value("outputs") {
        super::tensors::write_outputs(path, g, &got)?;
        println!("wrote {path}");
    }
    if o.switch("views") {
        let viewed = lib
            .run_shaped(launch, &lb, &inputs, seed, &options, RunShape { views: true, ..shape })
            .map_err(|e| UserError(format!("emulation with views failed: {e}")))?;
        for ((o, dense), view) in g.outputs.iter().zip(&got).zip(&viewed) {
            let same = dense.data.len() == view.data.len()
                && dense
                    .data
                    .iter()
                    .zip(&view.data)
                    .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
            if !same {
                return Err(UserError(format!(
                    "output {}: the run with views differs from the dense run",
                    o.decl.name
                )));
            }
        }
        println!("views: every output matches the dense run bit for bit (padded rows and axes, offset starts)");
    }
    let tol = tolerance(g, &b, exp_range.map_or(0.0, |(lo, hi)| lo.abs().max(hi.abs())));
    println!("tolerance={tol:.3e}");
    println!("max_rel_err={worst:.6e}");
    if worst.is_nan() || worst > tol {
        return Err(UserError(format!("max_rel_err {worst:.3e} exceeds the tolerance {tol:.3e}")));
    }
    Ok(())
}

/// The reference outputs, which of their elements some request owns (over buffers), and the
/// range of the exps' arguments.
type Reference = (Vec<Tensor>, Option<Vec<Vec<bool>>>, Option<(f64, f64)>);

/// `--scale` is a standard deviation for every input (`8`), per input (`q=11,k=11`), or both
/// (`8,v=1`: the named inputs get theirs, the others the first).
fn parse_scale(spec: &str) -> Result<InputScale, UserError> {
    let mut scale = InputScale::default();
    let positive = |v: &str| {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x > 0.0)
            .ok_or_else(|| UserError(format!("--scale expects positive numbers, got `{v}`")))
    };
    for part in spec.split(',') {
        match part.split_once('=') {
            Some((name, v)) => scale.per_input.push((name.trim().to_string(), positive(v)?)),
            None => scale.default = positive(part)?,
        }
    }
    Ok(scale)
}
