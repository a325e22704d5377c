//! The launch plan at the limits of the declaration language: every dim index, extent and
//! tensor axis survives the trip from the declaration through the plan data to the runtime's
//! plan unchanged (the host and CUDA executors index buffers by what the plan says), and a
//! declaration beyond what a launch can hold stops at the front end with a located error, so no
//! plan field can overflow.

use cleave::emulate::leak_plan;
use cleave_core::codegen::plan::plan_data;
use cleave_core::front::{check_source, MAX_DIM, MAX_RANK};
use cleave_core::graph::Dim;
use cleave_core::pipeline::{compile, Options};
use cleave_runtime::plan::Axis;

fn compiled(yaml: &str) -> cleave_core::pipeline::Compiled {
    let g = check_source(yaml.as_bytes()).expect("the declaration checks").kernels.remove(0).1;
    compile(&g, &Options::default()).expect("compiles")
}

#[test]
fn a_plan_at_the_limits_round_trips() {
    // Six axes (the most a tensor has), a dynamic dim at the largest extent a dim may declare
    // (the others within the 2^48-element limit of a tensor), static ones around them, and more
    // declared dims than any tensor uses.
    let mut dims: Vec<String> = (0..40).map(|i| format!("u{i}: {}", 2 + i)).collect();
    dims.extend([
        format!("a: {{ value: {MAX_DIM}, dynamic: true }}"),
        "b: 3".into(),
        "c: { value: 16, dynamic: true }".into(),
        "d: 5".into(),
        "e: 1".into(),
        "f: { value: 64, dynamic: true }".into(),
    ]);
    assert_eq!(MAX_RANK, 6);
    let yaml = format!(
        "kernels:\n  - name: edge\n    dims: {{ {} }}\n    inputs: {{ x: \"f16[a, b, c, d, e, f]\", s: \"f32[]\" }}\n    outputs: {{ y: \"f32[a, b, c, d, e, f]\" }}\n    body: |\n      y = x * s\n",
        dims.join(", ")
    );
    let c = compiled(&yaml);
    let launch = c.best();
    let plan = plan_data(launch, "edge").expect("plan data");
    let rt = leak_plan(&plan);
    let table = launch.dims();
    // Every dim the plan passes keeps its name, value and flag.
    for d in rt.dims {
        let v = table.find(d.name).unwrap_or_else(|| panic!("dim {} is not the kernel's", d.name));
        assert_eq!((d.value, d.dynamic), (table.get(v).value, table.get(v).dynamic), "{}", d.name);
    }
    // Every axis of every tensor names the same dim it was declared over.
    let g = &launch.graph;
    let decls = g.inputs.iter().map(|i| &i.decl).chain(g.outputs.iter().map(|o| &o.decl));
    let specs = rt.inputs.iter().chain(rt.outputs);
    for (decl, spec) in decls.zip(specs) {
        assert_eq!(decl.name, spec.name);
        assert_eq!(decl.shape.len(), spec.shape.len(), "{}", decl.name);
        for (d, a) in decl.shape.iter().zip(spec.shape) {
            match (d, a) {
                (Dim::One, Axis::One) => {}
                (Dim::Var(v), Axis::Dim(i)) => assert_eq!(rt.dims[usize::from(*i)].name, table.get(*v).name),
                other => panic!("{}: axis {other:?}", decl.name),
            }
        }
    }
    assert!(rt.dims.iter().any(|d| d.value == MAX_DIM as u64 && d.dynamic));
}

/// The code generator restates the runtime's plan limits (cleave-core cannot depend on the
/// runtime), and the front end's limits stay within them, so that a declaration it accepts
/// always gets a plan the allocation-free launch path can hold.
#[test]
fn the_limits_of_the_front_end_the_generator_and_the_runtime_agree() {
    use cleave_core::codegen::rust;
    use cleave_runtime::plan as rt;
    assert_eq!(rust::RUNTIME_MAX_DIMS, rt::MAX_DIMS);
    assert_eq!(rust::RUNTIME_MAX_TENSORS, rt::MAX_TENSORS);
    assert_eq!(rust::RUNTIME_MAX_WORKSPACES, rt::MAX_WORKSPACES);
    assert_eq!(rust::RUNTIME_MAX_PARAMS, rt::MAX_PARAMS);
    const { assert!(cleave_core::front::MAX_DIMS <= rt::MAX_DIMS) };
    const { assert!(cleave_core::front::MAX_TENSORS <= rt::MAX_TENSORS) };
}

/// A declaration with more dims than a launch's extent table holds stops at the front end, at
/// the first dim too many; that also keeps every dim index far inside the plan's 16-bit fields.
#[test]
fn more_dims_than_a_launch_holds_is_a_located_error() {
    let n = cleave_core::front::MAX_DIMS + 1;
    let dims: Vec<String> = (0..n).map(|i| format!("u{i}: 2")).collect();
    let yaml = format!(
        "kernels:\n  - name: wide\n    dims: {{ {} }}\n    inputs: {{ x: \"f32[u0]\" }}\n    outputs: {{ y: \"f32[u0]\" }}\n    body: y = exp(x)\n",
        dims.join(", ")
    );
    let errs = check_source(yaml.as_bytes()).unwrap_err();
    let err = errs[0].render("k.yaml");
    assert!(err.contains(&format!("`u{}` is dim number {n}; a kernel declares at most", n - 1)), "{err}");
    assert!(err.starts_with("k.yaml:3:"), "not located at the dim: {err}");
}
