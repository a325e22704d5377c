//! Equivalence by fingerprints: graphs evaluated exactly in the ring Z_p × Z_q.
//!
//! A candidate is equivalent to the target when their outputs agree at every element on
//! random inputs, for several small random instantiations of the symbols (each drawn by
//! [`small_bindings`]: distinct values, `s | K`, non-powers of two) and independent input
//! draws. The semantics of each op is in [`field`](super::field).
//!
//! Soundness. For graphs built from `+ − · /`, sums, means, matmuls, splits and `exp` of
//! `exp`-free arguments, every op is evaluated by a ring homomorphism of its real meaning, so
//! equivalent graphs always agree (completeness), and inequivalent ones agree on a random
//! point with probability about `degree / q` per element (Schwartz–Zippel, with `exp` argued
//! as in the Mirage/LAX model), independently per trial. The limits:
//! - `max` (binary or reduction) selects by a random total order: it models associativity,
//!   commutativity and idempotence (so any split of a max-reduction is recognized), not
//!   monotonicity (`max(a + c, b + c) = max(a, b) + c` is not recognized).
//! - `log` is the homomorphism back from the `p`- to the `q`-component (`log(exp(x)) = x`,
//!   `log(a · b) = log(a) + log(b)`, so `m + log(Σ exp(s − m)) = log(Σ exp(s))` for any `m`),
//!   but of `|x|`: `log(−x) = log(x)` holds in the field, and the float check after the search
//!   tells them apart. Its result is known mod q only, and one mixed with an `exp` result
//!   (known mod p only) into a value that would know neither is an uninterpreted function of
//!   the two. What that loses, a second reading of `log` as a random function recovers: a
//!   verifier whose target takes a log accepts a candidate that either reading proves.
//! - `sqrt`, `sigmoid`, `gelu`, `exp` of an `exp`-dependent value and `log` of a
//!   `log`-dependent one are random functions of the argument's known component: consistent
//!   (equal arguments, equal results), but identities *through* them (`exp(u + v) = exp(u)
//!   exp(v)` for `exp`-dependent `u`, `sqrt(x)² = x`) are not recognized, so such equivalences
//!   are missed, never invented; two different arguments collide with probability about `1/p`.
//! - A division by a value that is zero in the field makes a trial inconclusive; it is drawn
//!   again with new inputs.

use super::field::{agree, random, Fp, Keys, LogReading, Uninterpreted, ZeroDivisor, P, Q, UNKNOWN};
use crate::eval::{self, Dense, Domain};
use crate::graph::{BinaryOp, Bindings, DimTable, Node, Op, ReduceOp, UnaryOp};
use crate::reference::Rng;
use crate::symbolic::small_bindings;

/// A dense row-major tensor of fingerprint values.
pub type FTensor = Dense<Fp>;

/// Why the field has no value for an operation.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum FieldError {
    /// A division by zero in the field: the trial is inconclusive.
    ZeroDivisor,
    /// A constant with no image in the field (infinite or NaN).
    BadConstant(f64),
}

impl From<ZeroDivisor> for FieldError {
    fn from(_: ZeroDivisor) -> Self {
        FieldError::ZeroDivisor
    }
}

/// Why an evaluation gave no fingerprint.
pub type EvalError = eval::EvalError<FieldError>;

/// The error of a division by zero, which makes a trial inconclusive rather than wrong.
pub const ZERO_DIVISOR: EvalError = eval::EvalError::Domain(FieldError::ZeroDivisor);

/// Largest tensor the evaluator materializes.
const MAX_ELEMS: usize = 1 << 26;

/// The ring Z_p × Z_q, with the uninterpreted functions and the order of `max` drawn by the
/// keys of one trial.
impl Domain for Keys {
    type Value = Fp;
    type Error = FieldError;

    fn constant(&self, c: f64) -> Result<Fp, FieldError> {
        Fp::from_f64(c).ok_or(FieldError::BadConstant(c))
    }

    fn count(&self, n: usize) -> Result<Fp, FieldError> {
        Ok(Fp::from_u64(n as u64))
    }

    fn zero(&self) -> Fp {
        Fp::ZERO
    }

    fn unary(&self, u: UnaryOp, v: Fp) -> Result<Fp, FieldError> {
        if v.is_special() {
            // exp(-inf) = 0 is the one value a masked element keeps; everything else of -inf
            // (its negation is +inf, its log undefined) is left undefined.
            return Ok(if v.is_neg_inf() && u == UnaryOp::Exp { Fp::ZERO } else { Fp::POISON });
        }
        Ok(match u {
            UnaryOp::Exp => self.exp(v),
            UnaryOp::Log => self.log(v)?,
            UnaryOp::Sqrt => self.apply(Uninterpreted::Sqrt, v),
            UnaryOp::Rsqrt => self.apply(Uninterpreted::Sqrt, v).inv()?,
            UnaryOp::Square => v * v,
            UnaryOp::Recip => v.inv()?,
            UnaryOp::Silu => v * self.apply(Uninterpreted::Sigmoid, v),
            UnaryOp::Sigmoid => self.apply(Uninterpreted::Sigmoid, v),
            UnaryOp::Gelu => self.apply(Uninterpreted::Gelu, v),
            UnaryOp::Neg => -v,
        })
    }

    fn binary(&self, op: BinaryOp, a: Fp, c: Fp) -> Result<Fp, FieldError> {
        if a.is_special() || c.is_special() {
            return Ok(special_binary(op, a, c));
        }
        Ok(match op {
            BinaryOp::Add => a + c,
            BinaryOp::Sub => a - c,
            BinaryOp::Mul => a * c,
            // 0 / 0 is 0 in the language (a row with nothing unmasked); any other quotient by
            // zero makes the trial inconclusive.
            BinaryOp::Div if a.is_zero() && c.is_zero() => Fp::ZERO,
            BinaryOp::Div => a.checked_div(c)?,
            BinaryOp::Max => self.max(a, c),
        })
    }

    fn mul_add(&self, acc: Fp, x: Fp, y: Fp) -> Fp {
        if x.is_special() || y.is_special() {
            return Fp::POISON;
        }
        if acc.is_special() {
            return acc;
        }
        acc + x * y
    }

    fn neg_inf(&self) -> Fp {
        Fp::NEG_INF
    }

    /// Sums of products reduced once per element rather than once per term: the ring's
    /// arithmetic is exact, so where the reductions happen does not change the value. An
    /// element is undefined when any of its terms has a sentinel operand (its row of `a` or
    /// column of `b` holds one), and its `q`-component unknown when any term's is, as
    /// [`Domain::mul_add`] has it. Matmuls are most of the time the search spends checking.
    /// An operand with an unknown `p`-component takes the element loop instead.
    fn matmul_fast(&self, a: &[Fp], b: &[Fp], m: usize, k: usize, n: usize) -> Option<Vec<Fp>> {
        // Operands known mod q only are rare (results of `log`) and may mix with operands known
        // mod p only into products known mod neither, which the element loop handles.
        if a.iter().chain(b).any(|x| !x.p_known()) {
            return None;
        }
        let mut col_special = vec![false; n];
        let mut col_unknown = vec![false; n];
        for row in b.chunks_exact(n.max(1)).take(k) {
            for ((s, u), y) in col_special.iter_mut().zip(col_unknown.iter_mut()).zip(row) {
                *s |= y.is_special();
                *u |= !y.q_known();
            }
        }
        let (mut sum_p, mut sum_q) = (vec![0u128; n], vec![0u128; n]);
        let mut out = Vec::with_capacity(m * n);
        for i in 0..m {
            let row = &a[i * k..(i + 1) * k];
            let row_special = row.iter().any(|x| x.is_special());
            let row_unknown = row.iter().any(|x| !x.q_known());
            sum_p.fill(0);
            sum_q.fill(0);
            if !row_special {
                for (p, x) in row.iter().enumerate() {
                    // Each product of two u32s fits a u64 (a sentinel or an unknown `q` is
                    // near u32::MAX, and its sums are never used); a u128 holds any number.
                    let (xp, xq) = (u64::from(x.p), u64::from(x.q));
                    for ((sp, sq), y) in sum_p.iter_mut().zip(sum_q.iter_mut()).zip(&b[p * n..(p + 1) * n]) {
                        *sp += u128::from(xp * u64::from(y.p));
                        *sq += u128::from(xq * u64::from(y.q));
                    }
                }
            }
            for j in 0..n {
                out.push(if row_special || col_special[j] {
                    Fp::POISON
                } else {
                    let q = if row_unknown || col_unknown[j] { UNKNOWN } else { reduce(sum_q[j], Q) };
                    Fp { p: reduce(sum_p[j], P), q }
                });
            }
        }
        Some(out)
    }

    fn reduce_start(&self, _: ReduceOp) -> Option<Fp> {
        // A max has no identity under a random order; sums start from their first term too.
        None
    }
}

/// `s mod m` for a modulus below 2^31, in u64 arithmetic: `s = hi · 2^64 + lo`, and the
/// residues of `hi`, of `2^64` and of `lo` are each below 2^31, so their combination fits.
fn reduce(s: u128, m: u32) -> u32 {
    let m = u64::from(m);
    let (hi, lo) = ((s >> 64) as u64, s as u64);
    let two_64 = (u64::MAX % m + 1) % m;
    ((hi % m * two_64 % m + lo % m) % m) as u32
}

/// An op of two operands of which at least one is `-inf` or undefined, as the extended reals
/// define it where they can (see [`field`](super::field)).
fn special_binary(op: BinaryOp, a: Fp, c: Fp) -> Fp {
    if a.is_poison() || c.is_poison() {
        return Fp::POISON;
    }
    match op {
        // -inf + x = -inf for x finite or -inf.
        BinaryOp::Add => Fp::NEG_INF,
        // -inf - x = -inf for finite x; x - (-inf) is +inf and -inf - (-inf) is NaN.
        BinaryOp::Sub if a.is_neg_inf() && !c.is_neg_inf() => Fp::NEG_INF,
        // -inf is the identity of max.
        BinaryOp::Max if a.is_neg_inf() => c,
        BinaryOp::Max => a,
        _ => Fp::POISON,
    }
}

/// Evaluates every node of `nodes` (an arena in topological order whose leaves are
/// `Op::Input(k)` → `inputs[k]` and constants) into `values`, which is cleared and reused.
pub fn eval_into(
    nodes: &[Node],
    table: &DimTable,
    bindings: &Bindings,
    inputs: &[FTensor],
    keys: &Keys,
    values: &mut Vec<FTensor>,
) -> Result<(), EvalError> {
    eval::eval_into(keys, nodes, table, bindings, inputs, MAX_ELEMS, values)
}

/// Random inputs for the leaves `Op::Input(k)` of `nodes` at `bindings`.
pub fn random_inputs(nodes: &[Node], n_inputs: usize, bindings: &Bindings, rng: &mut Rng) -> Vec<FTensor> {
    let mut out: Vec<FTensor> = vec![Dense::default(); n_inputs];
    for node in nodes {
        if let Op::Input(k) = node.op {
            let shape = bindings.extents(&node.shape);
            let n: usize = shape.iter().product();
            out[k as usize] = FTensor { shape, data: (0..n).map(|_| random(rng)).collect() };
        }
    }
    out
}

/// True when two output tensors agree: the same elements after dropping leading unit axes.
pub fn outputs_agree(a: &FTensor, b: &FTensor) -> bool {
    let squeeze = |s: &[usize]| -> Vec<usize> {
        let first = s.iter().position(|&d| d != 1).unwrap_or(s.len());
        s[first..].to_vec()
    };
    squeeze(&a.shape) == squeeze(&b.shape)
        && a.data.len() == b.data.len()
        && a.data.iter().zip(&b.data).all(|(x, y)| agree(*x, *y))
}

/// The outcome of a fingerprint comparison.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Verdict {
    /// Every trial agreed.
    Equivalent,
    /// Some trial disagreed.
    Different,
    /// No conclusive draw was found for some trial.
    Inconclusive,
}

/// One instantiation: the bindings, the uninterpreted-function keys and the seed of its
/// input draws.
#[derive(Clone, Debug)]
struct Trial {
    bindings: Bindings,
    keys: Keys,
    seed: u64,
    /// The first conclusive draw for the target, its inputs and its outputs.
    draw: u64,
    inputs: Vec<FTensor>,
    outputs: Vec<FTensor>,
}

/// Draws per trial before giving up on a zero divisor.
const MAX_DRAWS: u64 = 4;

/// The fingerprint verifier of one target: fixed instantiations and target fingerprints,
/// shared read-only by all workers; each worker brings its own [`Scratch`].
#[derive(Clone, Debug)]
pub struct Verifier {
    target: Vec<Node>,
    /// The dim table every arena's shapes refer to.
    table: DimTable,
    target_outputs: Vec<usize>,
    n_inputs: usize,
    trials: Vec<Trial>,
    /// The same trials with `log` read as an uninterpreted function, when the target takes a
    /// log: a candidate the first reading rejects is compared again under this one.
    opaque_log: Vec<Trial>,
}

/// A worker's evaluation buffers.
#[derive(Default, Debug)]
pub struct Scratch {
    values: Vec<FTensor>,
    target_values: Vec<FTensor>,
}

/// Elements over all target nodes that one trial may instantiate. Small instantiations of
/// low-rank kernels stay far below it; a rank-6 tensor of distinct small extents can pass it
/// (up to 6·7·8·9·10·11 elements), and then every candidate's evaluation would too.
const TRIAL_MAX_ELEMS: usize = 1 << 20;

/// Instantiations drawn before settling for the smallest one seen.
const BINDING_DRAWS: usize = 16;

/// Elements of all nodes of `nodes` at `bindings`, saturating.
fn total_elements(nodes: &[Node], bindings: &Bindings) -> usize {
    nodes.iter().fold(0usize, |acc, n| acc.saturating_add(bindings.extents(&n.shape).iter().product::<usize>()))
}

/// A [`small_bindings`] draw whose target instantiation holds at most [`TRIAL_MAX_ELEMS`]
/// elements, or the smallest of [`BINDING_DRAWS`] draws. A draw within the budget is kept at
/// once, so kernels that always fit see exactly the instantiations they saw without a budget.
fn bounded_bindings(target: &[Node], table: &DimTable, rng: &mut Rng) -> Bindings {
    let mut best = small_bindings(table, rng);
    let mut best_size = total_elements(target, &best);
    for _ in 1..BINDING_DRAWS {
        if best_size <= TRIAL_MAX_ELEMS {
            break;
        }
        let b = small_bindings(table, rng);
        let size = total_elements(target, &b);
        if size < best_size {
            (best, best_size) = (b, size);
        }
    }
    best
}

fn draw_seed(seed: u64, draw: u64) -> u64 {
    super::field::mix(seed, 0xd4a3 + draw)
}

impl Verifier {
    /// Draws `trials` small instantiations of `table` (which must contain every split variable a
    /// candidate may use) and fingerprints the target on each. `target` is an arena whose
    /// leaves are `Op::Input(k)` for `k < n_inputs` and constants.
    pub fn new(
        target: Vec<Node>,
        target_outputs: Vec<usize>,
        n_inputs: usize,
        table: &DimTable,
        trials: usize,
        seed: u64,
    ) -> Result<Verifier, EvalError> {
        let mut rng = Rng::new(seed);
        let mut out = Vec::with_capacity(trials);
        let mut scratch = Vec::new();
        for t in 0..trials {
            let bindings = bounded_bindings(&target, table, &mut rng);
            let keys = Keys::new(super::field::mix(seed, 0x7e1a1 + t as u64));
            let trial_seed = rng.next_u64();
            let mut found = None;
            for draw in 0..MAX_DRAWS {
                let mut r = Rng::new(draw_seed(trial_seed, draw));
                let inputs = random_inputs(&target, n_inputs, &bindings, &mut r);
                match eval_into(&target, table, &bindings, &inputs, &keys, &mut scratch) {
                    Ok(()) => {
                        let outputs = target_outputs.iter().map(|&o| scratch[o].clone()).collect();
                        found = Some((draw, inputs, outputs));
                        break;
                    }
                    Err(ZERO_DIVISOR) => continue,
                    Err(e) => return Err(e),
                }
            }
            let Some((draw, inputs, outputs)) = found else { return Err(ZERO_DIVISOR) };
            out.push(Trial { bindings, keys, seed: trial_seed, draw, inputs, outputs });
        }
        let mut opaque_log = Vec::new();
        if target.iter().any(|n| n.op == Op::Unary(UnaryOp::Log)) {
            for t in &out {
                let keys = t.keys.reading_log(LogReading::Opaque);
                // The other reading divides as the first does, but for a zero divisor in its
                // uninterpreted values: then this reading is left out.
                if eval_into(&target, table, &t.bindings, &t.inputs, &keys, &mut scratch).is_err() {
                    opaque_log.clear();
                    break;
                }
                let outputs = target_outputs.iter().map(|&o| scratch[o].clone()).collect();
                opaque_log.push(Trial { keys, outputs, ..t.clone() });
            }
        }
        Ok(Verifier { target, table: table.clone(), target_outputs, n_inputs, trials: out, opaque_log })
    }

    /// Number of trials.
    pub fn trials(&self) -> usize {
        self.trials.len()
    }

    /// Compares a candidate arena (same leaves as the target) whose outputs are the nodes
    /// `outputs`, matched in order with the target's outputs.
    /// Under the homomorphic reading of `log` first and, where that finds a difference and
    /// the target takes a log, under the uninterpreted reading.
    pub fn check(&self, candidate: &[Node], outputs: &[usize], scratch: &mut Scratch) -> Verdict {
        let first = self.check_trials(&self.trials, candidate, outputs, scratch);
        if first == Verdict::Different
            && !self.opaque_log.is_empty()
            && self.check_trials(&self.opaque_log, candidate, outputs, scratch) == Verdict::Equivalent
        {
            return Verdict::Equivalent;
        }
        first
    }

    fn check_trials(&self, trials: &[Trial], candidate: &[Node], outputs: &[usize], scratch: &mut Scratch) -> Verdict {
        for trial in trials {
            match self.check_trial(trial, candidate, outputs, scratch) {
                Verdict::Equivalent => {}
                other => return other,
            }
        }
        Verdict::Equivalent
    }

    fn check_trial(&self, trial: &Trial, candidate: &[Node], outputs: &[usize], scratch: &mut Scratch) -> Verdict {
        match eval_into(candidate, &self.table, &trial.bindings, &trial.inputs, &trial.keys, &mut scratch.values) {
            Ok(()) => {
                return if outputs.iter().zip(&trial.outputs).all(|(&o, t)| outputs_agree(&scratch.values[o], t)) {
                    Verdict::Equivalent
                } else {
                    Verdict::Different
                };
            }
            Err(ZERO_DIVISOR) => {}
            Err(_) => return Verdict::Different,
        }
        // The stored draw divides by zero in the candidate: draw again, for both graphs.
        for draw in trial.draw + 1..trial.draw + MAX_DRAWS {
            let mut r = Rng::new(draw_seed(trial.seed, draw));
            let inputs = random_inputs(&self.target, self.n_inputs, &trial.bindings, &mut r);
            if eval_into(&self.target, &self.table, &trial.bindings, &inputs, &trial.keys, &mut scratch.target_values)
                .is_err()
            {
                continue;
            }
            match eval_into(candidate, &self.table, &trial.bindings, &inputs, &trial.keys, &mut scratch.values) {
                Ok(()) => {
                    let ok = outputs
                        .iter()
                        .zip(&self.target_outputs)
                        .all(|(&o, &t)| outputs_agree(&scratch.values[o], &scratch.target_values[t]));
                    return if ok { Verdict::Equivalent } else { Verdict::Different };
                }
                Err(ZERO_DIVISOR) => continue,
                Err(_) => return Verdict::Different,
            }
        }
        Verdict::Inconclusive
    }
}

/// Compares two graphs by fingerprints on `trials` small instantiations. `candidate` must be
/// built over `target`'s dim table (extended by the split variables it creates) with the same
/// inputs; outputs are matched in order.
pub fn equivalent(
    target: &crate::graph::Graph,
    candidate: &crate::graph::Graph,
    trials: usize,
    seed: u64,
) -> Result<Verdict, EvalError> {
    let prefix = target.dims.iter().zip(candidate.dims.iter()).all(|((_, a), (_, b))| a == b);
    assert!(prefix && candidate.dims.len() >= target.dims.len(), "the candidate's dim table must extend the target's");
    let verifier = Verifier::new(
        target.nodes.clone(),
        target.outputs.iter().map(|o| o.node.index()).collect(),
        target.inputs.len(),
        &candidate.dims,
        trials,
        seed,
    )?;
    let outputs: Vec<usize> = candidate.outputs.iter().map(|o| o.node.index()).collect();
    Ok(verifier.check(&candidate.nodes, &outputs, &mut Scratch::default()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbolic::symbolize;

    #[test]
    fn the_fast_matmul_is_the_element_loop() {
        let mut rng = Rng::new(7);
        let keys = Keys::new(3);
        for (m, k, n, odd) in [(1, 1, 1, 0), (4, 9, 6, 0), (5, 33, 7, 3), (8, 64, 3, 5), (3, 0, 2, 0)] {
            // Random ring values with `odd` sentinels and unknown `q`-components scattered.
            let mut draw = |len: usize| -> Vec<Fp> {
                let mut v: Vec<Fp> = (0..len).map(|_| random(&mut rng)).collect();
                for t in 0..odd.min(len) {
                    let at = rng.below(len as u64) as usize;
                    v[at] = match t % 3 {
                        0 => Fp { q: UNKNOWN, ..v[at] },
                        1 => Fp::NEG_INF,
                        _ => Fp::POISON,
                    };
                }
                v
            };
            let (a, b) = (draw(m * k), draw(k * n));
            let fast = keys.matmul_fast(&a, &b, m, k, n).expect("the ring has a fast matmul");
            for i in 0..m {
                for j in 0..n {
                    let slow = (0..k).fold(Fp::ZERO, |acc, p| keys.mul_add(acc, a[i * k + p], b[p * n + j]));
                    assert_eq!(fast[i * n + j], slow, "{m}x{k}x{n} at ({i}, {j})");
                }
            }
        }
        // An operand known mod q only (a log) leaves the product to the element loop.
        let a: Vec<Fp> = (0..6).map(|_| random(&mut rng)).collect();
        let mut b: Vec<Fp> = (0..6).map(|_| random(&mut rng)).collect();
        b[4] = keys.log(b[4]).expect("nonzero");
        assert_eq!(keys.matmul_fast(&a, &b, 2, 3, 2), None);
    }

    #[test]
    fn the_instantiations_of_a_rank_6_target_stay_within_the_element_budget() {
        let src = "kernels:\n  - name: k\n    dims: { a: 3, b: 4, c: 5, d: 6, e: 7, f: 64 }\n    \
                   inputs: { x: \"f32[a, b, c, d, e, f]\" }\n    outputs: { y: \"f32[a, b, c, d, e, 1]\" }\n    \
                   body: |\n      y = sum(exp(x) * x, axis=-1)\n";
        let module = crate::front::check_source(src.as_bytes()).expect("valid");
        let target = symbolize(&module.kernels[0].1).graph;
        let outputs = target.outputs.iter().map(|o| o.node.index()).collect();
        let v = Verifier::new(target.nodes.clone(), outputs, 1, &target.dims, 8, 5).expect("fingerprints");
        // Six distinct extents drawn unbounded reach 6·7·8·9·10·11 elements per node.
        for trial in &v.trials {
            let total = total_elements(&target.nodes, &trial.bindings);
            assert!(total <= TRIAL_MAX_ELEMS, "{total} elements");
            let mut extents: Vec<u64> = trial.bindings.values.clone();
            extents.sort_unstable();
            extents.dedup();
            assert_eq!(extents.len(), trial.bindings.values.len(), "extents stay distinct: {extents:?}");
        }
    }
}
