//! Launch plans: the launch sequence of one declared kernel, as data.
//!
//! Code generation writes one [`LaunchPlan`] per declared kernel as a `static`. Both executors
//! (CUDA and host emulation) read the same plan, so the host emulation exercises exactly the
//! grid sizes, workspace sizes and argument order the GPU sees.
//!
//! Every type here is built from `&'static` slices and plain values so that a plan can be a
//! `static` item in generated code, or be built at run time and leaked (`Box::leak`) by the
//! command-line tool.

use std::fmt;

use crate::layout::MAX_RANK;
use crate::Error;

/// The largest extent of any dim: kernels index one axis with 32-bit signed arithmetic.
pub const MAX_EXTENT: u64 = (1 << 31) - 1;

/// The largest element count of one tensor: kernels compute element offsets in 64-bit
/// arithmetic, and 2^48 leaves headroom for the byte offsets and tile arithmetic on top.
pub const MAX_TENSOR_ELEMENTS: u64 = 1 << 48;

/// CUDA's limit on the number of blocks along grid x, y and z.
pub const MAX_GRID: [u64; 3] = [(1 << 31) - 1, 65_535, 65_535];

/// CUDA's limit on threads per block.
pub const MAX_THREADS: u32 = 1024;

/// Most dims of a plan. The per-call tables of a launch (extents, pointers, parameters) are
/// fixed-size arrays bounded by these limits, so that a launch allocates nothing; the code
/// generator refuses plans beyond them.
pub const MAX_DIMS: usize = 128;
/// Most inputs plus outputs of a plan (the front end allows 64).
pub const MAX_TENSORS: usize = 64;
/// Most workspaces of a plan.
pub const MAX_WORKSPACES: usize = 64;
/// Most parameters of one kernel launch.
pub const MAX_PARAMS: usize = 256;

/// The alignment of each workspace inside the one buffer that holds them all: the alignment
/// CUDA's allocators give, so that a workspace is as aligned as its own allocation would be.
pub const WORKSPACE_ALIGN: u64 = 256;

/// The launch sequence of one declared kernel.
#[derive(Debug, Clone, Copy)]
pub struct LaunchPlan {
    /// The declared kernel name.
    pub kernel: &'static str,
    /// Every dim of the kernel, in declaration order.
    pub dims: &'static [DimSpec],
    /// The declared inputs, in declaration order.
    pub inputs: &'static [TensorSpec],
    /// The declared outputs, in declaration order.
    pub outputs: &'static [TensorSpec],
    /// Scratch buffers (Split-K partials) the executor allocates for the duration of a call.
    pub workspaces: &'static [WorkspaceSpec],
    /// The kernels to launch, in order, on one stream.
    pub launches: &'static [KernelLaunch],
    /// The index tensors among the inputs and the rules their entries follow.
    pub tables: &'static [Table],
}

/// One plan of a kernel, the GPUs and the extents it was made for. A build makes a plan per
/// kind of GPU its code runs on (SM count, shared memory per block) and per set of extents
/// the declaration lists (`also:`); generated modules list them newest GPU first, each GPU's
/// plans together, and pick one per device and call with [`select`].
#[derive(Debug, Clone, Copy)]
pub struct Variant {
    /// The targets it was scheduled for, e.g. `"sm_90"` or `"sm_86, sm_80"`.
    pub target: &'static str,
    /// The lowest compute capability it is meant for, as nvcc numbers it (86 for 8.6).
    pub min_cc: u32,
    /// The extents of the plan's dynamic dims (in the order of [`LaunchPlan::dynamic_dims`])
    /// it was made for. Several entries may share one plan, when the best plan at their
    /// extents came out the same.
    pub at: &'static [u64],
    /// The plan.
    pub plan: &'static LaunchPlan,
}

impl LaunchPlan {
    /// The most dynamic shared memory any of its launches asks for, in bytes.
    pub fn smem_bytes(&self) -> u32 {
        self.launches.iter().map(|l| l.smem_bytes).max().unwrap_or(0)
    }
}

/// The plans a GPU of compute capability `cc` (major, minor) that lets one block opt in to
/// `smem_per_block` bytes of shared memory runs: those of the first target in `variants`
/// (newest first) meant for its capability or an older one whose kernels all fit its shared
/// memory. A GPU newer than every target (running PTX) takes the newest plans that fit it; a
/// GPU whose shared memory holds none of them is an error that says what each would need.
pub fn for_device(
    variants: &'static [Variant],
    cc: (u32, u32),
    smem_per_block: u64,
) -> Result<&'static [Variant], Error> {
    let number = cc.0.saturating_mul(10).saturating_add(cc.1);
    // A target's plans come together; it serves the GPU when every one of them fits, so that
    // which plan runs never depends on the extents' fitting.
    let mut start = 0;
    while start < variants.len() {
        let target = variants[start].target;
        let len = variants[start..].iter().take_while(|v| v.target == target).count();
        let group = &variants[start..start + len];
        if group.iter().all(|v| v.min_cc <= number && u64::from(v.plan.smem_bytes()) <= smem_per_block) {
            return Ok(group);
        }
        start += len;
    }
    let Some(first) = variants.first() else {
        return Err(Error::InvalidPlan { kernel: "?", reason: "a kernel module lists no plans".into() });
    };
    let plans: Vec<String> = variants
        .iter()
        .map(|v| {
            format!(
                "{} (compute capability {}.{} or newer, {} bytes of shared memory per block)",
                v.target,
                v.min_cc / 10,
                v.min_cc % 10,
                v.plan.smem_bytes()
            )
        })
        .collect();
    Err(Error::NoPlanFits { kernel: first.plan.kernel, have: cc, smem_per_block, plans: plans.join("; ") })
}

/// The plan a call with these dynamic extents runs on that GPU: the one of [`for_device`]'s
/// plans made nearest to them ([`nearest`]).
pub fn select(
    variants: &'static [Variant],
    cc: (u32, u32),
    smem_per_block: u64,
    dynamic: &[usize],
) -> Result<&'static LaunchPlan, Error> {
    Ok(nearest(for_device(variants, cc, smem_per_block)?, dynamic).plan)
}

/// The entry of `variants` (one target's, from [`for_device`]) made for the extents nearest
/// to `dynamic`: the smallest sum over dynamic dims of |ln(extent ÷ planned extent)|, so that
/// twice and half as large are equally far; the first on a tie (the declared extents come
/// first). Allocates nothing: a launcher calls it on every launch. `variants` must not be
/// empty ([`for_device`] never returns an empty list); [`nearest_index`] of an empty list is 0.
pub fn nearest<'v>(variants: &'v [Variant], dynamic: &[usize]) -> &'v Variant {
    &variants[nearest_index(variants, dynamic)]
}

/// The index of [`nearest`] in `variants`.
pub fn nearest_index(variants: &[Variant], dynamic: &[usize]) -> usize {
    let distance = |v: &Variant| -> f64 {
        v.at.iter()
            .zip(dynamic)
            .map(|(&planned, &have)| ((have.max(1) as f64).ln() - (planned.max(1) as f64).ln()).abs())
            .sum()
    };
    let mut best = 0;
    let mut best_distance = f64::INFINITY;
    for (i, v) in variants.iter().enumerate() {
        // Equal distances computed through different logarithms may differ in the last bit;
        // a margin keeps such a tie a tie.
        let d = distance(v);
        if d < best_distance - 1e-9 {
            best = i;
            best_distance = d;
        }
    }
    best
}

/// An index tensor of a plan and what its entries must satisfy. Kernels clamp every entry
/// they read, so no table can move an access outside a buffer; these rules are what makes the
/// result meaningful, checked wherever the table is in host memory ([`check_tables`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// Input `input` holds `batch + 1` non-decreasing offsets, each in `0..=extent(bound)`.
    Indptr {
        /// The input.
        input: u16,
        /// The batch dim.
        batch: u16,
        /// The dim the offsets index (`None`: only monotony is required).
        bound: Option<u16>,
    },
    /// Input `input` is a page table: every entry some request owns through the indptr
    /// `indptr` is a page number below the extent of each dim of `pages`.
    Pages {
        /// The page table.
        input: u16,
        /// Its indptr.
        indptr: u16,
        /// The batch dim.
        batch: u16,
        /// The page-pool dims it addresses.
        pages: &'static [u16],
    },
    /// Input `input` holds each request's used slots of its last page: in `1..=page_size`
    /// for a request with pages.
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

/// One dim of a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DimSpec {
    /// The declared name.
    pub name: &'static str,
    /// The static extent, or the representative one the schedule was chosen for when `dynamic`
    /// or derived.
    pub value: u64,
    /// Whether the extent is a run-time argument of the launcher.
    pub dynamic: bool,
    /// How the launcher computes the extent from the others (such a dim is not `dynamic`).
    pub derive: Option<Derive>,
}

/// How a launcher computes a dim's extent from the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Derive {
    /// The split count of a split-KV over requests of different lengths, or of a split of a
    /// dynamic axis: [`split_count`] of the split kernel's `blocks` besides the split and the
    /// entries a request has on average (`entries` over the batch; a dense axis is one
    /// request). It depends only on extents the launcher is given, so no table is read and
    /// nothing synchronizes.
    SplitCount {
        /// The split kernel's blocks besides the split.
        blocks: Product,
        /// Of those, the ones that stream data of their own (the others read the same chunks
        /// again, from L2): [`SplitShape::streams`].
        streams: Product,
        /// Every request's entries together (an upper bound: the packed axis' extent, the
        /// page table's entries times the page size), or the dense axis' extent.
        entries: Product,
        /// The batch dim (`None`: a dense axis).
        batch: Option<u16>,
        /// The SMs of the GPU the plan was made for, over which the count spreads the grid.
        sms: u32,
        /// Blocks of the split kernel one SM of that GPU holds at once, as the compiler
        /// estimates it; a launch on a device uses the device's own count when it has one
        /// ([`Device::resident`]).
        resident: u32,
        /// How many blocks streaming at once saturate that GPU's DRAM: [`SplitShape::fill`].
        fill: u32,
        /// The launch of the split kernel, whose residency on the device replaces `resident`;
        /// `None` when no launch's grid has the split, or when the split kernel is a stage
        /// kernel, which keeps the one block per SM it was ranked with.
        launch: Option<u16>,
    },
}

/// The shortest chunk of a request worth a block of its own: 128 entries are 64 KiB of one
/// 128-wide K/V head in 16 bits, and more than twice that of an MLA latent row.
pub const SPLIT_MIN_CHUNK: u64 = 128;
/// The most parts a request is split into.
pub const SPLIT_MAX: u64 = 32;
/// What a block of a split costs besides streaming its chunk, in entries of a request
/// (its partial result stored and read back, its pipeline filled).
pub const SPLIT_BLOCK_OVERHEAD: u64 = 64;

/// What the split-count rule knows of a launch, all of it from the extents and the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitShape {
    /// The split kernel's blocks besides the split.
    pub blocks: u64,
    /// Of those, how many stream data of their own; the others read the same chunks again.
    pub streams: u64,
    /// The entries a request has on average.
    pub per_request: u64,
    /// The GPU's SMs.
    pub sms: u64,
    /// Blocks of the split kernel one SM holds at once.
    pub resident: u64,
    /// How many blocks, each streaming as fast as one block does, saturate DRAM.
    pub fill: u64,
}

/// The split count of a per-request dim: of the counts from 1 up to [`most_parts`], the one
/// whose launch is estimated to end first, the fewest parts among equals. With `s` parts a
/// launch lasts as long as the longer of the busiest SM's work (`ceil(blocks·s / sms)`
/// blocks, `resident` at a time, each streaming `per_request / s` entries and paying
/// [`SPLIT_BLOCK_OVERHEAD`]) and DRAM's (`streams · per_request` entries of distinct data and
/// every block's overhead, at `fill` blocks' rate). The compiler ranks schedules with the same
/// rule (`cleave_core::plan::requests::split_count`), and a test checks that the two agree.
pub fn split_count(shape: SplitShape) -> u64 {
    // Bounded so that the products below cannot overflow; no launch comes near the bounds.
    let blocks = u128::from(shape.blocks.clamp(1, 1 << 24));
    let streams = u128::from(shape.streams.clamp(1, 1 << 24)).min(blocks);
    let sms = u128::from(shape.sms.clamp(1, 1 << 16));
    let resident = u128::from(shape.resident.clamp(1, 64));
    let fill = u128::from(shape.fill.clamp(1, 1 << 12));
    let per_request = shape.per_request.min(1 << 40);
    let most = most_parts(per_request);
    let per = u128::from(per_request);
    let over = u128::from(SPLIT_BLOCK_OVERHEAD);
    // The launch's time with `s` parts, times `s · fill`, so that counts compare exactly by
    // cross-multiplication.
    let time = |s: u64| {
        let s = u128::from(s);
        let rounds = (blocks * s).div_ceil(sms).div_ceil(resident);
        let busiest = rounds * (per + over * s) * fill;
        let dram = (streams * per + blocks * s * over) * s;
        busiest.max(dram)
    };
    (2..=most).fold(1, |best, s| if time(s) * u128::from(best) < time(best) * u128::from(s) { s } else { best })
}

/// The most parts [`split_count`] splits requests of `per_request` entries into: chunks of at
/// least [`SPLIT_MIN_CHUNK`] entries, at most [`SPLIT_MAX`] parts, and always at least one.
pub fn most_parts(per_request: u64) -> u64 {
    (per_request / SPLIT_MIN_CHUNK).clamp(1, SPLIT_MAX)
}

/// The average entries per request of a split-count dim's requests, for `values`.
fn per_request(values: &[u64], entries: Product, batch: Option<u16>) -> u64 {
    let e = entries.eval(values).unwrap_or(0);
    let n = batch.and_then(|b| values.get(usize::from(b)).copied()).unwrap_or(1).max(1);
    e / n
}

/// What a launcher knows of the device a launch runs on, for the split counts it derives.
/// Empty (the default): the GPU the plan was made for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Device<'a> {
    /// The device's SMs (a plan made for 132 SMs also runs on GPUs of 114 or 78).
    pub sms: Option<u32>,
    /// Per launch of the plan, in order, how many of its blocks one SM of the device holds
    /// at once, as the driver reports it for the compiled function; 0 (or no entry) where
    /// unknown, which leaves the plan's estimate. The compiler can only estimate a kernel's
    /// registers, and a split count made for three blocks per SM where the registers allow
    /// two leaves a third of the grid waiting for a second round.
    pub resident: &'a [u32],
}

/// Fills in the derived extents of `values` (one per dim, the others already set), for the
/// GPU the plan was made for.
pub fn derive_extents(plan: &LaunchPlan, values: &mut [u64]) {
    derive_extents_on(plan, values, Device::default());
}

/// [`derive_extents`] for `device`: what it tells of the GPU a launch runs on replaces the
/// plan's figures.
pub fn derive_extents_on(plan: &LaunchPlan, values: &mut [u64], device: Device<'_>) {
    for (i, dim) in plan.dims.iter().enumerate() {
        let Some(Derive::SplitCount { blocks, streams, entries, batch, sms: planned, resident, fill, launch }) =
            dim.derive
        else {
            continue;
        };
        let measured = launch.and_then(|l| device.resident.get(usize::from(l)).copied()).filter(|&r| r > 0);
        let shape = SplitShape {
            blocks: blocks.eval(values).unwrap_or(1),
            streams: streams.eval(values).unwrap_or(1),
            per_request: per_request(values, entries, batch),
            sms: u64::from(device.sms.unwrap_or(planned)),
            resident: u64::from(measured.unwrap_or(resident)),
            fill: u64::from(fill),
        };
        if let Some(slot) = values.get_mut(i) {
            *slot = split_count(shape);
        }
    }
}

/// Sets every split count the launcher derives in `values` (the full extents of one call,
/// derived ones included) to `count` instead of the one [`split_count`] picks for the device:
/// the same count on every GPU gives the same order of summation, so the same bits, and a
/// benchmark can time each count.
///
/// Any count from 1 up to the largest the launcher itself could pick for these extents
/// ([`most_parts`] of the average request) is allowed: the kernels take every such count, and
/// a workspace sized by `workspace_bytes` holds its partials. Errors: `InvalidArguments` when
/// the plan has no split count chosen at launch, or `count` lies outside that range; `values`
/// is then unchanged.
pub fn pin_split_count(plan: &LaunchPlan, values: &mut [u64], count: u64) -> Result<(), Error> {
    let mut any = false;
    // Every count is checked before any is set, so each bound is computed from the extents
    // the call was given (and nothing is allocated but an error's message).
    for dim in plan.dims.iter().take(values.len()) {
        let Some(Derive::SplitCount { entries, batch, .. }) = dim.derive else { continue };
        let most = most_parts(per_request(values, entries, batch));
        if !(1..=most).contains(&count) {
            return Err(Error::InvalidArguments {
                kernel: plan.kernel,
                message: format!("split count {count} for `{}`: these extents allow 1 to {most} parts", dim.name),
            });
        }
        any = true;
    }
    if !any {
        return Err(Error::InvalidArguments {
            kernel: plan.kernel,
            message: format!("split count {count}: the plan chooses no split count at launch"),
        });
    }
    for (dim, slot) in plan.dims.iter().zip(values.iter_mut()) {
        if matches!(dim.derive, Some(Derive::SplitCount { .. })) {
            *slot = count;
        }
    }
    Ok(())
}

/// One axis of a tensor's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    /// A broadcast axis of extent 1.
    One,
    /// The extent of `LaunchPlan::dims[i]`.
    Dim(u16),
    /// The product of several dims' extents: logical axes merged into one (`(g r)`).
    Merged(&'static [u16]),
    /// The extent of `LaunchPlan::dims[i]` plus one (an indptr over `i` requests).
    PlusOne(u16),
}

impl Axis {
    /// The extent for these extents (one per dim), or `None` for a dim out of range or an
    /// overflow.
    pub fn extent(&self, extents: &[u64]) -> Option<u64> {
        match *self {
            Axis::One => Some(1),
            Axis::Dim(d) => extents.get(usize::from(d)).copied(),
            Axis::Merged(ds) => ds.iter().try_fold(1u64, |acc, d| acc.checked_mul(*extents.get(usize::from(*d))?)),
            Axis::PlusOne(d) => extents.get(usize::from(d))?.checked_add(1),
        }
    }

    /// The dims this axis' extent is made of.
    pub fn dims(&self) -> &[u16] {
        match self {
            Axis::One => &[],
            Axis::Dim(d) | Axis::PlusOne(d) => std::slice::from_ref(d),
            Axis::Merged(ds) => ds,
        }
    }
}

/// The element type of a tensor in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE binary32.
    F32,
    /// 32-bit signed integers (index tensors).
    I32,
}

impl DType {
    /// The size of one element in bytes.
    pub const fn size_bytes(self) -> u32 {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
        }
    }

    /// The name used in declarations (`f16`, `bf16`, `f32`, `i32`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::I32 => "i32",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A declared input or output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorSpec {
    /// The declared name, used in error messages.
    pub name: &'static str,
    /// The element type.
    pub dtype: DType,
    /// The buffer's shape, outermost axis first (dense and row-major unless a view says
    /// otherwise). A scalar has none, and is passed by value.
    pub shape: &'static [Axis],
}

impl TensorSpec {
    /// The number of elements for the given extents, rejecting tensors above
    /// [`MAX_TENSOR_ELEMENTS`].
    ///
    /// The error names the dim at which the running product first exceeds the limit.
    pub fn elements(&self, plan: &LaunchPlan, extents: &[u64]) -> Result<u64, Error> {
        let mut count: u64 = 1;
        for axis in self.shape {
            let Some(&d) = axis.dims().last() else { continue };
            let Some(dim) = plan.dims.get(usize::from(d)) else {
                return Err(Error::InvalidPlan {
                    kernel: plan.kernel,
                    reason: format!("tensor `{}` refers to dim {d}, which has no extent", self.name),
                });
            };
            let too_large = || Error::InvalidExtent {
                dim: dim.name,
                value: extents.get(usize::from(d)).copied().unwrap_or(0),
                reason: "a tensor using this dim would exceed 2^48 elements",
            };
            let extent = axis.extent(extents).ok_or_else(too_large)?;
            count = match count.checked_mul(extent) {
                Some(c) if c <= MAX_TENSOR_ELEMENTS => c,
                _ => return Err(too_large()),
            };
        }
        Ok(count)
    }
}

/// One factor of a [`Product`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Factor {
    /// A constant.
    Const(u64),
    /// The extent of `LaunchPlan::dims[i]`.
    Dim(u16),
    /// `ceil(extent[d] / t)`: the number of tiles of size `t` covering dim `d`.
    CeilDiv(u16, u64),
    /// `extent[total] / tile + extent[batch]`: the slots of a work list over the requests of a
    /// ragged dim packed into `total` rows, `tile` rows a slot.
    Slots {
        /// The packed axis' dim.
        total: u16,
        /// The batch dim.
        batch: u16,
        /// Rows per slot.
        tile: u64,
    },
}

/// A product of factors; the empty product is 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Product(pub &'static [Factor]);

impl Product {
    /// Evaluates the product, or `None` when it overflows `u64` or refers to a dim or divisor
    /// that is not valid ([`LaunchPlan::validate`] rules the latter out).
    pub fn eval(&self, extents: &[u64]) -> Option<u64> {
        self.0.iter().try_fold(1u64, |acc, factor| {
            let value = match *factor {
                Factor::Const(c) => c,
                Factor::Dim(d) => *extents.get(usize::from(d))?,
                Factor::CeilDiv(d, t) => {
                    let extent = *extents.get(usize::from(d))?;
                    (t > 0).then(|| extent.div_ceil(t))?
                }
                Factor::Slots { total, batch, tile } => {
                    let (total, batch) = (*extents.get(usize::from(total))?, *extents.get(usize::from(batch))?);
                    (tile > 0).then(|| total / tile)?.checked_add(batch)?
                }
            };
            acc.checked_mul(value)
        })
    }
}

/// A scratch buffer of `len` elements of `elem_bytes` bytes each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceSpec {
    /// The size of one element in bytes.
    pub elem_bytes: u32,
    /// The number of elements.
    pub len: Product,
}

impl WorkspaceSpec {
    /// The size in bytes for the given extents, or `None` on overflow.
    pub fn bytes(&self, extents: &[u64]) -> Option<u64> {
        self.len.eval(extents)?.checked_mul(u64::from(self.elem_bytes))
    }
}

/// One kernel launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelLaunch {
    /// The `extern "C"` symbol in the fatbin (and, prefixed, in the host-emulation library).
    pub symbol: &'static str,
    /// Blocks along x, y and z.
    pub grid: [Product; 3],
    /// Threads per block (a one-dimensional block).
    pub threads: u32,
    /// Dynamic shared memory per block in bytes.
    pub smem_bytes: u32,
    /// The kernel's parameters, in order.
    pub params: &'static [Param],
}

impl KernelLaunch {
    /// The grid for the given extents, checked against CUDA's per-axis limits.
    pub fn grid_dims(&self, kernel: &'static str, extents: &[u64]) -> Result<[u32; 3], Error> {
        let mut grid = [0u32; 3];
        for (axis, ((slot, product), limit)) in grid.iter_mut().zip(&self.grid).zip(MAX_GRID).enumerate() {
            let axis_name = ['x', 'y', 'z'][axis];
            let value = product.eval(extents).ok_or_else(|| Error::Overflow {
                kernel,
                quantity: format!("grid.{axis_name} of launch `{}`", self.symbol),
            })?;
            // The limit is below 2^31, so a value within it always fits in u32.
            *slot = u32::try_from(value).ok().filter(|_| value <= limit).ok_or(Error::GridTooLarge {
                kernel,
                launch: self.symbol,
                axis: axis_name,
                value,
                limit,
            })?;
        }
        Ok(grid)
    }
}

/// One kernel parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// A pointer to input `i`.
    Input(u16),
    /// A pointer to output `i`.
    Output(u16),
    /// A pointer to workspace `i`.
    Workspace(u16),
    /// The extent of dim `i`, passed as a 64-bit signed integer.
    Extent(u16),
    /// The element stride of axis `.1` of input `.0` in this call's view of it, as a 64-bit
    /// signed integer (see [`crate::layout`]).
    InputStride(u16, u8),
    /// The element stride of axis `.1` of output `.0`.
    OutputStride(u16, u8),
    /// Scalar input `i` (an `f32`), by value.
    Scalar(u16),
}

impl LaunchPlan {
    /// Checks that every index in the plan is in range and every launch is well formed.
    ///
    /// Generated plans always pass; the check exists so that a plan built at run time (by the
    /// command-line tool) fails with an error instead of an out-of-bounds access.
    pub fn validate(&self) -> Result<(), Error> {
        let fail = |reason: String| Err(Error::InvalidPlan { kernel: self.kernel, reason });
        let counts = [
            ("dims", self.dims.len(), MAX_DIMS),
            ("inputs and outputs", self.inputs.len() + self.outputs.len(), MAX_TENSORS),
            ("workspaces", self.workspaces.len(), MAX_WORKSPACES),
        ];
        if let Some((what, n, limit)) = counts.into_iter().find(|&(_, n, limit)| n > limit) {
            return fail(format!("the plan has {n} {what}; the runtime takes at most {limit}"));
        }
        let dim_ok = |d: u16| usize::from(d) < self.dims.len();
        for tensor in self.inputs.iter().chain(self.outputs) {
            if tensor.shape.len() > MAX_RANK {
                return fail(format!(
                    "tensor `{}` has {} axes; the runtime takes at most {MAX_RANK}",
                    tensor.name,
                    tensor.shape.len()
                ));
            }
            if let Some(d) = tensor.shape.iter().flat_map(|a| a.dims()).find(|d| !dim_ok(**d)) {
                return fail(format!(
                    "tensor `{}` refers to dim {d}, but the plan has {}",
                    tensor.name,
                    self.dims.len()
                ));
            }
            // A launch chooses its split counts again once the device is known, after the
            // tensors were checked against the extents: no tensor may depend on one.
            if let Some(d) =
                tensor.shape.iter().flat_map(|a| a.dims()).find(|d| self.dims[usize::from(**d)].derive.is_some())
            {
                return fail(format!(
                    "tensor `{}` is sized by `{}`, a split count the launcher derives",
                    tensor.name,
                    self.dims[usize::from(*d)].name
                ));
            }
        }
        let product_ok = |p: &Product| {
            p.0.iter().all(|f| match *f {
                Factor::Const(_) => true,
                Factor::Dim(d) => dim_ok(d),
                Factor::CeilDiv(d, t) => dim_ok(d) && t > 0,
                Factor::Slots { total, batch, tile } => dim_ok(total) && dim_ok(batch) && tile > 0,
            })
        };
        for (i, ws) in self.workspaces.iter().enumerate() {
            if !product_ok(&ws.len) {
                return fail(format!("workspace {i} has a size that refers to a missing dim or divides by zero"));
            }
        }
        for launch in self.launches {
            let symbol = launch.symbol;
            if symbol.is_empty() || symbol.contains('\0') {
                return fail(format!("launch symbol {symbol:?} is empty or contains a NUL byte"));
            }
            if launch.threads == 0 || launch.threads > MAX_THREADS {
                return fail(format!("launch `{symbol}` has {} threads per block (1..=1024)", launch.threads));
            }
            if launch.params.len() > MAX_PARAMS {
                return fail(format!(
                    "launch `{symbol}` has {} parameters (at most {MAX_PARAMS})",
                    launch.params.len()
                ));
            }
            if !launch.grid.iter().all(product_ok) {
                return fail(format!("launch `{symbol}` has a grid that refers to a missing dim or divides by zero"));
            }
            for param in launch.params {
                let (what, i, len) = match *param {
                    Param::Input(i) => ("input", i, self.inputs.len()),
                    Param::Output(i) => ("output", i, self.outputs.len()),
                    Param::Workspace(i) => ("workspace", i, self.workspaces.len()),
                    Param::Extent(i) => ("dim", i, self.dims.len()),
                    Param::InputStride(i, _) => ("input", i, self.inputs.len()),
                    Param::OutputStride(i, _) => ("output", i, self.outputs.len()),
                    Param::Scalar(i) => ("input", i, self.inputs.len()),
                };
                if usize::from(i) >= len {
                    return fail(format!("launch `{symbol}` passes {what} {i}, but the plan has {len}"));
                }
                if let Param::Scalar(i) = *param {
                    let spec = &self.inputs[usize::from(i)];
                    if !spec.shape.is_empty() || spec.dtype == DType::I32 {
                        return fail(format!(
                            "launch `{symbol}` passes `{}` by value, but it is not a scalar",
                            spec.name
                        ));
                    }
                }
                // A stride names an axis of its tensor, and never the last, which is contiguous.
                let strided = match *param {
                    Param::InputStride(i, a) => Some((&self.inputs[usize::from(i)], a)),
                    Param::OutputStride(i, a) => Some((&self.outputs[usize::from(i)], a)),
                    _ => None,
                };
                if let Some((tensor, a)) = strided.filter(|(t, a)| usize::from(*a) + 1 >= t.shape.len()) {
                    return fail(format!(
                        "launch `{symbol}` passes a stride of axis {a} of `{}`, which has {} axes",
                        tensor.name,
                        tensor.shape.len()
                    ));
                }
            }
        }
        for dim in self.dims {
            if let Some(Derive::SplitCount { launch: Some(l), .. }) = dim.derive {
                if usize::from(l) >= self.launches.len() {
                    return fail(format!(
                        "the split count `{}` names launch {l}, but the plan has {}",
                        dim.name,
                        self.launches.len()
                    ));
                }
            }
        }
        for table in self.tables {
            // The dims are chained, not collected: a launch validates its plan on the hot
            // path, which allocates nothing.
            let (input, batch, bound, pages): (u16, u16, Option<u16>, &[u16]) = match *table {
                Table::Indptr { input, batch, bound } => (input, batch, bound, &[]),
                Table::Pages { input, indptr, batch, pages } => {
                    if usize::from(indptr) >= self.inputs.len() {
                        return fail(format!(
                            "a page table names input {indptr}, but the plan has {}",
                            self.inputs.len()
                        ));
                    }
                    (input, batch, None, pages)
                }
                Table::LastPage { input, indptr, batch, .. } => {
                    if usize::from(indptr) >= self.inputs.len() {
                        return fail(format!("a table names input {indptr}, but the plan has {}", self.inputs.len()));
                    }
                    (input, batch, None, &[])
                }
            };
            match self.inputs.get(usize::from(input)) {
                Some(spec) if spec.dtype == DType::I32 && spec.shape.len() == 1 => {}
                _ => return fail(format!("table input {input} is not a one-axis i32 input")),
            }
            if let Some(d) = std::iter::once(batch).chain(bound).chain(pages.iter().copied()).find(|d| !dim_ok(*d)) {
                return fail(format!("a table refers to dim {d}, but the plan has {}", self.dims.len()));
            }
        }
        Ok(())
    }

    /// The dynamic dims, in the order their extents are passed.
    pub fn dynamic_dims(&self) -> impl Iterator<Item = &'static DimSpec> {
        self.dims.iter().filter(|d| d.dynamic)
    }
}

/// Builds the full extent vector (one entry per dim of `plan.dims`) from the static extents and
/// the `dynamic` values, given in the order the dynamic dims appear in `plan.dims`.
///
/// Every extent must lie in `1..=2^31-1`, and every input and output must stay within 2^48
/// elements; the plan itself is validated too.
pub fn extents(plan: &LaunchPlan, dynamic: &[usize]) -> Result<Vec<u64>, Error> {
    Extents::new(plan, dynamic).map(|e| e.to_vec())
}

/// The extent of every dim of a plan for one call, held inline: computing them allocates
/// nothing, which the hot launch path relies on.
#[derive(Clone, Copy)]
pub struct Extents {
    len: usize,
    values: [u64; MAX_DIMS],
}

impl Extents {
    /// What [`extents`] computes, without allocating (except for the message of an error).
    pub fn new(plan: &LaunchPlan, dynamic: &[usize]) -> Result<Self, Error> {
        Self::on(plan, dynamic, None)
    }

    /// [`Extents::new`] with the split counts chosen for a device of `sms` SMs when given and
    /// the plan's estimate of the blocks an SM holds (see [`derive_extents_on`]).
    pub fn on(plan: &LaunchPlan, dynamic: &[usize], sms: Option<u32>) -> Result<Self, Error> {
        Self::for_device(plan, dynamic, Device { sms, resident: &[] })
    }

    /// [`Extents::new`] with the split counts chosen for `device` ([`derive_extents_on`]).
    pub fn for_device(plan: &LaunchPlan, dynamic: &[usize], device: Device<'_>) -> Result<Self, Error> {
        plan.validate()?;
        let expected = plan.dynamic_dims().count();
        if dynamic.len() != expected {
            let names: Vec<&str> = plan.dynamic_dims().map(|d| d.name).collect();
            return Err(Error::DynamicCount {
                kernel: plan.kernel,
                names: names.join(", "),
                expected,
                got: dynamic.len(),
            });
        }
        let mut given = dynamic.iter();
        let mut out = Extents { len: plan.dims.len(), values: [0; MAX_DIMS] };
        // `validate` bounds the dim count by MAX_DIMS, so the zip covers every dim.
        for (dim, slot) in plan.dims.iter().zip(&mut out.values).filter(|(d, _)| d.derive.is_none()) {
            // The count check above guarantees one given value per dynamic dim.
            let value = match dim.dynamic.then(|| given.next()).flatten() {
                Some(&v) => u64::try_from(v).map_err(|_| Error::InvalidExtent {
                    dim: dim.name,
                    value: u64::MAX,
                    reason: "extents must be at most 2^31-1",
                })?,
                None => dim.value,
            };
            check_extent(dim.name, value)?;
            *slot = value;
        }
        let len = out.len;
        derive_extents_on(plan, &mut out.values[..len], device);
        for tensor in plan.inputs.iter().chain(plan.outputs) {
            tensor.elements(plan, &out)?;
        }
        Ok(out)
    }
}

impl Extents {
    /// These extents with every split count the launcher derives at its largest
    /// ([`SPLIT_MAX`]): what a workspace sized once must hold for every launch up to them,
    /// since a smaller batch can take more parts per request.
    pub fn with_largest_splits(mut self, plan: &LaunchPlan) -> Self {
        for (dim, slot) in plan.dims.iter().zip(&mut self.values) {
            if dim.derive.is_some() {
                *slot = SPLIT_MAX;
            }
        }
        self
    }
}

impl Extents {
    /// These extents with their split counts chosen again for `device`, from the extents they
    /// were derived from (which stay as they are).
    pub fn rederived(mut self, plan: &LaunchPlan, device: Device<'_>) -> Self {
        derive_extents_on(plan, &mut self.values[..self.len], device);
        self
    }

    /// These extents with every split count pinned to `count` ([`pin_split_count`]).
    pub fn with_split_count(mut self, plan: &LaunchPlan, count: u64) -> Result<Self, Error> {
        pin_split_count(plan, &mut self.values[..self.len], count)?;
        Ok(self)
    }
}

impl std::ops::Deref for Extents {
    type Target = [u64];

    fn deref(&self) -> &[u64] {
        &self.values[..self.len]
    }
}

impl fmt::Debug for Extents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The byte offset of each workspace inside one buffer holding them all, each aligned to
/// [`WORKSPACE_ALIGN`], and the buffer's total size; without allocating.
#[derive(Clone, Copy)]
pub struct WorkspaceLayout {
    len: usize,
    offsets: [u64; MAX_WORKSPACES],
    sizes: [u64; MAX_WORKSPACES],
    /// The bytes a buffer must have to hold every workspace (0 when none is needed).
    pub total: u64,
}

impl WorkspaceLayout {
    /// The layout for these extents; an `Overflow` error when a size does not fit in `u64`.
    pub fn new(plan: &LaunchPlan, extents: &[u64]) -> Result<Self, Error> {
        let kernel = plan.kernel;
        if plan.workspaces.len() > MAX_WORKSPACES {
            return Err(Error::InvalidPlan { kernel, reason: format!("more than {MAX_WORKSPACES} workspaces") });
        }
        let mut layout = WorkspaceLayout {
            len: plan.workspaces.len(),
            offsets: [0; MAX_WORKSPACES],
            sizes: [0; MAX_WORKSPACES],
            total: 0,
        };
        for (i, ws) in plan.workspaces.iter().enumerate() {
            let overflow = || Error::Overflow { kernel, quantity: format!("the size of workspace {i}") };
            let bytes = ws.bytes(extents).ok_or_else(overflow)?;
            let start = layout.total.checked_next_multiple_of(WORKSPACE_ALIGN).ok_or_else(overflow)?;
            layout.offsets[i] = start;
            layout.sizes[i] = bytes;
            layout.total = start.checked_add(bytes).ok_or_else(overflow)?;
        }
        Ok(layout)
    }

    /// The byte offset of workspace `i` and its size, or `None` for an index out of range.
    pub fn get(&self, i: usize) -> Option<(u64, u64)> {
        (i < self.len).then(|| (self.offsets[i], self.sizes[i]))
    }
}

impl fmt::Debug for WorkspaceLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<(u64, u64)> = (0..self.len).filter_map(|i| self.get(i)).collect();
        f.debug_struct("WorkspaceLayout").field("parts", &parts).field("total", &self.total).finish()
    }
}

/// The dynamic extents, in declaration order, that the shapes of the inputs imply: what a
/// framework adapter passes as `dims` when its tensors carry their shapes.
///
/// Each shape must have the declared rank, a static axis the declared extent, a broadcast
/// axis extent 1, and every axis of one dynamic dim the same extent across all inputs. A
/// dynamic dim that no input uses cannot be inferred and is an error. The errors name the
/// argument, the axis and both extents.
pub fn dynamic_from_shapes(plan: &LaunchPlan, shapes: &[&[usize]]) -> Result<Vec<usize>, Error> {
    plan.validate()?;
    if shapes.len() != plan.inputs.len() {
        return Err(Error::InvalidArguments {
            kernel: plan.kernel,
            message: format!("{} inputs were passed, but the kernel declares {}", shapes.len(), plan.inputs.len()),
        });
    }
    // For each dim: the extent seen so far and the argument it came from.
    let mut bound: Vec<Option<(usize, &'static str)>> = vec![None; plan.dims.len()];
    for (spec, shape) in plan.inputs.iter().zip(shapes) {
        let arg = spec.name;
        if shape.len() != spec.shape.len() {
            return Err(Error::Argument {
                arg,
                message: format!(
                    "has shape {shape:?} with {} axes, but the kernel declares {} axes {}",
                    shape.len(),
                    spec.shape.len(),
                    show_shape(plan, spec)
                ),
            });
        }
        for (axis, (declared, &extent)) in spec.shape.iter().zip(shape.iter()).enumerate() {
            let mismatch = |want: String| Error::Argument {
                arg,
                message: format!(
                    "has shape {shape:?}, but the kernel declares {}: axis {axis} must be {want}",
                    show_shape(plan, spec)
                ),
            };
            // A merge of dims: its one unknown dynamic member (if any) is what the extent leaves
            // after the others; an indptr's dim is its length less one.
            let (d, extent) = match *declared {
                Axis::Merged(ds) => {
                    let mut known = 1usize;
                    let mut unknown = None;
                    for &m in ds {
                        let dim = &plan.dims[usize::from(m)];
                        match (dim.dynamic, bound[usize::from(m)]) {
                            (false, _) => known = known.saturating_mul(dim.value as usize),
                            (true, Some((v, _))) => known = known.saturating_mul(v),
                            (true, None) if unknown.is_none() => unknown = Some(m),
                            (true, None) => {
                                return Err(mismatch(format!(
                                "the product of several dims, of which more than one ({} and {}) no other input gives",
                                plan.dims[usize::from(unknown.unwrap_or(m))].name,
                                dim.name
                            )))
                            }
                        }
                    }
                    match unknown {
                        Some(m) if known > 0 && extent % known == 0 => (m, extent / known),
                        None if extent == known => continue,
                        _ => return Err(mismatch(format!("a multiple of {known}, the product of its merged dims"))),
                    }
                }
                Axis::PlusOne(d) if extent >= 1 => (d, extent - 1),
                Axis::PlusOne(_) => return Err(mismatch("at least 1 (an indptr over the requests)".into())),
                Axis::One if extent != 1 => return Err(mismatch("1".into())),
                Axis::One => continue,
                Axis::Dim(d) => (d, extent),
            };
            let whole = shape[axis];
            let mismatch = |want: String| Error::Argument {
                arg,
                message: if whole == extent {
                    format!(
                        "has shape {shape:?}, but the kernel declares {}: axis {axis} must be {want}",
                        show_shape(plan, spec)
                    )
                } else {
                    format!(
                        "has shape {shape:?}, but the kernel declares {}: axis {axis} gives `{}` = {extent}, which must be {want}",
                        show_shape(plan, spec),
                        plan.dims[usize::from(d)].name
                    )
                },
            };
            let dim = &plan.dims[usize::from(d)];
            let slot = &mut bound[usize::from(d)];
            if !dim.dynamic {
                if u64::try_from(extent).ok() != Some(dim.value) {
                    return Err(mismatch(format!("{} (`{}`)", dim.value, dim.name)));
                }
            } else if let Some((seen, from)) = *slot {
                if seen != extent {
                    return Err(mismatch(format!("{seen}, the extent of `{}` in `{from}`", dim.name)));
                }
            } else {
                *slot = Some((extent, arg));
            }
        }
    }
    plan.dims
        .iter()
        .zip(&bound)
        .filter(|(dim, _)| dim.dynamic)
        .map(|(dim, slot)| {
            slot.map(|(extent, _)| extent).ok_or_else(|| Error::InvalidArguments {
                kernel: plan.kernel,
                message: format!(
                    "dynamic dim `{}` appears in no input, so its extent cannot be read from the inputs' shapes",
                    dim.name
                ),
            })
        })
        .collect()
}

/// A declared shape with its dim names: `[h, s, 1]`, `[total, (g r), d]`, `[n + 1]`.
pub(crate) fn show_shape(plan: &LaunchPlan, spec: &TensorSpec) -> String {
    let name = |d: &u16| plan.dims.get(usize::from(*d)).map_or("?", |dim| dim.name);
    let names: Vec<String> = spec
        .shape
        .iter()
        .map(|a| match *a {
            Axis::One => "1".to_string(),
            Axis::Dim(d) => name(&d).to_string(),
            Axis::Merged(ds) => format!("({})", ds.iter().map(name).collect::<Vec<_>>().join(" ")),
            Axis::PlusOne(d) => format!("{} + 1", name(&d)),
        })
        .collect();
    format!("[{}]", names.join(", "))
}

/// Checks the index tensors of a call whose inputs are in host memory: `table(i)` gives input
/// `i`'s entries. Every rule of [`LaunchPlan::tables`] must hold; the error names the tensor,
/// the entry and what it should have been.
pub fn check_tables<'t>(
    plan: &LaunchPlan,
    extents: &[u64],
    table: &dyn Fn(usize) -> Option<&'t [i32]>,
) -> Result<(), Error> {
    let ext = |d: u16| extents.get(usize::from(d)).copied().unwrap_or(0);
    let get = |i: u16| -> Result<(&'static str, &[i32]), Error> {
        let spec = plan.inputs.get(usize::from(i)).ok_or_else(|| Error::InvalidPlan {
            kernel: plan.kernel,
            reason: format!("a table names input {i}, which the plan does not have"),
        })?;
        let data = table(usize::from(i)).ok_or_else(|| Error::InvalidArguments {
            kernel: plan.kernel,
            message: format!("index tensor `{}` is not available to check", spec.name),
        })?;
        Ok((spec.name, data))
    };
    let bad = |arg: &'static str, message: String| Err(Error::Table { arg, message });
    // The owned range of request `b` of an indptr, already checked.
    let range = |p: &[i32], b: usize| (p[b] as usize, p[b + 1] as usize);
    for t in plan.tables {
        match *t {
            Table::Indptr { input, batch, bound } => {
                let (arg, p) = get(input)?;
                let n = ext(batch) as usize;
                if p.len() < n + 1 {
                    return bad(arg, format!("has {} entries; an indptr over {n} requests has {}", p.len(), n + 1));
                }
                let limit = bound.map(ext);
                for (b, w) in p[..=n].windows(2).enumerate() {
                    if w[0] < 0 {
                        return bad(arg, format!("entry {b} is {}; offsets are not negative", w[0]));
                    }
                    if w[1] < w[0] {
                        return bad(
                            arg,
                            format!(
                                "entry {} is {}, below entry {b} ({}): an indptr never decreases",
                                b + 1,
                                w[1],
                                w[0]
                            ),
                        );
                    }
                }
                if let Some(limit) = limit {
                    if p[n] as u64 > limit {
                        return bad(arg, format!("entry {n} is {}, past the {limit} entries it indexes", p[n]));
                    }
                }
            }
            Table::Pages { input, indptr, batch, pages } => {
                let (arg, idx) = get(input)?;
                let (_, p) = get(indptr)?;
                let n = ext(batch) as usize;
                let pool = pages.iter().map(|d| ext(*d)).min().unwrap_or(0);
                for b in 0..n.min(p.len().saturating_sub(1)) {
                    let (start, end) = range(p, b);
                    for (k, &pg) in idx.get(start..end).unwrap_or(&[]).iter().enumerate() {
                        if pg < 0 || pg as u64 >= pool {
                            return bad(
                                arg,
                                format!(
                                    "entry {} (page {k} of request {b}) is {pg}, outside the pool of {pool} pages",
                                    start + k
                                ),
                            );
                        }
                    }
                }
            }
            Table::LastPage { input, indptr, batch, page_size } => {
                let (arg, last) = get(input)?;
                let (_, p) = get(indptr)?;
                let n = ext(batch) as usize;
                let requests = n.min(p.len().saturating_sub(1));
                for (b, &l) in last.iter().enumerate().take(requests) {
                    let (start, end) = range(p, b);
                    if end > start && !(1..=page_size as i64).contains(&i64::from(l)) {
                        return bad(arg, format!("entry {b} is {l}; a last page holds 1 to {page_size} entries"));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Rejects an extent of zero or above [`MAX_EXTENT`].
pub fn check_extent(dim: &'static str, value: u64) -> Result<(), Error> {
    let reason = if value == 0 {
        "extents must be at least 1"
    } else if value > MAX_EXTENT {
        "extents must be at most 2^31-1"
    } else {
        return Ok(());
    };
    Err(Error::InvalidExtent { dim, value, reason })
}

/// Checks that argument `name` has exactly `expected` elements.
pub fn check_len(name: &'static str, got: usize, expected: u64) -> Result<(), Error> {
    if u64::try_from(got).is_ok_and(|g| g == expected) {
        Ok(())
    } else {
        Err(Error::ShapeMismatch { arg: name, expected, got })
    }
}

/// Whether an argument is one of the plan's inputs or outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Input,
    Output,
}

impl Role {
    pub(crate) fn word(self) -> &'static str {
        match self {
            Role::Input => "input",
            Role::Output => "output",
        }
    }
}

/// The declaration of the `index`-th input or output, or an error when the plan has none.
pub(crate) fn spec(plan: &LaunchPlan, role: Role, index: usize) -> Result<&'static TensorSpec, Error> {
    let specs = match role {
        Role::Input => plan.inputs,
        Role::Output => plan.outputs,
    };
    specs.get(index).ok_or_else(|| Error::InvalidArguments {
        kernel: plan.kernel,
        message: format!("{} {}s were passed, but the kernel declares {}", index + 1, role.word(), specs.len()),
    })
}

/// Checks the `index`-th input or output passed to a typed builder as a view: that the plan
/// declares it with this element type. Returns the argument's declared name.
pub(crate) fn check_dtype(plan: &LaunchPlan, role: Role, index: usize, dtype: DType) -> Result<&'static str, Error> {
    let spec = spec(plan, role, index)?;
    if spec.dtype != dtype {
        return Err(Error::DTypeMismatch { arg: spec.name, expected: spec.dtype, got: dtype });
    }
    Ok(spec.name)
}

/// Checks the `index`-th input or output passed to a typed builder as a dense tensor: that the
/// plan declares it, and that its element type and length match the declaration for these
/// extents. Returns the argument's declared name.
pub(crate) fn check_arg(
    plan: &LaunchPlan,
    extents: &[u64],
    role: Role,
    index: usize,
    dtype: DType,
    len: usize,
) -> Result<&'static str, Error> {
    let name = check_dtype(plan, role, index, dtype)?;
    if spec(plan, role, index)?.shape.is_empty() {
        return Err(Error::Argument { arg: name, message: "is a scalar: pass it by value".into() });
    }
    check_len(name, len, spec(plan, role, index)?.elements(plan, extents)?)?;
    Ok(name)
}

/// Checks the `index`-th input passed to a typed builder as a scalar: that the plan declares a
/// scalar (`[]`) there. Returns the value as the kernel sees it: rounded to the declared dtype
/// (kernels compute in f32, and an `f16[]` scalar holds an f16 value).
pub(crate) fn check_scalar(plan: &LaunchPlan, index: usize, value: f32) -> Result<f32, Error> {
    let spec = spec(plan, Role::Input, index)?;
    if !spec.shape.is_empty() || spec.dtype == DType::I32 {
        return Err(Error::Argument {
            arg: spec.name,
            message: format!("is a tensor ({}{}), not a scalar", spec.dtype, show_shape(plan, spec)),
        });
    }
    Ok(match spec.dtype {
        DType::F16 => half::f16::from_f32(value).to_f32(),
        DType::BF16 => half::bf16::from_f32(value).to_f32(),
        _ => value,
    })
}

/// Checks that a builder received every declared input and output before launching.
pub(crate) fn check_complete(plan: &LaunchPlan, inputs: usize, outputs: usize) -> Result<(), Error> {
    for (role, got, specs) in [(Role::Input, inputs, plan.inputs), (Role::Output, outputs, plan.outputs)] {
        if let Some(missing) = specs.get(got) {
            return Err(Error::InvalidArguments {
                kernel: plan.kernel,
                message: format!(
                    "{} `{}` was not passed ({} of {} given)",
                    role.word(),
                    missing.name,
                    got,
                    specs.len()
                ),
            });
        }
    }
    Ok(())
}

/// Checks the executors' common preconditions: a valid plan, one extent per dim, and one
/// pointer per declared input and output.
pub(crate) fn check_call(plan: &LaunchPlan, extents: &[u64], inputs: usize, outputs: usize) -> Result<(), Error> {
    plan.validate()?;
    let fail = |message: String| Err(Error::InvalidArguments { kernel: plan.kernel, message });
    if extents.len() != plan.dims.len() {
        return fail(format!("{} extents were given, but the kernel has {} dims", extents.len(), plan.dims.len()));
    }
    if inputs != plan.inputs.len() || outputs != plan.outputs.len() {
        return fail(format!(
            "{inputs} inputs and {outputs} outputs were given, but the kernel declares {} and {}",
            plan.inputs.len(),
            plan.outputs.len()
        ));
    }
    for (dim, &value) in plan.dims.iter().zip(extents) {
        check_extent(dim.name, value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `q: f16[h, s, d]` and `k: f16[h, l, d]` with dynamic `s` and `l`, and a broadcast axis.
    static PLAN: LaunchPlan = LaunchPlan {
        kernel: "attn",
        dims: &[
            DimSpec { name: "h", value: 2, dynamic: false, derive: None },
            DimSpec { name: "s", value: 64, dynamic: true, derive: None },
            DimSpec { name: "l", value: 128, dynamic: true, derive: None },
            DimSpec { name: "d", value: 8, dynamic: false, derive: None },
        ],
        inputs: &[
            TensorSpec { name: "q", dtype: DType::F16, shape: &[Axis::Dim(0), Axis::Dim(1), Axis::Dim(3)] },
            TensorSpec { name: "k", dtype: DType::F16, shape: &[Axis::Dim(0), Axis::Dim(2), Axis::Dim(3)] },
            TensorSpec { name: "m", dtype: DType::F32, shape: &[Axis::One, Axis::Dim(2)] },
        ],
        outputs: &[],
        workspaces: &[],
        launches: &[],
        tables: &[],
    };

    #[test]
    fn dynamic_extents_are_read_from_the_shapes() {
        let got = dynamic_from_shapes(&PLAN, &[&[2, 5, 8], &[2, 77, 8], &[1, 77]]).unwrap();
        assert_eq!(got, [5, 77]);
    }

    #[test]
    fn shapes_that_contradict_the_declaration_are_located_errors() {
        let err = |shapes: &[&[usize]]| dynamic_from_shapes(&PLAN, shapes).unwrap_err().to_string();
        assert_eq!(
            err(&[&[2, 5, 8], &[2, 77], &[1, 77]]),
            "argument `k`: has shape [2, 77] with 2 axes, but the kernel declares 3 axes [h, l, d]"
        );
        assert_eq!(
            err(&[&[3, 5, 8], &[2, 77, 8], &[1, 77]]),
            "argument `q`: has shape [3, 5, 8], but the kernel declares [h, s, d]: axis 0 must be 2 (`h`)"
        );
        assert_eq!(
            err(&[&[2, 5, 8], &[2, 77, 8], &[1, 76]]),
            "argument `m`: has shape [1, 76], but the kernel declares [1, l]: axis 1 must be 77, the extent of `l` in `k`"
        );
        assert_eq!(
            err(&[&[2, 5, 8], &[2, 77, 8], &[2, 77]]),
            "argument `m`: has shape [2, 77], but the kernel declares [1, l]: axis 0 must be 1"
        );
        assert_eq!(err(&[&[2, 5, 8]]), "kernel `attn`: 1 inputs were passed, but the kernel declares 3");
    }

    #[test]
    fn a_dynamic_dim_no_input_uses_cannot_be_inferred() {
        static OUT_ONLY: LaunchPlan = LaunchPlan {
            kernel: "fill",
            dims: &[DimSpec { name: "n", value: 4, dynamic: true, derive: None }],
            inputs: &[],
            outputs: &[TensorSpec { name: "y", dtype: DType::F32, shape: &[Axis::Dim(0)] }],
            workspaces: &[],
            launches: &[],
            tables: &[],
        };
        let err = dynamic_from_shapes(&OUT_ONLY, &[]).unwrap_err().to_string();
        assert!(err.contains("dynamic dim `n` appears in no input"), "{err}");
    }

    #[test]
    fn extents_are_computed_inline() {
        let e = Extents::new(&PLAN, &[5, 77]).unwrap();
        assert_eq!(&*e, &[2, 5, 77, 8]);
        assert_eq!(extents(&PLAN, &[5, 77]).unwrap(), [2, 5, 77, 8]);
        assert_eq!(format!("{e:?}"), "[2, 5, 77, 8]");
    }
}

#[cfg(test)]
mod select_tests {
    use super::*;

    const fn launch(symbol: &'static str, smem_bytes: u32) -> KernelLaunch {
        KernelLaunch { symbol, grid: [Product(&[]), Product(&[]), Product(&[])], threads: 128, smem_bytes, params: &[] }
    }

    const fn plan(launches: &'static [KernelLaunch]) -> LaunchPlan {
        LaunchPlan { kernel: "k", dims: &[], inputs: &[], outputs: &[], workspaces: &[], launches, tables: &[] }
    }

    static SM90: LaunchPlan = plan(&[launch("k_0", 200_000), launch("k_1", 4096)]);
    static SM86: LaunchPlan = plan(&[launch("k_sm86_0", 90_000)]);
    static SM80: LaunchPlan = plan(&[launch("k_sm80_0", 139_520)]);
    /// The plans of the default build, newest first, as a generated module lists them.
    static PLANS: [Variant; 3] = [
        Variant { target: "sm_90", min_cc: 90, at: &[], plan: &SM90 },
        Variant { target: "sm_86", min_cc: 86, at: &[], plan: &SM86 },
        Variant { target: "sm_80", min_cc: 80, at: &[], plan: &SM80 },
    ];

    fn pick(cc: (u32, u32), smem: u64) -> Result<&'static str, String> {
        select(&PLANS, cc, smem, &[]).map(|p| p.launches[0].symbol).map_err(|e| e.to_string())
    }

    static B16: LaunchPlan = plan(&[launch("k_0", 1024)]);
    static B64: LaunchPlan = plan(&[launch("k_b64_0", 1024)]);
    static B256: LaunchPlan = plan(&[launch("k_b256_0", 200_000)]);
    static B16_SM80: LaunchPlan = plan(&[launch("k_sm80_0", 1024)]);
    /// A kernel declared `b: dyn 16 | 64 | 256, l: dyn 4096 | 512` for sm_90 and sm_80, where
    /// sm_80's plan is the same at every extent and sm_90's at b=16 is its plan at l=512 too.
    static BY_EXTENT: [Variant; 8] = [
        Variant { target: "sm_90", min_cc: 90, at: &[16, 4096], plan: &B16 },
        Variant { target: "sm_90", min_cc: 90, at: &[16, 512], plan: &B16 },
        Variant { target: "sm_90", min_cc: 90, at: &[64, 4096], plan: &B64 },
        Variant { target: "sm_90", min_cc: 90, at: &[256, 4096], plan: &B256 },
        Variant { target: "sm_80", min_cc: 80, at: &[16, 4096], plan: &B16_SM80 },
        Variant { target: "sm_80", min_cc: 80, at: &[64, 4096], plan: &B16_SM80 },
        Variant { target: "sm_80", min_cc: 80, at: &[256, 4096], plan: &B16_SM80 },
        Variant { target: "sm_80", min_cc: 80, at: &[16, 512], plan: &B16_SM80 },
    ];

    fn pick_at(cc: (u32, u32), smem: u64, b: usize, l: usize) -> Result<&'static str, String> {
        select(&BY_EXTENT, cc, smem, &[b, l]).map(|p| p.launches[0].symbol).map_err(|e| e.to_string())
    }

    #[test]
    fn a_call_runs_the_plan_made_nearest_to_its_extents() {
        // The planned extents themselves.
        assert_eq!(pick_at((9, 0), 232_448, 16, 4096), Ok("k_0"));
        assert_eq!(pick_at((9, 0), 232_448, 64, 4096), Ok("k_b64_0"));
        assert_eq!(pick_at((9, 0), 232_448, 256, 4096), Ok("k_b256_0"));
        // Nearest on the log scale: 31 is nearer 16 than 64 (ln 31/16 = 0.66 < ln 64/31 = 0.72),
        // 33 nearer 64; 128 is as far from 64 as from 256, and the first listed wins.
        assert_eq!(pick_at((9, 0), 232_448, 31, 4096), Ok("k_0"));
        assert_eq!(pick_at((9, 0), 232_448, 33, 4096), Ok("k_b64_0"));
        assert_eq!(pick_at((9, 0), 232_448, 128, 4096), Ok("k_b64_0"));
        assert_eq!(pick_at((9, 0), 232_448, 100_000, 4096), Ok("k_b256_0"));
        // Every dynamic dim counts: b=40 with a short context is nearest (16, 512).
        assert_eq!(pick_at((9, 0), 232_448, 40, 600), Ok("k_0"));
        assert_eq!(pick_at((9, 0), 232_448, 40, 4000), Ok("k_b64_0"));
        // A zero extent is measured as 1 (it launches nothing, but must not pick NaN).
        assert_eq!(pick_at((9, 0), 232_448, 0, 4096), Ok("k_0"));
        // sm_90's b=256 plan does not fit a GPU with 99 KiB per block: that GPU takes a
        // target all of whose plans fit, whatever the extents.
        assert_eq!(pick_at((9, 0), 101_376, 16, 4096), Ok("k_sm80_0"));
        assert_eq!(pick_at((8, 0), 166_912, 256, 4096), Ok("k_sm80_0"));
        assert_eq!(for_device(&BY_EXTENT, (9, 0), 232_448).map(<[Variant]>::len).ok(), Some(4));
        assert_eq!(for_device(&BY_EXTENT, (8, 6), 101_376).map(<[Variant]>::len).ok(), Some(4));
    }

    #[test]
    fn each_gpu_runs_the_plan_made_for_it() {
        // H100/H200, A100, RTX 3090, Jetson Orin, RTX 4090, with their opt-in limits.
        assert_eq!(pick((9, 0), 232_448), Ok("k_0"));
        assert_eq!(pick((8, 0), 166_912), Ok("k_sm80_0"));
        assert_eq!(pick((8, 6), 101_376), Ok("k_sm86_0"));
        assert_eq!(pick((8, 7), 166_912), Ok("k_sm86_0"));
        assert_eq!(pick((8, 9), 101_376), Ok("k_sm86_0"));
        // Newer than every target: B200 runs the newest plan; an RTX 5090 (99 KiB) the newest
        // one that fits it.
        assert_eq!(pick((10, 0), 232_448), Ok("k_0"));
        assert_eq!(pick((12, 0), 101_376), Ok("k_sm86_0"));
    }

    #[test]
    fn a_gpu_no_plan_fits_is_told_what_each_needs() {
        let err = pick((8, 0), 65_536).unwrap_err();
        assert!(err.contains("kernel `k` has no plan for this GPU (compute capability 8.0, 65536 bytes"), "{err}");
        assert!(err.contains("sm_90 (compute capability 9.0 or newer, 200000 bytes"), "{err}");
        assert!(err.contains("sm_80 (compute capability 8.0 or newer, 139520 bytes"), "{err}");
        assert!(select(&[], (9, 0), 232_448, &[]).is_err());
        assert_eq!(SM90.smem_bytes(), 200_000);
    }
}
