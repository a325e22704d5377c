use cleave_core::pipeline::{compile, Options};

fn main() {
    let path = std::env::args().nth(1).unwrap();
    let names: Vec<String> = std::env::args().skip(2).collect();
    let text = std::fs::read(&path).unwrap();
    let m = cleave_core::front::check_source(&text).unwrap();
    for (_, g) in &m.kernels {
        if !names.is_empty() && !names.contains(&g.name) {
            continue;
        }
        let t = std::time::Instant::now();
        match compile(g, &Options::default()) {
            Ok(c) => {
                let best = &c.ranked[0];
                println!(
                    "{}: search {:.1}s ({} graphs, {} states, {:?}), schedule {:.1}s, best graph {:?} splits {:?} kernels {} est {:.3e}s total {:.1}s",
                    g.name,
                    c.search.seconds,
                    c.search.graphs.len(),
                    c.search.states_explored,
                    c.search.stop_reason,
                    c.schedule_seconds,
                    best.graph_index,
                    best.splits.iter().map(|s| s.value).collect::<Vec<_>>(),
                    best.candidate.launch.kernels.len(),
                    best.candidate.seconds,
                    t.elapsed().as_secs_f64()
                );
                for (k, (_, it)) in best.candidate.launch.kernels.iter().zip(&best.candidate.launch.schedules) {
                    let names = cleave_core::schedule::itgraph::IterNames::of(it);
                    println!(
                        "{}",
                        cleave_core::plan::ShowKernel { kernel: k, dims: best.candidate.launch.dims(), names: &names }
                    );
                }
            }
            Err(e) => {
                println!("{}: error {e}", g.name);
                debug(g);
            }
        }
    }
}

#[allow(dead_code)]
fn debug(g: &cleave_core::graph::ValidGraph) {
    let r = cleave_core::superopt::search(g, &Default::default()).unwrap();
    for fg in &r.graphs {
        for c in &fg.concrete {
            let (cands, stats) =
                cleave_core::schedule::candidates(&c.graph, &cleave_core::schedule::SM80, 1, "x").unwrap();
            if cands.is_empty() {
                println!("NO SCHEDULE for\n{}\n{:?}", c.graph.listing(), stats);
            }
        }
    }
}
