//! Runtime for Cleave-generated launchers.
//!
//! Code generation emits, per declared kernel, a static [`LaunchPlan`] (which kernels to
//! launch, with which grids, workspaces and parameters), the embedded [`cuda::Fatbin`], and two
//! typed launchers:
//!
//! - `launch(stream, inputs…, outputs…, dims)` runs the plan on a GPU through [`cuda::Args`];
//! - `run_host(inputs…, outputs…, dims)` runs the same plan on the CPU through [`host::Args`],
//!   calling the generated CUDA source compiled for the host-emulation header.
//!
//! Each also has a `_strided` form taking a view of every tensor (an element stride per axis,
//! see [`layout`]), so that a tensor inside a larger buffer is used in place.
//!
//! Both executors read the same plan, so the host emulation tests exactly the grid, workspace
//! and argument logic the GPU runs. Both validate every extent and buffer length before
//! launching anything and report problems as [`Error`]s, never panics.
//!
//! This crate chooses none of cudarc's CUDA-version or linking features: the application does
//! (or enables `cuda-version-fallback`). At run time it needs only `libcuda`, and without it
//! every GPU entry point returns [`Error::NoDriver`].

mod element;
mod error;
pub mod layout;
pub mod plan;

pub mod cuda;
pub mod host;

pub use element::Element;
pub use error::Error;
pub use layout::{Layouts, MAX_RANK};
pub use plan::{
    check_extent, check_len, check_tables, extents, split_count, Axis, DType, Derive, DimSpec, Factor, KernelLaunch,
    LaunchPlan, Param, Product, SplitShape, Table, TensorSpec, Variant, WorkspaceSpec,
};

pub use cudarc;
pub use half::{bf16, f16};
