//! What the benchmark knows about each kernel: its declaration (read from the same
//! `kernels.yaml` the kernels were built from, embedded at compile time), the extents it is
//! checked and timed at, and the size of its random inputs.

use cleave_core::graph::{Bindings, DType, Dim, ValidGraph};
use serde_json::{json, Map, Value};

use crate::dispatch::{Dispatch, DISPATCH};
use crate::error::BenchError;

/// The declarations the kernels were built from (build.rs compiles the same file).
const YAML: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels.yaml"));

/// Extents of the correctness check: odd, not multiples of any tile size, and small enough
/// that the raw files stay well under 16 MiB each for most kernels.
const CHECK_EXTENTS: &[(&str, u64)] = &[("s", 333), ("l", 1001), ("b", 5)];
/// The check extent of a dynamic dim not named above.
const CHECK_FALLBACK: u64 = 67;

/// The paper's benchmark shapes: prefill at s = l = 4096 and 1024, decode at b = 16 and 64 over
/// a context of l = 4096.
const PREFILL_CASES: &[&[(&str, u64)]] = &[&[("s", 4096), ("l", 4096)], &[("s", 1024), ("l", 1024)]];
const DECODE_CASES: &[&[(&str, u64)]] = &[&[("b", 16), ("l", 4096)], &[("b", 64), ("l", 4096)]];

/// Largest extent a launcher accepts.
const MAX_EXTENT: u64 = (1 << 31) - 1;

/// A declared tensor at concrete extents.
#[derive(Clone, Debug)]
pub(crate) struct TensorAt {
    pub(crate) name: String,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
}

impl TensorAt {
    pub(crate) fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub(crate) fn json(&self) -> Value {
        json!({ "name": self.name, "dtype": self.dtype.name(), "shape": self.shape })
    }
}

/// One declared kernel.
pub(crate) struct Kernel {
    pub(crate) name: String,
    /// The body as written in the YAML: `compare.py` evaluates exactly this.
    pub(crate) body: String,
    pub(crate) graph: ValidGraph,
    pub(crate) dispatch: &'static Dispatch,
}

/// Dynamic extents by name, as given on the command line or by the defaults.
pub(crate) type Extents = Vec<(String, u64)>;

/// Parses `s=333,l=1001`.
pub(crate) fn parse_extents(text: &str) -> Result<Extents, BenchError> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = part
            .split_once('=')
            .ok_or_else(|| BenchError::new(format!("expected NAME=VALUE pairs separated by commas, got `{part}`")))?;
        let value: u64 = value
            .trim()
            .parse()
            .ok()
            .filter(|v| (1..=MAX_EXTENT).contains(v))
            .ok_or_else(|| BenchError::new(format!("extent `{part}`: the value must be an integer in 1..2^31")))?;
        out.push((name.trim().to_string(), value));
    }
    if out.is_empty() {
        return Err(BenchError::new(format!("no extents in `{text}`")));
    }
    Ok(out)
}

/// Every kernel of the embedded YAML, each with its dispatch entry.
pub(crate) fn kernels() -> Result<Vec<Kernel>, BenchError> {
    let module = cleave_core::front::check_source(YAML.as_bytes()).map_err(|diags| {
        BenchError::new(diags.iter().map(|d| d.render("kernels.yaml")).collect::<Vec<_>>().join("\n"))
    })?;
    module
        .kernels
        .into_iter()
        // The serving operators are not driven yet (build.rs leaves them out by the same rule).
        .filter(|(_, g)| !serving(g))
        .map(|(decl, graph)| {
            let dispatch = DISPATCH.iter().find(|d| d.name == decl.name).ok_or_else(|| {
                BenchError::new(format!("kernel `{}` has no dispatch entry: rebuild the benchmark", decl.name))
            })?;
            Ok(Kernel { name: decl.name, body: decl.body.text, graph, dispatch })
        })
        .collect()
}

/// A kernel with index tables, runtime scalars or a storage layout (`build.rs` has the twin).
fn serving(g: &ValidGraph) -> bool {
    let decls = g.inputs.iter().map(|t| &t.decl).chain(g.outputs.iter().map(|t| &t.decl));
    decls.into_iter().any(|d| d.is_index() || d.shape.is_empty() || d.layout.is_some())
}

impl Kernel {
    /// The names of the dynamic dims, in declaration order (the order of `Dims`).
    pub(crate) fn dynamic(&self) -> Vec<&str> {
        self.graph.dims.iter().filter(|(_, d)| d.dynamic).map(|(_, d)| d.name.as_str()).collect()
    }

    /// The standard deviation of the random inputs.
    ///
    /// Attention inputs are scaled as the repository's emulation tests scale them
    /// (`tests/emulate_kernels.rs`), so that scores reach several hundred and an unstabilized
    /// softmax would overflow: σ = 11 gives scores of σ ≈ 121 with a 1/√d scale; MLA decode
    /// contracts 576 products at 1/√192, so σ = 8 gives about 110. SwiGLU multiplies two
    /// products of 4096 terms; σ = 0.5 keeps its f16 output far from overflow (65504), where
    /// σ = 1 would overflow a few elements.
    pub(crate) fn input_std(&self) -> f64 {
        if self.name.starts_with("mla_decode") {
            8.0
        } else if self.body.contains("softmax") {
            11.0
        } else if self.name.starts_with("swiglu") {
            0.5
        } else {
            1.0
        }
    }

    /// Bindings of every declared dim, with the dynamic ones taken from `extents` (names that
    /// are not dims of this kernel are ignored; a dynamic dim missing from `extents` keeps its
    /// representative value).
    pub(crate) fn bindings(&self, extents: &[(String, u64)]) -> Bindings {
        let mut b = Bindings::of_table(&self.graph.dims);
        for (v, d) in self.graph.dims.iter() {
            if let Some((_, value)) = extents.iter().find(|(n, _)| *n == d.name).filter(|_| d.dynamic) {
                b.values[v.index()] = *value;
            }
        }
        b
    }

    /// The extents of the correctness check, with `overrides` applied.
    pub(crate) fn check_extents(&self, overrides: Option<&Extents>) -> Extents {
        let mut out: Extents = self
            .dynamic()
            .into_iter()
            .map(|n| {
                let v = CHECK_EXTENTS.iter().find(|(c, _)| *c == n).map_or(CHECK_FALLBACK, |(_, v)| *v);
                (n.to_string(), v)
            })
            .collect();
        apply(&mut out, overrides);
        out
    }

    /// The timing cases: the paper's shapes for this kernel's dynamic dims, or one case from
    /// `overrides`.
    pub(crate) fn bench_cases(&self, overrides: Option<&Extents>) -> Vec<Extents> {
        let dynamic = self.dynamic();
        let mut base: Extents = dynamic
            .iter()
            .map(|n| {
                let value = self.graph.dims.iter().find(|(_, d)| d.name == *n).map_or(1, |(_, d)| d.value);
                (n.to_string(), value)
            })
            .collect();
        if overrides.is_some() {
            apply(&mut base, overrides);
            return vec![base];
        }
        let cases = if dynamic.contains(&"b") {
            DECODE_CASES
        } else if dynamic.contains(&"s") {
            PREFILL_CASES
        } else {
            return vec![base];
        };
        cases
            .iter()
            .map(|case| {
                let mut e = base.clone();
                apply(&mut e, Some(&case.iter().map(|(n, v)| (n.to_string(), *v)).collect()));
                e
            })
            .collect()
    }

    pub(crate) fn inputs(&self, b: &Bindings) -> Vec<TensorAt> {
        self.graph
            .inputs
            .iter()
            .map(|t| TensorAt { name: t.decl.name.clone(), dtype: t.decl.dtype, shape: b.extents(&t.decl.shape) })
            .collect()
    }

    pub(crate) fn outputs(&self, b: &Bindings) -> Vec<TensorAt> {
        self.graph
            .outputs
            .iter()
            .map(|t| TensorAt { name: t.decl.name.clone(), dtype: t.decl.dtype, shape: b.extents(&t.decl.shape) })
            .collect()
    }

    /// The dynamic extents in declaration order, as the dispatch functions take them.
    pub(crate) fn dynamic_values(&self, b: &Bindings) -> Vec<usize> {
        self.graph.dims.iter().filter(|(_, d)| d.dynamic).map(|(v, _)| b.extent(Dim::Var(v))).collect()
    }

    /// Every declared dim with its value, in declaration order.
    pub(crate) fn dims_json(&self, b: &Bindings) -> Value {
        let mut m = Map::new();
        for (v, d) in self.graph.dims.iter() {
            m.insert(d.name.clone(), json!(b.values[v.index()]));
        }
        Value::Object(m)
    }

    /// `s=333 l=1001`: the dynamic extents, for messages and table rows.
    pub(crate) fn case_label(&self, b: &Bindings) -> String {
        self.graph
            .dims
            .iter()
            .filter(|(_, d)| d.dynamic)
            .map(|(v, d)| format!("{}={}", d.name, b.values[v.index()]))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

fn apply(extents: &mut Extents, overrides: Option<&Extents>) {
    for (name, value) in overrides.into_iter().flatten() {
        if let Some(slot) = extents.iter_mut().find(|(n, _)| n == name) {
            slot.1 = *value;
        }
    }
}
