//! Front ends: the declaration language, from `kernels.yaml` or from Rust tokens, to a
//! validated graph.
//!
//! Both front ends produce a [`KernelDecl`]: the declaration as written, with the source
//! position of every part. [`lower`] checks it and builds the graph. Errors are
//! [`Diagnostic`]s with 1-based line and column, rendered as `FILE:LINE:COL: message`.

use std::collections::HashMap;

mod decl;
mod diag;
mod expr;
mod ident;
mod lower;
#[cfg(feature = "rust-front")]
pub mod tokens;
mod yaml;

pub use decl::{AxisDecl, Body, DimDecl, KernelDecl, PerRequestDecl, StorageAxisDecl, TensorSrc};
pub use diag::{Diagnostic, Pos, PosMap};
pub use expr::{lex, parse as parse_body, Arg, BinTok, Expr, ExprKind, ParseError, Stmt, Tok};
pub use ident::{check_ident, check_name, NameKind, MAX_NAME_LEN};
pub use lower::{
    dynamic_dims, label, lower, points, Point, FUNCTIONS, MAX_DIM, MAX_DIMS, MAX_ELEMENTS, MAX_OPS, MAX_POINTS,
    MAX_RANK, MAX_TENSORS, RMSNORM_EPS,
};
pub use yaml::{parse_tensor_type, parse_yaml, TensorType};

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
    // Old Mac line ends (a lone CR) are line breaks to YAML; making them LF keeps every later
    // position computation on one convention. CRLF becomes LF too (columns are unchanged).
    let normalized;
    let text = if text.contains('\r') {
        normalized = text.replace("\r\n", "\n").replace('\r', "\n");
        normalized.as_str()
    } else {
        text
    };
    let decls = parse_yaml(text)?;
    let mut kernels = Vec::new();
    let mut errors = Vec::new();
    // By name, and by lowercase name: `k` and `K` would write `k.cu` and `K.cu`, one file on
    // a case-insensitive file system.
    let mut seen: HashMap<&str, Pos> = HashMap::new();
    let mut folded: HashMap<String, (&str, Pos)> = HashMap::new();
    for d in &decls {
        if let Some(first) = seen.get(d.name.as_str()) {
            errors.push(Diagnostic::new(
                d.name_pos,
                format!("duplicate kernel name `{}` (first at {}:{})", d.name, first.line, first.col),
            ));
            continue;
        }
        if let Some((other, first)) = folded.get(&d.name.to_ascii_lowercase()) {
            errors.push(Diagnostic::new(
                d.name_pos,
                format!(
                    "kernel names `{}` and `{other}` (at {}:{}) differ only in case; their generated files would collide",
                    d.name, first.line, first.col
                ),
            ));
            continue;
        }
        seen.insert(&d.name, d.name_pos);
        folded.insert(d.name.to_ascii_lowercase(), (&d.name, d.name_pos));
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
