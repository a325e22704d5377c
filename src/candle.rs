//! Generated kernels on candle tensors (the `candle` feature).
//!
//! Every generated kernel module has `candle_forward(inputs..)`, written by the
//! [`__candle_forward!`](crate::__candle_forward) macro, which calls [`forward`] here. It reads
//! the dynamic extents from the inputs' shapes, checks each input's rank, extents, dtype,
//! layout and device against the declaration, allocates the outputs on the inputs' device and
//! runs the kernel:
//!
//! - CPU tensors run the host emulation of the generated CUDA (`run_host`);
//! - CUDA tensors (with the `candle-cuda` feature) launch on the device's own stream, reading
//!   and writing candle's memory in place, with no copy and no synchronisation.
//!
//! Inputs are read where they lie, at candle's strides (a narrow, a slice of a fused tensor or
//! a transpose of the outer axes is no copy); only a strided last axis is refused.
//!
//! Every mismatch is an `Err` naming the argument, never a panic.

use candle_core::{CpuStorage, DType as CandleDType, Device, Layout, Storage};
pub use candle_core::{Result, Tensor};

use crate::runtime::cuda::Fatbin;
use crate::runtime::host::{self, EmuFn};
use crate::runtime::plan::{self, DType, LaunchPlan, TensorSpec, Variant};
use crate::runtime::{bf16, f16};
use crate::Error;

/// The seed of the host emulator's thread schedule; fixed, as in `run_host`.
const HOST_SEED: u64 = 0;

fn wrap(e: Error) -> candle_core::Error {
    candle_core::Error::wrap(e)
}

/// The dtype candle uses for a declared element type.
fn candle_dtype(d: DType) -> CandleDType {
    match d {
        DType::F16 => CandleDType::F16,
        DType::BF16 => CandleDType::BF16,
        DType::F32 => CandleDType::F32,
        // candle has no i32 tensors; kernels with index tensors get no `candle_forward`, so a
        // declared i32 tensor never meets a candle one here.
        DType::I32 => CandleDType::U32,
    }
}

/// The shape of a declared tensor at these extents.
fn shape_of(spec: &TensorSpec, extents: &[u64]) -> Result<Vec<usize>> {
    spec.shape
        .iter()
        .map(|a| {
            let e = a.extent(extents).unwrap_or(0);
            usize::try_from(e).map_err(|_| candle_core::Error::msg(format!("extent {e} does not fit in usize")))
        })
        .collect()
}

/// Where an input lies in its storage: the offset of its first element and its element
/// strides, or an error when the kernels cannot read it in place. They take every axis at a
/// runtime stride but read rows contiguously, so a narrow, a slice of a fused tensor or a
/// transpose of the outer axes is read where it is; a tensor whose last axis is strided is not.
fn view_of(spec: &TensorSpec, layout: &Layout) -> Result<(usize, Vec<usize>)> {
    let (dims, strides) = (layout.dims(), layout.stride());
    let last_contiguous = dims.last().is_none_or(|&e| e <= 1) || strides.last() == Some(&1);
    if !last_contiguous {
        return Err(wrap(Error::Argument {
            arg: spec.name,
            message: format!(
                "has a strided last axis (shape {dims:?}, strides {strides:?}), and the kernels read rows \
                 contiguously; pass `.contiguous()?` of it, or declare it in its storage order and \
                 `transpose` it in the body"
            ),
        }));
    }
    Ok((layout.start_offset(), strides.to_vec()))
}

/// `data[start..]`, or an error naming the argument when the layout starts past the storage.
fn from<'a, T>(spec: &TensorSpec, data: &'a [T], start: usize) -> std::result::Result<&'a [T], Error> {
    data.get(start..).ok_or_else(|| Error::Argument {
        arg: spec.name,
        message: format!("starts at element {start} of a storage of {}", data.len()),
    })
}

/// Runs a generated kernel on candle tensors: what every `candle_forward` calls.
///
/// `inputs` are in declaration order; the result holds the outputs in declaration order.
///
/// # Safety
///
/// `hosts[i][j]` must implement `plans[i].plan.launches[j]` for each of the first
/// `hosts.len()` plans (the first GPU's, which the host runs), and `fatbin` must hold every
/// plan's kernels, as for `host::Args::run` and `cuda::Args::launch`. Generated modules pass
/// their own `PLANS`, `HOSTS` and `FATBIN`, built from one generated source.
pub unsafe fn forward<const N: usize>(
    plans: &'static [Variant],
    hosts: &[&[EmuFn]],
    fatbin: Option<&Fatbin>,
    inputs: &[&Tensor],
) -> Result<[Tensor; N]> {
    // Every plan takes the same arguments; the host runs the first, a GPU the one it picks.
    let Some(plan) = plans.first().map(|v| v.plan) else {
        return Err(wrap(Error::InvalidPlan { kernel: "?", reason: "a kernel module lists no plans".into() }));
    };
    let kernel = plan.kernel;
    if N != plan.outputs.len() {
        let message = format!("{N} outputs were asked for, but the kernel declares {}", plan.outputs.len());
        return Err(wrap(Error::InvalidArguments { kernel, message }));
    }
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.dims()).collect();
    let dynamic = plan::dynamic_from_shapes(plan, &shapes).map_err(wrap)?;
    let extents = plan::extents(plan, &dynamic).map_err(wrap)?;
    let device = match inputs.first() {
        Some(t) => t.device().clone(),
        // A kernel without inputs computes constants; they go to the CPU.
        None => Device::Cpu,
    };
    for (spec, t) in plan.inputs.iter().zip(inputs) {
        let want = candle_dtype(spec.dtype);
        if t.dtype() != want {
            let message = format!("is a {:?} tensor, but the kernel declares {}", t.dtype(), spec.dtype);
            return Err(wrap(Error::Argument { arg: spec.name, message }));
        }
        if !t.device().same_device(&device) {
            let message = format!(
                "is on {:?}, but `{}` is on {:?}; every input must be on one device",
                t.device().location(),
                plan.inputs[0].name,
                device.location()
            );
            return Err(wrap(Error::Argument { arg: spec.name, message }));
        }
    }
    let out_shapes: Vec<Vec<usize>> =
        plan.outputs.iter().map(|spec| shape_of(spec, &extents)).collect::<Result<_>>()?;
    let outputs: Vec<Tensor> = match &device {
        Device::Cpu => {
            // The host runs the first GPU's plan made nearest to these extents.
            let hosted = &plans[..hosts.len().min(plans.len())];
            let chosen = plan::nearest_index(hosted, &dynamic);
            let (Some(v), Some(host)) = (hosted.get(chosen), hosts.get(chosen)) else {
                return Err(wrap(Error::InvalidPlan { kernel, reason: "a kernel module lists no host plans".into() }));
            };
            // SAFETY: passed on from the caller.
            unsafe { forward_cpu(v.plan, host, &dynamic, inputs, &out_shapes)? }
        }
        #[cfg(feature = "candle-cuda")]
        // SAFETY: passed on from the caller.
        Device::Cuda(dev) => unsafe { cuda::forward(plans, fatbin, dev, &dynamic, inputs, &out_shapes)? },
        other => {
            let _ = fatbin;
            let message = format!(
                "is on {:?}; this build of cleave runs candle tensors on the CPU{}",
                other.location(),
                if cfg!(feature = "candle-cuda") { " and CUDA" } else { " (enable `candle-cuda` for CUDA tensors)" }
            );
            return Err(wrap(Error::Argument { arg: plan.inputs.first().map_or("", |s| s.name), message }));
        }
    };
    <[Tensor; N]>::try_from(outputs).map_err(|v| {
        let message = format!("{} outputs were produced for {N}", v.len());
        wrap(Error::InvalidArguments { kernel, message })
    })
}

/// A host output buffer of a declared element type.
enum HostBuf {
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F32(Vec<f32>),
}

impl HostBuf {
    fn new(dtype: DType, len: usize) -> Self {
        match dtype {
            DType::F16 => HostBuf::F16(vec![f16::ZERO; len]),
            DType::BF16 => HostBuf::BF16(vec![bf16::ZERO; len]),
            // Outputs are never i32 (the front end refuses them).
            DType::F32 | DType::I32 => HostBuf::F32(vec![0.0; len]),
        }
    }

    fn into_tensor(self, shape: &[usize]) -> Result<Tensor> {
        match self {
            HostBuf::F16(v) => Tensor::from_vec(v, shape, &Device::Cpu),
            HostBuf::BF16(v) => Tensor::from_vec(v, shape, &Device::Cpu),
            HostBuf::F32(v) => Tensor::from_vec(v, shape, &Device::Cpu),
        }
    }
}

/// The CPU path: the host emulation reads candle's storage in place and writes fresh vectors
/// that become the output tensors.
///
/// # Safety
///
/// As for [`forward`].
unsafe fn forward_cpu(
    plan: &'static LaunchPlan,
    host: &[EmuFn],
    dynamic: &[usize],
    inputs: &[&Tensor],
    out_shapes: &[Vec<usize>],
) -> Result<Vec<Tensor>> {
    // Read guards on every input's storage, held until the emulation has run.
    let storages: Vec<_> = inputs.iter().map(|t| t.storage_and_layout()).collect();
    let mut args = host::Args::new(plan, dynamic).map_err(wrap)?;
    for (spec, (storage, layout)) in plan.inputs.iter().zip(&storages) {
        let (start, strides) = view_of(spec, layout)?;
        let Storage::Cpu(cpu) = &**storage else {
            let message = "is not in CPU memory".to_string();
            return Err(wrap(Error::Argument { arg: spec.name, message }));
        };
        // The dtype was checked against the declaration, so the slice type matches it. The
        // view is read in place, from its first element on; the builder checks that it lies
        // inside the storage.
        match cpu {
            CpuStorage::F16(v) => from(spec, v, start).and_then(|v| args.input_strided(v, &strides).map(drop)),
            CpuStorage::BF16(v) => from(spec, v, start).and_then(|v| args.input_strided(v, &strides).map(drop)),
            CpuStorage::F32(v) => from(spec, v, start).and_then(|v| args.input_strided(v, &strides).map(drop)),
            _ => Err(Error::Argument { arg: spec.name, message: "has an unsupported dtype".into() }),
        }
        .map_err(wrap)?;
    }
    let mut bufs: Vec<HostBuf> = plan
        .outputs
        .iter()
        .zip(out_shapes)
        .map(|(spec, shape)| HostBuf::new(spec.dtype, shape.iter().product()))
        .collect();
    for buf in &mut bufs {
        match buf {
            HostBuf::F16(v) => args.output(v),
            HostBuf::BF16(v) => args.output(v),
            HostBuf::F32(v) => args.output(v),
        }
        .map_err(wrap)?;
    }
    // SAFETY: the caller vouches that `host` implements the plan's launches.
    unsafe { args.run(host, HOST_SEED) }.map_err(wrap)?;
    drop(storages);
    bufs.into_iter().zip(out_shapes).map(|(b, shape)| b.into_tensor(shape)).collect()
}

#[cfg(feature = "candle-cuda")]
mod cuda {
    //! The CUDA path: candle's device memory and stream, used in place.

    use candle_core::op::BackpropOp;
    use candle_core::{CudaDevice, CudaStorage, Storage, Tensor};

    use super::{view_of, wrap, Result};
    use crate::runtime::cuda::{Args, Fatbin};
    use crate::runtime::plan::{DType, TensorSpec, Variant};
    use crate::runtime::{bf16, f16};
    use crate::Error;

    /// A fresh device output of a declared element type.
    enum DeviceBuf {
        F16(crate::runtime::cudarc::driver::CudaSlice<f16>),
        BF16(crate::runtime::cudarc::driver::CudaSlice<bf16>),
        F32(crate::runtime::cudarc::driver::CudaSlice<f32>),
    }

    /// # Safety
    ///
    /// As for [`super::forward`].
    pub(super) unsafe fn forward(
        plans: &'static [Variant],
        fatbin: Option<&Fatbin>,
        dev: &CudaDevice,
        dynamic: &[usize],
        inputs: &[&Tensor],
        out_shapes: &[Vec<usize>],
    ) -> Result<Vec<Tensor>> {
        let stream = dev.cuda_stream();
        let plan = crate::runtime::cuda::select(stream.context(), plans, dynamic).map_err(wrap)?;
        let storages: Vec<_> = inputs.iter().map(|t| t.storage_and_layout()).collect();
        let mut views = Vec::with_capacity(inputs.len());
        for (spec, (storage, layout)) in plan.inputs.iter().zip(&storages) {
            let (start, strides) = view_of(spec, layout)?;
            let Storage::Cuda(cuda) = &**storage else {
                return Err(wrap(Error::Argument { arg: spec.name, message: "is not in CUDA memory".into() }));
            };
            views.push((spec, cuda, start, strides));
        }
        let mut outs = Vec::with_capacity(plan.outputs.len());
        for (spec, shape) in plan.outputs.iter().zip(out_shapes) {
            let len: usize = shape.iter().product();
            // SAFETY: uninitialised device memory; the kernels write every output element.
            let buf = unsafe {
                match spec.dtype {
                    DType::F16 => dev.alloc::<f16>(len).map(DeviceBuf::F16),
                    DType::BF16 => dev.alloc::<bf16>(len).map(DeviceBuf::BF16),
                    // Outputs are never i32 (the front end refuses them).
                    DType::F32 | DType::I32 => dev.alloc::<f32>(len).map(DeviceBuf::F32),
                }
            }?;
            outs.push(buf);
        }
        {
            let past_end = |spec: &TensorSpec, start: usize| {
                wrap(Error::Argument { arg: spec.name, message: format!("starts past its storage (element {start})") })
            };
            let input_views: Vec<_> = views
                .iter()
                .map(|(spec, cuda, start, strides)| -> Result<(InputView<'_>, &[usize])> {
                    let view = match spec.dtype {
                        DType::F16 => InputView::F16(cuda.as_cuda_slice::<f16>()?.try_slice(*start..)),
                        DType::BF16 => InputView::BF16(cuda.as_cuda_slice::<bf16>()?.try_slice(*start..)),
                        // An i32 input never gets here: a kernel with index tensors has no
                        // `candle_forward`, and the dtype check before refuses it.
                        DType::F32 | DType::I32 => InputView::F32(cuda.as_cuda_slice::<f32>()?.try_slice(*start..)),
                    };
                    if view.is_empty() {
                        return Err(past_end(spec, *start));
                    }
                    Ok((view, strides.as_slice()))
                })
                .collect::<Result<_>>()?;
            let mut args = Args::new(plan, &stream, dynamic).map_err(wrap)?;
            // Every view is read in place, at candle's strides; the builder checks each one
            // against its storage.
            for (view, strides) in &input_views {
                match view {
                    InputView::F16(Some(v)) => args.input_strided(v, strides),
                    InputView::BF16(Some(v)) => args.input_strided(v, strides),
                    InputView::F32(Some(v)) => args.input_strided(v, strides),
                    _ => continue,
                }
                .map_err(wrap)?;
            }
            for out in &mut outs {
                match out {
                    DeviceBuf::F16(v) => args.output(v),
                    DeviceBuf::BF16(v) => args.output(v),
                    DeviceBuf::F32(v) => args.output(v),
                }
                .map_err(wrap)?;
            }
            // SAFETY: the caller vouches that `fatbin` holds the plan's kernels.
            unsafe { args.launch(fatbin) }.map_err(wrap)?;
        }
        drop(storages);
        outs.into_iter()
            .zip(out_shapes)
            .map(|(buf, shape)| {
                let storage = match buf {
                    DeviceBuf::F16(s) => CudaStorage::wrap_cuda_slice(s, dev.clone()),
                    DeviceBuf::BF16(s) => CudaStorage::wrap_cuda_slice(s, dev.clone()),
                    DeviceBuf::F32(s) => CudaStorage::wrap_cuda_slice(s, dev.clone()),
                };
                Ok(Tensor::from_storage(Storage::Cuda(storage), shape.as_slice(), BackpropOp::none(), false))
            })
            .collect()
    }

    /// An input's storage from its first element on (`None` when the layout starts past it).
    enum InputView<'a> {
        F16(Option<crate::runtime::cudarc::driver::CudaView<'a, f16>>),
        BF16(Option<crate::runtime::cudarc::driver::CudaView<'a, bf16>>),
        F32(Option<crate::runtime::cudarc::driver::CudaView<'a, f32>>),
    }

    impl InputView<'_> {
        fn is_empty(&self) -> bool {
            matches!(self, InputView::F16(None) | InputView::BF16(None) | InputView::F32(None))
        }
    }
}

/// Writes a kernel module's `candle_forward` when `cleave` has the `candle` feature, and
/// nothing otherwise; generated modules invoke it, so whether the function exists follows
/// this crate's features rather than the user's.
#[doc(hidden)]
#[macro_export]
macro_rules! __candle_forward {
    ($(#[$meta:meta])* fn $name:ident($($input:ident),*) -> [$($output:ident),+];) => {
        $(#[$meta])*
        pub fn $name($($input: &$crate::candle::Tensor),*)
            -> $crate::candle::Result<($($crate::__candle_forward!(@tensor $output)),+)>
        {
            // SAFETY: PLANS, HOSTS and FATBIN of the generated module were built from one
            // generated source.
            let [$($output),+] = unsafe { $crate::candle::forward(&PLANS, &HOSTS, FATBIN.as_ref(), &[$($input),*]) }?;
            ::core::result::Result::Ok(($($output),+))
        }
    };
    (@tensor $output:ident) => { $crate::candle::Tensor };
}
