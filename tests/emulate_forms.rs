//! Generated CUDA run on the host emulator: every transformed form's best schedule, compiled
//! from the same source nvcc compiles, matches the f64 reference at odd extents.

use cleave::emulate;
use cleave_core::arch::{Targets, SM80};
use cleave_core::codegen::plan::plan_data;
use cleave_core::front::check_source;
use cleave_core::graph::{Bindings, ValidGraph};
use cleave_core::pipeline::candidates;
use cleave_core::reference::{eval, max_rel_err, random_inputs, InputScale};

fn forms() -> Vec<ValidGraph> {
    let text = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/cleave-core/tests/forms/transformed.yaml"))
        .expect("fixture");
    check_source(&text).expect("forms check").kernels.into_iter().map(|(_, g)| g).collect()
}

#[test]
fn transformed_forms_run_on_the_emulator() {
    let mut failures = Vec::new();
    for g in forms() {
        let scale = if g.name.contains("fa") {
            11.0
        } else if g.name.contains("softmax") {
            100.0
        } else {
            1.0
        };
        let (cands, stats) =
            candidates(&g, &Targets::new(&[SM80]), 1, &format!("cleave_{}", g.name)).expect("schedules");
        let launch = &cands.first().unwrap_or_else(|| panic!("{}: {stats:?}", g.name)).launch;
        let plan = plan_data(launch, &g.name).expect("plan");
        let lib = match emulate::compile(launch, &plan) {
            Ok(l) => l,
            Err(e) => {
                failures.push(format!("{}: {e}", g.name));
                continue;
            }
        };
        let mut b = Bindings::of_table(&g.dims);
        for (v, d) in g.dims.iter() {
            if d.dynamic {
                b.values[v.index()] = [37, 45, 71, 5][v.index() % 4];
            }
        }
        b.complete(&g.dims);
        let inputs = random_inputs(&g, &b, 11, &InputScale { default: scale, per_input: vec![] });
        let want = eval(&g, &b, &inputs).expect("reference");
        match lib.run(launch, &b, &inputs, 5) {
            Ok(got) => {
                for (gt, wt) in got.iter().zip(&want) {
                    let e = max_rel_err(&gt.data, &wt.data);
                    if e.is_nan() || e > 2e-2 {
                        failures.push(format!("{}: max_rel_err {e}", g.name));
                    }
                }
            }
            Err(e) => failures.push(format!("{}: {e}", g.name)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
