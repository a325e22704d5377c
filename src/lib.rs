//! Cleave: declare a fused subgraph, get searched and scheduled CUDA kernels with typed Rust
//! launchers, built ahead of time.

pub use cleave_runtime as runtime;
pub use cleave_runtime::{bf16, f16, Error};

#[doc(hidden)]
pub mod emulate;
