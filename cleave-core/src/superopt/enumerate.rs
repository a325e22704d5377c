//! The enumerative search: graphs grown one op at a time from the target's leaves.
//!
//! **Canonical order.** Each op gets a key: its largest operand index, then its other operand
//! index (none sorts first), then its kind and attributes, then its operand order. A new op is
//! accepted only if its key is greater than the previous op's key. An op that consumes the
//! previous op's output always passes (its largest operand is newer than any operand before),
//! and every DAG without duplicate ops is reached exactly once: in the unique order that adds,
//! at each step, the ready op with the smallest key. (Mirage compares operand lists
//! lexicographically, which makes `A·(B·C)` unreachable.) Commutative ops take their operands
//! in ascending order.
//!
//! **Pruning**, each switchable for measurement ([`Pruning`]):
//! - *abstract expression*: the new tensor's term must be represented in the target's
//!   saturated e-graph (one lookup from its operands' classes);
//! - *reducibility*: only axes of eventually-reduced symbols (and their split parts) are
//!   reduced or split;
//! - *duplicates*: no tensor with the class and shape of an existing one (this subsumes
//!   identical ops and transposes of transposes), and no `x * x` when the target squares;
//! - *views on leaves*: transposes and splits only of inputs (and of views of inputs), a split
//!   never of a transpose (the transpose of the split is the same tensor); views move no data
//!   and commute with the other ops, so this drops only layout variants;
//! - *open bound*: every tensor but the outputs must be consumed and every input used, and an
//!   op lowers the number of open tensors by at most one, so `open − outputs ≤ ops left`;
//! - *pending reduction*: an op removes at most one symbol, so the symbols that open tensors
//!   have and no output has (split counts, chunks, contracted dims) each need one more op;
//! - *distance*: a tensor needs at least as many more ops as its class is e-nodes away from the
//!   output class in the e-graph ([`Abstraction::distances`]).
//!
//! A complete graph (all inputs used, only the outputs open) is kept when its outputs have the
//! target outputs' classes and shapes (up to leading unit axes) and its fingerprints agree;
//! kept graphs are not extended.
//!
//! **Parallelism and determinism.** States up to a small depth are expanded breadth-first in
//! order; the subtrees below them are searched in parallel batches. Each subtree is searched
//! depth-first in a fixed order, so its states are numbered deterministically; a state limit is
//! applied by truncating subtrees in order after each batch, which makes the result
//! independent of thread timing unless the time limit stops the search.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use egg::Id;
use rayon::prelude::*;

use super::abstraction::Abstraction;
use super::atoms::Atoms;
use super::fingerprint::{Scratch, Verdict, Verifier};
use super::vocab::{is_laid_out_vector, Vocab};
use crate::graph::{
    infer, squeeze_leading, BinaryOp, Dim, DimKind, DimTable, Mask, Node, NodeId, Op, ReduceOp, Shape, UnaryOp,
};

/// Switches for each pruning rule (all on by default), for measuring their effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pruning {
    /// Require every tensor's term in the saturated e-graph.
    pub abstract_expr: bool,
    /// Reduce and split only eventually-reduced axes.
    pub reducibility: bool,
    /// Reject a tensor with the class and shape of an existing one.
    pub duplicates: bool,
    /// Bound the open tensors by the ops left.
    pub open_bound: bool,
    /// Require one op per symbol that open tensors have and no output has.
    pub pending_reduction: bool,
    /// Require as many ops as the e-graph distance of each open tensor to an output.
    pub distance: bool,
    /// Apply views (transpose, split) to leaves and views of leaves only, unless the target
    /// itself transposes a computed tensor. Views move no data and commute with elementwise
    /// ops, reductions over other axes and matmul, so this only drops layout variants of
    /// graphs that are kept.
    pub views_on_leaves: bool,
}

impl Default for Pruning {
    fn default() -> Self {
        Pruning {
            abstract_expr: true,
            reducibility: true,
            duplicates: true,
            open_bound: true,
            pending_reduction: true,
            distance: true,
            views_on_leaves: true,
        }
    }
}

/// Why a search stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StopReason {
    /// Every graph up to the size bound was considered.
    Exhausted,
    /// The state limit was reached.
    StateLimit,
    /// The wall-clock limit was reached (the result may differ between runs).
    TimeLimit,
}

impl StopReason {
    /// The JSON name.
    pub fn name(self) -> &'static str {
        match self {
            StopReason::Exhausted => "exhausted",
            StopReason::StateLimit => "state_limit",
            StopReason::TimeLimit => "time_limit",
        }
    }
}

/// Counters of one search.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Candidate ops rejected by the canonical order are never generated; these are the ones
    /// generated and rejected by the abstract-expression check.
    pub pruned_abstract: u64,
    /// Rejected by the shape rules.
    pub pruned_shape: u64,
    /// Rejected as duplicates.
    pub pruned_duplicate: u64,
    /// Rejected by the open bound.
    pub pruned_open: u64,
    /// Rejected by the pending-reduction bound.
    pub pruned_pending: u64,
    /// Rejected by the distance bound.
    pub pruned_distance: u64,
    /// Complete graphs whose output classes matched (fingerprint tests run).
    pub fingerprinted: u64,
    /// Of those, rejected by fingerprints (or inconclusive).
    pub fingerprint_rejected: u64,
    /// Found graphs reached more than once; the canonical order makes this 0.
    pub repeated: u64,
}

impl Counters {
    fn add(&mut self, o: &Counters) {
        self.pruned_abstract += o.pruned_abstract;
        self.pruned_shape += o.pruned_shape;
        self.pruned_duplicate += o.pruned_duplicate;
        self.pruned_open += o.pruned_open;
        self.pruned_pending += o.pruned_pending;
        self.pruned_distance += o.pruned_distance;
        self.fingerprinted += o.fingerprinted;
        self.fingerprint_rejected += o.fingerprint_rejected;
        self.repeated += o.repeated;
    }
}

/// A leaf of the search: an input or a constant of the target.
#[derive(Clone, Debug)]
pub struct LeafSpec {
    /// `Op::Input(k)` or `Op::Const(c)`.
    pub op: Op,
    /// Its shape.
    pub shape: Shape,
    /// A graph must use it: an input that is not an index tensor (those address, they are
    /// never computed with).
    pub must_use: bool,
}

/// Everything a worker reads: shared and immutable during the search.
pub struct Space<'a> {
    /// The saturated e-graph.
    pub abs: &'a Abstraction,
    /// Index atoms of `table`.
    pub atoms: &'a Atoms,
    /// The symbolic dim table with every split variable created up front.
    pub table: DimTable,
    /// Inputs (in input order), then constants.
    pub leaves: Vec<LeafSpec>,
    /// Number of inputs among the leaves.
    pub n_inputs: usize,
    /// Ops the search may insert.
    pub vocab: Vocab,
    /// Target output classes and squeezed shapes, in output order.
    pub outputs: Vec<(Id, Shape)>,
    /// Per dim variable: whether some output has an axis of it.
    pub in_output: Vec<bool>,
    /// Per e-class: [`Abstraction::distances`].
    pub dist: Vec<u32>,
    /// Most ops (leaves excluded).
    pub max_ops: usize,
    /// The fingerprint verifier.
    pub verifier: &'a Verifier,
    /// Pruning switches.
    pub pruning: Pruning,
}

/// A found graph: its ops (operands index leaves first, then earlier ops) and which tensors
/// are the outputs, in target output order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FoundOps {
    /// Ops after the leaves, each with its operand indices.
    pub ops: Vec<(OpCode, Vec<u16>)>,
    /// Tensor index of each output.
    pub outputs: Vec<u16>,
}

/// A hashable, ordered stand-in for a non-leaf [`Op`] (an `Op` holds an `f64` constant, so it
/// has no total order). The order of the variants is part of the canonical key: changing it
/// changes the order in which graphs are found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpCode {
    /// Swap of the last two axes.
    Transpose,
    /// An elementwise op of one operand.
    Unary(UnaryOp),
    /// A reduction over an axis (below [`MAX_RANK`]).
    Reduce(ReduceOp, u8),
    /// A split of an axis (below [`MAX_RANK`]).
    Split(u8),
    /// A batched matrix product.
    MatMul,
    /// An elementwise op of two operands.
    Binary(BinaryOp),
    /// A mask over the last two axes.
    Mask(Mask),
}

impl OpCode {
    /// The code of a non-leaf op; `None` for inputs and constants.
    pub fn of(op: &Op) -> Option<OpCode> {
        Some(match *op {
            Op::Input(_) | Op::Const(_) => return None,
            Op::Transpose => OpCode::Transpose,
            Op::Unary(u) => OpCode::Unary(u),
            Op::Reduce(r, axis) => OpCode::Reduce(r, axis as u8),
            Op::Split(axis) => OpCode::Split(axis as u8),
            Op::MatMul => OpCode::MatMul,
            Op::Binary(b) => OpCode::Binary(b),
            Op::Mask(m) => OpCode::Mask(m),
        })
    }

    /// The op it stands for.
    pub fn op(self) -> Op {
        match self {
            OpCode::Transpose => Op::Transpose,
            OpCode::Unary(u) => Op::Unary(u),
            OpCode::Reduce(r, axis) => Op::Reduce(r, u32::from(axis)),
            OpCode::Split(axis) => Op::Split(u32::from(axis)),
            OpCode::MatMul => Op::MatMul,
            OpCode::Binary(b) => Op::Binary(b),
            OpCode::Mask(m) => Op::Mask(m),
        }
    }

    /// The code's position in the order of codes, as a number small enough to pack into a
    /// candidate key (below 2^16).
    fn rank(self) -> u64 {
        let (unary, reduce, rank) = (UnaryOp::ALL.len() as u64, 3, MAX_RANK as u64);
        match self {
            OpCode::Transpose => 1,
            OpCode::Unary(u) => 2 + u as u64,
            OpCode::Reduce(r, axis) => 2 + unary + r as u64 * rank + u64::from(axis),
            OpCode::Split(axis) => 2 + unary + reduce * rank + u64::from(axis),
            OpCode::MatMul => 2 + unary + (reduce + 1) * rank,
            OpCode::Binary(b) => 3 + unary + (reduce + 1) * rank + b as u64,
            OpCode::Mask(m) => 3 + unary + (reduce + 1) * rank + BinaryOp::ALL.len() as u64 + m.code(),
        }
    }
}

/// The most axes a tensor may have in a search (axis numbers are part of op codes).
pub const MAX_RANK: usize = 40;

fn key(max: usize, second: Option<usize>, code: OpCode, order: u8) -> u64 {
    ((max as u64) << 40) | ((second.map_or(0, |s| s as u64 + 1)) << 24) | (code.rank() << 8) | u64::from(order)
}

#[derive(Clone, Debug)]
struct Tensor {
    /// `None` for a leaf.
    code: Option<OpCode>,
    args: [u16; 2],
    arity: u8,
    shape: Shape,
    class: Option<Id>,
    uses: u32,
    /// An input (must be used) or an op result (must be consumed unless an output).
    must_use: bool,
    /// The symbols of its axes that no output has, as a mask over dim variables.
    foreign: u64,
    /// E-graph distance of its class to an output.
    dist: u32,
    /// A leaf, or a transpose or split of one.
    view_of_leaf: bool,
}

#[derive(Clone, Debug)]
struct State {
    ts: Vec<Tensor>,
    keys: Vec<u64>,
    open: usize,
    n_ops: usize,
}

struct Cand {
    code: OpCode,
    args: [u16; 2],
    arity: u8,
    shape: Shape,
    class: Option<Id>,
    key: u64,
}

impl State {
    fn last_key(&self) -> u64 {
        self.keys.last().copied().unwrap_or(0)
    }

    /// The open count recomputed from scratch, for debug assertions.
    fn recount(&self) -> usize {
        self.ts.iter().filter(|t| t.must_use && t.uses == 0).count()
    }

    fn push(&mut self, c: &Cand, foreign: u64, dist: u32) {
        for (i, &a) in c.args[..c.arity as usize].iter().enumerate() {
            if i == 1 && c.args[0] == a {
                self.ts[a as usize].uses += 1;
                continue;
            }
            let t = &mut self.ts[a as usize];
            if t.uses == 0 && t.must_use {
                self.open -= 1;
            }
            t.uses += 1;
        }
        self.ts.push(Tensor {
            code: Some(c.code),
            args: c.args,
            arity: c.arity,
            shape: c.shape.clone(),
            class: c.class,
            uses: 0,
            must_use: true,
            foreign,
            dist,
            view_of_leaf: matches!(c.code, OpCode::Transpose | OpCode::Split(_))
                && self.ts[c.args[0] as usize].view_of_leaf,
        });
        self.open += 1;
        self.keys.push(c.key);
        self.n_ops += 1;
        debug_assert_eq!(self.open, self.recount());
    }

    fn pop(&mut self) {
        let t = self.ts.pop().expect("pop after push");
        self.keys.pop();
        self.n_ops -= 1;
        self.open -= 1;
        let args = &t.args[..t.arity as usize];
        for (i, &a) in args.iter().enumerate() {
            // A tensor used twice by this op is released once, after both uses.
            self.ts[a as usize].uses -= 1;
            if i == 0 && args.len() == 2 && args[1] == a {
                continue;
            }
            let u = &self.ts[a as usize];
            if u.uses == 0 && u.must_use {
                self.open += 1;
            }
        }
        debug_assert_eq!(self.open, self.recount());
    }
}

/// The result of searching one subtree.
#[derive(Default)]
struct SubResult {
    states: u64,
    /// Found graphs with the (1-based) number of the state at which each was found.
    found: Vec<(u64, FoundOps)>,
    counters: Counters,
    timed_out: bool,
    /// The subtree had more states than its cap allowed.
    capped: bool,
}

/// Per-worker mutable context.
struct Worker<'s, 'a> {
    space: &'s Space<'a>,
    table: DimTable,
    scratch: Scratch,
    nodes: Vec<Node>,
    cands: Vec<Vec<Cand>>,
    out: SubResult,
    cap: u64,
    deadline: Instant,
    stop: &'s AtomicBool,
    /// Work since the clock was last read: one unit per state, [`CLOCK_EVERY`] per
    /// fingerprint check, which can take far longer than a state on large instantiations.
    unread: u64,
}

/// Units of work between two reads of the clock.
const CLOCK_EVERY: u64 = 256;

/// The outcome of a whole search.
pub struct Outcome {
    /// Found graphs, sorted and without repeats.
    pub found: Vec<FoundOps>,
    /// States explored.
    pub states: u64,
    /// Why the search stopped.
    pub stop: StopReason,
    /// Pruning counters.
    pub counters: Counters,
}

impl<'s, 'a> Worker<'s, 'a> {
    fn new(space: &'s Space<'a>, cap: u64, deadline: Instant, stop: &'s AtomicBool) -> Self {
        Worker {
            space,
            table: space.table.clone(),
            scratch: Scratch::default(),
            nodes: Vec::new(),
            cands: Vec::new(),
            out: SubResult::default(),
            cap,
            deadline,
            stop,
            unread: 0,
        }
    }

    fn root(&self) -> State {
        let sp = self.space;
        let ts = sp
            .leaves
            .iter()
            .map(|l| Tensor {
                code: None,
                args: [0; 2],
                arity: 0,
                shape: l.shape.clone(),
                class: if sp.pruning.abstract_expr { sp.abs.leaf(&l.op, sp.atoms) } else { None },
                uses: 0,
                must_use: l.must_use,
                foreign: 0,
                dist: 0,
                view_of_leaf: true,
            })
            .collect();
        let open = sp.leaves.iter().filter(|l| l.must_use).count();
        State { ts, keys: Vec::new(), open, n_ops: 0 }
    }

    fn foreign(&self, shape: &[Dim]) -> u64 {
        shape.iter().fold(0, |m, d| match d {
            Dim::Var(v) if !self.space.in_output[v.index()] && v.index() < 64 => m | (1u64 << v.index()),
            _ => m,
        })
    }

    /// Lists the accepted children of `st` into `buf` (cleared first).
    fn children(&mut self, st: &State, buf: &mut Vec<Cand>) {
        buf.clear();
        let sp = self.space;
        if st.n_ops >= sp.max_ops {
            return;
        }
        let last = st.last_key();
        let lo = (last >> 40) as usize;
        let n = st.ts.len();
        for m in lo..n {
            // Ops of one operand.
            let t = &st.ts[m];
            let rank = t.shape.len();
            let mut unary_ops: Vec<OpCode> = Vec::new();
            let views = !sp.pruning.views_on_leaves || t.view_of_leaf;
            let transposes = views || sp.vocab.transpose_computed;
            let vector = sp.vocab.transpose_vectors && t.view_of_leaf && is_laid_out_vector(&t.shape);
            if rank >= 2 && (sp.vocab.transpose && transposes || vector) {
                unary_ops.push(OpCode::Transpose);
            }
            unary_ops.extend(sp.vocab.unary.iter().map(|u| OpCode::Unary(*u)));
            if rank >= 2 {
                unary_ops.extend(sp.vocab.masks.iter().map(|m| OpCode::Mask(*m)));
            }
            for (axis, d) in t.shape.iter().enumerate() {
                let allowed = if sp.pruning.reducibility { sp.atoms.reducible(*d) } else { *d != Dim::One };
                if !allowed {
                    continue;
                }
                unary_ops.extend(sp.vocab.reduce.iter().map(|r| OpCode::Reduce(*r, axis as u8)));
                // A split of a transpose is the transpose of a split of the untransposed axis;
                // only the second form is generated.
                let transposed = sp.pruning.views_on_leaves && t.code == Some(OpCode::Transpose);
                if sp.vocab.split
                    && views
                    && !transposed
                    && matches!(d, Dim::Var(v) if self.table.get(*v).kind == DimKind::Plain)
                {
                    unary_ops.push(OpCode::Split(axis as u8));
                }
            }
            for code in unary_ops {
                let k = key(m, None, code, 0);
                if k <= last {
                    continue;
                }
                self.consider(st, code, [m as u16, 0], 1, k, buf);
            }
            // Ops of two operands, one of which is m (the larger index).
            let mut binary_ops: Vec<(OpCode, bool)> = Vec::new();
            if sp.vocab.matmul {
                binary_ops.push((OpCode::MatMul, false));
            }
            binary_ops.extend(sp.vocab.binary.iter().map(|b| (OpCode::Binary(*b), b.is_commutative())));
            let square = sp.vocab.unary.contains(&UnaryOp::Square);
            for j in 0..=m {
                for &(code, commutative) in &binary_ops {
                    // x * x is square(x) when the target squares: one form is enough.
                    if square && j == m && code == OpCode::Binary(BinaryOp::Mul) && sp.pruning.duplicates {
                        continue;
                    }
                    // [j, m]: the larger index second (order 0); [m, j]: first (order 1).
                    let k0 = key(m, Some(j), code, 0);
                    if k0 > last {
                        self.consider(st, code, [j as u16, m as u16], 2, k0, buf);
                    }
                    if !commutative && j != m {
                        let k1 = key(m, Some(j), code, 1);
                        if k1 > last {
                            self.consider(st, code, [m as u16, j as u16], 2, k1, buf);
                        }
                    }
                }
            }
        }
    }

    fn consider(&mut self, st: &State, code: OpCode, args: [u16; 2], arity: u8, key: u64, buf: &mut Vec<Cand>) {
        let sp = self.space;
        let op = code.op();
        let a = &st.ts[args[0] as usize];
        let b = &st.ts[args[arity as usize - 1] as usize];
        if op == Op::MatMul && (a.shape.len() < 2 || b.shape.len() < 2) {
            // The e-node of a matmul needs the contracted axis; the shape rules reject it anyway.
            self.out.counters.pruned_shape += 1;
            return;
        }
        let class = if sp.pruning.abstract_expr {
            let classes = [a.class.expect("classes are known"), b.class.expect("classes are known")];
            let shapes: [&[Dim]; 2] = [&a.shape, &b.shape];
            match sp.abs.apply(&op, &classes[..arity as usize], &shapes[..arity as usize], sp.atoms) {
                Some(c) => Some(c),
                None => {
                    self.out.counters.pruned_abstract += 1;
                    return;
                }
            }
        } else {
            None
        };
        let shapes: [&[Dim]; 2] = [&a.shape, &b.shape];
        let shape = match infer(&op, &shapes[..arity as usize], &mut self.table) {
            Ok(s) => s,
            Err(_) => {
                self.out.counters.pruned_shape += 1;
                return;
            }
        };
        if sp.pruning.duplicates {
            let dup = if sp.pruning.abstract_expr {
                st.ts.iter().any(|t| t.class == class && t.shape == shape)
            } else {
                // Without classes, only identical ops are known to be duplicates.
                st.ts.iter().any(|t| t.code == Some(code) && t.arity == arity && t.args == args)
            };
            if dup {
                self.out.counters.pruned_duplicate += 1;
                return;
            }
        }
        buf.push(Cand { code, args, arity, shape, class, key });
    }

    /// Checks the bounds after a push; true when the state may be kept.
    fn bounds_ok(&mut self, st: &State) -> bool {
        let sp = self.space;
        let left = sp.max_ops - st.n_ops;
        let k = sp.outputs.len();
        if sp.pruning.open_bound && st.open > k + left {
            self.out.counters.pruned_open += 1;
            return false;
        }
        if sp.pruning.pending_reduction || sp.pruning.distance {
            // Each op removes at most one symbol (a reduction or a contraction), and a split
            // replaces one by two, so every symbol that an open tensor has and no output has
            // costs at least one more op.
            let (mut foreign, mut far) = (0u64, 0u32);
            for t in st.ts.iter().filter(|t| t.must_use && t.uses == 0) {
                foreign |= t.foreign;
                far = far.max(t.dist);
            }
            if sp.pruning.pending_reduction && foreign.count_ones() as usize > left {
                self.out.counters.pruned_pending += 1;
                return false;
            }
            if sp.pruning.distance && far as usize > left {
                self.out.counters.pruned_distance += 1;
                return false;
            }
        }
        true
    }

    /// When the state is a complete graph matching the target, its output tensors.
    fn complete(&self, st: &State) -> Option<Vec<u16>> {
        let sp = self.space;
        let k = sp.outputs.len();
        if st.open != k || st.n_ops == 0 {
            return None;
        }
        let open: Vec<usize> =
            (0..st.ts.len()).filter(|&i| st.ts[i].must_use && st.ts[i].uses == 0 && st.ts[i].arity > 0).collect();
        if open.len() != k {
            // Some input is still unused.
            return None;
        }
        // Match open tensors to outputs by class and squeezed shape; both are equivalence
        // relations, so a greedy matching finds one whenever one exists.
        let mut used = vec![false; open.len()];
        let mut assign = vec![0u16; k];
        for (oi, (class, shape)) in sp.outputs.iter().enumerate() {
            let pick = (0..open.len()).find(|&p| {
                let t = &st.ts[open[p]];
                !used[p]
                    && (!sp.pruning.abstract_expr || t.class == Some(*class))
                    && squeeze_leading(&t.shape) == shape.as_slice()
            })?;
            used[pick] = true;
            assign[oi] = open[pick] as u16;
        }
        Some(assign)
    }

    fn verify(&mut self, st: &State, outputs: &[u16]) -> bool {
        let sp = self.space;
        self.out.counters.fingerprinted += 1;
        self.nodes.clear();
        for (i, t) in st.ts.iter().enumerate() {
            let op = match t.code {
                Some(code) => code.op(),
                None => sp.leaves[i].op,
            };
            let args = t.args[..t.arity as usize].iter().map(|&a| NodeId(u32::from(a))).collect();
            self.nodes.push(Node { op, args, shape: t.shape.clone() });
        }
        let outs: Vec<usize> = outputs.iter().map(|&o| o as usize).collect();
        let ok = sp.verifier.check(&self.nodes, &outs, &mut self.scratch) == Verdict::Equivalent;
        self.unread += CLOCK_EVERY;
        if !ok {
            self.out.counters.fingerprint_rejected += 1;
        }
        ok
    }

    fn record(&mut self, st: &State, outputs: Vec<u16>) {
        let n_leaves = self.space.leaves.len();
        let ops =
            st.ts[n_leaves..].iter().filter_map(|t| Some((t.code?, t.args[..t.arity as usize].to_vec()))).collect();
        self.out.found.push((self.out.states, FoundOps { ops, outputs }));
    }

    /// Pushes a candidate and evaluates the new state: `Some(true)` to expand it,
    /// `Some(false)` to skip it, `None` when a limit stops the search.
    fn enter(&mut self, st: &mut State, c: &Cand) -> Option<bool> {
        let foreign = self.foreign(&c.shape);
        let dist = match c.class {
            Some(id) if self.space.pruning.distance => {
                self.space.dist.get(usize::from(id)).copied().unwrap_or(u32::MAX)
            }
            _ => 0,
        };
        st.push(c, foreign, dist);
        if !self.bounds_ok(st) {
            return Some(false);
        }
        if self.out.states >= self.cap {
            self.out.capped = true;
            return None;
        }
        self.out.states += 1;
        self.unread += 1;
        if self.unread >= CLOCK_EVERY {
            self.unread = 0;
            if self.stop.load(Ordering::Relaxed) || Instant::now() >= self.deadline {
                self.stop.store(true, Ordering::Relaxed);
                self.out.timed_out = true;
                return None;
            }
        }
        if let Some(outputs) = self.complete(st) {
            if self.verify(st, &outputs) {
                self.record(st, outputs);
                return Some(false);
            }
        }
        Some(true)
    }

    /// Depth-first search below `st`; false when a limit stopped it.
    fn dfs(&mut self, st: &mut State, depth: usize) -> bool {
        if self.cands.len() <= depth {
            self.cands.push(Vec::new());
        }
        let mut buf = std::mem::take(&mut self.cands[depth]);
        self.children(st, &mut buf);
        let mut ok = true;
        for c in &buf {
            match self.enter(st, c) {
                None => {
                    st.pop();
                    ok = false;
                    break;
                }
                Some(true) => {
                    let cont = self.dfs(st, depth + 1);
                    st.pop();
                    if !cont {
                        ok = false;
                        break;
                    }
                }
                Some(false) => st.pop(),
            }
        }
        self.cands[depth] = buf;
        ok
    }
}

/// Depth of the breadth-first prefix, and the frontier size it aims for.
const FRONTIER_DEPTH: usize = 3;
const FRONTIER_TARGET: usize = 64;

/// Runs the search.
pub fn search(space: &Space<'_>, max_states: u64, deadline: Instant) -> Outcome {
    let stop = AtomicBool::new(false);
    let mut counters = Counters::default();
    let mut found: Vec<FoundOps> = Vec::new();
    let mut states: u64 = 0;

    // Breadth-first prefix, sequential and in order.
    let mut w = Worker::new(space, max_states, deadline, &stop);
    let mut frontier = vec![w.root()];
    let mut depth = 0;
    let mut buf = Vec::new();
    let mut limited = None;
    while depth < FRONTIER_DEPTH && frontier.len() < FRONTIER_TARGET && !frontier.is_empty() {
        let mut next = Vec::new();
        'states: for st in &frontier {
            let mut st = st.clone();
            w.children(&st, &mut buf);
            for c in buf.drain(..) {
                match w.enter(&mut st, &c) {
                    None => {
                        limited = Some(if w.out.timed_out { StopReason::TimeLimit } else { StopReason::StateLimit });
                        st.pop();
                        break 'states;
                    }
                    Some(true) => next.push(st.clone()),
                    Some(false) => {}
                }
                st.pop();
            }
        }
        if limited.is_some() {
            frontier.clear();
            break;
        }
        frontier = next;
        depth += 1;
    }
    counters.add(&w.out.counters);
    states += w.out.states;
    found.extend(w.out.found.drain(..).map(|(_, f)| f));

    // Parallel subtrees, in ordered batches so that a state limit truncates deterministically:
    // every subtree of a batch may use the budget left at the batch's start, and afterwards
    // the subtrees are charged in order; the first one that overruns what is left is cut at
    // its state number, which does not depend on timing.
    let batch = (16 * rayon::current_num_threads()).max(8);
    let mut stop_reason = limited.unwrap_or(StopReason::Exhausted);
    'batches: for chunk in frontier.chunks(batch) {
        if stop_reason != StopReason::Exhausted {
            break;
        }
        let cap = max_states.saturating_sub(states);
        let results: Vec<SubResult> = chunk
            .par_iter()
            .map(|st| {
                let mut w = Worker::new(space, cap, deadline, &stop);
                let mut st = st.clone();
                w.dfs(&mut st, 0);
                w.out
            })
            .collect();
        for r in results {
            counters.add(&r.counters);
            let remaining = max_states.saturating_sub(states);
            if r.timed_out {
                stop_reason = StopReason::TimeLimit;
            }
            if r.capped || r.states > remaining {
                states += remaining;
                found.extend(r.found.into_iter().filter(|(at, _)| *at <= remaining).map(|(_, f)| f));
                if stop_reason == StopReason::Exhausted {
                    stop_reason = StopReason::StateLimit;
                }
                break 'batches;
            }
            states += r.states;
            found.extend(r.found.into_iter().map(|(_, f)| f));
        }
    }
    // Canonical order: fewest ops first, then by op codes and operands.
    found.sort_by(|a, b| (a.ops.len(), a).cmp(&(b.ops.len(), b)));
    let before = found.len();
    found.dedup();
    counters.repeated = (before - found.len()) as u64;
    Outcome { found, states, stop: stop_reason, counters }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_code() -> Vec<OpCode> {
        let mut codes = vec![OpCode::Transpose, OpCode::MatMul];
        codes.extend(UnaryOp::ALL.map(OpCode::Unary));
        codes.extend(BinaryOp::ALL.map(OpCode::Binary));
        for axis in 0..MAX_RANK as u8 {
            codes.extend([ReduceOp::Sum, ReduceOp::Max, ReduceOp::Mean].map(|r| OpCode::Reduce(r, axis)));
            codes.push(OpCode::Split(axis));
        }
        codes.sort();
        codes
    }

    #[test]
    fn ranks_follow_the_order_of_codes_and_fit_a_key() {
        let codes = every_code();
        for w in codes.windows(2) {
            assert!(w[0].rank() < w[1].rank(), "{:?} {:?}", w[0], w[1]);
        }
        assert!(codes.iter().all(|c| c.rank() > 0 && c.rank() < 1 << 16));
    }

    #[test]
    fn codes_round_trip_through_ops() {
        for c in every_code() {
            assert_eq!(OpCode::of(&c.op()), Some(c));
        }
        assert_eq!(OpCode::of(&Op::Input(0)), None);
        assert_eq!(OpCode::of(&Op::Const(2.0)), None);
    }
}
