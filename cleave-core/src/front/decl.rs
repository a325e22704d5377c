//! A kernel declaration as written, before any checking: what both front ends (the YAML file
//! and the `kernel!` macro) produce, with the position of every part.

use super::diag::{Pos, PosMap};

/// One declared dimension.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct DimDecl {
    /// Name.
    pub name: String,
    /// Where the name is.
    pub pos: Pos,
    /// Declared extent (or representative extent of a dynamic axis), not yet range-checked.
    pub value: i128,
    /// Where the value is.
    pub value_pos: Pos,
    /// A runtime axis.
    pub dynamic: bool,
    /// `ragged:` or `paged:`: the extent differs between the requests of a batch.
    pub per_request: Option<PerRequestDecl>,
    /// More extents of a dynamic axis to make plans for (`also: [64, 256]`, `dyn 16 | 64 |
    /// 256`), each with its position: the launcher runs the plan made nearest to the extents
    /// it is given.
    pub also: Vec<(i128, Pos)>,
}

/// How a per-request dim is declared, as written.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum PerRequestDecl {
    /// `ragged: indptr`.
    Ragged {
        /// Where `ragged` is.
        pos: Pos,
        /// The `indptr` tensor.
        indptr: AxisDecl,
    },
    /// `paged: { indices: .., indptr: .., page_size: .., last_page_len: .. }`.
    Paged {
        /// Where `paged` is.
        pos: Pos,
        /// The page table.
        indices: Option<AxisDecl>,
        /// The `indptr` into the page table.
        indptr: Option<AxisDecl>,
        /// The page size: a dim name or an integer.
        page_size: Option<AxisDecl>,
        /// The used length of each request's last page.
        last_page_len: Option<AxisDecl>,
    },
}

/// One axis of a tensor's storage, as written: a dim, `1`, or `(a b ..)`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct StorageAxisDecl {
    /// The names (one, or several in a parenthesized merge).
    pub names: Vec<AxisDecl>,
    /// Written in parentheses.
    pub grouped: bool,
    /// Where it is.
    pub pos: Pos,
}

/// One axis of a declared tensor type: a dim name or the literal `1`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct AxisDecl {
    /// The dim name, or `"1"`.
    pub name: String,
    /// Where it is.
    pub pos: Pos,
}

/// A declared input or output.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct TensorSrc {
    /// Name.
    pub name: String,
    /// Where the name is.
    pub pos: Pos,
    /// The dtype as written.
    pub dtype: String,
    /// Where the dtype is.
    pub dtype_pos: Pos,
    /// Axes.
    pub shape: Vec<AxisDecl>,
    /// `reduce: [..]`: the user's list of eventually-reduced dims (inputs only).
    pub reduce: Option<Vec<AxisDecl>>,
    /// `as [..]`: the buffer's axes, when they are not the shape's.
    pub storage: Option<Vec<StorageAxisDecl>>,
}

/// The body: assignment statements, and how to locate each byte of it in the source.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Body {
    /// The statements.
    pub text: String,
    /// Offsets to file positions.
    pub map: PosMap,
}

impl Body {
    /// The file position of a byte offset of the text.
    pub fn pos(&self, offset: usize) -> Pos {
        self.map.pos(&self.text, offset)
    }
}

/// One kernel as declared.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct KernelDecl {
    /// The kernel (and launcher module) name.
    pub name: String,
    /// Where the name is.
    pub name_pos: Pos,
    /// Where the declaration starts.
    pub pos: Pos,
    /// Dims in declaration order.
    pub dims: Vec<DimDecl>,
    /// Inputs in declaration order.
    pub inputs: Vec<TensorSrc>,
    /// Outputs in declaration order.
    pub outputs: Vec<TensorSrc>,
    /// The statements.
    pub body: Body,
}
