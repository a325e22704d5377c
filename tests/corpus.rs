//! The corpus of `tests/corpus/`: declarations written the way users write them, beyond the
//! shipped kernels. Every one checks, covers its share of the language (asserted below from the
//! graphs, not from a list), and runs through `cleave run --backend emulate` at the odd extents
//! and input scales of its `# run:` comment, under the race, hazard and bounds checks, within
//! the tolerance of its types against the f64 reference.
//!
//! `CLEAVE_CORPUS_TABLE=FILE` writes the table of results (dims, kernel kinds, error,
//! tolerance) that `bench/RESULTS.md` quotes.

#[path = "corpus/entries.rs"]
mod entries;

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::Mutex;

use cleave_core::front::check_source;
use cleave_core::graph::{BinaryOp, Op, ReduceOp, UnaryOp};
use entries::corpus;

#[test]
fn the_corpus_is_large_distinct_and_covers_the_language() {
    let entries = corpus();
    assert!(entries.len() >= 40, "{} corpus kernels", entries.len());
    let shipped =
        check_source(&std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/kernels.yaml")).expect("kernels.yaml"))
            .expect("kernels.yaml checks");
    let mut names = BTreeSet::new();
    for (d, _) in &shipped.kernels {
        names.insert(d.name.clone());
    }
    for e in &entries {
        assert!(names.insert(e.name.clone()), "kernel name `{}` is used twice", e.name);
        // Every `# run:` line names only dims of its kernel, and scales that parse.
        if let Err(err) = e.run() {
            panic!("{}: {err}", e.name);
        }
    }
    // What the graphs contain, over the whole corpus.
    let mut unary = BTreeSet::new();
    let mut binary = BTreeSet::new();
    let mut reduce = BTreeSet::new();
    let (mut matmul, mut transpose) = (false, false);
    let mut dtypes = BTreeSet::new();
    let mut mixed_matmul = false;
    let mut reduced_axes_from_end = BTreeSet::new();
    let mut ranks = BTreeSet::new();
    let (mut several_outputs, mut output_read, mut scalar_input, mut elementwise_only, mut reduction_only) =
        (false, false, false, false, false);
    let mut torch_layout = false;
    let (mut ragged, mut paged, mut masked) = (false, false, false);
    for e in &entries {
        let g = &e.graph;
        for (_, d) in g.dims.iter() {
            match d.per_request.as_ref().map(|p| &p.kind) {
                Some(cleave_core::graph::PerRequestKind::Ragged { .. }) => ragged = true,
                Some(cleave_core::graph::PerRequestKind::Paged { .. }) => paged = true,
                None => {}
            }
        }
        masked |= g.nodes.iter().any(|n| matches!(n.op, Op::Mask(_)));
        let users = g.users();
        let mut has_reduce = false;
        let mut has_matmul = false;
        for n in &g.nodes {
            match n.op {
                Op::Unary(u) => {
                    unary.insert(u.name());
                }
                Op::Binary(b) => {
                    binary.insert(format!("{b:?}"));
                }
                Op::Reduce(r, axis) => {
                    has_reduce = true;
                    reduce.insert(format!("{r:?}"));
                    let rank = g.shape(n.args[0]).len();
                    reduced_axes_from_end.insert(rank - axis as usize);
                }
                Op::MatMul => {
                    has_matmul = true;
                    matmul = true;
                    let dt = |a: cleave_core::graph::NodeId| match g.node(a).op {
                        Op::Input(k) => Some(g.inputs[k as usize].decl.dtype),
                        _ => None,
                    };
                    if let (Some(a), Some(b)) = (dt(n.args[0]), dt(n.args[1])) {
                        mixed_matmul |= a != b;
                    }
                    torch_layout |= matches!(g.node(n.args[1]).op, Op::Transpose);
                }
                Op::Transpose => transpose = true,
                _ => {}
            }
        }
        for input in &g.inputs {
            dtypes.insert(input.decl.dtype);
            ranks.insert(input.decl.shape.len());
            scalar_input |= input.decl.shape.iter().all(|d| matches!(d, cleave_core::graph::Dim::One));
        }
        several_outputs |= g.outputs.len() > 1;
        output_read |= g.outputs.iter().any(|o| !users[o.node.index()].is_empty());
        elementwise_only |= !has_reduce && !has_matmul;
        reduction_only |= has_reduce && !has_matmul;
    }
    for u in UnaryOp::ALL {
        assert!(unary.contains(u.name()), "no corpus kernel uses `{}`", u.name());
    }
    for b in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max] {
        assert!(binary.contains(&format!("{b:?}")), "no corpus kernel uses {b:?}");
    }
    for r in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
        assert!(reduce.contains(&format!("{r:?}")), "no corpus kernel reduces with {r:?}");
    }
    assert!(matmul && transpose && mixed_matmul && torch_layout);
    assert_eq!(dtypes.len(), 4, "every dtype, i32 index tables included: {dtypes:?}");
    for from_end in 1..=3 {
        assert!(reduced_axes_from_end.contains(&from_end), "no reduction over axis -{from_end}");
    }
    assert!(ranks.contains(&4) && ranks.contains(&5), "4-D and 5-D inputs: {ranks:?}");
    assert!(ragged && paged && masked, "ragged and paged requests and causal masks");
    assert!(several_outputs && output_read && scalar_input && elementwise_only && reduction_only);
}

#[test]
fn every_corpus_kernel_passes_on_the_emulator() {
    let entries = corpus();
    let queue = Mutex::new((0..entries.len()).collect::<Vec<_>>());
    let results = Mutex::new(Vec::new());
    let schedules = ["round-robin", "random", "run-ahead"];
    // Two kernels at a time: each run searches, compiles a C++ library and runs the emulator.
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let Some(i) = queue.lock().expect("queue").pop() else { break };
                let e = &entries[i];
                let out = Command::new(env!("CARGO_BIN_EXE_cleave"))
                    .arg("run")
                    .arg(&e.file)
                    .args(["--kernel", &e.name, "--backend", "emulate", "--checks", "all"])
                    .args(["--schedule", schedules[i % schedules.len()]])
                    .args(&e.args)
                    .output()
                    .expect("cleave runs");
                let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
                let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
                results.lock().expect("results").push((i, out.status.code(), stdout, stderr));
            });
        }
    });
    let mut results = results.into_inner().expect("results");
    results.sort_by_key(|r| r.0);
    let mut failures = Vec::new();
    let mut table =
        String::from("| kernel | dims | launches | kinds | max_rel_err | tolerance |\n|---|---|---|---|---|---|\n");
    for (i, code, stdout, stderr) in &results {
        let e = &entries[*i];
        let value = |key: &str| -> Option<&str> {
            stdout.lines().flat_map(|l| l.split_whitespace()).find_map(|w| w.strip_prefix(key))
        };
        let num = |key: &str| value(key).and_then(|v| v.parse::<f64>().ok());
        match (code, num("max_rel_err="), num("tolerance=")) {
            // A tolerance past the loosest type's (bf16: 40 units, plus accumulation) would
            // let anything pass.
            (Some(0), Some(err), Some(tol)) if err <= tol && tol < 0.2 => {}
            _ => failures.push(format!("{}: exit {code:?}\n{stdout}{stderr}", e.name)),
        }
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            e.name,
            value("dims=").unwrap_or("?"),
            value("launches=").unwrap_or("?"),
            value("kinds=").unwrap_or("?"),
            value("max_rel_err=").unwrap_or("?"),
            value("tolerance=").unwrap_or("?"),
        ));
    }
    if let Ok(path) = std::env::var("CLEAVE_CORPUS_TABLE") {
        std::fs::write(&path, &table).expect("write the corpus table");
    }
    assert_eq!(results.len(), entries.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A user's own max subtraction compiles to the same kernel as the plain softmax: the search
/// finds the plain form's graph (shift invariance is a law of its abstraction), and the ranking
/// picks it. The two declarations differ only in how the softmax is written.
#[test]
fn hand_stabilized_attention_compiles_to_the_plain_forms_kernels() {
    let entries = corpus();
    let cuda = |name: &str| {
        let e = entries.iter().find(|e| e.name == name).unwrap_or_else(|| panic!("no corpus kernel {name}"));
        // Bounded by states, not by the clock: under a loaded machine a time limit would stop
        // the search at a different point and the comparison would test the machine's speed.
        let mut opts = cleave_core::pipeline::Options::default();
        opts.search.time_limit = std::time::Duration::from_secs(3600);
        let c = cleave_core::pipeline::compile(&e.graph, &opts).unwrap_or_else(|err| panic!("{name}: {err}"));
        if let Ok(s) = &c.search {
            assert_ne!(s.stop_reason, cleave_core::superopt::StopReason::TimeLimit, "{name}");
        }
        cleave_core::codegen::cuda::emit_launch(c.best(), name).replace(name, "KERNEL")
    };
    let plain = cuda("attn_plain");
    let hand = cuda("attn_hand_stabilized");
    assert!(plain.contains("cleave_exp_diff"), "the plain form gets a running max");
    assert!(plain == hand, "the hand-stabilized form compiles to different CUDA");
}
