//! The `kernel!` and `include_kernels!` macros.
