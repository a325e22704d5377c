//! `cleave search`, `schedule`, `emit` and `explain` from the command line: the JSON contracts
//! of DESIGN §7.2, and emitted directories that their tools accept as they are.

use std::path::Path;
use std::process::Command;

fn cleave(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cleave")).args(args).output().expect("the cleave binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const KERNELS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels.yaml");

#[test]
fn schedule_json_has_the_contract_fields() {
    let (code, out, err) = cleave(&["schedule", KERNELS, "--kernel", "mha_d128_decode", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["kernel"], "mha_d128_decode");
    let cands = v["candidates"].as_array().expect("candidates");
    assert!(!cands.is_empty());
    let best = &cands[0];
    let kernels = best["kernels"].as_array().expect("kernels");
    assert_eq!(kernels.len(), 2, "split + combine");
    for k in kernels {
        for field in ["grid", "tile_config", "smem_bytes", "gmem_bytes", "program"] {
            assert!(!k[field].is_null(), "missing {field}");
        }
        assert!(k["grid"].is_array());
        assert!(k["program"].as_str().expect("text").contains("parfor"));
    }
    // The split kernel's program shows the stabilization.
    let p = kernels[0]["program"].as_str().expect("text");
    assert!(p.contains("Rowmax(") && p.contains("exp("), "{p}");
    // Candidates are ranked by estimated time.
    let secs: Vec<f64> = cands.iter().map(|c| c["estimated_seconds"].as_f64().expect("number")).collect();
    assert!(secs.windows(2).all(|w| w[0] <= w[1]));
}

#[test]
fn schedule_plans_for_the_architectures_given() {
    let smem = |args: &[&str]| -> u64 {
        let mut all = vec!["schedule", KERNELS, "--kernel", "mha_d128_prefill", "--json"];
        all.extend_from_slice(args);
        let (code, out, err) = cleave(&all);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        let kernels = v["candidates"][0]["kernels"].as_array().expect("kernels").clone();
        kernels.iter().map(|k| k["smem_bytes"].as_u64().expect("bytes")).max().expect("a launch")
    };
    // For the A100 and the H200 the best attention tile at head dim 128 takes more than
    // 99 KiB (two 128-key K/V tiles, double-buffered, beside the queries); listing sm_86, whose
    // blocks get at most 101,376 bytes, makes the plan fit it.
    let wide = smem(&["--arch", "80,90"]);
    let fits = smem(&["--arch", "80,86,90"]);
    assert!(wide > 101_376, "{wide}");
    assert!(fits <= 101_376, "{fits}");
    let (code, _, err) = cleave(&["schedule", KERNELS, "--kernel", "rmsnorm_matmul_decode", "--arch", "75"]);
    assert_eq!(code, 1);
    assert!(err.contains("--arch") && err.contains("older than sm_80"), "{err}");
}

/// `--at b=256` plans for another extent, as a build does for an `also` extent: the plan the
/// schedule prints is made for 256 rows (its row tile grows past the 16 declared), beside the
/// estimate of the declared extents' plan run at 256 rows; bad extents are refused with the
/// dim named.
#[test]
fn schedule_plans_at_the_extents_given() {
    let rows = |args: &[&str]| -> (u64, String, serde_json::Value) {
        let mut all = vec!["schedule", KERNELS, "--kernel", "matmul_decode", "--arch", "90", "--json"];
        all.extend_from_slice(args);
        let (code, out, err) = cleave(&all);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        let k = &v["candidates"][0]["kernels"][0];
        (k["tile_config"]["output"]["b"].as_u64().expect("a row tile"), k["program"].to_string(), v)
    };
    let (declared, _, plain) = rows(&[]);
    let (wide, program, at) = rows(&["--at", "b=256"]);
    assert_eq!(declared, 16);
    assert!(wide > 16, "{wide}: {program}");
    // Sixteen blocks of 16 rows each stream the whole weight: the 16-row plan is estimated at
    // more than twice the time of the plan made for 256 rows.
    assert!(plain.get("declared_plan").is_none());
    let own = at["candidates"][0]["estimated_seconds"].as_f64().expect("seconds");
    assert_eq!(at["declared_plan"]["extents"], "b=16");
    let declared_there = at["declared_plan"]["estimated_seconds"].as_f64().expect("seconds");
    assert!(declared_there > 2.0 * own, "{declared_there} against {own}");
    // At the declared extents the two are one plan, and one estimate.
    let (_, _, same) = rows(&["--at", "b=16"]);
    let own16 = same["candidates"][0]["estimated_seconds"].as_f64().expect("seconds");
    assert_eq!(same["declared_plan"]["estimated_seconds"].as_f64(), Some(own16));
    let (code, out, err) = cleave(&["schedule", KERNELS, "--kernel", "matmul_decode", "--arch", "90", "--at", "b=256"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("the plan made for b=16, run at these extents: "), "{out}");
    for (at, why) in [
        ("k=64", "`k` is static (4096) and cannot change"),
        ("z=4", "`z` is not a dim of `matmul_decode`"),
        ("b=0", "`b` must be an integer in 1..2^31, got `0`"),
        ("b=4,b=8", "`b` is given twice"),
        ("b", "expects name=value pairs, got `b`"),
    ] {
        let (code, _, err) = cleave(&["schedule", KERNELS, "--kernel", "matmul_decode", "--at", at]);
        assert_eq!(code, 1, "{at}");
        assert!(err.contains(&format!("--at: {why}")), "{at}: {err}");
    }
}

#[test]
fn search_json_lists_ops_topologically_with_the_output_last() {
    let (code, out, err) = cleave(&["search", KERNELS, "--kernel", "mha_d64_prefill", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    for field in ["kernel", "seconds", "states_explored", "graphs"] {
        assert!(!v[field].is_null(), "missing {field}");
    }
    let allowed = [
        "input",
        "matmul",
        "transpose",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "square",
        "recip",
        "silu",
        "sigmoid",
        "gelu",
        "neg",
        "add",
        "sub",
        "mul",
        "div",
        "max",
        "sum",
        "reduce_max",
        "mean",
        "split",
    ];
    for g in v["graphs"].as_array().expect("graphs") {
        assert!(g["has_split"].is_boolean());
        let ops = g["ops"].as_array().expect("ops");
        let mut seen: Vec<String> = Vec::new();
        for op in ops {
            let name = op["op"].as_str().expect("op");
            assert!(allowed.contains(&name), "{name}");
            for i in op["inputs"].as_array().expect("inputs") {
                assert!(seen.contains(&i.as_str().expect("id").to_string()), "uses {i} before it is defined");
            }
            seen.push(op["id"].as_str().expect("id").to_string());
        }
        // Input tensors appear under their declared names.
        for name in ["q", "k", "v"] {
            assert!(ops.iter().any(|o| o["op"] == "input" && o["id"] == name));
        }
    }
}

#[test]
fn emitted_directories_compile_as_they_are() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("emit");
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_string_lossy().into_owned();
    for target in ["cuda", "tilelang", "rust"] {
        let (code, _, err) = cleave(&["emit", KERNELS, "--kernel", "gqa_decode", "--target", target, "--out", &d]);
        assert_eq!(code, 0, "{target}: {err}");
    }
    assert!(dir.join("cleave/tile.cuh").exists(), "the headers travel with the source");
    let rust = std::fs::read_to_string(dir.join("gqa_decode.rs")).expect("rust");
    assert!(rust.contains("pub fn run_host(") && rust.contains("pub fn launch("), "{rust}");
    let py =
        Command::new("python3").args(["-m", "py_compile"]).arg(dir.join("gqa_decode.py")).output().expect("python3");
    assert!(py.status.success(), "{}", String::from_utf8_lossy(&py.stderr));
    // `nvcc -c -I DIR` with no other flags, when nvcc is available.
    if let Some(nvcc) = cleave_core::toolchain::nvcc_for_check("compiling the emitted CUDA with nvcc") {
        let out = Command::new(&nvcc.path)
            .arg("-c")
            .arg("-I")
            .arg(&dir)
            .arg(dir.join("gqa_decode.cu"))
            .arg("-o")
            .arg(dir.join("gqa_decode.o"))
            .output()
            .expect("nvcc runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn explain_shows_every_stage() {
    let (code, out, err) = cleave(&["explain", KERNELS, "--kernel", "rmsnorm_matmul_prefill"]);
    assert_eq!(code, 0, "{err}");
    for section in [
        "== declared graph ==",
        "== symbolic graph ==",
        "== eventually-reduced dims ==",
        "== found graphs",
        "cost table",
        "== chosen program ==",
    ] {
        assert!(out.contains(section), "missing {section}");
    }
}

#[test]
fn run_reports_the_error_last_and_rejects_bad_options() {
    let (code, out, err) =
        cleave(&["run", KERNELS, "--kernel", "matmul_rowsum_decode", "--backend", "emulate", "--dims", "b=7"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().last().unwrap_or_default().starts_with("max_rel_err="), "{out}");
    let (code, _, err) = cleave(&["run", KERNELS, "--kernel", "matmul_rowsum_decode", "--dims", "k=7"]);
    assert_eq!(code, 1);
    assert!(err.contains("`k` is static"), "{err}");
    let (code, _, err) = cleave(&["run", KERNELS, "--kernel", "matmul_rowsum_decode", "--dims", "b=0"]);
    assert_eq!(code, 1);
    assert!(err.contains("must be an integer in 1..2^31"), "{err}");
    let (code, _, err) = cleave(&["run", KERNELS, "--kernel", "matmul_rowsum_decode", "--backend", "gpu"]);
    assert_eq!(code, 1);
    assert!(err.contains("unknown backend"), "{err}");
}

#[test]
fn run_emulates_an_edited_emitted_kernel_and_reports_its_race() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("edited");
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_string_lossy().into_owned();
    let (code, _, err) = cleave(&["emit", KERNELS, "--kernel", "mha_d64_decode", "--target", "cuda", "--out", &d]);
    assert_eq!(code, 0, "{err}");
    let run = |extra: &[&str]| {
        let mut args = vec!["run", KERNELS, "--kernel", "mha_d64_decode", "--backend", "emulate", "--source", &d];
        args.extend(extra);
        cleave(&args)
    };
    // As emitted, it passes.
    let (code, out, err) = run(&["--dims", "b=3,l=150"]);
    assert_eq!(code, 0, "{out}{err}");
    // Without the barrier after the pipeline's wait, other threads read a tile some thread's
    // copy just completed: a race, exit 1. The pipeline has a loop over full tiles and one
    // over the ragged rest; the barrier goes from both.
    let path = dir.join("mha_d64_decode.cu");
    let mut source = std::fs::read_to_string(&path).expect("emitted source");
    let wait = "cleave::cp_async_wait<1>();\n";
    let (mut from, mut edits) = (0, 0);
    while let Some(i) = source[from..].find(wait) {
        let at = from + i + wait.len();
        let barrier = source[at..].find("__syncthreads();").expect("its barrier") + at;
        source.replace_range(barrier..barrier + "__syncthreads();".len(), "");
        from = barrier;
        edits += 1;
    }
    assert!(edits >= 1, "a pipelined loop");
    std::fs::write(&path, source).expect("write the edit");
    let (code, _, err) = run(&["--dims", "b=3,l=150"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("shared-memory race (read-after-write)") && err.contains("at line"), "{err}");
    // Bad values of the checking options are user errors.
    let (code, _, err) = run(&["--checks", "raecs"]);
    assert_eq!(code, 1);
    assert!(err.contains("--checks: unknown check `raecs`"), "{err}");
    let (code, _, err) = cleave(&["run", KERNELS, "--kernel", "mha_d64_decode", "--source", "/nonexistent/dir"]);
    assert_eq!(code, 1);
    assert!(err.contains("--source: /nonexistent/dir/mha_d64_decode.cu: cannot read"), "{err}");
}

#[test]
fn run_refuses_repeated_and_oversized_extents_before_allocating() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/corpus/elementwise.yaml");
    let (code, _, err) = cleave(&["run", file, "--kernel", "ew_softplus", "--dims", "t=3,t=5"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("`t` is given twice"), "{err}");
    // 2^31 - 1 rows of 96 columns: far more than the emulator holds, refused with the flag named.
    let (code, _, err) = cleave(&["run", file, "--kernel", "ew_softplus", "--dims", "t=2147483647"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--dims") && err.contains("elements"), "{err}");
}

#[test]
fn schedule_prints_the_program_of_any_kept_rank() {
    let (code, out, err) = cleave(&["schedule", KERNELS, "--kernel", "matmul_prefill", "--rank", "1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("program of rank 1:") && out.contains("parfor"), "{out}");
    let (code, _, err) = cleave(&["schedule", KERNELS, "--kernel", "matmul_prefill", "--rank", "9999"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--rank"), "{err}");
}
