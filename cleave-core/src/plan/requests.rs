//! Decisions that depend on a batch's requests, which only the launch knows.
//!
//! One compile of a kernel with per-request dims serves every batch: one request of 16k keys
//! or 64 of 100. So the split count of a Split-K over a per-request dim (split-KV) is chosen at
//! run time, by [`split_count`], from what the launcher knows without reading device memory:
//! how many blocks the kernel has besides the split, and the average length of a request (the
//! packed axis' extent, or the page table's entries times the page size, over the batch). And a
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

/// Blocks a split-KV launch aims at: two waves of an H200's 132 SMs.
pub const SPLIT_TARGET_BLOCKS: u64 = 264;
/// The shortest chunk of a request worth a block of its own: 128 entries are 64 KiB of one
/// 128-wide K/V head in 16 bits, and more than twice that of an MLA latent row.
pub const SPLIT_MIN_CHUNK: u64 = 128;
/// The most parts a per-request dim is split into.
pub const SPLIT_MAX: u64 = 32;

/// The split count of a per-request dim for a launch whose split kernel has `blocks` blocks
/// besides the split, over requests of `per_request` entries on average: enough parts to fill
/// [`SPLIT_TARGET_BLOCKS`], none shorter than [`SPLIT_MIN_CHUNK`], at most [`SPLIT_MAX`].
pub fn split_count(blocks: u64, per_request: u64) -> u64 {
    let by_blocks = SPLIT_TARGET_BLOCKS.div_ceil(blocks.max(1));
    let by_length = (per_request / SPLIT_MIN_CHUNK).max(1);
    by_blocks.min(by_length).clamp(1, SPLIT_MAX)
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

    #[test]
    fn the_split_count_fills_the_gpu_but_keeps_chunks_long() {
        // One request of 16k keys over 4 KV heads: 4 blocks, 64 chunks wanted, capped at 32.
        assert_eq!(split_count(4, 16384), 32);
        // 16 requests of 2048 over 4 heads: 64 blocks, 5 parts fill two waves.
        assert_eq!(split_count(64, 2048), 5);
        // Short requests are not split below 128 keys a part.
        assert_eq!(split_count(4, 600), 4);
        assert_eq!(split_count(4, 255), 1);
        assert_eq!(split_count(4, 100), 1);
        // A launch that fills the GPU already is not split.
        assert_eq!(split_count(512, 8192), 1);
    }
}
