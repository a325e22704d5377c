//! Resource report of every generated kernel of `kernels.yaml`: registers, spills and shared
//! memory per architecture from nvcc's `-Xptxas -v`, and the emulated error per kernel. Run with
//! `cargo bench --bench kernels` (needs nvcc; `.ci/install-nvcc.sh` installs one). Prints the
//! Markdown tables of `bench/RESULTS.md`.

#![allow(clippy::print_stdout)]

use cleave_core::codegen::{cuda, headers};
use cleave_core::pipeline::{compile, Options};
use cleave_core::toolchain::{compile_each, discover, ArchSet};

fn main() {
    let text = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/kernels.yaml")).expect("kernels.yaml");
    let module = cleave_core::front::check_source(&text).expect("kernels.yaml checks");
    let Some(nvcc) = discover().nvcc else {
        println!("no nvcc found: run .ci/install-nvcc.sh");
        return;
    };
    let dir = std::env::temp_dir().join(format!("cleave-kernel-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    headers::write_to(&dir).expect("headers");
    let mut sources = Vec::new();
    let mut rows = Vec::new();
    for (_, g) in &module.kernels {
        let c = compile(g, &Options::default()).expect("compiles");
        let launch = c.best();
        let path = dir.join(format!("{}.cu", g.name));
        std::fs::write(&path, cuda::emit_launch(launch, &g.name)).expect("write");
        sources.push(path);
        for (k, regs) in launch.kernels.iter().zip(&launch.registers) {
            rows.push((g.name.clone(), k.symbol().to_string(), k.threads(), k.smem_bytes(), *regs));
        }
    }
    let arches = ArchSet::parse("80,90").expect("arches");
    let report = compile_each(&nvcc, &sources, std::slice::from_ref(&dir), &arches, &dir.join("out")).expect("nvcc");
    println!("nvcc: {} ({}.{})\n", nvcc.path.display(), nvcc.version.0, nvcc.version.1);
    println!("| kernel | launch | threads | dynamic smem (KiB) | est. regs | sm_80 regs | sm_80 spill B | sm_90 regs | sm_90 spill B |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for (name, symbol, threads, smem, est) in rows {
        let stat = |arch: &str| {
            report.kernel(&symbol).find(|k| k.entry && k.arch == arch).map_or(("?".to_string(), "?".to_string()), |k| {
                (k.registers.to_string(), (k.spill_stores + k.spill_loads).to_string())
            })
        };
        let (r80, s80) = stat("sm_80");
        let (r90, s90) = stat("sm_90");
        println!(
            "| {name} | `{symbol}` | {threads} | {:.1} | {est} | {r80} | {s80} | {r90} | {s90} |",
            smem as f64 / 1024.0
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
