//! A launch: the tile kernels of one graph, in order, and the workspaces between them.

use super::lower::{lower, KernelIo, Planned};
use super::partition::{Partition, Workspace};
use super::program::{Binding, TileKernel};
use crate::graph::{DimTable, ValidGraph};
use crate::schedule::config::TileConfig;
use crate::schedule::itgraph::ItGraph;
use crate::schedule::tmap::Reject;

/// Everything a backend needs to run one declared kernel.
#[derive(Clone, Debug)]
pub struct Launch {
    /// The graph this launch computes (after algebraic rewriting; concrete dims, split counts
    /// fixed).
    pub graph: ValidGraph,
    /// The kernels, run in order.
    pub kernels: Vec<TileKernel>,
    /// Workspaces (f32) shared between kernels.
    pub workspaces: Vec<Workspace>,
    /// Per kernel: its schedule and configuration (for explain and JSON).
    pub schedules: Vec<(TileConfig, ItGraph)>,
    /// Per kernel: estimated registers per thread.
    pub registers: Vec<u64>,
}

impl Launch {
    /// The dim table every kernel's shapes refer to.
    pub fn dims(&self) -> &DimTable {
        &self.graph.dims
    }
}

/// Lowers the kernels of a partition under the chosen schedules. A split kernel whose
/// partials are stored scaled gets an extra workspace for their running max, which the combine
/// kernel reads.
pub fn build_launch(
    graph: &ValidGraph,
    part: &Partition,
    chosen: &[(TileConfig, ItGraph)],
    symbol_prefix: &str,
) -> Result<Launch, Reject> {
    let mut workspaces = part.workspaces.clone();
    let mut kernels = Vec::new();
    let mut registers = Vec::new();
    let mut scaled: Vec<(Binding, Binding)> = Vec::new();
    for (k, (kg, (cfg, it))) in part.kernels.iter().zip(chosen).enumerate() {
        let mut io = KernelIo { inputs: kg.inputs.clone(), outputs: kg.outputs.clone(), ..Default::default() };
        for (i, b) in kg.inputs.iter().enumerate() {
            if let Some((_, m)) = scaled.iter().find(|(p, _)| p == b) {
                io.scaled_inputs.insert(i, *m);
            }
        }
        let max_ws = Binding::Workspace(workspaces.len() as u32);
        if k + 1 < part.kernels.len() {
            io.max_output = Some(max_ws);
        }
        let symbol = format!("{symbol_prefix}_{k}");
        let Planned { kernel, scaled_outputs, max_shape, registers: regs } = lower(&kg.graph, it, cfg, &io, &symbol)?;
        if let Some(shape) = max_shape {
            workspaces.push(Workspace { name: format!("ws{}", workspaces.len()), shape });
            for o in scaled_outputs {
                scaled.push((kg.outputs[o], max_ws));
            }
        }
        kernels.push(kernel);
        registers.push(regs);
    }
    // Every scaled partial must be read by a kernel that merges it.
    for (p, _) in &scaled {
        let merged = part.kernels.iter().any(|kg| kg.inputs.contains(p));
        if !merged {
            return Err(Reject::Unsupported("a scaled partial nobody merges".into()));
        }
    }
    Ok(Launch { graph: graph.clone(), kernels, workspaces, schedules: chosen.to_vec(), registers })
}
