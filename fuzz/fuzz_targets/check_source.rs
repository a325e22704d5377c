//! Fuzzes the whole front end: YAML, tensor types, the body language, lowering and shape
//! inference. Run with `cargo +nightly fuzz run check_source` from the `fuzz/` directory.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = cleave_core::front::check_source(data);
});
