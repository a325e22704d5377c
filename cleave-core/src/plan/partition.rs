//! Splitting a graph into the kernels of one launch (paper Fig. 5b).
//!
//! A graph without `split` is one kernel. A Split-K graph becomes a split kernel and a combine
//! kernel: the combine starts at the reductions over a split-count axis (`sum(.., axis=0)` of
//! a `[s_K, ..]` tensor, in the usual case) and holds everything downstream of them; the split
//! kernel holds every other op. Tensors of the split kernel read by the combine kernel become
//! f32 workspace buffers: what the split kernel writes to global memory and the combine kernel
//! reads.
//!
//! A product's right operand is read from memory by every block (the tensor cores and the
//! row-vector products take it as a staged tile), so one that is computed (`sum(w, axis=-1)`
//! in `matmul(x, sum(w, axis=-1))`) is computed first, by a kernel of its own that stores it
//! to a workspace: the first kernel of the launch. A matrix is stored in the 16-bit type the
//! tensor cores take it in (rounding it once there rather than in every block), a vector in
//! f32 (its products are f32 dot products).
//!
//! Where an output spans a row it also reduces, [`super::rows`] offers a second partition.

use std::collections::BTreeMap;

use super::program::Binding;
use crate::graph::{validate, DType, Dim, DimKind, Graph, NodeId, Op, TensorDecl, ValidGraph, ValidationError};

/// Which kernel of a launch computes a node.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Part {
    /// An input or constant: read by whichever kernel uses it.
    Leaf,
    /// The kernel before the others: the computed right operands of products.
    Pre,
    /// The row reductions that an output reads back across the row they reduce, and what they
    /// are computed from ([`super::rows::row_first`]), by level: those of level `l` are
    /// computed from those below.
    Rows(u8),
    /// The split kernel, or the whole graph (but its [`Part::Pre`] or [`Part::Rows`]) when it
    /// has no split.
    Split,
    /// The combine kernel.
    Combine,
    /// One kernel of a [`grouped`] partition: groups of outputs computed apart, in launch
    /// order.
    Group(u8),
    /// A node no output depends on: neither kernel computes it.
    Unused,
}

/// One kernel's graph and how its inputs and outputs bind at launch.
#[derive(Clone, Debug)]
pub struct KernelGraph {
    /// The kernel's own graph (shares the launch's dim table).
    pub graph: ValidGraph,
    /// For each input of `graph`: what it reads.
    pub inputs: Vec<Binding>,
    /// For each output of `graph`: what it writes.
    pub outputs: Vec<Binding>,
    /// For each node of `graph` (by [`NodeId::index`]): the node of the partitioned graph it
    /// computes or reads. How a later kernel finds the node an earlier one stabilized.
    pub origin: Vec<NodeId>,
    /// For each input of `graph`: the float types of the declared inputs its values come from
    /// (an input's own; a workspace's, those its node is computed from), which bound what the
    /// tensor cores may round it to ([`crate::graph::may_round_to`]).
    pub input_sources: Vec<Vec<DType>>,
}

/// What a workspace's elements are.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum WorkspaceType {
    /// f32 (between tile kernels).
    F32,
    /// f16: a computed right operand that the tensor cores take in f16.
    F16,
    /// bf16: a computed right operand that the tensor cores take in bf16.
    BF16,
    /// Extended-exponent floats, an f32 mantissa and an i32 exponent (between stage kernels).
    Extended,
}

impl WorkspaceType {
    /// Bytes per element.
    pub fn bytes(self) -> u32 {
        match self {
            WorkspaceType::F16 | WorkspaceType::BF16 => 2,
            WorkspaceType::F32 => 4,
            WorkspaceType::Extended => 8,
        }
    }

    /// The tensor type a tile kernel reads and writes it as (`None`: a fallback workspace,
    /// which only stage kernels touch).
    pub fn dtype(self) -> Option<DType> {
        match self {
            WorkspaceType::F32 => Some(DType::F32),
            WorkspaceType::F16 => Some(DType::F16),
            WorkspaceType::BF16 => Some(DType::BF16),
            WorkspaceType::Extended => None,
        }
    }
}

/// A workspace tensor, with a shape over the launch's dims.
#[derive(Clone, PartialEq, Debug)]
pub struct Workspace {
    /// Printed name.
    pub name: String,
    /// Shape.
    pub shape: Vec<Dim>,
    /// The node of the partitioned graph it holds (`None`: a running max the planner added).
    pub node: Option<NodeId>,
    /// Its elements.
    pub ty: WorkspaceType,
    /// The buffer's axes where they are not the shape's: a fallback workspace over dims that
    /// differ between requests stores them by position ([`super::stage::positions`]).
    pub storage: Option<Vec<Dim>>,
}

/// The kernels of a launch, in order, and the workspaces between them.
#[derive(Clone, Debug)]
pub struct Partition {
    /// Per node (by [`NodeId::index`]): the kernel that computes it.
    pub part: Vec<Part>,
    /// Per node: the first node computing the same elements, seen through splits
    /// ([`super::rows::same_elements`]).
    pub same_elements: Vec<NodeId>,
    /// Per node: whether a later kernel computes it again, beside the [`Part::Rows`] kernel
    /// that computes it first (an elementwise value is cheaper recomputed than stored).
    pub recomputed: Vec<bool>,
    /// Per node: an exp that needs no running max ([`super::lower::stabilize::bounded_exps`]).
    pub bounded_exps: Vec<bool>,
    /// The reductions over a split-count axis, where the combine kernel begins.
    pub combine_roots: Vec<NodeId>,
    /// Kernels in launch order.
    pub kernels: Vec<KernelGraph>,
    /// Workspaces, in node order.
    pub workspaces: Vec<Workspace>,
}

impl Partition {
    /// The nodes one kernel computes, in topological order.
    pub fn nodes(&self, part: Part) -> Vec<NodeId> {
        (0..self.part.len()).filter(|&i| self.part[i] == part).map(|i| NodeId(i as u32)).collect()
    }
}

/// Why a graph has no partition.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum PartitionError {
    /// A split with no reduction over its count.
    #[error("a split whose parts are never combined")]
    UncombinedSplit,
    /// An output of the split kernel.
    #[error("the output `{0}` is computed before the Split-K combine")]
    OutputBeforeCombine(String),
    /// A workspace over the chunks of a split whose last chunk runs past the axis: the split
    /// kernel would store the padding, and the combine would reduce it.
    #[error("a Split-K workspace over the ragged chunks of `{0}`")]
    RaggedChunkWorkspace(String),
    /// A kernel graph that fails validation (a partitioning bug).
    #[error("kernel {kernel} of the partition is invalid: {error}")]
    InvalidKernel {
        /// The kernel's index.
        kernel: usize,
        /// What the validator found.
        error: ValidationError,
    },
    /// A kernel graph whose shapes do not infer (a partitioning bug).
    #[error("kernel {kernel} of the partition is invalid at node %{node}: {message}")]
    Shape {
        /// The kernel's index.
        kernel: usize,
        /// The node of the partitioned graph.
        node: u32,
        /// The shape error.
        message: String,
    },
}

/// True when `node` reduces an axis that is a split count: a combine.
pub fn is_combine(g: &Graph, node: NodeId) -> bool {
    let n = g.node(node);
    match n.op {
        Op::Reduce(_, axis) => match g.shape(n.args[0]).get(axis as usize) {
            Some(Dim::Var(v)) => matches!(g.dims.get(*v).kind, DimKind::SplitCount { .. }),
            _ => false,
        },
        _ => false,
    }
}

/// Partitions a (validated, concrete) graph.
pub fn partition(g: &ValidGraph) -> Result<Partition, PartitionError> {
    let live = g.live();
    let pre = computed_right_operands(g, &live);
    let mut part = vec![Part::Unused; g.nodes.len()];
    let mut combine_roots = Vec::new();
    for id in g.ids() {
        if g.node(id).op.is_leaf() {
            part[id.index()] = Part::Leaf;
        } else if !live[id.index()] {
            continue;
        } else if pre[id.index()] {
            part[id.index()] = Part::Pre;
        } else if is_combine(g, id) {
            part[id.index()] = Part::Combine;
            combine_roots.push(id);
        } else if g.node(id).args.iter().any(|a| part[a.index()] == Part::Combine) {
            part[id.index()] = Part::Combine;
        } else {
            part[id.index()] = Part::Split;
        }
    }
    // An elementwise value of the unsplit inputs that only the combine reads (the numerator
    // `exp(x)` of a softmax whose sum is split along the row) is the combine's to compute:
    // stored by the split kernel, it would be written and read back whole. So is a transpose
    // of one, or of an input (the numerator of a softmax down a column reads its input
    // transposed).
    if !combine_roots.is_empty() {
        let users = g.users();
        let mut split_dep = vec![false; g.nodes.len()];
        for id in g.ids() {
            let n = g.node(id);
            split_dep[id.index()] = matches!(n.op, Op::Split(_)) || n.args.iter().any(|a| split_dep[a.index()]);
        }
        for id in (0..g.nodes.len() as u32).rev().map(NodeId) {
            let elementwise_or_view =
                matches!(g.node(id).op, Op::Unary(_) | Op::Binary(_) | Op::Mask(_) | Op::Transpose);
            let for_combine = users[id.index()].iter().all(|u| matches!(part[u.index()], Part::Combine | Part::Unused));
            if part[id.index()] == Part::Split && elementwise_or_view && !split_dep[id.index()] && for_combine {
                part[id.index()] = Part::Combine;
            }
        }
    }
    if combine_roots.is_empty() && g.has_split() {
        return Err(PartitionError::UncombinedSplit);
    }
    if !combine_roots.is_empty() {
        // The combine is the last kernel, which also stores the outputs that are leaves.
        if let Some(o) = g.outputs.iter().find(|o| !matches!(part[o.node.index()], Part::Combine | Part::Leaf)) {
            return Err(PartitionError::OutputBeforeCombine(o.decl.name.clone()));
        }
    }
    let has_pre = pre.iter().any(|&p| p);
    if !has_pre && combine_roots.is_empty() {
        let inputs = (0..g.inputs.len() as u32).map(Binding::Input).collect();
        let outputs = (0..g.outputs.len() as u32).map(Binding::Output).collect();
        let origin = g.ids().collect();
        return Ok(Partition {
            same_elements: super::rows::same_elements(g),
            bounded_exps: super::lower::stabilize::bounded_exps(g),
            recomputed: vec![false; part.len()],
            part,
            combine_roots,
            kernels: vec![KernelGraph {
                graph: g.clone(),
                inputs,
                outputs,
                origin,
                input_sources: declared_sources(g),
            }],
            workspaces: Vec::new(),
        });
    }
    // Workspace tensors: values one kernel computes and a later one reads.
    let users = g.users();
    let mut workspaces: Vec<Workspace> = Vec::new();
    for id in g.ids() {
        let p = part[id.index()];
        let read_later = users[id.index()].iter().any(|u| order(part[u.index()]) > order(p));
        if !matches!(p, Part::Pre | Part::Split) || !read_later {
            continue;
        }
        let name = format!("ws{}", workspaces.len());
        for d in g.shape(id) {
            if let Dim::Var(v) = d {
                if let DimKind::SplitChunk { of, count } = g.dims.get(*v).kind {
                    let (of, count) = (g.dims.get(of), g.dims.get(count).value);
                    if of.dynamic || of.value % count.max(1) != 0 {
                        return Err(PartitionError::RaggedChunkWorkspace(of.name.clone()));
                    }
                }
            }
        }
        let shape = g.shape(id).to_vec();
        let ty = if p == Part::Pre { operand_type(g, &part, &users, id) } else { WorkspaceType::F32 };
        workspaces.push(Workspace { name, shape, node: Some(id), ty, storage: None });
    }
    let mut parts = Vec::new();
    if has_pre {
        parts.push(Part::Pre);
    }
    parts.push(Part::Split);
    if !combine_roots.is_empty() {
        parts.push(Part::Combine);
    }
    let recomputed = vec![false; part.len()];
    let kernels = parts
        .iter()
        .enumerate()
        .map(|(k, &p)| extract(g, &part, &recomputed, k, (p, k + 1 == parts.len()), &workspaces))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Partition {
        part,
        same_elements: super::rows::same_elements(g),
        bounded_exps: super::lower::stabilize::bounded_exps(g),
        recomputed,
        combine_roots,
        kernels,
        workspaces,
    })
}

/// The live computed nodes of `g` in the groups that share none, each in node order, the groups
/// in the order of their first node: two nodes are in one group when one reads the other.
/// Inputs and constants join nothing, so outputs computed from the same inputs by separate
/// chains of ops fall in separate groups.
pub fn components(g: &ValidGraph) -> Vec<Vec<NodeId>> {
    let live = g.live();
    let mut root: Vec<usize> = (0..g.nodes.len()).collect();
    fn find(root: &mut [usize], mut x: usize) -> usize {
        while root[x] != x {
            root[x] = root[root[x]];
            x = root[x];
        }
        x
    }
    let computed = |id: NodeId| live[id.index()] && !g.node(id).op.is_leaf();
    for id in g.ids().filter(|&id| computed(id)) {
        for &a in g.node(id).args.iter().filter(|&&a| computed(a)) {
            let (x, y) = (find(&mut root, id.index()), find(&mut root, a.index()));
            // The smaller index stays the root, so a group is named by its first node.
            root[x.max(y)] = x.min(y);
        }
    }
    let mut groups: BTreeMap<usize, Vec<NodeId>> = BTreeMap::new();
    for id in g.ids().filter(|&id| computed(id)) {
        groups.entry(find(&mut root, id.index())).or_default().push(id);
    }
    groups.into_values().collect()
}

/// The live computed nodes that each output of `g` computed in `among` is computed from, one
/// set per output, equal sets once: the smallest groups a kernel can compute on its own,
/// recomputing what they share. A set inside another (an output another output is computed
/// from) comes before it, so that a kernel of its own, placed first, stores that output and
/// the larger one's kernel only computes it again ([`grouped`]); the rest are in node order.
pub fn output_cones(g: &ValidGraph, among: &[NodeId]) -> Vec<Vec<NodeId>> {
    let mut cones: Vec<Vec<NodeId>> = Vec::new();
    for o in &g.outputs {
        if !among.contains(&o.node) {
            continue;
        }
        let cone = cone(g, o.node);
        if !cone.is_empty() && !cones.contains(&cone) {
            cones.push(cone);
        }
    }
    cones.sort_by_key(|c| c.first().copied());
    let within = |a: &[NodeId], b: &[NodeId]| a.len() < b.len() && a.iter().all(|x| b.binary_search(x).is_ok());
    // Repeatedly the first cone in node order that no other cone left lies within.
    let mut ordered = Vec::with_capacity(cones.len());
    while !cones.is_empty() {
        let i = (0..cones.len()).find(|&i| !cones.iter().any(|d| within(d, &cones[i]))).unwrap_or(0);
        ordered.push(cones.remove(i));
    }
    ordered
}

/// The computed nodes `node` is computed from, itself included, in node order.
pub fn cone(g: &Graph, node: NodeId) -> Vec<NodeId> {
    let mut cone = vec![false; g.nodes.len()];
    let mut stack = vec![node];
    while let Some(x) = stack.pop() {
        if g.node(x).op.is_leaf() || std::mem::replace(&mut cone[x.index()], true) {
            continue;
        }
        stack.extend(g.node(x).args.iter().copied());
    }
    g.ids().filter(|id| cone[id.index()]).collect()
}

/// The nodes of `group` that a kernel may store to an f32 workspace for a later kernel of a
/// [`grouped`] partition to read, when the group schedules in no one kernel (two reductions
/// of one cone that want different tiles): those computed and read by another node of the
/// group. The kernel that stores one refuses it where it carries a running-max scale
/// ([`KernelIo::cut_outputs`](super::KernelIo::cut_outputs)).
pub fn cut_points(g: &ValidGraph, group: &[NodeId]) -> Vec<NodeId> {
    let users = g.users();
    group
        .iter()
        .copied()
        .filter(|&c| !g.node(c).op.is_leaf() && users[c.index()].iter().any(|u| group.contains(u)))
        .collect()
}

/// What is left of `group` to compute once value `cut` is read from memory: the nodes its
/// sinks (those no node of the group reads) still need, reached without passing `cut`.
pub fn beyond_cut(g: &ValidGraph, group: &[NodeId], cut: NodeId) -> Vec<NodeId> {
    let users = g.users();
    let mut kept = vec![false; g.nodes.len()];
    let mut stack: Vec<NodeId> =
        group.iter().copied().filter(|x| !users[x.index()].iter().any(|u| group.contains(u))).collect();
    while let Some(x) = stack.pop() {
        if x == cut || g.node(x).op.is_leaf() || std::mem::replace(&mut kept[x.index()], true) {
            continue;
        }
        stack.extend(g.node(x).args.iter().copied());
    }
    group.iter().copied().filter(|x| kept[x.index()]).collect()
}

/// A partition of `g` into one kernel per group of `groups`, in order: a node in several
/// groups is computed by each kernel whose group holds it (an output among them is stored by
/// the first), so every group must hold all it is computed from ([`components`] or
/// [`output_cones`], or unions of them) but the `stored` nodes ([`cut_points`]): the first
/// kernel that computes one of those also stores it to an f32 workspace, and a later kernel
/// whose group does not hold it reads it from there. The last kernel also stores the outputs
/// that are leaves. Nodes in no group are computed by no kernel (a partition of part of the
/// graph, to try whether a group schedules alone). A group marked `true` is computed
/// transposed ([`super::columns`]): its reductions down a column run along the block's rows,
/// whatever the other kernels do.
///
/// This is the launch of a graph whose outputs cannot share one block's tiles (a sum down
/// the columns of the tensor whose rows another output normalizes), or whose one output needs
/// a value stored between two kernels (a sum down the columns of a softmax along the
/// rows). `None` for a graph with a split, or with a computed right operand of a product
/// that is not `stored` (the tile programs read a right operand only from memory; [`partition`]
/// orders such kernels), or with more groups than a [`Part`] counts.
pub fn grouped(
    g: &ValidGraph,
    groups: &[(Vec<NodeId>, bool)],
    stored: &[NodeId],
) -> Option<Result<Partition, PartitionError>> {
    // A product's computed right operand is read from a workspace an earlier kernel stored
    // (the tile programs take a right operand only from memory), or there is no such launch.
    let live = g.live();
    if g.has_split() || right_operand_roots(g, &live).iter().any(|b| !stored.contains(b)) || groups.len() > 200 {
        return None;
    }
    let mut part = vec![Part::Unused; g.nodes.len()];
    for id in g.ids().filter(|&id| g.node(id).op.is_leaf()) {
        part[id.index()] = Part::Leaf;
    }
    // Each node belongs to the first kernel that computes it; later ones compute it again.
    let mut again = vec![vec![false; g.nodes.len()]; groups.len()];
    for (k, (group, _)) in groups.iter().enumerate() {
        for id in group {
            match part[id.index()] {
                Part::Group(_) => again[k][id.index()] = true,
                _ => part[id.index()] = Part::Group(k as u8),
            }
        }
    }
    let mut cuts: Vec<NodeId> = stored.to_vec();
    cuts.sort();
    cuts.dedup();
    let workspaces: Vec<Workspace> = cuts
        .iter()
        .enumerate()
        .map(|(w, &c)| Workspace {
            name: format!("ws{w}"),
            shape: g.shape(c).to_vec(),
            node: Some(c),
            ty: WorkspaceType::F32,
            storage: None,
        })
        .collect();
    let mut kernels = Vec::with_capacity(groups.len());
    for (k, &(_, transposed)) in groups.iter().enumerate() {
        let mut kg = match extract(g, &part, &again[k], k, (Part::Group(k as u8), k + 1 == groups.len()), &workspaces) {
            Ok(kg) => kg,
            Err(e) => return Some(Err(e)),
        };
        if transposed {
            // The rewrite keeps the inputs and outputs in order, so the bindings stand.
            let (t, origin) = super::columns::transpose_columns_traced(&kg.graph)?;
            kg.origin = origin.iter().map(|o| kg.origin[o.index()]).collect();
            kg.graph = t;
        }
        kernels.push(kg);
    }
    Some(Ok(Partition {
        same_elements: super::rows::same_elements(g),
        bounded_exps: super::lower::stabilize::bounded_exps(g),
        recomputed: (0..part.len()).map(|i| again.iter().any(|a| a[i])).collect(),
        part,
        combine_roots: Vec::new(),
        kernels,
        workspaces,
    }))
}

/// Where a kernel's part falls in launch order (leaves and unused nodes before all).
fn order(p: Part) -> u8 {
    match p {
        Part::Leaf | Part::Unused => 0,
        Part::Pre => 1,
        // A grouped partition has no rows kernels.
        Part::Rows(l) | Part::Group(l) => 2 + l,
        Part::Split => 250,
        Part::Combine => 251,
    }
}

/// The nodes of the first kernel (by [`NodeId::index`]): each live product's right operand
/// that is computed, seen through views (a transpose), with everything it is computed from.
/// One is left in place (to the fallback) when that would store a graph output early, or
/// cross a split (its parts' count is chosen with the split kernel's grid).
pub(super) fn computed_right_operands(g: &ValidGraph, live: &[bool]) -> Vec<bool> {
    let mut pre = vec![false; g.nodes.len()];
    for b in right_operand_roots(g, live) {
        // The operand and every non-leaf node it depends on.
        let nodes = cone(g, b);
        let crosses_split = nodes.iter().any(|&x| matches!(g.node(x).op, Op::Split(_)));
        let stores_output = g.outputs.iter().any(|o| nodes.contains(&o.node));
        if crosses_split || stores_output {
            continue;
        }
        for x in nodes {
            pre[x.index()] = true;
        }
    }
    pre
}

/// Each live product's right operand that is computed, seen through views (a transpose).
fn right_operand_roots(g: &ValidGraph, live: &[bool]) -> Vec<NodeId> {
    let mut roots = Vec::new();
    for id in g.ids() {
        if !live[id.index()] || g.node(id).op != Op::MatMul {
            continue;
        }
        let mut b = g.node(id).args[1];
        while g.node(b).op == Op::Transpose {
            b = g.node(b).args[0];
        }
        if !g.node(b).op.is_leaf() && !roots.contains(&b) {
            roots.push(b);
        }
    }
    roots
}

/// The type a first kernel stores value `id` in: that in which the tensor cores take it
/// ([`Graph::rounded_operand_type`]) when every later use is the right operand of a product of
/// more than one column, seen through transposes, and they agree on a 16-bit type; f32 for a
/// vector (its products are f32 dot products) or a value anything else reads.
fn operand_type(g: &Graph, part: &[Part], users: &[Vec<NodeId>], id: NodeId) -> WorkspaceType {
    let mut found = None;
    let mut stack: Vec<(NodeId, NodeId)> =
        users[id.index()].iter().filter(|u| part[u.index()] != Part::Pre).map(|&u| (id, u)).collect();
    while let Some((operand, user)) = stack.pop() {
        let n = g.node(user);
        let t = match n.op {
            Op::Transpose => {
                stack.extend(users[user.index()].iter().map(|&u| (user, u)));
                continue;
            }
            Op::MatMul if n.args[0] != operand && n.shape.last() != Some(&Dim::One) => g.rounded_operand_type(user),
            _ => None,
        };
        match t {
            Some(t @ (DType::F16 | DType::BF16)) if found.is_none_or(|f| f == t) => found = Some(t),
            _ => return WorkspaceType::F32,
        }
    }
    match found {
        Some(DType::F16) => WorkspaceType::F16,
        Some(DType::BF16) => WorkspaceType::BF16,
        _ => WorkspaceType::F32,
    }
}

/// Builds the graph of kernel `k` of a partition, which computes the nodes of part `kernel`
/// (and the nodes of earlier parts marked `again`): its nodes, the leaves they read, the
/// workspaces of earlier kernels it reads as inputs, and as outputs the workspaces it writes
/// and the graph outputs it computes. The `last` kernel also stores the outputs that are
/// leaves (an output the algebra reduced to an input, `transpose(transpose(x))`), which no
/// part computes.
pub(super) fn extract(
    g: &Graph,
    part: &[Part],
    again: &[bool],
    k: usize,
    (kernel, last): (Part, bool),
    workspaces: &[Workspace],
) -> Result<KernelGraph, PartitionError> {
    let users = g.users();
    let ws_of: BTreeMap<NodeId, usize> =
        workspaces.iter().enumerate().filter_map(|(w, ws)| Some((ws.node?, w))).collect();
    let mut sub = Graph::new(format!("{}_{k}", g.name), g.dims.clone());
    let mut map: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    let computes = |id: NodeId| part[id.index()] == kernel || again[id.index()];
    let stores = |id: NodeId| part[id.index()] == kernel || (last && part[id.index()] == Part::Leaf);
    let stored_leaf = |id: NodeId| last && part[id.index()] == Part::Leaf && g.outputs.iter().any(|o| o.node == id);
    let needs = |id: NodeId| users[id.index()].iter().any(|&u| computes(u)) || stored_leaf(id);
    let workspace_decl = |w: usize, shape: Vec<Dim>| {
        TensorDecl::dense(workspaces[w].name.clone(), workspaces[w].ty.dtype().unwrap_or(DType::F32), shape)
    };
    for id in g.ids() {
        let n = g.node(id);
        match (n.op, part[id.index()]) {
            (Op::Input(i), Part::Leaf) if needs(id) => {
                map.insert(id, sub.add_input(g.inputs[i as usize].decl.clone()));
                inputs.push(Binding::Input(i));
            }
            (Op::Const(c), Part::Leaf) if needs(id) => {
                map.insert(id, sub.constant(c));
            }
            _ if computes(id) => {
                // Operands come before their users, and every operand of a kernel's node is a
                // leaf, a node of the same kernel or a workspace of an earlier one; a group
                // that lacks one (a stored value no earlier group computes) is refused.
                let args = n.args.iter().map(|a| map.get(a).copied()).collect::<Option<Vec<NodeId>>>();
                let Some(args) = args else {
                    let message = "an operand that neither this kernel nor an earlier one computes".to_string();
                    return Err(PartitionError::Shape { kernel: k, node: id.0, message });
                };
                let new = sub.add(n.op, &args).map_err(|e| PartitionError::Shape {
                    kernel: k,
                    node: id.0,
                    message: e.message(&g.dims),
                })?;
                map.insert(id, new);
            }
            (_, p) if order(p) > 0 && order(p) < order(kernel) && needs(id) => {
                let Some(&w) = ws_of.get(&id) else {
                    let message = "an earlier kernel's value that no workspace holds".to_string();
                    return Err(PartitionError::Shape { kernel: k, node: id.0, message });
                };
                map.insert(id, sub.add_input(workspace_decl(w, n.shape.clone())));
                inputs.push(Binding::Workspace(w as u32));
            }
            _ => {}
        }
    }
    for (&id, &w) in &ws_of {
        if part[id.index()] == kernel {
            sub.add_output(workspace_decl(w, g.shape(id).to_vec()), map[&id]);
            outputs.push(Binding::Workspace(w as u32));
        }
    }
    for (i, o) in g.outputs.iter().enumerate() {
        if stores(o.node) {
            sub.add_output(o.decl.clone(), map[&o.node]);
            outputs.push(Binding::Output(i as u32));
        }
    }
    let mut origin = vec![NodeId(0); sub.nodes.len()];
    for (&from, &to) in &map {
        origin[to.index()] = from;
    }
    let graph = validate(sub).map_err(|error| PartitionError::InvalidKernel { kernel: k, error })?;
    let declared = declared_sources(g);
    let input_sources = inputs
        .iter()
        .map(|b| match *b {
            Binding::Input(i) => declared[i as usize].clone(),
            Binding::Workspace(w) => workspaces[w as usize]
                .node
                .map(|n| g.float_sources(n, &|i| declared[i].clone()).into_iter().collect())
                .unwrap_or_default(),
            Binding::Output(_) => Vec::new(),
        })
        .collect();
    Ok(KernelGraph { graph, inputs, outputs, origin, input_sources })
}

/// Each input's own float type (none for an index tensor), as [`KernelGraph::input_sources`]
/// lists them.
fn declared_sources(g: &Graph) -> Vec<Vec<DType>> {
    g.inputs.iter().map(|i| if i.decl.dtype.is_float() { vec![i.decl.dtype] } else { Vec::new() }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::check_source;

    fn graph(body: &str, outputs: &str) -> ValidGraph {
        let text = format!(
            "kernels:\n  - name: t\n    dims: {{ s: 40, k: 32, n: 24 }}\n    \
             inputs: {{ x: \"f16[s, k]\", w: \"f16[k, n]\" }}\n    outputs: {outputs}\n    body: |\n      {body}\n"
        );
        check_source(text.as_bytes()).expect("checks").kernels.remove(0).1
    }

    #[test]
    fn a_computed_right_operand_is_stored_by_a_kernel_of_its_own_first() {
        let g = graph("y = matmul(x, sum(w, axis=-1))", "{ y: \"f32[s, 1]\" }");
        let p = partition(&g).expect("partitions");
        assert_eq!(p.kernels.len(), 2);
        assert_eq!(p.workspaces.len(), 1);
        let sum = p.workspaces[0].node.expect("a node's workspace");
        assert_eq!(
            (p.part[sum.index()], g.shape(sum)),
            (Part::Pre, &[Dim::Var(g.dims.find("k").unwrap()), Dim::One][..])
        );
        assert_eq!(
            (&p.kernels[0].inputs[..], &p.kernels[0].outputs[..]),
            (&[Binding::Input(1)][..], &[Binding::Workspace(0)][..])
        );
        assert_eq!(
            (&p.kernels[1].inputs[..], &p.kernels[1].outputs[..]),
            (&[Binding::Input(0), Binding::Workspace(0)][..], &[Binding::Output(0)][..])
        );
        // A right operand that is a view of an input stays where it is.
        let g = graph("y = matmul(x, w)", "{ y: \"f32[s, n]\" }");
        assert_eq!(partition(&g).expect("partitions").kernels.len(), 1);
        // So does one that is also an output: storing it early would split the outputs.
        let g = graph("r = sum(w, axis=-1)\n      y = matmul(x, r)", "{ y: \"f32[s, 1]\", r: \"f32[k, 1]\" }");
        let p = partition(&g).expect("partitions");
        assert_eq!(p.kernels.len(), 1);
        assert!(p.part.iter().all(|&x| x != Part::Pre));
    }

    /// The workspaces of a declaration with inputs `x`, `w` and `g` of the given types.
    fn workspace_types(types: [&str; 3], body: &str, outputs: &str) -> Vec<WorkspaceType> {
        let [x, w, g] = types;
        let text = format!(
            "kernels:\n  - name: t\n    dims: {{ s: 40, k: 32, n: 24 }}\n    inputs: {{ x: \"{x}[s, k]\", \
             w: \"{w}[k, n]\", g: \"{g}[k, n]\" }}\n    outputs: {outputs}\n    body: |\n      {body}\n"
        );
        let g = check_source(text.as_bytes()).expect("checks").kernels.remove(0).1;
        partition(&g).expect("partitions").workspaces.iter().map(|w| w.ty).collect()
    }

    #[test]
    fn a_computed_right_operand_is_stored_in_the_type_the_tensor_cores_take_it_in() {
        use WorkspaceType::{BF16, F16, F32};
        let y = "{ y: \"f32[s, n]\" }";
        // Of the left operand's type, when its sources share it.
        assert_eq!(workspace_types(["f16"; 3], "y = matmul(x, w * g)", y), [F16]);
        assert_eq!(workspace_types(["bf16"; 3], "y = matmul(x, silu(w + g))", y), [BF16]);
        // Seen through a transpose.
        let t = "y = matmul(x, transpose(transpose(w + g)))";
        assert_eq!(workspace_types(["f16"; 3], t, y), [F16]);
        // A computed left operand is packed to the right one's type.
        assert_eq!(workspace_types(["f32", "bf16", "bf16"], "y = matmul(exp(x), w * g)", y), [BF16]);
        // Sources of two types, or of another type than the left input: f32, and the product
        // is the fallback's.
        assert_eq!(workspace_types(["f16", "f16", "bf16"], "y = matmul(x, w * g)", y), [F32]);
        assert_eq!(workspace_types(["bf16", "f16", "f16"], "y = matmul(x, w * g)", y), [F32]);
        assert_eq!(workspace_types(["f16", "f32", "f32"], "y = matmul(x, w * g)", y), [F32]);
        // A vector is multiplied in f32; a value another op also reads stays exact for it.
        let v = "{ y: \"f32[s, 1]\" }";
        assert_eq!(workspace_types(["f16"; 3], "y = matmul(x, sum(w * g, axis=-1))", v), [F32]);
        let both = "u = w * g\n      y = matmul(x, u) + matmul(x, exp(u))";
        assert_eq!(workspace_types(["f16"; 3], both, y), [F16, F16]);
        let vector = "u = w * g\n      y = matmul(x, u) + matmul(x, sum(u, axis=-1))";
        assert_eq!(workspace_types(["f16"; 3], vector, y), [F16, F32]);
        let other = "u = w * g\n      y = matmul(x, u) + sum(u, axis=0)";
        assert_eq!(workspace_types(["f16"; 3], other, y), [F32]);
    }

    #[test]
    fn outputs_that_share_only_inputs_fall_in_separate_groups() {
        let outs = "{ a: \"f32[s, k]\", b: \"f32[s, 1]\", c: \"f32[1, k]\" }";
        let g = graph("u = exp(x)\n      a = u * 2\n      b = sum(u, axis=-1)\n      c = max(x, axis=0) + transpose(sum(w, axis=1))", outs);
        let groups = components(&g);
        let names: Vec<Vec<String>> = groups
            .iter()
            .map(|grp| g.outputs.iter().filter(|o| grp.contains(&o.node)).map(|o| o.decl.name.clone()).collect())
            .collect();
        // `a` and `b` share `u`; `c` reads only an input they read, and another.
        assert_eq!(names, [vec!["a".to_string(), "b".to_string()], vec!["c".to_string()]]);
        let p = grouped(&g, &[(groups[1].clone(), false), (groups[0].clone(), false)], &[])
            .expect("no split")
            .expect("partitions");
        let stored: Vec<Vec<Binding>> = p.kernels.iter().map(|k| k.outputs.clone()).collect();
        assert_eq!(stored, [vec![Binding::Output(2)], vec![Binding::Output(0), Binding::Output(1)]]);
        assert!(p.workspaces.is_empty());
        // A computed right operand orders its own kernels.
        let pre = graph("a = matmul(x, exp(w))", "{ a: \"f32[s, n]\" }");
        assert!(grouped(&pre, &[(components(&pre)[0].clone(), false)], &[]).is_none());
    }

    #[test]
    fn fallback_stages_bind_only_the_launchs_own_tensors() {
        use crate::plan::{append_fallback, fallback, PlanError};
        let arch = crate::arch::SM90;
        // The product kernel reads the computed operand from a tile kernel's workspace, which
        // a stage would read as extended-exponent values.
        let g = graph("y = matmul(x, sum(w, axis=-1))", "{ y: \"f32[s, 1]\" }");
        let p = partition(&g).expect("partitions");
        let mut launch = fallback(&g, "t", &arch).expect("fallback");
        let before = launch.clone();
        assert_eq!(append_fallback(&mut launch, &p.kernels[1], "t", &arch), Err(PlanError::StagesOnTileWorkspaces));
        assert_eq!(launch, before, "a refused part leaves the launch as it was");
        // A grouped kernel binds only inputs and outputs: its stages write what it binds.
        let g = graph("a = exp(x)\n      b = sum(matmul(x, w), axis=-1)", "{ a: \"f32[s, k]\", b: \"f32[s, 1]\" }");
        let groups: Vec<(Vec<NodeId>, bool)> = components(&g).into_iter().map(|c| (c, false)).collect();
        let p = grouped(&g, &groups, &[]).expect("no split").expect("partitions");
        let mut launch = fallback(&g, "t", &arch).expect("fallback");
        let (n, base) = (launch.kernels.len(), launch.workspaces.len() as u32);
        append_fallback(&mut launch, &p.kernels[1], "t", &arch).expect("appends");
        let written: Vec<Binding> = launch.kernels[n..]
            .iter()
            .flat_map(|k| k.params().iter().filter(|p| p.output).map(|p| p.binding))
            .collect();
        // The product's stage writes a workspace of its own, numbered after the launch's.
        let (own, tensors): (Vec<Binding>, Vec<Binding>) =
            written.into_iter().partition(|b| matches!(b, Binding::Workspace(_)));
        assert_eq!(tensors, p.kernels[1].outputs);
        assert_eq!(own, [Binding::Workspace(base)]);
        assert_eq!(launch.workspaces.len() as u32, base + 1);
        assert_eq!(launch.workspaces[base as usize].name, format!("ws{base}"));
        assert_eq!(
            launch.kernels.last().map(|k| k.symbol().to_string()),
            Some(format!("t_{}", launch.kernels.len() - 1))
        );
    }

    #[test]
    fn kernels_of_overlapping_groups_recompute_what_they_share() {
        let outs = "{ a: \"f32[s, k]\", b: \"f32[s, 1]\", c: \"f32[1, k]\" }";
        let g = graph("u = exp(x)\n      a = u * 2\n      b = sum(u, axis=-1)\n      c = sum(u, axis=0) + transpose(sum(w, axis=1))", outs);
        let cones = output_cones(&g, &components(&g)[0]);
        let out_of = |cone: &Vec<NodeId>| -> Vec<String> {
            g.outputs.iter().filter(|o| cone.contains(&o.node)).map(|o| o.decl.name.clone()).collect()
        };
        // Each output's cone holds `u`; none holds another's output.
        assert_eq!(cones.iter().map(out_of).collect::<Vec<_>>(), [["a"], ["b"], ["c"]]);
        let u = g.ids().find(|&id| g.node(id).op == Op::Unary(crate::graph::UnaryOp::Exp)).expect("an exp");
        assert!(cones.iter().all(|c| c.contains(&u)));
        // `a`'s cone holds the value `b` sums, so `b` and `a` in one group is `b`'s cone and `a`.
        let ab: Vec<NodeId> = {
            let mut v: Vec<NodeId> = cones[0].iter().chain(&cones[1]).copied().collect();
            v.sort();
            v.dedup();
            v
        };
        let p = grouped(&g, &[(ab, false), (cones[2].clone(), false)], &[]).expect("no split").expect("partitions");
        let stored: Vec<Vec<Binding>> = p.kernels.iter().map(|k| k.outputs.clone()).collect();
        assert_eq!(stored, [vec![Binding::Output(0), Binding::Output(1)], vec![Binding::Output(2)]]);
        // Both kernels compute the exp from `x`; the second computes it again.
        for k in &p.kernels {
            assert_eq!(k.inputs[0], Binding::Input(0));
            assert!(k.graph.nodes.iter().any(|n| n.op == Op::Unary(crate::graph::UnaryOp::Exp)));
        }
        assert_eq!((p.part[u.index()], p.recomputed[u.index()]), (Part::Group(0), true));
        assert!(p.workspaces.is_empty());
        // An output inside another's cone has a cone of its own, placed first: its kernel
        // stores it, and the larger cone's kernel only computes it again.
        let nested = graph(
            "u = exp(x)\n      a = u * 2\n      b = sum(a, axis=-1) + sum(matmul(x, w), axis=-1)",
            "{ a: \"f32[s, k]\", b: \"f32[s, 1]\" }",
        );
        let cones = output_cones(&nested, &components(&nested)[0]);
        assert_eq!(cones.len(), 2);
        assert!(cones[0].contains(&nested.outputs[0].node) && !cones[0].contains(&nested.outputs[1].node));
        assert!(cones[1].contains(&nested.outputs[0].node) && cones[1].contains(&nested.outputs[1].node));
        let p = grouped(&nested, &[(cones[0].clone(), false), (cones[1].clone(), false)], &[])
            .expect("no split")
            .expect("partitions");
        let stored: Vec<Vec<Binding>> = p.kernels.iter().map(|k| k.outputs.clone()).collect();
        assert_eq!(stored, [vec![Binding::Output(0)], vec![Binding::Output(1)]]);
    }

    #[test]
    fn a_stored_value_is_written_by_the_first_kernel_and_read_by_the_next() {
        use crate::graph::BinaryOp;
        let g = graph(
            "u = exp(x)\n      a = u / sum(u, axis=-1)\n      b = sum(a, axis=0) + transpose(sum(w, axis=1))",
            "{ b: \"f32[1, k]\" }",
        );
        let group = components(&g)[0].clone();
        let a = g.ids().find(|&id| g.node(id).op == Op::Binary(BinaryOp::Div)).expect("a quotient");
        // Every computed value another reads may be stored; the sink may not.
        let points = cut_points(&g, &group);
        assert!(points.contains(&a) && !points.contains(&g.outputs[0].node));
        // Past the quotient, its column sum is left, and what `w` adds to it.
        let rest = beyond_cut(&g, &group, a);
        assert!(rest.contains(&g.outputs[0].node) && !rest.contains(&a) && rest.iter().all(|&x| x > a));
        let p = grouped(&g, &[(cone(&g, a), false), (rest, false)], &[a]).expect("no split").expect("partitions");
        assert_eq!(p.workspaces.len(), 1);
        assert_eq!((p.workspaces[0].node, p.workspaces[0].ty), (Some(a), WorkspaceType::F32));
        assert_eq!(p.workspaces[0].shape, g.shape(a));
        assert_eq!(p.kernels[0].outputs, [Binding::Workspace(0)]);
        assert_eq!(p.kernels[1].inputs, [Binding::Input(1), Binding::Workspace(0)]);
        assert_eq!(p.kernels[1].outputs, [Binding::Output(0)]);
        // The second kernel reads the quotient; it computes no exp of its own.
        assert!(!p.kernels[1].graph.nodes.iter().any(|n| n.op == Op::Unary(crate::graph::UnaryOp::Exp)));
        // Without the stored value, the second group lacks what it is computed from; so it
        // does when no earlier group computes the value.
        let rest = beyond_cut(&g, &group, a);
        assert!(matches!(grouped(&g, &[(cone(&g, a), false), (rest.clone(), false)], &[]), Some(Err(_))));
        assert!(matches!(grouped(&g, &[(rest, false)], &[a]), Some(Err(PartitionError::Shape { .. }))));
    }
}
