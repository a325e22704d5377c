//! `cleave run --backend emulate` on every kernel of `kernels.yaml`: the generated CUDA, compiled
//! for the host emulator, matches the f64 reference on fresh random inputs at extents that are
//! not multiples of any tile size, and runs clean under the race, hazard and bounds checks;
//! attention kernels get scores of magnitude up to about ±500. The kernels take turns at the
//! emulator's three thread schedules, and every other one also runs with its tensors as
//! padded, offset views of larger buffers (`--views`), which must match the dense run exactly.
//! The plans made for the extents a kernel lists under `also` run too (`--at`).
//! The serving operators run over random requests (lengths from 0 up, shuffled page tables with
//! spare pages), compared element by element with the reference evaluated request by request.

use std::process::Command;
use std::sync::Mutex;

/// The input scale per kernel: attention inputs large enough that scores reach about ±500
/// (the f64 reference still has headroom: exp overflows past 709).
fn scale(name: &str) -> &'static str {
    if is_serving(name) {
        // A random `sm_scale` of about 1/√d: scores of σ ≈ 60 (head width 128, inputs σ = 8;
        // MLA's 576 products per score, inputs σ = 6), reaching a few hundred.
        if name.starts_with("mla") {
            "6,sm_scale=0.06"
        } else {
            "8,sm_scale=0.07"
        }
    } else if name.starts_with("mla_decode") {
        // 576 products per score at a 1/√192 scale: σ = 8 gives score σ ≈ 110.
        "8"
    } else if ["mha", "gqa", "mqa", "mla"].iter().any(|p| name.starts_with(p)) {
        // Scores are N(0, σ⁴) with the 1/√d scale: σ = 11 gives score σ ≈ 121.
        "11"
    } else {
        "1"
    }
}

/// The FlashInfer-Bench operators: their kernels take index tables and a runtime scale.
fn is_serving(name: &str) -> bool {
    name.contains("_paged_") || name.contains("_ragged_")
}

/// Small extents for the serving operators (requests of 0 to twice these lengths); the others
/// take the run's default, which shrinks the declared extents off every tile multiple.
fn dims(name: &str) -> &'static [&'static str] {
    match (is_serving(name), name.contains("decode")) {
        (false, _) => &[],
        (true, true) => &["--dims", "batch_size=5,kv_len=150"],
        (true, false) => &["--dims", "batch_size=4,qo_len=40,kv_len=90"],
    }
}

/// The tolerance the run may set: the rounding of the kernel's narrowest type (bf16 outputs of
/// the serving operators, f16 for the others), plus the accumulation terms.
fn tolerance_cap(name: &str) -> f64 {
    if is_serving(name) {
        0.17
    } else {
        2.5e-2
    }
}

#[test]
fn every_declared_kernel_passes_on_the_emulator() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels.yaml");
    let text = std::fs::read(file).expect("kernels.yaml");
    let module = cleave_core::front::check_source(&text).expect("kernels.yaml checks");
    let names: Vec<String> = module.kernels.iter().map(|(d, _)| d.name.clone()).collect();
    assert_eq!(names.len(), 29);
    assert_eq!(names.iter().filter(|n| is_serving(n)).count(), 9);
    let schedules = ["round-robin", "random", "run-ahead"];
    // Each kernel's plan for its declared extents, then the plan of each extent it lists under
    // `also` (`--at`), run at the same small odd extents: a launch runs whichever plan was
    // made nearest to its extents, so each must be right at any extent.
    let mut jobs: Vec<(usize, String, Option<String>)> =
        names.iter().cloned().enumerate().map(|(i, n)| (i, n, None)).collect();
    for (decl, _) in &module.kernels {
        for p in cleave_core::front::points(decl).expect("points") {
            let at: Vec<String> = p.at.iter().map(|(d, x)| format!("{d}={x}")).collect();
            jobs.push((jobs.len(), decl.name.clone(), Some(at.join(","))));
        }
    }
    let points = jobs.len() - names.len();
    let queue = Mutex::new(jobs);
    let results = Mutex::new(Vec::new());
    // Two kernels at a time: each run compiles a C++ library and runs a multi-threaded emulator.
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let Some((i, name, at)) = queue.lock().expect("queue").pop() else { break };
                // Every other kernel also runs with each tensor a padded, offset view of a
                // larger buffer, and must give the dense run's outputs bit for bit.
                let views: &[&str] = if i % 2 == 0 && at.is_none() { &["--views"] } else { &[] };
                // A default build plans each kernel for sm_90, for the 99 KiB sm_86/sm_89 and
                // for sm_80 (`--arch` asks for one of them); each kernel runs one of the three.
                let arch = ["90", "86", "80"][(i / 2) % 3];
                let at_args: Vec<&str> = at.as_deref().map_or(Vec::new(), |a| vec!["--at", a]);
                let out = Command::new(env!("CARGO_BIN_EXE_cleave"))
                    .args([
                        "run",
                        file,
                        "--kernel",
                        &name,
                        "--backend",
                        "emulate",
                        "--seed",
                        "17",
                        "--scale",
                        scale(&name),
                        "--checks",
                        "all",
                        "--schedule",
                        schedules[i % schedules.len()],
                        "--arch",
                        arch,
                    ])
                    .args(views)
                    .args(&at_args)
                    .args(dims(&name))
                    .output()
                    .expect("cleave runs");
                let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
                let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
                let name = at.map_or(name.clone(), |a| format!("{name} (the plan for {a})"));
                results.lock().expect("results").push((name, !views.is_empty(), out.status.code(), stdout, stderr));
            });
        }
    });
    let results = results.into_inner().expect("results");
    let mut failures = Vec::new();
    for (name, views, code, stdout, stderr) in &results {
        // The command compares with the tolerance of the kernel's types and prints both.
        let value = |key: &str| -> Option<f64> { stdout.lines().find_map(|l| l.strip_prefix(key)?.parse().ok()) };
        let viewed = !views || stdout.contains("views: every output matches the dense run bit for bit");
        match (code, value("max_rel_err="), value("tolerance=")) {
            (Some(0), Some(e), Some(tol)) if e <= tol && tol <= tolerance_cap(name) && viewed => {}
            _ => failures.push(format!("{name}: exit {code:?}\n{stdout}{stderr}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(results.iter().filter(|r| r.1).count(), names.len().div_ceil(2), "half the kernels run with views");
    assert_eq!(results.len(), names.len() + points);
    // The MatMul, SwiGLU and RMSNorm+MatMul decodes plan 64 and 256 rows; MHA, GQA and
    // MatMul+MatMul decodes 64.
    assert_eq!(points, 10);
}
