//! Why a scheduled kernel cannot be planned: a closed set, so the driver counts rejections by
//! kind and nothing parses a message.

use crate::graph::NodeId;

/// Why an itGraph has no tile program.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum PlanError {
    /// An output with no tile at the grid level.
    #[error("the output %{} has no tile at the grid level", .0.0)]
    OutputWithoutTile(NodeId),
    /// An output the lowering never produced a value for.
    #[error("the output %{} was never computed", .0.0)]
    OutputNotComputed(NodeId),
    /// A value read before the lowering produced it.
    #[error("node %{} is used before it is computed", .0.0)]
    UsedBeforeComputed(NodeId),
    /// A reduction inside a loop without its accumulator.
    #[error("the accumulator of node %{} is missing", .0.0)]
    MissingAccumulator(NodeId),
    /// A combine's result with a leading axis that is not a unit.
    #[error("an output with a leading axis that is not a unit")]
    OutputLeadingAxis,
    /// More registers per thread than the planner allows itself.
    #[error("needs about {registers} registers per thread (the budget is {budget})")]
    OverRegisterBudget {
        /// The estimate.
        registers: u64,
        /// The budget.
        budget: u64,
    },
    /// A configuration whose warps would idle: the rows need fewer, and the loop's tile is
    /// too narrow for the rest to split it (a wider tile of the same loop would).
    #[error("{threads} threads of the configuration's warps would work: the loop's tile of {tile} is narrower than the {needed} its warps split")]
    IdleWarps {
        /// The threads the rows use.
        threads: u32,
        /// The loop's tile.
        tile: u64,
        /// The tile the configuration's warps need.
        needed: u64,
    },
    /// More shared memory than a block may use.
    #[error("needs {bytes} bytes of shared memory per block (the limit is {limit})")]
    OverSharedMemory {
        /// The peak of the allocator.
        bytes: u64,
        /// The architecture's limit.
        limit: u64,
    },
    /// Per-request dims (ragged or paged) the schedule cannot serve.
    #[error("per-request dims: {0}")]
    PerRequest(&'static str),
    /// A transposed tile used by an elementwise op.
    #[error("an elementwise use of a transposed tile")]
    TransposedElementwise,
    /// A staged tile that broadcasts over some of the block's row axes but not all.
    #[error("a tile that broadcasts over only some row axes")]
    PartialRowBroadcast,
    /// A transpose of a value computed in registers.
    #[error("a transpose of a computed value")]
    TransposeOfComputed,
    /// An output stored transposed whose tile spans more than one index of an axis before its
    /// last two: the block's rows would be several of its columns, one per index.
    #[error("a transposed store over several indices of a leading axis")]
    TransposedStoreLeadingAxis,
    /// A split of a value computed in registers.
    #[error("a split of a computed value")]
    SplitOfComputed,
    /// A left matmul operand whose rows are not the block's rows.
    #[error("a left matmul operand whose rows are not the block's rows")]
    LeftOperandRows,
    /// A transposed left operand needs whole 16-row tiles.
    #[error("a transposed left matmul operand over {rows} rows (not a multiple of 16)")]
    TransposedLeftOperandRows {
        /// Rows of the block.
        rows: u64,
    },
    /// A product of an operand that is not a float (no op reads an index tensor, so only a
    /// malformed program gets here).
    #[error("a matmul of {a} and {b} operands (the tensor cores take f16, bf16 and f32 values)")]
    MatmulDtypes {
        /// The left operand's type (`registers` for a computed one).
        a: &'static str,
        /// The right operand's type.
        b: &'static str,
    },
    /// An exp that no reduction of its loop level stabilizes: its f32 value could overflow
    /// where the true result does not.
    #[error("node %{} is an exp that no row reduction stabilizes", .0.0)]
    UnstabilizedExp(NodeId),
    /// A quotient whose divisor is an exp shifted by a running max element by element,
    /// `exp(x - m)`: far below the max that underflows to zero where the true quotient need
    /// not be small (`exp(x) / exp(x)` is one). A sum of such exps over the row that holds the
    /// max is at least one, so a reduction's quotient is safe.
    #[error("node %{} divides by an exp shifted by a running max, which underflows far below it", .0.0)]
    ShiftedExpDivisor(NodeId),
    /// Fallback stages asked to bind a tile kernel's workspace, whose plain floats they would
    /// read as extended-exponent values.
    #[error("fallback stages bound to a tile kernel's workspace")]
    StagesOnTileWorkspaces,
    /// A matmul with a constant operand.
    #[error("a matmul with a constant operand")]
    ConstantMatmulOperand,
    /// A right matmul operand with several matrices per block.
    #[error("a right matmul operand holding several matrices per block")]
    RightOperandBatched,
    /// A transposed left matmul operand with several matrices per block: the tile stores
    /// each matrix's depth down its rows, which the fragment loads read as one matrix.
    #[error("a transposed left matmul operand holding several matrices per block")]
    TransposedLeftOperandBatched,
    /// A right matmul operand computed in registers.
    #[error("a computed right matmul operand")]
    ComputedRightOperand,
    /// A contraction tile the tensor cores cannot take.
    #[error("a contraction tile of {k}, not a multiple of 16")]
    ContractionTile {
        /// The tile.
        k: u64,
    },
    /// A product tile with a column count the tensor cores cannot take.
    #[error("a matmul tile of {cols} columns, not a multiple of 8")]
    MatmulColumns {
        /// The columns.
        cols: u64,
    },
    /// A reduction over a non-last axis whose tile is more than one slice.
    #[error("a reduction over a non-last axis that is not iterated one slice at a time")]
    NonLastReductionTile,
    /// A reduction of an exp that no running max can stabilize: the exp reaches it through an
    /// op that is not linear in it, as a product's right operand, or along an axis other than
    /// the last that its loop does not walk one slice at a time (where a max per element
    /// would), or beside a reduction that needs the other kind of max.
    #[error("node %{} reduces an exp in a way no running max, per row or per element, can stabilize", .0.0)]
    ExpReduction(NodeId),
    /// An exp feeding both loop accumulators and one-shot reductions.
    #[error("an exp feeding both loop accumulators and one-shot reductions")]
    MixedExpReductions,
    /// An exp of a value that is itself scaled by a running max.
    #[error("an exp of a scaled value")]
    ExpOfScaled,
    /// Undoing a running max inside the kernel: `x · exp(m)` can overflow f32 long before the
    /// true result would, so a graph that needs it (two partial sums on different scales, a
    /// non-linear op of an accumulator) is left to a form that does not.
    #[error("a value would have to leave its running-max scale inside the kernel")]
    LeavesRunningMaxScale,
    /// A product or a row reduction of a value scaled by a running max per element, whose
    /// elements are on different scales.
    #[error("node %{} combines elements that a running max per element keeps on different scales", .0.0)]
    ElementScalesCombined(NodeId),
    /// A running max per element whose split partials differ in shape or are stored
    /// transposed: the max is stored at its partials' layout, and they have no one layout.
    #[error("a running max per element stored beside partials of different layouts")]
    ElementMaxLayout,
    /// Split partials stored against different running maxima.
    #[error("partials scaled by different running maxima")]
    PartialsOnDifferentMaxima,
    /// A scaled partial input that no reduction merges.
    #[error("a scaled partial that is not reduced")]
    UnreducedScaledPartial,
    /// An exp shifted by the max of partials this kernel merges, computed before the merge
    /// ends.
    #[error("node %{} is an exp computed before the partials whose max shifts it are merged", .0.0)]
    ShiftBeforeMerge(NodeId),
    /// A graph with a split given to the fallback (only the declared graph goes there, and
    /// declarations have none).
    #[error("the fallback kernels take graphs without splits")]
    StageOfSplit,
    /// A scaled partial output no later kernel reads.
    #[error("a scaled partial nobody merges")]
    UnmergedScaledPartial,
}

impl PlanError {
    /// The kind of rejection, without node numbers or sizes, for counting: the message itself
    /// for variants that carry none.
    pub fn kind(&self) -> String {
        match self {
            PlanError::OverRegisterBudget { .. } => "over the register budget".into(),
            PlanError::OverSharedMemory { .. } => "over the shared-memory limit".into(),
            PlanError::IdleWarps { .. } => "warps left idle by a loop tile too narrow to split".into(),
            PlanError::OutputWithoutTile(_) => "an output with no tile at the grid level".into(),
            PlanError::OutputNotComputed(_) => "an output that was never computed".into(),
            PlanError::UsedBeforeComputed(_) => "a value used before it is computed".into(),
            PlanError::MissingAccumulator(_) => "a missing accumulator".into(),
            PlanError::ExpReduction(_) => "a reduction of an exp that no running max can stabilize".into(),
            PlanError::UnstabilizedExp(_) => "an exp that no row reduction stabilizes".into(),
            PlanError::ShiftedExpDivisor(_) => "a divisor that is an exp shifted by a running max".into(),
            PlanError::StagesOnTileWorkspaces => "fallback stages bound to a tile kernel's workspace".into(),
            PlanError::ElementScalesCombined(_) => {
                "elements combined across the scales of a running max per element".into()
            }
            PlanError::ShiftBeforeMerge(_) => "an exp computed before the merge of the max that shifts it".into(),
            PlanError::MatmulDtypes { .. } => "a matmul whose operand types the tensor cores cannot take".into(),
            PlanError::ContractionTile { .. } => "a contraction tile that is not a multiple of 16".into(),
            PlanError::MatmulColumns { .. } => "a matmul tile whose columns are not a multiple of 8".into(),
            other => other.to_string(),
        }
    }
}
