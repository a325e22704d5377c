//! The native artifacts of a build: a fatbin (nvcc) and a host-emulation static library (the
//! system C++ compiler through `cc`) per kernel, each cached by its kernel's content outside
//! `OUT_DIR`, so that editing one kernel recompiles only its own.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use rayon::prelude::*;

use cleave_core::codegen::headers;
use cleave_core::toolchain::{compile_fatbin, ArchSet, Nvcc};

use super::cache;
use super::env::{Directives, Env};

/// The nvcc flags [`compile_fatbin`] passes, as part of the fatbin cache key: a change there
/// must not reuse an old binary.
const NVCC_FLAGS_VERSION: &str = "-fatbin -O3 -std=c++17 -Xptxas -v";

/// Builds (or reuses) one fatbin per kernel (name, CUDA source), in parallel, each cached by
/// its own source, and copies each to `out_dir/NAME.fatbin`: editing one kernel recompiles
/// only that kernel. Returns a build-log line per kernel, in order.
pub(crate) fn fatbins(
    nvcc: &Nvcc,
    kernels: &[(String, PathBuf)],
    include: &Path,
    arches: &ArchSet,
    cache_root: &Path,
    out_dir: &Path,
) -> Result<Vec<String>, String> {
    fs::create_dir_all(out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
    kernels
        .par_iter()
        .map(|(name, source)| {
            let out = out_dir.join(format!("{name}.fatbin"));
            let line = fatbin(nvcc, std::slice::from_ref(source), include, arches, cache_root, &out)
                .map_err(|e| format!("kernel `{name}`: {e}"))?;
            Ok(format!("fatbin {name}: {line}"))
        })
        .collect()
}

/// Builds (or reuses) the fatbin of `sources` and copies it to `out`. Returns what happened,
/// for the build log.
fn fatbin(
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
        format!("cache hit ({})", cached.display())
    } else {
        let start = Instant::now();
        fs::create_dir_all(cached.parent().unwrap_or(cache_root))
            .map_err(|e| format!("{}: {e}", cache_root.display()))?;
        // nvcc writes under a unique name that is renamed into place, so that concurrent
        // builds never read a half-written fatbin; the name is removed if nvcc fails.
        let dir = cached.parent().unwrap_or(cache_root);
        let tmp = tempfile::Builder::new()
            .prefix(&format!("{key}."))
            .suffix(".fatbin")
            .tempfile_in(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .into_temp_path();
        let report = compile_fatbin(nvcc, sources, &[include.to_owned()], arches, &tmp);
        // The umbrella source compile_fatbin writes next to its output is of no further use.
        let mut umbrella = tmp.to_path_buf().into_os_string();
        umbrella.push(".all.cu");
        let _ = fs::remove_file(umbrella);
        let report = report.map_err(|e| e.to_string())?;
        tmp.persist(&cached).map_err(|e| format!("{}: {e}", cached.display()))?;
        let spills: Vec<String> = report
            .kernels
            .iter()
            .filter(|k| k.spill_stores > 0 || k.spill_loads > 0)
            .map(|k| format!("{} ({}): {} spill stores", k.name, k.arch, k.spill_stores))
            .collect();
        let mut line = format!(
            "compiled by {} {}.{} for {} in {:.2} s",
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

/// Builds (or reuses) one host-emulation static library per kernel (name, C++ unit that
/// includes the kernel's generated CUDA), each cached by its own unit, and links them all into
/// the crate: editing one kernel recompiles only its library. Returns a build-log line per
/// kernel, in order.
pub(crate) fn emulation_libraries(
    units: &[(String, PathBuf)],
    include: &Path,
    package: &str,
    cache_root: &Path,
    lib_dir: &Path,
    env: &Env,
    directives: &mut Directives,
) -> Result<Vec<String>, String> {
    let target = Env::cargo("TARGET").map(|t| t.to_string_lossy().into_owned()).unwrap_or_default();
    record_cc_vars(env, &target);
    let build = crate::emulate::emulation_build(&target, include);
    let compiler = build.try_get_compiler().map_err(|e| format!("no C++ compiler for the host emulation: {e}"))?;
    let version = Command::new(compiler.path()).arg("--version").output().map(|o| o.stdout).unwrap_or_default();
    let common: Vec<Vec<u8>> = vec![
        b"cleave-emu-v2".to_vec(),
        headers::fingerprint().into_bytes(),
        target.as_bytes().to_vec(),
        compiler.path().as_os_str().as_encoded_bytes().to_vec(),
        compiler.args().iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ").into_bytes(),
        version,
    ];
    let package = package.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    let libs: Vec<(String, PathBuf, String)> = units
        .par_iter()
        .map(|(name, unit)| {
            let lib_name = format!("cleave_emu_{package}_{name}");
            let mut parts = common.clone();
            parts.push(lib_name.as_bytes().to_vec());
            parts.push(fs::read(unit).map_err(|e| format!("{}: {e}", unit.display()))?);
            parts.push(fs::read(unit.with_extension("").with_extension("cu")).unwrap_or_default());
            let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            let key = cleave_core::hash::hex(&refs);
            let (cached, how) = emulation_library(&build, unit, &lib_name, &key, cache_root)?;
            Ok((lib_name, cached, format!("host emulation {name}: {how}")))
        })
        .collect::<Result<_, String>>()?;
    fs::create_dir_all(lib_dir).map_err(|e| format!("{}: {e}", lib_dir.display()))?;
    let mut keep = Vec::new();
    for (lib_name, cached, _) in &libs {
        let out = lib_dir.join(format!("lib{lib_name}.a"));
        cache::copy_if_changed(cached, &out).map_err(|e| format!("{}: {e}", out.display()))?;
        keep.push(out);
        directives.link(format!("rustc-link-lib=static={lib_name}"));
    }
    // Libraries of kernels no longer declared would be linked by nothing, but they would
    // linger; the directory holds exactly this build's.
    if let Ok(entries) = fs::read_dir(lib_dir) {
        for e in entries.flatten() {
            if !keep.contains(&e.path()) {
                let _ = fs::remove_file(e.path());
            }
        }
    }
    directives.link(format!("rustc-link-search=native={}", lib_dir.display()));
    if let Some(std) = cxx_stdlib(env, &target) {
        directives.link(format!("rustc-link-lib={std}"));
    }
    Ok(libs.into_iter().map(|(_, _, line)| line).collect())
}

/// The cached static library `lib_name` of one unit, compiled first if the cache lacks it, and
/// what happened.
fn emulation_library(
    build: &cc::Build,
    unit: &Path,
    lib_name: &str,
    key: &str,
    cache_root: &Path,
) -> Result<(PathBuf, String), String> {
    let file = format!("lib{lib_name}.a");
    let cached_dir = cache_root.join("emu").join(key);
    let cached = cached_dir.join(&file);
    if cached.is_file() {
        return Ok((cached.clone(), format!("cache hit ({})", cached.display())));
    }
    let start = Instant::now();
    // cc builds in a private directory (removed when `work` drops), and the library is
    // renamed from there into place, atomically.
    let emu = cache_root.join("emu");
    fs::create_dir_all(&emu).map_err(|e| format!("{}: {e}", emu.display()))?;
    let work = tempfile::Builder::new()
        .prefix(&format!("{key}."))
        .tempdir_in(&emu)
        .map_err(|e| format!("{}: {e}", emu.display()))?;
    let mut build = build.clone();
    build.out_dir(work.path()).file(unit);
    build.try_compile(lib_name).map_err(|e| format!("the C++ compiler failed on the host emulation: {e}"))?;
    fs::create_dir_all(&cached_dir).map_err(|e| format!("{}: {e}", cached_dir.display()))?;
    fs::rename(work.path().join(&file), &cached).map_err(|e| format!("{}: {e}", cached.display()))?;
    Ok((cached, format!("compiled in {:.2} s", start.elapsed().as_secs_f64())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Editing one of two kernels recompiles its fatbin only; the other comes from the cache.
    /// Runs where nvcc is found (CI requires it through `CLEAVE_REQUIRE_NVCC`).
    #[test]
    fn each_kernel_has_its_own_cached_fatbin() {
        let Some(nvcc) = cleave_core::toolchain::nvcc_for_check("the per-kernel fatbin check") else { return };
        let dir = std::env::temp_dir().join(format!("cleave-fatbins-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let include = dir.join("include");
        headers::write_to(&include).expect("headers");
        let source = |name: &str, value: f32| {
            let path = dir.join(format!("{name}.cu"));
            let text =
                format!("extern \"C\" __global__ void cleave_{name}(float* x) {{ x[threadIdx.x] = {value:?}f; }}\n");
            fs::write(&path, text).expect("source");
            (name.to_string(), path)
        };
        let arches = ArchSet::parse("90").expect("arches");
        let (cache, out) = (dir.join("cache"), dir.join("out"));
        let kernels = vec![source("one", 1.0), source("two", 2.0)];
        let first = fatbins(&nvcc, &kernels, &include, &arches, &cache, &out).expect("nvcc");
        assert!(first.iter().all(|l| l.contains(": compiled by ")), "{first:?}");
        let kernels = vec![source("one", 1.0), source("two", 3.0)];
        let second = fatbins(&nvcc, &kernels, &include, &arches, &cache, &out).expect("nvcc");
        assert!(second[0].starts_with("fatbin one: cache hit"), "{second:?}");
        assert!(second[1].starts_with("fatbin two: compiled by "), "{second:?}");
        for name in ["one", "two"] {
            let bytes = fs::metadata(out.join(format!("{name}.fatbin"))).map(|m| m.len()).unwrap_or(0);
            assert!(bytes > 0, "{name}.fatbin is missing or empty");
        }
        let _ = fs::remove_dir_all(&dir);
    }
}
