//! The CUDA path of the candle integration builds: `cargo check` of `cleave` with its
//! `candle-cuda` feature (candle's `cuda`, whose own kernels candle compiles with nvcc). Nothing
//! here runs on a GPU; the CPU path is run by `examples/candle`'s tests.
//!
//! It checks the library rather than `examples/candle --features cuda`: that feature names
//! `cleave/candle-cuda`, which Cargo also applies to the example's build-dependency on `cleave`,
//! and linking that build script needs the CUDA libraries, which a machine with only nvcc from
//! PyPI does not have.
//!
//! What is checked is our Rust against candle's and cudarc's CUDA API, not candle's own CUDA:
//! compiling all of candle's kernels (PTX and a static library of quantized and MoE kernels)
//! takes most of half an hour on two cores and tests nothing of ours. So candle's build sees a
//! stand-in nvcc that answers its queries (`--version`, `--list-gpu-code`) with the real
//! nvcc's answers and writes every output it is asked for empty.
//!
//! It needs nvcc, so without one it checks nothing, unless `CLEAVE_REQUIRE_NVCC` is set (CI sets
//! it), which makes a missing nvcc a failure. It builds in its own target directory under
//! `target/`, kept between runs.

use std::path::{Path, PathBuf};
use std::process::Command;

use cleave_core::toolchain::nvcc_for_check;

#[test]
fn the_candle_cuda_path_builds() {
    let Some(nvcc) = nvcc_for_check("the candle CUDA build") else { return };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let target = root.join("target/candle-cuda");
    let bin = target.join("stand-in-nvcc/bin");
    write_stand_in(&bin, &nvcc.path);
    // candle's build looks for nvcc in `NVCC`, then on PATH: the stand-in is first in both.
    let path = std::env::join_paths(
        std::iter::once(bin.clone())
            .chain(std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default()),
    )
    .expect("PATH joins");
    let out = Command::new(env!("CARGO"))
        .args(["check", "--release", "--locked", "-p", "cleave", "--features", "candle-cuda", "--lib"])
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", &target)
        .env("NVCC", bin.join("nvcc"))
        .env("PATH", path)
        // candle's kernel build asks nvidia-smi for the architecture unless this names one.
        .env("CUDA_COMPUTE_CAP", "90")
        .env_remove("RUSTFLAGS")
        .output()
        .expect("cargo runs");
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the candle CUDA path does not build:\n{log}");
    // The stand-in, not the real nvcc, built candle's kernel library: otherwise this check
    // costs half an hour.
    let built: Vec<PathBuf> = std::fs::read_dir(target.join("release/build"))
        .expect("the check has build outputs")
        .filter_map(|e| Some(e.ok()?.path().join("out/libmoe.a")))
        .filter(|p| p.exists())
        .collect();
    assert!(!built.is_empty(), "candle's kernel library was not built");
    for lib in built {
        let len = std::fs::metadata(&lib).expect("the library is readable").len();
        assert_eq!(len, 0, "{} was compiled by a real nvcc", lib.display());
    }
}

/// Writes `dir/nvcc`: queries go to the real nvcc at `real`; a compile writes its outputs
/// (`-o FILE`, or one `.ptx` per source under `--output-directory`) empty, so candle's build
/// script runs to its end without compiling anything.
fn write_stand_in(dir: &Path, real: &Path) {
    std::fs::create_dir_all(dir).expect("the stand-in's directory is created");
    let script = format!(
        r#"#!/bin/sh
# Stand-in nvcc for a `cargo check` that compiles no CUDA; see tests/candle_cuda.rs.
for a in "$@"; do
  case "$a" in
    --version|-V|--list-gpu-code|--list-gpu-arch) exec '{real}' "$@" ;;
  esac
done
out=""; dir=""; prev=""
for a in "$@"; do
  case "$prev" in
    -o|--output-file) out="$a" ;;
    -odir|--output-directory) dir="$a" ;;
  esac
  case "$a" in
    --output-file=*) out="${{a#--output-file=}}" ;;
    --output-directory=*) dir="${{a#--output-directory=}}" ;;
  esac
  prev="$a"
done
if [ -n "$out" ]; then : > "$out"; fi
if [ -n "$dir" ]; then
  for a in "$@"; do
    case "$a" in *.cu) name="${{a##*/}}"; : > "$dir/${{name%.cu}}.ptx" ;; esac
  done
fi
"#,
        real = real.display()
    );
    let path = dir.join("nvcc");
    std::fs::write(&path, script).expect("the stand-in is written");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("the stand-in is executable");
    }
}
