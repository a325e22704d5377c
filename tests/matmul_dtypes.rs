//! Matmuls over every pair of operand dtypes: the tile interpreter (the scheduler's spec) and
//! the generated CUDA on the host emulator both match the f64 reference within the tolerance of
//! the types, and agree with each other, for the fused schedule where one exists and for the
//! fallback. Tensor-core products appear only for f16 × f16 and bf16 × bf16.

use cleave::emulate;
use cleave::runtime::host::EmuOptions;
use cleave_core::codegen::plan::plan_data;
use cleave_core::front::check_source;
use cleave_core::graph::{Bindings, DType};
use cleave_core::pipeline::{compile, Options};
use cleave_core::plan::{interp, Kernel, Launch, Stmt};
use cleave_core::reference::{eval, max_rel_err, random_inputs, tolerance, InputScale};

const DTYPES: [DType; 3] = [DType::F16, DType::BF16, DType::F32];

fn name(d: DType) -> &'static str {
    d.name()
}

fn has_mma(body: &[Stmt]) -> bool {
    body.iter().any(|s| match s {
        Stmt::Mma { .. } => true,
        Stmt::Loop { body, .. } => has_mma(body),
        _ => false,
    })
}

fn uses_tensor_cores(l: &Launch) -> bool {
    l.kernels.iter().any(|k| matches!(k, Kernel::Tile(t) if has_mma(&t.body)))
}

#[test]
fn every_operand_dtype_pair_agrees_in_the_interpreter_and_the_emulator() {
    let mut failures = Vec::new();
    for a in DTYPES {
        for b in DTYPES {
            // A plain product with an input left operand, and a torch-layout one whose left
            // operand is computed (rounded to the right operand's type on the tensor-core path).
            let yaml = format!(
                "kernels:\n  - name: mm_{a}_{b}\n    dims: {{ t: {{ value: 64, dynamic: true }}, k: 96, n: 64 }}\n    inputs: {{ x: \"{a}[t, k]\", w: \"{b}[k, n]\", wt: \"{b}[n, k]\" }}\n    outputs: {{ y: \"f32[t, n]\", z: \"f32[t, n]\" }}\n    body: |\n      y = matmul(x, w)\n      z = matmul(silu(x), transpose(wt))\n",
                a = name(a),
                b = name(b)
            );
            let g = check_source(yaml.as_bytes()).expect("the declaration checks").kernels.remove(0).1;
            let c = compile(&g, &Options::default()).unwrap_or_else(|e| panic!("{}: {e}", g.name));
            // Two inputs of one 16-bit type go to the tensor cores; so does a left operand
            // computed from f32 inputs, rounded to a 16-bit right operand's type (`z` of an
            // f32 `x`, its own tile kernel beside `y`'s fallback stages). Nothing else does.
            let exact_pair = a == b && a != DType::F32;
            let expected = exact_pair || (a == DType::F32 && b != DType::F32);
            if c.ranked.iter().any(|r| uses_tensor_cores(&r.candidate.launch)) != expected {
                failures.push(format!("{}: tensor cores {}", g.name, if expected { "missing" } else { "used" }));
            }
            let mut b_ = Bindings::of_table(&g.dims);
            for (v, d) in g.dims.iter() {
                if d.dynamic {
                    b_.values[v.index()] = 37;
                }
            }
            let inputs = random_inputs(&g, &b_, 3, &InputScale { default: 2.0, per_input: vec![] });
            let want = eval(&g, &b_, &inputs).expect("reference");
            let tol = tolerance(&g, &b_, 0.0);
            // The best launch with tile kernels (if any; beside fallback stages, when one
            // output has none) and the fallback.
            let tile =
                c.ranked.iter().find(|r| r.candidate.launch.kernels.iter().any(|k| matches!(k, Kernel::Tile(_))));
            let stage =
                c.ranked.iter().find(|r| r.candidate.launch.kernels.iter().all(|k| matches!(k, Kernel::Stage(_))));
            if stage.is_none() {
                failures.push(format!("{}: no fallback among the kept launches", g.name));
            }
            for r in tile.into_iter().chain(stage) {
                let launch = &r.candidate.launch;
                let mut lb = Bindings::of_table(launch.dims());
                lb.values[..b_.values.len()].copy_from_slice(&b_.values);
                lb.complete(launch.dims());
                let spec = interp::run(launch, &lb, &inputs, 1).expect("interpreter");
                let plan = plan_data(launch, &g.name).expect("plan");
                let lib = match emulate::compile(launch, &plan) {
                    Ok(l) => l,
                    Err(e) => {
                        failures.push(format!("{}: {e}", g.name));
                        continue;
                    }
                };
                let emu = match lib.run_with(launch, &lb, &inputs, 1, &EmuOptions::default()) {
                    Ok(o) => o,
                    Err(e) => {
                        failures.push(format!("{}: {e}", g.name));
                        continue;
                    }
                };
                let kind = if uses_tensor_cores(launch) { "mma" } else { "no mma" };
                for o in 0..want.len() {
                    let e_spec = max_rel_err(&spec[o].data, &want[o].data);
                    let e_emu = max_rel_err(&emu[o].data, &want[o].data);
                    let e_pair = max_rel_err(&emu[o].data, &spec[o].data);
                    if !(e_spec <= tol && e_emu <= tol && e_pair <= tol) {
                        failures.push(format!(
                            "{} ({kind}) output {o}: interpreter {e_spec:e}, emulator {e_emu:e}, between them {e_pair:e}, tolerance {tol:e}",
                            g.name
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
