//! A launch: the tile kernels of one graph, in order, and the workspaces between them.

use super::error::PlanError;
use super::lower::{KernelIo, Planned};
use super::partition::{Partition, Workspace};
use super::program::{Binding, TileKernel};
use crate::graph::{DimTable, ValidGraph};

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
    /// Per kernel: estimated registers per thread.
    pub registers: Vec<u64>,
}

impl Launch {
    /// The dim table every kernel's shapes refer to.
    pub fn dims(&self) -> &DimTable {
        &self.graph.dims
    }
}

/// How kernel `k` of a partition binds, given the planned kernels before it. A split kernel
/// whose partials are stored scaled gets an extra workspace for their running max, numbered
/// after the partition's workspaces in kernel order; a later kernel reading those partials
/// reads that max next to them. This is the only place the wiring is decided: the kernels are
/// planned with it and [`assemble`] lays out the workspaces it names.
pub fn kernel_io(part: &Partition, k: usize, earlier: &[&Planned]) -> KernelIo {
    let kg = &part.kernels[k];
    let mut io = KernelIo { inputs: kg.inputs.clone(), outputs: kg.outputs.clone(), ..Default::default() };
    let mut next_workspace = part.workspaces.len() as u32;
    for (j, planned) in earlier.iter().enumerate() {
        if planned.max_shape.is_none() {
            continue;
        }
        for &o in &planned.scaled_outputs {
            let stored = part.kernels[j].outputs[o];
            if let Some(i) = kg.inputs.iter().position(|x| *x == stored) {
                io.scaled_inputs.insert(i, Binding::Workspace(next_workspace));
            }
        }
        next_workspace += 1;
    }
    if k + 1 < part.kernels.len() {
        io.max_output = Some(Binding::Workspace(next_workspace));
    }
    io
}

/// Assembles the planned kernels of a partition (each planned with [`kernel_io`]) into a
/// launch, naming kernel `k` `{symbol_prefix}_{k}`.
pub fn assemble(
    graph: &ValidGraph,
    part: &Partition,
    planned: Vec<Planned>,
    symbol_prefix: &str,
) -> Result<Launch, PlanError> {
    let mut workspaces = part.workspaces.clone();
    let mut scaled: Vec<Binding> = Vec::new();
    let mut kernels = Vec::with_capacity(planned.len());
    let mut registers = Vec::with_capacity(planned.len());
    for (k, p) in planned.into_iter().enumerate() {
        if let Some(shape) = p.max_shape {
            workspaces.push(Workspace { name: format!("ws{}", workspaces.len()), shape, node: None });
            scaled.extend(p.scaled_outputs.iter().map(|&o| part.kernels[k].outputs[o]));
        }
        let mut kernel = p.kernel;
        kernel.symbol = format!("{symbol_prefix}_{k}");
        kernels.push(kernel);
        registers.push(p.registers);
    }
    // Every scaled partial must be read by a kernel that merges it.
    if scaled.iter().any(|s| !part.kernels.iter().any(|kg| kg.inputs.contains(s))) {
        return Err(PlanError::UnmergedScaledPartial);
    }
    Ok(Launch { graph: graph.clone(), kernels, workspaces, registers })
}
