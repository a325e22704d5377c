//! Memory and layout planning: an itGraph to a [`TileKernel`] (paper §6.1).
//!
//! Graph inputs are staged in shared memory; computed values live in registers in the block's
//! row layout. Loads whose tile does not move with a loop are hoisted out of it. Elementwise
//! chains stay unmaterialized expressions until a reduction, a product, a store or a second
//! user needs them.
//!
//! Stabilization (beyond the paper; RedFuser's incremental form) is derived from the graph:
//! when an `exp` feeds reductions through ops that are linear in it, the block keeps a running
//! maximum of the exponent per row, computes `exp(x - m)` instead, and rescales every
//! accumulator of that exponent whenever `m` grows. Values carry the power of `exp(m)` they
//! are scaled by; a ratio of two accumulators cancels it, a `log` adds `m` back, and a stored
//! output is rescaled to its true value. A split kernel instead stores `m` next to its scaled
//! partials, and the combine kernel merges the partials with the same rule.
//!
//! The work is split by concern:
//! - this file walks the loop levels and writes the stores;
//! - [`ops`] lowers each graph op to tile statements;
//! - [`stabilize`] is the pure analysis that decides which exps get a running max;
//! - [`rescale`] writes the running-max statements that analysis asks for;
//! - [`resources`] lays out warps, estimates registers and allocates shared memory;
//! - [`extents`] finds the runtime extents a kernel takes as arguments.

mod extents;
mod ops;
mod padding;
mod rescale;
mod resources;
mod split;
pub mod stabilize;

use std::collections::{BTreeMap, BTreeSet};

use self::stabilize::Stabilized;
use super::error::PlanError;
use super::program::{Binding, Buf, BufId, BufKind, Expr, GridAxis, MergeOp, Param, ParamId, Src, Stmt, TileKernel};
use crate::graph::{BinaryOp, DType, Dim, DimVar, Graph, Layout, NodeId, Op, ReduceOp, StoreAxis};
use crate::index::{AxisRange, IterId, TMap};
use crate::schedule::build::transposed_output;
use crate::schedule::config::{primary_output, TileConfig};
use crate::schedule::itgraph::{ItGraph, ItNode, LoopKind};

/// Register budget per thread the planner allows itself (of 255), leaving room for addresses
/// and temporaries.
pub const REGISTER_BUDGET: u64 = 200;

/// How a kernel's inputs and outputs bind, and which inputs are scaled partials.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelIo {
    /// Binding of each input of the kernel graph.
    pub inputs: Vec<Binding>,
    /// Binding of each output.
    pub outputs: Vec<Binding>,
    /// Inputs that are scaled partials: input index → the binding of their running max.
    pub scaled_inputs: BTreeMap<usize, Binding>,
    /// Where a split kernel stores the running max of its scaled partials, if it has any.
    pub max_output: Option<Binding>,
    /// The running maxima of [`scaled_inputs`](Self::scaled_inputs) stored one per element
    /// (shaped like their partials) rather than one per row: the maxima of exps summed
    /// slice by slice ([`stabilize::Cover::Element`]).
    pub element_maxima: BTreeSet<Binding>,
    /// Exps an earlier kernel stabilized and stored the running max of, by node of this
    /// kernel's graph: the binding of that max. Where such an exp reaches no reduction, it is
    /// computed against that max.
    pub shifted_exps: BTreeMap<NodeId, Binding>,
    /// Per input: the float types of the declared inputs its values come from
    /// ([`KernelGraph::input_sources`](crate::plan::KernelGraph::input_sources)); empty: the
    /// input's own type.
    pub input_sources: Vec<Vec<DType>>,
    /// Exps of this kernel's graph that need no running max: a user's own shift by the max,
    /// at most one ([`stabilize::bounded_exps`], decided on the partitioned graph).
    pub bounded_exps: BTreeSet<NodeId>,
    /// Outputs that store a value for a later kernel of a grouped launch to read
    /// ([`crate::plan::partition::grouped`]), by output index, as the kernel holds it. One that
    /// carries a running-max scale is refused: brought back to its true scale, `x · exp(m)`
    /// can overflow f32 where the outputs computed from it would not (`log(sum(exp(x)))`),
    /// and stored scaled, the kernels that read it would have to merge rows of different
    /// maxima.
    pub cut_outputs: BTreeSet<usize>,
}

/// The planned kernel and what the next kernel of its launch needs to know about it.
#[derive(Clone, Debug)]
pub struct Planned {
    /// The tile program; its symbol is given when the launch is assembled.
    pub kernel: TileKernel,
    /// Outputs stored scaled by `exp(m)` (split partials), by output index.
    pub scaled_outputs: Vec<usize>,
    /// The shape of the stored running max, when there is one.
    pub max_shape: Option<Vec<Dim>>,
    /// The stored running max holds one value per element of the partials, not per row.
    pub max_per_element: bool,
    /// The node of this kernel's graph whose running max is stored: an exp, or the first
    /// scaled partial input of a merge.
    pub max_source: Option<NodeId>,
    /// Estimated registers per thread.
    pub registers: u64,
}

/// What a kernel's stores leave for the next kernel: the fields of [`Planned`] they decide.
struct Stores {
    scaled_outputs: Vec<usize>,
    max_shape: Option<Vec<Dim>>,
    max_per_element: bool,
}

/// The lowered value of a graph node.
#[derive(Clone, Debug)]
enum Value {
    Const(f64),
    /// A staged tile (`trans`: seen through a transpose).
    Tile {
        buf: BufId,
        tmap: TMap,
        trans: bool,
    },
    /// A block-layout value: an expression over buffers, scaled by `exp(m)^degree`.
    Reg {
        expr: Expr,
        cols: u64,
        scale: Option<Scale>,
    },
}

/// The power of a running max a value is scaled by: the value is `true · exp(m)^degree`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Scale {
    m: BufId,
    degree: i32,
}

struct Lowerer<'a> {
    g: &'a Graph,
    io: &'a KernelIo,
    bufs: Vec<Buf>,
    params: Vec<Param>,
    param_of: BTreeMap<Binding, ParamId>,
    /// Row axes of the block (the output tile's non-last axes), right-aligned.
    row_axes: Vec<AxisRange>,
    rows: u64,
    values: BTreeMap<NodeId, Value>,
    extents: BTreeSet<DimVar>,
    users: Vec<Vec<NodeId>>,
    /// The running max shared by the scaled partials this kernel stores.
    stored_max: Option<BufId>,
    /// Frags used as a left MMA operand (their f16 copies cost registers).
    mma_a_frags: BTreeSet<BufId>,
    /// The running max of each stabilized source, for loops being lowered.
    running_max: BTreeMap<NodeId, BufId>,
    /// The staged max tile of each scaled partial input, for the partials sharing it.
    partial_max_tile: BTreeMap<NodeId, BufId>,
    /// The source each running or one-shot max buffer belongs to.
    max_source_of: BTreeMap<BufId, NodeId>,
    /// The max an earlier kernel stored, by its binding, once read: what the sources it
    /// shifts share.
    stored_shift: BTreeMap<Binding, BufId>,
    /// Running maxima kept per element ([`stabilize::Cover::Element`]).
    element_maxima: BTreeSet<BufId>,
    /// Register buffers of this loop level holding an exp, or a product or quotient with an
    /// exp factor, with their log taken through it: a log of them takes that rather than the
    /// log of a value that may have underflowed.
    log_regs: BTreeMap<BufId, Expr>,
    /// For each lowered loop, how the state it carries would merge across warps that split
    /// it: its running maxima and accumulators (`None`: some of it cannot be merged).
    loop_state: BTreeMap<IterId, Option<Vec<(BufId, MergeOp)>>>,
    /// The expression each register buffer was assigned once ([`Lowerer::materialize`]):
    /// what it holds past a ragged tile's end ([`padding`]).
    assigned: BTreeMap<BufId, Expr>,
}

/// Plans one kernel of a launch under its schedule.
pub fn lower(g: &Graph, it: &ItGraph, cfg: &TileConfig, io: &KernelIo) -> Result<Planned, PlanError> {
    assert_eq!(it.kind, LoopKind::Parallel, "the top level is the grid");
    let primary = primary_output(g);
    let Some(ptm) = it.tmaps.get(&primary) else {
        return Err(PlanError::OutputWithoutTile(primary));
    };
    let rank = ptm.axes.len();
    let row_axes: Vec<AxisRange> = ptm.axes[..rank.saturating_sub(1)].to_vec();
    let rows: u64 = row_axes.iter().map(|a| a.extent).product::<u64>().max(1);
    let mut lowerer = Lowerer {
        g,
        io,
        bufs: Vec::new(),
        params: Vec::new(),
        param_of: BTreeMap::new(),
        row_axes,
        rows,
        values: BTreeMap::new(),
        extents: BTreeSet::new(),
        users: g.users(),
        stored_max: None,
        mma_a_frags: BTreeSet::new(),
        running_max: BTreeMap::new(),
        partial_max_tile: BTreeMap::new(),
        max_source_of: BTreeMap::new(),
        stored_shift: BTreeMap::new(),
        element_maxima: BTreeSet::new(),
        log_regs: BTreeMap::new(),
        loop_state: BTreeMap::new(),
        assigned: BTreeMap::new(),
    };
    lowerer.declare_params();
    lowerer.check_requests(it)?;
    let mut body = Vec::new();
    let stab = stabilize::analyze(g, it, io)?;
    lowerer.level(it, &stab, &mut body)?;
    let Stores { scaled_outputs, max_shape, max_per_element } = lowerer.stores(it, primary, &mut body)?;
    let max_source = lowerer.stored_max.and_then(|m| lowerer.max_source_of.get(&m).copied());

    let mut warps = lowerer.warps(cfg, &body);
    let mut registers = lowerer.register_estimate(warps, &body);
    // A product's left operand computed in registers keeps the block's rows in one warp, and
    // with them every column of the accumulators. When those do not fit, the operand goes
    // through shared memory instead: then the warps can split the columns (each reads the
    // whole operand), as MLA's 512-wide output needs.
    if registers > REGISTER_BUDGET && !lowerer.mma_a_frags.is_empty() {
        lowerer.stage_left_operands(&mut body);
        warps = lowerer.warps(cfg, &body);
        registers = lowerer.register_estimate(warps, &body);
    }
    // Warps the rows leave idle split the loop instead, when it can be split.
    if warps.threads() < 32 * cfg.warps.max(1) {
        let saved = (body.clone(), lowerer.bufs.clone());
        if let Some(w) = lowerer.split_loop(cfg, &mut body) {
            let r = lowerer.register_estimate(w, &body);
            if r <= REGISTER_BUDGET {
                (warps, registers) = (w, r);
            } else {
                (body, lowerer.bufs) = saved;
            }
        } else if let Some((tile, needed)) = lowerer.narrow_loop(cfg, &body) {
            return Err(PlanError::IdleWarps { threads: warps.threads(), tile, needed });
        }
    }
    if registers > REGISTER_BUDGET {
        return Err(PlanError::OverRegisterBudget { registers, budget: REGISTER_BUDGET });
    }
    // Every tile a loop streams gets the configuration's pipeline depth.
    for b in lowerer.bufs.iter_mut().filter(|b| b.stages > 1) {
        b.stages = cfg.stages.max(2);
    }
    let smem_bytes = resources::allocate_smem(&mut lowerer.bufs, &body, warps);
    let grid = it.loops.iter().map(|l| GridAxis { iter: l.iter, dim: l.dim, tile: l.tile }).collect::<Vec<_>>();
    let extents = extents::runtime_extents(g, &grid, &body, &lowerer.params, lowerer.extents);
    let mut kernel = TileKernel {
        symbol: String::new(),
        params: lowerer.params,
        extents,
        grid,
        rows: rows.div_ceil(16) * 16,
        warps,
        bufs: lowerer.bufs,
        body,
        smem_bytes,
        names: it.iter_names(),
    };
    super::cost::order_grid(&mut kernel, &g.dims);
    Ok(Planned { kernel, scaled_outputs, max_shape, max_per_element, max_source, registers })
}

impl Lowerer<'_> {
    /// One parameter per binding: the inputs (each scaled partial followed by its running
    /// max), then the outputs, then the index tables of the per-request dims they have.
    fn declare_params(&mut self) {
        let g = self.g;
        for (i, input) in g.inputs.iter().enumerate() {
            let b = self.io.inputs[i];
            self.param(b, &input.decl.name, input.decl.dtype, &input.decl.shape, false);
            self.set_layout(b, input.decl.layout.clone());
            if let Some(mb) = self.io.scaled_inputs.get(&i) {
                let mut shape = input.decl.shape.clone();
                if let Some(last) = shape.last_mut().filter(|_| !self.io.element_maxima.contains(mb)) {
                    *last = Dim::One;
                }
                self.param(*mb, &format!("{}_max", input.decl.name), DType::F32, &shape, false);
            }
        }
        for (o, out) in g.outputs.iter().enumerate() {
            let b = self.io.outputs[o];
            self.param(b, &out.decl.name, out.decl.dtype, &out.decl.shape, true);
            self.set_layout(b, out.decl.layout.clone());
        }
        // A per-request dim's extent and rows come from its tables, read by the kernel.
        let mut tables = Vec::new();
        for p in &self.params {
            for v in p.shape.iter().flatten() {
                if let Some(pr) = &g.dims.get(*v).per_request {
                    for t in pr.tables() {
                        if !tables.contains(t) {
                            tables.push(t.clone());
                        }
                    }
                }
            }
        }
        for t in tables {
            let b = Binding::Input(t.input);
            self.param(b, &t.name, DType::I32, &[Dim::Var(t.len)], false);
            self.set_layout(b, t.plus_one.then(|| Layout { axes: vec![StoreAxis::PlusOne(t.len)] }));
        }
    }

    fn set_layout(&mut self, b: Binding, layout: Option<Layout>) {
        if let Some(p) = self.param_of.get(&b) {
            self.params[p.0 as usize].layout = layout;
        }
    }

    /// A block serves one request of every per-request dim it has: their batch is a grid axis
    /// of tile 1, never packed into the rows; workspaces (dense) have no per-request axes; and
    /// at most one grid axis walks a ragged dim (its blocks are dealt out by a work list).
    fn check_requests(&self, it: &ItGraph) -> Result<(), PlanError> {
        let dims = &self.g.dims;
        let mut ragged_grid = 0;
        for l in &it.loops {
            if dims.get(l.dim).per_request.is_some() {
                ragged_grid += 1;
            }
        }
        if ragged_grid > 1 {
            return Err(PlanError::PerRequest("more than one grid axis over dims that differ between requests"));
        }
        for p in &self.params {
            for v in p.shape.iter().flatten() {
                let Some(pr) = &dims.get(*v).per_request else { continue };
                if matches!(p.binding, Binding::Workspace(_)) {
                    return Err(PlanError::PerRequest("a workspace with an axis that differs between requests"));
                }
                // Every tile of the batch axis is then one request, at the grid's index.
                if !it.loops.iter().any(|l| l.dim == pr.batch && l.tile == 1) {
                    return Err(PlanError::PerRequest("a block that spans several requests"));
                }
            }
        }
        Ok(())
    }

    /// The stores of the kernel's outputs (and of the running max its scaled partials share);
    /// returns what they leave for the next kernel ([`Stores`]).
    fn stores(&mut self, it: &ItGraph, primary: NodeId, body: &mut Vec<Stmt>) -> Result<Stores, PlanError> {
        let g = self.g;
        let mut scaled_outputs = Vec::new();
        for (o, out) in g.outputs.iter().enumerate() {
            // An output that transposes a computed value stores that value's block transposed.
            let trans = transposed_output(g, out.node);
            let node = if trans { g.node(out.node).args[0] } else { out.node };
            let tmap = it.tmaps.get(&node).cloned().ok_or(PlanError::OutputWithoutTile(node))?;
            let val = self.values.get(&node).cloned().ok_or(PlanError::OutputNotComputed(node))?;
            let (expr, cols, scale) = self.as_reg(&val, &tmap)?;
            if self.io.cut_outputs.contains(&o) && scale.is_some_and(|s| s.degree != 0) {
                return Err(PlanError::LeavesRunningMaxScale);
            }
            let tmap = if trans {
                it.tmaps.get(&out.node).cloned().ok_or(PlanError::OutputWithoutTile(out.node))?
            } else {
                tmap
            };
            let expr = match (scale, self.io.outputs[o]) {
                (Some(s), Binding::Workspace(_)) if s.degree == 1 && self.io.max_output.is_some() => {
                    match self.stored_max {
                        Some(m) if m != s.m => return Err(PlanError::PartialsOnDifferentMaxima),
                        _ => self.stored_max = Some(s.m),
                    }
                    scaled_outputs.push(o);
                    expr
                }
                // A value a later kernel reads is not brought back to its true scale:
                // `x · exp(m)^d` can leave f32 where every declared value stays in it. A
                // reassociated graph may store `w / sum(exp(x))` for a product with `exp(x)`
                // to cancel; its true value underflows to zero once `x` passes 88 or so. Only
                // a declared output is normalized; a workspace carries its max instead (the
                // arm above) or the kernel is refused.
                (Some(s), Binding::Workspace(_)) if s.degree != 0 => return Err(PlanError::LeavesRunningMaxScale),
                (s, _) => self.normalize(expr, s),
            };
            let param = self.param_of[&self.io.outputs[o]];
            // A combine's result carries the split's leading unit axis; the declared output does not.
            let rank = out.decl.shape.len();
            let mut tmap = tmap;
            while tmap.axes.len() > rank {
                let lead = tmap.axes.remove(0);
                if lead.extent != 1 || !lead.offset.is_const() {
                    return Err(PlanError::OutputLeadingAxis);
                }
            }
            // The block's rows must be the tensor's last axis alone.
            let r = tmap.axes.len();
            if trans && (r < 2 || tmap.axes[..r - 2].iter().any(|a| a.extent != 1)) {
                return Err(PlanError::TransposedStoreLeadingAxis);
            }
            let staging = if trans { None } else { self.staging(param, cols, &tmap) };
            body.push(Stmt::Store { param, expr, cols, tmap, staging, trans });
        }
        let mut max_shape = None;
        let mut per_element = false;
        if let (Some(m), Some(mb)) = (self.stored_max, self.io.max_output) {
            // A max per row is stored as one column; a max per element (a register tile like
            // the partials it scales) is stored whole, shaped like them.
            per_element = self.element_maxima.contains(&m);
            let cols = match self.bufs[m.0 as usize].kind {
                BufKind::Frag { cols, .. } => cols,
                _ => 1,
            };
            // A max per element takes the layout of the partials it scales, which the combine
            // reads it at; they must share one, stored as computed (not transposed).
            let node = if per_element {
                let nodes: Vec<NodeId> = scaled_outputs.iter().map(|&o| g.outputs[o].node).collect();
                let first = *nodes.first().ok_or(PlanError::ElementMaxLayout)?;
                if nodes.iter().any(|&n| g.shape(n) != g.shape(first) || transposed_output(g, n)) {
                    return Err(PlanError::ElementMaxLayout);
                }
                first
            } else {
                primary
            };
            let mut tmap = it.tmaps.get(&node).cloned().ok_or(PlanError::OutputWithoutTile(node))?;
            let mut shape = g.shape(node).to_vec();
            if !per_element {
                if let Some(last) = tmap.axes.last_mut() {
                    *last = AxisRange::unit();
                }
                if let Some(last) = shape.last_mut() {
                    *last = Dim::One;
                }
            }
            let param = self.param(mb, "partial_max", DType::F32, &shape, true);
            body.push(Stmt::Store { param, expr: Expr::reg(m), cols, tmap, staging: None, trans: false });
            max_shape = Some(shape);
        }
        Ok(Stores { scaled_outputs, max_shape, max_per_element: per_element })
    }

    fn param(&mut self, b: Binding, name: &str, dtype: DType, shape: &[Dim], output: bool) -> ParamId {
        if let Some(p) = self.param_of.get(&b) {
            return *p;
        }
        let id = ParamId(self.params.len() as u32);
        self.params.push(Param {
            name: name.to_string(),
            dtype,
            shape: shape.iter().map(|d| d.var()).collect(),
            output,
            binding: b,
            layout: None,
        });
        self.param_of.insert(b, id);
        id
    }

    /// A staging tile for a store that can be written in 16-byte chunks: the output's rows are
    /// whole chunks in memory (a static last axis), the tile's rows too, and no column of the
    /// tile can fall outside the tensor (ragged columns are stored element by element).
    fn staging(&mut self, param: ParamId, cols: u64, tmap: &TMap) -> Option<BufId> {
        let p = &self.params[param.0 as usize];
        let size = p.dtype.size();
        let last = p.shape.last().copied().flatten()?;
        let info = self.g.dims.get(last);
        let fits = cols > 1
            && !info.dynamic
            && (info.value * size) % 16 == 0
            && (cols * size) % 16 == 0
            && tmap.axes.len() == p.shape.len()
            && tmap.axes.last().is_some_and(|a| a.limits.is_empty());
        if !fits {
            return None;
        }
        let (name, dtype) = (format!("t_{}_stage", p.name), p.dtype);
        let rows = self.rows.div_ceil(16) * 16;
        Some(self.buf(name, BufKind::Smem { dtype, rows, cols }))
    }

    fn buf(&mut self, name: String, kind: BufKind) -> BufId {
        let id = BufId(self.bufs.len() as u32);
        self.bufs.push(Buf { name, kind, smem_offset: 0, stages: 1 });
        id
    }

    fn name_of(&self, id: NodeId) -> String {
        match self.g.node(id).op {
            Op::Input(i) => format!("t_{}", self.g.inputs[i as usize].decl.name),
            _ => format!("t{}", id.0),
        }
    }

    /// Lowers one loop level, whose stabilization `stab` was analyzed once by the caller.
    fn level(
        &mut self,
        it: &ItGraph,
        stab: &BTreeMap<NodeId, Stabilized>,
        body: &mut Vec<Stmt>,
    ) -> Result<(), PlanError> {
        let accs: BTreeSet<NodeId> = it.accumulates.iter().copied().collect();
        for node in &it.nodes {
            match node {
                ItNode::Op(id) => self.op(*id, it, &accs, stab, body)?,
                ItNode::Inner(inner) => self.inner(inner, body)?,
            }
        }
        Ok(())
    }

    /// A sequential loop: its accumulators and running maxima start before it, loads that do
    /// not move with it are hoisted, the others are double-buffered.
    fn inner(&mut self, inner: &ItGraph, body: &mut Vec<Stmt>) -> Result<(), PlanError> {
        let axis = inner.loops[0];
        // A loop reassigns running maxima, so an exponent recorded on one side of it is not
        // read on the other.
        self.log_regs.clear();
        // Accumulators start at the identity of their reduction.
        for &r in &inner.accumulates {
            let tm = inner.tmaps.get(&r).ok_or(PlanError::MissingAccumulator(r))?;
            let cols = tm.axes.last().map_or(1, |a| a.extent);
            let kind = if cols == 1 { BufKind::Rows } else { BufKind::Frag { cols, whole: false } };
            let b = self.buf(format!("t{}", r.0), kind);
            let init = match self.g.node(r).op {
                Op::Reduce(ReduceOp::Max, _) => f64::NEG_INFINITY,
                _ => 0.0,
            };
            body.push(Stmt::Assign { dst: b, expr: Expr::constant(init) });
            self.values.insert(r, Value::Reg { expr: Expr::reg(b), cols, scale: None });
        }
        let stab = stabilize::analyze(self.g, inner, self.io)?;
        let maxima_before = self.running_max.clone();
        self.start_running_maxima(&stab, body)?;
        let started: Vec<BufId> =
            self.running_max.iter().filter(|(k, _)| !maxima_before.contains_key(k)).map(|(_, m)| *m).collect();
        let mut loop_body = Vec::new();
        let mut hoisted = Vec::new();
        // A node the enclosing level already has (an input both a reduction inside and an
        // elementwise op outside read) is lowered again inside, at the loop's tile; after the
        // loop the enclosing level must see its own value again, not the last iteration's.
        let outer = self.values.clone();
        self.level(inner, &stab, &mut loop_body)?;
        self.log_regs.clear();
        for (id, v) in outer {
            if !inner.accumulates.contains(&id) {
                self.values.insert(id, v);
            }
        }
        let state = self.carried_state(inner, &started);
        self.loop_state.insert(axis.iter, state);
        // Hoist loads whose tile does not move with this loop.
        loop_body.retain(|s| match s {
            Stmt::Load { tmap, .. } if !tmap.uses(axis.iter) => {
                hoisted.push(s.clone());
                false
            }
            _ => true,
        });
        for s in &loop_body {
            if let Stmt::Load { dst, .. } = s {
                // Double buffered here; `lower` gives it the configuration's depth.
                self.bufs[dst.0 as usize].stages = 2;
            }
        }
        body.extend(hoisted);
        body.push(Stmt::Loop { iter: axis.iter, dim: axis.dim, tile: axis.tile, body: loop_body });
        // A mean divides its sum once, after the loop.
        for &r in &inner.accumulates {
            if let Op::Reduce(ReduceOp::Mean, a) = self.g.node(r).op {
                let d = self.g.shape(self.g.node(r).args[0])[a as usize];
                let Some(Value::Reg { expr: Expr::Src(Src::Reg(b)), .. }) = self.values.get(&r).cloned() else {
                    continue;
                };
                body.push(Stmt::Assign { dst: b, expr: Expr::bin(BinaryOp::Div, Expr::reg(b), self.extent_expr(d)) });
            }
        }
        Ok(())
    }
}
