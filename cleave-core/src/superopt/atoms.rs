//! Index atoms: what the abstract terms of the e-graph sum over.
//!
//! A reduction's index set is a set of atoms. Every eventually-reduced symbol `K` is two atoms,
//! `K_hi` (which part of a split) and `K_lo` (the position inside a part), because a split
//! turns one sum over `K` into a sum over `s_K` of sums over `K/s_K`; every other symbol is one
//! atom. An axis of symbol `K` stands for `{K_hi, K_lo}`, an axis `s_K` for `{K_hi}` and an
//! axis `K/s_K` for `{K_lo}`. With this, `sum(K, x) = sum(s_K, sum(K/s_K, x))` is the set
//! identity `sum(A ∪ B, x) = sum(A, sum(B, x))` and needs no rule of its own.

use crate::graph::{Dim, DimKind, DimTable, DimVar};

/// A set of atoms as a bit mask.
pub type AtomMask = u64;

/// The most atoms a search supports (one bit each).
pub const MAX_ATOMS: usize = 64;

/// The atoms of every variable of a dim table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Atoms {
    /// Per variable (by [`DimVar::index`]): its atom mask.
    per_var: Vec<AtomMask>,
    /// Per variable: whether axes of it may be reduced or split.
    reducible: Vec<bool>,
    /// Per variable: the atoms of the unsplit variable (a split count or chunk stands for a
    /// part of its axis; this is the whole axis).
    whole: Vec<AtomMask>,
    /// Number of atoms allocated.
    count: usize,
}

impl Atoms {
    /// Allocates atoms for `table`, where `reduced[v]` says whether plain symbol `v` is
    /// eventually reduced. Split variables take the atoms of the variable they split. Returns
    /// the number of atoms needed when it exceeds [`MAX_ATOMS`].
    pub fn new(table: &DimTable, reduced: &[bool]) -> Result<Atoms, usize> {
        let n = table.len();
        let mut per_var = vec![0; n];
        let mut reducible = vec![false; n];
        let mut hi = vec![0; n];
        let mut lo = vec![0; n];
        let mut count = 0usize;
        let next = |count: &mut usize| -> AtomMask {
            let bit = if *count < MAX_ATOMS { 1u64 << *count } else { 0 };
            *count += 1;
            bit
        };
        for (v, info) in table.iter() {
            if info.kind != DimKind::Plain {
                continue;
            }
            let i = v.index();
            if reduced.get(i).copied().unwrap_or(false) {
                hi[i] = next(&mut count);
                lo[i] = next(&mut count);
                per_var[i] = hi[i] | lo[i];
                reducible[i] = true;
            } else {
                per_var[i] = next(&mut count);
            }
        }
        if count > MAX_ATOMS {
            return Err(count);
        }
        let mut whole = per_var.clone();
        for (v, info) in table.iter() {
            match info.kind {
                DimKind::Plain => {}
                DimKind::SplitCount { of } => {
                    per_var[v.index()] = hi[of.index()];
                    reducible[v.index()] = reducible[of.index()];
                    whole[v.index()] = whole[of.index()];
                }
                DimKind::SplitChunk { of, .. } => {
                    per_var[v.index()] = lo[of.index()];
                    reducible[v.index()] = reducible[of.index()];
                    whole[v.index()] = whole[of.index()];
                }
            }
        }
        Ok(Atoms { per_var, reducible, whole, count })
    }

    /// The atoms of one axis (`1` has none).
    pub fn of_dim(&self, d: Dim) -> AtomMask {
        match d {
            Dim::One => 0,
            Dim::Var(v) => self.of_var(v),
        }
    }

    /// The atoms of a variable.
    pub fn of_var(&self, v: DimVar) -> AtomMask {
        self.per_var.get(v.index()).copied().unwrap_or(0)
    }

    /// The atoms of the whole axis an axis of this dim is (a part of): a mask's rows and
    /// columns are positions in the unsplit axes.
    pub fn of_whole_dim(&self, d: Dim) -> AtomMask {
        match d {
            Dim::One => 0,
            Dim::Var(v) => self.whole.get(v.index()).copied().unwrap_or(0),
        }
    }

    /// The atoms a tensor of this shape is indexed by.
    pub fn of_shape(&self, shape: &[Dim]) -> AtomMask {
        shape.iter().fold(0, |m, d| m | self.of_dim(*d))
    }

    /// True when an axis of this dim may be reduced or split (paper §4: only eventually-reduced
    /// dims and the parts of their splits).
    pub fn reducible(&self, d: Dim) -> bool {
        match d {
            Dim::One => false,
            Dim::Var(v) => self.reducible.get(v.index()).copied().unwrap_or(false),
        }
    }

    /// Number of atoms.
    pub fn count(&self) -> usize {
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduced_symbols_get_two_atoms_and_splits_take_one_each() {
        let mut t = DimTable::new();
        let m = t.plain("m", 4, false);
        let k = t.plain("k", 6, false);
        let (s, c) = t.split_vars(k);
        let atoms = Atoms::new(&t, &[false, true]).unwrap();
        assert_eq!(atoms.count(), 3);
        assert_eq!(atoms.of_var(m).count_ones(), 1);
        assert_eq!(atoms.of_var(k).count_ones(), 2);
        assert_eq!(atoms.of_var(s) | atoms.of_var(c), atoms.of_var(k));
        assert_eq!(atoms.of_var(s) & atoms.of_var(c), 0);
        assert!(atoms.reducible(Dim::Var(s)) && atoms.reducible(Dim::Var(c)) && !atoms.reducible(Dim::Var(m)));
        assert_eq!(atoms.of_shape(&[Dim::Var(s), Dim::Var(m), Dim::One]), atoms.of_var(s) | atoms.of_var(m));
    }

    #[test]
    fn too_many_atoms_are_reported() {
        let mut t = DimTable::new();
        for i in 0..40 {
            t.plain(format!("d{i}"), 2, false);
        }
        assert_eq!(Atoms::new(&t, &[true; 40]), Err(80));
    }
}
