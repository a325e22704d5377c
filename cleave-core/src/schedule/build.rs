//! Inter- and intra-threadblock scheduling (paper §5.3): one tile configuration to an itGraph.
//!
//! The inter-block pass tiles the outputs into the grid and back-propagates tile maps to every
//! node, with every reduction still reading its whole reduced axis. The intra-block pass then
//! repeatedly takes the last-wave iterative reductions (those with no iterative reduction
//! downstream), groups the ones that share producers (horizontal fusion), and wraps each group
//! with all its producers in a sequential loop over the reduced axis, re-deriving tile maps
//! inside. It recurses into each new loop until every reduction runs at its configured tile.

use std::collections::{BTreeMap, BTreeSet};

use super::config::TileConfig;
use super::error::ScheduleError;
use super::itgraph::{ItGraph, ItNode, LoopAxis, LoopKind};
use super::tmap::{full_range, operand_tmaps, reduced_axis};
use crate::graph::{Dim, DimKind, DimVar, Graph, NodeId, Op};
use crate::index::{Affine, AxisRange, IterId, Limit, TMap};

/// Allocates fresh iterators.
#[derive(Default)]
struct Iters(u32);

impl Iters {
    fn fresh(&mut self) -> IterId {
        self.0 += 1;
        IterId(self.0 - 1)
    }
}

/// Schedules `g` (one kernel's graph) under `cfg`.
pub fn schedule(g: &Graph, cfg: &TileConfig) -> Result<ItGraph, ScheduleError> {
    let mut iters = Iters::default();
    let live = g.live();
    let ops: Vec<NodeId> = g.ids().filter(|id| live[id.index()]).collect();

    // Grid: one parallel axis per output axis that is tiled (or dynamic, hence always tiled).
    // Outputs share the grid axis of a dim (attention's output and its log-sum-exp walk the
    // same query tiles), but two axes of one output over the same dim (a Gram matrix x·xᵀ over
    // [n, n]) are independent and get one grid axis each: the k-th axis over a dim in every
    // output is the k-th grid axis of that dim. Outputs whose axes pair up otherwise get tile
    // maps that conflict, which the back-propagation rejects.
    let mut loops: Vec<LoopAxis> = Vec::new();
    let mut seeds: BTreeMap<NodeId, TMap> = BTreeMap::new();
    for out in &g.outputs {
        let mut axes = Vec::new();
        let mut seen: Vec<DimVar> = Vec::new();
        let rank = g.shape(out.node).len();
        for (j, &d) in g.shape(out.node).iter().enumerate() {
            let Dim::Var(v) = d else {
                axes.push(AxisRange::unit());
                continue;
            };
            let info = g.dims.get(v);
            // A tile is no wider than its axis, but a row is kept a multiple of 8 columns,
            // the width a product's columns come in: past the end they are predicated.
            let most = if j + 1 == rank { info.value.div_ceil(8) * 8 } else { info.value };
            let tile = cfg.out.get(&v).copied().unwrap_or(info.value).min(most.max(1));
            let tiled = info.dynamic || tile < info.value;
            let occurrence = seen.iter().filter(|&&x| x == v).count();
            seen.push(v);
            let offset = if tiled {
                let iter = match loops.iter().filter(|l| l.dim == v).nth(occurrence) {
                    Some(l) => l.iter,
                    None => {
                        let iter = iters.fresh();
                        loops.push(LoopAxis { iter, dim: v, tile });
                        iter
                    }
                };
                Affine::iter(iter, tile)
            } else {
                Affine::zero()
            };
            let ragged = info.dynamic || info.value % tile != 0;
            let limits = if ragged { vec![Limit { base: offset.clone(), bound: v }] } else { Vec::new() };
            axes.push(AxisRange { offset, extent: tile, limits });
        }
        let tm = TMap { axes };
        if let Some(prev) = seeds.get(&out.node) {
            if *prev != tm {
                return Err(ScheduleError::Conflict(out.node));
            }
        }
        seeds.insert(out.node, tm);
    }
    // A split part's chunk is valid only inside the chunk and inside the axis it was cut from:
    // the last part of a ragged split extends past the end. The part index is the grid axis
    // over the split count.
    let reduced = |node: NodeId| -> Option<AxisRange> {
        let a = reduced_axis(g, node, 0)?;
        let d = g.shape(g.node(node).args[0])[a];
        let mut range = full_range(g, d);
        if let Dim::Var(v) = d {
            if let DimKind::SplitChunk { of, count } = g.dims.get(v).kind {
                if let Some(part) = loops.iter().find(|l| l.dim == count) {
                    let base = Affine::iter(part.iter, 1).scaled_by(v).expect("a pure iterator offset");
                    range.limits.push(Limit { base, bound: of });
                    if !range.limits.iter().any(|l| l.bound == v) {
                        range.limits.push(Limit { base: Affine::zero(), bound: v });
                    }
                }
            }
        }
        Some(range)
    };
    let tmaps = backprop(g, &ops, seeds, &reduced)?;
    let mut top = ItGraph {
        kind: LoopKind::Parallel,
        loops,
        nodes: ops.iter().map(|&id| ItNode::Op(id)).collect(),
        tmaps,
        accumulates: Vec::new(),
    };
    wrap_reductions(g, cfg, &mut top, &mut iters)?;
    Ok(top)
}

/// Derives tile maps for `ops` (a level's nodes, in order) from the seeds, walking backwards.
/// `reduced` gives the range of a reduction's reduced axis at this level.
fn backprop(
    g: &Graph,
    ops: &[NodeId],
    seeds: BTreeMap<NodeId, TMap>,
    reduced: &dyn Fn(NodeId) -> Option<AxisRange>,
) -> Result<BTreeMap<NodeId, TMap>, ScheduleError> {
    let in_level: BTreeSet<NodeId> = ops.iter().copied().collect();
    let mut tmaps = seeds;
    for &id in ops.iter().rev() {
        let Some(tm) = tmaps.get(&id).cloned() else {
            // Nothing at this level consumes the node: it belongs elsewhere.
            return Err(ScheduleError::NoConsumerAtLevel(id));
        };
        let red = reduced(id);
        let operands = operand_tmaps(g, id, &tm, red.as_ref())?;
        for (arg, want) in g.node(id).args.iter().zip(operands) {
            if !in_level.contains(arg) {
                continue;
            }
            match tmaps.get(arg) {
                Some(have) if *have != want => return Err(ScheduleError::Conflict(*arg)),
                Some(_) => {}
                None => {
                    tmaps.insert(*arg, want);
                }
            }
        }
    }
    Ok(tmaps)
}

/// The reduced dim of a reduction and its configured tile.
fn reduction_tile(g: &Graph, cfg: &TileConfig, id: NodeId) -> Option<(Dim, u64)> {
    let a = reduced_axis(g, id, 0)?;
    let d = g.shape(g.node(id).args[0])[a];
    let full = match d {
        Dim::One => 1,
        Dim::Var(v) => g.dims.get(v).value,
    };
    Some((d, cfg.red.get(&id).copied().unwrap_or(full)))
}

/// True when the reduction must run as a loop: its tile is not the axis' extent, or the axis is
/// dynamic.
fn is_iterative(g: &Graph, cfg: &TileConfig, id: NodeId) -> Result<bool, ScheduleError> {
    let Some((d, tile)) = reduction_tile(g, cfg, id) else { return Ok(false) };
    match d {
        Dim::One => Ok(false),
        Dim::Var(v) => {
            let info = g.dims.get(v);
            if info.dynamic && tile >= info.value && !cfg.red.contains_key(&id) {
                return Err(ScheduleError::UntiledDynamicAxis { dim: info.name.clone() });
            }
            // A tile past a static axis' end (a contraction rounded up to the MMA depth) is a
            // loop of one trip, predicated like a dynamic axis' last tile.
            Ok(info.dynamic || tile != info.value)
        }
    }
}

/// The intra-block pass at one level: wraps each group of last-wave iterative reductions, with
/// their producers, in a sequential loop, and recurses into the new loops.
fn wrap_reductions(g: &Graph, cfg: &TileConfig, level: &mut ItGraph, iters: &mut Iters) -> Result<(), ScheduleError> {
    loop {
        let ops: Vec<NodeId> = level.ops().collect();
        let op_set: BTreeSet<NodeId> = ops.iter().copied().collect();
        let mut iterative = Vec::new();
        for &id in &ops {
            if !level.accumulates.contains(&id) && is_iterative(g, cfg, id)? {
                iterative.push(id);
            }
        }
        if iterative.is_empty() {
            return Ok(());
        }
        let users = g.users();
        let descendants = |id: NodeId| -> BTreeSet<NodeId> {
            let mut seen = BTreeSet::new();
            let mut stack = vec![id];
            while let Some(x) = stack.pop() {
                for &u in &users[x.index()] {
                    if op_set.contains(&u) && seen.insert(u) {
                        stack.push(u);
                    }
                }
            }
            seen
        };
        let ancestors = |id: NodeId| -> BTreeSet<NodeId> {
            let mut seen = BTreeSet::new();
            let mut stack = vec![id];
            while let Some(x) = stack.pop() {
                for &a in &g.node(x).args {
                    if op_set.contains(&a) && seen.insert(a) {
                        stack.push(a);
                    }
                }
            }
            seen
        };
        let last_wave: Vec<NodeId> =
            iterative.iter().copied().filter(|&r| descendants(r).iter().all(|d| !iterative.contains(d))).collect();

        // Horizontal fusion: reductions sharing any producer form one group (paper §5.3). We
        // also fuse reductions of the same axis and tile that feed a common consumer: they can
        // share the loop, and the consumer then sees values on one common scale (the partial
        // sums of a Split-K combine).
        struct Group {
            members: Vec<NodeId>,
            producers: BTreeSet<NodeId>,
            consumers: BTreeSet<NodeId>,
        }
        let mut groups: Vec<Group> = Vec::new();
        for &r in &last_wave {
            let producers = ancestors(r);
            let consumers = descendants(r);
            let key = reduction_tile(g, cfg, r);
            let mut merged = Group { members: vec![r], producers, consumers };
            let mut i = 0;
            while i < groups.len() {
                let gr = &groups[i];
                let joins = !gr.producers.is_disjoint(&merged.producers)
                    || (!gr.consumers.is_disjoint(&merged.consumers) && reduction_tile(g, cfg, gr.members[0]) == key);
                if joins {
                    let other = groups.remove(i);
                    merged.members.extend(other.members);
                    merged.producers.extend(other.producers);
                    merged.consumers.extend(other.consumers);
                } else {
                    i += 1;
                }
            }
            merged.members.sort();
            groups.push(merged);
        }
        let mut groups: Vec<Vec<NodeId>> = groups.into_iter().map(|gr| gr.members).collect();
        groups.sort();

        let mut new_nodes = level.nodes.clone();
        for group in groups {
            let (d0, t0) = reduction_tile(g, cfg, group[0]).expect("reductions have a reduced axis");
            for &r in &group[1..] {
                if reduction_tile(g, cfg, r) != Some((d0, t0)) {
                    return Err(ScheduleError::GroupMismatch(group[0], r));
                }
            }
            let Dim::Var(dvar) = d0 else { unreachable!("iterative reductions reduce a variable") };
            let mut inside: BTreeSet<NodeId> = group.iter().copied().collect();
            for &r in &group {
                inside.extend(ancestors(r));
            }
            // Producers must be consumed only inside the loop, or they would have to be
            // materialized whole for their other users. Leaves and views of leaves (a split or a
            // transpose of an input is only addressing) are loaded again at each level instead.
            let mut keep_outside = BTreeSet::new();
            for &u in &inside {
                if group.contains(&u) {
                    continue;
                }
                let outside_users = users[u.index()].iter().any(|x| op_set.contains(x) && !inside.contains(x));
                if outside_users {
                    if is_leaf_view(g, u) {
                        // The view and the chain down to its leaf.
                        let mut x = u;
                        while keep_outside.insert(x) && !g.node(x).op.is_leaf() {
                            x = g.node(x).args[0];
                        }
                    } else {
                        return Err(ScheduleError::SharedUpstream(u));
                    }
                }
            }
            let iter = iters.fresh();
            let tile = t0;
            let inner_ops: Vec<NodeId> = ops.iter().copied().filter(|x| inside.contains(x)).collect();
            let seeds: BTreeMap<NodeId, TMap> = group.iter().map(|&r| (r, level.tmaps[&r].clone())).collect();
            let outer_tmaps = level.tmaps.clone();
            let reduced = |node: NodeId| -> Option<AxisRange> {
                let a = reduced_axis(g, node, 0)?;
                let arg = g.node(node).args[0];
                let outer = outer_tmaps.get(&arg)?.axes[a].clone();
                if group.contains(&node) {
                    let at = Affine::iter(iter, tile);
                    let mut r = outer.sub(&at, tile);
                    // The last tile of a static axis its tile does not divide runs past the
                    // end: the loads stop there, and the reduction must too.
                    if g.dims.get(dvar).value % tile != 0 && !r.limits.iter().any(|l| l.bound == dvar) {
                        r.limits.push(Limit { base: at, bound: dvar });
                    }
                    Some(r)
                } else {
                    Some(outer)
                }
            };
            let tmaps = backprop(g, &inner_ops, seeds, &reduced)?;
            let mut inner = ItGraph {
                kind: LoopKind::Sequential,
                loops: vec![LoopAxis { iter, dim: dvar, tile }],
                nodes: inner_ops.iter().map(|&id| ItNode::Op(id)).collect(),
                tmaps,
                accumulates: group.clone(),
            };
            wrap_reductions(g, cfg, &mut inner, iters)?;
            // Replace the wrapped nodes by the loop, at the place of the last of them.
            let last_pos = new_nodes
                .iter()
                .rposition(|n| matches!(n, ItNode::Op(id) if inside.contains(id)))
                .expect("the group is at this level");
            new_nodes[last_pos] = ItNode::Inner(Box::new(inner));
            new_nodes.retain(|n| !matches!(n, ItNode::Op(id) if inside.contains(id) && !keep_outside.contains(id)));
            for id in &inside {
                if !keep_outside.contains(id) && !group.contains(id) {
                    level.tmaps.remove(id);
                }
            }
        }
        level.nodes = new_nodes;
    }
}

/// Whether `id` is an output that is the transpose of a value the kernel computes: the block
/// holds that value (it is the primary output's stand-in, see
/// [`primary_output`](super::config::primary_output)), and the store transposes it.
pub fn transposed_output(g: &Graph, id: NodeId) -> bool {
    let n = g.node(id);
    n.op == Op::Transpose && g.outputs.iter().any(|o| o.node == id) && !is_leaf_view(g, n.args[0])
}

/// True for a leaf, or a split or transpose of one: nodes that are only addressing into a
/// buffer, so every loop level can load its own tile of them.
fn is_leaf_view(g: &Graph, id: NodeId) -> bool {
    let n = g.node(id);
    match n.op {
        Op::Split(_) | Op::Transpose => is_leaf_view(g, n.args[0]),
        ref op => op.is_leaf(),
    }
}
