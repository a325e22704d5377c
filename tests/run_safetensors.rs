//! `cleave run --inputs/--outputs`: a kernel emulated on tensors made elsewhere (written here
//! with the `safetensors` crate), its dynamic dims read from their shapes, its outputs written
//! back and checked against a reference computed in this file; and bad files as located errors.

use std::path::Path;
use std::process::Command;

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

const YAML: &str = "kernels:
  - name: decode
    dims: { h: 2, b: { value: 4, dynamic: true }, l: { value: 256, dynamic: true }, d: 64 }
    inputs: { q: \"f16[h, b, d]\", k: \"f16[h, l, d]\", v: \"f16[h, l, d]\" }
    outputs: { o: \"f16[h, b, d]\" }
    body: |
      o = matmul(softmax(matmul(q, transpose(k)) * 0.125, axis=-1), v)
";

/// Deterministic values in `[-a, a]`, rounded to f16.
fn values(n: usize, seed: u64, a: f64) -> Vec<f64> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            half::f16::from_f64(((x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * a).to_f64()
        })
        .collect()
}

fn f16_bytes(x: &[f64]) -> Vec<u8> {
    x.iter().flat_map(|v| half::f16::from_f64(*v).to_le_bytes()).collect()
}

fn write(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView<'_>)> =
        tensors.iter().map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn cleave(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cleave"))
        .arg("run")
        .arg(dir.join("k.yaml"))
        .args(["--kernel", "decode", "--backend", "emulate"])
        .args(args)
        .env("CLEAVE_CACHE_DIR", dir.join("cache"))
        .output()
        .unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// softmax(q kᵀ / 8) v per head, in f64, with the max subtracted; and the largest logit.
fn attention(q: &[f64], k: &[f64], v: &[f64], (h, b, l, d): (usize, usize, usize, usize)) -> (Vec<f64>, f64) {
    let mut want = vec![0.0; h * b * d];
    let mut peak: f64 = 0.0;
    for hh in 0..h {
        for i in 0..b {
            let s: Vec<f64> = (0..l)
                .map(|j| (0..d).map(|c| q[(hh * b + i) * d + c] * k[(hh * l + j) * d + c]).sum::<f64>() * 0.125)
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            peak = s.iter().fold(peak, |p, x| p.max(x.abs()));
            let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = w.iter().sum();
            for c in 0..d {
                want[(hh * b + i) * d + c] = (0..l).map(|j| w[j] * v[(hh * l + j) * d + c]).sum::<f64>() / z;
            }
        }
    }
    (want, peak)
}

/// Output `o` of a safetensors file `cleave run --outputs` wrote, checked to be f16 of `shape`.
fn read_o(path: &Path, shape: [usize; 3]) -> Vec<f64> {
    let bytes = std::fs::read(path).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let o = file.tensor("o").unwrap();
    assert_eq!((o.dtype(), o.shape()), (Dtype::F16, &shape[..]));
    o.data().chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64()).collect()
}

/// The largest error relative to each element, floored at a tenth of the reference's RMS.
fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    let rms = (want.iter().map(|x| x * x).sum::<f64>() / want.len() as f64).sqrt();
    got.iter().zip(want).map(|(g, w)| (g - w).abs() / w.abs().max(0.1 * rms)).fold(0.0, f64::max)
}

#[test]
fn run_reads_and_writes_safetensors() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(dir.join("k.yaml"), YAML).unwrap();
    // b = 3 and l = 77: neither the declared extents nor multiples of a tile.
    let (h, b, l, d) = (2, 3, 77, 64);
    let q = values(h * b * d, 1, 12.0);
    let k = values(h * l * d, 2, 12.0);
    let v = values(h * l * d, 3, 2.0);
    let inputs = dir.join("in.safetensors");
    write(
        &inputs,
        &[
            ("q", Dtype::F16, vec![h, b, d], f16_bytes(&q)),
            ("k", Dtype::F16, vec![h, l, d], f16_bytes(&k)),
            ("v", Dtype::F16, vec![h, l, d], f16_bytes(&v)),
            // Not an input of the kernel: ignored.
            ("extra", Dtype::F32, vec![2], vec![0; 8]),
        ],
    );
    let outputs = dir.join("out.safetensors");
    let (ok, text) = cleave(dir, &["--inputs", inputs.to_str().unwrap(), "--outputs", outputs.to_str().unwrap()]);
    assert!(ok, "{text}");
    assert!(text.contains("dims=b=3,l=77"), "the dims come from the shapes: {text}");

    let (want, peak) = attention(&q, &k, &v, (h, b, l, d));
    assert!(peak > 100.0, "the inputs were meant to give large logits, got {peak}");
    let got = read_o(&outputs, [h, b, d]);
    let worst = rel_err(&got, &want);
    assert!(worst < 2e-2, "max relative error {worst}");

    // Bad files are errors naming the file, the tensor and what is wrong.
    let bad = dir.join("bad.safetensors");
    let run_bad = |tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)], extra: &[&str]| {
        write(&bad, tensors);
        let mut args = vec!["--inputs", bad.to_str().unwrap()];
        args.extend_from_slice(extra);
        let (ok, text) = cleave(dir, &args);
        assert!(!ok, "{text}");
        text
    };
    let qt = ("q", Dtype::F16, vec![h, b, d], f16_bytes(&q));
    let kt = ("k", Dtype::F16, vec![h, l, d], f16_bytes(&k));
    let e = run_bad(&[qt.clone(), kt.clone()], &[]);
    assert!(e.contains("has no tensor `v` (it holds k, q)"), "{e}");
    let vt32 = ("v", Dtype::F32, vec![h, l, d], vec![0; h * l * d * 4]);
    let e = run_bad(&[qt.clone(), kt.clone(), vt32], &[]);
    assert!(e.contains("`v` is F32, but the kernel declares f16"), "{e}");
    let vshort = ("v", Dtype::F16, vec![h, l - 1, d], f16_bytes(&v[..h * (l - 1) * d]));
    let e = run_bad(&[qt.clone(), kt.clone(), vshort], &[]);
    assert!(
        e.contains("`v` has shape [2, 76, 64], but the kernel declares [h, l, d]: axis 1 must be 77 (`l`, from `k`)"),
        "{e}"
    );
    let vt = ("v", Dtype::F16, vec![h, l, d], f16_bytes(&v));
    let e = run_bad(&[qt.clone(), kt.clone(), vt.clone()], &["--dims", "l=78"]);
    assert!(
        e.contains(
            "`k` has shape [2, 77, 64], but the kernel declares [h, l, d]: axis 1 must be 78 (`l`, from `--dims`)"
        ),
        "{e}"
    );
    let e = run_bad(&[qt, kt, vt], &["--scale", "3"]);
    assert!(e.contains("--scale sets the magnitude of random inputs"), "{e}");
    std::fs::write(&bad, b"not a safetensors file").unwrap();
    let (ok, e) = cleave(dir, &["--inputs", bad.to_str().unwrap()]);
    assert!(!ok && e.contains("bad.safetensors: not a safetensors file"), "{e}");
}

/// A decode over a long context with few heads: the launcher splits the keys into parts.
const SPLIT_YAML: &str = "kernels:
  - name: decode
    dims: { h: 4, b: { value: 1, dynamic: true }, l: { value: 4096, dynamic: true }, d: 64 }
    inputs: { q: \"f16[h, b, d]\", k: \"f16[h, l, d]\", v: \"f16[h, l, d]\" }
    outputs: { o: \"f16[h, b, d]\" }
    body: |
      o = matmul(softmax(matmul(q, transpose(k)) * 0.125, axis=-1), v)
";

#[test]
fn a_pinned_split_count_changes_the_partial_sums_not_the_result() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(dir.join("k.yaml"), SPLIT_YAML).unwrap();
    // 1001 keys allow up to 7 parts of at least 128.
    let (h, b, l, d) = (4, 3, 1001, 64);
    let (q, k, v) = (values(h * b * d, 4, 12.0), values(h * l * d, 5, 12.0), values(h * l * d, 6, 2.0));
    let inputs = dir.join("in.safetensors");
    write(
        &inputs,
        &[
            ("q", Dtype::F16, vec![h, b, d], f16_bytes(&q)),
            ("k", Dtype::F16, vec![h, l, d], f16_bytes(&k)),
            ("v", Dtype::F16, vec![h, l, d], f16_bytes(&v)),
        ],
    );
    let (want, peak) = attention(&q, &k, &v, (h, b, l, d));
    assert!(peak > 100.0, "the inputs were meant to give large logits, got {peak}");
    let mut outs = Vec::new();
    for split in ["1", "3", "7"] {
        let out = dir.join(format!("out{split}.safetensors"));
        let (ok, text) = cleave(
            dir,
            &["--inputs", inputs.to_str().unwrap(), "--outputs", out.to_str().unwrap(), "--split", split, "--views"],
        );
        assert!(ok, "--split {split}: {text}");
        let got = read_o(&out, [h, b, d]);
        let worst = rel_err(&got, &want);
        assert!(worst < 2e-2, "--split {split}: max relative error {worst}");
        outs.push(got);
    }
    // The pin reached the kernels: one part and seven sum the keys in different orders.
    assert!(outs[0].iter().zip(&outs[2]).any(|(a, b)| a.to_bits() != b.to_bits()), "splits 1 and 7 agree bit for bit");
    for (arg, want) in [
        ("8", "split count 8 for `s_l`: these extents allow 1 to 7 parts"),
        ("0", "split count 0 for `s_l`: these extents allow 1 to 7 parts"),
        ("two", "--split expects a positive integer, got `two`"),
    ] {
        let (ok, text) = cleave(dir, &["--inputs", inputs.to_str().unwrap(), "--split", arg]);
        assert!(!ok && text.contains(want), "--split {arg}: {text}");
    }
}
