//! The nine dynamic operators of FlashInfer-Bench, declared in `kernels.yaml`, each compiled
//! once and run in the host emulator on many workloads, against a reference written here from
//! the operators' definitions (`softmax(logits · sm_scale)`, the base-2 log-sum-exp, the page
//! table and indptr rules, bottom-right causal masks), not from the declarations or from
//! cleave's own reference.
//!
//! The workloads cover ragged lengths (1, and lengths that are no multiple of any tile), empty
//! requests, shuffled page tables with spare pages and spare table entries, key prefixes longer
//! than the queries, logits near ±250, and malformed tables, which must be refused. Every
//! workload of an operator runs through the same compiled library: one compile serves every
//! batch and length.

#![allow(clippy::print_stderr)]

use std::sync::OnceLock;

use cleave::emulate::{self, HostLibrary};
use cleave_core::codegen::plan::plan_data;
use cleave_core::front::check_source;
use cleave_core::graph::{Bindings, ValidGraph};
use cleave_core::pipeline::{compile, Options};
use cleave_core::plan::{Kernel, Launch};
use cleave_core::reference::{max_rel_err, Rng, Tensor};

/// One operator, as FlashInfer-Bench defines it.
#[derive(Clone, Copy, Debug)]
struct Operator {
    name: &'static str,
    /// Query heads and KV heads (MLA: 16 heads, one shared latent cache).
    heads: (usize, usize),
    /// Head dim (MLA: the latent width 512; its rotary part is 64 more).
    dim: usize,
    /// `Some(page_size)` for a paged cache, `None` for ragged keys and values.
    page_size: Option<usize>,
    /// One query per request (decode) or a ragged run of them (prefill).
    decode: bool,
    /// Prefill operators are causal.
    causal: bool,
    mla: bool,
    last_page_len: bool,
}

const OPS: [Operator; 9] = [
    Operator {
        name: "gqa_paged_decode_h32_kv4_d128_ps1",
        heads: (32, 4),
        dim: 128,
        page_size: Some(1),
        decode: true,
        causal: false,
        mla: false,
        last_page_len: false,
    },
    Operator {
        name: "gqa_paged_decode_h32_kv8_d128_ps1",
        heads: (32, 8),
        dim: 128,
        page_size: Some(1),
        decode: true,
        causal: false,
        mla: false,
        last_page_len: false,
    },
    Operator {
        name: "gqa_paged_decode_h32_kv8_d128_ps64",
        heads: (32, 8),
        dim: 128,
        page_size: Some(64),
        decode: true,
        causal: false,
        mla: false,
        last_page_len: true,
    },
    Operator {
        name: "gqa_paged_prefill_causal_h32_kv4_d128_ps1",
        heads: (32, 4),
        dim: 128,
        page_size: Some(1),
        decode: false,
        causal: true,
        mla: false,
        last_page_len: false,
    },
    Operator {
        name: "gqa_paged_prefill_causal_h32_kv8_d128_ps1",
        heads: (32, 8),
        dim: 128,
        page_size: Some(1),
        decode: false,
        causal: true,
        mla: false,
        last_page_len: false,
    },
    Operator {
        name: "gqa_ragged_prefill_causal_h32_kv4_d128",
        heads: (32, 4),
        dim: 128,
        page_size: None,
        decode: false,
        causal: true,
        mla: false,
        last_page_len: false,
    },
    Operator {
        name: "gqa_ragged_prefill_causal_h32_kv8_d128",
        heads: (32, 8),
        dim: 128,
        page_size: None,
        decode: false,
        causal: true,
        mla: false,
        last_page_len: false,
    },
    Operator {
        name: "mla_paged_decode_h16_ckv512_kpe64_ps1",
        heads: (16, 1),
        dim: 512,
        page_size: Some(1),
        decode: true,
        causal: false,
        mla: true,
        last_page_len: false,
    },
    Operator {
        name: "mla_paged_prefill_causal_h16_ckv512_kpe64_ps1",
        heads: (16, 1),
        dim: 512,
        page_size: Some(1),
        decode: false,
        causal: true,
        mla: true,
        last_page_len: false,
    },
];

/// The MLA rotary width.
const KPE: usize = 64;

/// One request: its queries and its keys.
#[derive(Clone, Copy, Debug)]
struct Request {
    qlen: usize,
    kvlen: usize,
}

/// A workload in FlashInfer's buffers, in the operator's input order.
struct Workload {
    requests: Vec<Request>,
    /// The declared inputs, each its buffer (storage shape, row-major).
    inputs: Vec<(String, Tensor)>,
    sm_scale: f64,
}

/// The buffers of a workload: random values of standard deviation `std`, pages drawn at random
/// from a pool `spare_pages` pages larger than needed, in shuffled order, with `spare_entries`
/// unused entries at the end of the page table.
fn workload(op: &Operator, requests: &[Request], std: f64, seed: u64) -> Workload {
    let mut rng = Rng::new(seed);
    let (hq, hkv) = op.heads;
    let d = op.dim;
    let mut normal =
        |n: usize| -> Vec<f64> { (0..n).map(|_| half::bf16::from_f64(std * rng.normal()).to_f64()).collect() };
    let batch = requests.len();
    let total_q: usize = requests.iter().map(|r| r.qlen).sum();
    let mut inputs: Vec<(String, Tensor)> = Vec::new();
    let t = |shape: Vec<usize>, data: Vec<f64>| Tensor { shape, data };
    let rows = if op.decode { batch } else { total_q };
    if op.mla {
        inputs.push(("q_nope".into(), t(vec![rows, hq, d], normal(rows * hq * d))));
        inputs.push(("q_pe".into(), t(vec![rows, hq, KPE], normal(rows * hq * KPE))));
    } else {
        inputs.push(("q".into(), t(vec![rows, hq, d], normal(rows * hq * d))));
    }
    let prefix = |sizes: &[usize]| -> Vec<f64> {
        let mut acc = 0;
        std::iter::once(0.0)
            .chain(sizes.iter().map(|s| {
                acc += s;
                acc as f64
            }))
            .collect()
    };
    let qo_indptr = prefix(&requests.iter().map(|r| r.qlen).collect::<Vec<_>>());
    let mut rng = Rng::new(seed ^ 0x5eed);
    match op.page_size {
        Some(ps) => {
            let pages: Vec<usize> = requests.iter().map(|r| r.kvlen.div_ceil(ps)).collect();
            let used: usize = pages.iter().sum();
            let pool = used + 7;
            let mut order: Vec<usize> = (0..pool).collect();
            for i in (1..pool).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
            let mut indices: Vec<f64> = order[..used].iter().map(|p| *p as f64).collect();
            indices.extend([(pool - 1) as f64, 0.0, 3.0]);
            let per_page = if op.mla { vec![d, KPE] } else { vec![hkv * d, hkv * d] };
            let mut values = Rng::new(seed ^ 0xca5e);
            let mut cache = |width: usize| {
                let n = pool * ps * width;
                let data: Vec<f64> = (0..n).map(|_| half::bf16::from_f64(std * values.normal()).to_f64()).collect();
                if op.mla {
                    t(vec![pool, ps, width], data)
                } else {
                    t(vec![pool, ps, hkv, d], data)
                }
            };
            if op.mla {
                inputs.push(("ckv_cache".into(), cache(per_page[0])));
                inputs.push(("kpe_cache".into(), cache(per_page[1])));
            } else {
                inputs.push(("k_cache".into(), cache(per_page[0])));
                inputs.push(("v_cache".into(), cache(per_page[1])));
            }
            if !op.decode {
                inputs.push(("qo_indptr".into(), t(vec![batch + 1], qo_indptr)));
            }
            inputs.push(("kv_indptr".into(), t(vec![batch + 1], prefix(&pages))));
            let n = indices.len();
            inputs.push(("kv_indices".into(), t(vec![n], indices)));
            if op.last_page_len {
                let last = requests
                    .iter()
                    .zip(&pages)
                    .map(|(r, p)| if *p == 0 { 1.0 } else { (r.kvlen - (p - 1) * ps) as f64 })
                    .collect();
                inputs.push(("kv_last_page_len".into(), t(vec![batch], last)));
            }
        }
        None => {
            let total_kv: usize = requests.iter().map(|r| r.kvlen).sum::<usize>() + 5;
            let mut values = Rng::new(seed ^ 0xca5e);
            let mut kv = || {
                let n = total_kv * hkv * d;
                t(
                    vec![total_kv, hkv, d],
                    (0..n).map(|_| half::bf16::from_f64(std * values.normal()).to_f64()).collect(),
                )
            };
            inputs.push(("k".into(), kv()));
            inputs.push(("v".into(), kv()));
            inputs.push(("qo_indptr".into(), t(vec![batch + 1], qo_indptr)));
            let kv_indptr = prefix(&requests.iter().map(|r| r.kvlen).collect::<Vec<_>>());
            inputs.push(("kv_indptr".into(), t(vec![batch + 1], kv_indptr)));
        }
    }
    // A scale of either sign and no power of two: nothing depends on it being 1/sqrt(d).
    let sm_scale = f64::from((0.8 / (d as f64).sqrt()) as f32);
    inputs.push(("sm_scale".into(), t(vec![], vec![sm_scale])));
    Workload { requests: requests.to_vec(), inputs, sm_scale }
}

fn input<'w>(w: &'w Workload, name: &str) -> &'w Tensor {
    &w.inputs.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no input `{name}`")).1
}

/// The operators' definitions, in f64: for each request and query head, the logits against its
/// KV head's keys (the request's pages in table order, or its packed rows), scaled, masked
/// bottom-right causally for prefill; `lse` is their base-2 log-sum-exp and `output` the
/// softmax-weighted values; a row that sees no key gets 0 and -inf.
fn definition(op: &Operator, w: &Workload) -> (Vec<f64>, Vec<f64>, f64) {
    let (hq, hkv) = op.heads;
    let d = op.dim;
    let group = hq / hkv;
    let rows = if op.decode { w.requests.len() } else { w.requests.iter().map(|r| r.qlen).sum() };
    let mut output = vec![0.0; rows * hq * d];
    let mut lse = vec![f64::NEG_INFINITY; rows * hq];
    let mut largest: f64 = 0.0;
    // Where the key of request b's token j lies: (buffer row, slot) in the cache's first axes.
    let token = |b: usize, j: usize| -> usize {
        match op.page_size {
            Some(ps) => {
                let indptr = &input(w, "kv_indptr").data;
                let indices = &input(w, "kv_indices").data;
                let page = indices[indptr[b] as usize + j / ps] as usize;
                page * ps + j % ps
            }
            None => input(w, "kv_indptr").data[b] as usize + j,
        }
    };
    let mut first_row = 0;
    for (b, r) in w.requests.iter().enumerate() {
        let qlen = if op.decode { 1 } else { r.qlen };
        for i in 0..qlen {
            let row = first_row + i;
            for h in 0..hq {
                let kvh = h / group;
                // Query i sees keys j <= i + (kvlen - qlen).
                let visible = if op.causal { (i + r.kvlen + 1).saturating_sub(qlen).min(r.kvlen) } else { r.kvlen };
                let logits: Vec<f64> = (0..visible)
                    .map(|j| {
                        let t = token(b, j);
                        let dot = if op.mla {
                            let (qn, qp) = (&input(w, "q_nope").data, &input(w, "q_pe").data);
                            let (ckv, kpe) = (&input(w, "ckv_cache").data, &input(w, "kpe_cache").data);
                            (0..d).map(|e| qn[(row * hq + h) * d + e] * ckv[t * d + e]).sum::<f64>()
                                + (0..KPE).map(|e| qp[(row * hq + h) * KPE + e] * kpe[t * KPE + e]).sum::<f64>()
                        } else {
                            let (q, k) = (
                                &input(w, "q").data,
                                if op.page_size.is_some() { &input(w, "k_cache").data } else { &input(w, "k").data },
                            );
                            (0..d).map(|e| q[(row * hq + h) * d + e] * k[(t * hkv + kvh) * d + e]).sum::<f64>()
                        };
                        dot * w.sm_scale
                    })
                    .collect();
                if logits.is_empty() {
                    continue;
                }
                largest = logits.iter().fold(largest, |a, l| a.max(l.abs()));
                let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = logits.iter().map(|l| (l - m).exp()).sum();
                lse[row * hq + h] = (m + z.ln()) / std::f64::consts::LN_2;
                for (j, l) in logits.iter().enumerate() {
                    let p = (l - m).exp() / z;
                    let t = token(b, j);
                    for e in 0..d {
                        let v = if op.mla {
                            input(w, "ckv_cache").data[t * d + e]
                        } else if op.page_size.is_some() {
                            input(w, "v_cache").data[(t * hkv + kvh) * d + e]
                        } else {
                            input(w, "v").data[(t * hkv + kvh) * d + e]
                        };
                        output[(row * hq + h) * d + e] += p * v;
                    }
                }
            }
        }
        first_row += qlen;
    }
    (output, lse, largest)
}

/// One operator compiled once: its graph, its launch and its emulation library.
struct Compiled {
    graph: ValidGraph,
    launch: Launch,
    lib: HostLibrary,
}

/// Which launch of an operator to run: the chosen (fused) one, or the fallback stages every
/// graph has.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    Best,
    Fallback,
}

/// Compiles an operator the first time a test needs it, and only then; every later workload of
/// the operator reuses that library.
fn compiled_path(op: &Operator, path: Path) -> &'static Compiled {
    static ALL: [[OnceLock<Compiled>; 9]; 2] = [const { [const { OnceLock::new() }; 9] }; 2];
    let i = OPS.iter().position(|o| o.name == op.name).expect("an operator");
    ALL[path as usize][i].get_or_init(|| {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/kernels.yaml")).expect("kernels.yaml");
        let module = check_source(text.as_bytes()).expect("kernels.yaml checks");
        let graph = module
            .kernels
            .into_iter()
            .find(|(d, _)| d.name == op.name)
            .unwrap_or_else(|| panic!("{} is declared", op.name))
            .1;
        let c = compile(&graph, &Options::default()).expect("compiles");
        let launch = match path {
            Path::Best => c.best().clone(),
            Path::Fallback => c
                .ranked
                .iter()
                .map(|r| &r.candidate.launch)
                .find(|l| l.kernels.iter().all(|k| matches!(k, Kernel::Stage(_))))
                .unwrap_or_else(|| panic!("{}: the fallback is among the kept launches", op.name))
                .clone(),
        };
        let plan = plan_data(&launch, op.name).expect("plan data");
        let lib = emulate::compile(&launch, &plan).expect("emulation builds");
        Compiled { graph, launch, lib }
    })
}

fn compiled(op: &Operator) -> &'static Compiled {
    compiled_path(op, Path::Best)
}

/// Runs a workload through the operator's one compiled library; returns (output, lse).
fn run(op: &Operator, w: &Workload) -> Result<(Vec<f64>, Vec<f64>), String> {
    run_path(op, w, Path::Best)
}

fn run_path(op: &Operator, w: &Workload, path: Path) -> Result<(Vec<f64>, Vec<f64>), String> {
    let c = compiled_path(op, path);
    let g = &c.graph;
    let mut b = Bindings::of_table(c.launch.dims());
    let batch = w.requests.len();
    let total_q: usize = w.requests.iter().map(|r| r.qlen).sum();
    let set = |b: &mut Bindings, name: &str, v: usize| {
        if let Some(d) = g.dims.find(name) {
            b.values[d.index()] = v as u64;
        }
    };
    set(&mut b, "batch_size", batch);
    set(&mut b, "total_q", total_q);
    if let Some(t) = w.inputs.iter().find(|(n, _)| n == "k") {
        set(&mut b, "total_kv", t.1.shape[0]);
    }
    let pool = w.inputs.iter().find(|(n, _)| n.ends_with("_cache")).map(|(_, t)| t.shape[0]);
    set(&mut b, "num_pages", pool.unwrap_or(0));
    if let Some(t) = w.inputs.iter().find(|(n, _)| n == "kv_indices") {
        set(&mut b, "num_kv_indices", t.1.shape[0]);
    }
    b.complete(c.launch.dims());
    let inputs: Vec<Tensor> = g.inputs.iter().map(|i| input(w, &i.decl.name).clone()).collect();
    let out = c.lib.run(&c.launch, &b, &inputs, 7)?;
    Ok((out[0].data.clone(), out[1].data.clone()))
}

/// Runs one workload and compares it with the definition; returns the largest |logit|.
fn check(op: &Operator, requests: &[Request], std: f64, seed: u64) -> f64 {
    check_path(op, requests, std, seed, Path::Best)
}

fn check_path(op: &Operator, requests: &[Request], std: f64, seed: u64, path: Path) -> f64 {
    let w = workload(op, requests, std, seed);
    let (want_o, want_l, largest) = definition(op, &w);
    let (got_o, got_l) = run_path(op, &w, path).unwrap_or_else(|e| panic!("{} ({path:?}): {e}", op.name));
    let (eo, el) = (max_rel_err(&got_o, &want_o), max_rel_err(&got_l, &want_l));
    let rms = rms_rel_err(&got_o, &want_o);
    eprintln!(
        "{} {requests:?} std={std}: |logits| <= {largest:.0}, output max_rel_err={eo:.2e} rms_rel_err={rms:.2e}, \
         lse max_rel_err={el:.2e}",
        op.name
    );
    // bf16 outputs, and probabilities rounded to bf16 for the second product (as FlashInfer
    // does): each element within 40 bf16 units (2^-8) of the scale it mixes, and the error
    // over all of them a few roundings. A key too many or too few, or a wrong page, moves
    // whole rows by far more. The lse is f32 throughout.
    assert!(eo <= 0.15, "{}: output max_rel_err {eo:e} on {requests:?}", op.name);
    assert!(rms <= 1e-2, "{}: output rms_rel_err {rms:e} on {requests:?}", op.name);
    assert!(el <= 1e-4, "{}: lse max_rel_err {el:e} on {requests:?}", op.name);
    // An empty request's rows are exactly 0 and -inf.
    let mut row = 0;
    let hq = op.heads.0;
    for r in requests {
        let rows = if op.decode { 1 } else { r.qlen };
        if r.kvlen == 0 {
            for x in row * hq..(row + rows) * hq {
                assert_eq!(got_l[x], f64::NEG_INFINITY, "{}: lse of an empty request", op.name);
                assert!(got_o[x * op.dim..(x + 1) * op.dim].iter().all(|v| *v == 0.0), "{}", op.name);
            }
        }
        row += rows;
    }
    largest
}

/// `‖got − want‖ / ‖want‖` over all elements.
fn rms_rel_err(got: &[f64], want: &[f64]) -> f64 {
    let err: f64 = got.iter().zip(want).map(|(g, w)| (g - w) * (g - w)).sum();
    let norm: f64 = want.iter().map(|w| w * w).sum();
    (err / norm.max(f64::MIN_POSITIVE)).sqrt()
}

fn decode_requests(kvlens: &[usize]) -> Vec<Request> {
    kvlens.iter().map(|&kvlen| Request { qlen: 1, kvlen }).collect()
}

fn op(name: &str) -> Operator {
    *OPS.iter().find(|o| o.name == name).expect("an operator")
}

#[test]
fn the_compiler_and_the_launcher_split_alike() {
    // The ranking plans split-KV with the core's rule and the launcher picks the count with
    // the runtime's copy of it (neither crate depends on the other): they must agree.
    use cleave::runtime::plan as rt;
    use cleave_core::plan::requests as core;
    assert_eq!(
        (core::SPLIT_MIN_CHUNK, core::SPLIT_MAX, core::SPLIT_BLOCK_OVERHEAD),
        (rt::SPLIT_MIN_CHUNK, rt::SPLIT_MAX, rt::SPLIT_BLOCK_OVERHEAD)
    );
    let mut split = 0;
    let mut seen = std::collections::BTreeSet::new();
    for sms in [0, 1, 46, 78, 108, 132, 148] {
        for blocks in [0, 1, 2, 3, 7, 32, 64, 100, 264, 265, 1000, 1 << 20] {
            for streams in [0, 1, blocks / 4, blocks, blocks + 1] {
                for per_request in [0, 1, 255, 256, 257, 511, 1024, 4096, 8191, 16384, 1 << 30] {
                    for (resident, fill) in [(0, 0), (1, 102), (2, 83), (3, 116), (64, 4096)] {
                        let c =
                            core::split_count(core::SplitShape { blocks, streams, per_request, sms, resident, fill });
                        let r = rt::split_count(rt::SplitShape { blocks, streams, per_request, sms, resident, fill });
                        assert_eq!(c, r, "{blocks} blocks ({streams} streaming), {per_request} per request, {sms} SMs, {resident} resident, fill {fill}");
                        split = split.max(c);
                        seen.insert(c);
                    }
                }
            }
        }
    }
    // The counts vary with the shape: a rule that ignored its inputs would not pass.
    assert!(seen.len() > 10, "{seen:?}");
    // The sweep reaches the cap, so a change to either rule's clamp shows here.
    assert_eq!(split, core::SPLIT_MAX);
}

#[test]
fn paged_decode_over_ragged_lengths_empty_requests_and_shuffled_pages() {
    for name in
        ["gqa_paged_decode_h32_kv4_d128_ps1", "gqa_paged_decode_h32_kv8_d128_ps1", "gqa_paged_decode_h32_kv8_d128_ps64"]
    {
        let o = op(name);
        // Lengths of 1, 0 (an empty request), and none a multiple of 16, 64 or 128.
        check(&o, &decode_requests(&[1, 0, 77, 200, 3]), 1.0, 1);
        check(&o, &decode_requests(&[129]), 1.0, 2);
    }
}

#[test]
fn ragged_and_paged_prefill_with_prefixes_and_causal_masks() {
    for name in [
        "gqa_ragged_prefill_causal_h32_kv4_d128",
        "gqa_ragged_prefill_causal_h32_kv8_d128",
        "gqa_paged_prefill_causal_h32_kv4_d128_ps1",
        "gqa_paged_prefill_causal_h32_kv8_d128_ps1",
    ] {
        let o = op(name);
        let requests = [
            Request { qlen: 1, kvlen: 1 },
            Request { qlen: 0, kvlen: 0 },
            // A prefix of earlier keys: the last query sees all 150.
            Request { qlen: 37, kvlen: 150 },
            Request { qlen: 70, kvlen: 70 },
            Request { qlen: 5, kvlen: 21 },
            // More queries than keys: the first 17 rows see no key (output 0, lse -inf).
            Request { qlen: 20, kvlen: 3 },
        ];
        check(&o, &requests, 1.0, 3);
    }
}

#[test]
fn logits_near_250_keep_their_precision() {
    // Inputs of standard deviation 9 give logits of a few hundred in magnitude: an exp that is
    // not stabilized overflows, and the lse must still be exact.
    let o = op("gqa_paged_decode_h32_kv4_d128_ps1");
    let largest = check(&o, &decode_requests(&[90, 33]), 9.0, 4);
    assert!((200.0..400.0).contains(&largest), "{largest}");
    let o = op("gqa_ragged_prefill_causal_h32_kv4_d128");
    let largest = check(&o, &[Request { qlen: 20, kvlen: 45 }], 9.0, 5);
    assert!((150.0..400.0).contains(&largest), "{largest}");
}

#[test]
fn mla_decode_and_prefill_over_a_paged_latent_cache() {
    let o = op("mla_paged_decode_h16_ckv512_kpe64_ps1");
    check(&o, &decode_requests(&[1, 0, 130, 47]), 1.0, 8);
    let o = op("mla_paged_prefill_causal_h16_ckv512_kpe64_ps1");
    let requests = [
        Request { qlen: 1, kvlen: 1 },
        Request { qlen: 0, kvlen: 0 },
        Request { qlen: 19, kvlen: 83 },
        Request { qlen: 33, kvlen: 33 },
    ];
    check(&o, &requests, 1.0, 9);
}

#[test]
fn one_compile_serves_every_batch_and_length() {
    // Batches of 1 to 11 and lengths from 1 to past 1000, through the same library, whose
    // split count follows the lengths at run time.
    let o = op("gqa_paged_decode_h32_kv8_d128_ps64");
    let symbols = |c: &Compiled| c.launch.kernels.iter().map(|k| k.symbol().to_string()).collect::<Vec<_>>();
    let before = symbols(compiled(&o));
    check(&o, &decode_requests(&[1030]), 1.0, 10);
    check(&o, &decode_requests(&[64, 65, 63, 128, 1, 0, 2, 300, 17, 640, 5]), 1.0, 11);
    assert_eq!(symbols(compiled(&o)), before);
    let o = op("gqa_ragged_prefill_causal_h32_kv8_d128");
    check(&o, &[Request { qlen: 130, kvlen: 200 }], 1.0, 12);
    check(&o, &(1..8).map(|i| Request { qlen: 3 * i, kvlen: 7 * i }).collect::<Vec<_>>(), 1.0, 13);
}

#[test]
fn malformed_tables_are_refused() {
    let o = op("gqa_paged_decode_h32_kv4_d128_ps1");
    let mut w = workload(&o, &decode_requests(&[5, 9]), 1.0, 6);
    // A page number past the pool.
    let pool = input(&w, "k_cache").shape[0] as f64;
    let slot = w.inputs.iter_mut().find(|(n, _)| n == "kv_indices").expect("a page table");
    slot.1.data[3] = pool;
    let err = run(&o, &w).expect_err("a page outside the pool is refused");
    assert!(err.contains("kv_indices") && err.contains("outside the pool"), "{err}");
    // An indptr that decreases.
    let mut w = workload(&o, &decode_requests(&[5, 9, 2]), 1.0, 7);
    let slot = w.inputs.iter_mut().find(|(n, _)| n == "kv_indptr").expect("an indptr");
    slot.1.data[2] = 1.0;
    let err = run(&o, &w).expect_err("a decreasing indptr is refused");
    assert!(err.contains("kv_indptr") && err.contains("never decreases"), "{err}");
}

/// A workload's buffers in a safetensors file, under FlashInfer's names and dtypes (bf16
/// activations and caches, i32 tables, an f32 scalar), written with the `safetensors` crate.
fn write_safetensors(w: &Workload, path: &std::path::Path) {
    use safetensors::tensor::{Dtype, TensorView};
    let encoded: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = w
        .inputs
        .iter()
        .map(|(name, t)| {
            let table = ["indptr", "indices", "_len"].iter().any(|s| name.ends_with(s));
            let (dtype, bytes): (Dtype, Vec<u8>) = if table {
                (Dtype::I32, t.data.iter().flat_map(|x| (*x as i32).to_le_bytes()).collect())
            } else if name == "sm_scale" {
                (Dtype::F32, t.data.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect())
            } else {
                (Dtype::BF16, t.data.iter().flat_map(|x| half::bf16::from_f64(*x).to_le_bytes()).collect())
            };
            (name.clone(), dtype, t.shape.clone(), bytes)
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = encoded
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).expect("a tensor view")))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).expect("serializes")).expect("write");
}

#[test]
fn cleave_run_takes_flashinfer_buffers_from_safetensors_for_all_nine() {
    // The command-line path an outside check uses: buffers made here, in FlashInfer's layout,
    // through `cleave run --inputs/--outputs`, compared with the definition.
    let dir = tempfile::tempdir().expect("a temp dir");
    let kernels = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels.yaml");
    for (i, o) in OPS.iter().enumerate() {
        let requests: Vec<Request> = if o.decode {
            decode_requests(&[3, 0, 70])
        } else {
            vec![Request { qlen: 2, kvlen: 9 }, Request { qlen: 0, kvlen: 0 }, Request { qlen: 21, kvlen: 21 }]
        };
        let w = workload(o, &requests, 1.0, 20 + i as u64);
        let (input, output) = (dir.path().join(format!("{}.in", o.name)), dir.path().join(format!("{}.out", o.name)));
        write_safetensors(&w, &input);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cleave"))
            .args(["run", kernels, "--kernel", o.name, "--backend", "emulate", "--inputs"])
            .arg(&input)
            .arg("--outputs")
            .arg(&output)
            .output()
            .expect("cleave runs");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{}: {text}", o.name);
        let bytes = std::fs::read(&output).expect("the outputs file");
        let file = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors file");
        let (out_t, lse_t) = (file.tensor("output").expect("output"), file.tensor("lse").expect("lse"));
        let rows = if o.decode { requests.len() } else { requests.iter().map(|r| r.qlen).sum() };
        assert_eq!(out_t.shape(), &[rows, o.heads.0, o.dim][..], "{}", o.name);
        assert_eq!(lse_t.shape(), &[rows, o.heads.0][..], "{}", o.name);
        let got_o: Vec<f64> =
            out_t.data().chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect();
        let got_l: Vec<f64> =
            lse_t.data().chunks_exact(4).map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect();
        let (want_o, want_l, _) = definition(o, &w);
        let (eo, el) = (max_rel_err(&got_o, &want_o), max_rel_err(&got_l, &want_l));
        assert!(eo <= 0.15 && rms_rel_err(&got_o, &want_o) <= 1e-2, "{}: output {eo:e}", o.name);
        assert!(el <= 1e-4, "{}: lse {el:e}", o.name);
    }
}

#[test]
fn the_fallback_stages_serve_the_same_workloads() {
    // The launch every graph has, with no fused schedule: stage kernels that lay per-request
    // dims out by position (the scores of a prefill over both of its ragged dims), find each
    // position's request by binary search, and loop over each request's own length.
    for o in &OPS {
        let requests: Vec<Request> = if o.decode {
            decode_requests(&[3, 0, 70, 1])
        } else {
            // More queries than keys: the first three rows see no key at all.
            vec![
                Request { qlen: 2, kvlen: 9 },
                Request { qlen: 0, kvlen: 0 },
                Request { qlen: 21, kvlen: 21 },
                Request { qlen: 5, kvlen: 2 },
            ]
        };
        check_path(o, &requests, 3.0, 30, Path::Fallback);
    }
}
