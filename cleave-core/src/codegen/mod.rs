//! Code generators: pure functions from a planned launch to source text.

pub mod cuda;
pub mod headers;
pub mod plan;
pub mod rust;
mod stage;
pub mod tilelang;

/// An identifier of C and Python for a dim name (`l/s_l`, a split chunk, becomes
/// `l_over_s_l`).
fn ident(s: &str) -> String {
    s.replace('/', "_over_").chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}
