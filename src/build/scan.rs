//! Finding inline `cleave::kernel! { .. }` declarations in a crate's sources.
//!
//! Each file is parsed with `syn` and every macro invocation whose path is `kernel`,
//! `cleave::kernel` or `::cleave::kernel` is read with the same token parser the macro uses, so
//! the build script generates exactly the kernels the macro will ask for. Invocations of the
//! crate's own `macro_rules!` macros are expanded (`expand.rs`) and scanned in turn, so a
//! `kernel!` inside a macro that stamps out variants is found too. Invocations the parser or
//! the front end rejects are skipped: the macro reports them at compile time, with the span of
//! the offending token, which is a better place than the build script's output.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cleave_core::front::tokens::{self, Parsed};
use cleave_core::front::{lower, KernelDecl};
use cleave_core::graph::ValidGraph;
use syn::visit::Visit;

use super::expand::{MacroDef, MAX_DEPTH};

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

/// The `macro_rules!` definitions of the given files, by name; where two share a name, the
/// first is kept (a wrong choice only costs the macro's clear error, never a wrong kernel).
pub(crate) fn macros<'a>(texts: impl Iterator<Item = &'a str>) -> BTreeMap<String, MacroDef> {
    struct Defs(BTreeMap<String, MacroDef>);
    impl<'ast> Visit<'ast> for Defs {
        fn visit_item_macro(&mut self, item: &'ast syn::ItemMacro) {
            if let (Some(name), true) = (&item.ident, item.mac.path.is_ident("macro_rules")) {
                if let Some(def) = MacroDef::parse(item.mac.tokens.clone()) {
                    self.0.entry(name.to_string()).or_insert(def);
                }
            }
            syn::visit::visit_item_macro(self, item);
        }
    }
    let mut defs = Defs(BTreeMap::new());
    for text in texts {
        if let Ok(ast) = syn::parse_file(text) {
            defs.visit_file(&ast);
        }
    }
    defs.0
}

struct Finder<'m> {
    found: Vec<(usize, usize, proc_macro2::TokenStream)>,
    macros: &'m BTreeMap<String, MacroDef>,
    /// Where the outermost invocation being expanded is, and how deep the expansion is.
    expanding: Option<(usize, usize)>,
    depth: usize,
}

impl<'ast> Visit<'ast> for Finder<'_> {
    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let segments: Vec<String> = mac.path.segments.iter().map(|s| s.ident.to_string()).collect();
        let ours = match segments.as_slice() {
            [last] => last == "kernel",
            [krate, last] => krate == "cleave" && last == "kernel",
            _ => false,
        };
        let start = mac.path.segments.first().map(|s| s.ident.span().start());
        let here = self.expanding.unwrap_or_else(|| start.map_or((0, 0), |s| (s.line, s.column + 1)));
        if ours && tokens::reference(&mac.tokens).is_none() {
            self.found.push((here.0, here.1, mac.tokens.clone()));
        } else if let ([name], true) = (segments.as_slice(), self.depth < MAX_DEPTH) {
            if let Some(expanded) = self.macros.get(name).and_then(|def| def.expand(mac.tokens.clone())) {
                let outer = (self.expanding, self.depth);
                self.expanding = Some(here);
                self.depth += 1;
                visit_tokens(self, expanded);
                (self.expanding, self.depth) = outer;
            }
        }
        syn::visit::visit_macro(self, mac);
    }
}

/// Visits the expansion of a macro: items, or else statements.
fn visit_tokens(finder: &mut Finder<'_>, tokens: proc_macro2::TokenStream) {
    if let Ok(file) = syn::parse2::<syn::File>(tokens.clone()) {
        finder.visit_file(&file);
    } else if let Ok(block) = syn::parse2::<syn::Block>(quote_braced(tokens)) {
        finder.visit_block(&block);
    }
}

fn quote_braced(tokens: proc_macro2::TokenStream) -> proc_macro2::TokenStream {
    let group = proc_macro2::Group::new(proc_macro2::Delimiter::Brace, tokens);
    proc_macro2::TokenStream::from(proc_macro2::TokenTree::Group(group))
}

/// The inline declarations of one file's text, with the crate's `macro_rules!` macros expanded
/// (a declaration from an expansion is placed at the outermost invocation). A file that does
/// not parse yields none (the compiler reports it); so does a declaration the front end
/// rejects (the macro reports it).
pub(crate) fn scan_text(file: &str, text: &str, macros: &BTreeMap<String, MacroDef>) -> Vec<InlineKernel> {
    let Ok(ast) = syn::parse_file(text) else { return Vec::new() };
    let mut finder = Finder { found: Vec::new(), macros, expanding: None, depth: 0 };
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
        let found = scan_text("src/lib.rs", text, &BTreeMap::new());
        assert_eq!(found.len(), 1, "{found:?}");
        let k = &found[0];
        assert_eq!((k.decl.name.as_str(), k.line, k.col), ("swiglu", 6, 7));
        assert!(k.graph.dims.find("t").is_some());
        assert!(scan_text("src/bad.rs", "fn (", &BTreeMap::new()).is_empty());
    }

    const STAMPED: &str = r#"
macro_rules! norms {
    ($($name:ident: $n:literal),* $(,)?) => {
        $(
            cleave::kernel! {
                name: $name,
                dims: { r: dyn 4, n: $n },
                inputs: { x: f32[r, n] },
                outputs: { y: f32[r, n] },
                body: { y = x / sum(x, axis=-1) }
            }
        )*
    };
}
macro_rules! one_norm {
    ($name:ident) => { norms!($name: 16); };
}
norms!(norm_a: 32, norm_b: 48,);
one_norm!(norm_c);
norms!(not, a, match);
"#;

    #[test]
    fn kernels_inside_the_crates_own_macros_are_found_with_the_same_fingerprint() {
        let macros = macros([STAMPED].into_iter());
        assert_eq!(macros.keys().collect::<Vec<_>>(), ["norms", "one_norm"]);
        let found = scan_text("src/lib.rs", STAMPED, &macros);
        let names: Vec<(&str, usize)> = found.iter().map(|k| (k.decl.name.as_str(), k.line)).collect();
        // Placed at the outermost invocation; the one the rules do not match yields nothing.
        assert_eq!(names, [("norm_a", 18), ("norm_b", 18), ("norm_c", 19)]);
        let n = |k: &InlineKernel| k.graph.dims.find("n").map(|v| k.graph.dims.get(v).value);
        assert_eq!(found.iter().map(n).collect::<Vec<_>>(), [Some(32), Some(48), Some(16)]);
        // The same declaration written out has the same fingerprint, which is what the macro
        // checks before it includes the generated module.
        let written = "cleave::kernel! { name: norm_b, dims: { r: dyn 4, n: 48 }, inputs: { x: f32[r, n] }, \
                       outputs: { y: f32[r, n] }, body: { y = x / sum(x, axis=-1) } }";
        let direct = scan_text("src/other.rs", written, &BTreeMap::new());
        assert_eq!(direct.len(), 1);
        assert_eq!(tokens::fingerprint(&direct[0].decl), tokens::fingerprint(&found[1].decl));
        // Without the definitions, nothing is expanded.
        assert!(scan_text("src/lib.rs", STAMPED, &BTreeMap::new()).is_empty());
    }

    #[test]
    fn a_macro_that_expands_into_itself_stops_at_the_depth_limit() {
        let text = "macro_rules! forever { () => { forever!(); }; }\nforever!();\n";
        let macros = macros([text].into_iter());
        assert!(scan_text("src/lib.rs", text, &macros).is_empty());
    }
}
