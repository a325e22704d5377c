//! The fallback: any valid graph as a sequence of stage kernels, correct by construction.
//!
//! Every reduction (a `reduce` or a `matmul`) is a stage of its own, and every graph output is
//! one more stage. A stage kernel gives each thread one element of the tensor it writes; the
//! thread evaluates the element's expression tree, which inlines every elementwise op and view
//! between the stage's reduction and the leaves (inputs, constants, and the workspaces of the
//! stages before it), and loops over the reduced axis itself. Broadcasting, transposes, any
//! reduction axis and any mix of dtypes are index arithmetic and conversions at the loads.
//!
//! All arithmetic is in extended-exponent floats ([`crate::xfloat::X32`]; `cleave::xf` in the
//! generated CUDA): f32 precision with no overflow, so an exp needs no running max, and the
//! workspaces between stages hold such values (8 bytes each). The fused schedules are ranked
//! against this one by the cost model; this one always exists.

use std::collections::BTreeMap;

use super::error::PlanError;
use super::partition::{Workspace, WorkspaceType};
use super::program::{Binding, GridAxis, Param, ParamId};
use crate::graph::{BinaryOp, DType, Dim, DimTable, DimVar, Graph, Mask, NodeId, Op, ReduceOp, UnaryOp, ValidGraph};
use crate::index::IterId;

/// Threads per block of a stage kernel.
pub const STAGE_THREADS: u64 = 256;

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
    },
    /// The stage's reduction: `op` over `body` for every value of the loop index below
    /// `extent`. Only the root of a stage's tree is one.
    Reduce {
        /// Sum, max or mean.
        op: ReduceOp,
        /// The reduced axis' extent.
        extent: Dim,
        /// The reduced value, in terms of [`Ix::Loop`].
        body: Box<SExpr>,
    },
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
    /// Elements of the last axis and of the one before it that a block covers.
    pub block: [u64; 2],
    /// The written parameter.
    pub out: ParamId,
    /// The value of the element at the thread's index.
    pub value: SExpr,
}

impl StageKernel {
    /// Threads per block.
    pub fn threads(&self) -> u32 {
        (self.block[0] * self.block[1]) as u32
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
                SExpr::Reduce { op, extent, body } => {
                    let n = dims.show(&[*extent]);
                    format!("{}(r < {}: {})", op.name(), n.trim_matches(['[', ']']), go(k, body, dims, ix))
                }
                SExpr::Mask { mask, value, .. } => format!("{}({})", mask.name(), go(k, value, dims, ix)),
            }
        }
        let out = &self.params[self.out.0 as usize];
        let idx: Vec<String> = self
            .space
            .iter()
            .enumerate()
            .map(|(j, d)| if *d == Dim::One { "0".to_string() } else { format!("o{j}") })
            .collect();
        format!(
            "{}[{}] = {}  # {} threads per block, extended-exponent arithmetic",
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
                let extent = self.g.shape(n.args[0])[axis as usize];
                SExpr::Reduce { op, extent, body: Box::new(body) }
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
                SExpr::Reduce {
                    op: ReduceOp::Sum,
                    extent,
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

/// The index of the thread's element along every axis of `space`.
fn out_index(space: &[Dim]) -> Vec<Ix> {
    space.iter().enumerate().map(|(j, d)| if *d == Dim::One { Ix::Zero } else { Ix::Out(j as u32) }).collect()
}

/// The stages of `g`, in launch order, and the workspaces between them.
pub fn stages(g: &ValidGraph) -> Result<(Vec<StageKernel>, Vec<Workspace>), PlanError> {
    if g.dims.has_per_request() {
        return Err(PlanError::PerRequest("the fallback stages have no work list for per-request dims"));
    }
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
    let workspaces = ws_shape
        .iter()
        .map(|(w, shape)| Workspace {
            name: format!("ws{w}"),
            shape: shape.clone(),
            node: b.workspaces.iter().find(|(_, x)| *x == w).map(|(id, _)| *id),
            ty: WorkspaceType::Extended,
        })
        .collect();
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
        .collect();
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
fn kernel(g: &Graph, space: Vec<Dim>, value: SExpr, params: Vec<Param>) -> StageKernel {
    let rep = |d: Dim| match d {
        Dim::One => 1,
        Dim::Var(v) => g.dims.get(v).value,
    };
    let rank = space.len();
    // A block covers up to 256 elements of the last axis and, when that is narrower, rows of
    // the axis before it.
    let last = if rank >= 1 { rep(space[rank - 1]) } else { 1 };
    let w = last.next_power_of_two().min(STAGE_THREADS);
    let rows = if rank >= 2 { (STAGE_THREADS / w).min(rep(space[rank - 2]).next_power_of_two()) } else { 1 };
    let mut grid = Vec::new();
    for (j, d) in space.iter().enumerate() {
        let Dim::Var(v) = *d else { continue };
        let tile = if j + 1 == rank {
            w
        } else if j + 2 == rank {
            rows
        } else {
            1
        };
        grid.push(GridAxis { iter: IterId(j as u32), dim: v, tile });
    }
    let mut extents = std::collections::BTreeSet::new();
    let mut dims = |d: Dim| {
        if let Dim::Var(v) = d {
            if g.dims.get(v).dynamic {
                extents.insert(v);
            }
        }
    };
    space.iter().copied().for_each(&mut dims);
    for p in &params {
        p.shape.iter().flatten().for_each(|v| dims(Dim::Var(*v)));
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
    StageKernel {
        symbol: String::new(),
        params,
        extents: extents.into_iter().collect(),
        grid,
        space,
        block: [w, rows],
        out: ParamId(0),
        value,
    }
}
