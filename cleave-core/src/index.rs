//! Index vocabulary shared by the scheduler, the planner and the code generators: loop
//! iterators, affine offsets in them, validity limits, and the tile map of a tensor (a range
//! per axis). It sits below those stages so that each can speak of tiles without depending on
//! another stage's IR.

use std::collections::BTreeMap;

use crate::graph::{DimTable, DimVar};

/// A loop iterator (block index component or sequential loop counter).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct IterId(pub u32);

/// One term of an offset: `coeff · iter`, times the runtime extent of `scale` when present.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Term {
    /// The iterator.
    pub iter: IterId,
    /// Constant factor (a tile size).
    pub coeff: u64,
    /// A dim whose runtime extent multiplies the term (a split chunk length).
    pub scale: Option<DimVar>,
}

/// An element offset along one axis: `Σ terms + konst`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct Affine {
    /// Iterator terms, sorted.
    pub terms: Vec<Term>,
    /// Constant part.
    pub konst: u64,
}

impl Affine {
    /// The constant 0.
    pub fn zero() -> Affine {
        Affine::default()
    }

    /// `coeff · iter`.
    pub fn iter(iter: IterId, coeff: u64) -> Affine {
        Affine { terms: vec![Term { iter, coeff, scale: None }], konst: 0 }
    }

    /// Whether this offset is a multiple of `n` elements whatever its iterators are: each
    /// term's coefficient, times its chunk length where it has a static one, and the constant
    /// are. A tile's offset is a multiple of its own width, but the chunks of a static Split-K
    /// need not be: 1000 columns in 8 parts start every 125.
    pub fn multiple_of(&self, n: u64, dims: &DimTable) -> bool {
        self.konst % n == 0
            && self.terms.iter().all(|t| {
                t.coeff % n == 0
                    || t.scale.is_some_and(|d| !dims.get(d).dynamic && (t.coeff * dims.get(d).value) % n == 0)
            })
    }

    /// The sum of two offsets.
    pub fn add(&self, other: &Affine) -> Affine {
        let mut terms = self.terms.clone();
        for t in &other.terms {
            match terms.iter_mut().find(|u| u.iter == t.iter && u.scale == t.scale) {
                Some(u) => u.coeff += t.coeff,
                None => terms.push(*t),
            }
        }
        terms.retain(|t| t.coeff != 0);
        terms.sort();
        Affine { terms, konst: self.konst + other.konst }
    }

    /// This offset with every term multiplied by the runtime extent of `dim`. Only offsets made
    /// of unscaled iterator terms can be scaled (a split part index times the chunk length).
    pub fn scaled_by(&self, dim: DimVar) -> Option<Affine> {
        if self.konst != 0 || self.terms.iter().any(|t| t.scale.is_some()) {
            return None;
        }
        let terms = self.terms.iter().map(|t| Term { scale: Some(dim), ..*t }).collect();
        Some(Affine { terms, konst: 0 })
    }

    /// True when no iterator appears.
    pub fn is_const(&self) -> bool {
        self.terms.is_empty()
    }

    /// True when `iter` appears.
    pub fn uses(&self, iter: IterId) -> bool {
        self.terms.iter().any(|t| t.iter == iter)
    }

    /// Evaluates with iterator values and dim extents.
    pub fn eval(&self, iters: &dyn Fn(IterId) -> u64, dims: &dyn Fn(DimVar) -> u64) -> u64 {
        self.terms.iter().map(|t| t.coeff * iters(t.iter) * t.scale.map_or(1, dims)).sum::<u64>() + self.konst
    }

    /// Renders with iterator names `i0, j1..` and dim names.
    pub fn show(&self, names: &IterNames, dims: &DimTable) -> String {
        let mut parts: Vec<String> = self
            .terms
            .iter()
            .map(|t| {
                let mut s = names.name(t.iter);
                if t.coeff != 1 {
                    s = format!("{s}*{}", t.coeff);
                }
                if let Some(d) = t.scale {
                    s = format!("{s}*{}", dims.get(d).name);
                }
                s
            })
            .collect();
        if self.konst != 0 || parts.is_empty() {
            parts.push(self.konst.to_string());
        }
        parts.join(" + ")
    }
}

/// A bound an index must respect: `base + local < extent(bound)`, where `local` counts from the
/// start of the tile. Tiles past the end of a dynamic or non-divisible axis are predicated by
/// these.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Limit {
    /// Offset of the tile start in the bound's coordinates.
    pub base: Affine,
    /// The dim whose extent bounds the index.
    pub bound: DimVar,
}

/// The slice of one axis a tile covers.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct AxisRange {
    /// Start offset.
    pub offset: Affine,
    /// Tile extent (elements).
    pub extent: u64,
    /// Validity bounds of the elements (empty: always valid).
    pub limits: Vec<Limit>,
}

impl AxisRange {
    /// `[0, 1)`, the range of a broadcast axis.
    pub fn unit() -> AxisRange {
        AxisRange { offset: Affine::zero(), extent: 1, limits: Vec::new() }
    }

    /// The sub-range `[offset + at, offset + at + extent)` of this range, keeping its limits.
    pub fn sub(&self, at: &Affine, extent: u64) -> AxisRange {
        AxisRange {
            offset: self.offset.add(at),
            extent,
            limits: self.limits.iter().map(|l| Limit { base: l.base.add(at), bound: l.bound }).collect(),
        }
    }
}

/// The tile map of one tensor at one level: a range per axis.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct TMap {
    /// One range per axis.
    pub axes: Vec<AxisRange>,
}

impl TMap {
    /// Tile extents.
    pub fn shape(&self) -> Vec<u64> {
        self.axes.iter().map(|a| a.extent).collect()
    }

    /// Number of elements of the tile.
    pub fn elements(&self) -> u64 {
        self.axes.iter().map(|a| a.extent).product()
    }

    /// True when some offset uses `iter`.
    pub fn uses(&self, iter: IterId) -> bool {
        self.axes.iter().any(|a| a.offset.uses(iter) || a.limits.iter().any(|l| l.base.uses(iter)))
    }
}

/// Printed names of iterators: grid axes `i0, i1, ..`, sequential loops `j0, j1, ..`. The
/// scheduler assigns them (it knows which loop is which); everything later only looks names up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IterNames {
    names: BTreeMap<IterId, String>,
}

impl IterNames {
    /// Names `iter`.
    pub fn insert(&mut self, iter: IterId, name: String) {
        self.names.insert(iter, name);
    }

    /// The name of an iterator.
    pub fn name(&self, it: IterId) -> String {
        self.names.get(&it).cloned().unwrap_or_else(|| format!("it{}", it.0))
    }
}
