//! The host emulator as a sanitizer, on real generated kernels: each bug of the planted-bug
//! suite is planted in a copy of the generated CUDA of `mha_d64_prefill` and must be reported
//! with its kind and source line; the unmodified copy runs clean; a pipeline deeper than two
//! stages that waits one group short is reported too; a split count the launcher derives from
//! the extents is correct at each; and the three thread schedules give bit-identical results
//! on a Split-K kernel.

use cleave::emulate;
use cleave::runtime::host::{checks, EmuOptions, Schedule};
use cleave_core::codegen::cuda;
use cleave_core::codegen::plan::{plan_data, DeriveData};
use cleave_core::graph::{Bindings, ValidGraph};
use cleave_core::pipeline::{compile, Compiled, Options};
use cleave_core::reference::{eval, max_rel_err, random_inputs, InputScale, Tensor};

fn kernel(name: &str) -> ValidGraph {
    let text = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/kernels.yaml")).expect("kernels.yaml");
    let module = cleave_core::front::check_source(&text).expect("kernels.yaml checks");
    module.kernels.into_iter().find(|(d, _)| d.name == name).expect("the kernel is declared").1
}

/// Bindings of the launch with the dynamic dims at small odd extents.
fn bindings(c: &Compiled, extents: &[(&str, u64)]) -> (Bindings, Bindings) {
    let g = &c.declared;
    let mut b = Bindings::of_table(&g.dims);
    for (name, v) in extents {
        b.values[g.dims.find(name).expect("dim").index()] = *v;
    }
    let launch = c.best();
    let mut lb = Bindings::of_table(launch.dims());
    lb.values[..b.values.len()].copy_from_slice(&b.values);
    lb.complete(launch.dims());
    (b, lb)
}

/// Runs `source` (CUDA implementing the compiled kernel's best launch) on the emulator with
/// every check and the given schedule.
fn run(
    c: &Compiled,
    source: &str,
    extents: &[(&str, u64)],
    schedule: Schedule,
    seed: u64,
) -> Result<Vec<Tensor>, String> {
    let launch = c.best();
    let plan = plan_data(launch, &c.declared.name).map_err(|e| e.to_string())?;
    // SAFETY: the sources are the generated ones, or one planted bug each, whose stray accesses
    // go through the emulator's checked accessors (the point of these tests).
    let lib = unsafe { emulate::compile_source(source, &plan) }?;
    let (b, lb) = bindings(c, extents);
    let inputs = random_inputs(&c.declared, &b, seed, &InputScale { default: 3.0, per_input: Vec::new() });
    lib.run_with(launch, &lb, &inputs, seed, &EmuOptions { checks: checks::ALL, schedule })
}

/// One planted bug: a text edit of the generated source that must apply exactly once, and the
/// words its report must contain.
struct Bug {
    name: &'static str,
    find: &'static str,
    replace: &'static str,
    report: &'static [&'static str],
}

const BUGS: &[Bug] = &[
    Bug {
        name: "a missing barrier before a prefetch",
        find: "      __syncthreads();  // the next prefetch overwrites this iteration's tiles\n",
        replace: "",
        report: &["shared-memory race (write-after-read)", "with no __syncthreads in between"],
    },
    Bug {
        name: "a missing barrier after a wait",
        find: "      cleave::cp_async_wait<1>();\n      __syncthreads();\n",
        replace: "      cleave::cp_async_wait<1>();\n",
        report: &["shared-memory race (read-after-write)", "wrote it at line"],
    },
    Bug {
        name: "a missing wait",
        find: "      cleave::cp_async_wait<1>();\n",
        replace: "",
        report: &["cp.async hazard", "the destination of", "cp_async_16"],
    },
    Bug {
        name: "an off-by-one bounds guard",
        find: "(((r / 1) % 128) < cleave_room(e_s - (128LL * i1))) && true)) continue;",
        replace: "(((r / 1) % 128) <= cleave_room(e_s - (128LL * i1))) && true)) continue;",
        report: &["out of bounds: st_global_16 at line", "of `o`"],
    },
    Bug {
        name: "a misaligned ldmatrix",
        find: "cleave::ldmatrix_x4(a[mi], ((smem + 0) + ",
        replace: "cleave::ldmatrix_x4(a[mi], ((smem + 2) + ",
        report: &["alignment hazard: ldmatrix row address at line", "is not 16-byte aligned"],
    },
    Bug {
        name: "a shuffle inside divergent code",
        find: "        part = cleave::quad_max(part);\n",
        replace: "        if (lane < 16) part = __shfl_xor_sync(0xffffffffu, part, 1);\n        part = cleave::quad_max(part);\n",
        report: &["divergence hazard", "__shfl_xor_sync at line"],
    },
];

/// Plants `bug` in `source` at its first match; the pattern must be there.
fn plant(source: &str, bug: &Bug) -> String {
    assert!(source.contains(bug.find), "{}: the pattern is no longer in the generated source", bug.name);
    source.replacen(bug.find, bug.replace, 1)
}

#[test]
fn every_planted_bug_is_reported_and_the_original_runs_clean() {
    let c = compile(&kernel("mha_d64_prefill"), &Options::default()).expect("compiles");
    let source = cuda::emit_launch(c.best(), "mha_d64_prefill");
    // Three whole key tiles and a ragged one: the bugs are planted in the full-tile loop (the
    // first match), which runs while the next tile is whole too.
    let extents = [("s", 67), ("l", 389)];
    let outcomes: Vec<(&Bug, Result<Vec<Tensor>, String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = BUGS
            .iter()
            .map(|bug| {
                let planted = plant(&source, bug);
                let (c, extents) = (&c, &extents);
                s.spawn(move || (bug, run(c, &planted, extents, Schedule::RoundRobin, 5)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a planted run")).collect()
    });
    let mut missed = Vec::new();
    for (bug, outcome) in outcomes {
        match outcome {
            Err(msg) if bug.report.iter().all(|w| msg.contains(w)) && msg.contains("cleave_mha_d64_prefill_0") => {}
            other => missed.push(format!("{}: {other:?}", bug.name)),
        }
    }
    assert!(missed.is_empty(), "planted bugs not reported as expected:\n{}", missed.join("\n"));
    run(&c, &source, &extents, Schedule::RoundRobin, 5).expect("the generated kernel runs clean under every check");
}

#[test]
fn a_deep_pipeline_waits_for_exactly_its_own_tiles() {
    // matmul_decode's split kernel streams the weights through more than two stages: every
    // iteration waits for all but the newest `stages - 1` groups of copies. Waiting for one
    // group fewer leaves this iteration's tile in flight while it is read, which the emulator
    // reports; the generated wait runs clean.
    let c = compile(&kernel("matmul_decode"), &Options::default()).expect("compiles");
    let launch = c.best();
    let split = launch.kernels[0].tile().expect("a tile kernel");
    let stages = split.bufs.iter().map(|b| b.stages).max().expect("buffers");
    assert!(stages > 2, "the weights stream through {stages} stages");
    let source = cuda::emit_launch(launch, "matmul_decode");
    let wait = format!("cleave::cp_async_wait<{}>();", stages - 1);
    assert!(source.contains(&wait), "the loop waits for all but {} groups", stages - 1);
    // Every such wait, in the steady-state loop (whole blocks) and the masked one (a ragged
    // batch): each extent below runs one of them.
    let planted = source.replace(&wait, &format!("cleave::cp_async_wait<{stages}>();"));
    for b in [5, 16] {
        let extents = [("b", b)];
        let err = run(&c, &planted, &extents, Schedule::RoundRobin, 5).expect_err("a wait one group short");
        assert!(err.contains("cp.async hazard") && err.contains("cp_async_16"), "b={b}: {err}");
        run(&c, &source, &extents, Schedule::RoundRobin, 5).expect("the generated kernel runs clean under every check");
    }
}

#[test]
fn a_dense_split_count_follows_the_extents() {
    use cleave_core::plan::requests;
    // gqa_decode splits its dynamic keys, and the launcher counts the parts from the extents:
    // many for one query over a long context, few for a larger batch over a short one. One
    // library runs both, matching the reference.
    let c = compile(&kernel("gqa_decode"), &Options::default()).expect("compiles");
    let launch = c.best();
    let plan = plan_data(launch, "gqa_decode").expect("plan");
    let derived: Vec<_> = plan.dims.iter().filter(|d| d.derive.is_some()).collect();
    assert_eq!(derived.len(), 1, "one split count, the launcher's");
    assert!(matches!(derived[0].derive, Some(DeriveData::SplitCount { batch: None, .. })), "{derived:?}");
    let split = launch.dims().find(&derived[0].name).expect("the split count");
    // The count names the split kernel's launch, whose residency the device reports at run
    // time: the launch whose grid spreads the parts.
    let Some(DeriveData::SplitCount { launch: Some(at), .. }) = derived[0].derive else {
        panic!("the split count names its launch: {derived:?}")
    };
    let named = &launch.kernels[usize::from(at)];
    assert_eq!(plan.launches[usize::from(at)].symbol, named.symbol());
    assert!(named.grid().iter().any(|a| a.dim == split), "launch {at} spreads the parts");
    let source = cuda::emit_launch(launch, "gqa_decode");
    // SAFETY: the generated source of this launch.
    let lib = unsafe { emulate::compile_source(&source, &plan) }.expect("builds");
    let mut parts = Vec::new();
    for extents in [[("b", 1), ("l", 3001)], [("b", 20), ("l", 290)]] {
        let (b, lb) = bindings(&c, &extents);
        let k = launch.kernels[0].tile().expect("the split kernel");
        let extent = |d: cleave_core::graph::DimVar| lb.values[d.index()];
        let resident = u64::from(launch.resident[0]);
        let shape = requests::split_shape(k, split, &extent, extents[1].1, launch.sms, resident, launch.fill);
        parts.push(requests::split_count(shape));
        let inputs = random_inputs(&c.declared, &b, 7, &InputScale { default: 11.0, per_input: Vec::new() });
        let want = eval(&c.declared, &b, &inputs).expect("reference");
        let opts = EmuOptions { checks: checks::ALL, schedule: Schedule::RoundRobin };
        let got = lib.run_with(launch, &lb, &inputs, 7, &opts).expect("runs clean");
        let e = max_rel_err(&got[0].data, &want[0].data);
        assert!(e < 2e-2, "{extents:?}: max_rel_err {e}");
    }
    assert!(parts[0] > parts[1] && parts[1] > 1, "parts {parts:?}");
}

#[test]
fn the_schedules_agree_bit_for_bit_on_a_split_k_kernel() {
    let c = compile(&kernel("mha_d64_decode"), &Options::default()).expect("compiles");
    assert_eq!(c.best().kernels.len(), 2, "a split kernel and a combine kernel");
    let source = cuda::emit_launch(c.best(), "mha_d64_decode");
    let extents = [("b", 3), ("l", 301)];
    let first = run(&c, &source, &extents, Schedule::RoundRobin, 3).expect("runs");
    for schedule in [Schedule::Random, Schedule::RunAhead] {
        for seed in [3, 4] {
            let got = run(&c, &source, &extents, schedule, seed).expect("runs");
            // Different seeds draw different inputs; compare like with like.
            let want = if seed == 3 {
                first.clone()
            } else {
                run(&c, &source, &extents, Schedule::RoundRobin, seed).expect("runs")
            };
            let same =
                got.iter().zip(&want).all(|(g, w)| g.data.iter().zip(&w.data).all(|(x, y)| x.to_bits() == y.to_bits()));
            assert!(same, "{schedule:?} with seed {seed} changed the result");
        }
    }
}

#[test]
fn a_library_refuses_tensors_or_a_launch_its_plan_does_not_hold() {
    let c = compile(&kernel("swiglu_decode"), &Options::default()).expect("compiles");
    let launch = c.best();
    let plan = plan_data(launch, "swiglu_decode").expect("plan");
    let lib = emulate::compile(launch, &plan).expect("builds");
    let (b, lb) = bindings(&c, &[("b", 5)]);
    let scale = InputScale { default: 2.0, per_input: Vec::new() };
    let inputs = random_inputs(&c.declared, &b, 9, &scale);
    lib.run(launch, &lb, &inputs, 9).expect("the matching call runs");

    // One element short: refused before any kernel runs (it would read past the buffer).
    let mut short = inputs.clone();
    short[0].data.pop();
    let err = lib.run(launch, &lb, &short, 9).expect_err("a short input");
    assert!(err.contains("elements"), "{err}");
    let err = lib.run(launch, &lb, &inputs[1..], 9).expect_err("a missing input");
    assert!(err.contains("inputs were given"), "{err}");

    // Another kernel's launch with its own tensors: the buffers are sized from this library's
    // plan, so the mismatch is an error, not a read past the end.
    let other = compile(&kernel("matmul_decode"), &Options::default()).expect("compiles");
    let (ob, olb) = bindings(&other, &[("b", 5)]);
    let other_inputs = random_inputs(&other.declared, &ob, 9, &scale);
    assert!(lib.run(other.best(), &olb, &other_inputs, 9).is_err());
}
