//! Running nvcc.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

use super::arch::ArchSet;
use super::discover::Nvcc;
use super::report::{parse_ptxas, CompileReport};

/// Why a compilation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolchainError {
    /// Nothing to compile.
    #[error("no CUDA sources to compile")]
    NoSources,
    /// The architecture set is empty.
    #[error("no target architectures to compile for")]
    NoArches,
    /// The nvcc found is too old for a requested architecture.
    #[error("{arch} needs nvcc {}.{} or newer, but {} is {}.{}", needs.0, needs.1, nvcc.display(), have.0, have.1)]
    NvccTooOld {
        /// The architecture, e.g. `sm_100a`.
        arch: String,
        /// The oldest nvcc that supports it.
        needs: (u32, u32),
        /// The nvcc that was asked to compile.
        nvcc: PathBuf,
        /// Its version.
        have: (u32, u32),
    },
    /// A source file cannot be used.
    #[error("source {}: {reason}", file.display())]
    Source {
        /// The source file.
        file: PathBuf,
        /// Why.
        reason: String,
    },
    /// Reading or writing a file, or starting nvcc, failed.
    #[error("{context}: {error}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        error: io::Error,
    },
    /// nvcc ran and failed.
    #[error("nvcc failed ({status}) on {}:\n{diagnostics}\ncommand: {command}", file.display())]
    Nvcc {
        /// The source being compiled.
        file: PathBuf,
        /// The exit status.
        status: String,
        /// The command line, for reproducing the failure.
        command: String,
        /// nvcc's errors and warnings (resource-usage lines left out).
        diagnostics: String,
    },
    /// Several sources failed (per-source mode).
    #[error("{} sources failed to compile:\n{}", .0.len(), join_errors(.0))]
    Several(Vec<ToolchainError>),
}

fn join_errors(errors: &[ToolchainError]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n\n")
}

/// Compiles `sources` into one fatbin at `out`, with SASS (and PTX) for `arches`.
///
/// Several sources are compiled as one translation unit that includes each of them, because
/// a fatbin is one module per architecture and nvcc takes one source per fatbin. The report
/// holds ptxas's per-kernel resource usage.
pub fn compile_fatbin(
    nvcc: &Nvcc,
    sources: &[PathBuf],
    include_dirs: &[PathBuf],
    arches: &ArchSet,
    out: &Path,
) -> Result<CompileReport, ToolchainError> {
    check_inputs(nvcc, sources, arches)?;
    let umbrella;
    let source = match sources {
        [one] => one.as_path(),
        _ => {
            let mut name = out.as_os_str().to_owned();
            name.push(".all.cu");
            umbrella = PathBuf::from(name);
            write_umbrella(sources, &umbrella)?;
            umbrella.as_path()
        }
    };
    let mut report = run_nvcc(nvcc, source, include_dirs, arches, out)?;
    report.outputs.push(out.to_owned());
    Ok(report)
}

/// Compiles each source into its own fatbin `out_dir/<file stem>.fatbin`, running up to one
/// nvcc per CPU. This is the CI check mode: every kernel's resource usage is attributed to its
/// source, and all failures are reported together.
pub fn compile_each(
    nvcc: &Nvcc,
    sources: &[PathBuf],
    include_dirs: &[PathBuf],
    arches: &ArchSet,
    out_dir: &Path,
) -> Result<CompileReport, ToolchainError> {
    check_inputs(nvcc, sources, arches)?;
    let mut outputs = Vec::with_capacity(sources.len());
    for source in sources {
        let stem = source.file_stem().ok_or_else(|| ToolchainError::Source {
            file: source.clone(),
            reason: "the path has no file name".to_owned(),
        })?;
        let out = out_dir.join(stem).with_extension("fatbin");
        if outputs.contains(&out) {
            return Err(ToolchainError::Source {
                file: source.clone(),
                reason: format!("another source also compiles to {}", out.display()),
            });
        }
        outputs.push(out);
    }
    fs::create_dir_all(out_dir)
        .map_err(|error| ToolchainError::Io { context: format!("creating {}", out_dir.display()), error })?;

    let next = AtomicUsize::new(0);
    let workers = thread::available_parallelism().map_or(1, |n| n.get()).min(sources.len());
    let work = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let (Some(source), Some(out)) = (sources.get(i), outputs.get(i)) else { break };
            done.push((i, run_nvcc(nvcc, source, include_dirs, arches, out)));
        }
        done
    };
    let mut results: Vec<(usize, Result<CompileReport, ToolchainError>)> = thread::scope(|scope| {
        let handles: Vec<_> = (0..workers).map(|_| scope.spawn(work)).collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    });
    results.sort_by_key(|(i, _)| *i);
    if results.len() != sources.len() {
        return Err(ToolchainError::Io {
            context: "compiling sources in parallel".to_owned(),
            error: io::Error::other("a compile worker stopped unexpectedly"),
        });
    }

    let mut report = CompileReport::default();
    let mut failures = Vec::new();
    for (i, result) in results {
        match result {
            Ok(part) => {
                let source = sources.get(i).cloned();
                report.kernels.extend(part.kernels.into_iter().map(|mut k| {
                    k.source.clone_from(&source);
                    k
                }));
                report.warnings.extend(part.warnings);
                report.commands.extend(part.commands);
                report.outputs.extend(outputs.get(i).cloned());
            }
            Err(e) => failures.push(e),
        }
    }
    match failures.len() {
        0 => Ok(report),
        1 => Err(failures.remove(0)),
        _ => Err(ToolchainError::Several(failures)),
    }
}

fn check_inputs(nvcc: &Nvcc, sources: &[PathBuf], arches: &ArchSet) -> Result<(), ToolchainError> {
    if sources.is_empty() {
        return Err(ToolchainError::NoSources);
    }
    if arches.is_empty() {
        return Err(ToolchainError::NoArches);
    }
    for arch in arches.sass() {
        if let Some(needs) = arch.min_nvcc().filter(|&needs| nvcc.version < needs) {
            return Err(ToolchainError::NvccTooOld {
                arch: arch.sm(),
                needs,
                nvcc: nvcc.path.clone(),
                have: nvcc.version,
            });
        }
    }
    Ok(())
}

/// Writes a translation unit that `#include`s every source by absolute path.
fn write_umbrella(sources: &[PathBuf], umbrella: &Path) -> Result<(), ToolchainError> {
    let mut text = String::from("// Generated by cleave: every kernel source in one translation unit.\n");
    for source in sources {
        let absolute = fs::canonicalize(source)
            .map_err(|e| ToolchainError::Source { file: source.clone(), reason: e.to_string() })?;
        let shown =
            absolute.to_str().filter(|s| !s.contains(['"', '\n', '\r'])).ok_or_else(|| ToolchainError::Source {
                file: source.clone(),
                reason: "the path cannot be written in an #include line (not UTF-8, or contains a quote or newline)"
                    .to_owned(),
            })?;
        text.push_str(&format!("#include \"{shown}\"\n"));
    }
    fs::write(umbrella, text)
        .map_err(|error| ToolchainError::Io { context: format!("writing {}", umbrella.display()), error })
}

/// The arguments for compiling one source into a fatbin.
///
/// The PyPI toolchain (`nvidia-cuda-nvcc` 13.x) needs no extra flags: its `nvcc.profile` adds
/// the include directories, `cicc` and libdevice relative to nvcc's own path, which
/// [`Nvcc::path`] keeps pointing into the wheel even when nvcc was found through a symlink.
fn nvcc_args(nvcc: &Nvcc, source: &Path, include_dirs: &[PathBuf], arches: &ArchSet, out: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = ["-fatbin", "-O3", "-std=c++17", "-Xptxas", "-v"].map(OsString::from).into();
    if let Some(ccbin) = &nvcc.ccbin {
        args.push("-ccbin".into());
        args.push(ccbin.into());
    }
    for dir in include_dirs {
        let mut flag = OsString::from("-I");
        flag.push(dir);
        args.push(flag);
    }
    args.extend(arches.gencode_flags().into_iter().map(OsString::from));
    args.push("-o".into());
    args.push(out.into());
    args.push(source.into());
    args
}

fn run_nvcc(
    nvcc: &Nvcc,
    source: &Path,
    include_dirs: &[PathBuf],
    arches: &ArchSet,
    out: &Path,
) -> Result<CompileReport, ToolchainError> {
    let args = nvcc_args(nvcc, source, include_dirs, arches, out);
    let command = std::iter::once(nvcc.path.as_os_str())
        .chain(args.iter().map(OsString::as_os_str))
        .map(|a| shell_quote(&a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ");
    let output = Command::new(&nvcc.path)
        .args(&args)
        .output()
        .map_err(|error| ToolchainError::Io { context: format!("starting {}", nvcc.path.display()), error })?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        let diagnostics = stdout
            .lines()
            .chain(stderr.lines())
            .filter(|l| !l.trim_start().starts_with("ptxas info") && !l.contains("bytes stack frame"))
            .collect::<Vec<_>>()
            .join("\n");
        return Err(ToolchainError::Nvcc {
            file: source.to_owned(),
            status: output.status.to_string(),
            command,
            diagnostics,
        });
    }
    let mut report = parse_ptxas(&format!("{stdout}\n{stderr}"));
    report.commands.push(command);
    Ok(report)
}

/// Quotes an argument for a POSIX shell when it needs it (the command is shown to the user, to
/// rerun by hand). An argument with a NUL byte cannot be quoted; it is shown as Rust writes it.
fn shell_quote(arg: &str) -> String {
    shlex::try_quote(arg).map_or_else(|_| format!("{arg:?}"), |q| q.into_owned())
}

#[cfg(test)]
mod tests {
    use super::shell_quote;

    /// Plain arguments are shown as they are; anything a shell would split or expand is quoted
    /// so that the shown command reruns as it ran.
    #[test]
    fn shown_commands_quote_what_a_shell_would_change() {
        assert_eq!(shell_quote("-Xptxas"), "-Xptxas");
        assert_eq!(shell_quote("/tmp/a_b-1.cu"), "/tmp/a_b-1.cu");
        assert_eq!(shell_quote("my dir/k.cu"), "'my dir/k.cu'");
        assert_eq!(shell_quote("it's"), r#""it's""#);
        assert_eq!(shell_quote("$HOME"), "'$HOME'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a\0b"), r#""a\0b""#);
    }
}
