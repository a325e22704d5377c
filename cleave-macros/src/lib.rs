//! The `kernel!` and `include_kernels!` macros of Cleave.
//!
//! The macros generate nothing themselves: the build script (`cleave::build::Builder`) runs the
//! pipeline and writes each kernel's launcher module under `OUT_DIR/cleave/`, and the macros
//! include those files. What the macros do is check: an inline declaration goes through the same
//! front end as `kernels.yaml` (so every error points at the offending token), and a missing or
//! stale generated file becomes a `compile_error!` that says what to add to `build.rs`. On any
//! error they also emit a stub module with the declared signatures, so that the rest of the
//! crate (and an IDE) still type-checks.
//!
//! `parse` turns tokens into a checked request; `generate` turns a request into tokens.

mod generate;
mod parse;

use proc_macro::TokenStream;

/// Defines the launcher module of one kernel.
///
/// - `cleave::kernel!(attention)` defines `pub mod attention` for kernel `attention` of the YAML
///   files given to the build script's `Builder::kernels`.
/// - An inline declaration defines `pub mod <name>` here:
///
/// ```ignore
/// cleave::kernel! {
///     name: swiglu,
///     dims: { t: dyn 256, k: 4096, f: 14336 },   // `dyn N`: runtime axis, N = representative value
///     inputs: { x: f16[t, k], w1: f16[k, f], w2: f16[k, f] },
///     outputs: { y: f16[t, f] },
///     body: { y = silu(matmul(x, w1)) * matmul(x, w2) }
/// }
/// ```
///
/// The build script finds inline declarations by scanning `src/**/*.rs` and generates their
/// modules; the macro checks the declaration and includes the generated module.
#[proc_macro]
pub fn kernel(input: TokenStream) -> TokenStream {
    generate::kernel(parse::kernel(input.into()), &generate::BuildOutput::from_env()).into()
}

/// Defines `pub mod kernels` with one launcher module per kernel of the YAML files given to the
/// build script's `Builder::kernels`.
#[proc_macro]
pub fn include_kernels(input: TokenStream) -> TokenStream {
    generate::include_kernels(parse::include_kernels(input.into()), &generate::BuildOutput::from_env()).into()
}
