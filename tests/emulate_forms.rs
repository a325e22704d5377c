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

#[test]
fn a_running_max_that_stops_growing_rescales_its_sum_by_exactly_one() {
    // A softmax along rows of 5001: the first kernel sums the row's exps over 40 tiles, its
    // running max settled after the first few; the second divides each exp by that sum. Each
    // step rescales the sum by `exp(m_old - m_new)`. Computed as one FFMA,
    // `exp2(m_old · log2(e) - round(m_new · log2(e)))`, equal maxima gave `2^δ` rather than 1,
    // and the 40 steps compounded δ into an error of 1.3e-4. Taken as a difference first the
    // factor is exactly 1, and what remains is the element exps' own rounding of the max,
    // about |max| · log2(e) · 2^-24 each (5e-6 at the inputs' largest, 130), once.
    let text = "kernels:\n  - name: long_rows\n    dims: { t: 8, n: { value: 100000, dynamic: true } }\n    \
                inputs: { x: \"f32[t, n]\" }\n    outputs: { y: \"f32[t, n]\" }\n    body: |\n      \
                y = softmax(x, axis=-1)\n";
    for seed in [3, 4] {
        let e = first_output_error(text, ("n", 5001), seed, 30.0);
        assert!(e < 2e-5, "seed {seed}: {e}");
    }
}

/// The first output's largest relative error against the reference: the one kernel of `text`,
/// its best SM80 schedule emitted and run on the emulator with its dynamic dim `at` bound, on
/// inputs of `seed` and standard deviation `scale`.
fn first_output_error(text: &str, at: (&str, u64), seed: u64, scale: f64) -> f64 {
    let g = check_source(text.as_bytes()).expect("checks").kernels.remove(0).1;
    let (cands, stats) = candidates(&g, &Targets::new(&[SM80]), 1, &format!("cleave_{}", g.name)).expect("schedules");
    let launch = &cands.first().unwrap_or_else(|| panic!("{stats:?}")).launch;
    let plan = plan_data(launch, &g.name).expect("plan");
    let lib = emulate::compile(launch, &plan).expect("builds for the emulator");
    let mut b = Bindings::of_table(&g.dims);
    b.values[g.dims.find(at.0).expect("the dim").index()] = at.1;
    let inputs = random_inputs(&g, &b, seed, &InputScale { default: scale, per_input: vec![] });
    let want = eval(&g, &b, &inputs).expect("reference");
    let mut lb = Bindings::of_table(launch.dims());
    lb.values[..b.values.len()].copy_from_slice(&b.values);
    lb.complete(launch.dims());
    let got = lib.run(launch, &lb, &inputs, 5).expect("runs");
    max_rel_err(&got[0].data, &want[0].data)
}

#[test]
fn a_row_sum_of_one_column_counts_it_once() {
    // `softmax` over the unit last axis of a matrix-vector product: one everywhere. The kernel
    // holds the product one value per row, which every lane holds alike; its row sum visited
    // each lane's columns and counted the value once per lane (32 times over 4 column warps),
    // so the result was 1/32.
    let text = "kernels:\n  - name: unit_softmax\n    dims: { s: { value: 512, dynamic: true }, k: 200 }\n    \
                inputs: { x: \"f16[s, k]\", v: \"f32[k, 1]\" }\n    outputs: { y: \"f32[s, 1]\" }\n    body: |\n      \
                y = softmax(matmul(x, v))\n";
    let e = first_output_error(text, ("s", 37), 8, 2.0);
    assert!(e < 1e-6, "{e}");
}
