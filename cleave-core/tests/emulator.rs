//! Builds and runs the CPU emulator's C++ test programs (`tests/emu/*.cpp`), and, when the `NVCC`
//! environment variable names an nvcc, checks that the same kernel source compiles for the GPU.
//!
//! Each program is compiled with the system C++ compiler (`CXX`, else `c++`, `g++` or `clang++`
//! from `PATH`) as `-std=c++17 -O2 -I include -DCLEAVE_EMULATE -pthread`, run, and must exit 0.
//! A few are compiled a second time with `-DCLEAVE_EMU_UCONTEXT` so that the portable
//! context-switch fallback stays tested on machines that have the assembly one.

// The programs' own summaries (and the speed measurement) are worth seeing with --nocapture.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;

/// Programs that are also built against the ucontext fallback.
const UCONTEXT_VARIANTS: &[&str] = &["barrier", "launch"];

/// The kernel file that must also compile with nvcc.
const DEVICE_SOURCE: &str = "all_primitives.cpp";

/// The extern "C" kernels of `DEVICE_SOURCE`; ptxas must report each of them.
const DEVICE_KERNELS: &[&str] = &["cleave_attn_fwd_f16", "cleave_attn_fwd_bf16", "cleave_row_softmax", "cleave_mm16x8"];

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn work_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).expect("create the test's temporary directory");
    dir
}

/// The C++ compiler as a program and leading arguments (`CXX` may be e.g. `ccache g++`).
fn cxx() -> Vec<String> {
    if let Ok(cxx) = std::env::var("CXX") {
        let words: Vec<String> = cxx.split_whitespace().map(str::to_owned).collect();
        if !words.is_empty() {
            return words;
        }
    }
    for candidate in ["c++", "g++", "clang++"] {
        let works = Command::new(candidate).arg("--version").output().is_ok_and(|o| o.status.success());
        if works {
            return vec![candidate.to_owned()];
        }
    }
    panic!("no C++ compiler found: set CXX or put c++, g++ or clang++ on PATH");
}

fn describe(what: &str, out: &Output) -> String {
    format!(
        "{what}: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

struct Job {
    name: String,
    source: PathBuf,
    defines: Vec<&'static str>,
}

/// Compiles and runs one program; returns its output, or a description of what failed.
fn compile_and_run(cxx: &[String], job: &Job, dir: &Path) -> Result<String, String> {
    let exe = dir.join(&job.name);
    let include = crate_dir().join("include");
    let mut cmd = Command::new(&cxx[0]);
    cmd.args(&cxx[1..])
        .args(["-std=c++17", "-O2", "-DCLEAVE_EMULATE", "-pthread"])
        .arg("-I")
        .arg(&include)
        .args(&job.defines)
        .arg(&job.source)
        .arg("-o")
        .arg(&exe);
    let built = cmd.output().map_err(|e| format!("{}: cannot run {}: {e}", job.name, cxx[0]))?;
    if !built.status.success() {
        return Err(describe(&format!("{}: compile", job.name), &built));
    }
    let ran = Command::new(&exe).output().map_err(|e| format!("{}: cannot run: {e}", job.name))?;
    if !ran.status.success() {
        return Err(describe(&format!("{}: run", job.name), &ran));
    }
    Ok(String::from_utf8_lossy(&ran.stdout).into_owned())
}

fn jobs() -> Vec<Job> {
    let dir = crate_dir().join("tests/emu");
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read tests/emu")
        .map(|e| e.expect("list tests/emu").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cpp"))
        .collect();
    sources.sort();
    assert!(!sources.is_empty(), "no C++ test programs in {}", dir.display());
    let mut jobs = Vec::new();
    for source in sources {
        let stem = source.file_stem().expect("file name").to_string_lossy().into_owned();
        if UCONTEXT_VARIANTS.contains(&stem.as_str()) {
            jobs.push(Job {
                name: format!("{stem}-ucontext"),
                source: source.clone(),
                defines: vec!["-DCLEAVE_EMU_UCONTEXT"],
            });
        }
        jobs.push(Job { name: stem, source, defines: Vec::new() });
    }
    jobs
}

#[test]
fn emulator_programs_pass() {
    let cxx = cxx();
    let dir = work_dir("emu");
    let jobs = jobs();
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    let workers = thread::available_parallelism().map_or(2, |n| n.get()).min(jobs.len());
    thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let result = compile_and_run(&cxx, job, &dir);
                results.lock().expect("results lock").push((job.name.clone(), result));
            });
        }
    });
    let mut results = results.into_inner().expect("results lock");
    results.sort_by(|a, b| a.0.cmp(&b.0));
    let mut failures = Vec::new();
    for (name, result) in results {
        match result {
            Ok(stdout) => println!("== {name}\n{}", stdout.trim_end()),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{} program(s) failed:\n{}", failures.len(), failures.join("\n\n"));
}

/// ptxas lines such as "0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads" that
/// report a non-zero spill.
fn spills(ptxas_log: &str) -> Vec<&str> {
    ptxas_log
        .lines()
        .filter(|line| {
            line.split(',').any(|part| {
                let part = part.trim();
                part.contains("spill") && !part.starts_with("0 bytes")
            })
        })
        .collect()
}

#[test]
fn device_kernels_compile_with_nvcc() {
    let Some(nvcc) = std::env::var_os("NVCC").filter(|v| !v.is_empty()) else {
        eprintln!("NVCC is not set: skipping the nvcc compile of tests/emu/{DEVICE_SOURCE}");
        return;
    };
    let dir = work_dir("nvcc");
    for arch in ["sm_80", "sm_90"] {
        let out = Command::new(&nvcc)
            .arg(format!("-arch={arch}"))
            .args(["-cubin", "-Xptxas", "-v", "-x", "cu", "-I"])
            .arg(crate_dir().join("include"))
            .arg(crate_dir().join("tests/emu").join(DEVICE_SOURCE))
            .arg("-o")
            .arg(dir.join(format!("all_primitives_{arch}.cubin")))
            .output()
            .expect("run $NVCC");
        let what = format!("nvcc -arch={arch}");
        assert!(out.status.success(), "{}", describe(&what, &out));
        let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        for kernel in DEVICE_KERNELS {
            assert!(
                log.contains(&format!("Function properties for {kernel}")),
                "{what}: ptxas did not report {kernel}:\n{log}"
            );
        }
        let spilled = spills(&log);
        assert!(spilled.is_empty(), "{what}: register spills:\n{}\n\n{log}", spilled.join("\n"));
        println!("{what}: {} kernels, no spills", DEVICE_KERNELS.len());
    }
}
