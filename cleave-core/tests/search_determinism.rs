//! Determinism: the same search gives byte-identical JSON apart from `seconds`, whatever the
//! number of threads, including when a state limit cuts it short.

mod common;

use cleave_core::superopt::{search, to_json, SearchOptions};

/// The JSON without its `seconds` line (the only field allowed to differ).
fn json_without_seconds(kernel: &str, opts: &SearchOptions, threads: usize) -> String {
    let g = common::shipped(kernel);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a thread pool");
    let r = pool.install(|| search(&g, opts).expect("search runs"));
    let json = to_json(&r);
    let lines: Vec<&str> = json.lines().filter(|l| !l.trim_start().starts_with("\"seconds\"")).collect();
    assert_eq!(lines.len() + 1, json.lines().count(), "exactly one seconds line");
    lines.join("\n")
}

fn options() -> SearchOptions {
    SearchOptions { full_shape_budget_macs: 1 << 22, ..SearchOptions::default() }
}

#[test]
fn two_runs_give_identical_json() {
    for kernel in ["mha_d64_decode", "rmsnorm_matmul_decode"] {
        let a = json_without_seconds(kernel, &options(), 2);
        let b = json_without_seconds(kernel, &options(), 2);
        assert_eq!(a, b, "{kernel}");
        let c = json_without_seconds(kernel, &options(), 1);
        assert_eq!(a, c, "{kernel}: one thread and two threads agree");
        assert!(a.contains("\"stop_reason\": \"exhausted\""));
        assert!(a.contains("\"has_split\": true"));
    }
}

#[test]
fn a_state_limit_cuts_the_search_deterministically() {
    let opts = SearchOptions { max_states: 3_000, ..options() };
    let a = json_without_seconds("mha_d64_decode", &opts, 2);
    let b = json_without_seconds("mha_d64_decode", &opts, 1);
    assert_eq!(a, b);
    assert!(a.contains("\"stop_reason\": \"state_limit\""), "{a}");
    assert!(a.contains("\"states_explored\": 3000"), "{a}");
    // The space without Split, searched after the cut, whole.
    assert!(a.contains("\"without_split\": {"), "{a}");
    assert!(a.contains("\"stop_reason\": \"exhausted\""), "{a}");
}

#[test]
fn the_json_follows_the_contract() {
    let g = common::shipped("matmul_decode");
    let r = search(&g, &options()).expect("search runs");
    let v: serde_json::Value = serde_json::from_str(&to_json(&r)).expect("valid JSON");
    assert_eq!(v["kernel"], "matmul_decode");
    assert!(v["seconds"].is_f64());
    assert!(v["states_explored"].as_u64().is_some_and(|n| n > 0));
    let graphs = v["graphs"].as_array().expect("graphs");
    assert_eq!(graphs.len(), r.graphs.len());
    const OPS: [&str; 23] = [
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
        "input",
    ];
    for graph in graphs {
        let ops = graph["ops"].as_array().expect("ops");
        let mut seen: Vec<&str> = Vec::new();
        for op in ops {
            let id = op["id"].as_str().expect("string id");
            assert!(OPS.contains(&op["op"].as_str().expect("op name")));
            for input in op["inputs"].as_array().expect("inputs") {
                assert!(seen.contains(&input.as_str().expect("string input")), "topological order");
            }
            for d in op["shape"].as_array().expect("shape") {
                assert!(d.is_string() || d.as_u64() == Some(1));
            }
            seen.push(id);
        }
        assert!(seen.contains(&"x") && seen.contains(&"w"), "inputs appear under their declared names");
        let last = ops.last().expect("an output op");
        assert_ne!(last["op"], "input");
        let split = graph["has_split"].as_bool().expect("has_split");
        assert_eq!(split, ops.iter().any(|o| o["op"] == "split"));
        if split {
            let counts = &graph["split_counts"][0];
            assert_eq!(counts["symbol"], "s_k");
            assert_eq!(counts["values"], serde_json::json!([2, 4, 8, 16, 32, 64]));
        }
    }
    // Constants appear as inputs with their value.
    let g = common::shipped("mha_d64_prefill");
    let r = search(&g, &SearchOptions { split: false, ..options() }).expect("search runs");
    let v: serde_json::Value = serde_json::from_str(&to_json(&r)).expect("valid JSON");
    let c0 = v["graphs"][0]["ops"].as_array().expect("ops").iter().find(|o| o["id"] == "c0").expect("c0").clone();
    assert_eq!(c0, serde_json::json!({"id": "c0", "op": "input", "inputs": [], "shape": [], "value": 0.125}));
}
