//! Why a tile configuration cannot be scheduled: a closed set, so that the driver can count
//! rejections by kind and a message never has to be parsed.

use crate::graph::NodeId;

/// Why a tile configuration has no itGraph.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum ScheduleError {
    /// Two consumers need different tiles of one node.
    #[error("two consumers need different tiles of node %{}", .0.0)]
    Conflict(NodeId),
    /// A node used inside a loop is also needed outside it.
    #[error("node %{} is needed inside a loop and outside it", .0.0)]
    SharedUpstream(NodeId),
    /// Two reductions share producers but reduce different axes or with different tiles.
    #[error("fused reductions %{} and %{} reduce different axes or tiles", .0.0, .1.0)]
    GroupMismatch(NodeId, NodeId),
    /// A reduction over a dynamic axis with no tile: it must run as a loop.
    #[error("the dynamic axis {dim} must be tiled")]
    UntiledDynamicAxis {
        /// The axis' name.
        dim: String,
    },
    /// A tile of a split's result that covers more than one part.
    #[error("a tile spanning several split parts")]
    TileSpansSplitParts,
    /// A split of an axis of extent 1.
    #[error("a split of a unit axis")]
    SplitOfUnitAxis,
    /// A split part whose offset is not a plain iterator (it cannot be scaled by the chunk).
    #[error("a split part offset that is not a pure iterator")]
    SplitOffsetNotIterator,
    /// A node nothing at its loop level consumes.
    #[error("node %{} has no consumer at its level", .0.0)]
    NoConsumerAtLevel(NodeId),
    /// A reduction whose reduced axis has no range at its level.
    #[error("no range for the reduced axis of node %{}", .0.0)]
    NoReducedRange(NodeId),
}

impl ScheduleError {
    /// The kind of rejection, without node numbers or names, for counting: the message itself
    /// for variants that carry none.
    pub fn kind(&self) -> String {
        match self {
            ScheduleError::Conflict(_) => "conflicting tile maps".into(),
            ScheduleError::SharedUpstream(_) => "a producer needed inside and outside a loop".into(),
            ScheduleError::GroupMismatch(..) => "fused reductions with different axes or tiles".into(),
            ScheduleError::UntiledDynamicAxis { .. } => "an untiled dynamic reduction".into(),
            ScheduleError::NoConsumerAtLevel(_) => "a node with no consumer at its level".into(),
            ScheduleError::NoReducedRange(_) => "a reduction with no range for its axis".into(),
            other => other.to_string(),
        }
    }
}
