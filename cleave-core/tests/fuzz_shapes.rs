//! Property tests of the shape engine: any op on any shapes either infers a shape or returns an
//! error, never panics; broadcasting is symmetric; and every shape `infer` accepts evaluates in
//! the reference interpreter to a tensor of exactly that shape.

use cleave_core::graph::{
    broadcast, infer, validate, BinaryOp, Bindings, DType, Dim, DimTable, Graph, Op, ReduceOp, TensorDecl, UnaryOp,
};
use cleave_core::reference::{eval_nodes, random_inputs, InputScale};
use proptest::prelude::*;

fn table() -> DimTable {
    let mut t = DimTable::new();
    for (n, v) in [("a", 2), ("b", 3), ("c", 5)] {
        t.plain(n, v, false);
    }
    t
}

fn dim() -> impl Strategy<Value = Dim> {
    prop_oneof![Just(Dim::One), (0u32..3).prop_map(|i| Dim::Var(cleave_core::graph::DimVar(i)))]
}

fn shape() -> impl Strategy<Value = Vec<Dim>> {
    prop::collection::vec(dim(), 0..5)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::MatMul),
        Just(Op::Transpose),
        Just(Op::Unary(UnaryOp::Exp)),
        Just(Op::Binary(BinaryOp::Add)),
        Just(Op::Binary(BinaryOp::Max)),
        (0u32..6).prop_map(|a| Op::Reduce(ReduceOp::Sum, a)),
        (0u32..6).prop_map(|a| Op::Reduce(ReduceOp::Max, a)),
        (0u32..6).prop_map(Op::Split),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn inference_never_panics(o in op(), x in shape(), y in shape(), n in 0usize..4) {
        let mut t = table();
        let args: Vec<&[Dim]> = [x.as_slice(), y.as_slice(), x.as_slice()][..n.min(3)].to_vec();
        let _ = infer(&o, &args, &mut t);
    }

    #[test]
    fn broadcasting_is_symmetric(x in shape(), y in shape()) {
        prop_assert_eq!(broadcast(&x, &y).ok(), broadcast(&y, &x).ok());
    }

    #[test]
    fn accepted_shapes_are_the_shapes_the_reference_computes(o in op(), x in shape(), y in shape()) {
        let mut g = Graph::new("k", table());
        let a = g.add_input(TensorDecl::dense("x", DType::F32, x));
        let b = g.add_input(TensorDecl::dense("y", DType::F32, y));
        let args = if o.arity() == 2 { vec![a, b] } else { vec![a] };
        let Ok(out) = g.add(o, &args) else { return Ok(()) };
        let shape = g.shape(out).to_vec();
        // Splits need a count dividing the axis: 2 parts of the instantiated extents below.
        let mut t = g.dims.clone();
        for (v, d) in g.dims.iter() {
            if matches!(d.kind, cleave_core::graph::DimKind::SplitCount { .. }) {
                t.get_mut(v).value = 1;
            }
        }
        g.dims = t;
        if o.arity() == 1 {
            // Keep the unused input used so the graph validates.
            let keep = g.add(Op::Unary(UnaryOp::Neg), &[b]).expect("neg");
            g.add_output(TensorDecl::dense("z", DType::F32, g.shape(keep).to_vec()), keep);
        }
        g.add_output(TensorDecl::dense("o", DType::F32, shape.clone()), out);
        let v = validate(g).expect("a graph of accepted ops validates");
        let mut binds = Bindings::of_table(&v.dims);
        binds.complete(&v.dims);
        let inputs = random_inputs(&v, &binds, 1, &InputScale::default());
        let values = eval_nodes(&v, &binds, &inputs).expect("evaluates");
        prop_assert_eq!(&values[out.index()].shape, &binds.extents(&shape));
    }
}
