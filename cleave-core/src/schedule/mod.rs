//! The scheduling phase (paper §5, App. A): a kernel graph and a tile configuration become an
//! itGraph, the loop nest of one thread block with a tile map per node.
//!
//! ```text
//! kernel graph ─► configs (tile ladders, grouped reduction tiles, warps)
//! kernel graph + config ─► schedule: inter-block tiling, then iterative intra-block tiling
//!     with horizontal fusion ─► ItGraph
//! ```
//!
//! Which configuration wins is not decided here: the pipeline's driver plans and costs every
//! one.

pub mod build;
pub mod config;
pub mod error;
pub mod itgraph;
pub mod tmap;

pub use build::schedule;
pub use config::{configs, TileConfig};
pub use error::ScheduleError;
pub use itgraph::{ItGraph, ItNode, LoopAxis, LoopKind, Show};
