//! Human-readable forms of a graph: an SSA listing and infix expressions.

use std::fmt::Write;

use super::{BinaryOp, Graph, NodeId, Op};

impl Graph {
    /// The display name of a node: an input's name, a constant's value, or `%N`.
    pub fn label(&self, id: NodeId) -> String {
        match self.node(id).op {
            Op::Input(i) => self.inputs[i as usize].decl.name.clone(),
            Op::Const(c) => format_const(c),
            _ => format!("%{}", id.0),
        }
    }

    /// One line per non-leaf node: `%5 = matmul(q, %4)  [h, s, l]`.
    pub fn listing(&self) -> String {
        let mut out = String::new();
        for id in self.ids() {
            let node = self.node(id);
            if node.op.is_leaf() {
                continue;
            }
            let args: Vec<String> = node.args.iter().map(|a| self.label(*a)).collect();
            let call = match node.op {
                Op::Reduce(r, axis) => format!("{}({}, axis={axis})", r.name(), args.join(", ")),
                Op::Split(axis) => format!("split({}, axis={axis})", args[0]),
                Op::Mask(m) => format!("{}({}{})", m.name(), args[0], m.arguments()),
                op => format!("{}({})", op.name(), args.join(", ")),
            };
            let _ = writeln!(out, "{} = {call}  {}", self.label(id), self.dims.show(&node.shape));
        }
        for o in &self.outputs {
            let _ = writeln!(out, "{} <- {}", o.decl.name, self.label(o.node));
        }
        out
    }

    /// The infix expression computing `id`, with inputs and constants at the leaves.
    pub fn expr(&self, id: NodeId) -> String {
        self.expr_prec(id, 0)
    }

    fn expr_prec(&self, id: NodeId, outer: u8) -> String {
        let node = self.node(id);
        let arg = |i: usize, p: u8| self.expr_prec(node.args[i], p);
        match node.op {
            Op::Input(_) | Op::Const(_) => self.label(id),
            Op::Binary(b) => match b.symbol() {
                Some(sym) => {
                    let prec = match b {
                        BinaryOp::Add | BinaryOp::Sub => 1,
                        _ => 2,
                    };
                    // Left-associative: the right operand of - and / needs a tighter bracket.
                    let text = format!("{} {sym} {}", arg(0, prec), arg(1, prec + 1));
                    if prec < outer {
                        format!("({text})")
                    } else {
                        text
                    }
                }
                None => format!("max({}, {})", arg(0, 0), arg(1, 0)),
            },
            Op::Unary(super::UnaryOp::Neg) => format!("-{}", arg(0, 3)),
            Op::Unary(u) => format!("{}({})", u.name(), arg(0, 0)),
            Op::MatMul => format!("matmul({}, {})", arg(0, 0), arg(1, 0)),
            Op::Transpose => format!("transpose({})", arg(0, 0)),
            Op::Reduce(r, axis) => format!("{}({}, axis={axis})", r.surface_name(), arg(0, 0)),
            Op::Split(axis) => format!("split({}, axis={axis})", arg(0, 0)),
            Op::Mask(m) => format!("{}({}{})", m.name(), arg(0, 0), m.arguments()),
        }
    }
}

/// Prints a constant so that it reads back to the same f64.
pub(crate) fn format_const(c: f64) -> String {
    format!("{c:?}")
}
