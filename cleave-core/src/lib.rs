//! # cleave-core
//!
//! The ahead-of-time pipeline of Cleave: a kernel declaration goes in, generated sources come
//! out.
//!
//! ```text
//! front (yaml | tokens) ─► graph ─► symbolic ─► superopt ─► schedule ─► plan ─► codegen
//!                                               └──────── pipeline (Alg. 1) ────────┘
//! ```
//!
//! ## Semantics of the IR
//!
//! A [`graph::Graph`] is a DAG of tensor ops in topological order. Every tensor has a shape of
//! [`graph::Dim`]s: the unit `1` or a variable of the graph's dim table. Elementwise ops
//! broadcast NumPy-style (shapes align at the right; `1` expands). `matmul` contracts the last
//! axis of its left operand with the second-to-last of its right operand and broadcasts the
//! leading axes. Reductions keep the reduced axis with extent 1. `transpose` swaps the last two
//! axes and moves no data. `split(x, a)` cuts axis `a` of variable `K` into `s_K` parts and
//! stacks them on a new leading axis: element `[j, .., i, ..]` of the result is element
//! `[.., j * K/s_K + i, ..]` of `x`.
//!
//! Values are real numbers: the f64 reference interpreter ([`reference`]) is the executable
//! specification, and every later stage must agree with it. Inputs and outputs have a storage
//! dtype; everything in between is computed with f32 accumulation.

// In pipeline order: each module uses only the ones declared before it (tests/tidy.rs checks
// it). The first six are the vocabulary every stage shares; the stages follow; `pipeline`,
// which sequences them, comes last.
pub mod hash;
pub mod graph;
pub mod index;
pub mod arch;
pub mod xfloat;
pub mod eval;
pub mod reference;
pub mod front;
pub mod symbolic;
pub mod superopt;
pub mod schedule;
pub mod plan;
pub mod codegen;
pub mod toolchain;
pub mod pipeline;
pub mod picture;
