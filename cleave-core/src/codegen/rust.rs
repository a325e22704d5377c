//! The Rust launcher module of one declared kernel: a pure function of the declaration, its
//! [`PlanData`] and the entry-point symbols, byte-identical for the same input.
//!
//! The module (`pub mod <kernel>`) holds:
//! - `Dims`, one `usize` field per dynamic axis, in declaration order;
//! - `PLAN`, the runtime's `LaunchPlan` as a `static`;
//! - `FATBIN`, the embedded GPU binary (`None` when the crate was built without nvcc);
//! - `launch(stream, inputs.., outputs.., dims)`, which runs the plan on a CUDA stream,
//!   loading the module through the runtime's process-wide cache;
//! - `load(ctx)`, which loads the module ahead of time into a `Kernel` whose `launch` takes no
//!   lock and allocates nothing (a caller-provided workspace of `workspace_bytes(dims)` bytes);
//! - `candle_forward(tensors..)`, through the `cleave::__candle_forward!` macro, which expands
//!   to the function when `cleave` is built with its `candle` feature and to nothing otherwise;
//! - `run_host(inputs.., outputs.., dims)`, which runs the same plan through the host-emulation
//!   build of the same CUDA source;
//! - `Strides`, one element stride per axis of every tensor, and the `_strided` forms of
//!   `launch`, `Kernel::launch` and `run_host`, which take each tensor as a view of a larger
//!   buffer (the kernels read strides at run time, so one compile serves every view).
//!
//! Everything is named through absolute paths (`::cleave::runtime::..`), so the module works
//! wherever it is included. Parameter names are the declared tensor names, except where one
//! would clash with a name the module itself uses (`stream`, `dims`, `PLAN`, ..), which gets a
//! trailing `_`.

use std::fmt::Write;

use super::plan::{AxisData, PlanData, TensorData};
use crate::front::KernelDecl;
use crate::graph::DType;

/// The path generated code reaches the runtime through.
pub const RUNTIME: &str = "::cleave::runtime";

/// A fingerprint of cleave-core's sources and headers, computed when cleave-core is built:
/// caches of generated code key on it, so any change to the generator invalidates them.
pub const GENERATOR_FINGERPRINT: &str = env!("CLEAVE_CORE_FINGERPRINT");

/// The runtime's limits on a plan (`cleave_runtime::plan::MAX_*`), within which a launch keeps
/// its per-call tables on the stack. cleave-core does not depend on the runtime, so they are
/// restated here; a test of the facade checks that both agree.
pub const RUNTIME_MAX_DIMS: usize = 128;
/// See [`RUNTIME_MAX_DIMS`].
pub const RUNTIME_MAX_TENSORS: usize = 64;
/// See [`RUNTIME_MAX_DIMS`].
pub const RUNTIME_MAX_WORKSPACES: usize = 64;
/// See [`RUNTIME_MAX_DIMS`].
pub const RUNTIME_MAX_PARAMS: usize = 256;

/// The seed handed to the host emulator; fixed, so `run_host` is deterministic.
const HOST_SEED: u64 = 0;

/// One plan of a kernel and the GPUs it is for (mirrors the runtime's `Variant`).
#[derive(Clone, Debug)]
pub struct TargetPlan {
    /// The targets it was scheduled for, e.g. `sm_90` or `sm_86, sm_80`.
    pub target: String,
    /// The lowest compute capability it is meant for (86 for 8.6).
    pub min_cc: u32,
    /// The launch plan of the schedule chosen for them, at the extents it was made for (its
    /// dynamic dims' values, which the launcher measures a call's extents against).
    pub plan: PlanData,
    /// The index in the list of the plan for the same targets whose kernels this one's are
    /// (made for other extents, it came out the same): it is launched as that one.
    pub shares: Option<usize>,
}

/// Everything the launcher module of one kernel is made from.
#[derive(Clone, Copy, Debug)]
pub struct ModuleSpec<'a> {
    /// The declaration as written (for names and docs).
    pub decl: &'a KernelDecl,
    /// The plans, newest GPU first (at least one), each target's together, its declared
    /// extents first. The launchers run the one the device and the extents pick; the host
    /// emulation runs the first target's.
    pub plans: &'a [TargetPlan],
    /// Per plan of the first target (the leading plans with its name): the host-emulation
    /// entry point of each of its launches, in order (empty for one that shares another's).
    pub host_symbols: &'a [Vec<String>],
    /// A Rust expression of type `Option<::cleave::runtime::cuda::Fatbin>`: the embedded GPU
    /// binary holding the plan's kernels.
    pub fatbin: &'a str,
    /// Lines describing the chosen configuration, for the module's documentation.
    pub summary: &'a [String],
}

/// Names the generated module uses for its own items, parameters and locals, and the
/// prelude's enum variants (a parameter named `Some` would be a pattern, not a binding).
const TAKEN: &[&str] = &[
    "stream",
    "dims",
    "args",
    "PLAN",
    "PLANS",
    "plan",
    "FATBIN",
    "HOST",
    "HOSTS",
    "host_plan",
    "plan_at",
    "chosen",
    "Dims",
    "Strides",
    "strides",
    "launch_strided",
    "run_host_strided",
    "host_entry",
    "launch",
    "run_host",
    "load",
    "Kernel",
    "workspace",
    "workspace_bytes",
    "candle_forward",
    "self",
    "None",
    "Some",
    "Ok",
    "Err",
];

/// Why a module could not be generated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("kernel `{kernel}`: {reason}")]
pub struct RustGenError {
    /// The declared kernel name.
    pub kernel: String,
    /// What is inconsistent.
    pub reason: String,
}

/// The launcher module as Rust source text, formatted when the `rust-front` feature is on
/// (which brings `syn` and `prettyplease`).
pub fn module(spec: &ModuleSpec<'_>) -> Result<String, RustGenError> {
    let text = module_text(spec)?;
    #[cfg(feature = "rust-front")]
    let text = format(&text).map_err(|reason| RustGenError { kernel: spec.decl.name.clone(), reason })?;
    Ok(safety_comments(&text))
}

/// Parses and pretty-prints Rust source, so generated files read like hand-written ones.
#[cfg(feature = "rust-front")]
pub fn format(text: &str) -> Result<String, String> {
    let file = syn::parse_file(text).map_err(|e| format!("generated Rust does not parse: {e}"))?;
    Ok(prettyplease::unparse(&file))
}

/// Why each generated `unsafe` block is sound, keyed by how the block starts.
const SAFETY: &[(&str, &str)] = &[
    ("unsafe { args.launch(", "FATBIN was compiled from the same generated source as PLANS."),
    ("let loaded = unsafe {", "FATBIN was compiled from the same generated source as PLANS."),
    (
        "unsafe { args.run(",
        "HOSTS[chosen] holds the host-emulation build of the same generated source as PLANS[chosen].plan, one entry point per launch, in order.",
    ),
];

/// Puts a `// SAFETY:` comment above every `unsafe` block. Comments are not tokens, so they
/// are added after formatting, which would drop them.
fn safety_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 256);
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some((_, why)) = SAFETY.iter().find(|(start, _)| trimmed.starts_with(start)) {
            let indent = &line[..line.len() - trimmed.len()];
            let _ = writeln!(out, "{indent}// SAFETY: {why}");
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn rust_type(d: DType) -> String {
    match d {
        DType::F16 => format!("{RUNTIME}::f16"),
        DType::BF16 => format!("{RUNTIME}::bf16"),
        DType::F32 => "f32".to_string(),
        DType::I32 => "i32".to_string(),
    }
}

/// How a tensor is passed: a view with strides, a dense index tensor, or a scalar by value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pass {
    View,
    Index,
    Scalar,
}

fn pass(t: &TensorData) -> Pass {
    if t.dtype == DType::I32 {
        Pass::Index
    } else if t.shape.is_empty() {
        Pass::Scalar
    } else {
        Pass::View
    }
}

/// A shape as written in the declaration, from the plan: `[h, s, 1]`.
fn show_shape(plan: &PlanData, t: &TensorData) -> String {
    let name = |d: &u16| plan.dims.get(usize::from(*d)).map_or("?", |d| d.name.as_str());
    let axes: Vec<String> = t
        .shape
        .iter()
        .map(|a| match a {
            AxisData::One => "1".to_string(),
            AxisData::Dim(d) => name(d).to_string(),
            AxisData::Merged(ds) => format!("({})", ds.iter().map(name).collect::<Vec<_>>().join(" ")),
            AxisData::PlusOne(d) => format!("{} + 1", name(d)),
        })
        .collect();
    format!("[{}]", axes.join(", "))
}

/// A string literal holding `s` for a doc attribute.
fn doc(out: &mut String, s: &str) {
    let _ = writeln!(out, "#[doc = {:?}]", format!(" {s}").trim_end());
}

/// The launcher module, unformatted.
pub fn module_text(spec: &ModuleSpec<'_>) -> Result<String, RustGenError> {
    let Some(first) = spec.plans.first() else {
        return Err(RustGenError { kernel: spec.decl.name.clone(), reason: "no plan was given".into() });
    };
    let plan = &first.plan;
    let kernel = &plan.kernel;
    let fail = |reason: String| Err(RustGenError { kernel: kernel.clone(), reason });
    // Every plan must take the same arguments: the launchers pass one set to whichever runs.
    let signature = |p: &PlanData| -> Vec<String> {
        let dynamic = p.dims.iter().filter(|d| d.dynamic).map(|d| d.name.clone());
        let tensors =
            p.inputs.iter().chain(&p.outputs).map(|t| format!("{}: {}{}", t.name, t.dtype.name(), show_shape(p, t)));
        dynamic.chain(tensors).chain([format!("{} inputs", p.inputs.len())]).collect()
    };
    if let Some(other) = spec.plans.iter().find(|p| signature(&p.plan) != signature(plan) || p.plan.kernel != *kernel) {
        return fail(format!("the plan for {} takes other arguments than the plan for {}", other.target, first.target));
    }
    // The first target's plans, which the host emulation runs.
    let hosted = spec.plans.iter().take_while(|p| p.target == first.target).count();
    if spec.host_symbols.len() != hosted {
        return fail(format!("host entry points were given for {} plans of {hosted}", spec.host_symbols.len()));
    }
    for (p, symbols) in spec.plans.iter().zip(spec.host_symbols) {
        if p.shares.is_none() && symbols.len() != p.plan.launches.len() {
            return fail(format!(
                "{} host entry points were given for {} launches",
                symbols.len(),
                p.plan.launches.len()
            ));
        }
    }
    for (i, p) in spec.plans.iter().enumerate() {
        if let Some(j) = p.shares {
            let ok = j < i && spec.plans[j].shares.is_none() && spec.plans[j].target == p.target;
            if !ok {
                return fail(format!("plan {i} shares plan {j}, which is not an earlier plan of its targets"));
            }
        }
    }
    if spec.decl.name != *kernel {
        return fail(format!("the declaration is named `{}`", spec.decl.name));
    }
    for p in spec.plans.iter().map(|p| &p.plan) {
        let counts = [
            ("dims", p.dims.len(), RUNTIME_MAX_DIMS),
            ("inputs and outputs", p.inputs.len() + p.outputs.len(), RUNTIME_MAX_TENSORS),
            ("workspaces", p.workspaces.len(), RUNTIME_MAX_WORKSPACES),
            (
                "parameters in one launch",
                p.launches.iter().map(|l| l.params.len()).max().unwrap_or(0),
                RUNTIME_MAX_PARAMS,
            ),
        ];
        if let Some((what, n, limit)) = counts.into_iter().find(|&(_, n, limit)| n > limit) {
            return fail(format!("the plan has {n} {what}; the runtime takes at most {limit}"));
        }
    }
    let rt = RUNTIME;
    let driver = format!("{rt}::cudarc::driver");

    // Parameter names: the tensor names, made distinct from the module's own names.
    let mut used: Vec<String> = TAKEN.iter().map(|s| s.to_string()).collect();
    used.extend((1..spec.plans.len()).map(|i| format!("PLAN_{i}")));
    used.extend((1..spec.plans.len()).map(|i| format!("HOST_{i}")));
    let mut param = |name: &str| {
        let mut p = name.to_string();
        while used.contains(&p) {
            p.push('_');
        }
        used.push(p.clone());
        p
    };
    let inputs: Vec<(String, &TensorData)> = plan.inputs.iter().map(|t| (param(&t.name), t)).collect();
    let outputs: Vec<(String, &TensorData)> = plan.outputs.iter().map(|t| (param(&t.name), t)).collect();
    let dynamic: Vec<&str> = plan.dims.iter().filter(|d| d.dynamic).map(|d| d.name.as_str()).collect();

    let mut out = String::new();
    // Module documentation: the declaration and the chosen configuration.
    doc(&mut out, &format!("Launchers for kernel `{kernel}`, generated by cleave. Do not edit."));
    doc(&mut out, "");
    doc(&mut out, "```text");
    let dims: Vec<String> = spec
        .decl
        .dims
        .iter()
        .map(|d| if d.dynamic { format!("{}: dyn {}", d.name, d.value) } else { format!("{}: {}", d.name, d.value) })
        .collect();
    doc(&mut out, &format!("dims:    {}", dims.join(", ")));
    let tensors = |list: &[(String, &TensorData)]| -> String {
        list.iter()
            .map(|(_, t)| format!("{}: {}{}", t.name, t.dtype.name(), show_shape(plan, t)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    doc(&mut out, &format!("inputs:  {}", tensors(&inputs)));
    doc(&mut out, &format!("outputs: {}", tensors(&outputs)));
    doc(&mut out, "body:");
    for line in spec.decl.body.text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        doc(&mut out, &format!("    {line}"));
    }
    doc(&mut out, "```");
    if !spec.summary.is_empty() {
        doc(&mut out, "");
        doc(&mut out, "Chosen configuration:");
        doc(&mut out, "");
        for line in spec.summary {
            doc(&mut out, &format!("- {line}"));
        }
    }
    // Generated items are used as the crate pleases, named as declared and qualified in full.
    let _ = writeln!(
        out,
        "#[allow(dead_code, unreachable_pub, unused_qualifications, non_snake_case, missing_docs, clippy::all, clippy::pedantic)]"
    );
    let _ = writeln!(out, "pub mod {kernel} {{");

    // Dims.
    let _ = writeln!(out, "/// The extents of the dynamic axes, in declaration order.");
    let _ = writeln!(out, "#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]");
    let _ = writeln!(out, "pub struct Dims {{");
    for d in plan.dims.iter().filter(|d| d.dynamic) {
        doc(&mut out, &format!("The extent of `{}` (scheduled for {}).", d.name, d.value));
        let _ = writeln!(out, "pub {}: usize,", d.name);
    }
    let _ = writeln!(out, "}}");

    // Strides, with the dense layout as a constructor.
    let dim_value = |d: u16| -> String {
        match plan.dims.get(usize::from(d)) {
            Some(dim) if dim.dynamic => format!("dims.{}", dim.name),
            Some(dim) => dim.value.to_string(),
            None => "1".to_string(),
        }
    };
    let axis_factors = |a: &AxisData| -> Vec<String> {
        match a {
            AxisData::One => Vec::new(),
            AxisData::Dim(d) => vec![dim_value(*d)],
            AxisData::Merged(ds) => ds.iter().map(|d| dim_value(*d)).collect(),
            AxisData::PlusOne(d) => vec![format!("({} + 1)", dim_value(*d))],
        }
    };
    let views: Vec<&(String, &TensorData)> =
        inputs.iter().chain(&outputs).filter(|(_, t)| pass(t) == Pass::View).collect();
    let _ =
        writeln!(out, "/// The view of every input and output: one element stride per axis of its buffer, outermost");
    let _ = writeln!(out, "/// first. The last axis must be contiguous (stride 1); a stride of an axis of extent 1 is");
    let _ = writeln!(out, "/// ignored. Index tensors and scalars are passed whole and have none.");
    let _ = writeln!(out, "#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]");
    let _ = writeln!(out, "pub struct Strides {{");
    for (p, t) in &views {
        doc(&mut out, &format!("The strides of `{}`: `{}{}`.", t.name, t.dtype.name(), show_shape(plan, t)));
        let _ = writeln!(out, "pub {p}: [usize; {}],", t.shape.len());
    }
    let _ = writeln!(out, "}}");
    let _ = writeln!(out, "impl Strides {{");
    let _ = writeln!(out, "/// The strides of dense, row-major tensors at these extents.");
    let _ = writeln!(out, "pub fn contiguous(dims: Dims) -> Strides {{");
    // An outermost axis never enters a stride, so `dims` may go unused.
    let _ = writeln!(out, "let _ = dims;");
    let _ = writeln!(out, "Strides {{");
    for (p, t) in &views {
        let axes: Vec<String> = (0..t.shape.len())
            .map(|a| {
                let factors: Vec<String> = t.shape[a + 1..].iter().flat_map(&axis_factors).collect();
                if factors.is_empty() {
                    "1".to_string()
                } else {
                    factors.join(" * ")
                }
            })
            .collect();
        let _ = writeln!(out, "{p}: [{}],", axes.join(", "));
    }
    let _ = writeln!(out, "}}\n}}\n}}");

    // The plan, the fatbin and the host entry points.
    // Where each entry's plan is and the extents it was made for.
    let own = |i: usize| spec.plans[i].shares.unwrap_or(i);
    let plan_name = |i: usize| if own(i) == 0 { "PLAN".to_string() } else { format!("PLAN_{}", own(i)) };
    let made_for = |p: &PlanData| -> String {
        let at: Vec<String> = p.dims.iter().filter(|d| d.dynamic).map(|d| format!("{}={}", d.name, d.value)).collect();
        if at.is_empty() {
            String::new()
        } else {
            format!(" at {}", at.join(", "))
        }
    };
    let _ = writeln!(
        out,
        "/// The launch sequence made for {}{}: the first of `PLANS`.",
        first.target,
        made_for(&first.plan)
    );
    let _ = writeln!(out, "pub static PLAN: {rt}::LaunchPlan = {};", plan.to_rust(rt));
    for (i, p) in spec.plans.iter().enumerate().skip(1).filter(|(_, p)| p.shares.is_none()) {
        let _ = writeln!(out, "/// The launch sequence made for {}{}.", p.target, made_for(&p.plan));
        let _ = writeln!(out, "static PLAN_{i}: {rt}::LaunchPlan = {};", p.plan.to_rust(rt));
    }
    let variants: Vec<String> = spec
        .plans
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let at: Vec<String> = p.plan.dims.iter().filter(|d| d.dynamic).map(|d| d.value.to_string()).collect();
            format!(
                "{rt}::Variant {{ target: {:?}, min_cc: {}, at: &[{}], plan: &{} }}",
                p.target,
                p.min_cc,
                at.join(", "),
                plan_name(i)
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "/// Every plan of the kernel, newest GPU first, each GPU's together: `launch` and `load` run the"
    );
    let _ = writeln!(
        out,
        "/// first GPU whose compute capability and shared memory fit all of its plans, and of those the one"
    );
    let _ = writeln!(out, "/// made nearest to a call's extents (`cleave::runtime::plan::select`).");
    let _ = writeln!(out, "pub static PLANS: [{rt}::Variant; {}] = [{}];", variants.len(), variants.join(", "));
    let _ =
        writeln!(out, "/// The GPU binary holding this kernel's code; `None` when the crate was built without nvcc.");
    let _ = writeln!(out, "pub static FATBIN: ::core::option::Option<{rt}::cuda::Fatbin> = {};", spec.fatbin);
    let _ = writeln!(out, "mod host_entry {{");
    let _ = writeln!(out, "unsafe extern \"C\" {{");
    for symbol in spec.host_symbols.iter().flatten() {
        let _ = writeln!(
            out,
            "pub fn {symbol}(launch: *const {rt}::host::EmuLaunch, args: *const *mut ::core::ffi::c_void) -> ::core::ffi::c_int;"
        );
    }
    let _ = writeln!(out, "}}\n}}");
    let host_name = |i: usize| if own(i) == 0 { "HOST".to_string() } else { format!("HOST_{}", own(i)) };
    for (i, symbols) in spec.host_symbols.iter().enumerate().filter(|&(i, _)| spec.plans[i].shares.is_none()) {
        let host: Vec<String> = symbols.iter().map(|s| format!("host_entry::{s}")).collect();
        let _ = writeln!(out, "/// The host-emulation build of each launch of `{}`, in order.", plan_name(i));
        let _ = writeln!(out, "static {}: [{rt}::host::EmuFn; {}] = [{}];", host_name(i), host.len(), host.join(", "));
    }
    let hosts: Vec<String> = (0..spec.host_symbols.len()).map(|i| format!("&{}", host_name(i))).collect();
    let _ = writeln!(
        out,
        "/// The host-emulation builds of the first {hosted} entries of `PLANS` (the first GPU's plans)."
    );
    let _ = writeln!(out, "static HOSTS: [&[{rt}::host::EmuFn]; {hosted}] = [{}];", hosts.join(", "));

    let extents = format!("&[{}]", dynamic.iter().map(|d| format!("dims.{d}")).collect::<Vec<_>>().join(", "));
    // The runtime extents, so that a launcher's docs say which axes one compile serves.
    let runtime: Vec<String> =
        plan.dims.iter().filter(|d| d.dynamic).map(|d| format!("`{}` (scheduled for {})", d.name, d.value)).collect();
    let tensor_lines = |out: &mut String| {
        for (_, t) in inputs.iter().chain(&outputs) {
            doc(out, &format!("- `{}`: `{}{}`", t.name, t.dtype.name(), show_shape(plan, t)));
        }
    };
    // A launcher's signature; one without dynamic dims leaves its `dims` unused on purpose.
    let open_fn = |out: &mut String, name: &str, params: &[String], ret: &str| {
        let _ =
            writeln!(out, "pub fn {name}({}) -> ::core::result::Result<{ret}, ::cleave::Error> {{", params.join(", "));
        if dynamic.is_empty() {
            let _ = writeln!(out, "let _ = dims;");
        }
    };
    let shape_docs = |out: &mut String| {
        tensor_lines(out);
        doc(out, "");
        if runtime.is_empty() {
            doc(out, "Every extent is fixed at build time; `dims` has no fields.");
        } else {
            doc(out, &format!("Extents given at run time, in `dims`: {}.", runtime.join(", ")));
        }
    };

    // launch
    doc(&mut out, &format!("Queues kernel `{kernel}` on `stream` (nothing waits for it to finish)."));
    doc(&mut out, "");
    doc(&mut out, "Arguments are the inputs, then the outputs, in declaration order, dense and row-major:");
    doc(&mut out, "");
    shape_docs(&mut out);
    doc(&mut out, "");
    doc(&mut out, "Every length is checked against the extents before anything is queued. Errors: `NoDriver`,");
    doc(&mut out, "`NotBuilt` (no nvcc at build time), `UnsupportedArch`, `ShapeMismatch`, `InvalidExtent`,");
    doc(&mut out, "`Launch` and the others of `cleave::Error`.");
    let tensor_params = |params: &mut Vec<String>| {
        params.extend(inputs.iter().map(|(p, t)| match pass(t) {
            Pass::Scalar => format!("{p}: f32"),
            _ => format!("{p}: &impl {driver}::DevicePtr<{}>", rust_type(t.dtype)),
        }));
        params.extend(
            outputs.iter().map(|(p, t)| format!("{p}: &mut impl {driver}::DevicePtrMut<{}>", rust_type(t.dtype))),
        );
    };
    let mut device_chain = String::from("args");
    for (p, t) in &inputs {
        match pass(t) {
            Pass::Scalar => {
                let _ = write!(device_chain, ".scalar({p})?");
            }
            _ => {
                let _ = write!(device_chain, ".input::<{}, _>({p})?", rust_type(t.dtype));
            }
        }
    }
    for (p, t) in &outputs {
        let _ = write!(device_chain, ".output::<{}, _>({p})?", rust_type(t.dtype));
    }
    let mut strided_chain = String::from("args");
    for (p, t) in &inputs {
        match pass(t) {
            Pass::Scalar => {
                let _ = write!(strided_chain, ".scalar({p})?");
            }
            Pass::Index => {
                let _ = write!(strided_chain, ".input::<i32, _>({p})?");
            }
            Pass::View => {
                let _ = write!(strided_chain, ".input_strided::<{}, _>({p}, &strides.{p})?", rust_type(t.dtype));
            }
        }
    }
    for (p, t) in &outputs {
        let _ = write!(strided_chain, ".output_strided::<{}, _>({p}, &strides.{p})?", rust_type(t.dtype));
    }
    let views_doc = |out: &mut String, base: &str| {
        doc(out, &format!("`{base}` with every tensor a view: `strides` gives each one's element stride per axis"));
        doc(out, "(`Strides::contiguous(dims)` for dense tensors), and a view starts at its buffer's first");
        doc(out, "element and must lie inside it, so that a tensor inside a larger buffer (a KV cache allocated");
        doc(out, "for its capacity, one projection of a fused weight) is used in place. The last axis must be");
        doc(out, "contiguous, an output must not overlap itself, and a tensor whose last axis is a static");
        doc(out, "multiple of 16 bytes needs 16-byte aligned rows. Errors: those of the dense form, and `View`.");
    };
    let mut params = vec![format!("stream: &::std::sync::Arc<{driver}::CudaStream>")];
    tensor_params(&mut params);
    params.push("dims: Dims".to_string());
    open_fn(&mut out, "launch", &params, "()");
    let _ = writeln!(out, "let plan = {rt}::cuda::select(stream.context(), &PLANS, {extents})?;");
    let _ = writeln!(out, "let mut args = {rt}::cuda::Args::new(plan, stream, {extents})?;");
    let _ = writeln!(out, "{device_chain};");
    let _ = writeln!(out, "unsafe {{ args.launch(FATBIN.as_ref()) }}");
    let _ = writeln!(out, "}}");
    views_doc(&mut out, "launch");
    params.push("strides: &Strides".to_string());
    open_fn(&mut out, "launch_strided", &params, "()");
    let _ = writeln!(out, "let plan = {rt}::cuda::select(stream.context(), &PLANS, {extents})?;");
    let _ = writeln!(out, "let mut args = {rt}::cuda::Args::new(plan, stream, {extents})?;");
    let _ = writeln!(out, "{strided_chain};");
    let _ = writeln!(out, "unsafe {{ args.launch(FATBIN.as_ref()) }}");
    let _ = writeln!(out, "}}");

    // workspace_bytes, load and Kernel
    doc(&mut out, "The bytes of workspace a `Kernel::launch` with these extents needs on any GPU: 0 unless a");
    doc(&mut out, "chosen configuration splits a reduction, whose partials live there (the largest of the plans;");
    doc(&mut out, "`Kernel::workspace_bytes` gives that of the loaded plan these extents run).");
    open_fn(&mut out, "workspace_bytes", &["dims: Dims".to_string()], "u64");
    let _ = writeln!(out, "{rt}::cuda::workspace_bytes_any(&PLANS, {extents})");
    let _ = writeln!(out, "}}");
    doc(&mut out, &format!("Kernel `{kernel}` loaded into one CUDA context ahead of time (see `load`)."));
    let _ = writeln!(out, "#[derive(Debug, Clone)]");
    let _ = writeln!(out, "pub struct Kernel({rt}::cuda::Loaded);");
    doc(&mut out, &format!("Loads kernel `{kernel}` into `ctx`: the module, its functions and their shared-memory"));
    doc(&mut out, "limits, so that `Kernel::launch` takes no lock, allocates nothing and never synchronizes");
    doc(&mut out, "(its driver calls are the launches and cudarc's stream-ordered event waits and records for");
    doc(&mut out, "the buffers); it can then be captured into a CUDA graph.");
    let _ = writeln!(
        out,
        "pub fn load(ctx: &::std::sync::Arc<{driver}::CudaContext>) -> ::core::result::Result<Kernel, ::cleave::Error> {{"
    );
    let _ =
        writeln!(out, "let loaded = unsafe {{ {rt}::cuda::Loaded::with_variants(ctx, FATBIN.as_ref(), &PLANS) }}?;");
    let _ = writeln!(out, "::core::result::Result::Ok(Kernel(loaded))");
    let _ = writeln!(out, "}}");
    let _ = writeln!(out, "impl Kernel {{");
    doc(&mut out, "The plan the device picked when this was loaded (one of `PLANS`), for the declared extents.");
    let _ = writeln!(out, "pub fn plan(&self) -> &'static {rt}::LaunchPlan {{ self.0.plan() }}");
    doc(&mut out, "The plan `launch` runs at these extents: of the device's plans, the one made nearest to them.");
    let _ = writeln!(out, "pub fn plan_at(&self, dims: Dims) -> &'static {rt}::LaunchPlan {{");
    if dynamic.is_empty() {
        let _ = writeln!(out, "let _ = dims;");
    }
    let _ = writeln!(out, "self.0.plan_at({extents})");
    let _ = writeln!(out, "}}");
    doc(&mut out, "The bytes of workspace `launch` with these extents needs, under the plan it runs for them.");
    open_fn(&mut out, "workspace_bytes", &["&self".to_string(), "dims: Dims".to_string()], "u64");
    let _ = writeln!(out, "self.0.workspace_bytes({extents})");
    let _ = writeln!(out, "}}");
    doc(&mut out, &format!("Queues kernel `{kernel}` on `stream`, a stream of the context it was loaded into."));
    doc(&mut out, "");
    doc(&mut out, "The arguments of `launch`, plus a `workspace` of at least `workspace_bytes(dims)` bytes");
    doc(&mut out, "(`Workspace::none()` when that is 0) that no other work uses until this launch is done:");
    doc(&mut out, "");
    shape_docs(&mut out);
    doc(&mut out, "");
    doc(&mut out, "Errors: those of `launch`, and `WorkspaceTooSmall`.");
    let mut params = vec!["&self".to_string(), format!("stream: &::std::sync::Arc<{driver}::CudaStream>")];
    tensor_params(&mut params);
    params.push(format!("workspace: &mut {rt}::cuda::Workspace"));
    params.push("dims: Dims".to_string());
    open_fn(&mut out, "launch", &params, "()");
    let _ = writeln!(out, "let mut args = {rt}::cuda::Args::new(self.0.plan_at({extents}), stream, {extents})?;");
    let _ = writeln!(out, "{device_chain};");
    let _ = writeln!(out, "self.0.launch(args, workspace)");
    let _ = writeln!(out, "}}");
    views_doc(&mut out, "Kernel::launch");
    params.push("strides: &Strides".to_string());
    open_fn(&mut out, "launch_strided", &params, "()");
    let _ = writeln!(out, "let mut args = {rt}::cuda::Args::new(self.0.plan_at({extents}), stream, {extents})?;");
    let _ = writeln!(out, "{strided_chain};");
    let _ = writeln!(out, "self.0.launch(args, workspace)");
    let _ = writeln!(out, "}}");
    let _ = writeln!(out, "}}");

    // host_plan and run_host
    doc(&mut out, "The plan `run_host` runs at these extents: of the first GPU's plans, the one made nearest to them.");
    let _ = writeln!(out, "pub fn host_plan(dims: Dims) -> &'static {rt}::LaunchPlan {{");
    if dynamic.is_empty() {
        let _ = writeln!(out, "let _ = dims;");
    }
    let _ = writeln!(out, "PLANS[{rt}::plan::nearest_index(&PLANS[..{hosted}], {extents})].plan");
    let _ = writeln!(out, "}}");
    doc(&mut out, &format!("Runs kernel `{kernel}` on the CPU through the host emulation of its generated CUDA."));
    doc(&mut out, "");
    doc(&mut out, "Same arguments and checks as `launch`, on host slices:");
    doc(&mut out, "");
    shape_docs(&mut out);
    let mut params: Vec<String> = inputs
        .iter()
        .map(|(p, t)| match pass(t) {
            Pass::Scalar => format!("{p}: f32"),
            _ => format!("{p}: &[{}]", rust_type(t.dtype)),
        })
        .collect();
    params.extend(outputs.iter().map(|(p, t)| format!("{p}: &mut [{}]", rust_type(t.dtype))));
    params.push("dims: Dims".to_string());
    open_fn(&mut out, "run_host", &params, "()");
    let mut chain = String::from("args");
    for (p, t) in &inputs {
        match pass(t) {
            Pass::Scalar => {
                let _ = write!(chain, ".scalar({p})?");
            }
            _ => {
                let _ = write!(chain, ".input({p})?");
            }
        }
    }
    for (p, _) in &outputs {
        let _ = write!(chain, ".output({p})?");
    }
    let _ = writeln!(out, "let chosen = {rt}::plan::nearest_index(&PLANS[..{hosted}], {extents});");
    let _ = writeln!(out, "let mut args = {rt}::host::Args::new(PLANS[chosen].plan, {extents})?;");
    let _ = writeln!(out, "{chain};");
    let _ = writeln!(out, "unsafe {{ args.run(HOSTS[chosen], {HOST_SEED}) }}");
    let _ = writeln!(out, "}}");
    views_doc(&mut out, "run_host");
    params.push("strides: &Strides".to_string());
    open_fn(&mut out, "run_host_strided", &params, "()");
    let mut chain = String::from("args");
    for (p, t) in &inputs {
        match pass(t) {
            Pass::Scalar => {
                let _ = write!(chain, ".scalar({p})?");
            }
            Pass::Index => {
                let _ = write!(chain, ".input({p})?");
            }
            Pass::View => {
                let _ = write!(chain, ".input_strided({p}, &strides.{p})?");
            }
        }
    }
    for (p, _) in &outputs {
        let _ = write!(chain, ".output_strided({p}, &strides.{p})?");
    }
    let _ = writeln!(out, "let chosen = {rt}::plan::nearest_index(&PLANS[..{hosted}], {extents});");
    let _ = writeln!(out, "let mut args = {rt}::host::Args::new(PLANS[chosen].plan, {extents})?;");
    let _ = writeln!(out, "{chain};");
    let _ = writeln!(out, "unsafe {{ args.run(HOSTS[chosen], {HOST_SEED}) }}");
    let _ = writeln!(out, "}}");

    // candle_forward, written by a macro of `cleave` so that it follows that crate's features.
    // candle has no i32 tensors, and a scalar is a value, not a tensor: kernels with index
    // tables or scalars are served by `launch` and `run_host` alone.
    if inputs.iter().any(|(_, t)| pass(t) != Pass::View) {
        let _ = writeln!(out, "}}");
        return Ok(out);
    }
    let _ = writeln!(out, "::cleave::__candle_forward! {{");
    doc(&mut out, &format!("Runs kernel `{kernel}` on candle tensors (the `candle` feature of `cleave`)."));
    doc(&mut out, "");
    doc(&mut out, "Inputs in declaration order, on one device, each read in place at its own strides (a");
    doc(&mut out, "narrow or a transpose of the outer axes is no copy; the last axis must be contiguous); the");
    doc(&mut out, "outputs come back in declaration order, dense, allocated on that device:");
    doc(&mut out, "");
    tensor_lines(&mut out);
    doc(&mut out, "");
    doc(&mut out, "The runtime extents are read from the inputs' shapes. CPU tensors run the host emulation;");
    doc(&mut out, "CUDA tensors (the `candle-cuda` feature) launch on the device's stream with no copy. A wrong");
    doc(&mut out, "rank, extent, dtype, layout or device is an `Err` naming the argument.");
    let names = |list: &[(String, &TensorData)]| list.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>().join(", ");
    let _ = writeln!(out, "fn candle_forward({}) -> [{}];", names(&inputs), names(&outputs));
    let _ = writeln!(out, "}}");
    let _ = writeln!(out, "}}");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::plan::{DimData, FactorData, LaunchData, ParamData};
    use crate::front::{Body, KernelDecl, Pos, PosMap};

    fn spec_parts() -> (KernelDecl, PlanData, Vec<String>) {
        let decl = KernelDecl {
            name: "rowsum".into(),
            name_pos: Pos::start(),
            pos: Pos::start(),
            dims: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            body: Body { text: "y = sum(x, axis=-1)\n".into(), map: PosMap::single(Pos::start()) },
        };
        let plan = PlanData {
            kernel: "rowsum".into(),
            dims: vec![
                DimData { name: "m".into(), value: 3, dynamic: false, derive: None },
                DimData { name: "k".into(), value: 100, dynamic: true, derive: None },
            ],
            inputs: vec![TensorData {
                name: "dims".into(),
                dtype: DType::F32,
                shape: vec![AxisData::Dim(0), AxisData::Dim(1)],
            }],
            outputs: vec![TensorData {
                name: "y".into(),
                dtype: DType::BF16,
                shape: vec![AxisData::Dim(0), AxisData::One],
            }],
            workspaces: vec![],
            launches: vec![LaunchData {
                symbol: "cleave_rowsum_0".into(),
                grid: vec![FactorData::Const(3)],
                threads: 32,
                smem_bytes: 0,
                params: vec![ParamData::Input(0), ParamData::Output(0), ParamData::Extent(1)],
            }],
            tables: vec![],
        };
        (decl, plan, vec!["cleave_emu_cleave_rowsum_0_0123".into()])
    }

    #[test]
    fn module_is_deterministic_and_renames_clashing_parameters() {
        let (decl, plan, host) = spec_parts();
        let plans = [TargetPlan { target: "sm_90".into(), min_cc: 90, plan, shares: None }];
        let spec = ModuleSpec { decl: &decl, plans: &plans, host_symbols: &[host], fatbin: "None", summary: &[] };
        let a = module(&spec).unwrap();
        assert_eq!(a, module(&spec).unwrap());
        assert!(a.contains("pub mod rowsum {"), "{a}");
        assert!(a.contains("pub k: usize,"), "{a}");
        assert!(!a.contains("pub m: usize"), "{a}");
        // The input named `dims` must not shadow the `dims: Dims` parameter.
        assert!(a.contains("dims_: &[f32]"), "{a}");
        assert!(a.contains("y: &mut [::cleave::runtime::bf16]"), "{a}");
        assert!(a.contains(".input(dims_)?.output(y)?"), "{a}");
        assert!(a.contains("cleave_emu_cleave_rowsum_0_0123"), "{a}");
        assert_eq!(a.matches("// SAFETY:").count(), a.matches("unsafe {").count(), "{a}");
        assert_eq!(a.matches("unsafe {").count(), 5, "{a}");
        // The views: a stride per axis of every tensor, dense strides from the extents, and the
        // strided forms handing each view to the builder.
        assert!(a.contains("pub dims_: [usize; 2],"), "{a}");
        assert!(a.contains("dims_: [dims.k, 1],"), "{a}");
        assert!(a.contains("y: [1, 1],"), "{a}");
        assert!(a.contains(".input_strided(dims_, &strides.dims_)?.output_strided(y, &strides.y)?"), "{a}");
        assert!(a.contains("strides: &Strides"), "{a}");
        // The pretty-printer wraps a macro's tokens by width, so compare them with the spacing collapsed.
        let flat = a.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(flat.contains("fn candle_forward(dims_) -> [y];"), "{a}");
    }

    /// Both launchers' docs list every tensor with its dtype and shape and name the runtime
    /// extents; every field of `Dims` has its own line.
    #[test]
    fn launcher_docs_give_shapes_dtypes_and_runtime_extents() {
        let (decl, plan, host) = spec_parts();
        let plans = [TargetPlan { target: "sm_90".into(), min_cc: 90, plan: plan.clone(), shares: None }];
        let spec = ModuleSpec {
            decl: &decl,
            plans: &plans,
            host_symbols: std::slice::from_ref(&host),
            fatbin: "None",
            summary: &[],
        };
        let a = module(&spec).unwrap();
        let runtime = "Extents given at run time, in `dims`: `k` (scheduled for 100).";
        // `launch`, `Kernel::launch` and `run_host` take `dims`; `candle_forward` reads shapes.
        assert_eq!(a.matches(runtime).count(), 3, "{a}");
        assert_eq!(a.matches("- `dims`: `f32[m, k]`").count(), 4, "{a}");
        assert!(a.contains("The runtime extents are read from the inputs' shapes."), "{a}");
        assert!(a.contains("The extent of `k` (scheduled for 100)."), "{a}");
        let mut fixed = plan;
        fixed.dims.iter_mut().for_each(|d| d.dynamic = false);
        let plans = [TargetPlan { target: "sm_90".into(), min_cc: 90, plan: fixed, shares: None }];
        let spec = ModuleSpec { decl: &decl, plans: &plans, host_symbols: &[host], fatbin: "None", summary: &[] };
        let b = module(&spec).unwrap();
        assert_eq!(b.matches("Every extent is fixed at build time; `dims` has no fields.").count(), 3, "{b}");
    }

    #[test]
    fn inconsistent_specs_are_errors() {
        let (decl, plan, _) = spec_parts();
        let plans = [TargetPlan { target: "sm_90".into(), min_cc: 90, plan: plan.clone(), shares: None }];
        let spec = ModuleSpec { decl: &decl, plans: &plans, host_symbols: &[], fatbin: "None", summary: &[] };
        let err = module(&spec).unwrap_err();
        assert_eq!(err.to_string(), "kernel `rowsum`: host entry points were given for 0 plans of 1");
        let spec = ModuleSpec { decl: &decl, plans: &plans, host_symbols: &[Vec::new()], fatbin: "None", summary: &[] };
        let err = module(&spec).unwrap_err();
        assert_eq!(err.to_string(), "kernel `rowsum`: 0 host entry points were given for 1 launches");
        // A plan shares only an earlier plan of its own targets.
        let forward = [
            TargetPlan { target: "sm_90".into(), min_cc: 90, plan: plan.clone(), shares: Some(1) },
            TargetPlan { target: "sm_90".into(), min_cc: 90, plan: plan.clone(), shares: None },
        ];
        let host = vec!["h".to_string()];
        let spec = ModuleSpec {
            decl: &decl,
            plans: &forward,
            host_symbols: &[Vec::new(), host],
            fatbin: "None",
            summary: &[],
        };
        let err = module(&spec).unwrap_err();
        assert_eq!(
            err.to_string(),
            "kernel `rowsum`: plan 0 shares plan 1, which is not an earlier plan of its targets"
        );
        let spec = ModuleSpec { decl: &decl, plans: &[], host_symbols: &[], fatbin: "None", summary: &[] };
        assert_eq!(module(&spec).unwrap_err().to_string(), "kernel `rowsum`: no plan was given");
        // Plans that take different arguments cannot share one launcher.
        let mut other = plan.clone();
        other.dims[1].dynamic = false;
        let plans = [
            TargetPlan { target: "sm_90".into(), min_cc: 90, plan, shares: None },
            TargetPlan { target: "sm_80".into(), min_cc: 80, plan: other, shares: None },
        ];
        let host = vec!["h".to_string()];
        let spec = ModuleSpec { decl: &decl, plans: &plans, host_symbols: &[host], fatbin: "None", summary: &[] };
        assert_eq!(
            module(&spec).unwrap_err().to_string(),
            "kernel `rowsum`: the plan for sm_80 takes other arguments than the plan for sm_90"
        );
    }

    /// A module with the spacing collapsed and without the trailing commas the formatter adds,
    /// so that tests compare its items however they were wrapped.
    fn flat(text: &str) -> String {
        text.split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .replace(", }", " }")
            .replace(", ]", " ]")
            .replace("( ", "(")
    }

    /// A kernel planned for several GPUs lists every plan, newest first; the launchers pick one
    /// per device, and the host emulation runs the first.
    #[test]
    fn every_plan_is_listed_and_launchers_pick_by_device() {
        let (decl, plan, host) = spec_parts();
        let mut older = plan.clone();
        older.launches[0].symbol = "cleave_rowsum_sm80_0".into();
        older.launches[0].smem_bytes = 1024;
        let plans = [
            TargetPlan { target: "sm_90".into(), min_cc: 90, plan, shares: None },
            TargetPlan { target: "sm_86, sm_80".into(), min_cc: 80, plan: older, shares: None },
        ];
        let spec = ModuleSpec { decl: &decl, plans: &plans, host_symbols: &[host], fatbin: "None", summary: &[] };
        let a = module(&spec).unwrap();
        let flat = flat(&a);
        assert!(flat.contains("pub static PLANS: [::cleave::runtime::Variant; 2] = ["), "{a}");
        assert!(flat.contains("target: \"sm_90\", min_cc: 90, at: &[100], plan: &PLAN }"), "{a}");
        assert!(flat.contains("target: \"sm_86, sm_80\", min_cc: 80, at: &[100], plan: &PLAN_1 }"), "{a}");
        assert!(flat.contains("symbol: \"cleave_rowsum_sm80_0\""), "{a}");
        assert_eq!(flat.matches("::cleave::runtime::cuda::select(stream.context(), &PLANS, &[dims.k])").count(), 2);
        assert!(flat.contains("::cleave::runtime::cuda::Loaded::with_variants(ctx, FATBIN.as_ref(), &PLANS)"), "{a}");
        assert!(flat.contains("::cleave::runtime::cuda::workspace_bytes_any(&PLANS"), "{a}");
        // The host runs the first GPU's plans only: here the one.
        assert!(flat.contains("static HOSTS: [&[::cleave::runtime::host::EmuFn]; 1] = [&HOST]"), "{a}");
        assert!(flat.contains("::cleave::runtime::plan::nearest_index(&PLANS[..1], &[dims.k])"), "{a}");
        assert!(flat.contains("::cleave::runtime::host::Args::new(PLANS[chosen].plan,"), "{a}");
        assert!(flat.contains("::cleave::runtime::cuda::Args::new(self.0.plan_at(&[dims.k]),"), "{a}");
    }

    /// Plans made for other extents of a dynamic dim sit next to their GPU's first plan; one
    /// whose kernels came out the same as another's points at that plan and adds no code, and
    /// the host emulation runs whichever of the first GPU's plans is nearest.
    #[test]
    fn plans_for_other_extents_are_listed_with_their_extents() {
        let (decl, plan, host) = spec_parts();
        let at = |k: u64, symbol: &str| {
            let mut p = plan.clone();
            p.dims.iter_mut().filter(|d| d.name == "k").for_each(|d| d.value = k);
            p.launches[0].symbol = symbol.into();
            p
        };
        let plans = [
            TargetPlan { target: "sm_90".into(), min_cc: 90, plan: plan.clone(), shares: None },
            TargetPlan { target: "sm_90".into(), min_cc: 90, plan: at(400, "cleave_rowsum_k400_0"), shares: None },
            TargetPlan { target: "sm_90".into(), min_cc: 90, plan: at(1600, "cleave_rowsum_0"), shares: Some(0) },
            TargetPlan { target: "sm_80".into(), min_cc: 80, plan: at(100, "cleave_rowsum_sm80_0"), shares: None },
        ];
        let host400 = vec!["cleave_emu_k400".to_string()];
        let spec = ModuleSpec {
            decl: &decl,
            plans: &plans,
            host_symbols: &[host, host400, Vec::new()],
            fatbin: "None",
            summary: &[],
        };
        let a = module(&spec).unwrap();
        assert_eq!(a, module(&spec).unwrap());
        let flat = flat(&a);
        assert!(flat.contains("pub static PLANS: [::cleave::runtime::Variant; 4] = ["), "{a}");
        assert!(flat.contains("min_cc: 90, at: &[100], plan: &PLAN }"), "{a}");
        assert!(flat.contains("min_cc: 90, at: &[400], plan: &PLAN_1 }"), "{a}");
        assert!(flat.contains("min_cc: 90, at: &[1600], plan: &PLAN }"), "{a}");
        assert!(flat.contains("min_cc: 80, at: &[100], plan: &PLAN_3 }"), "{a}");
        assert!(!flat.contains("static PLAN_2"), "{a}");
        assert!(flat.contains("The launch sequence made for sm_90 at k=400."), "{a}");
        assert!(flat.contains("static HOST_1: [::cleave::runtime::host::EmuFn; 1] = [host_entry::cleave_emu_k400]"));
        assert!(flat.contains("static HOSTS: [&[::cleave::runtime::host::EmuFn]; 3] = [&HOST, &HOST_1, &HOST]"), "{a}");
        assert!(flat.contains("::cleave::runtime::plan::nearest_index(&PLANS[..3], &[dims.k])"), "{a}");
        assert!(flat.contains("pub fn host_plan(dims: Dims)"), "{a}");
        assert!(flat.contains("pub fn plan_at(&self, dims: Dims)"), "{a}");
    }
}
