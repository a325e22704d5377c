//! Which names can become Rust identifiers in generated code.

/// Rust's strict and reserved keywords (all editions), plus names our generated modules use.
const RESERVED: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern", "false", "fn",
    "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return", "self", "Self",
    "static", "struct", "super", "trait", "true", "type", "unsafe", "use", "where", "while", "abstract", "become",
    "box", "do", "final", "gen", "macro", "override", "priv", "try", "typeof", "unsized", "virtual", "yield", "_",
];

/// Python's keywords and soft keywords: tensor and dim names are parameters and variables of
/// the generated TileLang.
const PYTHON: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue", "def", "del",
    "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is", "lambda", "nonlocal",
    "not", "or", "pass", "raise", "return", "try", "while", "with", "yield", "match", "case", "type",
];

/// Names a tensor cannot take: the generated TileLang's module aliases and the names it gives
/// workspaces. (The Rust launchers rename parameters that meet their own names or the
/// prelude's variants, so those need no rule here.)
const TENSOR_RESERVED: &[&str] = &["T", "tilelang", "partial_max"];

/// Crates a kernel module would shadow for the code around it.
const CRATES: &[&str] =
    &["cleave", "cleave_core", "cleave_runtime", "cleave_macros", "std", "core", "alloc", "cudarc", "half"];

/// Longest name: kernel names become file names (`NAME.cu`, `NAME.rs`) and symbols.
pub const MAX_NAME_LEN: usize = 64;

/// What a name names, for the rules that differ.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum NameKind {
    /// A kernel: a Rust module, a file name and a symbol prefix.
    Kernel,
    /// An input or output: a launcher parameter, a TileLang parameter.
    Tensor,
    /// A dim: a field of `Dims`, a TileLang variable.
    Dim,
}

/// Why a name cannot be used, or `None` when it can.
pub fn check_ident(name: &str) -> Option<String> {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return Some("an empty name is not a Rust identifier".into());
    };
    if !(first.is_ascii_alphabetic() || first == '_') || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Some(format!(
            "`{name}` is not a valid Rust identifier (use ASCII letters, digits and `_`, not starting with a digit)"
        ));
    }
    if RESERVED.contains(&name) {
        return Some(format!("`{name}` is a Rust keyword and cannot name a kernel, tensor or dim"));
    }
    None
}

/// Why a name cannot name a `kind`, or `None` when it can: [`check_ident`], a length limit, and
/// the names the generated Rust, TileLang or the crates around them already use.
pub fn check_name(name: &str, kind: NameKind) -> Option<String> {
    if let Some(msg) = check_ident(name) {
        return Some(msg);
    }
    if name.len() > MAX_NAME_LEN {
        return Some(format!("`{}…` is {} characters long (the limit is {MAX_NAME_LEN})", &name[..16], name.len()));
    }
    match kind {
        NameKind::Kernel if CRATES.contains(&name) => {
            Some(format!("`{name}` is a crate name; a kernel module of that name would shadow it"))
        }
        NameKind::Tensor | NameKind::Dim if PYTHON.contains(&name) => {
            Some(format!("`{name}` is a Python keyword, and the generated TileLang uses it as a name"))
        }
        NameKind::Tensor if TENSOR_RESERVED.contains(&name) || is_workspace_name(name) => {
            Some(format!("`{name}` is a name the generated TileLang already uses"))
        }
        _ => None,
    }
}

/// `ws0`, `ws12_max`: the generated code's names of workspaces.
fn is_workspace_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("ws") else { return false };
    let digits = rest.strip_suffix("_max").unwrap_or(rest);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::{check_ident, check_name, NameKind};

    #[test]
    fn identifiers_and_keywords() {
        assert_eq!(check_ident("attention_d128"), None);
        assert_eq!(check_ident("_x"), None);
        assert!(check_ident("2attn").unwrap().contains("not a valid Rust identifier"));
        assert!(check_ident("my-kernel").is_some());
        assert!(check_ident("fn").unwrap().contains("keyword"));
        assert!(check_ident("").is_some());
        assert!(check_ident("naïve").is_some());
    }

    #[test]
    fn names_the_generated_code_uses_are_refused() {
        for t in ["lambda", "None", "ws0", "ws3_max", "T", "partial_max"] {
            assert!(check_name(t, NameKind::Tensor).is_some(), "{t}");
        }
        for k in ["cleave", "std", "core", "cudarc"] {
            assert!(check_name(k, NameKind::Kernel).unwrap().contains("crate"), "{k}");
        }
        assert!(check_name("lambda", NameKind::Dim).is_some());
        assert_eq!(check_name("ws", NameKind::Tensor), None);
        assert_eq!(check_name("wsx", NameKind::Tensor), None);
        assert_eq!(check_name("std", NameKind::Tensor), None);
        assert_eq!(check_name("Some", NameKind::Tensor), None, "the launchers rename it");
        assert_eq!(check_name("attention", NameKind::Kernel), None);
        assert!(check_name(&"k".repeat(65), NameKind::Kernel).unwrap().contains("limit is 64"));
        assert_eq!(check_name(&"k".repeat(64), NameKind::Kernel), None);
    }
}
