//! Decisions that depend on a batch's requests, which only the launch knows.
//!
//! One compile of a kernel with per-request dims serves every batch: one request of 16k keys
//! or 64 of 100. So the split count of a Split-K over a per-request dim (split-KV) is chosen at
//! run time, by [`split_count`], from what the launcher knows without reading device memory:
//! how many blocks the kernel has besides the split, the average length of a request (the
//! packed axis' extent, or the page table's entries times the page size, over the batch), and
//! the GPU's SM count and how many blocks of the split kernel one SM holds (the compiler ranks
//! with the figures of the GPU the plan is made for; a launch asks its device's driver). And a
//! schedule is ranked by its estimated time over a few [`workloads`], not at one shape.
//!
//! A split of a dynamic dense axis (the keys of a decode over a dense cache, a dynamic depth)
//! is chosen the same way, with the axis' extent as the one request's length: a fixed count
//! would be sized for the declared extents only, too few parts for one sequence and too many
//! for a large batch.
//!
//! The runtime applies the same rule (`cleave_runtime::plan::split_count`); a test of the
//! facade checks that the two agree.

use crate::graph::{DimKind, DimTable, DimVar, Graph, PerRequestKind, ValidGraph};

/// The shortest chunk of a request worth a block of its own: 128 entries are 64 KiB of one
/// 128-wide K/V head in 16 bits, and more than twice that of an MLA latent row.
pub const SPLIT_MIN_CHUNK: u64 = 128;
/// The most parts a per-request dim is split into.
pub const SPLIT_MAX: u64 = 32;
/// What a block of a split costs besides streaming its chunk, in entries of a request:
/// storing its partial result, the combine's reading it back, and filling its pipeline. Half
/// the shortest chunk.
pub const SPLIT_BLOCK_OVERHEAD: u64 = 64;

/// What the split-count rule knows of a launch: all of it is known to the launcher without
/// reading device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitShape {
    /// The split kernel's blocks besides the split.
    pub blocks: u64,
    /// Of those, how many stream data of their own: the blocks along grid axes that index
    /// the tensors the split axis runs over. The others (the row tiles of a batch over one
    /// K/V head, query heads packed apart) read the same chunks again, from L2.
    pub streams: u64,
    /// The entries a request has on average.
    pub per_request: u64,
    /// The GPU's SMs.
    pub sms: u64,
    /// Blocks of the split kernel one SM holds at once.
    pub resident: u64,
    /// How many blocks, each streaming as fast as one block does, saturate DRAM: the GPU's
    /// DRAM bandwidth over one SM's ([`split_fill`]).
    pub fill: u64,
}

/// [`SplitShape::fill`] of a GPU: its DRAM bandwidth over the most one SM streams on its own.
pub fn split_fill(arch: &crate::arch::Arch) -> u32 {
    (arch.dram_bandwidth / arch.sm_dram_bandwidth).round().clamp(1.0, 4096.0) as u32
}

/// The split count of a per-request dim: of the counts from 1 up to as many as leave no chunk
/// shorter than [`SPLIT_MIN_CHUNK`] (at most [`SPLIT_MAX`]), the one whose launch is
/// estimated to end first, the fewest parts among equals.
///
/// With `s` parts a launch lasts as long as the longer of two things, in units of one
/// block's streaming of one entry:
/// - the busiest SM: it runs `ceil(blocks·s / sms)` blocks, `resident` at a time, each
///   streaming `per_request / s` entries and paying [`SPLIT_BLOCK_OVERHEAD`];
/// - DRAM: the `streams · per_request` entries of distinct data and every block's overhead,
///   at `fill` blocks' rate.
///
/// So a split stops at about one block per SM when the blocks read distinct data (DRAM is
/// then the bound, and every further part only adds partials to store and merge), and goes on
/// to fill every resident slot when many blocks read the same chunks (one block then streams
/// from L2 at its own rate, which DRAM would outpace). Measured on an H200 (bench/RESULTS.md,
/// "The split count, measured"), this picks the fastest count of the attention decodes at
/// batches of 1 to 64 and contexts of 4k and 16k keys.
pub fn split_count(shape: SplitShape) -> u64 {
    // Bounded so that the products below cannot overflow; no launch comes near the bounds.
    let blocks = u128::from(shape.blocks.clamp(1, 1 << 24));
    let streams = u128::from(shape.streams.clamp(1, 1 << 24)).min(blocks);
    let sms = u128::from(shape.sms.clamp(1, 1 << 16));
    let resident = u128::from(shape.resident.clamp(1, 64));
    let fill = u128::from(shape.fill.clamp(1, 1 << 12));
    let per_request = shape.per_request.min(1 << 40);
    let most = (per_request / SPLIT_MIN_CHUNK).clamp(1, SPLIT_MAX);
    let per = u128::from(per_request);
    let over = u128::from(SPLIT_BLOCK_OVERHEAD);
    // The launch's time with `s` parts, times `s · fill`, so that counts compare exactly by
    // cross-multiplication.
    let time = |s: u64| {
        let s = u128::from(s);
        let rounds = (blocks * s).div_ceil(sms).div_ceil(resident);
        let busiest = rounds * (per + over * s) * fill;
        let dram = (streams * per + blocks * s * over) * s;
        busiest.max(dram)
    };
    (2..=most).fold(1, |best, s| if time(s) * u128::from(best) < time(best) * u128::from(s) { s } else { best })
}

/// The rule's view of split count `v` of kernel `k` at the extents `extent` gives, over
/// requests of `per_request` entries on a GPU of `sms` SMs that holds `resident` of its
/// blocks at once and whose DRAM `fill` blocks keep busy.
pub fn split_shape(
    k: &crate::plan::program::TileKernel,
    v: DimVar,
    extent: &dyn Fn(DimVar) -> u64,
    per_request: u64,
    sms: u32,
    resident: u64,
    fill: u32,
) -> SplitShape {
    let axes = split_axes(k, v);
    let trips = |a: &crate::plan::program::GridAxis| extent(a.dim).div_ceil(a.tile).max(1);
    SplitShape {
        blocks: axes.iter().map(|(a, _)| trips(a)).product(),
        streams: axes.iter().filter(|(_, own)| *own).map(|(a, _)| trips(a)).product(),
        per_request,
        sms: u64::from(sms),
        resident,
        fill: u64::from(fill),
    }
}

/// The grid axes of split kernel `k` besides its split count `v`, each with whether its
/// blocks stream data of their own ([`SplitShape::streams`]): whether some tile the kernel
/// loads along the split also moves with that axis. A kernel that loads nothing along the
/// split has every axis streaming.
pub fn split_axes(k: &crate::plan::program::TileKernel, v: DimVar) -> Vec<(crate::plan::program::GridAxis, bool)> {
    let split = k.grid.iter().find(|a| a.dim == v).map(|a| a.iter);
    let streamed: Vec<&crate::index::TMap> = crate::plan::program::flatten(&k.body)
        .into_iter()
        .filter_map(|st| match st {
            crate::plan::program::Stmt::Load { tmap, .. } if split.is_some_and(|i| tmap.uses(i)) => Some(tmap),
            _ => None,
        })
        .collect();
    k.grid
        .iter()
        .filter(|a| a.dim != v)
        .map(|a| (*a, streamed.is_empty() || streamed.iter().any(|t| t.uses(a.iter))))
        .collect()
}

/// The split counts that a launch chooses at run time (of per-request and of dynamic axes):
/// marked dynamic (the kernels take them as extents), their value the representative one.
pub fn runtime_splits(g: ValidGraph) -> ValidGraph {
    let counts: Vec<DimVar> = g.dims.iter().map(|(v, _)| v).filter(|v| is_runtime_split(&g.dims, *v)).collect();
    if counts.is_empty() {
        return g;
    }
    let mut graph: Graph = g.into_inner();
    for v in counts {
        graph.dims.get_mut(v).dynamic = true;
    }
    crate::graph::validate(graph).expect("only a dim's flag changed")
}

/// Whether `v` is a split count a launch chooses at run time: the split of a per-request dim
/// or of a dynamic one. (A static axis splits into one of its divisors, fixed at compile time.)
pub fn is_runtime_split(dims: &DimTable, v: DimVar) -> bool {
    matches!(dims.get(v).kind, DimKind::SplitCount { of } if dims.get(of).per_request.is_some() || dims.get(of).dynamic)
}

/// Whether some split count of `dims` is chosen at run time.
pub fn has_runtime_splits(dims: &DimTable) -> bool {
    dims.iter().any(|(v, _)| is_runtime_split(dims, v))
}

/// The entries a request of per-request dim `v` has on average, as a launcher computes it
/// from the extents it is given.
pub fn per_request_entries(dims: &DimTable, v: DimVar, extent: &dyn Fn(DimVar) -> u64) -> u64 {
    let Some(pr) = &dims.get(v).per_request else { return extent(v) };
    let total = match &pr.kind {
        PerRequestKind::Ragged { total: Some(t), .. } => extent(*t),
        PerRequestKind::Ragged { total: None, .. } => extent(v) * extent(pr.batch),
        PerRequestKind::Paged { indices, page_size, .. } => extent(indices.len) * page_size,
    };
    total / extent(pr.batch).max(1)
}

/// The workloads a schedule of a graph with per-request dims is ranked over: the declared
/// extents; one request eight times as long (the long-context decode that only a split fills
/// the GPU with); and four times the requests at a quarter of the length. Every table keeps the
/// graph's dims and only their values change: a batch, its per-request dims, and the extents
/// of the axes that hold them (packed totals, page tables and pools), kept consistent.
pub fn workloads(dims: &DimTable) -> Vec<DimTable> {
    if !dims.has_per_request() {
        return vec![dims.clone()];
    }
    let scaled = |batch: &dyn Fn(u64) -> u64, len: &dyn Fn(u64) -> u64| {
        let mut t = dims.clone();
        let per: Vec<(DimVar, crate::graph::PerRequest)> =
            dims.iter().filter_map(|(v, d)| d.per_request.clone().map(|p| (v, p))).collect();
        let mut batches: Vec<DimVar> = per.iter().map(|(_, p)| p.batch).collect();
        batches.sort();
        batches.dedup();
        for b in batches {
            t.get_mut(b).value = batch(dims.get(b).value).max(1);
        }
        for (v, p) in &per {
            let l = len(dims.get(*v).value).max(1);
            t.get_mut(*v).value = l;
            let n = t.get(p.batch).value;
            match &p.kind {
                PerRequestKind::Ragged { total: Some(total), .. } => t.get_mut(*total).value = n * l,
                PerRequestKind::Ragged { total: None, .. } => {}
                PerRequestKind::Paged { indices, page_size, .. } => {
                    let entries = n * l.div_ceil(*page_size);
                    t.get_mut(indices.len).value = entries;
                }
            }
        }
        t
    };
    vec![dims.clone(), scaled(&|_| 1, &|l| 8 * l), scaled(&|b| 4 * b, &|l| l.div_ceil(4))]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H200: 132 SMs, and DRAM saturated by about 102 blocks streaming at once.
    fn h200(blocks: u64, streams: u64, per_request: u64, resident: u64) -> u64 {
        split_count(SplitShape { blocks, streams, per_request, sms: 132, resident, fill: 102 })
    }

    #[test]
    fn the_split_count_follows_what_was_measured() {
        // The shapes of bench/RESULTS.md's sweep on an H200, where these counts were the
        // fastest. 32 heads of distinct keys, 16 queries a block: 4 parts, 128 blocks, one
        // per SM (12 parts, three per SM, took 1.15 to 1.25 times as long).
        assert_eq!(h200(32, 32, 4096, 3), 4);
        assert_eq!(h200(32, 32, 16384, 1), 4);
        // 64 queries: four row tiles read each head's keys again, from L2, where one block
        // streams slower than DRAM could feed it; two blocks per SM then go faster.
        assert_eq!(h200(128, 32, 4096, 2), 2);
        // The product chain at 64 queries: the same shape, with three blocks per SM as the
        // register estimate (88) has it, takes 3 parts; at the two that ptxas's 177 registers
        // allow, which the launcher asks the driver for, 2 parts, the fastest of the sweep
        // (26.2 us at 4096 keys against 33.5 at 3, 63.6 against 81.0 at 16384).
        assert_eq!(h200(128, 32, 4096, 3), 3);
        assert_eq!(h200(128, 32, 16384, 3), 3);
        assert_eq!(h200(128, 32, 16384, 2), 2);
        // One K/V head for 16 blocks of query heads: 8 parts, one block per SM (the rule of
        // two blocks per SM took 24 and was 1.5 times as slow).
        assert_eq!(h200(16, 1, 4096, 1), 8);
        // MLA, one request's 16 heads a block, 16 requests: 2 parts.
        assert_eq!(h200(64, 16, 4096, 1), 2);
        // A single request over 4 blocks: as many parts as chunks of 128 allow, up to 32.
        assert_eq!(h200(4, 1, 16384, 1), 32);
    }

    #[test]
    fn the_split_count_keeps_chunks_long_and_ends_first() {
        // Short requests are not split below 128 keys a part, and a launch that fills the GPU
        // with distinct data already is not split.
        assert_eq!(h200(4, 4, 600, 2), 4);
        assert_eq!(h200(4, 4, 255, 2), 1);
        assert_eq!(h200(4, 4, 100, 2), 1);
        assert_eq!(h200(512, 512, 8192, 2), 1);
        // Over a sweep, the count stays within its bounds and no other count of its range is
        // estimated to end sooner, by the same model reckoned here in floating point.
        for sms in [16, 78, 108, 132, 148] {
            for blocks in [1u64, 2, 3, 5, 8, 13, 32, 64, 100, 127, 200, 264, 300, 1000] {
                for streams in [1, blocks.div_ceil(4), blocks] {
                    for per_request in [0, 100, 128, 1000, 4096, 5000, 1 << 20] {
                        for (resident, fill) in [(1, 83), (2, 102), (3, 116)] {
                            let shape = SplitShape { blocks, streams, per_request, sms, resident, fill };
                            let s = split_count(shape);
                            let most = (per_request / SPLIT_MIN_CHUNK).clamp(1, SPLIT_MAX);
                            assert!((1..=most).contains(&s), "{shape:?}: {s}");
                            let time = |s: u64| {
                                let n = ((blocks * s) as f64 / sms as f64).ceil();
                                let rounds = (n / resident as f64).ceil();
                                let busiest = rounds * (per_request as f64 / s as f64 + SPLIT_BLOCK_OVERHEAD as f64);
                                let dram = (streams as f64 * per_request as f64
                                    + (blocks * s) as f64 * SPLIT_BLOCK_OVERHEAD as f64)
                                    / fill as f64;
                                busiest.max(dram)
                            };
                            for other in 1..=most {
                                assert!(
                                    time(s) <= time(other) * (1.0 + 1e-12),
                                    "{shape:?}: {s} parts, but {other} end sooner"
                                );
                                if other < s {
                                    assert!(time(other) > time(s) * (1.0 - 1e-12), "{shape:?}: {other} parts tie {s}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
