//! Tensors made elsewhere: `cleave run --inputs FILE` reads a kernel's inputs from a
//! safetensors file, by their declared names, and binds the dynamic dims from their shapes;
//! `--outputs FILE` writes the emulated outputs the same way.

use cleave_core::graph::{Bindings, DType, Dim, ValidGraph};
use cleave_core::reference::Tensor;
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

use super::UserError;

fn file_dtype(d: DType) -> Dtype {
    match d {
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
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
        let declared = g.dims.show(&d.shape);
        if shape.len() != d.shape.len() {
            return Err(fail(format!(
                "`{}` has shape {shape:?} with {} axes, but the kernel declares {declared}",
                d.name,
                shape.len()
            )));
        }
        for (axis, (dim, &extent)) in d.shape.iter().zip(shape).enumerate() {
            let mismatch = |want: String| {
                fail(format!(
                    "`{}` has shape {shape:?}, but the kernel declares {declared}: axis {axis} must be {want}",
                    d.name
                ))
            };
            match *dim {
                Dim::One if extent != 1 => return Err(mismatch("1".into())),
                Dim::One => {}
                Dim::Var(v) => {
                    let info = g.dims.get(v);
                    let have = b.values[v.index()];
                    if !info.dynamic || bound[v.index()].is_some() {
                        if extent as u64 != have {
                            let from =
                                bound[v.index()].as_deref().map_or("declared".to_string(), |f| format!("from `{f}`"));
                            return Err(mismatch(format!("{have} (`{}`, {from})", info.name)));
                        }
                    } else if extent == 0 || extent >= 1 << 31 {
                        return Err(mismatch(format!("an extent in 1..2^31 for `{}`", info.name)));
                    } else {
                        b.values[v.index()] = extent as u64;
                        bound[v.index()] = Some(d.name.clone());
                    }
                }
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
    }
}

/// f64 values already representable in `dtype` (the emulator's outputs) as its little-endian
/// bytes.
fn encode(dtype: DType, data: &[f64]) -> Vec<u8> {
    match dtype {
        DType::F16 => data.iter().flat_map(|x| half::f16::from_f64(*x).to_le_bytes()).collect(),
        DType::BF16 => data.iter().flat_map(|x| half::bf16::from_f64(*x).to_le_bytes()).collect(),
        DType::F32 => data.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect(),
    }
}
