//! Extent, length and plan validation.

use cleave_runtime::host::{self, EmuLaunch};
use cleave_runtime::{
    check_len, extents, Axis, DType, DimSpec, Error, Factor, KernelLaunch, LaunchPlan, Layouts, Param, Product,
    TensorSpec, WorkspaceSpec,
};
use std::ffi::{c_int, c_void};

const fn dim(name: &'static str, value: u64, dynamic: bool) -> DimSpec {
    DimSpec { name, value, dynamic, derive: None }
}

static ATTN: LaunchPlan = LaunchPlan {
    kernel: "attention",
    dims: &[dim("h", 32, false), dim("s", 4096, true), dim("l", 4096, true), dim("d", 128, false)],
    inputs: &[
        TensorSpec { name: "q", dtype: DType::F16, shape: &[Axis::Dim(0), Axis::Dim(1), Axis::Dim(3)] },
        TensorSpec { name: "k", dtype: DType::F16, shape: &[Axis::Dim(0), Axis::Dim(2), Axis::Dim(3)] },
    ],
    outputs: &[TensorSpec { name: "o", dtype: DType::F16, shape: &[Axis::Dim(0), Axis::Dim(1), Axis::Dim(3)] }],
    workspaces: &[],
    launches: &[KernelLaunch {
        symbol: "attention_0",
        grid: [Product(&[Factor::CeilDiv(1, 128)]), Product(&[Factor::Dim(0)]), Product(&[])],
        threads: 128,
        smem_bytes: 65_536,
        params: &[Param::Input(0), Param::Input(1), Param::Output(0), Param::Extent(1), Param::Extent(2)],
    }],
    tables: &[],
};

#[test]
fn extents_merge_static_and_dynamic_in_declaration_order() {
    assert_eq!(extents(&ATTN, &[7, 9]).unwrap(), vec![32, 7, 9, 128]);
}

#[test]
fn zero_and_oversized_extents_are_rejected() {
    let err = extents(&ATTN, &[0, 9]).unwrap_err();
    assert!(matches!(err, Error::InvalidExtent { dim: "s", value: 0, .. }), "{err}");
    assert_eq!(err.to_string(), "extent 0 of dim `s` is invalid: extents must be at least 1");

    let err = extents(&ATTN, &[7, 1 << 31]).unwrap_err();
    assert!(matches!(err, Error::InvalidExtent { dim: "l", value: 2_147_483_648, .. }), "{err}");
    assert!(extents(&ATTN, &[7, (1 << 31) - 1]).is_ok(), "the largest extent is allowed");
}

#[test]
fn tensors_above_2_pow_48_elements_are_rejected() {
    static BIG: LaunchPlan = LaunchPlan {
        kernel: "big",
        dims: &[dim("a", 1 << 20, false), dim("b", 1, true), dim("c", 1 << 10, false)],
        inputs: &[TensorSpec { name: "x", dtype: DType::F32, shape: &[Axis::Dim(0), Axis::Dim(1), Axis::Dim(2)] }],
        outputs: &[],
        workspaces: &[],
        launches: &[],
        tables: &[],
    };
    assert!(extents(&BIG, &[1 << 18]).is_ok(), "exactly 2^48 is allowed");
    let err = extents(&BIG, &[(1 << 18) + 1]).unwrap_err();
    assert!(matches!(err, Error::InvalidExtent { dim: "c", .. }), "{err}");
    assert!(err.to_string().contains("2^48"), "{err}");
}

#[test]
fn dynamic_count_must_match() {
    let err = extents(&ATTN, &[7]).unwrap_err();
    assert_eq!(err.to_string(), "kernel `attention` has 2 dynamic dims (s, l), but 1 extents were given");
}

#[test]
fn check_len_names_the_argument_and_expected_length() {
    assert!(check_len("q", 12, 12).is_ok());
    let err = check_len("q", 11, 12).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { arg: "q", expected: 12, got: 11 }));
    assert_eq!(err.to_string(), "argument `q` has 11 elements, but the given extents need exactly 12");
}

#[test]
fn tensor_element_counts_follow_the_shape() {
    let ext = extents(&ATTN, &[7, 9]).unwrap();
    assert_eq!(ATTN.inputs[1].elements(&ATTN, &ext).unwrap(), 32 * 9 * 128);
    let bcast = TensorSpec { name: "b", dtype: DType::F32, shape: &[Axis::One, Axis::Dim(3), Axis::One] };
    assert_eq!(bcast.elements(&ATTN, &ext).unwrap(), 128);
}

#[test]
fn products_evaluate_with_overflow_checks() {
    let ext = [10, 1 << 31, 3];
    assert_eq!(Product(&[]).eval(&ext), Some(1));
    assert_eq!(Product(&[Factor::CeilDiv(0, 4), Factor::Dim(2), Factor::Const(5)]).eval(&ext), Some(3 * 3 * 5));
    assert_eq!(Product(&[Factor::CeilDiv(0, 10)]).eval(&ext), Some(1));
    assert_eq!(Product(&[Factor::CeilDiv(0, 11)]).eval(&ext), Some(1));
    assert_eq!(Product(&[Factor::Dim(1), Factor::Dim(1), Factor::Dim(1)]).eval(&ext), None);
    assert_eq!(Product(&[Factor::CeilDiv(0, u64::MAX)]).eval(&[u64::MAX]), Some(1));
    assert_eq!(Product(&[Factor::Dim(9)]).eval(&ext), None, "a missing dim does not panic");
    assert_eq!(Product(&[Factor::CeilDiv(0, 0)]).eval(&ext), None, "a zero divisor does not panic");
}

#[test]
fn grids_are_checked_against_cuda_limits() {
    let ext = extents(&ATTN, &[4096, 4096]).unwrap();
    assert_eq!(ATTN.launches[0].grid_dims("attention", &ext).unwrap(), [32, 32, 1]);

    let wide =
        KernelLaunch { grid: [Product(&[]), Product(&[Factor::Const(65_536)]), Product(&[])], ..ATTN.launches[0] };
    let err = wide.grid_dims("attention", &ext).unwrap_err();
    assert_eq!(
        err.to_string(),
        "kernel `attention`: launch `attention_0` needs 65536 blocks along grid.y, above the limit of 65535"
    );

    let huge = KernelLaunch {
        grid: [Product(&[Factor::Dim(1), Factor::Dim(2), Factor::Dim(3)]), Product(&[]), Product(&[])],
        ..wide
    };
    assert!(matches!(huge.grid_dims("attention", &ext), Err(Error::GridTooLarge { axis: 'x', .. })));

    let overflow = KernelLaunch {
        grid: [Product(&[Factor::Const(u64::MAX), Factor::Const(2)]), Product(&[]), Product(&[])],
        ..wide
    };
    let err = overflow.grid_dims("attention", &ext).unwrap_err();
    assert_eq!(err.to_string(), "kernel `attention`: grid.x of launch `attention_0` overflows for the given extents");
}

#[test]
fn workspace_size_overflow_is_an_error() {
    static WS: LaunchPlan = LaunchPlan {
        kernel: "ws",
        dims: &[dim("n", 1, true)],
        inputs: &[],
        outputs: &[],
        workspaces: &[WorkspaceSpec {
            elem_bytes: 4,
            len: Product(&[Factor::Dim(0), Factor::Dim(0), Factor::Dim(0), Factor::Const(1 << 40)]),
        }],
        launches: &[],
        tables: &[],
    };
    let ext = extents(&WS, &[(1 << 31) - 1]).unwrap();
    let layouts = Layouts::contiguous(&WS, &ext).unwrap();
    // SAFETY: the plan has no tensors and no launches.
    let err = unsafe { host::execute(&WS, &[], &ext, &layouts, &[], &[], 0) }.unwrap_err();
    assert_eq!(err.to_string(), "kernel `ws`: the size of workspace 0 overflows for the given extents");
}

/// Builds a plan at run time, as the command-line tool does, from a template with one field
/// changed.
fn leaked(edit: impl FnOnce(&mut KernelLaunch)) -> &'static LaunchPlan {
    let mut launch = ATTN.launches[0];
    edit(&mut launch);
    let launches: &'static [KernelLaunch] = Box::leak(vec![launch].into_boxed_slice());
    Box::leak(Box::new(LaunchPlan { launches, ..ATTN }))
}

#[test]
fn inconsistent_plans_are_errors() {
    let cases: [(&LaunchPlan, &str); 5] = [
        (leaked(|l| l.params = &[Param::Input(2)]), "passes input 2, but the plan has 2"),
        (leaked(|l| l.params = &[Param::Extent(4)]), "passes dim 4, but the plan has 4"),
        (leaked(|l| l.grid[1] = Product(&[Factor::CeilDiv(1, 0)])), "divides by zero"),
        (leaked(|l| l.threads = 2048), "2048 threads per block"),
        (leaked(|l| l.symbol = "a\0b"), "NUL"),
    ];
    for (plan, want) in cases {
        let err = plan.validate().unwrap_err();
        assert!(matches!(err, Error::InvalidPlan { kernel: "attention", .. }), "{err}");
        assert!(err.to_string().contains(want), "{err} should mention {want}");
        assert!(extents(plan, &[1, 1]).is_err());
    }
    assert!(leaked(|_| {}).validate().is_ok());
}

#[test]
fn a_zero_grid_launches_nothing() {
    unsafe extern "C" fn must_not_run(_l: *const EmuLaunch, _args: *const *mut c_void) -> c_int {
        1
    }
    let plan = leaked(|l| l.grid[2] = Product(&[Factor::Const(0)]));
    let ext = extents(plan, &[1, 1]).unwrap();
    // h=32, s=l=1, d=128: 4096 f16 elements per tensor.
    let (q, k, mut o) = (vec![0u8; 8192], vec![0u8; 8192], vec![0u8; 8192]);
    let layouts = Layouts::contiguous(plan, &ext).unwrap();
    // SAFETY: the buffers hold each tensor's 4096 f16 elements; `must_not_run` is never called.
    let res = unsafe {
        host::execute(plan, &[must_not_run], &ext, &layouts, &[q.as_ptr(), k.as_ptr()], &[o.as_mut_ptr()], 0)
    };
    assert!(res.is_ok(), "{res:?}");
}

/// A split decode: `s` parts of every request, counted by the launcher from the batch and the
/// page table's length; partials `[s, b, 8]` in the workspace.
static SPLIT: LaunchPlan = LaunchPlan {
    kernel: "split",
    dims: &[
        dim("b", 16, true),
        dim("entries", 4096, true),
        DimSpec {
            name: "s",
            value: 2,
            dynamic: false,
            derive: Some(cleave_runtime::Derive::SplitCount {
                blocks: Product(&[Factor::Dim(0), Factor::Const(8)]),
                streams: Product(&[Factor::Dim(0), Factor::Const(8)]),
                entries: Product(&[Factor::Dim(1)]),
                batch: Some(0),
                sms: 132,
                resident: 2,
                fill: 102,
                launch: Some(0),
            }),
        },
    ],
    inputs: &[],
    outputs: &[],
    workspaces: &[WorkspaceSpec { elem_bytes: 4, len: Product(&[Factor::Dim(2), Factor::Dim(0), Factor::Const(8)]) }],
    launches: &[KernelLaunch {
        symbol: "split_0",
        grid: [Product(&[Factor::Dim(2)]), Product(&[Factor::Dim(0), Factor::Const(8)]), Product(&[])],
        threads: 128,
        smem_bytes: 67_840,
        params: &[Param::Workspace(0), Param::Extent(2)],
    }],
    tables: &[],
};

#[test]
fn split_counts_follow_the_extents_and_the_workspace_bound_covers_smaller_ones() {
    // 16 requests × 8 blocks of distinct keys are 128 blocks, about one per SM, already as
    // many as keep DRAM busy (102 on the plan's GPU), so more parts would only add partials:
    // 1. One request over 8 blocks takes 13 parts (104 blocks); requests of fewer than 256
    // entries (two chunks of 128) are not split.
    assert_eq!(extents(&SPLIT, &[16, 16 * 1024]).unwrap()[2], 1);
    assert_eq!(extents(&SPLIT, &[1, 65536]).unwrap()[2], 13);
    assert_eq!(extents(&SPLIT, &[16, 16 * 200]).unwrap()[2], 1);
    // Blocks that read the same keys (row tiles of one head) gain from a second block per SM,
    // which streams from L2 beside the first: 2 parts where distinct keys take 1.
    let shape = |streams| cleave_runtime::SplitShape {
        blocks: 128,
        streams,
        per_request: 4096,
        sms: 132,
        resident: 2,
        fill: 102,
    };
    assert_eq!(cleave_runtime::split_count(shape(32)), 2);
    assert_eq!(cleave_runtime::split_count(shape(128)), 1);
    // A workspace sized for some extents holds every launch at smaller ones, though a smaller
    // batch takes more parts per request.
    let bound = |d: &[u64]| {
        let e = cleave_runtime::plan::Extents::new(&SPLIT, &d.iter().map(|x| *x as usize).collect::<Vec<_>>())
            .unwrap()
            .with_largest_splits(&SPLIT);
        SPLIT.workspaces[0].len.eval(&e).unwrap()
    };
    let need = |d: &[u64]| {
        let e = extents(&SPLIT, &d.iter().map(|x| *x as usize).collect::<Vec<_>>()).unwrap();
        SPLIT.workspaces[0].len.eval(&e).unwrap()
    };
    for b in 1..=16u64 {
        for entries in [1, 300, 4096, 60000] {
            assert!(need(&[b, entries]) <= bound(&[16, 60000]), "b={b} entries={entries}");
        }
    }
}

#[test]
fn a_launch_splits_for_the_sms_of_its_device() {
    // The plan was made for 132 SMs; the launcher on a device of another count spreads the
    // grid over that device's SMs instead, and the workspace bound holds for every device.
    use cleave_runtime::plan::Extents;
    let parts = |d: &[usize], sms: Option<u32>| Extents::on(&SPLIT, d, sms).unwrap()[2];
    // 4 requests × 8 blocks: 32 blocks take 4 parts on 132 SMs (128 blocks, one per SM) and
    // on 108 (two on 20 of them, side by side); a 16-SM device gains nothing from a split.
    assert_eq!(parts(&[4, 4 * 4096], None), 4);
    assert_eq!(parts(&[4, 4 * 4096], Some(132)), 4);
    assert_eq!(parts(&[4, 4 * 4096], Some(108)), 4);
    assert_eq!(parts(&[4, 4 * 4096], Some(16)), 1);
    let bound = Extents::new(&SPLIT, &[4, 4 * 4096]).unwrap().with_largest_splits(&SPLIT);
    for sms in [1, 16, 46, 78, 108, 114, 132, 170, 4096] {
        let e = Extents::on(&SPLIT, &[4, 4 * 4096], Some(sms)).unwrap();
        assert!(
            SPLIT.workspaces[0].len.eval(&e).unwrap() <= SPLIT.workspaces[0].len.eval(&bound).unwrap(),
            "{sms} SMs"
        );
    }
}

#[test]
fn a_launch_splits_for_the_blocks_its_device_holds_per_sm() {
    // The plan's estimate says an SM holds two blocks of the split kernel; the driver, which
    // knows the compiled kernel's registers, may say otherwise, and its count is the one used.
    use cleave_runtime::plan::{derive_extents_on, Device, Extents};
    let with =
        |d: &[usize], resident: &[u32]| Extents::for_device(&SPLIT, d, Device { sms: Some(132), resident }).unwrap()[2];
    // 16 requests of 4096 over 8 blocks each (128 blocks, blocks of distinct keys): one part
    // whatever the residency, as DRAM is the bound.
    for r in [0, 1, 2, 3, 8] {
        assert_eq!(with(&[16, 16 * 4096], &[r]), 1, "resident {r}");
    }
    // 6 requests over 8 blocks: 48 blocks, where the count the rule picks depends on how many
    // blocks an SM holds. The driver's count decides; 0 or no entry leaves the plan's.
    let d = [6, 6 * 4096];
    assert_eq!(with(&d, &[]), with(&d, &[2]));
    assert_eq!(with(&d, &[0]), with(&d, &[2]));
    let (one, two) = (with(&d, &[1]), with(&d, &[2]));
    let shape = |resident| cleave_runtime::SplitShape {
        blocks: 48,
        streams: 48,
        per_request: 4096,
        sms: 132,
        resident,
        fill: 102,
    };
    assert_eq!((one, two), (cleave_runtime::split_count(shape(1)), cleave_runtime::split_count(shape(2))));
    assert_ne!(one, two, "the residency must matter at these extents for the test to mean anything");
    // Re-deriving extents for a device changes only the split count, and pinned extents are
    // not re-derived by anyone but `derive_extents_on` itself.
    let planned = Extents::on(&SPLIT, &d, Some(132)).unwrap();
    let device = planned.rederived(&SPLIT, Device { sms: Some(132), resident: &[1] });
    assert_eq!((device[0], device[1], device[2]), (planned[0], planned[1], one));
    let mut values = planned.to_vec();
    derive_extents_on(&SPLIT, &mut values, Device { sms: Some(132), resident: &[1] });
    assert_eq!(values, device.to_vec());
    // A plan whose split count names a launch it does not have is refused with the names.
    let missing = LaunchPlan { launches: &[], ..SPLIT };
    let err = Extents::new(&missing, &[2, 8192]).unwrap_err().to_string();
    assert!(err.contains("`s` names launch 0, but the plan has 0"), "{err}");
    // Nor may a tensor be sized by a split count: the launch re-derives it after the checks.
    let sized = LaunchPlan {
        outputs: &[TensorSpec { name: "partials", dtype: DType::F32, shape: &[Axis::Dim(2), Axis::Dim(0)] }],
        ..SPLIT
    };
    let err = Extents::new(&sized, &[2, 8192]).unwrap_err().to_string();
    assert!(err.contains("tensor `partials` is sized by `s`, a split count the launcher derives"), "{err}");
}

#[test]
fn a_pinned_split_count_replaces_the_launchers_within_its_range() {
    use cleave_runtime::plan::Extents;
    // 4 requests of 4096 entries: the launcher picks 4 parts on 132 SMs and 1 on 16, and
    // would take at most 32 (chunks of at least 128 entries).
    let pinned =
        |d: &[usize], sms: Option<u32>, s: u64| Extents::on(&SPLIT, d, sms).and_then(|e| e.with_split_count(&SPLIT, s));
    for s in [1, 5, 12, 32] {
        for sms in [None, Some(108), Some(16)] {
            let e = pinned(&[4, 4 * 4096], sms, s).unwrap();
            assert_eq!(e[2], s, "{s} parts on {sms:?} SMs");
            // The declared extents are untouched.
            assert_eq!((e[0], e[1]), (4, 4 * 4096));
        }
    }
    // The workspace sized for these extents holds every pinned count's partials.
    let bound = Extents::new(&SPLIT, &[4, 4 * 4096]).unwrap().with_largest_splits(&SPLIT);
    let most = SPLIT.workspaces[0].len.eval(&bound).unwrap();
    for s in 1..=32 {
        assert!(SPLIT.workspaces[0].len.eval(&pinned(&[4, 4 * 4096], None, s).unwrap()).unwrap() <= most);
    }
    // Outside 1..=most for these extents: a located error, and no extents.
    for (d, s, most) in
        [([4usize, 4 * 4096], 0, 32), ([4, 4 * 4096], 33, 32), ([4, 4 * 300], 3, 2), ([16, 16 * 100], 2, 1)]
    {
        let err = pinned(&d, None, s).unwrap_err().to_string();
        assert!(err.contains("split") && err.contains(&format!("1 to {most} parts")), "{d:?} {s}: {err}");
        assert!(err.contains("`s`") && err.contains("kernel `split`"), "{err}");
    }
    // The host builder takes the same pin, and refuses a plan with no split count.
    let mut args = host::Args::new(&SPLIT, &[4, 4 * 4096]).unwrap();
    args.split_count(7).unwrap();
    assert_eq!(args.extents()[2], 7);
    assert!(args.split_count(40).is_err());
    assert_eq!(args.extents()[2], 7, "a refused pin leaves the extents as they were");
    let err = host::Args::new(&ATTN, &[3, 5]).unwrap().split_count(2).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("chooses no split count"), "{err}");
}
