//! Finding inline `cleave::kernel! { .. }` declarations in a crate's sources.
//!
//! Each file is parsed with `syn` and every macro invocation whose path is `kernel`,
//! `cleave::kernel` or `::cleave::kernel` is read with the same token parser the macro uses, so
//! the build script generates exactly the kernels the macro will ask for. Invocations the
//! parser or the front end rejects are skipped: the macro reports them at compile time, with
//! the span of the offending token, which is a better place than the build script's output.

use std::path::{Path, PathBuf};

use cleave_core::front::tokens::{self, Parsed};
use cleave_core::front::{lower, KernelDecl};
use cleave_core::graph::ValidGraph;
use syn::visit::Visit;

/// One inline declaration found in a source file.
#[derive(Clone, Debug)]
pub(crate) struct InlineKernel {
    /// The file, as shown in messages (relative to the crate when inside it).
    pub(crate) file: String,
    /// 1-based line and column of the macro invocation.
    pub(crate) line: usize,
    pub(crate) col: usize,
    /// The declaration (with the macro front end's synthetic positions).
    pub(crate) decl: KernelDecl,
    /// The checked graph.
    pub(crate) graph: ValidGraph,
}

/// Every `.rs` file under `root` (a file or a directory), sorted, skipping hidden directories
/// and `target`.
pub(crate) fn rust_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if root.is_file() {
        out.push(root.to_owned());
    } else {
        walk(root, &mut out);
    }
    out.sort();
    out
}

/// Every `.rs` file below `dir`, skipping hidden directories and `target` (build output).
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let skipped = |e: &walkdir::DirEntry| {
        e.depth() > 0
            && e.file_type().is_dir()
            && e.file_name().to_str().is_none_or(|n| n.starts_with('.') || n == "target")
    };
    for entry in walkdir::WalkDir::new(dir).follow_links(true).into_iter().filter_entry(|e| !skipped(e)).flatten() {
        if entry.file_type().is_file() && entry.path().extension().is_some_and(|e| e == "rs") {
            out.push(entry.into_path());
        }
    }
}

struct Finder {
    found: Vec<(usize, usize, proc_macro2::TokenStream)>,
}

impl<'ast> Visit<'ast> for Finder {
    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let segments: Vec<String> = mac.path.segments.iter().map(|s| s.ident.to_string()).collect();
        let ours = match segments.as_slice() {
            [last] => last == "kernel",
            [krate, last] => krate == "cleave" && last == "kernel",
            _ => false,
        };
        if ours && tokens::reference(&mac.tokens).is_none() {
            let start = mac.path.segments.first().map(|s| s.ident.span().start());
            let (line, col) = start.map_or((0, 0), |s| (s.line, s.column + 1));
            self.found.push((line, col, mac.tokens.clone()));
        }
        syn::visit::visit_macro(self, mac);
    }
}

/// The inline declarations of one file's text. A file that does not parse yields none (the
/// compiler reports it); so does a declaration the front end rejects (the macro reports it).
pub(crate) fn scan_text(file: &str, text: &str) -> Vec<InlineKernel> {
    let Ok(ast) = syn::parse_file(text) else { return Vec::new() };
    let mut finder = Finder { found: Vec::new() };
    finder.visit_file(&ast);
    finder
        .found
        .into_iter()
        .filter_map(|(line, col, tokens)| {
            let Parsed { decl, .. } = tokens::parse(tokens).ok()?;
            let graph = lower(&decl).ok()?;
            Some(InlineKernel { file: file.to_string(), line, col, decl, graph })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_inline_declarations_with_their_positions() {
        let text = r#"
use cleave::kernel;
pub fn f() {}
cleave::kernel!(attention);
mod inner {
    ::cleave::kernel! {
        name: swiglu,
        dims: { t: dyn 16, k: 64, f: 128 },
        inputs: { x: f16[t, k], w1: f16[k, f], w2: f16[k, f] },
        outputs: { y: f16[t, f] },
        body: { y = silu(matmul(x, w1)) * matmul(x, w2) }
    }
}
kernel! { name: broken, dims: {} }
other::kernel! { name: not_ours }
"#;
        let found = scan_text("src/lib.rs", text);
        assert_eq!(found.len(), 1, "{found:?}");
        let k = &found[0];
        assert_eq!((k.decl.name.as_str(), k.line, k.col), ("swiglu", 6, 7));
        assert!(k.graph.dims.find("t").is_some());
        assert!(scan_text("src/bad.rs", "fn (").is_empty());
    }
}
