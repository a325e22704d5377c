//! The CUDA path of the candle integration builds: `cargo check` of `cleave` with its
//! `candle-cuda` feature (candle's `cuda`, whose own kernels candle compiles with nvcc). Nothing
//! here runs on a GPU; the CPU path is run by `examples/candle`'s tests.
//!
//! It checks the library rather than `examples/candle --features cuda`: that feature names
//! `cleave/candle-cuda`, which Cargo also applies to the example's build-dependency on `cleave`,
//! and linking that build script needs the CUDA libraries, which a machine with only nvcc from
//! PyPI does not have.
//!
//! It needs nvcc, so without one it checks nothing, unless `CLEAVE_REQUIRE_NVCC` is set (CI sets
//! it), which makes a missing nvcc a failure. It builds in its own target directory under
//! `target/`, kept between runs.

use std::path::PathBuf;
use std::process::Command;

use cleave_core::toolchain::nvcc_for_check;

#[test]
fn the_candle_cuda_path_builds() {
    let Some(nvcc) = nvcc_for_check("the candle CUDA build") else { return };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // candle's build finds nvcc on PATH, so the discovered one goes first.
    let bin = nvcc.path.parent().expect("nvcc has a directory").to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(bin)
            .chain(std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default()),
    )
    .expect("PATH joins");
    let out = Command::new(env!("CARGO"))
        .args(["check", "--release", "--locked", "-p", "cleave", "--features", "candle-cuda", "--lib"])
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", root.join("target/candle-cuda"))
        .env("PATH", path)
        // candle's kernel build asks nvidia-smi for the architecture unless this names one.
        .env("CUDA_COMPUTE_CAP", "90")
        .env_remove("RUSTFLAGS")
        .output()
        .expect("cargo runs");
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the candle CUDA path does not build:\n{log}");
}
