//! Pictures of what the compiler did, as SVG written in plain Rust (no Graphviz): the declared
//! graph, the graph the search chose with its rewrites and splits highlighted, and the chosen
//! schedule as nested loops with every tensor coloured by where it lives.
//!
//! Each picture is a pure function of its input, so the same declaration always gives the
//! same bytes. Every box and name carries a class (and `data-*` attributes), so tests and tools
//! can read a picture back.

mod graph;
mod layout;
mod schedule;
mod svg;

pub use graph::graph_svg;
pub use schedule::schedule_svg;
