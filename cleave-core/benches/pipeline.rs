//! Pipeline benchmark: search + schedule time per kernel of `kernels.yaml`, Split-K on, on this
//! machine. Run with `cargo bench -p cleave-core --bench pipeline [-- NAME_SUBSTRING ...]`;
//! prints a Markdown table for `bench/RESULTS.md`.

#![allow(clippy::print_stdout)]

use std::time::Instant;

use cleave_core::front::check_source;
use cleave_core::pipeline::{compile, Options};

fn main() {
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels.yaml");
    let text = std::fs::read(path).expect("kernels.yaml");
    let module = check_source(&text).expect("kernels.yaml checks");
    println!("| kernel | search s | schedule s | total s | graphs | concrete candidates | configs tried | kept | chosen | kernels | est. us |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|");
    for (d, g) in &module.kernels {
        if !filters.is_empty() && !filters.iter().any(|f| d.name.contains(f.as_str())) {
            continue;
        }
        let t = Instant::now();
        let c = compile(g, &Options::default()).expect("compiles");
        let total = t.elapsed().as_secs_f64();
        let best = &c.ranked[0];
        let search = c.search.as_ref().expect("the shipped kernels are searchable");
        let chosen = if best.splits.is_empty() {
            "no split".to_string()
        } else {
            let dims = best.candidate.launch.dims();
            best.splits.iter().map(|s| s.label(dims)).collect::<Vec<_>>().join(",")
        };
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} | {chosen} | {} | {:.1} |",
            d.name,
            search.seconds,
            c.schedule_seconds,
            total,
            search.graphs.len(),
            search.candidates().count() + 1,
            c.stats.tried,
            c.ranked.len(),
            best.candidate.launch.kernels.len(),
            best.candidate.seconds * 1e6,
        );
    }
}
