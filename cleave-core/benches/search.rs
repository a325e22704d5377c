//! Search benchmark: the algebraic phase with Split on for the subgraphs of `kernels.yaml`.
//!
//! Run with `cargo bench -p cleave-core --bench search [-- NAME_SUBSTRING ...]`. Prints a
//! Markdown table (seconds, states explored, graphs found, split graphs, stop reason) for
//! `bench/RESULTS.md`. Environment:
//! - `CLEAVE_SEARCH_FILE` reads another declaration file than `kernels.yaml`;
//! - `CLEAVE_SEARCH_TIME_LIMIT` (seconds) overrides the time limit;
//! - `CLEAVE_SEARCH_NO_SPLIT` turns Split off;
//! - `CLEAVE_SEARCH_VERBOSE` prints every found graph instead of the table;
//! - `CLEAVE_SEARCH_ABLATION` runs each selected kernel once per pruning rule with that rule
//!   off (state limit 5 M, time limit 60 s unless overridden) and prints their effect.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::time::Duration;

use cleave_core::front::check_source;
use cleave_core::graph::ValidGraph;
use cleave_core::superopt::{search, summary_text, Pruning, SearchOptions};

fn row(name: &str, variant: &str, graph: &ValidGraph, opts: &SearchOptions) {
    match search(graph, opts) {
        Ok(r) => println!(
            "| {name}{variant} | {} ({}) | {:.2} | {:.2} | {} | {} | {} | {} | {} |",
            graph.op_count(),
            r.max_ops,
            r.seconds,
            r.stage_seconds[1],
            r.states_explored,
            r.graphs.len(),
            r.graphs.iter().filter(|g| g.has_split()).count(),
            r.stop_reason.name(),
            r.egraph.nodes
        ),
        Err(e) => println!("| {name}{variant} | error: {e} |"),
    }
}

fn main() {
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let file = std::env::var("CLEAVE_SEARCH_FILE")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels.yaml").to_string());
    let text = std::fs::read(&file).expect("the declaration file");
    let module = check_source(&text).expect("the declaration file checks");
    let mut opts = SearchOptions::default();
    let verbose = std::env::var("CLEAVE_SEARCH_VERBOSE").is_ok();
    let ablation = std::env::var("CLEAVE_SEARCH_ABLATION").is_ok();
    if std::env::var("CLEAVE_SEARCH_NO_ABSTRACT").is_ok() {
        opts.pruning.abstract_expr = false;
        opts.pruning.distance = false;
    }
    if std::env::var("CLEAVE_SEARCH_NO_SPLIT").is_ok() {
        opts.split = false;
    }
    if ablation {
        opts.time_limit = Duration::from_secs(60);
        opts.max_states = 5_000_000;
    }
    if let Ok(s) = std::env::var("CLEAVE_SEARCH_TIME_LIMIT") {
        opts.time_limit = Duration::from_secs_f64(s.parse().expect("seconds"));
    }
    println!(
        "| kernel | ops (bound) | seconds | of which enumeration | states explored | graphs | with split | stop | e-graph nodes |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (decl, graph) in &module.kernels {
        if !filters.is_empty() && !filters.iter().any(|f| decl.name.contains(f.as_str())) {
            continue;
        }
        if verbose {
            match search(graph, &opts) {
                Ok(r) => eprintln!("{}", summary_text(&r)),
                Err(e) => eprintln!("{}: {e}", decl.name),
            }
            continue;
        }
        row(&decl.name, "", graph, &opts);
        if !ablation {
            continue;
        }
        let all = Pruning::default();
        let variants: [(&str, Pruning); 7] = [
            ("abstract_expr", Pruning { abstract_expr: false, distance: false, ..all }),
            ("reducibility", Pruning { reducibility: false, ..all }),
            ("duplicates", Pruning { duplicates: false, ..all }),
            ("open_bound", Pruning { open_bound: false, ..all }),
            ("pending_reduction", Pruning { pending_reduction: false, ..all }),
            ("distance", Pruning { distance: false, ..all }),
            ("views_on_leaves", Pruning { views_on_leaves: false, ..all }),
        ];
        for (name, pruning) in variants {
            let o = SearchOptions { pruning, ..opts.clone() };
            row(&decl.name, &format!(" without {name}"), graph, &o);
        }
    }
}
