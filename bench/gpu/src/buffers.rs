//! Typed tensors on the host and on the device, whichever of f16, bf16, f32 and i32 a
//! declaration names, with seeded random filling and raw little-endian files.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use cleave::runtime::cudarc::driver::result as cuda_result;
use cleave::runtime::cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtrMut};
use cleave::{bf16, f16};
use cleave_core::graph::DType;
use cleave_core::reference::Rng;

use crate::error::BenchError;

/// A tensor element the benchmark can allocate, fill, upload and write.
pub(crate) trait Elem: cleave::runtime::Element + Send + Sync + 'static {
    /// The dtype as the declaration front end spells it.
    const CORE_DTYPE: DType;
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn le_bytes(self, out: &mut Vec<u8>);
    fn host(b: &HostBuf) -> Option<&[Self]>;
    fn host_mut(b: &mut HostBuf) -> Option<&mut [Self]>;
    fn dev(b: &DevBuf) -> Option<&CudaSlice<Self>>;
    fn dev_mut(b: &mut DevBuf) -> Option<&mut CudaSlice<Self>>;
}

macro_rules! elem {
    ($t:ty, $variant:ident, $dtype:expr, $from:expr, $to:expr, $bytes:expr) => {
        impl Elem for $t {
            const CORE_DTYPE: DType = $dtype;
            fn from_f64(x: f64) -> Self {
                $from(x)
            }
            fn to_f64(self) -> f64 {
                $to(self)
            }
            fn le_bytes(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&$bytes(self));
            }
            fn host(b: &HostBuf) -> Option<&[Self]> {
                match b {
                    HostBuf::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn host_mut(b: &mut HostBuf) -> Option<&mut [Self]> {
                match b {
                    HostBuf::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn dev(b: &DevBuf) -> Option<&CudaSlice<Self>> {
                match b {
                    DevBuf::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn dev_mut(b: &mut DevBuf) -> Option<&mut CudaSlice<Self>> {
                match b {
                    DevBuf::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

elem!(f16, F16, DType::F16, f16::from_f64, f16::to_f64, |x: f16| x.to_bits().to_le_bytes());
elem!(bf16, Bf16, DType::BF16, bf16::from_f64, bf16::to_f64, |x: bf16| x.to_bits().to_le_bytes());
elem!(f32, F32, DType::F32, |x: f64| x as f32, f64::from, |x: f32| x.to_le_bytes());
elem!(i32, I32, DType::I32, |x: f64| x as i32, f64::from, |x: i32| x.to_le_bytes());

/// A host tensor in its declared dtype.
#[derive(Debug)]
pub(crate) enum HostBuf {
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    F32(Vec<f32>),
    I32(Vec<i32>),
}

/// Runs `$body` with `$v` bound to the typed vector of a `HostBuf` and `$t` to its element
/// type, so that each operation is written once for the three dtypes.
macro_rules! with_host {
    ($buf:expr, $v:ident => $body:expr) => {
        match $buf {
            HostBuf::F16($v) => $body,
            HostBuf::Bf16($v) => $body,
            HostBuf::F32($v) => $body,
            HostBuf::I32($v) => $body,
        }
    };
}

impl HostBuf {
    /// `len` NaNs: an output buffer whose unwritten elements show up in any comparison.
    pub(crate) fn nan(dtype: DType, len: usize) -> HostBuf {
        match dtype {
            DType::F16 => HostBuf::F16(vec![f16::NAN; len]),
            DType::BF16 => HostBuf::Bf16(vec![bf16::NAN; len]),
            DType::F32 => HostBuf::F32(vec![f32::NAN; len]),
            // No NaN: all-ones bytes, as on the device.
            DType::I32 => HostBuf::I32(vec![-1; len]),
        }
    }

    /// `len` values drawn from N(0, std²) and rounded to `dtype`, generated in parallel from
    /// `seed` (each chunk of the tensor has its own stream, so the result does not depend on
    /// the number of threads).
    pub(crate) fn random(dtype: DType, len: usize, std: f64, seed: u64) -> HostBuf {
        match dtype {
            DType::F16 => HostBuf::F16(random_vec(len, std, seed)),
            DType::BF16 => HostBuf::Bf16(random_vec(len, std, seed)),
            DType::F32 => HostBuf::F32(random_vec(len, std, seed)),
            DType::I32 => HostBuf::I32(random_vec(len, std, seed)),
        }
    }

    pub(crate) fn slice<T: Elem>(&self, name: &str) -> Result<&[T], BenchError> {
        T::host(self).ok_or_else(|| BenchError::dtype(name, T::CORE_DTYPE))
    }

    pub(crate) fn slice_mut<T: Elem>(&mut self, name: &str) -> Result<&mut [T], BenchError> {
        T::host_mut(self).ok_or_else(|| BenchError::dtype(name, T::CORE_DTYPE))
    }

    pub(crate) fn to_f64(&self) -> Vec<f64> {
        with_host!(self, v => v.iter().map(|x| Elem::to_f64(*x)).collect())
    }

    /// How many elements are NaN or infinite.
    pub(crate) fn count_nonfinite(&self) -> usize {
        with_host!(self, v => v.iter().filter(|x| !Elem::to_f64(**x).is_finite()).count())
    }

    /// Writes the elements as raw little-endian values.
    pub(crate) fn write_raw(&self, path: &Path) -> Result<(), BenchError> {
        let mut bytes = Vec::new();
        with_host!(self, v => {
            bytes.reserve(std::mem::size_of_val(v.as_slice()));
            for x in v {
                x.le_bytes(&mut bytes);
            }
        });
        write_file(path, &bytes)
    }

    /// Copies the tensor to the device.
    pub(crate) fn upload(&self, stream: &Arc<CudaStream>) -> Result<DevBuf, BenchError> {
        let what = "copying an input to the GPU";
        Ok(match self {
            HostBuf::F16(v) => DevBuf::F16(stream.clone_htod(v).map_err(|e| BenchError::driver(what, e))?),
            HostBuf::Bf16(v) => DevBuf::Bf16(stream.clone_htod(v).map_err(|e| BenchError::driver(what, e))?),
            HostBuf::F32(v) => DevBuf::F32(stream.clone_htod(v).map_err(|e| BenchError::driver(what, e))?),
            HostBuf::I32(v) => DevBuf::I32(stream.clone_htod(v).map_err(|e| BenchError::driver(what, e))?),
        })
    }
}

fn random_vec<T: Elem>(len: usize, std: f64, seed: u64) -> Vec<T> {
    /// Elements per independently seeded chunk.
    const CHUNK: usize = 1 << 20;
    let mut out = vec![T::from_f64(0.0); len];
    let threads = std::thread::available_parallelism().map_or(4, std::num::NonZero::get).min(32);
    let chunks: Vec<(usize, &mut [T])> = out.chunks_mut(CHUNK).enumerate().collect();
    let per_thread = chunks.len().div_ceil(threads).max(1);
    let mut groups: Vec<Vec<(usize, &mut [T])>> = Vec::new();
    let mut it = chunks.into_iter().peekable();
    while it.peek().is_some() {
        groups.push(it.by_ref().take(per_thread).collect());
    }
    std::thread::scope(|scope| {
        for group in groups {
            scope.spawn(move || {
                for (index, chunk) in group {
                    let mut rng = Rng::new(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                    for x in chunk.iter_mut() {
                        *x = T::from_f64(std * rng.normal());
                    }
                }
            });
        }
    });
    out
}

/// A device tensor in its declared dtype.
#[derive(Debug)]
pub(crate) enum DevBuf {
    F16(CudaSlice<f16>),
    Bf16(CudaSlice<bf16>),
    F32(CudaSlice<f32>),
    I32(CudaSlice<i32>),
}

impl DevBuf {
    /// An output buffer of `len` elements filled with all-ones bytes, a NaN in every dtype, so
    /// that elements a kernel fails to write are caught.
    pub(crate) fn poisoned(stream: &Arc<CudaStream>, dtype: DType, len: usize) -> Result<DevBuf, BenchError> {
        let what = "allocating an output on the GPU";
        // SAFETY: the memory is uninitialised until `poison` below overwrites every byte.
        let mut buf = unsafe {
            match dtype {
                DType::F16 => DevBuf::F16(stream.alloc::<f16>(len).map_err(|e| BenchError::driver(what, e))?),
                DType::BF16 => DevBuf::Bf16(stream.alloc::<bf16>(len).map_err(|e| BenchError::driver(what, e))?),
                DType::F32 => DevBuf::F32(stream.alloc::<f32>(len).map_err(|e| BenchError::driver(what, e))?),
                DType::I32 => DevBuf::I32(stream.alloc::<i32>(len).map_err(|e| BenchError::driver(what, e))?),
            }
        };
        buf.poison(stream)?;
        Ok(buf)
    }

    /// Fills every byte with 0xFF (NaN in f16, bf16 and f32; -1 in i32).
    pub(crate) fn poison(&mut self, stream: &Arc<CudaStream>) -> Result<(), BenchError> {
        fn fill<T: Elem>(s: &mut CudaSlice<T>, stream: &Arc<CudaStream>) -> Result<(), BenchError> {
            let bytes = s.num_bytes();
            let (ptr, _sync) = s.device_ptr_mut(stream);
            // SAFETY: `ptr` addresses `bytes` bytes of a live allocation of the stream's
            // context, and every byte pattern is a valid (NaN) value of the element type.
            unsafe { cuda_result::memset_d8_async(ptr, 0xFF, bytes, stream.cu_stream()) }
                .map_err(|e| BenchError::driver("poisoning an output", e))
        }
        match self {
            DevBuf::F16(s) => fill(s, stream),
            DevBuf::Bf16(s) => fill(s, stream),
            DevBuf::F32(s) => fill(s, stream),
            DevBuf::I32(s) => fill(s, stream),
        }
    }

    pub(crate) fn view<T: Elem>(&self, name: &str) -> Result<CudaView<'_, T>, BenchError> {
        T::dev(self).map(|s| s.as_view()).ok_or_else(|| BenchError::dtype(name, T::CORE_DTYPE))
    }

    pub(crate) fn view_mut<T: Elem>(&mut self, name: &str) -> Result<CudaViewMut<'_, T>, BenchError> {
        T::dev_mut(self).map(|s| s.as_view_mut()).ok_or_else(|| BenchError::dtype(name, T::CORE_DTYPE))
    }

    /// Copies the tensor back to the host (waits for the stream).
    pub(crate) fn download(&self, stream: &Arc<CudaStream>) -> Result<HostBuf, BenchError> {
        let what = "copying an output from the GPU";
        Ok(match self {
            DevBuf::F16(s) => HostBuf::F16(stream.clone_dtoh(s).map_err(|e| BenchError::driver(what, e))?),
            DevBuf::Bf16(s) => HostBuf::Bf16(stream.clone_dtoh(s).map_err(|e| BenchError::driver(what, e))?),
            DevBuf::F32(s) => HostBuf::F32(stream.clone_dtoh(s).map_err(|e| BenchError::driver(what, e))?),
            DevBuf::I32(s) => HostBuf::I32(stream.clone_dtoh(s).map_err(|e| BenchError::driver(what, e))?),
        })
    }
}

/// Writes raw little-endian f64 values.
pub(crate) fn write_f64(path: &Path, values: &[f64]) -> Result<(), BenchError> {
    let mut bytes = Vec::with_capacity(values.len() * 8);
    for x in values {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    write_file(path, &bytes)
}

pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<(), BenchError> {
    let io = |e: std::io::Error| BenchError::new(format!("{}: {e}", path.display()));
    let mut f = std::fs::File::create(path).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    Ok(())
}
