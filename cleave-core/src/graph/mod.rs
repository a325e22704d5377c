//! The graph IR: an arena of ops with typed handles.
//!
//! A [`Graph`] is a DAG stored in topological order: every node's operands have smaller
//! handles. Nodes are immutable once pushed, analyses live in side tables indexed by
//! [`NodeId`], and a graph becomes usable by later stages only through [`validate`], which
//! returns the [`ValidGraph`] proof token.

use std::collections::BTreeSet;

mod dim;
mod display;
mod dtype;
pub mod layout;
mod op;
mod shape;
mod valid;

pub use dim::{Bindings, Dim, DimInfo, DimKind, DimTable, DimVar, IndexRef, PerRequest, PerRequestKind, Shape};
pub(crate) use display::format_const;
pub use dtype::DType;
pub use layout::{Layout, StoreAxis};
pub use op::{erf, BinaryOp, Mask, Op, ReduceOp, UnaryOp, MAX_DIAGONAL};
pub use shape::{broadcast, infer, normalize_axis, ShapeError};
pub use valid::{validate, ValidGraph, ValidationError};

/// Handle of a node in a [`Graph`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct NodeId(pub u32);

impl NodeId {
    /// The arena index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One op applied to earlier nodes.
#[derive(Clone, PartialEq, Debug)]
pub struct Node {
    /// What the node computes.
    pub op: Op,
    /// Operands, all with smaller handles.
    pub args: Vec<NodeId>,
    /// The inferred shape of the result.
    pub shape: Shape,
}

/// A named, typed tensor at the boundary of a graph.
#[derive(Clone, PartialEq, Debug)]
pub struct TensorDecl {
    /// The name the user declared (a Rust identifier).
    pub name: String,
    /// Storage type.
    pub dtype: DType,
    /// Declared shape: the logical tensor the body computes with.
    pub shape: Shape,
    /// How the buffer lays the logical tensor out, when not dense row-major over `shape`.
    pub layout: Option<Layout>,
}

impl TensorDecl {
    /// A dense tensor: its buffer is its shape, row-major.
    pub fn dense(name: impl Into<String>, dtype: DType, shape: Shape) -> TensorDecl {
        TensorDecl { name: name.into(), dtype, shape, layout: None }
    }

    /// True for an index tensor (`i32`): it addresses other tensors and is never computed with.
    pub fn is_index(&self) -> bool {
        !self.dtype.is_float()
    }
}

/// A graph input: its declaration, its node, and optionally the user's override of which of its
/// dims are eventually reduced.
#[derive(Clone, PartialEq, Debug)]
pub struct Input {
    /// Declaration.
    pub decl: TensorDecl,
    /// The `Op::Input` node.
    pub node: NodeId,
    /// `reduce: [..]` from the declaration, when given.
    pub reduce_override: Option<Vec<DimVar>>,
}

/// A graph output: its declaration and the node that computes it.
#[derive(Clone, PartialEq, Debug)]
pub struct Output {
    /// Declaration.
    pub decl: TensorDecl,
    /// The node whose value is stored.
    pub node: NodeId,
}

/// A computation graph: one kernel's worth of ops.
#[derive(Clone, PartialEq, Debug, Default)]
pub struct Graph {
    /// The kernel name.
    pub name: String,
    /// Dimension variables of every shape in the graph.
    pub dims: DimTable,
    /// The arena, in topological order.
    pub nodes: Vec<Node>,
    /// Inputs in declaration order.
    pub inputs: Vec<Input>,
    /// Outputs in declaration order.
    pub outputs: Vec<Output>,
}

impl Graph {
    /// An empty graph with a dim table.
    pub fn new(name: impl Into<String>, dims: DimTable) -> Self {
        Graph { name: name.into(), dims, ..Default::default() }
    }

    /// The node behind a handle.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    /// Shape of a node.
    pub fn shape(&self, id: NodeId) -> &[Dim] {
        &self.nodes[id.index()].shape
    }

    /// All handles in topological order.
    pub fn ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    fn push(&mut self, node: Node) -> NodeId {
        let id = NodeId(u32::try_from(self.nodes.len()).expect("fewer than 2^32 nodes"));
        self.nodes.push(node);
        id
    }

    /// Declares an input.
    pub fn add_input(&mut self, decl: TensorDecl) -> NodeId {
        let index = u32::try_from(self.inputs.len()).expect("fewer than 2^32 inputs");
        let node = self.push(Node { op: Op::Input(index), args: Vec::new(), shape: decl.shape.clone() });
        self.inputs.push(Input { decl, node, reduce_override: None });
        node
    }

    /// A scalar constant; equal constants share one node.
    pub fn constant(&mut self, value: f64) -> NodeId {
        let bits = value.to_bits();
        if let Some(i) = self.nodes.iter().position(|n| matches!(n.op, Op::Const(c) if c.to_bits() == bits)) {
            return NodeId(i as u32);
        }
        self.push(Node { op: Op::Const(value), args: Vec::new(), shape: Vec::new() })
    }

    /// Applies `op` to `args`, inferring the shape.
    pub fn add(&mut self, op: Op, args: &[NodeId]) -> Result<NodeId, ShapeError> {
        debug_assert!(!op.is_leaf(), "leaves are added with add_input or constant");
        let shapes: Vec<Shape> = args.iter().map(|a| self.shape(*a).to_vec()).collect();
        let refs: Vec<&[Dim]> = shapes.iter().map(|s| s.as_slice()).collect();
        let shape = infer(&op, &refs, &mut self.dims)?;
        Ok(self.push(Node { op, args: args.to_vec(), shape }))
    }

    /// Declares an output computed by `node`.
    pub fn add_output(&mut self, decl: TensorDecl, node: NodeId) {
        self.outputs.push(Output { decl, node });
    }

    /// For each node, the nodes that use it (in increasing order, with repeats for repeated use).
    pub fn users(&self) -> Vec<Vec<NodeId>> {
        let mut users = vec![Vec::new(); self.nodes.len()];
        for id in self.ids() {
            for a in &self.node(id).args {
                users[a.index()].push(id);
            }
        }
        users
    }

    /// The input index of a node, when it is an input.
    pub fn input_index(&self, id: NodeId) -> Option<usize> {
        match self.node(id).op {
            Op::Input(i) => Some(i as usize),
            _ => None,
        }
    }

    /// The input a node reads, seen through views (transposes and splits), when it is one.
    pub fn viewed_input(&self, mut id: NodeId) -> Option<usize> {
        loop {
            match self.node(id).op {
                Op::Transpose | Op::Split(_) => id = self.node(id).args[0],
                Op::Input(i) => return Some(i as usize),
                _ => return None,
            }
        }
    }

    /// The type in which the tensor cores take the computed operand of product `m`, which is
    /// rounded to it. A computed left operand takes the right input's type, when it may be
    /// rounded to it ([`Graph::rounds_to`]; otherwise it stays in f32 and is split for tf32 products). A computed right
    /// operand of more than one column is stored before the product in the one float type of
    /// the inputs it is computed from, which a left input must share; a product of one column
    /// is each row's dot product in f32 and rounds nothing. `None`: nothing is rounded (both
    /// operands are inputs, or the product is the fallback's, in f32).
    pub fn rounded_operand_type(&self, m: NodeId) -> Option<DType> {
        let n = self.node(m);
        if n.op != Op::MatMul {
            return None;
        }
        let input_type = |x: NodeId| self.viewed_input(x).map(|i| self.inputs[i].decl.dtype);
        match (input_type(n.args[0]), input_type(n.args[1])) {
            (Some(_), Some(_)) => None,
            (None, Some(t)) => self.rounds_to(n.args[0], t).then_some(t),
            (left, None) => {
                if n.shape.last() == Some(&Dim::One) {
                    return None;
                }
                let t = self.source_type(n.args[1])?;
                (left.is_none() || left == Some(t)).then_some(t)
            }
        }
    }

    /// Whether the value of `id` may be rounded to the 16-bit type `t` for the tensor cores
    /// ([`may_round_to`], over the types of the inputs it is computed from).
    pub fn rounds_to(&self, id: NodeId, t: DType) -> bool {
        may_round_to(&self.float_sources(id, &|i| vec![self.inputs[i].decl.dtype]), t)
    }

    /// The float types of the inputs `id` is computed from, input `i` seen as having been
    /// computed from `input_sources(i)`: its own type for a declared input; for a workspace
    /// that an earlier kernel of a launch stored, the types of the inputs that one read.
    pub fn float_sources(&self, id: NodeId, input_sources: &dyn Fn(usize) -> Vec<DType>) -> BTreeSet<DType> {
        let mut seen = vec![false; self.nodes.len()];
        let mut stack = vec![id];
        let mut found = BTreeSet::new();
        while let Some(x) = stack.pop() {
            if std::mem::replace(&mut seen[x.index()], true) {
                continue;
            }
            match self.node(x).op {
                Op::Input(i) => found.extend(input_sources(i as usize).into_iter().filter(|t| t.is_float())),
                _ => stack.extend(self.node(x).args.iter().copied()),
            }
        }
        found
    }

    /// The one float type of the inputs `id` is computed from; `None` when they differ or it
    /// reads none (index tensors do not count: they are never values).
    fn source_type(&self, id: NodeId) -> Option<DType> {
        let sources = self.float_sources(id, &|i| vec![self.inputs[i].decl.dtype]);
        let mut types = sources.into_iter();
        let only = types.next()?;
        types.next().is_none().then_some(only)
    }

    /// The nodes that some output depends on, as a mask.
    pub fn live(&self) -> Vec<bool> {
        let mut live = vec![false; self.nodes.len()];
        for o in &self.outputs {
            live[o.node.index()] = true;
        }
        for i in (0..self.nodes.len()).rev() {
            if live[i] {
                for a in &self.nodes[i].args {
                    live[a.index()] = true;
                }
            }
        }
        live
    }

    /// Number of non-leaf nodes.
    pub fn op_count(&self) -> usize {
        self.nodes.iter().filter(|n| !n.op.is_leaf()).count()
    }

    /// True when any node is a split.
    pub fn has_split(&self) -> bool {
        self.nodes.iter().any(|n| matches!(n.op, Op::Split(_)))
    }
}

/// Drops leading extent-1 axes: an output stored as `[1, h, s, d]` has the memory layout of a
/// declared `[h, s, d]`, which is what a Split-K combine produces.
pub fn squeeze_leading(shape: &[Dim]) -> &[Dim] {
    let first = shape.iter().position(|d| *d != Dim::One).unwrap_or(shape.len());
    &shape[first..]
}

/// Whether a value computed from inputs of the float types `sources` may be rounded to the
/// 16-bit type `t` for the tensor cores: each is `t` or f32. A value computed from f16 inputs
/// loses three bits of mantissa in bf16, and one computed from bf16 inputs loses range in f16;
/// where a sum cancels, either is far more than the declaration's rounding. An f32 source is
/// the declaration's choice of a wider type for the rest of the graph, and mixed-precision
/// products round it by design.
pub fn may_round_to(sources: &BTreeSet<DType>, t: DType) -> bool {
    sources.iter().all(|&s| s == t || s == DType::F32)
}
