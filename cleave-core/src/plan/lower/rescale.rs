//! The statements of stabilization: running maxima, `exp(x - m)`, and the rescaling of every
//! accumulator when a maximum grows. What gets stabilized is decided by
//! [`stabilize`](super::stabilize); this only writes it out.

use std::collections::BTreeMap;

use super::ops::tile_2d;
use super::stabilize::{Cover, Stabilized};
use super::{Lowerer, Scale, Value};
use crate::graph::{BinaryOp, DType, NodeId, Op, ReduceOp};
use crate::index::{AxisRange, TMap};
use crate::plan::error::PlanError;
use crate::plan::program::{Binding, BufId, BufKind, Expr, Src, Stmt};

impl Lowerer<'_> {
    /// Before a loop: each stabilized source of the loop level gets a running max starting at
    /// -inf, and its accumulators are scaled by `exp(m)` from the start (zero is zero at any
    /// scale).
    ///
    /// A max per element ([`Cover::Element`]) takes the layout of the accumulators it scales,
    /// which must share one.
    pub(super) fn start_running_maxima(
        &mut self,
        stab: &BTreeMap<NodeId, Stabilized>,
        body: &mut Vec<Stmt>,
    ) -> Result<(), PlanError> {
        for (src, st) in stab {
            if st.accumulators.is_empty() || st.shares_max_with.is_some() {
                continue;
            }
            let kind = match st.cover {
                Cover::Row => BufKind::Rows,
                Cover::Element { .. } => {
                    let mut kinds = st.accumulators.iter().map(|a| match self.values.get(a) {
                        Some(Value::Reg { expr: Expr::Src(Src::Reg(b)), .. }) => Some(self.bufs[b.0 as usize].kind),
                        _ => None,
                    });
                    let first = kinds.next().flatten().ok_or(PlanError::MissingAccumulator(st.accumulators[0]))?;
                    if let Some(i) = kinds.position(|k| k != Some(first)) {
                        return Err(PlanError::ExpReduction(st.accumulators[i + 1]));
                    }
                    first
                }
            };
            let m = self.buf(format!("t{}_m", src.0), kind);
            if matches!(st.cover, Cover::Element { .. }) {
                self.element_maxima.insert(m);
            }
            body.push(Stmt::Assign { dst: m, expr: Expr::constant(f64::NEG_INFINITY) });
            self.running_max.insert(*src, m);
            for a in &st.accumulators {
                if let Some(Value::Reg { scale, .. }) = self.values.get_mut(a) {
                    *scale = Some(Scale { m, degree: 1 });
                }
            }
        }
        Ok(())
    }

    /// Stabilized `exp(x)`: masks columns outside the tensor to -inf, updates the running max
    /// (or takes a one-shot max) and returns `exp(x - m)` scaled by `exp(m)`.
    pub(super) fn stabilize_exp(
        &mut self,
        id: NodeId,
        x: Expr,
        xs: Option<Scale>,
        st: &Stabilized,
        tm: &TMap,
        body: &mut Vec<Stmt>,
    ) -> Result<Value, PlanError> {
        if xs.is_some() {
            return Err(PlanError::ExpOfScaled);
        }
        let cols = tm.axes.last().map_or(1, |a| a.extent);
        let limits = tm.axes.last().map(|a| a.limits.clone()).unwrap_or_default();
        // A positive constant scale (softmax's `scores · sm_scale`) is kept out of the masked
        // tile: the row max is taken unscaled and scaled once per row (rounding is monotone,
        // so `fl(c · max x) = max fl(c · x)` exactly), and the exponent applies it, which
        // code generation folds into its one multiply-add per element.
        let (scale, x) = match x.positive_scale() {
            Some((c, inner)) => (Some(c), inner.clone()),
            None => (None, x),
        };
        let scaled = |e: Expr| match scale {
            Some(c) => Expr::bin(BinaryOp::Mul, Expr::constant(c), e),
            None => e,
        };
        if let Some(b) = st.stored_max {
            // The max an earlier kernel took over the whole row of this same exponent (merged
            // here first, when it stored one per chunk of the row): no element exceeds it, so
            // the exp needs no max of its own, and columns past the tensor are never stored.
            let m = match self.merged_max(b) {
                Some(Some(m)) => m,
                Some(None) => return Err(PlanError::ShiftBeforeMerge(id)),
                None => self.stored_shift(b, tm, body),
            };
            let e = Expr::ExpDiff(Box::new(scaled(x)), Box::new(Expr::reg(m)));
            return Ok(Value::Reg { expr: e, cols, scale: Some(Scale { m, degree: 1 }) });
        }
        if let Cover::Element { axis } = st.cover {
            // Each element is its own max: the tile itself is this iteration's maximum. A
            // slice past the end of its axis (the last chunk of a ragged split) is -inf, which
            // moves no max and adds nothing.
            let limits = tm.axes.get(axis as usize).map(|a| a.limits.clone()).unwrap_or_default();
            let x = if limits.is_empty() { x } else { Expr::MaskSlice(Box::new(x), limits, f64::NEG_INFINITY) };
            let xb = self.materialize(format!("t{}_x", id.0), x, cols, body);
            let m = self.update_max(id, scaled(Expr::reg(xb)), st, body);
            if self.bufs[m.0 as usize].kind != self.bufs[xb.0 as usize].kind {
                return Err(PlanError::ExpReduction(st.accumulators.first().copied().unwrap_or(id)));
            }
            let e = Expr::ExpDiff(Box::new(scaled(Expr::reg(xb))), Box::new(Expr::reg(m)));
            return Ok(Value::Reg { expr: e, cols, scale: Some(Scale { m, degree: 1 }) });
        }
        let x = if limits.is_empty() { x } else { Expr::MaskCols(Box::new(x), limits, f64::NEG_INFINITY) };
        let xb = self.materialize(format!("t{}_x", id.0), x, cols, body);
        let m_tile = self.buf(format!("t{}_mt", id.0), BufKind::Rows);
        body.push(Stmt::RowReduce {
            dst: m_tile,
            op: ReduceOp::Max,
            expr: Expr::reg(xb),
            cols,
            mask: Vec::new(),
            acc: false,
        });
        let m = self.update_max(id, scaled(Expr::reg(m_tile)), st, body);
        let e = Expr::ExpDiff(Box::new(scaled(Expr::reg(xb))), Box::new(Expr::reg(m)));
        Ok(Value::Reg { expr: e, cols, scale: Some(Scale { m, degree: 1 }) })
    }

    /// A scaled partial input `x · exp(m_in)`: merges `m_in` into the running max and returns
    /// `x · exp(m_in - m)` scaled by `exp(m)`.
    pub(super) fn scaled_input(
        &mut self,
        id: NodeId,
        tile: &Value,
        tm: &TMap,
        max_binding: Binding,
        stab: &BTreeMap<NodeId, Stabilized>,
        body: &mut Vec<Stmt>,
    ) -> Result<Value, PlanError> {
        let Some(st) = stab.get(&id) else {
            return Err(PlanError::UnreducedScaledPartial);
        };
        if let Some(b) = st.stored_max {
            // Read as stored, on its own max: `x` scaled by `exp(m_in)`.
            let m = self.stored_shift(b, tm, body);
            let (x, cols, _) = self.as_reg(tile, tm)?;
            return Ok(Value::Reg { expr: x, cols, scale: Some(Scale { m, degree: 1 }) });
        }
        let (m, mbuf) = match st.shares_max_with {
            // The earlier partial already folded this iteration's max in; reuse its tile.
            Some(first) => (self.running_max[&first], self.partial_max_tile[&first]),
            None => {
                // A max per row is one column; a max per element is shaped like the partial.
                let mut mtm = tm.clone();
                if let (Some(last), Cover::Row) = (mtm.axes.last_mut(), st.cover) {
                    *last = AxisRange::unit();
                }
                let (rows, cols) = tile_2d(&mtm);
                let mbuf =
                    self.buf(format!("{}_max", self.name_of(id)), BufKind::Smem { dtype: DType::F32, rows, cols });
                let param = self.param_of[&max_binding];
                body.push(Stmt::Load { dst: mbuf, param, tmap: mtm, trans: false });
                self.partial_max_tile.insert(id, mbuf);
                (self.update_max(id, Expr::Src(Src::Tile(mbuf)), st, body), mbuf)
            }
        };
        let (x, cols, _) = self.as_reg(tile, tm)?;
        let f = Expr::ExpDiff(Box::new(Expr::Src(Src::Tile(mbuf))), Box::new(Expr::reg(m)));
        Ok(Value::Reg { expr: Expr::bin(BinaryOp::Mul, x, f), cols, scale: Some(Scale { m, degree: 1 }) })
    }

    /// For a max stored at `binding` next to partials this kernel merges (reduces): the merged
    /// running max, once the merge has started (`Some(None)` before). `None` when no reduction
    /// here reads those partials.
    fn merged_max(&self, binding: Binding) -> Option<Option<BufId>> {
        let g = self.g;
        let users = &self.users;
        let partials: Vec<NodeId> = g
            .ids()
            .filter(|id| match g.node(*id).op {
                Op::Input(i) => self.io.scaled_inputs.get(&(i as usize)) == Some(&binding),
                _ => false,
            })
            .collect();
        let merged = partials.iter().any(|p| users[p.index()].iter().any(|u| matches!(g.node(*u).op, Op::Reduce(..))));
        merged.then(|| partials.iter().find_map(|p| self.running_max.get(p).copied()))
    }

    /// The per-row max an earlier kernel stored at `binding`, read into registers once for
    /// every source it shifts (one value per row of the block).
    fn stored_shift(&mut self, binding: Binding, tm: &TMap, body: &mut Vec<Stmt>) -> BufId {
        if let Some(&m) = self.stored_shift.get(&binding) {
            return m;
        }
        let mut mtm = tm.clone();
        if let Some(last) = mtm.axes.last_mut() {
            *last = AxisRange::unit();
        }
        let param = self.param_of[&binding];
        let tile = self.buf(
            format!("ws{}_max", self.stored_shift.len()),
            BufKind::Smem { dtype: DType::F32, rows: tile_2d(&mtm).0, cols: 1 },
        );
        body.push(Stmt::Load { dst: tile, param, tmap: mtm, trans: false });
        let m = self.buf(format!("ws{}_m", self.stored_shift.len()), BufKind::Rows);
        body.push(Stmt::Assign { dst: m, expr: Expr::Src(Src::Tile(tile)) });
        self.stored_shift.insert(binding, m);
        m
    }

    /// Folds a per-row (or, for [`Cover::Element`], per-element) maximum into the running max
    /// of `src` (rescaling its accumulators), or makes it the one-shot max. Returns the buffer
    /// holding the max to subtract.
    fn update_max(&mut self, src: NodeId, m_tile: Expr, st: &Stabilized, body: &mut Vec<Stmt>) -> BufId {
        let Some(&m) = self.running_max.get(&src).filter(|_| !st.accumulators.is_empty()) else {
            let m = self.buf(format!("t{}_m", src.0), BufKind::Rows);
            body.push(Stmt::Assign { dst: m, expr: m_tile });
            self.max_source_of.insert(m, src);
            return m;
        };
        self.max_source_of.insert(m, src);
        let kind = self.bufs[m.0 as usize].kind;
        let m_new = self.buf(format!("t{}_mn", src.0), kind);
        body.push(Stmt::Assign { dst: m_new, expr: Expr::bin(BinaryOp::Max, Expr::reg(m), m_tile) });
        let c = self.buf(format!("t{}_c", src.0), kind);
        body.push(Stmt::Assign { dst: c, expr: Expr::ExpDiff(Box::new(Expr::reg(m)), Box::new(Expr::reg(m_new))) });
        for &a in &st.accumulators {
            if let Some(Value::Reg { expr: Expr::Src(Src::Reg(b)), .. }) = self.values.get(&a).cloned() {
                body.push(Stmt::Assign { dst: b, expr: Expr::bin(BinaryOp::Mul, Expr::reg(b), Expr::reg(c)) });
            }
        }
        body.push(Stmt::Assign { dst: m, expr: Expr::reg(m_new) });
        m
    }
}
