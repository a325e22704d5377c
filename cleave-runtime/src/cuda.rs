//! The CUDA executor: runs a [`LaunchPlan`] on a stream, from an embedded fatbin.
//!
//! Nothing here touches cudarc before [`driver_present`] has confirmed that `libcuda` can be
//! loaded, because cudarc panics when it cannot load the library.
//!
//! Loaded modules are cached for the life of the process, keyed by CUDA context and fatbin. A
//! cached module keeps its `CudaContext` alive, which also guarantees that the context handle
//! in the key is never reused for a different context.

use std::collections::hash_map::{Entry, HashMap};
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, PoisonError};

use cudarc::driver::sys::{self, CUfunction_attribute, CUresult};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, DriverError,
    SyncOnDrop,
};
use cudarc::nvrtc::Ptx;

use crate::element::Element;
use crate::layout::Layouts;
use crate::plan::{
    self, Device, Extents, KernelLaunch, LaunchPlan, Param, Role, Variant, WorkspaceLayout, MAX_PARAMS, MAX_TENSORS,
};
use crate::Error;

/// A raw device address, as passed to kernels.
pub type DevPtr = sys::CUdeviceptr;

/// An embedded GPU binary: a fatbin holding SASS (and PTX) for the architectures it was
/// built for.
#[derive(Debug, Clone, Copy)]
pub struct Fatbin {
    /// The fatbin image, usually `include_bytes!` of the build's output.
    pub image: &'static [u8],
    /// The architectures the image holds code for, e.g. `"sm_80, sm_90, compute_90"`; used in
    /// error messages.
    pub built_for: &'static str,
}

/// Dynamic shared memory a kernel may use without raising its limit.
const DEFAULT_DYNAMIC_SMEM: u32 = 48 * 1024;

/// The file names under which the driver library is installed. cudarc's dynamic loader tries
/// these among others, so when one of them loads, cudarc can load the driver too.
const DRIVER_LIBRARIES: &[&str] = if cfg!(windows) { &["nvcuda.dll"] } else { &["libcuda.so.1", "libcuda.so"] };

/// Whether the CUDA driver library can be loaded; checked once per process.
///
/// This is our own check rather than `cudarc::driver::sys::is_culib_present`, which only
/// exists when cudarc loads the driver dynamically: an application that picks cudarc's
/// `dynamic-linking` feature would otherwise break this crate's build.
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        DRIVER_LIBRARIES.iter().any(|&name| {
            // SAFETY: loading the NVIDIA driver library runs only its own initialisers, which
            // is exactly what cudarc does when it loads the library for its first call.
            unsafe { libloading::Library::new(name) }.is_ok()
        })
    })
}

fn require_driver() -> Result<(), Error> {
    if driver_present() {
        Ok(())
    } else {
        Err(Error::NoDriver)
    }
}

/// Opens the primary context of device `ordinal`, after checking that the driver exists and
/// the device is there.
pub fn context(ordinal: usize) -> Result<Arc<CudaContext>, Error> {
    require_driver()?;
    let count = match CudaContext::device_count() {
        Ok(n) => usize::try_from(n).unwrap_or(0),
        Err(DriverError(CUresult::CUDA_ERROR_NO_DEVICE)) => 0,
        Err(e) => return Err(Error::Device { ordinal, message: describe("counting devices", e) }),
    };
    if ordinal >= count {
        return Err(Error::NoDevice { ordinal, count });
    }
    CudaContext::new(ordinal)
        .map_err(|e| Error::Device { ordinal, message: describe("retaining its primary context", e) })
}

/// Runs `plan` on `stream`: loads the fatbin into the stream's context (once, through a
/// process-wide cache), allocates the workspaces on the stream and launches every kernel in
/// order. Nothing waits for completion.
///
/// This is the convenient path; a serving loop loads once with [`Loaded::new`] and launches
/// through [`Loaded::launch`], which takes no lock and allocates nothing.
///
/// `extents` has one entry per dim (see [`plan::extents`]); `layouts` gives each tensor's view
/// ([`Layouts::contiguous`] for dense tensors); `inputs` and `outputs` hold one device address
/// per declared tensor, its view's first element. A launch whose grid has a zero dimension is
/// skipped. Split counts are taken from `extents` as given: [`launch_extents`] computes the
/// ones the device's SMs and its residency for the split kernel call for, which
/// [`Args::launch`] and [`Loaded::launch`] use on their own.
///
/// # Safety
///
/// Each address must point to device memory of the stream's context holding its view's span
/// (for these extents) in its dtype, aligned as [`crate::layout::alignment`] says, readable (inputs)
/// or writable (outputs) by work queued on `stream`, and outputs must not overlap any other
/// argument, nor themselves. `fatbin` must hold the kernels `plan` names, with the parameters
/// it lists.
pub unsafe fn execute(
    stream: &Arc<CudaStream>,
    fatbin: Option<&Fatbin>,
    plan: &LaunchPlan,
    extents: &[u64],
    layouts: &Layouts,
    inputs: &[DevPtr],
    outputs: &[DevPtr],
) -> Result<(), Error> {
    require_driver()?;
    let fatbin = fatbin.ok_or(Error::NotBuilt { kernel: plan.kernel })?;
    // The plan and the call are checked before the module is touched, so that a malformed
    // plan built at run time fails with its reason, not inside the driver's loader.
    plan::check_call(plan, extents, inputs.len(), outputs.len())?;
    for launch in plan.launches {
        launch.grid_dims(plan.kernel, extents)?;
    }
    let functions = load_functions(stream, fatbin, plan)?;
    // SAFETY: as for this function; the functions were loaded for `plan` from `fatbin`.
    unsafe { execute_loaded(stream, plan, &functions.functions, extents, layouts, inputs, outputs) }
}

/// [`execute`] with the plan's functions already loaded: checks every grid, allocates the
/// workspaces on the stream and queues the launches.
///
/// # Safety
///
/// As for [`execute`], with `functions` loaded for `plan`, one per launch.
unsafe fn execute_loaded(
    stream: &Arc<CudaStream>,
    plan: &LaunchPlan,
    functions: &[Arc<CudaFunction>],
    extents: &[u64],
    layouts: &Layouts,
    inputs: &[DevPtr],
    outputs: &[DevPtr],
) -> Result<(), Error> {
    plan::check_call(plan, extents, inputs.len(), outputs.len())?;
    let kernel = plan.kernel;
    // Every grid is checked before anything is allocated or queued.
    for launch in plan.launches {
        launch.grid_dims(kernel, extents)?;
    }
    let layout = WorkspaceLayout::new(plan, extents)?;
    let workspace = alloc_workspace(stream, kernel, layout.total)?;
    // The workspace is used only by this call, on this stream, so no event bookkeeping is
    // needed beyond what cudarc does when the slice is freed (in stream order).
    let base = workspace.as_ref().map_or(0, |slice| slice.device_ptr(stream).0);
    // SAFETY: the caller vouches for the tensors and the fatbin; the workspace is a live
    // allocation of `layout.total` bytes that outlives the queued launches.
    unsafe { launch_all(stream, plan, functions, extents, layouts, inputs, outputs, (base, layout.total)) }
}

/// Queues every launch of `plan` on `stream` with the functions loaded for it (one per launch),
/// through the driver's launch call: no lock, no allocation, no synchronisation.
///
/// # Safety
///
/// As for [`execute`]; in addition `workspace` is `(address, bytes)` of device memory of the
/// stream's context that no other work uses until these launches are done (`(0, 0)` when the
/// plan needs none).
#[allow(clippy::too_many_arguments)]
unsafe fn launch_all(
    stream: &CudaStream,
    plan: &LaunchPlan,
    functions: &[Arc<CudaFunction>],
    extents: &[u64],
    layouts: &Layouts,
    inputs: &[DevPtr],
    outputs: &[DevPtr],
    workspace: (DevPtr, u64),
) -> Result<(), Error> {
    let kernel = plan.kernel;
    if functions.len() != plan.launches.len() {
        return Err(Error::InvalidPlan { kernel, reason: "the loaded functions do not match the launches".into() });
    }
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| Error::Launch { kernel, message: describe("binding the CUDA context", e) })?;
    let cu_stream = stream.cu_stream();
    queue_plan(plan, extents, layouts, inputs, outputs, workspace, &mut |i, grid, params| {
        let launch = &plan.launches[i];
        // SAFETY: the function takes exactly the parameters the plan lists, each pointer in
        // `params` points at a live 64-bit value for the duration of the call, and the caller
        // vouches for the memory behind the addresses.
        unsafe {
            cudarc::driver::result::launch_kernel(
                functions[i].cu_function(),
                (grid[0], grid[1], grid[2]),
                (launch.threads, 1, 1),
                launch.smem_bytes,
                cu_stream,
                params,
            )
        }
        .map_err(|e| Error::Launch { kernel, message: describe(&format!("launching `{}`", launch.symbol), e) })
    })
}

/// What [`queue_plan`] calls per launch: `(launch index, grid, parameter pointers)`.
pub(crate) type QueueFn<'q> = dyn FnMut(usize, [u32; 3], &mut [*mut c_void]) -> Result<(), Error> + 'q;

/// Calls `queue(i, grid, params)` for every launch `i` of `plan` whose grid is not empty, with
/// `params` pointing at the values of the parameters the launch lists: the core both launch
/// paths share, kept free of allocation and of driver calls so that the host tests can check it.
///
/// Every grid and the workspace size are checked before the first call, so a bad extent or a
/// small workspace queues nothing. Workspace `i` is passed as `base + offset`, from
/// [`WorkspaceLayout`], or as a null pointer when it is empty.
pub(crate) fn queue_plan(
    plan: &LaunchPlan,
    extents: &[u64],
    layouts: &Layouts,
    inputs: &[DevPtr],
    outputs: &[DevPtr],
    workspace: (DevPtr, u64),
    queue: &mut QueueFn<'_>,
) -> Result<(), Error> {
    let kernel = plan.kernel;
    plan::check_call(plan, extents, inputs.len(), outputs.len())?;
    for launch in plan.launches {
        launch.grid_dims(kernel, extents)?;
    }
    let layout = WorkspaceLayout::new(plan, extents)?;
    if layout.total > workspace.1 {
        return Err(Error::WorkspaceTooSmall { kernel, needed: layout.total, have: workspace.1 });
    }
    for (i, launch) in plan.launches.iter().enumerate() {
        let grid = launch.grid_dims(kernel, extents)?;
        if grid.contains(&0) {
            continue;
        }
        // Every parameter is a 64-bit value: a device address, or an extent or a stride, which
        // the kernel reads as an int64_t (extents are below 2^31 and strides below 2^48, so the
        // bytes are the same).
        let mut values = [0u64; MAX_PARAMS];
        for (slot, param) in values.iter_mut().zip(launch.params) {
            let value = match *param {
                Param::Input(i) => inputs.get(usize::from(i)).copied(),
                Param::Output(i) => outputs.get(usize::from(i)).copied(),
                Param::Workspace(i) => {
                    layout.get(usize::from(i)).map(|(offset, bytes)| if bytes == 0 { 0 } else { workspace.0 + offset })
                }
                Param::Extent(i) => extents.get(usize::from(i)).copied(),
                Param::InputStride(i, a) => layouts.input_stride(usize::from(i), usize::from(a)),
                Param::OutputStride(i, a) => layouts.output_stride(usize::from(i), usize::from(a)),
                // A scalar's entry holds its f32 bits; the kernel reads the low 4 bytes.
                Param::Scalar(i) => inputs.get(usize::from(i)).copied(),
            };
            *slot = value.ok_or_else(|| Error::InvalidPlan {
                kernel,
                reason: format!("launch `{}` has a parameter out of range", launch.symbol),
            })?;
        }
        let mut pointers = [std::ptr::null_mut::<c_void>(); MAX_PARAMS];
        for (pointer, value) in pointers.iter_mut().zip(values.iter_mut()) {
            *pointer = std::ptr::from_mut(value).cast();
        }
        // `validate` (through `check_call`) bounds the parameter count by MAX_PARAMS.
        queue(i, grid, &mut pointers[..launch.params.len()])?;
    }
    Ok(())
}

/// Allocates `bytes` bytes on `stream`, or nothing for an empty workspace (CUDA rejects
/// zero-sized allocations on some paths).
fn alloc_workspace(stream: &Arc<CudaStream>, kernel: &'static str, bytes: u64) -> Result<Option<CudaSlice<u8>>, Error> {
    if bytes == 0 {
        return Ok(None);
    }
    let len = usize::try_from(bytes).map_err(|_| Error::OutOfMemory { kernel, bytes })?;
    // SAFETY: the memory is uninitialised, which is fine: generated kernels write every
    // workspace element before reading it (the host emulator checks this by filling NaNs).
    let slice = unsafe { stream.alloc::<u8>(len) }
        .map_err(|e| Error::Launch { kernel, message: describe(&format!("allocating a {bytes}-byte workspace"), e) })?;
    Ok(Some(slice))
}

/// One kernel's module and functions, loaded into a context ahead of time, with each
/// function's shared-memory limit already raised: what a serving loop launches through.
///
/// [`Loaded::launch`] takes no lock, allocates nothing and never synchronizes: its driver calls
/// are binding the context, one `cuLaunchKernel` per launch of the plan, and the stream-ordered
/// event waits and records cudarc makes for the buffers [`Args`] borrows, so it can be captured
/// into a CUDA graph. Split workspaces come from the caller ([`Workspace`], sized with
/// [`Loaded::workspace_bytes`]).
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The plans loaded, one per set of extents they were made for, the first the declared
    /// extents' ([`Loaded::plan_at`] picks one per call).
    variants: Vec<Variant>,
    ctx: Arc<CudaContext>,
    /// Per entry of `variants`: the function of each launch of its plan, in order, and how
    /// many blocks of each launch one SM of the device holds at once, as the driver reports
    /// it (0: unknown), for the split counts.
    functions: Vec<Functions>,
}

impl Loaded {
    /// Loads the fatbin's functions for `plan` into `ctx`. Loading the same fatbin into the same
    /// context again shares the module.
    ///
    /// # Safety
    ///
    /// `fatbin` must hold the kernels `plan` names, with the parameters it lists: every later
    /// [`Loaded::launch`] relies on it. Generated `load` functions pass the fatbin built from
    /// the same generated source as the plan.
    pub unsafe fn new(
        ctx: &Arc<CudaContext>,
        fatbin: Option<&Fatbin>,
        plan: &'static LaunchPlan,
    ) -> Result<Self, Error> {
        // A plan given alone is a list of one, made for no extents in particular.
        // SAFETY: as the caller vouched for `plan`.
        unsafe { Self::load(ctx, fatbin, vec![Variant { target: "", min_cc: 0, at: &[], plan }]) }
    }

    /// Loads the fatbin's functions for every plan of `variants` that the device of `ctx` runs
    /// ([`for_device`]: one per set of extents they were made for), so that each launch runs
    /// the one made nearest to its extents.
    ///
    /// # Safety
    ///
    /// `fatbin` must hold the kernels every plan of `variants` names, with the parameters it
    /// lists. Generated `load` functions pass `PLANS` and the fatbin built from the same
    /// generated source.
    pub unsafe fn with_variants(
        ctx: &Arc<CudaContext>,
        fatbin: Option<&Fatbin>,
        variants: &'static [Variant],
    ) -> Result<Self, Error> {
        let variants = for_device(ctx, variants)?.to_vec();
        // SAFETY: as the caller vouched for `variants`.
        unsafe { Self::load(ctx, fatbin, variants) }
    }

    /// # Safety
    ///
    /// As for [`Loaded::with_variants`]; `variants` is not empty.
    unsafe fn load(ctx: &Arc<CudaContext>, fatbin: Option<&Fatbin>, variants: Vec<Variant>) -> Result<Self, Error> {
        require_driver()?;
        let kernel = variants.first().map_or("?", |v| v.plan.kernel);
        let fatbin = fatbin.ok_or(Error::NotBuilt { kernel })?;
        let mut functions = Vec::with_capacity(variants.len());
        for v in &variants {
            v.plan.validate()?;
            functions.push(load_in(ctx, fatbin, v.plan)?);
        }
        Ok(Loaded { variants, ctx: Arc::clone(ctx), functions })
    }

    /// The plan made for the declared extents.
    pub fn plan(&self) -> &'static LaunchPlan {
        self.variants[0].plan
    }

    /// The plan a launch with these dynamic extents runs: the one made nearest to them
    /// ([`plan::nearest`]). Build the launch's [`Args`] for it.
    pub fn plan_at(&self, dynamic: &[usize]) -> &'static LaunchPlan {
        plan::nearest(&self.variants, dynamic).plan
    }

    /// The bytes of workspace a launch with these dynamic extents needs (0 for most kernels;
    /// Split-K kernels keep their partials there), under the plan it runs.
    pub fn workspace_bytes(&self, dynamic: &[usize]) -> Result<u64, Error> {
        workspace_bytes(self.plan_at(dynamic), dynamic)
    }

    /// Queues the plan on `stream` with the arguments collected in `args` (built with
    /// [`Args::new`] for [`Loaded::plan_at`] of their extents) and the caller's workspace.
    ///
    /// Errors: everything [`Args`] checks, `ContextMismatch` when the stream or workspace
    /// belongs to another context than the one loaded into, `WorkspaceTooSmall`, `Launch`.
    pub fn launch(&self, args: Args<'_>, workspace: &mut Workspace) -> Result<(), Error> {
        let kernel = self.plan().kernel;
        let Some(i) = self.variants.iter().position(|v| std::ptr::eq(args.plan, v.plan)) else {
            return Err(Error::InvalidArguments {
                kernel,
                message: "the arguments were built for a plan this kernel did not load".into(),
            });
        };
        let (plan, functions) = (self.variants[i].plan, &self.functions[i]);
        plan::check_complete(plan, args.n_inputs, args.n_outputs)?;
        let ctx = args.stream.context();
        if ctx.cu_ctx() != self.ctx.cu_ctx() {
            return Err(Error::ContextMismatch { arg: "stream" });
        }
        let (base, bytes, _guard) = match workspace.buf.as_mut() {
            Some(buf) => {
                if buf.context().cu_ctx() != self.ctx.cu_ctx() {
                    return Err(Error::ContextMismatch { arg: "workspace" });
                }
                let bytes = u64::try_from(buf.len()).unwrap_or(u64::MAX);
                let (ptr, guard) = buf.device_ptr_mut(args.stream);
                (ptr, bytes, Some(guard))
            }
            None => (0, 0, None),
        };
        // The split counts, for the blocks per SM the driver reported when the functions were
        // loaded; a split count sizes no tensor, so the arguments' checks still hold.
        let extents = args.settled(&functions.resident);
        // SAFETY: every address in `args` comes from a buffer borrowed for the builder's
        // lifetime in this context, checked against the declaration; outputs come from `&mut`
        // borrows; the workspace is borrowed mutably for this call and its guard is dropped
        // after the launches are queued; `Loaded::new`'s caller vouched that the functions
        // take the parameters the plan lists.
        let queued = unsafe {
            launch_all(
                args.stream,
                plan,
                &functions.functions,
                &extents,
                &args.layouts,
                &args.inputs[..args.n_inputs],
                &args.outputs[..args.n_outputs],
                (base, bytes),
            )
        };
        // The buffers' guards record this launch's reads and writes now that it is queued.
        drop(args);
        queued
    }
}

/// The workspace bytes `plan` needs for these dynamic extents, and for any smaller ones: a
/// split count the launch derives from the extents is taken at its largest.
pub fn workspace_bytes(plan: &LaunchPlan, dynamic: &[usize]) -> Result<u64, Error> {
    let extents = Extents::new(plan, dynamic)?.with_largest_splits(plan);
    Ok(WorkspaceLayout::new(plan, &extents)?.total)
}

/// The extents a launch of `plan` with these dynamic extents runs with on `stream`'s device,
/// split counts included: chosen for the device's SMs and for how many blocks of the split
/// kernel one of them holds, as the driver reports it for the function in `fatbin` (loaded
/// through the module cache). A benchmark reports the split count a launch chose with it.
pub fn launch_extents(
    stream: &Arc<CudaStream>,
    fatbin: Option<&Fatbin>,
    plan: &'static LaunchPlan,
    dynamic: &[usize],
) -> Result<Extents, Error> {
    require_driver()?;
    let fatbin = fatbin.ok_or(Error::NotBuilt { kernel: plan.kernel })?;
    let sms = if plan.dims.iter().any(|d| d.derive.is_some()) {
        Some(device_sms(stream.context(), plan.kernel)?)
    } else {
        None
    };
    // The extents (and the plan) are checked before the module is loaded.
    let extents = Extents::on(plan, dynamic, sms)?;
    let functions = load_functions(stream, fatbin, plan)?;
    Ok(extents.rederived(plan, Device { sms, resident: &functions.resident }))
}

/// The workspace bytes that whichever of `variants` a device picks needs for these dynamic
/// extents: the largest of theirs, so that one workspace sized before any device is known
/// serves every plan.
pub fn workspace_bytes_any(variants: &[Variant], dynamic: &[usize]) -> Result<u64, Error> {
    let mut most = 0;
    for v in variants {
        most = most.max(workspace_bytes(v.plan, dynamic)?);
    }
    Ok(most)
}

/// The plan of `variants` the device of `ctx` runs for these dynamic extents
/// ([`plan::select`]), from its compute capability and the shared memory a block may opt in
/// to.
pub fn select(
    ctx: &CudaContext,
    variants: &'static [Variant],
    dynamic: &[usize],
) -> Result<&'static LaunchPlan, Error> {
    Ok(plan::nearest(for_device(ctx, variants)?, dynamic).plan)
}

/// The plans of `variants` the device of `ctx` runs ([`plan::for_device`]), one per set of
/// extents they were made for.
pub fn for_device(ctx: &CudaContext, variants: &'static [Variant]) -> Result<&'static [Variant], Error> {
    require_driver()?;
    let kernel = variants.first().map_or("?", |v| v.plan.kernel);
    let (have, smem_optin) = device_limits(ctx, kernel)?;
    plan::for_device(variants, have, u64::from(smem_optin))
}

/// The device's compute capability (major, minor) and the shared memory one block may opt in
/// to: what picks a plan and what bounds its launches.
fn device_limits(ctx: &CudaContext, kernel: &'static str) -> Result<((u32, u32), u32), Error> {
    let query = |what: &str, attr| {
        ctx.attribute(attr)
            .map(|v| u32::try_from(v).unwrap_or(0))
            .map_err(|e| Error::Launch { kernel, message: describe(&format!("querying the {what}"), e) })
    };
    use sys::CUdevice_attribute as A;
    let major = query("compute capability", A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = query("compute capability", A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let smem = query("shared memory per block", A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
    Ok(((major, minor), smem))
}

/// The device's SM count, which a launch's split counts are chosen for.
fn device_sms(ctx: &CudaContext, kernel: &'static str) -> Result<u32, Error> {
    remembered_sms(&SM_COUNTS, ctx.ordinal(), || {
        ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map(|v| u32::try_from(v).unwrap_or(1).max(1))
            .map_err(|e| Error::Launch { kernel, message: describe("querying the SM count", e) })
    })
}

/// Devices whose SM count is remembered; a process with more asks the driver on every launch.
const REMEMBERED_DEVICES: usize = 16;

/// The SM count of each device ordinal once asked, 0 before. A launch with a split count
/// needs it every call, and a device's count never changes while the process runs, so only
/// the first launch on a device pays for the driver call.
static SM_COUNTS: [AtomicU32; REMEMBERED_DEVICES] = [const { AtomicU32::new(0) }; REMEMBERED_DEVICES];

/// Device `ordinal`'s SM count from `table`, asking `query` only the first time (or every
/// time, past the table's end). Two threads that ask at once both query and store the same
/// value, which is harmless.
fn remembered_sms(
    table: &[AtomicU32],
    ordinal: usize,
    query: impl FnOnce() -> Result<u32, Error>,
) -> Result<u32, Error> {
    let Some(slot) = table.get(ordinal) else { return query() };
    match slot.load(Ordering::Relaxed) {
        0 => {
            let sms = query()?;
            slot.store(sms, Ordering::Relaxed);
            Ok(sms)
        }
        sms => Ok(sms),
    }
}

/// Scratch device memory a caller lends to [`Loaded::launch`] for Split-K partials, so that
/// the launch itself allocates nothing. One workspace serves any kernel whose
/// `workspace_bytes` it covers, one launch at a time (launches on one stream are ordered).
#[derive(Debug, Default)]
pub struct Workspace {
    buf: Option<CudaSlice<u8>>,
}

impl Workspace {
    /// No memory, for kernels that need none.
    pub const fn none() -> Self {
        Workspace { buf: None }
    }

    /// `bytes` bytes allocated on `stream` (nothing for 0).
    pub fn alloc(stream: &Arc<CudaStream>, bytes: u64) -> Result<Self, Error> {
        require_driver()?;
        Ok(Workspace { buf: alloc_workspace(stream, "workspace", bytes)? })
    }

    /// Wraps a buffer the caller allocated.
    pub fn from_slice(buf: CudaSlice<u8>) -> Self {
        Workspace { buf: Some(buf) }
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> u64 {
        self.buf.as_ref().map_or(0, |b| u64::try_from(b.len()).unwrap_or(u64::MAX))
    }
}

/// A module loaded into one context, with the functions fetched from it so far.
struct LoadedModule {
    module: Arc<CudaModule>,
    functions: HashMap<&'static str, LoadedFunction>,
    /// The device's compute capability.
    have: (u32, u32),
    /// The most dynamic shared memory one block may opt in to on this device.
    smem_optin: u32,
}

struct LoadedFunction {
    function: Arc<CudaFunction>,
    /// The dynamic shared memory the function is currently allowed to use.
    smem_limit: u32,
    /// The blocks of `(threads, dynamic shared memory)` one SM holds at once, once asked.
    resident: Option<((u32, u32), u32)>,
}

/// The functions of a plan's launches, in order, and how many blocks of each one SM holds.
#[derive(Debug, Clone)]
struct Functions {
    functions: Vec<Arc<CudaFunction>>,
    resident: Vec<u32>,
}

/// (context handle, fatbin address, fatbin length).
type ModuleKey = (usize, usize, usize);

static MODULES: LazyLock<Mutex<HashMap<ModuleKey, LoadedModule>>> = LazyLock::new(Default::default);

/// The functions for every launch of `plan`, loading the module and functions on first use and
/// raising each function's dynamic shared memory limit as far as the plan needs.
fn load_functions(stream: &CudaStream, fatbin: &Fatbin, plan: &LaunchPlan) -> Result<Functions, Error> {
    load_in(stream.context(), fatbin, plan)
}

/// The functions for every launch of `plan` in `ctx`, through the module cache.
fn load_in(ctx: &Arc<CudaContext>, fatbin: &Fatbin, plan: &LaunchPlan) -> Result<Functions, Error> {
    let kernel = plan.kernel;
    // Function lookups and attribute changes act on the current context.
    ctx.bind_to_thread().map_err(|e| Error::Launch { kernel, message: describe("binding the CUDA context", e) })?;
    let key = (ctx.cu_ctx() as usize, fatbin.image.as_ptr() as usize, fatbin.image.len());
    // A panic while the lock was held cannot leave an entry half-built (entries are inserted
    // whole), so a poisoned cache is still consistent.
    let mut cache = MODULES.lock().unwrap_or_else(PoisonError::into_inner);
    let loaded = match cache.entry(key) {
        Entry::Occupied(e) => e.into_mut(),
        Entry::Vacant(e) => e.insert(load_module(ctx, fatbin, kernel)?),
    };
    let mut out = Functions { functions: Vec::new(), resident: Vec::new() };
    for launch in plan.launches {
        let (function, resident) = loaded.function(launch, kernel)?;
        out.functions.push(function);
        out.resident.push(resident);
    }
    Ok(out)
}

fn load_module(ctx: &Arc<CudaContext>, fatbin: &Fatbin, kernel: &'static str) -> Result<LoadedModule, Error> {
    // Asked once per module, so that a plan too large for this GPU fails with its figures
    // rather than with the driver's bare "invalid value" from the attribute call.
    let (have, smem_optin) = device_limits(ctx, kernel)?;
    if have.0 < 8 {
        return Err(Error::UnsupportedArch { have, built_for: fatbin.built_for });
    }
    let module = ctx.load_module(Ptx::from_binary(fatbin.image.to_vec())).map_err(|e| match e.0 {
        CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU => Error::UnsupportedArch { have, built_for: fatbin.built_for },
        CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION => Error::Launch {
            kernel,
            message: describe("loading the fatbin (the NVIDIA driver is older than the CUDA toolkit that built it)", e),
        },
        _ => Error::Launch { kernel, message: describe("loading the fatbin", e) },
    })?;
    Ok(LoadedModule { module, functions: HashMap::new(), have, smem_optin })
}

impl LoadedModule {
    /// The function of `launch`, with its dynamic shared memory limit raised as far as the
    /// launch needs, and how many of its blocks one SM holds (0 when the driver cannot say).
    fn function(&mut self, launch: &KernelLaunch, kernel: &'static str) -> Result<(Arc<CudaFunction>, u32), Error> {
        let symbol = launch.symbol;
        let loaded = match self.functions.entry(symbol) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let function = self.module.load_function(symbol).map_err(|err| Error::Launch {
                    kernel,
                    message: describe(&format!("finding `{symbol}` in the fatbin"), err),
                })?;
                e.insert(LoadedFunction {
                    function: Arc::new(function),
                    smem_limit: DEFAULT_DYNAMIC_SMEM,
                    resident: None,
                })
            }
        };
        check_smem(launch, kernel, self.smem_optin, self.have)?;
        if launch.smem_bytes > loaded.smem_limit {
            let step = format!("raising the dynamic shared memory limit of `{symbol}` to {} bytes", launch.smem_bytes);
            let value = i32::try_from(launch.smem_bytes)
                .map_err(|_| Error::Launch { kernel, message: format!("{step}: the value is out of range") })?;
            loaded
                .function
                .set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, value)
                .map_err(|e| Error::Launch { kernel, message: describe(&step, e) })?;
            loaded.smem_limit = launch.smem_bytes;
        }
        // The driver's count follows from the compiled kernel's registers and shared memory,
        // which the plan only estimates. A failed query is not a failed launch: the split
        // counts then keep the plan's estimate.
        let key = (launch.threads, launch.smem_bytes);
        let resident = match loaded.resident {
            Some((k, r)) if k == key => r,
            _ => {
                let r = loaded
                    .function
                    .occupancy_max_active_blocks_per_multiprocessor(
                        launch.threads,
                        usize::try_from(launch.smem_bytes).unwrap_or(usize::MAX),
                        None,
                    )
                    .unwrap_or(0);
                loaded.resident = Some((key, r));
                r
            }
        };
        Ok((Arc::clone(&loaded.function), resident))
    }
}

/// Refuses a launch that asks for more shared memory per block than the device grants.
fn check_smem(launch: &KernelLaunch, kernel: &'static str, allowed: u32, have: (u32, u32)) -> Result<(), Error> {
    if launch.smem_bytes > allowed {
        return Err(Error::SharedMemory { kernel, launch: launch.symbol, needed: launch.smem_bytes, allowed, have });
    }
    Ok(())
}

/// "`step`: CUDA_ERROR_NAME (the driver's description)".
fn describe(step: &str, err: DriverError) -> String {
    let text = |r: Result<&CStr, DriverError>| r.map(|s| s.to_string_lossy().into_owned()).ok();
    match (text(err.error_name()), text(err.error_string())) {
        (Some(name), Some(what)) => format!("{step}: {name} ({what})"),
        _ => format!("{step}: {:?}", err.0),
    }
}

/// A typed argument list for one launch on a stream, so that a generated `launch` is a few
/// lines: `Args::new`, one `input`/`output` per declared tensor in declaration order, `launch`.
///
/// Each argument is checked against the declaration (dtype, exact length, same context) as it
/// is added. The builder takes part in cudarc's stream synchronisation: an input waits for
/// earlier writes, an output for earlier reads and writes, and the reads and writes of this
/// launch are recorded when it is done. Its tables are inline, so building it allocates
/// nothing.
pub struct Args<'a> {
    plan: &'a LaunchPlan,
    stream: &'a Arc<CudaStream>,
    /// The extents, with split counts for the stream's device as the plan estimates it;
    /// [`Args::settled`] chooses them again once the device's own residency is known.
    extents: Extents,
    /// The SMs of the stream's device, when the plan derives a split count.
    sms: Option<u32>,
    /// Whether [`Args::split_count`] fixed the split counts.
    pinned: bool,
    layouts: Layouts,
    inputs: [DevPtr; MAX_TENSORS],
    n_inputs: usize,
    outputs: [DevPtr; MAX_TENSORS],
    n_outputs: usize,
    /// Record this launch's reads and writes on the buffers' events when dropped, which
    /// happens after the kernels are queued.
    guards: [Option<SyncOnDrop<'a>>; MAX_TENSORS],
}

impl std::fmt::Debug for Args<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Args")
            .field("kernel", &self.plan.kernel)
            .field("extents", &self.extents)
            .field("inputs", &&self.inputs[..self.n_inputs])
            .field("outputs", &&self.outputs[..self.n_outputs])
            .finish()
    }
}

impl<'a> Args<'a> {
    /// Starts an argument list for `stream`; `dynamic` holds the dynamic extents in declaration
    /// order.
    pub fn new(plan: &'a LaunchPlan, stream: &'a Arc<CudaStream>, dynamic: &[usize]) -> Result<Self, Error> {
        require_driver()?;
        // A split count lands the grid evenly on the SMs of the device the stream runs on, not
        // only of the GPU the plan was made for; only kernels with one ask.
        let sms = if plan.dims.iter().any(|d| d.derive.is_some()) {
            Some(device_sms(stream.context(), plan.kernel)?)
        } else {
            None
        };
        let extents = Extents::on(plan, dynamic, sms)?;
        Ok(Self {
            plan,
            stream,
            sms,
            pinned: false,
            layouts: Layouts::contiguous(plan, &extents)?,
            extents,
            inputs: [0; MAX_TENSORS],
            n_inputs: 0,
            outputs: [0; MAX_TENSORS],
            n_outputs: 0,
            guards: std::array::from_fn(|_| None),
        })
    }

    /// The full extent vector, one entry per dim. A split count the launcher derives is
    /// chosen here for the device's SMs and the plan's estimate of how many blocks an SM
    /// holds; the launch chooses it again with the driver's count ([`launch_extents`] gives
    /// the extents a launch runs with), unless it was pinned.
    pub fn extents(&self) -> &[u64] {
        &self.extents
    }

    /// Pins every split count this launch would choose for the device to `count`
    /// ([`plan::pin_split_count`]): the same partial sums, so the same bits, on every GPU.
    pub fn split_count(&mut self, count: u64) -> Result<&mut Self, Error> {
        self.extents = self.extents.with_split_count(self.plan, count)?;
        self.pinned = true;
        Ok(self)
    }

    /// The extents the launch runs with, given how many blocks of each launch one SM holds
    /// (`resident`, from the loaded functions): the split counts chosen again for that,
    /// unless pinned.
    fn settled(&self, resident: &[u32]) -> Extents {
        if self.pinned {
            self.extents
        } else {
            self.extents.rederived(self.plan, Device { sms: self.sms, resident })
        }
    }

    /// Adds the next declared input, dense and row-major: a `CudaSlice`, `CudaView` or
    /// `CudaViewMut` of exactly its element count.
    pub fn input<T: Element, S: DevicePtr<T>>(&mut self, buf: &'a S) -> Result<&mut Self, Error> {
        let name =
            plan::check_arg(self.plan, &self.extents, Role::Input, self.n_inputs, T::DTYPE, DeviceSlice::len(buf))?;
        self.add_input(buf, name, None)
    }

    /// Adds the next declared input as a view starting at the buffer's first element:
    /// `strides` gives one element stride per declared axis (the last 1), and the view must lie
    /// inside the buffer (a K cache allocated for its capacity, one head's slice of a fused
    /// projection, a candle narrow).
    pub fn input_strided<T: Element, S: DevicePtr<T>>(
        &mut self,
        buf: &'a S,
        strides: &[usize],
    ) -> Result<&mut Self, Error> {
        let name = plan::check_dtype(self.plan, Role::Input, self.n_inputs, T::DTYPE)?;
        self.add_input(buf, name, Some(strides))
    }

    fn add_input<T: Element, S: DevicePtr<T>>(
        &mut self,
        buf: &'a S,
        name: &'static str,
        strides: Option<&[usize]>,
    ) -> Result<&mut Self, Error> {
        self.check_context(DeviceSlice::stream(buf), name)?;
        let addr = buf.device_ptr(self.stream);
        // The guard is recorded only once the view checks out; a dropped guard records a read
        // that never happens, which only orders later work after this point.
        self.view(Role::Input, self.n_inputs, strides, DeviceSlice::len(buf), addr.0)?;
        let (ptr, guard) = addr;
        // `check_arg` accepted the index, so it is below the declared count (≤ MAX_TENSORS).
        self.inputs[self.n_inputs] = ptr;
        self.guards[self.n_inputs + self.n_outputs] = Some(guard);
        self.n_inputs += 1;
        Ok(self)
    }

    /// Adds the next declared input when it is a scalar (`[]`), by value (rounded to its
    /// declared dtype).
    pub fn scalar(&mut self, value: f32) -> Result<&mut Self, Error> {
        let value = plan::check_scalar(self.plan, self.n_inputs, value)?;
        // The parameter's slot carries the f32's bits in its low 4 bytes, which is what the
        // kernel's `float` parameter reads (little-endian).
        self.inputs[self.n_inputs] = u64::from(value.to_bits());
        self.n_inputs += 1;
        Ok(self)
    }

    /// Adds the next declared output, dense and row-major: a `CudaSlice` or `CudaViewMut`.
    pub fn output<T: Element, S: DevicePtrMut<T>>(&mut self, buf: &'a mut S) -> Result<&mut Self, Error> {
        let name =
            plan::check_arg(self.plan, &self.extents, Role::Output, self.n_outputs, T::DTYPE, DeviceSlice::len(buf))?;
        self.add_output(buf, name, None)
    }

    /// Adds the next declared output as a view starting at the buffer's first element; the
    /// buffer's elements outside the view are left as they are.
    pub fn output_strided<T: Element, S: DevicePtrMut<T>>(
        &mut self,
        buf: &'a mut S,
        strides: &[usize],
    ) -> Result<&mut Self, Error> {
        let name = plan::check_dtype(self.plan, Role::Output, self.n_outputs, T::DTYPE)?;
        self.add_output(buf, name, Some(strides))
    }

    fn add_output<T: Element, S: DevicePtrMut<T>>(
        &mut self,
        buf: &'a mut S,
        name: &'static str,
        strides: Option<&[usize]>,
    ) -> Result<&mut Self, Error> {
        self.check_context(DeviceSlice::stream(buf), name)?;
        let len = DeviceSlice::len(buf);
        let addr = buf.device_ptr_mut(self.stream);
        self.view(Role::Output, self.n_outputs, strides, len, addr.0)?;
        let (ptr, guard) = addr;
        self.outputs[self.n_outputs] = ptr;
        self.guards[self.n_inputs + self.n_outputs] = Some(guard);
        self.n_outputs += 1;
        Ok(self)
    }

    /// Checks and records a view (`None`: dense, already recorded) of input or output `index`.
    fn view(
        &mut self,
        role: Role,
        index: usize,
        strides: Option<&[usize]>,
        len: usize,
        addr: u64,
    ) -> Result<(), Error> {
        self.layouts.record(self.plan, &self.extents, role, index, strides, len, addr)
    }

    fn check_context(&self, owner: &CudaStream, arg: &'static str) -> Result<(), Error> {
        if owner.context().cu_ctx() == self.stream.context().cu_ctx() {
            Ok(())
        } else {
            Err(Error::ContextMismatch { arg })
        }
    }

    /// Queues the plan's kernels on the stream, loading the module through the process-wide
    /// cache and allocating any workspace on the stream. `fatbin` is `None` when the crate was
    /// built without nvcc, which gives [`Error::NotBuilt`].
    ///
    /// # Safety
    ///
    /// `fatbin` must hold the kernels this plan was generated with. Generated launchers pass
    /// the fatbin built from the same generated source as the plan.
    pub unsafe fn launch(self, fatbin: Option<&Fatbin>) -> Result<(), Error> {
        plan::check_complete(self.plan, self.n_inputs, self.n_outputs)?;
        let fatbin = fatbin.ok_or(Error::NotBuilt { kernel: self.plan.kernel })?;
        let functions = load_functions(self.stream, fatbin, self.plan)?;
        let extents = self.settled(&functions.resident);
        // SAFETY: every address comes from a buffer borrowed for 'a in the stream's context,
        // whose dtype and length were checked against the declaration for these extents (a
        // split count changes no tensor's), and outputs come from `&mut` borrows, so they
        // overlap nothing else; the caller vouches for the fatbin, from which the functions
        // were loaded. `self.guards` is dropped after this call returns.
        unsafe {
            execute_loaded(
                self.stream,
                self.plan,
                &functions.functions,
                &extents,
                &self.layouts,
                &self.inputs[..self.n_inputs],
                &self.outputs[..self.n_outputs],
            )
        }
    }
}

#[cfg(test)]
mod tests {
    //! The launch core, run on the host with a recording queue in place of the driver: it
    //! passes the parameters the plan lists, checks everything before the first launch, and
    //! allocates nothing (counted by a per-thread allocator).

    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    use super::*;
    use crate::plan::{Axis, DType, DimSpec, Factor, Product, TensorSpec, WorkspaceSpec, WORKSPACE_ALIGN};

    /// The system allocator, counting the allocations of each thread, so that one test's
    /// count is not disturbed by tests running on other threads.
    struct Counting;

    thread_local! {
        static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
    }

    fn count() {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
    }

    // SAFETY: every call is forwarded to the system allocator unchanged.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            count();
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            count();
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            count();
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    fn allocations_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
        let before = ALLOCATIONS.with(Cell::get);
        let r = f();
        (r, ALLOCATIONS.with(Cell::get) - before)
    }

    /// A Split-K row sum over a dynamic `k`, with two workspaces (partials and a scratch one of
    /// odd size, so the second starts at an aligned offset), a split launch and a combine.
    static PLAN: LaunchPlan = LaunchPlan {
        kernel: "rowsum",
        dims: &[
            DimSpec { name: "m", value: 3, dynamic: false, derive: None },
            DimSpec { name: "k", value: 100, dynamic: true, derive: None },
        ],
        inputs: &[TensorSpec { name: "x", dtype: DType::F32, shape: &[Axis::Dim(0), Axis::Dim(1)] }],
        outputs: &[TensorSpec { name: "y", dtype: DType::F32, shape: &[Axis::Dim(0), Axis::One] }],
        workspaces: &[
            WorkspaceSpec { elem_bytes: 4, len: Product(&[Factor::Dim(0), Factor::CeilDiv(1, 64)]) },
            WorkspaceSpec { elem_bytes: 2, len: Product(&[Factor::Const(3)]) },
        ],
        launches: &[
            KernelLaunch {
                symbol: "split",
                grid: [Product(&[Factor::Dim(0)]), Product(&[Factor::CeilDiv(1, 64)]), Product(&[])],
                threads: 64,
                smem_bytes: 0,
                params: &[
                    Param::Input(0),
                    Param::Workspace(0),
                    Param::Workspace(1),
                    Param::Extent(1),
                    Param::InputStride(0, 0),
                ],
            },
            KernelLaunch {
                symbol: "combine",
                grid: [Product(&[Factor::Dim(0)]), Product(&[]), Product(&[])],
                threads: 32,
                smem_bytes: 0,
                params: &[Param::Workspace(0), Param::Output(0), Param::Extent(0), Param::Extent(1)],
            },
        ],
        tables: &[],
    };

    type Recorded = (usize, [u32; 3], [u64; 5]);

    /// Runs the core with a queue that records each launch's index, grid and parameter values
    /// into `log` (whose capacity the caller reserves, so recording allocates nothing). `x` is
    /// dense, or a view with this row stride inside a buffer of 4096 elements.
    fn run_view(
        dynamic: &[usize],
        x_stride: Option<usize>,
        workspace: (DevPtr, u64),
        log: &mut Vec<Recorded>,
    ) -> Result<(), Error> {
        let extents = Extents::new(&PLAN, dynamic)?;
        let mut layouts = Layouts::contiguous(&PLAN, &extents)?;
        if let Some(s) = x_stride {
            layouts.set_input(&PLAN, &extents, 0, &[s, 1], 4096, 0x1000)?;
        }
        queue_plan(&PLAN, &extents, &layouts, &[0x1000], &[0x2000], workspace, &mut |i, grid, params| {
            let mut values = [0u64; 5];
            for (v, p) in values.iter_mut().zip(params.iter()) {
                // SAFETY: the core hands out pointers to live 64-bit parameter values.
                *v = unsafe { *p.cast::<u64>() };
            }
            log.push((i, grid, values));
            Ok(())
        })
    }

    fn run(dynamic: &[usize], workspace: (DevPtr, u64), log: &mut Vec<Recorded>) -> Result<(), Error> {
        run_view(dynamic, None, workspace, log)
    }

    #[test]
    fn a_devices_sm_count_is_asked_of_the_driver_once() {
        let table = [const { AtomicU32::new(0) }; 2];
        let asked = Cell::new(0);
        let query = |sms| {
            asked.set(asked.get() + 1);
            Ok(sms)
        };
        assert_eq!(remembered_sms(&table, 1, || query(132)).unwrap(), 132);
        // Later launches on device 1 reuse the count, whatever the driver would say now.
        assert_eq!(remembered_sms(&table, 1, || query(7)).unwrap(), 132);
        assert_eq!(asked.get(), 1);
        // Device 0 has its own count.
        assert_eq!(remembered_sms(&table, 0, || query(108)).unwrap(), 108);
        assert_eq!(asked.get(), 2);
        // A failed query is not remembered, and the error reaches the caller.
        let fresh = [const { AtomicU32::new(0) }; 1];
        let failed = remembered_sms(&fresh, 0, || Err(Error::Launch { kernel: "k", message: "gone".into() }));
        assert!(matches!(failed, Err(Error::Launch { kernel: "k", .. })));
        assert_eq!(remembered_sms(&fresh, 0, || query(114)).unwrap(), 114);
        // Past the table's end every launch asks.
        assert_eq!(remembered_sms(&table, 5, || query(78)).unwrap(), 78);
        assert_eq!(remembered_sms(&table, 5, || query(78)).unwrap(), 78);
        assert_eq!(asked.get(), 5);
        // Remembering allocates nothing.
        let (r, allocations) = allocations_during(|| remembered_sms(&table, 1, || query(1)));
        assert_eq!((r.unwrap(), allocations), (132, 0));
    }

    /// A paged decode's plan in miniature: an indptr, a page table, the last pages' lengths
    /// and a split count over the requests' pages.
    static PAGED: LaunchPlan = LaunchPlan {
        kernel: "paged",
        dims: &[
            DimSpec { name: "b", value: 4, dynamic: true, derive: None },
            DimSpec { name: "pages", value: 64, dynamic: true, derive: None },
            DimSpec { name: "entries", value: 64, dynamic: true, derive: None },
            DimSpec { name: "b1", value: 5, dynamic: true, derive: None },
            DimSpec {
                name: "s",
                value: 1,
                dynamic: false,
                derive: Some(plan::Derive::SplitCount {
                    blocks: Product(&[Factor::Dim(0), Factor::Const(8)]),
                    streams: Product(&[Factor::Dim(0), Factor::Const(8)]),
                    entries: Product(&[Factor::Dim(2), Factor::Const(64)]),
                    batch: Some(0),
                    sms: 132,
                    resident: 2,
                    fill: 102,
                    launch: Some(0),
                }),
            },
        ],
        inputs: &[
            TensorSpec { name: "indptr", dtype: DType::I32, shape: &[Axis::Dim(3)] },
            TensorSpec { name: "indices", dtype: DType::I32, shape: &[Axis::Dim(2)] },
            TensorSpec { name: "last", dtype: DType::I32, shape: &[Axis::Dim(0)] },
        ],
        outputs: &[],
        workspaces: &[],
        launches: &[KernelLaunch {
            symbol: "paged_0",
            grid: [Product(&[Factor::Dim(4)]), Product(&[Factor::Dim(0), Factor::Const(8)]), Product(&[])],
            threads: 128,
            smem_bytes: 0,
            params: &[Param::Input(0), Param::Input(1), Param::Input(2)],
        }],
        tables: &[
            plan::Table::Indptr { input: 0, batch: 0, bound: Some(2) },
            plan::Table::Pages { input: 1, indptr: 0, batch: 0, pages: &[1] },
            plan::Table::LastPage { input: 2, indptr: 0, batch: 0, page_size: 64 },
        ],
    };

    #[test]
    fn validating_a_paged_plan_and_settling_its_split_count_allocate_nothing() {
        // Every launch validates its plan and, unless pinned, chooses its split count again
        // for the blocks per SM the driver reported: both on the hot path.
        let extents = Extents::on(&PAGED, &[4, 64, 64, 5], Some(132)).unwrap();
        let ((valid, settled), allocations) = allocations_during(|| {
            (PAGED.validate(), extents.rederived(&PAGED, Device { sms: Some(132), resident: &[1] }))
        });
        valid.unwrap();
        assert_eq!(allocations, 0, "validating or settling allocated");
        assert!(settled[4] >= 1);
    }

    #[test]
    fn the_launch_core_passes_the_listed_parameters_without_allocating() {
        let extents = Extents::new(&PLAN, &[130]).unwrap();
        let layout = WorkspaceLayout::new(&PLAN, &extents).unwrap();
        // 3 rows × ceil(130 / 64) = 9 partials of 4 bytes, then 3 × 2 bytes at the next
        // aligned offset.
        assert_eq!(layout.get(0), Some((0, 36)));
        assert_eq!(layout.get(1), Some((WORKSPACE_ALIGN, 6)));
        assert_eq!(layout.total, WORKSPACE_ALIGN + 6);
        assert_eq!(workspace_bytes(&PLAN, &[130]).unwrap(), WORKSPACE_ALIGN + 6);

        let mut log = Vec::with_capacity(8);
        let base = 0x10_0000;
        let (result, allocations) = allocations_during(|| run(&[130], (base, layout.total), &mut log));
        result.unwrap();
        assert_eq!(allocations, 0, "the launch core allocated");
        assert_eq!(
            log,
            [
                (0, [3, 3, 1], [0x1000, base, base + WORKSPACE_ALIGN, 130, 130]),
                (1, [3, 1, 1], [base, 0x2000, 3, 130, 0]),
            ]
        );
        // A view of `x` with a row stride of 1000 elements passes that stride, still without
        // allocating; one past its buffer is refused before anything is queued.
        log.clear();
        let (result, allocations) = allocations_during(|| run_view(&[130], Some(1000), (base, layout.total), &mut log));
        result.unwrap();
        assert_eq!(allocations, 0, "the launch core allocated for a view");
        assert_eq!(log[0].2, [0x1000, base, base + WORKSPACE_ALIGN, 130, 1000]);
        log.clear();
        let err = run_view(&[130], Some(2000), (base, layout.total), &mut log).unwrap_err();
        assert!(matches!(err, Error::View { arg: "x", .. }), "{err}");
        assert!(log.is_empty());
    }

    #[test]
    fn the_launch_core_checks_everything_before_the_first_launch() {
        let mut log = Vec::new();
        let needed = workspace_bytes(&PLAN, &[130]).unwrap();
        let err = run(&[130], (0x10_0000, needed - 1), &mut log).unwrap_err();
        assert!(
            matches!(err, Error::WorkspaceTooSmall { kernel: "rowsum", needed: n, have } if n == needed && have == needed - 1),
            "{err}"
        );
        assert!(err.to_string().contains("workspace_bytes"), "{err}");
        assert!(matches!(run(&[0], (0x10_0000, needed), &mut log), Err(Error::InvalidExtent { dim: "k", .. })));
        assert!(matches!(run(&[1, 2], (0x10_0000, needed), &mut log), Err(Error::DynamicCount { .. })));
        assert!(log.is_empty(), "a failed call queued {log:?}");
        // A grid beyond CUDA's limit along y (ceil(k / 64) > 65535) also queues nothing, even
        // though the first launch's grid.x is fine.
        let big = 64 * 65_536;
        let bytes = workspace_bytes(&PLAN, &[big]).unwrap();
        assert!(matches!(run(&[big], (0x10_0000, bytes), &mut log), Err(Error::GridTooLarge { axis: 'y', .. })));
        assert!(log.is_empty(), "a failed call queued {log:?}");
    }

    #[test]
    fn a_plan_over_the_device_shared_memory_is_refused_with_its_figures() {
        let launch = KernelLaunch { smem_bytes: 139_520, ..PLAN.launches[0] };
        // An RTX 4090 (sm_89) runs the sm_80 code but grants 99 KiB per block.
        let err = check_smem(&launch, "rmsnorm_matmul", 101_376, (8, 9)).unwrap_err();
        assert!(
            matches!(err, Error::SharedMemory { needed: 139_520, allowed: 101_376, have: (8, 9), launch: "split", .. }),
            "{err}"
        );
        let text = err.to_string();
        assert!(text.contains("sm_89") && text.contains("CUDA_COMPUTE_CAP including 89"), "{text}");
        // An A100 grants 163 KiB: the same launch passes, as does one exactly at the limit.
        assert!(check_smem(&launch, "rmsnorm_matmul", 166_912, (8, 0)).is_ok());
        assert!(check_smem(&launch, "rmsnorm_matmul", 139_520, (8, 0)).is_ok());
    }
}
