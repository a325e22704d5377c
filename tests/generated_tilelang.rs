//! TileLang text run on a CPU stand-in of `tilelang.language` (`tests/tilelang_cpu/`), against
//! the oracle the interpreter and the emulator runs use (`cleave-core/tests/generator/`). The
//! stand-in reads a global tensor past its shape as zero, as TileLang's safe-memory-access pass
//! does, and stops at any index past a shared tile or a fragment, at a `T.copy` between regions
//! of different shapes and at a product or reduction of mismatched operands; so a TileLang
//! module that would be wrong on a GPU fails here, not just one that Python cannot parse.
//!
//! What runs: the generator's random declarations, the paper's transformed forms, loops split
//! across blocks at ragged extents, and the corpus. A fallback stage has no TileLang
//! rendering, so each runs its best launch of tile kernels alone; those with none are counted
//! apart. `CLEAVE_GEN_TL_CASES=N` sets the number of generated cases (default 120),
//! `CLEAVE_GEN_SEED=S` the first seed, the same seeds as the other two runs.

// The summary line goes to stderr, where `cargo test` shows it.
#![allow(clippy::print_stderr)]

#[path = "corpus/entries.rs"]
mod entries;
#[path = "../cleave-core/tests/generator/mod.rs"]
mod generator;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use cleave_core::arch::{Targets, SM80};
use cleave_core::codegen::tilelang;
use cleave_core::front::check_source;
use cleave_core::graph::{Bindings, DType, ValidGraph};
use cleave_core::pipeline::{candidates, compile, Options};
use cleave_core::plan::program::Binding;
use cleave_core::plan::{Kernel, Launch, WorkspaceType};
use cleave_core::reference::{random_inputs, InputScale, Tensor};
use entries::corpus;
use generator::{caught, checked, env_u64, generate, options, Oracle};

/// What happened to one case.
enum Outcome {
    Checked,
    /// Every launch has a fallback stage, which TileLang does not render.
    Fallback,
}

fn dtype_word(d: DType) -> &'static str {
    match d {
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F32 => "float32",
        DType::I32 => "int32",
    }
}

fn buffer_key(b: Binding) -> String {
    match b {
        Binding::Input(i) => format!("in{i}"),
        Binding::Output(o) => format!("out{o}"),
        Binding::Workspace(w) => format!("ws{w}"),
    }
}

/// The runner's job: every dim, every buffer (inputs with their values), the kernels in order
/// with their buffers, and the outputs to write back.
fn job(launch: &Launch, lb: &Bindings, inputs: &[Tensor]) -> String {
    let mut s = String::new();
    for (v, d) in launch.dims().iter() {
        let _ = writeln!(s, "dim {} {}", d.name, lb.values[v.index()]);
    }
    let g = &launch.graph;
    for (i, (input, t)) in g.inputs.iter().zip(inputs).enumerate() {
        let mut shape: Vec<String> = lb.extents(&input.decl.shape).iter().map(ToString::to_string).collect();
        // A scalar is a one-element tensor in the module.
        if shape.is_empty() {
            shape.push("1".into());
        }
        let values: Vec<String> = t.data.iter().map(|x| format!("{x:?}")).collect();
        let _ = writeln!(s, "buffer in{i} {} {} : {}", dtype_word(input.decl.dtype), shape.join(" "), values.join(" "));
    }
    for (o, out) in g.outputs.iter().enumerate() {
        let shape: Vec<String> = lb.extents(&out.decl.shape).iter().map(ToString::to_string).collect();
        let _ = writeln!(s, "buffer out{o} {} {} :", dtype_word(out.decl.dtype), shape.join(" "));
    }
    for (w, ws) in launch.workspaces.iter().enumerate() {
        let dtype = match ws.ty {
            WorkspaceType::F16 => "float16",
            WorkspaceType::BF16 => "bfloat16",
            WorkspaceType::F32 | WorkspaceType::Extended => "float32",
        };
        let shape: Vec<String> = lb.extents(&ws.shape).iter().map(ToString::to_string).collect();
        let _ = writeln!(s, "buffer ws{w} {dtype} {} :", shape.join(" "));
    }
    for k in launch.kernels.iter().filter_map(Kernel::tile) {
        let keys: Vec<String> = k.params.iter().map(|p| buffer_key(p.binding)).collect();
        let _ = writeln!(s, "kernel {} {}", k.symbol, keys.join(" "));
    }
    for o in 0..g.outputs.len() {
        let _ = writeln!(s, "output out{o}");
    }
    s
}

fn runner() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tilelang_cpu/run.py")
}

/// Runs the module on the stand-in and reads back the outputs.
fn run_module(
    dir: &Path,
    stem: &str,
    module: &str,
    job: &str,
    launch: &Launch,
    lb: &Bindings,
) -> Result<Vec<Tensor>, String> {
    let (py, jb, out) =
        (dir.join(format!("{stem}.py")), dir.join(format!("{stem}.job")), dir.join(format!("{stem}.out")));
    std::fs::write(&py, module).map_err(|e| e.to_string())?;
    std::fs::write(&jb, job).map_err(|e| e.to_string())?;
    let run = Command::new("python3")
        .arg(runner())
        .args([&py, &jb, &out])
        .output()
        .map_err(|e| format!("python3 is needed to run the TileLang modules: {e}"))?;
    if !run.status.success() {
        return Err(format!(
            "the TileLang module failed ({}):\n{}",
            py.display(),
            String::from_utf8_lossy(&run.stderr)
        ));
    }
    let text = std::fs::read_to_string(&out).map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    for (o, line) in text.lines().enumerate() {
        let mut words = line.split_whitespace();
        let key = words.next().unwrap_or_default();
        if key != format!("out{o}") {
            return Err(format!("output line {o} is `{key}`"));
        }
        let data: Result<Vec<f64>, _> = words.map(str::parse::<f64>).collect();
        let data = data.map_err(|e| format!("output {key}: {e}"))?;
        let shape = lb.extents(&launch.graph.outputs[o].decl.shape);
        got.push(Tensor { shape, data });
    }
    Ok(got)
}

/// The first launch of `launches` made of tile kernels alone: a fallback stage has no
/// TileLang rendering.
fn first_tiled<'a>(mut launches: impl Iterator<Item = &'a Launch>) -> Option<&'a Launch> {
    launches.find(|l| l.kernels.iter().all(|k| k.tile().is_some()))
}

/// Emits `launch` as TileLang, runs it at the graph's bindings `b` and checks its outputs
/// against the oracle.
fn check_launch(
    graph: &ValidGraph,
    b: &Bindings,
    launch: &Launch,
    inputs: &[Tensor],
    oracle: &Oracle,
    stem: &str,
    dir: &Path,
) -> Result<(), String> {
    let mut lb = Bindings::of_table(launch.dims());
    lb.values[..b.values.len()].copy_from_slice(&b.values);
    lb.complete(launch.dims());
    let module = tilelang::emit_launch(launch, &graph.name);
    let got = run_module(dir, stem, &module, &job(launch, &lb, inputs), launch, &lb)?;
    oracle.check(graph, &got).map_err(|e| format!("{e} as TileLang"))
}

/// Draws inputs for `seed` at `scale`, then checks `launch` on them as [`check_launch`] does.
fn check_at(
    graph: &ValidGraph,
    b: &Bindings,
    launch: &Launch,
    (seed, scale): (u64, &InputScale),
    stem: &str,
    dir: &Path,
) -> Result<(), String> {
    let inputs = random_inputs(graph, b, seed, scale);
    let oracle = Oracle::new(graph, b, &inputs, seed)?;
    check_launch(graph, b, launch, &inputs, &oracle, stem, dir)
}

fn run_case(seed: u64, opts: &Options, dir: &Path) -> Result<Outcome, String> {
    let case = generate(seed);
    let fail = |what: String| format!("seed {seed}: {what}\n{}", case.yaml);
    let (graph, b) = checked(&case).map_err(fail)?;
    let compiled = compile(&graph, opts).map_err(|e| fail(format!("compile: {e}")))?;
    let Some(launch) = first_tiled(compiled.ranked.iter().map(|r| &r.candidate.launch)) else {
        return Ok(Outcome::Fallback);
    };
    let scale = InputScale { default: case.scale, per_input: Vec::new() };
    check_at(&graph, &b, launch, (seed, &scale), &format!("gen_{seed}"), dir)
        .map_err(|e| fail(format!("{e} at {:?}", case.extents)))?;
    Ok(Outcome::Checked)
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

#[test]
fn generated_declarations_run_correctly_as_tilelang() {
    let cases = env_u64("CLEAVE_GEN_TL_CASES", 120);
    let first = env_u64("CLEAVE_GEN_SEED", 1);
    let dir = scratch("generated_tilelang");
    let opts = options();
    let (mut failures, mut fallback) = (Vec::new(), 0);
    for seed in first..first + cases {
        match caught(seed, || run_case(seed, &opts, &dir)) {
            Ok(Outcome::Checked) => {}
            Ok(Outcome::Fallback) => fallback += 1,
            Err(e) => failures.push(e),
        }
    }
    eprintln!(
        "{cases} generated declarations as TileLang: {} run, {fallback} with no launch of tile kernels alone, {} failures",
        cases - fallback - failures.len() as u64,
        failures.len()
    );
    assert!(failures.is_empty(), "{} of {cases} cases failed:\n{}", failures.len(), failures.join("\n"));
    // About half the cases have an exp that no reduction stabilizes or tile maps that
    // conflict, and only the fallback; the rest must be enough to mean something.
    assert!(4 * (cases - fallback) >= cases, "{fallback} of {cases} cases have no launch of tile kernels alone");
}

/// The transformed forms of the paper's subgraphs (attention with an online softmax, GQA,
/// RMSNorm and SwiGLU into a product, a product and a row sum, back-to-back products, a
/// softmax), each one's best launch of tile kernels, at odd extents of their dynamic dims.
#[test]
fn transformed_forms_run_correctly_as_tilelang() {
    let text = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/cleave-core/tests/forms/transformed.yaml"))
        .expect("fixture");
    let forms = check_source(&text).expect("forms check");
    let dir = scratch("forms_tilelang");
    let mut failures = Vec::new();
    for (i, (_, g)) in forms.kernels.iter().enumerate() {
        let (cands, stats) =
            candidates(g, &Targets::new(&[SM80]), 1, &format!("cleave_{}", g.name)).expect("schedules");
        let Some(launch) = first_tiled(cands.iter().map(|c| &c.launch)) else {
            failures.push(format!("{}: no launch of tile kernels alone ({stats:?})", g.name));
            continue;
        };
        let mut b = Bindings::of_table(&g.dims);
        for (v, d) in g.dims.iter() {
            if d.dynamic {
                b.values[v.index()] = [37, 45, 71, 5][v.index() % 4];
            }
        }
        b.complete(&g.dims);
        let scale = InputScale { default: 4.0, per_input: vec![] };
        if let Err(e) = check_at(g, &b, launch, (11 + i as u64, &scale), &g.name, &dir) {
            failures.push(format!("{}: {e}", g.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Loops split across blocks at a ragged extent: a decode attention split along its keys and a
/// product of one row split along its inner axis. The last tiles of each block's part run past
/// the part's end but not the tensor's, so only the tiles' limits keep a part from reading its
/// neighbour's keys or terms.
#[test]
fn split_loops_run_correctly_as_tilelang() {
    let text = "kernels:
  - name: split_decode
    dims: { h: 2, q: 1, l: { value: 4096, dynamic: true }, d: 64 }
    inputs: { qt: \"f16[h, q, d]\", k: \"f16[h, l, d]\", v: \"f16[h, l, d]\" }
    outputs: { o: \"f16[h, q, d]\" }
    body: |
      o = matmul(softmax(matmul(qt, transpose(k)) * 0.125, axis=-1), v)
  - name: split_gemv
    dims: { m: 1, k: { value: 8192, dynamic: true }, n: 64 }
    inputs: { x: \"f16[m, k]\", w: \"f16[k, n]\" }
    outputs: { y: \"f32[m, n]\" }
    body: |
      y = matmul(x, w)
";
    let module = check_source(text.as_bytes()).expect("checks");
    let dir = scratch("split_tilelang");
    let mut failures = Vec::new();
    for (i, (_, g)) in module.kernels.iter().enumerate() {
        let compiled = compile(g, &Options::default()).expect("compiles");
        let launch = first_tiled(compiled.ranked.iter().map(|r| &r.candidate.launch))
            .unwrap_or_else(|| panic!("{}: {:?}", g.name, compiled.stats));
        assert!(launch.kernels.len() > 1, "{}: the best launch is split", g.name);
        let mut b = Bindings::of_table(&g.dims);
        for (v, d) in g.dims.iter() {
            if d.dynamic {
                // Odd: each part of a split into an even count ends inside a tile.
                b.values[v.index()] = [3001, 5001][i];
            }
        }
        b.complete(&g.dims);
        let scale = InputScale { default: 4.0, per_input: vec![] };
        if let Err(e) = check_at(g, &b, launch, (101 + i as u64, &scale), &g.name, &dir) {
            failures.push(format!("{}: {e}", g.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The corpus (`tests/corpus/`) at the extents and scales of its `# run:` lines, each kernel's
/// best launch of tile kernels under the generator's bounded search. Kernels over paged or
/// ragged requests are left out: the TileLang text addresses their tensors densely, not
/// through the page and offset tables the CUDA reads.
#[test]
fn corpus_kernels_run_correctly_as_tilelang() {
    let dir = scratch("corpus_tilelang");
    let opts = options();
    let (mut failures, mut run, mut fallback) = (Vec::new(), 0, 0);
    for (i, e) in corpus().iter().enumerate() {
        let g = &e.graph;
        let requests = g.dims.iter().any(|(_, d)| d.per_request.is_some());
        if requests || g.inputs.iter().any(|x| x.decl.layout.is_some() || !x.decl.dtype.is_float()) {
            continue;
        }
        let fail = |what: String| format!("{} ({}): {what}", e.name, e.file.display());
        let checked = e.run().and_then(|(b, scale)| {
            let compiled = compile(g, &opts).map_err(|err| format!("compile: {err}"))?;
            let Some(launch) = first_tiled(compiled.ranked.iter().map(|r| &r.candidate.launch)) else {
                return Ok(false);
            };
            check_at(g, &b, launch, (7 + i as u64, &scale), &e.name, &dir).map(|()| true)
        });
        match checked {
            Ok(true) => run += 1,
            Ok(false) => fallback += 1,
            Err(err) => failures.push(fail(err)),
        }
    }
    eprintln!(
        "corpus as TileLang: {run} run, {fallback} with no launch of tile kernels alone, {} failures",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(run >= 60, "only {run} corpus kernels ran as TileLang");
}
