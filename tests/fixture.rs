//! Builds and runs `tests/fixture`, a downstream crate that uses cleave exactly as a user
//! would (build.rs + `include_kernels!` + an inline `kernel!` + `kernel!(name)` + `kernel!`
//! inside its own `macro_rules!`), on a machine without a GPU or nvcc.
//!
//! One test, because the fixture's release build is the slow part and is done once:
//! 0. the binary's own dependency graph has no compiler (`cargo tree`);
//! 1. a fresh cache: the build searches every kernel, and the binary's `run_host` results match
//!    the f64 reference, misuse is an `Err`, and the GPU path says `NoDriver`;
//! 2. a second build with nothing changed reruns nothing (the build log is untouched);
//! 3. touching the YAML without changing a declaration reruns the build script, which takes
//!    every kernel from the cache;
//! 4. editing one declaration searches that kernel again, and only it, and rebuilds only its
//!    host-emulation library;
//! 5. an error in the YAML fails the build with `FILE:LINE:COL: message`;
//! 6. the release binary links neither nvcc, NVRTC nor the CUDA runtime (`ldd`).
//!
//! The fixture is copied under `target/`, so the edits never touch the repository, and built
//! with its own target directory there (kept between runs, so later runs are incremental).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Copies the fixture to `dest`, pointing its path dependencies at this repository.
fn copy_fixture(dest: &Path) {
    let src = root().join("tests/fixture");
    fs::create_dir_all(dest.join("src")).unwrap();
    for file in ["build.rs", "kernels.yaml", "src/lib.rs", "src/main.rs"] {
        let text = fs::read_to_string(src.join(file)).unwrap();
        write_if_changed(&dest.join(file), &text);
    }
    let manifest = fs::read_to_string(src.join("Cargo.toml")).unwrap();
    let manifest = manifest.replace("path = \"../..\"", &format!("path = {:?}", root().display().to_string()));
    write_if_changed(&dest.join("Cargo.toml"), &manifest);
    // The workspace's lockfile pins the fixture's dependencies to the versions tested here.
    if !dest.join("Cargo.lock").exists() {
        let _ = fs::copy(root().join("Cargo.lock"), dest.join("Cargo.lock"));
    }
}

/// Leaves an unchanged file alone, so a rerun of this test does not look like an edit to Cargo.
fn write_if_changed(path: &Path, text: &str) {
    if fs::read_to_string(path).ok().as_deref() != Some(text) {
        fs::write(path, text).unwrap();
    }
}

struct Fixture {
    dir: PathBuf,
    target: PathBuf,
    cache: PathBuf,
}

impl Fixture {
    fn cargo(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(env!("CARGO"))
            .args(args)
            .current_dir(&self.dir)
            .env("CARGO_TARGET_DIR", &self.target)
            .env("CLEAVE_CACHE_DIR", &self.cache)
            // Whatever the machine has, this test is about the build without nvcc.
            .env("NVCC", "/nonexistent/nvcc")
            .env_remove("CUDA_COMPUTE_CAP")
            .env_remove("RUSTFLAGS")
            .output()
            .expect("cargo runs");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }

    fn build(&self) -> String {
        let (ok, text) = self.cargo(&["build", "--release"]);
        assert!(ok, "the fixture failed to build:\n{text}");
        text
    }

    /// The build log of the most recent build-script run.
    fn log(&self) -> (PathBuf, String) {
        let build = self.target.join("release/build");
        let newest = fs::read_dir(&build)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("cleave-fixture-"))
            .map(|e| e.path().join("out/cleave/build.log"))
            .filter(|p| p.is_file())
            .max_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH))
            .expect("a build log");
        let text = fs::read_to_string(&newest).unwrap();
        (newest, text)
    }

    fn binary(&self) -> PathBuf {
        self.target.join("release/cleave-fixture")
    }
}

fn kernel_line<'a>(log: &'a str, kernel: &str) -> &'a str {
    log.lines()
        .find(|l| l.starts_with(&format!("kernel {kernel} ")))
        .unwrap_or_else(|| panic!("no line for kernel {kernel} in the build log:\n{log}"))
}

#[test]
fn fixture_builds_runs_caches_and_links_no_cuda_toolkit() {
    let base = root().join("target/fixture");
    let fx = Fixture { dir: base.join("crate"), target: base.join("target"), cache: base.join("cache") };
    copy_fixture(&fx.dir);
    // A fresh cache, under a new name: changing CLEAVE_CACHE_DIR also reruns the build script
    // of a fixture built by an earlier run of this test.
    let _ = fs::remove_dir_all(&fx.cache);
    let stamp = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let fx = Fixture { cache: fx.cache.join(stamp.to_string()), ..fx };

    // 0. The binary's own dependencies (not the build script's, not the proc macro's) leave
    //    the compiler out.
    let (ok, tree) = fx.cargo(&["tree", "--edges", "normal,no-proc-macro", "--prefix", "none"]);
    assert!(ok, "{tree}");
    assert!(tree.lines().any(|l| l.starts_with("cleave-runtime ")), "{tree}");
    for banned in ["cleave-core ", "cc ", "syn ", "clap "] {
        assert!(!tree.lines().any(|l| l.starts_with(banned)), "the binary depends on {banned}:\n{tree}");
    }

    // 1. A fresh build searches every kernel.
    let output = fx.build();
    let (log_path, log) = fx.log();
    for kernel in ["attention", "decode", "swiglu", "proj", "row_norm_40", "row_norm_24"] {
        assert!(kernel_line(&log, kernel).contains("searched in"), "{log}");
    }
    // The decode and SwiGLU list a second extent of their batch: two searches each.
    for kernel in ["decode", "swiglu"] {
        assert!(kernel_line(&log, kernel).contains(", over 2 sets of extents;"), "{log}");
    }
    assert!(!kernel_line(&log, "proj").contains("sets of extents"), "{log}");
    assert!(log.contains("fatbin: not built (nvcc not found)"), "{log}");
    assert!(output.contains("nvcc not found"), "expected one cargo warning about nvcc:\n{output}");
    let lock = fs::read_to_string(fx.dir.join("kernels.lock")).expect("kernels.lock next to kernels.yaml");
    for kernel in ["attention", "decode", "swiglu", "proj", "row_norm_40", "row_norm_24"] {
        assert!(lock.contains(&format!("\"{kernel}\"")), "{lock}");
    }

    let run = Command::new(fx.binary()).output().expect("the fixture runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "fixture checks failed:\n{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("fixture: all checks passed"), "{stdout}");
    assert!(stdout.contains("ok launch without a driver") || stdout.contains("ok launch"), "{stdout}");

    // 2. Nothing changed: nothing reruns.
    let modified = fs::metadata(&log_path).unwrap().modified().unwrap();
    let output = fx.build();
    assert!(!output.contains("Compiling cleave-fixture"), "a no-op build recompiled:\n{output}");
    assert_eq!(fs::metadata(&log_path).unwrap().modified().unwrap(), modified, "the build script reran");

    // 3. A new mtime (and a comment) on the YAML reruns the script, which searches nothing.
    let yaml_path = fx.dir.join("kernels.yaml");
    let yaml = fs::read_to_string(&yaml_path).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    fs::write(&yaml_path, format!("{yaml}# touched\n")).unwrap();
    fx.build();
    let (_, log) = fx.log();
    for kernel in ["attention", "decode", "swiglu", "proj", "row_norm_40", "row_norm_24"] {
        assert!(kernel_line(&log, kernel).contains("cache hit"), "{log}");
    }

    // 4. Editing one declaration searches that kernel again, and only it; the other kernels'
    //    host-emulation libraries come from the cache, and the edited one's is rebuilt exactly
    //    when its generated source changed.
    let (log_path, _) = fx.log();
    let source = log_path.with_file_name("src").join("attention.cu");
    let before = fs::read_to_string(&source).expect("the generated source");
    let edited = yaml.replace("s: { value: 64, dynamic: true }", "s: { value: 96, dynamic: true }");
    assert_ne!(edited, yaml, "the fixture's YAML changed; update this test");
    fs::write(&yaml_path, edited).unwrap();
    fx.build();
    let (_, log) = fx.log();
    assert!(kernel_line(&log, "attention").contains("searched in"), "{log}");
    assert!(kernel_line(&log, "decode").contains("cache hit"), "{log}");
    assert!(kernel_line(&log, "swiglu").contains("cache hit"), "{log}");
    let emulation = |kernel: &str| {
        let prefix = format!("host emulation {kernel}: ");
        log.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no {prefix} line:\n{log}")).to_string()
    };
    assert!(emulation("decode").contains("cache hit"), "{log}");
    assert!(emulation("swiglu").contains("cache hit"), "{log}");
    let changed = fs::read_to_string(&source).expect("the generated source") != before;
    assert_eq!(emulation("attention").contains("compiled in"), changed, "{log}");
    let run = Command::new(fx.binary()).output().expect("the fixture runs");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stdout));

    // An error in the YAML fails the build with a located diagnostic.
    let broken =
        yaml.replace("o = matmul(softmax(scores, axis=-1), v)\n\n", "o = matmul(softmax(scores, axis=-1), w)\n\n");
    assert_ne!(broken, yaml, "the fixture's YAML changed; update this test");
    fs::write(&yaml_path, broken).unwrap();
    let (ok, output) = fx.cargo(&["build", "--release"]);
    assert!(!ok, "a broken YAML built:\n{output}");
    // Cargo shows it first, as an error of its own (`cargo::error`), not only in the script's
    // stderr; the stderr also has the source line with the name underlined.
    assert!(output.contains("error: cleave-fixture@0.0.0: kernels.yaml:10:44: undefined name `w`"), "{output}");
    assert!(output.contains("o = matmul(softmax(scores, axis=-1), w)"), "{output}");
    fs::write(&yaml_path, yaml).unwrap();

    // 5. At run time the binary needs only the system libraries: libcuda is loaded on demand.
    let ldd = Command::new("ldd").arg(fx.binary()).output();
    match ldd {
        Ok(out) if out.status.success() => {
            let libs = String::from_utf8_lossy(&out.stdout).to_lowercase();
            for banned in ["libcudart", "libnvrtc", "nvcc", "libcuda.so"] {
                assert!(!libs.contains(banned), "the release binary links {banned}:\n{libs}");
            }
        }
        // No ldd (not Linux): nothing to check.
        _ => {}
    }
}
