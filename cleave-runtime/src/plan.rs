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
}

/// One dim of a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DimSpec {
    /// The declared name.
    pub name: &'static str,
    /// The static extent, or the representative one the schedule was chosen for when `dynamic`.
    pub value: u64,
    /// Whether the extent is a run-time argument of the launcher.
    pub dynamic: bool,
}

/// One axis of a tensor's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    /// A broadcast axis of extent 1.
    One,
    /// The extent of `LaunchPlan::dims[i]`.
    Dim(u16),
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
}

impl DType {
    /// The size of one element in bytes.
    pub const fn size_bytes(self) -> u32 {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 => 4,
        }
    }

    /// The name used in declarations (`f16`, `bf16`, `f32`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
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
    /// The shape, outermost axis first; the tensor is dense and row-major.
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
            let Axis::Dim(d) = *axis else { continue };
            let (Some(dim), Some(&extent)) = (plan.dims.get(usize::from(d)), extents.get(usize::from(d))) else {
                return Err(Error::InvalidPlan {
                    kernel: plan.kernel,
                    reason: format!("tensor `{}` refers to dim {d}, which has no extent", self.name),
                });
            };
            count = match count.checked_mul(extent) {
                Some(c) if c <= MAX_TENSOR_ELEMENTS => c,
                _ => {
                    return Err(Error::InvalidExtent {
                        dim: dim.name,
                        value: extent,
                        reason: "a tensor using this dim would exceed 2^48 elements",
                    })
                }
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
            if let Some(Axis::Dim(d)) = tensor.shape.iter().find(|a| matches!(a, Axis::Dim(d) if !dim_ok(*d))) {
                return fail(format!(
                    "tensor `{}` refers to dim {d}, but the plan has {}",
                    tensor.name,
                    self.dims.len()
                ));
            }
        }
        let product_ok = |p: &Product| {
            p.0.iter().all(|f| match *f {
                Factor::Const(_) => true,
                Factor::Dim(d) => dim_ok(d),
                Factor::CeilDiv(d, t) => dim_ok(d) && t > 0,
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
                };
                if usize::from(i) >= len {
                    return fail(format!("launch `{symbol}` passes {what} {i}, but the plan has {len}"));
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
        for (dim, slot) in plan.dims.iter().zip(&mut out.values) {
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
        for tensor in plan.inputs.iter().chain(plan.outputs) {
            tensor.elements(plan, &out)?;
        }
        Ok(out)
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
            match *declared {
                Axis::One if extent != 1 => return Err(mismatch("1".into())),
                Axis::One => {}
                Axis::Dim(d) => {
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

/// A declared shape with its dim names: `[h, s, 1]`.
fn show_shape(plan: &LaunchPlan, spec: &TensorSpec) -> String {
    let names: Vec<&str> = spec
        .shape
        .iter()
        .map(|a| match *a {
            Axis::One => "1",
            Axis::Dim(d) => plan.dims.get(usize::from(d)).map_or("?", |dim| dim.name),
        })
        .collect();
    format!("[{}]", names.join(", "))
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
    check_len(name, len, spec(plan, role, index)?.elements(plan, extents)?)?;
    Ok(name)
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
            DimSpec { name: "h", value: 2, dynamic: false },
            DimSpec { name: "s", value: 64, dynamic: true },
            DimSpec { name: "l", value: 128, dynamic: true },
            DimSpec { name: "d", value: 8, dynamic: false },
        ],
        inputs: &[
            TensorSpec { name: "q", dtype: DType::F16, shape: &[Axis::Dim(0), Axis::Dim(1), Axis::Dim(3)] },
            TensorSpec { name: "k", dtype: DType::F16, shape: &[Axis::Dim(0), Axis::Dim(2), Axis::Dim(3)] },
            TensorSpec { name: "m", dtype: DType::F32, shape: &[Axis::One, Axis::Dim(2)] },
        ],
        outputs: &[],
        workspaces: &[],
        launches: &[],
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
            dims: &[DimSpec { name: "n", value: 4, dynamic: true }],
            inputs: &[],
            outputs: &[TensorSpec { name: "y", dtype: DType::F32, shape: &[Axis::Dim(0)] }],
            workspaces: &[],
            launches: &[],
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
