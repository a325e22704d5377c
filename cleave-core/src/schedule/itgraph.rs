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

use crate::graph::{DimTable, DimVar, Graph, NodeId};

/// A loop iterator (block index component or sequential loop counter).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct IterId(pub u32);

/// One term of an offset: `coeff · iter`, times the runtime extent of `scale` when present.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Term {
    /// The iterator.
    pub iter: IterId,
    /// Constant factor (a tile size).
    pub coeff: u64,
    /// A dim whose runtime extent multiplies the term (a split chunk length).
    pub scale: Option<DimVar>,
}

/// An element offset along one axis: `Σ terms + konst`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct Affine {
    /// Iterator terms, sorted.
    pub terms: Vec<Term>,
    /// Constant part.
    pub konst: u64,
}

impl Affine {
    /// The constant 0.
    pub fn zero() -> Affine {
        Affine::default()
    }

    /// `coeff · iter`.
    pub fn iter(iter: IterId, coeff: u64) -> Affine {
        Affine { terms: vec![Term { iter, coeff, scale: None }], konst: 0 }
    }

    /// The sum of two offsets.
    pub fn add(&self, other: &Affine) -> Affine {
        let mut terms = self.terms.clone();
        for t in &other.terms {
            match terms.iter_mut().find(|u| u.iter == t.iter && u.scale == t.scale) {
                Some(u) => u.coeff += t.coeff,
                None => terms.push(*t),
            }
        }
        terms.retain(|t| t.coeff != 0);
        terms.sort();
        Affine { terms, konst: self.konst + other.konst }
    }

    /// This offset with every term multiplied by the runtime extent of `dim`. Only offsets made
    /// of unscaled iterator terms can be scaled (a split part index times the chunk length).
    pub fn scaled_by(&self, dim: DimVar) -> Option<Affine> {
        if self.konst != 0 || self.terms.iter().any(|t| t.scale.is_some()) {
            return None;
        }
        let terms = self.terms.iter().map(|t| Term { scale: Some(dim), ..*t }).collect();
        Some(Affine { terms, konst: 0 })
    }

    /// True when no iterator appears.
    pub fn is_const(&self) -> bool {
        self.terms.is_empty()
    }

    /// True when `iter` appears.
    pub fn uses(&self, iter: IterId) -> bool {
        self.terms.iter().any(|t| t.iter == iter)
    }

    /// Evaluates with iterator values and dim extents.
    pub fn eval(&self, iters: &dyn Fn(IterId) -> u64, dims: &dyn Fn(DimVar) -> u64) -> u64 {
        self.terms.iter().map(|t| t.coeff * iters(t.iter) * t.scale.map_or(1, dims)).sum::<u64>() + self.konst
    }

    /// Renders with iterator names `i0, j1..` and dim names.
    pub fn show(&self, names: &IterNames, dims: &DimTable) -> String {
        let mut parts: Vec<String> = self
            .terms
            .iter()
            .map(|t| {
                let mut s = names.name(t.iter);
                if t.coeff != 1 {
                    s = format!("{s}*{}", t.coeff);
                }
                if let Some(d) = t.scale {
                    s = format!("{s}*{}", dims.get(d).name);
                }
                s
            })
            .collect();
        if self.konst != 0 || parts.is_empty() {
            parts.push(self.konst.to_string());
        }
        parts.join(" + ")
    }
}

/// A bound an index must respect: `base + local < extent(bound)`, where `local` counts from the
/// start of the tile. Tiles past the end of a dynamic or non-divisible axis are predicated by
/// these.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Limit {
    /// Offset of the tile start in the bound's coordinates.
    pub base: Affine,
    /// The dim whose extent bounds the index.
    pub bound: DimVar,
}

/// The slice of one axis a tile covers.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct AxisRange {
    /// Start offset.
    pub offset: Affine,
    /// Tile extent (elements).
    pub extent: u64,
    /// Validity bounds of the elements (empty: always valid).
    pub limits: Vec<Limit>,
}

impl AxisRange {
    /// `[0, 1)`, the range of a broadcast axis.
    pub fn unit() -> AxisRange {
        AxisRange { offset: Affine::zero(), extent: 1, limits: Vec::new() }
    }

    /// The sub-range `[offset + at, offset + at + extent)` of this range, keeping its limits.
    pub fn sub(&self, at: &Affine, extent: u64) -> AxisRange {
        AxisRange {
            offset: self.offset.add(at),
            extent,
            limits: self.limits.iter().map(|l| Limit { base: l.base.add(at), bound: l.bound }).collect(),
        }
    }
}

/// The tile map of one tensor at one level: a range per axis.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct TMap {
    /// One range per axis.
    pub axes: Vec<AxisRange>,
}

impl TMap {
    /// Tile extents.
    pub fn shape(&self) -> Vec<u64> {
        self.axes.iter().map(|a| a.extent).collect()
    }

    /// Number of elements of the tile.
    pub fn elements(&self) -> u64 {
        self.axes.iter().map(|a| a.extent).product()
    }

    /// True when some offset uses `iter`.
    pub fn uses(&self, iter: IterId) -> bool {
        self.axes.iter().any(|a| a.offset.uses(iter) || a.limits.iter().any(|l| l.base.uses(iter)))
    }
}

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

/// Names iterators for printing: grid axes `i0, i1, ..`, loops `j0, j1, ..`.
#[derive(Clone, Debug, Default)]
pub struct IterNames {
    names: BTreeMap<IterId, String>,
}

impl IterNames {
    /// Collects names from a graph's loop axes.
    pub fn of(g: &ItGraph) -> IterNames {
        let mut n = IterNames::default();
        let (mut i, mut j) = (0, 0);
        collect(g, &mut n, &mut i, &mut j);
        n
    }

    /// The name of an iterator.
    pub fn name(&self, it: IterId) -> String {
        self.names.get(&it).cloned().unwrap_or_else(|| format!("it{}", it.0))
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
        n.names.insert(l.iter, name);
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
        let names = IterNames::of(self.it);
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
