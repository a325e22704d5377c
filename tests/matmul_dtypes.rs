//! Matmuls over every pair of operand dtypes: the tile interpreter (the scheduler's spec) and
//! the generated CUDA on the host emulator both match the f64 reference within the tolerance of
//! the types, and agree with each other, for the fused schedule where one exists and for the
//! fallback. Every pair runs on the tensor cores: two inputs of one 16-bit type on 16-bit
//! products, anything else on tf32 ones, an f32 operand split into a head and a tail.

use cleave::emulate;
use cleave::runtime::host::EmuOptions;
use cleave_core::codegen::plan::plan_data;
use cleave_core::front::check_source;
use cleave_core::graph::{Bindings, DType};
use cleave_core::pipeline::{compile, Options};
use cleave_core::plan::program::flatten;
use cleave_core::plan::{interp, Kernel, Launch, MmaKind, Stmt};
use cleave_core::reference::{eval, max_rel_err, random_inputs, tolerance, InputScale};
use std::collections::BTreeSet;

const DTYPES: [DType; 3] = [DType::F16, DType::BF16, DType::F32];

fn name(d: DType) -> &'static str {
    d.name()
}

/// The kinds of the launch's tensor-core products, in a stable order.
fn mma_kinds(l: &Launch) -> BTreeSet<String> {
    let tiles = l.kernels.iter().filter_map(|k| k.tile());
    tiles
        .flat_map(|k| {
            flatten(&k.body).into_iter().filter_map(|s| match s {
                Stmt::Mma { kind, .. } => Some(format!("{kind:?}")),
                _ => None,
            })
        })
        .collect()
}

/// The kind of a product of a left operand of type `a` (`None`: computed in f32 registers from
/// inputs of type `from`) and a right input of type `b`.
fn expected_kind(a: Option<DType>, from: DType, b: DType) -> MmaKind {
    let half = b != DType::F32
        && match a {
            Some(a) => a == b,
            // A computed operand is rounded to the right operand's type where its inputs'
            // precision survives that: inputs of that type, or f32 ones by design.
            None => from == b || from == DType::F32,
        };
    if half {
        MmaKind::Half
    } else {
        MmaKind::Tf32 { a_split: a.is_none_or(|a| a == DType::F32), b_split: b == DType::F32 }
    }
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
            // `y` multiplies the inputs as declared, `z` a computed left operand.
            let expected: BTreeSet<String> =
                [expected_kind(Some(a), a, b), expected_kind(None, a, b)].iter().map(|k| format!("{k:?}")).collect();
            let all_tile = c.ranked.iter().find(|r| r.candidate.launch.kernels.iter().all(|k| k.tile().is_some()));
            match all_tile {
                Some(r) if mma_kinds(&r.candidate.launch) == expected => {}
                Some(r) => failures.push(format!(
                    "{}: products {:?}, expected {expected:?}",
                    g.name,
                    mma_kinds(&r.candidate.launch)
                )),
                None => failures.push(format!("{}: no launch of tile kernels alone", g.name)),
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
            // The best launch of tile kernels alone and the fallback.
            let stage =
                c.ranked.iter().find(|r| r.candidate.launch.kernels.iter().all(|k| matches!(k, Kernel::Stage(_))));
            if stage.is_none() {
                failures.push(format!("{}: no fallback among the kept launches", g.name));
            }
            for r in all_tile.into_iter().chain(stage) {
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
                let kind = if mma_kinds(launch).is_empty() { "no mma" } else { "mma" };
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
