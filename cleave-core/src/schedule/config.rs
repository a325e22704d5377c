//! Tile configurations (paper App. A, Alg. 2): output tiles and grouped reduction tiles.
//!
//! Ladders are aligned to the `mma` shape (16) and to 16-byte transactions; dynamic axes take
//! tiles from a fixed ladder and are predicated, never divisors of one representative size.

use std::collections::{BTreeMap, BTreeSet};

use super::build::transposed_output;
use super::tmap::reduced_dim;
use crate::graph::{Dim, DimKind, DimVar, Graph, NodeId, Op};

/// One point of the schedule space.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct TileConfig {
    /// Tile of each output dim (absent: the whole axis).
    pub out: BTreeMap<DimVar, u64>,
    /// Tile of the reduced axis of each reduction (absent: the whole axis).
    pub red: BTreeMap<NodeId, u64>,
    /// Warps per block.
    pub warps: u32,
    /// Shared-memory stages of the tiles a loop streams: a loop with `stages` of them keeps
    /// `stages - 1` tiles in flight while it works on one (2: double buffering).
    pub stages: u32,
}

/// The rows tile ladder: one to eight `mma` row blocks.
const ROW_TILES: [u64; 4] = [16, 32, 64, 128];
/// Reduction tiles for iterated axes.
const RED_TILES: [u64; 3] = [32, 64, 128];
/// Pipeline depths for a kernel that loops: double buffering, and deeper pipelines for loops
/// whose tiles are small (a decode block's slice of K/V, a combine's one partial per step), so
/// that enough bytes are in flight to cover the DRAM latency. The cost model chooses.
const STAGES: [u32; 4] = [2, 3, 4, 8];

fn round16(x: u64) -> u64 {
    x.div_ceil(16) * 16
}

/// The node whose tile defines the block: the output of highest rank, then the first; for
/// an output that transposes a computed value, that value (the block computes it in its own
/// orientation, and the store transposes it).
pub fn primary_output(g: &Graph) -> NodeId {
    let mut best = &g.outputs[0];
    for o in &g.outputs[1..] {
        if g.shape(o.node).len() > g.shape(best.node).len() {
            best = o;
        }
    }
    if transposed_output(g, best.node) {
        g.node(best.node).args[0]
    } else {
        best.node
    }
}

/// Every configuration of a kernel graph, in a fixed order.
pub fn configs(g: &Graph) -> Vec<TileConfig> {
    let primary = g.shape(primary_output(g)).to_vec();
    let rank = primary.len();
    // The dims that are some product's columns.
    let product_columns: BTreeSet<DimVar> = g
        .ids()
        .filter(|id| matches!(g.node(*id).op, Op::MatMul))
        .filter_map(|id| match g.shape(id).last() {
            Some(Dim::Var(v)) => Some(*v),
            _ => None,
        })
        .collect();
    // Candidate tiles per output dim.
    let mut out_choices: Vec<(DimVar, Vec<u64>)> = Vec::new();
    for (j, d) in primary.iter().enumerate() {
        let Dim::Var(v) = *d else { continue };
        if out_choices.iter().any(|(w, _)| *w == v) {
            continue;
        }
        let info = g.dims.get(v);
        let e = info.value;
        let choices: Vec<u64> = if j + 1 == rank {
            if !info.dynamic && e <= 256 {
                let mut c = vec![e];
                c.extend([64, 128].into_iter().filter(|t| *t < e && e % t == 0));
                // A product's columns come in groups of 8 (the MMA's width). A declared
                // axis that is not a multiple of 8 is also tiled rounded up to one, its
                // columns past the end loaded as zeros and never stored.
                if e % 8 != 0 && product_columns.contains(&v) {
                    c.push(e.div_ceil(8) * 8);
                }
                c
            } else if !info.dynamic && e <= 512 {
                // A whole row of up to 512 columns: the one tile with which an output axis that
                // is also contracted (MLA's latent width, both the keys and the values) is read
                // whole for the scores and sliced for nothing.
                let mut c: Vec<u64> = vec![64, 128, 256].into_iter().filter(|t| *t < e).collect();
                c.push(e);
                c
            } else {
                // A dynamic axis runs at any extent, down to 1: a small representative value
                // gets the small tiles, never none.
                let c: Vec<u64> = vec![64, 128, 256].into_iter().filter(|t| *t <= round16(e)).collect();
                if c.is_empty() {
                    [16, 32].into_iter().filter(|t| *t <= round16(e)).collect()
                } else {
                    c
                }
            }
        } else if j + 2 == rank {
            let mut c: Vec<u64> = ROW_TILES.into_iter().filter(|t| *t <= round16(e).max(16)).collect();
            if !info.dynamic && e < 16 {
                c = vec![e];
            }
            c
        } else {
            // Batch axes map to the grid; a static axis next to the rows may instead be packed
            // into the rows, whole when small or in groups of 2, 4 or 8 that divide it, so
            // that query heads sharing one K/V head (GQA's groups, all of MQA's heads) read
            // each K/V tile once per block rather than once per head. Where the heads do not
            // share (MHA), the packed tile's maps conflict and the scheduler refuses it.
            let mut c = vec![1];
            if !info.dynamic && e > 1 && j + 3 == rank && matches!(info.kind, DimKind::Plain) {
                c.extend([2, 4, 8].into_iter().filter(|&t| t < e && e % t == 0));
                if e <= 8 {
                    c.push(e);
                }
            }
            c
        };
        out_choices.push((v, choices));
    }
    // The dims that are some output's last axis: its rows' width.
    let output_last: BTreeSet<DimVar> = g
        .outputs
        .iter()
        .filter_map(|o| match g.shape(o.node).last() {
            Some(Dim::Var(v)) => Some(*v),
            _ => None,
        })
        .collect();
    // Reductions grouped by the dim they reduce share one tile.
    let mut classes: BTreeMap<DimVar, (Vec<NodeId>, bool)> = BTreeMap::new();
    for id in g.ids() {
        let Some(Dim::Var(v)) = reduced_dim(g, id) else { continue };
        let n = g.node(id);
        let non_last = matches!(n.op, Op::Reduce(_, a) if (a as usize) + 1 != g.shape(n.args[0]).len());
        let e = classes.entry(v).or_insert((Vec::new(), false));
        e.0.push(id);
        e.1 |= non_last;
    }
    let mut red_choices: Vec<(Vec<NodeId>, Vec<u64>)> = Vec::new();
    for (v, (nodes, non_last)) in classes {
        let info = g.dims.get(v);
        let choices: Vec<u64> = if non_last || matches!(info.kind, DimKind::SplitCount { .. }) {
            vec![1]
        } else if info.dynamic {
            RED_TILES.to_vec()
        } else {
            let e = info.value;
            let mut c = Vec::new();
            // A contracted axis that is also an output's last axis (MLA's latent width, up to
            // 512: the keys and the values are one tensor) may be read whole for the product
            // too, so that one tile serves both and nothing is loaded twice.
            if e <= 256 || (e <= 512 && output_last.contains(&v)) {
                c.push(e);
            }
            // A product's contraction tile must be a multiple of the MMA depth (16). A
            // declared axis that is not one is read in a tile rounded up to it, zero past its
            // end, as a dynamic axis' last tile is. A split's chunk is not: other split counts
            // give chunks that need no padding.
            let contracted = nodes.iter().any(|n| matches!(g.node(*n).op, Op::MatMul));
            if contracted && matches!(info.kind, DimKind::Plain) && e % 16 != 0 && round16(e) <= 256 {
                c.push(round16(e));
            }
            c.extend(RED_TILES.into_iter().filter(|t| *t < e));
            c
        };
        red_choices.push((nodes, choices));
    }
    // Cartesian product in a fixed order.
    let mut configs = vec![TileConfig { out: BTreeMap::new(), red: BTreeMap::new(), warps: 4, stages: 2 }];
    for (v, choices) in &out_choices {
        configs = configs
            .into_iter()
            .flat_map(|c| {
                choices.iter().map(move |t| {
                    let mut c = c.clone();
                    c.out.insert(*v, *t);
                    c
                })
            })
            .collect();
    }
    for (nodes, choices) in &red_choices {
        configs = configs
            .into_iter()
            .flat_map(|c| {
                choices.iter().map(move |t| {
                    let mut c = c.clone();
                    for n in nodes {
                        c.red.insert(*n, *t);
                    }
                    c
                })
            })
            .collect();
    }
    configs
        .into_iter()
        .flat_map(|c| {
            let rows = row_count(g, &c);
            let mut v = vec![TileConfig { warps: 4, ..c.clone() }];
            // Eight warps need 128 rows to stack down, or an output row wide enough to give
            // column warps their share: 32 rows of 512 columns (MLA's latent width) would hold
            // 128 f32 accumulators a thread over four warps, and eight halve that.
            let wide = output_last.iter().any(|v| c.out.get(v).copied().unwrap_or(g.dims.get(*v).value) >= 512);
            if rows >= 128 || (rows >= 32 && wide) {
                v.push(TileConfig { warps: 8, ..c });
            }
            v
        })
        .flat_map(|c| {
            // Only a kernel with a loop has tiles in flight; the others would only repeat.
            let depths = if loops(g, &c) { &STAGES[..] } else { &STAGES[..1] };
            depths.iter().map(move |&stages| TileConfig { stages, ..c.clone() })
        })
        .collect()
}

/// True when some reduction of the configuration runs as a loop: its tile is not its axis'
/// extent, or the axis is dynamic.
fn loops(g: &Graph, c: &TileConfig) -> bool {
    c.red.iter().any(|(id, tile)| match reduced_dim(g, *id) {
        Some(Dim::Var(v)) => {
            let info = g.dims.get(v);
            info.dynamic || *tile != info.value
        }
        _ => false,
    })
}

/// The number of rows of the block: the product of the primary output's non-last tiles.
pub fn row_count(g: &Graph, c: &TileConfig) -> u64 {
    let shape = g.shape(primary_output(g));
    shape[..shape.len().saturating_sub(1)]
        .iter()
        .map(|d| match d {
            Dim::One => 1,
            Dim::Var(v) => c.out.get(v).copied().unwrap_or(g.dims.get(*v).value),
        })
        .product()
}
