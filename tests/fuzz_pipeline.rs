//! A seeded, bounded fuzz loop over the whole pipeline: real declarations (the shipped
//! `kernels.yaml` and the corpus) are mutated as text — dims resized or made dynamic, dtypes,
//! axes and literals changed, lines dropped or duplicated, operands swapped, functions renamed,
//! bytes inserted — and every mutant runs check → search → schedule → emit (CUDA, TileLang and
//! the Rust launchers), with small budgets. A mutant may be refused, but only with a located
//! diagnostic; past the front end nothing may panic, and every valid mutant must give a launch
//! whose generated sources are produced. The first few valid mutants also run on the emulator.
//!
//! `CLEAVE_FUZZ_CASES=N` sets the number of mutants (default 120), `CLEAVE_FUZZ_SEED=S` the
//! first seed, `CLEAVE_FUZZ_SECONDS=T` stops after T seconds (a long run: a huge N and a time).

// The summary goes to stderr, where `cargo test` shows it.
#![allow(clippy::print_stderr)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use cleave::emulate;
use cleave::runtime::host::EmuOptions;
use cleave_core::codegen::plan::plan_data;
use cleave_core::codegen::rust::{module_text, ModuleSpec, TargetPlan};
use cleave_core::codegen::{cuda, tilelang};
use cleave_core::front::check_source;
use cleave_core::graph::Bindings;
use cleave_core::pipeline::{compile, symbol_prefix, Options};
use cleave_core::reference::{
    eval, eval_buffers, max_rel_err, random_buffers, random_inputs, tolerance, InputScale, Requests, Rng,
};

/// The seeds: every declaration of the shipped file and the corpus, one YAML file each.
fn seeds() -> Vec<String> {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut files = vec![format!("{root}/kernels.yaml")];
    let mut corpus: Vec<String> = std::fs::read_dir(format!("{root}/tests/corpus"))
        .expect("corpus")
        .map(|e| e.expect("entry").path().display().to_string())
        .filter(|p| p.ends_with(".yaml"))
        .collect();
    corpus.sort();
    files.extend(corpus);
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("seed file");
        // Split the `kernels:` list into one file per kernel, comments dropped.
        let mut current = String::new();
        for line in text.lines() {
            if line.trim_start().starts_with('#') || line.trim() == "kernels:" {
                continue;
            }
            if line.trim_start().starts_with("- name:") && !current.is_empty() {
                out.push(format!("kernels:\n{current}"));
                current.clear();
            }
            if !line.trim().is_empty() {
                current.push_str(line);
                current.push('\n');
            }
        }
        if !current.is_empty() {
            out.push(format!("kernels:\n{current}"));
        }
    }
    out
}

const FUNCS: [&str; 12] =
    ["exp", "log", "sqrt", "rsqrt", "square", "recip", "silu", "sigmoid", "gelu", "sum", "max", "softmax"];

/// One random edit of a declaration's text.
fn mutate(text: &str, rng: &mut Rng) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let body_start = lines.iter().position(|l| l.trim() == "body: |").map_or(lines.len(), |i| i + 1);
    let pick = |rng: &mut Rng, n: usize| rng.below(n.max(1) as u64) as usize;
    let numbers = ["1", "3", "7", "16", "17", "48", "64", "100", "1000", "65536", "0", "-1", "1e39", "2.5"];
    match rng.below(9) {
        // A dim's value, or its dynamic flag.
        0 => {
            if let Some(i) = lines.iter().position(|l| l.trim_start().starts_with("dims:")) {
                let n = numbers[pick(rng, numbers.len())];
                let l = &lines[i];
                let digits: Vec<usize> = l.char_indices().filter(|(_, c)| c.is_ascii_digit()).map(|(j, _)| j).collect();
                if let Some(&j) = digits.get(pick(rng, digits.len())) {
                    let end = l[j..].find(|c: char| !c.is_ascii_digit()).map_or(l.len(), |e| j + e);
                    lines[i] = format!("{}{n}{}", &l[..j], &l[end..]);
                } else {
                    lines[i] = l.replace("dynamic: true", "dynamic: false");
                }
            }
        }
        // A dtype.
        1 => {
            let dt = ["f16", "bf16", "f32", "f64", "i8"][pick(rng, 5)];
            let i = pick(rng, lines.len());
            for from in ["bf16[", "f16[", "f32["] {
                if lines[i].contains(from) {
                    lines[i] = lines[i].replacen(from, &format!("{dt}["), 1);
                    break;
                }
            }
        }
        // An axis, a literal or a number in the body.
        2 => {
            if body_start < lines.len() {
                let i = body_start + pick(rng, lines.len() - body_start);
                let l = lines[i].clone();
                let digits: Vec<usize> = l.char_indices().filter(|(_, c)| c.is_ascii_digit()).map(|(j, _)| j).collect();
                if let Some(&j) = digits.get(pick(rng, digits.len())) {
                    let n = numbers[pick(rng, numbers.len())];
                    lines[i] = format!("{}{n}{}", &l[..j], &l[j + 1..]);
                } else {
                    lines[i] = format!("{l} * 0.5");
                }
            }
        }
        // Drop a line.
        3 => {
            let i = pick(rng, lines.len());
            lines.remove(i);
        }
        // Duplicate a line.
        4 => {
            let i = pick(rng, lines.len());
            let l = lines[i].clone();
            lines.insert(i, l);
        }
        // Rename a function.
        5 => {
            if body_start < lines.len() {
                let i = body_start + pick(rng, lines.len() - body_start);
                let to = FUNCS[pick(rng, FUNCS.len())];
                for f in FUNCS {
                    if lines[i].contains(&format!("{f}(")) {
                        lines[i] = lines[i].replacen(&format!("{f}("), &format!("{to}("), 1);
                        break;
                    }
                }
            }
        }
        // Swap the operands of a binary op or a matmul.
        6 => {
            if body_start < lines.len() {
                let i = body_start + pick(rng, lines.len() - body_start);
                if let Some((lhs, rhs)) = lines[i].split_once(" = ") {
                    for op in [" * ", " + ", " / ", " - ", ", "] {
                        if let Some((a, b)) = rhs.split_once(op) {
                            lines[i] = format!("{lhs} = {b}{op}{a}");
                            break;
                        }
                    }
                }
            }
        }
        // Wrap a statement's value in another function, or a transpose.
        7 => {
            if body_start < lines.len() {
                let i = body_start + pick(rng, lines.len() - body_start);
                if let Some((lhs, rhs)) = lines[i].split_once(" = ") {
                    let f = ["exp", "transpose", "silu", "square", "softmax"][pick(rng, 5)];
                    lines[i] = format!("{lhs} = {f}({rhs})");
                }
            }
        }
        // A random byte somewhere.
        _ => {
            let i = pick(rng, lines.len());
            let chars: Vec<char> = lines[i].chars().collect();
            let at = pick(rng, chars.len() + 1);
            let c = ['(', ')', ',', ':', '-', '[', ']', '{', '}', 'x', '"', '\t', '\r', 'é', '0'][pick(rng, 15)];
            let mut s: String = chars[..at].iter().collect();
            s.push(c);
            s.extend(&chars[at..]);
            lines[i] = s;
        }
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// What one mutant did.
enum Outcome {
    Refused,
    Compiled { emulated: bool },
}

fn run_one(text: &str, seed: u64, opts: &Options, emulate_it: bool) -> Result<Outcome, String> {
    let module = match check_source(text.as_bytes()) {
        Ok(m) => m,
        Err(diags) => {
            // A refusal must say where.
            return if diags.iter().all(|d| d.pos.line >= 1 && d.pos.col >= 1 && !d.message.is_empty()) {
                Ok(Outcome::Refused)
            } else {
                Err(format!("an unlocated diagnostic: {diags:?}"))
            };
        }
    };
    let mut emulated = false;
    for (decl, g) in &module.kernels {
        let c = compile(g, opts).map_err(|e| format!("compile: {e}"))?;
        let launch = c.best();
        let _ = cuda::emit_launch(launch, &decl.name);
        let _ = tilelang::emit_launch(launch, &decl.name);
        let plan = plan_data(launch, &decl.name).map_err(|e| format!("plan data: {e}"))?;
        let host: Vec<String> = launch.kernels.iter().map(|k| format!("cleave_emu_{}", k.symbol())).collect();
        let plans = [TargetPlan { target: "sm_80, sm_90".into(), min_cc: 80, plan: plan.clone(), shares: None }];
        let spec =
            ModuleSpec { decl, plans: &plans, host_symbols: std::slice::from_ref(&host), fatbin: "None", summary: &[] };
        let rust = module_text(&spec).map_err(|e| format!("rust module: {e}"))?;
        syn::parse_file(&rust).map_err(|e| format!("the launcher module does not parse: {e}"))?;
        assert!(launch.kernels.iter().all(|k| k.symbol().starts_with(&symbol_prefix(&decl.name))));
        if emulate_it {
            // Small extents keep the emulator quick; the error must be within tolerance.
            let mut b = Bindings::of_table(&g.dims);
            for (v, d) in g.dims.iter() {
                if d.dynamic {
                    b.values[v.index()] = 1 + (seed + v.index() as u64) % 37;
                }
            }
            let elems: u64 = g.nodes.iter().map(|n| n.shape.iter().map(|d| b.extent(*d) as u64).product::<u64>()).sum();
            if elems > 1 << 20 {
                continue;
            }
            // A graph with layouts runs on buffers with random, valid index tables (whose sizes
            // set the extents they index), against the reference evaluated request by request,
            // on the elements some request owns.
            let buffers = g.dims.has_per_request()
                || g.inputs
                    .iter()
                    .map(|i| &i.decl)
                    .chain(g.outputs.iter().map(|o| &o.decl))
                    .any(|t| t.layout.is_some());
            let (inputs, want, written) = if buffers {
                let inputs = random_buffers(g, &mut b, seed, &InputScale::default(), &Requests::default());
                let e = eval_buffers(g, &b, &inputs).map_err(|e| format!("reference: {e}"))?;
                (inputs, e.outputs, Some(e.written))
            } else {
                let inputs = random_inputs(g, &b, seed, &InputScale::default());
                let want = eval(g, &b, &inputs).map_err(|e| format!("reference: {e}"))?;
                (inputs, want, None)
            };
            let mut lb = Bindings::of_table(launch.dims());
            lb.values[..b.values.len()].copy_from_slice(&b.values);
            lb.complete(launch.dims());
            let lib = emulate::compile(launch, &plan)?;
            let got = lib.run_with(launch, &lb, &inputs, seed, &EmuOptions::default())?;
            let tol = tolerance(g, &b, 40.0);
            for (o, (gt, wt)) in got.iter().zip(&want).enumerate() {
                let owned = |t: &[f64]| -> Vec<f64> {
                    match &written {
                        Some(w) => t.iter().zip(&w[o]).filter(|(_, ok)| **ok).map(|(x, _)| *x).collect(),
                        None => t.to_vec(),
                    }
                };
                let (gt, wt) = (owned(&gt.data), owned(&wt.data));
                let e = max_rel_err(&gt, &wt);
                // A reference that is not finite (a mutant that overflows its own f64
                // definition) proves nothing either way.
                if wt.iter().all(|x| x.is_finite()) && e > tol {
                    return Err(format!("output {o}: max_rel_err {e:e} above {tol:e} on the emulator"));
                }
            }
            emulated = true;
        }
    }
    Ok(Outcome::Compiled { emulated })
}

fn env_u64(key: &str, default: u64) -> u64 {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn mutated_declarations_are_refused_with_a_position_or_compile() {
    let seeds = seeds();
    assert!(seeds.len() >= 70, "{} seed declarations", seeds.len());
    let cases = env_u64("CLEAVE_FUZZ_CASES", 120);
    let first = env_u64("CLEAVE_FUZZ_SEED", 1);
    let mut opts = Options::default();
    // Budgets: a small search, bounded by states; the shipped kernels' long searches are not the
    // point here.
    opts.search.max_states = 3_000;
    opts.search.time_limit = Duration::from_secs(20);
    opts.top_k = 1;
    let (mut refused, mut compiled, mut emulated) = (0, 0, 0);
    let mut failures = Vec::new();
    let deadline = std::env::var("CLEAVE_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(|s| std::time::Instant::now() + Duration::from_secs(s));
    let mut ran = 0u64;
    // A mutant that once exhausted memory in the e-graph saturation (shift laws in both
    // directions), kept as a regression.
    let regressions = [102_841];
    for seed in (first..first + cases).chain(regressions) {
        if deadline.is_some_and(|d| std::time::Instant::now() > d) {
            break;
        }
        ran += 1;
        let mut rng = Rng::new(seed);
        let mut text = seeds[rng.below(seeds.len() as u64) as usize].clone();
        for _ in 0..1 + rng.below(3) {
            text = mutate(&text, &mut rng);
        }
        if std::env::var_os("CLEAVE_FUZZ_VERBOSE").is_some() {
            eprintln!("seed {seed}\n{text}");
        }
        let emulate_it = emulated < 4;
        match catch_unwind(AssertUnwindSafe(|| run_one(&text, seed, &opts, emulate_it))) {
            Ok(Ok(Outcome::Refused)) => refused += 1,
            Ok(Ok(Outcome::Compiled { emulated: e })) => {
                compiled += 1;
                emulated += usize::from(e);
            }
            Ok(Err(e)) => failures.push(format!("seed {seed}: {e}\n{text}")),
            Err(p) => {
                let msg =
                    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                failures.push(format!("seed {seed}: panic: {}\n{text}", msg.unwrap_or_default()));
            }
        }
    }
    eprintln!(
        "{ran} mutants: {refused} refused with a position, {compiled} compiled ({emulated} emulated), {} failures",
        failures.len()
    );
    assert!(compiled > 0 && refused > 0, "the mutations should produce both valid and invalid declarations");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
