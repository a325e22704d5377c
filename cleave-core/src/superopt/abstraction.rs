//! The abstract-expression check: one saturated e-graph per target.
//!
//! The target's output terms seed the e-graph; saturating it with [`rules`](super::rules)
//! makes every e-class a set of equivalent terms, and every term represented in it a
//! subexpression of some equivalent form of the target. A candidate tensor survives only if
//! its term is represented: since its operands' classes are already known, that is one hash
//! lookup of the e-node built from them ([`Abstraction::apply`]).

use std::time::Duration;

use egg::{Id, Runner, SimpleScheduler, StopReason};

use super::atoms::Atoms;
use super::rules::{cancellations, rules};
use super::term::{op_term, FreeAtoms, Term, TermGraph};
use crate::graph::{Dim, Graph, Op};

/// Limits of the saturation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EGraphLimits {
    /// Most e-nodes.
    pub nodes: usize,
    /// Most iterations.
    pub iterations: usize,
    /// Wall-clock limit.
    pub time: Duration,
}

impl Default for EGraphLimits {
    fn default() -> Self {
        EGraphLimits { nodes: 200_000, iterations: 40, time: Duration::from_secs(20) }
    }
}

/// Rounds of the cancellation rules after the saturation.
const CANCELLATION_ROUNDS: usize = 4;

/// Size and stop reason of the saturation, for reports.
#[derive(Clone, Debug, PartialEq)]
pub struct EGraphStats {
    /// E-classes after saturation.
    pub classes: usize,
    /// E-nodes after saturation.
    pub nodes: usize,
    /// Iterations run.
    pub iterations: usize,
    /// Why saturation stopped: `saturated`, `iteration_limit`, `node_limit`, `time_limit`.
    pub stop_reason: String,
    /// True when the stop reason depends on the clock (the result may differ between runs).
    pub timed_out: bool,
}

/// The saturated e-graph of a target and the classes of its outputs.
pub struct Abstraction {
    egraph: TermGraph,
    /// The class of each target output.
    pub outputs: Vec<Id>,
    /// Statistics of the saturation.
    pub stats: EGraphStats,
}

impl Abstraction {
    /// Seeds the e-graph with the target's outputs and saturates it.
    pub fn saturate(target: &Graph, atoms: &Atoms, limits: EGraphLimits) -> Abstraction {
        let inputs = target.inputs.iter().map(|i| atoms.of_shape(&i.decl.shape)).collect();
        let mut egraph = TermGraph::new(FreeAtoms { inputs });
        let mut classes: Vec<Id> = Vec::with_capacity(target.nodes.len());
        for node in &target.nodes {
            let args: Vec<Id> = node.args.iter().map(|a| classes[a.index()]).collect();
            let shapes: Vec<&[Dim]> = node.args.iter().map(|a| target.shape(*a)).collect();
            let id = op_term(&node.op, &args, &shapes, atoms, |n| Some(egraph.add(n)))
                .expect("adding e-nodes always yields a class");
            classes.push(id);
        }
        let roots: Vec<Id> = target.outputs.iter().map(|o| classes[o.node.index()]).collect();
        let mut runner = Runner::default()
            .with_egraph(egraph)
            .with_node_limit(limits.nodes)
            .with_iter_limit(limits.iterations)
            .with_time_limit(limits.time)
            .with_scheduler(SimpleScheduler);
        runner.roots = roots;
        let runner = runner.run(&rules());
        let first_iterations = runner.iterations.len();
        // Then the cancellations, on the result: they merge classes and add nothing, so a
        // few rounds (cancellations that a merge exposes) stay within any limit.
        let (first_stop, roots) = (runner.stop_reason.clone(), runner.roots.clone());
        let mut egraph = runner.egraph;
        egraph.rebuild();
        let mut second = Runner::default()
            .with_egraph(egraph)
            .with_iter_limit(CANCELLATION_ROUNDS)
            .with_node_limit(usize::MAX)
            .with_time_limit(limits.time)
            .with_scheduler(SimpleScheduler);
        second.roots = roots;
        let mut runner = second.run(&cancellations());
        runner.stop_reason = match (first_stop, runner.stop_reason) {
            (Some(StopReason::Saturated) | None, Some(StopReason::TimeLimit(t))) => Some(StopReason::TimeLimit(t)),
            (first, _) => first,
        };
        // Rounds that merged something: a target with nothing to cancel reports what the
        // rules alone took.
        let iterations =
            first_iterations + runner.iterations.iter().filter(|it| it.applied.values().any(|&n| n > 0)).count();
        let (stop_reason, timed_out) = match runner.stop_reason.as_ref() {
            Some(StopReason::Saturated) | None => ("saturated".to_string(), false),
            Some(StopReason::IterationLimit(_)) => ("iteration_limit".to_string(), false),
            Some(StopReason::NodeLimit(_)) => ("node_limit".to_string(), false),
            Some(StopReason::TimeLimit(_)) => ("time_limit".to_string(), true),
            Some(StopReason::Other(s)) => (s.clone(), false),
        };
        let mut egraph = runner.egraph;
        egraph.rebuild();
        let outputs = runner.roots.iter().map(|r| egraph.find(*r)).collect();
        let stats = EGraphStats {
            classes: egraph.number_of_classes(),
            nodes: egraph.total_number_of_nodes(),
            iterations,
            stop_reason,
            timed_out,
        };
        Abstraction { egraph, outputs, stats }
    }

    /// The class of a leaf (input or constant), if the target's terms mention it.
    pub fn leaf(&self, op: &Op, atoms: &Atoms) -> Option<Id> {
        op_term(op, &[], &[], atoms, |n| self.egraph.lookup(n))
    }

    /// The class of `op` applied to operands of the given classes and shapes, or `None` when
    /// that term is not a subexpression of any equivalent form of the target.
    pub fn apply(&self, op: &Op, args: &[Id], shapes: &[&[Dim]], atoms: &Atoms) -> Option<Id> {
        op_term(op, args, shapes, atoms, |n: Term| self.egraph.lookup(n))
    }

    /// Per class (indexed by `usize::from(id)`): the fewest ops that can turn a tensor of this
    /// class into an output, counting one step per e-node on the way to an output class and
    /// one step for a `sum` over a product (a matmul is one op); `u32::MAX` when no output
    /// class is reachable. Transposes and splits are free, so this is a lower bound on the ops
    /// a graph still needs after such a tensor.
    pub fn distances(&self) -> Vec<u32> {
        let eg = &self.egraph;
        let n = eg.classes().map(|c| usize::from(c.id)).max().map_or(0, |m| m + 1);
        // Reverse edges: child class -> (parent class), each of cost 1.
        let mut parents: Vec<Vec<usize>> = vec![Vec::new(); n];
        let is_set = |id: Id| eg[id].data.set.is_some();
        for class in eg.classes() {
            let pc = usize::from(class.id);
            for node in &class.nodes {
                for &ch in egg::Language::children(node) {
                    if !is_set(ch) {
                        parents[usize::from(eg.find(ch))].push(pc);
                    }
                }
                // A matmul reaches sum(C, a * b) from a and b in one op.
                if let Term::Sum([set, body]) = node {
                    if !is_set(*set) {
                        continue;
                    }
                    for inner in &eg[*body].nodes {
                        if let Term::Mul([a, b]) = inner {
                            parents[usize::from(eg.find(*a))].push(pc);
                            parents[usize::from(eg.find(*b))].push(pc);
                        }
                    }
                }
            }
        }
        let mut dist = vec![u32::MAX; n];
        let mut queue = std::collections::VecDeque::new();
        for &o in &self.outputs {
            dist[usize::from(o)] = 0;
            queue.push_back(usize::from(o));
        }
        // Unit costs: breadth-first search from the outputs along reversed edges.
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (c, ps) in parents.iter().enumerate() {
            for &p in ps {
                children[p].push(c);
            }
        }
        while let Some(c) = queue.pop_front() {
            for &ch in &children[c] {
                if dist[ch] == u32::MAX {
                    dist[ch] = dist[c] + 1;
                    queue.push_back(ch);
                }
            }
        }
        dist
    }

    /// Free atoms of a class.
    pub fn free(&self, id: Id) -> u64 {
        self.egraph[id].data.free
    }

    /// The saturated e-graph (for tests and diagnostics).
    pub fn egraph(&self) -> &TermGraph {
        &self.egraph
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{BinaryOp, DType, Graph, ReduceOp, TensorDecl, UnaryOp};

    /// `o = sum_l(exp(q·kᵀ) / sum_l exp(q·kᵀ) · v)` over symbols, with l and d reduced.
    fn attention() -> (Graph, Atoms) {
        let mut t = crate::graph::DimTable::new();
        let [h, s, d, l, e] = ["h", "s", "d", "l", "e"].map(|n| Dim::Var(t.plain(n, 4, false)));
        let mut g = Graph::new("att", t);
        let decl = |name: &str, shape: Vec<Dim>| TensorDecl::dense(name, DType::F32, shape);
        let q = g.add_input(decl("q", vec![h, s, d]));
        let k = g.add_input(decl("k", vec![h, l, d]));
        let v = g.add_input(decl("v", vec![h, l, e]));
        let kt = g.add(Op::Transpose, &[k]).unwrap();
        let sc = g.add(Op::MatMul, &[q, kt]).unwrap();
        let ex = g.add(Op::Unary(UnaryOp::Exp), &[sc]).unwrap();
        let rs = g.add(Op::Reduce(ReduceOp::Sum, 2), &[ex]).unwrap();
        let p = g.add(Op::Binary(BinaryOp::Div), &[ex, rs]).unwrap();
        let o = g.add(Op::MatMul, &[p, v]).unwrap();
        g.add_output(decl("o", vec![h, s, e]), o);
        let mut dims = g.dims.clone();
        for v in [2, 3] {
            dims.split_vars(crate::graph::DimVar(v));
        }
        g.dims = dims;
        let atoms = Atoms::new(&g.dims, &[false, false, true, true, false]).unwrap();
        (g, atoms)
    }

    #[test]
    fn the_late_division_and_the_split_sums_are_represented() {
        let (g, atoms) = attention();
        let abs = Abstraction::saturate(&g, &atoms, EGraphLimits::default());
        assert_eq!(abs.stats.stop_reason, "saturated");
        let shape = |id: u32| g.shape(crate::graph::NodeId(id)).to_vec();
        let leaf = |i: u32| abs.leaf(&Op::Input(i), &atoms).unwrap();
        let (q, k, v) = (leaf(0), leaf(1), leaf(2));
        let sc = abs.apply(&Op::MatMul, &[q, k], &[&shape(0), &shape(3)], &atoms).expect("q·kᵀ");
        let ex = abs.apply(&Op::Unary(UnaryOp::Exp), &[sc], &[&shape(4)], &atoms).expect("exp");
        let rs = abs.apply(&Op::Reduce(ReduceOp::Sum, 2), &[ex], &[&shape(5)], &atoms).expect("row sum");
        // matmul(exp, v) and its division by the row sum: the FlashAttention form.
        let pv = abs.apply(&Op::MatMul, &[ex, v], &[&shape(5), &shape(2)], &atoms).expect("exp·v");
        let o = abs.apply(&Op::Binary(BinaryOp::Div), &[pv, rs], &[&shape(5), &shape(6)], &atoms);
        assert_eq!(o, Some(abs.outputs[0]));
        // The partial sum over the chunk l/s_l exists, and summing it over s_l gives the row sum.
        let chunk = g.dims.iter().find(|(_, d)| d.name == "l/s_l").unwrap().0;
        let count = g.dims.iter().find(|(_, d)| d.name == "s_l").unwrap().0;
        let split_shape = [Dim::Var(count), shape(5)[0], shape(5)[1], Dim::Var(chunk)];
        let part = abs.apply(&Op::Reduce(ReduceOp::Sum, 3), &[ex], &[&split_shape], &atoms).expect("partial row sum");
        let comb_shape = [Dim::Var(count), shape(5)[0], shape(5)[1], Dim::One];
        let comb = abs.apply(&Op::Reduce(ReduceOp::Sum, 0), &[part], &[&comb_shape], &atoms);
        assert_eq!(comb, Some(rs));
        // Summing q over d is not part of any equivalent form: a dependent factor never leaves
        // a sum.
        assert_eq!(abs.apply(&Op::Reduce(ReduceOp::Sum, 2), &[q], &[&shape(0)], &atoms), None);
        // exp of a partial score is not either: exp does not distribute over the split sum.
        let qk = abs.apply(&Op::MatMul, &[q, k], &[&shape(0), &[shape(3)[0], shape(3)[1], Dim::Var(chunk)]], &atoms);
        assert!(qk.is_some_and(|c| abs.apply(&Op::Unary(UnaryOp::Exp), &[c], &[&shape(4)], &atoms) == Some(ex)));
    }

    #[test]
    fn distances_count_ops_to_the_output() {
        let (g, atoms) = attention();
        let abs = Abstraction::saturate(&g, &atoms, EGraphLimits::default());
        let dist = abs.distances();
        let leaf = |i: u32| abs.leaf(&Op::Input(i), &atoms).unwrap();
        assert_eq!(dist[usize::from(abs.outputs[0])], 0);
        // v is one matmul away (with the normalized scores). q is three steps away: the score
        // matmul, exp, and a matmul of exp(..) with v/rowsum (a term of the e-graph, though not
        // a well-shaped tensor; the distance counts only the ops on q's own path, so it stays a
        // lower bound).
        assert_eq!(dist[usize::from(leaf(2))], 1);
        assert_eq!(dist[usize::from(leaf(0))], 3);
    }
}
