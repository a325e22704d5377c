//! The native artifacts of a build: the fatbin (nvcc) and the host-emulation static library
//! (the system C++ compiler through `cc`), both cached by content outside `OUT_DIR`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use cleave_core::codegen::headers;
use cleave_core::toolchain::{compile_fatbin, ArchSet, Nvcc};

use super::cache;
use super::env::{Directives, Env};

/// The nvcc flags [`compile_fatbin`] passes, as part of the fatbin cache key: a change there
/// must not reuse an old binary.
const NVCC_FLAGS_VERSION: &str = "-fatbin -O3 -std=c++17 -Xptxas -v";

/// Builds (or reuses) the fatbin of `sources` and copies it to `out`. Returns a line for the
/// build log.
pub(crate) fn fatbin(
    nvcc: &Nvcc,
    sources: &[PathBuf],
    include: &Path,
    arches: &ArchSet,
    cache_root: &Path,
    out: &Path,
) -> Result<String, String> {
    let mut parts: Vec<Vec<u8>> = vec![
        b"cleave-fatbin-v1".to_vec(),
        headers::fingerprint().into_bytes(),
        nvcc.path.as_os_str().as_encoded_bytes().to_vec(),
        format!("{:?} {:?}", nvcc.version, nvcc.ccbin).into_bytes(),
        arches.gencode_flags().join(" ").into_bytes(),
        NVCC_FLAGS_VERSION.as_bytes().to_vec(),
    ];
    for s in sources {
        parts.push(s.file_name().unwrap_or_default().as_encoded_bytes().to_vec());
        parts.push(fs::read(s).map_err(|e| format!("{}: {e}", s.display()))?);
    }
    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    let key = cleave_core::hash::hex(&refs);
    let cached = cache_root.join("fatbin").join(format!("{key}.fatbin"));
    let line = if cached.is_file() {
        format!("fatbin: cache hit ({})", cached.display())
    } else {
        let start = Instant::now();
        fs::create_dir_all(cached.parent().unwrap_or(cache_root))
            .map_err(|e| format!("{}: {e}", cache_root.display()))?;
        let tmp = cache::temp_path(&cached);
        let report = compile_fatbin(nvcc, sources, &[include.to_owned()], arches, &tmp).map_err(|e| {
            let _ = fs::remove_file(&tmp);
            e.to_string()
        })?;
        fs::rename(&tmp, &cached).map_err(|e| format!("{}: {e}", cached.display()))?;
        // The umbrella source compile_fatbin writes next to its output is of no further use.
        let mut umbrella = tmp.into_os_string();
        umbrella.push(".all.cu");
        let _ = fs::remove_file(umbrella);
        let spills: Vec<String> = report
            .kernels
            .iter()
            .filter(|k| k.spill_stores > 0 || k.spill_loads > 0)
            .map(|k| format!("{} ({}): {} spill stores", k.name, k.arch, k.spill_stores))
            .collect();
        let mut line = format!(
            "fatbin: compiled by {} {}.{} for {} in {:.2} s",
            nvcc.path.display(),
            nvcc.version.0,
            nvcc.version.1,
            arches.describe(),
            start.elapsed().as_secs_f64()
        );
        if !spills.is_empty() {
            line.push_str(&format!("; register spills: {}", spills.join(", ")));
        }
        line
    };
    cache::copy_if_changed(&cached, out).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(line)
}

/// The variables `cc` reads to pick the C++ compiler, its flags and archiver (plain and
/// target-specific forms), recorded so that changing them reruns the build.
fn record_cc_vars(env: &Env, target: &str) {
    let underscored = target.replace('-', "_");
    for base in ["CXX", "CXXFLAGS", "CC", "CFLAGS", "AR", "ARFLAGS", "CXXSTDLIB", "CRATE_CC_NO_DEFAULTS"] {
        env.record(base);
        env.record(&format!("{base}_{target}"));
        env.record(&format!("{base}_{underscored}"));
        env.record(&format!("TARGET_{base}"));
        env.record(&format!("HOST_{base}"));
    }
}

/// The C++ standard library to link the emulation library against, as `cc` chooses it.
fn cxx_stdlib(env: &Env, target: &str) -> Option<String> {
    if let Some(lib) = env.var("CXXSTDLIB") {
        return Some(lib.to_string_lossy().into_owned()).filter(|s| !s.is_empty());
    }
    if target.contains("msvc") {
        None
    } else if target.contains("apple") || target.contains("freebsd") || target.contains("openbsd") {
        Some("c++".into())
    } else if target.contains("android") {
        Some("c++_shared".into())
    } else {
        Some("stdc++".into())
    }
}

/// Builds (or reuses) the host-emulation static library from `units` (C++ files that include
/// the generated CUDA sources) and links it into the crate. Returns a line for the build log.
pub(crate) fn emulation_library(
    units: &[PathBuf],
    include: &Path,
    lib_name: &str,
    cache_root: &Path,
    lib_dir: &Path,
    env: &Env,
    directives: &mut Directives,
) -> Result<String, String> {
    let target = Env::cargo("TARGET").map(|t| t.to_string_lossy().into_owned()).unwrap_or_default();
    record_cc_vars(env, &target);
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        // The emulator is the test backend; an unoptimized one would make `run_host` crawl in
        // debug builds.
        .opt_level(2)
        .debug(false)
        .warnings(false)
        .cargo_metadata(false)
        .cargo_warnings(false)
        .define("CLEAVE_EMULATE", None)
        .include(include);
    if !target.contains("msvc") {
        build.flag("-pthread").flag("-w");
    }
    let compiler = build.try_get_compiler().map_err(|e| format!("no C++ compiler for the host emulation: {e}"))?;
    let version = Command::new(compiler.path()).arg("--version").output().map(|o| o.stdout).unwrap_or_default();
    let mut parts: Vec<Vec<u8>> = vec![
        b"cleave-emu-v1".to_vec(),
        headers::fingerprint().into_bytes(),
        lib_name.as_bytes().to_vec(),
        target.as_bytes().to_vec(),
        compiler.path().as_os_str().as_encoded_bytes().to_vec(),
        compiler.args().iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ").into_bytes(),
        version,
    ];
    for unit in units {
        parts.push(unit.file_name().unwrap_or_default().as_encoded_bytes().to_vec());
        parts.push(fs::read(unit).map_err(|e| format!("{}: {e}", unit.display()))?);
        let cu = unit.with_extension("").with_extension("cu");
        parts.push(fs::read(&cu).unwrap_or_default());
    }
    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    let key = cleave_core::hash::hex(&refs);
    let file = format!("lib{lib_name}.a");
    let cached_dir = cache_root.join("emu").join(&key);
    let cached = cached_dir.join(&file);
    let line = if cached.is_file() {
        format!("host emulation library: cache hit ({})", cached.display())
    } else {
        let start = Instant::now();
        let work = cache::temp_path(&cached_dir);
        fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
        build.out_dir(&work).files(units);
        let result =
            build.try_compile(lib_name).map_err(|e| format!("the C++ compiler failed on the host emulation: {e}"));
        if let Err(e) = result {
            let _ = fs::remove_dir_all(&work);
            return Err(e);
        }
        fs::create_dir_all(&cached_dir).map_err(|e| format!("{}: {e}", cached_dir.display()))?;
        let tmp = cache::temp_path(&cached);
        fs::rename(work.join(&file), &tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        fs::rename(&tmp, &cached).map_err(|e| format!("{}: {e}", cached.display()))?;
        let _ = fs::remove_dir_all(&work);
        format!(
            "host emulation library: compiled {} units with {} in {:.2} s",
            units.len(),
            compiler.path().display(),
            start.elapsed().as_secs_f64()
        )
    };
    let out = lib_dir.join(&file);
    cache::copy_if_changed(&cached, &out).map_err(|e| format!("{}: {e}", out.display()))?;
    directives.link(format!("rustc-link-search=native={}", lib_dir.display()));
    directives.link(format!("rustc-link-lib=static={lib_name}"));
    if let Some(std) = cxx_stdlib(env, &target) {
        directives.link(format!("rustc-link-lib={std}"));
    }
    Ok(line)
}
