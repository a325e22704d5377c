//! A hand-written stand-in for one generated kernel module: a Split-K row sum with a split
//! launch, a combine launch and a workspace. It checks that the runtime's API composes from
//! `static` items the way generated code uses it, and runs the host executor end to end with
//! Rust `extern "C"` functions in place of the emulated CUDA kernels; those functions check
//! every argument they receive.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use cleave_runtime::cudarc::driver::{CudaStream, CudaView, CudaViewMut};
use cleave_runtime::host::EmuLaunch;
use cleave_runtime::{cuda, Error};

/// What the generated module for this declaration would look like:
///
/// ```yaml
/// - name: rowsum
///   dims: { m: 3, k: { value: 100, dynamic: true } }
///   inputs: { x: f32[m, k] }
///   outputs: { y: f32[m, 1] }
///   body: y = sum(x, axis=-1)
/// ```
// Generated modules are `pub` items of the user's crate; in this test crate they are unreachable.
#[allow(unreachable_pub)]
mod rowsum {
    use super::*;
    use cleave_runtime::{f16, WorkspaceSpec};
    use cleave_runtime::{Axis, DType, DimSpec, Factor, KernelLaunch, LaunchPlan, Param, Product, TensorSpec};

    #[derive(Debug, Clone, Copy)]
    pub struct Dims {
        pub k: usize,
    }

    pub const SPLITS: u64 = 4;

    pub static PLAN: LaunchPlan = LaunchPlan {
        kernel: "rowsum",
        dims: &[
            DimSpec { name: "m", value: 3, dynamic: false, derive: None },
            DimSpec { name: "k", value: 100, dynamic: true, derive: None },
        ],
        inputs: &[TensorSpec { name: "x", dtype: DType::F32, shape: &[Axis::Dim(0), Axis::Dim(1)] }],
        outputs: &[TensorSpec { name: "y", dtype: DType::F32, shape: &[Axis::Dim(0), Axis::One] }],
        workspaces: &[WorkspaceSpec { elem_bytes: 4, len: Product(&[Factor::Dim(0), Factor::Const(SPLITS)]) }],
        launches: &[
            KernelLaunch {
                symbol: "rowsum_split",
                grid: [Product(&[Factor::Dim(0)]), Product(&[Factor::Const(SPLITS)]), Product(&[])],
                threads: 32,
                smem_bytes: 0,
                params: &[Param::Input(0), Param::Workspace(0), Param::Extent(0), Param::Extent(1)],
            },
            KernelLaunch {
                symbol: "rowsum_combine",
                grid: [Product(&[Factor::CeilDiv(0, 2)]), Product(&[]), Product(&[])],
                threads: 64,
                smem_bytes: 70_000,
                params: &[Param::Workspace(0), Param::Output(0), Param::Extent(0)],
            },
        ],
        tables: &[],
    };

    /// `None`: this stand-in was "built without nvcc".
    static FATBIN: Option<cuda::Fatbin> = None;

    /// The GPU launcher, exactly as generated code would write it.
    pub fn launch(
        stream: &Arc<CudaStream>,
        x: &CudaView<'_, f32>,
        y: &mut CudaViewMut<'_, f32>,
        dims: Dims,
    ) -> Result<(), Error> {
        let mut args = cuda::Args::new(&PLAN, stream, &[dims.k])?;
        args.input(x)?.output(y)?;
        // SAFETY: FATBIN was built from the same generated source as PLAN.
        unsafe { args.launch(FATBIN.as_ref()) }
    }

    /// The host launcher, exactly as generated code would write it.
    pub fn run_host(x: &[f32], y: &mut [f32], dims: Dims) -> Result<(), Error> {
        let mut args = cleave_runtime::host::Args::new(&PLAN, &[dims.k])?;
        args.input(x)?.output(y)?;
        // SAFETY: the functions implement PLAN's launches (here: by hand, below).
        unsafe { args.run(&[rowsum_split, rowsum_combine], 7) }
    }

    /// Passes an f16 buffer where the declaration says f32.
    pub fn run_host_wrong_dtype(x: &[f16], y: &mut [f32], dims: Dims) -> Result<(), Error> {
        let mut args = cleave_runtime::host::Args::new(&PLAN, &[dims.k])?;
        args.input(x)?.output(y)?;
        // SAFETY: as in `run_host`.
        unsafe { args.run(&[rowsum_split, rowsum_combine], 7) }
    }
}

/// Writes `msg` into the emulator's error buffer and returns a failure code.
///
/// # Safety
/// `l` must point to a valid `EmuLaunch` whose `err` buffer holds `err_len` bytes.
unsafe fn fail(l: *const EmuLaunch, msg: &str) -> c_int {
    // SAFETY: guaranteed by the caller.
    let l = unsafe { &*l };
    let n = msg.len().min(l.err_len - 1);
    // SAFETY: `err` holds `err_len` bytes and we write at most `err_len - 1` plus the NUL.
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr(), l.err.cast::<u8>(), n);
        *l.err.add(n) = 0;
    }
    1
}

/// Reads parameter `i` as a pointer.
///
/// # Safety
/// `args[i]` must point at a pointer-sized slot.
unsafe fn ptr_arg<T>(args: *const *mut c_void, i: usize) -> *mut T {
    // SAFETY: guaranteed by the caller.
    unsafe { *(*args.add(i)).cast::<*mut T>() }
}

/// Reads parameter `i` as an i64 extent.
///
/// # Safety
/// `args[i]` must point at an i64 slot.
unsafe fn extent_arg(args: *const *mut c_void, i: usize) -> i64 {
    // SAFETY: guaranteed by the caller.
    unsafe { *(*args.add(i)).cast::<i64>() }
}

/// The split kernel: block (row, split) sums its quarter of the row into the workspace.
unsafe extern "C" fn rowsum_split(l: *const EmuLaunch, args: *const *mut c_void) -> c_int {
    // SAFETY: the executor passes a valid launch and the four parameters of the plan.
    unsafe {
        let launch = &*l;
        let (x, ws) = (ptr_arg::<f32>(args, 0), ptr_arg::<f32>(args, 1));
        let (m, k) = (extent_arg(args, 2), extent_arg(args, 3));
        if launch.block != [32, 1, 1] || launch.smem_bytes != 0 || launch.seed != 7 {
            return fail(l, &format!("bad launch config {:?}", launch));
        }
        if launch.grid != [m as u32, rowsum::SPLITS as u32, 1] {
            return fail(l, &format!("split grid {:?} for m={m}", launch.grid));
        }
        if ws as usize % 16 != 0 {
            return fail(l, "workspace is not 16-byte aligned");
        }
        let ws_len = (m as u64 * rowsum::SPLITS) as usize;
        // A fresh workspace is all NaN, so a read of an unwritten partial would show.
        if (0..ws_len).any(|i| !(*ws.add(i)).is_nan()) {
            return fail(l, "workspace was not filled with NaN");
        }
        let chunk = (k as u64).div_ceil(rowsum::SPLITS) as i64;
        for row in 0..launch.grid[0] as i64 {
            for split in 0..launch.grid[1] as i64 {
                let (lo, hi) = (split * chunk, ((split + 1) * chunk).min(k));
                let sum: f32 = (lo..hi).map(|c| *x.add((row * k + c) as usize)).sum();
                *ws.add((row * rowsum::SPLITS as i64 + split) as usize) = sum;
            }
        }
        0
    }
}

/// The combine kernel: block b adds up the partials of rows 2b and 2b+1.
unsafe extern "C" fn rowsum_combine(l: *const EmuLaunch, args: *const *mut c_void) -> c_int {
    // SAFETY: the executor passes a valid launch and the three parameters of the plan.
    unsafe {
        let launch = &*l;
        let (ws, y) = (ptr_arg::<f32>(args, 0), ptr_arg::<f32>(args, 1));
        let m = extent_arg(args, 2);
        if launch.block != [64, 1, 1] || launch.smem_bytes != 70_000 {
            return fail(l, &format!("bad launch config {:?}", launch));
        }
        if i64::from(launch.grid[0]) != (m + 1) / 2 || launch.grid[1..] != [1, 1] {
            return fail(l, &format!("combine grid {:?} for m={m}", launch.grid));
        }
        for b in 0..i64::from(launch.grid[0]) {
            for row in (2 * b)..(2 * b + 2).min(m) {
                let parts = (0..rowsum::SPLITS as i64).map(|s| *ws.add((row * rowsum::SPLITS as i64 + s) as usize));
                *y.add(row as usize) = parts.sum();
            }
        }
        0
    }
}

#[test]
fn host_executor_runs_split_and_combine() {
    for k in [1usize, 5, 100, 257] {
        let x: Vec<f32> = (0..3 * k).map(|i| (i % 17) as f32 - 8.0).collect();
        let mut y = vec![0.0f32; 3];
        rowsum::run_host(&x, &mut y, rowsum::Dims { k }).unwrap();
        let want: Vec<f32> = x.chunks(k).map(|row| row.iter().sum()).collect();
        assert_eq!(y, want, "k={k}");
    }
}

#[test]
fn host_executor_checks_lengths_and_dtypes() {
    let x = vec![0.0f32; 3 * 10];
    let mut y = vec![0.0f32; 3];
    let err = rowsum::run_host(&x, &mut y, rowsum::Dims { k: 11 }).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { arg: "x", expected: 33, got: 30 }), "{err}");
    assert_eq!(err.to_string(), "argument `x` has 30 elements, but the given extents need exactly 33");

    let mut short = vec![0.0f32; 2];
    let err = rowsum::run_host(&x, &mut short, rowsum::Dims { k: 10 }).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { arg: "y", expected: 3, got: 2 }), "{err}");

    let xh = vec![cleave_runtime::f16::ZERO; 30];
    let err = rowsum::run_host_wrong_dtype(&xh, &mut y, rowsum::Dims { k: 10 }).unwrap_err();
    assert_eq!(err.to_string(), "argument `x` holds f16 elements, but the kernel declares it as f32");

    let err = rowsum::run_host(&x, &mut y, rowsum::Dims { k: 0 }).unwrap_err();
    assert!(matches!(err, Error::InvalidExtent { dim: "k", value: 0, .. }), "{err}");
}

#[test]
fn emulator_errors_carry_the_kernel_and_message() {
    unsafe extern "C" fn boom(l: *const EmuLaunch, _args: *const *mut c_void) -> c_int {
        // SAFETY: the executor passes a valid launch with an error buffer.
        unsafe { fail(l, "mma fragment out of range") }
    }
    unsafe extern "C" fn silent(_l: *const EmuLaunch, _args: *const *mut c_void) -> c_int {
        3
    }
    let x = vec![1.0f32; 3 * 4];
    let mut y = vec![0.0f32; 3];
    let mut args = cleave_runtime::host::Args::new(&rowsum::PLAN, &[4]).unwrap();
    args.input(&x).unwrap().output(&mut y).unwrap();
    // SAFETY: `boom` touches no parameter.
    let err = unsafe { args.run(&[boom, boom], 7) }.unwrap_err();
    assert_eq!(err.to_string(), "kernel `rowsum` (host emulation): launch `rowsum_split`: mma fragment out of range");

    let mut args = cleave_runtime::host::Args::new(&rowsum::PLAN, &[4]).unwrap();
    args.input(&x).unwrap().output(&mut y).unwrap();
    // SAFETY: `rowsum_split` implements the first launch; `silent` touches nothing.
    let err = unsafe { args.run(&[rowsum_split, silent], 7) }.unwrap_err();
    assert_eq!(err.to_string(), "kernel `rowsum` (host emulation): launch `rowsum_combine` failed with code 3");
}

#[test]
fn builder_reports_missing_and_extra_arguments() {
    let x = vec![1.0f32; 3 * 4];
    let mut y = vec![0.0f32; 3];
    let mut args = cleave_runtime::host::Args::new(&rowsum::PLAN, &[4]).unwrap();
    args.input(&x).unwrap();
    // SAFETY: the run is refused before any function is called.
    let err = unsafe { args.run(&[rowsum_split, rowsum_combine], 0) }.unwrap_err();
    assert_eq!(err.to_string(), "kernel `rowsum`: output `y` was not passed (0 of 1 given)");

    let mut args = cleave_runtime::host::Args::new(&rowsum::PLAN, &[4]).unwrap();
    args.input(&x).unwrap().output(&mut y).unwrap();
    let err = args.input(&x).unwrap_err();
    assert_eq!(err.to_string(), "kernel `rowsum`: 2 inputs were passed, but the kernel declares 1");

    let err = cleave_runtime::host::Args::new(&rowsum::PLAN, &[4, 5]).unwrap_err();
    assert_eq!(err.to_string(), "kernel `rowsum` has 1 dynamic dims (k), but 2 extents were given");

    let mut args = cleave_runtime::host::Args::new(&rowsum::PLAN, &[4]).unwrap();
    args.input(&x).unwrap().output(&mut y).unwrap();
    // SAFETY: the run is refused before any function is called.
    let err = unsafe { args.run(&[rowsum_split], 0) }.unwrap_err();
    assert_eq!(err.to_string(), "kernel `rowsum`: 1 emulated kernels were given for 2 launches");
}

#[test]
fn gpu_launcher_has_the_generated_signature() {
    type Launcher = for<'a, 'b, 'c, 'd> fn(
        &'a Arc<CudaStream>,
        &'b CudaView<'c, f32>,
        &'b mut CudaViewMut<'d, f32>,
        rowsum::Dims,
    ) -> Result<(), Error>;
    // The coercion is the test: it compiles only if `launch` has exactly this signature.
    let _launcher: Launcher = rowsum::launch;
}

#[test]
fn cuda_executor_without_a_driver_is_an_error_not_a_panic() {
    if cuda::driver_present() {
        // On a machine with a driver, opening a device must still never panic.
        match cuda::context(0) {
            Ok(_) | Err(Error::NoDevice { .. }) => {}
            Err(e) => panic!("unexpected error with a driver present: {e}"),
        }
    } else {
        let err = cuda::context(0).unwrap_err();
        assert!(matches!(err, Error::NoDriver), "{err}");
        assert!(err.to_string().contains("libcuda"), "{err}");
    }
}
