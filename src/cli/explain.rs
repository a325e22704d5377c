//! `cleave explain`: a human-readable account of every stage for one kernel.

use std::fmt::Write;

use std::path::Path;

use cleave_core::picture::{graph_svg, schedule_svg};
use cleave_core::pipeline::{compile, Compiled};
use cleave_core::superopt::{explain_text, plain_phase_text};
use cleave_core::symbolic::{eventually_reduced, symbolize};

use super::schedule::{programs, table};
use super::{kernel, load, with_progress, Opts, UserError};

pub(crate) fn run(o: &Opts) -> Result<(), UserError> {
    let module = load(&o.file)?;
    let (_, graph) = kernel(&module, o.required("kernel")?)?;
    let mut out = String::new();
    let _ = writeln!(out, "kernel {}", graph.name);
    let _ = writeln!(out, "\n== declared graph ==");
    for (_, d) in graph.dims.iter() {
        let _ = writeln!(out, "dim {} = {}{}", d.name, d.value, if d.dynamic { " (dynamic)" } else { "" });
    }
    for i in &graph.inputs {
        let _ = writeln!(out, "input {}: {}{}", i.decl.name, i.decl.dtype, graph.dims.show(&i.decl.shape));
    }
    for oo in &graph.outputs {
        let _ = writeln!(out, "output {}: {}{}", oo.decl.name, oo.decl.dtype, graph.dims.show(&oo.decl.shape));
    }
    out.push_str(&graph.listing());
    for oo in &graph.outputs {
        let _ = writeln!(out, "{} = {}", oo.decl.name, graph.expr(oo.node));
    }

    let sym = symbolize(graph);
    let _ = writeln!(out, "\n== symbolic graph ==");
    for (gi, members) in sym.groups.members.iter().enumerate() {
        let info = sym.graph.dims.get(cleave_core::graph::DimVar(gi as u32));
        let places: Vec<String> = members
            .iter()
            .map(|&(n, a)| format!("{}.{a}", graph.label(cleave_core::graph::NodeId(n as u32))))
            .collect();
        let _ = writeln!(
            out,
            "symbol {} (from {}{}): {}",
            info.name,
            graph.dims.get(sym.origin[gi]).name,
            if sym.reduced[gi] { ", eventually reduced" } else { "" },
            places.join(" ")
        );
    }
    out.push_str(&sym.graph.listing());

    let red = eventually_reduced(graph);
    let _ = writeln!(out, "\n== eventually-reduced dims ==");
    for (i, input) in graph.inputs.iter().enumerate() {
        let dims: Vec<String> = input
            .decl
            .shape
            .iter()
            .zip(&red.per_input[i])
            .filter(|(_, r)| **r)
            .map(|(d, _)| graph.dims.show(&[*d]).trim_matches(['[', ']']).to_string())
            .collect();
        let how = if red.overridden[i] { " (declared)" } else { "" };
        let _ = writeln!(
            out,
            "{}: {}{how}",
            input.decl.name,
            if dims.is_empty() { "none".to_string() } else { dims.join(", ") }
        );
    }

    let opts = super::compile::options(o)?;
    match with_progress(format!("compiling `{}`: search and schedule", graph.name), || compile(graph, &opts)) {
        Ok(c) => {
            match &c.search {
                Ok(search) => {
                    let _ = writeln!(
                        out,
                        "\n== found graphs ({} in {:.2} s, {} states, stopped: {}) ==",
                        search.graphs.len(),
                        search.seconds,
                        search.states_explored,
                        search.stop_reason.name()
                    );
                    if let Some(line) = plain_phase_text(search) {
                        let _ = writeln!(out, "{line}");
                    }
                    out.push_str(&explain_text(search));
                }
                Err(e) => {
                    let _ = writeln!(out, "\n== found graphs ==\nno search ({e}); the declared graph is scheduled");
                }
            }
            let _ = writeln!(out, "\n== schedules: cost table ({} configurations tried) ==", c.stats.tried);
            out.push_str(&table(&c));
            if !c.stats.rejected.is_empty() {
                let why: Vec<String> = c.stats.rejected.iter().map(|(k, n)| format!("{k}: {n}")).collect();
                let _ = writeln!(out, "rejected: {}", why.join("; "));
            }
            let _ = writeln!(out, "\n== chosen program ==");
            out.push_str(&programs(&c.ranked[0]));
            if let Some(dir) = o.value("svg") {
                pictures(&c, Path::new(dir))?;
            }
        }
        Err(e) => {
            let _ = writeln!(out, "\n== pipeline ==\n{e}");
        }
    }
    print!("{out}");
    Ok(())
}

/// Writes the three pictures of `cleave explain --svg DIR` and names each on stderr.
fn pictures(c: &Compiled, dir: &Path) -> Result<(), UserError> {
    let name = &c.declared.name;
    let best = &c.ranked[0];
    let chosen = best.candidate.launch.graph.graph();
    let splits: Vec<String> = best.splits.iter().map(|s| s.label(best.candidate.launch.dims())).collect();
    let chosen_title = match (best.graph_index, splits.is_empty()) {
        (None, _) => format!("{name}: the declared graph is scheduled as written"),
        (Some(i), true) => format!("{name}: found graph {} (chosen)", i + 1),
        (Some(i), false) => format!("{name}: found graph {} (chosen), {}", i + 1, splits.join(", ")),
    };
    let files = [
        ("declared", graph_svg(c.declared.graph(), &format!("{name}: the declared graph"), None)),
        ("chosen", graph_svg(chosen, &chosen_title, Some(c.declared.graph()))),
        ("schedule", schedule_svg(&best.candidate.launch, &format!("{name}: the chosen schedule"))),
    ];
    std::fs::create_dir_all(dir).map_err(|e| UserError(format!("{}: cannot create: {e}", dir.display())))?;
    for (what, svg) in files {
        let path = dir.join(format!("{name}.{what}.svg"));
        std::fs::write(&path, svg).map_err(|e| UserError(format!("{}: cannot write: {e}", path.display())))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
