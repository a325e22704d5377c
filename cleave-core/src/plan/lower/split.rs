//! Warps that split the loop: FlashDecoding's split of the keys inside one block.
//!
//! A decode block has 16 rows, which one warp covers; the other warps of the configuration
//! would idle. Instead the column warps each take a slice of every tile the loop streams:
//! warp `w` computes the scores of its slice of the keys, keeps its own running max, row sum
//! and output accumulator through the whole loop, and contracts its slice of the values.
//! After the loop one [`Stmt::Merge`] combines the warps' states through shared memory with
//! the rule that combines split-KV partials across blocks. Loads stay cooperative (every
//! thread of the block copies), so a tile costs each thread a quarter of the copies, and
//! four warps hide each other's latency where one would stall.
//!
//! The rewrite applies to a kernel whose one loop is a reduction the lowering knows how to
//! merge (sums, maxima, accumulators scaled by a running max) and in which every value is
//! either sliced along the loop's columns or one of those accumulators. Anything else keeps
//! the plain layout.

use std::collections::BTreeSet;

use super::{Lowerer, Scale, Value};
use crate::graph::{DType, Op, ReduceOp};
use crate::index::{AxisRange, IterId};
use crate::plan::program::{BufId, BufKind, Expr, MergeOp, MergePart, MmaA, Src, Stmt, Warps};
use crate::schedule::config::TileConfig;
use crate::schedule::itgraph::ItGraph;

fn moves(a: &AxisRange, iter: IterId) -> bool {
    a.offset.uses(iter) || a.limits.iter().any(|l| l.base.uses(iter))
}

impl Lowerer<'_> {
    /// How the state a just-lowered loop carries would merge across warps: its running
    /// maxima (`started`), then each accumulator by its reduction and scale. `None` when an
    /// accumulator is not a plain register value or its scale is not one of those maxima.
    pub(super) fn carried_state(&self, inner: &ItGraph, started: &[BufId]) -> Option<Vec<(BufId, MergeOp)>> {
        // The merge combines maxima one per row; a max per element does not merge that way.
        if started.iter().any(|m| self.element_maxima.contains(m)) {
            return None;
        }
        let mut parts: Vec<(BufId, MergeOp)> = started.iter().map(|&m| (m, MergeOp::Max)).collect();
        for &r in &inner.accumulates {
            let Some(Value::Reg { expr: Expr::Src(Src::Reg(b)), scale, .. }) = self.values.get(&r) else {
                return None;
            };
            let op = match (&self.g.node(r).op, scale) {
                (Op::Reduce(ReduceOp::Max, _), None) => MergeOp::Max,
                (Op::Reduce(ReduceOp::Sum | ReduceOp::Mean, _), None) => MergeOp::Sum,
                (Op::Reduce(ReduceOp::Sum | ReduceOp::Mean, _), Some(Scale { m, degree: 1 }))
                    if started.contains(m) =>
                {
                    MergeOp::Scaled(*m)
                }
                // A product accumulated over the loop.
                (Op::MatMul, None) => MergeOp::Sum,
                (Op::MatMul, Some(Scale { m, degree: 1 })) if started.contains(m) => MergeOp::Scaled(*m),
                _ => return None,
            };
            parts.push((*b, op));
        }
        Some(parts)
    }

    /// The rows and columns of warps a split lays out for `cfg`: as many warp rows as divide
    /// the block's 16-row tiles, the rest of the configuration's warps in columns (at least
    /// two, or there is nothing to split).
    fn column_warps(&self, cfg: &TileConfig) -> Option<(u32, u32)> {
        let want = cfg.warps.max(1);
        let tiles16 = self.rows.div_ceil(16) as u32;
        let m = (1..=want.min(tiles16)).rev().find(|d| tiles16 % d == 0).unwrap_or(1);
        (want % m == 0 && want / m >= 2).then_some((m, want / m))
    }

    /// The tile of `body`'s one loop and the width its split needs, when the loop carries
    /// state the warps could merge but its tile is too narrow for the configuration's column
    /// warps to take 16 columns each, and its dim admits a tile that wide: such a
    /// configuration would run with its warps idle where a wider tile of the same loop
    /// keeps them busy, so the lowering refuses it.
    pub(super) fn narrow_loop(&self, cfg: &TileConfig, body: &[Stmt]) -> Option<(u64, u64)> {
        let (_, n) = self.column_warps(cfg)?;
        let needed = 16 * u64::from(n);
        let mut loops = body.iter().filter_map(|s| match s {
            Stmt::Loop { iter, dim, tile, .. } => Some((*iter, *dim, *tile)),
            _ => None,
        });
        let (iter, dim, tile) = loops.next()?;
        if loops.next().is_some() || tile % needed == 0 {
            return None;
        }
        self.loop_state.get(&iter)?.as_ref()?;
        let info = self.g.dims.get(dim);
        (info.dynamic || info.value >= needed).then_some((tile, needed))
    }

    /// Rewrites `body` so that the column warps split its one loop, when the rows leave warps
    /// of the configuration idle and the loop qualifies (see the module). Returns the layout,
    /// or `None` with `body` and the buffers untouched.
    pub(super) fn split_loop(&mut self, cfg: &TileConfig, body: &mut Vec<Stmt>) -> Option<Warps> {
        let (m, n) = self.column_warps(cfg)?;
        let n64 = u64::from(n);
        let mut loops = body.iter().enumerate().filter(|(_, s)| matches!(s, Stmt::Loop { .. }));
        let (at, _) = loops.next()?;
        if loops.next().is_some() {
            return None;
        }
        let Stmt::Loop { iter, tile, body: lbody, .. } = &body[at] else { return None };
        let (iter, tile) = (*iter, *tile);
        // Each warp contracts its slice 16 deep at a time.
        if tile % (16 * n64) != 0 {
            return None;
        }
        let parts = self.loop_state.get(&iter)?.clone()?;
        let carried: BTreeSet<BufId> = parts.iter().map(|p| p.0).collect();
        let is_frag = |b: &BufId| matches!(self.bufs[b.0 as usize].kind, BufKind::Frag { .. });
        let whole_frag = |b: &BufId| carried.contains(b) && is_frag(b);

        // The loop's tiles, and whether their columns or rows move with it.
        let (mut loaded, mut col_tiles, mut row_tiles) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        for s in lbody {
            match s {
                Stmt::Load { dst, tmap, trans, .. } => {
                    // A transposed tile's columns are the tensor's next-to-last axis.
                    let col = if *trans { tmap.axes.len().checked_sub(2)? } else { tmap.axes.len().checked_sub(1)? };
                    loaded.insert(*dst);
                    if moves(&tmap.axes[col], iter) {
                        col_tiles.insert(*dst);
                    }
                    if tmap.axes.iter().enumerate().any(|(a, x)| a != col && moves(x, iter)) {
                        row_tiles.insert(*dst);
                    }
                }
                Stmt::Loop { .. } | Stmt::Stage { .. } | Stmt::Store { .. } | Stmt::Merge { .. } => return None,
                _ => {}
            }
        }
        // A one-column tile read only across the block's columns (`Src::Column`: its row `c`
        // is the block's column `c`, a scale per column of a product's left operand) whose
        // rows move with the loop is a slice of the loop's columns like any tile whose columns
        // move: each warp reads the rows of its slice.
        for b in row_tiles.clone() {
            let one_column = matches!(self.bufs[b.0 as usize].kind, BufKind::Smem { cols: 1, .. });
            if one_column && !col_tiles.contains(&b) && read_only_as_column(lbody, b) {
                row_tiles.remove(&b);
                col_tiles.insert(b);
            }
        }
        // Register tiles sliced along the loop's columns: each warp holds its slice.
        let mut sliced: BTreeSet<BufId> = BTreeSet::new();
        let mut written: BTreeSet<BufId> = BTreeSet::new();
        for s in lbody {
            match s {
                Stmt::Load { .. } => {}
                Stmt::Mma { acc, a, b, accumulate, .. } => {
                    written.insert(*acc);
                    if !loaded.contains(&b.buf) {
                        return None;
                    }
                    let (rows_move, cols_move) = (row_tiles.contains(&b.buf), col_tiles.contains(&b.buf));
                    let (n_moves, k_moves) = if b.n_major { (rows_move, cols_move) } else { (cols_move, rows_move) };
                    match (n_moves, k_moves) {
                        // Scores: each warp's columns are its slice of the keys; the left
                        // operand must not move with the loop.
                        (true, false) => {
                            let fixed = match a {
                                MmaA::Smem { buf, .. } => !col_tiles.contains(buf) && !row_tiles.contains(buf),
                                MmaA::Frag(_) => false,
                            };
                            if !fixed || carried.contains(acc) {
                                return None;
                            }
                            sliced.insert(*acc);
                        }
                        // A product over the loop's axis: each warp contracts its slice into
                        // its own whole accumulator.
                        (false, true) => {
                            let ok_a = match a {
                                MmaA::Frag(p) => sliced.contains(p),
                                MmaA::Smem { buf, trans: false } => col_tiles.contains(buf) && !row_tiles.contains(buf),
                                MmaA::Smem { trans: true, .. } => false,
                            };
                            if !ok_a || !whole_frag(acc) || !*accumulate {
                                return None;
                            }
                        }
                        _ => return None,
                    }
                }
                Stmt::Assign { dst, expr } => {
                    written.insert(*dst);
                    let mut srcs = Vec::new();
                    expr.bufs(&mut srcs);
                    let reads_sliced = srcs.iter().any(|b| sliced.contains(b) || col_tiles.contains(b));
                    let reads_whole = srcs.iter().any(whole_frag);
                    // Tiles whose rows alone move with the loop have no column slice to read.
                    let reads_row_tile = srcs.iter().any(|b| row_tiles.contains(b) && !col_tiles.contains(b));
                    match self.bufs[dst.0 as usize].kind {
                        BufKind::Rows => {
                            if reads_sliced || reads_whole || reads_row_tile {
                                return None;
                            }
                        }
                        _ if carried.contains(dst) => {
                            if reads_sliced || reads_row_tile {
                                return None;
                            }
                        }
                        _ => {
                            if !reads_sliced || reads_whole || reads_row_tile {
                                return None;
                            }
                            sliced.insert(*dst);
                        }
                    }
                }
                Stmt::RowReduce { dst, expr, acc, .. } => {
                    written.insert(*dst);
                    let mut srcs = Vec::new();
                    expr.bufs(&mut srcs);
                    let reads_sliced = srcs.iter().any(|b| sliced.contains(b) || col_tiles.contains(b));
                    if !reads_sliced || srcs.iter().any(whole_frag) || (*acc && !carried.contains(dst)) {
                        return None;
                    }
                }
                Stmt::Loop { .. } | Stmt::Stage { .. } | Stmt::Store { .. } | Stmt::Merge { .. } => return None,
            }
        }
        // Every sliced tile is one loop tile wide, split evenly.
        for b in &sliced {
            match self.bufs[b.0 as usize].kind {
                BufKind::Frag { cols, .. } if cols == tile => {}
                _ => return None,
            }
        }
        if self.mma_a_frags.iter().any(|f| !sliced.contains(f)) {
            return None;
        }
        // What the loop carries is what merges; what it computes for itself stays inside it.
        let mut before = Vec::new();
        let mut after = Vec::new();
        for s in &body[..at] {
            s.bufs(&mut before);
            match s {
                Stmt::Load { .. } => {}
                Stmt::Assign { dst, .. } if carried.contains(dst) || !is_frag(dst) => {}
                _ => return None,
            }
        }
        for s in &body[at + 1..] {
            s.bufs(&mut after);
            if matches!(s, Stmt::Mma { .. } | Stmt::Stage { .. } | Stmt::Loop { .. } | Stmt::Merge { .. }) {
                return None;
            }
        }
        if written.iter().any(|b| !carried.contains(b) && (before.contains(b) || after.contains(b))) {
            return None;
        }
        // After the merge the warps own column slices of every register tile and store.
        let splits = |cols: u64| cols % (8 * n64) == 0;
        for b in self.bufs.iter() {
            if let BufKind::Frag { cols, .. } = b.kind {
                if !splits(cols) {
                    return None;
                }
            }
        }
        for s in &body[at + 1..] {
            if let Stmt::Store { cols, .. } = s {
                if *cols != 1 && !splits(*cols) {
                    return None;
                }
            }
        }

        // The rewrite: carried Frags become whole per warp, and the code after the loop reads
        // their merged copies.
        let mut merge = Vec::new();
        let mut width = 0;
        for &(src, op) in &parts {
            let dst = match self.bufs[src.0 as usize].kind {
                BufKind::Frag { cols, .. } => {
                    width += cols;
                    self.bufs[src.0 as usize].kind = BufKind::Frag { cols, whole: true };
                    let name = format!("{}_all", self.bufs[src.0 as usize].name);
                    let dst = self.buf(name, BufKind::Frag { cols, whole: false });
                    for s in &mut body[at + 1..] {
                        rename(s, src, dst);
                    }
                    dst
                }
                _ => {
                    width += 1;
                    src
                }
            };
            merge.push(MergePart { src, dst, op });
        }
        let rows = self.rows.div_ceil(16) * 16;
        let scratch =
            self.buf("t_merge".to_string(), BufKind::Smem { dtype: DType::F32, rows: n64 * rows, cols: width });
        body.insert(at + 1, Stmt::Merge { scratch, parts: merge });
        Some(Warps { m, n, m_tiles: self.rows.div_ceil(16) as u32 / m, split: true })
    }
}

/// Whether every read of `b` in `body` is an elementwise `Src::Column` read.
fn read_only_as_column(body: &[Stmt], b: BufId) -> bool {
    fn uses(e: &Expr, b: BufId, column: &mut bool, other: &mut bool) {
        match e {
            Expr::Src(Src::Column(x)) if *x == b => *column = true,
            Expr::Src(Src::Reg(x) | Src::Tile(x)) if *x == b => *other = true,
            Expr::Src(_) => {}
            Expr::Unary(_, a) | Expr::MaskCols(a, _, _) | Expr::MaskSlice(a, _, _) | Expr::Mask(a, _) => {
                uses(a, b, column, other)
            }
            Expr::Binary(_, a, c) | Expr::ExpDiff(a, c) => {
                uses(a, b, column, other);
                uses(c, b, column, other);
            }
        }
    }
    let (mut column, mut other) = (false, false);
    for s in body {
        match s {
            Stmt::Load { .. } => {}
            Stmt::Assign { expr, .. } | Stmt::RowReduce { expr, .. } => uses(expr, b, &mut column, &mut other),
            s => {
                let mut all = Vec::new();
                s.bufs(&mut all);
                other |= all.contains(&b);
            }
        }
    }
    column && !other
}

/// Makes a statement after the loop read (and write) `to` for the register tile `from`.
fn rename(s: &mut Stmt, from: BufId, to: BufId) {
    match s {
        Stmt::Assign { dst, expr } | Stmt::RowReduce { dst, expr, .. } => {
            if *dst == from {
                *dst = to;
            }
            expr.rename_reg(from, to);
        }
        Stmt::Store { expr, .. } => expr.rename_reg(from, to),
        _ => {}
    }
}
