//! Property tests: no input, however malformed, makes the front end panic.

use cleave_core::front::{check_source, parse_body};
use proptest::prelude::*;

/// Tokens of the body language and of the YAML around it, to build "almost right" inputs.
const TOKENS: &[&str] = &[
    "matmul",
    "transpose",
    "softmax",
    "rmsnorm",
    "sum",
    "max",
    "mean",
    "exp",
    "silu",
    "(",
    ")",
    ",",
    "=",
    "+",
    "-",
    "*",
    "/",
    "axis",
    "eps",
    "=",
    "-1",
    "0",
    "2",
    "1e-6",
    "1e309",
    ".",
    "x",
    "w",
    "y",
    "q",
    "k",
    "\n",
    ";",
    "#",
    " ",
    "axis=-1",
    "axis=7",
    "f16[",
    "]",
    "[",
    ":",
    "{",
    "}",
    "\"",
    "|",
    "  ",
    "- name: ",
    "dims:",
    "inputs:",
    "outputs:",
    "body: |",
    "dynamic: true",
    "value: ",
    "99999999999999999999",
    "\u{0}",
    "é",
];

fn soup() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(TOKENS), 0..60).prop_map(|t| t.concat())
}

fn wrap(body: &str) -> String {
    let indented: String = body.lines().map(|l| format!("      {l}\n")).collect();
    format!(
        "kernels:\n  - name: k\n    dims: {{ m: 3, n: 4 }}\n    inputs: {{ x: \"f16[m, n]\", w: \"f16[n, m]\" }}\n    outputs: {{ y: \"f16[m, m]\" }}\n    body: |\n{indented}"
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let _ = check_source(&bytes);
    }

    #[test]
    fn token_soups_never_panic(s in soup()) {
        let _ = parse_body(&s);
        let _ = check_source(s.as_bytes());
        let _ = check_source(wrap(&s).as_bytes());
    }

    #[test]
    fn errors_point_inside_the_file(s in soup()) {
        let text = wrap(&s);
        if let Err(diags) = check_source(text.as_bytes()) {
            let lines = text.lines().count().max(1) as u32 + 1;
            for d in diags {
                prop_assert!(d.pos.line >= 1 && d.pos.line <= lines, "{d:?} outside {lines} lines");
                prop_assert!(d.pos.col >= 1, "{d:?}");
                prop_assert!(!d.message.is_empty());
            }
        }
    }
}
