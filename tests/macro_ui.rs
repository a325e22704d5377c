//! The macros' compile errors: each case in `tests/ui/` must fail with the message and span
//! recorded in its `.stderr` file (regenerate with `TRYBUILD=overwrite` after reviewing).

#[test]
fn macro_errors_point_at_the_offending_token() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
