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
