//! The final checks of a found graph, after the search: one fingerprint comparison at the
//! declared shapes and one floating-point comparison against the f64 reference.
//!
//! The search proves equivalence on small instantiations only; the check at the declared
//! shapes rules out anything specific to small extents, and the float check ties the
//! fingerprint semantics back to the executable specification.

use super::field::{Keys, LogReading};
use super::fingerprint::{eval_into, outputs_agree, random_inputs, FTensor, ZERO_DIVISOR};
use crate::graph::{Bindings, Dim, DimKind, DimTable, Graph, Op, UnaryOp, ValidGraph};
use crate::reference::{self, max_rel_err, InputScale, Rng, Tensor};

/// The default bound on the elements (over all nodes of target and candidate together) that
/// the check at the declared shapes materializes: 2^26 values of 8 bytes, 512 MiB.
pub const FULL_SHAPE_MAX_ELEMS: u64 = 1 << 26;
/// The default bound on its multiply-adds (about a second of work per graph).
pub const FULL_SHAPE_MAX_MACS: u64 = 1 << 30;
/// The default bound on the multiply-adds of all declared-shape checks of one search.
pub const FULL_SHAPE_BUDGET_MACS: u64 = 1 << 30;
/// Relative tolerance of the float check.
pub const FLOAT_TOLERANCE: f64 = 1e-9;

/// The outcome of one check.
#[derive(Clone, Debug, PartialEq)]
pub enum Check {
    /// Passed.
    Passed,
    /// Failed, with the reason.
    Failed(String),
    /// Not run, with the reason.
    Skipped(String),
}

impl Check {
    /// True unless the check failed.
    pub fn ok(&self) -> bool {
        !matches!(self, Check::Failed(_))
    }
}

/// The final checks of one graph.
#[derive(Clone, Debug, PartialEq)]
pub struct FinalChecks {
    /// Fingerprints at the declared shapes.
    pub full_shape: Check,
    /// f64 comparison with the reference at a moderate instantiation.
    pub float: Check,
    /// The float check's error (reference metric `max_rel_err`).
    pub float_max_rel_err: Option<f64>,
}

impl FinalChecks {
    /// Both checks passed or were skipped.
    pub fn ok(&self) -> bool {
        self.full_shape.ok() && self.float.ok()
    }
}

/// What one `log` costs the fingerprints, in multiply-adds: a discrete log takes about a
/// thousand giant steps, each a modular product and a probe of a 16 MiB table (about 10 us,
/// where a multiply-add of the matmul loop takes about a nanosecond).
const LOG_MACS: u64 = 1 << 13;

/// Elements and multiply-adds of evaluating `g` at `b`, a log counted as [`LOG_MACS`].
pub(super) fn cost(g: &Graph, b: &Bindings) -> (u64, u64) {
    let mut elems = 0u64;
    let mut macs = 0u64;
    for n in &g.nodes {
        let e: u64 = b.extents(&n.shape).iter().map(|&x| x as u64).product();
        elems = elems.saturating_add(e);
        if n.op == Op::MatMul {
            let a = g.shape(n.args[0]);
            let k = b.extent(a[a.len() - 1]) as u64;
            macs = macs.saturating_add(e.saturating_mul(k));
        } else if n.op == Op::Unary(UnaryOp::Log) {
            macs = macs.saturating_add(e.saturating_mul(LOG_MACS));
        } else {
            macs = macs.saturating_add(e);
        }
    }
    (elems, macs)
}

/// Bindings of a found graph's table: plain symbols take `plain[v]`; each split count takes
/// the smallest divisor of its axis from `counts`, or the reason there is none.
fn bindings_with_splits(table: &DimTable, plain: &[u64], counts: &[u64]) -> Result<Bindings, String> {
    let mut values = vec![0u64; table.len()];
    for (v, d) in table.iter() {
        if d.kind == DimKind::Plain {
            values[v.index()] = plain[v.index()];
        }
    }
    for (v, d) in table.iter() {
        if let DimKind::SplitCount { of } = d.kind {
            let k = values[of.index()];
            let s = counts.iter().copied().find(|s| k % s == 0 && *s < k).ok_or_else(|| {
                format!("`{}` = {k} has no split count among {counts:?} that divides it", table.get(of).name)
            })?;
            values[v.index()] = s;
        }
    }
    for (v, d) in table.iter() {
        if let DimKind::SplitChunk { of, count } = d.kind {
            values[v.index()] = values[of.index()] / values[count.index()];
        }
    }
    Ok(Bindings { values })
}

/// The target's fingerprint at the declared shapes, computed once per search.
pub(super) struct FullShape {
    plain: Vec<u64>,
    max_elems: u64,
    max_macs: u64,
    keys: Keys,
    inputs: Vec<FTensor>,
    outputs: Result<Vec<FTensor>, String>,
    /// The target's outputs with `log` read as an uninterpreted function, when it takes a log
    /// (see [`LogReading`]).
    opaque_log: Option<(Keys, Vec<FTensor>)>,
}

impl FullShape {
    /// Prepares the check: `plain[v]` is the declared extent of symbol `v`.
    pub(super) fn new(
        target: &ValidGraph,
        plain: Vec<u64>,
        seed: u64,
        max_elems: u64,
        max_macs: u64,
        budget: u64,
    ) -> FullShape {
        let keys = Keys::new(seed ^ 0xf011);
        let bindings = Bindings { values: plain.clone() };
        let (elems, macs) = cost(target, &bindings);
        if elems > max_elems / 2 || macs > max_macs / 2 || macs.saturating_mul(2) > budget {
            let why = format!(
                "the declared shapes need {elems} elements and {macs} multiply-adds per graph \
                 (bounds {max_elems} and {max_macs} for target and candidate together, {budget} per search)"
            );
            return FullShape {
                plain,
                max_elems,
                max_macs,
                keys,
                inputs: Vec::new(),
                outputs: Err(why),
                opaque_log: None,
            };
        }
        let mut rng = Rng::new(seed ^ 0xf0f0);
        let inputs = random_inputs(&target.nodes, target.inputs.len(), &bindings, &mut rng);
        let mut values = Vec::new();
        let outputs = match eval_into(&target.nodes, &target.dims, &bindings, &inputs, &keys, &mut values) {
            Ok(()) => Ok(target.outputs.iter().map(|o| values[o.node.index()].clone()).collect()),
            Err(e) => Err(format!("the target cannot be fingerprinted at the declared shapes: {e:?}")),
        };
        let opaque_log = if outputs.is_ok() && target.nodes.iter().any(|n| n.op == Op::Unary(UnaryOp::Log)) {
            let keys = keys.reading_log(LogReading::Opaque);
            eval_into(&target.nodes, &target.dims, &bindings, &inputs, &keys, &mut values)
                .ok()
                .map(|()| (keys, target.outputs.iter().map(|o| values[o.node.index()].clone()).collect()))
        } else {
            None
        };
        FullShape { plain, max_elems, max_macs, keys, inputs, outputs, opaque_log }
    }

    fn bindings(&self, found: &ValidGraph) -> Result<Bindings, String> {
        let mut plain = self.plain.clone();
        plain.resize(found.dims.len(), 0);
        bindings_with_splits(&found.dims, &plain, &[2, 3, 4, 5, 6, 7, 8, 16, 32])
    }

    /// The multiply-adds of checking `found` (target and candidate), when it can be checked.
    pub(super) fn work(&self, found: &ValidGraph) -> Option<u64> {
        self.outputs.as_ref().ok()?;
        let b = self.bindings(found).ok()?;
        let (elems, macs) = cost(found, &b);
        (elems <= self.max_elems / 2 && macs <= self.max_macs / 2).then_some(macs.saturating_mul(2))
    }

    /// Compares a found graph with the target at the declared shapes; `within_budget` is false
    /// when the search's total budget for these checks is spent.
    pub(super) fn check(&self, found: &ValidGraph, within_budget: bool) -> Check {
        let target = match &self.outputs {
            Ok(t) => t,
            Err(why) => return Check::Skipped(why.clone()),
        };
        let bindings = match self.bindings(found) {
            Ok(b) => b,
            Err(why) => return Check::Skipped(why),
        };
        let (elems, macs) = cost(found, &bindings);
        if elems > self.max_elems / 2 || macs > self.max_macs / 2 {
            return Check::Skipped(format!("the graph needs {elems} elements and {macs} multiply-adds"));
        }
        if !within_budget {
            return Check::Skipped("the search's budget of multiply-adds for declared-shape checks is spent".into());
        }
        let mut values = Vec::new();
        // Under the homomorphic reading of `log`, then, if that differs, the uninterpreted one.
        let agrees = |keys: &Keys, target: &[FTensor], values: &mut Vec<FTensor>| {
            eval_into(&found.nodes, &found.dims, &bindings, &self.inputs, keys, values)
                .map(|()| found.outputs.iter().zip(target).all(|(o, t)| outputs_agree(&values[o.node.index()], t)))
        };
        match agrees(&self.keys, target, &mut values) {
            Ok(ok) => {
                let ok = ok
                    || self
                        .opaque_log
                        .as_ref()
                        .is_some_and(|(keys, target)| agrees(keys, target, &mut values) == Ok(true));
                if ok {
                    Check::Passed
                } else {
                    Check::Failed("fingerprints differ at the declared shapes".into())
                }
            }
            Err(ZERO_DIVISOR) => Check::Skipped("a division by zero in the field (inconclusive)".into()),
            Err(e) => Check::Failed(format!("cannot evaluate: {e:?}")),
        }
    }
}

/// Elements the float check may instantiate over all of the target's nodes (16 bytes each in
/// the reference's number type): 64 MiB.
pub const FLOAT_CHECK_MAX_ELEMS: u64 = 1 << 22;

/// Moderate extents for the float check: symbols that may be split get distinct multiples of
/// 6 (so split counts 2 and 3 divide them), the others distinct odd values from `first_odd`;
/// none is a power of two.
pub(super) fn moderate_plain(table: &DimTable, reducible: &[bool], first_odd: u64) -> Vec<u64> {
    let mut odd = (first_odd..).step_by(2).filter(|v: &u64| !v.is_power_of_two());
    let mut sixes = (2..).map(|k: u64| 6 * k);
    table
        .iter()
        .map(|(v, d)| {
            if d.kind != DimKind::Plain {
                0
            } else if reducible.get(v.index()).copied().unwrap_or(false) {
                sixes.next().unwrap_or(12)
            } else {
                odd.next().unwrap_or(5)
            }
        })
        .collect()
}

/// The target's reference outputs at a moderate instantiation, computed once per search.
pub(super) struct FloatCheck {
    plain: Vec<u64>,
    inputs: Vec<Tensor>,
    outputs: Result<Vec<Tensor>, String>,
    /// When the target is not finite on normal inputs (a log of a value of either sign), the
    /// check runs on positive ones; these are the normal inputs and the target's outputs on
    /// them. A candidate must also agree with the target wherever the target is defined on
    /// them: the fingerprints' log is `log |x|`, and on positive inputs alone
    /// `log(a) − log(b)` passes for `log(a / b)`, which is not a NaN where both are negative.
    signed: Option<(Vec<Tensor>, Vec<Tensor>)>,
}

fn positive_inputs(g: &ValidGraph, b: &Bindings, seed: u64) -> Vec<Tensor> {
    let mut rng = Rng::new(seed);
    g.inputs
        .iter()
        .map(|i| {
            let shape = b.extents(&i.decl.shape);
            let n: usize = shape.iter().product();
            let data = (0..n).map(|_| i.decl.dtype.round(0.5 + rng.uniform())).collect();
            Tensor { shape, data }
        })
        .collect()
}

impl FloatCheck {
    /// Evaluates the target at `plain` on random inputs (normal; positive when the target is
    /// not finite on normal inputs, e.g. a `log`).
    pub(super) fn new(target: &ValidGraph, reducible: &[bool], seed: u64) -> FloatCheck {
        // The moderate extents, or smaller ones when a high-rank target would not fit the
        // budget; past even those the check is skipped, and says why.
        let elems = |plain: &[u64]| -> u64 {
            target
                .nodes
                .iter()
                .map(|n| {
                    n.shape
                        .iter()
                        .map(|d| match d {
                            Dim::One => 1,
                            Dim::Var(v) => plain[v.index()].max(1),
                        })
                        .fold(1u64, u64::saturating_mul)
                })
                .fold(0u64, u64::saturating_add)
        };
        let mut plain = moderate_plain(&target.dims, reducible, 5);
        if elems(&plain) > FLOAT_CHECK_MAX_ELEMS {
            plain = moderate_plain(&target.dims, reducible, 3);
        }
        let need = elems(&plain);
        if need > FLOAT_CHECK_MAX_ELEMS {
            let why = format!("the float check would need {need} elements (the budget is {FLOAT_CHECK_MAX_ELEMS})");
            return FloatCheck { plain, inputs: Vec::new(), outputs: Err(why), signed: None };
        }
        let bindings = Bindings { values: plain.clone() };
        let finite = |o: &[Tensor]| o.iter().all(|t| t.data.iter().all(|x| x.is_finite()));
        let mut inputs = reference::random_inputs(target, &bindings, seed, &InputScale::default());
        let mut outputs = reference::eval(target, &bindings, &inputs).map_err(|e| e.to_string());
        let mut signed = None;
        if let Ok(o) = &outputs {
            if !finite(o) {
                let positive = positive_inputs(target, &bindings, seed);
                signed = Some((std::mem::replace(&mut inputs, positive), o.clone()));
                outputs = reference::eval(target, &bindings, &inputs).map_err(|e| e.to_string());
            }
        }
        if matches!(&outputs, Ok(o) if !finite(o)) {
            outputs = Err("the target is not finite on random inputs".into());
        }
        FloatCheck { plain, inputs, outputs, signed }
    }

    /// Compares a found graph with the target; returns the check and the error.
    pub(super) fn check(&self, found: &ValidGraph) -> (Check, Option<f64>) {
        let target = match &self.outputs {
            Ok(t) => t,
            Err(why) => return (Check::Skipped(why.clone()), None),
        };
        let mut plain = self.plain.clone();
        plain.resize(found.dims.len(), 0);
        let bindings = match bindings_with_splits(&found.dims, &plain, &[3, 2]) {
            Ok(b) => b,
            Err(why) => return (Check::Skipped(why), None),
        };
        let got = match reference::eval(found, &bindings, &self.inputs) {
            Ok(g) => g,
            Err(e) => return (Check::Failed(e.to_string()), None),
        };
        let mut worst: f64 = 0.0;
        for (g, t) in got.iter().zip(target) {
            if g.data.len() != t.data.len() {
                return (Check::Failed("output sizes differ".into()), None);
            }
            worst = worst.max(max_rel_err(&g.data, &t.data));
        }
        if worst > FLOAT_TOLERANCE {
            return (Check::Failed(format!("max_rel_err {worst:e} exceeds {FLOAT_TOLERANCE:e}")), Some(worst));
        }
        if let Some((inputs, target)) = &self.signed {
            let got = match reference::eval(found, &bindings, inputs) {
                Ok(g) => g,
                Err(e) => return (Check::Failed(e.to_string()), None),
            };
            // Only where the target is defined: a candidate may be defined where it is not.
            let mut signed_worst: f64 = 0.0;
            for (g, t) in got.iter().zip(target) {
                let (got, want): (Vec<f64>, Vec<f64>) =
                    g.data.iter().zip(&t.data).filter(|(_, w)| !w.is_nan()).map(|(g, w)| (*g, *w)).unzip();
                signed_worst = signed_worst.max(max_rel_err(&got, &want));
            }
            // A NaN error (a NaN where the target is defined) fails too.
            if signed_worst.is_nan() || signed_worst > FLOAT_TOLERANCE {
                return (
                    Check::Failed(format!(
                        "on inputs of both signs, where the target is defined: max_rel_err {signed_worst:e} exceeds \
                         {FLOAT_TOLERANCE:e}"
                    )),
                    Some(signed_worst),
                );
            }
        }
        (Check::Passed, Some(worst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(body: &str) -> ValidGraph {
        let yaml = format!(
            "kernels:\n  - name: k\n    dims: {{ t: 6, v: 10 }}\n    inputs: {{ a: \"f32[t, v]\", b: \"f32[t, v]\" }}\n    \
             outputs: {{ y: \"f32[t, v]\" }}\n    body: |\n      {body}\n"
        );
        let module = crate::front::check_source(yaml.as_bytes()).expect("checks");
        module.kernels.into_iter().next().expect("a kernel").1
    }

    #[test]
    fn a_log_split_over_operands_of_either_sign_fails_the_float_check() {
        // `log(a / b)` is not finite on normal inputs, so the check runs on positive ones, where
        // `log(a) − log(b)` agrees; on inputs of both signs it is a NaN wherever a and b are
        // both negative, where the target is defined.
        let target = graph("y = log(a / b)");
        let check = FloatCheck::new(&target, &[false, false], 7);
        assert_eq!(check.check(&target).0, Check::Passed);
        assert_eq!(check.check(&graph("y = log(a / b) * 1.0")).0, Check::Passed);
        let (split, err) = check.check(&graph("y = log(a) - log(b)"));
        assert!(
            matches!(&split, Check::Failed(why) if why.starts_with("on inputs of both signs")),
            "{split:?} {err:?}"
        );
        // The same identity over values a log keeps positive is accepted.
        let target = graph("y = log(exp(a) / exp(b))");
        let check = FloatCheck::new(&target, &[false, false], 7);
        assert_eq!(check.check(&graph("y = a - b")).0, Check::Passed);
    }
}
