//! Shared by the commands that run the pipeline: option parsing and the compile call.

use cleave_core::arch::Targets;
use cleave_core::pipeline::{compile, Compiled, Options};
use cleave_core::toolchain::ArchSet;

use super::{extent_pairs, kernel, load, with_progress, Opts, UserError};

/// Loads the file, finds the kernel and runs the pipeline on it.
pub(crate) fn compile_kernel(o: &Opts) -> Result<Compiled, UserError> {
    compile_with_decl(o).map(|(_, c)| c)
}

/// Like [`compile_kernel`], also returning the declaration as written.
pub(crate) fn compile_with_decl(o: &Opts) -> Result<(cleave_core::front::KernelDecl, Compiled), UserError> {
    let module = load(&o.file)?;
    let (decl, graph) = kernel(&module, o.required("kernel")?)?;
    let decl = decl.clone();
    let at_graph = match o.value("at") {
        Some(spec) => Some(at(&decl, spec).map_err(|e| UserError(format!("--at: {e}")))?),
        None => None,
    };
    let graph = at_graph.as_ref().unwrap_or(graph);
    let opts = options(o)?;
    let c = with_progress(format!("compiling `{}`: search and schedule", graph.name), || compile(graph, &opts))
        .map_err(|e| {
            UserError(
                cleave_core::front::Diagnostic::new(decl.name_pos, format!("kernel `{}`: {e}", graph.name))
                    .render(&o.file),
            )
        })?;
    Ok((decl, c))
}

/// With `--at`: the estimate of the plan made for the declared extents when it runs at the
/// `--at` ones, and those declared extents (`b=16`). A build plans an `also` extent apart
/// only to beat that figure, so `cleave schedule --at` prints it beside its own.
pub(crate) fn declared_plan_at(o: &Opts) -> Result<Option<(f64, String)>, UserError> {
    let Some(spec) = o.value("at") else { return Ok(None) };
    let module = load(&o.file)?;
    let (decl, declared) = kernel(&module, o.required("kernel")?)?;
    let at_graph = at(decl, spec).map_err(|e| UserError(format!("--at: {e}")))?;
    let opts = options(o)?;
    let c =
        with_progress(format!("compiling `{}` at its declared extents", declared.name), || compile(declared, &opts))
            .map_err(|e| UserError(format!("kernel `{}`: {e}", declared.name)))?;
    let seconds = cleave_core::pipeline::seconds_at(c.best(), &at_graph.dims, &Targets::new(&opts.archs));
    // The declared values of the dims `--at` names (`at` has checked them).
    let named: Vec<String> = extent_pairs(spec)
        .map_err(|e| UserError(format!("--at: {e}")))?
        .into_iter()
        .filter_map(|(name, _)| declared.dims.find(name).map(|v| format!("{name}={}", declared.dims.get(v).value)))
        .collect();
    Ok(Some((seconds, named.join(","))))
}

/// The pipeline options the flags select: `--no-split`, and `--arch` (else `CUDA_COMPUTE_CAP`).
/// One plan is made for every architecture listed, together; a build makes one per kind of GPU
/// (`ArchSet::plan_targets`), and `--arch 90`, `--arch 86` or `--arch 80` shows each of the
/// default build's three.
pub(crate) fn options(o: &Opts) -> Result<Options, UserError> {
    let mut opts = Options::default();
    if o.switch("no-split") {
        opts.search.split = false;
    }
    let arches = match o.value("arch") {
        Some(list) => ArchSet::parse(list),
        None => ArchSet::from_env(|v| std::env::var_os(v)),
    }
    .map_err(|e| UserError(format!("--arch: {e}")))?;
    opts.archs = arches.budgets();
    Ok(opts)
}

/// The declaration at other extents of its dynamic dims (`b=64,l=8192`): what a build plans
/// for an `also` extent, for any extent.
fn at(decl: &cleave_core::front::KernelDecl, spec: &str) -> Result<cleave_core::graph::ValidGraph, String> {
    let mut at_decl = decl.clone();
    for (name, value) in extent_pairs(spec)? {
        let d = at_decl
            .dims
            .iter_mut()
            .find(|d| d.name == name)
            .ok_or_else(|| format!("`{name}` is not a dim of `{}`", decl.name))?;
        if !d.dynamic && d.per_request.is_none() {
            return Err(format!("`{name}` is static ({}) and cannot change", d.value));
        }
        d.value = i128::from(value);
    }
    for d in &mut at_decl.dims {
        d.also.clear();
    }
    cleave_core::front::lower(&at_decl).map_err(|e| e.message)
}
