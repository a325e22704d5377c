//! Splitting a graph into the kernels of one launch (paper Fig. 5b).
//!
//! A graph without `split` is one kernel. A Split-K graph becomes a split kernel and a combine
//! kernel: the combine holds every reduction over a split-count axis and everything downstream
//! of them; the tensors crossing the boundary become f32 workspace buffers.

use std::collections::BTreeMap;

use super::program::Binding;
use crate::graph::{validate, DType, Dim, DimKind, Graph, NodeId, Op, TensorDecl, ValidGraph};

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

/// A workspace tensor: f32, with a shape over the launch's dims.
#[derive(Clone, PartialEq, Debug)]
pub struct Workspace {
    /// Printed name.
    pub name: String,
    /// Shape.
    pub shape: Vec<Dim>,
}

/// The kernels of a launch, in order, and the workspaces between them.
#[derive(Clone, Debug)]
pub struct Partition {
    /// Kernels in launch order.
    pub kernels: Vec<KernelGraph>,
    /// Workspaces.
    pub workspaces: Vec<Workspace>,
}

fn is_split_reduction(g: &Graph, id: NodeId) -> bool {
    let n = g.node(id);
    match n.op {
        Op::Reduce(_, axis) => {
            matches!(g.shape(n.args[0])[axis as usize], Dim::Var(v) if matches!(g.dims.get(v).kind, DimKind::SplitCount { .. }))
        }
        _ => false,
    }
}

/// Partitions a (validated, concrete) graph.
pub fn partition(g: &ValidGraph) -> Result<Partition, String> {
    let live = g.live();
    let mut kernel_of = vec![0u8; g.nodes.len()];
    let mut any_combine = false;
    for id in g.ids() {
        if !live[id.index()] || g.node(id).op.is_leaf() {
            continue;
        }
        let from_args = g.node(id).args.iter().any(|a| kernel_of[a.index()] == 1);
        if from_args || is_split_reduction(g, id) {
            kernel_of[id.index()] = 1;
            any_combine = true;
        }
    }
    if !any_combine {
        if g.has_split() {
            return Err("a split whose parts are never combined".into());
        }
        let inputs = (0..g.inputs.len() as u32).map(Binding::Input).collect();
        let outputs = (0..g.outputs.len() as u32).map(Binding::Output).collect();
        return Ok(Partition {
            kernels: vec![KernelGraph { graph: g.clone(), inputs, outputs }],
            workspaces: Vec::new(),
        });
    }
    // Workspace tensors: split-kernel values read by the combine kernel.
    let users = g.users();
    let mut workspaces: Vec<Workspace> = Vec::new();
    let mut ws_of: BTreeMap<NodeId, u32> = BTreeMap::new();
    for id in g.ids() {
        let n = g.node(id);
        if !live[id.index()] || kernel_of[id.index()] != 0 || n.op.is_leaf() {
            continue;
        }
        if users[id.index()].iter().any(|u| kernel_of[u.index()] == 1) {
            ws_of.insert(id, workspaces.len() as u32);
            workspaces.push(Workspace { name: format!("ws{}", workspaces.len()), shape: n.shape.clone() });
        }
    }
    for o in &g.outputs {
        if kernel_of[o.node.index()] == 0 {
            return Err("an output computed before the Split-K combine".into());
        }
    }
    let split = extract(g, &kernel_of, 0, &ws_of, &workspaces)?;
    let combine = extract(g, &kernel_of, 1, &ws_of, &workspaces)?;
    Ok(Partition { kernels: vec![split, combine], workspaces })
}

/// Builds the graph of kernel `k`: its nodes, the leaves they read, the workspaces it reads as
/// inputs (combine) or writes as outputs (split).
fn extract(
    g: &Graph,
    kernel_of: &[u8],
    k: u8,
    ws_of: &BTreeMap<NodeId, u32>,
    workspaces: &[Workspace],
) -> Result<KernelGraph, String> {
    let live = g.live();
    let users = g.users();
    let mut sub = Graph::new(format!("{}_{k}", g.name), g.dims.clone());
    let mut map: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    let needs = |id: NodeId| -> bool {
        users[id.index()].iter().any(|u| live[u.index()] && kernel_of[u.index()] == k && !g.node(*u).op.is_leaf())
    };
    for id in g.ids() {
        let n = g.node(id);
        if !live[id.index()] {
            continue;
        }
        match n.op {
            Op::Input(i) if needs(id) => {
                let decl = g.inputs[i as usize].decl.clone();
                let new = sub.add_input(decl);
                map.insert(id, new);
                inputs.push(Binding::Input(i));
            }
            Op::Const(c) if needs(id) => {
                map.insert(id, sub.constant(c));
            }
            Op::Input(_) | Op::Const(_) => {}
            _ if kernel_of[id.index()] == k => {
                let args: Vec<NodeId> = n
                    .args
                    .iter()
                    .map(|a| match map.get(a) {
                        Some(x) => Ok(*x),
                        None => Err(format!("node {} reads a value the kernel does not have", id.0)),
                    })
                    .collect::<Result<_, _>>()?;
                let new = sub.add(n.op, &args).map_err(|e| e.message(&g.dims))?;
                map.insert(id, new);
            }
            _ if k == 1 && ws_of.contains_key(&id) => {
                let w = ws_of[&id];
                let decl =
                    TensorDecl { name: workspaces[w as usize].name.clone(), dtype: DType::F32, shape: n.shape.clone() };
                let new = sub.add_input(decl);
                map.insert(id, new);
                inputs.push(Binding::Workspace(w));
            }
            _ => {}
        }
    }
    if k == 0 {
        for (&id, &w) in ws_of {
            let decl = TensorDecl {
                name: workspaces[w as usize].name.clone(),
                dtype: DType::F32,
                shape: g.shape(id).to_vec(),
            };
            sub.add_output(decl, map[&id]);
            outputs.push(Binding::Workspace(w));
        }
    } else {
        for (i, o) in g.outputs.iter().enumerate() {
            sub.add_output(o.decl.clone(), map[&o.node]);
            outputs.push(Binding::Output(i as u32));
        }
    }
    let graph = validate(sub).map_err(|e| format!("kernel {k} of the partition is invalid: {e}"))?;
    Ok(KernelGraph { graph, inputs, outputs })
}
