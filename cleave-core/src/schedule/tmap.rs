//! Tile-map back-propagation: from the tile of an op's result, the slice of each operand it
//! reads (Welder's index-range analysis, specialised to our closed op set).

use super::error::ScheduleError;
use crate::graph::{Dim, Graph, NodeId, Op};
use crate::index::{Affine, AxisRange, Limit, TMap};

/// The range covering a whole axis of extent `d`; dynamic axes carry a bound.
pub fn full_range(g: &Graph, d: Dim) -> AxisRange {
    match d {
        Dim::One => AxisRange::unit(),
        Dim::Var(v) => {
            let info = g.dims.get(v);
            let limits = if info.dynamic { vec![Limit { base: Affine::zero(), bound: v }] } else { Vec::new() };
            AxisRange { offset: Affine::zero(), extent: info.value, limits }
        }
    }
}

/// The tiles of `node`'s operands, given the node's own tile and, for a reduction, the range of
/// the reduced (or contracted) axis in the operand.
pub fn operand_tmaps(
    g: &Graph,
    node: NodeId,
    out: &TMap,
    reduced: Option<&AxisRange>,
) -> Result<Vec<TMap>, ScheduleError> {
    let n = g.node(node);
    let rank = n.shape.len();
    // Maps operand axes to output axes right-aligned, with unit ranges where the operand broadcasts.
    let aligned = |arg: NodeId, out_axes: &[AxisRange]| -> TMap {
        let shape = g.shape(arg);
        let off = out_axes.len() - shape.len();
        TMap {
            axes: shape
                .iter()
                .enumerate()
                .map(|(j, d)| if *d == Dim::One { AxisRange::unit() } else { out_axes[j + off].clone() })
                .collect(),
        }
    };
    let need_reduced = || reduced.cloned().ok_or(ScheduleError::NoReducedRange(node));
    Ok(match n.op {
        Op::Input(_) | Op::Const(_) => Vec::new(),
        Op::Unary(_) | Op::Mask(_) => vec![out.clone()],
        Op::Binary(_) => n.args.iter().map(|a| aligned(*a, &out.axes)).collect(),
        Op::Transpose => {
            let mut axes = out.axes.clone();
            axes.swap(rank - 1, rank - 2);
            vec![TMap { axes }]
        }
        Op::MatMul => {
            let k = need_reduced()?;
            // Batch axes broadcast; the row axis of A and the column axis of B follow the output.
            let batch = &out.axes[..rank - 2];
            let operand = |arg: NodeId, rows: AxisRange, cols: AxisRange| {
                let shape = g.shape(arg);
                let nb = shape.len() - 2;
                let off = batch.len() - nb;
                let mut axes: Vec<AxisRange> = (0..nb)
                    .map(|j| if shape[j] == Dim::One { AxisRange::unit() } else { batch[j + off].clone() })
                    .collect();
                axes.push(rows);
                axes.push(cols);
                TMap { axes }
            };
            vec![
                operand(n.args[0], out.axes[rank - 2].clone(), k.clone()),
                operand(n.args[1], k, out.axes[rank - 1].clone()),
            ]
        }
        Op::Reduce(_, axis) => {
            let mut axes = out.axes.clone();
            axes[axis as usize] = need_reduced()?;
            vec![TMap { axes }]
        }
        Op::Split(axis) => {
            // out[j, .., c, ..] = x[.., j*C + c, ..]: a tile must stay inside one part.
            let a = axis as usize;
            let (part, chunk) = (&out.axes[0], &out.axes[a + 1]);
            if part.extent != 1 {
                return Err(ScheduleError::TileSpansSplitParts);
            }
            let Dim::Var(cvar) = g.shape(node)[a + 1] else {
                return Err(ScheduleError::SplitOfUnitAxis);
            };
            let Dim::Var(kvar) = g.shape(n.args[0])[a] else {
                return Err(ScheduleError::SplitOfUnitAxis);
            };
            let start = part.offset.scaled_by(cvar).ok_or(ScheduleError::SplitOffsetNotIterator)?;
            let base = start.add(&chunk.offset);
            let mut limits = chunk.limits.clone();
            if !limits.iter().any(|l| l.bound == cvar) {
                limits.push(Limit { base: chunk.offset.clone(), bound: cvar });
            }
            if !limits.iter().any(|l| l.bound == kvar) {
                limits.push(Limit { base: base.clone(), bound: kvar });
            }
            let mut axes: Vec<AxisRange> = out.axes[1..].to_vec();
            axes[a] = AxisRange { offset: base, extent: chunk.extent, limits };
            vec![TMap { axes }]
        }
    })
}

/// The axis of operand `slot` that `node` reduces, if any: the contracted axis of a matmul, the
/// reduced axis of a reduction.
pub fn reduced_axis(g: &Graph, node: NodeId, slot: usize) -> Option<usize> {
    let n = g.node(node);
    match n.op {
        Op::MatMul => {
            let r = g.shape(n.args[slot]).len();
            Some(if slot == 0 { r - 1 } else { r - 2 })
        }
        Op::Reduce(_, axis) => Some(axis as usize),
        _ => None,
    }
}

/// The dim a reduction reduces.
pub fn reduced_dim(g: &Graph, node: NodeId) -> Option<Dim> {
    reduced_axis(g, node, 0).map(|a| g.shape(g.node(node).args[0])[a])
}
