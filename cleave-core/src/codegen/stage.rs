//! CUDA C++ of the fallback's stage kernels: each thread computes one element of the written
//! tensor in extended-exponent arithmetic (`cleave::xf`), looping over the stage's reduced
//! axis, and every access goes through the checked accessors.

use std::fmt::Write;

use super::cuda::{ctype, dim_expr, emu_entry, stride_factors};
use super::ident;
use crate::graph::{BinaryOp, Dim, DimTable, DimVar, PerRequestKind, ReduceOp, StoreAxis, UnaryOp};
use crate::plan::program::{stride_params, Binding, Param, StrideParam};
use crate::plan::stage::{positions, slots, PosAxis, SLOT_ITERS, STAGE_UNROLL};
use crate::plan::{Ix, SExpr, StageKernel};

/// The C element type of a stage parameter: workspaces hold extended-exponent values.
fn elem(p: &Param) -> &'static str {
    match p.binding {
        Binding::Workspace(_) => "cleave::xf",
        _ => ctype(p.dtype),
    }
}

struct Stage<'a> {
    k: &'a StageKernel,
    dims: &'a DimTable,
}

impl Stage<'_> {
    /// An index as C.
    fn ix(i: &Ix) -> String {
        match i {
            Ix::Zero => "0LL".to_string(),
            Ix::Out(j) => format!("o{j}"),
            Ix::Loop => "r".to_string(),
        }
    }

    fn ext(&self, d: Dim) -> String {
        match d {
            Dim::One => "1LL".to_string(),
            Dim::Var(v) => dim_expr(self.dims, v),
        }
    }

    /// The parameter holding input `i` (a table the planner passed).
    fn input_param(&self, i: u32) -> usize {
        self.k
            .params
            .iter()
            .position(|p| p.binding == Binding::Input(i))
            .expect("the planner passes every table a stage reads")
    }

    /// Where request `b` of per-request dim `v` starts (in entries of its packed axis or page
    /// table), how long it is, and its page size (1 for a ragged dim); all clamped like the
    /// tile kernels' (`cleave_req_start`), so a malformed table never leads outside a buffer.
    fn request(&self, v: DimVar, b: &str) -> (String, String, u64) {
        let pr = self.dims.get(v).per_request.as_ref().expect("a per-request dim");
        let indptr = self.input_param(pr.indptr().input);
        match &pr.kind {
            PerRequestKind::Ragged { total, .. } => {
                let bound = total.map_or_else(|| "0LL".to_string(), |t| dim_expr(self.dims, t));
                (
                    format!("cleave_req_start(p{indptr}, {b}, {bound})"),
                    format!("cleave_req_len(p{indptr}, {b}, {bound})"),
                    1,
                )
            }
            PerRequestKind::Paged { indices, page_size, last_page_len, .. } => {
                let n = dim_expr(self.dims, indices.len);
                let last = match last_page_len {
                    Some(l) => format!("(long long)cleave::ld_global(p{}, {b})", self.input_param(l.input)),
                    None => format!("{page_size}LL"),
                };
                (
                    format!("cleave_req_start(p{indptr}, {b}, {n})"),
                    format!("cleave_paged_len(cleave_req_len(p{indptr}, {b}, {n}), {page_size}LL, {last})"),
                    *page_size,
                )
            }
        }
    }

    /// The length of the request at batch index `b` of per-request extent `d` (or `d`'s
    /// extent when it is the same for every request).
    fn extent_at(&self, d: Dim, b: Option<&Ix>) -> String {
        match (d.var().filter(|v| self.dims.get(*v).per_request.is_some()), b) {
            (Some(v), Some(b)) => self.request(v, &Self::ix(b)).1,
            _ => self.ext(d),
        }
    }

    /// The stride of storage axis `k` of `p`'s buffer.
    fn storage_stride(p: &Param, k: usize) -> String {
        if k + 1 >= p.storage_rank() {
            "1LL".to_string()
        } else {
            StrideParam { binding: p.binding, axis: k as u32 }.name()
        }
    }

    /// The element of `p` at `index` (one index per logical axis): an offset, and for a paged
    /// tensor the page size and the arguments of the page-table lookup that completes it.
    fn element(&self, p: &Param, index: &[Ix]) -> (String, Option<(u64, String)>) {
        if let (Binding::Workspace(_), Some(axes)) = (p.binding, self.workspace_positions(p)) {
            return (self.positional(&axes, index), None);
        }
        let mut terms = Vec::new();
        for (a, ix) in index.iter().enumerate() {
            if *ix == Ix::Zero {
                continue;
            }
            let stride = stride_factors(p, a, self.dims);
            let i = Self::ix(ix);
            terms.push(if stride.is_empty() { i } else { format!("{i} * {}", stride.join(" * ")) });
        }
        let mut page = None;
        if let Some(layout) = &p.layout {
            // The request of a per-request axis is the index of its batch axis.
            let batch_ix = |v: DimVar| -> String {
                let pr = self.dims.get(v).per_request.as_ref().expect("per-request");
                let a = p.shape.iter().position(|d| *d == Some(pr.batch)).expect("a packed tensor has the batch");
                Self::ix(&index[a])
            };
            let logical_ix = |v: DimVar| -> String {
                let a = p.shape.iter().position(|d| *d == Some(v)).expect("the tensor has its dim");
                Self::ix(&index[a])
            };
            for (k, axis) in layout.axes.iter().enumerate() {
                match axis {
                    StoreAxis::Packed { ragged, .. } => {
                        let (start, _, _) = self.request(*ragged, &batch_ix(*ragged));
                        terms.push(format!("{start} * {}", Self::storage_stride(p, k)));
                    }
                    StoreAxis::Pages { pages, paged } => {
                        let PerRequestKind::Paged { indices, page_size, .. } =
                            &self.dims.get(*paged).per_request.as_ref().expect("per-request").kind
                        else {
                            unreachable!("a pages axis is of a paged dim")
                        };
                        let (start, _, _) = self.request(*paged, &batch_ix(*paged));
                        let slot = match layout.axes.get(k + 1) {
                            Some(StoreAxis::Slot { size: Dim::Var(_), .. }) => Self::storage_stride(p, k + 1),
                            _ => "0LL".to_string(),
                        };
                        page = Some((
                            *page_size,
                            format!(
                                "p{}, {start}, {}, {}, {}, {slot}",
                                self.input_param(indices.input),
                                logical_ix(*paged),
                                dim_expr(self.dims, *pages),
                                Self::storage_stride(p, k)
                            ),
                        ));
                    }
                    _ => {}
                }
            }
        }
        let offset = if terms.is_empty() { "0LL".into() } else { terms.join(" + ") };
        (offset, page)
    }

    /// The positional layout of a workspace over per-request dims.
    fn workspace_positions(&self, p: &Param) -> Option<Vec<PosAxis>> {
        let shape: Vec<Dim> = p.shape.iter().map(|d| d.map_or(Dim::One, Dim::Var)).collect();
        positions(self.dims, &shape).ok().flatten()
    }

    /// Row-major offset of `index` in a tensor laid out by position: each per-request dim at
    /// its position among its slots, the folded batch dropped.
    fn positional(&self, axes: &[PosAxis], index: &[Ix]) -> String {
        let mut parts: Vec<(String, String)> = Vec::new();
        for (axis, ix) in axes.iter().zip(index) {
            match axis {
                PosAxis::Dense(d) => parts.push((Self::ix(ix), self.ext(*d))),
                PosAxis::Folded => {}
                PosAxis::Packed(v) | PosAxis::Padded(v) => {
                    let extent = slots(self.dims, *v)
                        .expect("the planner checked the slots")
                        .into_iter()
                        .map(|d| self.ext(d))
                        .collect::<Vec<_>>()
                        .join(" * ");
                    let at = if matches!(axis, PosAxis::Packed(_)) {
                        let b = axes.iter().position(|x| *x == PosAxis::Folded).expect("a packed dim folds its batch");
                        let (start, _, ps) = self.request(*v, &Self::ix(&index[b]));
                        format!("({start} * {ps}LL + {})", Self::ix(ix))
                    } else {
                        Self::ix(ix)
                    };
                    parts.push((at, format!("({extent})")));
                }
            }
        }
        let mut terms = Vec::new();
        for (k, (at, _)) in parts.iter().enumerate() {
            let mut t = vec![at.clone()];
            t.extend(parts[k + 1..].iter().map(|(_, e)| e.clone()));
            terms.push(t.join(" * "));
        }
        if terms.is_empty() {
            "0LL".into()
        } else {
            terms.join(" + ")
        }
    }

    fn expr(&self, e: &SExpr) -> String {
        match e {
            SExpr::Const(c) => format!("cleave::xf_of_double({})", double_literal(*c)),
            SExpr::Load { param, .. } if self.k.params[param.0 as usize].is_scalar() => {
                format!("cleave::xf_of_float(p{})", param.0)
            }
            SExpr::Load { param, index } => {
                let p = &self.k.params[param.0 as usize];
                let (offset, page) = self.element(p, index);
                match (p.binding, page) {
                    (Binding::Workspace(_), _) => format!("cleave::ld_global(p{}, {offset})", param.0),
                    // A page outside the pool reads as zero, like the tile kernels' copies.
                    (_, Some((ps, args))) => {
                        format!("cleave::xf_of_float(cleave_ld_page<{ps}LL>({args}, p{}, {offset}))", param.0)
                    }
                    (_, None) => {
                        format!("cleave::xf_of_float(cleave::to_float(cleave::ld_global(p{}, {offset})))", param.0)
                    }
                }
            }
            SExpr::Unary(u, a) => {
                let x = self.expr(a);
                match u {
                    UnaryOp::Exp => format!("cleave::xf_exp({x})"),
                    UnaryOp::Log => format!("cleave::xf_log({x})"),
                    UnaryOp::Sqrt => format!("cleave::xf_sqrt({x})"),
                    UnaryOp::Rsqrt => format!("cleave::xf_rsqrt({x})"),
                    UnaryOp::Square => format!("cleave::xf_square({x})"),
                    UnaryOp::Recip => format!("cleave::xf_recip({x})"),
                    UnaryOp::Silu => format!("cleave::xf_silu({x})"),
                    UnaryOp::Sigmoid => format!("cleave::xf_sigmoid({x})"),
                    UnaryOp::Gelu => format!("cleave::xf_gelu({x})"),
                    UnaryOp::Neg => format!("cleave::xf_neg({x})"),
                }
            }
            SExpr::Binary(op, a, b) => {
                let f = match op {
                    BinaryOp::Add => "xf_add",
                    BinaryOp::Sub => "xf_sub",
                    BinaryOp::Mul => "xf_mul",
                    BinaryOp::Div => "xf_div",
                    BinaryOp::Max => "xf_max",
                };
                format!("cleave::{f}({}, {})", self.expr(a), self.expr(b))
            }
            SExpr::Mask { mask, value, row, col, rows, cols, batch } => {
                let (rows, cols) = (self.extent_at(*rows, batch.as_ref()), self.extent_at(*cols, batch.as_ref()));
                let keep = match mask {
                    crate::graph::Mask::Causal { diagonal } => {
                        format!("({}) <= ({}) + ({cols}) - ({rows}) + ({diagonal}LL)", Self::ix(col), Self::ix(row))
                    }
                };
                format!("(({keep}) ? {} : cleave::xf{{-INFINITY, 0}})", self.expr(value))
            }
            SExpr::Reduce { .. } => unreachable!("a reduction is only a stage's root"),
        }
    }
}

/// A C double literal that reads back as `c` exactly.
fn double_literal(c: f64) -> String {
    if c.is_nan() {
        "NAN".into()
    } else if c.is_infinite() {
        if c > 0.0 { "INFINITY" } else { "-INFINITY" }.into()
    } else {
        let s = format!("{c:?}");
        if s.contains(['.', 'e', 'E']) {
            s
        } else {
            format!("{s}.0")
        }
    }
}

/// Emits one stage kernel and, for the emulator, its C entry point.
pub(super) fn emit_stage(k: &StageKernel, dims: &DimTable) -> String {
    let st = Stage { k, dims };
    let mut out = String::new();
    let mut params: Vec<String> = k
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let t = elem(p);
            if p.is_scalar() {
                format!("const float p{i}")
            } else if p.output {
                format!("{t}* __restrict__ p{i}")
            } else {
                format!("const {t}* __restrict__ p{i}")
            }
        })
        .collect();
    for d in &k.extents {
        params.push(format!("long long e_{}", ident(&dims.get(*d).name)));
    }
    let strides = stride_params(&k.params);
    params.extend(strides.iter().map(|s| format!("long long {}", s.name())));
    let _ = writeln!(out, "\nextern \"C\" __global__ void __launch_bounds__({}) {}(", k.threads(), k.symbol);
    let _ = writeln!(out, "    {}) {{", params.join(",\n    "));
    for (i, p) in k.params.iter().enumerate() {
        let ty = if elem(p) == "cleave::xf" { "extended" } else { p.dtype.name() };
        let _ = writeln!(out, "  // p{i}: {} ({ty}{})", p.name, if p.output { ", written" } else { "" });
    }
    for d in &k.extents {
        let _ = writeln!(out, "  (void)e_{};", ident(&dims.get(*d).name));
    }
    for s in &strides {
        let _ = writeln!(out, "  (void){};", s.name());
    }
    let [w, rows] = k.block;
    let lanes = k.lanes.max(1);
    if lanes == 1 {
        let _ = writeln!(out, "  const long long tx = threadIdx.x % {w}, ty = threadIdx.x / {w};");
    } else {
        // Consecutive lanes share an element, so that they read its reduced axis in order.
        let _ = writeln!(out, "  const long long lane = threadIdx.x % {lanes}, element = threadIdx.x / {lanes};");
        let _ = writeln!(out, "  const long long tx = element % {w}, ty = element / {w};");
    }
    let _ = writeln!(out, "  (void)tx; (void)ty;");
    // Block indices, the last grid axis fastest; each grid axis is one axis of the space, or
    // one axis of the slots of a per-request dim of it.
    let _ = writeln!(out, "  long long bid = blockIdx.x;");
    let name = |iter: u32| {
        if iter < SLOT_ITERS {
            format!("o{iter}")
        } else {
            let rel = iter - SLOT_ITERS;
            format!("q{}_{}", rel / 2, rel % 2)
        }
    };
    let n_grid = k.grid.len();
    for (gi, a) in k.grid.iter().enumerate().rev() {
        let n = format!("cleave_ceil_div({}, {}LL)", dim_expr(dims, a.dim), a.tile);
        let lane = if gi + 1 == n_grid {
            " + tx"
        } else if gi + 2 == n_grid {
            " + ty"
        } else {
            ""
        };
        let _ = writeln!(out, "  const long long {} = (bid % {n}) * {}LL{lane}; bid /= {n};", name(a.iter.0), a.tile);
    }
    let _ = writeln!(out, "  (void)bid;");
    for (gi, a) in k.grid.iter().enumerate() {
        if gi + 2 >= n_grid {
            let _ = writeln!(out, "  if ({} >= {}) return;", name(a.iter.0), dim_expr(dims, a.dim));
        }
    }
    if let Some(axes) = &k.positions {
        emit_positions(&st, axes, &mut out);
    }
    let _ = writeln!(out, "  // {rows} rows of {w} elements per block.");
    let value = match &k.value {
        SExpr::Reduce { op, extent, body, batch } => {
            let (start, combine) = match op {
                ReduceOp::Max => ("cleave::xf{-INFINITY, 0}", "xf_max"),
                _ => ("cleave::xf{0.0f, 0}", "xf_add"),
            };
            // Over a per-request dim, the loop runs to the element's request's length.
            let n = st.extent_at(*extent, batch.as_ref());
            let _ = writeln!(out, "  cleave::xf acc = {start};");
            // The loads of the unrolled steps do not depend on `acc`, so they are in flight
            // together (the cost model counts one memory latency per STAGE_UNROLL steps).
            let _ = writeln!(out, "  #pragma unroll {STAGE_UNROLL}");
            if lanes == 1 {
                let _ = writeln!(out, "  for (long long r = 0; r < {n}; ++r) {{");
            } else {
                let _ = writeln!(out, "  for (long long r = lane; r < {n}; r += {lanes}) {{");
            }
            let _ = writeln!(out, "    acc = cleave::{combine}(acc, {});", st.expr(body));
            let _ = writeln!(out, "  }}");
            if lanes > 1 {
                emit_fold(lanes, combine, &mut out);
            }
            if *op == ReduceOp::Mean {
                let _ = writeln!(out, "  acc = cleave::xf_div(acc, cleave::xf_of_double((double)({n})));");
            }
            "acc".to_string()
        }
        e => {
            let _ = writeln!(out, "  const cleave::xf v = {};", st.expr(e));
            "v".to_string()
        }
    };
    let p = &k.params[k.out.0 as usize];
    let index: Vec<Ix> =
        k.space.iter().enumerate().map(|(j, d)| if *d == Dim::One { Ix::Zero } else { Ix::Out(j as u32) }).collect();
    let (at, _) = st.element(p, &index);
    if lanes > 1 {
        let _ = writeln!(out, "  if (lane != 0) return;");
    }
    match p.binding {
        Binding::Workspace(_) => {
            let _ = writeln!(out, "  cleave::st_global(p{}, {at}, {value});", k.out.0);
        }
        _ => {
            let t = ctype(p.dtype);
            let _ = writeln!(
                out,
                "  cleave::st_global(p{}, {at}, cleave::from_float<{t}>(cleave::xf_to_float({value})));",
                k.out.0
            );
        }
    }
    out.push_str("}\n");
    out.push_str(&emu_entry(&k.symbol, &k.params, k.extents.len() + strides.len(), elem));
    out
}

/// Folds the partials of an element's `lanes` lanes into lane 0's `acc`, in the order the
/// interpreter folds them (`plan::interp`): at each step lane `l` below the step's width takes
/// `combine(its own, lane l + width)`, halving the width within a warp; with more than one
/// warp, every thread then folds the warps' results from shared memory the same way.
fn emit_fold(lanes: u32, combine: &str, out: &mut String) {
    let warp = lanes.min(32);
    let _ = writeln!(out, "  // Fold the {lanes} lanes' partials: halves within a warp, then across warps.");
    let _ = writeln!(out, "  for (int s = {}; s > 0; s >>= 1) {{", warp / 2);
    let _ = writeln!(out, "    const float m = __shfl_xor_sync(0xffffffffu, acc.m, s);");
    let _ = writeln!(out, "    const int e = __shfl_xor_sync(0xffffffffu, acc.e, s);");
    let _ = writeln!(out, "    acc = cleave::{combine}(acc, cleave::xf{{m, e}});");
    let _ = writeln!(out, "  }}");
    if lanes > 32 {
        let warps = lanes / 32;
        let _ = writeln!(out, "  cleave::xf* part = reinterpret_cast<cleave::xf*>(cleave::dynamic_smem());");
        let _ = writeln!(out, "  if (lane % 32 == 0) part[lane / 32] = acc;");
        let _ = writeln!(out, "  __syncthreads();");
        let _ = writeln!(out, "  cleave::xf w[{warps}];");
        let _ = writeln!(out, "  for (int i = 0; i < {warps}; ++i) w[i] = part[i];");
        let _ = writeln!(out, "  for (int s = {}; s > 0; s >>= 1) {{", warps / 2);
        let _ = writeln!(out, "    for (int i = 0; i < s; ++i) w[i] = cleave::{combine}(w[i], w[i + s]);");
        let _ = writeln!(out, "  }}");
        let _ = writeln!(out, "  acc = w[0];");
    }
}

/// Defines the space's per-request indices from the grid's positions: a packed dim's position
/// finds its request (binary search over the indptr, the folded batch's index) and its index
/// in it; a padded dim's position is its index. A position past its request's length has no
/// element: the thread returns.
fn emit_positions(st: &Stage<'_>, axes: &[PosAxis], out: &mut String) {
    let position = |j: usize, v: DimVar| -> (String, u64) {
        let ps = st.request(v, "0").2;
        let entry = format!("q{j}_0");
        if ps == 1 {
            (entry, 1)
        } else {
            (format!("({entry} * {ps}LL + q{j}_1)"), ps)
        }
    };
    let space = &st.k.space;
    for (j, a) in axes.iter().enumerate() {
        let PosAxis::Packed(v) = *a else { continue };
        let pr = st.dims.get(v).per_request.as_ref().expect("per-request");
        let folded = axes.iter().position(|x| *x == PosAxis::Folded).expect("a packed dim folds its batch");
        let indptr = st.input_param(pr.indptr().input);
        let batch = dim_expr(st.dims, pr.batch);
        let bound = match &pr.kind {
            PerRequestKind::Ragged { total, .. } => total.map_or_else(|| "0LL".to_string(), |t| dim_expr(st.dims, t)),
            PerRequestKind::Paged { indices, .. } => dim_expr(st.dims, indices.len),
        };
        let (pos, ps) = position(j, v);
        let entry = format!("q{j}_0");
        let _ = writeln!(out, "  // `{}`: position {pos} of its slots, in request o{folded}", st.dims.get(v).name);
        let _ = writeln!(out, "  const long long o{folded} = cleave_request_of(p{indptr}, {batch}, {entry}, {bound});");
        let (start, len, _) = st.request(v, &format!("o{folded}"));
        let _ = writeln!(out, "  const long long o{j} = {pos} - {start} * {ps}LL;");
        let _ = writeln!(out, "  if ({entry} < {start} || o{j} >= {len}) return;");
    }
    for (j, a) in axes.iter().enumerate() {
        let PosAxis::Padded(v) = *a else { continue };
        let pr = st.dims.get(v).per_request.as_ref().expect("per-request");
        let b = space.iter().position(|d| *d == Dim::Var(pr.batch)).expect("a per-request dim has its batch");
        let (pos, _) = position(j, v);
        let (_, len, _) = st.request(v, &format!("o{b}"));
        let _ = writeln!(out, "  const long long o{j} = {pos};");
        let _ = writeln!(out, "  if (o{j} >= {len}) return;");
    }
}
