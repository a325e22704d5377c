//! Cleave: declare a fused subgraph, get searched and scheduled CUDA kernels with typed Rust
//! launchers, built ahead of time.
//!
//! A crate declares kernels in `kernels.yaml` or inline, builds them in `build.rs` with
//! [`build::Builder`], and includes the generated launcher modules with the macros:
//!
//! ```ignore
//! // build.rs
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     cleave::build::Builder::new().kernels("kernels.yaml").compile()?;
//!     Ok(())
//! }
//!
//! // src/lib.rs
//! cleave::include_kernels!();      // pub mod kernels { pub mod attention { .. } .. }
//! cleave::kernel!(attention);      // pub mod attention { .. }
//! cleave::kernel! {                // pub mod swiglu { .. }
//!     name: swiglu,
//!     dims: { t: dyn 256, k: 4096, f: 14336 },
//!     inputs: { x: f16[t, k], w1: f16[k, f], w2: f16[k, f] },
//!     outputs: { y: f16[t, f] },
//!     body: { y = silu(matmul(x, w1)) * matmul(x, w2) }
//! }
//! ```
//!
//! Every kernel module has `Dims` (one `usize` per dynamic axis), `launch(stream, inputs..,
//! outputs.., dims)` over cudarc views and `run_host(inputs.., outputs.., dims)` over host
//! slices; both return `Result<(), cleave::Error>` and check every length first.
//!
//! At run time the binary needs only the NVIDIA driver (`libcuda`, loaded dynamically) for
//! `launch`, and nothing for `run_host`: no nvcc, NVRTC or CUDA runtime library.

pub use cleave_macros::{include_kernels, kernel};
pub use cleave_runtime as runtime;
pub use cleave_runtime::{bf16, f16, Error};

#[cfg(feature = "build")]
pub mod build;

#[cfg(feature = "candle")]
pub mod candle;

/// Without the `candle` feature, generated modules have no `candle_forward`.
#[cfg(not(feature = "candle"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __candle_forward {
    ($($tokens:tt)*) => {};
}

#[cfg(feature = "emulate")]
#[doc(hidden)]
pub mod emulate;
