//! The launch sequence as plain data (`PlanData`): what the runtime's `LaunchPlan` holds,
//! derived from a planned [`Launch`]. Generated Rust writes it as a `static`; the command line
//! builds the runtime plan from it directly. Keeping one derivation means the host emulation
//! and the GPU launch read the same grids, workspaces and parameter order.

use std::fmt::Write;

use crate::graph::{DType, Dim, DimKind, DimVar, PerRequestKind, StoreAxis, TensorDecl};
use crate::plan::{Binding, Kernel, Launch};

/// A factor of a product (mirrors the runtime's `Factor`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FactorData {
    /// A constant.
    Const(u64),
    /// A dim's extent.
    Dim(u16),
    /// `ceil(dim / t)`.
    CeilDiv(u16, u64),
    /// The slots of a work list over a ragged dim: `total / tile + batch`.
    Slots {
        /// The packed axis' extent.
        total: u16,
        /// The batch.
        batch: u16,
        /// Rows per slot.
        tile: u64,
    },
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
    /// The element stride of axis `.1` of input `.0`'s buffer, as i64.
    InputStride(u16, u8),
    /// The element stride of axis `.1` of output `.0`'s buffer, as i64.
    OutputStride(u16, u8),
    /// A scalar input, by value (f32).
    Scalar(u16),
}

/// One axis of a tensor's buffer (mirrors the runtime's `Axis`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum AxisData {
    /// Extent 1.
    One,
    /// A plan dim's extent.
    Dim(u16),
    /// The product of plan dims' extents (several logical axes merged).
    Merged(Vec<u16>),
    /// A plan dim's extent plus one (an indptr).
    PlusOne(u16),
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
    /// Computed by the launcher from the other extents (mirrors the runtime's `Derive`).
    pub derive: Option<DeriveData>,
}

/// How a launcher computes a dim (mirrors the runtime's `Derive`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum DeriveData {
    /// The split count of a per-request or dynamic dim: [`crate::plan::requests::split_count`]
    /// of the split kernel's other blocks, the entries a request has on average and the SMs
    /// the plan is for.
    SplitCount {
        /// The split kernel's blocks besides the split.
        blocks: Vec<FactorData>,
        /// Of those, the ones that stream data of their own
        /// ([`crate::plan::requests::SplitShape::streams`]).
        streams: Vec<FactorData>,
        /// Every request's entries together (an upper bound), or a dense axis' extent.
        entries: Vec<FactorData>,
        /// The batch dim (`None`: a dense axis, one request).
        batch: Option<u16>,
        /// The SMs the grid is spread over.
        sms: u32,
        /// Blocks of the split kernel one SM holds at once.
        resident: u32,
        /// [`crate::plan::requests::SplitShape::fill`] of the GPU.
        fill: u32,
        /// The launch of the split kernel, whose residency a device reports at run time.
        launch: Option<u16>,
    },
}

/// A tensor of the plan.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct TensorData {
    /// Name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// The buffer's axes.
    pub shape: Vec<AxisData>,
}

/// An index tensor and what its entries must satisfy (mirrors the runtime's `Table`), so that
/// an executor holding it in host memory can refuse a malformed one before any kernel reads it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum TableData {
    /// Input `input` holds `batch + 1` non-decreasing offsets into an axis of extent `bound`.
    Indptr {
        /// The input.
        input: u16,
        /// The batch dim.
        batch: u16,
        /// The extent the offsets index (`None`: no tensor packs it, only monotony is checked).
        bound: Option<u16>,
    },
    /// Input `input` is a page table: every entry a request owns (through `indptr`) is a page
    /// number below the extent of each of `pages`.
    Pages {
        /// The page table.
        input: u16,
        /// The indptr into it.
        indptr: u16,
        /// The batch dim.
        batch: u16,
        /// The page pools it addresses (their page-axis dims).
        pages: Vec<u16>,
    },
    /// Input `input` holds each request's used slots in its last page: in `1..=page_size` for
    /// a request with pages.
    LastPage {
        /// The input.
        input: u16,
        /// The indptr into the page table.
        indptr: u16,
        /// The batch dim.
        batch: u16,
        /// Slots per page.
        page_size: u64,
    },
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

/// The whole plan.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PlanData {
    /// Declared kernel name.
    pub kernel: String,
    /// Dims (split chunks and per-request dims excluded: kernels derive them).
    pub dims: Vec<DimData>,
    /// Inputs.
    pub inputs: Vec<TensorData>,
    /// Outputs.
    pub outputs: Vec<TensorData>,
    /// Workspaces: element bytes and length.
    pub workspaces: Vec<(u32, Vec<FactorData>)>,
    /// Launches.
    pub launches: Vec<LaunchData>,
    /// The index tensors' rules.
    pub tables: Vec<TableData>,
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
    let kept: Vec<DimVar> = dims
        .iter()
        .filter(|(_, d)| !matches!(d.kind, DimKind::SplitChunk { .. }) && d.per_request.is_none())
        .map(|(v, _)| v)
        .collect();
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
    let tensor = |t: &TensorDecl| -> Result<TensorData, PlanDataError> {
        let shape = match &t.layout {
            None => t
                .shape
                .iter()
                .map(|d| Ok(d.var().map(&index).transpose()?.map_or(AxisData::One, AxisData::Dim)))
                .collect::<Result<_, PlanDataError>>()?,
            Some(l) => l
                .axes
                .iter()
                .map(|a| {
                    Ok(match a {
                        StoreAxis::One | StoreAxis::Slot { size: Dim::One, .. } => AxisData::One,
                        StoreAxis::Dims(ds) if ds.len() == 1 => AxisData::Dim(index(ds[0])?),
                        StoreAxis::Dims(ds) => {
                            AxisData::Merged(ds.iter().map(|d| index(*d)).collect::<Result<_, _>>()?)
                        }
                        StoreAxis::Packed { total: d, .. }
                        | StoreAxis::Pages { pages: d, .. }
                        | StoreAxis::Slot { size: Dim::Var(d), .. } => AxisData::Dim(index(*d)?),
                        StoreAxis::PlusOne(d) => AxisData::PlusOne(index(*d)?),
                    })
                })
                .collect::<Result<_, PlanDataError>>()?,
        };
        Ok(TensorData { name: t.name.clone(), dtype: t.dtype, shape })
    };
    let g = &launch.graph;
    let inputs = g.inputs.iter().map(|i| tensor(&i.decl)).collect::<Result<_, _>>()?;
    let outputs = g.outputs.iter().map(|o| tensor(&o.decl)).collect::<Result<_, _>>()?;
    let workspaces = launch
        .workspaces
        .iter()
        .map(|w| {
            let axes = w.storage.as_ref().unwrap_or(&w.shape);
            Ok((w.ty.bytes(), axes.iter().map(|d| factor(*d)).collect::<Result<Vec<_>, _>>()?))
        })
        .collect::<Result<_, PlanDataError>>()?;
    let mut launches = Vec::new();
    for k in &launch.kernels {
        let mut grid = Vec::new();
        for a in k.grid() {
            let info = dims.get(a.dim);
            // A ragged dim's blocks are the slots of its work list; its batch's grid axis is
            // folded into them.
            if let Some(pr) = &info.per_request {
                if let PerRequestKind::Ragged { total: Some(total), .. } = pr.kind {
                    grid.push(FactorData::Slots { total: index(total)?, batch: index(pr.batch)?, tile: a.tile });
                    continue;
                }
                return Err(PlanDataError::NotPassed(info.name.clone()));
            }
            let folded = k.grid().iter().any(|r| {
                matches!(&dims.get(r.dim).per_request, Some(p) if p.batch == a.dim && matches!(p.kind, PerRequestKind::Ragged { .. }))
            });
            if folded {
                continue;
            }
            grid.push(if info.dynamic {
                FactorData::CeilDiv(index(a.dim)?, a.tile)
            } else {
                FactorData::Const(info.value.div_ceil(a.tile))
            });
        }
        let mut params = Vec::new();
        for p in k.params() {
            params.push(match p.binding {
                Binding::Input(i) if p.is_scalar() => ParamData::Scalar(small("input index", i as usize)?),
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
    let mut dims_out = Vec::with_capacity(kept.len());
    for v in &kept {
        let d = dims.get(*v);
        let derive = if crate::plan::requests::is_runtime_split(dims, *v) {
            Some(split_rule(launch, *v, &index)?)
        } else {
            None
        };
        // A derived dim is not given: the launcher computes it.
        let dynamic = d.dynamic && derive.is_none();
        dims_out.push(DimData { name: d.name.clone(), value: d.value, dynamic, derive });
    }
    let mut tables = Vec::new();
    for (v, info) in dims.iter() {
        let Some(pr) = &info.per_request else { continue };
        let batch = index(pr.batch)?;
        let indptr = small("input index", pr.indptr().input as usize)?;
        match &pr.kind {
            PerRequestKind::Ragged { total, .. } => {
                let bound = total.map(index).transpose()?;
                tables.push(TableData::Indptr { input: indptr, batch, bound });
            }
            PerRequestKind::Paged { indices, page_size, last_page_len, .. } => {
                tables.push(TableData::Indptr { input: indptr, batch, bound: Some(index(indices.len)?) });
                let mut pages = Vec::new();
                for i in &g.inputs {
                    for a in i.decl.layout.iter().flat_map(|l| &l.axes) {
                        if let StoreAxis::Pages { pages: p, paged } = a {
                            if *paged == v {
                                pages.push(index(*p)?);
                            }
                        }
                    }
                }
                pages.sort_unstable();
                pages.dedup();
                let input = small("input index", indices.input as usize)?;
                tables.push(TableData::Pages { input, indptr, batch, pages });
                if let Some(l) = last_page_len {
                    let input = small("input index", l.input as usize)?;
                    tables.push(TableData::LastPage { input, indptr, batch, page_size: *page_size });
                }
            }
        }
    }
    tables.dedup();
    Ok(PlanData { kernel: kernel.to_string(), dims: dims_out, inputs, outputs, workspaces, launches, tables })
}

/// How the launcher computes the run-time split count `v` of a per-request or dynamic dim.
fn split_rule(
    launch: &Launch,
    v: DimVar,
    index: &dyn Fn(DimVar) -> Result<u16, PlanDataError>,
) -> Result<DeriveData, PlanDataError> {
    let dims = launch.dims();
    let DimKind::SplitCount { of } = dims.get(v).kind else { unreachable!("a split count") };
    let factor = |d: DimVar| -> Result<FactorData, PlanDataError> {
        if dims.get(d).dynamic {
            Ok(FactorData::Dim(index(d)?))
        } else {
            Ok(FactorData::Const(dims.get(d).value))
        }
    };
    let (mut blocks, mut streams) = (Vec::new(), Vec::new());
    let mut resident = 1;
    let mut split_launch = None;
    if let Some((i, k)) = launch.kernels.iter().enumerate().find(|(_, k)| k.grid().iter().any(|a| a.dim == v)) {
        resident = launch.resident.get(i).copied().unwrap_or(1);
        // Every kernel is one launch of the plan, in the same order. A stage kernel keeps the
        // one block per SM the compiler ranked it with (`plan::launch::on_gpu`).
        if matches!(k, Kernel::Tile(_)) {
            split_launch = u16::try_from(i).ok();
        }
        // A stage kernel's axes all count as streaming: it has no tiles to tell apart.
        let axes = match k {
            Kernel::Tile(t) => crate::plan::requests::split_axes(t, v),
            Kernel::Stage(_) => k.grid().iter().filter(|a| a.dim != v).map(|a| (*a, true)).collect(),
        };
        for (a, own) in axes {
            let f = if dims.get(a.dim).dynamic {
                FactorData::CeilDiv(index(a.dim)?, a.tile)
            } else {
                FactorData::Const(dims.get(a.dim).value.div_ceil(a.tile))
            };
            if own {
                streams.push(f);
            }
            blocks.push(f);
        }
    }
    let (sms, fill) = (launch.sms, launch.fill);
    // A dense axis is one request of its whole extent.
    let Some(pr) = dims.get(of).per_request.as_ref() else {
        let entries = vec![factor(of)?];
        return Ok(DeriveData::SplitCount {
            blocks,
            streams,
            entries,
            batch: None,
            sms,
            resident,
            fill,
            launch: split_launch,
        });
    };
    let entries = match &pr.kind {
        PerRequestKind::Ragged { total: Some(t), .. } => vec![factor(*t)?],
        PerRequestKind::Ragged { total: None, .. } => vec![FactorData::Const(dims.get(of).value), factor(pr.batch)?],
        PerRequestKind::Paged { indices, page_size, .. } => vec![factor(indices.len)?, FactorData::Const(*page_size)],
    };
    Ok(DeriveData::SplitCount {
        blocks,
        streams,
        entries,
        batch: Some(index(pr.batch)?),
        sms,
        resident,
        fill,
        launch: split_launch,
    })
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
                    FactorData::Slots { total, batch, tile } => {
                        format!("{rt}::Factor::Slots {{ total: {total}, batch: {batch}, tile: {tile} }}")
                    }
                })
                .collect();
            format!("{rt}::Product(&[{}])", items.join(", "))
        };
        let dtype = |d: DType| match d {
            DType::F16 => format!("{rt}::DType::F16"),
            DType::BF16 => format!("{rt}::DType::BF16"),
            DType::F32 => format!("{rt}::DType::F32"),
            DType::I32 => format!("{rt}::DType::I32"),
        };
        let tensor = |t: &TensorData| -> String {
            let axes: Vec<String> = t
                .shape
                .iter()
                .map(|a| match a {
                    AxisData::One => format!("{rt}::Axis::One"),
                    AxisData::Dim(d) => format!("{rt}::Axis::Dim({d})"),
                    AxisData::Merged(ds) => format!(
                        "{rt}::Axis::Merged(&[{}])",
                        ds.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
                    ),
                    AxisData::PlusOne(d) => format!("{rt}::Axis::PlusOne({d})"),
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
            .map(|d| {
                let derive = match &d.derive {
                    None => "::core::option::Option::None".to_string(),
                    Some(DeriveData::SplitCount { blocks, streams, entries, batch, sms, resident, fill, launch }) => {
                        let option = |v: &Option<u16>| match v {
                            Some(b) => format!("::core::option::Option::Some({b})"),
                            None => "::core::option::Option::None".to_string(),
                        };
                        format!(
                            "::core::option::Option::Some({rt}::Derive::SplitCount {{ blocks: {}, streams: {}, entries: {}, batch: {}, sms: {sms}, resident: {resident}, fill: {fill}, launch: {} }})",
                            factors(blocks),
                            factors(streams),
                            factors(entries),
                            option(batch),
                            option(launch)
                        )
                    }
                };
                format!(
                    "{rt}::DimSpec {{ name: {:?}, value: {}, dynamic: {}, derive: {derive} }}",
                    d.name, d.value, d.dynamic
                )
            })
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
                    ParamData::Scalar(i) => format!("{rt}::Param::Scalar({i})"),
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
        let tables: Vec<String> = self
            .tables
            .iter()
            .map(|t| match t {
                TableData::Indptr { input, batch, bound } => format!(
                    "{rt}::Table::Indptr {{ input: {input}, batch: {batch}, bound: {} }}",
                    bound.map_or("::core::option::Option::None".to_string(), |b| format!("::core::option::Option::Some({b})"))
                ),
                TableData::Pages { input, indptr, batch, pages } => format!(
                    "{rt}::Table::Pages {{ input: {input}, indptr: {indptr}, batch: {batch}, pages: &[{}] }}",
                    pages.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
                ),
                TableData::LastPage { input, indptr, batch, page_size } => format!(
                    "{rt}::Table::LastPage {{ input: {input}, indptr: {indptr}, batch: {batch}, page_size: {page_size} }}"
                ),
            })
            .collect();
        let _ = writeln!(s, "    tables: &[{}],", tables.join(", "));
        s.push('}');
        s
    }
}
