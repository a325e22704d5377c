//! Shape recovery: a found symbolic graph becomes concrete graphs over the declared dims.
//!
//! The found graph's ops are replayed on the declared inputs, so every shape is propagated
//! from the inputs by the shape rules (each symbol stands for exactly one declared dim, so a
//! graph valid over symbols is valid over the dims they came from). A split creates the split
//! variables of the declared dim; each valid split count gives one concrete candidate:
//! - a static axis of extent `K`: the divisors `s` of `K` with `2 ≤ s ≤ max_split_count` and
//!   a chunk of at least 2;
//! - a dynamic axis: the fixed ladder (2, 4, 8, 16, 32), predicated — the chunk is
//!   `ceil(K/s)` at the representative size and dynamic, and the last chunk is ragged. A graph
//!   that averages over a split part (`mean` over `s_K` or `K/s_K`) would be wrong on a ragged
//!   split, so it gets no predicated candidates.

use crate::graph::{validate, DimKind, DimVar, Graph, NodeId, Op, ReduceOp, ValidGraph, ValidationError};

/// Why a found graph does not map back to the declared dims (a search bug if it ever happens:
/// every symbol stands for exactly one declared dim).
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum RecoverError {
    /// An op of the found graph has no valid shape over the declared dims.
    #[error("node %{node}: {message}")]
    Shape {
        /// The node of the found graph.
        node: u32,
        /// The shape rule's message.
        message: String,
    },
    /// The replay has a different number of nodes.
    #[error("the replay has {replayed} nodes, the found graph {found}")]
    NodeCount {
        /// Nodes of the found graph.
        found: usize,
        /// Nodes of the replay.
        replayed: usize,
    },
    /// An axis whose symbol does not stand for the declared dim it replays to.
    #[error("node %{node}: {found} does not map to {replayed}")]
    Origin {
        /// The node.
        node: usize,
        /// Its shape over the symbols.
        found: String,
        /// Its shape over the declared dims.
        replayed: String,
    },
    /// A concrete candidate that fails validation.
    #[error("{0}")]
    Invalid(#[from] ValidationError),
}

/// How split counts are enumerated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoverOptions {
    /// The largest split count for a static axis.
    pub max_split_count: u64,
    /// Split counts for a dynamic axis.
    pub ladder: Vec<u64>,
    /// Most concrete candidates per found graph (over all split variables together).
    pub max_candidates: usize,
}

impl Default for RecoverOptions {
    fn default() -> Self {
        RecoverOptions { max_split_count: 64, ladder: vec![2, 4, 8, 16, 32], max_candidates: 64 }
    }
}

/// The concrete value chosen for one split count.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SplitValue {
    /// The split-count variable in the candidate's dim table.
    pub count: DimVar,
    /// The declared dim it splits.
    pub of: DimVar,
    /// The count's name (`s_l`).
    pub name: String,
    /// The count.
    pub value: u64,
    /// True when the split axis is dynamic: chunks are `ceil(K/s)` and the last is ragged.
    pub predicated: bool,
}

impl SplitValue {
    /// `s_l=4`; for a split of a dim whose extent differs between requests or between launches
    /// (a dynamic axis), `s_l=run time`: the launcher counts the parts from its extents, and
    /// `value` only stood for them in the search.
    pub fn label(&self, dims: &crate::graph::DimTable) -> String {
        if dims.get(self.of).per_request.is_some() || self.predicated {
            format!("{}=run time", self.name)
        } else {
            format!("{}={}", self.name, self.value)
        }
    }
}

/// One concrete graph for the scheduler.
#[derive(Clone, Debug)]
pub struct ConcreteCandidate {
    /// The graph over the declared dims, split counts set in its dim table.
    pub graph: ValidGraph,
    /// The split counts of this candidate (empty without a split).
    pub splits: Vec<SplitValue>,
}

/// The concrete candidates of one found graph.
#[derive(Clone, Debug, Default)]
pub struct Recovered {
    /// Candidates, ordered by split counts.
    pub candidates: Vec<ConcreteCandidate>,
    /// Why some or all split values were left out, when they were.
    pub notes: Vec<String>,
}

/// Replays the found graph's ops on the concrete target's inputs: the concrete graph with
/// split counts still unset.
pub fn replay(concrete: &ValidGraph, found: &Graph) -> Result<Graph, RecoverError> {
    let mut g = Graph::new(concrete.name.clone(), concrete.dims.clone());
    let mut map: Vec<NodeId> = Vec::with_capacity(found.nodes.len());
    let input_nodes: Vec<NodeId> = concrete.inputs.iter().map(|i| g.add_input(i.decl.clone())).collect();
    for id in found.ids() {
        let node = found.node(id);
        let new = match node.op {
            Op::Input(k) => input_nodes[k as usize],
            Op::Const(c) => g.constant(c),
            op => {
                let args: Vec<NodeId> = node.args.iter().map(|a| map[a.index()]).collect();
                g.add(op, &args).map_err(|e| RecoverError::Shape { node: id.0, message: e.message(&g.dims) })?
            }
        };
        map.push(new);
    }
    for (o, fo) in concrete.outputs.iter().zip(&found.outputs) {
        g.add_output(o.decl.clone(), map[fo.node.index()]);
    }
    Ok(g)
}

/// True when some `mean` reduces a part of a split of `of`: such a graph is exact only for
/// splits into equal parts.
fn averages_split_part(g: &Graph, of: DimVar) -> bool {
    g.nodes.iter().any(|n| match n.op {
        Op::Reduce(ReduceOp::Mean, axis) => match g.shape(n.args[0])[axis as usize].var() {
            Some(v) => match g.dims.get(v).kind {
                DimKind::SplitCount { of: o } | DimKind::SplitChunk { of: o, .. } => o == of,
                DimKind::Plain => false,
            },
            None => false,
        },
        _ => false,
    })
}

/// Checks that every axis of the replayed graph is the declared dim its symbol came from
/// (`origin`, by symbol index), and every split variable splits the origin of the symbol the
/// found graph split.
fn check_origins(found: &Graph, replayed: &Graph, origin: &[DimVar]) -> Result<(), RecoverError> {
    // The replay adds no nodes of its own (constants are shared by value, as in the found
    // graph), so nodes correspond one to one.
    if found.nodes.len() != replayed.nodes.len() {
        return Err(RecoverError::NodeCount { found: found.nodes.len(), replayed: replayed.nodes.len() });
    }
    let declared = |d: DimVar| -> Option<DimVar> {
        match found.dims.get(d).kind {
            DimKind::Plain => origin.get(d.index()).copied(),
            _ => None,
        }
    };
    for (i, (a, b)) in found.nodes.iter().zip(&replayed.nodes).enumerate() {
        for (x, y) in a.shape.iter().zip(&b.shape) {
            let ok = match (x.var(), y.var()) {
                (None, None) => true,
                (Some(sx), Some(cy)) => match (found.dims.get(sx).kind.clone(), replayed.dims.get(cy).kind.clone()) {
                    (DimKind::Plain, DimKind::Plain) => declared(sx) == Some(cy),
                    (DimKind::SplitCount { of: so }, DimKind::SplitCount { of: co })
                    | (DimKind::SplitChunk { of: so, .. }, DimKind::SplitChunk { of: co, .. }) => {
                        declared(so) == Some(co)
                    }
                    _ => false,
                },
                _ => false,
            };
            if !ok || a.shape.len() != b.shape.len() {
                return Err(RecoverError::Origin {
                    node: i,
                    found: found.dims.show(&a.shape),
                    replayed: replayed.dims.show(&b.shape),
                });
            }
        }
    }
    Ok(())
}

/// The concrete candidates of a found symbolic graph; `origin` maps each symbol of the found
/// graph's table to the declared dim it stands for ([`Symbolized::origin`]).
///
/// [`Symbolized::origin`]: crate::symbolic::Symbolized::origin
pub fn recover(
    concrete: &ValidGraph,
    origin: &[DimVar],
    found: &Graph,
    opts: &RecoverOptions,
) -> Result<Recovered, RecoverError> {
    let base = replay(concrete, found)?;
    check_origins(found, &base, origin)?;
    let counts: Vec<(DimVar, DimVar)> = base
        .dims
        .iter()
        .filter_map(|(v, d)| match d.kind {
            DimKind::SplitCount { of } => Some((v, of)),
            _ => None,
        })
        .collect();
    let mut notes = Vec::new();
    // Per split variable: the values to try.
    let mut choices: Vec<Vec<(u64, bool)>> = Vec::new();
    for &(count, of) in &counts {
        let info = base.dims.get(of);
        let k = info.value;
        let values: Vec<(u64, bool)> = if info.dynamic {
            if averages_split_part(&base, of) {
                notes.push(format!(
                    "{}: dynamic axis `{}` is averaged per part, which a ragged split would get wrong",
                    base.dims.get(count).name,
                    info.name
                ));
                Vec::new()
            } else {
                opts.ladder.iter().filter(|&&s| s >= 2 && s <= opts.max_split_count).map(|&s| (s, true)).collect()
            }
        } else {
            (2..=opts.max_split_count.min(k / 2)).filter(|s| k % s == 0).map(|s| (s, false)).collect()
        };
        if values.is_empty() && !info.dynamic {
            notes.push(format!(
                "{}: `{}` = {k} has no divisor in [2, {}]",
                base.dims.get(count).name,
                info.name,
                opts.max_split_count
            ));
        }
        choices.push(values);
    }
    let mut candidates = Vec::new();
    let mut index = vec![0usize; choices.len()];
    let any_empty = choices.iter().any(|c| c.is_empty());
    while !any_empty && candidates.len() < opts.max_candidates {
        let mut g = base.clone();
        let mut splits = Vec::new();
        for (ci, &(count, of)) in counts.iter().enumerate() {
            let (s, predicated) = choices[ci][index[ci]];
            let k = g.dims.get(of).value;
            let dynamic = g.dims.get(of).dynamic;
            let c = g.dims.get_mut(count);
            c.value = s;
            c.dynamic = false;
            let name = c.name.clone();
            let chunk = g.dims.iter().find_map(|(v, d)| match d.kind {
                DimKind::SplitChunk { count: cc, .. } if cc == count => Some(v),
                _ => None,
            });
            if let Some(chunk) = chunk {
                let ch = g.dims.get_mut(chunk);
                ch.value = k.div_ceil(s);
                ch.dynamic = dynamic;
            }
            splits.push(SplitValue { count, of, name, value: s, predicated });
        }
        let graph = validate(g)?;
        candidates.push(ConcreteCandidate { graph, splits });
        // Next combination (odometer order, last variable fastest).
        let mut pos = choices.len();
        loop {
            if pos == 0 {
                return Ok(Recovered { candidates, notes });
            }
            pos -= 1;
            index[pos] += 1;
            if index[pos] < choices[pos].len() {
                break;
            }
            index[pos] = 0;
        }
    }
    if candidates.len() >= opts.max_candidates {
        notes.push(format!("stopped at {} concrete candidates", opts.max_candidates));
    }
    Ok(Recovered { candidates, notes })
}
