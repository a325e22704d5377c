//! The generator's random declarations (`cleave-core/tests/generator/`) on the host emulator:
//! each case's best launch, the one a build ships, is emitted as CUDA, compiled for the
//! emulator and run with every check on (bounds, races, hazards), against the same oracle its
//! tile program meets in the interpreter (`cleave-core/tests/generated.rs`). The interpreter
//! runs the tile program; this runs the text nvcc compiles, so a bug of the CUDA generator
//! alone (a store past a tensor, a missing guard, a race) fails here.
//!
//! Each case compiles a C++ library, a few seconds, so the default run is small:
//! `CLEAVE_GEN_EMU_CASES=N` sets the number of cases (default 24), `CLEAVE_GEN_SEED=S` the first
//! seed, the same seeds as the interpreter's run.

// The summary line goes to stderr, where `cargo test` shows it.
#![allow(clippy::print_stderr)]

#[path = "../cleave-core/tests/generator/mod.rs"]
mod generator;

use cleave::emulate;
use cleave::runtime::host::EmuOptions;
use cleave_core::codegen::plan::plan_data;
use cleave_core::graph::Bindings;
use cleave_core::pipeline::{compile, Options};
use cleave_core::plan::Kernel;
use cleave_core::reference::{random_inputs, InputScale};
use generator::{caught, checked, env_u64, generate, options, Oracle};

/// Runs one case's best launch on the emulator; `Err` describes a failure.
fn run_case(seed: u64, opts: &Options) -> Result<(), String> {
    let case = generate(seed);
    let fail = |what: String| format!("seed {seed}: {what}\n{}", case.yaml);
    let (graph, b) = checked(&case).map_err(fail)?;
    let compiled = compile(&graph, opts).map_err(|e| fail(format!("compile: {e}")))?;
    let launch = compiled.best();
    let scale = InputScale { default: case.scale, per_input: Vec::new() };
    let inputs = random_inputs(&graph, &b, seed, &scale);
    let oracle = Oracle::new(&graph, &b, &inputs, seed).map_err(fail)?;
    let mut lb = Bindings::of_table(launch.dims());
    lb.values[..b.values.len()].copy_from_slice(&b.values);
    lb.complete(launch.dims());
    let plan = plan_data(launch, &graph.name).map_err(|e| fail(format!("plan data: {e}")))?;
    let lib = emulate::compile(launch, &plan).map_err(|e| fail(format!("emulator build: {e}")))?;
    let got = lib.run_with(launch, &lb, &inputs, seed, &EmuOptions::default()).map_err(fail)?;
    oracle.check(&graph, &got).map_err(|e| {
        let kinds: Vec<&str> =
            launch.kernels.iter().map(|k| if matches!(k, Kernel::Tile(_)) { "tile" } else { "stage" }).collect();
        fail(format!("{e} on the emulator ({}) at {:?}", kinds.join(","), case.extents))
    })
}

#[test]
fn generated_declarations_run_correctly_as_cuda_on_the_emulator() {
    let cases = env_u64("CLEAVE_GEN_EMU_CASES", 24);
    let first = env_u64("CLEAVE_GEN_SEED", 1);
    let opts = options();
    let mut failures = Vec::new();
    for seed in first..first + cases {
        if let Err(e) = caught(seed, || run_case(seed, &opts)) {
            failures.push(e);
        }
    }
    eprintln!("{cases} generated declarations on the emulator, {} failures", failures.len());
    assert!(failures.is_empty(), "{} of {cases} cases failed:\n{}", failures.len(), failures.join("\n"));
}
