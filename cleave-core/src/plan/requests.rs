//! Decisions that depend on a batch's requests, which only the launch knows.
//!
//! One compile of a kernel with per-request dims serves every batch: one request of 16k keys
//! or 64 of 100. So the split count of a Split-K over a per-request dim (split-KV) is chosen at
//! run time, by [`split_count`], from what the launcher knows without reading device memory:
//! how many blocks the kernel has besides the split, the average length of a request (the
//! packed axis' extent, or the page table's entries times the page size, over the batch), and
//! the SM count of the GPU the plan was made for, on which the count lands the grid evenly. And a
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

/// Blocks per SM a split aims at, at least: with two, one block's loads are in flight while
/// the other's wait, and a grid of that many blocks is at least one full wave.
pub const SPLIT_BLOCKS_PER_SM: u64 = 2;
/// The shortest chunk of a request worth a block of its own: 128 entries are 64 KiB of one
/// 128-wide K/V head in 16 bits, and more than twice that of an MLA latent row.
pub const SPLIT_MIN_CHUNK: u64 = 128;
/// The most parts a per-request dim is split into.
pub const SPLIT_MAX: u64 = 32;
/// What a block of a split costs besides streaming its chunk, in entries of a request:
/// storing its partial result, the combine's reading it back, and filling its pipeline. Half
/// the shortest chunk; a constant of the same standing as the cost model's, to be measured on
/// a GPU.
pub const SPLIT_BLOCK_OVERHEAD: u64 = 64;

/// The split count of a per-request dim for a launch whose split kernel has `blocks` blocks
/// besides the split, over requests of `per_request` entries on average, on a GPU of `sms`
/// SMs.
///
/// The counts worth having lie between enough parts for [`SPLIT_BLOCKS_PER_SM`] blocks per
/// SM and as many as leave no chunk shorter than [`SPLIT_MIN_CHUNK`] (at most
/// [`SPLIT_MAX`]); when the first exceeds the second, the second wins. Among them the count
/// is chosen by the work of the busiest SM, which the launch lasts as long as: with `s` parts
/// it runs `ceil(blocks·s / sms)` blocks, each streaming `per_request / s` entries and paying
/// [`SPLIT_BLOCK_OVERHEAD`]. A grid of 288 blocks on 132 SMs leaves the busiest SM three blocks
/// where the average is 2.2; 384 blocks give it three of a quarter less work each.
pub fn split_count(blocks: u64, per_request: u64, sms: u64) -> u64 {
    // Bounded so that the products below cannot overflow; no launch comes near the bounds.
    let blocks = blocks.clamp(1, 1 << 32);
    let sms = sms.clamp(1, 1 << 16);
    let per_request = per_request.min(1 << 48);
    let most = (per_request / SPLIT_MIN_CHUNK).clamp(1, SPLIT_MAX);
    let least = (SPLIT_BLOCKS_PER_SM * sms).div_ceil(blocks).clamp(1, most);
    // The busiest SM's work with `s` parts, times `s` (its blocks, each `per_request / s`
    // entries and the overhead), so that counts compare exactly by cross-multiplication.
    let work = |s: u64| u128::from((blocks * s).div_ceil(sms)) * u128::from(per_request + SPLIT_BLOCK_OVERHEAD * s);
    (least..=most).fold(least, |best, s| if work(s) * u128::from(best) < work(best) * u128::from(s) { s } else { best })
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

    /// The H200's SMs, which the tests' figures are for.
    const H200: u64 = 132;

    #[test]
    fn the_split_count_fills_the_gpu_but_keeps_chunks_long() {
        // One request of 16k keys over 4 KV heads: 4 blocks, 66 parts wanted, capped at 32.
        assert_eq!(split_count(4, 16384, H200), 32);
        // 16 requests of 2048 over 4 heads: 64 blocks; 5 parts would be 320 blocks, three on
        // the busiest SM; 6 give every SM two or three, of a sixth of a request each.
        assert_eq!(split_count(64, 2048, H200), 6);
        // Short requests are not split below 128 keys a part.
        assert_eq!(split_count(4, 600, H200), 4);
        assert_eq!(split_count(4, 255, H200), 1);
        assert_eq!(split_count(4, 100, H200), 1);
        // A launch that fills the GPU already is not split.
        assert_eq!(split_count(512, 8192, H200), 1);
    }

    #[test]
    fn the_split_count_lands_evenly_on_the_sms_it_finds() {
        // 32 heads over 4096 keys: 9 parts (the fewest for two blocks per SM) would be 288 blocks, three
        // the busiest of 132 SMs against 2.2 on average; 12 parts are 384 blocks, three on
        // every SM but 12. An A100's 108 SMs take 10 parts: 320 blocks, at most three each.
        assert_eq!(split_count(32, 4096, H200), 12);
        assert_eq!(split_count(32, 4096, 108), 10);
        // Over a sweep, the count stays within its bounds, fills a wave whenever the requests
        // are long enough for it, and no other count of its range gives the busiest SM less
        // work (reckoned here in floating point).
        for sms in [16, 78, 108, 114, 132, 148] {
            for blocks in [1, 2, 3, 5, 8, 13, 32, 64, 100, 127, 200, 264, 300, 1000] {
                for per_request in [0, 100, 128, 1000, 4096, 5000, 1 << 20] {
                    let s = split_count(blocks, per_request, sms);
                    let most = (per_request / SPLIT_MIN_CHUNK).clamp(1, SPLIT_MAX);
                    assert!((1..=most).contains(&s), "{blocks} blocks, {per_request}, {sms} SMs: {s}");
                    if most * blocks >= 2 * sms {
                        assert!(s * blocks >= 2 * sms, "{blocks} blocks, {per_request}, {sms} SMs: {s}");
                    }
                    let busiest = |s: u64| {
                        let per_sm = ((blocks * s) as f64 / sms as f64).ceil();
                        per_sm * (per_request as f64 / s as f64 + SPLIT_BLOCK_OVERHEAD as f64)
                    };
                    let least = (2 * sms).div_ceil(blocks).clamp(1, most);
                    for other in least..=most {
                        assert!(
                            busiest(s) <= busiest(other) * (1.0 + 1e-12),
                            "{blocks} blocks, {per_request}, {sms} SMs: {s} parts, but {other} do better"
                        );
                    }
                }
            }
        }
    }
}
