//! The one error type every generated launcher returns.

use crate::plan::DType;

/// Why a launch (GPU or host emulation) did not happen or did not complete.
///
/// Every message names the kernel or argument involved and, where a length or extent is wrong,
/// the value that was expected, so that a caller can fix the call without reading generated
/// code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `libcuda` could not be loaded, so no CUDA call can be made.
    #[error(
        "the CUDA driver library (libcuda) could not be loaded: install the NVIDIA driver, \
         or use the host-emulation backend (`run_host`)"
    )]
    NoDriver,

    /// The driver is present but there is no device with this ordinal.
    #[error("no CUDA device with ordinal {ordinal} ({count} visible)")]
    NoDevice {
        /// The device ordinal that was asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: usize,
    },

    /// The driver failed to count or open devices.
    #[error("could not open CUDA device {ordinal}: {message}")]
    Device {
        /// The device ordinal that was asked for.
        ordinal: usize,
        /// The failed step and the driver's error.
        message: String,
    },

    /// The device cannot run the embedded kernels.
    #[error(
        "the GPU has compute capability {}.{} but the kernels were built for {built_for}; {}",
        have.0,
        have.1,
        arch_hint(*have)
    )]
    UnsupportedArch {
        /// The device's compute capability (major, minor).
        have: (u32, u32),
        /// The architectures the embedded fatbin holds code for.
        built_for: &'static str,
    },

    /// None of a kernel's plans suits the device: each is meant for a newer GPU or needs more
    /// shared memory per block than it allows.
    #[error(
        "kernel `{kernel}` has no plan for this GPU (compute capability {}.{}, {smem_per_block} bytes of \
         shared memory per block); its plans: {plans}. Rebuild with CUDA_COMPUTE_CAP including this GPU's \
         architecture",
        have.0,
        have.1
    )]
    NoPlanFits {
        /// The declared kernel name.
        kernel: &'static str,
        /// The device's compute capability (major, minor).
        have: (u32, u32),
        /// The shared memory one block may opt in to on the device.
        smem_per_block: u64,
        /// Each plan and what it needs.
        plans: String,
    },

    /// No GPU binary was embedded because nvcc was missing when the crate was built.
    #[error(
        "kernel `{kernel}` has no GPU binary: the kernels were generated without nvcc; \
         install CUDA (or set NVCC) and rebuild. The host-emulation backend still works"
    )]
    NotBuilt {
        /// The declared kernel name.
        kernel: &'static str,
    },

    /// A buffer does not have the number of elements the extents imply.
    #[error("argument `{arg}` has {got} elements, but the given extents need exactly {expected}")]
    ShapeMismatch {
        /// The argument's declared name.
        arg: &'static str,
        /// The element count the extents imply.
        expected: u64,
        /// The element count that was passed.
        got: usize,
    },

    /// A tensor handed to a framework adapter (candle) does not fit the declaration: its rank,
    /// an extent, its element type, its layout or its device.
    #[error("argument `{arg}`: {message}")]
    Argument {
        /// The argument's declared name.
        arg: &'static str,
        /// What is wrong, with the shape or type that was passed.
        message: String,
    },

    /// A strided view of a tensor does not fit its buffer or its kernels: a stride count other
    /// than the rank, a last axis that is not contiguous, a view past the buffer's end, a
    /// misaligned start or stride, or an output that overlaps itself.
    #[error("argument `{arg}`: {message}")]
    View {
        /// The argument's declared name.
        arg: &'static str,
        /// What is wrong, with the strides that were passed.
        message: String,
    },

    /// An index tensor (a ragged dim's indptr, a page table) breaks its rules: an indptr that
    /// decreases or points past the rows it indexes, a page number outside the pool.
    #[error("index tensor `{arg}`: {message}")]
    Table {
        /// The argument's declared name.
        arg: &'static str,
        /// Which entry is wrong, and why.
        message: String,
    },

    /// A buffer has a different element type than the declaration.
    #[error("argument `{arg}` holds {got} elements, but the kernel declares it as {expected}")]
    DTypeMismatch {
        /// The argument's declared name.
        arg: &'static str,
        /// The declared element type.
        expected: DType,
        /// The element type that was passed.
        got: DType,
    },

    /// An extent is outside what the kernels can index.
    #[error("extent {value} of dim `{dim}` is invalid: {reason}")]
    InvalidExtent {
        /// The dim's declared name.
        dim: &'static str,
        /// The offending value.
        value: u64,
        /// Why it is rejected.
        reason: &'static str,
    },

    /// The number of dynamic extents does not match the declaration.
    #[error("kernel `{kernel}` has {expected} dynamic dims ({names}), but {got} extents were given")]
    DynamicCount {
        /// The declared kernel name.
        kernel: &'static str,
        /// The names of the dynamic dims, in order.
        names: String,
        /// How many dynamic dims the kernel has.
        expected: usize,
        /// How many extents were passed.
        got: usize,
    },

    /// A grid size or workspace size overflows for the given extents.
    #[error("kernel `{kernel}`: {quantity} overflows for the given extents")]
    Overflow {
        /// The declared kernel name.
        kernel: &'static str,
        /// What overflowed, e.g. "grid.x of launch `attention_split`".
        quantity: String,
    },

    /// A launch would need more blocks along one axis than CUDA allows.
    #[error("kernel `{kernel}`: launch `{launch}` needs {value} blocks along grid.{axis}, above the limit of {limit}")]
    GridTooLarge {
        /// The declared kernel name.
        kernel: &'static str,
        /// The launched symbol.
        launch: &'static str,
        /// `x`, `y` or `z`.
        axis: char,
        /// The computed block count.
        value: u64,
        /// CUDA's limit along that axis.
        limit: u64,
    },

    /// A device buffer belongs to a different CUDA context than the stream it is launched on.
    #[error("argument `{arg}` was allocated in a different CUDA context than the launch stream")]
    ContextMismatch {
        /// The argument's declared name.
        arg: &'static str,
    },

    /// The arguments supplied through a builder do not match the plan (too few or too many).
    #[error("kernel `{kernel}`: {message}")]
    InvalidArguments {
        /// The declared kernel name.
        kernel: &'static str,
        /// What is wrong.
        message: String,
    },

    /// The launch plan itself is inconsistent (an index out of range, a zero divisor, …).
    #[error("kernel `{kernel}` has an invalid launch plan: {reason}")]
    InvalidPlan {
        /// The declared kernel name.
        kernel: &'static str,
        /// What is wrong.
        reason: String,
    },

    /// The host executor could not allocate a workspace.
    #[error("kernel `{kernel}`: could not allocate a {bytes}-byte workspace on the host")]
    OutOfMemory {
        /// The declared kernel name.
        kernel: &'static str,
        /// The requested size.
        bytes: u64,
    },

    /// A caller-provided workspace is smaller than the plan needs for these extents.
    #[error(
        "kernel `{kernel}` needs a {needed}-byte workspace for these extents, but the one given has {have} bytes; \
         size it with `workspace_bytes`"
    )]
    WorkspaceTooSmall {
        /// The declared kernel name.
        kernel: &'static str,
        /// The bytes the plan needs.
        needed: u64,
        /// The bytes of the workspace that was passed.
        have: u64,
    },

    /// A launch of the plan needs more shared memory per block than this GPU grants. The
    /// plans of a default build fit the A100 and the H100/H200; sm_86 and sm_89 run the same
    /// sm_80 code with 99 KiB.
    #[error(
        "kernel `{kernel}`: launch `{launch}` needs {needed} bytes of shared memory per block, but this GPU \
         (sm_{}{}) grants at most {allowed}; rebuild with CUDA_COMPUTE_CAP including {}{} so the plans fit it",
        have.0, have.1, have.0, have.1
    )]
    SharedMemory {
        /// The declared kernel name.
        kernel: &'static str,
        /// The launched symbol.
        launch: &'static str,
        /// The bytes of dynamic shared memory the launch asks for.
        needed: u32,
        /// The most this device lets one block opt in to.
        allowed: u32,
        /// The device's compute capability.
        have: (u32, u32),
    },

    /// A CUDA driver call failed while loading or launching.
    #[error("kernel `{kernel}`: {message}")]
    Launch {
        /// The declared kernel name.
        kernel: &'static str,
        /// The failed step and the driver's error.
        message: String,
    },

    /// The host-emulation kernel reported an error (a failed check inside the emulator).
    #[error("kernel `{kernel}` (host emulation): {message}")]
    Emulation {
        /// The declared kernel name.
        kernel: &'static str,
        /// The emulator's message.
        message: String,
    },
}

/// The second half of the `UnsupportedArch` message: what the user can do about it.
fn arch_hint(have: (u32, u32)) -> &'static str {
    if have.0 < 8 {
        "Cleave kernels need compute capability 8.0 (Ampere) or newer"
    } else {
        "rebuild with CUDA_COMPUTE_CAP including this GPU's architecture"
    }
}
