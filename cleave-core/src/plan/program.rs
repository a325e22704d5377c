//! The tile program: a scheduled kernel after memory and layout planning (paper §6.1).
//!
//! Every value of a block is one of three layouts: a tile of a global tensor staged in shared
//! memory ([`BufKind::Smem`]), a register tile over the block's rows ([`BufKind::Frag`], the
//! tensor-core accumulator layout) or one register value per block row ([`BufKind::Rows`]).
//! The block's rows are the flattened non-last axes of its output tile; every register value
//! shares them. Statements are plain tile operations and loops; the online-softmax rescaling
//! that the stabilization pass inserts is written out in the same operations, so the
//! interpreter and every backend execute it without knowing what it is for.

use std::fmt::{self, Write};

use crate::graph::{BinaryOp, DType, DimTable, DimVar, Layout, Mask, ReduceOp, StoreAxis, UnaryOp};
use crate::index::{Affine, IterId, IterNames, Limit, TMap};

/// Index of a buffer of a [`TileKernel`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct BufId(pub u32);

/// Index of a global tensor parameter of a [`TileKernel`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ParamId(pub u32);

/// Where and how a buffer lives.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BufKind {
    /// A `rows × cols` tile of a global tensor in shared memory, in the tensor's dtype, rows
    /// being the flattened non-last axes of the tile.
    Smem {
        /// Element type.
        dtype: DType,
        /// Rows.
        rows: u64,
        /// Columns (the last axis).
        cols: u64,
    },
    /// An f32 register tile of the block's rows × `cols`.
    Frag {
        /// Columns.
        cols: u64,
        /// Every column warp holds all the columns, each its own partial: the accumulator of
        /// a loop whose tiles the column warps split ([`Warps::split`]), until a
        /// [`Stmt::Merge`] sums the partials into a tile split across the warps as usual.
        whole: bool,
    },
    /// One f32 register value per block row.
    Rows,
}

/// A buffer.
#[derive(Clone, PartialEq, Debug)]
pub struct Buf {
    /// Printed name (`t_q`, `t_o`).
    pub name: String,
    /// Layout.
    pub kind: BufKind,
    /// Byte offset in dynamic shared memory (Smem buffers).
    pub smem_offset: u64,
    /// Copies kept in shared memory: for a tile loaded in a loop, the pipeline's depth (2 to 4:
    /// the next `stages - 1` iterations' tiles stream in while this one is used), else 1.
    pub stages: u32,
}

impl Buf {
    /// Bytes of one stage of an Smem buffer (0 for registers).
    pub fn smem_stage_bytes(&self) -> u64 {
        match self.kind {
            BufKind::Smem { dtype, rows, cols } => rows * cols * dtype.size(),
            _ => 0,
        }
    }
}

/// What an operand reads, at one element `(row, col)` of the block.
#[derive(Clone, PartialEq, Debug)]
pub enum Src {
    /// A Frag (same rows and columns) or Rows buffer (broadcast along columns).
    Reg(BufId),
    /// An Smem tile read in the block's layout: row `row` unless the tile has a single row
    /// (broadcast over rows), column `col` unless it has a single column.
    Tile(BufId),
    /// An Smem tile of one column read across the block's columns: column `col` of every row
    /// is the tile's row `col`. The vector a matrix-vector product multiplies each row by.
    Column(BufId),
    /// A constant.
    Const(f64),
    /// The runtime extent of a dim, as f32.
    Extent(DimVar),
    /// A scalar input (rank 0, f32), passed to the kernel by value.
    Scalar(ParamId),
}

/// Where an element lies along one axis of a masked tensor, in the whole axis.
#[derive(Clone, PartialEq, Debug)]
pub struct Coord {
    /// The global index of the tile's first element.
    pub base: Affine,
    /// The element's index in the tile: `(row / div) % ext` for the row axis, the column
    /// itself for the column axis.
    pub div: u64,
    /// See `div`.
    pub ext: u64,
    /// The axis' extent the mask aligns with (`None`: 1).
    pub extent: Option<DimVar>,
}

/// A mask's geometry at one element of the block.
#[derive(Clone, PartialEq, Debug)]
pub struct MaskAt {
    /// Which mask.
    pub mask: Mask,
    /// The row (the masked tensor's second-to-last axis).
    pub row: Coord,
    /// The column (its last axis).
    pub col: Coord,
}

/// An elementwise expression over block elements.
#[derive(Clone, PartialEq, Debug)]
pub enum Expr {
    /// A leaf.
    Src(Src),
    /// One operand.
    Unary(UnaryOp, Box<Expr>),
    /// Two operands.
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    /// `exp(a - b)` for a running max `b` that includes `a` (so `b >= a`), 0 when `a` is -inf
    /// (the rescale factor of a running max that has not seen a finite value yet). Code
    /// generation may guard `b` instead of `a` (the two are -inf together when `b` is).
    ExpDiff(Box<Expr>, Box<Expr>),
    /// The value, or `fill` at columns outside the tensor (`base + col < extent(bound)` fails
    /// for some limit): -inf so that a maximum and an exp ignore them.
    MaskCols(Box<Expr>, Vec<Limit>, f64),
    /// The value, or `fill` when the current slice of a non-last axis lies outside the tensor
    /// (`base < extent(bound)` fails for some limit): the last chunk of a ragged split can run
    /// past its axis, and a reduction must see its identity there, not the loads' zero fill.
    MaskSlice(Box<Expr>, Vec<Limit>, f64),
    /// The value where the mask keeps the element, else `-inf` (a graph `Mask`).
    Mask(Box<Expr>, Box<MaskAt>),
}

impl Expr {
    /// A constant leaf.
    pub fn constant(c: f64) -> Expr {
        Expr::Src(Src::Const(c))
    }

    /// `(c, x)` when this is `c · x` or `x · c` for a finite constant `c > 0`: a scale that
    /// commutes with a maximum and folds into an exponent's multiply-add.
    pub fn positive_scale(&self) -> Option<(f64, &Expr)> {
        let Expr::Binary(BinaryOp::Mul, a, b) = self else { return None };
        match (a.as_ref(), b.as_ref()) {
            (Expr::Src(Src::Const(c)), x) | (x, Expr::Src(Src::Const(c))) if c.is_finite() && *c > 0.0 => Some((*c, x)),
            _ => None,
        }
    }

    /// A leaf reading a register buffer.
    pub fn reg(b: BufId) -> Expr {
        Expr::Src(Src::Reg(b))
    }

    /// A binary node.
    pub fn bin(op: BinaryOp, a: Expr, b: Expr) -> Expr {
        Expr::Binary(op, Box::new(a), Box::new(b))
    }

    /// Every buffer the expression reads.
    /// Reads register buffer `to` wherever this reads register buffer `from`.
    pub fn rename_reg(&mut self, from: BufId, to: BufId) {
        match self {
            Expr::Src(Src::Reg(b)) if *b == from => *b = to,
            Expr::Src(_) => {}
            Expr::Unary(_, a) | Expr::MaskCols(a, _, _) | Expr::MaskSlice(a, _, _) | Expr::Mask(a, _) => {
                a.rename_reg(from, to)
            }
            Expr::Binary(_, a, b) | Expr::ExpDiff(a, b) => {
                a.rename_reg(from, to);
                b.rename_reg(from, to);
            }
        }
    }

    pub fn bufs(&self, out: &mut Vec<BufId>) {
        match self {
            Expr::Src(Src::Reg(b) | Src::Tile(b) | Src::Column(b)) => out.push(*b),
            Expr::Src(Src::Const(_) | Src::Extent(_) | Src::Scalar(_)) => {}
            Expr::Unary(_, a) | Expr::MaskCols(a, _, _) | Expr::MaskSlice(a, _, _) | Expr::Mask(a, _) => a.bufs(out),
            Expr::Binary(_, a, b) | Expr::ExpDiff(a, b) => {
                a.bufs(out);
                b.bufs(out);
            }
        }
    }
}

/// The left operand of a tensor-core product: rows of the block × k.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MmaA {
    /// An Smem tile stored `rows × k` (or `k × rows` when `trans`).
    Smem {
        /// The tile.
        buf: BufId,
        /// Stored k-major.
        trans: bool,
    },
    /// A Frag with k columns, rounded to the MMA input type in registers.
    Frag(BufId),
}

/// How a product's operands reach the tensor cores.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MmaKind {
    /// Both operands in the right operand's 16-bit type, f16 or bf16: one `m16n8k16` per 16
    /// of depth. A register left operand is rounded to that type.
    Half,
    /// Operands the 16-bit products cannot take as they are: two 16-bit types (f16 and bf16),
    /// or f32 values on either side. Each is widened to tf32, which holds every f16 and bf16
    /// value exactly, and the 16 of depth run as two `m16n8k8` tf32 products. An f32 operand
    /// is split into a tf32 head and the tf32 rounding of what the head leaves, and the
    /// product sums head × head, head × tail and tail × head: products within a few units of
    /// f32 rounding of the exact ones, where rounding the operand to 16 bits would not be.
    Tf32 {
        /// The left operand holds f32 values (registers or an f32 tile) and is split.
        a_split: bool,
        /// The right operand is an f32 tile and is split.
        b_split: bool,
    },
}

impl MmaKind {
    /// Tensor-core time per 16 of depth and 16 × 8 of output, in units of one `m16n8k16`
    /// f16 product. The tf32 rate is half the f16 one (A100 and H100 alike), so an `m16n8k8`
    /// of half the depth takes as long; two cover 16 of depth, once per pair of split halves
    /// multiplied.
    pub fn issue_units(self) -> u64 {
        match self {
            MmaKind::Half => 1,
            MmaKind::Tf32 { a_split, b_split } => 2 * (1 + u64::from(a_split) + u64::from(b_split)),
        }
    }
}

/// The right operand: an Smem tile holding a `k × n` matrix.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MmaB {
    /// The tile.
    pub buf: BufId,
    /// Stored `n × k` (each row is one output column): the transposed view of an input.
    pub n_major: bool,
}

/// Every statement of `body` in program order, a loop's before those of its body.
pub fn flatten(body: &[Stmt]) -> Vec<&Stmt> {
    let mut out = Vec::new();
    for s in body {
        out.push(s);
        if let Stmt::Loop { body, .. } = s {
            out.extend(flatten(body));
        }
    }
    out
}

/// The row sums a loop body only accumulates (`dst += Rowsum(..)` at its top level, `dst`
/// neither read nor written anywhere else in it). With warps across columns, each column of
/// warps may keep its own partial of such a sum for the whole loop and combine once after it,
/// instead of exchanging partials through shared memory, with a barrier, every iteration.
pub fn deferred_row_sums(loop_body: &[Stmt]) -> Vec<BufId> {
    let mut found = Vec::new();
    for (i, s) in loop_body.iter().enumerate() {
        let Stmt::RowReduce { dst, op: ReduceOp::Sum, expr, acc: true, .. } = s else { continue };
        let mut own = Vec::new();
        expr.bufs(&mut own);
        if own.contains(dst) {
            continue;
        }
        let mut others = Vec::new();
        loop_body[..i].iter().for_each(|s| s.bufs(&mut others));
        loop_body[i + 1..].iter().for_each(|s| s.bufs(&mut others));
        if !others.contains(dst) {
            found.push(*dst);
        }
    }
    found
}

/// One statement.
#[derive(Clone, PartialEq, Debug)]
pub enum Stmt {
    /// Stages a tile of a global tensor in shared memory; elements outside the tensor (per
    /// the tmap's limits) read as zero.
    Load {
        /// Destination (Smem).
        dst: BufId,
        /// Source tensor.
        param: ParamId,
        /// The slice.
        tmap: TMap,
        /// The tile arrives transposed: shared memory holds it with the tensor's last two axes
        /// swapped, so that elementwise code reads a transposed view (a reduction over a
        /// column, seen as one over a row) in the block's layout like any other tile. Only a
        /// tile whose leading axes are single indices; copied element by element.
        trans: bool,
    },
    /// `dst = expr` elementwise over `dst`'s layout.
    Assign {
        /// Frag or Rows destination.
        dst: BufId,
        /// The value.
        expr: Expr,
    },
    /// Reduces `expr` (a block tile of `cols` columns) along its columns into the Rows buffer
    /// `dst`, skipping columns outside `mask`; with `acc`, combines with `dst`'s old value.
    RowReduce {
        /// Rows destination.
        dst: BufId,
        /// Sum or max (mean is a sum followed by a scale).
        op: ReduceOp,
        /// The reduced tile.
        expr: Expr,
        /// Its column count.
        cols: u64,
        /// Column validity: `base + c < extent(bound)`.
        mask: Vec<Limit>,
        /// Combine with the old value.
        acc: bool,
    },
    /// `acc = a · b` (or `acc += a · b`) over `k`, in f32.
    Mma {
        /// Frag accumulator.
        acc: BufId,
        /// Left operand.
        a: MmaA,
        /// Right operand.
        b: MmaB,
        /// Contracted length (multiple of 16).
        k: u64,
        /// Add to the old value.
        accumulate: bool,
        /// The operands' precision on the tensor cores.
        kind: MmaKind,
    },
    /// Writes a block tile to a global tensor, converting to its dtype; elements outside
    /// the tensor are skipped.
    Store {
        /// Destination tensor.
        param: ParamId,
        /// The value, in the block layout.
        expr: Expr,
        /// Columns of the stored tile.
        cols: u64,
        /// The slice.
        tmap: TMap,
        /// An Smem tile (in the output's dtype) the value is staged through, so that global
        /// memory is written in whole 16-byte chunks, row by row; `None` stores each thread's
        /// elements directly. The result is the same either way.
        staging: Option<BufId>,
        /// The block tile is the transpose of the tensor tile: block element `(r, c)` goes to
        /// tile element `(c, r)` (an output computed as the transpose of what it declares,
        /// whose reduction ran along the block's rows). Stored element by element, unstaged.
        trans: bool,
    },
    /// Copies a register tile (a product's left operand, computed in registers) into a shared
    /// tile in the product's input type, so that every warp can read all of its columns:
    /// warps that own slices of a wide accumulator each need the whole left operand.
    Stage {
        /// The Frag.
        src: BufId,
        /// The Smem tile (the block's rows × the Frag's columns).
        dst: BufId,
    },
    /// After a loop whose tiles the column warps split ([`Warps::split`]): merges each
    /// warp's partial state into the block's. Every part is read as all warps left it before
    /// any is written, so a part may merge in place (a Rows `src` that is its own `dst`).
    /// Outside the warps' view (the interpreter's) every `dst` is simply `src`.
    Merge {
        /// An F32 Smem tile of `warps.n × rows` rows and the parts' columns side by side,
        /// where each warp leaves its partials.
        scratch: BufId,
        /// The parts, in order.
        parts: Vec<MergePart>,
    },
    /// A sequential loop: `iter` runs over `ceil(extent(dim) / tile)` iterations.
    Loop {
        /// The iterator.
        iter: IterId,
        /// The walked dim.
        dim: DimVar,
        /// Elements per iteration.
        tile: u64,
        /// Body.
        body: Vec<Stmt>,
    },
}

/// One value a [`Stmt::Merge`] combines across the warps.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MergePart {
    /// The warp's partial: a Rows buffer or a whole Frag.
    pub src: BufId,
    /// The merged value: the same Rows buffer, or a Frag split across the warps.
    pub dst: BufId,
    /// How the partials combine.
    pub op: MergeOp,
}

/// How a [`MergePart`]'s partials combine.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MergeOp {
    /// Added up.
    Sum,
    /// The largest.
    Max,
    /// Added up after each is rescaled from its warp's running max (the `src` of the Max part
    /// this names) to the merged one: `Σ_w x_w · exp(m_w - max_w m_w)`.
    Scaled(BufId),
}

impl Stmt {
    /// Every buffer the statement (and, for a loop, its body) reads or writes.
    pub fn bufs(&self, out: &mut Vec<BufId>) {
        match self {
            Stmt::Load { dst, .. } => out.push(*dst),
            Stmt::Assign { dst, expr } | Stmt::RowReduce { dst, expr, .. } => {
                out.push(*dst);
                expr.bufs(out);
            }
            Stmt::Mma { acc, a, b, .. } => {
                out.push(*acc);
                out.push(match a {
                    MmaA::Smem { buf, .. } | MmaA::Frag(buf) => *buf,
                });
                out.push(b.buf);
            }
            Stmt::Store { expr, staging, .. } => {
                expr.bufs(out);
                out.extend(*staging);
            }
            Stmt::Stage { src, dst } => out.extend([*src, *dst]),
            Stmt::Merge { scratch, parts } => {
                out.push(*scratch);
                for p in parts {
                    out.extend([p.src, p.dst]);
                }
            }
            Stmt::Loop { body, .. } => body.iter().for_each(|s| s.bufs(out)),
        }
    }
}

/// A global tensor a kernel reads or writes.
#[derive(Clone, PartialEq, Debug)]
pub struct Param {
    /// Name (`q`, `ws0`).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Extent per axis, as dims (`None` for a unit axis).
    pub shape: Vec<Option<DimVar>>,
    /// Written by the kernel.
    pub output: bool,
    /// What it is bound to at launch.
    pub binding: Binding,
    /// The buffer's layout when it is not the dense `shape` (inputs and outputs only).
    pub layout: Option<Layout>,
}

impl Param {
    /// A scalar input, passed by value.
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty() && !self.output && matches!(self.binding, Binding::Input(_))
    }

    /// An index tensor (i32), read only to address others.
    pub fn is_index(&self) -> bool {
        !self.dtype.is_float()
    }

    /// The number of axes of the buffer: its storage axes, or its shape's.
    pub fn storage_rank(&self) -> usize {
        self.layout.as_ref().map_or(self.shape.len(), |l| l.axes.len())
    }

    /// Whether storage axis `k` has a runtime stride (it is not the last, contiguous one, and
    /// not a unit axis, always at index 0).
    fn strided_axis(&self, k: usize) -> bool {
        if k + 1 >= self.storage_rank() {
            return false;
        }
        match &self.layout {
            Some(l) => !matches!(l.axes[k], StoreAxis::One | StoreAxis::PlusOne(_)),
            None => self.shape[k].is_some(),
        }
    }
}

/// What a kernel parameter is at launch time.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Binding {
    /// A graph input.
    Input(u32),
    /// A graph output.
    Output(u32),
    /// A workspace buffer between the kernels of one launch.
    Workspace(u32),
}

/// A runtime element stride a kernel takes after its extents: axis `axis` of the buffer of the
/// input or output `binding` (a storage axis, when the tensor has a layout). Inputs and outputs are views, so that a tensor inside a larger buffer (a
/// KV cache allocated for its capacity, one projection of a fused weight, a candle narrow or
/// transpose) is read and written in place and one compile serves every stride. Workspaces are
/// the launch's own, dense and row-major, and take none.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct StrideParam {
    /// An `Input` or `Output` binding.
    pub binding: Binding,
    /// The buffer axis; never the last, which is contiguous.
    pub axis: u32,
}

impl StrideParam {
    /// Its name in generated CUDA (`si0_1`: input 0, axis 1), unique within a kernel.
    pub fn name(&self) -> String {
        match self.binding {
            Binding::Input(i) => format!("si{i}_{}", self.axis),
            Binding::Output(o) => format!("so{o}_{}", self.axis),
            Binding::Workspace(w) => format!("sw{w}_{}", self.axis),
        }
    }
}

/// The one rule of which strides a kernel with these tensor parameters takes, in parameter
/// order: every axis of the buffer of an input or output but the last, except unit axes
/// (always index 0); index tensors and scalars take none. The code generators name them in the
/// kernel's signature and the plan data passes them in this order, so the two cannot disagree.
pub fn stride_params(params: &[Param]) -> Vec<StrideParam> {
    let mut out = Vec::new();
    for p in params.iter().filter(|p| is_view(p.binding) && !p.is_index() && !p.is_scalar()) {
        for k in 0..p.storage_rank() {
            if p.strided_axis(k) {
                out.push(StrideParam { binding: p.binding, axis: k as u32 });
            }
        }
    }
    out
}

/// Whether the tiles `tm` of `p` are copied 16 bytes at a time: a tile's rows and the
/// tensor's (static) rows are whole 16-byte chunks, and every tile starts on one. Otherwise
/// the copies are element by element. The code generator copies by this rule and the cost
/// model counts the instructions it takes, so the two cannot disagree.
pub fn copies_whole_chunks(p: &Param, tm: &TMap, dims: &DimTable) -> bool {
    let epc = 16 / p.dtype.size();
    let Some(last) = tm.axes.last() else { return false };
    let last_static = p.shape.last().copied().flatten().map(|v| dims.get(v)).filter(|d| !d.dynamic).map(|d| d.value);
    last.extent % epc == 0
        && last_static.is_some_and(|e| e % epc == 0)
        && tm.axes.len() == p.shape.len()
        && last.offset.multiple_of(epc, dims)
}

/// Whether a tensor bound this way is addressed through runtime strides (inputs and outputs)
/// rather than its dense row-major extents (workspaces).
pub fn is_view(b: Binding) -> bool {
    matches!(b, Binding::Input(_) | Binding::Output(_))
}

/// One grid axis: `iter` runs over `ceil(extent(dim) / tile)` blocks.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct GridAxis {
    /// Block index component.
    pub iter: IterId,
    /// The dim.
    pub dim: DimVar,
    /// Elements per block.
    pub tile: u64,
}

/// How the block's warps cover its rows and the columns of every register tile.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Warps {
    /// Warps stacked along rows.
    pub m: u32,
    /// Warps side by side along columns.
    pub n: u32,
    /// 16-row MMA tiles per warp.
    pub m_tiles: u32,
    /// The column warps split the tiles of the kernel's one loop between them instead: each
    /// takes a slice of every tile that moves with the loop, keeps its own running state
    /// (whole Frags, Rows) through the loop, and a [`Stmt::Merge`] after it combines the
    /// warps' states. Before and after the loop the column warps own column slices as usual.
    /// FlashDecoding's split of the keys, inside one block.
    pub split: bool,
}

impl Warps {
    /// Threads per block.
    pub fn threads(&self) -> u32 {
        32 * self.m * self.n
    }
}

/// One kernel of a launch.
#[derive(Clone, PartialEq, Debug)]
pub struct TileKernel {
    /// Entry point name (`cleave_<kernel>_<index>`).
    pub symbol: String,
    /// Global tensors, in parameter order.
    pub params: Vec<Param>,
    /// Dims whose runtime extents the kernel needs, in parameter order after the tensors.
    pub extents: Vec<DimVar>,
    /// The grid.
    pub grid: Vec<GridAxis>,
    /// Block rows (the flattened non-last axes of the output tile, padded to 16).
    pub rows: u64,
    /// Warp layout.
    pub warps: Warps,
    /// Buffers.
    pub bufs: Vec<Buf>,
    /// The program.
    pub body: Vec<Stmt>,
    /// Dynamic shared memory, bytes.
    pub smem_bytes: u64,
    /// Printed names of the grid and loop iterators (`i0`, `j0`, ..), as the schedule named them.
    pub names: IterNames,
}

impl TileKernel {
    /// The buffer behind an id.
    pub fn buf(&self, b: BufId) -> &Buf {
        &self.bufs[b.0 as usize]
    }

    /// The pipeline depth of a loop with this body: the stages of the tiles it loads (all
    /// alike), 2 for a loop that loads nothing.
    pub fn loop_stages(&self, body: &[Stmt]) -> u32 {
        body.iter()
            .filter_map(|s| match s {
                Stmt::Load { dst, .. } => Some(self.buf(*dst).stages),
                _ => None,
            })
            .max()
            .unwrap_or(2)
            .max(2)
    }
}

/// Renders a kernel in the style of the paper's Listing 1.
pub struct ShowKernel<'a> {
    /// The kernel.
    pub kernel: &'a TileKernel,
    /// Names of dims.
    pub dims: &'a DimTable,
}

impl fmt::Display for ShowKernel<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.header());
        for (depth, line) in self.lines() {
            let _ = writeln!(out, "{}{line}", "  ".repeat(depth));
        }
        f.write_str(&out)
    }
}

impl ShowKernel<'_> {
    /// The first line: the grid, the block's threads and rows, and its shared memory.
    pub fn header(&self) -> String {
        let k = self.kernel;
        let grid: Vec<String> = k
            .grid
            .iter()
            .map(|a| format!("{} < ceil({}/{})", self.kernel.names.name(a.iter), self.dims.get(a.dim).name, a.tile))
            .collect();
        format!(
            "parfor {}:  # {} threads, {} rows, {} B smem{}",
            if grid.is_empty() { "_ < 1".to_string() } else { grid.join(", ") },
            k.warps.threads(),
            k.rows,
            k.smem_bytes,
            if k.warps.split { format!(", {} warps split the loop", k.warps.n) } else { String::new() }
        )
    }

    /// The body, one statement per line with its loop depth (1 inside the grid loop); a
    /// loop's line comes before its body's. The SVG picture of a schedule draws these lines.
    pub fn lines(&self) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for s in &self.kernel.body {
            self.stmt(s, 1, &mut out);
        }
        out
    }

    fn name(&self, b: BufId) -> &str {
        &self.kernel.buf(b).name
    }

    fn slice(&self, p: ParamId, tmap: &TMap) -> String {
        let ranges: Vec<String> = tmap
            .axes
            .iter()
            .map(|a| {
                if a.extent == 1 {
                    a.offset.show(&self.kernel.names, self.dims)
                } else {
                    format!("{}:+{}", a.offset.show(&self.kernel.names, self.dims), a.extent)
                }
            })
            .collect();
        format!("{}[{}]", self.kernel.params[p.0 as usize].name, ranges.join(", "))
    }

    fn expr(&self, e: &Expr) -> String {
        match e {
            Expr::Src(Src::Reg(b) | Src::Tile(b)) => self.name(*b).to_string(),
            Expr::Src(Src::Column(b)) => format!("{}ᵀ", self.name(*b)),
            Expr::Src(Src::Const(c)) => format!("{c:?}"),
            Expr::Src(Src::Extent(d)) => self.dims.get(*d).name.clone(),
            Expr::Src(Src::Scalar(p)) => self.kernel.params[p.0 as usize].name.clone(),
            Expr::Unary(UnaryOp::Neg, a) => format!("-{}", self.expr(a)),
            Expr::Unary(u, a) => format!("{}({})", u.name(), self.expr(a)),
            Expr::Binary(BinaryOp::Max, a, b) => format!("max({}, {})", self.expr(a), self.expr(b)),
            Expr::Binary(op, a, b) => {
                format!("({} {} {})", self.expr(a), op.symbol().unwrap_or("?"), self.expr(b))
            }
            Expr::ExpDiff(a, b) => format!("exp({} - {})", self.expr(a), self.expr(b)),
            Expr::MaskCols(a, _, fill) => format!("mask({}, {fill:?})", strip(&self.expr(a))),
            Expr::MaskSlice(a, _, fill) => format!("mask_slice({}, {fill:?})", strip(&self.expr(a))),
            Expr::Mask(a, at) => format!("{}({}{})", at.mask.name(), strip(&self.expr(a)), at.mask.arguments()),
        }
    }

    fn stmt(&self, s: &Stmt, depth: usize, out: &mut Vec<(usize, String)>) {
        match s {
            Stmt::Load { dst, param, tmap, trans } => {
                let f = if *trans { "LoadT" } else { "Load" };
                out.push((depth, format!("{} = {f}({})", self.name(*dst), self.slice(*param, tmap))));
            }
            Stmt::Assign { dst, expr } => {
                out.push((depth, format!("{} = {}", self.name(*dst), strip(&self.expr(expr)))));
            }
            Stmt::RowReduce { dst, op, expr, acc, .. } => {
                let f = match op {
                    ReduceOp::Max => "Rowmax",
                    _ => "Rowsum",
                };
                let (lhs, join) = match (acc, op) {
                    (true, ReduceOp::Max) => (format!("{0} = max({0}, ", self.name(*dst)), ")"),
                    (true, _) => (format!("{} += ", self.name(*dst)), ""),
                    (false, _) => (format!("{} = ", self.name(*dst)), ""),
                };
                out.push((depth, format!("{lhs}{f}({}){join}", strip(&self.expr(expr)))));
            }
            Stmt::Mma { acc, a, b, accumulate, kind, .. } => {
                let a = match a {
                    MmaA::Smem { buf, trans: false } => self.name(*buf).to_string(),
                    MmaA::Smem { buf, trans: true } => format!("{}^T", self.name(*buf)),
                    MmaA::Frag(buf) => self.name(*buf).to_string(),
                };
                let b = if b.n_major { format!("{}^T", self.name(b.buf)) } else { self.name(b.buf).to_string() };
                let op = if *accumulate { "+=" } else { "=" };
                let mma = match kind {
                    MmaKind::Half => "MMA",
                    MmaKind::Tf32 { a_split: false, b_split: false } => "MMA.tf32",
                    MmaKind::Tf32 { a_split: true, b_split: false } => "MMA.tf32(split A)",
                    MmaKind::Tf32 { a_split: false, b_split: true } => "MMA.tf32(split B)",
                    MmaKind::Tf32 { a_split: true, b_split: true } => "MMA.tf32(split A, B)",
                };
                out.push((depth, format!("{} {op} {mma}({a}, {b})", self.name(*acc))));
            }
            Stmt::Store { param, expr, tmap, trans, .. } => {
                let f = if *trans { "StoreT" } else { "Store" };
                out.push((depth, format!("{f}({}, {})", strip(&self.expr(expr)), self.slice(*param, tmap))));
            }
            Stmt::Stage { src, dst } => {
                out.push((depth, format!("{} = Stage({})", self.name(*dst), self.name(*src))));
            }
            Stmt::Merge { parts, .. } => {
                let parts: Vec<String> = parts
                    .iter()
                    .map(|p| {
                        let how = match p.op {
                            MergeOp::Sum => "sum".to_string(),
                            MergeOp::Max => "max".to_string(),
                            MergeOp::Scaled(m) => format!("sum at {}", self.name(m)),
                        };
                        if p.src == p.dst {
                            format!("{} ({how})", self.name(p.dst))
                        } else {
                            format!("{} <- {} ({how})", self.name(p.dst), self.name(p.src))
                        }
                    })
                    .collect();
                out.push((depth, format!("MergeWarps({})", parts.join(", "))));
            }
            Stmt::Loop { iter, dim, tile, body } => {
                out.push((
                    depth,
                    format!("for {} in range(0, {}, {tile}):", self.kernel.names.name(*iter), self.dims.get(*dim).name),
                ));
                for s in body {
                    self.stmt(s, depth + 1, out);
                }
            }
        }
    }
}

fn strip(s: &str) -> &str {
    if s.starts_with('(') && s.ends_with(')') && balanced(&s[1..s.len() - 1]) {
        &s[1..s.len() - 1]
    } else {
        s
    }
}

fn balanced(s: &str) -> bool {
    let mut depth = 0i32;
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            _ => {}
        }
    }
    depth == 0
}
