//! CUDA C++ of the fallback's stage kernels: each thread computes one element of the written
//! tensor in extended-exponent arithmetic (`cleave::xf`), looping over the stage's reduced
//! axis, and every access goes through the checked accessors.

use std::fmt::Write;

use super::cuda::{ctype, dim_expr, emu_entry, stride_factors};
use super::ident;
use crate::graph::{BinaryOp, Dim, DimTable, ReduceOp, UnaryOp};
use crate::plan::program::{stride_params, Binding, Param};
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
    /// The element offset of `index` in parameter `p`: through the runtime strides of an input
    /// or output view, row-major over its shape for a workspace (as the tile kernels address
    /// them).
    fn linear(&self, p: &Param, index: &[Ix]) -> String {
        let mut terms = Vec::new();
        for (a, ix) in index.iter().enumerate() {
            let i = match ix {
                Ix::Zero => continue,
                Ix::Out(j) => format!("o{j}"),
                Ix::Loop => "r".to_string(),
            };
            let stride = stride_factors(p, a, self.dims);
            terms.push(if stride.is_empty() { i } else { format!("{i} * {}", stride.join(" * ")) });
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
                let load = format!("cleave::ld_global(p{}, {})", param.0, self.linear(p, index));
                match p.binding {
                    Binding::Workspace(_) => load,
                    _ => format!("cleave::xf_of_float(cleave::to_float({load}))"),
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
            SExpr::Mask { mask, value, row, col, rows, cols } => {
                let ix = |i: &Ix| match i {
                    Ix::Zero => "0LL".to_string(),
                    Ix::Out(j) => format!("o{j}"),
                    Ix::Loop => "r".to_string(),
                };
                let ext = |d: &Dim| match d {
                    Dim::One => "1LL".to_string(),
                    Dim::Var(v) => dim_expr(self.dims, *v),
                };
                let keep = match mask {
                    crate::graph::Mask::Causal => {
                        format!("({}) <= ({}) + ({}) - ({})", ix(col), ix(row), ext(cols), ext(rows))
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
    let _ = writeln!(out, "  const long long tx = threadIdx.x % {w}, ty = threadIdx.x / {w};");
    let _ = writeln!(out, "  (void)tx; (void)ty;");
    // Block indices, the last grid axis fastest; each grid axis is one axis of the space.
    let _ = writeln!(out, "  long long bid = blockIdx.x;");
    let rank = k.space.len();
    for a in k.grid.iter().rev() {
        let j = a.iter.0 as usize;
        let n = format!("cleave_ceil_div({}, {}LL)", dim_expr(dims, a.dim), a.tile);
        let lane = if j + 1 == rank {
            " + tx"
        } else if j + 2 == rank {
            " + ty"
        } else {
            ""
        };
        let _ = writeln!(out, "  const long long o{j} = (bid % {n}) * {}LL{lane}; bid /= {n};", a.tile);
    }
    let _ = writeln!(out, "  (void)bid;");
    for a in &k.grid {
        let j = a.iter.0 as usize;
        if j + 2 >= rank {
            let _ = writeln!(out, "  if (o{j} >= {}) return;", dim_expr(dims, a.dim));
        }
    }
    let _ = writeln!(out, "  // {rows} rows of {w} elements per block.");
    let value = match &k.value {
        SExpr::Reduce { op, extent, body } => {
            let (start, combine) = match op {
                ReduceOp::Max => ("cleave::xf{-INFINITY, 0}", "xf_max"),
                _ => ("cleave::xf{0.0f, 0}", "xf_add"),
            };
            let n = match extent {
                Dim::One => "1LL".to_string(),
                Dim::Var(v) => dim_expr(dims, *v),
            };
            let _ = writeln!(out, "  cleave::xf acc = {start};");
            let _ = writeln!(out, "  for (long long r = 0; r < {n}; ++r) {{");
            let _ = writeln!(out, "    acc = cleave::{combine}(acc, {});", st.expr(body));
            let _ = writeln!(out, "  }}");
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
    let at = st.linear(p, &index);
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
