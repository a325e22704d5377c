//! Code generation: golden sources for a few kernels (reviewable diffs; `CLEAVE_BLESS=1`
//! rewrites them), byte-identical output across runs, the FA2 building blocks visible in the
//! attention kernel, and TileLang output that Python accepts.

use std::path::Path;
use std::process::Command;

use cleave_core::codegen::{cuda, tilelang};
use cleave_core::pipeline::{compile, Options};
use cleave_core::plan::program::flatten;
use cleave_core::plan::Stmt;

fn kernels() -> cleave_core::front::Module {
    let text = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/kernels.yaml")).expect("kernels.yaml");
    cleave_core::front::check_source(&text).expect("kernels.yaml checks")
}

fn emit(name: &str) -> (String, String) {
    let m = kernels();
    let (_, g) = m.kernels.iter().find(|(d, _)| d.name == name).expect("kernel");
    let c = compile(g, &Options::default()).expect("compiles");
    (cuda::emit_launch(c.best(), name), tilelang::emit_launch(c.best(), name))
}

#[test]
fn golden_cuda_sources() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let bless = std::env::var_os("CLEAVE_BLESS").is_some();
    let mut stale = Vec::new();
    for name in [
        "mha_d64_prefill",
        "mha_d64_decode",
        "rmsnorm_matmul_prefill",
        "gqa_paged_decode_h32_kv8_d128_ps64",
        "gqa_ragged_prefill_causal_h32_kv4_d128",
    ] {
        let (cu, _) = emit(name);
        let path = dir.join(format!("{name}.cu"));
        if bless {
            std::fs::write(&path, &cu).expect("write golden");
            continue;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_default();
        if want != cu {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "generated CUDA differs from the golden files (review, then rerun with CLEAVE_BLESS=1): {stale:?}"
    );
}

#[test]
fn the_same_declaration_gives_byte_identical_sources() {
    for name in ["gqa_decode", "swiglu_prefill"] {
        assert_eq!(emit(name), emit(name), "{name}");
    }
}

/// Every load of a split decode's combine is an asynchronous copy, the f32 per-row partials (one
/// element a row, too narrow for 16-byte copies) included: a synchronous element load in its
/// pipelined loop stalled each stage for a memory latency (22 µs for gqa_decode's 1 MB combine
/// on an H200, 11 µs once asynchronous).
#[test]
fn a_split_combine_copies_its_row_partials_asynchronously() {
    for name in ["gqa_decode", "mha_d64_decode"] {
        let (cu, _) = emit(name);
        let combine = &cu[cu.find(&format!("cleave_{name}_1(")).expect("a combine kernel")..];
        let combine = &combine[..combine.find("\n}\n").expect("its end")];
        assert!(combine.contains("cleave::cp_async_4("), "{name}: the row partials are not copied asynchronously");
        assert!(!combine.contains("cleave::ld_global("), "{name}: the combine still loads synchronously");
    }
}

#[test]
fn the_attention_kernel_uses_the_fa2_building_blocks() {
    let (cu, _) = emit("mha_d128_prefill");
    for needle in [
        "cleave::mma_m16n8k16(",      // tensor cores
        "cleave::ldmatrix_x4(",       // Q and K fragments
        "cleave::ldmatrix_x4_trans(", // V as the right operand without a transpose in memory
        "cleave::cp_async_16(",       // asynchronous, predicated copies
        "cleave::cp_async_wait<1>",   // double buffering
        ", 2, 1>(",                   // 128-byte rows with the XOR swizzle (mode 1)
        "cleave::pack_half2(",        // P packed from the accumulator registers: never in smem
        "cleave::quad_max(",          // row max inside a quad
        "cleave_exp_diff(",           // exp2 with log2(e) folded, guarded for -inf
    ] {
        assert!(cu.contains(needle), "missing `{needle}`");
    }
    // P goes straight from registers into the second product's A fragments.
    assert!(cu.lines().any(|l| l.contains("a[mi][0] = cleave::pack_half2(b")), "P is register-resident");
}

/// The tensor-core products of a tile program, nested loops included.
fn mma_count(body: &[Stmt]) -> usize {
    flatten(body).into_iter().filter(|s| matches!(s, Stmt::Mma { .. })).count()
}

#[test]
fn tilelang_output_compiles_as_python() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tilelang");
    std::fs::create_dir_all(&dir).expect("dir");
    let m = kernels();
    let mut files = Vec::new();
    for (d, g) in &m.kernels {
        let c = compile(g, &Options::default()).expect("compiles");
        let text = tilelang::emit_launch(c.best(), &d.name);
        for needle in ["T.Kernel(", "T.copy("] {
            assert!(text.contains(needle), "{}: missing {needle}", d.name);
        }
        // Every tensor-core product is a `T.gemm` (a product of one column is a row reduction,
        // and matmul_rowsum's best plan has only those).
        let mmas: usize = c.best().kernels.iter().filter_map(|k| k.tile()).map(|k| mma_count(&k.body)).sum();
        assert_eq!(text.matches("T.gemm(").count() > 0, mmas > 0, "{}: {mmas} products", d.name);
        let path = dir.join(format!("{}.py", d.name));
        std::fs::write(&path, text).expect("write");
        files.push(path);
    }
    let out = Command::new("python3").arg("-m").arg("py_compile").args(&files).output();
    match out {
        Ok(o) => assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => panic!("python3 is needed to check the TileLang output: {e}"),
    }
    let attention = std::fs::read_to_string(dir.join("mha_d128_prefill.py")).expect("read");
    for needle in ["T.Pipelined(", "T.reduce_max(", "T.reduce_sum("] {
        assert!(attention.contains(needle), "missing {needle}");
    }
}

#[test]
fn a_reduction_down_a_column_emits_transposed_tiles_in_both_backends() {
    // A softmax down the columns: its tiles arrive transposed and its output is stored back
    // transposed. CUDA copies such tiles element by element with the tensor's contiguous axis
    // across consecutive threads; TileLang writes both as element loops Python accepts.
    let text = "kernels:\n  - name: column_softmax\n    dims: { n: { value: 512, dynamic: true }, d: 1024 }\n    \
                inputs: { x: \"f32[n, d]\" }\n    outputs: { y: \"f32[n, d]\" }\n    body: |\n      \
                y = softmax(x, axis=0)\n";
    let m = cleave_core::front::check_source(text.as_bytes()).expect("checks");
    let (_, g) = &m.kernels[0];
    let c = compile(g, &Options::default()).expect("compiles");
    let l = c.best();
    let all: Vec<&Stmt> = l.kernels.iter().filter_map(|k| k.tile()).flat_map(|k| flatten(&k.body)).collect();
    assert!(all.iter().any(|s| matches!(s, Stmt::Load { trans: true, .. })), "a transposed load");
    assert!(all.iter().any(|s| matches!(s, Stmt::Store { trans: true, .. })), "a transposed store");
    let cu = cuda::emit_launch(l, "column_softmax");
    assert!(cu.contains("const int r = ei % ") && cu.contains(", c = ei / "), "the transposed copy");
    let py = tilelang::emit_launch(l, "column_softmax");
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("column_softmax.py");
    std::fs::write(&path, &py).expect("write");
    let out = Command::new("python3").arg("-m").arg("py_compile").arg(&path).output().expect("python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(py.contains("T.if_then_else("), "the transposed read keeps its bounds");
}
