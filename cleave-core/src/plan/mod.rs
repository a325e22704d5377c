//! The planning phase: a scheduled kernel (an itGraph) becomes a tile program, with its
//! memory, layouts, stabilization and resources decided; the tile programs of a partition
//! become a [`Launch`].
//!
//! ```text
//! graph (or its rewrites: columns::transpose_columns, rows::split_rows)
//!   ─► partition (split kernel + combine kernel, workspaces), or rows::row_first
//! kernel graph + itGraph + io ─► lower ─► Planned { TileKernel, .. } ─► cost
//! Planned per kernel ─► assemble ─► Launch
//! ```
//!
//! The tile program ([`program`]) is the IR every backend reads: the interpreter ([`interp`])
//! and the code generators.

pub mod columns;
pub mod cost;
pub mod error;
pub mod interp;
pub mod launch;
pub mod lower;
pub mod partition;
pub mod rows;
pub mod program;
pub mod requests;
pub mod stage;

pub use cost::{cost_of, cost_on, kernel_cost, kernel_cost_on, stage_cost, Bound, Cost, Issue, LAUNCH_SECONDS};
pub use error::PlanError;
pub use launch::{append_fallback, assemble, fallback, kernel_io, Kernel, Launch};
pub use lower::{lower, KernelIo, Planned};
pub use partition::{is_combine, partition, KernelGraph, Part, Partition, PartitionError, Workspace, WorkspaceType};
pub use program::{
    is_view, stride_params, Binding, Buf, BufId, BufKind, Expr, MergeOp, MergePart, MmaA, MmaB, MmaKind, Param,
    ParamId, ShowKernel, Src, Stmt, StrideParam, TileKernel, Warps,
};
pub use rows::row_first;
pub use stage::{Ix, SExpr, StageKernel};
