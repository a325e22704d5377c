//! Finding nvcc, without any GPU or driver.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A usable nvcc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nvcc {
    /// The path to run. For a symlink named `nvcc` this is its target, because the PyPI nvcc
    /// finds its headers and `cicc` relative to the path it was started through.
    pub path: PathBuf,
    /// The CUDA release, e.g. (13, 0).
    pub version: (u32, u32),
    /// The host compiler to pass as `-ccbin`, from `NVCC_CCBIN`.
    pub ccbin: Option<PathBuf>,
    /// Which rule found it: an environment variable name, `PATH`, `/usr/local/cuda`, or a
    /// Python package location.
    pub found_by: String,
}

impl Nvcc {
    /// Checks the nvcc at `path` by running `nvcc --version`; the error says why it is not
    /// usable.
    pub fn at(path: &Path, found_by: &str) -> Result<Nvcc, String> {
        if !is_executable(path) {
            return Err(format!("{} is not an executable file", path.display()));
        }
        let path = match fs::canonicalize(path) {
            Ok(real) if real.file_name() == path.file_name() => real,
            _ => path.to_owned(),
        };
        let output = Command::new(&path)
            .arg("--version")
            .output()
            .map_err(|e| format!("running `{} --version` failed: {e}", path.display()))?;
        let text = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(format!("`{} --version` exited with {}", path.display(), output.status));
        }
        let version = parse_version(&text)
            .ok_or_else(|| format!("`{} --version` printed no `release X.Y` line", path.display()))?;
        Ok(Nvcc { path, version, ccbin: None, found_by: found_by.to_owned() })
    }
}

/// Extracts (major, minor) from `nvcc --version` output
/// (`Cuda compilation tools, release 13.0, V13.0.88`).
pub fn parse_version(text: &str) -> Option<(u32, u32)> {
    let rest = &text[text.find("release ")? + "release ".len()..];
    let number = rest.split(|c: char| c == ',' || c.is_whitespace()).next()?;
    let (major, minor) = number.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The outcome of a search: the nvcc found (if any), the environment variables consulted, and
/// notes on candidates that were rejected.
#[derive(Debug, Clone, Default)]
pub struct Discovery {
    /// The nvcc to use.
    pub nvcc: Option<Nvcc>,
    /// Every environment variable the search read, set or not, in order. A build script emits
    /// `cargo::rerun-if-env-changed` for each.
    pub env_vars: Vec<&'static str>,
    /// Why candidates were rejected, for a build warning.
    pub notes: Vec<String>,
}

/// The variables naming a toolkit root whose `bin/nvcc` is a candidate, in the order tried.
const ROOT_VARS: &[&str] = &["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR"];

/// Where the CI script puts its venv unless `CLEAVE_NVCC_VENV` says otherwise, relative to
/// `HOME`.
const CI_VENV: &str = ".cache/cleave-ci/nvcc-venv";

/// Locations of nvcc inside the `nvidia` Python namespace package: the CUDA 13 wheels install
/// into `nvidia/cu13`, older layouts used one directory per package.
const WHEEL_NVCC: &[&str] = &["cu13/bin", "cuda_nvcc/bin"];

/// Finds nvcc using the process environment; see [`discover_with`].
pub fn find_nvcc() -> Option<Nvcc> {
    discover().nvcc
}

/// nvcc for a check that needs one (a test, a benchmark): `Some` when it is found. When it is
/// not, `None` after a note on stderr naming the skipped `check`, unless `CLEAVE_REQUIRE_NVCC`
/// is set (CI sets it): then a missing nvcc is a panic that says why, so a check can never
/// pass by skipping where nvcc was promised.
#[allow(clippy::print_stderr)]
pub fn nvcc_for_check(check: &str) -> Option<Nvcc> {
    let found = discover();
    if found.nvcc.is_none() {
        let why = found.notes.join("; ");
        assert!(
            std::env::var_os("CLEAVE_REQUIRE_NVCC").is_none(),
            "CLEAVE_REQUIRE_NVCC is set but no nvcc was found: {why}"
        );
        eprintln!("note: no nvcc found ({why}); skipping {check}");
    }
    found.nvcc
}

/// Searches using the process environment; see [`discover_with`].
pub fn discover() -> Discovery {
    discover_with(|name| std::env::var_os(name))
}

/// Searches for nvcc, in order:
///
/// 1. `NVCC` (a path, or a name looked up in `PATH`). If it is set but unusable the search
///    stops there: an explicit choice is never silently replaced.
/// 2. `bin/nvcc` under `CUDA_HOME`, `CUDA_PATH`, `CUDA_ROOT`, `CUDA_TOOLKIT_ROOT_DIR`.
/// 3. `nvcc` in `PATH`, then `/usr/local/cuda/bin/nvcc`.
/// 4. The PyPI wheels (`nvidia-cuda-nvcc`) of the `python3` in `PATH`.
/// 5. The CI script's venv (`CLEAVE_NVCC_VENV`, default `$HOME/.cache/cleave-ci/nvcc-venv`).
///
/// `NVCC_CCBIN`, when set, becomes the host compiler. `env` reads one variable.
pub fn discover_with(env: impl Fn(&str) -> Option<OsString>) -> Discovery {
    let mut search = Search { env, found: Discovery::default() };
    let nvcc = search.run();
    search.found.nvcc = nvcc.map(|mut nvcc| {
        nvcc.ccbin = search.var("NVCC_CCBIN").map(PathBuf::from);
        nvcc
    });
    search.found
}

struct Search<F> {
    env: F,
    found: Discovery,
}

impl<F: Fn(&str) -> Option<OsString>> Search<F> {
    /// Reads a variable, recording that it was read; empty counts as unset.
    fn var(&mut self, name: &'static str) -> Option<OsString> {
        self.found.env_vars.push(name);
        (self.env)(name).filter(|v| !v.is_empty())
    }

    fn try_path(&mut self, path: &Path, found_by: &str) -> Option<Nvcc> {
        match Nvcc::at(path, found_by) {
            Ok(nvcc) => Some(nvcc),
            Err(reason) => {
                self.found.notes.push(format!("{found_by}: {reason}"));
                None
            }
        }
    }

    fn run(&mut self) -> Option<Nvcc> {
        let exe = format!("nvcc{}", std::env::consts::EXE_SUFFIX);
        if let Some(explicit) = self.var("NVCC") {
            let path = PathBuf::from(&explicit);
            let path = if path.components().count() == 1 {
                let dirs = self.var("PATH");
                find_in_path(dirs.as_deref(), &explicit).unwrap_or(path)
            } else {
                path
            };
            return self.try_path(&path, "NVCC");
        }
        for &root in ROOT_VARS {
            if let Some(dir) = self.var(root) {
                let nvcc = self.try_path(&Path::new(&dir).join("bin").join(&exe), root);
                if nvcc.is_some() {
                    return nvcc;
                }
            }
        }
        let path_var = self.var("PATH");
        if let Some(path) = find_in_path(path_var.as_deref(), OsStr::new(&exe)) {
            if let Some(nvcc) = self.try_path(&path, "PATH") {
                return Some(nvcc);
            }
        }
        let default_root = Path::new("/usr/local/cuda/bin").join(&exe);
        if cfg!(unix) && default_root.exists() {
            if let Some(nvcc) = self.try_path(&default_root, "/usr/local/cuda") {
                return Some(nvcc);
            }
        }
        if let Some(nvcc) = self.wheel_nvcc(path_var.as_deref(), &exe) {
            return Some(nvcc);
        }
        self.ci_venv_nvcc(&exe)
    }

    /// nvcc from the `nvidia` namespace package of the `python3` in `PATH`.
    fn wheel_nvcc(&mut self, path_var: Option<&OsStr>, exe: &str) -> Option<Nvcc> {
        let python = find_in_path(path_var, OsStr::new("python3"))?;
        let output = Command::new(&python)
            .args(["-c", "import nvidia\nfor p in nvidia.__path__: print(p)"])
            .output()
            .ok()
            .filter(|o| o.status.success())?;
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        for dir in text.lines().filter(|l| !l.is_empty()) {
            for sub in WHEEL_NVCC {
                let candidate = Path::new(dir).join(sub).join(exe);
                if candidate.exists() {
                    if let Some(nvcc) = self.try_path(&candidate, "python3 (PyPI nvidia-cuda-nvcc)") {
                        return Some(nvcc);
                    }
                }
            }
        }
        None
    }

    /// nvcc from the venv `.ci/install-nvcc.sh` creates.
    fn ci_venv_nvcc(&mut self, exe: &str) -> Option<Nvcc> {
        let venv = match self.var("CLEAVE_NVCC_VENV") {
            Some(dir) => PathBuf::from(dir),
            None => Path::new(&self.var("HOME")?).join(CI_VENV),
        };
        let mut libs: Vec<PathBuf> = fs::read_dir(venv.join("lib"))
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.file_name().and_then(OsStr::to_str).is_some_and(|n| n.starts_with("python3")))
            .collect();
        libs.sort();
        for lib in libs {
            for sub in WHEEL_NVCC {
                let candidate = lib.join("site-packages/nvidia").join(sub).join(exe);
                if candidate.exists() {
                    if let Some(nvcc) = self.try_path(&candidate, &format!("venv {}", venv.display())) {
                        return Some(nvcc);
                    }
                }
            }
        }
        None
    }
}

/// The first executable file called `name` in the directories of a `PATH` value.
fn find_in_path(path_var: Option<&OsStr>, name: &OsStr) -> Option<PathBuf> {
    std::env::split_paths(path_var?).map(|dir| dir.join(name)).find(|p| is_executable(p))
}

#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn is_executable(path: &Path) -> bool {
    path.is_file()
}
