//! Fuzzes past the front end: every input that checks is searched (a small, state-bounded
//! search), scheduled, planned and emitted as CUDA and TileLang, none of which may panic. Run
//! with `cargo +nightly fuzz run pipeline` from the `fuzz/` directory; seed the corpus with
//! `kernels.yaml` and `tests/corpus/*.yaml`.

#![no_main]

use std::time::Duration;

use cleave_core::codegen::{cuda, tilelang};
use cleave_core::pipeline::{compile, Options};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(module) = cleave_core::front::check_source(data) else { return };
    let mut opts = Options::default();
    opts.search.max_states = 2_000;
    opts.search.time_limit = Duration::from_secs(10);
    opts.top_k = 1;
    for (decl, graph) in &module.kernels {
        // Every valid graph has the fallback, so compiling must succeed.
        let compiled = compile(graph, &opts).expect("a valid graph always compiles");
        let launch = compiled.best();
        let _ = cuda::emit_launch(launch, &decl.name);
        let _ = tilelang::emit_launch(launch, &decl.name);
    }
});
