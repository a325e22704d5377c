//! Validation: the proof token later stages require.
//!
//! [`validate`] checks, in order: handles point backwards (so the arena is topological), every
//! node's arity and shape agree with the shape rules, inputs and constants are where the input
//! list says, every input is used, and every output has its declared shape. Only then does it
//! hand out a [`ValidGraph`], which nothing else can construct: stages that take one may index
//! the arena and trust the shapes without re-checking.

use super::{infer, squeeze_leading, Dim, Graph, NodeId, Op, Shape};

/// A graph that passed [`validate`].
#[derive(Clone, Debug, PartialEq)]
pub struct ValidGraph(Graph);

impl ValidGraph {
    /// The validated graph.
    pub fn graph(&self) -> &Graph {
        &self.0
    }

    /// Gives the graph back, dropping the proof (for editing and re-validation).
    pub fn into_inner(self) -> Graph {
        self.0
    }
}

impl std::ops::Deref for ValidGraph {
    type Target = Graph;
    fn deref(&self) -> &Graph {
        &self.0
    }
}

/// Why a graph is not valid. Front ends report the user-facing form of these before a graph is
/// ever built; seeing one here means a stage produced a malformed graph.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// An operand handle is not smaller than its user.
    #[error("node {node} uses node {arg}, which does not come before it")]
    ForwardReference { node: u32, arg: u32 },
    /// An op with the wrong number of operands.
    #[error("node {node} ({op}) has {got} operand(s), want {want}")]
    Arity { node: u32, op: &'static str, got: usize, want: usize },
    /// The stored shape disagrees with the shape rules.
    #[error("node {node} ({op}): {message}")]
    Shape { node: u32, op: &'static str, message: String },
    /// An input node and the input list disagree.
    #[error("input `{name}` is not an input node with its declared shape")]
    InputMismatch { name: String },
    /// An input nothing reads.
    #[error("input `{name}` is never used")]
    UnusedInput { name: String },
    /// An output whose node has another shape.
    #[error("output `{name}` is declared {declared} but computes {computed}")]
    OutputShape { name: String, declared: String, computed: String },
    /// An output handle out of range.
    #[error("output `{name}` refers to a missing node")]
    OutputMissing { name: String },
    /// A graph with no outputs.
    #[error("the graph has no outputs")]
    NoOutputs,
}

/// Checks every invariant of the IR and returns the proof token.
pub fn validate(graph: Graph) -> Result<ValidGraph, ValidationError> {
    let mut dims = graph.dims.clone();
    for (i, node) in graph.nodes.iter().enumerate() {
        let id = i as u32;
        for a in &node.args {
            if a.0 >= id {
                return Err(ValidationError::ForwardReference { node: id, arg: a.0 });
            }
        }
        if node.args.len() != node.op.arity() {
            return Err(ValidationError::Arity {
                node: id,
                op: node.op.name(),
                got: node.args.len(),
                want: node.op.arity(),
            });
        }
        let expect: Shape = match node.op {
            Op::Input(k) => match graph.inputs.get(k as usize) {
                Some(input) if input.node == NodeId(id) => input.decl.shape.clone(),
                _ => return Err(ValidationError::InputMismatch { name: format!("#{k}") }),
            },
            Op::Const(_) => Vec::new(),
            op => {
                let shapes: Vec<&[Dim]> = node.args.iter().map(|a| graph.shape(*a)).collect();
                infer(&op, &shapes, &mut dims).map_err(|e| ValidationError::Shape {
                    node: id,
                    op: op.name(),
                    message: e.message(&graph.dims),
                })?
            }
        };
        if expect != node.shape {
            return Err(ValidationError::Shape {
                node: id,
                op: node.op.name(),
                message: format!(
                    "stored shape {} but the rules give {}",
                    graph.dims.show(&node.shape),
                    graph.dims.show(&expect)
                ),
            });
        }
    }
    for input in &graph.inputs {
        let ok = graph
            .nodes
            .get(input.node.index())
            .is_some_and(|n| matches!(n.op, Op::Input(_)) && n.shape == input.decl.shape);
        if !ok {
            return Err(ValidationError::InputMismatch { name: input.decl.name.clone() });
        }
    }
    let users = graph.users();
    // An index tensor is read by the kernels' addressing, never by an op.
    for input in graph.inputs.iter().filter(|i| !i.decl.is_index()) {
        if users[input.node.index()].is_empty() {
            return Err(ValidationError::UnusedInput { name: input.decl.name.clone() });
        }
    }
    if graph.outputs.is_empty() {
        return Err(ValidationError::NoOutputs);
    }
    for out in &graph.outputs {
        let Some(node) = graph.nodes.get(out.node.index()) else {
            return Err(ValidationError::OutputMissing { name: out.decl.name.clone() });
        };
        if squeeze_leading(&node.shape) != squeeze_leading(&out.decl.shape) {
            return Err(ValidationError::OutputShape {
                name: out.decl.name.clone(),
                declared: graph.dims.show(&out.decl.shape),
                computed: graph.dims.show(&node.shape),
            });
        }
    }
    Ok(ValidGraph(graph))
}

#[cfg(test)]
mod tests {
    use super::super::{DType, Graph, Node, TensorDecl};
    use super::*;

    fn tiny() -> Graph {
        let mut g = Graph::default();
        let m = g.dims.plain("m", 4, false);
        let shape = vec![Dim::Var(m)];
        let x = g.add_input(TensorDecl::dense("x", DType::F16, shape.clone()));
        let y = g.add(Op::Unary(super::super::UnaryOp::Exp), &[x]).unwrap();
        g.add_output(TensorDecl::dense("y", DType::F16, shape), y);
        g
    }

    #[test]
    fn a_well_formed_graph_validates() {
        assert!(validate(tiny()).is_ok());
    }

    #[test]
    fn forward_references_and_bad_shapes_are_caught() {
        let mut g = tiny();
        g.nodes[1].args[0] = NodeId(1);
        assert!(matches!(validate(g), Err(ValidationError::ForwardReference { .. })));
        let mut g = tiny();
        g.nodes[1].shape = vec![Dim::One];
        assert!(matches!(validate(g), Err(ValidationError::Shape { .. })));
        let mut g = tiny();
        g.nodes.push(Node { op: Op::MatMul, args: vec![NodeId(0)], shape: vec![] });
        assert!(matches!(validate(g), Err(ValidationError::Arity { .. })));
    }

    #[test]
    fn unused_inputs_and_wrong_outputs_are_caught() {
        let mut g = tiny();
        let m = g.dims.find("m").unwrap();
        g.add_input(TensorDecl::dense("z", DType::F16, vec![Dim::Var(m)]));
        assert_eq!(validate(g), Err(ValidationError::UnusedInput { name: "z".into() }));
        let mut g = tiny();
        g.outputs[0].decl.shape = vec![Dim::One];
        assert!(matches!(validate(g), Err(ValidationError::OutputShape { .. })));
    }
}
