//! Lowering of each graph op to tile statements, and the value conversions they share.

use std::collections::{BTreeMap, BTreeSet};

use super::stabilize::Stabilized;
use super::{Lowerer, Scale, Value};
use crate::graph::{BinaryOp, DType, Dim, DimKind, Mask, NodeId, Op, ReduceOp, UnaryOp};
use crate::index::{Affine, AxisRange, TMap};
use crate::plan::error::PlanError;
use crate::plan::program::{Binding, BufId, BufKind, Coord, Expr, MaskAt, MmaA, MmaB, MmaKind, Src, Stmt};
use crate::schedule::build::transposed_output;
use crate::schedule::itgraph::ItGraph;

/// How a staged tile's non-last axes relate to the block's rows.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum RowLayout {
    /// The tile's rows are the block's rows.
    Block,
    /// Every row axis of the tile is a unit: one row, broadcast to all.
    Broadcast,
}

/// The exponent of an exp expression: `x` of `exp(x)`, `a - b` of `exp(a - b)`.
fn exponent(e: &Expr) -> Option<Expr> {
    match e {
        Expr::Unary(UnaryOp::Exp, x) => Some(x.as_ref().clone()),
        Expr::ExpDiff(a, b) => Some(Expr::bin(BinaryOp::Sub, a.as_ref().clone(), b.as_ref().clone())),
        _ => None,
    }
}

/// A tile's shared-memory shape: its non-last axes flattened into rows, its last axis as
/// columns.
pub(super) fn tile_2d(tm: &TMap) -> (u64, u64) {
    match tm.axes.split_last() {
        None => (1, 1),
        Some((last, rest)) => (rest.iter().map(|a| a.extent).product::<u64>().max(1), last.extent),
    }
}

impl Lowerer<'_> {
    /// How a tile's rows relate to the block's rows; `None` when the tile broadcasts over some
    /// row axes but not all (no layout can express that).
    pub(super) fn row_layout(&self, tm: &TMap) -> Option<RowLayout> {
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
            Some(RowLayout::Block)
        } else if all_unit {
            Some(RowLayout::Broadcast)
        } else {
            None
        }
    }

    /// A value as a block-layout expression, with its column count and scale.
    pub(super) fn as_reg(&mut self, v: &Value, tm: &TMap) -> Result<(Expr, u64, Option<Scale>), PlanError> {
        let cols = tm.axes.last().map_or(1, |a| a.extent);
        match v {
            Value::Const(c) => Ok((Expr::constant(*c), cols, None)),
            Value::Reg { expr, cols, scale } => Ok((expr.clone(), *cols, *scale)),
            Value::Tile { buf, tmap, trans } => {
                if *trans {
                    // A column as stored, seen as a row broadcast over the block's rows (a
                    // scale per column of a product's left operand, declared as `[k, 1]`):
                    // its rows are the block's columns. Any other transposed tile would need
                    // a transposed read of shared memory, which elementwise code lacks.
                    let BufKind::Smem { cols: 1, rows, .. } = self.bufs[buf.0 as usize].kind else {
                        return Err(PlanError::TransposedElementwise);
                    };
                    if self.row_layout(tmap) != Some(RowLayout::Broadcast) {
                        return Err(PlanError::TransposedElementwise);
                    }
                    // One element (a `[1, 1]` tensor) is the same transposed: read as a tile, it
                    // broadcasts over the block's columns too, where a column read would stop
                    // after the tile's one row.
                    if rows == 1 {
                        return Ok((Expr::Src(Src::Tile(*buf)), 1, None));
                    }
                    return Ok((Expr::Src(Src::Column(*buf)), cols, None));
                }
                if self.row_layout(tmap).is_none() {
                    return Err(PlanError::PartialRowBroadcast);
                }
                Ok((Expr::Src(Src::Tile(*buf)), tmap.axes.last().map_or(1, |a| a.extent), None))
            }
        }
    }

    /// Whether input node `id` (input `i`, tile `tm`) is staged transposed: every use of it
    /// is a transpose, and the kernel has no product, whose operands the tensor cores read
    /// transposed from an untransposed tile anyway. The transposed tile is what lets a
    /// reduction over a column run as a row reduction. Its leading axes must be single
    /// indices (a batch position), so that its rows are the tensor's last axis alone; an
    /// input a previous kernel stored scaled or with a paged layout keeps the plain copy.
    fn loads_transposed(&self, id: NodeId, i: usize, tm: &TMap) -> bool {
        let users = &self.users[id.0 as usize];
        let r = tm.axes.len();
        !users.is_empty()
            && users.iter().all(|u| self.g.node(*u).op == Op::Transpose)
            && !self.g.ids().any(|n| self.g.node(n).op == Op::MatMul)
            && r >= 2
            && tm.axes[..r - 2].iter().all(|a| a.extent == 1)
            && !self.io.scaled_inputs.contains_key(&i)
            && matches!(self.io.inputs[i], Binding::Input(_) | Binding::Workspace(_))
            && self.g.inputs[i].decl.layout.is_none()
    }

    /// Rescales a value to its true magnitude.
    pub(super) fn normalize(&self, e: Expr, s: Option<Scale>) -> Expr {
        match s {
            Some(Scale { m, degree }) if degree != 0 => {
                let f = if degree == 1 {
                    Expr::reg(m)
                } else {
                    Expr::bin(BinaryOp::Mul, Expr::reg(m), Expr::constant(f64::from(degree)))
                };
                Expr::bin(BinaryOp::Mul, e, Expr::Unary(UnaryOp::Exp, Box::new(f)))
            }
            _ => e,
        }
    }

    /// Materializes a block value into a register buffer named `name` (a register read is
    /// returned as it is).
    pub(super) fn materialize(&mut self, name: String, expr: Expr, cols: u64, body: &mut Vec<Stmt>) -> BufId {
        if let Expr::Src(Src::Reg(b)) = expr {
            return b;
        }
        let kind = if cols == 1 { BufKind::Rows } else { BufKind::Frag { cols, whole: false } };
        let b = self.buf(name, kind);
        if let Some(l) = self.log_form(&expr) {
            self.log_regs.insert(b, l);
        }
        self.assigned.insert(b, expr.clone());
        body.push(Stmt::Assign { dst: b, expr });
        b
    }

    /// `log(e)`, computed so that a factor of `e` that is an exp never passes through f32 as
    /// an exp: `log(exp(x) / s)` is `x - log(s)`, finite where `exp(x)` underflows (a
    /// log-softmax far below its row's max). The rewrite holds at every sign: an exp is
    /// positive, so `log(p · q)` and `log(p) + log(q)` are NaN together.
    pub(super) fn log_of(&self, e: Expr) -> Expr {
        self.log_form(&e).unwrap_or_else(|| Expr::Unary(UnaryOp::Log, Box::new(e)))
    }

    /// The log of `e` taken through its exp factors, when it has one: an exp's exponent, a
    /// register this level assigned such a value to, or a product or quotient with such a
    /// factor.
    fn log_form(&self, e: &Expr) -> Option<Expr> {
        if let Some(x) = exponent(e) {
            return Some(x);
        }
        match e {
            Expr::Src(Src::Reg(b)) => self.log_regs.get(b).cloned(),
            Expr::Binary(op @ (BinaryOp::Mul | BinaryOp::Div), p, q) => {
                let (lp, lq) = (self.log_form(p), self.log_form(q));
                if lp.is_none() && lq.is_none() {
                    return None;
                }
                let log =
                    |l: Option<Expr>, x: &Expr| l.unwrap_or_else(|| Expr::Unary(UnaryOp::Log, Box::new(x.clone())));
                let sum = if *op == BinaryOp::Mul { BinaryOp::Add } else { BinaryOp::Sub };
                Some(Expr::bin(sum, log(lp, p), log(lq, q)))
            }
            _ => None,
        }
    }

    pub(super) fn op(
        &mut self,
        id: NodeId,
        it: &ItGraph,
        accs: &BTreeSet<NodeId>,
        stab: &BTreeMap<NodeId, Stabilized>,
        body: &mut Vec<Stmt>,
    ) -> Result<(), PlanError> {
        let n = self.g.node(id).clone();
        let tm = it.tmaps.get(&id).cloned().ok_or(PlanError::UsedBeforeComputed(id))?;
        let cols = tm.axes.last().map_or(1, |a| a.extent);
        // A value scaled by a running max per element holds each element on a scale of its
        // own: ops that combine elements (a product, a reduction along the row) would add
        // values on different scales, so only element-by-element ops read it. A reduction
        // along a non-last axis accumulates element by element, under the same max.
        let combines = match n.op {
            Op::MatMul => true,
            Op::Reduce(_, axis) => axis as usize + 1 == self.g.shape(n.args[0]).len(),
            _ => false,
        };
        if combines && n.args.iter().any(|a| self.scaled_per_element(*a)) {
            return Err(PlanError::ElementScalesCombined(id));
        }
        let val = match n.op {
            Op::Const(c) => Value::Const(c),
            // A scalar input is a kernel argument, read by value: no tile to stage. (A scalar
            // workspace between the kernels of a launch is staged like any tile.)
            Op::Input(i) if n.shape.is_empty() && matches!(self.io.inputs[i as usize], Binding::Input(_)) => {
                let param = self.param_of[&self.io.inputs[i as usize]];
                Value::Reg { expr: Expr::Src(Src::Scalar(param)), cols: 1, scale: None }
            }
            Op::Input(i) => {
                let trans = self.loads_transposed(id, i as usize, &tm);
                let (rows, cols) = if trans { (cols, tile_2d(&tm).0) } else { tile_2d(&tm) };
                let dtype = self.g.inputs[i as usize].decl.dtype;
                let b = self.buf(self.name_of(id), BufKind::Smem { dtype, rows, cols });
                let param = self.param_of[&self.io.inputs[i as usize]];
                body.push(Stmt::Load { dst: b, param, tmap: tm.clone(), trans });
                let tile = Value::Tile { buf: b, tmap: tm.clone(), trans };
                if let Some(mb) = self.io.scaled_inputs.get(&(i as usize)).copied() {
                    self.scaled_input(id, &tile, &tm, mb, stab, body)?
                } else {
                    tile
                }
            }
            Op::Transpose => match self.value(n.args[0])? {
                Value::Tile { buf, tmap, trans } => {
                    let mut tmap = tmap;
                    let r = tmap.axes.len();
                    tmap.axes.swap(r - 1, r - 2);
                    Value::Tile { buf, tmap, trans: !trans }
                }
                // An output computed transposed: its store writes the operand's block
                // transposed (see `stores`), and nothing reads it here.
                _ if self.users[id.index()].is_empty() && transposed_output(self.g, id) => return Ok(()),
                _ => return Err(PlanError::TransposeOfComputed),
            },
            Op::Split(_) => match self.value(n.args[0])? {
                Value::Tile { buf, trans: false, .. } => Value::Tile { buf, tmap: tm.clone(), trans: false },
                _ => return Err(PlanError::SplitOfComputed),
            },
            Op::Unary(u) => self.unary(id, u, it, &tm, cols, stab, body)?,
            Op::Mask(m) => self.mask(id, m, it, &tm)?,
            Op::Binary(op) => self.binary(id, op, it, cols)?,
            // A product with one column (a matrix-vector product) has nothing for the tensor
            // cores: each row is a dot product, in f32 whatever the vector's type.
            Op::MatMul if self.g.shape(n.args[1]).last() == Some(&Dim::One) => self.matvec(id, it, accs, body)?,
            Op::MatMul => self.matmul(id, it, accs, cols, body)?,
            Op::Reduce(op, axis) => self.reduce(id, op, axis, it, accs, cols, body)?,
        };
        // A value read more than once is computed once.
        let val = match val {
            Value::Reg { expr, cols, scale } if self.users[id.index()].len() > 1 && !matches!(expr, Expr::Src(_)) => {
                let b = self.materialize(self.name_of(id), expr, cols, body);
                Value::Reg { expr: Expr::reg(b), cols, scale }
            }
            v => v,
        };
        self.values.insert(id, val);
        Ok(())
    }

    /// Whether `id`'s value is scaled by a running max per element ([`Cover::Element`]).
    ///
    /// [`Cover::Element`]: super::stabilize::Cover::Element
    fn scaled_per_element(&self, id: NodeId) -> bool {
        match self.values.get(&id) {
            Some(Value::Reg { scale: Some(Scale { m, degree }), .. }) => {
                *degree != 0 && self.element_maxima.contains(m)
            }
            _ => false,
        }
    }

    /// The lowered value of an operand. An operand the loop walk has not reached (a value
    /// consumed in a loop level above the one that computes it) is a rejection of this
    /// schedule, never a panic.
    fn value(&self, id: NodeId) -> Result<Value, PlanError> {
        self.values.get(&id).cloned().ok_or(PlanError::UsedBeforeComputed(id))
    }

    /// The lowered value of an operand as a block-layout expression.
    fn arg(&mut self, id: NodeId, it: &ItGraph) -> Result<(Expr, u64, Option<Scale>), PlanError> {
        let v = self.value(id)?;
        let tm = it.tmaps.get(&id).cloned().unwrap_or(TMap { axes: Vec::new() });
        self.as_reg(&v, &tm)
    }

    #[allow(clippy::too_many_arguments)]
    fn unary(
        &mut self,
        id: NodeId,
        u: UnaryOp,
        it: &ItGraph,
        tm: &TMap,
        cols: u64,
        stab: &BTreeMap<NodeId, Stabilized>,
        body: &mut Vec<Stmt>,
    ) -> Result<Value, PlanError> {
        let (e, _, s) = self.arg(self.g.node(id).args[0], it)?;
        if let Some(st) = stab.get(&id).filter(|_| u == UnaryOp::Exp) {
            return self.stabilize_exp(id, e, s, st, tm, body);
        }
        let (e, s) = match (u, s) {
            // log(x · exp(m)^d) = log(x) + d · m: the scale leaves through the log.
            (UnaryOp::Log, Some(sc)) if sc.degree != 0 => {
                let f = Expr::bin(BinaryOp::Mul, Expr::reg(sc.m), Expr::constant(f64::from(sc.degree)));
                (Expr::bin(BinaryOp::Add, self.log_of(e), f), None)
            }
            (UnaryOp::Log, s) => (self.log_of(e), s),
            // Negation keeps a running-max scale (it is linear); nothing else may carry one.
            (UnaryOp::Neg, s) => (Expr::Unary(u, Box::new(e)), s),
            (_, Some(sc)) if sc.degree != 0 => return Err(PlanError::LeavesRunningMaxScale),
            (_, s) => (Expr::Unary(u, Box::new(e)), s),
        };
        Ok(Value::Reg { expr: e, cols, scale: s })
    }

    /// A mask: the value where the mask keeps the element, `-inf` elsewhere. A running-max
    /// scale carries through (`-inf` times a positive scale is `-inf`).
    fn mask(&mut self, id: NodeId, m: Mask, it: &ItGraph, tm: &TMap) -> Result<Value, PlanError> {
        let arg = self.g.node(id).args[0];
        let (e, cols, s) = self.arg(arg, it)?;
        let r = tm.axes.len();
        if self.row_layout(tm).is_none() {
            return Err(PlanError::PartialRowBroadcast);
        }
        let shape = self.g.shape(id).to_vec();
        let row = self.coord(&tm.axes[r - 2], shape[r - 2]);
        let col = self.coord(&tm.axes[r - 1], shape[r - 1]);
        Ok(Value::Reg { expr: Expr::Mask(Box::new(e), Box::new(MaskAt { mask: m, row, col })), cols, scale: s })
    }

    /// Where the elements of a tile lie along axis `d` of the masked tensor, in the whole axis:
    /// a split chunk's elements count from the start of their part (the base its limit on the
    /// unsplit axis carries).
    fn coord(&mut self, ax: &AxisRange, d: Dim) -> Coord {
        let (base, extent) = match d {
            Dim::One => (Affine::zero(), None),
            Dim::Var(v) => match self.g.dims.get(v).kind {
                DimKind::SplitChunk { of, .. } => {
                    let base =
                        ax.limits.iter().find(|l| l.bound == of).map_or_else(|| ax.offset.clone(), |l| l.base.clone());
                    (base, Some(of))
                }
                _ => (ax.offset.clone(), Some(v)),
            },
        };
        if let Some(v) = extent {
            if self.g.dims.get(v).dynamic {
                self.extents.insert(v);
            }
        }
        Coord { base, div: 1, ext: ax.extent, extent }
    }

    fn binary(&mut self, id: NodeId, op: BinaryOp, it: &ItGraph, cols: u64) -> Result<Value, PlanError> {
        let args = self.g.node(id).args.clone();
        let (a, _, sa) = self.arg(args[0], it)?;
        let (b, _, sb) = self.arg(args[1], it)?;
        let deg = |s: Option<Scale>| s.map_or(0, |s| s.degree);
        let same_m = match (sa, sb) {
            (Some(x), Some(y)) => x.m == y.m,
            _ => true,
        };
        let m = sa.or(sb).map(|s| s.m);
        if op == BinaryOp::Div && deg(sb) > 0 && self.shifted_elementwise(args[1]) {
            return Err(PlanError::ShiftedExpDivisor(id));
        }
        let scale = match op {
            BinaryOp::Mul if same_m => Some(deg(sa) + deg(sb)),
            BinaryOp::Div if same_m => Some(deg(sa) - deg(sb)),
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Max if same_m && deg(sa) == deg(sb) => Some(deg(sa)),
            _ if deg(sa) != 0 || deg(sb) != 0 => return Err(PlanError::LeavesRunningMaxScale),
            _ => None,
        };
        let scale = match (scale, m) {
            (Some(d), Some(m)) if d != 0 => Some(Scale { m, degree: d }),
            _ => None,
        };
        // `x - (log(l) + d·m)`, a log-softmax against a log-sum-exp whose running max left
        // through its log: subtract the max first. Where it matters, at the row's max, `x`
        // and `m` are equal and `x - m` is exact; rounding `log(l) + m` first would lose a
        // small `log(l)` to the ulp of `m` (6e-5 at 1000).
        if let (BinaryOp::Sub, Expr::Binary(BinaryOp::Add, l, max)) = (op, &b) {
            if self.is_max_term(max) {
                let shifted = Expr::bin(BinaryOp::Sub, a, max.as_ref().clone());
                return Ok(Value::Reg { expr: Expr::bin(BinaryOp::Sub, shifted, l.as_ref().clone()), cols, scale });
            }
        }
        Ok(Value::Reg { expr: Expr::bin(op, a, b), cols, scale })
    }

    /// Whether node `id` is computed from an exp element by element, through no reduction or
    /// product: on a running max's scale such a value holds `exp(x - m)`, which underflows far
    /// below the max (see [`PlanError::ShiftedExpDivisor`]).
    fn shifted_elementwise(&self, id: NodeId) -> bool {
        let mut stack = vec![id];
        let mut seen = vec![false; self.g.nodes.len()];
        while let Some(x) = stack.pop() {
            if std::mem::replace(&mut seen[x.index()], true) {
                continue;
            }
            let n = self.g.node(x);
            match n.op {
                Op::Unary(UnaryOp::Exp) => return true,
                Op::Unary(_) | Op::Binary(_) | Op::Mask(_) | Op::Split(_) | Op::Transpose => {
                    stack.extend(n.args.iter().copied());
                }
                _ => {}
            }
        }
        false
    }

    /// Whether `e` is `d · m` for a running or stored max `m`, the term a log adds back.
    fn is_max_term(&self, e: &Expr) -> bool {
        let Expr::Binary(BinaryOp::Mul, m, d) = e else { return false };
        let (Expr::Src(Src::Reg(m)), Expr::Src(Src::Const(_))) = (m.as_ref(), d.as_ref()) else { return false };
        self.max_source_of.contains_key(m) || self.stored_shift.values().any(|s| s == m)
    }

    fn matmul(
        &mut self,
        id: NodeId,
        it: &ItGraph,
        accs: &BTreeSet<NodeId>,
        cols: u64,
        body: &mut Vec<Stmt>,
    ) -> Result<Value, PlanError> {
        let n = self.g.node(id).clone();
        let (a, b) = (self.value(n.args[0])?, self.value(n.args[1])?);
        let mut scale = None;
        let (ma, k) = match a {
            Value::Tile { buf, tmap, trans } => {
                if self.row_layout(&tmap) != Some(RowLayout::Block) {
                    return Err(PlanError::LeftOperandRows);
                }
                // A transposed operand is read by 16-byte rows along the block's rows, which a
                // block of a ragged row count would read past.
                if trans && self.rows % 16 != 0 {
                    return Err(PlanError::TransposedLeftOperandRows { rows: self.rows });
                }
                // Its tile holds each matrix as `k × rows`, one after another, but its loads
                // (and the interpreter) read the block's rows as the columns of one matrix:
                // rows past the first matrix's read the next one's depth (generated seed 1229).
                let r = tmap.axes.len();
                if trans && tmap.axes[..r.saturating_sub(2)].iter().any(|x| x.extent != 1) {
                    return Err(PlanError::TransposedLeftOperandBatched);
                }
                (MmaA::Smem { buf, trans }, tmap.axes.last().map_or(1, |x| x.extent))
            }
            Value::Reg { expr, cols: k, scale: s } => {
                scale = s;
                // Past a ragged contraction's end the right operand's rows are zero; this
                // operand's columns there must be finite, or `inf · 0` makes the row NaN.
                let limits = it.tmaps.get(&n.args[0]).and_then(|t| t.axes.last()).map(|a| a.limits.clone());
                let expr = match limits {
                    Some(l) if !l.is_empty() && !self.pad(&expr, &l).is_finite() => {
                        Expr::MaskCols(Box::new(expr), l, 0.0)
                    }
                    _ => expr,
                };
                let b = self.materialize(self.name_of(n.args[0]), expr, k, body);
                self.mma_a_frags.insert(b);
                (MmaA::Frag(b), k)
            }
            Value::Const(_) => return Err(PlanError::ConstantMatmulOperand),
        };
        let mb = match b {
            Value::Tile { buf, tmap, trans } => {
                let r = tmap.axes.len();
                if tmap.axes[..r - 2].iter().any(|x| x.extent != 1) {
                    return Err(PlanError::RightOperandBatched);
                }
                MmaB { buf, n_major: trans }
            }
            _ => return Err(PlanError::ComputedRightOperand),
        };
        // The 16-bit products take two f16 or two bf16 operands; a register operand is packed
        // to the right operand's type where rounding it there is harmless. Anything else runs
        // on tf32 products (`MmaKind::Tf32`), which take f16 and bf16 values exactly and f32
        // ones as a head and a tail.
        let dtype_of = |b: BufId| match self.bufs[b.0 as usize].kind {
            BufKind::Smem { dtype, .. } => Some(dtype),
            _ => None,
        };
        let bt = dtype_of(mb.buf).unwrap_or(DType::F32);
        let at = match ma {
            MmaA::Smem { buf, .. } => dtype_of(buf),
            MmaA::Frag(_) => None,
        };
        if [Some(bt), at].into_iter().flatten().any(|t| !t.is_float()) {
            return Err(PlanError::MatmulDtypes { a: at.map_or("registers", DType::name), b: bt.name() });
        }
        // A register operand computed from 16-bit inputs of the other type would lose what
        // they declared when rounded to this one (`may_round_to`), also when an earlier
        // kernel computed it from them and stored it in f32. Before an exp, rounding is an
        // absolute error in the exponent, amplified by the scores' magnitude; after one
        // (softmax probabilities) it is a small relative error.
        let rounds = matches!(ma, MmaA::Frag(_)) && bt != DType::F32 && !self.feeds_exp(id) && {
            let declared = |i: usize| match self.io.input_sources.get(i) {
                Some(s) if !s.is_empty() => s.clone(),
                _ => vec![self.g.inputs[i].decl.dtype],
            };
            crate::graph::may_round_to(&self.g.float_sources(n.args[0], &declared), bt)
        };
        let kind = match at {
            Some(t) if t == bt && t != DType::F32 => MmaKind::Half,
            None if rounds => MmaKind::Half,
            _ => MmaKind::Tf32 { a_split: at.is_none_or(|t| t == DType::F32), b_split: bt == DType::F32 },
        };
        if k % 16 != 0 {
            return Err(PlanError::ContractionTile { k });
        }
        if cols % 8 != 0 {
            return Err(PlanError::MatmulColumns { cols });
        }
        if accs.contains(&id) {
            let acc = self.accumulator(id)?;
            body.push(Stmt::Mma { acc, a: ma, b: mb, k, accumulate: true, kind });
            // The accumulator's scale is that of its contributions (set by stabilization).
            let scale = self.acc_scale(id).or(scale);
            Ok(Value::Reg { expr: Expr::reg(acc), cols, scale })
        } else {
            let acc = self.buf(self.name_of(id), BufKind::Frag { cols, whole: false });
            body.push(Stmt::Mma { acc, a: ma, b: mb, k, accumulate: false, kind });
            Ok(Value::Reg { expr: Expr::reg(acc), cols, scale })
        }
    }

    /// A matrix-vector product `a · b`, `b` of one column: every row of `a` times `b` read as
    /// a row, reduced along the contraction (accumulated across its loop when it is one).
    fn matvec(
        &mut self,
        id: NodeId,
        it: &ItGraph,
        accs: &BTreeSet<NodeId>,
        body: &mut Vec<Stmt>,
    ) -> Result<Value, PlanError> {
        let n = self.g.node(id).clone();
        let a_tm = it.tmaps.get(&n.args[0]).cloned().ok_or(PlanError::UsedBeforeComputed(n.args[0]))?;
        let (a, k, scale) = self.arg(n.args[0], it)?;
        let vector = match self.value(n.args[1])? {
            Value::Tile { buf, tmap, trans } => {
                let r = tmap.axes.len();
                if tmap.axes[..r.saturating_sub(2)].iter().any(|x| x.extent != 1) {
                    return Err(PlanError::RightOperandBatched);
                }
                let BufKind::Smem { rows, cols, .. } = self.bufs[buf.0 as usize].kind else {
                    return Err(PlanError::ComputedRightOperand);
                };
                match (trans, rows, cols) {
                    // A column as stored: its rows run along the contraction.
                    (false, _, 1) => Expr::Src(Src::Column(buf)),
                    // The transpose of a stored row: already laid along the contraction.
                    (true, 1, _) => Expr::Src(Src::Tile(buf)),
                    _ => return Err(PlanError::ComputedRightOperand),
                }
            }
            Value::Reg { .. } => return Err(PlanError::ComputedRightOperand),
            Value::Const(_) => return Err(PlanError::ConstantMatmulOperand),
        };
        // Columns past the contraction's end are the loads' zero padding; skipping them keeps a
        // computed row's value there (log(0), say) out of the sum.
        let mask = a_tm.axes.last().map(|x| x.limits.clone()).unwrap_or_default();
        let expr = Expr::bin(BinaryOp::Mul, a, vector);
        let acc = accs.contains(&id);
        if let (true, Some(sc)) = (acc, scale) {
            if self.acc_scale(id).map(|a| a.m) != Some(sc.m) {
                return Err(PlanError::PartialsOnDifferentMaxima);
            }
        }
        let dst = if acc { self.accumulator(id)? } else { self.buf(self.name_of(id), BufKind::Rows) };
        body.push(Stmt::RowReduce { dst, op: ReduceOp::Sum, expr, cols: k, mask, acc });
        let scale = if acc { self.acc_scale(id).or(scale) } else { scale };
        Ok(Value::Reg { expr: Expr::reg(dst), cols: 1, scale })
    }

    /// The register buffer accumulating the loop reduction `id`.
    fn accumulator(&self, id: NodeId) -> Result<BufId, PlanError> {
        match self.values.get(&id) {
            Some(Value::Reg { expr: Expr::Src(Src::Reg(b)), .. }) => Ok(*b),
            _ => Err(PlanError::MissingAccumulator(id)),
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
        match self.values.get(&id) {
            Some(Value::Reg { scale, .. }) => *scale,
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
    ) -> Result<Value, PlanError> {
        let arg = self.g.node(id).args[0];
        let arg_tm = it.tmaps.get(&arg).cloned().ok_or(PlanError::UsedBeforeComputed(arg))?;
        let (e, in_cols, s) = self.arg(arg, it)?;
        let last = axis as usize + 1 == arg_tm.axes.len();
        let red_op = if op == ReduceOp::Max { ReduceOp::Max } else { ReduceOp::Sum };
        let d = self.g.shape(arg)[axis as usize];
        let acc = accs.contains(&id);
        // Partials accumulated across a loop must share one running max that lives across it;
        // a max that restarts in every iteration (it belongs to a loop nested inside) scales
        // each partial differently.
        if let (true, Some(sc)) = (acc, s) {
            if self.acc_scale(id).map(|a| a.m) != Some(sc.m) {
                return Err(PlanError::PartialsOnDifferentMaxima);
            }
        }
        let out_scale = self.acc_scale(id).or(s);
        if last {
            let mask = arg_tm.axes.last().map(|x| x.limits.clone()).unwrap_or_default();
            let dst = if acc { self.accumulator(id)? } else { self.buf(self.name_of(id), BufKind::Rows) };
            body.push(Stmt::RowReduce { dst, op: red_op, expr: e, cols: in_cols, mask, acc });
            if op == ReduceOp::Mean && !acc {
                let ext = self.extent_expr(d);
                body.push(Stmt::Assign { dst, expr: Expr::bin(BinaryOp::Div, Expr::reg(dst), ext) });
            }
            return Ok(Value::Reg { expr: Expr::reg(dst), cols: 1, scale: out_scale });
        }
        if arg_tm.axes[axis as usize].extent != 1 {
            return Err(PlanError::NonLastReductionTile);
        }
        if !acc {
            // Reducing one slice is the identity (a mean over an axis of extent 1 included).
            return Ok(Value::Reg { expr: e, cols, scale: s });
        }
        let b = self.accumulator(id)?;
        // A slice past the end of its axis (the last chunk of a ragged split) adds the
        // reduction's identity.
        let limits = arg_tm.axes[axis as usize].limits.clone();
        let e = if limits.is_empty() {
            e
        } else {
            let identity = if red_op == ReduceOp::Max { f64::NEG_INFINITY } else { 0.0 };
            Expr::MaskSlice(Box::new(e), limits, identity)
        };
        let combined = match red_op {
            ReduceOp::Max => Expr::bin(BinaryOp::Max, Expr::reg(b), e),
            _ => Expr::bin(BinaryOp::Add, Expr::reg(b), e),
        };
        body.push(Stmt::Assign { dst: b, expr: combined });
        Ok(Value::Reg { expr: Expr::reg(b), cols, scale: out_scale })
    }
}
