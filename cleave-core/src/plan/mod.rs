//! Memory and layout planning: scheduled itGraphs become tile programs, the input of the
//! itGraph interpreter and of every code generator.

pub mod lower;
pub mod partition;
pub mod program;

pub use lower::{lower, KernelIo, Planned};
pub use partition::{partition, KernelGraph, Partition, Workspace};
pub use program::{
    Binding, Buf, BufId, BufKind, Expr, MmaA, MmaB, Param, ParamId, ShowKernel, Src, Stmt, TileKernel, Warps,
};
pub mod interp;
pub mod launch;
pub use launch::{build_launch, Launch};
