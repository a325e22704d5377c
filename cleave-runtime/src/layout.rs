//! Views: where each input and output of one call lies in the buffer it was passed in.
//!
//! Generated kernels address every input and output through an element stride per axis (the
//! last axis is contiguous), passed at launch time, so one compile serves a dense tensor, a K
//! cache allocated for a larger capacity, one projection of a fused weight or a candle narrow.
//! A view starts at the address passed (an offset into a larger buffer is a sub-slice of it)
//! and is checked here before anything runs: it must lie inside the buffer, be as aligned as
//! the kernels may assume, and, for an output, never name one element twice.

use std::fmt;

use crate::plan::{Axis, LaunchPlan, Role, TensorSpec, MAX_TENSORS, MAX_TENSOR_ELEMENTS};
use crate::Error;

/// The most axes of a tensor the runtime takes (the front end allows six).
pub const MAX_RANK: usize = 8;

/// The element strides of every input and output of one call, and the elements each view
/// spans, held inline so that building them allocates nothing. Inputs come first, then
/// outputs, in declaration order.
#[derive(Clone, Copy)]
pub struct Layouts {
    inputs: usize,
    len: usize,
    strides: [[u64; MAX_RANK]; MAX_TENSORS],
    spans: [u64; MAX_TENSORS],
}

impl Layouts {
    /// Every tensor dense and row-major at these extents (one per dim of the plan).
    pub fn contiguous(plan: &LaunchPlan, extents: &[u64]) -> Result<Self, Error> {
        plan.validate()?;
        let mut out = Layouts {
            inputs: plan.inputs.len(),
            len: plan.inputs.len() + plan.outputs.len(),
            strides: [[0; MAX_RANK]; MAX_TENSORS],
            spans: [0; MAX_TENSORS],
        };
        // `validate` bounds the tensor count by MAX_TENSORS and each rank by MAX_RANK.
        for (slot, spec) in plan.inputs.iter().chain(plan.outputs).enumerate() {
            let mut stride = 1u64;
            for (a, axis) in spec.shape.iter().enumerate().rev() {
                let e = extent(plan, extents, spec, *axis)?;
                out.strides[slot][a] = if e > 1 { stride } else { 0 };
                stride = stride.saturating_mul(e);
            }
            out.spans[slot] = spec.elements(plan, extents)?;
        }
        Ok(out)
    }

    /// Sets the view of input or output `index` after checking it with [`check_view`].
    pub(crate) fn set(
        &mut self,
        plan: &LaunchPlan,
        extents: &[u64],
        role: Role,
        index: usize,
        view: View<'_>,
    ) -> Result<(), Error> {
        let (specs, slot) = match role {
            Role::Input => (plan.inputs, index),
            Role::Output => (plan.outputs, self.inputs + index),
        };
        let Some(spec) = specs.get(index).filter(|_| slot < self.len) else {
            return Err(Error::InvalidArguments {
                kernel: plan.kernel,
                message: format!("{} {}s were passed, but the kernel declares {}", index + 1, role.word(), specs.len()),
            });
        };
        let (strides, span) = check_view(plan, extents, spec, role == Role::Output, view)?;
        self.strides[slot] = strides;
        self.spans[slot] = span;
        Ok(())
    }

    /// What the typed builders record for input or output `index` in a buffer of `len`
    /// elements at `addr`: a view with these strides (checked and stored), or, for `None`, the
    /// dense tensor already recorded, whose start must still be aligned.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &mut self,
        plan: &LaunchPlan,
        extents: &[u64],
        role: Role,
        index: usize,
        strides: Option<&[usize]>,
        len: usize,
        addr: u64,
    ) -> Result<(), Error> {
        match strides {
            Some(strides) => self.set(plan, extents, role, index, View { strides, len, addr }),
            None => check_start(plan, crate::plan::spec(plan, role, index)?, addr),
        }
    }

    /// Sets the view of input `i`: `strides` in elements, one per declared axis, in a buffer of
    /// `len` elements starting at address `addr` (checked as [`check_view`] says).
    pub fn set_input(
        &mut self,
        plan: &LaunchPlan,
        extents: &[u64],
        i: usize,
        strides: &[usize],
        len: usize,
        addr: u64,
    ) -> Result<(), Error> {
        self.set(plan, extents, Role::Input, i, View { strides, len, addr })
    }

    /// Sets the view of output `o`, as [`Layouts::set_input`] does.
    pub fn set_output(
        &mut self,
        plan: &LaunchPlan,
        extents: &[u64],
        o: usize,
        strides: &[usize],
        len: usize,
        addr: u64,
    ) -> Result<(), Error> {
        self.set(plan, extents, Role::Output, o, View { strides, len, addr })
    }

    /// The element stride of axis `axis` of input `i` (0 for an axis of extent 1).
    pub fn input_stride(&self, i: usize, axis: usize) -> Option<u64> {
        (i < self.inputs).then(|| self.strides[i].get(axis).copied()).flatten()
    }

    /// The element stride of axis `axis` of output `o`.
    pub fn output_stride(&self, o: usize, axis: usize) -> Option<u64> {
        (self.inputs + o < self.len).then(|| self.strides[self.inputs + o].get(axis).copied()).flatten()
    }

    /// The elements input `i`'s view spans, from its first element to its last.
    pub fn input_span(&self, i: usize) -> Option<u64> {
        (i < self.inputs).then(|| self.spans[i])
    }

    /// The elements output `o`'s view spans.
    pub fn output_span(&self, o: usize) -> Option<u64> {
        (self.inputs + o < self.len).then(|| self.spans[self.inputs + o])
    }
}

impl fmt::Debug for Layouts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let views: Vec<(&[u64], u64)> = (0..self.len).map(|i| (&self.strides[i][..], self.spans[i])).collect();
        f.debug_struct("Layouts").field("inputs", &self.inputs).field("views", &views).finish()
    }
}

/// A view of a tensor in the buffer passed for it: one element stride per declared axis
/// (the last must be 1 unless its extent is 1), the buffer's length in elements, and its
/// address (for the alignment check).
#[derive(Clone, Copy, Debug)]
pub(crate) struct View<'a> {
    pub(crate) strides: &'a [usize],
    pub(crate) len: usize,
    pub(crate) addr: u64,
}

/// The byte alignment kernels may assume of a tensor's rows and start: 16 when its last axis
/// is a static extent of whole 16-byte chunks (the kernels then copy it in 16-byte chunks, as
/// they may for a dense tensor), else its element size. A dense tensor from an allocator meets
/// it, so a view is asked for no more than the tensor it stands for.
pub fn alignment(plan: &LaunchPlan, spec: &TensorSpec) -> u64 {
    let size = u64::from(spec.dtype.size_bytes());
    // The last axis' static extent: a dim, or a merge of static dims.
    let last = spec.shape.last().and_then(|a| match a {
        Axis::Dim(_) | Axis::Merged(_) => a
            .dims()
            .iter()
            .try_fold(1u64, |acc, d| plan.dims.get(usize::from(*d)).filter(|d| !d.dynamic).map(|d| acc * d.value)),
        _ => None,
    });
    match last {
        Some(e) if (e * size) % 16 == 0 => 16,
        _ => size,
    }
}

/// Checks that a tensor starting at `addr` is as aligned as its kernels assume.
pub(crate) fn check_start(plan: &LaunchPlan, spec: &TensorSpec, addr: u64) -> Result<(), Error> {
    let align = alignment(plan, spec);
    if addr % align == 0 {
        Ok(())
    } else {
        Err(Error::View {
            arg: spec.name,
            message: format!("starts at an address that is not {align}-byte aligned, as its kernels need"),
        })
    }
}

fn extent(plan: &LaunchPlan, extents: &[u64], spec: &TensorSpec, axis: Axis) -> Result<u64, Error> {
    axis.extent(extents).ok_or_else(|| Error::InvalidPlan {
        kernel: plan.kernel,
        reason: format!("tensor `{}` has an axis whose dims have no extent", spec.name),
    })
}

/// Checks a view of `spec` and returns its strides (0 for axes of extent 1) and the elements
/// it spans. The view must give one stride per axis, keep the last axis contiguous, lie inside
/// the buffer, be aligned as [`alignment`] says, and, for an output, have nested strides: in
/// increasing stride, each axis steps past everything the axes before it reach. That proves
/// each element is reached once; interleaved strides that happen to be injective too are
/// refused rather than searched.
pub(crate) fn check_view(
    plan: &LaunchPlan,
    extents: &[u64],
    spec: &TensorSpec,
    output: bool,
    view: View<'_>,
) -> Result<([u64; MAX_RANK], u64), Error> {
    let arg = spec.name;
    let fail = |message: String| Err(Error::View { arg, message });
    let rank = spec.shape.len();
    if view.strides.len() != rank {
        return fail(format!(
            "{} strides were given for a tensor of {rank} axes; pass one per axis, in elements",
            view.strides.len()
        ));
    }
    let mut strides = [0u64; MAX_RANK];
    // (extent, stride) of every axis that spans more than one index.
    let mut wide: [(u64, u64); MAX_RANK] = [(0, 0); MAX_RANK];
    let mut n_wide = 0;
    let mut span = 1u64;
    for (a, (axis, &s)) in spec.shape.iter().zip(view.strides).enumerate() {
        let e = extent(plan, extents, spec, *axis)?;
        if e <= 1 {
            continue;
        }
        let s = s as u64;
        if a + 1 == rank && s != 1 {
            return fail(format!(
                "its last axis has stride {s}; kernels read rows contiguously, so the last stride must be 1 \
                 (declare the tensor in its storage order and `transpose` it in the body, or pass a copy)"
            ));
        }
        let reach = (e - 1).checked_mul(s).and_then(|r| span.checked_add(r)).filter(|&r| r <= MAX_TENSOR_ELEMENTS);
        let Some(reach) = reach else {
            return fail(format!("with strides {:?} it spans more than 2^48 elements", view.strides));
        };
        span = reach;
        strides[a] = s;
        wide[n_wide] = (e, s);
        n_wide += 1;
    }
    if u64::try_from(view.len).map_or(true, |len| span > len) {
        return fail(format!(
            "with strides {:?} it spans {span} elements, but the buffer holds {}",
            view.strides, view.len
        ));
    }
    check_start(plan, spec, view.addr)?;
    let align = alignment(plan, spec);
    let size = u64::from(spec.dtype.size_bytes());
    if let Some(a) = (0..rank.saturating_sub(1)).find(|&a| (strides[a] * size) % align != 0) {
        return fail(format!(
            "axis {a} has stride {} elements, not a multiple of {align} bytes, as its kernels need",
            strides[a]
        ));
    }
    if output {
        // Axes in increasing stride: each must step past everything the axes inside it reach,
        // or two indices would name one element and blocks would race on it.
        let wide = &mut wide[..n_wide];
        wide.sort_unstable_by_key(|&(_, s)| s);
        let mut inner = 0u64;
        for &(e, s) in wide.iter() {
            if s <= inner {
                return fail(format!(
                    "with strides {:?} two of its elements share one address; an output must not overlap itself",
                    view.strides
                ));
            }
            inner += (e - 1) * s;
        }
    }
    Ok((strides, span))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{DType, DimSpec};

    /// `k: f16[h, l, d]` with `d` 64 (16-byte rows) and dynamic `l`; `o: f32[l, 3]`.
    static PLAN: LaunchPlan = LaunchPlan {
        kernel: "views",
        dims: &[
            DimSpec { name: "h", value: 2, dynamic: false, derive: None },
            DimSpec { name: "l", value: 8, dynamic: true, derive: None },
            DimSpec { name: "d", value: 64, dynamic: false, derive: None },
            DimSpec { name: "c", value: 3, dynamic: false, derive: None },
        ],
        inputs: &[TensorSpec { name: "k", dtype: DType::F16, shape: &[Axis::Dim(0), Axis::Dim(1), Axis::Dim(2)] }],
        outputs: &[TensorSpec { name: "o", dtype: DType::F32, shape: &[Axis::Dim(1), Axis::Dim(3)] }],
        workspaces: &[],
        launches: &[],
        tables: &[],
    };

    fn check(output: bool, strides: &[usize], len: usize, addr: u64) -> Result<([u64; MAX_RANK], u64), String> {
        let spec = if output { &PLAN.outputs[0] } else { &PLAN.inputs[0] };
        check_view(&PLAN, &[2, 5, 64, 3], spec, output, View { strides, len, addr }).map_err(|e| e.to_string())
    }

    #[test]
    fn dense_layouts_are_row_major() {
        let l = Layouts::contiguous(&PLAN, &[2, 5, 64, 3]).unwrap();
        assert_eq!(&l.strides[0][..3], &[320, 64, 1]);
        assert_eq!(l.input_span(0), Some(640));
        assert_eq!(l.output_stride(0, 0), Some(3));
        assert_eq!(l.output_span(0), Some(15));
        assert_eq!(l.output_span(1), None);
        // A dense view checks out to the same strides and span.
        assert_eq!(check(false, &[320, 64, 1], 640, 0).unwrap().1, 640);
    }

    #[test]
    fn a_cache_with_spare_capacity_spans_its_last_used_row() {
        // Capacity 12 rows per head, 5 used: the view spans (2-1)·768 + (5-1)·64 + 63 + 1.
        let (s, span) = check(false, &[12 * 64, 64, 1], 2 * 12 * 64, 32).unwrap();
        assert_eq!(&s[..3], &[768, 64, 1]);
        assert_eq!(span, 768 + 4 * 64 + 64);
        assert!(check(false, &[12 * 64, 64, 1], span as usize - 1, 0).unwrap_err().contains("spans 1088 elements"));
    }

    #[test]
    fn bad_views_are_located_errors() {
        let e = check(false, &[320, 64], 640, 0).unwrap_err();
        assert!(e.starts_with("argument `k`: 2 strides were given for a tensor of 3 axes"), "{e}");
        let e = check(false, &[320, 1, 5], 4000, 0).unwrap_err();
        assert!(e.contains("its last axis has stride 5"), "{e}");
        // 16-byte rows: the start and every stride must keep them aligned.
        assert!(check(false, &[320, 64, 1], 700, 2).unwrap_err().contains("not 16-byte aligned"));
        assert!(check(false, &[324, 64, 1], 700, 0).unwrap_err().contains("axis 0 has stride 324"));
        assert!(check(false, &[usize::MAX / 2, 64, 1], 700, 0).unwrap_err().contains("2^48"));
        // An f32 output of 3-element rows needs only element alignment.
        assert_eq!(check(true, &[5, 1], 25, 4).unwrap().1, 4 * 5 + 3);
        assert!(check(true, &[2, 1], 25, 4).unwrap_err().contains("overlap itself"));
        assert!(check(true, &[0, 1], 25, 4).unwrap_err().contains("overlap itself"));
    }

    /// Every small view against brute force: the span is one past the largest offset, an
    /// accepted output never has two elements at one offset, every output whose strides nest
    /// (rows inside planes, in either axis order) is accepted, and a view one element longer
    /// than its buffer is refused.
    #[test]
    fn small_views_agree_with_enumeration() {
        static T: LaunchPlan = LaunchPlan {
            kernel: "t",
            dims: &[
                DimSpec { name: "a", value: 2, dynamic: true, derive: None },
                DimSpec { name: "b", value: 2, dynamic: true, derive: None },
                DimSpec { name: "c", value: 2, dynamic: true, derive: None },
            ],
            inputs: &[],
            outputs: &[TensorSpec { name: "y", dtype: DType::F32, shape: &[Axis::Dim(0), Axis::Dim(1), Axis::Dim(2)] }],
            workspaces: &[],
            launches: &[],
            tables: &[],
        };
        let mut checked = 0;
        for e in (0..27).map(|i| [1 + i / 9, 1 + (i / 3) % 3, 1 + i % 3]) {
            for (sa, sb) in (0..64).map(|i| (i / 8, i % 8)) {
                let strides = [sa, sb, 1];
                let mut offsets = Vec::new();
                for i in 0..e[0] {
                    for j in 0..e[1] {
                        for k in 0..e[2] {
                            offsets.push(i * sa + j * sb + k);
                        }
                    }
                }
                let span = offsets.iter().max().unwrap() + 1;
                let mut sorted = offsets.clone();
                sorted.sort_unstable();
                sorted.dedup();
                let distinct = sorted.len() == offsets.len();
                let extents = e.map(|x| x as u64);
                for output in [false, true] {
                    let view = |len| View { strides: &strides, len, addr: 0 };
                    let got = check_view(&T, &extents, &T.outputs[0], output, view(span));
                    match got {
                        Ok((_, s)) => {
                            assert_eq!(s, span as u64, "extents {e:?} strides {strides:?}");
                            assert!(distinct || !output, "accepted an overlapping output: {e:?} {strides:?}");
                            let short = check_view(&T, &extents, &T.outputs[0], output, view(span - 1));
                            assert!(short.is_err(), "{e:?} {strides:?} fits one element short");
                        }
                        Err(err) => {
                            // Interleaved strides can be injective ([3, 2] over 2 × 3); the
                            // rule refuses them rather than solve a packing problem per call.
                            let nested = |outer: usize, so: usize, inner: usize, si: usize| {
                                outer == 1 || inner == 1 || so >= (inner - 1) * si + e[2]
                            };
                            let nests = nested(e[0], sa, e[1], sb) || nested(e[1], sb, e[0], sa);
                            let trivially = (e[0] == 1 || sa >= e[2]) && (e[1] == 1 || sb >= e[2]);
                            assert!(output && !(nests && trivially), "refused {e:?} {strides:?}: {err}");
                        }
                    }
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 27 * 64 * 2);
    }

    #[test]
    fn inputs_may_broadcast_through_a_zero_stride() {
        let (s, span) = check(false, &[0, 64, 1], 320, 0).unwrap();
        assert_eq!((&s[..3], span), (&[0, 64, 1][..], 320));
    }
}
