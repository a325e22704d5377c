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

/// A declaration whose dims `m` and `n` list more extents to plan for.
fn with_extents(dynamic: bool, m: i64, m_also: &[i64], n_also: &[i64]) -> String {
    let list = |v: &[i64]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ");
    format!(
        "kernels:\n  - name: k\n    dims:\n      m: {{ value: {m}, dynamic: {dynamic}, also: [{}] }}\n      \
         n: {{ value: 4, dynamic: true, also: [{}] }}\n    inputs: {{ x: \"f16[m, n]\" }}\n    \
         outputs: {{ y: \"f16[m, n]\" }}\n    body: |\n      y = exp(x)\n",
        list(m_also),
        list(n_also)
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// `also` lists are accepted exactly when every extent is a new positive one on a dynamic
    /// dim and there are at most 8 plans; then every other combination is a point, lowered at
    /// its extents, in order with the last dim fastest.
    #[test]
    fn extents_to_plan_for_are_all_combinations_or_a_located_error(
        dynamic in any::<bool>(),
        m in prop::sample::select(vec![-3i64, 0, 1, 7, 16]),
        m_also in prop::collection::vec(prop::sample::select(vec![-1i64, 0, 1, 2, 16, 64, 3_000_000_000]), 0..4),
        n_also in prop::collection::vec(prop::sample::select(vec![0i64, 1, 4, 8, 64]), 0..3),
    ) {
        let text = with_extents(dynamic, m, &m_also, &n_also);
        let distinct = |first: i64, rest: &[i64]| {
            let mut seen = vec![first];
            rest.iter().all(|x| {
                let new = !seen.contains(x);
                seen.push(*x);
                new
            })
        };
        let in_range = |v: &[i64]| v.iter().all(|x| *x >= 1 && *x < (1 << 31));
        let valid = m >= 1
            && (m_also.is_empty() || dynamic)
            && in_range(&m_also)
            && in_range(&n_also)
            && distinct(m, &m_also)
            && distinct(4, &n_also)
            && (1 + m_also.len()) * (1 + n_also.len()) <= cleave_core::front::MAX_POINTS;
        match check_source(text.as_bytes()) {
            Ok(module) => {
                prop_assert!(valid, "accepted: {text}");
                let points = cleave_core::front::points(&module.kernels[0].0).expect("checked");
                let ms: Vec<i64> = std::iter::once(m).chain(m_also.iter().copied()).collect();
                let ns: Vec<i64> = std::iter::once(4).chain(n_also.iter().copied()).collect();
                let mut want = Vec::new();
                for &a in &ms {
                    for &b in &ns {
                        want.push((a as u64, b as u64));
                    }
                }
                want.remove(0);
                let got: Vec<(u64, u64)> = points
                    .iter()
                    .map(|p| {
                        let dims = &p.graph.dims;
                        let value = |name: &str| dims.get(dims.find(name).expect("dim")).value;
                        (value("m"), value("n"))
                    })
                    .collect();
                prop_assert_eq!(got, want);
            }
            Err(diags) => {
                prop_assert!(!valid, "refused {text}: {diags:?}");
                let lines = text.lines().count() as u32 + 1;
                for d in diags {
                    prop_assert!(d.pos.line >= 1 && d.pos.line <= lines && d.pos.col >= 1, "{d:?}");
                }
            }
        }
    }
}
