//! Splitting a graph into the kernels of one launch (paper Fig. 5b).
//!
//! A graph without `split` is one kernel. A Split-K graph becomes a split kernel and a combine
//! kernel: the combine starts at the reductions over a split-count axis (`sum(.., axis=0)` of
//! a `[s_K, ..]` tensor, in the usual case) and holds everything downstream of them; the split
//! kernel holds every other op. Tensors of the split kernel read by the combine kernel become
//! f32 workspace buffers: what the split kernel writes to global memory and the combine kernel
//! reads.

use std::collections::BTreeMap;

use super::program::Binding;
use crate::graph::{validate, DType, Dim, DimKind, Graph, NodeId, Op, TensorDecl, ValidGraph, ValidationError};

/// Which kernel of a launch computes a node.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Part {
    /// An input or constant: read by whichever kernel uses it.
    Leaf,
    /// The first kernel: the split kernel, or the whole graph when it has no split.
    Split,
    /// The combine kernel.
    Combine,
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
}

/// What a workspace's elements are.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum WorkspaceType {
    /// f32 (between tile kernels).
    F32,
    /// Extended-exponent floats, an f32 mantissa and an i32 exponent (between stage kernels).
    Extended,
}

impl WorkspaceType {
    /// Bytes per element.
    pub fn bytes(self) -> u32 {
        match self {
            WorkspaceType::F32 => 4,
            WorkspaceType::Extended => 8,
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
    let mut part = vec![Part::Unused; g.nodes.len()];
    let mut combine_roots = Vec::new();
    for id in g.ids() {
        if g.node(id).op.is_leaf() {
            part[id.index()] = Part::Leaf;
        } else if !live[id.index()] {
            continue;
        } else if is_combine(g, id) {
            part[id.index()] = Part::Combine;
            combine_roots.push(id);
        } else if g.node(id).args.iter().any(|a| part[a.index()] == Part::Combine) {
            part[id.index()] = Part::Combine;
        } else {
            part[id.index()] = Part::Split;
        }
    }
    if combine_roots.is_empty() {
        if g.has_split() {
            return Err(PartitionError::UncombinedSplit);
        }
        let inputs = (0..g.inputs.len() as u32).map(Binding::Input).collect();
        let outputs = (0..g.outputs.len() as u32).map(Binding::Output).collect();
        return Ok(Partition {
            part,
            combine_roots,
            kernels: vec![KernelGraph { graph: g.clone(), inputs, outputs }],
            workspaces: Vec::new(),
        });
    }
    // Workspace tensors: split-kernel values read by the combine kernel.
    let users = g.users();
    let mut workspaces: Vec<Workspace> = Vec::new();
    for id in g.ids() {
        if part[id.index()] == Part::Split && users[id.index()].iter().any(|u| part[u.index()] == Part::Combine) {
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
            workspaces.push(Workspace {
                name,
                shape: g.shape(id).to_vec(),
                node: Some(id),
                ty: WorkspaceType::F32,
                storage: None,
            });
        }
    }
    for o in &g.outputs {
        if part[o.node.index()] != Part::Combine {
            return Err(PartitionError::OutputBeforeCombine(o.decl.name.clone()));
        }
    }
    let split = extract(g, &part, Part::Split, &workspaces)?;
    let combine = extract(g, &part, Part::Combine, &workspaces)?;
    Ok(Partition { part, combine_roots, kernels: vec![split, combine], workspaces })
}

/// Builds the graph of one kernel: its nodes, the leaves they read, the workspaces it reads as
/// inputs (combine) or writes as outputs (split).
fn extract(g: &Graph, part: &[Part], kernel: Part, workspaces: &[Workspace]) -> Result<KernelGraph, PartitionError> {
    let k = usize::from(kernel == Part::Combine);
    let users = g.users();
    let ws_of: BTreeMap<NodeId, usize> =
        workspaces.iter().enumerate().filter_map(|(w, ws)| Some((ws.node?, w))).collect();
    let mut sub = Graph::new(format!("{}_{k}", g.name), g.dims.clone());
    let mut map: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    let needs = |id: NodeId| users[id.index()].iter().any(|u| part[u.index()] == kernel);
    let workspace_decl = |w: usize, shape: Vec<Dim>| TensorDecl::dense(workspaces[w].name.clone(), DType::F32, shape);
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
            (_, p) if p == kernel => {
                // Operands come before their users, and every operand of a kernel's node is a
                // leaf, a node of the same kernel or (in the combine) a workspace.
                let args: Vec<NodeId> = n.args.iter().map(|a| map[a]).collect();
                let new = sub.add(n.op, &args).map_err(|e| PartitionError::Shape {
                    kernel: k,
                    node: id.0,
                    message: e.message(&g.dims),
                })?;
                map.insert(id, new);
            }
            (_, Part::Split) if kernel == Part::Combine && ws_of.contains_key(&id) => {
                let w = ws_of[&id];
                map.insert(id, sub.add_input(workspace_decl(w, n.shape.clone())));
                inputs.push(Binding::Workspace(w as u32));
            }
            _ => {}
        }
    }
    if kernel == Part::Split {
        for (&id, &w) in &ws_of {
            sub.add_output(workspace_decl(w, g.shape(id).to_vec()), map[&id]);
            outputs.push(Binding::Workspace(w as u32));
        }
    } else {
        for (i, o) in g.outputs.iter().enumerate() {
            sub.add_output(o.decl.clone(), map[&o.node]);
            outputs.push(Binding::Output(i as u32));
        }
    }
    let graph = validate(sub).map_err(|error| PartitionError::InvalidKernel { kernel: k, error })?;
    Ok(KernelGraph { graph, inputs, outputs })
}
