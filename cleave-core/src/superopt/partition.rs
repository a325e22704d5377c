//! The split/combine partition of a Split graph (paper Fig. 5b).
//!
//! The combine kernel starts at the reductions over a split-count axis (`sum(.., axis=0)` of
//! a `[s_K, ..]` tensor, in the usual case) and holds everything downstream of them; the split
//! kernel holds every other op. Tensors of the split kernel read by the combine kernel are the
//! workspace: what the split kernel writes to global memory and the combine kernel reads.

use crate::graph::{Dim, DimKind, Graph, NodeId, Op};

/// Which kernel computes a node.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Part {
    /// An input or constant: read by whichever kernel uses it.
    Leaf,
    /// Computed by the split kernel (one launch, parallel over the split count).
    Split,
    /// Computed by the combine kernel.
    Combine,
}

/// The partition of one Split graph.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Partition {
    /// Per node (by [`NodeId::index`]): its kernel.
    pub part: Vec<Part>,
    /// The reductions over a split-count axis, where the combine kernel begins.
    pub combine_roots: Vec<NodeId>,
    /// Split-kernel tensors read by the combine kernel, in node order.
    pub workspace: Vec<NodeId>,
}

impl Partition {
    /// The nodes of one kernel, in topological order.
    pub fn nodes(&self, part: Part) -> Vec<NodeId> {
        (0..self.part.len()).filter(|&i| self.part[i] == part).map(|i| NodeId(i as u32)).collect()
    }
}

/// True when `node` reduces an axis that is a split count.
pub fn is_combine(g: &Graph, node: NodeId) -> bool {
    let n = g.node(node);
    match n.op {
        Op::Reduce(_, axis) => match g.shape(n.args[0]).get(axis as usize) {
            Some(Dim::Var(v)) => matches!(g.dims.get(*v).kind, DimKind::SplitCount { .. }),
            _ => false,
        },
        _ => false,
    }
}

/// Partitions a graph; `None` when it has no split.
pub fn partition(g: &Graph) -> Option<Partition> {
    if !g.has_split() {
        return None;
    }
    let mut part = vec![Part::Split; g.nodes.len()];
    let mut combine_roots = Vec::new();
    for id in g.ids() {
        let node = g.node(id);
        if node.op.is_leaf() {
            part[id.index()] = Part::Leaf;
        } else if is_combine(g, id) {
            part[id.index()] = Part::Combine;
            combine_roots.push(id);
        } else if node.args.iter().any(|a| part[a.index()] == Part::Combine) {
            part[id.index()] = Part::Combine;
        }
    }
    let mut workspace = Vec::new();
    for id in g.ids() {
        if part[id.index()] != Part::Split {
            continue;
        }
        let read_by_combine = g.ids().any(|u| part[u.index()] == Part::Combine && g.node(u).args.contains(&id));
        if read_by_combine {
            workspace.push(id);
        }
    }
    Some(Partition { part, combine_roots, workspace })
}
