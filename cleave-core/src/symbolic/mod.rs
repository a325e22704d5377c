//! Symbolization (paper §4 and App. A, Table 2): a concrete graph becomes a graph over symbols.
//!
//! The grouping pass unions the axes that the ops force to be equal; each group becomes one
//! symbol, and axes of extent 1 stay the broadcast unit. The symbolic graph is the same graph
//! with every axis renamed to its symbol, so it is valid for *any* positive values of the
//! symbols: that is what lets the superoptimizer test equivalence on tiny instances.
//!
//! Two axes that carry the same declared dim but that no op links get different symbols
//! (attention's `d` of `q`/`k` and `d` of `v`/`o`); recovery maps both back to `d`.

mod group;
mod reduced;

pub use group::{group_axes, AxisGroups};
pub use reduced::{eventually_reduced, ReducedAxes};

use crate::graph::{validate, Bindings, Dim, DimInfo, DimKind, DimTable, DimVar, Graph, Input, Node, ValidGraph};
use crate::reference::Rng;

/// The result of symbolization.
#[derive(Clone, Debug)]
pub struct Symbolized {
    /// The graph over symbols.
    pub graph: ValidGraph,
    /// For each symbol (by [`DimVar::index`] of `graph.dims`), the declared dim of the concrete
    /// graph it stands for.
    pub origin: Vec<DimVar>,
    /// For each symbol, whether it is eventually reduced (may be reduced or split).
    pub reduced: Vec<bool>,
    /// The axis groups, for `explain`.
    pub groups: AxisGroups,
}

/// Symbolizes a concrete graph.
pub fn symbolize(concrete: &ValidGraph) -> Symbolized {
    let groups = group_axes(concrete);
    let reduced_axes = eventually_reduced(concrete);
    let mut table = DimTable::new();
    let mut origin = Vec::new();
    let mut reduced = Vec::new();
    // Symbols are numbered in order of first appearance so the naming is deterministic.
    let mut name_uses: Vec<(String, usize)> = Vec::new();
    for (gi, members) in groups.members.iter().enumerate() {
        let (n0, a0) = members[0];
        let Dim::Var(var) = concrete.nodes[n0].shape[a0] else { unreachable!("groups hold only non-unit axes") };
        let info = concrete.dims.get(var);
        let uses = match name_uses.iter_mut().find(|(n, _)| *n == info.name) {
            Some((_, k)) => {
                *k += 1;
                *k
            }
            None => {
                name_uses.push((info.name.clone(), 0));
                0
            }
        };
        let name = format!("{}{}", info.name, "'".repeat(uses));
        let sym = table.push(DimInfo {
            name,
            value: info.value,
            dynamic: info.dynamic,
            kind: DimKind::Plain,
            per_request: None,
        });
        debug_assert_eq!(sym.index(), gi);
        origin.push(var);
        let is_reduced = members.iter().any(|&(n, a)| {
            concrete
                .input_index(crate::graph::NodeId(n as u32))
                .is_some_and(|i| reduced_axes.per_input[i].get(a).copied().unwrap_or(false))
        });
        reduced.push(is_reduced);
    }
    let mut g = Graph::new(concrete.name.clone(), table);
    g.nodes = concrete
        .nodes
        .iter()
        .enumerate()
        .map(|(ni, n)| Node {
            op: n.op,
            args: n.args.clone(),
            shape: n
                .shape
                .iter()
                .enumerate()
                .map(|(a, d)| match d {
                    Dim::One => Dim::One,
                    Dim::Var(_) => Dim::Var(DimVar(groups.group_of(ni, a) as u32)),
                })
                .collect(),
        })
        .collect();
    g.inputs = concrete
        .inputs
        .iter()
        .map(|i| {
            let mut decl = i.decl.clone();
            decl.shape = g.nodes[i.node.index()].shape.clone();
            Input { decl, node: i.node, reduce_override: None }
        })
        .collect();
    g.outputs = concrete
        .outputs
        .iter()
        .map(|o| {
            let mut out = o.clone();
            out.decl.shape = g.nodes[o.node.index()].shape.clone();
            out
        })
        .collect();
    let graph = validate(g).expect("symbolization preserves validity: grouping follows the shape rules");
    Symbolized { graph, origin, reduced, groups }
}

/// Draws a small instantiation of a symbolic table: every plain symbol gets a distinct value
/// in `[2, 2 + pool)`, chosen so no two symbols coincide (so a graph that confuses two axes
/// fails the shape check), and every split `(K, s)` gets `s ≥ 2` and a chunk `c ≥ 2` with
/// `K = s · c`.
pub fn small_bindings(table: &DimTable, rng: &mut Rng) -> Bindings {
    let n = table.len();
    let mut values = vec![0u64; n];
    // Values already used by some symbol; the pool holds non-powers of two on purpose.
    let mut used: Vec<u64> = Vec::new();
    let pick = |rng: &mut Rng, used: &mut Vec<u64>, lo: u64| -> u64 {
        loop {
            // The pool grows past 7 values only when more than 3 are taken, so a table with
            // many symbols cannot run out of distinct values.
            let v = lo + rng.below(7.max(used.len() as u64 + 4));
            if !used.contains(&v) {
                used.push(v);
                return v;
            }
        }
    };
    let split_of = |v: DimVar| {
        table.iter().find_map(|(c, d)| match d.kind {
            DimKind::SplitCount { of } if of == v => Some(c),
            _ => None,
        })
    };
    for (v, d) in table.iter() {
        if d.kind == DimKind::Plain && split_of(v).is_none() {
            values[v.index()] = pick(rng, &mut used, 2);
        }
    }
    for (v, d) in table.iter() {
        if let DimKind::SplitCount { of } = d.kind {
            let s = 2 + rng.below(3);
            let c = pick(rng, &mut used, 2);
            values[v.index()] = s;
            values[of.index()] = s * c;
        }
    }
    for (v, d) in table.iter() {
        if let DimKind::SplitChunk { of, count } = d.kind {
            values[v.index()] = values[of.index()] / values[count.index()];
        }
    }
    Bindings { values }
}
