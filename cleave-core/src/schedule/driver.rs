//! The scheduling driver (paper Alg. 1): every tile configuration of every kernel of a graph is
//! scheduled, planned and costed; the best few launches are kept.

use rayon::prelude::*;

use super::arch::Arch;
use super::build::schedule;
use super::config::{enumerate, TileConfig};
use super::cost::{kernel_cost, Cost};
use super::itgraph::ItGraph;
use super::tmap::Reject;
use crate::graph::ValidGraph;
use crate::plan::{build_launch, lower, partition, KernelIo, Launch, Partition};

/// One scheduled launch with its estimated cost.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// The launch.
    pub launch: Launch,
    /// Cost of each kernel.
    pub costs: Vec<Cost>,
    /// Sum of the kernels' estimated seconds.
    pub seconds: f64,
}

/// Counts of what happened to the configurations, for explain.
#[derive(Clone, Debug, Default)]
pub struct ScheduleStats {
    /// Configurations tried.
    pub tried: usize,
    /// Rejected, with the first reason seen for each kind.
    pub rejected: Vec<(String, usize)>,
}

impl ScheduleStats {
    fn reject(&mut self, r: &Reject) {
        let key = match r {
            Reject::Conflict(_) => "conflicting tile maps".to_string(),
            Reject::SharedUpstream(_) => "a producer needed inside and outside a loop".to_string(),
            Reject::GroupMismatch(..) => "fused reductions with different axes or tiles".to_string(),
            Reject::Unsupported(m) => {
                if m.starts_with("needs about") {
                    "over the register budget".to_string()
                } else {
                    m.clone()
                }
            }
        };
        match self.rejected.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => self.rejected.push((key, 1)),
        }
    }
}

/// Schedules one kernel graph under every configuration; returns the valid ones best first.
fn kernel_candidates(
    kg: &ValidGraph,
    io: &KernelIo,
    arch: &Arch,
    stats: &mut ScheduleStats,
) -> Vec<(TileConfig, ItGraph, Cost)> {
    let configs = enumerate(kg);
    stats.tried += configs.len();
    let results: Vec<Result<(TileConfig, ItGraph, Cost), Reject>> = configs
        .into_par_iter()
        .map(|c| {
            let it = schedule(kg, &c)?;
            let planned = lower(kg, &it, &c, io, "probe")?;
            if planned.kernel.smem_bytes > arch.smem_per_block {
                return Err(Reject::Unsupported("over the shared-memory limit".into()));
            }
            let cost = kernel_cost(&planned.kernel, &kg.dims, planned.registers, arch);
            Ok((c, it, cost))
        })
        .collect();
    let mut ok = Vec::new();
    for r in results {
        match r {
            Ok(x) => ok.push(x),
            Err(e) => stats.reject(&e),
        }
    }
    // Ties break on the configuration so the order never depends on thread timing.
    ok.sort_by(|a, b| a.2.seconds.total_cmp(&b.2.seconds).then_with(|| a.0.cmp(&b.0)));
    ok
}

/// The best `top_k` launches of a graph.
pub fn candidates(
    graph: &ValidGraph,
    arch: &Arch,
    top_k: usize,
    symbol: &str,
) -> Result<(Vec<Candidate>, ScheduleStats), String> {
    let part: Partition = partition(graph)?;
    let mut stats = ScheduleStats::default();
    let first_io = KernelIo {
        inputs: part.kernels[0].inputs.clone(),
        outputs: part.kernels[0].outputs.clone(),
        max_output: (part.kernels.len() > 1).then_some(crate::plan::Binding::Workspace(part.workspaces.len() as u32)),
        ..Default::default()
    };
    let firsts = kernel_candidates(&part.kernels[0].graph, &first_io, arch, &mut stats);
    let mut out = Vec::new();
    for (cfg, it, cost) in firsts.into_iter().take(top_k) {
        let mut chosen = vec![(cfg, it)];
        let mut costs = vec![cost];
        // Later kernels depend on what the first stores (scaled partials); plan them against it.
        let mut ok = true;
        for k in 1..part.kernels.len() {
            let io = io_for(&part, k, &chosen, symbol);
            let next = kernel_candidates(&part.kernels[k].graph, &io, arch, &mut stats);
            match next.into_iter().next() {
                Some((c, i, cost)) => {
                    chosen.push((c, i));
                    costs.push(cost);
                }
                None => {
                    ok = false;
                    break;
                }
            }
        }
        if !ok {
            continue;
        }
        match build_launch(graph, &part, &chosen, symbol) {
            Ok(launch) => {
                let seconds = costs.iter().map(|c| c.seconds).sum();
                out.push(Candidate { launch, costs, seconds });
            }
            Err(e) => stats.reject(&e),
        }
    }
    out.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    Ok((out, stats))
}

/// The io of kernel `k`, knowing the schedules of the kernels before it.
fn io_for(part: &Partition, k: usize, chosen: &[(TileConfig, ItGraph)], symbol: &str) -> KernelIo {
    let kg = &part.kernels[k];
    let mut io = KernelIo { inputs: kg.inputs.clone(), outputs: kg.outputs.clone(), ..Default::default() };
    // Re-plan the earlier kernels to learn which of their outputs are scaled partials.
    let mut ws = part.workspaces.len() as u32;
    for (j, kj) in part.kernels[..k].iter().enumerate() {
        let mut ioj = KernelIo { inputs: kj.inputs.clone(), outputs: kj.outputs.clone(), ..Default::default() };
        ioj.max_output = Some(crate::plan::Binding::Workspace(ws));
        if let Ok(p) = lower(&kj.graph, &chosen[j].1, &chosen[j].0, &ioj, symbol) {
            if p.max_shape.is_some() {
                for o in p.scaled_outputs {
                    let b = kj.outputs[o];
                    if let Some(i) = kg.inputs.iter().position(|x| *x == b) {
                        io.scaled_inputs.insert(i, crate::plan::Binding::Workspace(ws));
                    }
                }
                ws += 1;
            }
        }
    }
    if k + 1 < part.kernels.len() {
        io.max_output = Some(crate::plan::Binding::Workspace(ws));
    }
    io
}
