//! The fallback: any valid graph as a sequence of stage kernels, correct by construction.
//!
//! Every reduction (a `reduce` or a `matmul`) is a stage of its own, and every graph output is
//! one more stage. A stage kernel gives each thread one element of the tensor it writes; the
//! thread evaluates the element's expression tree, which inlines every elementwise op and view
//! between the stage's reduction and the leaves (inputs, constants, and the workspaces of the
//! stages before it), and loops over the reduced axis itself. Broadcasting, transposes, any
//! reduction axis and any mix of dtypes are index arithmetic and conversions at the loads.
//!
//! A reduction over a long axis with few elements to reduce into (a softmax's row sums over a
//! vocabulary) would leave most of the GPU idle and run one long dependent chain per thread, so
//! such a stage may give each element a warp or a whole block instead ([`LANES`]): lane `t` of
//! `L` reduces entries `t, t + L, ...` and the lanes fold their partials in a fixed order
//! (halves within a warp, then the warps' results), so the result is the same on every run.
//! The fallback chooses the count by the cost model, among those whose lanes read consecutive
//! addresses ([`StageKernel::may_cooperate`]).
//!
//! All arithmetic is in extended-exponent floats ([`crate::xfloat::X32`]; `cleave::xf` in the
//! generated CUDA): f32 precision with no overflow, so an exp needs no running max, and the
//! workspaces between stages hold such values (8 bytes each). The fused schedules are ranked
//! against this one by the cost model; this one always exists.
//!
//! Dims whose extent differs between requests (ragged, paged) are laid out by position: the
//! first such dim of a tensor is packed with its batch (request `b`'s element `i` at position
//! `start(b) + i` of the dim's slots: the packed total of a ragged dim, every slot of the page
//! table's entries for a paged one), and any other is padded to its slots. A stage's grid runs
//! over those positions, finds each one's request by binary search over the indptr, and leaves
//! out positions past their request's length; a reduction over such a dim loops over the
//! request's own length.

use std::collections::BTreeMap;

use super::error::PlanError;
use super::partition::{Workspace, WorkspaceType};
use super::program::{Binding, GridAxis, Param, ParamId};
use crate::graph::{
    BinaryOp, DType, Dim, DimTable, DimVar, Graph, Mask, NodeId, Op, PerRequestKind, ReduceOp, UnaryOp, ValidGraph,
};
use crate::index::IterId;

/// Threads per block of a stage kernel.
pub const STAGE_THREADS: u64 = 256;

/// How many steps of a stage's loop the generated code unrolls, so that a thread has that many
/// loads in flight: its chain waits out a memory latency once per that many steps.
pub const STAGE_UNROLL: u32 = 4;

/// The numbers of threads that may share one element's reduction: one thread, a warp, or a
/// whole block of [`STAGE_THREADS`].
pub const LANES: [u32; 3] = [1, 32, 256];

/// The first iterator of the grid axes over per-request slots: `SLOT_ITERS + 2 * axis + k` for
/// the `k`-th slot axis of space axis `axis` (the space's own axes use their index).
pub const SLOT_ITERS: u32 = 1 << 16;

/// Which element of a loaded tensor, per axis.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ix {
    /// Index 0 (a unit or broadcast axis).
    Zero,
    /// The thread's index along axis `k` of the written tensor.
    Out(u32),
    /// The stage's loop over its reduced axis.
    Loop,
}

/// The value of one element, as an expression tree.
#[derive(Clone, PartialEq, Debug)]
pub enum SExpr {
    /// A constant.
    Const(f64),
    /// An element of a kernel parameter, indexed per axis.
    Load {
        /// The parameter.
        param: ParamId,
        /// One index per axis of the parameter.
        index: Vec<Ix>,
    },
    /// An elementwise op of one operand.
    Unary(UnaryOp, Box<SExpr>),
    /// An elementwise op of two operands.
    Binary(BinaryOp, Box<SExpr>, Box<SExpr>),
    /// The value where the mask keeps element `(row, col)` of a `rows × cols` matrix, else
    /// `-inf`.
    Mask {
        /// Which mask.
        mask: Mask,
        /// The value.
        value: Box<SExpr>,
        /// The element's row index.
        row: Ix,
        /// Its column index.
        col: Ix,
        /// The rows' extent.
        rows: Dim,
        /// The columns' extent.
        cols: Dim,
        /// The request of the element, when an extent differs between requests: the index of
        /// its batch axis.
        batch: Option<Ix>,
    },
    /// The stage's reduction: `op` over `body` for every value of the loop index below
    /// `extent`. Only the root of a stage's tree is one.
    Reduce {
        /// Sum, max or mean.
        op: ReduceOp,
        /// The reduced axis' extent.
        extent: Dim,
        /// For an extent that differs between requests: the index of the request (its batch
        /// axis) whose length the loop runs to.
        batch: Option<Ix>,
        /// The reduced value, in terms of [`Ix::Loop`].
        body: Box<SExpr>,
    },
}

/// How one axis of a tensor the fallback lays out itself (a stage's space, a workspace) is
/// stored, when some of its dims differ between requests.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PosAxis {
    /// An ordinary axis.
    Dense(Dim),
    /// The batch of the packed dim: its index is the request the position belongs to.
    Folded,
    /// The first per-request dim: request `b`'s element `i` at position `start(b) + i` of the
    /// dim's [`slots`].
    Packed(DimVar),
    /// Another per-request dim: element `i` at position `i`, below the dim's [`slots`].
    Padded(DimVar),
}

/// The positions of per-request dim `v`, as the axes that count them: the packed total of a
/// ragged dim; the page table's entries and the page's slots for a paged one.
pub fn slots(dims: &DimTable, v: DimVar) -> Result<Vec<Dim>, PlanError> {
    let pr = dims.get(v).per_request.as_ref().ok_or(PlanError::PerRequest("a per-request dim without its facts"))?;
    match &pr.kind {
        PerRequestKind::Ragged { total: Some(t), .. } => Ok(vec![Dim::Var(*t)]),
        PerRequestKind::Ragged { total: None, .. } => {
            Err(PlanError::PerRequest("a ragged dim no tensor packs (its total is unknown)"))
        }
        PerRequestKind::Paged { indices, page_size, .. } => {
            let size = if *page_size == 1 {
                Dim::One
            } else {
                // The storage of a paged tensor names its page size as a static dim.
                let found = dims.iter().find(|(_, d)| !d.dynamic && d.per_request.is_none() && d.value == *page_size);
                Dim::Var(found.map(|(s, _)| s).ok_or(PlanError::PerRequest("a page size that is not a dim"))?)
            };
            Ok(vec![Dim::Var(indices.len), size])
        }
    }
}

/// The layout of a tensor of `shape` that the fallback stores itself: `None` when no dim
/// differs between requests.
pub fn positions(dims: &DimTable, shape: &[Dim]) -> Result<Option<Vec<PosAxis>>, PlanError> {
    let first = shape.iter().find_map(|d| d.var().filter(|v| dims.get(*v).per_request.is_some()));
    let Some(first) = first else { return Ok(None) };
    let batch = dims.get(first).per_request.as_ref().map(|p| p.batch).expect("per-request");
    if !shape.contains(&Dim::Var(batch)) {
        return Err(PlanError::PerRequest("a per-request dim without its batch axis"));
    }
    Ok(Some(
        shape
            .iter()
            .map(|d| match d.var() {
                Some(v) if v == first => PosAxis::Packed(v),
                Some(v) if v == batch => PosAxis::Folded,
                Some(v) if dims.get(v).per_request.is_some() => PosAxis::Padded(v),
                _ => PosAxis::Dense(*d),
            })
            .collect(),
    ))
}

/// The buffer axes of a tensor laid out by [`positions`]: the slots of each per-request dim in
/// place of it, nothing for the folded batch.
pub fn position_storage(dims: &DimTable, axes: &[PosAxis]) -> Result<Vec<Dim>, PlanError> {
    let mut out = Vec::new();
    for a in axes {
        match a {
            PosAxis::Dense(d) => out.push(*d),
            PosAxis::Folded => {}
            PosAxis::Packed(v) | PosAxis::Padded(v) => out.extend(slots(dims, *v)?),
        }
    }
    Ok(out)
}

/// One stage: every element of one tensor.
#[derive(Clone, PartialEq, Debug)]
pub struct StageKernel {
    /// Entry point name, given when the launch is assembled.
    pub symbol: String,
    /// Global tensors, in parameter order; workspaces hold extended-exponent values.
    pub params: Vec<Param>,
    /// Dims whose runtime extents the kernel needs, in parameter order after the tensors.
    pub extents: Vec<DimVar>,
    /// The grid: one axis per non-unit axis of the written tensor, the last fastest.
    pub grid: Vec<GridAxis>,
    /// The written tensor's axes (its index space).
    pub space: Vec<Dim>,
    /// With per-request dims: how the grid covers the space (one entry per space axis; the grid
    /// axes of a per-request dim's slots have iterators from [`SLOT_ITERS`] up).
    pub positions: Option<Vec<PosAxis>>,
    /// Elements of the last axis and of the one before it that a block covers.
    pub block: [u64; 2],
    /// Threads that share each element's reduction ([`LANES`]): 1, or a warp or a whole block
    /// that stride through the reduced axis together and fold their partials in a fixed
    /// order (see [`StageKernel::cooperate`]).
    pub lanes: u32,
    /// The written parameter.
    pub out: ParamId,
    /// The value of the element at the thread's index.
    pub value: SExpr,
}

impl StageKernel {
    /// Threads per block.
    pub fn threads(&self) -> u32 {
        (self.block[0] * self.block[1]) as u32 * self.lanes
    }

    /// Dynamic shared memory per block, bytes: one extended-exponent partial per warp when a
    /// whole block shares an element.
    pub fn smem_bytes(&self) -> u64 {
        if self.lanes > 32 {
            u64::from(self.lanes / 32) * 8
        } else {
            0
        }
    }

    /// Whether lanes may share this stage's reduction: it is one, and every load that moves
    /// with its loop walks the load's last axis, so that a warp's lanes read consecutive
    /// elements. (Where the loop walks another axis, neighbouring elements are what is
    /// contiguous, and one thread per element already reads memory in order.)
    pub fn may_cooperate(&self) -> bool {
        fn walks_last(e: &SExpr) -> bool {
            match e {
                SExpr::Const(_) => true,
                SExpr::Load { index, .. } => {
                    !index.contains(&Ix::Loop)
                        || (index.last() == Some(&Ix::Loop) && index.iter().filter(|i| **i == Ix::Loop).count() == 1)
                }
                SExpr::Unary(_, a) | SExpr::Mask { value: a, .. } => walks_last(a),
                SExpr::Binary(_, a, b) => walks_last(a) && walks_last(b),
                SExpr::Reduce { .. } => false,
            }
        }
        match &self.value {
            SExpr::Reduce { body, .. } => walks_last(body),
            _ => false,
        }
    }

    /// The same stage with `lanes` threads to each element: a block keeps [`STAGE_THREADS`]
    /// threads and so covers `STAGE_THREADS / lanes` elements, laid out as [`stages`] lays
    /// them out.
    pub fn cooperate(mut self, lanes: u32, dims: &DimTable) -> StageKernel {
        let n = self.grid.len();
        let rep = |a: &GridAxis| dims.get(a.dim).value;
        let [w, rows] = block_shape(
            STAGE_THREADS / u64::from(lanes),
            self.grid.last().map_or(1, rep),
            if n >= 2 { Some(rep(&self.grid[n - 2])) } else { None },
        );
        for (i, a) in self.grid.iter_mut().enumerate() {
            a.tile = if i + 1 == n {
                w
            } else if i + 2 == n {
                rows
            } else {
                1
            };
        }
        self.block = [w, rows];
        self.lanes = lanes;
        self
    }

    /// The stage as one line of pseudocode: `out[o0, o1] = sum(r < k: ...)`.
    pub fn show(&self, dims: &DimTable) -> String {
        let ix = |i: &Ix| match i {
            Ix::Zero => "0".to_string(),
            Ix::Out(j) => format!("o{j}"),
            Ix::Loop => "r".to_string(),
        };
        fn go(k: &StageKernel, e: &SExpr, dims: &DimTable, ix: &dyn Fn(&Ix) -> String) -> String {
            match e {
                SExpr::Const(c) => format!("{c:?}"),
                SExpr::Load { param, index } => {
                    let idx: Vec<String> = index.iter().map(ix).collect();
                    format!("{}[{}]", k.params[param.0 as usize].name, idx.join(", "))
                }
                SExpr::Unary(UnaryOp::Neg, a) => format!("-{}", go(k, a, dims, ix)),
                SExpr::Unary(u, a) => format!("{}({})", u.name(), go(k, a, dims, ix)),
                SExpr::Binary(BinaryOp::Max, a, b) => format!("max({}, {})", go(k, a, dims, ix), go(k, b, dims, ix)),
                SExpr::Binary(op, a, b) => {
                    format!("({} {} {})", go(k, a, dims, ix), op.symbol().unwrap_or("?"), go(k, b, dims, ix))
                }
                SExpr::Reduce { op, extent, body, .. } => {
                    let n = dims.show(&[*extent]);
                    format!("{}(r < {}: {})", op.name(), n.trim_matches(['[', ']']), go(k, body, dims, ix))
                }
                SExpr::Mask { mask, value, .. } => {
                    format!("{}({}{})", mask.name(), go(k, value, dims, ix), mask.arguments())
                }
            }
        }
        let out = &self.params[self.out.0 as usize];
        let idx: Vec<String> = self
            .space
            .iter()
            .enumerate()
            .map(|(j, d)| if *d == Dim::One { "0".to_string() } else { format!("o{j}") })
            .collect();
        let shared = if self.lanes > 1 { format!(", {} to an element", self.lanes) } else { String::new() };
        format!(
            "{}[{}] = {}  # {} threads per block{shared}, extended-exponent arithmetic",
            out.name,
            idx.join(", "),
            go(self, &self.value, dims, &ix),
            self.threads()
        )
    }
}

/// What a stage writes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Target {
    /// The workspace of a reduction node, for later stages.
    Workspace(NodeId),
    /// Graph output `o`.
    Output(usize),
}

struct Builder<'a> {
    g: &'a Graph,
    /// The workspace of each reduction node later stages read, in the order requested.
    workspaces: BTreeMap<NodeId, u32>,
    pending: Vec<NodeId>,
}

impl Builder<'_> {
    /// The index of the request of a tensor of `shape` at `at`, when one of `extents` differs
    /// between requests: the index of that dim's batch axis.
    fn request_of(&self, extents: &[Dim], shape: &[Dim], at: &[Ix]) -> Result<Option<Ix>, PlanError> {
        let Some(pr) = extents.iter().find_map(|d| self.g.dims.per_request(*d)) else { return Ok(None) };
        let axis = shape
            .iter()
            .position(|d| *d == Dim::Var(pr.batch))
            .ok_or(PlanError::PerRequest("a per-request extent without its batch axis"))?;
        match at[axis] {
            Ix::Loop => Err(PlanError::PerRequest("a reduction over the requests of a per-request dim")),
            ix => Ok(Some(ix)),
        }
    }

    /// The index of each axis of `arg` when its consumer, of `rank` axes, is at `at`
    /// (right-aligned broadcasting: a unit axis reads index 0).
    fn broadcast(&self, arg: NodeId, at: &[Ix]) -> Vec<Ix> {
        let shape = self.g.shape(arg);
        let off = at.len() - shape.len();
        shape.iter().enumerate().map(|(j, d)| if *d == Dim::One { Ix::Zero } else { at[j + off] }).collect()
    }

    /// The expression of `id`'s element at `at`. `root` is the stage's own node: a reduction
    /// there is the stage's loop; a reduction anywhere else is read from its workspace.
    fn expr(&mut self, id: NodeId, at: &[Ix], root: NodeId, params: &mut Params<'_>) -> Result<SExpr, PlanError> {
        let n = self.g.node(id);
        let rank = n.shape.len();
        Ok(match n.op {
            Op::Const(c) => SExpr::Const(c),
            Op::Input(i) => SExpr::Load { param: params.get(Binding::Input(i)), index: at.to_vec() },
            Op::Unary(u) => SExpr::Unary(u, Box::new(self.expr(n.args[0], at, root, params)?)),
            Op::Mask(mask) => SExpr::Mask {
                mask,
                value: Box::new(self.expr(n.args[0], at, root, params)?),
                row: at[rank - 2],
                col: at[rank - 1],
                rows: n.shape[rank - 2],
                cols: n.shape[rank - 1],
                batch: self.request_of(&n.shape[rank - 2..], &n.shape, at)?,
            },
            Op::Binary(b) => {
                let (x, y) = (self.broadcast(n.args[0], at), self.broadcast(n.args[1], at));
                let x = self.expr(n.args[0], &x, root, params)?;
                let y = self.expr(n.args[1], &y, root, params)?;
                SExpr::Binary(b, Box::new(x), Box::new(y))
            }
            Op::Transpose => {
                let mut t = at.to_vec();
                t.swap(rank - 1, rank - 2);
                self.expr(n.args[0], &t, root, params)?
            }
            Op::Split(_) => return Err(PlanError::StageOfSplit),
            Op::Reduce(..) | Op::MatMul if id != root => {
                let w = match self.workspaces.get(&id) {
                    Some(w) => *w,
                    None => {
                        let w = self.workspaces.len() as u32;
                        self.workspaces.insert(id, w);
                        self.pending.push(id);
                        w
                    }
                };
                SExpr::Load { param: params.get(Binding::Workspace(w)), index: at.to_vec() }
            }
            Op::Reduce(op, axis) => {
                let mut inner = at.to_vec();
                inner[axis as usize] = Ix::Loop;
                let body = self.expr(n.args[0], &inner, root, params)?;
                let shape = self.g.shape(n.args[0]);
                let extent = shape[axis as usize];
                let batch = self.request_of(&[extent], shape, at)?;
                SExpr::Reduce { op, extent, batch, body: Box::new(body) }
            }
            Op::MatMul => {
                // out[.., i, j] = sum over k of a[.., i, k] * b[.., k, j], batch axes broadcast.
                let operand = |arg: NodeId, last2: [Ix; 2]| -> Vec<Ix> {
                    let mut batch = at[..rank - 2].to_vec();
                    batch.extend(last2);
                    let shape = self.g.shape(arg);
                    let off = batch.len() - shape.len();
                    shape
                        .iter()
                        .enumerate()
                        .map(|(j, d)| if *d == Dim::One { Ix::Zero } else { batch[j + off] })
                        .collect()
                };
                let ia = operand(n.args[0], [at[rank - 2], Ix::Loop]);
                let ib = operand(n.args[1], [Ix::Loop, at[rank - 1]]);
                let a = self.expr(n.args[0], &ia, root, params)?;
                let b = self.expr(n.args[1], &ib, root, params)?;
                let a_shape = self.g.shape(n.args[0]);
                let extent = a_shape[a_shape.len() - 1];
                let batch = self.request_of(&[extent], a_shape, &ia)?;
                SExpr::Reduce {
                    op: ReduceOp::Sum,
                    extent,
                    batch,
                    body: Box::new(SExpr::Binary(BinaryOp::Mul, Box::new(a), Box::new(b))),
                }
            }
        })
    }
}

/// The parameters of one stage, added as they are first used.
struct Params<'a> {
    g: &'a Graph,
    list: Vec<Param>,
}

impl Params<'_> {
    fn get(&mut self, b: Binding) -> ParamId {
        if let Some(i) = self.list.iter().position(|p| p.binding == b) {
            return ParamId(i as u32);
        }
        let (name, dtype, shape, output, layout) = match b {
            Binding::Input(i) => {
                let d = &self.g.inputs[i as usize].decl;
                (d.name.clone(), d.dtype, d.shape.clone(), false, d.layout.clone())
            }
            Binding::Output(o) => {
                let d = &self.g.outputs[o as usize].decl;
                (d.name.clone(), d.dtype, d.shape.clone(), true, d.layout.clone())
            }
            // Workspaces are read here (the stage that writes one adds it as its output first);
            // their shapes are filled in once every workspace is known.
            Binding::Workspace(w) => (format!("ws{w}"), DType::F32, Vec::new(), false, None),
        };
        self.list.push(Param {
            name,
            dtype,
            shape: shape.iter().map(|d| d.var()).collect(),
            output,
            binding: b,
            layout,
        });
        ParamId(self.list.len() as u32 - 1)
    }
}

/// A block of up to `budget` elements: as many of the last grid axis (of representative
/// extent `last`) as it has, and when that is narrower, rows of the axis before it.
fn block_shape(budget: u64, last: u64, before: Option<u64>) -> [u64; 2] {
    let w = last.next_power_of_two().min(budget);
    let rows = before.map_or(1, |b| (budget / w).min(b.next_power_of_two()));
    [w, rows]
}

/// The index of the thread's element along every axis of `space`.
fn out_index(space: &[Dim]) -> Vec<Ix> {
    space.iter().enumerate().map(|(j, d)| if *d == Dim::One { Ix::Zero } else { Ix::Out(j as u32) }).collect()
}

/// The stages of `g`, in launch order, and the workspaces between them.
pub fn stages(g: &ValidGraph) -> Result<(Vec<StageKernel>, Vec<Workspace>), PlanError> {
    let mut b = Builder { g, workspaces: BTreeMap::new(), pending: Vec::new() };
    // Outputs first, to learn which reductions later stages need; then those, until every
    // workspace read has a stage that writes it.
    let mut built: Vec<(Target, Vec<Dim>, SExpr, Vec<Param>)> = Vec::new();
    let users = g.users();
    for (o, out) in g.outputs.iter().enumerate() {
        let space = out.decl.shape.clone();
        // A graph output's tree rooted at the output node: its reduction, if it is one, is the
        // stage's loop, unless other stages read it too (then the output copies the workspace).
        let mut params = Params { g, list: Vec::new() };
        params.get(Binding::Output(o as u32));
        let at = node_index(g, out.node, &space);
        let root = if users[out.node.index()].is_empty() { out.node } else { NodeId(u32::MAX) };
        let value = b.expr(out.node, &at, root, &mut params)?;
        built.push((Target::Output(o), space, value, params.list));
    }
    let mut done = 0;
    let mut workspace_exprs: Vec<(NodeId, SExpr, Vec<Param>)> = Vec::new();
    while done < b.pending.len() {
        let id = b.pending[done];
        done += 1;
        let w = b.workspaces[&id];
        let shape = g.shape(id).to_vec();
        let mut params = Params { g, list: Vec::new() };
        params.list.push(Param {
            name: format!("ws{w}"),
            dtype: DType::F32,
            shape: shape.iter().map(|d| d.var()).collect(),
            output: true,
            binding: Binding::Workspace(w),
            layout: None,
        });
        let value = b.expr(id, &out_index(&shape), id, &mut params)?;
        workspace_exprs.push((id, value, params.list));
    }
    for (id, value, params) in workspace_exprs {
        built.push((Target::Workspace(id), g.shape(id).to_vec(), value, params));
    }
    // Workspace parameters whose shape the builder did not know yet get it now.
    let ws_shape: BTreeMap<u32, Vec<Dim>> = b.workspaces.iter().map(|(id, w)| (*w, g.shape(*id).to_vec())).collect();
    // Launch order: each reduction's stage before every stage that reads it (node order), and
    // the outputs last.
    built.sort_by_key(|(t, ..)| match t {
        Target::Workspace(id) => (0, id.0 as usize),
        Target::Output(o) => (1, *o),
    });
    let mut workspaces = Vec::with_capacity(ws_shape.len());
    for (w, shape) in &ws_shape {
        let storage = match positions(&g.dims, shape)? {
            Some(axes) => Some(position_storage(&g.dims, &axes)?),
            None => None,
        };
        workspaces.push(Workspace {
            name: format!("ws{w}"),
            shape: shape.clone(),
            node: b.workspaces.iter().find(|(_, x)| *x == w).map(|(id, _)| *id),
            ty: WorkspaceType::Extended,
            storage,
        });
    }
    let kernels = built
        .into_iter()
        .map(|(_, space, value, mut params)| {
            for p in &mut params {
                if let Binding::Workspace(w) = p.binding {
                    p.shape = ws_shape[&w].iter().map(|d| d.var()).collect();
                }
            }
            kernel(g, space, value, params)
        })
        .collect::<Result<_, _>>()?;
    Ok((kernels, workspaces))
}

/// The index of `node`'s element that output element `space` corresponds to: the output's
/// declared shape drops the leading unit axes a combine's result may carry.
fn node_index(g: &Graph, node: NodeId, space: &[Dim]) -> Vec<Ix> {
    let shape = g.shape(node);
    let full = out_index(space);
    let mut at = vec![Ix::Zero; shape.len().saturating_sub(full.len())];
    at.extend(full);
    at
}

/// A stage kernel writing `params[0]` over `space`.
fn kernel(g: &Graph, space: Vec<Dim>, value: SExpr, params: Vec<Param>) -> Result<StageKernel, PlanError> {
    let rep = |d: Dim| match d {
        Dim::One => 1,
        Dim::Var(v) => g.dims.get(v).value,
    };
    let positions = positions(&g.dims, &space)?;
    // The grid's axes, outermost first: the space's own axes, or the slots of a per-request
    // dim in its place (its folded batch has none).
    let mut axes: Vec<(IterId, DimVar)> = Vec::new();
    for (j, d) in space.iter().enumerate() {
        match positions.as_ref().map(|p| p[j]) {
            None | Some(PosAxis::Dense(_)) => {
                if let Dim::Var(v) = *d {
                    axes.push((IterId(j as u32), v));
                }
            }
            Some(PosAxis::Folded) => {}
            Some(PosAxis::Packed(v) | PosAxis::Padded(v)) => {
                for (k, slot) in slots(&g.dims, v)?.into_iter().enumerate() {
                    if let Dim::Var(sv) = slot {
                        axes.push((IterId(SLOT_ITERS + 2 * j as u32 + k as u32), sv));
                    }
                }
            }
        }
    }
    let n = axes.len();
    let last = if n >= 1 { rep(Dim::Var(axes[n - 1].1)) } else { 1 };
    let [w, rows] = block_shape(STAGE_THREADS, last, (n >= 2).then(|| rep(Dim::Var(axes[n - 2].1))));
    let grid: Vec<GridAxis> = axes
        .iter()
        .enumerate()
        .map(|(i, (iter, dim))| {
            let tile = if i + 1 == n {
                w
            } else if i + 2 == n {
                rows
            } else {
                1
            };
            GridAxis { iter: *iter, dim: *dim, tile }
        })
        .collect();
    // Every per-request dim the stage touches brings its tables, and the extents that bound
    // them; the per-request dims themselves are never passed (each request has its own).
    let mut used: std::collections::BTreeSet<DimVar> = std::collections::BTreeSet::new();
    let mut extents = std::collections::BTreeSet::new();
    let mut dims = |d: Dim| {
        if let Dim::Var(v) = d {
            let info = g.dims.get(v);
            if info.per_request.is_some() {
                used.insert(v);
            } else if info.dynamic {
                extents.insert(v);
            }
        }
    };
    space.iter().copied().for_each(&mut dims);
    grid.iter().for_each(|a| dims(Dim::Var(a.dim)));
    for p in &params {
        p.shape.iter().flatten().for_each(|v| dims(Dim::Var(*v)));
        for a in p.layout.iter().flat_map(|l| &l.axes) {
            if let crate::graph::StoreAxis::Pages { pages, .. } | crate::graph::StoreAxis::Packed { total: pages, .. } =
                a
            {
                dims(Dim::Var(*pages));
            }
        }
    }
    fn reduce_dims(e: &SExpr, f: &mut dyn FnMut(Dim)) {
        match e {
            SExpr::Reduce { extent, body, .. } => {
                f(*extent);
                reduce_dims(body, f);
            }
            SExpr::Unary(_, a) => reduce_dims(a, f),
            SExpr::Mask { value, rows, cols, .. } => {
                f(*rows);
                f(*cols);
                reduce_dims(value, f);
            }
            SExpr::Binary(_, a, b) => {
                reduce_dims(a, f);
                reduce_dims(b, f);
            }
            SExpr::Const(_) | SExpr::Load { .. } => {}
        }
    }
    reduce_dims(&value, &mut dims);
    let mut params = Params { g, list: params };
    for v in &used {
        let pr = g.dims.get(*v).per_request.as_ref().expect("per-request");
        for t in pr.tables() {
            params.get(Binding::Input(t.input));
            extents.insert(t.len);
        }
        extents.insert(pr.batch);
        for s in slots(&g.dims, *v)? {
            if let Dim::Var(sv) = s {
                if g.dims.get(sv).dynamic {
                    extents.insert(sv);
                }
            }
        }
    }
    Ok(StageKernel {
        symbol: String::new(),
        params: params.list,
        extents: extents.into_iter().collect(),
        grid,
        space,
        positions,
        block: [w, rows],
        lanes: 1,
        out: ParamId(0),
        value,
    })
}
