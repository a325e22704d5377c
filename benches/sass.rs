//! The static main-loop benchmark: compiles every kernel of `kernels.yaml` for sm_90 with the
//! flags the build uses, disassembles it with cuobjdump, and reports the hottest loop of each
//! launch (`cleave_core::toolchain::sass`): instructions and LDSM per HMMA, the integer share,
//! issue and shared-memory cycles per HMMA, instructions per attention score element (kernels
//! with a head dim `d`), and for streaming loops instructions per 16 bytes of global memory.
//!
//! With `CLEAVE_FA2_DIR` (the `kernels/` folder of the `candle-flash-attn` crate) and
//! `CLEAVE_CUTLASS_INCLUDE` (CUTLASS's `include/`), the FlashAttention-2 forward kernels for
//! head dims 64 and 128 are compiled with FA2's own flags and measured the same way.
//! `bash bench/sass.sh` fetches both and runs this. Needs nvcc and cuobjdump; no GPU.
//!
//! `CLEAVE_SASS_SOURCES=DIR` measures the sources in `DIR/NAME/NAME.cu` instead of generating
//! them (what `cleave emit` of an earlier version wrote), for before-and-after tables.
//!
//! Run: `cargo bench --bench sass [NAME...]` (names select kernels by a part of their name and
//! skip FA2). Prints the Markdown table of `bench/RESULTS.md`.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::Command;

use cleave_core::codegen::{cuda, headers};
use cleave_core::pipeline::{compile, Options};
use cleave_core::toolchain::sass::{self, LoopReport};
use cleave_core::toolchain::{compile_each, discover, ArchSet, Nvcc};

/// One measured function: where it comes from and its hottest loop.
struct Row {
    kernel: String,
    threads: Option<u32>,
    head_dim: Option<u64>,
    /// Blocks of the launch at the declared extents (with the split counts the launcher
    /// derives there).
    blocks: Option<u64>,
    report: LoopReport,
}

fn cuobjdump(nvcc: &Nvcc) -> PathBuf {
    if let Some(p) = std::env::var_os("CLEAVE_CUOBJDUMP") {
        return PathBuf::from(p);
    }
    let sibling = nvcc.path.with_file_name("cuobjdump");
    if sibling.exists() {
        sibling
    } else {
        PathBuf::from("cuobjdump")
    }
}

fn disassemble(tool: &Path, binary: &Path) -> Vec<sass::Function> {
    let out = Command::new(tool)
        .args(["-sass", "-arch", "sm_90"])
        .arg(binary)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", tool.display()));
    assert!(out.status.success(), "cuobjdump {}: {}", binary.display(), String::from_utf8_lossy(&out.stderr));
    sass::parse(&String::from_utf8_lossy(&out.stdout))
}

fn ours(nvcc: &Nvcc, tool: &Path, dir: &Path, filters: &[String]) -> Vec<Row> {
    let text = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/kernels.yaml")).expect("kernels.yaml");
    let module = cleave_core::front::check_source(&text).expect("kernels.yaml checks");
    headers::write_to(dir).expect("headers");
    let mut sources = Vec::new();
    let mut launches = Vec::new();
    let wanted = |name: &str| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()));
    for (_, g) in module.kernels.iter().filter(|(_, g)| wanted(&g.name)) {
        // The plan a default build runs on an H200: the sm_90 one.
        let c = compile(g, &Options { archs: vec![cleave_core::arch::SM90], ..Options::default() }).expect("compiles");
        let launch = c.best();
        let path = dir.join(format!("{}.cu", g.name));
        // Sources emitted earlier (`cleave emit --target cuda --out DIR/NAME`) measure another
        // version of the code generator against the same plans.
        let source = match std::env::var_os("CLEAVE_SASS_SOURCES") {
            Some(d) => {
                let file = PathBuf::from(d).join(&g.name).join(format!("{}.cu", g.name));
                std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
            }
            None => cuda::emit_launch(launch, &g.name),
        };
        std::fs::write(&path, source).expect("write");
        sources.push(path);
        let d = g.dims.find("d").map(|v| g.dims.get(v).value);
        let kernels: Vec<(String, u32, u64)> = launch
            .kernels
            .iter()
            .zip(&c.ranked[0].candidate.costs)
            .map(|(k, cost)| (k.symbol().to_string(), k.threads(), cost.blocks))
            .collect();
        launches.push((g.name.clone(), d, kernels));
    }
    let arches = ArchSet::parse("90").expect("arches");
    let out = dir.join("out");
    compile_each(nvcc, &sources, &[dir.to_path_buf()], &arches, &out).expect("nvcc");
    let mut rows = Vec::new();
    for (name, d, kernels) in launches {
        let functions = disassemble(tool, &out.join(format!("{name}.fatbin")));
        for (symbol, threads, blocks) in kernels {
            let f = functions
                .iter()
                .find(|f| f.name == symbol)
                .unwrap_or_else(|| panic!("{symbol} is not in the disassembly of {name}"));
            rows.push(Row {
                kernel: name.clone(),
                threads: Some(threads),
                head_dim: d,
                blocks: Some(blocks),
                report: sass::hottest(f),
            });
        }
    }
    rows
}

/// FlashAttention-2's forward kernels, compiled as its crate's build compiles them, but for
/// sm_90. Compiling one takes minutes, so the cubins are kept in `dir` between runs.
fn fa2(nvcc: &Nvcc, tool: &Path, dir: &Path) -> Vec<Row> {
    let (Some(src), Some(cutlass)) = (std::env::var_os("CLEAVE_FA2_DIR"), std::env::var_os("CLEAVE_CUTLASS_INCLUDE"))
    else {
        eprintln!("note: CLEAVE_FA2_DIR and CLEAVE_CUTLASS_INCLUDE are not both set; FlashAttention-2 is not measured");
        return Vec::new();
    };
    let src = PathBuf::from(src);
    let mut rows = Vec::new();
    for d in [64u64, 128] {
        let file = src.join(format!("flash_fwd_hdim{d}_fp16_sm80.cu"));
        let cubin = dir.join(format!("fa2_hdim{d}_fp16_sm90.cubin"));
        if !cubin.exists() {
            eprintln!("compiling {} for sm_90 (minutes)", file.display());
            let status = Command::new(&nvcc.path)
                .args(["-cubin", "-arch=sm_90", "-std=c++17", "-O3"])
                .args(["-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__"])
                .args(["-U__CUDA_NO_HALF2_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__"])
                .args(["--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math"])
                .arg("-I")
                .arg(&src)
                .arg("-I")
                .arg(&cutlass)
                .arg("-o")
                .arg(&cubin)
                .arg(&file)
                .status()
                .expect("nvcc");
            assert!(status.success(), "nvcc failed on {}", file.display());
        }
        // The file instantiates the kernel for several template arguments (even/odd
        // sequence lengths, ...); the hottest loop over all of them is the main loop.
        let best = disassemble(tool, &cubin)
            .iter()
            .filter(|f| f.name.contains("flash_fwd_kernel"))
            .map(sass::hottest)
            .max_by_key(|r| (r.counts.mma, std::cmp::Reverse(r.counts.total)))
            .expect("a flash_fwd_kernel in the cubin");
        rows.push(Row {
            kernel: format!("FlashAttention-2 fwd, hdim{d}"),
            threads: Some(128),
            head_dim: Some(d),
            blocks: None,
            report: best,
        });
    }
    rows
}

/// The H200 the issue-bound share is taken on: SMs, boost clock, datasheet HBM bandwidth.
const H200_SMS: u64 = 132;
const H200_CLOCK_HZ: f64 = 1.98e9;
const H200_BANDWIDTH: f64 = 4.8e12;

fn fmt(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
}

fn main() {
    let Some(nvcc) = discover().nvcc else {
        println!("no nvcc found: run .ci/install-nvcc.sh");
        return;
    };
    let tool = cuobjdump(&nvcc);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join("sass-bench");
    std::fs::create_dir_all(&dir).expect("dir");
    // Arguments that are not options select kernels by a part of their name.
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let mut rows = if filters.is_empty() { fa2(&nvcc, &tool, &dir) } else { Vec::new() };
    rows.extend(ours(&nvcc, &tool, &dir, &filters));
    println!("nvcc {}.{}, sm_90; cuobjdump: {}\n", nvcc.version.0, nvcc.version.1, tool.display());
    println!(
        "| kernel | launch | warps | loop instr | inner loops | HMMA | instr / HMMA | LDSM / HMMA | integer share | \
         issue cyc / HMMA | SMEM cyc / HMMA | instr / score | global B / warp | instr / 16 B | blocks | \
         issue-bound share of 4.8 TB/s |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in &rows {
        let r = &row.report;
        let c = &r.counts;
        let launch = r.function.rsplit('_').next().filter(|s| s.parse::<u32>().is_ok()).unwrap_or("main");
        let score = if c.mma > 0 { row.head_dim.and_then(|d| r.instr_per_score(d)) } else { None };
        let streaming = if c.mma == 0 { r.instr_per_16_global_bytes() } else { None };
        // The bandwidth the loop's issue alone allows: each SM's four schedulers issue a warp
        // instruction per cycle, and a warp moves its global bytes per loop body; only the
        // SMs the grid occupies stream.
        let share = row.blocks.zip(r.instr_per_16_global_bytes()).map(|(blocks, per_16)| {
            let per_sm = 4.0 * H200_CLOCK_HZ * 512.0 / per_16;
            blocks.min(H200_SMS) as f64 * per_sm / H200_BANDWIDTH
        });
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.kernel,
            launch,
            row.threads.map_or_else(|| "-".to_string(), |t| (t / 32).to_string()),
            c.total,
            r.inner,
            c.mma,
            fmt(r.instr_per_mma(), 2),
            fmt(r.ldsm_per_mma(), 2),
            fmt(r.integer_share(), 2),
            fmt(r.issue_cycles_per_mma(), 2),
            fmt(r.smem_cycles_per_mma(), 2),
            fmt(score, 3),
            c.global_bytes,
            fmt(streaming, 1),
            row.blocks.map_or_else(|| "-".to_string(), |b| b.to_string()),
            fmt(share, 2),
        );
    }
}
