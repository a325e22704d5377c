//! Code generators: pure functions from a planned launch to source text.

pub mod cuda;
pub mod plan;
pub mod headers;
