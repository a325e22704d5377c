//! The pipeline, above every stage: declared graph → search → recovery → scheduling and
//! planning of every concrete candidate under every tile configuration ([`rank`], the paper's
//! Algorithm 1) → the best launch. Each stage is a module with its own IR; this module only
//! sequences them and ranks what they produce.

mod rank;

use std::time::Instant;

use rayon::prelude::*;

pub use rank::{candidates, fallback_candidate, Candidate, KernelSchedule, ScheduleStats, Tiled};

use crate::arch::{Arch, Targets};
use crate::graph::{DimVar, ValidGraph};
use crate::plan::{Launch, PartitionError};
use crate::reference::rounding_unit;
use crate::superopt::{search, SearchError, SearchOptions, SearchResult, SplitValue};
use crate::toolchain::ArchSet;

/// Options of a whole compilation.
#[derive(Clone, Debug)]
pub struct Options {
    /// The algebraic search.
    pub search: SearchOptions,
    /// Architectures the kernels must fit (the plan uses the tightest limit of each).
    pub archs: Vec<Arch>,
    /// Schedules kept per concrete graph.
    pub top_k: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options { search: SearchOptions::default(), archs: ArchSet::default().budgets(), top_k: 3 }
    }
}

/// One scheduled launch and the graph it came from.
#[derive(Clone, Debug)]
pub struct Ranked {
    /// Index of the found graph in the search result (`None`: the declared graph itself).
    pub graph_index: Option<usize>,
    /// Split counts of the concrete graph.
    pub splits: Vec<SplitValue>,
    /// The schedule.
    pub candidate: Candidate,
}

/// The result of compiling one declared kernel.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The declared graph.
    pub declared: ValidGraph,
    /// The search, or why it could not run; the declared graph is scheduled either way.
    pub search: Result<SearchResult, SearchError>,
    /// Every launch kept, best first (across all graphs).
    pub ranked: Vec<Ranked>,
    /// What the scheduler rejected, summed over graphs.
    pub stats: ScheduleStats,
    /// Seconds spent scheduling.
    pub schedule_seconds: f64,
}

impl Compiled {
    /// The chosen launch (the cost model's best).
    pub fn best(&self) -> &Launch {
        &self.ranked[0].candidate.launch
    }
}

/// Why a kernel could not be compiled. Every valid graph has the fallback launch, so this is
/// an internal error when it happens.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PipelineError {
    /// Neither a schedule nor the fallback.
    #[error("no schedule fits: {0}")]
    NoSchedule(String),
}

/// The stable prefix of a declared kernel's entry points.
pub fn symbol_prefix(kernel: &str) -> String {
    format!("cleave_{kernel}")
}

/// Compiles one declared kernel.
pub fn compile(declared: &ValidGraph, opts: &Options) -> Result<Compiled, PipelineError> {
    // A target the search cannot take (too large, an output other ops read) still compiles:
    // its declared graph is a candidate like any found one.
    let found = search(declared, &opts.search);
    let start = Instant::now();
    let targets = Targets::new(&opts.archs);
    let prefix = symbol_prefix(&declared.name);
    // The declared graph is a candidate too: a graph the search never reached (or a plain
    // matmul that needs no rewriting) must still be schedulable.
    let mut jobs: Vec<(Option<usize>, Vec<SplitValue>, ValidGraph)> = vec![(None, Vec::new(), declared.clone())];
    // A found graph that rounds a value the declaration keeps in f32 (a division moved in
    // front of a tensor-core product makes its left operand computed, rounded to 16 bits) is
    // less precise than what was declared: equal in exact arithmetic, not in the kernel's.
    let declared_unit = rounding_unit(declared);
    for (gi, fg) in found.iter().flat_map(|f| f.graphs.iter()).enumerate() {
        // Candidates that differ only in a split count the launcher chooses at run time are
        // one candidate: the first stands for them.
        let mut seen: Vec<Vec<(DimVar, u64)>> = Vec::new();
        for c in &fg.concrete {
            let fixed: Vec<(DimVar, u64)> = c
                .splits
                .iter()
                .filter(|s| !crate::plan::requests::is_runtime_split(&c.graph.dims, s.count))
                .map(|s| (s.count, s.value))
                .collect();
            if seen.contains(&fixed) {
                continue;
            }
            seen.push(fixed);
            if rounding_unit(&c.graph) <= declared_unit {
                jobs.push((Some(gi), c.splits.clone(), crate::plan::requests::runtime_splits(c.graph.clone())));
            }
        }
    }
    type Job = (Option<usize>, Vec<SplitValue>, Result<(Vec<Candidate>, ScheduleStats), PartitionError>);
    let results: Vec<Job> = jobs
        .into_par_iter()
        .map(|(gi, splits, g)| {
            let r = candidates(&g, &targets, opts.top_k, &prefix);
            (gi, splits, r)
        })
        .collect();
    let mut ranked = Vec::new();
    let mut stats = ScheduleStats::default();
    let mut errors = Vec::new();
    for (gi, splits, r) in results {
        match r {
            Ok((cands, s)) => {
                stats.merge(s);
                for c in cands {
                    ranked.push(Ranked { graph_index: gi, splits: splits.clone(), candidate: c });
                }
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    // The fallback, which every valid graph has, ranked like the rest.
    match fallback_candidate(declared, &targets, &prefix) {
        Ok(candidate) => ranked.push(Ranked { graph_index: None, splits: Vec::new(), candidate }),
        Err(e) => errors.push(format!("fallback: {e}")),
    }
    // Best first; ties keep the search's canonical graph order, so the choice is deterministic.
    ranked.sort_by(|a, b| {
        a.candidate
            .seconds
            .total_cmp(&b.candidate.seconds)
            .then_with(|| a.graph_index.cmp(&b.graph_index))
            .then_with(|| a.splits.iter().map(|s| s.value).cmp(b.splits.iter().map(|s| s.value)))
    });
    if ranked.is_empty() {
        let mut why: Vec<String> = stats.rejected.iter().map(|(k, n)| format!("{k} ({n})")).collect();
        why.extend(errors);
        return Err(PipelineError::NoSchedule(why.join("; ")));
    }
    Ok(Compiled {
        declared: declared.clone(),
        search: found,
        ranked,
        stats,
        schedule_seconds: start.elapsed().as_secs_f64(),
    })
}
