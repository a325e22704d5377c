//! Cleave: declare a fused subgraph, get searched and scheduled CUDA kernels with typed Rust
//! launchers, built ahead of time.
