//! The generator of random well-typed declarations, and the oracle their launches are checked
//! against. Shared by the tile interpreter's run (`cleave-core/tests/generated.rs`) and the
//! emulator's run of the generated CUDA (`tests/generated_emulate.rs`): one case, one seed,
//! both ways.
//!
//! A generator writes kernels as YAML text: random DAGs over every op of the language, random
//! dims, dtypes, ranks and axes, outputs that other ops read. Each case is reproducible from its
//! seed alone.
//!
//! The oracle is the f64 reference within the tolerance of the declaration's types.
//! Ill-conditioned arithmetic (a difference of close values, a log near 1) is the declaration's,
//! not the compiler's, so the tolerance also admits a few times the error of a naive f32
//! evaluation of the same graph (one rounding per op, in declaration order), computed by an
//! evaluator written here, the larger of two: one on the inputs, one on the inputs each moved
//! by one unit in the last place. One sample can be lucky: a sum that cancels may come out of
//! one order of additions far closer than out of another, and a kernel adds in its own order.
//! For the same reason, an output that cancels to zero is judged after a few times the naive
//! evaluations' largest absolute error anywhere in it is taken off each element's error: one
//! element can come out exact in the naive order and an ulp of the operands away in another.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::time::Duration;

use cleave_core::eval::{eval_into, Dense, Domain};
use cleave_core::front::check_source;
use cleave_core::graph::{BinaryOp, Bindings, DType, Op, ReduceOp, UnaryOp, ValidGraph};
use cleave_core::pipeline::Options;
use cleave_core::reference::{eval_nodes, max_rel_err, tolerance, Rng, Tensor};

const DIM_NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];

/// One value of the body being written: its name, shape (`None` is a unit axis) and a rough
/// bound on its magnitude, which decides where an unstabilized `exp` may go.
#[derive(Clone)]
struct Var {
    name: String,
    shape: Vec<Option<usize>>,
    positive: bool,
    mag: f64,
    input: bool,
}

struct Writer {
    rng: Rng,
    dims: Vec<(u64, bool)>,
    vars: Vec<Var>,
    inputs: Vec<(String, DType, Vec<Option<usize>>)>,
    lines: Vec<String>,
    used: Vec<bool>,
    /// Standard deviation of the random inputs.
    scale: f64,
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F32 => "f32",
        DType::I32 => "i32",
    }
}

impl Writer {
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.rng.below(xs.len() as u64) as usize]
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.uniform() < p
    }

    fn dtype(&mut self) -> DType {
        self.pick(&[DType::F16, DType::BF16, DType::F32])
    }

    fn shape_text(&self, s: &[Option<usize>]) -> String {
        s.iter().map(|d| d.map_or("1".to_string(), |i| DIM_NAMES[i].to_string())).collect::<Vec<_>>().join(", ")
    }

    fn new_input(&mut self, shape: Vec<Option<usize>>, dtype: DType) -> usize {
        let name = format!("x{}", self.inputs.len());
        self.inputs.push((name.clone(), dtype, shape.clone()));
        self.vars.push(Var { name, shape, positive: false, mag: 4.0 * self.scale, input: true });
        self.used.push(false);
        self.vars.len() - 1
    }

    fn assign(&mut self, expr: &str, shape: Vec<Option<usize>>, positive: bool, mag: f64) -> usize {
        let name = format!("v{}", self.lines.len());
        self.lines.push(format!("{name} = {expr}"));
        self.vars.push(Var { name, shape, positive, mag: mag.min(1e30), input: false });
        self.used.push(false);
        self.vars.len() - 1
    }

    fn use_var(&mut self, v: usize) -> String {
        self.used[v] = true;
        self.vars[v].name.clone()
    }

    /// `v` as an expression that is positive and bounded away from zero.
    fn positive(&mut self, v: usize) -> (String, f64) {
        let x = self.use_var(v);
        let m = self.vars[v].mag;
        // A positive value can still be tiny (a probability), so it is bounded away from zero
        // like any other.
        match self.rng.below(3) {
            0 => (format!("(square({x}) + 0.5)"), m * m + 0.5),
            1 => (format!("(sigmoid({x}) + 0.25)"), 1.25),
            _ => (format!("(max({x}, 0.0) + 1.0)"), m + 1.0),
        }
    }

    /// A shape that broadcasts against `s`: `s` itself, `s` with unit axes, a suffix of it, or
    /// a scalar.
    fn broadcast_of(&mut self, s: &[Option<usize>]) -> Vec<Option<usize>> {
        match self.rng.below(4) {
            0 => s.to_vec(),
            1 => s.iter().map(|d| if self.rng.uniform() < 0.5 { None } else { *d }).collect(),
            2 => {
                let k = self.rng.below(s.len() as u64 + 1) as usize;
                s[k..].to_vec()
            }
            _ => Vec::new(),
        }
    }

    /// Whether `a` and `b` broadcast to `a`'s shape (NumPy rules, right-aligned).
    fn into_shape(a: &[Option<usize>], b: &[Option<usize>]) -> bool {
        b.len() <= a.len() && a.iter().rev().zip(b.iter().rev()).all(|(x, y)| y.is_none() || x == y)
    }

    /// Appends one statement reading `forced`, or a random value.
    fn statement(&mut self, forced: Option<usize>) {
        let v = match forced {
            Some(v) => v,
            None => self.rng.below(self.vars.len() as u64) as usize,
        };
        let var = self.vars[v].clone();
        let rank = var.shape.len();
        let real_axes: Vec<usize> = (0..rank).filter(|&i| var.shape[i].is_some()).collect();
        let axis_text = |w: &mut Writer, i: usize| -> String {
            if w.chance(0.5) {
                format!("{}", i as i64 - rank as i64)
            } else {
                format!("{i}")
            }
        };
        match self.rng.below(12) {
            // Elementwise functions.
            0 | 1 => {
                let u = self.pick(&UnaryOp::ALL);
                let (expr, positive, mag) = match u {
                    UnaryOp::Exp if var.mag <= 8.0 => {
                        let x = self.use_var(v);
                        (format!("exp({x})"), true, var.mag.exp())
                    }
                    UnaryOp::Exp | UnaryOp::Sigmoid => (format!("sigmoid({})", self.use_var(v)), true, 1.0),
                    UnaryOp::Log => {
                        let (x, m) = self.positive(v);
                        (format!("log({x})"), false, m.ln().abs() + 2.0)
                    }
                    UnaryOp::Sqrt => {
                        let (x, m) = self.positive(v);
                        (format!("sqrt({x})"), true, m.sqrt())
                    }
                    UnaryOp::Rsqrt => {
                        let (x, _) = self.positive(v);
                        (format!("rsqrt({x})"), true, 2.0)
                    }
                    UnaryOp::Recip => {
                        let (x, _) = self.positive(v);
                        (format!("recip({x})"), true, 4.0)
                    }
                    UnaryOp::Square => (format!("square({})", self.use_var(v)), true, var.mag * var.mag),
                    UnaryOp::Neg => (format!("-{}", self.use_var(v)), false, var.mag),
                    other => (format!("{}({})", other.name(), self.use_var(v)), false, var.mag),
                };
                self.assign(&expr, var.shape, positive, mag);
            }
            // Binary ops with another value, a constant or a new input.
            2..=4 => {
                let op = self.pick(&[BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max]);
                let others: Vec<usize> = (0..self.vars.len())
                    .filter(|&o| o != v && Self::into_shape(&var.shape, &self.vars[o].shape))
                    .collect();
                let other = match self.rng.below(3) {
                    0 if !others.is_empty() => Some(self.pick(&others)),
                    1 => {
                        let s = self.broadcast_of(&var.shape);
                        let d = self.dtype();
                        Some(self.new_input(s, d))
                    }
                    _ => None,
                };
                let x = self.use_var(v);
                let (rhs, rpos, rmag) = match other {
                    Some(o) if op == BinaryOp::Div => {
                        let (t, m) = self.positive(o);
                        (t, true, m)
                    }
                    Some(o) => {
                        let t = self.use_var(o);
                        (t, self.vars[o].positive, self.vars[o].mag)
                    }
                    None => {
                        let c = self.pick(&[0.5, 1.5, 2.0, 0.125, 3.0]);
                        (format!("{c}"), true, c)
                    }
                };
                let (expr, positive, mag) = match op {
                    BinaryOp::Add => (format!("{x} + {rhs}"), var.positive && rpos, var.mag + rmag),
                    BinaryOp::Sub => (format!("{x} - {rhs}"), false, var.mag + rmag),
                    BinaryOp::Mul => (format!("{x} * {rhs}"), var.positive && rpos, var.mag * rmag),
                    BinaryOp::Div => (format!("{x} / {rhs}"), var.positive, var.mag * 4.0),
                    BinaryOp::Max => (format!("max({x}, {rhs})"), var.positive || rpos, var.mag.max(rmag)),
                };
                self.assign(&expr, var.shape, positive, mag);
            }
            // Reductions over any axis.
            5 | 6 if !real_axes.is_empty() => {
                let i = self.pick(&real_axes);
                let n = self.dims[var.shape[i].expect("a real axis")].0 as f64;
                let op = self.pick(&["sum", "mean", "max"]);
                let a = axis_text(self, i);
                let x = self.use_var(v);
                let mut shape = var.shape.clone();
                shape[i] = None;
                let mag = if op == "sum" { var.mag * n.sqrt() * 2.0 } else { var.mag };
                self.assign(&format!("{op}({x}, axis={a})"), shape, var.positive, mag);
            }
            // Softmax and RMSNorm over any axis.
            7 if !real_axes.is_empty() => {
                let i = self.pick(&real_axes);
                let a = axis_text(self, i);
                let x = self.use_var(v);
                if self.chance(0.5) {
                    let form = if self.chance(0.3) { String::new() } else { format!(", axis={a}") };
                    self.assign(&format!("softmax({x}{form})"), var.shape, true, 1.0);
                } else {
                    self.assign(&format!("rmsnorm({x}, axis={a}, eps=1e-5)"), var.shape, false, 4.0);
                }
            }
            // The stabilized forms users write: a shifted exp, and a weighted average by exps.
            8 if !real_axes.is_empty() => {
                let i = self.pick(&real_axes);
                let a = axis_text(self, i);
                let x = self.use_var(v);
                if self.chance(0.5) {
                    self.assign(&format!("exp({x} - max({x}, axis={a}))"), var.shape, true, 1.0);
                } else {
                    let s = self.broadcast_of(&var.shape);
                    let d = self.dtype();
                    let w = self.new_input(s, d);
                    let w = self.use_var(w);
                    let mut shape = var.shape.clone();
                    shape[i] = None;
                    self.assign(&format!("sum(exp({x}) * {w}, axis={a}) / sum(exp({x}), axis={a})"), shape, false, 3.0);
                }
            }
            // Products: a weight (plain, torch layout, batched) or a computed right operand.
            9 | 10 if rank >= 2 && var.shape[rank - 1].is_some() => {
                let k = var.shape[rank - 1].expect("checked");
                let n = self.rng.below(self.dims.len() as u64) as usize;
                let computed: Vec<usize> = (0..self.vars.len())
                    .filter(|&o| o != v && !self.vars[o].input && self.vars[o].shape == [Some(k), Some(n)])
                    .collect();
                let x = self.use_var(v);
                let (rhs, rmag) = match self.rng.below(4) {
                    0 if !computed.is_empty() => {
                        let o = self.pick(&computed);
                        (self.use_var(o), self.vars[o].mag)
                    }
                    0 | 1 => {
                        let d = self.dtype();
                        let w = self.new_input(vec![Some(n), Some(k)], d);
                        (format!("transpose({})", self.use_var(w)), self.vars[w].mag)
                    }
                    2 if var.shape[..rank - 2].iter().all(Option::is_some) => {
                        let mut s = var.shape[..rank - 2].to_vec();
                        s.extend([Some(k), Some(n)]);
                        let d = self.dtype();
                        let w = self.new_input(s, d);
                        (self.use_var(w), self.vars[w].mag)
                    }
                    _ => {
                        let d = self.dtype();
                        let w = self.new_input(vec![Some(k), Some(n)], d);
                        (self.use_var(w), self.vars[w].mag)
                    }
                };
                let mut shape = var.shape.clone();
                shape[rank - 1] = Some(n);
                let kk = self.dims[k].0 as f64;
                self.assign(&format!("matmul({x}, {rhs})"), shape, false, var.mag * rmag * kk.sqrt());
            }
            // A transposed value.
            11 if rank >= 2 => {
                let x = self.use_var(v);
                let mut shape = var.shape.clone();
                shape.swap(rank - 1, rank - 2);
                self.assign(&format!("transpose({x})"), shape, var.positive, var.mag);
            }
            _ => {
                let x = self.use_var(v);
                let c = self.pick(&[0.25, 0.7, 1.25]);
                self.assign(&format!("{x} * {c}"), var.shape, var.positive, var.mag);
            }
        }
    }
}

/// A generated declaration and the extents to run it at.
pub(crate) struct Case {
    /// The declaration, as YAML.
    pub(crate) yaml: String,
    /// The extents of its dynamic dims, by name.
    pub(crate) extents: Vec<(String, u64)>,
    /// The standard deviation of its random inputs.
    pub(crate) scale: f64,
}

/// The declaration of `seed`: the same seed always gives the same text.
pub(crate) fn generate(seed: u64) -> Case {
    // Draw until the case is small enough for the interpreter: at most 32k elements a tensor,
    // at the declared sizes and at the run's extents alike.
    let mut attempt = 0u64;
    loop {
        let (w, extents) = draw(seed ^ (attempt << 40));
        let fits = |ext: &dyn Fn(usize) -> u64| {
            w.vars.iter().all(|v| v.shape.iter().map(|d| d.map_or(1, ext)).product::<u64>() <= 32_768)
        };
        if fits(&|i| w.dims[i].0) && fits(&|i| extents[i]) {
            return finish(seed, w, &extents);
        }
        attempt += 1;
    }
}

/// One random declaration: dims, a first input, and up to six statements.
fn draw(seed: u64) -> (Writer, Vec<u64>) {
    let mut rng = Rng::new(seed);
    let scale = if rng.uniform() < 0.25 { 6.0 } else { 1.0 };
    let mut w = Writer {
        rng,
        dims: Vec::new(),
        vars: Vec::new(),
        inputs: Vec::new(),
        lines: Vec::new(),
        used: Vec::new(),
        scale,
    };
    let n_dims = 2 + w.rng.below(4) as usize;
    let mut extents = Vec::new();
    for _ in 0..n_dims {
        let value = w.pick(&[3, 8, 16, 24, 32, 40, 64, 96]);
        let dynamic = w.chance(0.4);
        w.dims.push((value, dynamic));
        // A dynamic dim runs at a ragged extent of its own, below or above the declared one.
        extents.push(if dynamic { 1 + w.rng.below(value + value / 2 + 4) } else { value });
    }
    // The first input: 1-D to 5-D over distinct dims, mostly 2-D and 3-D.
    let rank = w.pick(&[1, 2, 2, 2, 3, 3, 4, 5]).min(n_dims);
    let mut order: Vec<usize> = (0..n_dims).collect();
    for i in (1..order.len()).rev() {
        let j = w.rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    let shape: Vec<Option<usize>> = order[..rank].iter().map(|&d| Some(d)).collect();
    let d = w.dtype();
    let first = w.new_input(shape, d);
    let stmts = 1 + w.rng.below(6);
    for s in 0..stmts {
        // The first statement reads the first input, so every input is used.
        w.statement(if s == 0 { Some(first) } else { None });
    }
    (w, extents)
}

/// The declaration's text.
fn finish(seed: u64, mut w: Writer, extents: &[u64]) -> Case {
    // Every computed value nobody reads is an output; so are some that others read.
    let mut outputs = Vec::new();
    for (i, v) in w.vars.iter().enumerate() {
        if v.input {
            continue;
        }
        let last = i + 1 == w.vars.len();
        if !w.used[i] || last || w.rng.uniform() < 0.15 {
            outputs.push(i);
        }
    }
    let mut yaml = format!("kernels:\n  - name: gen_{seed}\n    dims: {{ ");
    let dims: Vec<String> = w
        .dims
        .iter()
        .enumerate()
        .map(|(i, (v, dynamic))| {
            if *dynamic {
                format!("{}: {{ value: {v}, dynamic: true }}", DIM_NAMES[i])
            } else {
                format!("{}: {v}", DIM_NAMES[i])
            }
        })
        .collect();
    yaml.push_str(&dims.join(", "));
    yaml.push_str(" }\n    inputs: { ");
    let inputs: Vec<String> =
        w.inputs.iter().map(|(n, d, s)| format!("{n}: \"{}[{}]\"", dtype_name(*d), w.shape_text(s))).collect();
    yaml.push_str(&inputs.join(", "));
    yaml.push_str(" }\n    outputs: { ");
    let mut outs = Vec::new();
    for &o in &outputs {
        let v = &w.vars[o];
        let d = if v.mag > 1e4 {
            DType::F32
        } else {
            [DType::F32, DType::F32, DType::F16, DType::BF16][w.rng.below(4) as usize]
        };
        outs.push(format!("{}: \"{}[{}]\"", v.name, dtype_name(d), w.shape_text(&v.shape)));
    }
    yaml.push_str(&outs.join(", "));
    yaml.push_str(" }\n    body: |\n");
    for l in &w.lines {
        let _ = writeln!(yaml, "      {l}");
    }
    let extents = w
        .dims
        .iter()
        .enumerate()
        .filter(|(_, (_, dynamic))| *dynamic)
        .map(|(i, _)| (DIM_NAMES[i].to_string(), extents[i]))
        .collect();
    Case { yaml, extents, scale: w.scale }
}

/// Naive f32 evaluation: one rounding per op, sums in declaration order.
struct NaiveF32;

impl Domain for NaiveF32 {
    type Value = f32;
    type Error = Infallible;
    fn neg_inf(&self) -> f32 {
        f32::NEG_INFINITY
    }
    fn constant(&self, c: f64) -> Result<f32, Infallible> {
        Ok(c as f32)
    }
    fn count(&self, n: usize) -> Result<f32, Infallible> {
        Ok(n as f32)
    }
    fn zero(&self) -> f32 {
        0.0
    }
    fn unary(&self, op: UnaryOp, x: f32) -> Result<f32, Infallible> {
        Ok(match op {
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => 1.0 / x.sqrt(),
            UnaryOp::Square => x * x,
            UnaryOp::Recip => 1.0 / x,
            UnaryOp::Silu => x / (1.0 + (-x).exp()),
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            // f32 has no erf: the op's own evaluation, which rounds the f64 form.
            UnaryOp::Gelu => UnaryOp::Gelu.eval(x),
            UnaryOp::Neg => -x,
        })
    }
    fn binary(&self, op: BinaryOp, x: f32, y: f32) -> Result<f32, Infallible> {
        Ok(match op {
            BinaryOp::Add => x + y,
            BinaryOp::Sub => x - y,
            BinaryOp::Mul => x * y,
            BinaryOp::Div => x / y,
            BinaryOp::Max => x.max(y),
        })
    }
    fn mul_add(&self, acc: f32, x: f32, y: f32) -> f32 {
        acc + x * y
    }
    fn reduce_start(&self, op: ReduceOp) -> Option<f32> {
        Some(if op == ReduceOp::Max { f32::NEG_INFINITY } else { 0.0 })
    }
}

/// The pipeline's options for a case: a small search, since the point is many shapes of graph,
/// not deep rewrites.
pub(crate) fn options() -> Options {
    let mut opts = Options::default();
    opts.search.max_states = 2_000;
    opts.search.time_limit = Duration::from_secs(10);
    opts.top_k = 2;
    opts
}

/// The case's graph and the bindings of its dims at the case's extents.
pub(crate) fn checked(case: &Case) -> Result<(ValidGraph, Bindings), String> {
    let module = check_source(case.yaml.as_bytes()).map_err(|d| format!("rejected: {d:?}"))?;
    let graph: ValidGraph = module.kernels.into_iter().next().ok_or("no kernel")?.1;
    let mut b = Bindings::of_table(&graph.dims);
    for (name, x) in &case.extents {
        let v = graph.dims.find(name).ok_or_else(|| format!("dim {name}"))?;
        b.values[v.index()] = *x;
    }
    Ok((graph, b))
}

/// What a launch's outputs must match (see the module).
pub(crate) struct Oracle {
    want: Vec<Tensor>,
    tol: f64,
    /// Per naive evaluation, every node's value.
    naive: Vec<Vec<Dense<f32>>>,
}

impl Oracle {
    /// The oracle of `graph` at `b` on `inputs`; `seed` picks the nudges of the second naive
    /// evaluation.
    pub(crate) fn new(graph: &ValidGraph, b: &Bindings, inputs: &[Tensor], seed: u64) -> Result<Oracle, String> {
        let values = eval_nodes(graph, b, inputs).map_err(|e| format!("reference: {e}"))?;
        let want = graph.outputs.iter().map(|o| values[o.node.index()].clone()).collect();
        let mut max_exp_arg = 0.0f64;
        for id in graph.ids() {
            if graph.node(id).op == Op::Unary(UnaryOp::Exp) {
                for x in &values[graph.node(id).args[0].index()].data {
                    max_exp_arg = max_exp_arg.max(x.abs());
                }
            }
        }
        let tol = tolerance(graph, b, max_exp_arg);
        let mut nudge = Rng::new(seed ^ 0x006e_7564_6765);
        let mut naive = Vec::new();
        for nudged in [false, true] {
            let naive_inputs: Vec<Dense<f32>> = inputs
                .iter()
                .map(|t| Dense {
                    shape: t.shape.clone(),
                    data: t
                        .data
                        .iter()
                        .map(|x| {
                            let x = *x as f32;
                            if nudged {
                                one_ulp(x, nudge.below(2) == 0)
                            } else {
                                x
                            }
                        })
                        .collect(),
                })
                .collect();
            let mut values = Vec::new();
            eval_into(&NaiveF32, &graph.nodes, &graph.dims, b, &naive_inputs, usize::MAX, &mut values)
                .map_err(|_| "naive eval".to_string())?;
            naive.push(values);
        }
        Ok(Oracle { want, tol, naive })
    }

    /// `Err` describes the first output of `got` (the launch's, in declaration order) past
    /// its allowance.
    pub(crate) fn check(&self, graph: &ValidGraph, got: &[Tensor]) -> Result<(), String> {
        for (o, out) in graph.outputs.iter().enumerate() {
            let dt = out.decl.dtype;
            let want = &self.want[o].data;
            // A reference value past the output type's largest finite value rounds to infinity
            // in that type: a result that stores that infinity there rounded correctly, and is
            // compared as the reference value itself.
            let rounded = |got: &[f64]| -> Vec<f64> {
                got.iter().zip(want).map(|(&g, &w)| if g.is_infinite() && dt.round(w) == g { w } else { g }).collect()
            };
            let naive: Vec<Vec<f64>> = self
                .naive
                .iter()
                .map(|naive| {
                    rounded(&naive[out.node.index()].data.iter().map(|x| dt.round(f64::from(*x))).collect::<Vec<_>>())
                })
                .collect();
            let cond = naive.iter().map(|n| max_rel_err(n, want)).fold(0.0, f64::max);
            let allowed = self.tol + if cond.is_finite() { 8.0 * cond } else { 0.0 };
            // The naive evaluations' largest absolute error anywhere in the output: the size of
            // its rounding noise where the output is a difference of close values. There the
            // relative error of each element is noise over a reference that is zero up to
            // cancellation, and one sample can land exactly on an element where another order
            // of operations lands an ulp of the operands away; so a few times that noise is
            // allowed on every element before its relative error is measured.
            let noise = naive
                .iter()
                .flat_map(|n| n.iter().zip(want))
                .filter(|(n, w)| n.is_finite() && w.is_finite())
                .map(|(n, w)| (n - w).abs())
                .fold(0.0, f64::max);
            let slack = 8.0 * noise;
            let got: Vec<f64> = rounded(&got[o].data)
                .iter()
                .zip(want)
                .map(|(&g, &w)| {
                    if g.is_finite() && w.is_finite() {
                        w + (g - w).signum() * ((g - w).abs() - slack).max(0.0)
                    } else {
                        g
                    }
                })
                .collect();
            let err = max_rel_err(&got, want);
            if err.is_nan() || err > allowed {
                return Err(format!(
                    "output `{}`: max_rel_err={err:e} allowed={allowed:e} (tolerance {:e}, naive f32 {cond:e})",
                    out.decl.name, self.tol
                ));
            }
        }
        Ok(())
    }
}

/// `x` moved one unit in the last place, away from zero or toward it; zero and values that are
/// not finite stay as they are.
fn one_ulp(x: f32, away: bool) -> f32 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let moved = f32::from_bits(if away { x.to_bits() + 1 } else { x.to_bits() - 1 });
    if moved.is_finite() {
        moved
    } else {
        x
    }
}

/// `run`'s result for the case of `seed`, a panic in it reported as a failure that names the
/// seed and prints the declaration.
pub(crate) fn caught<T>(seed: u64, run: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|p| {
        let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
        Err(format!("seed {seed}: panic: {}\n{}", msg.unwrap_or_default(), generate(seed).yaml))
    })
}

/// A count or seed from the environment.
pub(crate) fn env_u64(key: &str, default: u64) -> u64 {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
