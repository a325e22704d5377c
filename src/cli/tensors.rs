//! Tensors made elsewhere: `cleave run --inputs FILE` reads a kernel's inputs from a
//! safetensors file, by their declared names, and binds the dynamic dims from their shapes;
//! `--outputs FILE` writes the emulated outputs the same way.

use cleave_core::graph::{Bindings, DType, Dim, DimVar, StoreAxis, ValidGraph};
use cleave_core::reference::Tensor;
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

use super::UserError;

fn file_dtype(d: DType) -> Dtype {
    match d {
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::I32 => Dtype::I32,
    }
}

/// The inputs of `g` from the safetensors file at `path`, in declaration order. Each declared
/// input must be in the file with its declared dtype and rank, static axes at their declared
/// extents; a dynamic dim takes its extent from the first input that has it, every other axis
/// of that dim must agree, and so must `--dims` where it names the dim (`fixed`). Tensors
/// the kernel does not declare are ignored.
pub(crate) fn read_inputs(
    path: &str,
    g: &ValidGraph,
    b: &mut Bindings,
    fixed: &[&str],
) -> Result<Vec<Tensor>, UserError> {
    let fail = |m: String| UserError(format!("--inputs: {path}: {m}"));
    let bytes = std::fs::read(path).map_err(|e| fail(format!("cannot read: {e}")))?;
    let file = SafeTensors::deserialize(&bytes).map_err(|e| fail(format!("not a safetensors file: {e}")))?;
    // Which input each dynamic dim's extent came from.
    let mut bound: Vec<Option<String>> = vec![None; b.values.len()];
    for name in fixed {
        if let Some(v) = g.dims.find(name) {
            bound[v.index()] = Some("--dims".to_string());
        }
    }
    let mut tensors = Vec::with_capacity(g.inputs.len());
    for input in &g.inputs {
        let d = &input.decl;
        let t = file.tensor(&d.name).map_err(|_| {
            let mut names = file.names();
            names.sort_unstable();
            fail(format!("has no tensor `{}` (it holds {})", d.name, names.join(", ")))
        })?;
        if t.dtype() != file_dtype(d.dtype) {
            return Err(fail(format!("`{}` is {:?}, but the kernel declares {}", d.name, t.dtype(), d.dtype.name())));
        }
        let shape = t.shape();
        // The buffer's axes: the storage of a tensor with a layout, its shape otherwise.
        let axes: Vec<StoreAxis> = match &d.layout {
            Some(l) => l.axes.clone(),
            None => d.shape.iter().map(|a| a.var().map_or(StoreAxis::One, |v| StoreAxis::Dims(vec![v]))).collect(),
        };
        let declared = match &d.layout {
            Some(l) => l.show(&g.dims),
            None => g.dims.show(&d.shape),
        };
        if shape.len() != axes.len() {
            return Err(fail(format!(
                "`{}` has shape {shape:?} with {} axes, but the kernel declares {declared}",
                d.name,
                shape.len()
            )));
        }
        for (axis, (store, &extent)) in axes.iter().zip(shape).enumerate() {
            let mismatch = |want: String| {
                fail(format!(
                    "`{}` has shape {shape:?}, but the kernel declares {declared}: axis {axis} must be {want}",
                    d.name
                ))
            };
            // The dim this axis binds, and its extent: a merge of dims binds its one dynamic
            // member no other axis has bound, an indptr's dim is its length less one.
            let (v, extent) = match store {
                StoreAxis::One | StoreAxis::Slot { size: Dim::One, .. } if extent != 1 => {
                    return Err(mismatch("1".into()))
                }
                StoreAxis::One | StoreAxis::Slot { size: Dim::One, .. } => continue,
                StoreAxis::Dims(ds) if ds.len() > 1 => {
                    let open: Vec<DimVar> =
                        ds.iter().copied().filter(|v| g.dims.get(*v).dynamic && bound[v.index()].is_none()).collect();
                    let known: u64 =
                        ds.iter().filter(|v| !open.contains(v)).map(|v| b.values[v.index()]).product::<u64>().max(1);
                    match open.as_slice() {
                        [] if extent as u64 == known => continue,
                        [v] if extent as u64 % known == 0 => (*v, extent / known as usize),
                        _ => return Err(mismatch(format!("a multiple of {known}, the product of its merged dims"))),
                    }
                }
                StoreAxis::Dims(ds) => (ds[0], extent),
                StoreAxis::Packed { total: v, .. }
                | StoreAxis::Pages { pages: v, .. }
                | StoreAxis::Slot { size: Dim::Var(v), .. } => (*v, extent),
                StoreAxis::PlusOne(v) if extent >= 1 => (*v, extent - 1),
                StoreAxis::PlusOne(_) => return Err(mismatch("at least 1".into())),
            };
            let info = g.dims.get(v);
            let have = b.values[v.index()];
            if !info.dynamic || bound[v.index()].is_some() {
                if extent as u64 != have {
                    let from = bound[v.index()].as_deref().map_or("declared".to_string(), |f| format!("from `{f}`"));
                    return Err(mismatch(format!("{have} (`{}`, {from})", info.name)));
                }
            } else if extent == 0 || extent >= 1 << 31 {
                return Err(mismatch(format!("an extent in 1..2^31 for `{}`", info.name)));
            } else {
                b.values[v.index()] = extent as u64;
                bound[v.index()] = Some(d.name.clone());
            }
        }
        let data = decode(d.dtype, t.data());
        tensors.push(Tensor { shape: shape.to_vec(), data });
    }
    Ok(tensors)
}

/// Writes `outputs` (in declaration order) to a safetensors file at `path`, each under its
/// declared name, in its declared dtype.
pub(crate) fn write_outputs(path: &str, g: &ValidGraph, outputs: &[Tensor]) -> Result<(), UserError> {
    let fail = |m: String| UserError(format!("--outputs: {path}: {m}"));
    let encoded: Vec<(String, DType, Vec<usize>, Vec<u8>)> = g
        .outputs
        .iter()
        .zip(outputs)
        .map(|(o, t)| (o.decl.name.clone(), o.decl.dtype, t.shape.clone(), encode(o.decl.dtype, &t.data)))
        .collect();
    let views = encoded
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            TensorView::new(file_dtype(*dtype), shape.clone(), bytes).map(|v| (name.clone(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(e.to_string()))?;
    let bytes = safetensors::serialize(views, None).map_err(|e| fail(e.to_string()))?;
    std::fs::write(path, bytes).map_err(|e| fail(format!("cannot write: {e}")))
}

/// Little-endian elements of `dtype` as f64 (exact).
fn decode(dtype: DType, b: &[u8]) -> Vec<f64> {
    match dtype {
        DType::F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        DType::BF16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        DType::F32 => b.chunks_exact(4).map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
        DType::I32 => b.chunks_exact(4).map(|c| f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
    }
}

/// f64 values already representable in `dtype` (the emulator's outputs) as its little-endian
/// bytes.
fn encode(dtype: DType, data: &[f64]) -> Vec<u8> {
    match dtype {
        DType::F16 => data.iter().flat_map(|x| half::f16::from_f64(*x).to_le_bytes()).collect(),
        DType::BF16 => data.iter().flat_map(|x| half::bf16::from_f64(*x).to_le_bytes()).collect(),
        DType::F32 => data.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect(),
        DType::I32 => data.iter().flat_map(|x| (*x as i32).to_le_bytes()).collect(),
    }
}
