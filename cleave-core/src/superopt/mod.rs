//! The algebraic phase (paper §4, App. A): symbolic superoptimization with Split-K.
//!
//! ```text
//! concrete graph ─► symbolize ─► saturate target terms (egg) ─► enumerate graphs over symbols
//!     ─► fingerprints on small instantiations ─► checks at declared shapes and in f64
//!     ─► recover concrete graphs (+ split counts)
//! ```
//!
//! [`search`] runs the whole phase on one kernel. Each [`FoundGraph`] is an equivalent graph
//! over the symbols; its [`ConcreteCandidate`]s are what the scheduler consumes: graphs over
//! the declared dims, one per valid split count.

mod abstraction;
mod atoms;
pub mod enumerate;
pub mod field;
pub mod fingerprint;
mod recover;
mod report;
mod rules;
mod term;
mod verify;
mod vocab;

use std::time::{Duration, Instant};

use rayon::prelude::*;

pub use abstraction::{Abstraction, EGraphLimits, EGraphStats};
pub use atoms::{AtomMask, Atoms, MAX_ATOMS};
pub use enumerate::{Counters, Pruning, StopReason};
pub use recover::{recover, replay, ConcreteCandidate, RecoverError, RecoverOptions, Recovered, SplitValue};
pub use report::{explain_text, plain_phase_text, summary_text, to_json};
pub use term::{AtomSet, Leaf, Term};
pub use verify::{
    Check, FinalChecks, FLOAT_CHECK_MAX_ELEMS, FLOAT_TOLERANCE, FULL_SHAPE_BUDGET_MACS, FULL_SHAPE_MAX_ELEMS,
    FULL_SHAPE_MAX_MACS,
};
pub use vocab::Vocab;

use crate::graph::{validate, Dim, DimKind, Graph, NodeId, Op, ValidGraph};
use crate::symbolic::{symbolize, Symbolized};
use enumerate::{FoundOps, LeafSpec, Space};
use fingerprint::Verifier;

/// The largest graphs (in ops, leaves excluded) the enumeration builds.
pub const MAX_SEARCH_OPS: usize = 60;

/// The share of [`SearchOptions::time_limit`] that saturation and enumeration may use.
pub const ENUMERATION_SHARE: f64 = 0.9;

/// The share of [`SearchOptions::time_limit`] that a search with Split may use; the rest is
/// for the search without Split that follows it when it stops at a limit (see [`search`]).
pub const SPLIT_SHARE: f64 = 0.75;

/// Options of a search. The defaults are what `cleave search` uses.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchOptions {
    /// Allow `split` (Split-K).
    pub split: bool,
    /// Most ops per graph (leaves excluded); `None` for [`default_max_ops`].
    pub max_ops: Option<usize>,
    /// Most search states.
    pub max_states: u64,
    /// Wall-clock limit of the whole search. Saturation and enumeration stop at
    /// [`ENUMERATION_SHARE`] of it, which leaves the rest to the final checks (their work is
    /// bounded by the budgets below); with Split, of [`SPLIT_SHARE`] of it (see [`search`]).
    pub time_limit: Duration,
    /// Limits of the e-graph saturation.
    pub egraph: EGraphLimits,
    /// Small instantiations (independent fingerprint trials) per candidate; at least 2.
    pub trials: usize,
    /// Seed of every random choice.
    pub seed: u64,
    /// Pruning switches.
    pub pruning: Pruning,
    /// Run the checks at the declared shapes and in f64 on every found graph.
    pub final_checks: bool,
    /// The check at the declared shapes is skipped (with the reason) above this many elements
    /// over all nodes of target and candidate together.
    pub full_shape_max_elems: u64,
    /// … or above this many multiply-adds.
    pub full_shape_max_macs: u64,
    /// Multiply-adds for all declared-shape checks of a search; graphs past it (in canonical
    /// order) skip the check with that reason.
    pub full_shape_budget_macs: u64,
    /// How split counts are recovered.
    pub recover: RecoverOptions,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            split: true,
            max_ops: None,
            max_states: 10_000_000,
            time_limit: Duration::from_secs(60),
            egraph: EGraphLimits::default(),
            trials: 3,
            seed: 0x00c1_ea7e,
            pruning: Pruning::default(),
            final_checks: true,
            full_shape_max_elems: FULL_SHAPE_MAX_ELEMS,
            full_shape_max_macs: FULL_SHAPE_MAX_MACS,
            full_shape_budget_macs: FULL_SHAPE_BUDGET_MACS,
            recover: RecoverOptions::default(),
        }
    }
}

/// Why a search could not run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SearchError {
    /// The target uses something the search does not handle; `op` names it.
    #[error("`{op}` is not supported by the search: {reason}")]
    Unsupported {
        /// The op or construct.
        op: String,
        /// Why.
        reason: String,
    },
    /// The target is larger than the graphs the enumeration builds.
    #[error(
        "the kernel has {ops} ops, so graphs of up to {bound} ops would be searched, and the search builds at most \
         {MAX_SEARCH_OPS}; `schedule` and `emit` compile it as declared"
    )]
    TooLarge {
        /// Ops of the target (leaves excluded).
        ops: usize,
        /// The size bound the search would need.
        bound: usize,
    },
    /// Invalid options.
    #[error("invalid search options: {0}")]
    Options(String),
}

/// One equivalent graph.
#[derive(Clone, Debug)]
pub struct FoundGraph {
    /// The graph over the symbols (split counts are symbols too).
    pub graph: ValidGraph,
    /// The final checks.
    pub checks: FinalChecks,
    /// Concrete candidates for the scheduler.
    pub concrete: Vec<ConcreteCandidate>,
    /// Why some split values were left out.
    pub notes: Vec<String>,
}

impl FoundGraph {
    /// True when the graph contains a split.
    pub fn has_split(&self) -> bool {
        self.graph.has_split()
    }
}

/// The result of a search.
#[derive(Clone, Debug)]
pub struct SearchResult {
    /// The kernel name.
    pub kernel: String,
    /// The symbolic target.
    pub symbolic: Symbolized,
    /// The equivalent graphs, in canonical order (fewest ops first).
    pub graphs: Vec<FoundGraph>,
    /// Graphs that passed the fingerprints on small instantiations but failed a final check.
    pub rejected: Vec<(ValidGraph, FinalChecks)>,
    /// States explored.
    pub states_explored: u64,
    /// Why the enumeration stopped.
    pub stop_reason: StopReason,
    /// The size bound used.
    pub max_ops: usize,
    /// The saturation.
    pub egraph: EGraphStats,
    /// Pruning counters.
    pub counters: Counters,
    /// Wall-clock seconds of the whole phase.
    pub seconds: f64,
    /// Seconds per stage: saturation, enumeration, final checks and recovery.
    pub stage_seconds: [f64; 3],
    /// The search without Split that followed, when this one (with Split) stopped at a limit.
    pub without_split: Option<PlainPhase>,
    /// The size bound a search with Split would have needed, when it was above
    /// [`MAX_SEARCH_OPS`] and the space without Split was searched instead.
    pub split_refused: Option<usize>,
}

/// The search without Split that follows a search with Split stopped at a limit: the smaller
/// space, whose graphs the larger one holds but may not have reached.
#[derive(Clone, Debug, PartialEq)]
pub struct PlainPhase {
    /// Its graphs that the search with Split had not found.
    pub graphs_added: usize,
    /// States it explored.
    pub states_explored: u64,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// Its wall-clock seconds.
    pub seconds: f64,
}

impl SearchResult {
    /// Every concrete candidate of every found graph, in order: the scheduler's input.
    pub fn candidates(&self) -> impl Iterator<Item = &ConcreteCandidate> + '_ {
        self.graphs.iter().flat_map(|g| g.concrete.iter())
    }
}

/// The default size bound: the target's op count, plus (with Split on) room to split one
/// eventually-reduced symbol everywhere: one `split` per input that carries it and one
/// combine per reduction over it. For attention over the context axis that is 2 splits (K and
/// V) and 2 combines (the row sum and the second matmul).
pub fn default_max_ops(target: &Graph, reduced: &[bool], split: bool) -> usize {
    let ops = target.op_count();
    if !split {
        return ops;
    }
    let mut extra = 0;
    for (v, _) in target.dims.iter().filter(|(v, d)| d.kind == DimKind::Plain && reduced[v.index()]) {
        let dim = Dim::Var(v);
        let splits = target.inputs.iter().filter(|i| i.decl.shape.contains(&dim)).count();
        let combines = target
            .nodes
            .iter()
            .filter(|n| match n.op {
                Op::Reduce(_, axis) => target.shape(n.args[0])[axis as usize] == dim,
                Op::MatMul => {
                    let a = target.shape(n.args[0]);
                    a[a.len() - 1] == dim
                }
                _ => false,
            })
            .count();
        extra = extra.max(splits + combines);
    }
    // A vector moved across a product is transposed on the way (`Vocab::transpose_vectors`):
    // room for one such transpose per input vector.
    let transposes = if Vocab::of(target, split).transpose_vectors {
        target.nodes.iter().filter(|n| matches!(n.op, Op::Input(_)) && vocab::is_laid_out_vector(&n.shape)).count()
    } else {
        0
    };
    ops + extra + transposes
}

/// Checks that the search can handle the target.
fn check_target(target: &Graph) -> Result<(), SearchError> {
    let users = target.users();
    for node in &target.nodes {
        if let Op::Split(_) = node.op {
            return Err(SearchError::Unsupported {
                op: "split".into(),
                reason: "the target already contains a split; the search introduces splits itself".into(),
            });
        }
        if let Op::Const(c) = node.op {
            if !c.is_finite() {
                return Err(SearchError::Unsupported {
                    op: "constant".into(),
                    reason: format!("the constant {c} has no exact fingerprint"),
                });
            }
        }
        if node.shape.len() > enumerate::MAX_RANK {
            return Err(SearchError::Unsupported {
                op: node.op.name().into(),
                reason: format!(
                    "a tensor of rank {} (the search handles rank ≤ {})",
                    node.shape.len(),
                    enumerate::MAX_RANK
                ),
            });
        }
    }
    for o in &target.outputs {
        if !users[o.node.index()].is_empty() {
            return Err(SearchError::Unsupported {
                op: format!("output `{}`", o.decl.name),
                reason: "an output that other ops also read".into(),
            });
        }
        if matches!(target.node(o.node).op, Op::Input(_) | Op::Const(_)) {
            return Err(SearchError::Unsupported {
                op: format!("output `{}`", o.decl.name),
                reason: "an output that is an input or a constant (nothing to search)".into(),
            });
        }
    }
    Ok(())
}

/// Builds the symbolic graph of a found op list.
fn build(target: &ValidGraph, leaves: &[LeafSpec], f: &FoundOps) -> ValidGraph {
    let mut g = Graph::new(target.name.clone(), target.dims.clone());
    let mut ids: Vec<Option<NodeId>> = Vec::with_capacity(leaves.len() + f.ops.len());
    let used: Vec<bool> = (0..leaves.len()).map(|i| f.ops.iter().any(|(_, a)| a.contains(&(i as u16)))).collect();
    for (i, leaf) in leaves.iter().enumerate() {
        ids.push(match leaf.op {
            Op::Input(k) => Some(g.add_input(target.inputs[k as usize].decl.clone())),
            Op::Const(c) if used[i] => Some(g.constant(c)),
            _ => None,
        });
    }
    for (code, args) in &f.ops {
        let args: Vec<NodeId> = args.iter().map(|&a| ids[a as usize].expect("operands exist")).collect();
        let id = g.add(code.op(), &args).expect("the search only keeps well-shaped ops");
        ids.push(Some(id));
    }
    for (o, &t) in target.outputs.iter().zip(&f.outputs) {
        g.add_output(o.decl.clone(), ids[t as usize].expect("outputs exist"));
    }
    validate(g).expect("found graphs use every input and have the output shapes")
}

/// Runs the algebraic phase on a concrete kernel graph.
///
/// The space with Split holds every graph of the space without it, but a search of it that
/// stops at its state or time limit may not have reached them: it walks its graphs depth-first
/// up to a larger size bound, and a wide target (attention with its log-sum-exp as a second
/// output) fills the budget with partial graphs that split. Then the space without Split is
/// searched as well, under the same state limit, and the graphs it finds are added: a search
/// with Split never finds less than the same search without it, given the time. The two
/// together keep to the time limit: the first has [`SPLIT_SHARE`] of it, the second what is
/// left.
pub fn search(concrete: &ValidGraph, opts: &SearchOptions) -> Result<SearchResult, SearchError> {
    let start = Instant::now();
    if !opts.split {
        return search_space(concrete, opts);
    }
    let with_split =
        search_space(concrete, &SearchOptions { time_limit: opts.time_limit.mul_f64(SPLIT_SHARE), ..opts.clone() });
    let mut result = match with_split {
        // Split adds ops for its splits and combines; a kernel too large for those may still
        // be small enough to search without them, with the whole time limit.
        Err(SearchError::TooLarge { bound, .. }) if opts.max_ops.is_none() => {
            let mut plain = search_space(concrete, &SearchOptions { split: false, ..opts.clone() })?;
            plain.split_refused = Some(bound);
            return Ok(plain);
        }
        other => other?,
    };
    if result.stop_reason != StopReason::Exhausted {
        let left = opts.time_limit.saturating_sub(start.elapsed());
        let plain = search_space(concrete, &SearchOptions { split: false, time_limit: left, ..opts.clone() })?;
        let found = result.graphs.len();
        for f in plain.graphs {
            if !result.graphs[..found].iter().any(|g| g.graph == f.graph) {
                result.graphs.push(f);
            }
        }
        result.without_split = Some(PlainPhase {
            graphs_added: result.graphs.len() - found,
            states_explored: plain.states_explored,
            stop_reason: plain.stop_reason,
            seconds: plain.seconds,
        });
        result.seconds += plain.seconds;
        for (g, checks) in plain.rejected {
            if !result.rejected.iter().any(|(r, _)| *r == g) {
                result.rejected.push((g, checks));
            }
        }
        // Fewest ops first, as each phase orders its own; among graphs of one size, those of
        // the search with Split come first, in its order.
        result.graphs.sort_by_key(|f| f.graph.op_count());
    }
    Ok(result)
}

fn search_space(concrete: &ValidGraph, opts: &SearchOptions) -> Result<SearchResult, SearchError> {
    let start = Instant::now();
    if opts.trials < 2 {
        return Err(SearchError::Options("at least 2 fingerprint trials are needed".into()));
    }
    check_target(concrete)?;
    let symbolic = symbolize(concrete);
    let target = &symbolic.graph;
    let reduced: Vec<bool> =
        if opts.pruning.reducibility { symbolic.reduced.clone() } else { vec![true; target.dims.len()] };

    // Refused before any work that grows with the target (the saturation, the fingerprints).
    let max_ops = opts.max_ops.unwrap_or_else(|| default_max_ops(target, &reduced, opts.split));
    if max_ops > MAX_SEARCH_OPS {
        return Err(match opts.max_ops {
            Some(_) => SearchError::Options(format!("max_ops {max_ops} is above the supported {MAX_SEARCH_OPS}")),
            None => SearchError::TooLarge { ops: target.op_count(), bound: max_ops },
        });
    }

    // The master table: every split variable the search may need, created up front so that
    // shape inference in the workers never changes it.
    let mut table = target.dims.clone();
    if opts.split {
        let splittable: Vec<_> = target
            .dims
            .iter()
            .filter(|(v, d)| d.kind == DimKind::Plain && reduced[v.index()])
            .map(|(v, _)| v)
            .collect();
        for v in splittable {
            table.split_vars(v);
        }
    }
    let atoms = Atoms::new(&table, &reduced).map_err(|n| SearchError::Unsupported {
        op: "dims".into(),
        reason: format!("the target needs {n} index atoms (at most {MAX_ATOMS})"),
    })?;

    // The saturation shares the wall-clock limit of the whole search.
    let limits = EGraphLimits { time: opts.egraph.time.min(opts.time_limit.mul_f64(ENUMERATION_SHARE)), ..opts.egraph };
    let abs = Abstraction::saturate(target, &atoms, limits);
    let saturated = Instant::now();

    let mut leaves: Vec<LeafSpec> = target
        .inputs
        .iter()
        .map(|i| LeafSpec { op: target.node(i.node).op, shape: i.decl.shape.clone(), must_use: !i.decl.is_index() })
        .collect();
    for n in &target.nodes {
        if let Op::Const(_) = n.op {
            leaves.push(LeafSpec { op: n.op, shape: n.shape.clone(), must_use: false });
        }
    }
    let verifier = Verifier::new(
        target.nodes.clone(),
        target.outputs.iter().map(|o| o.node.index()).collect(),
        target.inputs.len(),
        &table,
        opts.trials,
        opts.seed,
    )
    .map_err(|e| SearchError::Unsupported {
        op: "target".into(),
        reason: format!("the target cannot be fingerprinted: {e:?}"),
    })?;
    let mut in_output = vec![false; table.len()];
    for o in &target.outputs {
        for d in target.shape(o.node) {
            if let Dim::Var(v) = d {
                in_output[v.index()] = true;
            }
        }
    }
    let space = Space {
        abs: &abs,
        atoms: &atoms,
        table,
        leaves,
        n_inputs: target.inputs.len(),
        vocab: Vocab::of(target, opts.split),
        outputs: abs
            .outputs
            .iter()
            .zip(&target.outputs)
            .map(|(c, o)| (*c, crate::graph::squeeze_leading(target.shape(o.node)).to_vec()))
            .collect(),
        in_output,
        dist: abs.distances(),
        max_ops,
        verifier: &verifier,
        pruning: opts.pruning,
    };
    let outcome = enumerate::search(&space, opts.max_states, start + opts.time_limit.mul_f64(ENUMERATION_SHARE));
    let enumerated = Instant::now();

    // Build, check and recover every found graph, in parallel and in order.
    let graphs: Vec<ValidGraph> = outcome.found.iter().map(|f| build(target, &space.leaves, f)).collect();
    let full = opts.final_checks.then(|| {
        let plain: Vec<u64> = symbolic.origin.iter().map(|o| concrete.dims.get(*o).value).collect();
        verify::FullShape::new(
            target,
            plain,
            opts.seed,
            opts.full_shape_max_elems,
            opts.full_shape_max_macs,
            opts.full_shape_budget_macs,
        )
    });
    let float = opts.final_checks.then(|| verify::FloatCheck::new(target, &symbolic.reduced, opts.seed));
    // The budget of the declared-shape checks is handed out in canonical order, so which
    // graphs get one does not depend on timing.
    let mut spent = 0u64;
    let within: Vec<bool> = graphs
        .iter()
        .map(|g| match full.as_ref().and_then(|f| f.work(g)) {
            Some(w) if spent.saturating_add(w) <= opts.full_shape_budget_macs => {
                spent += w;
                true
            }
            _ => false,
        })
        .collect();
    let checked: Vec<(ValidGraph, FinalChecks, Result<Recovered, RecoverError>)> = graphs
        .into_par_iter()
        .zip(within)
        .map(|(g, within)| {
            let skipped = || Check::Skipped("final checks are off".into());
            let full_shape = full.as_ref().map_or_else(skipped, |f| f.check(&g, within));
            let (float_check, err) = float.as_ref().map_or_else(|| (skipped(), None), |f| f.check(&g));
            let checks = FinalChecks { full_shape, float: float_check, float_max_rel_err: err };
            let rec = recover(concrete, &symbolic.origin, &g, &opts.recover);
            (g, checks, rec)
        })
        .collect();
    let mut found = Vec::new();
    let mut rejected = Vec::new();
    for (g, checks, rec) in checked {
        if !checks.ok() {
            rejected.push((g, checks));
            continue;
        }
        let rec = rec.map_err(|e| SearchError::Unsupported {
            op: "recovery".into(),
            reason: format!("a found graph does not map back to the declared dims: {e}"),
        })?;
        found.push(FoundGraph { graph: g, checks, concrete: rec.candidates, notes: rec.notes });
    }
    Ok(SearchResult {
        kernel: concrete.name.clone(),
        graphs: found,
        rejected,
        states_explored: outcome.states,
        stop_reason: outcome.stop,
        max_ops,
        egraph: abs.stats.clone(),
        counters: outcome.counters,
        seconds: start.elapsed().as_secs_f64(),
        stage_seconds: [
            (saturated - start).as_secs_f64(),
            (enumerated - saturated).as_secs_f64(),
            enumerated.elapsed().as_secs_f64(),
        ],
        symbolic,
        without_split: None,
        split_refused: None,
    })
}
