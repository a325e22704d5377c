//! The algebraic axioms the abstract-expression check saturates with.
//!
//! They are generic identities of real arithmetic and of sums over index sets; none mentions a
//! particular kernel. The conditional ones consult the free-atoms analysis, which keeps them
//! sound (a factor may leave a sum only if it does not depend on the summed indices) and keeps
//! the e-graph small (a sum distributes over `+` only when both terms depend on its indices).
//! Index-set unions and splits are computed by custom appliers, which is how the split
//! factorization `sum(K, x) = sum(s_K, sum(K/s_K, x))` arises from `K = {K_hi, K_lo}`.

use egg::{rewrite as rw, Applier, EGraph, Id, PatternAst, Rewrite, Subst, Symbol, Var};

use super::atoms::AtomMask;
use super::term::{AtomSet, FreeAtoms, Term};

type Rule = Rewrite<Term, FreeAtoms>;

/// The largest index set whose splits are enumerated (2^n − 2 ways).
const MAX_SPLIT_SET: u32 = 6;

fn var(name: &str) -> Var {
    name.parse().expect("pattern variables are well-formed")
}

fn set_of(eg: &EGraph<Term, FreeAtoms>, subst: &Subst, v: &str) -> Option<AtomMask> {
    eg[subst[var(v)]].data.set
}

fn free_of(eg: &EGraph<Term, FreeAtoms>, subst: &Subst, v: &str) -> AtomMask {
    eg[subst[var(v)]].data.free
}

/// `?A ∩ free(?b) = ∅`: `?b` is constant along the indices of `?A`.
fn disjoint(a: &'static str, b: &'static str) -> impl Fn(&mut EGraph<Term, FreeAtoms>, Id, &Subst) -> bool {
    move |eg, _, s| set_of(eg, s, a).is_some_and(|set| set & free_of(eg, s, b) == 0)
}

/// `?A ⊆ free(?a) ∩ free(?b)`: both terms vary along every index of `?A`.
fn covered(
    a: &'static str,
    x: &'static str,
    y: &'static str,
) -> impl Fn(&mut EGraph<Term, FreeAtoms>, Id, &Subst) -> bool {
    move |eg, _, s| set_of(eg, s, a).is_some_and(|set| set & !(free_of(eg, s, x) & free_of(eg, s, y)) == 0)
}

/// Which reduction a set applier builds.
#[derive(Clone, Copy)]
enum Reducer {
    Sum,
    RMax,
    Mean,
}

impl Reducer {
    fn node(self, set: Id, body: Id) -> Term {
        match self {
            Reducer::Sum => Term::Sum([set, body]),
            Reducer::RMax => Term::RMax([set, body]),
            Reducer::Mean => Term::Mean([set, body]),
        }
    }
}

/// `red(A, red(B, x)) → red(A ∪ B, x)` for disjoint `A`, `B`.
struct MergeNested(Reducer);

impl Applier<Term, FreeAtoms> for MergeNested {
    fn apply_one(
        &self,
        eg: &mut EGraph<Term, FreeAtoms>,
        eclass: Id,
        subst: &Subst,
        _ast: Option<&PatternAst<Term>>,
        _rule: Symbol,
    ) -> Vec<Id> {
        let (Some(a), Some(b)) = (set_of(eg, subst, "?A"), set_of(eg, subst, "?B")) else { return vec![] };
        if a & b != 0 {
            return vec![];
        }
        let set = eg.add(Term::Set(AtomSet(a | b)));
        let n = eg.add(self.0.node(set, subst[var("?x")]));
        if eg.union(eclass, n) {
            vec![n]
        } else {
            vec![]
        }
    }
}

/// `red(S, x) → red(A, red(S \ A, x))` for every non-empty proper subset `A` of `S`.
struct SplitSet(Reducer);

impl Applier<Term, FreeAtoms> for SplitSet {
    fn apply_one(
        &self,
        eg: &mut EGraph<Term, FreeAtoms>,
        eclass: Id,
        subst: &Subst,
        _ast: Option<&PatternAst<Term>>,
        _rule: Symbol,
    ) -> Vec<Id> {
        let Some(s) = set_of(eg, subst, "?S") else { return vec![] };
        if s.count_ones() < 2 || s.count_ones() > MAX_SPLIT_SET {
            return vec![];
        }
        let x = subst[var("?x")];
        let mut changed = Vec::new();
        // Enumerates the non-empty proper submasks of s.
        let mut a = (s - 1) & s;
        while a != 0 {
            let outer = eg.add(Term::Set(AtomSet(a)));
            let inner_set = eg.add(Term::Set(AtomSet(s & !a)));
            let inner = eg.add(self.0.node(inner_set, x));
            let n = eg.add(self.0.node(outer, inner));
            if eg.union(eclass, n) {
                changed.push(n);
            }
            a = (a - 1) & s;
        }
        changed
    }
}

/// `invsize(A ∪ B) ↔ invsize(A) * invsize(B)`, as the split direction (the merge direction
/// follows from the mean rules).
struct SplitInvSize;

impl Applier<Term, FreeAtoms> for SplitInvSize {
    fn apply_one(
        &self,
        eg: &mut EGraph<Term, FreeAtoms>,
        eclass: Id,
        subst: &Subst,
        _ast: Option<&PatternAst<Term>>,
        _rule: Symbol,
    ) -> Vec<Id> {
        let Some(s) = set_of(eg, subst, "?S") else { return vec![] };
        if s.count_ones() < 2 || s.count_ones() > MAX_SPLIT_SET {
            return vec![];
        }
        let mut changed = Vec::new();
        let mut a = (s - 1) & s;
        while a != 0 {
            let sa = eg.add(Term::Set(AtomSet(a)));
            let sb = eg.add(Term::Set(AtomSet(s & !a)));
            let ia = eg.add(Term::InvSize(sa));
            let ib = eg.add(Term::InvSize(sb));
            let n = eg.add(Term::Mul([ia, ib]));
            if eg.union(eclass, n) {
                changed.push(n);
            }
            a = (a - 1) & s;
        }
        changed
    }
}

/// The rules run after [`rules`] has saturated (or stopped at a limit), without it: a term
/// added and subtracted again cancels, as a factor does from a quotient. They only merge
/// classes, never add a node, so they cannot grow the e-graph. Run among the other rules they
/// would: a cancellation puts `t` into the class of `(t + x) − x`, and from that cycle
/// associativity builds new sums with every term in reach, which filled the node limit from an
/// 8-op kernel with one `+ x` undone by a `− x`.
pub(super) fn cancellations() -> Vec<Rule> {
    vec![rw!("cancel-add"; "(+ (+ ?x ?a) (neg ?a))" => "?x")]
}

/// The rule set.
pub(super) fn rules() -> Vec<Rule> {
    let mut r: Vec<Rule> = vec![
        rw!("comm-add"; "(+ ?a ?b)" => "(+ ?b ?a)"),
        rw!("comm-mul"; "(* ?a ?b)" => "(* ?b ?a)"),
        rw!("comm-max"; "(max ?a ?b)" => "(max ?b ?a)"),
        rw!("assoc-add"; "(+ ?a (+ ?b ?c))" => "(+ (+ ?a ?b) ?c)"),
        rw!("assoc-add-r"; "(+ (+ ?a ?b) ?c)" => "(+ ?a (+ ?b ?c))"),
        rw!("assoc-mul"; "(* ?a (* ?b ?c))" => "(* (* ?a ?b) ?c)"),
        rw!("assoc-mul-r"; "(* (* ?a ?b) ?c)" => "(* ?a (* ?b ?c))"),
        rw!("mul-div"; "(* ?a (/ ?b ?c))" => "(/ (* ?a ?b) ?c)"),
        rw!("mul-div-r"; "(/ (* ?a ?b) ?c)" => "(* ?a (/ ?b ?c))"),
        rw!("div-div"; "(/ (/ ?a ?b) ?c)" => "(/ ?a (* ?b ?c))"),
        rw!("div-div-r"; "(/ ?a (* ?b ?c))" => "(/ (/ ?a ?b) ?c)"),
        rw!("mul-recip"; "(* ?a (recip ?b))" => "(/ ?a ?b)"),
        rw!("mul-recip-r"; "(/ ?a ?b)" => "(* ?a (recip ?b))"),
        rw!("rsqrt"; "(rsqrt ?x)" => "(recip (sqrt ?x))"),
        rw!("rsqrt-r"; "(recip (sqrt ?x))" => "(rsqrt ?x)"),
        rw!("sub"; "(- ?a ?b)" => "(+ ?a (neg ?b))"),
        rw!("sub-r"; "(+ ?a (neg ?b))" => "(- ?a ?b)"),
        rw!("mean-sum"; "(mean ?A ?x)" => "(* (sum ?A ?x) (invsize ?A))"),
        rw!("mean-sum-r"; "(* (sum ?A ?x) (invsize ?A))" => "(mean ?A ?x)"),
        // exp is a homomorphism from + to *: a shifted exp is the exp over the exp of the
        // shift, which is how a hand-written max subtraction cancels out of a softmax.
        rw!("exp-add"; "(exp (+ ?a ?b))" => "(* (exp ?a) (exp ?b))"),
        rw!("exp-neg"; "(exp (neg ?a))" => "(recip (exp ?a))"),
        // A common exp factor cancels from a quotient (an exp is never zero). Restricted to
        // exps: with any factor the match of a quotient of two products grows with the product
        // of their e-classes, which a large saturation cannot afford.
        rw!("cancel"; "(/ (* ?a (exp ?b)) (* ?c (exp ?b)))" => "(/ ?a ?c)"),
        // log is the inverse homomorphism, from * to +: the log of a sum of shifted exps is the
        // log of the sum less the shift, which is how a hand-written max subtraction cancels
        // out of a log-sum-exp. (On positive values, which is all a log is defined on.)
        rw!("log-exp"; "(log (exp ?a))" => "?a"),
        rw!("log-mul"; "(log (* ?a ?b))" => "(+ (log ?a) (log ?b))"),
        rw!("log-mul-r"; "(+ (log ?a) (log ?b))" => "(log (* ?a ?b))"),
        rw!("log-recip"; "(log (recip ?a))" => "(neg (log ?a))"),
        // A negation distributes over a sum and undoes itself, so that a shift subtracted
        // inside a subtrahend, `(x − m) − (l − m)`, meets the shift it cancels against (see
        // `cancellations`).
        rw!("neg-add"; "(neg (+ ?a ?b))" => "(+ (neg ?a) (neg ?b))"),
        rw!("neg-neg"; "(neg (neg ?a))" => "?a"),
    ];
    // A factor constant along the summed indices leaves the sum, and may re-enter it.
    r.push(rw!("sum-mul"; "(sum ?A (* ?a ?b))" => "(* (sum ?A ?a) ?b)" if disjoint("?A", "?b")));
    r.push(rw!("sum-mul-r"; "(* (sum ?A ?a) ?b)" => "(sum ?A (* ?a ?b))" if disjoint("?A", "?b")));
    r.push(rw!("sum-div"; "(sum ?A (/ ?a ?b))" => "(/ (sum ?A ?a) ?b)" if disjoint("?A", "?b")));
    r.push(rw!("sum-div-r"; "(/ (sum ?A ?a) ?b)" => "(sum ?A (/ ?a ?b))" if disjoint("?A", "?b")));
    r.push(rw!("mean-mul"; "(mean ?A (* ?a ?b))" => "(* (mean ?A ?a) ?b)" if disjoint("?A", "?b")));
    r.push(rw!("mean-mul-r"; "(* (mean ?A ?a) ?b)" => "(mean ?A (* ?a ?b))" if disjoint("?A", "?b")));
    r.push(rw!("mean-div"; "(mean ?A (/ ?a ?b))" => "(/ (mean ?A ?a) ?b)" if disjoint("?A", "?b")));
    r.push(rw!("mean-div-r"; "(/ (mean ?A ?a) ?b)" => "(mean ?A (/ ?a ?b))" if disjoint("?A", "?b")));
    // Linearity, restricted to terms that both vary along the summed indices.
    r.push(rw!("sum-add"; "(sum ?A (+ ?a ?b))" => "(+ (sum ?A ?a) (sum ?A ?b))" if covered("?A", "?a", "?b")));
    r.push(rw!("sum-add-r"; "(+ (sum ?A ?a) (sum ?A ?b))" => "(sum ?A (+ ?a ?b))" if covered("?A", "?a", "?b")));
    r.push(rw!("mean-add"; "(mean ?A (+ ?a ?b))" => "(+ (mean ?A ?a) (mean ?A ?b))" if covered("?A", "?a", "?b")));
    r.push(rw!("mean-add-r"; "(+ (mean ?A ?a) (mean ?A ?b))" => "(mean ?A (+ ?a ?b))" if covered("?A", "?a", "?b")));
    // Nested reductions over disjoint index sets are one reduction over the union, and back:
    // this is sum/sum commutation and the split factorization at once.
    for (name, pat, red) in
        [("sum", "sum", Reducer::Sum), ("rmax", "rmax", Reducer::RMax), ("mean", "mean", Reducer::Mean)]
    {
        let nested: egg::Pattern<Term> = format!("({pat} ?A ({pat} ?B ?x))").parse().expect("pattern");
        let flat: egg::Pattern<Term> = format!("({pat} ?S ?x)").parse().expect("pattern");
        r.push(Rewrite::new(format!("{name}-merge"), nested, MergeNested(red)).expect("rule"));
        r.push(Rewrite::new(format!("{name}-split"), flat, SplitSet(red)).expect("rule"));
    }
    let inv: egg::Pattern<Term> = "(invsize ?S)".parse().expect("pattern");
    r.push(Rewrite::new("invsize-split", inv, SplitInvSize).expect("rule"));
    r
}
