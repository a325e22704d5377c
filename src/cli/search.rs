//! `cleave search FILE --kernel NAME [--json]`: the algebraic phase (DESIGN §7.2).
//!
//! Options beyond the contract: `--max-ops N` (size bound), `--max-states N`,
//! `--time-limit SECONDS`, and the switch `--no-split`.

use std::io::Write;
use std::time::Duration;

use cleave_core::graph::ValidGraph;
use cleave_core::superopt::{search as run_search, summary_text, to_json, SearchOptions, SearchResult};

use super::{kernel, load, with_progress, Opts, UserError};

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
    with_progress(format!("searching `{}`", graph.name), || run_search(graph, opts))
        .map_err(|e| UserError(format!("{}: {e}", graph.name)))
}

/// `cleave search`.
pub(crate) fn run(o: &Opts) -> Result<(), UserError> {
    let module = load(&o.file)?;
    let (_, graph) = kernel(&module, o.required("kernel")?)?;
    let result = search_kernel(graph, &options(o)?)?;
    let text = if o.switch("json") { to_json(&result) + "\n" } else { summary_text(&result) };
    // A closed pipe (`| head`) is not an error of the search; anything else is reported.
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(UserError(format!("cannot write the result: {e}"))),
        _ => Ok(()),
    }
}
