//! The host-emulation executor.
//!
//! The generated CUDA source is also compiled as C++ for the CPU against an emulation header;
//! each kernel becomes an `extern "C"` function of type [`EmuFn`] that runs a whole grid. This
//! module runs a [`LaunchPlan`] through those functions exactly as the CUDA executor runs it on
//! a GPU: same grids, same workspaces, same argument order.

use std::ffi::{c_char, c_int, c_void, CString};
use std::marker::PhantomData;

use crate::element::Element;
use crate::layout::Layouts;
use crate::plan::{self, DType, LaunchPlan, Param, Role};
use crate::Error;

/// One emulated kernel: runs the whole grid described by the [`EmuLaunch`], reading its
/// parameters through `args` (one pointer per kernel parameter, pointing at the parameter's
/// value, as with `cuLaunchKernel`). Returns 0 on success; otherwise it has written a
/// NUL-terminated message into `err`.
pub type EmuFn = unsafe extern "C" fn(launch: *const EmuLaunch, args: *const *mut c_void) -> c_int;

/// One global buffer of a launch, for the emulator's bounds checks. The C side declares
/// `struct { const void* base; uint64_t bytes; const char* name; }`.
#[repr(C)]
#[derive(Debug)]
pub struct EmuBuffer {
    /// The first byte.
    pub base: *const c_void,
    /// Its length in bytes.
    pub bytes: u64,
    /// A NUL-terminated name for messages (the tensor's declared name).
    pub name: *const c_char,
}

/// Which of the emulator's checks run (bits of [`EmuLaunch::checks`]).
pub mod checks {
    /// Shared-memory races, cp.async hazards, and collectives or barriers in divergent code.
    pub const RACES: u32 = 1;
    /// Global and shared accesses inside their buffers.
    pub const BOUNDS: u32 = 2;
    /// Every check.
    pub const ALL: u32 = RACES | BOUNDS;
}

/// The order in which the emulator runs a block's threads between synchronization points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Schedule {
    /// Runnable threads in the order they became runnable.
    RoundRobin = 0,
    /// A seeded random runnable thread each time (and cp.async copies landing at seeded random
    /// moments between issue and wait).
    Random = 1,
    /// The last thread made runnable first: one warp runs as far as it can before the others.
    RunAhead = 2,
}

/// How the host emulator runs kernels: which checks and which schedule.
///
/// The default is every check with the round-robin schedule (the checks do not depend on the
/// schedule; the other schedules vary the order of effects for results to expose).
/// `CLEAVE_EMU_CHECKS` (`all`, `none`, or a comma list of `races` and `bounds`) and
/// `CLEAVE_EMU_SCHEDULE` (`round-robin`, `random`, `run-ahead`) override it for every
/// `run_host` of the process ([`EmuOptions::from_env`]). The checks cost time: see the README.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmuOptions {
    /// Bits of [`checks`].
    pub checks: u32,
    /// The thread schedule.
    pub schedule: Schedule,
}

impl Default for EmuOptions {
    fn default() -> Self {
        EmuOptions { checks: checks::ALL, schedule: Schedule::RoundRobin }
    }
}

impl EmuOptions {
    /// Parses `CLEAVE_EMU_CHECKS` and `CLEAVE_EMU_SCHEDULE` values (`None`: unset).
    pub fn parse(checks: Option<&str>, schedule: Option<&str>) -> Result<EmuOptions, String> {
        let mut o = EmuOptions::default();
        if let Some(c) = checks {
            o.checks = 0;
            for word in c.split(',').map(str::trim).filter(|w| !w.is_empty()) {
                o.checks |= match word {
                    "all" => checks::ALL,
                    "none" => 0,
                    "races" => checks::RACES,
                    "bounds" => checks::BOUNDS,
                    other => {
                        return Err(format!(
                            "CLEAVE_EMU_CHECKS: unknown check `{other}`; expected all, none, races or bounds"
                        ))
                    }
                };
            }
        }
        if let Some(s) = schedule {
            o.schedule = match s.trim() {
                "random" => Schedule::Random,
                "round-robin" => Schedule::RoundRobin,
                "run-ahead" => Schedule::RunAhead,
                other => {
                    return Err(format!(
                        "CLEAVE_EMU_SCHEDULE: unknown schedule `{other}`; expected random, round-robin or run-ahead"
                    ))
                }
            };
        }
        Ok(o)
    }

    /// The options the environment asks for.
    pub fn from_env() -> Result<EmuOptions, String> {
        let checks = std::env::var("CLEAVE_EMU_CHECKS").ok();
        let schedule = std::env::var("CLEAVE_EMU_SCHEDULE").ok();
        EmuOptions::parse(checks.as_deref(), schedule.as_deref())
    }
}

/// The launch configuration handed to an emulated kernel.
///
/// The C side declares the same struct: `struct { uint32_t grid[3]; uint32_t block[3];
/// uint32_t smem_bytes; uint64_t seed; char* err; size_t err_len; const cleave_emu_buffer*
/// buffers; uint32_t nbuffers; uint32_t checks; uint32_t schedule; }`.
#[repr(C)]
#[derive(Debug)]
pub struct EmuLaunch {
    /// Blocks along x, y and z.
    pub grid: [u32; 3],
    /// Threads along x, y and z.
    pub block: [u32; 3],
    /// Dynamic shared memory per block in bytes.
    pub smem_bytes: u32,
    /// Seeds the emulator's choices (e.g. the order in which it runs warps), so a failing run
    /// can be replayed.
    pub seed: u64,
    /// A buffer of `err_len` bytes for an error message.
    pub err: *mut c_char,
    /// The size of `err` in bytes, including room for the terminating NUL.
    pub err_len: usize,
    /// The launch's global buffers (inputs, outputs, workspaces), for the bounds checks.
    pub buffers: *const EmuBuffer,
    /// How many `buffers` there are.
    pub nbuffers: u32,
    /// Bits of [`checks`].
    pub checks: u32,
    /// A [`Schedule`] as its number.
    pub schedule: u32,
}

/// The size of the error-message buffer handed to each emulated kernel.
const ERR_BUF_LEN: usize = 4096;

/// The fill byte of fresh workspaces: every f16, bf16 and f32 made of it is a NaN, so a kernel
/// that reads a partial result nobody wrote produces NaNs instead of plausible numbers.
const WORKSPACE_FILL: u8 = 0xFF;

/// A 16-byte-aligned chunk, so workspaces are aligned for 16-byte vector accesses.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Chunk([u8; 16]);

/// Runs `plan` on the host with the options of the environment ([`EmuOptions::from_env`]);
/// see [`execute_with`].
///
/// # Safety
///
/// As for [`execute_with`].
pub unsafe fn execute(
    plan: &LaunchPlan,
    fns: &[EmuFn],
    extents: &[u64],
    layouts: &Layouts,
    inputs: &[*const u8],
    outputs: &[*mut u8],
    seed: u64,
) -> Result<(), Error> {
    let options = EmuOptions::from_env().map_err(|message| Error::InvalidArguments { kernel: plan.kernel, message })?;
    // SAFETY: the caller upholds `execute_with`'s contract.
    unsafe { execute_with(plan, fns, extents, layouts, inputs, outputs, seed, &options) }
}

/// Runs `plan` on the host: allocates its workspaces, then calls `fns[i]` for
/// `plan.launches[i]`, in order, with the emulator's checks and schedule from `options`.
///
/// `extents` has one entry per dim of the plan (see [`plan::extents`]); `layouts` gives each
/// tensor's view ([`Layouts::contiguous`] for dense tensors); `inputs` and `outputs` hold one
/// pointer per declared tensor, its view's first element. A launch whose grid has a zero
/// dimension is skipped.
///
/// # Safety
///
/// Each pointer in `inputs` must be valid for reads, and each in `outputs` valid for reads and
/// writes, of its view's span (for these extents) times its dtype's size, aligned as
/// [`crate::layout::alignment`] says; outputs must not overlap any other argument, nor
/// themselves. Each `fns[i]` must implement `plan.launches[i]` (read exactly the parameters
/// the plan lists, in that order).
#[allow(clippy::too_many_arguments)]
pub unsafe fn execute_with(
    plan: &LaunchPlan,
    fns: &[EmuFn],
    extents: &[u64],
    layouts: &Layouts,
    inputs: &[*const u8],
    outputs: &[*mut u8],
    seed: u64,
    options: &EmuOptions,
) -> Result<(), Error> {
    plan::check_call(plan, extents, inputs.len(), outputs.len())?;
    // Index tables are in host memory here: a malformed one is refused before any kernel runs.
    let table = |i: usize| -> Option<&[i32]> {
        let spec = plan.inputs.get(i)?;
        let len = usize::try_from(layouts.input_span(i)?).ok()?;
        let p = *inputs.get(i)?;
        // SAFETY: the caller guarantees each input pointer valid for reads of its view's span;
        // an i32 input is a dense index tensor (its span is its length) whose dtype the plan
        // declares, so the memory holds `len` i32 values, aligned as i32.
        (spec.dtype == DType::I32 && !p.is_null()).then(|| unsafe { std::slice::from_raw_parts(p.cast::<i32>(), len) })
    };
    plan::check_tables(plan, extents, &table)?;
    if fns.len() != plan.launches.len() {
        return Err(Error::InvalidArguments {
            kernel: plan.kernel,
            message: format!("{} emulated kernels were given for {} launches", fns.len(), plan.launches.len()),
        });
    }

    let mut workspaces = Vec::with_capacity(plan.workspaces.len());
    for (i, ws) in plan.workspaces.iter().enumerate() {
        let bytes = ws
            .bytes(extents)
            .ok_or_else(|| Error::Overflow { kernel: plan.kernel, quantity: format!("the size of workspace {i}") })?;
        workspaces.push(alloc_workspace(plan.kernel, bytes)?);
    }

    // Each parameter value lives in one of these vectors and the args arrays point into them.
    // They are complete before the base pointers are taken, so they never move, and they stay
    // in scope until this function returns, after the last call.
    let mut input_slots: Vec<*mut c_void> = inputs.iter().map(|p| p.cast_mut().cast()).collect();
    let mut output_slots: Vec<*mut c_void> = outputs.iter().map(|p| p.cast()).collect();
    let mut workspace_slots: Vec<*mut c_void> = workspaces.iter_mut().map(|w| w.as_mut_ptr().cast()).collect();
    // Extents are at most 2^31-1 (checked above), so they convert to i64 exactly.
    let mut extent_slots: Vec<i64> = extents.iter().map(|&e| e as i64).collect();
    // Scalars by value, as f32: each scalar input's pointer points at one element of its dtype.
    let mut scalar_slots: Vec<f32> = plan
        .inputs
        .iter()
        .zip(inputs)
        .map(|(spec, p)| {
            if !spec.shape.is_empty() || p.is_null() {
                return 0.0;
            }
            // SAFETY: a scalar input's pointer is valid for reads of one element of its dtype
            // (`Args::scalar`, or the caller's contract for `execute`).
            unsafe {
                match spec.dtype {
                    DType::F16 => half::f16::from_bits(p.cast::<u16>().read_unaligned()).to_f32(),
                    DType::BF16 => half::bf16::from_bits(p.cast::<u16>().read_unaligned()).to_f32(),
                    _ => p.cast::<f32>().read_unaligned(),
                }
            }
        })
        .collect();
    let scalars_base = scalar_slots.as_mut_ptr();
    let bases =
        (input_slots.as_mut_ptr(), output_slots.as_mut_ptr(), workspace_slots.as_mut_ptr(), extent_slots.as_mut_ptr());

    // The buffers the bounds checks know, named as declared; the names outlive every call.
    let mut names: Vec<CString> = Vec::new();
    let mut buffers: Vec<EmuBuffer> = Vec::new();
    let mut add = |base: *const c_void, bytes: u64, name: String| {
        names.push(CString::new(name.replace('\0', "")).unwrap_or_default());
        let name = names.last().map_or(std::ptr::null(), |n| n.as_ptr());
        buffers.push(EmuBuffer { base, bytes, name });
    };
    // Each tensor's buffer is its view's span: an access outside the view is a bug even where
    // the caller's buffer continues.
    let span = |s: Option<u64>, i: usize| {
        s.ok_or_else(|| Error::InvalidArguments { kernel: plan.kernel, message: format!("no view of tensor {i}") })
    };
    for (i, (spec, p)) in plan.inputs.iter().zip(inputs).enumerate() {
        if spec.shape.is_empty() {
            // A scalar reaches its kernel by value, not through memory.
            continue;
        }
        let bytes = span(layouts.input_span(i), i)? * u64::from(spec.dtype.size_bytes());
        add(p.cast(), bytes, spec.name.to_string());
    }
    for (o, (spec, p)) in plan.outputs.iter().zip(outputs).enumerate() {
        let bytes = span(layouts.output_span(o), o)? * u64::from(spec.dtype.size_bytes());
        add(p.cast_const().cast(), bytes, spec.name.to_string());
    }
    for (i, w) in workspaces.iter().enumerate() {
        add(w.as_ptr().cast(), (w.len() * 16) as u64, format!("workspace {i}"));
    }
    let nbuffers = u32::try_from(buffers.len()).unwrap_or(u32::MAX);

    let mut err = vec![0u8; ERR_BUF_LEN];
    for (launch, run) in plan.launches.iter().zip(fns) {
        let grid = launch.grid_dims(plan.kernel, extents)?;
        if grid.contains(&0) {
            continue;
        }
        // The launch's strides, one slot per parameter (unused for the others); complete before
        // `args` points into it.
        let mut stride_slots: Vec<i64> = Vec::with_capacity(launch.params.len());
        for param in launch.params {
            let stride = match *param {
                Param::InputStride(i, a) => layouts.input_stride(usize::from(i), usize::from(a)),
                Param::OutputStride(i, a) => layouts.output_stride(usize::from(i), usize::from(a)),
                _ => Some(0),
            };
            // Strides are below 2^48 (checked with the view), so they convert to i64 exactly.
            stride_slots.push(stride.ok_or_else(|| Error::InvalidPlan {
                kernel: plan.kernel,
                reason: format!("launch `{}` passes a stride of a tensor out of range", launch.symbol),
            })? as i64);
        }
        let strides_base = stride_slots.as_mut_ptr();
        // Indices were checked by `validate`, so every offset stays inside its vector.
        let args: Vec<*mut c_void> = launch
            .params
            .iter()
            .enumerate()
            .map(|(j, param)| match *param {
                Param::Input(i) => bases.0.wrapping_add(usize::from(i)).cast(),
                Param::Output(i) => bases.1.wrapping_add(usize::from(i)).cast(),
                Param::Workspace(i) => bases.2.wrapping_add(usize::from(i)).cast(),
                Param::Extent(i) => bases.3.wrapping_add(usize::from(i)).cast(),
                Param::InputStride(..) | Param::OutputStride(..) => strides_base.wrapping_add(j).cast(),
                Param::Scalar(i) => scalars_base.wrapping_add(usize::from(i)).cast(),
            })
            .collect();
        err.fill(0);
        let config = EmuLaunch {
            grid,
            block: [launch.threads, 1, 1],
            smem_bytes: launch.smem_bytes,
            seed,
            err: err.as_mut_ptr().cast(),
            err_len: err.len(),
            buffers: buffers.as_ptr(),
            nbuffers,
            checks: options.checks,
            schedule: options.schedule as u32,
        };
        // SAFETY: `config` and `args` outlive the call; every args entry points at a live slot
        // holding a pointer or an i64 as the plan describes; `buffers` and the names they point
        // at live until this function returns; and the caller guarantees that the tensors
        // behind the pointers are valid and that `run` implements this launch.
        let code = unsafe { run(&config, args.as_ptr()) };
        if code != 0 {
            return Err(Error::Emulation { kernel: plan.kernel, message: emulator_message(launch.symbol, code, &err) });
        }
    }
    Ok(())
}

/// Allocates a workspace of `bytes` bytes, 16-byte aligned and filled with NaN bytes.
fn alloc_workspace(kernel: &'static str, bytes: u64) -> Result<Vec<Chunk>, Error> {
    let chunks = usize::try_from(bytes.div_ceil(16)).map_err(|_| Error::OutOfMemory { kernel, bytes })?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(chunks).map_err(|_| Error::OutOfMemory { kernel, bytes })?;
    buf.resize(chunks, Chunk([WORKSPACE_FILL; 16]));
    Ok(buf)
}

/// The emulator's message from `err` (up to the first NUL), or a generic one if it wrote none.
fn emulator_message(symbol: &str, code: c_int, err: &[u8]) -> String {
    let text = err.split(|&b| b == 0).next().unwrap_or_default();
    if text.is_empty() {
        format!("launch `{symbol}` failed with code {code}")
    } else {
        format!("launch `{symbol}`: {}", String::from_utf8_lossy(text))
    }
}

/// A typed argument list for one host-emulation call, so that a generated `run_host` is a few
/// lines: `Args::new`, one `input`/`output` per declared tensor in declaration order, `run`.
///
/// Each argument is checked against the declaration (dtype and exact length) as it is added.
#[derive(Debug)]
pub struct Args<'a> {
    plan: &'a LaunchPlan,
    extents: Vec<u64>,
    layouts: Layouts,
    inputs: Vec<*const u8>,
    outputs: Vec<*mut u8>,
    /// The values of scalar inputs in their declared dtypes, one slot per input; a scalar's
    /// entry of `inputs` points at its slot (the heap buffer does not move with the builder).
    scalars: Vec<[u8; 4]>,
    borrows: PhantomData<&'a mut [u8]>,
}

impl<'a> Args<'a> {
    /// Starts an argument list; `dynamic` holds the dynamic extents in declaration order.
    pub fn new(plan: &'a LaunchPlan, dynamic: &[usize]) -> Result<Self, Error> {
        let extents = plan::extents(plan, dynamic)?;
        Ok(Self {
            plan,
            layouts: Layouts::contiguous(plan, &extents)?,
            extents,
            inputs: Vec::with_capacity(plan.inputs.len()),
            outputs: Vec::with_capacity(plan.outputs.len()),
            scalars: vec![[0; 4]; plan.inputs.len()],
            borrows: PhantomData,
        })
    }

    /// The full extent vector, one entry per dim.
    pub fn extents(&self) -> &[u64] {
        &self.extents
    }

    /// Pins every split count to `count`, as [`crate::cuda::Args::split_count`] does on a GPU.
    pub fn split_count(&mut self, count: u64) -> Result<&mut Self, Error> {
        plan::pin_split_count(self.plan, &mut self.extents, count)?;
        Ok(self)
    }

    /// Adds the next declared input, dense and row-major: exactly its element count.
    pub fn input<T: Element>(&mut self, data: &'a [T]) -> Result<&mut Self, Error> {
        plan::check_arg(self.plan, &self.extents, Role::Input, self.inputs.len(), T::DTYPE, data.len())?;
        self.view(Role::Input, self.inputs.len(), None, data.len(), data.as_ptr() as u64)?;
        self.inputs.push(data.as_ptr().cast());
        Ok(self)
    }

    /// Adds the next declared input when it is a scalar (`[]`), by value (rounded to its
    /// declared dtype).
    pub fn scalar(&mut self, value: f32) -> Result<&mut Self, Error> {
        let i = self.inputs.len();
        let value = plan::check_scalar(self.plan, i, value)?;
        let slot = self.scalars.get_mut(i).ok_or_else(|| Error::InvalidArguments {
            kernel: self.plan.kernel,
            message: format!("{} inputs were passed, but the kernel declares {}", i + 1, self.plan.inputs.len()),
        })?;
        *slot = match self.plan.inputs[i].dtype {
            DType::F16 => {
                let b = half::f16::from_f32(value).to_le_bytes();
                [b[0], b[1], 0, 0]
            }
            DType::BF16 => {
                let b = half::bf16::from_f32(value).to_le_bytes();
                [b[0], b[1], 0, 0]
            }
            _ => value.to_le_bytes(),
        };
        self.inputs.push(slot.as_ptr());
        Ok(self)
    }

    /// Adds the next declared output, dense and row-major.
    pub fn output<T: Element>(&mut self, data: &'a mut [T]) -> Result<&mut Self, Error> {
        plan::check_arg(self.plan, &self.extents, Role::Output, self.outputs.len(), T::DTYPE, data.len())?;
        self.view(Role::Output, self.outputs.len(), None, data.len(), data.as_ptr() as u64)?;
        self.outputs.push(data.as_mut_ptr().cast());
        Ok(self)
    }

    /// Adds the next declared input as a view starting at `data[0]`: `strides` gives one
    /// element stride per declared axis (the last 1), and the view must lie inside `data`.
    pub fn input_strided<T: Element>(&mut self, data: &'a [T], strides: &[usize]) -> Result<&mut Self, Error> {
        plan::check_dtype(self.plan, Role::Input, self.inputs.len(), T::DTYPE)?;
        self.view(Role::Input, self.inputs.len(), Some(strides), data.len(), data.as_ptr() as u64)?;
        self.inputs.push(data.as_ptr().cast());
        Ok(self)
    }

    /// Adds the next declared output as a view starting at `data[0]`; elements of `data`
    /// outside the view are left as they are.
    pub fn output_strided<T: Element>(&mut self, data: &'a mut [T], strides: &[usize]) -> Result<&mut Self, Error> {
        plan::check_dtype(self.plan, Role::Output, self.outputs.len(), T::DTYPE)?;
        self.view(Role::Output, self.outputs.len(), Some(strides), data.len(), data.as_ptr() as u64)?;
        self.outputs.push(data.as_mut_ptr().cast());
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

    /// Runs the plan with `fns[i]` implementing `plan.launches[i]`.
    ///
    /// # Safety
    ///
    /// Each `fns[i]` must implement `plan.launches[i]`: read exactly the parameters the plan
    /// lists, and access the tensors only within the extents. Generated launchers pass the
    /// functions compiled from the same generated source as the plan.
    pub unsafe fn run(self, fns: &[EmuFn], seed: u64) -> Result<(), Error> {
        plan::check_complete(self.plan, self.inputs.len(), self.outputs.len())?;
        // SAFETY: every pointer comes from a slice borrowed for 'a whose dtype was checked
        // against the declaration and whose view (strides, span, alignment, an output's
        // injectivity) was checked against the slice for these extents; outputs come from
        // `&mut` slices, so they overlap nothing else; the caller vouches for `fns`.
        unsafe { execute(self.plan, fns, &self.extents, &self.layouts, &self.inputs, &self.outputs, seed) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// The C side declares the struct with natural alignment; on LP64 targets that puts the
    /// fields at these offsets, and both sides must agree byte for byte.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn emu_launch_matches_the_c_layout() {
        assert_eq!(offset_of!(EmuLaunch, grid), 0);
        assert_eq!(offset_of!(EmuLaunch, block), 12);
        assert_eq!(offset_of!(EmuLaunch, smem_bytes), 24);
        assert_eq!(offset_of!(EmuLaunch, seed), 32);
        assert_eq!(offset_of!(EmuLaunch, err), 40);
        assert_eq!(offset_of!(EmuLaunch, err_len), 48);
        assert_eq!(offset_of!(EmuLaunch, buffers), 56);
        assert_eq!(offset_of!(EmuLaunch, nbuffers), 64);
        assert_eq!(offset_of!(EmuLaunch, checks), 68);
        assert_eq!(offset_of!(EmuLaunch, schedule), 72);
        assert_eq!(size_of::<EmuLaunch>(), 80);
        assert_eq!(offset_of!(EmuBuffer, bytes), 8);
        assert_eq!(offset_of!(EmuBuffer, name), 16);
        assert_eq!(size_of::<EmuBuffer>(), 24);
        assert_eq!(align_of::<EmuLaunch>(), 8);
    }

    #[test]
    fn options_parse_from_the_environment_words() {
        assert_eq!(EmuOptions::parse(None, None), Ok(EmuOptions::default()));
        let o = EmuOptions::parse(Some("races"), Some("run-ahead")).unwrap();
        assert_eq!((o.checks, o.schedule), (checks::RACES, Schedule::RunAhead));
        assert_eq!(EmuOptions::parse(Some("none"), Some("round-robin")).unwrap().checks, 0);
        assert_eq!(EmuOptions::parse(Some("bounds, races"), None).unwrap().checks, checks::ALL);
        assert!(EmuOptions::parse(Some("racse"), None).unwrap_err().contains("unknown check `racse`"));
        assert!(EmuOptions::parse(None, Some("fifo")).unwrap_err().contains("unknown schedule `fifo`"));
    }

    #[test]
    fn workspaces_are_aligned_and_poisoned() {
        let ws = alloc_workspace("k", 33).unwrap();
        assert_eq!(ws.as_ptr() as usize % 16, 0);
        assert_eq!(ws.len(), 3);
        assert!(ws.iter().all(|c| c.0 == [0xFF; 16]));
        assert!(f32::from_bits(u32::from_ne_bytes([WORKSPACE_FILL; 4])).is_nan());
        assert!(half::f16::from_bits(u16::from_ne_bytes([WORKSPACE_FILL; 2])).is_nan());
        assert!(half::bf16::from_bits(u16::from_ne_bytes([WORKSPACE_FILL; 2])).is_nan());
        assert!(matches!(alloc_workspace("k", u64::MAX), Err(Error::OutOfMemory { kernel: "k", .. })));
    }

    #[test]
    fn emulator_messages_stop_at_the_nul() {
        assert_eq!(emulator_message("f", 2, b"bad tile\0garbage"), "launch `f`: bad tile");
        assert_eq!(emulator_message("f", 2, b"\0"), "launch `f` failed with code 2");
        assert_eq!(emulator_message("f", 2, b"no terminator"), "launch `f`: no terminator");
    }
}
