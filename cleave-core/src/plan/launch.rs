//! A launch: the kernels of one graph, in order, and the workspaces between them.

use super::cost::stage_cost;
use super::error::PlanError;
use super::lower::{KernelIo, Planned};
use super::partition::{KernelGraph, Part, Partition, Workspace, WorkspaceType};
use super::program::{stride_params, Binding, GridAxis, Param, StrideParam, TileKernel};
use super::stage::{stages, StageKernel, LANES};
use crate::arch::Arch;
use crate::graph::{DimTable, DimVar, Op, UnaryOp, ValidGraph};

/// One kernel of a launch: a scheduled tile program, or a stage of the fallback.
#[derive(Clone, PartialEq, Debug)]
pub enum Kernel {
    /// A tile program from a schedule.
    Tile(TileKernel),
    /// A fallback stage.
    Stage(StageKernel),
}

impl Kernel {
    /// The entry point's name.
    pub fn symbol(&self) -> &str {
        match self {
            Kernel::Tile(k) => &k.symbol,
            Kernel::Stage(k) => &k.symbol,
        }
    }

    fn set_symbol(&mut self, symbol: String) {
        match self {
            Kernel::Tile(k) => k.symbol = symbol,
            Kernel::Stage(k) => k.symbol = symbol,
        }
    }

    /// Global tensors, in parameter order.
    pub fn params(&self) -> &[Param] {
        match self {
            Kernel::Tile(k) => &k.params,
            Kernel::Stage(k) => &k.params,
        }
    }

    /// Runtime extents, in parameter order after the tensors.
    pub fn extents(&self) -> &[DimVar] {
        match self {
            Kernel::Tile(k) => &k.extents,
            Kernel::Stage(k) => &k.extents,
        }
    }

    /// Runtime strides of the input and output views, in parameter order after the extents.
    pub fn strides(&self) -> Vec<StrideParam> {
        stride_params(self.params())
    }

    /// The grid axes, flattened into `blockIdx.x` with the last fastest.
    pub fn grid(&self) -> &[GridAxis] {
        match self {
            Kernel::Tile(k) => &k.grid,
            Kernel::Stage(k) => &k.grid,
        }
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        match self {
            Kernel::Tile(k) => k.warps.threads(),
            Kernel::Stage(k) => k.threads(),
        }
    }

    /// Dynamic shared memory per block, bytes.
    pub fn smem_bytes(&self) -> u64 {
        match self {
            Kernel::Tile(k) => k.smem_bytes,
            Kernel::Stage(k) => k.smem_bytes(),
        }
    }

    /// The kernel as readable pseudocode (the paper's Listing 1 for a tile program).
    pub fn show(&self, dims: &DimTable) -> String {
        match self {
            Kernel::Tile(k) => super::program::ShowKernel { kernel: k, dims }.to_string(),
            Kernel::Stage(k) => format!("{}\n", k.show(dims)),
        }
    }

    /// The tile program, when this is one.
    pub fn tile(&self) -> Option<&TileKernel> {
        match self {
            Kernel::Tile(k) => Some(k),
            Kernel::Stage(_) => None,
        }
    }
}

/// Everything a backend needs to run one declared kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// The graph this launch computes (after algebraic rewriting; concrete dims, split counts
    /// fixed).
    pub graph: ValidGraph,
    /// The kernels, run in order.
    pub kernels: Vec<Kernel>,
    /// Workspaces (f32) shared between kernels.
    pub workspaces: Vec<Workspace>,
    /// Per kernel: estimated registers per thread.
    pub registers: Vec<u64>,
    /// The SMs of the GPU the launch is planned for: a split count derived from the extents
    /// ([`split_count`](crate::plan::requests::split_count)) lands the grid evenly on them in
    /// the ranking and the host emulation; a launch on a device uses the device's count.
    pub sms: u32,
    /// The same GPU's [`SplitShape::fill`](crate::plan::requests::SplitShape::fill).
    pub fill: u32,
    /// Per kernel: its blocks one SM of that GPU holds at once.
    pub resident: Vec<u32>,
}

impl Launch {
    /// Names kernel `k` `{symbol_prefix}_{k}`, as [`assemble`] and [`fallback`] do: how the
    /// plans of one kernel for different GPUs keep their entry points apart in one binary.
    pub fn rename(&mut self, symbol_prefix: &str) {
        for (k, kernel) in self.kernels.iter_mut().enumerate() {
            kernel.set_symbol(format!("{symbol_prefix}_{k}"));
        }
    }

    /// The dim table every kernel's shapes refer to.
    pub fn dims(&self) -> &DimTable {
        &self.graph.dims
    }

    /// Whether `other` is the same plan: equal in everything but the GPU it was made for.
    /// That GPU's figures (SMs, fill, residency) only set the split counts of the host
    /// emulation and the launcher's rule, so two GPUs whose best kernels agree share them
    /// (with the figures of the first).
    pub fn same_plan(&self, other: &Launch) -> bool {
        self.graph == other.graph
            && self.kernels == other.kernels
            && self.workspaces == other.workspaces
            && self.registers == other.registers
    }
}

/// How kernel `k` of a partition binds, given the planned kernels before it. A split kernel
/// whose partials are stored scaled gets an extra workspace for their running max, numbered
/// after the partition's workspaces in kernel order; a later kernel reading those partials
/// reads that max next to them, and an exp whose running max that was, where the later kernel
/// computes it again, is shifted by it. This is the only place the wiring is decided: the kernels are
/// planned with it and [`assemble`] lays out the workspaces it names.
pub fn kernel_io(part: &Partition, k: usize, earlier: &[&Planned]) -> KernelIo {
    let kg = &part.kernels[k];
    let mut io = KernelIo {
        inputs: kg.inputs.clone(),
        outputs: kg.outputs.clone(),
        input_sources: kg.input_sources.clone(),
        bounded_exps: kg
            .graph
            .ids()
            .filter(|id| kg.graph.node(*id).op == Op::Unary(UnaryOp::Exp))
            .filter(|id| part.bounded_exps[kg.origin[id.index()].index()])
            .collect(),
        cut_outputs: (0..kg.outputs.len()).filter(|&o| is_cut(part, kg.outputs[o])).collect(),
        ..Default::default()
    };
    let mut next_workspace = part.workspaces.len() as u32;
    for (j, planned) in earlier.iter().enumerate() {
        if planned.max_shape.is_none() {
            continue;
        }
        let max = Binding::Workspace(next_workspace);
        if planned.max_per_element {
            io.element_maxima.insert(max);
        }
        for &o in &planned.scaled_outputs {
            let stored = part.kernels[j].outputs[o];
            if let Some(i) = kg.inputs.iter().position(|x| *x == stored) {
                io.scaled_inputs.insert(i, max);
            }
        }
        // The exp whose running max was stored, where this kernel computes its elements again
        // (the same node, or the same exp of the unsplit row) and reads a value scaled by
        // that max: a kernel of a grouped launch may compute the same exp for an output of
        // its own, on a max of its own.
        let earlier_graph = &part.kernels[j];
        let reads_max = io.scaled_inputs.values().any(|&b| b == max);
        // A max per element shifts no exp of a later kernel: those are shifted per row.
        let shifts = reads_max && !planned.max_per_element;
        if let Some(src) =
            planned.max_source.filter(|s| shifts && earlier_graph.graph.node(*s).op == Op::Unary(UnaryOp::Exp))
        {
            let class = part.same_elements[earlier_graph.origin[src.index()].index()];
            for id in kg.graph.ids().filter(|id| part.same_elements[kg.origin[id.index()].index()] == class) {
                io.shifted_exps.insert(id, max);
            }
        }
        next_workspace += 1;
    }
    if k + 1 < part.kernels.len() {
        io.max_output = Some(Binding::Workspace(next_workspace));
    }
    io
}

/// Whether `b` is a workspace of a [`grouped`](super::partition::grouped) partition: a value
/// one kernel stores for a later one to read.
fn is_cut(part: &Partition, b: Binding) -> bool {
    let Binding::Workspace(w) = b else { return false };
    let node = part.workspaces.get(w as usize).and_then(|ws| ws.node);
    node.is_some_and(|n| matches!(part.part[n.index()], Part::Group(_)))
}

/// Assembles the planned kernels of a partition (each planned with [`kernel_io`]) into a
/// launch for GPU `arch`, naming kernel `k` `{symbol_prefix}_{k}`.
pub fn assemble(
    graph: &ValidGraph,
    part: &Partition,
    planned: Vec<Planned>,
    symbol_prefix: &str,
    arch: &Arch,
) -> Result<Launch, PlanError> {
    let mut workspaces = part.workspaces.clone();
    let mut scaled: Vec<Binding> = Vec::new();
    let mut kernels = Vec::with_capacity(planned.len());
    let mut registers = Vec::with_capacity(planned.len());
    for (k, p) in planned.into_iter().enumerate() {
        if let Some(shape) = p.max_shape {
            let name = format!("ws{}", workspaces.len());
            workspaces.push(Workspace { name, shape, node: None, ty: WorkspaceType::F32, storage: None });
            scaled.extend(p.scaled_outputs.iter().map(|&o| part.kernels[k].outputs[o]));
        }
        let mut kernel = p.kernel;
        kernel.symbol = format!("{symbol_prefix}_{k}");
        kernels.push(Kernel::Tile(kernel));
        registers.push(p.registers);
    }
    // Every scaled partial must be read by a kernel that merges it.
    if scaled.iter().any(|s| !part.kernels.iter().any(|kg| kg.inputs.contains(s))) {
        return Err(PlanError::UnmergedScaledPartial);
    }
    Ok(on_gpu(graph, kernels, workspaces, registers, arch))
}

/// Registers per thread a stage kernel is estimated to need: a few extended-exponent values
/// and the index arithmetic.
const STAGE_REGISTERS: u64 = 48;

/// The fallback launch of `graph` for `arch`: its stages, kernel `k` named
/// `{symbol_prefix}_{k}`, each reduction shared by as many lanes ([`LANES`]) as the cost model
/// finds fastest on `arch` (one thread an element on a tie).
pub fn fallback(graph: &ValidGraph, symbol_prefix: &str, arch: &Arch) -> Result<Launch, PlanError> {
    let (stages, workspaces) = stages(graph)?;
    let kernels: Vec<Kernel> = stages
        .into_iter()
        .enumerate()
        .map(|(k, s)| {
            let s = if s.may_cooperate() {
                let seconds = |s: &StageKernel| stage_cost(s, &graph.dims, arch).seconds;
                let mut best = (seconds(&s), s.clone());
                for &lanes in &LANES[1..] {
                    let c = s.clone().cooperate(lanes, &graph.dims);
                    let t = seconds(&c);
                    if t < best.0 {
                        best = (t, c);
                    }
                }
                best.1
            } else {
                s
            };
            let mut kernel = Kernel::Stage(s);
            kernel.set_symbol(format!("{symbol_prefix}_{k}"));
            kernel
        })
        .collect();
    let registers = vec![STAGE_REGISTERS; kernels.len()];
    Ok(on_gpu(graph, kernels, workspaces, registers, arch))
}

/// Appends to `launch` the fallback stages of `kg`, a kernel of a partition of the launch's
/// graph that no tile program computes and that binds only the launch's inputs and outputs
/// (a [`grouped`](super::partition::grouped) kernel): its stages read and write them as `kg`
/// binds them, its workspaces are numbered after the launch's own, and its kernels are named
/// on from the launch's last, `{symbol_prefix}_{k}`.
pub fn append_fallback(
    launch: &mut Launch,
    kg: &KernelGraph,
    symbol_prefix: &str,
    arch: &Arch,
) -> Result<(), PlanError> {
    // A per-request dim names its tables by the launch graph's input numbers, which the
    // stages of a part of that graph would read as its own.
    if kg.graph.dims.has_per_request() {
        return Err(PlanError::PerRequest("fallback stages of a part of the graph"));
    }
    // A stage reads and writes every workspace as extended-exponent values; a tile kernel's
    // workspace holds plain floats, so the stages may bind only the launch's own tensors.
    if kg.inputs.iter().chain(&kg.outputs).any(|b| matches!(b, Binding::Workspace(_))) {
        return Err(PlanError::StagesOnTileWorkspaces);
    }
    let sub = fallback(&kg.graph, symbol_prefix, arch)?;
    let base = launch.workspaces.len() as u32;
    let rebind = |b: Binding| match b {
        Binding::Input(i) => kg.inputs[i as usize],
        Binding::Output(o) => kg.outputs[o as usize],
        Binding::Workspace(w) => Binding::Workspace(base + w),
    };
    for (w, ws) in sub.workspaces.into_iter().enumerate() {
        let name = format!("ws{}", base + w as u32);
        launch.workspaces.push(Workspace { name, node: ws.node.map(|n| kg.origin[n.index()]), ..ws });
    }
    let first = launch.kernels.len();
    for (j, mut kernel) in sub.kernels.into_iter().enumerate() {
        if let Kernel::Stage(s) = &mut kernel {
            for p in &mut s.params {
                p.binding = rebind(p.binding);
                if let Binding::Workspace(w) = p.binding {
                    p.name = format!("ws{w}");
                }
            }
        }
        kernel.set_symbol(format!("{symbol_prefix}_{}", first + j));
        launch.kernels.push(kernel);
    }
    launch.registers.extend(sub.registers);
    launch.resident.extend(sub.resident);
    Ok(())
}

/// A launch of these kernels planned for `arch`, with the figures its split counts are
/// chosen by.
fn on_gpu(
    graph: &ValidGraph,
    kernels: Vec<Kernel>,
    workspaces: Vec<Workspace>,
    registers: Vec<u64>,
    arch: &Arch,
) -> Launch {
    let resident = kernels
        .iter()
        .zip(&registers)
        .map(|(k, r)| match k {
            Kernel::Tile(t) => u32::try_from(crate::plan::cost::resident_blocks(t, *r, arch)).unwrap_or(1),
            // A stage kernel is never split.
            Kernel::Stage(_) => 1,
        })
        .collect();
    let fill = crate::plan::requests::split_fill(arch);
    Launch { graph: graph.clone(), kernels, workspaces, registers, sms: arch.sms, fill, resident }
}
