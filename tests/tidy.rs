//! Project invariants checked as tests: the README's commands and CI agree, every source file
//! says what it is for, and no test is switched off.

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if p.is_dir() && name != "target" && !name.starts_with('.') {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn the_readme_starts_with_the_two_commands_and_ci_runs_the_test_command() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let commands: Vec<&str> =
        readme.lines().skip_while(|l| !l.starts_with("```")).skip(1).take_while(|l| !l.starts_with("```")).collect();
    assert_eq!(commands.len(), 2, "the README's first block holds the main job and the test command");
    let test = commands[1].split('#').next().expect("command").trim();
    assert!(test.starts_with("cargo test"), "{test}");
    let ci = std::fs::read_to_string(root().join(".ci/run")).expect(".ci/run");
    assert!(ci.lines().any(|l| l.trim() == test), ".ci/run must run `{test}` verbatim");
}

#[test]
fn every_source_file_starts_with_a_doc_comment() {
    let mut files = Vec::new();
    for dir in ["cleave-core/src", "cleave-runtime/src", "cleave-macros/src", "src"] {
        rust_files(&root().join(dir), &mut files);
    }
    assert!(files.len() > 30);
    let missing: Vec<String> = files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            !text.trim_start().starts_with("//!")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(missing.is_empty(), "files without a `//!` module doc: {missing:?}");
}

#[test]
fn no_test_is_ignored_or_expected_to_panic() {
    let mut files = Vec::new();
    for dir in ["cleave-core", "cleave-runtime", "cleave-macros", "src", "tests"] {
        rust_files(&root().join(dir), &mut files);
    }
    let attr_ignore = concat!("#[", "ignore");
    let attr_panic = concat!("#[", "should_panic");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        assert!(!text.contains(attr_ignore) && !text.contains(attr_panic), "{} switches a test off", f.display());
    }
}

/// The GPU benchmark's scripts run only on a lent GPU machine, so a mistake in them would show
/// up only there, where time is short: parse the shell script and run the Python unit checks
/// (the expression translation, the error metric, FLOP counts; no PyTorch needed) here.
#[test]
fn the_gpu_benchmark_scripts_parse_and_pass_their_unit_checks() {
    let dir = root().join("bench/gpu");
    let sh = std::process::Command::new("bash").arg("-n").arg(dir.join("run.sh")).output().expect("bash");
    assert!(sh.status.success(), "bench/gpu/run.sh: {}", String::from_utf8_lossy(&sh.stderr));
    let py = std::process::Command::new("python3")
        .arg(dir.join("compare.py"))
        .arg("--self-test")
        .output()
        .expect("python3 is needed to check bench/gpu/compare.py");
    let stdout = String::from_utf8_lossy(&py.stdout);
    assert!(py.status.success(), "compare.py --self-test:\n{stdout}\n{}", String::from_utf8_lossy(&py.stderr));
    assert!(stdout.contains("only the unit checks ran"), "{stdout}");
    assert!(stdout.lines().filter(|l| l.starts_with("ok ")).count() >= 5, "{stdout}");
}

/// The top-level modules of each crate root, in pipeline order: a module may use only the
/// modules before it (`lib.rs` lists them in this order too).
const LAYERS: &[(&str, &[&str])] = &[
    (
        "cleave-core/src",
        &[
            "hash",
            "graph",
            "index",
            "arch",
            "xfloat",
            "eval",
            "reference",
            "front",
            "symbolic",
            "superopt",
            "schedule",
            "plan",
            "codegen",
            "toolchain",
            "pipeline",
            // Pictures of what the stages produced, for `cleave explain --svg`.
            "picture",
        ],
    ),
    // The facade's library (`src/lib.rs`); the binary's `cli` uses it only through `cleave::`.
    ("src", &["emulate", "build", "cli"]),
];

/// The module path of a source file below a crate's `src`: `plan/lower/ops.rs` is
/// `[plan, lower, ops]`, `plan/lower/mod.rs` is `[plan, lower]`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs").to_string();
        if stem != "mod" && stem != "lib" && stem != "main" {
            parts.push(stem);
        }
    }
    parts
}

/// The first segment of each path a `use` or expression names after a prefix: `a::X` gives
/// `a`, and the group `{a::X, b}` gives `a` and `b`.
fn first_segments(after: &str) -> Vec<String> {
    let ident = |s: &str| -> String { s.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let Some(group) = after.strip_prefix('{') else { return vec![ident(after)] };
    let (mut depth, mut item, mut out) = (0, String::new(), Vec::new());
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(ident(&item));
                item.clear();
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
    out.push(ident(&item));
    out.retain(|s| !s.is_empty());
    out
}

/// The top-level modules a file's code names through `crate::` or `super::` paths (grouped
/// imports included), with the line of each. `path` is the file's module path; comments are
/// skipped.
fn referenced_modules(text: &str, path: &[String]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let mut rest = code.find(" //").map_or(code, |i| &code[..i]);
        while let Some(i) = [rest.find("crate::"), rest.find("super::")].into_iter().flatten().min() {
            let tail = &rest[i..];
            // Where the path starts from: the crate root, or the module `super::` chains climb to.
            let (from, after) = match tail.strip_prefix("crate::") {
                Some(after) => (Vec::new(), after),
                None => {
                    let (mut from, mut after) = (path.to_vec(), tail);
                    while let Some(a) = after.strip_prefix("super::") {
                        from.pop();
                        after = a;
                    }
                    (from, after)
                }
            };
            match from.first() {
                Some(top) => out.push((n + 1, top.clone())),
                None => out.extend(first_segments(after).into_iter().map(|m| (n + 1, m))),
            }
            rest = after;
        }
    }
    out
}

/// Every path that points from a module to one at or after it in `order` (its own excepted).
fn upward_references(src: &Path, order: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let rank = |m: &str| order.iter().position(|x| *x == m);
    let mut bad = Vec::new();
    for f in files {
        let rel = f.strip_prefix(src).expect("below src");
        let path = module_path(rel);
        let Some(own) = path.first().and_then(|m| rank(m)) else { continue };
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for (line, m) in referenced_modules(&text, &path) {
            if let Some(r) = rank(&m) {
                if r > own {
                    bad.push(format!("{}:{line}: `{}` uses `{m}`, which comes later", rel.display(), order[own]));
                }
            }
        }
    }
    bad
}

#[test]
fn every_module_uses_only_the_stages_before_it() {
    for (dir, order) in LAYERS {
        let bad = upward_references(&root().join(dir), order);
        assert!(bad.is_empty(), "{dir}: paths that point up the pipeline:\n{}", bad.join("\n"));
    }
    // The root module lists the core's modules in the same order.
    let lib = std::fs::read_to_string(root().join("cleave-core/src/lib.rs")).expect("lib.rs");
    let declared: Vec<&str> = lib.lines().filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';')).collect();
    assert_eq!(declared, LAYERS[0].1, "cleave-core/src/lib.rs declares its modules in pipeline order");
}

#[test]
fn the_layer_check_sees_grouped_imports_and_super_paths() {
    let plan = ["plan".to_string(), "lower".to_string(), "ops".to_string()];
    let refs = |t: &str| -> Vec<String> { referenced_modules(t, &plan).into_iter().map(|(_, m)| m).collect() };
    assert_eq!(refs("use crate::{graph::Op, pipeline::{rank, Ranked}};"), ["graph", "pipeline"]);
    assert_eq!(refs("use super::super::program::Stmt;"), ["plan"]);
    assert_eq!(refs("    let x = crate::codegen::cuda::emit(l); // crate::pipeline"), ["codegen"]);
    assert_eq!(refs("// use crate::pipeline;"), Vec::<String>::new());
    assert_eq!(module_path(Path::new("plan/lower/mod.rs")), ["plan", "lower"]);
    // A module that reaches forward is reported with its file and line.
    let dir = std::env::temp_dir().join(format!("cleave-tidy-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("graph")).expect("temp dir");
    std::fs::write(dir.join("graph/mod.rs"), "//! g\nuse crate::plan::Stmt;\n").expect("write");
    std::fs::write(dir.join("plan.rs"), "//! p\nuse crate::graph::Graph;\n").expect("write");
    let bad = upward_references(&dir, &["graph", "plan"]);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(bad, ["graph/mod.rs:2: `graph` uses `plan`, which comes later"]);
}

#[test]
fn cleave_core_never_depends_on_cudarc_or_the_runtime() {
    let manifest = std::fs::read_to_string(root().join("cleave-core/Cargo.toml")).expect("manifest");
    for dep in ["cudarc", "cleave-runtime"] {
        assert!(!manifest.lines().any(|l| l.trim_start().starts_with(dep)), "cleave-core depends on {dep}");
    }
}
