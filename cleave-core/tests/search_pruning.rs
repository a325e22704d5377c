//! The bounds that prune the search are sound: turning any of them off explores more states
//! but finds exactly the same graphs; and the canonical order reaches every graph once.

mod common;

use std::collections::BTreeSet;

use cleave_core::superopt::{search, Pruning, SearchOptions, SearchResult};

fn run(kernel: &str, pruning: Pruning) -> SearchResult {
    let opts = SearchOptions { pruning, final_checks: false, ..SearchOptions::default() };
    let r = search(&common::shipped(kernel), &opts).expect("search runs");
    assert_eq!(r.stop_reason.name(), "exhausted");
    assert_eq!(r.counters.repeated, 0, "{kernel}: a graph was reached twice");
    r
}

fn graphs(r: &SearchResult) -> BTreeSet<String> {
    r.graphs.iter().map(|f| f.graph.listing()).collect()
}

#[test]
fn bounds_lose_no_graph() {
    let all = Pruning::default();
    for kernel in ["mha_d64_decode", "rmsnorm_matmul_decode", "matmul_rowsum_decode"] {
        let base = run(kernel, all);
        let want = graphs(&base);
        assert!(!want.is_empty());
        for (name, p) in [
            ("open_bound", Pruning { open_bound: false, ..all }),
            ("pending_reduction", Pruning { pending_reduction: false, ..all }),
            ("distance", Pruning { distance: false, ..all }),
            ("reducibility", Pruning { reducibility: false, ..all }),
        ] {
            let r = run(kernel, p);
            assert_eq!(graphs(&r), want, "{kernel} without {name}");
            assert!(r.states_explored >= base.states_explored, "{kernel} without {name}");
        }
    }
}

#[test]
fn canonicalizations_only_drop_variants() {
    // Without the duplicate and view canonicalizations the search finds more graphs (layout
    // variants, recomputed tensors); every graph found with them is still among those.
    let all = Pruning::default();
    let base = graphs(&run("matmul_matmul_decode", all));
    let loose = graphs(&run("matmul_matmul_decode", Pruning { duplicates: false, views_on_leaves: false, ..all }));
    assert!(base.is_subset(&loose));
    assert!(loose.len() > base.len());
}
