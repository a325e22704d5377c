//! Memory and layout planning: an itGraph to a [`TileKernel`] (paper §6.1).
//!
//! Graph inputs are staged in shared memory; computed values live in registers in the block's
//! row layout. Loads whose tile does not move with a loop are hoisted out of it. Elementwise
//! chains stay unmaterialized expressions until a reduction, a product, a store or a second
//! user needs them.
//!
//! Stabilization (beyond the paper; RedFuser's incremental form) is derived here from the
//! graph: when an `exp` feeds reductions through ops that are linear in it, the block keeps a
//! running maximum of the exponent per row, computes `exp(x - m)` instead, and rescales every
//! accumulator of that exponent whenever `m` grows. Values carry the power of `exp(m)` they
//! are scaled by; a ratio of two accumulators cancels it, a `log` adds `m` back, and a stored
//! output is rescaled to its true value. A split kernel instead stores `m` next to its scaled
//! partials, and the combine kernel merges the partials with the same rule.

use std::collections::{BTreeMap, BTreeSet};

use super::program::{
    Binding, Buf, BufId, BufKind, Expr, GridAxis, MmaA, MmaB, Param, ParamId, Src, Stmt, TileKernel, Warps,
};
use crate::graph::{BinaryOp, DType, Dim, DimVar, Graph, NodeId, Op, ReduceOp, UnaryOp};
use crate::schedule::config::{primary_output, TileConfig};
use crate::schedule::itgraph::{Affine, AxisRange, ItGraph, ItNode, LoopKind, TMap};
use crate::schedule::tmap::Reject;

/// Register budget per thread the planner allows itself (of 255), leaving room for addresses
/// and temporaries.
pub const REGISTER_BUDGET: u64 = 200;

/// How a kernel's inputs and outputs bind, and which inputs are scaled partials.
#[derive(Clone, Debug, Default)]
pub struct KernelIo {
    /// Binding of each input of the kernel graph.
    pub inputs: Vec<Binding>,
    /// Binding of each output.
    pub outputs: Vec<Binding>,
    /// Inputs that are scaled partials: input index → the binding of their running max.
    pub scaled_inputs: BTreeMap<usize, Binding>,
    /// Where a split kernel stores the running max of its scaled partials, if it has any.
    pub max_output: Option<Binding>,
}

/// The planned kernel and what the next kernel needs to know about it.
#[derive(Clone, Debug)]
pub struct Planned {
    /// The tile program.
    pub kernel: TileKernel,
    /// Outputs stored scaled by `exp(m)` (split partials), by output index.
    pub scaled_outputs: Vec<usize>,
    /// The shape of the stored running max, when there is one.
    pub max_shape: Option<Vec<Dim>>,
    /// Estimated registers per thread.
    pub registers: u64,
}

/// A value during lowering.
#[derive(Clone, Debug)]
enum Val {
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
    vals: BTreeMap<NodeId, Val>,
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
}

fn reject<T>(msg: impl Into<String>) -> Result<T, Reject> {
    Err(Reject::Unsupported(msg.into()))
}

/// Undoing a running max inside a kernel (`x · exp(m)`) can overflow f32 long before the true
/// result would; a graph that needs it (two partial sums on different scales, a non-linear op
/// of an accumulator) is left to a form that does not.
fn unsafe_rescale<T>() -> Result<T, Reject> {
    reject("a value would have to leave its running-max scale inside the kernel")
}

/// Plans one kernel.
pub fn lower(g: &Graph, it: &ItGraph, cfg: &TileConfig, io: &KernelIo, symbol: &str) -> Result<Planned, Reject> {
    assert_eq!(it.kind, LoopKind::Parallel, "the top level is the grid");
    let primary = primary_output(g);
    let Some(ptm) = it.tmaps.get(&primary) else {
        return reject(format!("the output {} has no tile at the grid level\n{}", primary.0, g.listing()));
    };
    let rank = ptm.axes.len();
    let row_axes: Vec<AxisRange> = ptm.axes[..rank.saturating_sub(1)].to_vec();
    let rows: u64 = row_axes.iter().map(|a| a.extent).product::<u64>().max(1);
    let mut lw = Lowerer {
        g,
        io,
        bufs: Vec::new(),
        params: Vec::new(),
        param_of: BTreeMap::new(),
        row_axes,
        rows,
        vals: BTreeMap::new(),
        extents: BTreeSet::new(),
        users: g.users(),
        stored_max: None,
        mma_a_frags: BTreeSet::new(),
        running_max: BTreeMap::new(),
        partial_max_tile: BTreeMap::new(),
    };
    for (i, input) in g.inputs.iter().enumerate() {
        let b = io.inputs[i];
        lw.param(b, &input.decl.name, input.decl.dtype, &input.decl.shape, false);
        if let Some(mb) = io.scaled_inputs.get(&i) {
            let mut shape = input.decl.shape.clone();
            if let Some(last) = shape.last_mut() {
                *last = Dim::One;
            }
            lw.param(*mb, &format!("{}_max", input.decl.name), DType::F32, &shape, false);
        }
    }
    for (o, out) in g.outputs.iter().enumerate() {
        lw.param(io.outputs[o], &out.decl.name, out.decl.dtype, &out.decl.shape, true);
    }
    let mut body = Vec::new();
    lw.level(it, &mut body)?;

    // Stores.
    let mut scaled_outputs = Vec::new();
    let mut max_shape = None;
    for (o, out) in g.outputs.iter().enumerate() {
        let tmap = it.tmaps[&out.node].clone();
        let val = lw
            .vals
            .get(&out.node)
            .cloned()
            .ok_or_else(|| Reject::Unsupported("an output was never computed".into()))?;
        let (expr, cols, scale) = lw.as_reg(&val, &tmap)?;
        let expr = match (scale, io.outputs[o]) {
            (Some(s), Binding::Workspace(_)) if s.degree == 1 && io.max_output.is_some() => {
                match lw.stored_max {
                    Some(m) if m != s.m => return reject("partials scaled by different running maxima"),
                    _ => lw.stored_max = Some(s.m),
                }
                scaled_outputs.push(o);
                expr
            }
            (s, _) => lw.normalize(expr, s),
        };
        let param = lw.param_of[&io.outputs[o]];
        // A combine's result carries the split's leading unit axis; the declared output does not.
        let rank = out.decl.shape.len();
        let mut tmap = tmap;
        while tmap.axes.len() > rank {
            let lead = tmap.axes.remove(0);
            if lead.extent != 1 || !lead.offset.is_const() {
                return reject("an output with a leading axis that is not a unit");
            }
        }
        let staging = lw.staging(param, cols, &tmap);
        body.push(Stmt::Store { param, expr, cols, tmap, staging });
    }
    if let (Some(m), Some(mb)) = (lw.stored_max, io.max_output) {
        let primary_tm = it.tmaps[&primary].clone();
        let mut tmap = primary_tm;
        if let Some(last) = tmap.axes.last_mut() {
            *last = AxisRange::unit();
        }
        let mut shape = g.shape(primary).to_vec();
        if let Some(last) = shape.last_mut() {
            *last = Dim::One;
        }
        let param = lw.param(mb, "partial_max", DType::F32, &shape, true);
        body.push(Stmt::Store { param, expr: Expr::reg(m), cols: 1, tmap, staging: None });
        max_shape = Some(shape);
    }

    let warps = lw.warps(cfg)?;
    let registers = lw.register_estimate(warps, &body);
    if registers > REGISTER_BUDGET {
        return reject(format!("needs about {registers} registers per thread"));
    }
    let smem_bytes = allocate_smem(&mut lw.bufs, &body, warps);
    let grid = it.loops.iter().map(|l| GridAxis { iter: l.iter, dim: l.dim, tile: l.tile }).collect::<Vec<_>>();
    for a in &grid {
        lw.extents.insert(a.dim);
    }
    collect_extents(&body, &mut lw.extents);
    lw.extents = runtime_extents(g, &lw.extents);
    let kernel = TileKernel {
        symbol: symbol.to_string(),
        params: lw.params,
        extents: lw.extents.into_iter().collect(),
        grid,
        rows: rows.div_ceil(16) * 16,
        warps,
        bufs: lw.bufs,
        body,
        smem_bytes,
    };
    Ok(Planned { kernel, scaled_outputs, max_shape, registers })
}

impl Lowerer<'_> {
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

    /// Whether a tile's non-last axes are the block's rows (`Some(false)`), all broadcast
    /// (`Some(true)`), or neither (`None`).
    fn row_broadcast(&self, tm: &TMap) -> Option<bool> {
        let n = tm.axes.len().saturating_sub(1);
        let nb = self.row_axes.len();
        let mut all_unit = true;
        let mut all_equal = true;
        for j in 0..nb.max(n) {
            let block = if j < nb { Some(&self.row_axes[nb - 1 - j]) } else { None };
            let tile = if j < n { Some(&tm.axes[n - 1 - j]) } else { None };
            let (be, te) = (block.map_or(1, |a| a.extent), tile.map_or(1, |a| a.extent));
            if te != 1 {
                all_unit = false;
            }
            let equal = match (block, tile) {
                (Some(b), Some(t)) => b.extent == t.extent && (b.extent == 1 || b.offset == t.offset),
                _ => be == te,
            };
            if !equal {
                all_equal = false;
            }
        }
        if all_equal {
            Some(false)
        } else if all_unit {
            Some(true)
        } else {
            None
        }
    }

    /// A value as a block-layout expression.
    fn as_reg(&mut self, v: &Val, tm: &TMap) -> Result<(Expr, u64, Option<Scale>), Reject> {
        let cols = tm.axes.last().map_or(1, |a| a.extent);
        match v {
            Val::Const(c) => Ok((Expr::Src(Src::Const(*c)), cols, None)),
            Val::Reg { expr, cols, scale } => Ok((expr.clone(), *cols, *scale)),
            Val::Tile { buf, tmap, trans } => {
                if *trans {
                    return reject("elementwise use of a transposed tile");
                }
                if self.row_broadcast(tmap).is_none() {
                    return reject("a tile that broadcasts over only some row axes");
                }
                Ok((Expr::Src(Src::Tile(*buf)), tmap.axes.last().map_or(1, |a| a.extent), None))
            }
        }
    }

    /// Rescales a value to its true magnitude.
    fn normalize(&self, e: Expr, s: Option<Scale>) -> Expr {
        match s {
            Some(Scale { m, degree }) if degree != 0 => {
                let f = if degree == 1 {
                    Expr::reg(m)
                } else {
                    Expr::bin(BinaryOp::Mul, Expr::reg(m), Expr::Src(Src::Const(f64::from(degree))))
                };
                Expr::bin(BinaryOp::Mul, e, Expr::Unary(UnaryOp::Exp, Box::new(f)))
            }
            _ => e,
        }
    }

    /// Materializes a block value into a register buffer.
    fn materialize(&mut self, id: NodeId, expr: Expr, cols: u64, body: &mut Vec<Stmt>) -> BufId {
        if let Expr::Src(Src::Reg(b)) = expr {
            return b;
        }
        let kind = if cols == 1 { BufKind::Rows } else { BufKind::Frag { cols } };
        let b = self.buf(self.name_of(id), kind);
        body.push(Stmt::Assign { dst: b, expr });
        b
    }

    fn level(&mut self, it: &ItGraph, body: &mut Vec<Stmt>) -> Result<(), Reject> {
        let accs: BTreeSet<NodeId> = it.accumulates.iter().copied().collect();
        let stab = self.stabilization(it, &accs)?;
        for node in &it.nodes {
            match node {
                ItNode::Op(id) => self.op(*id, it, &accs, &stab, body)?,
                ItNode::Inner(inner) => self.inner(inner, body)?,
            }
        }
        Ok(())
    }

    fn inner(&mut self, inner: &ItGraph, body: &mut Vec<Stmt>) -> Result<(), Reject> {
        let axis = inner.loops[0];
        // Accumulators start at the identity of their reduction.
        for &r in &inner.accumulates {
            let tm = &inner.tmaps[&r];
            let cols = tm.axes.last().map_or(1, |a| a.extent);
            let kind = if cols == 1 { BufKind::Rows } else { BufKind::Frag { cols } };
            let b = self.buf(format!("t{}", r.0), kind);
            let init = match self.g.node(r).op {
                Op::Reduce(ReduceOp::Max, _) => f64::NEG_INFINITY,
                _ => 0.0,
            };
            body.push(Stmt::Assign { dst: b, expr: Expr::Src(Src::Const(init)) });
            self.vals.insert(r, Val::Reg { expr: Expr::reg(b), cols, scale: None });
        }
        // Running maxima start at -inf; their accumulators are scaled by exp(m) from the start
        // (zero is zero at any scale).
        let accs: BTreeSet<NodeId> = inner.accumulates.iter().copied().collect();
        for (src, st) in self.stabilization(inner, &accs)? {
            if st.accs.is_empty() || st.alias.is_some() {
                continue;
            }
            let m = self.buf(format!("t{}_m", src.0), BufKind::Rows);
            body.push(Stmt::Assign { dst: m, expr: Expr::Src(Src::Const(f64::NEG_INFINITY)) });
            self.running_max.insert(src, m);
            for a in &st.accs {
                if let Some(Val::Reg { scale, .. }) = self.vals.get_mut(a) {
                    *scale = Some(Scale { m, degree: 1 });
                }
            }
        }
        let mut loop_body = Vec::new();
        let mut hoisted = Vec::new();
        self.level(inner, &mut loop_body)?;
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
                self.bufs[dst.0 as usize].stages = 2;
            }
        }
        body.extend(hoisted);
        body.push(Stmt::Loop { iter: axis.iter, dim: axis.dim, tile: axis.tile, body: loop_body });
        // A mean divides its sum once, after the loop.
        for &r in &inner.accumulates {
            if let Op::Reduce(ReduceOp::Mean, a) = self.g.node(r).op {
                let d = self.g.shape(self.g.node(r).args[0])[a as usize];
                let Some(Val::Reg { expr: Expr::Src(Src::Reg(b)), .. }) = self.vals.get(&r).cloned() else { continue };
                body.push(Stmt::Assign { dst: b, expr: Expr::bin(BinaryOp::Div, Expr::reg(b), self.extent_expr(d)) });
            }
        }
        Ok(())
    }

    fn extent_expr(&mut self, d: Dim) -> Expr {
        match d {
            Dim::One => Expr::Src(Src::Const(1.0)),
            Dim::Var(v) => {
                let info = self.g.dims.get(v);
                if info.dynamic {
                    self.extents.insert(v);
                    Expr::Src(Src::Extent(v))
                } else {
                    Expr::Src(Src::Const(info.value as f64))
                }
            }
        }
    }

    fn op(
        &mut self,
        id: NodeId,
        it: &ItGraph,
        accs: &BTreeSet<NodeId>,
        stab: &BTreeMap<NodeId, Stab>,
        body: &mut Vec<Stmt>,
    ) -> Result<(), Reject> {
        let n = self.g.node(id).clone();
        let tm = it.tmaps[&id].clone();
        let cols = tm.axes.last().map_or(1, |a| a.extent);
        let val = match n.op {
            Op::Const(c) => Val::Const(c),
            Op::Input(i) => {
                let shape = &self.g.inputs[i as usize].decl.shape;
                let (rows, cols) = tile_2d(&tm);
                let dtype = self.g.inputs[i as usize].decl.dtype;
                let _ = shape;
                let b = self.buf(self.name_of(id), BufKind::Smem { dtype, rows, cols });
                let param = self.param_of[&self.io.inputs[i as usize]];
                body.push(Stmt::Load { dst: b, param, tmap: tm.clone() });
                let tile = Val::Tile { buf: b, tmap: tm.clone(), trans: false };
                if let Some(mb) = self.io.scaled_inputs.get(&(i as usize)).copied() {
                    self.scaled_input(id, &tile, &tm, mb, stab, body)?
                } else {
                    tile
                }
            }
            Op::Transpose => match self.vals[&n.args[0]].clone() {
                Val::Tile { buf, tmap, trans } => {
                    let mut tmap = tmap;
                    let r = tmap.axes.len();
                    tmap.axes.swap(r - 1, r - 2);
                    Val::Tile { buf, tmap, trans: !trans }
                }
                _ => return reject("a transpose of a computed value"),
            },
            Op::Split(_) => match self.vals[&n.args[0]].clone() {
                Val::Tile { buf, trans: false, .. } => Val::Tile { buf, tmap: tm.clone(), trans: false },
                _ => return reject("a split of a computed value"),
            },
            Op::Unary(u) => {
                let (e, _, s) = self.arg(n.args[0], it)?;
                let stabilized = match stab.get(&id) {
                    Some(st) if u == UnaryOp::Exp => Some(self.stabilize_exp(id, e.clone(), s, st, &tm, body)?),
                    _ => None,
                };
                if let Some(v) = stabilized {
                    v
                } else {
                    let (e, s) = match (u, s) {
                        (UnaryOp::Neg, s) => (e, s),
                        (UnaryOp::Log, Some(sc)) if sc.degree != 0 => {
                            let f =
                                Expr::bin(BinaryOp::Mul, Expr::reg(sc.m), Expr::Src(Src::Const(f64::from(sc.degree))));
                            (Expr::bin(BinaryOp::Add, Expr::Unary(UnaryOp::Log, Box::new(e)), f), None)
                        }
                        (_, Some(sc)) if sc.degree != 0 => return unsafe_rescale(),
                        (_, s) => (e, s),
                    };
                    let e = if u == UnaryOp::Log && matches!(e, Expr::Binary(BinaryOp::Add, ..)) {
                        e
                    } else {
                        Expr::Unary(u, Box::new(e))
                    };
                    Val::Reg { expr: e, cols, scale: s }
                }
            }
            Op::Binary(op) => {
                let (a, _, sa) = self.arg(n.args[0], it)?;
                let (b, _, sb) = self.arg(n.args[1], it)?;
                let deg = |s: Option<Scale>| s.map_or(0, |s| s.degree);
                let same_m = match (sa, sb) {
                    (Some(x), Some(y)) => x.m == y.m,
                    _ => true,
                };
                let m = sa.or(sb).map(|s| s.m);
                let (a, b, scale) = match op {
                    BinaryOp::Mul if same_m => (a, b, Some(deg(sa) + deg(sb))),
                    BinaryOp::Div if same_m => (a, b, Some(deg(sa) - deg(sb))),
                    BinaryOp::Add | BinaryOp::Sub | BinaryOp::Max if same_m && deg(sa) == deg(sb) => {
                        (a, b, Some(deg(sa)))
                    }
                    _ if deg(sa) != 0 || deg(sb) != 0 => return unsafe_rescale(),
                    _ => (a, b, None),
                };
                let scale = match (scale, m) {
                    (Some(d), Some(m)) if d != 0 => Some(Scale { m, degree: d }),
                    _ => None,
                };
                Val::Reg { expr: Expr::bin(op, a, b), cols, scale }
            }
            Op::MatMul => self.matmul(id, it, accs, cols, body)?,
            Op::Reduce(op, axis) => self.reduce(id, op, axis, it, accs, cols, body)?,
        };
        // A value read more than once is computed once.
        let val = match val {
            Val::Reg { expr, cols, scale } if self.users[id.index()].len() > 1 && !matches!(expr, Expr::Src(_)) => {
                let b = self.materialize(id, expr, cols, body);
                Val::Reg { expr: Expr::reg(b), cols, scale }
            }
            v => v,
        };
        self.vals.insert(id, val);
        Ok(())
    }

    fn arg(&mut self, id: NodeId, it: &ItGraph) -> Result<(Expr, u64, Option<Scale>), Reject> {
        let v = self
            .vals
            .get(&id)
            .cloned()
            .ok_or_else(|| Reject::Unsupported(format!("node {} used before it is computed", id.0)))?;
        let tm = it.tmaps.get(&id).cloned().unwrap_or(TMap { axes: Vec::new() });
        self.as_reg(&v, &tm)
    }

    fn matmul(
        &mut self,
        id: NodeId,
        it: &ItGraph,
        accs: &BTreeSet<NodeId>,
        cols: u64,
        body: &mut Vec<Stmt>,
    ) -> Result<Val, Reject> {
        let n = self.g.node(id).clone();
        let (a, b) = (self.vals[&n.args[0]].clone(), self.vals[&n.args[1]].clone());
        let mut scale = None;
        let (ma, k) = match a {
            Val::Tile { buf, tmap, trans } => {
                if self.row_broadcast(&TMap { axes: tmap.axes.clone() }) != Some(false) {
                    return reject("a left matmul operand whose rows are not the block's rows");
                }
                (MmaA::Smem { buf, trans }, tmap.axes.last().map_or(1, |x| x.extent))
            }
            Val::Reg { expr, cols: k, scale: s } => {
                // A register operand is rounded to 16 bits for the tensor cores. After an exp
                // (softmax probabilities) that is a small relative error; before one it is an
                // absolute error in the exponent, amplified by the scores' magnitude.
                if self.feeds_exp(id) {
                    return reject("a product that feeds an exp would round its left operand to 16 bits");
                }
                scale = s;
                let b = self.materialize(n.args[0], expr, k, body);
                self.mma_a_frags.insert(b);
                (MmaA::Frag(b), k)
            }
            Val::Const(_) => return reject("a matmul with a constant operand"),
        };
        let mb = match b {
            Val::Tile { buf, tmap, trans } => {
                let r = tmap.axes.len();
                if tmap.axes[..r - 2].iter().any(|x| x.extent != 1) {
                    return reject("a right matmul operand holding several matrices per block");
                }
                MmaB { buf, n_major: trans }
            }
            _ => return reject("a computed right matmul operand"),
        };
        if k % 16 != 0 {
            return reject(format!("a contraction tile of {k}, not a multiple of 16"));
        }
        if cols % 8 != 0 {
            return reject(format!("a matmul tile of {cols} columns, not a multiple of 8"));
        }
        let _ = it;
        if accs.contains(&id) {
            let Some(Val::Reg { expr: Expr::Src(Src::Reg(acc)), .. }) = self.vals.get(&id).cloned() else {
                return reject("accumulator missing");
            };
            body.push(Stmt::Mma { acc, a: ma, b: mb, k, accumulate: true });
            // The accumulator's scale is that of its contributions (set by stabilization).
            let scale = self.acc_scale(id).or(scale);
            Ok(Val::Reg { expr: Expr::reg(acc), cols, scale })
        } else {
            let acc = self.buf(self.name_of(id), BufKind::Frag { cols });
            body.push(Stmt::Mma { acc, a: ma, b: mb, k, accumulate: false });
            Ok(Val::Reg { expr: Expr::reg(acc), cols, scale })
        }
    }

    /// True when `id`'s value reaches an `exp` through any ops.
    fn feeds_exp(&self, id: NodeId) -> bool {
        let mut stack = vec![id];
        let mut seen = BTreeSet::new();
        while let Some(x) = stack.pop() {
            for &u in &self.users[x.index()] {
                if self.g.node(u).op == Op::Unary(UnaryOp::Exp) {
                    return true;
                }
                if seen.insert(u) {
                    stack.push(u);
                }
            }
        }
        false
    }

    fn acc_scale(&self, id: NodeId) -> Option<Scale> {
        match self.vals.get(&id) {
            Some(Val::Reg { scale, .. }) => *scale,
            _ => None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &mut self,
        id: NodeId,
        op: ReduceOp,
        axis: u32,
        it: &ItGraph,
        accs: &BTreeSet<NodeId>,
        cols: u64,
        body: &mut Vec<Stmt>,
    ) -> Result<Val, Reject> {
        let n = self.g.node(id).clone();
        let arg = n.args[0];
        let arg_tm = it.tmaps[&arg].clone();
        let (e, in_cols, s) = self.arg(arg, it)?;
        let last = axis as usize + 1 == arg_tm.axes.len();
        let red_op = if op == ReduceOp::Max { ReduceOp::Max } else { ReduceOp::Sum };
        let d = self.g.shape(arg)[axis as usize];
        let acc = accs.contains(&id);
        let out_scale = self.acc_scale(id).or(s);
        if last {
            let mask = arg_tm.axes.last().map(|x| x.limits.clone()).unwrap_or_default();
            let dst = if acc {
                let Some(Val::Reg { expr: Expr::Src(Src::Reg(b)), .. }) = self.vals.get(&id).cloned() else {
                    return reject("accumulator missing");
                };
                b
            } else {
                self.buf(self.name_of(id), BufKind::Rows)
            };
            body.push(Stmt::RowReduce { dst, op: red_op, expr: e, cols: in_cols, mask, acc });
            if op == ReduceOp::Mean && !acc {
                let ext = self.extent_expr(d);
                body.push(Stmt::Assign { dst, expr: Expr::bin(BinaryOp::Div, Expr::reg(dst), ext) });
            }
            return Ok(Val::Reg { expr: Expr::reg(dst), cols: 1, scale: out_scale });
        }
        if arg_tm.axes[axis as usize].extent != 1 {
            return reject("a reduction over a non-last axis that is not iterated one slice at a time");
        }
        if !acc {
            // Reducing one slice is the identity (a mean over an axis of extent 1 included).
            return Ok(Val::Reg { expr: e, cols, scale: s });
        }
        let Some(Val::Reg { expr: Expr::Src(Src::Reg(b)), .. }) = self.vals.get(&id).cloned() else {
            return reject("accumulator missing");
        };
        let combined = match red_op {
            ReduceOp::Max => Expr::bin(BinaryOp::Max, Expr::reg(b), e),
            _ => Expr::bin(BinaryOp::Add, Expr::reg(b), e),
        };
        body.push(Stmt::Assign { dst: b, expr: combined });
        Ok(Val::Reg { expr: Expr::reg(b), cols, scale: out_scale })
    }
}

/// How one exp (or scaled input) is stabilized at a level.
#[derive(Clone, Debug)]
struct Stab {
    /// The accumulators of this level fed by the value (running maximum across iterations);
    /// empty for a one-shot maximum within a single tile.
    accs: Vec<NodeId>,
    /// A scaled partial whose running max is that of an earlier partial of the same split.
    alias: Option<NodeId>,
}

impl Lowerer<'_> {
    /// Finds the exps of a level that feed reductions through ops linear in them.
    fn stabilization(&self, it: &ItGraph, accs: &BTreeSet<NodeId>) -> Result<BTreeMap<NodeId, Stab>, Reject> {
        let ops: Vec<NodeId> = it.ops().collect();
        let mut out = BTreeMap::new();
        let mut sources: Vec<NodeId> =
            ops.iter().copied().filter(|id| self.g.node(*id).op == Op::Unary(UnaryOp::Exp)).collect();
        // Scaled partial inputs are sources too.
        sources.extend(ops.iter().copied().filter(
            |id| matches!(self.g.node(*id).op, Op::Input(i) if self.io.scaled_inputs.contains_key(&(i as usize))),
        ));
        // Scaled partials stored with the same running max merge under one running max here.
        let mut shared: BTreeMap<Binding, NodeId> = BTreeMap::new();
        for e in sources {
            let (reds, nonlinear) = self.linear_reductions(e, &ops);
            if reds.is_empty() {
                continue;
            }
            if let Some(bad) = nonlinear {
                return reject(format!("node {} uses an exp non-linearly on its way to a reduction", bad.0));
            }
            let in_loop: Vec<NodeId> = reds.iter().copied().filter(|r| accs.contains(r)).collect();
            if !in_loop.is_empty() && in_loop.len() != reds.len() {
                return reject("an exp feeding both loop accumulators and one-shot reductions");
            }
            let max_of = match self.g.node(e).op {
                Op::Input(i) => self.io.scaled_inputs.get(&(i as usize)).copied(),
                _ => None,
            };
            match max_of.and_then(|b| shared.get(&b).copied()) {
                Some(first) => {
                    let st: &mut Stab = out.get_mut(&first).expect("recorded");
                    st.accs.extend(in_loop);
                    out.insert(e, Stab { accs: Vec::new(), alias: Some(first) });
                }
                None => {
                    if let Some(b) = max_of {
                        shared.insert(b, e);
                    }
                    out.insert(e, Stab { accs: in_loop, alias: None });
                }
            }
        }
        Ok(out)
    }

    /// The reductions of `ops` that consume `src` linearly, and the first reduction (if any)
    /// that consumes it through a non-linear op. Values after a reduction are scaled, which the
    /// lowering tracks; they do not need to be linear.
    fn linear_reductions(&self, src: NodeId, ops: &[NodeId]) -> (Vec<NodeId>, Option<NodeId>) {
        #[derive(Clone, Copy, PartialEq)]
        enum L {
            /// Independent of the source.
            Free,
            /// Linear in the source.
            Lin,
            /// Depends on the source non-linearly.
            Bad,
            /// Computed from a reduction of the source.
            Scaled,
        }
        let mut state: BTreeMap<NodeId, L> = BTreeMap::new();
        let mut reds = Vec::new();
        let mut bad = None;
        for &id in ops {
            let n = self.g.node(id);
            let a: Vec<L> = n.args.iter().map(|x| state.get(x).copied().unwrap_or(L::Free)).collect();
            let is_reduction = match n.op {
                Op::MatMul => true,
                Op::Reduce(_, axis) => {
                    axis as usize + 1 == self.g.shape(n.args[0]).len() || self.g.node(src).op.is_leaf()
                }
                _ => false,
            };
            let l = if id == src {
                L::Lin
            } else if a.iter().all(|x| *x == L::Free) {
                L::Free
            } else if is_reduction {
                // A matmul must take the source as its left operand: the running max is per
                // row of the left operand.
                let linear = match n.op {
                    Op::MatMul => a[0] == L::Lin && a[1] == L::Free,
                    _ => a[0] == L::Lin,
                };
                if linear {
                    reds.push(id);
                    L::Scaled
                } else if a.contains(&L::Bad) || a.contains(&L::Lin) {
                    bad.get_or_insert(id);
                    L::Bad
                } else {
                    L::Scaled
                }
            } else if a.contains(&L::Bad) {
                L::Bad
            } else if a.contains(&L::Scaled) {
                L::Scaled
            } else {
                match n.op {
                    Op::Unary(UnaryOp::Neg) | Op::Split(_) => L::Lin,
                    Op::Binary(BinaryOp::Mul) if a.contains(&L::Free) => L::Lin,
                    Op::Binary(BinaryOp::Div) if a[1] == L::Free => L::Lin,
                    Op::Binary(BinaryOp::Add | BinaryOp::Sub) if a[0] == L::Lin && a[1] == L::Lin => L::Lin,
                    _ => L::Bad,
                }
            };
            state.insert(id, l);
        }
        (reds, bad)
    }

    /// Stabilized `exp(x)`: masks columns outside the tensor to -inf, updates the running max
    /// (or takes a one-shot max) and returns `exp(x - m)` scaled by `exp(m)`.
    fn stabilize_exp(
        &mut self,
        id: NodeId,
        x: Expr,
        xs: Option<Scale>,
        st: &Stab,
        tm: &TMap,
        body: &mut Vec<Stmt>,
    ) -> Result<Val, Reject> {
        if xs.is_some() {
            return reject("an exp of a scaled value");
        }
        let cols = tm.axes.last().map_or(1, |a| a.extent);
        let limits = tm.axes.last().map(|a| a.limits.clone()).unwrap_or_default();
        let x = if limits.is_empty() { x } else { Expr::MaskCols(Box::new(x), limits, f64::NEG_INFINITY) };
        let xb = self.materialize_named(format!("t{}_x", id.0), x, cols, body);
        let m_tile = self.buf(format!("t{}_mt", id.0), BufKind::Rows);
        body.push(Stmt::RowReduce {
            dst: m_tile,
            op: ReduceOp::Max,
            expr: Expr::reg(xb),
            cols,
            mask: Vec::new(),
            acc: false,
        });
        let m = self.update_max(id, Expr::reg(m_tile), st, body);
        let e = Expr::ExpDiff(Box::new(Expr::reg(xb)), Box::new(Expr::reg(m)));
        Ok(Val::Reg { expr: e, cols, scale: Some(Scale { m, degree: 1 }) })
    }

    fn materialize_named(&mut self, name: String, expr: Expr, cols: u64, body: &mut Vec<Stmt>) -> BufId {
        if let Expr::Src(Src::Reg(b)) = expr {
            return b;
        }
        let kind = if cols == 1 { BufKind::Rows } else { BufKind::Frag { cols } };
        let b = self.buf(name, kind);
        body.push(Stmt::Assign { dst: b, expr });
        b
    }

    /// A scaled partial input `x · exp(m_in)`: merges `m_in` into the running max and returns
    /// `x · exp(m_in - m)` scaled by `exp(m)`.
    fn scaled_input(
        &mut self,
        id: NodeId,
        tile: &Val,
        tm: &TMap,
        max_binding: Binding,
        stab: &BTreeMap<NodeId, Stab>,
        body: &mut Vec<Stmt>,
    ) -> Result<Val, Reject> {
        let Some(st) = stab.get(&id) else {
            return reject("a scaled partial that is not reduced");
        };
        if let Some(first) = st.alias {
            // The earlier partial already folded this iteration's max in; reuse its tile.
            let m = self.running_max[&first];
            let mbuf = self.partial_max_tile[&first];
            let (x, cols, _) = self.as_reg(tile, tm)?;
            let f = Expr::ExpDiff(Box::new(Expr::Src(Src::Tile(mbuf))), Box::new(Expr::reg(m)));
            return Ok(Val::Reg { expr: Expr::bin(BinaryOp::Mul, x, f), cols, scale: Some(Scale { m, degree: 1 }) });
        }
        let mut mtm = tm.clone();
        if let Some(last) = mtm.axes.last_mut() {
            *last = AxisRange::unit();
        }
        let mbuf = self.buf(
            format!("{}_max", self.name_of(id)),
            BufKind::Smem { dtype: DType::F32, rows: tile_2d(&mtm).0, cols: 1 },
        );
        let param = self.param_of[&max_binding];
        body.push(Stmt::Load { dst: mbuf, param, tmap: mtm });
        self.partial_max_tile.insert(id, mbuf);
        let m = self.update_max(id, Expr::Src(Src::Tile(mbuf)), st, body);
        let (x, cols, _) = self.as_reg(tile, tm)?;
        let f = Expr::ExpDiff(Box::new(Expr::Src(Src::Tile(mbuf))), Box::new(Expr::reg(m)));
        Ok(Val::Reg { expr: Expr::bin(BinaryOp::Mul, x, f), cols, scale: Some(Scale { m, degree: 1 }) })
    }

    /// Folds a per-row maximum into the running max of `src` (rescaling its accumulators), or
    /// makes it the one-shot max. Returns the buffer holding the max to subtract.
    fn update_max(&mut self, src: NodeId, m_tile: Expr, st: &Stab, body: &mut Vec<Stmt>) -> BufId {
        let Some(&m) = self.running_max.get(&src).filter(|_| !st.accs.is_empty()) else {
            let m = self.buf(format!("t{}_m", src.0), BufKind::Rows);
            body.push(Stmt::Assign { dst: m, expr: m_tile });
            return m;
        };
        let m_new = self.buf(format!("t{}_mn", src.0), BufKind::Rows);
        body.push(Stmt::Assign { dst: m_new, expr: Expr::bin(BinaryOp::Max, Expr::reg(m), m_tile) });
        let c = self.buf(format!("t{}_c", src.0), BufKind::Rows);
        body.push(Stmt::Assign { dst: c, expr: Expr::ExpDiff(Box::new(Expr::reg(m)), Box::new(Expr::reg(m_new))) });
        for &a in &st.accs {
            if let Some(Val::Reg { expr: Expr::Src(Src::Reg(b)), .. }) = self.vals.get(&a).cloned() {
                body.push(Stmt::Assign { dst: b, expr: Expr::bin(BinaryOp::Mul, Expr::reg(b), Expr::reg(c)) });
            }
        }
        body.push(Stmt::Assign { dst: m, expr: Expr::reg(m_new) });
        m
    }
}

/// A tile's shared-memory shape: its non-last axes flattened into rows, its last axis as
/// columns.
pub fn tile_2d(tm: &TMap) -> (u64, u64) {
    match tm.axes.split_last() {
        None => (1, 1),
        Some((last, rest)) => (rest.iter().map(|a| a.extent).product::<u64>().max(1), last.extent),
    }
}

impl Lowerer<'_> {
    /// Lays warps over the block: down the rows first (so row reductions stay in a warp), and
    /// across columns only when there are too few 16-row tiles and no register tile feeds a
    /// product as its left operand (which would need whole rows in one warp).
    fn warps(&self, cfg: &TileConfig) -> Result<Warps, Reject> {
        let want = cfg.warps.max(1);
        let tiles16 = (self.rows.div_ceil(16)) as u32;
        let m = (1..=want.min(tiles16)).rev().find(|d| tiles16 % d == 0).unwrap_or(1);
        let m_tiles = tiles16 / m;
        let mut n = 1;
        if m < want && want % m == 0 && self.mma_a_frags.is_empty() {
            let cand = want / m;
            let all_cols_split = self.bufs.iter().all(|b| match b.kind {
                BufKind::Frag { cols } => cols % (8 * u64::from(cand)) == 0,
                _ => true,
            });
            if all_cols_split {
                n = cand;
            }
        }
        Ok(Warps { m, n, m_tiles })
    }

    /// Registers per thread at the busiest point of the program: register buffers are live
    /// from their first write to their last read (a loop keeps everything it touches live for
    /// all its iterations), plus the f16 copies of left MMA operands and a fixed allowance for
    /// addresses and loop state.
    fn register_estimate(&self, w: Warps, body: &[Stmt]) -> u64 {
        let rows = 16 * u64::from(w.m_tiles);
        let mut first = vec![usize::MAX; self.bufs.len()];
        let mut last = vec![0usize; self.bufs.len()];
        let mut clock = 0usize;
        lifetimes(body, &mut first, &mut last, &mut clock, &|_| false);
        let cost: Vec<u64> = self
            .bufs
            .iter()
            .enumerate()
            .map(|(i, b)| match b.kind {
                BufKind::Frag { cols } => {
                    let f32s = rows * cols.div_ceil(u64::from(w.n)) / 32;
                    let halves = if self.mma_a_frags.contains(&BufId(i as u32)) { rows * cols / 64 } else { 0 };
                    f32s + halves
                }
                BufKind::Rows => 2 * u64::from(w.m_tiles),
                BufKind::Smem { .. } => 0,
            })
            .collect();
        let peak = (0..=clock)
            .map(|t| (0..self.bufs.len()).filter(|&i| first[i] <= t && t <= last[i]).map(|i| cost[i]).sum::<u64>())
            .max()
            .unwrap_or(0);
        peak + 32
    }
}

/// Assigns shared-memory offsets with a first-fit allocator over buffer lifetimes, and returns
/// the peak (the dynamic shared memory a block needs). A tile used inside a loop stays live
/// for the whole loop; one loaded in a loop is double-buffered.
fn allocate_smem(bufs: &mut [Buf], body: &[Stmt], warps: Warps) -> u64 {
    let mut first = vec![usize::MAX; bufs.len()];
    let mut last = vec![0usize; bufs.len()];
    let mut clock = 0usize;
    lifetimes(body, &mut first, &mut last, &mut clock, &|i| bufs[i].stages > 1);
    let mut order: Vec<usize> =
        (0..bufs.len()).filter(|&i| bufs[i].smem_stage_bytes() > 0 && first[i] != usize::MAX).collect();
    order.sort_by_key(|&i| (first[i], i));
    let mut placed: Vec<(usize, u64, u64)> = Vec::new();
    let mut peak = 0;
    for i in order {
        let size = (bufs[i].smem_stage_bytes() * u64::from(bufs[i].stages)).div_ceil(128) * 128;
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|(j, _, _)| first[*j] <= last[i] && first[i] <= last[*j])
            .map(|(_, off, sz)| (*off, *sz))
            .collect();
        busy.sort_unstable();
        let mut off = 0;
        for (o, s) in busy {
            if off + size <= o {
                break;
            }
            off = off.max(o + s);
        }
        bufs[i].smem_offset = off;
        placed.push((i, off, size));
        peak = peak.max(off + size);
    }
    // Cross-warp row reductions exchange one f32 per row and column-warp.
    if warps.n > 1 {
        peak += 16 * u64::from(warps.m_tiles * warps.m) * u64::from(warps.n) * 4;
    }
    peak
}

/// First and last use of every buffer, on a clock that ticks once per statement. A buffer
/// defined before a loop and used in it is live for the whole loop (it carries across
/// iterations); so is one that `whole_loop` says must be (double-buffered tiles). A value
/// computed and consumed within one iteration keeps its short range.
fn lifetimes(
    body: &[Stmt],
    first: &mut [usize],
    last: &mut [usize],
    clock: &mut usize,
    whole_loop: &dyn Fn(usize) -> bool,
) {
    let touch = |b: BufId, t: usize, first: &mut [usize], last: &mut [usize]| {
        let i = b.0 as usize;
        first[i] = first[i].min(t);
        last[i] = last[i].max(t);
    };
    for s in body {
        *clock += 1;
        let t = *clock;
        match s {
            Stmt::Load { dst, .. } => touch(*dst, t, first, last),
            Stmt::Assign { dst, expr } => {
                touch(*dst, t, first, last);
                let mut v = Vec::new();
                expr.bufs(&mut v);
                v.into_iter().for_each(|b| touch(b, t, first, last));
            }
            Stmt::RowReduce { dst, expr, .. } => {
                touch(*dst, t, first, last);
                let mut v = Vec::new();
                expr.bufs(&mut v);
                v.into_iter().for_each(|b| touch(b, t, first, last));
            }
            Stmt::Mma { acc, a, b, .. } => {
                touch(*acc, t, first, last);
                match a {
                    MmaA::Smem { buf, .. } | MmaA::Frag(buf) => touch(*buf, t, first, last),
                }
                touch(b.buf, t, first, last);
            }
            Stmt::Store { expr, staging, .. } => {
                let mut v = Vec::new();
                expr.bufs(&mut v);
                v.extend(*staging);
                v.into_iter().for_each(|b| touch(b, t, first, last));
            }
            Stmt::Loop { body, .. } => {
                let start = t;
                let before: Vec<usize> = last.to_vec();
                lifetimes(body, first, last, clock, whole_loop);
                let end = *clock;
                for i in 0..first.len() {
                    let used_inside = last[i] != before[i] || (first[i] >= start && first[i] <= end);
                    if used_inside && (first[i] < start || whole_loop(i)) {
                        first[i] = first[i].min(start);
                        last[i] = last[i].max(end);
                    }
                }
            }
        }
    }
}

/// The dims a kernel takes as arguments: the dynamic ones it uses, with a split chunk replaced
/// by the axis and count it derives from (the kernel computes `ceil(K / s)` itself).
fn runtime_extents(g: &Graph, used: &BTreeSet<DimVar>) -> BTreeSet<DimVar> {
    let mut out = BTreeSet::new();
    for &d in used {
        match g.dims.get(d).kind {
            crate::graph::DimKind::SplitChunk { of, count } => {
                out.extend([of, count].into_iter().filter(|v| g.dims.get(*v).dynamic));
            }
            _ if g.dims.get(d).dynamic => {
                out.insert(d);
            }
            _ => {}
        }
    }
    out
}

/// The dynamic dims a kernel reads at run time: loop trip counts, limits, scaled offsets.
fn collect_extents(body: &[Stmt], out: &mut BTreeSet<DimVar>) {
    fn affine(a: &Affine, out: &mut BTreeSet<DimVar>) {
        for t in &a.terms {
            if let Some(d) = t.scale {
                out.insert(d);
            }
        }
    }
    fn tmap(tm: &TMap, out: &mut BTreeSet<DimVar>) {
        for ax in &tm.axes {
            affine(&ax.offset, out);
            for l in &ax.limits {
                out.insert(l.bound);
                affine(&l.base, out);
            }
        }
    }
    fn expr(e: &Expr, out: &mut BTreeSet<DimVar>) {
        match e {
            Expr::Src(Src::Extent(d)) => {
                out.insert(*d);
            }
            Expr::Src(_) => {}
            Expr::Unary(_, a) => expr(a, out),
            Expr::Binary(_, a, b) | Expr::ExpDiff(a, b) => {
                expr(a, out);
                expr(b, out);
            }
            Expr::MaskCols(a, limits, _) => {
                expr(a, out);
                for l in limits {
                    out.insert(l.bound);
                    affine(&l.base, out);
                }
            }
        }
    }
    for s in body {
        match s {
            Stmt::Load { tmap: tm, .. } => tmap(tm, out),
            Stmt::Store { tmap: tm, expr: e, .. } => {
                tmap(tm, out);
                expr(e, out);
            }
            Stmt::Assign { expr: e, .. } => expr(e, out),
            Stmt::RowReduce { expr: e, mask, .. } => {
                expr(e, out);
                for l in mask {
                    out.insert(l.bound);
                    affine(&l.base, out);
                }
            }
            Stmt::Mma { .. } => {}
            Stmt::Loop { dim, body, .. } => {
                out.insert(*dim);
                collect_extents(body, out);
            }
        }
    }
}
