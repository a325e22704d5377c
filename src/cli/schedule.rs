//! `cleave schedule`: the scheduling phase's candidates, best first.

use std::fmt::Write;

use cleave_core::graph::{Dim, DimTable};
use cleave_core::pipeline::{Compiled, KernelSchedule, Ranked};
use cleave_core::plan::{Kernel, SExpr, Stmt};
use cleave_core::schedule::tmap::reduced_dim;
use serde_json::{json, Value};

use super::compile::{compile_kernel, declared_plan_at};
use super::{Opts, UserError};

pub(crate) fn run(o: &Opts) -> Result<(), UserError> {
    let c = compile_kernel(o)?;
    let declared = declared_plan_at(o)?;
    if o.switch("json") {
        let mut doc = to_json(&c);
        if let (Some((seconds, extents)), Some(m)) = (&declared, doc.as_object_mut()) {
            m.insert("declared_plan".into(), json!({ "extents": extents, "estimated_seconds": seconds }));
        }
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print!("{}", table(&c));
        if let Some((seconds, extents)) = &declared {
            let own = c.ranked[0].candidate.seconds;
            println!(
                "\nthe plan made for {extents}, run at these extents: {:.2} us, {:.2} times this plan's",
                seconds * 1e6,
                seconds / own
            );
        }
        // `--rank N` shows another kept candidate's program, to compare it with the chosen one.
        let rank: usize = match o.value("rank") {
            Some(r) => r.parse().ok().filter(|r| *r < c.ranked.len()).ok_or_else(|| {
                UserError(format!("--rank expects a rank of the table (0..{}), got `{r}`", c.ranked.len()))
            })?,
            None => 0,
        };
        if rank == 0 {
            println!("\nchosen program:");
        } else {
            println!("\nprogram of rank {rank}:");
        }
        print!("{}", programs(&c.ranked[rank]));
    }
    Ok(())
}

/// The tile programs of one candidate, kernel by kernel.
pub(crate) fn programs(r: &Ranked) -> String {
    let l = &r.candidate.launch;
    let mut out = String::new();
    for k in &l.kernels {
        let _ = writeln!(out, "# {}", k.symbol());
        out.push_str(&k.show(l.dims()));
    }
    out
}

/// The cost table of every kept candidate.
pub(crate) fn table(c: &Compiled) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>4}  {:>10}  {:<10} {:>7}  {:>9}  {:>5}  {:>11}  graph",
        "rank", "est. us", "split", "kernels", "smem KiB", "regs", "GMEM MiB"
    );
    for (i, r) in c.ranked.iter().enumerate() {
        let l = &r.candidate.launch;
        let smem: Vec<String> = l.kernels.iter().map(|k| format!("{:.0}", k.smem_bytes() as f64 / 1024.0)).collect();
        let regs: Vec<String> = l.registers.iter().map(|x| x.to_string()).collect();
        let gmem: f64 = r.candidate.costs.iter().map(|c| c.gmem_bytes as f64).sum::<f64>() / (1 << 20) as f64;
        let split = if r.splits.is_empty() {
            "-".to_string()
        } else {
            r.splits.iter().map(|s| s.label(l.dims())).collect::<Vec<_>>().join(",")
        };
        let g = &l.graph;
        let graph =
            g.outputs.iter().map(|o| format!("{} = {}", o.decl.name, g.expr(o.node))).collect::<Vec<_>>().join("; ");
        let _ = writeln!(
            out,
            "{i:>4}  {:>10.2}  {split:<10} {:>7}  {:>9}  {:>5}  {gmem:>11.1}  {graph}",
            r.candidate.seconds * 1e6,
            l.kernels.len(),
            smem.join("+"),
            regs.join("+"),
        );
    }
    out
}

fn extent(dims: &DimTable, d: cleave_core::graph::DimVar, tile: u64) -> Value {
    let info = dims.get(d);
    if info.dynamic {
        Value::String(format!("ceil({}/{tile})", info.name))
    } else {
        json!(info.value.div_ceil(tile))
    }
}

fn tile_config(r: &Ranked, k: usize) -> Value {
    let KernelSchedule::Tiled(t) = &r.candidate.schedules[k] else {
        return Value::Null;
    };
    let (cfg, g) = (&t.config, &t.graph);
    let out: serde_json::Map<String, Value> =
        cfg.out.iter().map(|(v, t)| (g.dims.get(*v).name.clone(), json!(t))).collect();
    // The kernel graph numbers nodes in its own arena; describe reductions by their op and
    // reduced dim, which is what a reader needs.
    let red: Vec<Value> = cfg
        .red
        .iter()
        .map(|(n, t)| {
            let op = g.node(*n).op.name();
            let dim = match reduced_dim(g, *n) {
                Some(Dim::Var(v)) => g.dims.get(v).name.clone(),
                _ => "1".into(),
            };
            json!({ "op": op, "dim": dim, "tile": t })
        })
        .collect();
    json!({ "output": out, "reduction": red, "warps": cfg.warps, "stages": cfg.stages })
}

/// The `cleave schedule --json` document.
pub(crate) fn to_json(c: &Compiled) -> Value {
    let search_seconds = c.search.as_ref().map_or(0.0, |s| s.seconds);
    let candidates: Vec<Value> = c
        .ranked
        .iter()
        .map(|r| {
            let l = &r.candidate.launch;
            let g = &l.graph;
            let kernels: Vec<Value> = l
                .kernels
                .iter()
                .enumerate()
                .map(|(i, k)| {
                    let grid: Vec<Value> = k.grid().iter().map(|a| extent(l.dims(), a.dim, a.tile)).collect();
                    let loops = match k {
                        Kernel::Tile(t) => count_loops(&t.body),
                        Kernel::Stage(s) => usize::from(matches!(s.value, SExpr::Reduce { .. })),
                    };
                    json!({
                        "symbol": k.symbol(),
                        "grid": grid,
                        "threads": k.threads(),
                        "fallback": matches!(k, Kernel::Stage(_)),
                        "tile_config": tile_config(r, i),
                        "smem_bytes": k.smem_bytes(),
                        "gmem_bytes": r.candidate.costs[i].gmem_bytes,
                        "registers": l.registers[i],
                        "loops": loops,
                        "estimated_seconds": r.candidate.costs[i].seconds,
                        "bound": r.candidate.costs[i].bound.name(),
                        "blocks": r.candidate.costs[i].blocks,
                        "program": k.show(l.dims()),
                    })
                })
                .collect();
            json!({
                "graph": g.outputs.iter().map(|o| format!("{} = {}", o.decl.name, g.expr(o.node))).collect::<Vec<_>>().join("; "),
                "has_split": g.has_split(),
                "split_counts": r.splits.iter().map(|s| json!({ "name": s.name, "value": s.value })).collect::<Vec<_>>(),
                "estimated_seconds": r.candidate.seconds,
                "kernels": kernels,
            })
        })
        .collect();
    json!({
        "kernel": c.declared.name,
        "seconds": search_seconds + c.schedule_seconds,
        "search_seconds": search_seconds,
        "schedule_seconds": c.schedule_seconds,
        "configs_tried": c.stats.tried,
        "candidates": candidates,
    })
}

fn count_loops(body: &[Stmt]) -> usize {
    body.iter()
        .map(|s| match s {
            Stmt::Loop { body, .. } => 1 + count_loops(body),
            _ => 0,
        })
        .sum()
}
