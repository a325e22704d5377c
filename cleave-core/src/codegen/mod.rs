//! Code generators: pure functions from a planned launch to source text.

pub mod cuda;
pub mod headers;
pub mod plan;
pub mod rust;
pub mod tilelang;
