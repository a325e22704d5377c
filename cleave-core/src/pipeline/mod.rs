//! The pipeline, above every stage: declared graph → search → recovery → scheduling and
//! planning of every concrete candidate under every tile configuration ([`rank`], the paper's
//! Algorithm 1) → the best launch. Each stage is a module with its own IR; this module only
//! sequences them and ranks what they produce.

mod rank;

use std::time::Instant;

use rayon::prelude::*;

pub use rank::{candidates, fallback_candidate, seconds_at, Candidate, KernelSchedule, ScheduleStats, Tiled};
use rank::{candidates_with, grouped_candidates, Cuts};

use crate::arch::{Arch, Targets};
use crate::graph::{DimVar, ValidGraph};
use crate::plan::columns::transpose_columns;
use crate::plan::rows::split_rows;
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

/// Compiles one declared kernel: one plan for the GPUs of `opts.archs` together (fitting the
/// smallest limits of the set, ranked by the mean of the estimates on each).
pub fn compile(declared: &ValidGraph, opts: &Options) -> Result<Compiled, PipelineError> {
    // A target the search cannot take (too large, an output other ops read) still compiles:
    // its declared graph is a candidate like any found one.
    let found = search(declared, &opts.search);
    rank(declared, found, &Targets::new(&opts.archs), opts.top_k, &symbol_prefix(&declared.name))
}

/// The plan of one declared kernel for one kind of GPU, at one set of extents.
#[derive(Clone, Debug)]
pub struct Variant {
    /// The names of the targets this plan serves, newest first (several when their plans came
    /// out the same), e.g. `["sm_90", "sm_86"]`.
    pub targets: Vec<String>,
    /// The lowest compute capability it is meant for (nvcc's numbering): the launcher takes
    /// it on a GPU of at least this capability whose shared memory holds its kernels.
    pub min_cc: u32,
    /// The `also` extents it was made for (`[("b", 64)]`); empty for the declared extents.
    /// Its plan's dims carry every extent it was made for, which is what the launcher
    /// measures the distance to.
    pub at: Vec<(String, u64)>,
    /// The compilation for that target; its best launch is the plan.
    pub compiled: Compiled,
    /// The index (in the list [`compile_points`] returns) of the plan for the same targets at
    /// other extents whose kernels this one's are: this one's plan is that one, and it adds
    /// only the extents it is run for.
    pub shares: Option<usize>,
}

/// Compiles one declared kernel for each of `targets` (newest first, as
/// [`ArchSet::plan_targets`] orders them): the search runs once, and each target ranks its
/// candidates against its own budget. Neighbouring targets whose best launches are the same
/// share one plan (the older target's capability bounds it); every other plan's kernels get
/// the target's name in their symbols, so that all of them live in one binary.
pub fn compile_variants(
    declared: &ValidGraph,
    opts: &Options,
    targets: &[crate::toolchain::PlanTarget],
) -> Result<Vec<Variant>, PipelineError> {
    compile_points(declared, &[], opts, targets)
}

/// [`compile_variants`] at the declared extents and at each of `points` (the `also` extents
/// of a declaration, [`crate::front::points`]): each set of extents is searched and ranked
/// again, since what is best for 16 rows is not what is best for 256. A target's plan at a
/// point that comes out the same as at an earlier set of extents [`Variant::shares`] that
/// one's kernels. The result lists each target's plans together, in the order of the
/// points with the declared extents first, and neighbouring targets share plans only when all
/// of theirs agree.
pub fn compile_points(
    declared: &ValidGraph,
    points: &[crate::front::Point],
    opts: &Options,
    targets: &[crate::toolchain::PlanTarget],
) -> Result<Vec<Variant>, PipelineError> {
    let prefix = symbol_prefix(&declared.name);
    // Per set of extents: the extents, what its kernels' symbols add (`_p2_b256`: the point's
    // number keeps symbols apart whatever the dims are named), and its graph.
    type Extents = Vec<(String, u64)>;
    let graphs: Vec<(Extents, String, &ValidGraph)> = std::iter::once((Vec::new(), String::new(), declared))
        .chain(points.iter().enumerate().map(|(i, p)| (p.at.clone(), format!("_p{}_{}", i + 1, p.suffix()), &p.graph)))
        .collect();
    let found: Vec<_> = graphs.iter().map(|(_, _, g)| search(g, &opts.search)).collect();
    // Per target: its plans, one per set of extents whose plan is its own.
    let mut groups: Vec<Vec<Variant>> = Vec::new();
    for t in targets {
        let mut group: Vec<Variant> = Vec::new();
        for ((at, _, g), f) in graphs.iter().zip(&found) {
            let compiled = rank(g, f.clone(), &Targets::new(&[t.budget]), opts.top_k, &prefix)?;
            let shares =
                group.iter().position(|v| v.shares.is_none() && same_kernels(v.compiled.best(), compiled.best()));
            group.push(Variant { targets: vec![t.name.clone()], min_cc: t.min_cc, at: at.clone(), compiled, shares });
        }
        match groups.last_mut() {
            Some(last)
                if last
                    .iter()
                    .zip(&group)
                    .all(|(a, b)| a.shares == b.shares && a.compiled.best().same_plan(b.compiled.best())) =>
            {
                for v in last.iter_mut() {
                    v.targets.push(t.name.clone());
                    v.min_cc = v.min_cc.min(t.min_cc);
                }
            }
            _ => groups.push(group),
        }
    }
    // Symbols: the declared extents of the first target keep the plain prefix; other targets
    // add their name, other extents their number and values (`cleave_k_sm80_p1_b64`).
    let mut out: Vec<Variant> = Vec::new();
    for (gi, group) in groups.into_iter().enumerate() {
        let start = out.len();
        for (mut v, (_, suffix, _)) in group.into_iter().zip(&graphs) {
            if let Some(k) = &mut v.shares {
                *k += start;
                out.push(v);
                continue;
            }
            let mut renamed = prefix.clone();
            if gi > 0 {
                renamed.push('_');
                renamed.push_str(&v.targets.last().map_or(String::new(), |n| n.replace('_', "")));
            }
            renamed.push_str(suffix);
            if renamed != prefix {
                for r in &mut v.compiled.ranked {
                    r.candidate.launch.rename(&renamed);
                }
            }
            out.push(v);
        }
    }
    Ok(out)
}

/// Whether two launches made at different extents of one declaration run the same kernels
/// with the same launch data: their CUDA is the same text and their plans differ only in the
/// extents they were made for. One of them then serves both.
fn same_kernels(a: &Launch, b: &Launch) -> bool {
    let data = |l: &Launch| {
        crate::codegen::plan::plan_data(l, "k").ok().map(|mut p| {
            for d in &mut p.dims {
                d.value = 0;
            }
            p
        })
    };
    crate::codegen::cuda::emit_launch(a, "k") == crate::codegen::cuda::emit_launch(b, "k")
        && matches!((data(a), data(b)), (Some(x), Some(y)) if x == y)
}

/// The split counts a row split is tried at: one for a dynamic row, whose count the launcher
/// chooses from its extents (the value only stands for it), and the ladder's divisors of a
/// static one.
const ROW_SPLIT_COUNTS: [u64; 5] = [2, 4, 8, 16, 32];

/// The row-split candidates of graph `g` ([`split_rows`]), as ranking jobs.
fn row_split_jobs(gi: Option<usize>, g: &ValidGraph) -> Vec<(Option<usize>, Vec<SplitValue>, ValidGraph)> {
    let Some(probe) = split_rows(g, 8) else { return Vec::new() };
    let row = g.dims.get(probe.of);
    let counts: Vec<u64> =
        if row.dynamic { vec![8] } else { ROW_SPLIT_COUNTS.into_iter().filter(|s| row.value % s == 0).collect() };
    counts
        .into_iter()
        .filter_map(|s| {
            let rs = if s == 8 { probe.clone() } else { split_rows(g, s)? };
            let name = rs.graph.dims.get(rs.count).name.clone();
            let split = SplitValue { count: rs.count, of: rs.of, name, value: s, predicated: row.dynamic };
            Some((gi, vec![split], crate::plan::requests::runtime_splits(rs.graph)))
        })
        .collect()
}

/// Schedules and ranks every candidate of a search (and the declared graph, and the fallback)
/// for `targets`.
fn rank(
    declared: &ValidGraph,
    found: Result<SearchResult, SearchError>,
    targets: &Targets,
    top_k: usize,
    prefix: &str,
) -> Result<Compiled, PipelineError> {
    let start = Instant::now();
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
    // A graph that reduces down a column is also tried computed transposed, so that the
    // column is a row of the block (`columns`); the search, which only ever removes
    // transposes, does not find that form.
    let transposed: Vec<_> =
        jobs.iter().filter_map(|(gi, s, g)| Some((*gi, s.clone(), transpose_columns(g)?))).collect();
    jobs.extend(transposed);
    // A graph whose outputs span rows they also reduce is also tried with those reductions
    // split along the row, which the search's size bound keeps it from finding itself.
    let row_splits: Vec<_> = jobs
        .iter()
        .filter(|(_, s, g)| s.is_empty() && !g.has_split())
        .flat_map(|(gi, _, g)| row_split_jobs(*gi, g))
        .collect();
    jobs.extend(row_splits);
    type Job = (Option<usize>, Vec<SplitValue>, Result<(Vec<Candidate>, ScheduleStats, bool), PartitionError>);
    let mut results: Vec<Job> = jobs
        .par_iter()
        .map(|(gi, splits, g)| {
            let r = candidates_with(g, targets, top_k, prefix, Cuts::Refused);
            (*gi, splits.clone(), r)
        })
        .collect();
    // A declaration none of whose graphs has a launch of tile kernels alone gets its grouped
    // launches again, with groups cut in two where they must be: a value stored between two
    // kernels. Each cut tried plans a whole launch, so the others never pay for them.
    let all_tile = |c: &Candidate| c.launch.kernels.iter().all(|k| k.tile().is_some());
    let none_all_tile = !results.iter().any(|(_, _, r)| r.as_ref().is_ok_and(|(c, _, _)| c.iter().any(all_tile)));
    if none_all_tile {
        let again: Vec<(usize, (Vec<Candidate>, ScheduleStats))> = results
            .par_iter()
            .enumerate()
            .filter(|(_, (_, _, r))| matches!(r, Ok((_, _, true))))
            .map(|(i, _)| (i, grouped_candidates(&jobs[i].2, targets, top_k, prefix)))
            .collect();
        for (i, (cands, s)) in again {
            if let Ok((old, stats, _)) = &mut results[i].2 {
                *old = cands;
                stats.merge(s);
            }
        }
    }
    let mut ranked = Vec::new();
    let mut stats = ScheduleStats::default();
    let mut errors = Vec::new();
    for (gi, splits, r) in results {
        match r {
            Ok((cands, s, _)) => {
                stats.merge(s);
                for c in cands {
                    ranked.push(Ranked { graph_index: gi, splits: splits.clone(), candidate: c });
                }
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    // The fallback, which every valid graph has, ranked like the rest.
    match fallback_candidate(declared, targets, prefix) {
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
