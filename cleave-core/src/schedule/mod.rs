//! The scheduling phase (paper §5, App. A): tile configurations × inter/intra-block scheduling
//! → itGraphs, ranked by an analytic cost model.

pub mod arch;
pub mod build;
pub mod config;
pub mod cost;
pub mod itgraph;
pub mod tmap;

pub use arch::{Arch, SM80, SM90};
pub use build::schedule;
pub use config::{enumerate, TileConfig};
pub use cost::{kernel_cost, Cost};
pub use itgraph::{ItGraph, ItNode, LoopKind, Show};
pub use tmap::Reject;
pub mod driver;
pub use driver::{candidates, Candidate, ScheduleStats};
