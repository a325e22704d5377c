//! `cleave check` on data-driven fixtures: every file in `tests/check/bad/` states the
//! diagnostics it must produce in trailing `# expect: LINE:COL: message` comments; every file
//! in `tests/check/good/` (and the shipped `kernels.yaml`) must pass.

use std::path::{Path, PathBuf};
use std::process::Command;

fn cleave(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cleave")).args(args).output().expect("the cleave binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn fixtures(dir: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_bad_fixture_reports_its_located_errors() {
    let files = fixtures("tests/check/bad");
    assert!(files.len() >= 25, "fixtures are missing");
    let mut failures = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("fixture is text");
        let expected: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# expect: ")).collect();
        assert!(!expected.is_empty(), "{} has no `# expect:` line", path.display());
        let shown = path.to_string_lossy().into_owned();
        let (code, _, stderr) = cleave(&["check", &shown]);
        // Each located line is followed by the source snippet it points at.
        let got: Vec<&str> = stderr.lines().filter(|l| l.starts_with(shown.as_str())).collect();
        let snippets = stderr.lines().filter(|l| l.trim_start().starts_with("┌─ ")).count();
        let want: Vec<String> = expected.iter().map(|e| format!("{shown}:{e}")).collect();
        if code != 1 || got != want || snippets != want.len() {
            failures.push(format!(
                "{}\n  exit {code}\n  got:  {got:?}\n  want: {want:?}\n  snippets: {snippets}",
                path.display()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_diagnostic_shows_the_source_line_with_the_offending_item_underlined() {
    let dir = std::env::temp_dir().join(format!("cleave-snippet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("typo.yaml");
    let src = "kernels:\n  - name: k\n    dims: { n: 8 }\n    inputs: { x: \"f32[n]\" }\n    outputs: { y: \"f32[n]\" }\n    body: |\n      y = exq(x)\n";
    std::fs::write(&path, src).expect("write");
    let shown = path.to_string_lossy().into_owned();
    let (code, _, stderr) = cleave(&["check", &shown]);
    assert_eq!(code, 1, "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(lines[0].starts_with(&format!("{shown}:7:11: ")), "{stderr}");
    let at =
        lines.iter().position(|l| l.ends_with("y = exq(x)")).unwrap_or_else(|| panic!("no source line:\n{stderr}"));
    let column = lines[at].find("exq").expect("the call");
    assert_eq!(lines[at + 1].find('^'), Some(column), "{stderr}");
    assert_eq!(lines[at + 1].matches('^').count(), 3, "{stderr}");
}

#[test]
fn binary_files_are_rejected_with_a_position() {
    let dir = std::env::temp_dir().join(format!("cleave-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("binary.yaml");
    std::fs::write(&path, b"kernels:\n  - name: k\x00\xff\xfe\n").expect("write");
    let shown = path.to_string_lossy().into_owned();
    let (code, _, stderr) = cleave(&["check", &shown]);
    assert_eq!(code, 1);
    assert_eq!(stderr.trim(), format!("{shown}:2:13: not a UTF-8 text file (invalid byte at offset 21)"));
    std::fs::write(&path, b"kernels:\n\x00\n").expect("write");
    let (code, _, stderr) = cleave(&["check", &shown]);
    assert_eq!(code, 1);
    assert_eq!(stderr.trim(), format!("{shown}:2:1: the file contains NUL bytes: not a text file"));
}

#[test]
fn good_files_pass() {
    let mut files = fixtures("tests/check/good");
    files.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels.yaml"));
    for path in files {
        let shown = path.to_string_lossy().into_owned();
        let (code, stdout, stderr) = cleave(&["check", &shown]);
        assert_eq!(code, 0, "{shown}: {stderr}");
        assert!(stdout.starts_with(&format!("{shown}: ok")), "{stdout}");
    }
}

#[test]
fn usage_errors_exit_1_and_missing_files_are_user_errors() {
    let (code, _, stderr) = cleave(&["check"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("required arguments were not provided") && stderr.contains("<FILE>"), "{stderr}");
    let (code, _, stderr) = cleave(&["check", "/nonexistent/kernels.yaml"]);
    assert_eq!(code, 1);
    assert!(stderr.starts_with("/nonexistent/kernels.yaml: cannot read:"), "{stderr}");
    let (code, _, stderr) = cleave(&["frobnicate", "x"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("unrecognized subcommand 'frobnicate'"), "{stderr}");
    let kernels = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels.yaml");
    let (code, _, stderr) = cleave(&["explain", kernels, "--kernel", "nope"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("no kernel named `nope`"), "{stderr}");
}

/// The command line follows the conventions: `--help` for the program and each subcommand and
/// `--version` succeed on stdout, an unknown option is a user error that names the closest
/// known one, and a command run in a pipe writes nothing to stderr (no progress drawing).
#[test]
fn help_version_suggestions_and_quiet_pipes() {
    let (code, stdout, _) = cleave(&["--help"]);
    assert_eq!(code, 0);
    for sub in ["check", "search", "schedule", "emit", "explain", "run"] {
        assert!(stdout.contains(sub), "{sub} missing from:\n{stdout}");
        let (code, help, err) = cleave(&[sub, "--help"]);
        assert_eq!(code, 0, "{sub}: {err}");
        assert!(help.contains("Usage: cleave") && help.contains("<FILE>"), "{sub}: {help}");
    }
    let (_, help, _) = cleave(&["run", "--help"]);
    assert!(help.contains("--dims") && help.contains("--checks"), "{help}");
    let (code, stdout, _) = cleave(&["--version"]);
    assert_eq!(code, 0);
    assert_eq!(stdout.trim(), format!("cleave {}", env!("CARGO_PKG_VERSION")));
    let kernels = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels.yaml");
    let (code, _, stderr) = cleave(&["schedule", kernels, "--kernal", "matmul_prefill"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("--kernal") && stderr.contains("--kernel"), "{stderr}");
    let (code, stdout, stderr) = cleave(&["schedule", kernels, "--kernel", "matmul_prefill"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("chosen program"), "{stdout}");
    assert!(stderr.is_empty(), "stderr of a piped run: {stderr:?}");
}
