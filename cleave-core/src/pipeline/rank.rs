//! The scheduling driver (paper Alg. 1): every tile configuration of every kernel of a graph is
//! scheduled, planned once and costed; the best few launches are kept.
//!
//! The kernels of a Split-K partition are planned in order: the combine kernel reads what the
//! split kernel stores (scaled partials and their running max), so each of the split kernel's
//! best plans gets its own best combine kernel.
//!
//! A graph none of whose partitions schedules is tried once more as kernels per group of
//! outputs (`grouped_launches`), each recomputing what it shares with the others or reading
//! a value an earlier one stored, with the fallback for the groups no tile kernel computes,
//! before it is left to the fallback alone.

use rayon::prelude::*;

use crate::arch::{Arch, Targets};
use crate::graph::{DimKind, DimTable, DimVar, NodeId, ValidGraph};
use crate::plan::{
    append_fallback, assemble, cost_on, fallback, kernel_cost_on, kernel_io, lower, partition, requests, row_first,
    Cost, KernelGraph, KernelIo, Launch, Partition, PartitionError, PlanError, Planned, TileKernel,
};
use crate::schedule::{configs, schedule, ItGraph, ScheduleError, TileConfig};

/// How one kernel of a launch was scheduled.
#[derive(Clone, Debug)]
pub enum KernelSchedule {
    /// A tile program from a schedule.
    Tiled(Box<Tiled>),
    /// A stage of the fallback, which has no schedule.
    Fallback,
}

/// The schedule of a tile program.
#[derive(Clone, Debug)]
pub struct Tiled {
    /// The kernel's graph (a part of the partitioned graph, numbered in its own arena).
    pub graph: ValidGraph,
    /// The tile configuration.
    pub config: TileConfig,
    /// The itGraph it gave.
    pub itgraph: ItGraph,
}

/// One scheduled launch with its estimated cost.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// The launch.
    pub launch: Launch,
    /// How each kernel was scheduled (for explain and JSON).
    pub schedules: Vec<KernelSchedule>,
    /// Cost of each kernel.
    pub costs: Vec<Cost>,
    /// Sum of the kernels' estimated seconds.
    pub seconds: f64,
}

/// Counts of what happened to the configurations, for explain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScheduleStats {
    /// Configurations tried.
    pub tried: usize,
    /// Rejections by kind, in the order each kind was first met.
    pub rejected: Vec<(String, usize)>,
}

impl ScheduleStats {
    fn count(&mut self, kind: String, n: usize) {
        match self.rejected.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, m)) => *m += n,
            None => self.rejected.push((kind, n)),
        }
    }

    /// Adds `other`'s counts after this one's.
    pub fn merge(&mut self, other: ScheduleStats) {
        self.tried += other.tried;
        for (kind, n) in other.rejected {
            self.count(kind, n);
        }
    }
}

/// Why one configuration gave no kernel.
enum Rejection {
    Schedule(ScheduleError),
    Plan(PlanError),
}

impl Rejection {
    fn kind(&self) -> String {
        match self {
            Rejection::Schedule(e) => e.kind(),
            Rejection::Plan(e) => e.kind(),
        }
    }
}

/// One configuration of one kernel, scheduled, planned and costed.
struct Scheduled {
    config: TileConfig,
    itgraph: ItGraph,
    planned: Planned,
    cost: Cost,
}

/// The best `keep` of the configurations seen so far, best first, and what was rejected.
/// Configurations that run fewer warps than they asked for (a decode's 16 rows fill one warp
/// and the loop could not be split among the others) are kept apart and used only when no
/// configuration keeps its warps: a one-warp block cannot keep enough loads in flight to
/// stream at HBM bandwidth, whatever the model's constants say, but it beats no schedule.
struct Best {
    keep: usize,
    kept: Vec<Scheduled>,
    narrow: Vec<Scheduled>,
    stats: ScheduleStats,
}

impl Best {
    fn new(keep: usize) -> Best {
        Best { keep, kept: Vec::new(), narrow: Vec::new(), stats: ScheduleStats::default() }
    }

    fn add(mut self, r: Result<Scheduled, Rejection>) -> Best {
        match r {
            Ok(s) if s.planned.kernel.warps.threads() < 32 * s.config.warps => {
                self.narrow.push(s);
                self.trim();
            }
            Ok(s) => {
                self.kept.push(s);
                self.trim();
            }
            Err(e) => self.stats.count(e.kind(), 1),
        }
        self
    }

    fn merge(mut self, other: Best) -> Best {
        self.kept.extend(other.kept);
        self.narrow.extend(other.narrow);
        self.trim();
        self.stats.merge(other.stats);
        self
    }

    /// Keeps the best `keep` of each kind. Ties break on the configuration, so which ones
    /// survive never depends on how the work was split between threads.
    fn trim(&mut self) {
        for list in [&mut self.kept, &mut self.narrow] {
            list.sort_by(|a, b| a.cost.seconds.total_cmp(&b.cost.seconds).then_with(|| a.config.cmp(&b.config)));
            list.truncate(self.keep);
        }
    }

    /// The configurations that keep their warps, or the others when there are none.
    fn into_kept(self) -> Vec<Scheduled> {
        if self.kept.is_empty() {
            self.narrow
        } else {
            self.kept
        }
    }
}

/// Schedules, plans and costs one kernel under every configuration; returns the best `keep`.
/// `earlier` are the launch's kernels before this one: where a split count is the launcher's,
/// each configuration is costed with the count the launcher would choose for the split kernel
/// (this one, or an earlier one) at the declared extents, not at the count that stood for the
/// rule in the search.
fn plan_kernel(
    kg: &KernelGraph,
    io: &KernelIo,
    targets: &Targets,
    keep: usize,
    earlier: &[(&TileKernel, u64)],
    stats: &mut ScheduleStats,
) -> Vec<Scheduled> {
    let g = &kg.graph;
    let runtime = requests::has_runtime_splits(&g.dims);
    let configs = configs(g);
    stats.tried += configs.len();
    let mut best = configs
        .into_par_iter()
        .map(|config| {
            let itgraph = schedule(g, &config).map_err(Rejection::Schedule)?;
            let planned = lower(g, &itgraph, &config, io).map_err(Rejection::Plan)?;
            let bytes = planned.kernel.smem_bytes;
            let limit = targets.fit.smem_per_block;
            if bytes > limit {
                return Err(Rejection::Plan(PlanError::OverSharedMemory { bytes, limit }));
            }
            let cost = if runtime {
                let mut kernels = earlier.to_vec();
                kernels.push((&planned.kernel, planned.registers));
                let declared = at_workload(&g.dims, g.dims.clone(), &kernels, &targets.fit);
                kernel_cost_on(&planned.kernel, &declared, planned.registers, targets)
            } else {
                kernel_cost_on(&planned.kernel, &g.dims, planned.registers, targets)
            };
            Ok(Scheduled { config, itgraph, planned, cost })
        })
        .fold(|| Best::new(keep), Best::add)
        .reduce(|| Best::new(keep), Best::merge);
    stats.merge(std::mem::take(&mut best.stats));
    best.into_kept()
}

/// The best `top_k` launches of a graph, best first; kernel `k` of each is named
/// `{symbol_prefix}_{k}`. Where no partition of the graph schedules, its groups of outputs
/// are tried as kernels of their own, a group cut in two where it must
/// ([`Cuts::Allowed`]).
pub fn candidates(
    graph: &ValidGraph,
    targets: &Targets,
    top_k: usize,
    symbol_prefix: &str,
) -> Result<(Vec<Candidate>, ScheduleStats), PartitionError> {
    let (out, stats, _) = candidates_with(graph, targets, top_k, symbol_prefix, Cuts::Allowed)?;
    Ok((out, stats))
}

/// Whether the grouped launches of a graph may cut a group in two ([`grouped_launches`]).
/// Each cut tried plans every kernel of the launch again, so the driver allows them only for
/// a declaration none of whose graphs has a launch of tile kernels alone without them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Cuts {
    /// Groups that schedule in no kernel go to the fallback.
    Refused,
    /// Such a group is cut at the value whose launch runs fastest.
    Allowed,
}

/// [`candidates`], with or without cuts, and whether the launches are grouped ones (no
/// partition of the graph scheduled): those [`grouped_candidates`] may replace.
pub(super) fn candidates_with(
    graph: &ValidGraph,
    targets: &Targets,
    top_k: usize,
    symbol_prefix: &str,
    cuts: Cuts,
) -> Result<(Vec<Candidate>, ScheduleStats, bool), PartitionError> {
    let mut stats = ScheduleStats::default();
    let mut out = launches(graph, &partition(graph)?, targets, top_k, symbol_prefix, &mut stats);
    match row_first(graph) {
        Some(Ok(part)) => out.extend(launches(graph, &part, targets, top_k, symbol_prefix, &mut stats)),
        Some(Err(e)) => stats.count(format!("row-first partition: {e}"), 1),
        None => {}
    }
    let grouped = out.is_empty();
    if grouped {
        out = grouped_launches(graph, targets, top_k, symbol_prefix, cuts, &mut stats);
    }
    out.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    Ok((out, stats, grouped))
}

/// The grouped launches of a graph no partition of which schedules, best first, with cuts
/// allowed: what the driver tries when no graph of a declaration has a launch of tile
/// kernels alone.
pub(super) fn grouped_candidates(
    graph: &ValidGraph,
    targets: &Targets,
    top_k: usize,
    symbol_prefix: &str,
) -> (Vec<Candidate>, ScheduleStats) {
    let mut stats = ScheduleStats::default();
    let mut out = grouped_launches(graph, targets, top_k, symbol_prefix, Cuts::Allowed, &mut stats);
    out.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    (out, stats)
}

/// At most this many groups of outputs are tried together ([`grouped_launches`]); past it,
/// each is a kernel of its own.
const MAX_GROUPED_TRIALS: usize = 16;

/// At most this many values of one group are tried as the value a kernel stores for the next
/// ([`grouped_launches`]), the first in node order: each try plans every kernel of the launch
/// again.
const MAX_CUT_POINTS: usize = 32;

/// The nodes one kernel of a grouped launch computes, and whether it computes them transposed.
type Group = (Vec<NodeId>, bool);

/// The launches of a graph that has no launch of one kernel (nor a row-first one): its outputs
/// in groups, as few tile kernels as schedule, and the fallback for the groups that schedule
/// in none. The groups are those that share no computed value
/// ([`components`](crate::plan::partition::components)); one of them that schedules in no
/// kernel gives way to its outputs' own cones ([`output_cones`](crate::plan::partition::output_cones)),
/// each kernel recomputing what they share (a row sum and a column sum of one `exp(x)`, whose
/// tiles no one block can hold together), an output that another is computed from first (an
/// output `transpose(w)` beside `matmul(x, transpose(w))`: a kernel stores it, and the
/// product's kernel only reads `w` through it). Each group is tried after the kernels placed
/// before it, which store what they share with it: it joins the first kernel it schedules in
/// together with what that kernel already holds, or starts one of its own. One that
/// schedules in no kernel, even alone, is cut in two at a value it computes, where `cuts`
/// allows ([`cut_points`](crate::plan::partition::cut_points)): a kernel stores that value to
/// a workspace and the next reads it (a softmax along the rows, then a sum down its
/// columns). One that no cut helps is left to fallback stages after the tile kernels, so that
/// one output the tile programs cannot compute does not take the others with it.
fn grouped_launches(
    graph: &ValidGraph,
    targets: &Targets,
    top_k: usize,
    symbol_prefix: &str,
    cuts: Cuts,
    stats: &mut ScheduleStats,
) -> Vec<Candidate> {
    use crate::plan::partition::{beyond_cut, components, cone, cut_points, grouped, output_cones};
    // The best seconds of kernel `k` of `groups`, after the kernels before it (which store the
    // outputs they share with it, and the `stored` values it reads): `None`, no schedule.
    let seconds = |groups: &[Group], stored: &[NodeId], k: usize| -> Option<f64> {
        let Some(Ok(p)) = grouped(graph, groups, stored) else { return None };
        let mut scratch = ScheduleStats::default();
        let best = plan_kernel(&p.kernels[k], &kernel_io(&p, k, &[]), targets, 1, &[], &mut scratch);
        Some(best.first()?.cost.seconds)
    };
    // How the last group of `groups` schedules best: as written, or computed transposed (a
    // column a block's row), with its seconds; `None`, neither way.
    let schedules = |groups: &[Group], stored: &[NodeId]| -> Option<(bool, f64)> {
        let k = groups.len() - 1;
        [false, true]
            .into_iter()
            .filter_map(|transposed| {
                let mut trial = groups.to_vec();
                trial[k].1 = transposed;
                Some((transposed, seconds(&trial, stored, k)?))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))
    };
    // The seconds of the best launch of the kernels of `groups`, all planned again: a kernel
    // placed earlier may now also store a value for a later one. `None`: one of them does not
    // schedule.
    let launched = |groups: &[Group], stored: &[NodeId]| -> Option<f64> {
        let Some(Ok(p)) = grouped(graph, groups, stored) else { return None };
        let mut scratch = ScheduleStats::default();
        let found = launches(graph, &p, targets, 1, symbol_prefix, &mut scratch);
        found.iter().map(|c| c.seconds).min_by(f64::total_cmp)
    };
    // A group that schedules in no kernel, cut in two at the value whose launch runs fastest:
    // a kernel computes the value and stores it (an earlier kernel that already computes it,
    // or one of its own), and the next computes the rest of the group from it. The kernels to
    // append, and the value.
    let cut = |kernels: &[Group], stored: &[NodeId], group: &[NodeId]| {
        let mut best: Option<(f64, Vec<Group>, NodeId)> = None;
        for c in cut_points(graph, group).into_iter().take(MAX_CUT_POINTS) {
            let mut with: Vec<NodeId> = stored.to_vec();
            with.push(c);
            let mut ways: Vec<Vec<Group>> = Vec::new();
            let rest = beyond_cut(graph, group, c);
            let own = !kernels.iter().any(|(nodes, _)| nodes.contains(&c));
            for t in [false, true] {
                let after = (rest.clone(), t);
                if own {
                    ways.extend([false, true].map(|s| vec![(cone(graph, c), s), after.clone()]));
                } else {
                    ways.push(vec![after]);
                }
            }
            for added in ways {
                let trial: Vec<Group> = kernels.iter().chain(&added).cloned().collect();
                let Some(total) = launched(&trial, &with) else { continue };
                if best.as_ref().is_none_or(|b| total < b.0) {
                    best = Some((total, added, c));
                }
            }
        }
        best.map(|(_, added, c)| (added, c))
    };
    let parts = components(graph);
    // Each group to place, and whether it may still give way to its outputs' cones. The whole
    // graph in one group has just failed to schedule, so it gives way at once.
    let mut queue: std::collections::VecDeque<(Vec<NodeId>, bool)> = match parts.as_slice() {
        [whole] => output_cones(graph, whole).into_iter().map(|c| (c, false)).collect(),
        _ => parts.into_iter().map(|c| (c, true)).collect(),
    };
    // One group is the graph that has just failed to schedule; only a cut can help it.
    if queue.is_empty() || (queue.len() < 2 && cuts == Cuts::Refused) {
        return Vec::new();
    }
    let mut kernels: Vec<Group> = Vec::new();
    // The values kernels store for later ones to read.
    let mut stored: Vec<NodeId> = Vec::new();
    // What no tile kernel computes: the fallback's.
    let mut rest: Vec<NodeId> = Vec::new();
    let mut placed = 0;
    while let Some((nodes, divisible)) = queue.pop_front() {
        let mut joined = false;
        if placed < MAX_GROUPED_TRIALS {
            for i in 0..kernels.len() {
                let mut with: Vec<NodeId> = kernels[i].0.iter().chain(&nodes).copied().collect();
                with.sort();
                with.dedup();
                // Kernels after this one store nothing it stores, so they do not change it.
                let mut trial = kernels[..=i].to_vec();
                trial[i].0.clone_from(&with);
                if let Some((transposed, _)) = schedules(&trial, &stored) {
                    kernels[i] = (with, transposed);
                    joined = true;
                    break;
                }
            }
        }
        if !joined {
            let mut trial = kernels.clone();
            trial.push((nodes.clone(), false));
            match schedules(&trial, &stored) {
                Some((transposed, _)) => kernels.push((nodes, transposed)),
                None => {
                    let cones = if divisible { output_cones(graph, &nodes) } else { Vec::new() };
                    if cones.len() >= 2 {
                        for c in cones.into_iter().rev() {
                            queue.push_front((c, false));
                        }
                        continue;
                    }
                    if cuts == Cuts::Allowed && placed < MAX_GROUPED_TRIALS {
                        if let Some((added, c)) = cut(&kernels, &stored, &nodes) {
                            kernels.extend(added);
                            stored.push(c);
                            placed += 1;
                            continue;
                        }
                    }
                    // The stages of a part of a graph cannot read its per-request tables
                    // (`append_fallback`); such a graph is the fallback's whole.
                    if graph.dims.has_per_request() {
                        stats.count("grouped partition: a group of outputs with no schedule of its own".into(), 1);
                        return Vec::new();
                    }
                    stats.count("grouped partition: a group of outputs left to the fallback".into(), 1);
                    rest.extend(nodes);
                }
            }
        }
        placed += 1;
    }
    if kernels.is_empty() || (rest.is_empty() && kernels.len() < 2) {
        return Vec::new();
    }
    let tiles = kernels.len();
    if !rest.is_empty() {
        rest.sort();
        rest.dedup();
        kernels.push((rest, false));
    }
    let part = match grouped(graph, &kernels, &stored) {
        Some(Ok(part)) => part,
        Some(Err(e)) => {
            stats.count(format!("grouped partition: {e}"), 1);
            return Vec::new();
        }
        // A kernel that scheduled transposed on its own, holding less here, has no
        // transposed form.
        None => {
            stats.count("grouped partition: a kernel with no transposed form".into(), 1);
            return Vec::new();
        }
    };
    // The tile kernels are planned as a partition of their own; the fallback's kernel graph
    // (the last, which also stores the outputs that are leaves) becomes stages after them.
    let tile_part = Partition { kernels: part.kernels[..tiles].to_vec(), ..part.clone() };
    let candidates = launches(graph, &tile_part, targets, top_k, symbol_prefix, stats);
    let Some(rest) = part.kernels.get(tiles) else { return candidates };
    let mut out = Vec::with_capacity(candidates.len());
    for mut c in candidates {
        let first = c.launch.kernels.len();
        if let Err(e) = append_fallback(&mut c.launch, rest, symbol_prefix, &targets.fit) {
            stats.count(e.kind(), 1);
            continue;
        }
        for (k, regs) in c.launch.kernels[first..].iter().zip(&c.launch.registers[first..]) {
            let cost = cost_on(k, &graph.dims, *regs, targets);
            c.seconds += cost.seconds;
            c.costs.push(cost);
            c.schedules.push(KernelSchedule::Fallback);
        }
        out.push(c);
    }
    out
}

/// The best `top_k` launches of one partition of a graph (unsorted).
fn launches(
    graph: &ValidGraph,
    part: &Partition,
    targets: &Targets,
    top_k: usize,
    symbol_prefix: &str,
    stats: &mut ScheduleStats,
) -> Vec<Candidate> {
    let firsts = plan_kernel(&part.kernels[0], &kernel_io(part, 0, &[]), targets, top_k, &[], stats);
    let mut out = Vec::new();
    'firsts: for first in firsts {
        let mut chosen = vec![first];
        // Later kernels depend on what the earlier ones store (scaled partials).
        for k in 1..part.kernels.len() {
            let earlier: Vec<&Planned> = chosen.iter().map(|s| &s.planned).collect();
            let io = kernel_io(part, k, &earlier);
            let before: Vec<(&TileKernel, u64)> =
                chosen.iter().map(|s| (&s.planned.kernel, s.planned.registers)).collect();
            match plan_kernel(&part.kernels[k], &io, targets, 1, &before, stats).into_iter().next() {
                Some(s) => chosen.push(s),
                None => continue 'firsts,
            }
        }
        let (seconds, costs) = if requests::has_runtime_splits(&graph.dims) || graph.dims.has_per_request() {
            let kernels: Vec<(&TileKernel, u64)> =
                chosen.iter().map(|s| (&s.planned.kernel, s.planned.registers)).collect();
            // The kernels' own figures are those of the declared extents, with the split
            // counts the launcher would choose for them: what `cleave schedule` reports.
            let declared = at_workload(&graph.dims, graph.dims.clone(), &kernels, &targets.fit);
            let costs = kernels.iter().map(|(k, regs)| kernel_cost_on(k, &declared, *regs, targets)).collect();
            (
                workload_seconds(&graph.dims, &graph.dims, &kernels, targets, |w| {
                    kernels.iter().map(|(k, regs)| kernel_cost_on(k, w, *regs, targets).seconds).sum()
                }),
                costs,
            )
        } else {
            (chosen.iter().map(|s| s.cost.seconds).sum(), chosen.iter().map(|s| s.cost).collect())
        };
        let mut planned = Vec::with_capacity(chosen.len());
        let mut schedules = Vec::with_capacity(chosen.len());
        for (s, kg) in chosen.into_iter().zip(&part.kernels) {
            planned.push(s.planned);
            let tiled = Tiled { graph: kg.graph.clone(), config: s.config, itgraph: s.itgraph };
            schedules.push(KernelSchedule::Tiled(Box::new(tiled)));
        }
        match assemble(graph, part, planned, symbol_prefix, &targets.fit) {
            Ok(launch) => out.push(Candidate { launch, schedules, costs, seconds }),
            Err(e) => stats.count(e.kind(), 1),
        }
    }
    out
}

/// The estimated seconds of a launch of a graph with per-request dims, summed over the
/// [`workloads`](crate::plan::requests::workloads) of the extents `values` (a table of the
/// graph's `dims`), each with the split counts the launch would choose for it: `cost` gives
/// the launch's seconds at one workload's table.
fn workload_seconds(
    dims: &DimTable,
    values: &DimTable,
    tiles: &[(&TileKernel, u64)],
    targets: &Targets,
    cost: impl Fn(&DimTable) -> f64,
) -> f64 {
    requests::workloads(values)
        .into_iter()
        .map(|w| cost(&at_workload(dims, w, tiles, &targets.fit)))
        .fold(0.0, |a, c| a + c)
}

/// The estimated seconds of `launch` run at the extents of `at` (the dim table of the same
/// declaration at other extents, as [`crate::front::points`] and `cleave schedule --at` make
/// it), as the ranking estimates a candidate: the launcher's split counts for those extents,
/// and, with per-request dims, summed over their workloads. At the launch's own extents it is
/// the candidate's estimate.
///
/// This is what decides whether other extents deserve a plan of their own: the declared plan
/// run at them, against the plan made for them.
pub fn seconds_at(launch: &Launch, at: &DimTable, targets: &Targets) -> f64 {
    let dims = &launch.graph.dims;
    let mut table = dims.clone();
    let plain: Vec<(DimVar, u64)> = dims
        .iter()
        .filter(|(_, d)| matches!(d.kind, DimKind::Plain))
        .filter_map(|(v, d)| at.find(&d.name).map(|w| (v, at.get(w).value)))
        .collect();
    for (v, value) in plain {
        table.get_mut(v).value = value;
    }
    let tiles: Vec<(&TileKernel, u64)> =
        launch.kernels.iter().zip(&launch.registers).filter_map(|(k, r)| k.tile().map(|t| (t, *r))).collect();
    workload_seconds(dims, &table, &tiles, targets, |w| {
        launch.kernels.iter().zip(&launch.registers).map(|(k, regs)| cost_on(k, w, *regs, targets).seconds).sum()
    })
}

/// A workload's dim table with the split counts a launch would choose for it on GPU `arch`,
/// and the chunks that follow from them.
fn at_workload(dims: &DimTable, mut table: DimTable, kernels: &[(&TileKernel, u64)], arch: &Arch) -> DimTable {
    let counts: Vec<DimVar> = table.iter().map(|(v, _)| v).filter(|v| requests::is_runtime_split(dims, *v)).collect();
    for v in counts {
        let DimKind::SplitCount { of } = table.get(v).kind else { continue };
        let Some((k, regs)) = kernels.iter().find(|(k, _)| k.grid.iter().any(|a| a.dim == v)) else { continue };
        let extent = |d: DimVar| table.get(d).value;
        let per = requests::per_request_entries(&table, of, &extent);
        let resident = crate::plan::cost::resident_blocks(k, *regs, arch);
        let shape = requests::split_shape(k, v, &extent, per, arch.sms, resident, requests::split_fill(arch));
        table.get_mut(v).value = requests::split_count(shape);
    }
    // Chunks follow their axis and count.
    let chunks: Vec<(DimVar, DimVar, DimVar)> = table
        .iter()
        .filter_map(|(v, d)| match d.kind {
            DimKind::SplitChunk { of, count } => Some((v, of, count)),
            _ => None,
        })
        .collect();
    for (v, of, count) in chunks {
        table.get_mut(v).value = table.get(of).value.div_ceil(table.get(count).value.max(1));
    }
    table
}

/// The fallback launch of `graph` as a candidate, with its cost: the launch every valid graph
/// has, ranked against the fused ones.
pub fn fallback_candidate(graph: &ValidGraph, targets: &Targets, symbol_prefix: &str) -> Result<Candidate, PlanError> {
    let launch = fallback(graph, symbol_prefix, &targets.fit)?;
    let costs: Vec<Cost> =
        launch.kernels.iter().zip(&launch.registers).map(|(k, r)| cost_on(k, &graph.dims, *r, targets)).collect();
    let seconds = costs.iter().map(|c| c.seconds).sum();
    let schedules = vec![KernelSchedule::Fallback; launch.kernels.len()];
    Ok(Candidate { launch, schedules, costs, seconds })
}
