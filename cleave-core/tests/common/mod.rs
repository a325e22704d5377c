//! Helpers shared by the integration tests.

#![allow(dead_code)]

use cleave_core::front::check_source;
use cleave_core::graph::ValidGraph;

/// Parses a YAML declaration holding one kernel and returns its graph.
pub(crate) fn graph(yaml: &str) -> ValidGraph {
    match check_source(yaml.as_bytes()) {
        Ok(m) => m.kernels.into_iter().next().expect("one kernel").1,
        Err(d) => panic!("fixture does not check: {d:?}"),
    }
}

/// The graph of a kernel of the shipped `kernels.yaml`.
pub(crate) fn shipped(name: &str) -> ValidGraph {
    let text = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels.yaml")).expect("kernels.yaml");
    let m = check_source(&text).expect("kernels.yaml checks");
    m.kernels.into_iter().find(|(d, _)| d.name == name).unwrap_or_else(|| panic!("no kernel {name}")).1
}
