//! Every generated kernel of `kernels.yaml` compiles with nvcc for sm_80 and sm_90 within the
//! budget: no spills, at most 255 registers, shared memory within the architecture's limit.
//! Runs when nvcc can be found (CI installs it with `.ci/install-nvcc.sh`); otherwise it says so
//! and checks nothing, unless `CLEAVE_REQUIRE_NVCC` is set (CI sets it), which makes a missing
//! nvcc a failure.

use cleave_core::codegen::{cuda, headers};
use cleave_core::pipeline::{compile, Options};
use cleave_core::toolchain::{compile_each, discover, ArchSet};

#[test]
fn generated_kernels_compile_for_sm80_and_sm90_within_budget() {
    let found = discover();
    let Some(nvcc) = found.nvcc else {
        assert!(
            std::env::var_os("CLEAVE_REQUIRE_NVCC").is_none(),
            "CLEAVE_REQUIRE_NVCC is set but no nvcc was found: {}",
            found.notes.join("; ")
        );
        #[allow(clippy::print_stderr)]
        {
            eprintln!("note: no nvcc found ({}); skipping the nvcc compile check", found.notes.join("; "));
        }
        return;
    };
    let text = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/kernels.yaml")).expect("kernels.yaml");
    let module = cleave_core::front::check_source(&text).expect("kernels.yaml checks");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("nvcc-check");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    headers::write_to(&dir).expect("headers");
    let mut sources = Vec::new();
    let mut smem: Vec<(String, u32)> = Vec::new();
    for (_, g) in &module.kernels {
        let c = compile(g, &Options::default()).unwrap_or_else(|e| panic!("{}: {e}", g.name));
        let launch = c.best();
        let path = dir.join(format!("{}.cu", g.name));
        std::fs::write(&path, cuda::emit_launch(launch, &g.name)).expect("write");
        sources.push(path);
        for k in &launch.kernels {
            smem.push((k.symbol().to_string(), u32::try_from(k.smem_bytes()).expect("smem fits u32")));
        }
    }
    let arches = ArchSet::parse("80,90").expect("arches");
    let report = compile_each(&nvcc, &sources, std::slice::from_ref(&dir), &arches, &dir.join("out"))
        .unwrap_or_else(|e| panic!("nvcc failed:\n{e}"));
    let dynamic: Vec<(&str, u32)> = smem.iter().map(|(s, b)| (s.as_str(), *b)).collect();
    report.check_budget(&dynamic).unwrap_or_else(|e| panic!("over budget:\n{e}"));
    // Both architectures, every kernel.
    for (symbol, _) in &smem {
        let arches: Vec<&str> = report.kernel(symbol).filter(|k| k.entry).map(|k| k.arch.as_str()).collect();
        assert!(arches.contains(&"sm_80") && arches.contains(&"sm_90"), "{symbol}: {arches:?}");
    }
}
