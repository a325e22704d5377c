//! Resource usage reported by `ptxas -v`, and the budget every generated kernel must meet.

use std::fmt;
use std::path::PathBuf;

use super::arch::Arch;

/// What ptxas reports for one function on one architecture.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelStats {
    /// The symbol as ptxas prints it (generated kernels are `extern "C"`, so unmangled).
    pub name: String,
    /// The target, e.g. `sm_90a`; empty if ptxas never said.
    pub arch: String,
    /// Whether it is a kernel entry point; `false` for a device function ptxas kept out of
    /// line, which has no register or shared-memory line of its own.
    pub entry: bool,
    /// Registers per thread.
    pub registers: u32,
    /// Named barriers used.
    pub barriers: u32,
    /// Bytes spilled to local memory per thread.
    pub spill_stores: u32,
    /// Bytes reloaded from spills per thread.
    pub spill_loads: u32,
    /// Static shared memory per block, in bytes (dynamic shared memory is not known to ptxas).
    pub smem_bytes: u32,
    /// Stack frame per thread, in bytes (local arrays and spills).
    pub stack_bytes: u32,
    /// The source it came from, when sources were compiled one by one.
    pub source: Option<PathBuf>,
}

/// The outcome of a compilation: per-kernel resource usage, warnings, and what was run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompileReport {
    /// One entry per function and architecture, in ptxas's order.
    pub kernels: Vec<KernelStats>,
    /// Warnings from nvcc, cicc and ptxas, verbatim.
    pub warnings: Vec<String>,
    /// The command lines that were run.
    pub commands: Vec<String>,
    /// The files written.
    pub outputs: Vec<PathBuf>,
}

/// The register file holds at most 255 registers per thread.
pub const MAX_REGISTERS: u32 = 255;

/// Static shared memory above this is rejected at load time on every architecture; larger
/// buffers must be dynamic shared memory with an opt-in limit.
pub const MAX_STATIC_SMEM: u32 = 48 * 1024;

/// Parses nvcc's output (stderr) of a compilation with `-Xptxas -v`.
pub fn parse_ptxas(output: &str) -> CompileReport {
    let mut parser = Parser::default();
    for line in output.lines() {
        parser.line(line);
    }
    CompileReport { kernels: parser.kernels, warnings: parser.warnings, ..CompileReport::default() }
}

#[derive(Default)]
struct Parser {
    kernels: Vec<KernelStats>,
    warnings: Vec<String>,
    /// The architecture of the ptxas run being read, once an entry line has named it.
    arch: Option<String>,
    /// Device functions seen in this run before any entry named the architecture.
    pending: Vec<usize>,
    /// The latest entry function, which a `Used …` line describes.
    entry: Option<usize>,
    /// The function the next `… bytes stack frame …` line describes.
    properties: Option<usize>,
}

impl Parser {
    fn line(&mut self, raw: &str) {
        let line = raw.trim();
        if let Some((kind, message)) = ptxas_message(line) {
            match kind {
                "info" => self.info(message),
                _ => self.warnings.push(line.to_owned()),
            }
        } else if line.contains("bytes stack frame") {
            if let Some(stats) = self.properties.take().and_then(|i| self.kernels.get_mut(i)) {
                for (value, what) in numbered(line) {
                    match what {
                        "bytes stack frame" => stats.stack_bytes = value,
                        "bytes spill stores" => stats.spill_stores = value,
                        "bytes spill loads" => stats.spill_loads = value,
                        _ => {}
                    }
                }
            }
        } else if line.contains("warning") {
            self.warnings.push(line.to_owned());
        }
    }

    fn info(&mut self, message: &str) {
        if message.ends_with("bytes gmem") {
            // Each ptxas run (one per architecture) starts with its global-memory line.
            self.arch = None;
            self.entry = None;
        } else if let Some(rest) = message.strip_prefix("Compiling entry function '") {
            let Some((name, rest)) = rest.split_once('\'') else { return };
            let arch = rest.strip_prefix(" for '").and_then(|r| r.strip_suffix('\'')).unwrap_or_default();
            for i in self.pending.drain(..) {
                if let Some(stats) = self.kernels.get_mut(i) {
                    stats.arch = arch.to_owned();
                }
            }
            self.arch = Some(arch.to_owned());
            self.entry = Some(self.kernels.len());
            self.kernels.push(KernelStats {
                name: name.to_owned(),
                arch: arch.to_owned(),
                entry: true,
                ..KernelStats::default()
            });
        } else if let Some(name) = message.strip_prefix("Function properties for ") {
            let current = self.entry.filter(|&i| self.kernels.get(i).is_some_and(|k| k.name == name));
            self.properties = Some(match current {
                Some(i) => i,
                None => {
                    if self.arch.is_none() {
                        self.pending.push(self.kernels.len());
                    }
                    let arch = self.arch.clone().unwrap_or_default();
                    self.kernels.push(KernelStats { name: name.to_owned(), arch, ..KernelStats::default() });
                    self.kernels.len() - 1
                }
            });
        } else if message.starts_with("Used ") {
            if let Some(stats) = self.entry.and_then(|i| self.kernels.get_mut(i)) {
                for (value, what) in numbered(message) {
                    match what {
                        "registers" => stats.registers = value,
                        "barriers" => stats.barriers = value,
                        "bytes smem" => stats.smem_bytes = value,
                        _ => {}
                    }
                }
            }
        }
    }
}

/// Splits `ptxas info    : message` into ("info", "message").
fn ptxas_message(line: &str) -> Option<(&str, &str)> {
    let (head, message) = line.strip_prefix("ptxas")?.split_once(':')?;
    Some((head.trim(), message.trim()))
}

/// The `<number> <words>` items of a comma-separated list such as
/// `Used 40 registers, used 1 barriers, 128 bytes smem`; a leading `Used`/`used` is skipped.
fn numbered(list: &str) -> impl Iterator<Item = (u32, &str)> {
    list.split(',').filter_map(|item| {
        let item = item.trim();
        let item = item.strip_prefix("Used ").or_else(|| item.strip_prefix("used ")).unwrap_or(item);
        let (number, what) = item.split_once(' ')?;
        Some((number.parse().ok()?, what.trim()))
    })
}

/// One way a kernel exceeds the budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetViolation {
    /// The function.
    pub kernel: String,
    /// The architecture, or empty when the problem is not tied to one.
    pub arch: String,
    /// What is wrong.
    pub problem: String,
}

impl fmt::Display for BudgetViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.arch.is_empty() {
            write!(f, "`{}`: {}", self.kernel, self.problem)
        } else {
            write!(f, "`{}` ({}): {}", self.kernel, self.arch, self.problem)
        }
    }
}

/// Every budget violation of a compilation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} kernel resource-budget violation(s):\n  {}", violations.len(), list(violations))]
pub struct BudgetError {
    /// The violations, in report order.
    pub violations: Vec<BudgetViolation>,
}

fn list(violations: &[BudgetViolation]) -> String {
    violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  ")
}

impl CompileReport {
    /// The entries for `kernel`, one per architecture.
    pub fn kernel<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a KernelStats> + 'a {
        self.kernels.iter().filter(move |k| k.name == name)
    }

    /// Checks every function against the budget: no spills, at most [`MAX_REGISTERS`]
    /// registers, static shared memory within [`MAX_STATIC_SMEM`], and static plus dynamic
    /// shared memory within the architecture's per-block limit. `dynamic_smem` gives the
    /// dynamic shared memory each kernel is launched with (kernels not listed use none).
    pub fn check_budget(&self, dynamic_smem: &[(&str, u32)]) -> Result<(), BudgetError> {
        let mut violations = Vec::new();
        let mut flag = |k: &KernelStats, problem: String| {
            violations.push(BudgetViolation { kernel: k.name.clone(), arch: k.arch.clone(), problem });
        };
        for k in &self.kernels {
            if k.spill_stores > 0 || k.spill_loads > 0 {
                flag(k, format!("spills registers ({} bytes stored, {} bytes loaded)", k.spill_stores, k.spill_loads));
            }
            if !k.entry {
                continue;
            }
            if k.registers > MAX_REGISTERS {
                flag(k, format!("uses {} registers per thread (at most {MAX_REGISTERS})", k.registers));
            }
            if k.smem_bytes > MAX_STATIC_SMEM {
                flag(
                    k,
                    format!(
                        "uses {} bytes of static shared memory (at most {MAX_STATIC_SMEM}; use dynamic)",
                        k.smem_bytes
                    ),
                );
            }
            let dynamic = dynamic_smem.iter().find(|(name, _)| *name == k.name).map_or(0, |&(_, bytes)| bytes);
            let total = u64::from(k.smem_bytes) + u64::from(dynamic);
            let limit = Arch::parse(&k.arch).ok().and_then(Arch::smem_per_block);
            match limit {
                Some(limit) if total > u64::from(limit) => {
                    let parts = format!("{} static + {dynamic} dynamic", k.smem_bytes);
                    flag(
                        k,
                        format!("needs {total} bytes of shared memory per block ({parts}), above the limit of {limit}"),
                    );
                }
                Some(_) => {}
                None => flag(k, "no shared-memory limit is known for this architecture".to_owned()),
            }
        }
        for (name, _) in dynamic_smem {
            if !self.kernels.iter().any(|k| k.entry && k.name == *name) {
                violations.push(BudgetViolation {
                    kernel: (*name).to_owned(),
                    arch: String::new(),
                    problem: "dynamic shared memory was declared for a kernel the compilation did not produce"
                        .to_owned(),
                });
            }
        }
        if violations.is_empty() {
            Ok(())
        } else {
            Err(BudgetError { violations })
        }
    }
}
