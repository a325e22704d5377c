//! Dimensions: the variables a shape is made of.
//!
//! Every axis of every tensor is a [`Dim`]: either the broadcast unit `1` or a [`DimVar`], an
//! index into the graph's [`DimTable`]. A declared graph's variables are the user's named dims;
//! a symbolic graph's variables are the symbols of the grouping pass, plus the split count `s`
//! and the chunk `K/s` that a `split` introduces. Two axes are equal exactly when they are the
//! same variable: shapes are compared by name, never by value, so a dynamic axis can never match
//! a static one by accident of its representative size.

use std::fmt;

/// Index of a dimension variable in a [`DimTable`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct DimVar(pub u32);

impl DimVar {
    /// The table index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One axis of a shape.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Dim {
    /// Extent 1: broadcasts against anything.
    One,
    /// A variable of the graph's dim table.
    Var(DimVar),
}

impl Dim {
    /// The variable, unless this is the broadcast unit.
    pub fn var(self) -> Option<DimVar> {
        match self {
            Dim::One => None,
            Dim::Var(v) => Some(v),
        }
    }
}

/// A shape: one [`Dim`] per axis, outermost first. Scalars have rank 0.
pub type Shape = Vec<Dim>;

/// What a dimension variable stands for.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum DimKind {
    /// A dim the user declared (or a symbol standing for a group of axes).
    Plain,
    /// The number of parts `s` a `split` cuts the variable `of` into.
    SplitCount { of: DimVar },
    /// One part of a split: `of / count` (rounded up when `of` is dynamic: the last part is
    /// predicated).
    SplitChunk { of: DimVar, count: DimVar },
}

/// An index tensor a per-request dim reads: a graph input of dtype `i32`.
#[derive(Clone, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
pub struct IndexRef {
    /// Its index in the declared graph's inputs (the launch's `Binding::Input`).
    pub input: u32,
    /// Its declared name.
    pub name: String,
    /// The dim of its one axis.
    pub len: DimVar,
    /// `i32[len + 1]` (an indptr) rather than `i32[len]`.
    pub plus_one: bool,
}

/// How a per-request dim gets its extent for request `b` of its batch dim.
#[derive(Clone, PartialEq, Eq, Debug, Hash)]
pub enum PerRequestKind {
    /// `indptr[b + 1] - indptr[b]`: request `b` owns rows `indptr[b] .. indptr[b + 1]` of a
    /// packed storage axis.
    Ragged {
        /// `i32[batch + 1]`.
        indptr: IndexRef,
        /// The extent of the storage axis that packs every request's rows (the same for every
        /// tensor that packs this dim); `None` until a tensor's storage names it.
        total: Option<DimVar>,
    },
    /// Request `b` owns pages `indices[indptr[b] .. indptr[b + 1]]`, in order, of `page_size`
    /// slots each; its extent is `pages * page_size`, or `(pages - 1) * page_size +
    /// last_page_len[b]` when the last page may be partial.
    Paged {
        /// `i32[batch + 1]`, into `indices`.
        indptr: IndexRef,
        /// `i32[n]`: page numbers.
        indices: IndexRef,
        /// Slots per page (the storage axis after the pages axis).
        page_size: u64,
        /// `i32[batch]`: the used slots of each request's last page.
        last_page_len: Option<IndexRef>,
    },
}

/// A dim whose extent differs between the requests of a batch (packed sequences, a paged KV
/// cache). The graph computes over it as over any dynamic axis; its storage and its extent per
/// request are facts the planner and the code generator read.
#[derive(Clone, PartialEq, Eq, Debug, Hash)]
pub struct PerRequest {
    /// The batch dim whose index selects the request.
    pub batch: DimVar,
    /// Where the extent and the storage come from.
    pub kind: PerRequestKind,
}

impl PerRequest {
    /// The `indptr` table.
    pub fn indptr(&self) -> &IndexRef {
        match &self.kind {
            PerRequestKind::Ragged { indptr, .. } | PerRequestKind::Paged { indptr, .. } => indptr,
        }
    }

    /// Every index tensor it reads.
    pub fn tables(&self) -> Vec<&IndexRef> {
        match &self.kind {
            PerRequestKind::Ragged { indptr, .. } => vec![indptr],
            PerRequestKind::Paged { indptr, indices, last_page_len, .. } => {
                let mut v = vec![indptr, indices];
                v.extend(last_page_len);
                v
            }
        }
    }
}

/// One entry of a [`DimTable`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct DimInfo {
    /// Name used in printing and in generated code (`s`, `d`, `l/s_l`).
    pub name: String,
    /// The concrete extent: the declared value, or for a dynamic axis its representative value.
    /// Symbolic graphs carry the size they were instantiated from, for recovery.
    pub value: u64,
    /// A runtime axis: its extent is passed to the launcher.
    pub dynamic: bool,
    /// What the variable stands for.
    pub kind: DimKind,
    /// For a dim whose extent differs between requests: how (it is also `dynamic`, and
    /// `value` is a representative extent).
    pub per_request: Option<PerRequest>,
}

/// The dimension variables of one graph.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct DimTable {
    vars: Vec<DimInfo>,
}

impl DimTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a variable and returns its handle.
    pub fn push(&mut self, info: DimInfo) -> DimVar {
        let v = DimVar(u32::try_from(self.vars.len()).expect("fewer than 2^32 dims"));
        self.vars.push(info);
        v
    }

    /// Adds a plain variable.
    pub fn plain(&mut self, name: impl Into<String>, value: u64, dynamic: bool) -> DimVar {
        self.push(DimInfo { name: name.into(), value, dynamic, kind: DimKind::Plain, per_request: None })
    }

    /// The entry of `v`.
    pub fn get(&self, v: DimVar) -> &DimInfo {
        &self.vars[v.index()]
    }

    /// Mutable access to the entry of `v`.
    pub fn get_mut(&mut self, v: DimVar) -> &mut DimInfo {
        &mut self.vars[v.index()]
    }

    /// Looks a variable up by name.
    pub fn find(&self, name: &str) -> Option<DimVar> {
        self.vars.iter().position(|d| d.name == name).map(|i| DimVar(i as u32))
    }

    /// All variables with their entries, in creation order.
    pub fn iter(&self) -> impl Iterator<Item = (DimVar, &DimInfo)> + '_ {
        self.vars.iter().enumerate().map(|(i, d)| (DimVar(i as u32), d))
    }

    /// Number of variables.
    pub fn len(&self) -> usize {
        self.vars.len()
    }

    /// True when there are no variables.
    pub fn is_empty(&self) -> bool {
        self.vars.is_empty()
    }

    /// The split count variable for `of`, creating it (and its chunk) on first use.
    /// Returns `(count, chunk)`.
    pub fn split_vars(&mut self, of: DimVar) -> (DimVar, DimVar) {
        let existing = self.vars.iter().position(|d| d.kind == DimKind::SplitCount { of });
        let count = match existing {
            Some(i) => DimVar(i as u32),
            None => {
                let name = format!("s_{}", self.get(of).name);
                self.push(DimInfo {
                    name,
                    value: 1,
                    dynamic: false,
                    kind: DimKind::SplitCount { of },
                    per_request: None,
                })
            }
        };
        let chunk_kind = DimKind::SplitChunk { of, count };
        let chunk = match self.vars.iter().position(|d| d.kind == chunk_kind) {
            Some(i) => DimVar(i as u32),
            None => {
                let info = self.get(of);
                let name = format!("{}/s_{}", info.name, info.name);
                let dynamic = info.dynamic;
                let value = info.value;
                self.push(DimInfo { name, value, dynamic, kind: chunk_kind, per_request: None })
            }
        };
        (count, chunk)
    }

    /// The concrete extent of an axis under these values (`One` is 1).
    pub fn extent(&self, d: Dim) -> u64 {
        match d {
            Dim::One => 1,
            Dim::Var(v) => self.get(v).value,
        }
    }

    /// The per-request facts of `d`'s variable, when its extent differs between requests.
    pub fn per_request(&self, d: Dim) -> Option<&PerRequest> {
        d.var().and_then(|v| self.get(v).per_request.as_ref())
    }

    /// True when some dim's extent differs between requests.
    pub fn has_per_request(&self) -> bool {
        self.vars.iter().any(|d| d.per_request.is_some())
    }

    /// Renders a shape as `[h, s, d]`.
    pub fn show(&self, shape: &[Dim]) -> String {
        let parts: Vec<String> = shape
            .iter()
            .map(|d| match d {
                Dim::One => "1".to_string(),
                Dim::Var(v) => self.get(*v).name.clone(),
            })
            .collect();
        format!("[{}]", parts.join(", "))
    }

    /// Renders a shape with values: `[h=32, s=4096, d=128]`.
    pub fn show_values(&self, shape: &[Dim]) -> String {
        let parts: Vec<String> = shape
            .iter()
            .map(|d| match d {
                Dim::One => "1".to_string(),
                Dim::Var(v) => {
                    let i = self.get(*v);
                    format!("{}={}", i.name, i.value)
                }
            })
            .collect();
        format!("[{}]", parts.join(", "))
    }
}

/// A concrete assignment of extents to the variables of a table, used to instantiate a graph
/// (small random sizes for fingerprints, runtime sizes for dynamic axes).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Bindings {
    /// Extent of each variable, indexed by [`DimVar::index`].
    pub values: Vec<u64>,
}

impl Bindings {
    /// The table's own values (declared or representative sizes).
    pub fn of_table(table: &DimTable) -> Self {
        Bindings { values: table.iter().map(|(_, d)| d.value).collect() }
    }

    /// The extent of one axis.
    pub fn extent(&self, d: Dim) -> usize {
        match d {
            Dim::One => 1,
            Dim::Var(v) => self.values[v.index()] as usize,
        }
    }

    /// The extents of a whole shape.
    pub fn extents(&self, shape: &[Dim]) -> Vec<usize> {
        shape.iter().map(|&d| self.extent(d)).collect()
    }

    /// Recomputes every split chunk from its axis and count: `ceil(K / s)`.
    pub fn complete(&mut self, table: &DimTable) {
        for (v, d) in table.iter() {
            if let DimKind::SplitChunk { of, count } = d.kind {
                self.values[v.index()] = self.values[of.index()].div_ceil(self.values[count.index()].max(1));
            }
        }
    }
}

impl fmt::Display for DimVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}
