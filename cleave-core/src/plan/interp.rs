//! The tile-program interpreter: the scheduler's executable specification.
//!
//! It runs a [`Launch`] on the CPU block by block, in a shuffled block order, with the same
//! arithmetic the generated kernels use: f32 values and accumulation, inputs exactly as
//! stored, left MMA operands from registers rounded to the MMA input type, outputs rounded to
//! their dtype, partial tiles predicated by their limits, and each tensor addressed by the shape
//! its kernel's parameter declares, as the generated code addresses it. Comparing it with the f64
//! reference checks the schedule, the tile maps, the predication and the stabilization without
//! any code generation involved.

use std::collections::BTreeMap;

use super::launch::{Kernel, Launch};
use super::partition::WorkspaceType;
use super::program::{Binding, BufKind, Expr, MmaA, MmaKind, Param, Src, Stmt, TileKernel};
use super::stage::{Ix, SExpr, StageKernel};
use crate::graph::{BinaryOp, Bindings, DType, Dim, DimVar, ReduceOp, UnaryOp};
use crate::index::{IterId, Limit, TMap};
use crate::reference::{strides, Rng, Tensor};
use crate::xfloat::X32;

/// Why a launch could not be interpreted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InterpError {
    /// Wrong inputs.
    #[error("{0}")]
    Inputs(String),
    /// A kernel's parameter does not describe the buffer it is bound to: the generated code
    /// addresses a buffer by its parameter's shape, so such a launch would read or write the
    /// wrong elements.
    #[error("kernel `{kernel}`: parameter `{param}` has shape {param_shape:?}, but it is bound to a buffer of {elements} elements")]
    ParamShape {
        /// The kernel.
        kernel: String,
        /// The parameter.
        param: String,
        /// Its shape at these extents.
        param_shape: Vec<usize>,
        /// The bound buffer's element count.
        elements: usize,
    },
}

/// Runs a launch on inputs (in graph input order) at the given extents; returns the outputs.
pub fn run(launch: &Launch, bindings: &Bindings, inputs: &[Tensor], seed: u64) -> Result<Vec<Tensor>, InterpError> {
    let g = &launch.graph;
    if inputs.len() != g.inputs.len() {
        return Err(InterpError::Inputs(format!("expected {} inputs, got {}", g.inputs.len(), inputs.len())));
    }
    let ext = |d: &Dim| bindings.extent(*d);
    let mut globals: BTreeMap<Binding, (Vec<usize>, Vec<f32>)> = BTreeMap::new();
    for (i, (t, input)) in inputs.iter().zip(&g.inputs).enumerate() {
        let shape: Vec<usize> = input.decl.shape.iter().map(ext).collect();
        if shape != t.shape {
            return Err(InterpError::Inputs(format!(
                "input `{}` has shape {:?}, want {shape:?}",
                input.decl.name, t.shape
            )));
        }
        globals.insert(Binding::Input(i as u32), (shape, t.data.iter().map(|x| *x as f32).collect()));
    }
    for (o, out) in g.outputs.iter().enumerate() {
        let shape: Vec<usize> = out.decl.shape.iter().map(ext).collect();
        let n = shape.iter().product();
        globals.insert(Binding::Output(o as u32), (shape, vec![f32::NAN; n]));
    }
    let mut extended: BTreeMap<Binding, Vec<X32>> = BTreeMap::new();
    for (w, ws) in launch.workspaces.iter().enumerate() {
        let shape: Vec<usize> = ws.shape.iter().map(ext).collect();
        let n = shape.iter().product();
        match ws.ty {
            WorkspaceType::F32 | WorkspaceType::F16 | WorkspaceType::BF16 => {
                globals.insert(Binding::Workspace(w as u32), (shape, vec![f32::NAN; n]));
            }
            WorkspaceType::Extended => {
                extended.insert(Binding::Workspace(w as u32), vec![X32::from_float(f32::NAN); n]);
            }
        }
    }
    let mut rng = Rng::new(seed);
    for k in &launch.kernels {
        match k {
            Kernel::Tile(t) => run_kernel(t, bindings, &mut globals, &mut rng)?,
            Kernel::Stage(s) => run_stage(s, bindings, &mut globals, &mut extended),
        }
    }
    Ok(g.outputs
        .iter()
        .enumerate()
        .map(|(o, _)| {
            let (shape, data) = &globals[&Binding::Output(o as u32)];
            Tensor { shape: shape.clone(), data: data.iter().map(|x| f64::from(*x)).collect() }
        })
        .collect())
}

/// `x` rounded to tf32 (10 mantissa bits, to nearest, ties away from zero, as `cvt.rna.tf32`).
fn tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    f32::from_bits(x.to_bits().wrapping_add(0x1000) & 0xffff_e000)
}

/// What a split f32 operand contributes: its head (the value rounded to tf32, or cut to it
/// where rounding would overflow) plus the tf32 rounding of the rest, exact in f32.
fn tf32_split(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    let rounded = tf32(x);
    let head = if rounded.is_finite() { rounded } else { f32::from_bits(x.to_bits() & 0xffff_e000) };
    head + tf32(x - head)
}

fn round(dtype: DType, x: f32) -> f32 {
    match dtype {
        // Index tensors are never loaded as values.
        DType::I32 => x.round(),
        DType::F32 => x,
        DType::F16 => half::f16::from_f32(x).to_f32(),
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
    }
}

struct Block<'a> {
    k: &'a TileKernel,
    dims: &'a Bindings,
    iters: BTreeMap<IterId, u64>,
    regs: Vec<Vec<f32>>,
    /// Each parameter's value when it is a scalar (NaN otherwise).
    scalars: Vec<f32>,
    /// The block's rows that map to elements of its outputs. Rows are independent, so the
    /// others (padding, the ragged end of an axis) are never computed: their results could only
    /// be discarded by the stores' predication.
    live: Vec<usize>,
    /// Each parameter's shape, which addresses it ([`param_shapes`]).
    shapes: &'a [Vec<usize>],
}

/// Each parameter's shape at these extents. The generated code computes a parameter's strides
/// from this shape, not from the buffer it is bound to, so the interpreter addresses by it too:
/// two kernels that see one workspace at different shapes then disagree here as they would on
/// a device. A parameter whose element count differs from its buffer's is refused outright.
fn param_shapes(
    k: &TileKernel,
    dims: &Bindings,
    globals: &BTreeMap<Binding, (Vec<usize>, Vec<f32>)>,
) -> Result<Vec<Vec<usize>>, InterpError> {
    k.params
        .iter()
        .map(|p| {
            let shape: Vec<usize> = p.shape.iter().map(|d| d.map_or(1, |v| dims.values[v.index()] as usize)).collect();
            let elements = globals[&p.binding].1.len();
            // A paged or ragged layout stores its tensor in another shape; only dense
            // parameters are compared.
            if p.layout.is_none() && !p.is_scalar() && shape.iter().product::<usize>() != elements {
                return Err(InterpError::ParamShape {
                    kernel: k.symbol.clone(),
                    param: p.name.clone(),
                    param_shape: shape,
                    elements,
                });
            }
            Ok(if p.layout.is_none() { shape } else { globals[&p.binding].0.clone() })
        })
        .collect()
}

fn run_kernel(
    k: &TileKernel,
    dims: &Bindings,
    globals: &mut BTreeMap<Binding, (Vec<usize>, Vec<f32>)>,
    rng: &mut Rng,
) -> Result<(), InterpError> {
    let shapes = param_shapes(k, dims, globals)?;
    let counts: Vec<u64> = k.grid.iter().map(|a| (dims.values[a.dim.index()]).div_ceil(a.tile)).collect();
    let total: u64 = counts.iter().product();
    let mut order: Vec<u64> = (0..total).collect();
    for i in (1..order.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    for linear in order {
        let mut iters = BTreeMap::new();
        let mut rem = linear;
        for (a, &n) in k.grid.iter().zip(&counts).rev() {
            iters.insert(a.iter, rem % n);
            rem /= n;
        }
        let scalars = k
            .params
            .iter()
            .map(|p| if p.is_scalar() { globals[&p.binding].1.first().copied().unwrap_or(f32::NAN) } else { f32::NAN })
            .collect();
        let mut b =
            Block { k, dims, iters, regs: vec![Vec::new(); k.bufs.len()], scalars, live: Vec::new(), shapes: &shapes };
        // A row is live when any store writes it: outputs of one block can cover different
        // rows (a scalar next to a row tile).
        let mut stores = Vec::new();
        all_stores(&k.body, &mut stores);
        b.live = if stores.is_empty() {
            (0..k.rows as usize).collect()
        } else {
            (0..k.rows)
                .filter(|r| {
                    stores.iter().any(|(p, tm, trans)| {
                        let shape = &shapes[*p];
                        // A transposed store writes the block's row `r` to the tile's column `r`.
                        let at = if *trans { b.address(tm, shape, 0, *r) } else { b.address(tm, shape, *r, 0) };
                        at.is_some()
                    })
                })
                .map(|r| r as usize)
                .collect()
        };
        for (i, buf) in k.bufs.iter().enumerate() {
            b.regs[i] = match buf.kind {
                BufKind::Smem { rows, cols, .. } => vec![f32::NAN; (rows * cols) as usize],
                BufKind::Frag { cols, .. } => vec![f32::NAN; (k.rows * cols) as usize],
                BufKind::Rows => vec![f32::NAN; k.rows as usize],
            };
        }
        b.exec(&k.body, globals);
    }
    Ok(())
}

/// Every store of a body, loops included.
fn all_stores<'a>(body: &'a [Stmt], out: &mut Vec<(usize, &'a TMap, bool)>) {
    for s in body {
        match s {
            Stmt::Store { param, tmap, trans, .. } => out.push((param.0 as usize, tmap, *trans)),
            Stmt::Loop { body, .. } => all_stores(body, out),
            _ => {}
        }
    }
}

impl Block<'_> {
    fn dim(&self, d: DimVar) -> u64 {
        self.dims.values[d.index()]
    }

    fn valid(&self, limits: &[Limit], local: u64) -> bool {
        limits.iter().all(|l| {
            let base = l.base.eval(
                &|i| {
                    *self
                        .iters
                        .get(&i)
                        .unwrap_or_else(|| panic!("iterator {i:?} unset in {:?}; set {:?}", l, self.iters))
                },
                &|d| self.dim(d),
            );
            base + local < self.dim(l.bound)
        })
    }

    /// The global element index of tile element `(row, col)` of `tm`, if it is inside the tensor.
    fn address(&self, tm: &TMap, shape: &[usize], row: u64, col: u64) -> Option<usize> {
        let (base, valid) = self.row_address(tm, shape, row)?;
        (col < valid).then_some(base + col as usize)
    }

    /// Where tile row `row` of `tm` starts in the tensor, and how many of its columns are inside
    /// it (columns are contiguous in memory); `None` when the row is outside.
    fn row_address(&self, tm: &TMap, shape: &[usize], row: u64) -> Option<(usize, u64)> {
        let n = tm.axes.len();
        if n == 0 {
            return (row == 0).then_some((0, 1));
        }
        let iters = |i: IterId| self.iters[&i];
        let dims = |d: DimVar| self.dim(d);
        let st = strides(shape);
        let mut rem = row;
        let mut idx = 0usize;
        for a in (0..n - 1).rev() {
            let ax = &tm.axes[a];
            let local = rem % ax.extent;
            rem /= ax.extent;
            if !self.valid(&ax.limits, local) {
                return None;
            }
            let g = ax.offset.eval(&iters, &dims) + local;
            if g as usize >= shape[a] {
                return None;
            }
            idx += g as usize * st[a];
        }
        if rem != 0 {
            return None;
        }
        let last = &tm.axes[n - 1];
        let start = last.offset.eval(&iters, &dims);
        let mut valid = last.extent.min((shape[n - 1] as u64).saturating_sub(start));
        for l in &last.limits {
            let base = l.base.eval(&iters, &dims);
            valid = valid.min(self.dim(l.bound).saturating_sub(base));
        }
        // A row past the end of its axis (the last part of a ragged split can start there)
        // has nothing to read.
        if valid == 0 {
            return None;
        }
        Some((idx + start as usize, valid))
    }

    fn cols_of(&self, b: usize) -> u64 {
        match self.k.bufs[b].kind {
            BufKind::Smem { cols, .. } | BufKind::Frag { cols, .. } => cols,
            BufKind::Rows => 1,
        }
    }

    fn eval(&self, e: &Expr, row: u64, col: u64) -> f32 {
        match e {
            Expr::Src(Src::Const(c)) => *c as f32,
            Expr::Src(Src::Extent(d)) => self.dim(*d) as f32,
            Expr::Src(Src::Scalar(p)) => self.scalars[p.0 as usize],
            Expr::Src(Src::Reg(b)) => {
                let b = b.0 as usize;
                match self.k.bufs[b].kind {
                    BufKind::Rows => self.regs[b][row as usize],
                    _ => self.regs[b][(row * self.cols_of(b) + col) as usize],
                }
            }
            Expr::Src(Src::Tile(b)) => {
                let bi = b.0 as usize;
                let BufKind::Smem { rows, cols, .. } = self.k.bufs[bi].kind else { unreachable!("tiles are smem") };
                let r = if rows == 1 { 0 } else { row };
                let c = if cols == 1 { 0 } else { col };
                if r >= rows {
                    return 0.0;
                }
                self.regs[bi][(r * cols + c) as usize]
            }
            Expr::Src(Src::Column(b)) => {
                let bi = b.0 as usize;
                let BufKind::Smem { rows, cols, .. } = self.k.bufs[bi].kind else { unreachable!("tiles are smem") };
                if col >= rows {
                    return 0.0;
                }
                self.regs[bi][(col * cols) as usize]
            }
            Expr::Unary(u, a) => u.eval(self.eval(a, row, col)),
            Expr::Binary(op, a, b) => op.eval(self.eval(a, row, col), self.eval(b, row, col)),
            Expr::ExpDiff(a, b) => {
                let x = self.eval(a, row, col);
                if x == f32::NEG_INFINITY {
                    0.0
                } else {
                    (x - self.eval(b, row, col)).exp()
                }
            }
            Expr::MaskSlice(a, limits, fill) => {
                if self.valid(limits, 0) {
                    self.eval(a, row, col)
                } else {
                    *fill as f32
                }
            }
            Expr::MaskCols(a, limits, fill) => {
                if self.valid(limits, col) {
                    self.eval(a, row, col)
                } else {
                    *fill as f32
                }
            }
            Expr::Mask(a, at) => {
                let iters = |i: IterId| self.iters[&i];
                let dims = |d: DimVar| self.dim(d);
                let i = at.row.base.eval(&iters, &dims) + (row / at.row.div) % at.row.ext;
                let j = at.col.base.eval(&iters, &dims) + col;
                let extent = |d: Option<DimVar>| d.map_or(1, |v| self.dim(v));
                if at.mask.keeps(i, j, extent(at.row.extent), extent(at.col.extent)) {
                    self.eval(a, row, col)
                } else {
                    f32::NEG_INFINITY
                }
            }
        }
    }

    fn exec(&mut self, body: &[Stmt], globals: &mut BTreeMap<Binding, (Vec<usize>, Vec<f32>)>) {
        let rows = self.k.rows;
        for s in body {
            match s {
                Stmt::Load { dst, param, tmap, trans } => {
                    let p: &Param = &self.k.params[param.0 as usize];
                    let shape = &self.shapes[param.0 as usize];
                    let data = &globals[&p.binding].1;
                    let b = dst.0 as usize;
                    let BufKind::Smem { rows: tr, cols: tc, .. } = self.k.bufs[b].kind else { unreachable!() };
                    let mut tile = vec![0.0f32; (tr * tc) as usize];
                    // A transposed tile's rows are the tensor tile's columns: tensor row `r` of
                    // the tile lands in column `r`.
                    let tensor_rows = if *trans { tc } else { tr };
                    for r in 0..tensor_rows {
                        if let Some((base, valid)) = self.row_address(tmap, shape, r) {
                            let v = valid as usize;
                            if *trans {
                                for (c, x) in data[base..base + v].iter().enumerate() {
                                    tile[c * tc as usize + r as usize] = *x;
                                }
                            } else {
                                tile[(r * tc) as usize..(r * tc) as usize + v].copy_from_slice(&data[base..base + v]);
                            }
                        }
                    }
                    self.regs[b] = tile;
                }
                Stmt::Assign { dst, expr } => {
                    let b = dst.0 as usize;
                    let cols = self.cols_of(b);
                    let mut out = vec![f32::NAN; (rows * cols) as usize];
                    for &r in &self.live {
                        let r = r as u64;
                        for c in 0..cols {
                            out[(r * cols + c) as usize] = self.eval(expr, r, c);
                        }
                    }
                    self.regs[b] = out;
                }
                Stmt::RowReduce { dst, op, expr, cols, mask, acc } => {
                    let b = dst.0 as usize;
                    let mut out = vec![f32::NAN; rows as usize];
                    for &r in &self.live {
                        let r = r as u64;
                        let mut v = match op {
                            ReduceOp::Max => f32::NEG_INFINITY,
                            _ => 0.0,
                        };
                        for c in 0..*cols {
                            if !self.valid(mask, c) {
                                continue;
                            }
                            let x = self.eval(expr, r, c);
                            v = if *op == ReduceOp::Max { v.max(x) } else { v + x };
                        }
                        if *acc {
                            let old = self.regs[b][r as usize];
                            v = if *op == ReduceOp::Max { old.max(v) } else { old + v };
                        }
                        out[r as usize] = v;
                    }
                    self.regs[b] = out;
                }
                Stmt::Mma { acc, a, b, k, accumulate, kind } => {
                    let bb = b.buf.0 as usize;
                    let BufKind::Smem { dtype, cols: bcols, .. } = self.k.bufs[bb].kind else { unreachable!() };
                    let cols = self.cols_of(acc.0 as usize);
                    let (r, kk, n) = (rows as usize, *k as usize, cols as usize);
                    // Dense operands first, then a cache-friendly product: the arithmetic is the
                    // same f32 sums the hardware accumulates.
                    let mut am = vec![0.0f32; r * kk];
                    match a {
                        MmaA::Smem { buf, trans } => {
                            let ai = buf.0 as usize;
                            let BufKind::Smem { rows: ar, cols: ac, .. } = self.k.bufs[ai].kind else { unreachable!() };
                            let (ar, ac) = (ar as usize, ac as usize);
                            let src = &self.regs[ai];
                            for &i in &self.live {
                                for p in 0..kk {
                                    am[i * kk + p] = match trans {
                                        true if p < ar && i < ac => src[p * ac + i],
                                        false if i < ar => src[i * ac + p],
                                        _ => 0.0,
                                    };
                                }
                            }
                        }
                        MmaA::Frag(buf) => {
                            let ai = buf.0 as usize;
                            let ac = self.cols_of(ai) as usize;
                            for &i in &self.live {
                                for p in 0..kk {
                                    let x = self.regs[ai][i * ac + p];
                                    am[i * kk + p] = if *kind == MmaKind::Half { round(dtype, x) } else { x };
                                }
                            }
                        }
                    }
                    // A split operand reaches the tensor cores as a tf32 head and tail.
                    if let MmaKind::Tf32 { a_split: true, .. } = kind {
                        am.iter_mut().for_each(|x| *x = tf32_split(*x));
                    }
                    let b_split = matches!(kind, MmaKind::Tf32 { b_split: true, .. });
                    let bc = bcols as usize;
                    let mut bm = vec![0.0f32; kk * n];
                    for p in 0..kk {
                        for j in 0..n {
                            let y = if b.n_major { self.regs[bb][j * bc + p] } else { self.regs[bb][p * bc + j] };
                            bm[p * n + j] = if b_split { tf32_split(y) } else { y };
                        }
                    }
                    let mut out = if *accumulate { self.regs[acc.0 as usize].clone() } else { vec![0.0; r * n] };
                    let mut prod = vec![0.0f32; n];
                    for &i in &self.live {
                        prod.iter_mut().for_each(|x| *x = 0.0);
                        for p in 0..kk {
                            let x = am[i * kk + p];
                            for (o, y) in prod.iter_mut().zip(&bm[p * n..(p + 1) * n]) {
                                *o += x * y;
                            }
                        }
                        for (o, pv) in out[i * n..(i + 1) * n].iter_mut().zip(&prod) {
                            *o += pv;
                        }
                    }
                    self.regs[acc.0 as usize] = out;
                }
                Stmt::Stage { src, dst } => {
                    let (s, d) = (src.0 as usize, dst.0 as usize);
                    let BufKind::Smem { dtype, cols, .. } = self.k.bufs[d].kind else { unreachable!("smem") };
                    let mut tile = vec![0.0f32; self.regs[d].len()];
                    for &r in &self.live {
                        for c in 0..cols as usize {
                            tile[r * cols as usize + c] = round(dtype, self.regs[s][r * cols as usize + c]);
                        }
                    }
                    self.regs[d] = tile;
                }
                Stmt::Store { param, expr, cols, tmap, trans, .. } => {
                    let p = self.k.params[param.0 as usize].clone();
                    let mut writes = Vec::new();
                    {
                        let shape = &self.shapes[param.0 as usize];
                        for &r in &self.live {
                            let r = r as u64;
                            for c in 0..*cols {
                                let at = if *trans {
                                    self.address(tmap, shape, c, r)
                                } else {
                                    self.address(tmap, shape, r, c)
                                };
                                if let Some(i) = at {
                                    writes.push((i, round(p.dtype, self.eval(expr, r, c))));
                                }
                            }
                        }
                    }
                    let (_, data) = globals.get_mut(&p.binding).expect("bound");
                    for (i, v) in writes {
                        data[i] = v;
                    }
                }
                // The interpreter runs the block as one thread: there are no warps' partials to
                // merge, and each merged value is its source.
                Stmt::Merge { parts, .. } => {
                    for p in parts.iter().filter(|p| p.src != p.dst) {
                        self.regs[p.dst.0 as usize] = self.regs[p.src.0 as usize].clone();
                    }
                }
                Stmt::Loop { iter, dim, tile, body } => {
                    let n = self.dim(*dim).div_ceil(*tile);
                    for j in 0..n {
                        self.iters.insert(*iter, j);
                        self.exec(body, globals);
                    }
                    self.iters.remove(iter);
                }
            }
        }
    }
}

/// Runs a fallback stage: every element of the written tensor, in the extended-exponent
/// arithmetic the generated CUDA uses.
fn run_stage(
    k: &StageKernel,
    dims: &Bindings,
    globals: &mut BTreeMap<Binding, (Vec<usize>, Vec<f32>)>,
    extended: &mut BTreeMap<Binding, Vec<X32>>,
) {
    let space: Vec<usize> = k.space.iter().map(|d| dims.extent(*d)).collect();
    let total: usize = space.iter().product();
    let out = &k.params[k.out.0 as usize];
    let mut values = Vec::with_capacity(total);
    let mut idx = vec![0usize; space.len()];
    for lin in 0..total {
        let mut rem = lin;
        for (a, n) in space.iter().enumerate().rev() {
            idx[a] = rem % n;
            rem /= n;
        }
        values.push(stage_value(k, &k.value, &idx, 0, dims, globals, extended));
    }
    match out.binding {
        Binding::Workspace(_) => {
            extended.insert(out.binding, values);
        }
        b => {
            let (_, data) = globals.get_mut(&b).expect("outputs are bound");
            for (d, v) in data.iter_mut().zip(values) {
                *d = round(out.dtype, v.to_float());
            }
        }
    }
}

/// The value of `e` at output index `idx` and loop index `r`.
fn stage_value(
    k: &StageKernel,
    e: &SExpr,
    idx: &[usize],
    r: usize,
    dims: &Bindings,
    globals: &BTreeMap<Binding, (Vec<usize>, Vec<f32>)>,
    extended: &BTreeMap<Binding, Vec<X32>>,
) -> X32 {
    let value = |e: &SExpr, r: usize| stage_value(k, e, idx, r, dims, globals, extended);
    match e {
        SExpr::Const(c) => X32::from_f64(*c),
        SExpr::Load { param, index } => {
            let p = &k.params[param.0 as usize];
            let shape: Vec<usize> = p.shape.iter().map(|d| d.map_or(1, |v| dims.values[v.index()] as usize)).collect();
            let st = strides(&shape);
            let at: usize = index
                .iter()
                .zip(&st)
                .map(|(ix, s)| {
                    s * match ix {
                        Ix::Zero => 0,
                        Ix::Out(j) => idx[*j as usize],
                        Ix::Loop => r,
                    }
                })
                .sum();
            match p.binding {
                Binding::Workspace(_) if extended.contains_key(&p.binding) => extended[&p.binding][at],
                b => X32::from_float(globals[&b].1[at]),
            }
        }
        SExpr::Unary(u, a) => {
            let x = value(a, r);
            let one = X32::one();
            match u {
                UnaryOp::Exp => x.exp(),
                UnaryOp::Log => x.ln(),
                UnaryOp::Sqrt => x.sqrt(),
                UnaryOp::Rsqrt => one / x.sqrt(),
                UnaryOp::Square => x * x,
                UnaryOp::Recip => one / x,
                UnaryOp::Silu => x.silu(),
                UnaryOp::Sigmoid => x.sigmoid(),
                UnaryOp::Gelu => x.gelu(),
                UnaryOp::Neg => -x,
            }
        }
        SExpr::Binary(op, a, b) => {
            let (x, y) = (value(a, r), value(b, r));
            match op {
                BinaryOp::Add => x + y,
                BinaryOp::Sub => x - y,
                BinaryOp::Mul => x * y,
                BinaryOp::Div => x.quotient(y),
                BinaryOp::Max => x.max(y),
            }
        }
        SExpr::Mask { mask, value: v, row, col, rows, cols, .. } => {
            let at = |i: &Ix| match i {
                Ix::Zero => 0,
                Ix::Out(j) => idx[*j as usize] as u64,
                Ix::Loop => r as u64,
            };
            let (nr, nc) = (dims.extent(*rows) as u64, dims.extent(*cols) as u64);
            if mask.keeps(at(row), at(col), nr, nc) {
                value(v, r)
            } else {
                X32::from_float(f32::NEG_INFINITY)
            }
        }
        SExpr::Reduce { op, extent, body, .. } => {
            let n = dims.extent(*extent);
            let combine = |a: X32, b: X32| if *op == ReduceOp::Max { a.max(b) } else { a + b };
            let start = if *op == ReduceOp::Max { X32::from_float(f32::NEG_INFINITY) } else { X32::zero() };
            // Lane `t` of the element's lanes reduces entries `t, t + lanes, ...`; the lanes
            // then fold in the generated code's order: halves within each warp, then the warps'
            // results, lane `l` below the width taking `combine(its own, lane l + width)`.
            let lanes = k.lanes.max(1) as usize;
            let mut part: Vec<X32> =
                (0..lanes).map(|t| (t..n).step_by(lanes).fold(start, |a, j| combine(a, value(body, j)))).collect();
            let fold = |v: &mut [X32]| {
                let mut width = v.len() / 2;
                while width > 0 {
                    for l in 0..width {
                        v[l] = combine(v[l], v[l + width]);
                    }
                    width /= 2;
                }
                v[0]
            };
            let mut warps: Vec<X32> = part.chunks_mut(lanes.min(32)).map(fold).collect();
            let mut acc = fold(&mut warps);
            if *op == ReduceOp::Mean {
                acc = acc / X32::from_f64(n as f64);
            }
            acc
        }
    }
}
