//! The iterative tile graph (paper §5.2).
//!
//! An [`ItGraph`] is one loop level: its loop axes (the parallel grid at the top, one
//! sequential reduction loop below), the nodes executed each iteration (graph ops, or inner
//! `ItGraph`s standing for nested loops), and a [`TMap`] per node giving the slice of the full
//! tensor that one iteration touches: per axis a symbolic offset in the loop iterators and a
//! tile extent. Inner levels accumulate into the same output tiles every iteration; the top
//! level writes a different output tile per block.

use std::collections::BTreeMap;
use std::fmt::{self, Write};

use crate::graph::{DimVar, Graph, NodeId};
use crate::index::{IterId, IterNames, TMap};

/// Whether iterations run on different blocks or one after another in a block.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LoopKind {
    /// Across thread blocks (the grid).
    Parallel,
    /// Inside a block, accumulating.
    Sequential,
}

/// One loop axis: `iter` runs over `ceil(extent(dim) / tile)` iterations.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LoopAxis {
    /// The iterator.
    pub iter: IterId,
    /// The dim it walks.
    pub dim: DimVar,
    /// Elements per iteration.
    pub tile: u64,
}

/// A node of a level: a graph op or a nested loop.
#[derive(Clone, PartialEq, Debug)]
pub enum ItNode {
    /// A graph node (inputs and constants included).
    Op(NodeId),
    /// A nested sequential loop.
    Inner(Box<ItGraph>),
}

/// One loop level.
#[derive(Clone, PartialEq, Debug)]
pub struct ItGraph {
    /// Parallel (top) or sequential (inner).
    pub kind: LoopKind,
    /// The level's loop axes: several for the grid, one for an inner loop.
    pub loops: Vec<LoopAxis>,
    /// Nodes in execution order.
    pub nodes: Vec<ItNode>,
    /// The tile of every graph node at this level.
    pub tmaps: BTreeMap<NodeId, TMap>,
    /// For inner levels: the reductions accumulated across the loop (its results).
    pub accumulates: Vec<NodeId>,
}

impl ItGraph {
    /// The graph ops directly at this level.
    pub fn ops(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes.iter().filter_map(|n| match n {
            ItNode::Op(id) => Some(*id),
            ItNode::Inner(_) => None,
        })
    }

    /// The nested loops directly at this level.
    pub fn inners(&self) -> impl Iterator<Item = &ItGraph> + '_ {
        self.nodes.iter().filter_map(|n| match n {
            ItNode::Inner(g) => Some(g.as_ref()),
            ItNode::Op(_) => None,
        })
    }

    /// Depth of loop nesting below this level.
    pub fn depth(&self) -> usize {
        self.inners().map(|g| 1 + g.depth()).max().unwrap_or(0)
    }
}

impl ItGraph {
    /// Names this level's iterators and those of every loop below it, in loop order.
    pub fn iter_names(&self) -> IterNames {
        let mut n = IterNames::default();
        let (mut i, mut j) = (0, 0);
        collect(self, &mut n, &mut i, &mut j);
        n
    }
}

fn collect(g: &ItGraph, n: &mut IterNames, i: &mut u32, j: &mut u32) {
    for l in &g.loops {
        let name = match g.kind {
            LoopKind::Parallel => {
                *i += 1;
                format!("i{}", *i - 1)
            }
            LoopKind::Sequential => {
                *j += 1;
                format!("j{}", *j - 1)
            }
        };
        n.insert(l.iter, name);
    }
    for inner in g.inners() {
        collect(inner, n, i, j);
    }
}

/// Renders an itGraph: each level with its loops, and each node with its tmap.
pub struct Show<'a> {
    /// The level.
    pub it: &'a ItGraph,
    /// The graph it schedules.
    pub graph: &'a Graph,
}

impl fmt::Display for Show<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.it.iter_names();
        let mut out = String::new();
        show_level(self.it, self.graph, &names, 0, &mut out);
        f.write_str(&out)
    }
}

fn show_level(it: &ItGraph, g: &Graph, names: &IterNames, indent: usize, out: &mut String) {
    let pad = "  ".repeat(indent);
    let loops: Vec<String> = it
        .loops
        .iter()
        .map(|l| format!("{} < ceil({}/{})", names.name(l.iter), g.dims.get(l.dim).name, l.tile))
        .collect();
    let kind = match it.kind {
        LoopKind::Parallel => "parallel",
        LoopKind::Sequential => "sequential",
    };
    let _ = writeln!(out, "{pad}{kind} [{}]", loops.join(", "));
    for node in &it.nodes {
        match node {
            ItNode::Op(id) => {
                let tm = &it.tmaps[id];
                let ranges: Vec<String> =
                    tm.axes.iter().map(|a| format!("{}:+{}", a.offset.show(names, &g.dims), a.extent)).collect();
                let _ = writeln!(out, "{pad}  {} = {}  [{}]", g.label(*id), g.node(*id).op, ranges.join(", "));
            }
            ItNode::Inner(inner) => show_level(inner, g, names, indent + 1, out),
        }
    }
}
