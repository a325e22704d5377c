//! Runtime extents: which dynamic dims a kernel reads, so that exactly those become its
//! arguments.

use std::collections::BTreeSet;

use super::Lowerer;
use crate::graph::{Dim, DimKind, DimVar, Graph, PerRequestKind, StoreAxis};
use crate::index::{Affine, TMap};
use crate::plan::program::{Expr, GridAxis, Param, Src, Stmt};

impl Lowerer<'_> {
    /// A dim's extent as an expression: a constant, or the runtime extent of a dynamic dim
    /// (which the kernel then takes as an argument).
    pub(super) fn extent_expr(&mut self, d: Dim) -> Expr {
        match d {
            Dim::One => Expr::constant(1.0),
            Dim::Var(v) => {
                let info = self.g.dims.get(v);
                if info.dynamic {
                    self.extents.insert(v);
                    Expr::Src(Src::Extent(v))
                } else {
                    Expr::constant(info.value as f64)
                }
            }
        }
    }
}

/// The dims a kernel takes as arguments, in order: the dynamic ones its grid, its body and its
/// expressions (`used`) read, with a split chunk replaced by the axis and count it derives from
/// (the kernel computes `ceil(K / s)` itself).
pub(super) fn runtime_extents(
    g: &Graph,
    grid: &[GridAxis],
    body: &[Stmt],
    params: &[Param],
    mut used: BTreeSet<DimVar>,
) -> Vec<DimVar> {
    used.extend(grid.iter().map(|a| a.dim));
    collect_extents(body, &mut used);
    // A per-request dim's extent is computed in the kernel from its tables; the kernel takes
    // what bounds them instead: the batch, the packed axis' extent, the page table's length.
    for p in params {
        used.extend(p.shape.iter().flatten());
        if let Some(l) = &p.layout {
            for a in &l.axes {
                match a {
                    StoreAxis::Dims(ds) => used.extend(ds),
                    StoreAxis::Packed { total, .. } => {
                        used.insert(*total);
                    }
                    StoreAxis::Pages { pages, .. } => {
                        used.insert(*pages);
                    }
                    StoreAxis::PlusOne(d) => {
                        used.insert(*d);
                    }
                    StoreAxis::Slot { size: Dim::Var(d), .. } => {
                        used.insert(*d);
                    }
                    StoreAxis::One | StoreAxis::Slot { .. } => {}
                }
            }
        }
    }
    let mut expanded = BTreeSet::new();
    for d in used {
        match g.dims.get(d).kind {
            DimKind::SplitChunk { of, count } => {
                expanded.extend([of, count]);
            }
            _ => {
                expanded.insert(d);
            }
        }
    }
    let mut out = BTreeSet::new();
    for d in expanded {
        let info = g.dims.get(d);
        match &info.per_request {
            Some(pr) => {
                out.insert(pr.batch);
                for t in pr.tables() {
                    out.insert(t.len);
                }
                if let PerRequestKind::Ragged { total: Some(t), .. } = pr.kind {
                    out.insert(t);
                }
            }
            None => {
                out.insert(d);
            }
        }
    }
    out.into_iter().filter(|d| g.dims.get(*d).dynamic && g.dims.get(*d).per_request.is_none()).collect()
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
            Expr::MaskCols(a, limits, _) | Expr::MaskSlice(a, limits, _) => {
                expr(a, out);
                for l in limits {
                    out.insert(l.bound);
                    affine(&l.base, out);
                }
            }
            Expr::Mask(a, at) => {
                expr(a, out);
                for c in [&at.row, &at.col] {
                    affine(&c.base, out);
                    out.extend(c.extent);
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
            Stmt::Mma { .. } | Stmt::Stage { .. } | Stmt::Merge { .. } => {}
            Stmt::Loop { dim, body, .. } => {
                out.insert(*dim);
                collect_extents(body, out);
            }
        }
    }
}
