//! Which names can become Rust identifiers in generated code.

/// Rust's strict and reserved keywords (all editions), plus names our generated modules use.
const RESERVED: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern", "false", "fn",
    "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return", "self", "Self",
    "static", "struct", "super", "trait", "true", "type", "unsafe", "use", "where", "while", "abstract", "become",
    "box", "do", "final", "gen", "macro", "override", "priv", "try", "typeof", "unsized", "virtual", "yield", "_",
];

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

#[cfg(test)]
mod tests {
    use super::check_ident;

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
}
