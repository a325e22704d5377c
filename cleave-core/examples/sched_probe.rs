use cleave_core::plan::{lower, partition, KernelIo, ShowKernel};
use cleave_core::schedule::{enumerate, kernel_cost, schedule, SM80};

fn main() {
    let path = std::env::args().nth(1).unwrap();
    let text = std::fs::read(&path).unwrap();
    let m = cleave_core::front::check_source(&text).unwrap();
    for (_, g) in &m.kernels {
        let p = partition(g).unwrap();
        for kg in &p.kernels {
            let kgraph = &kg.graph;
            let io = KernelIo { inputs: kg.inputs.clone(), outputs: kg.outputs.clone(), ..Default::default() };
            let mut best: Vec<(f64, String)> = Vec::new();
            let mut rejects = std::collections::BTreeMap::new();
            for c in enumerate(kgraph) {
                let it = match schedule(kgraph, &c) {
                    Ok(it) => it,
                    Err(e) => {
                        *rejects.entry(format!("{e:?}")).or_insert(0) += 1;
                        continue;
                    }
                };
                match lower(kgraph, &it, &c, &io, "k") {
                    Ok(pl) => {
                        let cost = kernel_cost(&pl.kernel, &kgraph.dims, pl.registers, &SM80);
                        let names = cleave_core::schedule::itgraph::IterNames::of(&it);
                        let text = format!(
                            "{:?}\ncost {:?} regs {}\n{}",
                            c,
                            cost,
                            pl.registers,
                            ShowKernel { kernel: &pl.kernel, dims: &kgraph.dims, names: &names }
                        );
                        best.push((cost.seconds, text));
                    }
                    Err(e) => *rejects.entry(format!("{e:?}")).or_insert(0) += 1,
                }
            }
            best.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
            println!("== {} : {} planned, rejects {:?}", kgraph.name, best.len(), rejects);
            for (_, t) in best.iter().take(1) {
                println!("{t}");
            }
        }
    }
}
