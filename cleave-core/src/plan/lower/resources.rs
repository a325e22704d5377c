//! The block's resources: how warps cover it, how many registers a thread needs, and where
//! each shared-memory tile lives.

use super::Lowerer;
use crate::graph::DType;
use crate::plan::program::{deferred_row_sums, Buf, BufId, BufKind, Expr, MmaA, MmaKind, Stmt, Warps};
use crate::schedule::config::TileConfig;

/// Registers a transposed copy keeps live beyond a plain one's (see `addressing_allowance`).
const TRANSPOSED_COPY: u64 = 24;

impl Lowerer<'_> {
    /// Lays warps over the block. The count is the configuration's (or the largest number of
    /// 16-row tiles at most that, when fewer), laid down the rows first, so row reductions stay
    /// in a warp. A block with tensor-core products takes, among the layouts of the same count,
    /// the one that loads the fewest fragments per product: a warp of `a` 16-row tiles and `b`
    /// 8-column tiles issues `a` A loads and `b / 2` B loads (ldmatrix x4) for `a · b`
    /// products per 16 of depth, so 16 × 256 warp tiles load 0.53 per product and 64 × 64 ones
    /// 0.25, unless a loop reduces rows (see below). Warps go across columns only where no register tile feeds a product as its left
    /// operand (which needs whole rows in one warp) and every register and stored tile splits
    /// evenly (a warp's columns past a narrower tile would be written to a neighbour's, or
    /// nobody's, elements).
    pub(super) fn warps(&self, cfg: &TileConfig, body: &[Stmt]) -> Warps {
        let want = cfg.warps.max(1);
        let tiles16 = (self.rows.div_ceil(16)) as u32;
        let mut stored = Vec::new();
        store_cols(body, &mut stored);
        let splits = |n: u32| {
            let split = |cols: u64| cols % (8 * u64::from(n)) == 0;
            n == 1
                || (self.mma_a_frags.is_empty()
                    && self.bufs.iter().all(|b| match b.kind {
                        BufKind::Frag { cols, .. } => split(cols),
                        _ => true,
                    })
                    && stored.iter().all(|&c| c == 1 || split(c)))
        };
        let m0 = (1..=want.min(tiles16)).rev().find(|d| tiles16 % d == 0).unwrap_or(1);
        let n0 = if m0 < want && want % m0 == 0 && splits(want / m0) { want / m0 } else { 1 };
        let mut products = Vec::new();
        mma_shapes(body, &self.bufs, &mut products);
        // Fragment loads per product of a layout, as a fraction (loads, products) compared by
        // cross-multiplication so the choice is exact.
        let loads = |m: u32, n: u32| -> (u64, u64) {
            let a = u64::from(tiles16 / m);
            products.iter().fold((0, 0), |(l, p), &(cols, a_in_smem)| {
                let b = cols.div_ceil(8 * u64::from(n));
                (l + if a_in_smem { 2 * a } else { 0 } + b, p + 2 * a * b)
            })
        };
        let mut best = (m0, n0);
        // A row reduction inside a loop would combine across the row's warps on every
        // iteration (a shared-memory exchange and a barrier each); measured on the SASS, that
        // costs more issue than the fragment loads save, so such blocks keep their rows in one
        // warp, unless the loop only accumulates the sum (RMSNorm's sum of squares), which
        // column warps combine once after the loop.
        if !products.is_empty() && !reduces_in_loop(body, false) {
            let threads = m0 * n0;
            for m in (1..=tiles16.min(threads)).rev().filter(|m| tiles16 % m == 0 && threads % m == 0) {
                let n = threads / m;
                if !splits(n) {
                    continue;
                }
                let ((l1, p1), (l0, p0)) = (loads(m, n), loads(best.0, best.1));
                if l1 * p0 < l0 * p1 {
                    best = (m, n);
                }
            }
        }
        let (m, n) = best;
        Warps { m, n, m_tiles: tiles16 / m, split: false }
    }

    /// Registers per thread at the busiest point of the program: register buffers are live
    /// from their first write to their last read (a loop keeps everything it touches live for
    /// all its iterations), plus the f16 copies of left MMA operands and a fixed allowance for
    /// addresses and loop state.
    pub(super) fn register_estimate(&self, w: Warps, body: &[Stmt]) -> u64 {
        let rows = 16 * u64::from(w.m_tiles);
        let mut first = vec![usize::MAX; self.bufs.len()];
        let mut last = vec![0usize; self.bufs.len()];
        let mut clock = 0usize;
        lifetimes(body, &mut first, &mut last, &mut clock, &|_| false);
        let cost: Vec<u64> = self
            .bufs
            .iter()
            .enumerate()
            .map(|(i, b)| match b.kind {
                BufKind::Frag { cols, whole } => {
                    // A whole tile is all of it in every warp; the others are sliced across
                    // the column warps (a left operand only when they split the loop).
                    let share = if whole { cols } else { cols.div_ceil(u64::from(w.n)) };
                    let f32s = rows * share / 32;
                    let halves = if self.mma_a_frags.contains(&BufId(i as u32)) { rows * share / 64 } else { 0 };
                    f32s + halves
                }
                BufKind::Rows => 2 * u64::from(w.m_tiles),
                BufKind::Smem { .. } => 0,
            })
            .collect();
        // An elementwise assignment writes its result into the registers of an operand that
        // dies there (`t7 = exp(t7_x - m)` reuses `t7_x`'s), so at that statement the dying
        // operand and the result are not both live.
        let mut reused = vec![0u64; clock + 1];
        in_place(body, &self.bufs, &last, &cost, &mut 0, &mut reused);
        let peak = (0..=clock)
            .map(|t| {
                (0..self.bufs.len()).filter(|&i| first[i] <= t && t <= last[i]).map(|i| cost[i]).sum::<u64>()
                    - reused[t]
            })
            .max()
            .unwrap_or(0);
        peak + 32
            + self.addressing_allowance(w, body)
            + self.wide_operand_allowance(w, body)
            + self.tf32_allowance(w, body)
    }

    /// Registers the tf32 products hold beyond the 16-bit ones' four A registers a row tile:
    /// the two 8-deep fragments of each row tile (eight), their tails when A is split (eight
    /// more), and the eight floats of A a row tile widens from. ptxas loads an f32 right
    /// operand's elements for all of a warp's column tiles ahead of the products and keeps
    /// their heads and tails (twelve registers a tile): measured, such blocks took 255
    /// registers where the rest of the estimate gave 140.
    fn tf32_allowance(&self, w: Warps, body: &[Stmt]) -> u64 {
        let mut most = 0u64;
        for s in body {
            match s {
                Stmt::Mma { acc, kind: MmaKind::Tf32 { a_split, b_split }, .. } => {
                    let mt = u64::from(w.m_tiles);
                    let tiles = match self.bufs[acc.0 as usize].kind {
                        BufKind::Frag { cols, whole: true } => cols.div_ceil(8),
                        BufKind::Frag { cols, whole: false } => cols.div_ceil(8 * u64::from(w.n)),
                        _ => 1,
                    };
                    let b = if *b_split { 12 * tiles } else { 8 };
                    most = most.max(mt * (4 + 8 * u64::from(*a_split)) + 8 + b);
                }
                Stmt::Loop { body, .. } => most = most.max(self.tf32_allowance(w, body)),
                _ => {}
            }
        }
        most
    }

    /// The right operand's fragments of one 16-deep step of a product, beyond the 32 registers
    /// the fixed allowance holds: a warp whose accumulator spans more than 128 columns loads
    /// two registers per 8 of them before its `mma`s (MLA's 256-column output slices). Measured
    /// against ptxas: such a kernel estimated at 188 spilled.
    fn wide_operand_allowance(&self, w: Warps, body: &[Stmt]) -> u64 {
        let mut most = 0u64;
        for s in body {
            match s {
                Stmt::Mma { acc, .. } => {
                    if let BufKind::Frag { cols, whole } = self.bufs[acc.0 as usize].kind {
                        let share = if whole { cols } else { cols.div_ceil(u64::from(w.n)) };
                        most = most.max((share.div_ceil(8) * 2).saturating_sub(32));
                    }
                }
                Stmt::Loop { body, .. } => most = most.max(self.wide_operand_allowance(w, body)),
                _ => {}
            }
        }
        most
    }

    /// Registers the fixed allowance does not cover: a mask compares every element's row and
    /// column (kept live across the unrolled fragment loops), and a load through a page table
    /// holds one 64-bit page offset per row a thread copies, per paged tile of an iteration.
    /// Measured against ptxas on the paged and causal attention kernels, which spilled without
    /// it. Since the generated copies unroll at most four page lookups at a time, the paged
    /// GQA decodes take 106 to 128 registers where this estimates 120, and MLA's 171 to 202
    /// where it estimates 164 to 168; fully unrolled they took up to 255 and one spilled.
    /// A transposed copy (four element copies in flight a thread, each with its own address
    /// and predicate) adds `TRANSPOSED_COPY`: the column reductions of the corpus take 48 to 78
    /// registers where the rest of the estimate gives 34 to 58.
    fn addressing_allowance(&self, w: Warps, body: &[Stmt]) -> u64 {
        let (mut masked, mut transposed) = (false, false);
        let mut paged_chunks = 0u64;
        self.scan_addressing(w, body, &mut masked, &mut transposed, &mut paged_chunks);
        u64::from(masked) * 16 + (2 * paged_chunks).min(48) + u64::from(transposed) * TRANSPOSED_COPY
    }

    fn scan_addressing(
        &self,
        w: Warps,
        body: &[Stmt],
        masked: &mut bool,
        transposed: &mut bool,
        paged_chunks: &mut u64,
    ) {
        for s in body {
            match s {
                Stmt::Load { dst, param, trans, .. } => {
                    *transposed |= *trans;
                    let p = &self.params[param.0 as usize];
                    if p.layout.as_ref().is_some_and(|l| l.is_paged()) {
                        if let BufKind::Smem { dtype, rows, cols } = self.bufs[dst.0 as usize].kind {
                            let chunks = (rows * cols * dtype.size()).div_ceil(16);
                            *paged_chunks += chunks.div_ceil(u64::from(w.threads()));
                        }
                    }
                }
                Stmt::Assign { expr, .. } | Stmt::RowReduce { expr, .. } | Stmt::Store { expr, .. } => {
                    *masked |= has_mask(expr);
                }
                Stmt::Loop { body, .. } => self.scan_addressing(w, body, masked, transposed, paged_chunks),
                _ => {}
            }
        }
    }
}

fn has_mask(e: &Expr) -> bool {
    match e {
        Expr::Mask(..) => true,
        Expr::Src(_) => false,
        Expr::Unary(_, a) | Expr::MaskCols(a, _, _) | Expr::MaskSlice(a, _, _) => has_mask(a),
        Expr::Binary(_, a, b) | Expr::ExpDiff(a, b) => has_mask(a) || has_mask(b),
    }
}

impl Lowerer<'_> {
    /// Stages every register tile that is a product's left operand through a shared tile in
    /// the product's input type (a [`Stmt::Stage`] before its first product in a statement
    /// list), and makes the products read that tile. Rounding to the input type happens at the
    /// stage instead of when the registers are packed: the same values. A split operand
    /// ([`MmaKind::Tf32`]) is staged in f32 and split where it is read.
    pub(super) fn stage_left_operands(&mut self, body: &mut Vec<Stmt>) {
        let mut staged: Vec<(BufId, BufId)> = Vec::new();
        self.stage_in(body, &mut staged);
        self.mma_a_frags.clear();
    }

    fn stage_in(&mut self, body: &mut Vec<Stmt>, staged: &mut Vec<(BufId, BufId)>) {
        let mut out = Vec::with_capacity(body.len());
        for mut s in std::mem::take(body) {
            match &mut s {
                Stmt::Loop { body, .. } => self.stage_in(body, staged),
                Stmt::Mma { a, b, kind, .. } => {
                    if let MmaA::Frag(src) = *a {
                        let BufKind::Smem { dtype, .. } = self.bufs[b.buf.0 as usize].kind else {
                            unreachable!("a right operand is staged")
                        };
                        // A split operand keeps its f32 values.
                        let dtype =
                            if matches!(kind, MmaKind::Tf32 { a_split: true, .. }) { DType::F32 } else { dtype };
                        let same = |d: BufId| matches!(self.bufs[d.0 as usize].kind, BufKind::Smem { dtype: t, .. } if t == dtype);
                        let dst = match staged.iter().find(|(f, d)| *f == src && same(*d)) {
                            Some((_, d)) => *d,
                            None => {
                                let cols = match self.bufs[src.0 as usize].kind {
                                    BufKind::Frag { cols, .. } => cols,
                                    _ => 1,
                                };
                                let rows = self.rows.div_ceil(16) * 16;
                                let name = format!("{}_s", self.bufs[src.0 as usize].name);
                                let d = self.buf(name, BufKind::Smem { dtype, rows, cols });
                                staged.push((src, d));
                                d
                            }
                        };
                        // One stage per run of products: the previous statement may be it.
                        let fresh = !matches!(out.last(), Some(Stmt::Stage { src: s2, .. }) if *s2 == src)
                            && !matches!(out.last(), Some(Stmt::Mma { a: MmaA::Smem { buf, .. }, .. }) if *buf == dst);
                        if fresh {
                            out.push(Stmt::Stage { src, dst });
                        }
                        *a = MmaA::Smem { buf: dst, trans: false };
                    }
                }
                _ => {}
            }
            out.push(s);
        }
        *body = out;
    }
}

/// For every elementwise assignment into a register tile, on the clock of [`lifetimes`], the
/// registers its result takes over from a same-shaped operand whose last use it is (at most
/// the result's own f32 registers).
fn in_place(body: &[Stmt], bufs: &[Buf], last: &[usize], cost: &[u64], clock: &mut usize, reused: &mut [u64]) {
    for s in body {
        *clock += 1;
        let t = *clock;
        match s {
            Stmt::Assign { dst, expr } => {
                let BufKind::Frag { cols, whole } = bufs[dst.0 as usize].kind else { continue };
                let mut srcs = Vec::new();
                expr.bufs(&mut srcs);
                srcs.sort_unstable();
                srcs.dedup();
                let f32s = |b: BufId| match bufs[b.0 as usize].kind {
                    BufKind::Frag { cols: c, whole: w } if c == cols && w == whole => Some(cost[b.0 as usize]),
                    _ => None,
                };
                let own = f32s(*dst).unwrap_or(0);
                let dying = srcs
                    .iter()
                    .filter(|&&b| b != *dst && last[b.0 as usize] == t)
                    .filter_map(|&b| f32s(b))
                    .max()
                    .unwrap_or(0);
                reused[t] += dying.min(own);
            }
            Stmt::Loop { body, .. } => in_place(body, bufs, last, cost, clock, reused),
            _ => {}
        }
    }
}

/// Columns of every tile a program stores, loops included.
/// Whether a row reduction runs inside a loop of `body` (`inside`: `body` is a loop's).
/// Row sums the loop only accumulates do not count: column warps combine those once, after
/// the loop ([`deferred_row_sums`]).
fn reduces_in_loop(body: &[Stmt], inside: bool) -> bool {
    let deferred = if inside { deferred_row_sums(body) } else { Vec::new() };
    body.iter().any(|s| match s {
        Stmt::RowReduce { dst, .. } => inside && !deferred.contains(dst),
        Stmt::Loop { body, .. } => reduces_in_loop(body, true),
        _ => false,
    })
}

/// The column count of every product's accumulator, and whether its left operand is loaded
/// from shared memory for it: not when it is a register operand, nor when the product follows
/// one of the same left operand and depth (code generation loads it once for both).
fn mma_shapes(body: &[Stmt], bufs: &[Buf], out: &mut Vec<(u64, bool)>) {
    let mut prev: Option<(MmaA, u64)> = None;
    for s in body {
        let this = match s {
            Stmt::Mma { a, k, .. } => Some((*a, *k)),
            _ => None,
        };
        let shared = this.is_some() && this == prev;
        prev = this;
        match s {
            Stmt::Mma { acc, a, .. } => {
                if let BufKind::Frag { cols, .. } = bufs[acc.0 as usize].kind {
                    out.push((cols, matches!(a, MmaA::Smem { .. }) && !shared));
                }
            }
            Stmt::Loop { body, .. } => mma_shapes(body, bufs, out),
            _ => {}
        }
    }
}

fn store_cols(body: &[Stmt], out: &mut Vec<u64>) {
    for s in body {
        match s {
            Stmt::Store { cols, .. } => out.push(*cols),
            Stmt::Loop { body, .. } => store_cols(body, out),
            _ => {}
        }
    }
}

/// Assigns shared-memory offsets with a first-fit allocator over buffer lifetimes, and returns
/// the peak (the dynamic shared memory a block needs). A tile used inside a loop stays live
/// for the whole loop; one loaded in a loop is double-buffered.
pub(super) fn allocate_smem(bufs: &mut [Buf], body: &[Stmt], warps: Warps) -> u64 {
    let mut first = vec![usize::MAX; bufs.len()];
    let mut last = vec![0usize; bufs.len()];
    let mut clock = 0usize;
    lifetimes(body, &mut first, &mut last, &mut clock, &|i| bufs[i].stages > 1);
    let mut order: Vec<usize> =
        (0..bufs.len()).filter(|&i| bufs[i].smem_stage_bytes() > 0 && first[i] != usize::MAX).collect();
    order.sort_by_key(|&i| (first[i], i));
    let mut placed: Vec<(usize, u64, u64)> = Vec::new();
    let mut peak = 0;
    for i in order {
        let size = (bufs[i].smem_stage_bytes() * u64::from(bufs[i].stages)).div_ceil(128) * 128;
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|(j, _, _)| first[*j] <= last[i] && first[i] <= last[*j])
            .map(|(_, off, sz)| (*off, *sz))
            .collect();
        busy.sort_unstable();
        let mut off = 0;
        for (o, s) in busy {
            if off + size <= o {
                break;
            }
            off = off.max(o + s);
        }
        bufs[i].smem_offset = off;
        placed.push((i, off, size));
        peak = peak.max(off + size);
    }
    // Cross-warp row reductions exchange one f32 per row and column-warp.
    if warps.n > 1 {
        peak += 16 * u64::from(warps.m_tiles * warps.m) * u64::from(warps.n) * 4;
    }
    peak
}

/// First and last use of every buffer, on a clock that ticks once per statement. A buffer
/// defined before a loop and used in it is live for the whole loop (it carries across
/// iterations); so is one that `whole_loop` says must be (double-buffered tiles). A value
/// computed and consumed within one iteration keeps its short range.
fn lifetimes(
    body: &[Stmt],
    first: &mut [usize],
    last: &mut [usize],
    clock: &mut usize,
    whole_loop: &dyn Fn(usize) -> bool,
) {
    let touch = |b: BufId, t: usize, first: &mut [usize], last: &mut [usize]| {
        let i = b.0 as usize;
        first[i] = first[i].min(t);
        last[i] = last[i].max(t);
    };
    for s in body {
        *clock += 1;
        let t = *clock;
        match s {
            Stmt::Load { dst, .. } => touch(*dst, t, first, last),
            Stmt::Assign { dst, expr } => {
                touch(*dst, t, first, last);
                let mut v = Vec::new();
                expr.bufs(&mut v);
                v.into_iter().for_each(|b| touch(b, t, first, last));
            }
            Stmt::RowReduce { dst, expr, .. } => {
                touch(*dst, t, first, last);
                let mut v = Vec::new();
                expr.bufs(&mut v);
                v.into_iter().for_each(|b| touch(b, t, first, last));
            }
            Stmt::Mma { acc, a, b, .. } => {
                touch(*acc, t, first, last);
                match a {
                    MmaA::Smem { buf, .. } | MmaA::Frag(buf) => touch(*buf, t, first, last),
                }
                touch(b.buf, t, first, last);
            }
            Stmt::Store { expr, staging, .. } => {
                let mut v = Vec::new();
                expr.bufs(&mut v);
                v.extend(*staging);
                v.into_iter().for_each(|b| touch(b, t, first, last));
            }
            Stmt::Stage { src, dst } => {
                touch(*src, t, first, last);
                touch(*dst, t, first, last);
            }
            Stmt::Merge { scratch, parts } => {
                touch(*scratch, t, first, last);
                for p in parts {
                    touch(p.src, t, first, last);
                    touch(p.dst, t, first, last);
                }
            }
            Stmt::Loop { body, .. } => {
                let start = t;
                let before: Vec<usize> = last.to_vec();
                lifetimes(body, first, last, clock, whole_loop);
                let end = *clock;
                for i in 0..first.len() {
                    let used_inside = last[i] != before[i] || (first[i] >= start && first[i] <= end);
                    if used_inside && (first[i] < start || whole_loop(i)) {
                        first[i] = first[i].min(start);
                        last[i] = last[i].max(end);
                    }
                }
            }
        }
    }
}
