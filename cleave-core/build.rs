//! Fingerprints cleave-core's own sources and headers into `CLEAVE_CORE_FINGERPRINT`, so that
//! build caches keyed on it (the `cleave::build` cache of searched and generated kernels) are
//! invalidated whenever the generator changes, not only when its version number does. Also
//! records the target triple (`CLEAVE_CORE_TARGET`), which the host emulation needs when it
//! compiles C++ for the running process outside a build script.
//!
//! The script prints no `rerun-if-changed`: Cargo then reruns it whenever any file of the
//! package changes, which is exactly when the fingerprint may change.

use std::fs;
use std::path::{Path, PathBuf};

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let mut files = Vec::new();
    for sub in ["src", "include"] {
        collect(&root.join(sub), &mut files);
    }
    files.sort();
    // 64-bit FNV-1a over each file's relative path and contents, length-prefixed; std only, so
    // this script builds in a blink.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for file in &files {
        let rel = file.strip_prefix(&root).unwrap_or(file);
        eat(rel.to_string_lossy().as_bytes());
        eat(&fs::read(file).unwrap_or_default());
    }
    println!("cargo::rustc-env=CLEAVE_CORE_FINGERPRINT={h:016x}");
    if let Ok(target) = std::env::var("TARGET") {
        println!("cargo::rustc-env=CLEAVE_CORE_TARGET={target}");
    }
}
