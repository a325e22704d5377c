//! `cleave search FILE --kernel NAME [--json]`: the algebraic phase (DESIGN §7.2).
//!
//! Options beyond the contract: `--max-ops N` (size bound), `--max-states N`,
//! `--time-limit SECONDS`, and the switch `--no-split`.

use std::time::Duration;

use cleave_core::graph::ValidGraph;
use cleave_core::superopt::{explain_text, search as run_search, summary_text, to_json, SearchOptions, SearchResult};

use super::{kernel, load, Opts, UserError};

/// Reads the search options from the command line.
fn options(o: &Opts) -> Result<SearchOptions, UserError> {
    let mut opts = SearchOptions::default();
    if o.switch("no-split") {
        opts.split = false;
    }
    if let Some(v) = o.value("max-ops") {
        let n: usize = v.parse().map_err(|_| UserError(format!("--max-ops expects a number, got `{v}`")))?;
        opts.max_ops = Some(n);
    }
    if let Some(v) = o.value("max-states") {
        opts.max_states = v.parse().map_err(|_| UserError(format!("--max-states expects a number, got `{v}`")))?;
    }
    if let Some(v) = o.value("time-limit") {
        let s: f64 = v.parse().map_err(|_| UserError(format!("--time-limit expects seconds, got `{v}`")))?;
        if !(s.is_finite() && s > 0.0) {
            return Err(UserError(format!("--time-limit expects a positive number of seconds, got `{v}`")));
        }
        opts.time_limit = Duration::from_secs_f64(s);
    }
    Ok(opts)
}

/// Runs the search on one kernel; search errors are user errors (they name the op).
pub(crate) fn search_kernel(graph: &ValidGraph, opts: &SearchOptions) -> Result<SearchResult, UserError> {
    run_search(graph, opts).map_err(|e| UserError(format!("{}: {e}", graph.name)))
}

/// `cleave search`.
pub(crate) fn run(o: &Opts) -> Result<(), UserError> {
    let module = load(&o.file)?;
    let (_, graph) = kernel(&module, o.required("kernel")?)?;
    let result = search_kernel(graph, &options(o)?)?;
    if o.switch("json") {
        println!("{}", to_json(&result));
    } else {
        print!("{}", summary_text(&result));
    }
    Ok(())
}

/// The found graphs of a kernel in infix form, for `cleave explain`.
pub(crate) fn explain_section(graph: &ValidGraph) -> Result<String, UserError> {
    let result = search_kernel(graph, &SearchOptions::default())?;
    let mut out = format!(
        "{} equivalent graph(s), {} states explored, stopped: {}\n",
        result.graphs.len(),
        result.states_explored,
        result.stop_reason.name()
    );
    out.push_str(&explain_text(&result));
    Ok(out)
}
