//! Storage layouts: how the logical tensor a graph computes with lies in its buffer.
//!
//! The graph, the search and the scheduler see every input and output as a dense logical
//! tensor over its declared axes. Its buffer may be laid out otherwise, and [`Layout`] says
//! how: axes in another order, several logical axes merged into one storage axis (`[batch,
//! (g r), d]` for 32 heads seen as 4 groups of 8), the rows of all requests of a ragged dim
//! packed into one axis, or a paged dim's tokens behind a page table. Only the planner and the
//! code generator read it: a layout is an addressing fact, never a change of the computation.

use super::dim::{Dim, DimTable, DimVar, PerRequestKind};

/// One axis of a buffer, outermost first.
#[derive(Clone, PartialEq, Eq, Debug, Hash)]
pub enum StoreAxis {
    /// Extent 1.
    One,
    /// One logical dim, or several merged row-major (the last fastest).
    Dims(Vec<DimVar>),
    /// The rows of every request of the ragged dim `ragged`, packed by its `indptr`: `total`
    /// rows in all. Holds the logical axes `batch` and `ragged` together.
    Packed {
        /// The storage extent (a dynamic dim).
        total: DimVar,
        /// The ragged dim.
        ragged: DimVar,
    },
    /// The page axis of the paged dim `paged`, `pages` pages; the next axis is its [`Slot`]
    /// axis. Together they hold the logical axes `batch` and `paged`.
    ///
    /// [`Slot`]: StoreAxis::Slot
    Pages {
        /// The number of pages of the pool (a dynamic dim).
        pages: DimVar,
        /// The paged dim.
        paged: DimVar,
    },
    /// The slot within a page of the paged dim `paged`: its page size, a static dim or 1.
    Slot {
        /// The paged dim.
        paged: DimVar,
        /// The page size as a dim of the graph (`One` for pages of one token).
        size: Dim,
    },
    /// `n + 1` entries (an `indptr` over `n` requests).
    PlusOne(DimVar),
}

/// The storage of a tensor whose buffer is not its dense logical shape.
#[derive(Clone, PartialEq, Eq, Debug, Hash)]
pub struct Layout {
    /// The buffer's axes, outermost first; the last is contiguous.
    pub axes: Vec<StoreAxis>,
}

impl StoreAxis {
    /// The extent of this storage axis under `extent` (the extent of a dim).
    pub fn extent(&self, extent: &dyn Fn(Dim) -> u64) -> u64 {
        match self {
            StoreAxis::One => 1,
            StoreAxis::Dims(ds) => ds.iter().map(|d| extent(Dim::Var(*d))).product(),
            StoreAxis::Packed { total, .. } => extent(Dim::Var(*total)),
            StoreAxis::Pages { pages, .. } => extent(Dim::Var(*pages)),
            StoreAxis::Slot { size, .. } => extent(*size),
            StoreAxis::PlusOne(d) => extent(Dim::Var(*d)) + 1,
        }
    }

    /// The storage axis as written in a declaration (`(g r)`, `total_q`, `n + 1`).
    pub fn show(&self, dims: &DimTable) -> String {
        let name = |v: &DimVar| dims.get(*v).name.clone();
        match self {
            StoreAxis::One => "1".into(),
            StoreAxis::Dims(ds) if ds.len() == 1 => name(&ds[0]),
            StoreAxis::Dims(ds) => format!("({})", ds.iter().map(name).collect::<Vec<_>>().join(" ")),
            StoreAxis::Packed { total, .. } => name(total),
            StoreAxis::Pages { pages, .. } => name(pages),
            StoreAxis::Slot { size, .. } => dims.show(&[*size]).trim_matches(['[', ']']).to_string(),
            StoreAxis::PlusOne(d) => format!("{} + 1", name(d)),
        }
    }
}

impl Layout {
    /// The buffer's shape under `extent`.
    pub fn extents(&self, extent: &dyn Fn(Dim) -> u64) -> Vec<u64> {
        self.axes.iter().map(|a| a.extent(extent)).collect()
    }

    /// Renders the storage as written: `[total_q, (g r), d]`.
    pub fn show(&self, dims: &DimTable) -> String {
        format!("[{}]", self.axes.iter().map(|a| a.show(dims)).collect::<Vec<_>>().join(", "))
    }

    /// Where logical axis `dim` lives: the storage axis and, inside a merge, the dims after it
    /// (its stride there is the storage axis's stride times their extents). `None` for a dim
    /// that a packed or paged axis holds (a ragged or paged dim, and its batch).
    pub fn place(&self, dim: DimVar) -> Option<(usize, Vec<DimVar>)> {
        self.axes.iter().enumerate().find_map(|(k, a)| match a {
            StoreAxis::Dims(ds) => ds.iter().position(|d| *d == dim).map(|p| (k, ds[p + 1..].to_vec())),
            _ => None,
        })
    }

    /// The storage axis that packs or pages the per-request dim `dim`, if this layout holds it.
    pub fn request_axis(&self, dim: DimVar) -> Option<usize> {
        self.axes.iter().position(|a| match a {
            StoreAxis::Packed { ragged, .. } => *ragged == dim,
            StoreAxis::Pages { paged, .. } => *paged == dim,
            _ => false,
        })
    }

    /// The per-request dims this layout packs or pages.
    pub fn request_dims(&self) -> Vec<DimVar> {
        self.axes
            .iter()
            .filter_map(|a| match a {
                StoreAxis::Packed { ragged, .. } => Some(*ragged),
                StoreAxis::Pages { paged, .. } => Some(*paged),
                _ => None,
            })
            .collect()
    }

    /// True when some storage axis reaches its rows through a page table.
    pub fn is_paged(&self) -> bool {
        self.axes.iter().any(|a| matches!(a, StoreAxis::Pages { .. }))
    }
}

/// The batch dims of a table's per-request dims.
pub fn batch_dims(dims: &DimTable) -> Vec<DimVar> {
    let mut out: Vec<DimVar> = dims.iter().filter_map(|(_, d)| d.per_request.as_ref().map(|p| p.batch)).collect();
    out.sort();
    out.dedup();
    out
}

/// True when `d` is a paged dim.
pub fn is_paged(dims: &DimTable, d: DimVar) -> bool {
    matches!(dims.get(d).per_request.as_ref().map(|p| &p.kind), Some(PerRequestKind::Paged { .. }))
}
