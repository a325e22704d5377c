//! The whole pipeline on the shipped kernels: the schedules the acceptance criteria name are
//! found (not templated), and every kept schedule of every kernel runs in the tile interpreter
//! and matches the f64 reference at odd extents with large-magnitude scores.

mod common;

use cleave_core::arch::{Targets, SM80, SM90};
use cleave_core::graph::{Bindings, DType, Dim, ReduceOp};
use cleave_core::pipeline::{compile, compile_variants, seconds_at, Compiled, Options};
use cleave_core::plan::program::flatten;
use cleave_core::plan::stage::LANES;
use cleave_core::plan::{
    fallback, interp, kernel_cost, stage_cost, Bound, BufKind, Expr, Kernel, Launch, MergeOp, MmaKind, SExpr, Src,
    StageKernel, Stmt, TileKernel, WorkspaceType,
};
use cleave_core::reference::{eval, max_rel_err, random_inputs, tolerance, InputScale};
use cleave_core::toolchain::ArchSet;

fn compiled(name: &str) -> Compiled {
    compile(&common::shipped(name), &Options::default()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn loops(body: &[Stmt]) -> Vec<&Stmt> {
    body.iter().filter(|s| matches!(s, Stmt::Loop { .. })).collect()
}

fn loop_body(s: &Stmt) -> &[Stmt] {
    match s {
        Stmt::Loop { body, .. } => body,
        _ => panic!("not a loop"),
    }
}

fn grid_names(k: &TileKernel, c: &Compiled) -> Vec<String> {
    let dims = c.best().dims();
    k.grid.iter().map(|a| dims.get(a.dim).name.clone()).collect()
}

#[test]
fn mha_prefill_gets_the_flashattention_schedule() {
    let c = compiled("mha_d128_prefill");
    let l = c.best();
    assert_eq!(l.kernels.len(), 1, "one kernel");
    let k = l.kernels[0].tile().expect("a tile kernel");
    assert!(k.smem_bytes <= SM80.smem_per_block, "{} bytes of shared memory", k.smem_bytes);
    assert_eq!(grid_names(k, &c), vec!["h", "s"], "grid over heads × query tiles");
    let lp = loops(&k.body);
    assert_eq!(lp.len(), 1, "one sequential loop");
    let Stmt::Loop { dim, body, .. } = lp[0] else { unreachable!() };
    assert_eq!(l.dims().get(*dim).name, "l", "the loop walks the context");
    // Q is hoisted out of the loop; K and V stream through it.
    let loaded = |b: &[Stmt]| -> Vec<String> {
        b.iter()
            .filter_map(|s| match s {
                Stmt::Load { param, .. } => Some(k.params[param.0 as usize].name.clone()),
                _ => None,
            })
            .collect()
    };
    assert_eq!(loaded(&k.body), vec!["q"]);
    assert_eq!(loaded(body), vec!["k", "v"]);
    // The row sum and the second matmul accumulate in the same loop (horizontal fusion), and a
    // running max rescales them (stabilization).
    let acc_mma = body.iter().filter(|s| matches!(s, Stmt::Mma { accumulate: true, .. })).count();
    let acc_sum = body.iter().filter(|s| matches!(s, Stmt::RowReduce { op: ReduceOp::Sum, acc: true, .. })).count();
    let row_max = body.iter().filter(|s| matches!(s, Stmt::RowReduce { op: ReduceOp::Max, .. })).count();
    let rescale = body.iter().filter(|s| matches!(s, Stmt::Assign { expr: Expr::ExpDiff(..), .. })).count();
    assert_eq!((acc_mma, acc_sum, row_max), (1, 1, 1));
    assert!(rescale >= 1, "the running max rescales the accumulators");
    // The division comes after the loop.
    let after: Vec<&Stmt> = k.body.iter().skip_while(|s| !matches!(s, Stmt::Loop { .. })).skip(1).collect();
    assert!(after
        .iter()
        .any(|s| matches!(s, Stmt::Store { expr: Expr::Binary(cleave_core::graph::BinaryOp::Div, ..), .. })));
}

#[test]
fn decode_attention_splits_and_merges_with_log_sum_exp() {
    for name in ["mha_d64_decode", "mha_d128_decode", "gqa_decode", "mqa_decode"] {
        let c = compiled(name);
        let l = c.best();
        assert_eq!(l.kernels.len(), 2, "{name}: a split kernel and a combine kernel");
        assert!(l.graph.has_split());
        let (split, combine) = (l.kernels[0].tile().expect("tiles"), l.kernels[1].tile().expect("tiles"));
        assert!(split.params.iter().any(|p| p.output && p.name == "partial_max"), "{name}");
        assert!(combine.params.iter().any(|p| !p.output && p.name.ends_with("_max")), "{name}");
        // The combine merges partials under a running max: exp(m_i - M) factors.
        let lp = loops(&combine.body);
        assert_eq!(lp.len(), 1, "{name}: one merge loop over the splits");
        let merges =
            loop_body(lp[0]).iter().filter(|s| matches!(s, Stmt::Assign { expr: Expr::ExpDiff(..), .. })).count();
        assert!(merges >= 1, "{name}");
        assert!(!c.ranked[0].splits.is_empty());
    }
}

#[test]
fn decode_blocks_keep_four_warps_busy() {
    // Every decode kernel's streaming launch runs at least 4 warps per block. Where 16 rows
    // need only one warp (MHA decode, and the product chain of matmul_matmul), the other warps
    // split the keys of each tile: each keeps its own running state through the loop and one
    // merge after it combines them, before the partials of the split are stored.
    let text = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels.yaml")).expect("kernels.yaml");
    let module = cleave_core::front::check_source(&text).expect("kernels.yaml checks");
    let decode: Vec<String> =
        module.kernels.iter().map(|(d, _)| d.name.clone()).filter(|n| n.contains("_decode")).collect();
    assert_eq!(decode.len(), 14);
    // And, in the plan a default build makes for the H200, at the declared extents (with the
    // split counts the launcher derives there), at most one block per SM and at least 96 of
    // them busy, but for matmul_rowsum decode (a 0.5 MB kernel). Fewer blocks than
    // SMs is on purpose: measured on an H200 (bench/RESULTS.md, "The split count, measured"),
    // a split attention decode whose blocks read distinct keys ends sooner with one block per
    // SM, four SMs idle, than with three per SM (384 blocks took 1.14 to 1.28 times as long),
    // and the column blocks of the GEMV-shaped decodes stream near DRAM's peak as they are.
    let h200 = |name: &str| {
        let opts = Options { archs: vec![SM90], ..Options::default() };
        compile(&common::shipped(name), &opts).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let mut blocks_of = Vec::new();
    let targets = ArchSet::default().plan_targets();
    for name in &decode {
        // Every plan of a default build (sm_90, the 99 KiB sm_86 and sm_80) keeps 4 warps busy;
        // the first is the H200's.
        let variants = compile_variants(&common::shipped(name), &Options::default(), &targets)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for v in &variants {
            let k = v.compiled.best().kernels[0].tile().unwrap_or_else(|| panic!("{name}: a tile kernel"));
            assert!(k.warps.threads() >= 128, "{name} for {:?}: {:?}", v.targets, k.warps);
        }
        assert_eq!(variants[0].targets[0], "sm_90");
        let c = &variants[0].compiled;
        blocks_of.push((name.as_str(), c.ranked[0].candidate.costs[0].blocks));
    }
    for &(name, blocks) in &blocks_of {
        if name != "matmul_rowsum_decode" {
            assert!((96..=132).contains(&blocks), "{name}: {blocks} blocks ({blocks_of:?})");
        }
    }
    for name in ["mha_d64_decode", "mha_d128_decode", "matmul_matmul_decode"] {
        let c = h200(name);
        let k = c.best().kernels[0].tile().expect("a tile kernel");
        assert_eq!(k.rows, 16, "{name}");
        assert!(k.warps.split && k.warps.n >= 4 && k.warps.m == 1, "{name}: {:?}", k.warps);
        let at = k.body.iter().position(|s| matches!(s, Stmt::Loop { .. })).expect("a loop");
        let Some(Stmt::Merge { parts, .. }) = k.body.get(at + 1) else { panic!("{name}: a merge after the loop") };
        // The accumulators each warp keeps whole are merged into tiles the warps split again.
        let whole: Vec<_> = parts
            .iter()
            .filter(|p| matches!(k.buf(p.src).kind, BufKind::Frag { whole: true, .. }))
            .map(|p| k.buf(p.dst).kind)
            .collect();
        assert!(!whole.is_empty(), "{name}");
        assert!(whole.iter().all(|b| matches!(b, BufKind::Frag { whole: false, .. })), "{name}");
        // Attention's partials are scaled by the warps' running maxima.
        if name.starts_with("mha") {
            assert!(parts.iter().any(|p| p.op == MergeOp::Max), "{name}");
            assert!(parts.iter().filter(|p| matches!(p.op, MergeOp::Scaled(_))).count() >= 2, "{name}");
        }
    }
}

#[test]
fn mla_decode_is_one_kernel_that_reads_each_latent_tile_once() {
    // MLA's latent cache is both the keys (with its rotary part) and the values, 512 wide. A
    // reduction tile of the whole width lets one tile of it serve the scores and the output
    // product, so every plan of a default build streams each tile of `kv` once per block and
    // passes the probabilities to the warps that own slices of the 512-wide output through
    // shared memory (`Stage`), never writing the scores to memory. The H200's plan gives 32
    // heads to a block of eight warps, four across the output's columns.
    let targets = ArchSet::default().plan_targets();
    let variants = compile_variants(&common::shipped("mla_decode"), &Options::default(), &targets).expect("compiles");
    for v in &variants {
        let l = v.compiled.best();
        let k = l.kernels[0].tile().expect("a tile kernel");
        let lp = loops(&k.body);
        assert_eq!(lp.len(), 1, "{:?}: one loop", v.targets);
        let body = loop_body(lp[0]);
        // Loads of `kv` in the loop, nested loops included (a narrower depth tile would load
        // a slice of it again for the scores).
        fn kv_loads(k: &TileKernel, body: &[Stmt]) -> usize {
            body.iter()
                .map(|s| match s {
                    Stmt::Load { param, .. } => usize::from(k.params[param.0 as usize].name == "kv"),
                    Stmt::Loop { body, .. } => kv_loads(k, body),
                    _ => 0,
                })
                .sum()
        }
        assert_eq!(kv_loads(k, body), 1, "{:?}: kv loaded once per tile", v.targets);
        assert!(body.iter().any(|s| matches!(s, Stmt::Stage { .. })), "{:?}: P staged", v.targets);
        // No workspace holds a score per key: a split's partials are per head and width.
        let dims = l.dims();
        for w in &l.workspaces {
            let keyed = w.shape.iter().any(|d| matches!(d, Dim::Var(v) if dims.get(*v).name == "l"));
            assert!(!keyed, "{:?}: workspace {} over the keys", v.targets, w.name);
        }
    }
    assert_eq!(variants[0].targets[0], "sm_90");
    let k = variants[0].compiled.best().kernels[0].tile().expect("a tile kernel");
    assert_eq!((k.rows, k.warps.m, k.warps.n), (32, 2, 4), "{:?}", k.warps);
}

/// The `Src::Column` reads of an expression: a vector multiplied into every row.
fn column_reads(e: &Expr) -> usize {
    match e {
        Expr::Src(Src::Column(_)) => 1,
        Expr::Src(_) => 0,
        Expr::Unary(_, a) | Expr::MaskCols(a, _, _) | Expr::MaskSlice(a, _, _) | Expr::Mask(a, _) => column_reads(a),
        Expr::Binary(_, a, b) | Expr::ExpDiff(a, b) => column_reads(a) + column_reads(b),
    }
}

/// The row reductions of a body that multiply a vector into every row, nested loops included.
fn matvecs(body: &[Stmt]) -> usize {
    body.iter()
        .map(|s| match s {
            Stmt::RowReduce { expr, .. } => usize::from(column_reads(expr) > 0),
            Stmt::Loop { body, .. } => matvecs(body),
            _ => 0,
        })
        .sum()
}

/// Runs launch `l` of graph `g` in the interpreter with every dynamic dim at `extent` and
/// inputs of standard deviation `scale` drawn from `seed`, and asserts its first output is
/// within the tolerance of the f64 reference.
fn interpreted_within_tolerance(g: &cleave_core::graph::ValidGraph, l: &Launch, extent: u64, seed: u64, scale: f64) {
    let mut b = Bindings::of_table(&g.dims);
    for (v, d) in g.dims.iter() {
        if d.dynamic {
            b.values[v.index()] = extent;
        }
    }
    let (got, want) = interpreted(g, l, &b, seed, scale);
    let e = max_rel_err(&got[0].data, &want[0].data);
    assert!(e < tolerance(g, &b, 0.0), "{e}");
}

/// The launch's outputs in the tile interpreter and the reference's, on fresh random inputs
/// at the bindings `b` of the declared dims.
fn interpreted(
    g: &cleave_core::graph::ValidGraph,
    l: &Launch,
    b: &Bindings,
    seed: u64,
    scale: f64,
) -> (Vec<cleave_core::reference::Tensor>, Vec<cleave_core::reference::Tensor>) {
    let inputs = random_inputs(g, b, seed, &InputScale { default: scale, per_input: Vec::new() });
    let want = eval(g, b, &inputs).expect("reference");
    let mut lb = Bindings::of_table(l.dims());
    lb.values[..b.values.len()].copy_from_slice(&b.values);
    lb.complete(l.dims());
    (interp::run(l, &lb, &inputs, 3).expect("interpreter"), want)
}

/// The two tile kernels of a launch whose first stores a product's computed right operand to
/// its one workspace, `ws0`, reading only the inputs `reads`.
fn operand_then_product<'a>(l: &'a Launch, reads: &[&str], what: &str) -> (&'a TileKernel, &'a TileKernel) {
    assert_eq!((l.kernels.len(), l.workspaces.len()), (2, 1), "{what}");
    let first = l.kernels[0].tile().expect("a tile kernel");
    let names: Vec<&str> = first.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names[..names.len() - 1], *reads, "{what}: what the first kernel reads");
    assert_eq!(names.last(), Some(&"ws0"), "{what}: the first kernel writes the workspace");
    (first, l.kernels[1].tile().expect("a tile kernel"))
}

#[test]
fn the_gemv_the_search_finds_for_a_rowsum_of_a_product_is_scheduled() {
    // `sum(matmul(x, w), axis=-1)` is `matmul(x, sum(w, axis=-1))`: the search finds it, and it
    // is scheduled as two tile kernels, the row sums of `w` stored by the first and every row
    // of `x` multiplied by them in the second, on every plan of a default build: at the
    // prefill's 4096 rows the model ranks it above the product form, and nothing runs in the
    // fallback.
    let targets = ArchSet::default().plan_targets();
    let g = common::shipped("matmul_rowsum_prefill");
    let variants = compile_variants(&g, &Options::default(), &targets).expect("compiles");
    for v in &variants {
        let l = v.compiled.best();
        let (_, product) = operand_then_product(l, &["w"], &format!("{:?}", v.targets));
        assert_eq!(l.workspaces[0].shape.last(), Some(&Dim::One), "{:?}: one sum per row of w", v.targets);
        assert_eq!(matvecs(&product.body), 1, "{:?}", v.targets);
        assert!(!product.body.iter().any(|s| matches!(s, Stmt::Mma { .. })), "{:?}", v.targets);
    }
    // The reference and the interpreter agree at ragged extents and large inputs.
    interpreted_within_tolerance(&g, variants[0].compiled.best(), 77, 5, 16.0);
}

#[test]
fn a_product_with_one_column_is_a_row_reduction_not_the_fallback() {
    // A product whose right operand has one column leaves nothing for the tensor cores (they
    // take 8 columns at least). It is each row's dot product with the vector, in f32 whatever
    // the vector's type, inside a loop over the contraction with the other reductions,
    // rescaled with them under the running max when its rows are exponentials, and split
    // across blocks like any reduction.
    let g = common::graph(
        r#"
kernels:
  - name: weighted
    dims: { s: { value: 300, dynamic: true }, k: 4000 }
    inputs: { x: "f16[s, k]", v: "f32[k, 1]" }
    outputs: { y: "f32[s, 1]" }
    body: |
      y = matmul(exp(x), v) / sum(exp(x), axis=-1)
"#,
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    let l = c.best();
    // The plan splits the 4000 columns across blocks and merges their partials under their
    // maxima; either way every kernel is a tile kernel.
    assert!(l.kernels.iter().all(|k| k.tile().is_some()), "the fallback");
    let k = l.kernels[0].tile().expect("a tile kernel");
    let lp = loops(&k.body);
    assert_eq!(lp.len(), 1);
    assert_eq!(matvecs(loop_body(lp[0])), 1, "the product accumulates in the loop");
    interpreted_within_tolerance(&g, l, 45, 11, 16.0);
}

#[test]
fn a_scale_per_row_of_the_weights_moves_to_the_left_operand() {
    // `w * sc` with `sc: [k, 1]` scales each row of the weights. Written as declared, a first
    // kernel stores the scaled weights and the product reads them back: three passes over
    // the weights. The search finds `matmul(x * transpose(sc), w)` (transposing a vector
    // moves no data), which reads the weights once, the scale read across the block's
    // columns; at this decode's dynamic contraction it is split across blocks (a count chosen
    // at run time) and, at 16 rows, the block's four warps split each block's loop, each
    // scaling its slice of the columns of `x`.
    let g = common::graph(
        r#"
kernels:
  - name: row_scaled
    dims: { s: { value: 16, dynamic: true }, k: { value: 4096, dynamic: true }, n: 256 }
    inputs: { x: "f16[s, k]", w: "f16[k, n]", sc: "f16[k, 1]" }
    outputs: { y: "f32[s, n]" }
    body: |
      y = matmul(x, w * sc)
"#,
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    let l = c.best();
    let shown: String = l.kernels.iter().map(|k| k.show(l.dims())).collect();
    // No kernel stores the scaled weights: the only workspaces are the split's f32 partials.
    assert!(l.workspaces.iter().all(|w| w.ty == WorkspaceType::F32), "{shown}");
    let k = l.kernels[0].tile().expect("a tile kernel");
    let reads: Vec<&str> = k.params.iter().map(|p| p.name.as_str()).collect();
    assert!(reads.contains(&"w") && reads.contains(&"sc"), "{reads:?}");
    let lp = loops(&k.body);
    assert_eq!(lp.len(), 1);
    let scaled = loop_body(lp[0]).iter().any(|s| matches!(s, Stmt::Assign { expr, .. } if column_reads(expr) == 1));
    assert!(scaled, "the loop scales x by the column read of sc: {shown}");
    assert!(k.warps.split && k.warps.threads() == 128, "{:?}", k.warps);
    // At ragged extents (rows and contraction both 77, then both 333, no multiple of the
    // loop's tile) with large inputs.
    interpreted_within_tolerance(&g, l, 77, 5, 16.0);
    interpreted_within_tolerance(&g, l, 333, 6, 8.0);
}

/// The tensor-core products of a tile program, nested loops included.
fn mmas(body: &[Stmt]) -> usize {
    flatten(body).into_iter().filter(|s| matches!(s, Stmt::Mma { .. })).count()
}

#[test]
fn a_computed_right_operand_of_many_columns_is_stored_in_the_tensor_cores_type() {
    // `silu(w)` is computed, and every block of the product reads all of it: a first kernel
    // stores it, in bf16 (the type the tensor cores take with `x`), and the second multiplies
    // `x` by it on the tensor cores. Stored in f32, the product was the fallback's.
    let g = common::graph(
        r#"
kernels:
  - name: gated
    dims: { s: { value: 2048, dynamic: true }, k: 96, n: 72 }
    inputs: { x: "bf16[s, k]", w: "bf16[k, n]" }
    outputs: { y: "bf16[s, n]" }
    body: |
      y = matmul(x, silu(w))
"#,
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    let l = c.best();
    let (_, product) = operand_then_product(l, &["w"], "gated");
    assert_eq!(l.workspaces[0].ty, WorkspaceType::BF16);
    let ws = product.params.iter().find(|p| p.name == "ws0").expect("the product reads the workspace");
    assert_eq!(ws.dtype, DType::BF16);
    assert!(mmas(&product.body) > 0, "a tensor-core product");
    // The tolerance counts the rounding of silu(w) to bf16 (`Graph::rounded_operand_type`).
    interpreted_within_tolerance(&g, l, 77, 5, 16.0);
}

#[test]
fn a_grid_resident_at_once_reads_its_shared_tiles_from_dram_once() {
    // MLA decode unsplit on an H200, 16 heads a block: 128 blocks, eight per request, each
    // streaming its request's whole latent cache. The grid is resident at once, so the eight
    // read each tile side by side and L2 serves seven of them, however large the cache: the
    // estimate does not depend on the L2's size. Over two waves too, as long as the eight are
    // launched one after another; a wave apart, only a tensor L2 holds is read once.
    let opts = Options { archs: vec![SM90], ..Options::default() };
    let c = compile(&common::shipped("mla_decode"), &opts).expect("compiles");
    let r = c
        .ranked
        .iter()
        .find(|r| r.candidate.launch.kernels.len() == 1 && r.candidate.costs[0].blocks == 128)
        .expect("an unsplit candidate of 128 blocks");
    let l = &r.candidate.launch;
    let k = l.kernels[0].tile().expect("a tile kernel");
    let regs = l.registers[0];
    let at = |arch: &cleave_core::arch::Arch| kernel_cost(k, l.dims(), regs, arch);
    // A GPU whose DRAM is slow next to what its SMs stream and issue, so that what is
    // fetched from DRAM bounds.
    let fast = cleave_core::arch::Arch {
        sm_dram_bandwidth: 4.0 * SM90.sm_dram_bandwidth,
        dram_bandwidth: SM90.dram_bandwidth / 4.0,
        ..SM90
    };
    let one = at(&fast);
    assert_eq!(one.waves, 1, "{one:?}");
    let small_l2 = at(&cleave_core::arch::Arch { l2_bytes: 1 << 20, ..fast });
    assert_eq!(one.seconds, small_l2.seconds);
    // Were every block's tiles fetched from DRAM, the wave would take longer than estimated.
    let all = one.gmem_bytes as f64 / fast.dram_bandwidth;
    assert!(one.seconds < all, "{one:?}: {all} s to fetch every block's tiles");
    let half = cleave_core::arch::Arch { sms: SM90.sms / 2, ..fast };
    let two = at(&half);
    assert_eq!(two.waves, 2, "{two:?}");
    assert_eq!(two.seconds, at(&cleave_core::arch::Arch { l2_bytes: 1 << 20, ..half }).seconds);
    // The grid in the other order: the readers of a tile are a wave apart.
    let mut reversed = k.clone();
    reversed.grid.reverse();
    let apart = |arch: &cleave_core::arch::Arch| kernel_cost(&reversed, l.dims(), regs, arch);
    assert!(two.seconds < apart(&half).seconds, "{two:?} {:?}", apart(&half));
    let large_l2 = apart(&cleave_core::arch::Arch { l2_bytes: 1 << 32, ..half });
    assert!(large_l2.seconds < apart(&half).seconds, "{large_l2:?} {:?}", apart(&half));
}

#[test]
fn blocks_that_read_the_same_weights_are_launched_one_after_another() {
    // SwiGLU decode planned for 16 rows and run at 64: four row blocks read each column block
    // of the weights, 235 MB of them, far more than L2 holds. Launched next to one another
    // (the row axis fastest), the four stream each weight tile together and fetch it once; in
    // the lowering's order (the row axis slowest) every pass over the columns fetches all the
    // weights again.
    let opts = Options { archs: vec![SM90], ..Options::default() };
    let c = compile(&common::shipped("swiglu_decode"), &opts).expect("compiles");
    let l = c.best();
    let k = l.kernels[0].tile().expect("a tile kernel");
    let regs = l.registers[0];
    let b = l.dims().find("b").expect("dim b");
    assert_eq!(grid_names(k, &c).last().map(String::as_str), Some("b"), "{:?}", grid_names(k, &c));
    let mut slowest = k.clone();
    slowest.grid.sort_by_key(|a| a.dim != b);
    assert_eq!(slowest.grid[0].dim, b);
    let at = |k: &TileKernel, rows: u64, arch: &cleave_core::arch::Arch| {
        let mut dims = l.dims().clone();
        dims.get_mut(b).value = rows;
        kernel_cost(k, &dims, regs, arch)
    };
    // At the planned extent there is one row block, and the order changes nothing.
    assert_eq!(at(k, 16, &SM90).seconds, at(&slowest, 16, &SM90).seconds);
    let (together, apart) = (at(k, 64, &SM90), at(&slowest, 64, &SM90));
    assert_eq!(together.gmem_bytes, apart.gmem_bytes, "the same tiles are read");
    assert!(together.seconds < apart.seconds, "{together:?} {apart:?}");
    // On an H200 what each SM streams (from DRAM or L2) bounds too. On a GPU whose DRAM is
    // slow next to its SMs, fetching the weights once is four times as fast.
    let slow_dram = cleave_core::arch::Arch {
        sm_dram_bandwidth: 4.0 * SM90.sm_dram_bandwidth,
        dram_bandwidth: SM90.dram_bandwidth / 4.0,
        ..SM90
    };
    let (together, apart) = (at(k, 64, &slow_dram), at(&slowest, 64, &slow_dram));
    assert_eq!((together.bound, apart.bound), (Bound::Dram, Bound::Dram));
    assert!(3.5 * together.seconds < apart.seconds, "{together:?} {apart:?}");
}

#[test]
fn configurations_that_would_idle_their_warps_are_refused() {
    // MHA decode at head dim 128: 32-key tiles cannot give each of 4 column warps 16 keys, so
    // those configurations are refused rather than run on one warp; 64- and 128-key tiles of
    // the same loop keep all four busy.
    let c = compiled("mha_d128_decode");
    let idle = c.stats.rejected.iter().find(|(k, _)| k.contains("warps left idle")).map_or(0, |(_, n)| *n);
    assert!(idle > 0, "{:?}", c.stats.rejected);
    // No kept split kernel runs 16 rows on one warp over a loop of narrow tiles.
    for r in c.ranked.iter().filter(|r| !r.splits.is_empty()) {
        let k = r.candidate.launch.kernels[0].tile().expect("a tile kernel");
        for s in &k.body {
            if let Stmt::Loop { tile, .. } = s {
                assert!(k.warps.threads() >= 128 || *tile >= 64, "{:?} over {tile}-wide tiles", k.warps);
            }
        }
    }
}

#[test]
fn the_cost_model_counts_waves_on_the_sms_a_grid_uses() {
    // The split kernel of MHA decode streams K/V: DRAM-bound on an H200.
    let c = compiled("mha_d64_decode");
    let l = c.best();
    let k = l.kernels[0].tile().expect("a tile kernel");
    let regs = l.registers[0];
    let full = kernel_cost(k, l.dims(), regs, &SM90);
    assert_eq!(full.bound, Bound::Dram, "{full:?}");
    let blocks = full.blocks;
    // Exactly one wave, then one block more: the second wave holds a single block, which
    // costs far less than a full wave (the old model charged every wave as full).
    let resident = full.blocks_per_sm;
    let sms = blocks.div_ceil(resident) as u32;
    let one_wave = cleave_core::arch::Arch { sms, ..SM90 };
    let over = cleave_core::arch::Arch { sms: sms - 1, ..SM90 };
    let a = kernel_cost(k, l.dims(), regs, &one_wave);
    let b = kernel_cost(k, l.dims(), regs, &over);
    assert_eq!((a.waves, b.waves), (1, 2));
    assert!(b.seconds > a.seconds && b.seconds < 1.5 * a.seconds, "{a:?} {b:?}");
    // A GPU four times as wide, with the bandwidth to match, leaves three quarters of its SMs
    // idle on this grid, and their bandwidth with them.
    let scale = 4.0 * blocks as f64 / f64::from(SM90.sms);
    let wide = cleave_core::arch::Arch {
        sms: 4 * blocks as u32,
        dram_bandwidth: 4.0 * blocks as f64 * SM90.sm_dram_bandwidth / 1.3,
        mma_flops: SM90.mma_flops * scale,
        simt_flops: SM90.simt_flops * scale,
        smem_bandwidth: SM90.smem_bandwidth * scale,
        ..SM90
    };
    let w = kernel_cost(k, l.dims(), regs, &wide);
    let fraction = w.gmem_bytes as f64 / (w.seconds - cleave_core::plan::LAUNCH_SECONDS) / wide.dram_bandwidth;
    assert!(fraction < 0.4, "{fraction} of the bandwidth with a quarter of the SMs busy");
    assert_eq!(w.bound, Bound::Dram);
}

#[test]
fn a_deeper_pipeline_waits_out_less_latency() {
    // The combine kernel of a split decode reads one partial per iteration, a small tile: with
    // two stages it waits out a DRAM latency every other iteration. Its configurations offer
    // deeper pipelines, and the one chosen keeps more tiles in flight and costs less.
    let c = compiled("mha_d64_decode");
    let l = c.best();
    let k = l.kernels[1].tile().expect("a tile kernel");
    let regs = l.registers[1];
    let deep = k.bufs.iter().map(|b| b.stages).max().expect("buffers");
    assert!(deep > 2, "the combine streams through {deep} stages");
    let mut shallow = k.clone();
    for b in shallow.bufs.iter_mut().filter(|b| b.stages > 1) {
        b.stages = 2;
    }
    let a = kernel_cost(k, l.dims(), regs, &SM90);
    let b = kernel_cost(&shallow, l.dims(), regs, &SM90);
    assert_eq!(b.bound, Bound::Latency, "{b:?}");
    assert!(a.seconds < b.seconds, "{} stages: {a:?}; two: {b:?}", deep);
}

#[test]
fn query_heads_sharing_a_kv_head_share_the_tile() {
    // MQA's 32 heads read one K/V head and GQA's groups of 4 one each: the split kernel packs
    // several of those heads into the rows of one block (at least 4 warps), so each K/V tile
    // it loads serves them all, and the grid walks the heads in groups.
    for (name, heads) in [("mqa_decode", "h"), ("gqa_decode", "r")] {
        let c = compiled(name);
        let split = c.best().kernels[0].tile().expect("a tile kernel");
        assert!(split.rows >= 64, "{name}: {} rows", split.rows);
        assert!(split.warps.m * split.warps.n >= 4, "{name}: {:?}", split.warps);
        let dims = c.best().dims();
        let h = dims.find(heads).expect("the heads dim");
        // Heads per block: the grid axis's tile, or all of them when no grid axis walks them.
        let per_block = split.grid.iter().find(|a| a.dim == h).map_or(dims.get(h).value, |a| a.tile);
        assert!(per_block >= 4, "{name}: {per_block} heads per block");
        assert_eq!(split.rows, 16 * per_block, "{name}: 16 queries of each packed head");
    }
}

#[test]
fn consecutive_reductions_stay_fused_at_long_sequences() {
    // MatMul+MatMul as declared, `(q·kᵀ)·v`: one kernel, the scores never leave the block.
    let c = compiled("matmul_matmul_prefill");
    let declared = c.ranked.iter().find(|r| r.graph_index.is_none()).expect("the declared graph is scheduled");
    assert_eq!(declared.candidate.launch.kernels.len(), 1);
    assert!(declared.candidate.launch.kernels[0].tile().is_some());
    assert_eq!(c.best().dims().get(c.best().dims().find("s").expect("s")).value, 4096);
    // MatMul+RowSum: the product X·W is never written to global memory (only row sums are);
    // without Split-K the product form is one kernel.
    let c = compiled("matmul_rowsum_prefill");
    for k in &c.best().kernels {
        for s in &k.tile().expect("a tile kernel").body {
            if let Stmt::Store { cols, .. } = s {
                assert_eq!(*cols, 1, "only row sums are stored");
            }
        }
    }
    let mut opts = Options::default();
    opts.search.split = false;
    let c = compile(&common::shipped("matmul_rowsum_prefill"), &opts).expect("compiles");
    let fused = c.ranked.iter().find(|r| r.candidate.launch.kernels.len() == 1).expect("a one-kernel product form");
    assert!(fused.candidate.launch.workspaces.is_empty());
    // The GEMV form, row sums of W first, ranks above it.
    assert_eq!(c.best().kernels.len(), 2);
    assert!(c.ranked[0].candidate.seconds < fused.candidate.seconds);
}

#[test]
fn matmul_matmul_prefill_multiplies_by_the_small_product_the_search_finds() {
    // `(q·kᵀ)·v` is `q·(kᵀ·v)`: the search finds it, and on every plan of a default build it is
    // scheduled and ranked first. A first kernel contracts the 4096 keys into each head's
    // 64 × 64 `kᵀ·v`, stored in f16 for the tensor cores; the second multiplies `q` by it. A
    // 4096 × 4096 score matrix is never formed, in memory or in a block.
    let targets = ArchSet::default().plan_targets();
    let g = common::shipped("matmul_matmul_prefill");
    let variants = compile_variants(&g, &Options::default(), &targets).expect("compiles");
    for v in &variants {
        let l = v.compiled.best();
        let (_, second) = operand_then_product(l, &["k", "v"], &format!("{:?}", v.targets));
        let d = g.dims.find("d").expect("d");
        assert_eq!(l.workspaces[0].ty, WorkspaceType::F16, "{:?}", v.targets);
        assert_eq!(&l.workspaces[0].shape[1..], [Dim::Var(d), Dim::Var(d)], "{:?}: d × d a head", v.targets);
        assert!(mmas(&second.body) > 0, "{:?}", v.targets);
        let declared = v.compiled.ranked.iter().find(|r| r.graph_index.is_none()).expect("declared");
        assert!(v.compiled.ranked[0].candidate.seconds * 4.0 < declared.candidate.seconds, "{:?}", v.targets);
    }
    // The rounding of `kᵀ·v` to f16 is within the declaration's tolerance (its scores would be
    // rounded alike), at ragged extents, with inputs as large as an f16 output allows.
    interpreted_within_tolerance(&g, variants[0].compiled.best(), 77, 13, 4.0);
}

#[test]
fn swiglu_fuses_the_two_matmuls_sharing_x() {
    let c = compiled("swiglu_prefill");
    let k = c.best().kernels[0].tile().expect("a tile kernel");
    let lp = loops(&k.body);
    assert_eq!(lp.len(), 1);
    let body = loop_body(lp[0]);
    let mmas = body.iter().filter(|s| matches!(s, Stmt::Mma { accumulate: true, .. })).count();
    assert_eq!(mmas, 2, "both products accumulate in one loop over k");
    let x_loads =
        body.iter().filter(|s| matches!(s, Stmt::Load { param, .. } if k.params[param.0 as usize].name == "x")).count();
    assert_eq!(x_loads, 1, "one tile of x feeds both");
}

#[test]
fn rmsnorm_matmul_reduces_squares_and_multiplies_in_one_loop() {
    let c = compiled("rmsnorm_matmul_prefill");
    let l = c.best();
    assert_eq!(l.kernels.len(), 1);
    let k = l.kernels[0].tile().expect("a tile kernel");
    let lp = loops(&k.body);
    assert_eq!(lp.len(), 1);
    let Stmt::Loop { dim, body, .. } = lp[0] else { unreachable!() };
    assert_eq!(l.dims().get(*dim).name, "k");
    assert!(body.iter().any(|s| matches!(s, Stmt::Mma { accumulate: true, .. })));
    assert!(body.iter().any(|s| matches!(s, Stmt::RowReduce { op: ReduceOp::Sum, acc: true, .. })));
    // The row scaling happens after the loop, on the product (paper Fig. 1).
    assert!(k
        .body
        .iter()
        .any(|s| matches!(s, Stmt::Store { expr: Expr::Binary(cleave_core::graph::BinaryOp::Mul, ..), .. })));
}

/// Input scale so attention scores reach about ±500 without overflowing the f64 reference.
fn scale(name: &str) -> f64 {
    if name.starts_with("mla_decode") {
        8.0
    } else if ["mha", "gqa", "mqa", "mla"].iter().any(|p| name.starts_with(p)) {
        11.0
    } else {
        1.0
    }
}

#[test]
fn every_kept_schedule_of_every_kernel_matches_the_reference_in_the_interpreter() {
    let text = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels.yaml")).expect("kernels.yaml");
    let module = cleave_core::front::check_source(&text).expect("checks");
    let mut failures = Vec::new();
    let mut runs = 0;
    let targets = ArchSet::default().plan_targets();
    for (_, g) in &module.kernels {
        let variants = compile_variants(g, &Options::default(), &targets).expect("compiles");
        // Small odd extents keep the interpreter quick on the big static shapes.
        let mut b = Bindings::of_table(&g.dims);
        let mut k = 0;
        for (v, d) in g.dims.iter() {
            if d.dynamic {
                b.values[v.index()] = [19, 45][k % 2];
                k += 1;
            }
        }
        let inputs = random_inputs(g, &b, 23, &InputScale { default: scale(&g.name), per_input: Vec::new() });
        let want = eval(g, &b, &inputs).expect("reference");
        // The plan for each kind of GPU a default build makes, and the first plan's runners-up
        // (other graph shapes, split and unsplit), up to three in all.
        let kept = variants.iter().map(|v| v.compiled.best());
        let others = variants[0].compiled.ranked.iter().skip(1).take(3 - variants.len().min(3));
        for l in kept.chain(others.map(|r| &r.candidate.launch)) {
            let mut lb = Bindings::of_table(l.dims());
            lb.values[..b.values.len()].copy_from_slice(&b.values);
            lb.complete(l.dims());
            let got = interp::run(l, &lb, &inputs, 9).expect("interpreter");
            for (gt, wt) in got.iter().zip(&want) {
                let e = max_rel_err(&gt.data, &wt.data);
                runs += 1;
                // The rounding of the kernel's narrowest type: f16, or bf16 for the serving
                // operators.
                if e.is_nan() || e > tolerance(g, &b, 0.0).max(2e-2) {
                    failures.push(format!("{}: {e}", g.name));
                }
            }
        }
    }
    assert!(runs >= 40, "{runs}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A default build's code runs on sm_90, on sm_80 and, through the sm_80 SASS, on the 99 KiB
/// sm_86 and sm_89: each gets a plan within its own limits, under its own symbols, in one
/// source, and the sm_90 plan only in the code of GPUs that pick it.
#[test]
fn a_default_build_plans_for_each_kind_of_gpu() {
    let set = ArchSet::default();
    let targets = set.plan_targets();
    let variants =
        compile_variants(&common::shipped("mha_d128_prefill"), &Options::default(), &targets).expect("compiles");
    let summary: Vec<(Vec<String>, u32)> = variants.iter().map(|v| (v.targets.clone(), v.min_cc)).collect();
    let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(summary, [(names(&["sm_90"]), 90), (names(&["sm_86"]), 86), (names(&["sm_80"]), 80)]);
    let smem = |i: usize| variants[i].compiled.best().kernels.iter().map(|k| k.smem_bytes()).max().unwrap_or(0);
    // The A100 plan uses more than an RTX 4090 grants; the plan for the 99 KiB GPUs does not.
    assert!(smem(2) > 101_376 && smem(2) <= SM80.smem_per_block, "{}", smem(2));
    assert!(smem(1) <= 101_376, "{}", smem(1));
    assert!(smem(0) <= SM90.smem_per_block);
    let symbols: Vec<&str> = variants.iter().map(|v| v.compiled.best().kernels[0].symbol()).collect();
    assert_eq!(
        symbols,
        ["cleave_mha_d128_prefill_0", "cleave_mha_d128_prefill_sm86_0", "cleave_mha_d128_prefill_sm80_0"]
    );
    let floors: Vec<Option<u32>> = variants.iter().map(|v| set.code_floor(v.min_cc)).collect();
    assert_eq!(floors, [Some(900), None, None]);
    let launches: Vec<_> = variants.iter().zip(&floors).map(|(v, f)| (v.compiled.best(), *f)).collect();
    let source = cleave_core::codegen::cuda::emit_launches(&launches, "mha_d128_prefill");
    assert_eq!(source.matches("#if (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900)").count(), 1, "{source}");
    assert_eq!(source.matches("#if defined(__CUDACC__) && !defined(CLEAVE_EMULATE)").count(), 2, "{source}");
    // Each plan's kernel is defined (and, for the host emulation, called) the same way.
    let uses: Vec<usize> = symbols.iter().map(|s| source.matches(&format!(" {s}(")).count()).collect();
    assert!(uses[0] >= 1 && uses.iter().all(|&n| n == uses[0]), "{uses:?}");
    // Neighbouring targets whose best launches agree share one plan, bounded by the oldest.
    let one =
        compile_variants(&common::shipped("matmul_rowsum_decode"), &Options::default(), &targets).expect("compiles");
    assert_eq!(one.len(), 1, "{:?}", one.iter().map(|v| &v.targets).collect::<Vec<_>>());
    assert_eq!((one[0].targets.len(), one[0].min_cc), (3, 80));
    // A plan records the SMs of the first GPU it was made for: a split count derived at launch
    // lands the grid on them in the ranking and the host emulation.
    let decode = compile_variants(&common::shipped("mha_d64_decode"), &Options::default(), &targets).expect("compiles");
    for v in &decode {
        let first = targets.iter().find(|t| t.name == v.targets[0]).expect("a target");
        assert_eq!(v.compiled.best().sms, first.budget.sms, "{:?}", v.targets);
    }
    assert_eq!(decode[0].compiled.best().sms, 132);
}

#[test]
fn a_long_reduction_into_few_elements_shares_each_element_among_lanes() {
    // A softmax over a vocabulary has a few rows of 32000 entries. One thread per row sum
    // would leave all but one block idle and run a chain of 32000 dependent steps; the
    // fallback gives each row a block of lanes instead, and the one-thread form of the same
    // stage is estimated many times slower.
    let g = common::graph(
        r#"
kernels:
  - name: vocab
    dims: { b: { value: 8, dynamic: true }, v: { value: 32000, dynamic: true } }
    inputs: { logits: "f32[b, v]" }
    outputs: { p: "f32[b, v]" }
    body: |
      p = softmax(logits / 0.7)
"#,
    );
    let stage = |l: &Launch, k: usize| match &l.kernels[k] {
        Kernel::Stage(s) => s.clone(),
        Kernel::Tile(_) => panic!("kernel {k} is a tile kernel"),
    };
    let l = fallback(&g, "t", &SM90).expect("a fallback");
    let sums = l.kernels.iter().position(|k| matches!(k, Kernel::Stage(s) if matches!(s.value, SExpr::Reduce { .. })));
    let sums = stage(&l, sums.expect("a reducing stage"));
    assert_eq!(sums.lanes, 256, "{}", sums.show(&g.dims));
    assert_eq!((sums.threads(), sums.smem_bytes()), (256, 64));
    let single = sums.clone().cooperate(1, &g.dims);
    let (shared, alone) = (stage_cost(&sums, &g.dims, &SM90).seconds, stage_cost(&single, &g.dims, &SM90).seconds);
    assert!(alone > 20.0 * shared, "{alone} against {shared}");
    // Every lane count folds to the reference's value: at extents that are no multiple of the
    // lanes, and below them (most lanes reduce nothing), with exponents in the hundreds.
    for lanes in LANES {
        let mut forced = l.clone();
        for k in &mut forced.kernels {
            if let Kernel::Stage(s) = k {
                if s.may_cooperate() {
                    *s = s.clone().cooperate(lanes, &g.dims);
                }
            }
        }
        for (extent, seed) in [(77, 5), (1001, 6)] {
            interpreted_within_tolerance(&g, &forced, extent, seed, 30.0);
        }
    }

    // Lanes must read consecutive addresses: a sum down the rows keeps one thread per
    // column, whose neighbours read the next addresses, however long the columns are.
    let (s, shown) = first_fallback_stage(
        r#"
kernels:
  - name: columns
    dims: { n: { value: 32000, dynamic: true }, d: 64 }
    inputs: { x: "f32[n, d]" }
    outputs: { y: "f32[1, d]" }
    body: |
      y = sum(x, axis=0)
"#,
    );
    assert!(!s.may_cooperate() && s.lanes == 1, "{shown}");
    // Many short rows already fill the GPU one thread a row: lanes would only add their fold.
    let (s, shown) = first_fallback_stage(
        r#"
kernels:
  - name: short_rows
    dims: { t: { value: 65536, dynamic: true }, k: 8 }
    inputs: { x: "f32[t, k]" }
    outputs: { y: "f32[t, 1]" }
    body: |
      y = sum(exp(x), axis=-1)
"#,
    );
    assert!(s.may_cooperate() && s.lanes == 1, "{shown}");
}

/// The first stage of the H200 fallback of the one kernel `yaml` declares, and how it reads.
fn first_fallback_stage(yaml: &str) -> (StageKernel, String) {
    let g = common::graph(yaml);
    let l = fallback(&g, "t", &SM90).expect("a fallback");
    match &l.kernels[0] {
        Kernel::Stage(s) => (s.clone(), s.show(&g.dims)),
        Kernel::Tile(_) => panic!("the fallback's first kernel is a tile kernel"),
    }
}

/// A GEMV declared `b: dyn 16 | 64 | 256` gets a plan per batch size, each searched and ranked
/// at its own extents: each is exactly what compiling the declaration at that batch alone
/// gives, their kernels are named apart, and a plan that comes out the same as an earlier
/// one's shares it instead of adding code.
#[test]
fn plans_at_other_extents_are_searched_again_and_named_apart() {
    let yaml = "kernels:\n  - name: gemv\n    dims: { b: { value: 16, dynamic: true, also: [64, 256] }, k: 4096, n: 4096 }\n    \
                inputs: { x: \"f16[b, k]\", w: \"f16[k, n]\" }\n    outputs: { y: \"f16[b, n]\" }\n    \
                body: |\n      y = matmul(x, w)\n";
    let module = cleave_core::front::check_source(yaml.as_bytes()).expect("checks");
    let (decl, declared) = &module.kernels[0];
    let points = cleave_core::front::points(decl).expect("points");
    let targets = ArchSet::default().plan_targets();
    let h200 = &targets[..1];
    let variants =
        cleave_core::pipeline::compile_points(declared, &points, &Options::default(), h200).expect("compiles");
    let at: Vec<String> = variants.iter().map(|v| format!("{:?}", v.at)).collect();
    assert_eq!(at, ["[]", "[(\"b\", 64)]", "[(\"b\", 256)]"]);
    for (v, graph) in variants.iter().zip(std::iter::once(declared).chain(points.iter().map(|p| &p.graph))) {
        assert_eq!(v.targets, ["sm_90"]);
        // The same as the point compiled on its own, for the same GPU.
        let alone = compile_variants(graph, &Options::default(), h200).expect("compiles");
        let (mine, theirs) = (v.compiled.best(), alone[0].compiled.best());
        assert_eq!(mine.kernels.len(), theirs.kernels.len());
        assert_eq!(v.compiled.ranked[0].candidate.seconds, alone[0].compiled.ranked[0].candidate.seconds);
        assert_eq!(
            cleave_core::codegen::cuda::emit_launch(
                &{
                    let mut l = theirs.clone();
                    if let Some(k) = mine.kernels.first() {
                        l.rename(k.symbol().trim_end_matches("_0"));
                    }
                    l
                },
                "k"
            ),
            cleave_core::codegen::cuda::emit_launch(mine, "k")
        );
        let b = graph.dims.find("b").expect("b");
        assert_eq!(mine.graph.dims.get(mine.graph.dims.find("b").expect("b")).value, graph.dims.get(b).value);
    }
    // Each extent's plan has symbols of its own; one that shares points at an earlier plan.
    let suffix = ["", "_p1_b64", "_p2_b256"];
    for (v, s) in variants.iter().zip(suffix) {
        match v.shares {
            None => {
                for k in &v.compiled.best().kernels {
                    let rest = k
                        .symbol()
                        .strip_prefix(&format!("cleave_gemv{s}_"))
                        .unwrap_or_else(|| panic!("{}", k.symbol()));
                    assert!(rest.chars().all(|c| c.is_ascii_digit()), "{}", k.symbol());
                }
            }
            Some(j) => assert!(j < 4 && variants[j].shares.is_none(), "{:?}", v.shares),
        }
    }
    // 256 rows are not 16: the batch of 256 gets a plan of its own.
    assert_eq!(variants[2].shares, None);
    assert!(!variants[2].compiled.best().same_plan(variants[0].compiled.best()));
    // And by the cost model each point's own plan is at least as fast there as the declared
    // extents' plan run at that point.
    let targets = Targets::new(&[h200[0].budget]);
    let declared_plan = variants[0].compiled.best();
    for (v, graph) in variants.iter().zip(std::iter::once(declared).chain(points.iter().map(|p| &p.graph))) {
        let own = seconds_at(v.compiled.best(), &graph.dims, &targets);
        // The re-costing reproduces the ranking's own estimate.
        assert!((own - v.compiled.ranked[0].candidate.seconds).abs() <= 1e-12, "{own} at {:?}", v.at);
        let declared = seconds_at(declared_plan, &graph.dims, &targets);
        assert!(own <= declared, "{:?}: own plan {own:e} s, declared plan {declared:e} s", v.at);
        #[allow(clippy::print_stderr)]
        {
            eprintln!("{:?}: own plan {:.2} us, declared plan {:.2} us", v.at, own * 1e6, declared * 1e6);
        }
    }
    // The b=16 plan at 256 rows: sixteen row blocks each stream the whole weight.
    assert!(
        seconds_at(declared_plan, &points[1].graph.dims, &targets)
            > 2.0 * variants[2].compiled.ranked[0].candidate.seconds
    );

    // A decode whose context is split at run time: twice the context is the same kernels (the
    // launcher derives the split count from the extents), so that plan shares the declared one.
    let yaml = "kernels:\n  - name: dec\n    dims: { h: 32, b: { value: 16, dynamic: true }, \
                l: { value: 4096, dynamic: true, also: [8192] }, d: 64 }\n    \
                inputs: { q: \"f16[h, b, d]\", k: \"f16[h, l, d]\", v: \"f16[h, l, d]\" }\n    \
                outputs: { o: \"f16[h, b, d]\" }\n    body: |\n      \
                o = matmul(softmax(matmul(q, transpose(k)) * 0.125, axis=-1), v)\n";
    let module = cleave_core::front::check_source(yaml.as_bytes()).expect("checks");
    let (decl, declared) = &module.kernels[0];
    let points = cleave_core::front::points(decl).expect("points");
    let variants =
        cleave_core::pipeline::compile_points(declared, &points, &Options::default(), h200).expect("compiles");
    assert_eq!(variants.len(), 2);
    assert_eq!(variants[1].shares, Some(0));
    assert_eq!(variants[1].at, [("l".to_string(), 8192)]);
    // Its split count is chosen at launch: re-costed at twice the context, the shared plan
    // takes the count chosen for 8192 keys, and so is exactly the point's own estimate.
    let plan = variants[0].compiled.best();
    assert!(cleave_core::plan::requests::has_runtime_splits(&plan.graph.dims));
    let at_8192 = seconds_at(plan, &points[0].graph.dims, &targets);
    assert!((at_8192 - variants[1].compiled.ranked[0].candidate.seconds).abs() <= 1e-12);
    assert!(
        (seconds_at(plan, &declared.dims, &targets) - variants[0].compiled.ranked[0].candidate.seconds).abs() <= 1e-12
    );
    assert!(at_8192 > variants[0].compiled.ranked[0].candidate.seconds);
}

#[test]
fn a_log_sum_exp_written_with_its_own_max_runs_as_one_attention_kernel() {
    // `lse = m + log(Σ exp(s − m))` beside `o = softmax(s) · v`, with the user's `m = max(s)`:
    // log turns the shift into a term that cancels, so the search finds the graph without the
    // max, and the scheduler runs it as one attention kernel whose running max stabilizes both
    // outputs (five kernels before, the max, the exps and the sums apart).
    let g = common::graph(
        r#"
kernels:
  - name: attn_with_lse
    dims: { s: { value: 256, dynamic: true }, l: { value: 256, dynamic: true }, d: 64 }
    inputs: { q: "f16[s, d]", k: "f16[l, d]", v: "f16[l, d]" }
    outputs: { o: "f16[s, d]", lse: "f32[s, 1]" }
    body: |
      s = matmul(q, transpose(k)) * 0.125
      m = max(s, axis=-1)
      e = exp(s - m)
      z = sum(e, axis=-1)
      o = matmul(e / z, v)
      lse = m + log(z)
"#,
    );
    // Without Split the search is exhausted in about a second (with it, it runs to its limit).
    let mut opts = Options::default();
    opts.search.split = false;
    let c = compile(&g, &opts).expect("compiles");
    let l = c.best();
    assert_eq!(l.kernels.len(), 1, "{} kernels", l.kernels.len());
    let k = l.kernels[0].tile().expect("a tile kernel");
    assert_eq!(loops(&k.body).len(), 1, "one loop over the keys");
    assert!(
        !l.graph.nodes.iter().any(|n| matches!(n.op, cleave_core::graph::Op::Reduce(ReduceOp::Max, _))),
        "the user's max is gone from the chosen graph"
    );
    // Both outputs against the reference, at ragged extents and scores in the hundreds.
    let mut b = Bindings::of_table(&g.dims);
    for (name, v) in [("s", 29), ("l", 143)] {
        b.values[g.dims.find(name).expect("dim").index()] = v;
    }
    let (got, want) = interpreted(&g, l, &b, 3, 11.0);
    let lse = want[1].data.iter().fold(0.0f64, |a, x| a.max(x.abs()));
    assert!(lse > 100.0, "large scores: |lse| up to {lse}");
    for (i, name) in ["o", "lse"].iter().enumerate() {
        let e = max_rel_err(&got[i].data, &want[i].data);
        assert!(e < tolerance(&g, &b, 0.0), "{name}: {e}");
    }
}

#[test]
fn a_log_softmax_written_as_the_log_of_a_softmax_runs_stabilized_in_tile_kernels() {
    // `log(softmax(x))` as written takes the log of quotients whose exps underflow in f32 a
    // hundred below the row's max; the log of that quotient is a difference, so the search
    // finds `x − log(Σ exp(x))`, whose one reduction the scheduler stabilizes with a running
    // max. Before, only the extended-exponent fallback could run it.
    let g = common::graph(
        r#"
kernels:
  - name: log_softmax
    dims: { t: { value: 16, dynamic: true }, v: 32000 }
    inputs: { x: "f16[t, v]" }
    outputs: { y: "f32[t, v]" }
    body: |
      y = log(softmax(x, axis=-1))
"#,
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    let l = c.best();
    assert!(l.kernels.iter().all(|k| k.tile().is_some()), "tile kernels only: {:?}", c.ranked[0].splits);
    assert!(!l
        .graph
        .nodes
        .iter()
        .any(|n| matches!(n.op, cleave_core::graph::Op::Binary(cleave_core::graph::BinaryOp::Div))));
    let fallback = cleave_core::pipeline::fallback_candidate(&g, &Targets::new(&Options::default().archs), "f")
        .expect("the fallback");
    assert!(
        fallback.seconds > 2.0 * c.ranked[0].candidate.seconds,
        "{} against {}",
        fallback.seconds,
        c.ranked[0].candidate.seconds
    );
    // Against the reference with logits spread over thousands: every exp but the row's largest
    // underflows, and the answer is about x − max(x).
    let mut b = Bindings::of_table(&g.dims);
    b.values[g.dims.find("t").expect("t").index()] = 5;
    let (got, want) = interpreted(&g, l, &b, 7, 300.0);
    let spread = want[0].data.iter().fold(0.0f64, |a, x| a.max(x.abs()));
    assert!(spread > 1000.0, "|y| up to {spread}");
    let e = max_rel_err(&got[0].data, &want[0].data);
    assert!(e < tolerance(&g, &b, 0.0), "{e}");
}

#[test]
fn a_softmax_over_rows_longer_than_a_tile_sums_them_first_in_a_kernel_of_its_own() {
    // One block cannot tile a 32000-wide output row and also loop the row's sum over it, so
    // this ran only on the extended-exponent fallback. The row-first partition stores each
    // row's sum of exps, scaled by its running max, and that max; the second kernel computes
    // `exp(x - m) / sum` against the stored max, which no element of the row exceeds.
    let g = common::graph(
        r#"
kernels:
  - name: vocab_softmax
    dims: { b: { value: 4096, dynamic: true }, v: { value: 32000, dynamic: true } }
    inputs: { x: "f32[b, v]" }
    outputs: { p: "f32[b, v]" }
    body: |
      p = softmax(x * 0.5, axis=-1)
"#,
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    let l = c.best();
    assert_eq!(l.kernels.len(), 2, "{}", c.ranked[0].candidate.seconds);
    let (first, second) = (l.kernels[0].tile().expect("tile"), l.kernels[1].tile().expect("tile"));
    assert_eq!((l.workspaces.len(), l.workspaces[0].shape.last()), (2, Some(&Dim::One)), "a row's sum and its max");
    assert_eq!((loops(&first.body).len(), loops(&second.body).len()), (1, 0), "the sums loop; the quotient does not");
    let names = |k: &TileKernel| k.params.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(first)[0], "x");
    assert!(names(second).contains(&"x".to_string()), "the second kernel reads the row again: {:?}", names(second));
    let shifted = flatten(&second.body).iter().any(|s| match s {
        Stmt::Store { expr, .. } => format!("{expr:?}").contains("ExpDiff"),
        _ => false,
    });
    assert!(shifted, "the stored max shifts the second kernel's exp");
    let fallback = cleave_core::pipeline::fallback_candidate(&g, &Targets::new(&Options::default().archs), "f")
        .expect("the fallback");
    assert!(
        fallback.seconds > c.ranked[0].candidate.seconds,
        "{} against {}",
        fallback.seconds,
        c.ranked[0].candidate.seconds
    );
    // Against the reference at ragged extents, with exponents far past f32's exp range.
    let mut b = Bindings::of_table(&g.dims);
    b.values[g.dims.find("b").expect("b").index()] = 37;
    b.values[g.dims.find("v").expect("v").index()] = 2053;
    let (got, want) = interpreted(&g, l, &b, 11, 400.0);
    assert!(got[0].data.iter().all(|x| x.is_finite()), "finite probabilities");
    let e = max_rel_err(&got[0].data, &want[0].data);
    assert!(e < tolerance(&g, &b, 0.0), "{e}");
}

#[test]
fn the_log_of_a_quotient_of_exps_never_takes_the_log_of_an_underflowed_exp() {
    // `log(exp(x) / s)` in f32: `exp(x - m)` is 0 for a score 104 below its row's max, and its
    // log -inf, though the true value is finite. The lowering takes the exponent instead.
    let g = common::graph(
        r#"
kernels:
  - name: literal_log_softmax
    dims: { t: { value: 512, dynamic: true }, v: 128 }
    inputs: { x: "f32[t, v]" }
    outputs: { y: "f32[t, v]" }
    body: |
      y = log(exp(x) / sum(exp(x), axis=-1))
"#,
    );
    let opts = Options { archs: vec![SM90], ..Options::default() };
    let c = compile(&g, &opts).expect("compiles");
    let literal = c
        .ranked
        .iter()
        .find(|r| {
            r.candidate.launch.kernels.iter().all(|k| k.tile().is_some())
                && r.candidate
                    .launch
                    .graph
                    .nodes
                    .iter()
                    .any(|n| matches!(n.op, cleave_core::graph::Op::Binary(cleave_core::graph::BinaryOp::Div)))
        })
        .expect("a tile plan of the quotient");
    let mut b = Bindings::of_table(&g.dims);
    b.values[g.dims.find("t").expect("t").index()] = 37;
    let (got, want) = interpreted(&g, &literal.candidate.launch, &b, 5, 300.0);
    let spread = want[0].data.iter().fold(0.0f64, |a, x| a.max(x.abs()));
    assert!(spread > 200.0, "log-probabilities down to -{spread}");
    let e = max_rel_err(&got[0].data, &want[0].data);
    assert!(e < tolerance(&g, &b, 0.0), "{e}");
}

#[test]
fn a_softmax_over_few_long_rows_splits_them_across_blocks() {
    // Eight rows of 32000: computed first in a kernel of their own, the row sums would take one
    // block. Split along the row, a block per chunk sums its exps against its own running max;
    // the combine merges the chunks and computes `exp(x - m) / sum` with the merged max.
    let g = common::graph(
        r#"
kernels:
  - name: few_rows
    dims: { b: { value: 8, dynamic: true }, v: { value: 32000, dynamic: true } }
    inputs: { x: "f32[b, v]" }
    outputs: { p: "f32[b, v]" }
    body: |
      p = softmax(x / 0.7, axis=-1)
"#,
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    let l = c.best();
    let names: Vec<&str> = c.ranked[0].splits.iter().map(|s| s.name.as_str()).collect();
    assert_eq!((names, l.kernels.len()), (vec!["s_v"], 2));
    let combine = l.kernels[1].tile().expect("a tile kernel");
    let merge = loops(&combine.body);
    assert_eq!(merge.len(), 1, "the merge of the chunks");
    let after: Vec<&Stmt> = combine.body.iter().skip_while(|s| !matches!(s, Stmt::Loop { .. })).skip(1).collect();
    let Some(Stmt::Store { expr, .. }) = after.iter().find(|s| matches!(s, Stmt::Store { .. })) else {
        panic!("a store after the merge")
    };
    assert!(format!("{expr:?}").contains("ExpDiff"), "the merged max shifts the exp: {expr:?}");
    let fallback = cleave_core::pipeline::fallback_candidate(&g, &Targets::new(&Options::default().archs), "f")
        .expect("the fallback");
    assert!(
        fallback.seconds > 2.0 * c.ranked[0].candidate.seconds,
        "{} against {}",
        fallback.seconds,
        c.ranked[0].candidate.seconds
    );
    // One row and 37, each over a row that leaves the last chunk ragged, with exponents far
    // past f32's exp range.
    let count = l.dims().get(l.dims().find("s_v").expect("the split count")).value;
    assert!(count >= 2 && 2053 % count != 0 && 3001 % count != 0, "{count} chunks");
    for (rows, cols) in [(1, 2053), (37, 3001)] {
        let mut b = Bindings::of_table(&g.dims);
        b.values[g.dims.find("b").expect("b").index()] = rows;
        b.values[g.dims.find("v").expect("v").index()] = cols;
        let (got, want) = interpreted(&g, l, &b, 13, 400.0);
        assert!(got[0].data.iter().all(|x| x.is_finite()), "finite probabilities");
        let e = max_rel_err(&got[0].data, &want[0].data);
        assert!(e < tolerance(&g, &b, 0.0), "{rows}×{cols}: {e}");
    }
}

#[test]
fn a_layer_norm_over_rows_longer_than_a_tile_takes_a_kernel_per_reduction() {
    // The variance reduces `x - mean(x)`: the mean must be whole first. Each reduction gets a
    // kernel, and the last computes `x - mean` again from the stored mean.
    let g = common::graph(
        r#"
kernels:
  - name: layer_norm
    dims: { t: { value: 4096, dynamic: true }, d: 4096 }
    inputs: { x: "f16[t, d]", w: "f16[d]", b: "f16[d]" }
    outputs: { y: "f16[t, d]" }
    body: |
      c = x - mean(x, axis=-1)
      y = c * rsqrt(mean(square(c), axis=-1) + 1e-5) * w + b
"#,
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    let l = c.best();
    assert!(l.kernels.iter().all(|k| k.tile().is_some()) && l.kernels.len() == 3, "{}", l.kernels.len());
    assert_eq!(l.workspaces.len(), 2, "the mean and the variance");
    let fallback = cleave_core::pipeline::fallback_candidate(&g, &Targets::new(&Options::default().archs), "f")
        .expect("the fallback");
    assert!(
        fallback.seconds > 2.0 * c.ranked[0].candidate.seconds,
        "{} against {}",
        fallback.seconds,
        c.ranked[0].candidate.seconds
    );
    interpreted_within_tolerance(&g, l, 37, 17, 30.0);
}

#[test]
fn a_probability_times_its_log_is_zero_where_the_probability_underflows() {
    // `p * log(p)` with `p = exp(x) / sum(exp(x))` held in a register: its log is taken
    // through the exp, `(x - m) - log(l)`, so an underflowed `p` gives 0 · finite, not
    // 0 · -inf = NaN.
    let g = common::graph(
        r#"
kernels:
  - name: plogp
    dims: { t: { value: 512, dynamic: true }, v: 128 }
    inputs: { x: "f32[t, v]" }
    outputs: { y: "f32[t, v]" }
    body: |
      e = exp(x)
      p = e / sum(e, axis=-1)
      y = p * log(p)
"#,
    );
    let c = compile(&g, &Options { archs: vec![SM90], ..Options::default() }).expect("compiles");
    let tiled: Vec<&Launch> =
        c.ranked.iter().map(|r| &r.candidate.launch).filter(|l| l.kernels.iter().all(|k| k.tile().is_some())).collect();
    assert!(!tiled.is_empty(), "a tile plan");
    let mut b = Bindings::of_table(&g.dims);
    b.values[g.dims.find("t").expect("t").index()] = 37;
    // Exponents reach ±300: most of each row's probabilities underflow in f32.
    let exp_arg = random_inputs(&g, &b, 3, &InputScale { default: 100.0, per_input: Vec::new() })[0]
        .data
        .iter()
        .fold(0.0f64, |a, x| a.max(x.abs()));
    assert!(exp_arg > 200.0, "{exp_arg}");
    for l in tiled {
        let (got, want) = interpreted(&g, l, &b, 3, 100.0);
        assert!(got[0].data.iter().all(|y| y.is_finite()), "no 0 · -inf");
        let e = max_rel_err(&got[0].data, &want[0].data);
        assert!(e < tolerance(&g, &b, exp_arg), "{e}");
    }
}

/// Whether a tile kernel stages some tile transposed, and whether it stores one so.
fn transposed_tiles(k: &TileKernel) -> (bool, bool) {
    let all = flatten(&k.body);
    (
        all.iter().any(|s| matches!(s, Stmt::Load { trans: true, .. })),
        all.iter().any(|s| matches!(s, Stmt::Store { trans: true, .. })),
    )
}

/// A one-kernel declaration whose dims `n` and `d` are dynamic.
fn columns_kernel(dims: &str, inputs: &str, outputs: &str, body: &str) -> cleave_core::graph::ValidGraph {
    common::graph(&format!(
        "kernels:\n  - name: columns\n    dims: {{ {dims} }}\n    inputs: {{ {inputs} }}\n    \
         outputs: {{ {outputs} }}\n    body: |\n      {body}\n"
    ))
}

#[test]
fn reductions_down_a_column_run_along_the_rows_of_transposed_tiles() {
    // Written over the first axis, each reduction is computed transposed: its tiles arrive with
    // the tensor's columns as the block's rows, its loop walks the column many rows a step, and
    // each output is stored back in the declared order. As written, these ran on the fallback,
    // or (the plain sum) walked the column one row per step.
    let dynamic = "n: { value: 4096, dynamic: true }, d: { value: 1024, dynamic: true }";
    let cases = [
        // A column sum; a softmax-weighted average down the columns (one pass, with a running
        // max per column); a softmax down the columns, output whole; a mean over a sequence.
        (columns_kernel(dynamic, "x: \"f32[n, d]\"", "y: \"f32[1, d]\"", "y = sum(x, axis=0)"), 1.0),
        (
            columns_kernel(
                dynamic,
                "x: \"f32[n, d]\", v: \"f32[n, d]\"",
                "y: \"f32[1, d]\"",
                "y = sum(exp(x) * v, axis=0) / sum(exp(x), axis=0)",
            ),
            40.0,
        ),
        (columns_kernel(dynamic, "x: \"f32[n, d]\"", "y: \"f32[n, d]\"", "y = softmax(x, axis=0)"), 40.0),
        (
            columns_kernel(
                "b: 3, n: { value: 512, dynamic: true }, d: { value: 768, dynamic: true }",
                "h: \"f16[b, n, d]\"",
                "y: \"f16[b, 1, d]\"",
                "y = mean(h, axis=1)",
            ),
            1.0,
        ),
    ];
    let targets = Targets::new(&Options::default().archs);
    for (g, scale) in cases {
        let c = compile(&g, &Options::default()).expect("compiles");
        let l = c.best();
        let tiles: Vec<&TileKernel> = l.kernels.iter().map(|k| k.tile().expect("tile kernels only")).collect();
        let (loads, stores) =
            tiles.iter().map(|k| transposed_tiles(k)).fold((false, false), |a, b| (a.0 | b.0, a.1 | b.1));
        assert!(loads && stores, "transposed loads {loads}, stores {stores}");
        // The loop over the column takes many rows of it a step.
        let walks =
            tiles.iter().flat_map(|k| flatten(&k.body)).any(|s| matches!(s, Stmt::Loop { tile, .. } if *tile >= 64));
        assert!(walks, "a loop over the column");
        let fallback = cleave_core::pipeline::fallback_candidate(&g, &targets, "f").expect("the fallback");
        assert!(fallback.seconds > 2.0 * c.ranked[0].candidate.seconds);
        // Ragged extents in both axes (no tile divides them), fresh data, exponents far past
        // f32's range where the case has exps.
        for (n, d, seed) in [(301, 77, 5), (1, 33, 6), (1000, 5, 7)] {
            let mut b = Bindings::of_table(&g.dims);
            b.values[g.dims.find("n").expect("n").index()] = n;
            b.values[g.dims.find("d").expect("d").index()] = d;
            let (got, want) = interpreted(&g, l, &b, seed, scale);
            let e = max_rel_err(&got[0].data, &want[0].data);
            // The largest exp argument: the largest input, where the case has exps.
            let x = &random_inputs(&g, &b, seed, &InputScale { default: scale, per_input: Vec::new() })[0];
            let exp_arg = if scale > 1.0 { x.data.iter().fold(0.0f64, |m, v| m.max(v.abs())) } else { 0.0 };
            assert!(e < tolerance(&g, &b, exp_arg), "{n}×{d}: {e}");
        }
    }
}

#[test]
fn a_quotient_of_exps_shifted_by_a_running_max_is_never_computed() {
    // `softmax(x, axis=0)` over a unit axis is `exp(x) / exp(x)`, one everywhere. Beside a
    // softmax along the row of the same `x` the two exps are one node, which the row's max
    // shifts: `exp(x - m)` underflows far below the max, and the quotient was 0 / 0, stored
    // as 0. Every launch the ranking keeps must give ones.
    let g = columns_kernel(
        "a: { value: 300, dynamic: true }",
        "x: \"f32[1, a]\"",
        "p: \"f32[1, a]\", q: \"f32[1, a]\"",
        "p = softmax(x, axis=-1)\n      q = softmax(x, axis=0)",
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    let mut b = Bindings::of_table(&g.dims);
    b.values[g.dims.find("a").expect("a").index()] = 77;
    // The inputs `interpreted` draws for seed 31.
    let inputs = random_inputs(&g, &b, 31, &InputScale { default: 30.0, per_input: Vec::new() });
    let exp_arg = inputs[0].data.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let (lo, hi) = inputs[0].data.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| (l.min(*v), h.max(*v)));
    assert!(hi - lo > 104.0, "some exps underflow in f32 once shifted by the max: {lo} to {hi}");
    for r in &c.ranked {
        let (got, want) = interpreted(&g, &r.candidate.launch, &b, 31, 30.0);
        for (o, (x, w)) in got.iter().zip(&want).enumerate() {
            let e = max_rel_err(&x.data, &w.data);
            assert!(e < tolerance(&g, &b, exp_arg), "output {o}: {e}");
        }
    }
}

#[test]
fn a_softmax_down_a_few_long_columns_splits_each_column_across_blocks() {
    // Eight columns of 100000: a block per column group would leave all but one SM idle. The
    // transposed graph's sum runs over chunks of the column (the input split as it is read
    // transposed), and a combine merges the chunks' sums and running maxima.
    let g = columns_kernel(
        "n: { value: 100000, dynamic: true }, c: 8",
        "x: \"f32[n, c]\"",
        "y: \"f32[n, c]\"",
        "y = softmax(x, axis=0)",
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    let l = c.best();
    assert!(!c.ranked[0].splits.is_empty(), "split along the column");
    let tiles: Vec<&TileKernel> = l.kernels.iter().map(|k| k.tile().expect("tile kernels only")).collect();
    assert_eq!(tiles.len(), 2, "a split kernel and its combine");
    assert!(transposed_tiles(tiles[0]).0, "the split kernel reads its chunk transposed");
    assert_eq!(l.workspaces.iter().filter(|w| w.node.is_some()).count(), 1, "only the chunks' sums are stored");
    let unsplit =
        c.ranked.iter().filter(|r| r.splits.is_empty()).map(|r| r.candidate.seconds).fold(f64::INFINITY, f64::min);
    assert!(unsplit > 4.0 * c.ranked[0].candidate.seconds, "{unsplit} against {}", c.ranked[0].candidate.seconds);
    // Several chunk counts over columns they leave ragged, with exponents far past f32's
    // range; one row, where every chunk but the first is empty.
    for (n, parts, seed) in [(5001, 8, 21), (777, 3, 22), (1, 5, 23), (64, 32, 24)] {
        let (e, tol) = split_error(&g, l, ("n", n), ("s_n", parts), seed, 60.0);
        assert!(e < tol, "{n} rows in {parts} chunks: {e}");
    }
}

/// The interpreter's largest relative error on the first output of launch `l` of `g`, with
/// dynamic dim `dim.0` at `dim.1` and split count `count.0` at `count.1`, on inputs of `seed`
/// at `scale`; and the tolerance for exp arguments as large as the first input's largest
/// magnitude.
fn split_error(
    g: &cleave_core::graph::ValidGraph,
    l: &Launch,
    dim: (&str, u64),
    count: (&str, u64),
    seed: u64,
    scale: f64,
) -> (f64, f64) {
    let mut b = Bindings::of_table(&g.dims);
    b.values[g.dims.find(dim.0).expect("the dim").index()] = dim.1;
    let inputs = random_inputs(g, &b, seed, &InputScale { default: scale, per_input: Vec::new() });
    let want = eval(g, &b, &inputs).expect("reference");
    let mut lb = Bindings::of_table(l.dims());
    lb.values[..b.values.len()].copy_from_slice(&b.values);
    lb.values[l.dims().find(count.0).expect("the split count").index()] = count.1;
    lb.complete(l.dims());
    let got = interp::run(l, &lb, &inputs, 3).expect("interpreter");
    let exp_arg = inputs[0].data.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    (max_rel_err(&got[0].data, &want[0].data), tolerance(g, &b, exp_arg))
}

/// Runs every ranked launch of `c` in the interpreter at `b` on inputs of `seed` and `scale`,
/// and asserts each output within the tolerance for exp arguments up to `max_exp_arg`.
fn every_launch_within_tolerance(
    g: &cleave_core::graph::ValidGraph,
    c: &Compiled,
    b: &Bindings,
    seed: u64,
    scale: f64,
    max_exp_arg: f64,
) {
    for r in &c.ranked {
        let (got, want) = interpreted(g, &r.candidate.launch, b, seed, scale);
        for (o, (x, w)) in got.iter().zip(&want).enumerate() {
            let e = max_rel_err(&x.data, &w.data);
            let n = r.candidate.launch.kernels.len();
            assert!(e < tolerance(g, b, max_exp_arg), "output {o} of a launch of {n} kernels: {e}");
        }
    }
}

/// Bindings of `g`'s dims at their declared values, with dynamic dim `name` at `value`.
fn bound(g: &cleave_core::graph::ValidGraph, name: &str, value: u64) -> Bindings {
    let mut b = Bindings::of_table(&g.dims);
    b.values[g.dims.find(name).expect("the dim exists").index()] = value;
    b
}

#[test]
fn an_output_the_algebra_reduces_to_an_input_is_stored_by_every_launch() {
    // `transpose(transpose(x))` is `x`: an output whose node is the input itself, which no
    // kernel of a partition computes. Beside a softmax down the columns (a row-first launch:
    // the column sums first, the rest second) the second kernel left it unwritten.
    let g = columns_kernel(
        "c: { value: 16, dynamic: true }, a: 3",
        "x: \"bf16[c, a]\"",
        "p: \"f32[a, c]\", y: \"f32[c, a]\"",
        "p = softmax(transpose(x), axis=0)\n      y = transpose(transpose(x))",
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    let mut b = Bindings::of_table(&g.dims);
    b.values[g.dims.find("c").expect("c").index()] = 22;
    assert!(c.ranked.iter().any(|r| r.candidate.launch.kernels.len() > 1), "a launch of several kernels");
    every_launch_within_tolerance(&g, &c, &b, 5, 2.0, 8.0);
}

/// The kinds of the tensor-core products of a launch's tile kernels, in program order.
fn mma_kinds(l: &Launch) -> Vec<MmaKind> {
    let tiles = l.kernels.iter().filter_map(|k| k.tile());
    let stmts = tiles.flat_map(|k| flatten(&k.body));
    stmts
        .filter_map(|s| match s {
            Stmt::Mma { kind, .. } => Some(*kind),
            _ => None,
        })
        .collect()
}

#[test]
fn a_computed_left_operand_keeps_the_precision_its_inputs_declared() {
    // `-x` is computed, so the tensor cores would take it in the right operand's type. From f16
    // inputs, bf16 drops three bits of mantissa; where the 96 terms of a row cancel, that moved
    // the product by far more than any output's rounding (generated seed 134893: 0.46 where
    // 0.16 was allowed; 0.32 here). Such a product keeps `-x` in f32 and runs on split tf32
    // products; of one type it is rounded to that type, and an f32 source is rounded by design.
    for (x, w, split) in [("f16", "bf16", true), ("bf16", "f16", true), ("f16", "f16", false), ("f32", "bf16", false)] {
        let g = columns_kernel(
            "s: { value: 64, dynamic: true }, k: 96, n: 16",
            &format!("x: \"{x}[s, k]\", w: \"{w}[k, n]\""),
            "y: \"f16[s, n]\"",
            "y = sigmoid(matmul(-x, w))",
        );
        let c = compile(&g, &Options::default()).expect("compiles");
        let best = mma_kinds(c.best());
        assert!(!best.is_empty(), "{x} × {w}: the tensor cores");
        let want = if split { MmaKind::Tf32 { a_split: true, b_split: false } } else { MmaKind::Half };
        assert!(best.iter().all(|k| *k == want), "{x} × {w}: {best:?}");
        if !split {
            continue;
        }
        let mut b = Bindings::of_table(&g.dims);
        b.values[g.dims.find("s").expect("s").index()] = 37;
        for r in &c.ranked {
            let l = &r.candidate.launch;
            assert!(
                mma_kinds(l).iter().all(|k| *k != MmaKind::Half),
                "{x} × {w}: no launch rounds `-x` for the tensor cores"
            );
            let (got, want) = interpreted(&g, l, &b, 134_893, 6.0);
            let e = max_rel_err(&got[0].data, &want[0].data);
            assert!(e < tolerance(&g, &b, 0.0), "{x} × {w}: {e}");
        }
    }
}

#[test]
fn outputs_that_cannot_share_a_block_get_kernels_of_their_own() {
    // A norm along each row and a mean down each column of one input: no tile map serves both
    // in one block (the row's tiles against the column's), as written or transposed, so only
    // the fallback scheduled it. The two outputs share no computed value, so each can be a
    // kernel of its own, the mean's computed transposed (its column a block's row).
    let g = columns_kernel(
        "t: { value: 4096, dynamic: true }, d: 256",
        "x: \"bf16[t, d]\"",
        "y: \"bf16[t, d]\", m: \"f32[1, d]\"",
        "y = rmsnorm(x, axis=-1, eps=1e-5)\n      m = mean(x, axis=0)",
    );
    two_tile_kernels_one_transposed(&g, 301, 9, 8.0, 0.0);
}

/// Asserts that the best launch of `g` is two tile kernels without workspaces, one of them
/// reading its tiles transposed, and that every ranked launch is within tolerance at `t`.
fn two_tile_kernels_one_transposed(
    g: &cleave_core::graph::ValidGraph,
    t: u64,
    seed: u64,
    scale: f64,
    max_exp_arg: f64,
) {
    let c = compile(g, &Options::default()).expect("compiles");
    let l = c.best();
    let tiles: Vec<&TileKernel> = l.kernels.iter().filter_map(|k| k.tile()).collect();
    assert_eq!((tiles.len(), l.kernels.len(), l.workspaces.len()), (2, 2, 0), "{:?}", c.stats);
    assert_eq!(tiles.iter().filter(|k| transposed_tiles(k).0).count(), 1, "one kernel reads its tiles transposed");
    every_launch_within_tolerance(g, &c, &bound(g, "t", t), seed, scale, max_exp_arg);
}

#[test]
fn outputs_sharing_a_value_get_kernels_that_recompute_it() {
    // A sum of `exp(x)` along each row and one down each column: both read the same exps, so
    // the outputs fall in one group, and no block's tiles serve the row and the column at
    // once. Each output's kernel computes the exps again from `x` (the column sum's
    // transposed, its column a block's row), where before the graph went to the fallback.
    let g = columns_kernel(
        "t: { value: 2048, dynamic: true }, d: 128",
        "x: \"f16[t, d]\"",
        "r: \"f32[t, 1]\", s: \"f32[1, d]\"",
        "e = exp(x)\n      r = sum(e, axis=-1)\n      s = sum(e, axis=0)",
    );
    two_tile_kernels_one_transposed(&g, 203, 13, 3.0, 3.0 * 6.0);
}

#[test]
fn an_output_no_tile_program_computes_leaves_the_others_tiled() {
    // `exp(x)` stored as it is may overflow f32 where the declared result does not, so no
    // tile program computes it (no running max shifts it); only the fallback's
    // extended-exponent stages do. The row norm beside it shares nothing with it and is a
    // tile kernel of its own: the launch is that kernel, then the exp's stage, where before
    // the whole graph went to the fallback.
    let g = columns_kernel(
        "t: { value: 4096, dynamic: true }, d: 256",
        "x: \"bf16[t, d]\", z: \"f32[t, d]\"",
        "y: \"bf16[t, d]\", e: \"f32[t, d]\"",
        "y = rmsnorm(x, axis=-1, eps=1e-5)\n      e = exp(z)",
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    let l = c.best();
    let kinds: Vec<bool> = l.kernels.iter().map(|k| k.tile().is_some()).collect();
    assert_eq!(kinds, [true, false], "{:?}", c.stats);
    // The tile kernel writes y alone, the stage e alone.
    let written =
        |k: &Kernel| -> Vec<String> { k.params().iter().filter(|p| p.output).map(|p| p.name.clone()).collect() };
    assert_eq!((written(&l.kernels[0]), written(&l.kernels[1])), (vec!["y".to_string()], vec!["e".to_string()]));
    every_launch_within_tolerance(&g, &c, &bound(&g, "t", 77), 21, 4.0, 4.0 * 6.0);
}

#[test]
fn a_paged_decode_whose_outputs_share_scores_compiles() {
    // `o` and `lse` share the scores. For a search candidate whose outputs take no one
    // kernel, the grouping gave `lse`'s cone to fallback stages of a part of the graph, whose
    // stage builder read the page tables by the launch graph's input numbers and panicked
    // (index 4 of 4 inputs). A graph with per-request dims is now the fallback's whole there.
    let g = common::graph(
        "kernels:\n  - name: paged\n    dims:\n      b: { value: 32, dynamic: true }\n      \
         pages: { value: 4096, dynamic: true }\n      entries: { value: 2048, dynamic: true }\n      \
         l: { value: 1024, paged: { indices: page_table, indptr: page_indptr, page_size: page, last_page_len: last } }\n      \
         page: 16\n      h: 8\n      d: 64\n    inputs:\n      q: \"f16[b, h, 1, d] as [b, h, d]\"\n      \
         k_cache: \"f16[b, h, l, d] as [pages, page, h, d]\"\n      \
         v_cache: \"f16[b, h, l, d] as [pages, page, h, d]\"\n      page_table: \"i32[entries]\"\n      \
         page_indptr: \"i32[b + 1]\"\n      last: \"i32[b]\"\n      scale: \"f32[]\"\n    outputs:\n      \
         o: \"f16[b, h, 1, d] as [b, h, d]\"\n      lse: \"f32[b, h, 1, 1] as [b, h]\"\n    body: |\n      \
         s = matmul(q, transpose(k_cache)) * scale\n      o = matmul(softmax(s), v_cache)\n      \
         lse = log(sum(exp(s), axis=-1))\n",
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    assert!(c.best().kernels.iter().all(|k| k.tile().is_some()), "{:?}", c.stats);
}

#[test]
fn a_users_own_shift_by_the_max_is_a_tile_kernel() {
    // `exp(x - max(x))` with no reduction after it is at most one: no running max is needed,
    // and tile kernels compute it as written. Along the rows of 64 one kernel does; down the
    // columns, of a dynamic length, a first kernel stores each column's max and a second
    // computes the exps against it, both transposed (the row-first partition). Before, every
    // such exp was the fallback's. Large inputs put many elements far below their max, where
    // the f32 exp underflows to zero as the output type would round it.
    for (axis, kernels, transposed) in [("-1", 1, false), ("0", 2, true)] {
        let g = columns_kernel(
            "t: { value: 64, dynamic: true }, d: 64",
            "x: \"f32[t, d]\", v: \"bf16[t, d]\"",
            "y: \"f32[t, d]\"",
            &format!("y = v * exp(x - max(x, axis={axis}))"),
        );
        let c = compile(&g, &Options::default()).expect("compiles");
        let tiles: Vec<&TileKernel> = c.best().kernels.iter().filter_map(|k| k.tile()).collect();
        assert_eq!((tiles.len(), c.best().kernels.len()), (kernels, kernels), "axis {axis}: {:?}", c.stats);
        assert!(tiles.iter().all(|k| transposed_tiles(k).0 == transposed), "axis {axis}");
        every_launch_within_tolerance(&g, &c, &bound(&g, "t", 61), 17, 30.0, 0.0);
    }
}

#[test]
fn a_one_element_tile_read_transposed_broadcasts_over_the_blocks_columns() {
    // Computed transposed, the weighted column average reads `s` (one element) through a
    // transpose, from the tile the block loaded for `square(transpose(s))` as written. That
    // transposed read was a column read, which stops after the tile's one row: every column
    // but the first weighed zero, and `a` came out 100% off in that launch.
    let g = columns_kernel(
        "t: { value: 24, dynamic: true }, c: 8",
        "x: \"f32[c, t]\", s: \"bf16[1, 1]\"",
        "a: \"bf16[1, t]\", q: \"f16[1, 1]\"",
        "a = square(sum(exp(x) * s, axis=0) / sum(exp(x), axis=0))\n      q = square(transpose(s))",
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    every_launch_within_tolerance(&g, &c, &bound(&g, "t", 28), 5, 2.0, 12.0);
}

#[test]
fn a_transposed_left_operand_is_one_matrix_per_block() {
    // `transpose(x)` of a batched `x` is read transposed, each matrix stored `k × rows` in its
    // tile. A block over two matrices packed their rows together, and the fragment loads (and
    // the interpreter) read the second matrix's rows from the first one's columns: every launch
    // that did was wrong (generated seed 1229, 31× off). Such blocks are refused, and the
    // launches that remain tile one matrix a block.
    let g = columns_kernel(
        "a: 16, b: { value: 3, dynamic: true }, c: { value: 16, dynamic: true }",
        "x: \"f16[a, b, c]\", w: \"f16[c, b]\"",
        "y: \"f32[a, c, c]\"",
        "y = matmul(transpose(x), transpose(w))",
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    assert!(c.ranked.iter().any(|r| r.candidate.launch.kernels.iter().all(|k| k.tile().is_some())));
    let mut b = bound(&g, "b", 40);
    b.values[g.dims.find("c").expect("c").index()] = 24;
    every_launch_within_tolerance(&g, &c, &b, 1229, 2.0, 0.0);
}

#[test]
fn a_product_that_feeds_an_exp_keeps_its_computed_operand_in_f32() {
    // Rounded to 16 bits, `-x` would move the scores by an error the exp amplifies by their
    // magnitude; such a product was the fallback's. It now keeps `-x` in f32, split into tf32
    // head and tail, and the whole softmax is one tile kernel.
    let g = columns_kernel(
        "s: { value: 64, dynamic: true }, k: 96, n: 64",
        "x: \"f16[s, k]\", w: \"f16[k, n]\"",
        "y: \"f32[s, n]\"",
        "y = softmax(matmul(-x, w), axis=-1)",
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    assert_eq!(c.best().kernels.len(), 1, "one kernel");
    assert!(c.best().kernels[0].tile().is_some(), "a tile kernel");
    assert_eq!(mma_kinds(c.best()), [MmaKind::Tf32 { a_split: true, b_split: false }]);
    every_launch_within_tolerance(&g, &c, &bound(&g, "s", 37), 17, 8.0, 0.0);
}

#[test]
fn an_output_another_is_computed_from_gets_a_kernel_of_its_own() {
    // `wt` is stored as a `[n, k]` tile map, and the product reads it as its `[k, n]` operand:
    // no block holds both, and as one cone with the product's, `wt` took the whole
    // declaration to the fallback. Its own cone, placed first, is a kernel that stores it; the
    // product's kernel reads `w` again and stores only `y`.
    let g = columns_kernel(
        "s: { value: 96, dynamic: true }, k: 64, n: 128",
        "x: \"f16[s, k]\", w: \"f16[n, k]\"",
        "y: \"f32[s, n]\", wt: \"f16[k, n]\"",
        "y = matmul(x, transpose(w))\n      wt = transpose(w)",
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    let best = c.best();
    let tiles: Vec<&TileKernel> = best.kernels.iter().filter_map(|k| k.tile()).collect();
    assert_eq!(tiles.len(), 2, "two tile kernels");
    assert_eq!(best.kernels.len(), 2, "and nothing else");
    let stores = |k: &TileKernel| -> Vec<String> {
        flatten(&k.body)
            .into_iter()
            .filter_map(|s| match s {
                Stmt::Store { param, .. } => Some(k.params[param.0 as usize].name.clone()),
                _ => None,
            })
            .collect()
    };
    assert_eq!(stores(tiles[0]), ["wt"]);
    assert_eq!(stores(tiles[1]), ["y"]);
    every_launch_within_tolerance(&g, &c, &bound(&g, "s", 77), 141, 4.0, 0.0);
}

#[test]
fn a_value_two_reductions_tile_differently_is_stored_between_kernels() {
    // The softmax along each row of `x` wants blocks of whole rows; the sum down the columns
    // wants blocks of whole columns. No one kernel holds both, and no output lies between
    // them, so these declarations went to the fallback. A kernel now stores the value between
    // them to an f32 workspace and the next reads it: the softmax; the log of a log-sum-exp,
    // which its running max leaves through (a sum of the exps would stay scaled, and is
    // refused); or a softmax beside a normalization down the columns.
    let s = "s: { value: 80, dynamic: true }, d: 72";
    let cases = [
        (
            columns_kernel(
                s,
                "x: \"f32[s, d]\", v: \"f16[s, d]\"",
                "y: \"f32[1, d]\"",
                "y = sum(softmax(x) * v, axis=0)",
            ),
            "a softmax-weighted sum down the columns",
        ),
        (
            columns_kernel(s, "x: \"f32[s, d]\"", "y: \"f32[1, d]\"", "y = sum(x - log(sum(exp(x), axis=-1)), axis=0)"),
            "a log-sum-exp per row, then a sum down the columns",
        ),
        (
            columns_kernel(s, "x: \"f32[s, d]\"", "y: \"f32[s, d]\"", "y = x / sum(x * x, axis=0) + softmax(x)"),
            "a softmax beside a normalization down the columns",
        ),
    ];
    for (g, what) in cases {
        let c = compile(&g, &Options::default()).expect("compiles");
        let best = c.best();
        assert!(best.kernels.len() >= 2, "{what}: several kernels");
        assert!(best.kernels.iter().all(|k| k.tile().is_some()), "{what}: tile kernels only");
        // A tile kernel writes a workspace that a later one reads.
        let written = |k: &TileKernel| k.params.iter().any(|p| p.output && p.name.starts_with("ws"));
        let read = |k: &TileKernel| k.params.iter().any(|p| !p.output && p.name.starts_with("ws"));
        let tiles: Vec<&TileKernel> = best.kernels.iter().filter_map(|k| k.tile()).collect();
        assert!(written(tiles[0]) && read(tiles[tiles.len() - 1]), "{what}: a value between kernels");
        // Exp arguments past f32's range: the stored values stay finite and true.
        for (seed, extent) in [(31, 80), (32, 37)] {
            every_launch_within_tolerance(&g, &c, &bound(&g, "s", extent), seed, 150.0, 300.0);
        }
    }
}

#[test]
fn an_exp_summed_over_a_leading_axis_keeps_a_running_max_per_element() {
    // Over the leading axis of `[b, c, a]` a loop walks one slice at a time, and each element
    // sums its own column of slices, so its running max is its own (a max shared by a row
    // would let one large element underflow its neighbours' sums). No running max per row
    // could stabilize these exps, and the declarations went to the fallback.
    let dims = "b: { value: 96, dynamic: true }, c: 40, a: 24";
    let cases = [
        (
            columns_kernel(
                dims,
                "x: \"f32[b, c, a]\", v: \"f16[b, c, a]\"",
                "y: \"f32[1, c, a]\"",
                "y = sum(exp(x) * v, axis=0) / sum(exp(x), axis=0)",
            ),
            "a softmax-weighted average over the leading axis",
        ),
        (
            columns_kernel(dims, "x: \"f32[b, c, a]\"", "y: \"f32[1, c, a]\"", "y = log(sum(exp(x), axis=0))"),
            "a log-sum-exp over the leading axis",
        ),
    ];
    for (g, what) in cases {
        let c = compile(&g, &Options::default()).expect("compiles");
        let per_element =
            |k: &TileKernel| k.bufs.iter().any(|b| b.name.ends_with("_m") && matches!(b.kind, BufKind::Frag { .. }));
        let tiled: Vec<&Launch> = c
            .ranked
            .iter()
            .map(|r| &r.candidate.launch)
            .filter(|l| l.kernels.iter().all(|k| k.tile().is_some()))
            .collect();
        assert!(!tiled.is_empty(), "{what}: a launch of tile kernels");
        assert!(
            tiled.iter().all(|l| l.kernels.iter().filter_map(|k| k.tile()).any(per_element)),
            "{what}: each keeps a running max per element"
        );
        // Exp arguments past f32's range, at the declared extent and a ragged one.
        for (seed, extent) in [(41, 96), (42, 37)] {
            every_launch_within_tolerance(&g, &c, &bound(&g, "b", extent), seed, 150.0, 300.0);
        }
    }
    // Summed along the row after that, or contracted by a product, the elements would mix
    // their scales: such schedules are refused, and every launch kept is still right.
    let mixed = [
        ("x: \"f32[b, c, a]\"", "y: \"f32[1, c, 1]\"", "y = sum(sum(exp(x), axis=0), axis=-1)"),
        ("x: \"f32[b, c, a]\", w: \"f16[1, a, n]\"", "y: \"f32[1, c, n]\"", "y = matmul(max(exp(x), axis=0), w)"),
    ];
    for (inputs, outputs, body) in mixed {
        let g = columns_kernel("b: { value: 96, dynamic: true }, c: 40, a: 32, n: 16", inputs, outputs, body);
        let c = compile(&g, &Options::default()).expect("compiles");
        // Elements whose maxima differ by tens, and sums that fit f32.
        for (seed, extent) in [(43, 96), (44, 37)] {
            every_launch_within_tolerance(&g, &c, &bound(&g, "b", extent), seed, 10.0, 40.0);
        }
    }
}

#[test]
fn a_computed_right_operand_beside_a_conflicting_output_is_stored_for_its_product() {
    // `s` wants blocks of whole columns and the products blocks of rows, so the outputs take
    // kernels of their own. The outer product's right operand is computed, and a tile program
    // reads a right operand only from memory: one kernel now stores it and the product's
    // kernel reads it back. Such a graph had no launch of tile kernels and ran on the fallback.
    let g = columns_kernel(
        "n: { value: 64, dynamic: true }, d: 64",
        "x: \"f32[n, d]\", w: \"f16[d, d]\"",
        "s: \"f32[1, d]\", y: \"f32[d, d]\"",
        "s = sum(x, axis=0)\n      y = matmul(w, matmul(transpose(x), x))",
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    let best = c.best();
    assert!(best.kernels.iter().all(|k| k.tile().is_some()), "tile kernels only");
    let reads_stored_operand = |k: &TileKernel| {
        let body = flatten(&k.body);
        body.iter().any(|s| match s {
            Stmt::Mma { b, .. } => body.iter().any(|l| {
                matches!(l, Stmt::Load { dst, param, .. }
                    if *dst == b.buf && k.params[param.0 as usize].name.starts_with("ws"))
            }),
            _ => false,
        })
    };
    assert!(best.kernels.iter().filter_map(|k| k.tile()).any(reads_stored_operand), "a right operand read back");
    for (seed, extent) in [(51, 64), (52, 37)] {
        every_launch_within_tolerance(&g, &c, &bound(&g, "n", extent), seed, 3.0, 6.0);
    }
}

#[test]
fn an_exp_summed_over_a_long_leading_axis_is_split_with_a_max_stored_per_element() {
    // 4096 slices of 16 × 32: blocks of 16 rows would leave all but one SM idle, so the sum
    // is split over chunks of the leading axis. Each chunk's sums are scaled by its running
    // max per element, stored whole beside them (a max per row would let one element underflow
    // another), and the combine merges the chunks element by element.
    let dims = "b: { value: 4096, dynamic: true }, c: 16, a: 32";
    let cases = [
        (dims, "x: \"f32[b, c, a]\"", "y: \"f32[1, c, a]\"", "y = log(sum(exp(x), axis=0))"),
        (
            dims,
            "x: \"f32[b, c, a]\", v: \"f16[b, c, a]\"",
            "y: \"f32[1, c, a]\"",
            "y = sum(exp(x) * v, axis=0) / sum(exp(x), axis=0)",
        ),
        // Tiles of one column of a last axis of 8 (the leading `a` offers that tile to both):
        // a max per element is then one value per block row, and still stored per element.
        (
            "b: { value: 4096, dynamic: true }, a: 8, c: 16",
            "x: \"f32[b, a, c, a]\"",
            "y: \"f32[1, a, c, a]\"",
            "y = log(sum(exp(x), axis=0))",
        ),
        // Beside a wider unscaled partial: the max takes its own partial's layout, not the
        // wider one's.
        (
            dims,
            "u: \"f32[b, c, a]\", x: \"f32[b, c, 1]\"",
            "y: \"f32[1, c, a]\", z: \"f32[1, c, 1]\"",
            "y = sum(u + x, axis=0)\n      z = log(sum(exp(x * 0.5), axis=0))",
        ),
    ];
    for (dims, inputs, outputs, body) in cases {
        let g = columns_kernel(dims, inputs, outputs, body);
        let c = compile(&g, &Options::default()).expect("compiles");
        assert!(!c.ranked[0].splits.is_empty(), "{body}: split along the leading axis");
        let a = g.dims.find("a").expect("a");
        let mut split = 0;
        for r in c.ranked.iter().filter(|r| !r.splits.is_empty()) {
            let l = &r.candidate.launch;
            let tiles: Vec<&TileKernel> = l.kernels.iter().filter_map(|k| k.tile()).collect();
            let max = tiles.first().and_then(|k| k.params.iter().find(|p| p.name == "partial_max"));
            if let Some(max) = max {
                // The combine reads the max at the layout the split kernel wrote it.
                let read = tiles.last().and_then(|k| k.params.iter().find(|p| !p.output && p.name.ends_with("_max")));
                assert_eq!(read.map(|p| &p.shape), Some(&max.shape), "{body}: the max's layout");
                if g.outputs.len() == 1 {
                    assert_eq!(max.shape.last(), Some(&Some(a)), "{body}: one max per element");
                }
                split += 1;
            }
            // Several chunk counts, ragged ones and empty chunks among them, at exponents far
            // past f32's range.
            for (n, parts, seed) in [(4096, 8, 31), (1001, 7, 32), (5, 5, 33), (2, 4, 34)] {
                let (e, tol) = split_error(&g, l, ("b", n), ("s_b", parts), seed, 60.0);
                assert!(e < tol, "{body}: {n} slices in {parts} chunks: {e}");
            }
        }
        assert!(split > 0, "{body}: a split kernel stores its max");
    }
}

#[test]
fn the_interpreter_addresses_a_workspace_by_the_shape_each_kernel_declares_for_it() {
    // Generated code computes a parameter's strides from the parameter's own shape, so two
    // kernels that disagree on a workspace's shape read each other's values at the wrong
    // places. The interpreter must see that as a device would: a combine reading the stored
    // maxima at another shape of the same size gives wrong sums, and one of another size is
    // refused before anything runs.
    let g = columns_kernel(
        "b: { value: 4096, dynamic: true }, c: 16, a: 32",
        "x: \"f32[b, c, a]\"",
        "y: \"f32[1, c, a]\"",
        "y = log(sum(exp(x), axis=0))",
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    let l = &c.ranked.iter().find(|r| !r.splits.is_empty()).expect("a split launch").candidate.launch;
    let (e, tol) = split_error(&g, l, ("b", 1001), ("s_b", 7), 41, 60.0);
    assert!(e < tol, "as planned: {e}");
    let reshaped = |f: &dyn Fn(&mut Vec<Option<cleave_core::graph::DimVar>>)| {
        let mut l = l.clone();
        let combine = l.kernels.iter_mut().rev().find_map(|k| match k {
            Kernel::Tile(t) => Some(t),
            Kernel::Stage(_) => None,
        });
        let read = combine
            .expect("a tile combine")
            .params
            .iter_mut()
            .find(|p| !p.output && p.name.ends_with("_max"))
            .expect("the combine reads the maxima");
        f(&mut read.shape);
        l
    };
    // The same elements in another order: `[s, c, a]` read as `[s, a, c]`.
    let swapped = reshaped(&|shape| {
        let n = shape.len();
        shape.swap(n - 1, n - 2);
    });
    let (e, tol) = split_error(&g, &swapped, ("b", 1001), ("s_b", 7), 41, 60.0);
    assert!(e > tol, "the maxima read transposed must be wrong: {e}");
    // Fewer elements than the workspace holds.
    let short = reshaped(&|shape| {
        let n = shape.len();
        shape[n - 1] = None;
    });
    let mut b = Bindings::of_table(&g.dims);
    b.values[g.dims.find("b").expect("b").index()] = 1001;
    let inputs = random_inputs(&g, &b, 41, &InputScale { default: 1.0, per_input: Vec::new() });
    let mut lb = Bindings::of_table(short.dims());
    lb.values[..b.values.len()].copy_from_slice(&b.values);
    lb.values[short.dims().find("s_b").expect("the split count").index()] = 7;
    lb.complete(short.dims());
    let err = interp::run(&short, &lb, &inputs, 3).expect_err("a parameter smaller than its workspace");
    assert!(matches!(err, interp::InterpError::ParamShape { .. }), "{err}");
    assert!(err.to_string().contains("_max"), "{err}");
}

#[test]
fn a_contraction_that_does_not_fill_its_tile_is_padded_with_zeros_the_product_ignores() {
    // A contraction of 24 or 3 is read in a tile rounded up to the MMA depth (16); one of 40
    // in tiles of 32 and 48; a dynamic one in tiles whose last runs past its end. The loads
    // fill the right operand's rows past the end with zeros, and a left operand computed in
    // registers must be finite there: `recip` of the zero fill is infinite, and `inf · 0`
    // would make every row NaN, so that operand is masked to zero past the end. A softmax's
    // probabilities are 0 there already, and are not masked again.
    let cases = [
        ("n: { value: 256, dynamic: true }, k: 24, m: 64", "y = matmul(recip(x), w)", 45),
        ("n: { value: 256, dynamic: true }, k: 40, m: 64", "y = matmul(recip(x), w)", 45),
        ("n: { value: 256, dynamic: true }, k: { value: 64, dynamic: true }, m: 64", "y = matmul(recip(x), w)", 40),
        ("n: { value: 256, dynamic: true }, k: 3, m: 32", "y = matmul(log(x * x + 1.0), w)", 45),
        ("n: { value: 256, dynamic: true }, k: 24, m: 64", "y = matmul(x, w)", 45),
    ];
    for (dims, body, extent) in cases {
        let g = columns_kernel(dims, "x: \"f32[n, k]\", w: \"f16[k, m]\"", "y: \"f32[n, m]\"", body);
        let c = compile(&g, &Options::default()).expect("compiles");
        let best = c.best();
        assert!(best.kernels.iter().all(|k| k.tile().is_some()), "{dims}: {body} runs as tile kernels");
        let mut padded = false;
        for r in &c.ranked {
            let l = &r.candidate.launch;
            for k in l.kernels.iter().filter_map(|k| k.tile()) {
                for s in flatten(&k.body) {
                    if let Stmt::Mma { k: depth, .. } = s {
                        assert_eq!(depth % 16, 0, "{body}: an MMA {depth} deep");
                    }
                    if let Stmt::Assign { expr: Expr::MaskCols(_, _, fill), .. } = s {
                        padded |= *fill == 0.0;
                    }
                }
            }
            // The dynamic dims at `extent` (a contraction of 40 ends inside its last tile),
            // inputs of both signs, some near zero.
            interpreted_within_tolerance(&g, l, extent, 7, 3.0);
        }
        assert_eq!(padded, body.contains("recip"), "{body}: masked past the end exactly when infinite there");
    }
    // The probabilities of an attention decode are zero past the keys' end already.
    let c = compiled("mha_d128_decode");
    for k in c.best().kernels.iter().filter_map(|k| k.tile()) {
        for s in flatten(&k.body) {
            if let Stmt::Assign { expr: Expr::MaskCols(_, _, fill), .. } = s {
                assert!(*fill != 0.0, "the probabilities are not masked again");
            }
        }
    }
}

#[test]
fn a_value_stored_for_a_later_kernel_keeps_its_true_scale_in_f32() {
    // A softmax down the columns, then two products. The search finds
    // `(exp(x) @ (transpose(w) / sum(exp(x), axis=0))) @ v`, whose first kernel would store
    // `transpose(w) / sum(exp(x), axis=0)`: at exp arguments near 200 its true value is
    // below f32's range, and the second kernel's `exp(x)` cannot bring it back. The declared
    // graph never holds that value; every launch must stay within f32 where it does.
    let g = columns_kernel(
        "a: { value: 64, dynamic: true }, b: 8",
        "x: \"f32[b, a]\", w: \"f16[a, a]\", v: \"f16[a, b]\"",
        "y: \"f32[b, b]\"",
        "y = matmul(matmul(softmax(x, axis=0), transpose(w)), v) / 3",
    );
    let c = compile(&g, &Options::default()).expect("compiles");
    assert!(c.best().kernels.iter().all(|k| k.tile().is_some()), "the best launch runs as tile kernels");
    every_launch_within_tolerance(&g, &c, &bound(&g, "a", 65), 11, 200.0, 200.0);
}

#[test]
fn a_product_whose_columns_are_not_a_multiple_of_8_is_tiled_rounded_up_to_them() {
    // A product's columns come in groups of 8. A declared width of 3, 12 or 20 (or a dynamic
    // one whose representative value is 3) used to leave no tile a product could take, and
    // the kernel fell back to stages; its tile is now rounded up to a multiple of 8, the
    // columns past the end loaded as zeros and never stored.
    let cases = [
        ("n: { value: 256, dynamic: true }, k: 24, m: 3", 45),
        ("n: { value: 256, dynamic: true }, k: 32, m: 12", 45),
        ("n: { value: 256, dynamic: true }, k: 3, m: 20", 45),
        ("n: 128, k: 64, m: { value: 3, dynamic: true }", 13),
    ];
    for (dims, extent) in cases {
        let g = columns_kernel(dims, "x: \"f32[n, k]\", w: \"f16[k, m]\"", "y: \"f32[n, m]\"", "y = matmul(x, w)");
        let c = compile(&g, &Options::default()).expect("compiles");
        let best = c.best();
        assert!(best.kernels.iter().all(|k| k.tile().is_some()), "{dims}: runs as tile kernels");
        assert!(mmas(&best.kernels[0].tile().expect("a tile kernel").body) > 0, "{dims}: on the tensor cores");
        for r in &c.ranked {
            interpreted_within_tolerance(&g, &r.candidate.launch, extent, 9, 3.0);
        }
    }
}
