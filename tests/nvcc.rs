//! Every generated kernel of `kernels.yaml` and of the user corpus (`tests/corpus/`) compiles
//! with nvcc for sm_80 and sm_90 within the budget: at most 255 registers and shared memory
//! within the architecture's limit; the shipped kernels, in every plan a default build makes
//! (sm_90, the 99 KiB sm_86, sm_80, at every extent declared), also without register spills and
//! within the shared memory of the GPUs each plan serves. A shipped plan is held to that in the
//! code of the GPUs that pick it: the sm_80 code, the sm_90 code, and the PTX as a 99 KiB GPU
//! newer than sm_90 compiles it (sm_120, compiled here for the shipped kernels). (The
//! corpus's spills are listed in `bench/RESULTS.md`: the planner's register estimate does not
//! see what ptxas keeps live across a fully unrolled contraction.)
//! Runs when nvcc can be found (CI installs it with `.ci/install-nvcc.sh`); otherwise it says so
//! and checks nothing, unless `CLEAVE_REQUIRE_NVCC` is set (CI sets it), which makes a missing
//! nvcc a failure.

use cleave_core::codegen::{cuda, headers};
use cleave_core::pipeline::{compile, compile_points, Options};
use cleave_core::toolchain::{compile_each, nvcc_for_check, ArchSet};

/// The declaration files whose kernels are compiled.
fn files() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut corpus: Vec<_> = std::fs::read_dir(root.join("tests/corpus"))
        .expect("corpus")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    corpus.sort();
    let mut files = vec![root.join("kernels.yaml")];
    files.extend(corpus);
    files
}

/// GPUs by the code they run, as `(code, compute capability, shared memory per block)`: the
/// sm_80 code runs on every 8.x GPU, the sm_90 code on 9.0, and a newer GPU compiles the PTX,
/// which sm_120 stands for here (the one of 99 KiB; a 10.0 GPU holds the sm_90 plans).
const GPUS: [(&str, &str); 6] =
    [("sm_80", "80"), ("sm_80", "86"), ("sm_80", "87"), ("sm_80", "89"), ("sm_90", "90"), ("sm_120", "120")];

/// For each GPU of [`GPUS`], the code it runs and the functions of the plans it picks among a
/// kernel's `variants`, as the launcher picks them: the plans of the first target meant for its
/// compute capability whose kernels all fit its shared memory.
fn code_that_runs(variants: &[cleave_core::pipeline::Variant]) -> Vec<(&'static str, Vec<String>)> {
    let symbols = |v: &cleave_core::pipeline::Variant| -> Vec<String> {
        let plan = v.shares.map_or(v, |i| &variants[i]);
        plan.compiled.best().kernels.iter().map(|k| k.symbol().to_string()).collect()
    };
    let mut out = Vec::new();
    for (code, gpu) in GPUS {
        let arch = cleave_core::toolchain::Arch::parse(gpu).expect("a known GPU");
        let (cc, smem) = (arch.number(), u64::from(arch.smem_per_block().expect("known")));
        let mut start = 0;
        while start < variants.len() {
            let len = variants[start..].iter().take_while(|v| v.targets == variants[start].targets).count();
            let group = &variants[start..start + len];
            let fits = |v: &cleave_core::pipeline::Variant| {
                v.min_cc <= cc && v.compiled.best().kernels.iter().all(|k| k.smem_bytes() <= smem)
            };
            if group.iter().all(fits) {
                out.push((code, group.iter().flat_map(symbols).collect()));
                break;
            }
            start += len;
        }
    }
    out
}

#[test]
fn generated_kernels_compile_for_sm80_and_sm90_within_budget() {
    let Some(nvcc) = nvcc_for_check("the nvcc compile check") else { return };
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("nvcc-check");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    headers::write_to(&dir).expect("headers");
    let mut sources = Vec::new();
    let mut smem: Vec<(String, u32)> = Vec::new();
    let mut count = 0;
    let mut shipped: Vec<String> = Vec::new();
    let mut shipped_sources = Vec::new();
    // The code each shipped function runs in: which GPUs pick its plan.
    let mut runs: std::collections::BTreeMap<String, std::collections::BTreeSet<&str>> = Default::default();
    let set = ArchSet::default();
    let targets = set.plan_targets();
    let mut newest_only: Vec<String> = Vec::new();
    let mut over_99k = false;
    let mut plans = 0;
    let mut extents = 0;
    for (i, file) in files().into_iter().enumerate() {
        let text = std::fs::read(&file).expect("declarations");
        let module = cleave_core::front::check_source(&text).unwrap_or_else(|e| panic!("{}: {e:?}", file.display()));
        for (decl, g) in &module.kernels {
            // The shipped kernels as a default build makes them: a plan per kind of GPU and per
            // set of extents declared, in one source; the corpus as one plan for both
            // architectures.
            let launches: Vec<(cleave_core::plan::Launch, Option<u32>)> = if i == 0 {
                let points = cleave_core::front::points(decl).unwrap_or_else(|e| panic!("{}: {e:?}", g.name));
                let variants = compile_points(g, &points, &Options::default(), &targets)
                    .unwrap_or_else(|e| panic!("{}: {e}", g.name));
                for (code, symbols) in code_that_runs(&variants) {
                    for s in symbols {
                        runs.entry(s).or_default().insert(code);
                    }
                }
                // A plan that shares another's kernels adds no code.
                let variants: Vec<_> = variants.into_iter().filter(|v| v.shares.is_none()).collect();
                extents += variants.iter().filter(|v| !v.at.is_empty()).count();
                for v in &variants {
                    // Each plan fits the smallest shared memory of the GPUs it is meant for.
                    let limit = targets
                        .iter()
                        .filter(|t| v.targets.contains(&t.name))
                        .map(|t| t.budget.smem_per_block)
                        .min()
                        .expect("a plan serves a target");
                    for k in &v.compiled.best().kernels {
                        assert!(
                            k.smem_bytes() <= limit,
                            "{} for {:?}: {} bytes",
                            k.symbol(),
                            v.targets,
                            k.smem_bytes()
                        );
                        over_99k |= k.smem_bytes() > 101_376;
                    }
                }
                plans += variants.len();
                variants.into_iter().map(|v| (v.compiled.best().clone(), set.code_floor(v.min_cc))).collect()
            } else {
                vec![(
                    compile(g, &Options::default()).unwrap_or_else(|e| panic!("{}: {e}", g.name)).best().clone(),
                    None,
                )]
            };
            let path = dir.join(format!("{}.cu", g.name));
            let each: Vec<_> = launches.iter().map(|(l, floor)| (l, *floor)).collect();
            std::fs::write(&path, cuda::emit_launches(&each, &g.name)).expect("write");
            if i == 0 {
                shipped_sources.push(path.clone());
            }
            sources.push(path);
            for (launch, floor) in &launches {
                for k in &launch.kernels {
                    smem.push((k.symbol().to_string(), u32::try_from(k.smem_bytes()).expect("smem fits u32")));
                    if i == 0 {
                        shipped.push(k.symbol().to_string());
                    }
                    if floor.is_some() {
                        newest_only.push(k.symbol().to_string());
                    }
                }
            }
            count += 1;
        }
    }
    assert!(count >= 74, "{count} kernels");
    // Some shipped plans use more than the 99 KiB of sm_86 and sm_89, which the bound above
    // kept out of the plans those GPUs run; and some kernels have several plans.
    assert!(over_99k, "no shipped plan needs more than 99 KiB: the sm_86 bound checks nothing");
    assert!(plans > 29, "{plans} plans for 29 kernels");
    // The MatMul, SwiGLU and RMSNorm+MatMul decodes declare `also: [64, 256]`, and their plans
    // there are their own.
    assert!(extents >= 6, "{extents} plans for extents besides the declared ones");
    let arches = ArchSet::parse("80,90").expect("arches");
    let report = compile_each(&nvcc, &sources, std::slice::from_ref(&dir), &arches, &dir.join("out"))
        .unwrap_or_else(|e| panic!("nvcc failed:\n{e}"));
    let dynamic: Vec<(&str, u32)> = smem.iter().map(|(s, b)| (s.as_str(), *b)).collect();
    // A shipped function is held to the budget in the code of the GPUs that pick its plan. The
    // plans for the 99 KiB GPUs are in the sm_90 code too, since the PTX shares its source, but
    // an sm_90 GPU always takes the plans made for it.
    let not_run = |v: &&cleave_core::toolchain::BudgetViolation| {
        shipped.contains(&v.kernel) && runs.get(&v.kernel).is_some_and(|codes| !codes.contains(v.arch.as_str()))
    };
    let mut not_run_there = Vec::new();
    if let Err(e) = report.check_budget(&dynamic) {
        let (skipped, held): (Vec<_>, Vec<_>) = e.violations.iter().partition(not_run);
        not_run_there.extend(skipped.iter().map(|v| v.to_string()));
        let (spills, hard): (Vec<_>, Vec<_>) =
            held.into_iter().partition(|v| v.problem.starts_with("spills registers") && !shipped.contains(&v.kernel));
        assert!(hard.is_empty(), "over budget:\n{}", hard.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("\n"));
        #[allow(clippy::print_stderr)]
        {
            eprintln!(
                "corpus kernels that spill: {}",
                spills.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("; ")
            );
        }
    }
    // Every shipped plan is picked by some GPU.
    for symbol in &shipped {
        assert!(runs.get(symbol).is_some_and(|c| !c.is_empty()), "{symbol}: no GPU picks its plan");
    }
    // The PTX, compiled by a 99 KiB GPU newer than sm_90 for itself: the plans it picks within
    // the budget there too.
    let newest = ArchSet::parse("120").expect("arches");
    let jit = compile_each(&nvcc, &shipped_sources, std::slice::from_ref(&dir), &newest, &dir.join("out-120"))
        .unwrap_or_else(|e| panic!("nvcc failed for sm_120:\n{e}"));
    let shipped_dynamic: Vec<(&str, u32)> =
        dynamic.iter().copied().filter(|(s, _)| shipped.iter().any(|k| k == s)).collect();
    if let Err(e) = jit.check_budget(&shipped_dynamic) {
        let (skipped, held): (Vec<_>, Vec<_>) = e.violations.iter().partition(not_run);
        not_run_there.extend(skipped.iter().map(|v| v.to_string()));
        assert!(held.is_empty(), "over budget:\n{}", held.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("\n"));
    }
    assert!(runs.values().any(|c| c.contains("sm_120")), "no plan checked for sm_120");
    #[allow(clippy::print_stderr)]
    {
        eprintln!("in the code of GPUs that never pick their plans: {}", not_run_there.join("; "));
    }
    // Both architectures, every kernel; the sm_90 plans only in the sm_90 code, where the GPUs
    // that pick them find them.
    assert!(!newest_only.is_empty());
    for (symbol, _) in &smem {
        let arches: Vec<&str> = report.kernel(symbol).filter(|k| k.entry).map(|k| k.arch.as_str()).collect();
        if newest_only.contains(symbol) {
            assert_eq!(arches, ["sm_90"], "{symbol}");
        } else {
            assert!(arches.contains(&"sm_80") && arches.contains(&"sm_90"), "{symbol}: {arches:?}");
        }
    }
}
