//! The grouping pass: union-find over `(node, axis)` positions by the rules of Table 2.

use crate::graph::{Dim, Graph, Op};

/// Union-find with path halving.
struct UnionFind {
    parent: Vec<usize>,
}

impl UnionFind {
    fn find(&mut self, mut x: usize) -> usize {
        while self.parent[x] != x {
            self.parent[x] = self.parent[self.parent[x]];
            x = self.parent[x];
        }
        x
    }

    fn union(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            // The smaller root wins, so representatives are the earliest positions.
            let (lo, hi) = if ra < rb { (ra, rb) } else { (rb, ra) };
            self.parent[hi] = lo;
        }
    }
}

/// The groups of non-unit axes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AxisGroups {
    /// Each group's `(node index, axis)` members, groups ordered by their first member.
    pub members: Vec<Vec<(usize, usize)>>,
    /// Per node, per axis: the group index, or `usize::MAX` for unit axes.
    index: Vec<Vec<usize>>,
}

impl AxisGroups {
    /// The group of an axis (panics on unit axes).
    pub fn group_of(&self, node: usize, axis: usize) -> usize {
        let g = self.index[node][axis];
        assert_ne!(g, usize::MAX, "unit axes have no group");
        g
    }
}

/// Groups the axes of a graph.
pub fn group_axes(g: &Graph) -> AxisGroups {
    let mut base = Vec::with_capacity(g.nodes.len());
    let mut total = 0;
    for n in &g.nodes {
        base.push(total);
        total += n.shape.len();
    }
    let pos = |node: usize, axis: usize| base[node] + axis;
    let mut uf = UnionFind { parent: (0..total).collect() };
    let unit = |node: usize, axis: usize| g.nodes[node].shape[axis] == Dim::One;
    // Links axis `xa` of node `x` with axis `ya` of node `y` unless either is a unit axis.
    let mut link = |x: usize, xa: usize, y: usize, ya: usize| {
        if !unit(x, xa) && !unit(y, ya) {
            uf.union(pos(x, xa), pos(y, ya));
        }
    };
    for (ni, node) in g.nodes.iter().enumerate() {
        let rank = node.shape.len();
        let args: Vec<usize> = node.args.iter().map(|a| a.index()).collect();
        match node.op {
            Op::Input(_) | Op::Const(_) => {}
            Op::Unary(_) | Op::Mask(_) => (0..rank).for_each(|j| link(args[0], j, ni, j)),
            Op::Binary(_) => {
                for &a in &args {
                    let ar = g.nodes[a].shape.len();
                    for j in 0..ar {
                        link(a, j, ni, j + rank - ar);
                    }
                }
            }
            Op::Transpose => {
                for j in 0..rank {
                    let src = if j == rank - 1 {
                        rank - 2
                    } else if j == rank - 2 {
                        rank - 1
                    } else {
                        j
                    };
                    link(args[0], src, ni, j);
                }
            }
            Op::MatMul => {
                let (a, b) = (args[0], args[1]);
                let (ra, rb) = (g.nodes[a].shape.len(), g.nodes[b].shape.len());
                link(a, ra - 1, b, rb - 2);
                link(a, ra - 2, ni, rank - 2);
                link(b, rb - 1, ni, rank - 1);
                for j in 0..ra - 2 {
                    link(a, j, ni, j + rank - ra);
                }
                for j in 0..rb - 2 {
                    link(b, j, ni, j + rank - rb);
                }
            }
            Op::Reduce(_, axis) => {
                for j in (0..rank).filter(|&j| j != axis as usize) {
                    link(args[0], j, ni, j);
                }
            }
            Op::Split(axis) => {
                // Only the untouched axes keep their group; count and chunk are new.
                for j in (0..rank - 1).filter(|&j| j != axis as usize) {
                    link(args[0], j, ni, j + 1);
                }
            }
        }
    }
    let mut index = Vec::with_capacity(g.nodes.len());
    let mut root_to_group: Vec<usize> = vec![usize::MAX; total];
    let mut members: Vec<Vec<(usize, usize)>> = Vec::new();
    for (ni, node) in g.nodes.iter().enumerate() {
        let mut row = Vec::with_capacity(node.shape.len());
        for (a, d) in node.shape.iter().enumerate() {
            if *d == Dim::One {
                row.push(usize::MAX);
                continue;
            }
            let r = uf.find(pos(ni, a));
            if root_to_group[r] == usize::MAX {
                root_to_group[r] = members.len();
                members.push(Vec::new());
            }
            let gi = root_to_group[r];
            members[gi].push((ni, a));
            row.push(gi);
        }
        index.push(row);
    }
    AxisGroups { members, index }
}
