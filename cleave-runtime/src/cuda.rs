//! The CUDA executor: runs a [`LaunchPlan`] on a stream, from an embedded fatbin.
//!
//! Nothing here touches cudarc before [`driver_present`] has confirmed that `libcuda` can be
//! loaded, because cudarc panics when it cannot load the library.
//!
//! Loaded modules are cached for the life of the process, keyed by CUDA context and fatbin. A
//! cached module keeps its `CudaContext` alive, which also guarantees that the context handle
//! in the key is never reused for a different context.

use std::collections::hash_map::{Entry, HashMap};
use std::ffi::CStr;
use std::sync::{Arc, LazyLock, Mutex, OnceLock, PoisonError};

use cudarc::driver::sys::{self, CUfunction_attribute, CUresult};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, DriverError,
    LaunchConfig, PushKernelArg, SyncOnDrop,
};
use cudarc::nvrtc::Ptx;

use crate::element::Element;
use crate::plan::{self, KernelLaunch, LaunchPlan, Param, Role};
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

/// Runs `plan` on `stream`: loads the fatbin into the stream's context (once), allocates the
/// workspaces on the stream and launches every kernel in order. Nothing waits for completion.
///
/// `extents` has one entry per dim (see [`plan::extents`]); `inputs` and `outputs` hold one
/// device address per declared tensor. A launch whose grid has a zero dimension is skipped.
///
/// # Safety
///
/// Each address must point to device memory of the stream's context holding the tensor's
/// element count (for these extents) in its dtype, readable (inputs) or writable (outputs)
/// by work queued on `stream`, and outputs must not overlap any other argument. `fatbin` must
/// hold the kernels `plan` names, with the parameters it lists.
pub unsafe fn execute(
    stream: &Arc<CudaStream>,
    fatbin: Option<&Fatbin>,
    plan: &LaunchPlan,
    extents: &[u64],
    inputs: &[DevPtr],
    outputs: &[DevPtr],
) -> Result<(), Error> {
    require_driver()?;
    let fatbin = fatbin.ok_or(Error::NotBuilt { kernel: plan.kernel })?;
    plan::check_call(plan, extents, inputs.len(), outputs.len())?;
    let kernel = plan.kernel;
    // Every grid is computed before anything is queued, so a bad extent launches nothing.
    let grids: Vec<[u32; 3]> = plan.launches.iter().map(|l| l.grid_dims(kernel, extents)).collect::<Result<_, _>>()?;
    let functions = load_functions(stream, fatbin, plan)?;

    let mut workspaces = Vec::with_capacity(plan.workspaces.len());
    for (i, ws) in plan.workspaces.iter().enumerate() {
        let bytes = ws
            .bytes(extents)
            .ok_or_else(|| Error::Overflow { kernel, quantity: format!("the size of workspace {i}") })?;
        workspaces.push(alloc_workspace(stream, kernel, bytes)?);
    }
    // A workspace is used only by this call, on this stream, so no event bookkeeping is needed
    // beyond what cudarc does; an empty one is passed as a null pointer.
    let workspace_ptrs: Vec<DevPtr> =
        workspaces.iter().map(|w| w.as_ref().map_or(0, |slice| slice.device_ptr(stream).0)).collect();

    for ((launch, grid), function) in plan.launches.iter().zip(grids).zip(&functions) {
        if grid.contains(&0) {
            continue;
        }
        let mut builder = stream.launch_builder(function);
        for param in launch.params {
            // Extents are passed through their u64 slot: the kernel reads an int64_t, and
            // every extent is below 2^31, so the bytes are the same.
            let value = match *param {
                Param::Input(i) => inputs.get(usize::from(i)),
                Param::Output(i) => outputs.get(usize::from(i)),
                Param::Workspace(i) => workspace_ptrs.get(usize::from(i)),
                Param::Extent(i) => extents.get(usize::from(i)),
            };
            let value = value.ok_or_else(|| Error::InvalidPlan {
                kernel,
                reason: format!("launch `{}` has a parameter out of range", launch.symbol),
            })?;
            builder.arg(value);
        }
        let config = LaunchConfig {
            grid_dim: (grid[0], grid[1], grid[2]),
            block_dim: (launch.threads, 1, 1),
            shared_mem_bytes: launch.smem_bytes,
        };
        // SAFETY: the caller guarantees the tensors behind the addresses and that the fatbin's
        // kernel takes exactly these parameters; workspaces are live allocations of the sizes
        // the plan asks for and stay alive (freed in stream order) until after this launch.
        unsafe { builder.launch(config) }
            .map_err(|e| Error::Launch { kernel, message: describe(&format!("launching `{}`", launch.symbol), e) })?;
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

/// A module loaded into one context, with the functions fetched from it so far.
struct LoadedModule {
    module: Arc<CudaModule>,
    functions: HashMap<&'static str, LoadedFunction>,
}

struct LoadedFunction {
    function: Arc<CudaFunction>,
    /// The dynamic shared memory the function is currently allowed to use.
    smem_limit: u32,
}

/// (context handle, fatbin address, fatbin length).
type ModuleKey = (usize, usize, usize);

static MODULES: LazyLock<Mutex<HashMap<ModuleKey, LoadedModule>>> = LazyLock::new(Default::default);

/// The functions for every launch of `plan`, loading the module and functions on first use and
/// raising each function's dynamic shared memory limit as far as the plan needs.
fn load_functions(stream: &CudaStream, fatbin: &Fatbin, plan: &LaunchPlan) -> Result<Vec<Arc<CudaFunction>>, Error> {
    let kernel = plan.kernel;
    let ctx = stream.context();
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
    plan.launches.iter().map(|launch| loaded.function(launch, kernel)).collect()
}

fn load_module(ctx: &Arc<CudaContext>, fatbin: &Fatbin, kernel: &'static str) -> Result<LoadedModule, Error> {
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| Error::Launch { kernel, message: describe("querying the compute capability", e) })?;
    let have = (u32::try_from(major).unwrap_or(0), u32::try_from(minor).unwrap_or(0));
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
    Ok(LoadedModule { module, functions: HashMap::new() })
}

impl LoadedModule {
    fn function(&mut self, launch: &KernelLaunch, kernel: &'static str) -> Result<Arc<CudaFunction>, Error> {
        let symbol = launch.symbol;
        let loaded = match self.functions.entry(symbol) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let function = self.module.load_function(symbol).map_err(|err| Error::Launch {
                    kernel,
                    message: describe(&format!("finding `{symbol}` in the fatbin"), err),
                })?;
                e.insert(LoadedFunction { function: Arc::new(function), smem_limit: DEFAULT_DYNAMIC_SMEM })
            }
        };
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
        Ok(Arc::clone(&loaded.function))
    }
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
/// launch are recorded when it is done.
#[derive(Debug)]
pub struct Args<'a> {
    plan: &'a LaunchPlan,
    stream: &'a Arc<CudaStream>,
    extents: Vec<u64>,
    inputs: Vec<DevPtr>,
    outputs: Vec<DevPtr>,
    /// Record this launch's reads and writes on the buffers' events when dropped, which
    /// happens after the kernels are queued.
    guards: Vec<SyncOnDrop<'a>>,
}

impl<'a> Args<'a> {
    /// Starts an argument list for `stream`; `dynamic` holds the dynamic extents in declaration
    /// order.
    pub fn new(plan: &'a LaunchPlan, stream: &'a Arc<CudaStream>, dynamic: &[usize]) -> Result<Self, Error> {
        require_driver()?;
        let io = plan.inputs.len() + plan.outputs.len();
        Ok(Self {
            plan,
            stream,
            extents: plan::extents(plan, dynamic)?,
            inputs: Vec::with_capacity(plan.inputs.len()),
            outputs: Vec::with_capacity(plan.outputs.len()),
            guards: Vec::with_capacity(io),
        })
    }

    /// The full extent vector, one entry per dim.
    pub fn extents(&self) -> &[u64] {
        &self.extents
    }

    /// Adds the next declared input: a `CudaSlice`, `CudaView` or `CudaViewMut`.
    pub fn input<T: Element, S: DevicePtr<T>>(&mut self, buf: &'a S) -> Result<&mut Self, Error> {
        let name =
            plan::check_arg(self.plan, &self.extents, Role::Input, self.inputs.len(), T::DTYPE, DeviceSlice::len(buf))?;
        self.check_context(DeviceSlice::stream(buf), name)?;
        let (ptr, guard) = buf.device_ptr(self.stream);
        self.inputs.push(ptr);
        self.guards.push(guard);
        Ok(self)
    }

    /// Adds the next declared output: a `CudaSlice` or `CudaViewMut`.
    pub fn output<T: Element, S: DevicePtrMut<T>>(&mut self, buf: &'a mut S) -> Result<&mut Self, Error> {
        let name = plan::check_arg(
            self.plan,
            &self.extents,
            Role::Output,
            self.outputs.len(),
            T::DTYPE,
            DeviceSlice::len(buf),
        )?;
        self.check_context(DeviceSlice::stream(buf), name)?;
        let (ptr, guard) = buf.device_ptr_mut(self.stream);
        self.outputs.push(ptr);
        self.guards.push(guard);
        Ok(self)
    }

    fn check_context(&self, owner: &CudaStream, arg: &'static str) -> Result<(), Error> {
        if owner.context().cu_ctx() == self.stream.context().cu_ctx() {
            Ok(())
        } else {
            Err(Error::ContextMismatch { arg })
        }
    }

    /// Queues the plan's kernels on the stream. `fatbin` is `None` when the crate was built
    /// without nvcc, which gives [`Error::NotBuilt`].
    ///
    /// # Safety
    ///
    /// `fatbin` must hold the kernels this plan was generated with. Generated launchers pass
    /// the fatbin built from the same generated source as the plan.
    pub unsafe fn launch(self, fatbin: Option<&Fatbin>) -> Result<(), Error> {
        plan::check_complete(self.plan, self.inputs.len(), self.outputs.len())?;
        // SAFETY: every address comes from a buffer borrowed for 'a in the stream's context,
        // whose dtype and length were checked against the declaration for these extents, and
        // outputs come from `&mut` borrows, so they overlap nothing else; the caller vouches
        // for the fatbin. `self.guards` is dropped after this call returns.
        unsafe { execute(self.stream, fatbin, self.plan, &self.extents, &self.inputs, &self.outputs) }
    }
}
