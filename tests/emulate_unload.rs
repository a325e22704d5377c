//! A process that loads, runs and drops emulated kernels again and again keeps a bounded
//! number of memory mappings. Each emulated library maps its fibers' stacks in a pool of its
//! own; the pool once outlived the library, so every library a test loaded left its stacks
//! mapped, and a long run of generated cases failed with "memory allocation failed" when the
//! process reached the kernel's limit on mappings. A test binary of its own: other tests
//! running beside it would map and unmap at the same time.

use cleave::emulate;
use cleave_core::arch::{Targets, SM80};
use cleave_core::codegen::plan::plan_data;
use cleave_core::front::check_source;
use cleave_core::graph::Bindings;
use cleave_core::pipeline::candidates;
use cleave_core::reference::{random_inputs, InputScale};

/// The number of this process' memory mappings.
fn mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps").lines().count()
}

#[test]
fn loading_and_dropping_a_kernel_many_times_keeps_the_mappings_bounded() {
    let text = "kernels:\n  - name: unload\n    dims: { s: { value: 64, dynamic: true }, n: 256 }\n    \
                inputs: { x: \"f16[s, n]\" }\n    outputs: { y: \"f32[s, n]\" }\n    body: |\n      \
                y = softmax(x)\n";
    let g = check_source(text.as_bytes()).expect("checks").kernels.remove(0).1;
    let (cands, stats) = candidates(&g, &Targets::new(&[SM80]), 1, "cleave_unload").expect("schedules");
    let launch = &cands.first().unwrap_or_else(|| panic!("{stats:?}")).launch;
    let plan = plan_data(launch, &g.name).expect("plan");
    let mut b = Bindings::of_table(&g.dims);
    b.values[g.dims.find("s").expect("s").index()] = 37;
    b.complete(&g.dims);
    let inputs = random_inputs(&g, &b, 3, &InputScale { default: 2.0, per_input: vec![] });
    let cycle = || {
        // A cached library: loaded, run and unloaded, as each case of a long test does.
        let lib = emulate::compile(launch, &plan).expect("builds for the emulator");
        lib.run(launch, &b, &inputs, 5).expect("runs");
    };
    cycle();
    let before = mappings();
    for _ in 0..20 {
        cycle();
    }
    let after = mappings();
    // A launch runs hundreds of fibers, each stack two mappings (the stack and its guard
    // page); kept after every unload, 20 cycles would add thousands.
    assert!(after < before + 50, "{before} mappings before 20 load-run-drop cycles, {after} after");
}
