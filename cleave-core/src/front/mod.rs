//! Front ends: the declaration language, from `kernels.yaml` or from Rust tokens, to a
//! validated graph.
//!
//! Both front ends produce a [`KernelDecl`]: the declaration as written, with the source
//! position of every part. [`lower`] checks it and builds the graph. Errors are
//! [`Diagnostic`]s with 1-based line and column, rendered as `FILE:LINE:COL: message`.

mod decl;
mod diag;
mod expr;
mod ident;
mod lower;
#[cfg(feature = "rust-front")]
pub mod tokens;
mod yaml;

pub use decl::{AxisDecl, Body, DimDecl, KernelDecl, TensorSrc};
pub use diag::{Diagnostic, Pos, PosMap};
pub use expr::{lex, parse as parse_body, Arg, BinTok, Expr, ExprKind, ParseError, Stmt, Tok};
pub use ident::check_ident;
pub use lower::{dynamic_dims, lower, FUNCTIONS, MAX_DIM, MAX_ELEMENTS, RMSNORM_EPS};
pub use yaml::{parse_tensor_type, parse_yaml};

use crate::graph::ValidGraph;

/// A declaration file after checking: one graph per kernel.
#[derive(Clone, Debug)]
pub struct Module {
    /// The kernels, in file order.
    pub kernels: Vec<(KernelDecl, ValidGraph)>,
}

/// Reads and checks a whole declaration file given as bytes. Kernel names must be unique.
/// Every kernel is checked, so all errors are reported together.
pub fn check_source(bytes: &[u8]) -> Result<Module, Vec<Diagnostic>> {
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let ok = &bytes[..e.valid_up_to()];
            let line = ok.iter().filter(|b| **b == b'\n').count() as u32 + 1;
            let col =
                String::from_utf8_lossy(ok.rsplit(|b| *b == b'\n').next().unwrap_or(&[])).chars().count() as u32 + 1;
            return Err(vec![Diagnostic::new(
                Pos::new(line, col),
                format!("not a UTF-8 text file (invalid byte at offset {})", e.valid_up_to()),
            )]);
        }
    };
    if text.contains('\0') {
        let off = text.find('\0').unwrap_or(0);
        let line = text[..off].matches('\n').count() as u32 + 1;
        return Err(vec![Diagnostic::new(Pos::new(line, 1), "the file contains NUL bytes: not a text file")]);
    }
    let decls = parse_yaml(text)?;
    let mut kernels = Vec::new();
    let mut errors = Vec::new();
    let mut seen: Vec<(&str, Pos)> = Vec::new();
    for d in &decls {
        if let Some((_, first)) = seen.iter().find(|(n, _)| *n == d.name) {
            errors.push(Diagnostic::new(
                d.name_pos,
                format!("duplicate kernel name `{}` (first at {}:{})", d.name, first.line, first.col),
            ));
            continue;
        }
        seen.push((&d.name, d.name_pos));
        match lower(d) {
            Ok(g) => kernels.push((d.clone(), g)),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(Module { kernels })
    } else {
        errors.sort_by_key(|e| e.pos);
        Err(errors)
    }
}
