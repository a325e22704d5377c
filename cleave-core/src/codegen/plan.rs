//! The launch sequence as plain data (`PlanData`): what the runtime's `LaunchPlan` holds,
//! derived from a planned [`Launch`]. Generated Rust writes it as a `static`; the command line
//! builds the runtime plan from it directly. Keeping one derivation means the host emulation
//! and the GPU launch read the same grids, workspaces and parameter order.

use std::fmt::Write;

use crate::graph::{DType, Dim, DimKind, DimVar};
use crate::plan::{Binding, Launch};

/// A factor of a product (mirrors the runtime's `Factor`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FactorData {
    /// A constant.
    Const(u64),
    /// A dim's extent.
    Dim(u16),
    /// `ceil(dim / t)`.
    CeilDiv(u16, u64),
}

/// A kernel parameter (mirrors the runtime's `Param`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ParamData {
    /// Input pointer.
    Input(u16),
    /// Output pointer.
    Output(u16),
    /// Workspace pointer.
    Workspace(u16),
    /// A dim's extent as i64.
    Extent(u16),
    /// The element stride of axis `.1` of input `.0`, as i64.
    InputStride(u16, u8),
    /// The element stride of axis `.1` of output `.0`, as i64.
    OutputStride(u16, u8),
}

/// One launch.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct LaunchData {
    /// Entry point.
    pub symbol: String,
    /// Blocks along x (y and z are 1).
    pub grid: Vec<FactorData>,
    /// Threads per block.
    pub threads: u32,
    /// Dynamic shared memory.
    pub smem_bytes: u32,
    /// Parameters in order.
    pub params: Vec<ParamData>,
}

/// A dim of the plan.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct DimData {
    /// Name.
    pub name: String,
    /// Static or representative extent.
    pub value: u64,
    /// Passed at run time.
    pub dynamic: bool,
}

/// A tensor of the plan.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct TensorData {
    /// Name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Axes: `None` for a unit axis, else a plan dim index.
    pub shape: Vec<Option<u16>>,
}

/// The whole plan.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PlanData {
    /// Declared kernel name.
    pub kernel: String,
    /// Dims (split chunks excluded: kernels derive them).
    pub dims: Vec<DimData>,
    /// Inputs.
    pub inputs: Vec<TensorData>,
    /// Outputs.
    pub outputs: Vec<TensorData>,
    /// Workspaces: element bytes and length.
    pub workspaces: Vec<(u32, Vec<FactorData>)>,
    /// Launches.
    pub launches: Vec<LaunchData>,
}

/// Why a launch has no plan data.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum PlanDataError {
    /// A dim a kernel needs that the plan does not pass (a split chunk, which kernels derive).
    #[error("dim {0} is not passed to kernels")]
    NotPassed(String),
    /// More of something than the plan's fields can hold.
    #[error("{what} {value} is more than the launch plan can hold")]
    TooLarge {
        /// What overflowed.
        what: &'static str,
        /// Its value.
        value: u64,
    },
}

/// Derives the plan of a launch.
pub fn plan_data(launch: &Launch, kernel: &str) -> Result<PlanData, PlanDataError> {
    let dims = launch.dims();
    let kept: Vec<DimVar> =
        dims.iter().filter(|(_, d)| !matches!(d.kind, DimKind::SplitChunk { .. })).map(|(v, _)| v).collect();
    let index = |v: DimVar| -> Result<u16, PlanDataError> {
        let i = kept.iter().position(|x| *x == v).ok_or_else(|| PlanDataError::NotPassed(dims.get(v).name.clone()))?;
        u16::try_from(i).map_err(|_| PlanDataError::TooLarge { what: "dim index", value: i as u64 })
    };
    let small = |what: &'static str, i: usize| -> Result<u16, PlanDataError> {
        u16::try_from(i).map_err(|_| PlanDataError::TooLarge { what, value: i as u64 })
    };
    let factor = |d: Dim| -> Result<FactorData, PlanDataError> {
        match d {
            Dim::One => Ok(FactorData::Const(1)),
            Dim::Var(v) if dims.get(v).dynamic => Ok(FactorData::Dim(index(v)?)),
            Dim::Var(v) => Ok(FactorData::Const(dims.get(v).value)),
        }
    };
    let tensor = |name: &str, dtype: DType, shape: &[Dim]| -> Result<TensorData, PlanDataError> {
        let shape = shape.iter().map(|d| d.var().map(&index).transpose()).collect::<Result<_, _>>()?;
        Ok(TensorData { name: name.to_string(), dtype, shape })
    };
    let g = &launch.graph;
    let inputs =
        g.inputs.iter().map(|i| tensor(&i.decl.name, i.decl.dtype, &i.decl.shape)).collect::<Result<_, _>>()?;
    let outputs =
        g.outputs.iter().map(|o| tensor(&o.decl.name, o.decl.dtype, &o.decl.shape)).collect::<Result<_, _>>()?;
    let workspaces = launch
        .workspaces
        .iter()
        .map(|w| Ok((w.ty.bytes(), w.shape.iter().map(|d| factor(*d)).collect::<Result<Vec<_>, _>>()?)))
        .collect::<Result<_, PlanDataError>>()?;
    let mut launches = Vec::new();
    for k in &launch.kernels {
        let mut grid = Vec::new();
        for a in k.grid() {
            let info = dims.get(a.dim);
            grid.push(if info.dynamic {
                FactorData::CeilDiv(index(a.dim)?, a.tile)
            } else {
                FactorData::Const(info.value.div_ceil(a.tile))
            });
        }
        let mut params = Vec::new();
        for p in k.params() {
            params.push(match p.binding {
                Binding::Input(i) => ParamData::Input(small("input index", i as usize)?),
                Binding::Output(i) => ParamData::Output(small("output index", i as usize)?),
                Binding::Workspace(i) => ParamData::Workspace(small("workspace index", i as usize)?),
            });
        }
        for d in k.extents() {
            params.push(ParamData::Extent(index(*d)?));
        }
        for st in k.strides() {
            let axis =
                u8::try_from(st.axis).map_err(|_| PlanDataError::TooLarge { what: "axis", value: st.axis.into() })?;
            params.push(match st.binding {
                Binding::Input(i) => ParamData::InputStride(small("input index", i as usize)?, axis),
                Binding::Output(i) => ParamData::OutputStride(small("output index", i as usize)?, axis),
                // `stride_params` names views only.
                Binding::Workspace(_) => unreachable!("a workspace has no runtime strides"),
            });
        }
        let smem_bytes = u32::try_from(k.smem_bytes())
            .map_err(|_| PlanDataError::TooLarge { what: "dynamic shared memory", value: k.smem_bytes() })?;
        launches.push(LaunchData { symbol: k.symbol().to_string(), grid, threads: k.threads(), smem_bytes, params });
    }
    let dims_out = kept
        .iter()
        .map(|v| {
            let d = dims.get(*v);
            DimData { name: d.name.clone(), value: d.value, dynamic: d.dynamic }
        })
        .collect();
    Ok(PlanData { kernel: kernel.to_string(), dims: dims_out, inputs, outputs, workspaces, launches })
}

impl PlanData {
    /// The plan as a Rust expression of type `cleave::runtime::LaunchPlan` (for a `static`).
    pub fn to_rust(&self, rt: &str) -> String {
        let factors = |fs: &[FactorData]| -> String {
            let items: Vec<String> = fs
                .iter()
                .map(|f| match f {
                    FactorData::Const(c) => format!("{rt}::Factor::Const({c})"),
                    FactorData::Dim(d) => format!("{rt}::Factor::Dim({d})"),
                    FactorData::CeilDiv(d, t) => format!("{rt}::Factor::CeilDiv({d}, {t})"),
                })
                .collect();
            format!("{rt}::Product(&[{}])", items.join(", "))
        };
        let dtype = |d: DType| match d {
            DType::F16 => format!("{rt}::DType::F16"),
            DType::BF16 => format!("{rt}::DType::BF16"),
            DType::F32 => format!("{rt}::DType::F32"),
        };
        let tensor = |t: &TensorData| -> String {
            let axes: Vec<String> = t
                .shape
                .iter()
                .map(|a| match a {
                    None => format!("{rt}::Axis::One"),
                    Some(d) => format!("{rt}::Axis::Dim({d})"),
                })
                .collect();
            format!(
                "{rt}::TensorSpec {{ name: {:?}, dtype: {}, shape: &[{}] }}",
                t.name,
                dtype(t.dtype),
                axes.join(", ")
            )
        };
        let mut s = String::new();
        let _ = writeln!(s, "{rt}::LaunchPlan {{");
        let _ = writeln!(s, "    kernel: {:?},", self.kernel);
        let dims: Vec<String> = self
            .dims
            .iter()
            .map(|d| format!("{rt}::DimSpec {{ name: {:?}, value: {}, dynamic: {} }}", d.name, d.value, d.dynamic))
            .collect();
        let _ = writeln!(s, "    dims: &[{}],", dims.join(", "));
        let _ = writeln!(s, "    inputs: &[{}],", self.inputs.iter().map(tensor).collect::<Vec<_>>().join(", "));
        let _ = writeln!(s, "    outputs: &[{}],", self.outputs.iter().map(tensor).collect::<Vec<_>>().join(", "));
        let ws: Vec<String> = self
            .workspaces
            .iter()
            .map(|(b, f)| format!("{rt}::WorkspaceSpec {{ elem_bytes: {b}, len: {} }}", factors(f)))
            .collect();
        let _ = writeln!(s, "    workspaces: &[{}],", ws.join(", "));
        let _ = writeln!(s, "    launches: &[");
        for l in &self.launches {
            let params: Vec<String> = l
                .params
                .iter()
                .map(|p| match p {
                    ParamData::Input(i) => format!("{rt}::Param::Input({i})"),
                    ParamData::Output(i) => format!("{rt}::Param::Output({i})"),
                    ParamData::Workspace(i) => format!("{rt}::Param::Workspace({i})"),
                    ParamData::Extent(i) => format!("{rt}::Param::Extent({i})"),
                    ParamData::InputStride(i, a) => format!("{rt}::Param::InputStride({i}, {a})"),
                    ParamData::OutputStride(i, a) => format!("{rt}::Param::OutputStride({i}, {a})"),
                })
                .collect();
            let _ = writeln!(
                s,
                "        {rt}::KernelLaunch {{ symbol: {:?}, grid: [{}, {}, {}], threads: {}, smem_bytes: {}, params: &[{}] }},",
                l.symbol,
                factors(&l.grid),
                factors(&[]),
                factors(&[]),
                l.threads,
                l.smem_bytes,
                params.join(", ")
            );
        }
        let _ = writeln!(s, "    ],");
        s.push('}');
        s
    }
}
