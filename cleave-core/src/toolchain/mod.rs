//! The CUDA toolchain: finding nvcc, choosing target architectures, compiling fatbins,
//! checking the resource usage ptxas reports and reading the figures of disassembled code
//! ([`sass`]).
//!
//! Pure std: nothing here needs a GPU, a driver or `nvidia-smi`. A build script uses it as
//!
//! ```no_run
//! use cleave_core::toolchain::{compile_fatbin, discover, ArchSet};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let (sources, include_dirs, out) = (vec![], vec![], std::path::PathBuf::new());
//! let found = discover();
//! for var in &found.env_vars {
//!     println!("cargo::rerun-if-env-changed={var}");
//! }
//! println!("cargo::rerun-if-env-changed={}", cleave_core::toolchain::COMPUTE_CAP_VAR);
//! let arches = ArchSet::from_env(|v| std::env::var_os(v))?;
//! if let Some(nvcc) = &found.nvcc {
//!     let report = compile_fatbin(nvcc, &sources, &include_dirs, &arches, &out)?;
//!     report.check_budget(&[("attention_split", 98_304)])?;
//! }
//! # Ok(())
//! # }
//! ```

mod arch;
mod compile;
mod discover;
mod report;
pub mod sass;

pub use arch::{Arch, ArchError, ArchSet, PlanTarget, Variant, COMPUTE_CAP_VAR};

/// The target triple this crate was compiled for: what a C++ compiler must target to build
/// code loaded into this process (the host emulation, compiled at run time by the command
/// line and the tests).
pub const BUILD_TARGET: &str = env!("CLEAVE_CORE_TARGET");
pub use compile::{compile_each, compile_fatbin, ToolchainError};
pub use discover::{discover, discover_with, find_nvcc, nvcc_for_check, parse_version, Discovery, Nvcc};
pub use report::{
    parse_ptxas, BudgetError, BudgetViolation, CompileReport, KernelStats, MAX_REGISTERS, MAX_STATIC_SMEM,
};
