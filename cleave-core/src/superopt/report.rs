//! Reports of a search: the JSON of `cleave search --json` (DESIGN §7.2) and readable text.
//!
//! The JSON is built from structs with a fixed field order and serialized by serde_json, so
//! two runs of the same search give byte-identical output apart from `seconds`.

use std::fmt::Write;

use serde::Serialize;

use super::verify::Check;
use super::{FoundGraph, SearchResult};
use crate::graph::{Dim, Graph, NodeId, Op};

#[derive(Serialize)]
struct SearchJson<'a> {
    kernel: &'a str,
    seconds: f64,
    states_explored: u64,
    stop_reason: &'static str,
    max_ops: usize,
    egraph: EGraphJson<'a>,
    pruned: PrunedJson,
    rejected_by_final_checks: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    without_split: Option<PlainPhaseJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    split_refused_bound: Option<usize>,
    graphs: Vec<GraphJson>,
}

/// The search without Split after a cut search with it; its seconds are in the top-level
/// `seconds`, the one field allowed to differ between runs.
#[derive(Serialize)]
struct PlainPhaseJson {
    graphs_added: usize,
    states_explored: u64,
    stop_reason: &'static str,
}

#[derive(Serialize)]
struct EGraphJson<'a> {
    classes: usize,
    nodes: usize,
    iterations: usize,
    stop_reason: &'a str,
}

#[derive(Serialize)]
struct PrunedJson {
    abstract_expr: u64,
    shape: u64,
    duplicate: u64,
    open_bound: u64,
    pending_reduction: u64,
    distance: u64,
    fingerprinted: u64,
    fingerprint_rejected: u64,
}

#[derive(Serialize)]
struct GraphJson {
    has_split: bool,
    expr: Vec<String>,
    ops: Vec<OpJson>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    split_counts: Vec<SplitCountsJson>,
    checks: ChecksJson,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
}

#[derive(Serialize)]
struct SplitCountsJson {
    symbol: String,
    dim: String,
    values: Vec<u64>,
    predicated: bool,
}

#[derive(Serialize)]
struct ChecksJson {
    full_shape: String,
    float: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    float_max_rel_err: Option<f64>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum DimJson {
    One(u8),
    Symbol(String),
}

#[derive(Serialize)]
struct OpJson {
    id: String,
    op: &'static str,
    inputs: Vec<String>,
    shape: Vec<DimJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    axis: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<f64>,
}

fn check_text(c: &Check) -> String {
    match c {
        Check::Passed => "passed".into(),
        Check::Failed(why) => format!("failed: {why}"),
        Check::Skipped(why) => format!("skipped: {why}"),
    }
}

/// JSON ids: an input's declared name, `c0, c1, …` for constants, `t0, t1, …` for ops.
fn ids(g: &Graph) -> Vec<String> {
    let (mut consts, mut ops) = (0, 0);
    g.nodes
        .iter()
        .map(|n| match n.op {
            Op::Input(k) => g.inputs[k as usize].decl.name.clone(),
            Op::Const(_) => {
                consts += 1;
                format!("c{}", consts - 1)
            }
            _ => {
                ops += 1;
                format!("t{}", ops - 1)
            }
        })
        .collect()
}

/// The ops of a graph in the JSON form, in topological order with the outputs last.
fn ops_json(g: &Graph) -> Vec<OpJson> {
    let names = ids(g);
    let live = g.live();
    let outputs: Vec<NodeId> = g.outputs.iter().map(|o| o.node).collect();
    // Topological order with every output after all other ops: outputs of a found graph are
    // never read by other ops, so moving them to the end keeps the order topological.
    let mut order: Vec<NodeId> = g.ids().filter(|id| live[id.index()] && !outputs.contains(id)).collect();
    order.extend(outputs.iter().copied());
    order
        .into_iter()
        .map(|id| {
            let n = g.node(id);
            OpJson {
                id: names[id.index()].clone(),
                op: n.op.name(),
                inputs: n.args.iter().map(|a| names[a.index()].clone()).collect(),
                shape: n
                    .shape
                    .iter()
                    .map(|d| match d {
                        Dim::One => DimJson::One(1),
                        Dim::Var(v) => DimJson::Symbol(g.dims.get(*v).name.clone()),
                    })
                    .collect(),
                axis: match n.op {
                    Op::Reduce(_, a) | Op::Split(a) => Some(a),
                    _ => None,
                },
                value: match n.op {
                    Op::Const(c) => Some(c),
                    _ => None,
                },
            }
        })
        .collect()
}

fn graph_json(f: &FoundGraph) -> GraphJson {
    let g = f.graph.graph();
    // One entry per split variable: the values over all candidates, in order.
    let mut split_counts: Vec<SplitCountsJson> = Vec::new();
    for cand in &f.concrete {
        for s in &cand.splits {
            let dim = cand.graph.dims.get(s.of).name.clone();
            match split_counts.iter_mut().find(|e| e.symbol == s.name) {
                Some(e) => {
                    if !e.values.contains(&s.value) {
                        e.values.push(s.value);
                    }
                }
                None => split_counts.push(SplitCountsJson {
                    symbol: s.name.clone(),
                    dim,
                    values: vec![s.value],
                    predicated: s.predicated,
                }),
            }
        }
    }
    GraphJson {
        has_split: f.has_split(),
        expr: g.outputs.iter().map(|o| format!("{} = {}", o.decl.name, g.expr(o.node))).collect(),
        ops: ops_json(g),
        split_counts,
        checks: ChecksJson {
            full_shape: check_text(&f.checks.full_shape),
            float: check_text(&f.checks.float),
            float_max_rel_err: f.checks.float_max_rel_err,
        },
        notes: f.notes.clone(),
    }
}

/// The JSON report (DESIGN §7.2), pretty-printed.
pub fn to_json(r: &SearchResult) -> String {
    let doc = SearchJson {
        kernel: &r.kernel,
        seconds: r.seconds,
        states_explored: r.states_explored,
        stop_reason: r.stop_reason.name(),
        max_ops: r.max_ops,
        egraph: EGraphJson {
            classes: r.egraph.classes,
            nodes: r.egraph.nodes,
            iterations: r.egraph.iterations,
            stop_reason: &r.egraph.stop_reason,
        },
        pruned: PrunedJson {
            abstract_expr: r.counters.pruned_abstract,
            shape: r.counters.pruned_shape,
            duplicate: r.counters.pruned_duplicate,
            open_bound: r.counters.pruned_open,
            pending_reduction: r.counters.pruned_pending,
            distance: r.counters.pruned_distance,
            fingerprinted: r.counters.fingerprinted,
            fingerprint_rejected: r.counters.fingerprint_rejected,
        },
        rejected_by_final_checks: r.rejected.len(),
        without_split: r.without_split.as_ref().map(|p| PlainPhaseJson {
            graphs_added: p.graphs_added,
            states_explored: p.states_explored,
            stop_reason: p.stop_reason.name(),
        }),
        split_refused_bound: r.split_refused,
        graphs: r.graphs.iter().map(graph_json).collect(),
    };
    serde_json::to_string_pretty(&doc).expect("the report serializes")
}

/// A readable summary: the search statistics and every found graph in infix form.
pub fn summary_text(r: &SearchResult) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "kernel {}: {} graph{} in {:.2} s, {} states explored, stopped: {} (size bound {} ops)",
        r.kernel,
        r.graphs.len(),
        if r.graphs.len() == 1 { "" } else { "s" },
        r.seconds,
        r.states_explored,
        r.stop_reason.name(),
        r.max_ops
    );
    let _ = writeln!(
        out,
        "e-graph: {} classes, {} nodes, {} iterations, {}; seconds: saturation {:.3}, enumeration {:.3}, checks {:.3}",
        r.egraph.classes,
        r.egraph.nodes,
        r.egraph.iterations,
        r.egraph.stop_reason,
        r.stage_seconds[0],
        r.stage_seconds[1],
        r.stage_seconds[2]
    );
    let c = &r.counters;
    let _ = writeln!(
        out,
        "pruned: abstract {} shape {} duplicate {} open {} pending {} distance {}; fingerprinted {} (rejected {})",
        c.pruned_abstract,
        c.pruned_shape,
        c.pruned_duplicate,
        c.pruned_open,
        c.pruned_pending,
        c.pruned_distance,
        c.fingerprinted,
        c.fingerprint_rejected
    );
    if let Some(line) = plain_phase_text(r) {
        let _ = writeln!(out, "{line}");
    }
    if !r.rejected.is_empty() {
        let _ = writeln!(out, "{} graph(s) passed the small fingerprints but failed a final check", r.rejected.len());
    }
    out.push_str(&explain_text(r));
    out
}

/// The line that reports the search without Split after a search with Split stopped at a
/// limit, or in place of one too large to run, if there was one.
pub fn plain_phase_text(r: &SearchResult) -> Option<String> {
    if let Some(bound) = r.split_refused {
        return Some(format!(
            "without split only: with it, graphs of up to {bound} ops would be searched, and the search builds at \
             most {}",
            super::MAX_SEARCH_OPS
        ));
    }
    let p = r.without_split.as_ref()?;
    Some(format!(
        "then without split: {} more graph{} in {:.2} s, {} states explored, stopped: {}",
        p.graphs_added,
        if p.graphs_added == 1 { "" } else { "s" },
        p.seconds,
        p.states_explored,
        p.stop_reason.name()
    ))
}

/// Every found graph in infix form, with its split counts: what `cleave explain` shows.
pub fn explain_text(r: &SearchResult) -> String {
    let mut out = String::new();
    for (i, f) in r.graphs.iter().enumerate() {
        let g = f.graph.graph();
        let _ = writeln!(out, "graph {} ({} ops{}):", i + 1, g.op_count(), if f.has_split() { ", split" } else { "" });
        for o in &g.outputs {
            let _ = writeln!(out, "  {} = {}", o.decl.name, g.expr(o.node));
        }
        let j = graph_json(f);
        for s in &j.split_counts {
            let values: Vec<String> = s.values.iter().map(u64::to_string).collect();
            let _ = writeln!(
                out,
                "  {} (splits {}) ∈ {{{}}}{}",
                s.symbol,
                s.dim,
                values.join(", "),
                if s.predicated { ", predicated" } else { "" }
            );
        }
        for n in &f.notes {
            let _ = writeln!(out, "  note: {n}");
        }
    }
    out
}
