//! The analytic cost model (paper App. A, extended to a time estimate).
//!
//! For one planned kernel it counts, per block, the global-memory bytes of every tile load and
//! store over all loop iterations (loads hoisted out of a loop count once), the tensor-core and
//! SIMT flops, the shared-memory bytes and the warp instructions issued; the shared-memory peak
//! comes from the planner's allocator. Occupancy follows from shared memory, registers and
//! threads; the grid runs in waves over the SMs, and a wave's time is the largest of five
//! bounds ([`Bound`]) on the busiest SM, plus the latency of filling and draining a block.
//! The estimate ranks candidates; it is not a prediction of absolute time.

use super::launch::Kernel;
use super::program::{copies_whole_chunks, Binding, BufId, BufKind, MmaA, MmaKind, Stmt, TileKernel};
use super::stage::{SExpr, StageKernel, STAGE_UNROLL};
use crate::arch::{Arch, Targets};
use crate::graph::{Dim, DimTable, DimVar};

/// The model's view of one kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost {
    /// Blocks in the grid.
    pub blocks: u64,
    /// Global-memory bytes moved by all blocks.
    pub gmem_bytes: u64,
    /// Tensor-core flops of all blocks.
    pub mma_flops: u64,
    /// Other flops of all blocks.
    pub simt_flops: u64,
    /// Dynamic shared memory per block.
    pub smem_bytes: u64,
    /// Shared-memory bytes read and written by all blocks (MMA operands, cp.async copies,
    /// staged stores).
    pub smem_traffic: u64,
    /// Warp instructions all blocks issue (an estimate from the program, see [`Issue`]).
    pub instructions: u64,
    /// Blocks resident per SM.
    pub blocks_per_sm: u64,
    /// Waves of blocks.
    pub waves: u64,
    /// What bounds the first wave.
    pub bound: Bound,
    /// Estimated seconds (for ranking).
    pub seconds: f64,
}

/// The bound that sets a wave's time: the largest of the model's terms on the busiest SM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bound {
    /// DRAM bandwidth: the whole GPU's, or what the wave's SMs can stream.
    Dram,
    /// Tensor-core and SIMT throughput.
    Compute,
    /// Shared-memory bandwidth.
    Smem,
    /// Instruction issue: four schedulers per SM, each used only by a warp resident on it.
    Issue,
    /// The loop's turn: with two tiles in flight an iteration takes at least half a DRAM
    /// latency, whatever the bandwidth.
    Latency,
}

impl Bound {
    /// The lower-case name the CLI prints.
    pub fn name(self) -> &'static str {
        match self {
            Bound::Dram => "dram",
            Bound::Compute => "compute",
            Bound::Smem => "smem",
            Bound::Issue => "issue",
            Bound::Latency => "latency",
        }
    }
}

/// The fixed cost of one kernel launch on the stream (a few microseconds on current GPUs).
pub const LAUNCH_SECONDS: f64 = 4e-6;

/// Warp instructions the model charges, compared with the static SASS of the generated
/// loops (bench/RESULTS.md, "The main loop"; the estimate runs low by about a quarter on
/// matmul_decode's loop): a 16x8x16 product with its share of `ldmatrix`
/// and operand moves; a 512-byte warp copy (16 bytes a lane) with its address arithmetic; one
/// loop iteration's barrier, wait, pointer updates and branch. Elementwise work is one
/// instruction per 32 elements per operation.
pub struct Issue;

impl Issue {
    /// Per `mma.m16n8k16`.
    pub const PER_MMA: f64 = 3.0;
    /// Per 512 bytes copied between global and shared memory by one warp.
    pub const PER_COPY: f64 = 6.0;
    /// Per warp and loop iteration.
    pub const PER_ITERATION: f64 = 24.0;
    /// Instructions a warp issues per cycle on average: dependent instructions wait several
    /// cycles (shuffles and `exp` a few tens), which the generated code's independent chains
    /// hide only in part. A model constant, to be calibrated on a GPU.
    pub const WARP_RATE: f64 = 0.3;
    /// The share of the second largest bound that overlaps the largest imperfectly.
    pub const OVERLAP_LOSS: f64 = 0.25;
}

fn trips(dims: &DimTable, d: DimVar, tile: u64) -> u64 {
    dims.get(d).value.div_ceil(tile).max(1)
}

/// Blocks of a kernel resident on one SM at once: what its shared memory, registers and
/// threads allow.
pub fn resident_blocks(k: &TileKernel, registers: u64, arch: &Arch) -> u64 {
    let threads = u64::from(k.warps.threads());
    let by_smem = if k.smem_bytes == 0 { 32 } else { arch.smem_per_sm / k.smem_bytes.max(1) };
    let by_regs = u64::from(arch.regs_per_sm) / (registers.max(1) * threads);
    let by_threads = u64::from(arch.threads_per_sm) / threads;
    by_smem.min(by_regs).min(by_threads).clamp(1, 32)
}

/// Registers below the budget within which an estimate counts as a risk of spilling.
const REGISTER_MARGIN: u64 = 16;
/// What that risk adds to a kernel's estimated seconds.
const REGISTER_RISK: f64 = 0.01;

/// Estimates a kernel's cost at the dims' representative extents.
pub fn kernel_cost(k: &TileKernel, dims: &DimTable, registers: u64, arch: &Arch) -> Cost {
    let blocks: u64 = k.grid.iter().map(|a| trips(dims, a.dim, a.tile)).product::<u64>().max(1);
    let threads = u64::from(k.warps.threads());
    let warps = threads.div_ceil(32).max(1);
    let mut t = Tally::new(k, dims);
    walk(k, &k.body, 1, dims, &mut t);
    let Tally { bytes, mma, simt, iterations, turns, smem, copied, .. } = t;
    // The bytes of one block that come from DRAM: a tile that every block along some grid axes
    // reads alike is fetched once for them while the tensor fits in L2 (with room for the
    // rest of the traffic), and the other blocks find it there. A grid that is resident at
    // once needs less: its blocks stream their shared tiles side by side, so L2 holds only
    // the distance between the first and the last reader of a tile, whatever the tensor.
    // So do readers launched one after another (along the fastest grid axes, see
    // [`order_grid`]) when a group of them fits in one wave, or when the tile a wave's blocks
    // read (at most two of them) fits in L2 on its own. (A group that straddles two waves
    // fetches its tile twice, which this ignores; and like the test on `unique`, each load is
    // held against L2 alone.)
    let blocks_per_sm = resident_blocks(k, registers, arch);
    let sms = u64::from(arch.sms);
    let slots = sms * blocks_per_sm;
    let fetched: f64 = t
        .reads
        .iter()
        .map(|&(b, shared, adjacent)| {
            let unique = b * blocks / shared;
            if shared > 1 && (unique <= arch.l2_bytes / 2 || blocks <= slots) {
                b as f64 / shared as f64
            } else if adjacent > 1 && (adjacent <= slots || 2 * b <= arch.l2_bytes / 2) {
                b as f64 / adjacent as f64
            } else {
                b as f64
            }
        })
        .sum::<f64>()
        + (bytes - t.reads.iter().map(|r| r.0).sum::<u64>()) as f64;
    // Warp instructions of one block (Tally counts four flops per elementwise operation).
    let instructions = mma as f64 / 4096.0 * Issue::PER_MMA
        + copied as f64 / 512.0 * Issue::PER_COPY
        + simt as f64 / 128.0
        + (iterations * warps) as f64 * Issue::PER_ITERATION;
    let per_sm = |total: f64| total / f64::from(arch.sms);
    // One wave of `n` blocks: the GPU spreads them over the SMs, so the busiest SM holds
    // `r` of them and the wave lasts as long as that SM's work under the slowest of its
    // bounds. A partial wave is cheaper than a full one, but its idle SMs' bandwidth is lost.
    let wave = |n: u64| -> (f64, Bound) {
        let r = n.div_ceil(sms).min(blocks_per_sm) as f64;
        let dram = n as f64 * fetched / arch.dram_bandwidth;
        let dram = dram.max(r * bytes as f64 / arch.sm_dram_bandwidth);
        let compute = r * (mma as f64 / per_sm(arch.mma_flops) + simt as f64 / per_sm(arch.simt_flops));
        // Shared memory serves the tensor cores' operands concurrently with their work, so
        // it is a bound of its own. Measured on the generated SASS (bench/RESULTS.md, "The
        // main loop"), 16-row warp tiles move about twice FlashAttention-2's shared-memory
        // bytes per product, which is what makes 32-row warp tiles worth their registers.
        let smem_time = r * smem as f64 / per_sm(arch.smem_bandwidth);
        // A scheduler issues only for the warps resident on it, and a warp whose next
        // instruction waits on the one before issues only now and then: a one-warp block
        // alone on its SM keeps a third of one scheduler of four busy.
        let rate = |w: f64| (w * Issue::WARP_RATE).min(4.0) * arch.clock_hz;
        let issue = r * instructions / rate(r * warps as f64);
        // A block's loop turns no faster than a DRAM latency shared by the tiles of its
        // pipeline (half of one when double buffered; see `Tally::turns`), nor faster than
        // its own warps issue an iteration's instructions: what a few warps doing a whole
        // tile's softmax and products cost, even when the SM has bandwidth left.
        let latency = turns * arch.dram_latency;
        let latency = latency.max(instructions / rate(warps as f64));
        let mut terms = [
            (dram, Bound::Dram),
            (compute, Bound::Compute),
            (smem_time, Bound::Smem),
            (issue, Bound::Issue),
            (latency, Bound::Latency),
        ];
        terms.sort_by(|a, b| b.0.total_cmp(&a.0));
        // The bounds overlap only in part (a block's phases meet at its barriers), so the
        // second largest adds a share: of two schedules bound alike, the one with less of
        // the other work is the faster.
        let time = terms[0].0 + Issue::OVERLAP_LOSS * terms[1].0;
        // Filling the pipeline before the first tile and draining the last store are
        // latency no other block's work hides within a wave.
        (time + 2.0 * arch.dram_latency, terms[0].1)
    };
    let (full, rest) = (blocks / slots, blocks % slots);
    let (first, bound) = wave(if full > 0 { slots } else { rest });
    let mut seconds = LAUNCH_SECONDS + full as f64 * first;
    if full > 0 && rest > 0 {
        seconds += wave(rest).0;
    } else if full == 0 {
        seconds += first;
    }
    // The register estimate errs most near the budget (ptxas spilled gqa_decode's H200 plan,
    // estimated at 196 of 200), and a spill costs far more than this: of two schedules within
    // a percent of each other, the one with registers to spare wins.
    if registers + REGISTER_MARGIN > super::lower::REGISTER_BUDGET {
        seconds *= 1.0 + REGISTER_RISK;
    }
    Cost {
        blocks,
        gmem_bytes: bytes * blocks,
        mma_flops: mma * blocks,
        simt_flops: simt * blocks,
        smem_bytes: k.smem_bytes,
        smem_traffic: smem * blocks,
        instructions: (instructions * blocks as f64) as u64,
        blocks_per_sm,
        waves: blocks.div_ceil(slots),
        bound,
        seconds,
    }
}

/// Orders a kernel's grid axes so that the blocks that read the same tiles are launched one
/// after another: the axis along which the blocks read the most bytes alike varies fastest
/// (ties keep the lowering's order). The GPU hands out blocks in launch order, so such
/// neighbours run together and fetch a shared tile from DRAM once between them. In the
/// other order a tensor larger than L2 is fetched again by every pass over the slower axis:
/// a weight matrix once per 16-row block of a batch, a K/V head once per block of queries.
/// What depends on the order: the kernels' decoding of their block index (CUDA and TileLang)
/// and the cost model's count of the readers launched together. A kernel with a work list
/// keeps its order: its batch axis has no place of its own in the launch order (the work
/// list's slots run over the requests' tiles), so bytes alike along it do not make readers
/// neighbours.
pub fn order_grid(k: &mut TileKernel, dims: &DimTable) {
    if has_work_list(k, dims) {
        return;
    }
    let mut t = Tally::new(k, dims);
    walk(k, &k.body, 1, dims, &mut t);
    let mut order: Vec<usize> = (0..k.grid.len()).collect();
    order.sort_by_key(|&i| t.alike[i]);
    k.grid = order.iter().map(|&i| k.grid[i]).collect();
}

/// Whether a grid axis of `k` runs over a ragged dim: a work list of (request, tile) slots
/// whose batch axis is folded into it (the CUDA generator's `ragged_grid_axis`).
fn has_work_list(k: &TileKernel, dims: &DimTable) -> bool {
    k.grid.iter().any(|a| {
        matches!(&dims.get(a.dim).per_request, Some(p) if matches!(p.kind, crate::graph::PerRequestKind::Ragged { .. }))
    })
}

/// The per-block counters [`walk`] adds to.
#[derive(Default)]
struct Tally {
    bytes: u64,
    mma: u64,
    simt: u64,
    iterations: u64,
    /// DRAM latencies the loops wait out: an iteration of a loop whose tiles have `s` stages
    /// counts `1 / s`, so a deeper pipeline waits less per tile. (A loop with no loads counts
    /// as double buffered: its operands arrived with an enclosing level's tiles.)
    turns: f64,
    /// Shared-memory bytes read and written.
    smem: u64,
    /// Global bytes copied (loads and stores), for the instruction estimate.
    copied: u64,
    /// Per load: its bytes, how many blocks read the same tiles (the blocks along the grid
    /// axes its tile does not move with), and how many of those are launched one after
    /// another (the blocks along the fastest grid axes its tile does not move with).
    reads: Vec<(u64, u64, u64)>,
    /// Per grid axis (in the kernel's order): the bytes of the loads whose tiles do not move
    /// with it, which the blocks along it read alike.
    alike: Vec<u64>,
    /// Whether the kernel's grid has a work list ([`has_work_list`]), asked once per kernel.
    work_list: bool,
}

impl Tally {
    fn new(k: &TileKernel, dims: &DimTable) -> Tally {
        Tally { alike: vec![0; k.grid.len()], work_list: has_work_list(k, dims), ..Tally::default() }
    }
}

fn walk(k: &TileKernel, body: &[Stmt], times: u64, dims: &DimTable, t: &mut Tally) {
    let rows = k.rows;
    let w = k.warps;
    // Rows and columns the warps' fragments cover, padding included.
    let frag_rows = 16 * u64::from(w.m_tiles) * u64::from(w.m);
    let frag_cols = |cols: u64| cols.div_ceil(8 * u64::from(w.n)) * 8 * u64::from(w.n);
    // The left operand and depth of the statement before, when it is a product: the code
    // generator loads a left operand once for consecutive products of it.
    let mut prev: Option<(MmaA, u64)> = None;
    for s in body {
        let this = match s {
            Stmt::Mma { a, k: kk, .. } => Some((*a, *kk)),
            _ => None,
        };
        let shares_a = this.is_some() && this == prev;
        prev = this;
        match s {
            Stmt::Load { param, tmap, trans, .. } => {
                let p = &k.params[param.0 as usize];
                let load = times * tmap.elements() * p.dtype.size();
                t.bytes += load;
                let shared: u64 =
                    k.grid.iter().filter(|g| !tmap.uses(g.iter)).map(|g| trips(dims, g.dim, g.tile)).product();
                let adjacent: u64 = if t.work_list {
                    1
                } else {
                    k.grid.iter().rev().take_while(|g| !tmap.uses(g.iter)).map(|g| trips(dims, g.dim, g.tile)).product()
                };
                t.reads.push((load, shared.max(1), adjacent.max(1)));
                for (i, g) in k.grid.iter().enumerate() {
                    if !tmap.uses(g.iter) {
                        t.alike[i] += load;
                    }
                }
                // A tile that cannot be copied 16 bytes at a time (or arrives transposed) is
                // copied element by element.
                let per_copy = if !trans && copies_whole_chunks(p, tmap, dims) { 1 } else { 16 / p.dtype.size() };
                t.copied += times * tmap.elements() * p.dtype.size() * per_copy;
                // The copy lands in shared memory.
                t.smem += times * tmap.elements() * p.dtype.size();
            }
            Stmt::Store { param, tmap, staging, .. } => {
                let p = &k.params[param.0 as usize];
                t.bytes += times * tmap.elements() * p.dtype.size();
                t.copied += times * tmap.elements() * p.dtype.size();
                if staging.is_some() {
                    // Written to the staging tile, then read back in 16-byte rows.
                    t.smem += times * 2 * tmap.elements() * p.dtype.size();
                }
            }
            Stmt::Mma { acc, a, b, k: kk, kind, .. } => {
                let (cols, whole) = match k.buf(*acc).kind {
                    BufKind::Frag { cols, whole } => (cols, whole),
                    _ => (1, false),
                };
                // Tensor-core time in f16 flops: a tf32 product takes several (`issue_units`).
                t.mma += times * 2 * rows * cols * kk * kind.issue_units();
                // An f32 tile is read four bytes an element instead of two.
                let width = |buf: BufId| match k.buf(buf).kind {
                    BufKind::Smem { dtype, .. } => dtype.size(),
                    _ => 2,
                };
                let a_width = match a {
                    MmaA::Smem { buf, .. } => width(*buf),
                    MmaA::Frag(_) => 2,
                };
                let b_width = width(b.buf);
                // Widening (and splitting) every operand element a warp reads: a few
                // instructions each, per row of warps for B and per column of warps for A.
                if let MmaKind::Tf32 { a_split, b_split } = kind {
                    let a_ops = rows * kk * u64::from(w.n) * (2 + 4 * u64::from(*a_split));
                    let b_ops = cols * kk * u64::from(w.m) * (2 + 4 * u64::from(*b_split));
                    t.simt += times * (a_ops + b_ops);
                }
                let (a_bytes, b_bytes) = if whole {
                    // Warps splitting the loop contract each their own slice of the depth,
                    // over all columns: between them A and B are read once per row of warps.
                    let a_bytes = match a {
                        MmaA::Smem { .. } if !shares_a => a_width * kk * frag_rows,
                        _ => 0,
                    };
                    (a_bytes, b_width * kk * cols.div_ceil(8) * 8 * u64::from(w.m))
                } else {
                    // Every column of warps loads the A rows of its row of warps, and every
                    // row of warps the B columns of its column: 16-bit operands, `kk` deep.
                    let a_bytes = match a {
                        MmaA::Smem { .. } if !shares_a => a_width * kk * frag_rows * u64::from(w.n),
                        _ => 0,
                    };
                    (a_bytes, b_width * kk * frag_cols(cols) * u64::from(w.m))
                };
                t.smem += times * (a_bytes + b_bytes);
            }
            Stmt::Assign { dst, .. } => {
                let cols = match k.buf(*dst).kind {
                    // Each warp computes all of a whole tile (its own partial).
                    BufKind::Frag { cols, whole: true } => cols * u64::from(w.n),
                    BufKind::Frag { cols, whole: false } => cols,
                    _ => 1,
                };
                t.simt += times * rows * cols * 4;
            }
            Stmt::Merge { scratch, .. } => {
                // Each warp writes its partials and reads every warp's share of them back.
                let bytes = k.buf(*scratch).smem_stage_bytes();
                t.smem += times * 2 * bytes;
                t.simt += times * 2 * bytes / 4;
            }
            Stmt::RowReduce { cols, .. } => t.simt += times * rows * cols * 2,
            Stmt::Stage { dst, .. } => t.smem += times * k.buf(*dst).smem_stage_bytes(),
            Stmt::Loop { dim, tile, body, .. } => {
                let n = times * trips(dims, *dim, *tile);
                t.iterations += n;
                t.turns += n as f64 / f64::from(k.loop_stages(body));
                walk(k, body, n, dims, t);
            }
        }
    }
}

/// A kernel's cost on a set of GPUs: the first GPU's figures, with the mean of the estimated
/// seconds on each ([`Targets`]).
pub fn kernel_cost_on(k: &TileKernel, dims: &DimTable, registers: u64, targets: &Targets) -> Cost {
    mean_cost(targets, |a| kernel_cost(k, dims, registers, a))
}

fn mean_cost(targets: &Targets, cost: impl Fn(&Arch) -> Cost) -> Cost {
    let costs: Vec<Cost> = targets.gpus.iter().map(cost).collect();
    let mut c = costs[0];
    c.seconds = costs.iter().map(|c| c.seconds).sum::<f64>() / costs.len() as f64;
    c
}

/// [`cost_of`] on a set of GPUs, as [`kernel_cost_on`].
pub fn cost_on(k: &Kernel, dims: &DimTable, registers: u64, targets: &Targets) -> Cost {
    mean_cost(targets, |a| cost_of(k, dims, registers, a))
}

/// The cost of any kernel of a launch.
pub fn cost_of(k: &Kernel, dims: &DimTable, registers: u64, arch: &Arch) -> Cost {
    match k {
        Kernel::Tile(t) => kernel_cost(t, dims, registers, arch),
        Kernel::Stage(s) => stage_cost(s, dims, arch),
    }
}

/// Instructions per extended-exponent operation of a stage kernel (normalization, exponent
/// arithmetic): what makes the fallback compute-heavy.
const EXTENDED_OP_COST: u64 = 12;
/// Cycles of one step of a stage's loop beyond its operations: the loads' issue and latency a
/// single thread cannot hide.
const STEP_CYCLES: f64 = 40.0;
/// The SM clock the serial estimate counts in.
const CLOCK_HZ: f64 = 1.4e9;

/// The cost of a fallback stage: every element loads its operands for every step of its loop,
/// with no reuse between threads, and every operation is an extended-exponent one. An upper
/// bound (caches help the real kernel), which is what ranks it below any fused schedule.
pub fn stage_cost(k: &StageKernel, dims: &DimTable, arch: &Arch) -> Cost {
    let extent = |d: Dim| match d {
        Dim::One => 1,
        Dim::Var(v) => dims.get(v).value,
    };
    let elements: u64 = k.space.iter().map(|d| extent(*d)).product::<u64>().max(1);
    // Bytes loaded and operations per element.
    fn count(k: &StageKernel, e: &SExpr, times: u64, extent: &dyn Fn(Dim) -> u64, bytes: &mut u64, ops: &mut u64) {
        match e {
            SExpr::Const(_) => {}
            SExpr::Load { param, .. } => {
                let p = &k.params[param.0 as usize];
                let size = if matches!(p.binding, Binding::Workspace(_)) { 8 } else { p.dtype.size() };
                *bytes += times * size;
            }
            SExpr::Unary(_, a) | SExpr::Mask { value: a, .. } => {
                *ops += times;
                count(k, a, times, extent, bytes, ops);
            }
            SExpr::Binary(_, a, b) => {
                *ops += times;
                count(k, a, times, extent, bytes, ops);
                count(k, b, times, extent, bytes, ops);
            }
            SExpr::Reduce { extent: n, body, .. } => {
                let t = times * extent(*n);
                *ops += t;
                count(k, body, t, extent, bytes, ops);
            }
        }
    }
    let (mut bytes, mut ops) = (0, 0);
    count(k, &k.value, 1, &extent, &mut bytes, &mut ops);
    let out = &k.params[k.out.0 as usize];
    bytes += if matches!(out.binding, Binding::Workspace(_)) { 8 } else { out.dtype.size() };
    let blocks: u64 = k.grid.iter().map(|a| trips(dims, a.dim, a.tile)).product::<u64>().max(1);
    let threads = u64::from(k.threads());
    let blocks_per_sm = (u64::from(arch.threads_per_sm) / threads.max(1)).clamp(1, 32);
    let waves = blocks.div_ceil(u64::from(arch.sms) * blocks_per_sm);
    let gmem_bytes = bytes * elements;
    let simt_flops = ops * elements * EXTENDED_OP_COST;
    // Each thread runs its loop alone: its steps are a dependent chain of extended-exponent
    // operations, whatever the throughput, and it waits out a memory latency for every
    // STAGE_UNROLL steps' loads. Lanes that share an element take a `1 / lanes` share of its
    // steps each, then fold their partials in `log2(lanes)` steps of one operation (a shuffle
    // or a shared-memory read, and an addition). Threads beyond what the GPU holds at once
    // run their chains in later rounds.
    let mut cycles = 0.0;
    if let SExpr::Reduce { extent: n, body, .. } = &k.value {
        let lanes = u64::from(k.lanes.max(1));
        let (mut loaded, mut step_ops) = (0, 0);
        count(k, body, 1, &extent, &mut loaded, &mut step_ops);
        let wait = if loaded > 0 { arch.dram_latency * CLOCK_HZ / f64::from(STAGE_UNROLL) } else { 0.0 };
        let step = |ops: u64| STEP_CYCLES + (ops * EXTENDED_OP_COST) as f64;
        cycles =
            extent(*n).div_ceil(lanes) as f64 * (step(step_ops) + wait) + f64::from(lanes.trailing_zeros()) * step(1);
    }
    let serial = waves as f64 * cycles / CLOCK_HZ;
    let terms = [
        (gmem_bytes as f64 / arch.dram_bandwidth, Bound::Dram),
        (simt_flops as f64 / arch.simt_flops, Bound::Compute),
        (serial, Bound::Latency),
    ];
    let (time, bound) = terms.into_iter().fold((0.0, Bound::Latency), |a, b| if b.0 > a.0 { b } else { a });
    let seconds = LAUNCH_SECONDS + time + 2e-6;
    Cost {
        blocks,
        gmem_bytes,
        mma_flops: 0,
        simt_flops,
        smem_bytes: 0,
        smem_traffic: 0,
        instructions: simt_flops / 32,
        blocks_per_sm,
        waves,
        bound,
        seconds,
    }
}
