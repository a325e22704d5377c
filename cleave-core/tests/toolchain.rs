//! The CUDA toolchain module: `CUDA_COMPUTE_CAP` parsing, ptxas report parsing on real
//! output of the PyPI nvcc 13.0.88, nvcc discovery, and, only when `NVCC` is set, a real
//! compilation to a fatbin for sm_80 + sm_90.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use cleave_core::toolchain::{
    compile_each, compile_fatbin, discover_with, parse_ptxas, parse_version, Arch, ArchSet, KernelStats, Nvcc,
    ToolchainError, Variant,
};

// ---------------------------------------------------------------------------------------------
// Architectures

fn sass(set: &ArchSet) -> Vec<String> {
    set.sass().iter().map(|a| a.sm()).collect()
}

#[test]
fn default_set_is_sm80_sm90_with_compute90_ptx() {
    let set = ArchSet::default();
    assert_eq!(sass(&set), ["sm_80", "sm_90"]);
    assert_eq!(set.ptx(), Some(Arch::SM_90));
    assert_eq!(set.describe(), "sm_80, sm_90, compute_90");
    assert_eq!(
        set.gencode_flags(),
        ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=[sm_90,compute_90]"]
    );
    assert_eq!(ArchSet::parse("").unwrap(), set, "a blank value means the default");
    assert_eq!(ArchSet::parse(" ,; ").unwrap(), set);
    assert_eq!(ArchSet::from_env(|_| None).unwrap(), set, "unset means the default");
}

#[test]
fn compute_cap_accepts_every_common_spelling() {
    for spelling in ["80", "8.0", "sm_80", "compute_80", "SM_80", " 80 "] {
        assert_eq!(Arch::parse(spelling).unwrap(), Arch::SM_80, "{spelling}");
    }
    let a90 = Arch { major: 9, minor: 0, variant: Variant::Specific };
    for spelling in ["90a", "9.0a", "sm_90a"] {
        assert_eq!(Arch::parse(spelling).unwrap(), a90, "{spelling}");
    }
    assert_eq!(Arch::parse("120").unwrap(), Arch { major: 12, minor: 0, variant: Variant::Generic });
    assert_eq!(Arch::parse("100f").unwrap().sm(), "sm_100f");
    assert_eq!(a90.compute(), "compute_90a");
}

#[test]
fn compute_cap_lists_and_all() {
    let set = ArchSet::parse("86,80 89;90").unwrap();
    assert_eq!(sass(&set), ["sm_80", "sm_86", "sm_89", "sm_90"]);
    assert_eq!(set.ptx(), Some(Arch::SM_90));

    let all = ArchSet::parse("all").unwrap();
    assert_eq!(all, ArchSet::all());
    assert_eq!(all.describe(), "sm_80, sm_86, sm_89, sm_90, compute_90");
    assert_eq!(ArchSet::parse("ALL, 90").unwrap(), all, "duplicates collapse");

    // One arch: SASS plus its own PTX, so newer GPUs can still JIT it.
    let one = ArchSet::parse("8.6").unwrap();
    assert_eq!(one.gencode_flags(), ["-gencode=arch=compute_86,code=[sm_86,compute_86]"]);

    // Arch-specific code gets no PTX: it is not forward-compatible.
    let specific = ArchSet::parse("80 90a").unwrap();
    assert_eq!(specific.ptx(), Some(Arch::SM_80));
    assert_eq!(
        specific.gencode_flags(),
        ["-gencode=arch=compute_80,code=[sm_80,compute_80]", "-gencode=arch=compute_90a,code=sm_90a"]
    );
    assert_eq!(ArchSet::parse("90a").unwrap().ptx(), None);
}

#[test]
fn compute_cap_garbage_is_a_clear_error() {
    let cases = [
        ("75", "older than sm_80"),
        ("7.5", "older than sm_80"),
        ("95", "unknown architecture sm_95"),
        ("800", "unknown architecture"),
        ("8.0.1", "expected a compute capability"),
        ("sm80", "expected a compute capability"),
        ("ampere", "expected a compute capability"),
        ("8.", "expected a compute capability"),
        ("80b", "expected a compute capability"),
        ("80a", "sm_80 has no `a` variant"),
        ("89f", "sm_89 has no `f` variant"),
        ("-80", "expected a compute capability"),
        ("99999999999", "expected a compute capability"),
    ];
    for (value, want) in cases {
        let err = ArchSet::parse(&format!("80,{value}")).unwrap_err();
        assert_eq!(err.token, value.trim());
        let text = err.to_string();
        assert!(text.starts_with(&format!("CUDA_COMPUTE_CAP entry `{value}`")), "{text}");
        assert!(text.contains(want), "{value}: {text} should mention {want}");
    }
}

#[test]
fn smem_limits_per_block() {
    let limit = |s: &str| Arch::parse(s).unwrap().smem_per_block();
    assert_eq!(limit("80"), Some(166_912));
    assert_eq!(limit("86"), Some(101_376));
    assert_eq!(limit("89"), Some(101_376));
    assert_eq!(limit("90"), Some(232_448));
    assert_eq!(limit("90a"), Some(232_448));
}

// ---------------------------------------------------------------------------------------------
// ptxas reports, captured from nvcc 13.0.88 (nvidia-cuda-nvcc==13.0.88 from PyPI)

/// `nvcc -fatbin -O3 -std=c++17 -Xptxas -v -gencode=arch=compute_80,code=sm_80
/// -gencode=arch=compute_90,code=[sm_90,compute_90]` on three kernels: a cp.async + mma.sync
/// tile with 16 KiB static smem, a bf16 row max with dynamic smem calling an out-of-line device
/// function, and a kernel that spills under `__launch_bounds__(1024, 1)`.
const SAMPLE_80_90: &str = r#"ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'cleave_spilly' for 'sm_80'
ptxas info    : Function properties for cleave_spilly
    22616 bytes stack frame, 29068 bytes spill stores, 35728 bytes spill loads
ptxas info    : Used 64 registers, used 0 barriers, 22616 bytes cumulative stack size, 372 bytes cmem[0]
ptxas info    : Compile time = 10469.399 ms
ptxas info    : Compiling entry function 'cleave_rowmax' for 'sm_80'
ptxas info    : Function properties for cleave_rowmax
    128 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 128 bytes cumulative stack size, 376 bytes cmem[0]
ptxas info    : Compile time = 15.982 ms
ptxas info    : Function properties for _Z10gather_sumPKfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'cleave_tile_mma' for 'sm_80'
ptxas info    : Function properties for cleave_tile_mma
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 24 registers, used 1 barriers, 16384 bytes smem, 384 bytes cmem[0]
ptxas info    : Compile time = 4.131 ms
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'cleave_spilly' for 'sm_90'
ptxas info    : Function properties for cleave_spilly
    16704 bytes stack frame, 24540 bytes spill stores, 27468 bytes spill loads
ptxas info    : Used 64 registers, used 0 barriers, 16704 bytes cumulative stack size
ptxas info    : Compile time = 6783.830 ms
ptxas info    : Compiling entry function 'cleave_rowmax' for 'sm_90'
ptxas info    : Function properties for cleave_rowmax
    128 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 128 bytes cumulative stack size
ptxas info    : Compile time = 23.494 ms
ptxas info    : Function properties for _Z10gather_sumPKfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'cleave_tile_mma' for 'sm_90'
ptxas info    : Function properties for cleave_tile_mma
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 16384 bytes smem
ptxas info    : Compile time = 8.455 ms
"#;

/// A template kernel at 255 registers that spills, for sm_80 and sm_90a (plus compute_90 PTX),
/// with `-maxrregcount=64`, which ptxas ignores with a warning because of `__launch_bounds__`.
const SAMPLE_HEAVY: &str = r#"ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'dyn_smem' for 'sm_80'
ptxas info    : Function properties for dyn_smem
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 360 bytes cmem[0]
ptxas info    : Compile time = 1.974 ms
ptxas info    : Compiling entry function '_Z7spill_kILi200EEvPKfPfi' for 'sm_80'
ptxas info    : Function properties for _Z7spill_kILi200EEvPKfPfi
    1680 bytes stack frame, 620 bytes spill stores, 620 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 1680 bytes cumulative stack size, 372 bytes cmem[0]
ptxas info    : Compile time = 1439.829 ms
ptxas info    : Function properties for _Z6helperPKfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'dyn_smem' for 'sm_90a'
ptxas info    : Function properties for dyn_smem
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers
ptxas info    : Compile time = 2.429 ms
ptxas info    : Compiling entry function '_Z7spill_kILi200EEvPKfPfi' for 'sm_90a'
ptxas info    : Function properties for _Z7spill_kILi200EEvPKfPfi
    1696 bytes stack frame, 628 bytes spill stores, 628 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 1696 bytes cumulative stack size
ptxas info    : Compile time = 1665.489 ms
ptxas info    : Function properties for _Z6helperPKfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas warning : Too big maxrregcount value specified 64, will be ignored
"#;

/// 64 KiB of static shared memory, for sm_90a: ptxas accepts it, the budget must not.
const SAMPLE_STATIC_64K: &str = r#"ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'toobig' for 'sm_90a'
ptxas info    : Function properties for toobig
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers, 65536 bytes smem
ptxas info    : Compile time = 3.455 ms
"#;

fn stats<'a>(kernels: &'a [KernelStats], name: &str, arch: &str) -> &'a KernelStats {
    kernels.iter().find(|k| k.name == name && k.arch == arch).unwrap_or_else(|| panic!("no {name} for {arch}"))
}

#[test]
fn parses_entries_device_functions_and_arches() {
    let report = parse_ptxas(SAMPLE_80_90);
    assert_eq!(report.kernels.len(), 8, "3 entries + 1 device function, for 2 arches");
    assert!(report.warnings.is_empty());

    let tile = stats(&report.kernels, "cleave_tile_mma", "sm_80");
    assert_eq!(
        *tile,
        KernelStats {
            name: "cleave_tile_mma".into(),
            arch: "sm_80".into(),
            entry: true,
            registers: 24,
            barriers: 1,
            smem_bytes: 16_384,
            ..KernelStats::default()
        }
    );
    assert_eq!(stats(&report.kernels, "cleave_tile_mma", "sm_90").registers, 32);

    let rowmax = stats(&report.kernels, "cleave_rowmax", "sm_90");
    assert_eq!((rowmax.registers, rowmax.stack_bytes, rowmax.smem_bytes, rowmax.spill_stores), (40, 128, 0, 0));

    let spilly = stats(&report.kernels, "cleave_spilly", "sm_80");
    assert_eq!((spilly.registers, spilly.barriers), (64, 0));
    assert_eq!((spilly.stack_bytes, spilly.spill_stores, spilly.spill_loads), (22_616, 29_068, 35_728));

    let helper = stats(&report.kernels, "_Z10gather_sumPKfi", "sm_90");
    assert!(!helper.entry);
    assert_eq!((helper.registers, helper.stack_bytes), (0, 0));
    assert_eq!(report.kernel("cleave_rowmax").count(), 2);
}

#[test]
fn parses_mangled_names_warnings_and_arch_variants() {
    let report = parse_ptxas(SAMPLE_HEAVY);
    let spill = stats(&report.kernels, "_Z7spill_kILi200EEvPKfPfi", "sm_90a");
    assert_eq!((spill.registers, spill.spill_stores, spill.spill_loads, spill.stack_bytes), (255, 628, 628, 1696));
    assert_eq!(stats(&report.kernels, "dyn_smem", "sm_80").registers, 10);
    assert_eq!(report.warnings, ["ptxas warning : Too big maxrregcount value specified 64, will be ignored"]);
}

#[test]
fn budget_passes_clean_kernels_and_counts_dynamic_smem() {
    let report = parse_ptxas(SAMPLE_80_90);
    let clean = cleave_core::toolchain::CompileReport {
        kernels: report.kernels.iter().filter(|k| k.name != "cleave_spilly").cloned().collect(),
        ..report.clone()
    };
    // 16 KiB static + 150 000 dynamic fits sm_80's 166 912 and sm_90's 232 448.
    assert!(clean.check_budget(&[("cleave_tile_mma", 150_000), ("cleave_rowmax", 1024)]).is_ok());

    let err = clean.check_budget(&[("cleave_tile_mma", 160_000)]).unwrap_err();
    assert_eq!(err.violations.len(), 1, "{err}");
    assert_eq!(
        err.violations[0].to_string(),
        "`cleave_tile_mma` (sm_80): needs 176384 bytes of shared memory per block (16384 static + 160000 dynamic), \
         above the limit of 166912"
    );
}

#[test]
fn budget_reports_every_spill_and_unknown_kernel() {
    let report = parse_ptxas(SAMPLE_80_90);
    let err = report.check_budget(&[("cleave_typo", 1)]).unwrap_err();
    let text: Vec<String> = err.violations.iter().map(ToString::to_string).collect();
    assert_eq!(
        text,
        [
            "`cleave_spilly` (sm_80): spills registers (29068 bytes stored, 35728 bytes loaded)",
            "`cleave_spilly` (sm_90): spills registers (24540 bytes stored, 27468 bytes loaded)",
            "`cleave_typo`: dynamic shared memory was declared for a kernel the compilation did not produce",
        ]
    );
    assert!(err.to_string().starts_with("3 kernel resource-budget violation(s):"), "{err}");

    let heavy = parse_ptxas(SAMPLE_HEAVY).check_budget(&[]).unwrap_err();
    assert!(heavy.violations.iter().all(|v| v.kernel == "_Z7spill_kILi200EEvPKfPfi"), "{heavy}");
    assert_eq!(heavy.violations.len(), 2);
}

#[test]
fn budget_rejects_large_static_smem_and_registers() {
    let err = parse_ptxas(SAMPLE_STATIC_64K).check_budget(&[]).unwrap_err();
    assert_eq!(
        err.violations[0].to_string(),
        "`toobig` (sm_90a): uses 65536 bytes of static shared memory (at most 49152; use dynamic)"
    );
    let too_many = "ptxas info    : Compiling entry function 'k' for 'sm_80'\n\
                    ptxas info    : Used 256 registers, used 0 barriers\n";
    let err = parse_ptxas(too_many).check_budget(&[]).unwrap_err();
    assert_eq!(err.violations[0].problem, "uses 256 registers per thread (at most 255)");
}

#[test]
fn parser_survives_garbage() {
    for text in [
        "",
        "ptxas",
        "ptxas info :",
        "ptxas info    : Compiling entry function 'unterminated",
        "ptxas info    : Used many registers",
        "    1 bytes stack frame, x bytes spill stores",
        "ptxas info    : Function properties for lonely\n\
         7 bytes stack frame, 1 bytes spill stores, 2 bytes spill loads",
    ] {
        let report = parse_ptxas(text);
        assert!(report.kernels.len() <= 1, "{text:?}");
    }
    // A device function reported before any entry of its ptxas run gets the run's arch.
    let early = "ptxas info    : 0 bytes gmem\n\
                 ptxas info    : Function properties for helper\n\
                 \x20   0 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n\
                 ptxas info    : Compiling entry function 'k' for 'sm_86'\n";
    let report = parse_ptxas(early);
    assert_eq!(stats(&report.kernels, "helper", "sm_86").spill_stores, 4);
}

#[test]
fn nvcc_version_lines() {
    let text = "nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA Corporation\n\
                Built on Wed_Aug_20_01:58:59_PM_PDT_2025\nCuda compilation tools, release 13.0, V13.0.88\n\
                Build cuda_13.0.r13.0/compiler.36424714_0\n";
    assert_eq!(parse_version(text), Some((13, 0)));
    assert_eq!(parse_version("Cuda compilation tools, release 12.4, V12.4.131"), Some((12, 4)));
    assert_eq!(parse_version("release x.y"), None);
    assert_eq!(parse_version(""), None);
}

// ---------------------------------------------------------------------------------------------
// Discovery, with a fake environment and fake nvcc scripts

/// A fresh scratch directory for one test, removed when the test ends.
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("cleave-toolchain-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// Writes an executable `nvcc` script into `dir/bin` that reports `release`.
#[cfg(unix)]
fn fake_nvcc(dir: &Path, release: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let path = bin.join("nvcc");
    std::fs::write(&path, format!("#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n"))
        .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn env_of(vars: Vec<(&'static str, OsString)>) -> impl Fn(&str) -> Option<OsString> {
    move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone())
}

#[test]
#[cfg(unix)]
fn explicit_nvcc_wins_and_a_broken_one_stops_the_search() {
    let dir = scratch("explicit");
    let nvcc = fake_nvcc(&dir.join("a"), "12.8");
    let home = fake_nvcc(&dir.join("b"), "13.0");
    let found = discover_with(env_of(vec![
        ("NVCC", nvcc.clone().into()),
        ("CUDA_HOME", home.parent().unwrap().parent().unwrap().into()),
        ("NVCC_CCBIN", "/usr/bin/g++-12".into()),
    ]));
    let got = found.nvcc.unwrap();
    assert_eq!((got.version, got.found_by.as_str()), ((12, 8), "NVCC"));
    assert_eq!(got.path, std::fs::canonicalize(&nvcc).unwrap());
    assert_eq!(got.ccbin.as_deref(), Some(Path::new("/usr/bin/g++-12")));
    assert_eq!(found.env_vars, ["NVCC", "NVCC_CCBIN"]);

    let missing = dir.join("nope/nvcc");
    let found = discover_with(env_of(vec![
        ("NVCC", missing.clone().into()),
        ("CUDA_HOME", home.parent().unwrap().parent().unwrap().into()),
    ]));
    assert!(found.nvcc.is_none(), "a broken NVCC must not fall back silently");
    assert_eq!(found.env_vars, ["NVCC"]);
    assert_eq!(found.notes, [format!("NVCC: {} is not an executable file", missing.display())]);
}

#[test]
#[cfg(unix)]
fn toolkit_roots_then_path() {
    let dir = scratch("roots");
    let in_path = fake_nvcc(&dir.join("p"), "12.9");
    let root = dir.join("toolkit");
    fake_nvcc(&root, "13.0");
    let found = discover_with(env_of(vec![("CUDA_PATH", root.into()), ("CUDA_ROOT", dir.join("empty").into())]));
    let got = found.nvcc.unwrap();
    assert_eq!((got.version, got.found_by.as_str()), ((13, 0), "CUDA_PATH"));
    assert_eq!(found.env_vars, ["NVCC", "CUDA_HOME", "CUDA_PATH", "NVCC_CCBIN"]);

    // A root without nvcc is noted and skipped; PATH is next.
    let found = discover_with(env_of(vec![
        ("CUDA_HOME", dir.join("empty").into()),
        ("PATH", std::env::join_paths([dir.join("nowhere"), in_path.parent().unwrap().to_owned()]).unwrap()),
    ]));
    let got = found.nvcc.unwrap();
    assert_eq!((got.version, got.found_by.as_str()), ((12, 9), "PATH"));
    assert_eq!(found.notes.len(), 1, "{:?}", found.notes);
    assert!(found.notes[0].starts_with("CUDA_HOME: "), "{:?}", found.notes);
    assert_eq!(&found.env_vars[..6], ["NVCC", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR", "PATH"]);
}

#[test]
#[cfg(unix)]
fn nvcc_by_name_and_symlinks_resolve_to_the_real_file() {
    let dir = scratch("symlink");
    let real = fake_nvcc(&dir.join("wheel"), "13.0");
    let links = dir.join("links");
    std::fs::create_dir_all(&links).unwrap();
    std::os::unix::fs::symlink(&real, links.join("nvcc")).unwrap();

    // The PyPI nvcc locates its profile through the path it is started with, so a symlink
    // must be replaced by its target.
    let got = Nvcc::at(&links.join("nvcc"), "test").unwrap();
    assert_eq!(got.path, std::fs::canonicalize(&real).unwrap());

    // NVCC=nvcc is looked up in PATH.
    let found = discover_with(env_of(vec![("NVCC", "nvcc".into()), ("PATH", links.clone().into())]));
    assert_eq!(found.nvcc.unwrap().path, std::fs::canonicalize(&real).unwrap());
    assert_eq!(found.env_vars, ["NVCC", "PATH", "NVCC_CCBIN"]);

    // A wrapper with another name (ccache, say) is kept as it is.
    std::os::unix::fs::symlink(&real, links.join("wrapper")).unwrap();
    let got = Nvcc::at(&links.join("wrapper"), "test").unwrap();
    assert_eq!(got.path, links.join("wrapper"));
}

#[test]
#[cfg(unix)]
fn ci_venv_is_the_last_resort() {
    let dir = scratch("venv");
    let wheel = dir.join("venv/lib/python3.11/site-packages/nvidia/cu13");
    fake_nvcc(&wheel, "13.0");
    let found =
        discover_with(env_of(vec![("CLEAVE_NVCC_VENV", dir.join("venv").into()), ("PATH", dir.join("no").into())]));
    let got = found.nvcc.unwrap();
    assert_eq!(got.version, (13, 0));
    assert!(got.found_by.starts_with("venv "), "{}", got.found_by);
    assert!(found.env_vars.contains(&"CLEAVE_NVCC_VENV"));
}

#[test]
fn nvcc_that_is_not_a_compiler_is_rejected() {
    let dir = scratch("notnvcc");
    let err = Nvcc::at(&dir, "test").unwrap_err();
    assert!(err.ends_with("is not an executable file"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Real compilation, only when NVCC names a compiler (CI sets it from .ci/install-nvcc.sh)

fn real_nvcc() -> Option<Nvcc> {
    let path = std::env::var_os("NVCC").filter(|v| !v.is_empty())?;
    Some(Nvcc::at(Path::new(&path), "NVCC").expect("NVCC is set but not usable"))
}

#[test]
fn finds_the_wheel_through_its_python_when_nvcc_is_a_pypi_wheel() {
    let Some(nvcc) = real_nvcc() else { return };
    // <venv>/lib/python3.X/site-packages/nvidia/cu13/bin/nvcc: the venv's python3 can import it.
    let Some(venv) = nvcc.path.ancestors().nth(7).filter(|_| nvcc.path.to_string_lossy().contains("/nvidia/cu13/bin/"))
    else {
        return;
    };
    let found = discover_with(env_of(vec![("PATH", venv.join("bin").into())]));
    let got = found.nvcc.unwrap_or_else(|| panic!("not found through {}: {:?}", venv.display(), found.notes));
    assert_eq!(got.path, nvcc.path);
    assert_eq!(got.found_by, "python3 (PyPI nvidia-cuda-nvcc)");
}

const TILE_KERNEL: &str = r#"
#include <cuda_fp16.h>
#include <cstdint>
#include "scale.h"

extern "C" __global__ void __launch_bounds__(128) cleave_test_scale(const __half* __restrict__ x,
                                                                   __half* __restrict__ y, int64_t n) {
  __shared__ float stage[128];
  extern __shared__ __align__(16) unsigned char dyn[];
  float* tail = reinterpret_cast<float*>(dyn);
  int64_t i = (int64_t)blockIdx.x * 128 + threadIdx.x;
  stage[threadIdx.x] = i < n ? __half2float(x[i]) : 0.f;
  tail[threadIdx.x] = stage[threadIdx.x] * CLEAVE_TEST_SCALE;
  __syncthreads();
  if (i < n) y[i] = __float2half(tail[127 - threadIdx.x] + expf(stage[threadIdx.x]));
}
"#;

const SECOND_KERNEL: &str = r#"
extern "C" __global__ void cleave_test_fill(float* y, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 1.0f;
}
"#;

/// The fatbin container's magic number, little-endian.
const FATBIN_MAGIC: [u8; 4] = [0x50, 0xED, 0x55, 0xBA];

#[test]
fn compiles_a_fatbin_for_sm80_and_sm90_when_nvcc_is_set() {
    let Some(nvcc) = real_nvcc() else { return };
    let dir = scratch("fatbin");
    let include = dir.join("include");
    std::fs::create_dir_all(&include).unwrap();
    std::fs::write(include.join("scale.h"), "#define CLEAVE_TEST_SCALE 0.5f\n").unwrap();
    let tile = dir.join("tile.cu");
    let fill = dir.join("fill.cu");
    std::fs::write(&tile, TILE_KERNEL).unwrap();
    std::fs::write(&fill, SECOND_KERNEL).unwrap();

    let out = dir.join("kernels.fatbin");
    let report =
        compile_fatbin(&nvcc, &[tile, fill], &[include], &ArchSet::default(), &out).unwrap_or_else(|e| panic!("{e}"));
    let image = std::fs::read(&out).unwrap();
    assert_eq!(image[..4], FATBIN_MAGIC);
    assert_eq!(report.outputs, [out]);
    assert_eq!(report.commands.len(), 1);
    assert!(report.commands[0].contains("-Xptxas -v"), "{}", report.commands[0]);
    assert!(!report.commands[0].contains("fast_math"));

    for arch in ["sm_80", "sm_90"] {
        let k = stats(&report.kernels, "cleave_test_scale", arch);
        assert!(k.entry && k.registers > 0 && k.registers <= 255, "{k:?}");
        assert_eq!(k.smem_bytes, 512, "static smem of {arch}");
        assert_eq!((k.spill_stores, k.spill_loads), (0, 0));
        stats(&report.kernels, "cleave_test_fill", arch);
    }
    report.check_budget(&[("cleave_test_scale", 100_000)]).unwrap();
    assert!(report.check_budget(&[("cleave_test_scale", 200_000)]).is_err(), "over sm_80's limit");
}

#[test]
fn per_source_mode_reports_each_source_and_every_failure_when_nvcc_is_set() {
    let Some(nvcc) = real_nvcc() else { return };
    let dir = scratch("each");
    let good = dir.join("fill.cu");
    let bad = dir.join("broken.cu");
    let worse = dir.join("worse.cu");
    std::fs::write(&good, SECOND_KERNEL).unwrap();
    std::fs::write(&bad, "extern \"C\" __global__ void k(float* y) { y[0] = undefined_name; }\n").unwrap();
    std::fs::write(&worse, "this is not C++\n").unwrap();
    let arches = ArchSet::parse("80").unwrap();

    let report = compile_each(&nvcc, std::slice::from_ref(&good), &[], &arches, &dir.join("out")).unwrap();
    assert_eq!(report.outputs, [dir.join("out/fill.fatbin")]);
    let k = stats(&report.kernels, "cleave_test_fill", "sm_80");
    assert_eq!(k.source.as_deref(), Some(good.as_path()));

    let err = compile_each(&nvcc, &[good, bad, worse], &[], &arches, &dir.join("out")).unwrap_err();
    let ToolchainError::Several(failures) = &err else { panic!("expected two failures: {err}") };
    assert_eq!(failures.len(), 2);
    let text = err.to_string();
    assert!(text.contains("undefined_name"), "{text}");
    assert!(text.contains("broken.cu") && text.contains("worse.cu"), "{text}");
}
