//! Checks a [`KernelDecl`] and turns it into a validated [`Graph`].
//!
//! Composites expand here: `softmax(x)` is `exp(x) / sum(exp(x))` and `rmsnorm(x)` is
//! `x * rsqrt(mean(square(x)) + eps)`, in their exact mathematical form. Making them numerically
//! safe is the scheduler's job, which it can do only because it sees the primitives. Equal
//! subexpressions share one node, and constant subexpressions are folded.

use std::collections::HashMap;

use super::decl::{AxisDecl, KernelDecl, PerRequestDecl, StorageAxisDecl, TensorSrc};
use super::diag::{Diagnostic, Pos};
use super::expr::{parse, Arg, BinTok, Expr, ExprKind};
use super::ident::{check_ident, check_name, NameKind};
use crate::graph::{
    normalize_axis, validate, BinaryOp, DType, Dim, DimTable, DimVar, Graph, IndexRef, Layout, Mask, NodeId, Op,
    PerRequest, PerRequestKind, ReduceOp, Shape, StoreAxis, TensorDecl, UnaryOp, ValidGraph, MAX_DIAGONAL,
};

/// The largest extent of one axis. Grids, loop counters and per-axis offsets are 32-bit.
pub const MAX_DIM: i128 = (1 << 31) - 1;
/// The largest number of elements in one tensor; offsets are computed in 64 bits.
pub const MAX_ELEMENTS: u128 = 1 << 48;

/// Most axes of a declared tensor. Every later stage instantiates tensors at small extents per
/// axis (the search's fingerprints, its float check), whose size grows exponentially in the
/// rank; six axes cover batched multi-head layouts with room to spare.
pub const MAX_RANK: usize = 6;

/// Most ops in one kernel's body (after `softmax` and `rmsnorm` expand).
pub const MAX_OPS: usize = 128;

/// Most inputs and outputs of one kernel (the search numbers its leaves in 16 bits, and a
/// launcher takes one parameter each).
pub const MAX_TENSORS: usize = 64;

/// Most dims of one kernel: a launch holds one extent per dim in a fixed-size table, so that
/// launching allocates nothing (the runtime's `plan::MAX_DIMS`).
pub const MAX_DIMS: usize = 128;

/// Names the body language reserves for its functions.
pub const FUNCTIONS: &[&str] = &[
    "matmul",
    "transpose",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "square",
    "recip",
    "silu",
    "sigmoid",
    "gelu",
    "max",
    "sum",
    "mean",
    "softmax",
    "rmsnorm",
    "causal",
];

/// Default `eps` of `rmsnorm`.
pub const RMSNORM_EPS: f64 = 1e-6;

/// Most plans one kernel's extents ask for: the declared extents and every combination of
/// the `also` extents of its dims. Each is a search and a schedule at build time and a plan
/// in the binary.
pub const MAX_POINTS: usize = 8;

/// Checks one declaration and builds its graph. A declaration with `also` extents is checked
/// at each of them too ([`points`]), so that every plan the build makes exists.
pub fn lower(decl: &KernelDecl) -> Result<ValidGraph, Diagnostic> {
    let graph = lower_at(decl)?;
    if decl.dims.iter().any(|d| !d.also.is_empty()) {
        points(decl)?;
    }
    Ok(graph)
}

/// One more set of extents a kernel is planned for, from the `also` extents of its dims.
#[derive(Clone, Debug)]
pub struct Point {
    /// The dims whose extent differs from the declared one, with the extent, in declaration
    /// order (`[("b", 64)]`).
    pub at: Vec<(String, u64)>,
    /// The declared graph at these extents.
    pub graph: ValidGraph,
}

impl Point {
    /// `b=64, l=8192`.
    pub fn label(&self) -> String {
        label(&self.at)
    }

    /// `b64_l8192`: what the symbols of this point's kernels end with, after the point's
    /// number.
    pub fn suffix(&self) -> String {
        self.at.iter().map(|(n, v)| format!("{n}{v}")).collect::<Vec<_>>().join("_")
    }
}

/// Every set of extents besides the declared one that `decl` asks plans for: each combination
/// of its dims' declared and `also` extents, with at least one `also` extent, in declaration
/// order (the last dim's extents vary fastest). Errors: an `also` on a static dim, an extent
/// out of range or given twice, more than [`MAX_POINTS`] plans, and a declaration that does
/// not hold at one of them (reported with the extents).
pub fn points(decl: &KernelDecl) -> Result<Vec<Point>, Diagnostic> {
    // Per dim with `also`: its index and its extents, the declared one first.
    let mut axes: Vec<(usize, Vec<(u64, Pos)>)> = Vec::new();
    let mut count: usize = 1;
    for (i, d) in decl.dims.iter().enumerate() {
        let Some(&(_, first)) = d.also.first() else { continue };
        // A ragged or paged dim's extent differs between the requests and comes from the index
        // tables, not from the launcher's extents, so no launch could pick a plan by it.
        if d.per_request.is_some() {
            return Err(Diagnostic::new(
                first,
                format!(
                    "dim `{}` is ragged or paged: its extent differs between requests, so no launch can pick a plan by it; list more extents on a dynamic dim instead",
                    d.name
                ),
            ));
        }
        if !d.dynamic {
            return Err(Diagnostic::new(
                first,
                format!(
                    "dim `{}` is static; only a dynamic dim has more extents to plan for (declare it `dynamic: true`, or `{}: dyn {} | ..` inline)",
                    d.name, d.name, d.value
                ),
            ));
        }
        let mut values = vec![(d.value as u64, d.value_pos)];
        for &(v, pos) in &d.also {
            if v <= 0 {
                return Err(Diagnostic::new(pos, format!("extent {v} of dim `{}` must be positive", d.name)));
            }
            if v > MAX_DIM {
                return Err(Diagnostic::new(
                    pos,
                    format!("extent {v} of dim `{}` is too large (the limit is {MAX_DIM})", d.name),
                ));
            }
            if let Some((_, at)) = values.iter().find(|(w, _)| i128::from(*w) == v) {
                return Err(Diagnostic::new(
                    pos,
                    format!("extent {v} of dim `{}` is given twice (first at {}:{})", d.name, at.line, at.col),
                ));
            }
            values.push((v as u64, pos));
        }
        count = count.saturating_mul(values.len());
        if count > MAX_POINTS {
            return Err(Diagnostic::new(
                first,
                format!(
                    "kernel `{}` asks for {count} or more plans with the `also` extents up to dim `{}`; at most {MAX_POINTS} are made (each is a search at build time and a plan in the binary)",
                    decl.name, d.name
                ),
            ));
        }
        axes.push((i, values));
    }
    let mut out = Vec::new();
    let mut digits = vec![0usize; axes.len()];
    // The next combination, the last dim fastest; the all-declared one comes first and is the
    // declaration itself.
    while let Some(k) = (0..axes.len()).rev().find(|&k| digits[k] + 1 < axes[k].1.len()) {
        digits[k] += 1;
        for d in &mut digits[k + 1..] {
            *d = 0;
        }
        let mut at_decl = decl.clone();
        let mut at = Vec::new();
        for (&(i, ref values), &digit) in axes.iter().zip(&digits) {
            let (v, pos) = values[digit];
            let d = &mut at_decl.dims[i];
            if digit > 0 {
                at.push((d.name.clone(), v));
            }
            d.value = i128::from(v);
            d.value_pos = pos;
            d.also.clear();
        }
        let graph =
            lower_at(&at_decl).map_err(|e| Diagnostic::new(e.pos, format!("at {}: {}", label(&at), e.message)))?;
        out.push(Point { at, graph });
    }
    Ok(out)
}

/// `b=64, l=8192`: a set of extents as the lockfile, the build's docs and diagnostics show it.
pub fn label(at: &[(String, u64)]) -> String {
    at.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(", ")
}

/// Checks one declaration at its declared extents and builds its graph.
fn lower_at(decl: &KernelDecl) -> Result<ValidGraph, Diagnostic> {
    if let Some(msg) = check_name(&decl.name, NameKind::Kernel) {
        return Err(Diagnostic::new(decl.name_pos, format!("kernel name: {msg}")));
    }
    let mut dims = DimTable::new();
    let mut dim_pos: HashMap<String, Pos> = HashMap::new();
    for (i, d) in decl.dims.iter().enumerate() {
        if i == MAX_DIMS {
            return Err(Diagnostic::new(
                d.pos,
                format!("`{}` is dim number {}; a kernel declares at most {MAX_DIMS} dims", d.name, i + 1),
            ));
        }
        if let Some(msg) = check_name(&d.name, NameKind::Dim) {
            return Err(Diagnostic::new(d.pos, format!("dim name: {msg}")));
        }
        if let Some(first) = dim_pos.get(&d.name) {
            return Err(Diagnostic::new(
                d.pos,
                format!("dim `{}` is declared twice (first at {}:{})", d.name, first.line, first.col),
            ));
        }
        if d.value <= 0 {
            return Err(Diagnostic::new(d.value_pos, format!("dim `{}` must be positive, got {}", d.name, d.value)));
        }
        if d.value > MAX_DIM {
            // Values past i64 arrive through a float; printing them would show rounding noise.
            let shown = if d.value <= i128::from(i64::MAX) { format!(" = {}", d.value) } else { String::new() };
            return Err(Diagnostic::new(
                d.value_pos,
                format!("dim `{}`{shown} is too large (the limit is {MAX_DIM})", d.name),
            ));
        }
        dim_pos.insert(d.name.clone(), d.pos);
        dims.plain(d.name.clone(), d.value as u64, d.dynamic || d.per_request.is_some());
    }
    per_request_dims(decl, &mut dims)?;

    let mut graph = Graph::new(decl.name.clone(), dims);
    let mut env: HashMap<String, Binding> = HashMap::new();
    let mut tensor_pos: HashMap<&str, Pos> = HashMap::new();
    for (i, t) in decl.inputs.iter().chain(&decl.outputs).enumerate() {
        if i == MAX_TENSORS {
            return Err(Diagnostic::new(
                t.pos,
                format!(
                    "`{}` is tensor number {}; a kernel has at most {MAX_TENSORS} inputs and outputs",
                    t.name,
                    i + 1
                ),
            ));
        }
        if let Some(msg) = check_name(&t.name, NameKind::Tensor) {
            return Err(Diagnostic::new(t.pos, format!("tensor name: {msg}")));
        }
        if FUNCTIONS.contains(&t.name.as_str()) {
            return Err(Diagnostic::new(t.pos, format!("`{}` is a function name and cannot name a tensor", t.name)));
        }
        if let Some(first) = tensor_pos.get(t.name.as_str()) {
            return Err(Diagnostic::new(
                t.pos,
                format!("tensor `{}` is declared twice (first at {}:{})", t.name, first.line, first.col),
            ));
        }
        tensor_pos.insert(&t.name, t.pos);
    }
    for t in &decl.inputs {
        let decl_t = tensor_decl(t, &graph.dims)?;
        let index = decl_t.is_index();
        let node = graph.add_input(decl_t);
        if index {
            // An index tensor is used when a per-request dim reads it; the body never may.
            let used = graph
                .dims
                .iter()
                .any(|(_, d)| d.per_request.as_ref().is_some_and(|p| p.tables().iter().any(|r| r.name == t.name)));
            if !used {
                return Err(Diagnostic::new(
                    t.pos,
                    format!(
                        "index tensor `{}` is never used: an `i32` tensor is the `indptr`, `indices` or \
                         `last_page_len` of a ragged or paged dim",
                        t.name
                    ),
                ));
            }
            env.insert(t.name.clone(), Binding { node, pos: t.pos, used: true, input: true });
            continue;
        }
        if let Some(list) = &t.reduce {
            let mut vars = Vec::new();
            for a in list {
                let var = graph
                    .dims
                    .find(&a.name)
                    .filter(|v| graph.inputs.last().is_some_and(|i| i.decl.shape.contains(&Dim::Var(*v))));
                match var {
                    Some(v) => vars.push(v),
                    None => {
                        return Err(Diagnostic::new(
                            a.pos,
                            format!("`reduce` of `{}` names `{}`, which is not one of its dims", t.name, a.name),
                        ))
                    }
                }
            }
            if let Some(input) = graph.inputs.last_mut() {
                input.reduce_override = Some(vars);
            }
        }
        env.insert(t.name.clone(), Binding { node, pos: t.pos, used: false, input: true });
    }
    let outputs: Vec<(TensorDecl, &TensorSrc)> =
        decl.outputs.iter().map(|t| Ok((tensor_decl(t, &graph.dims)?, t))).collect::<Result<_, Diagnostic>>()?;
    // Every tensor that packs a ragged dim packs it into an axis of one extent: the kernels
    // bound the requests' rows by it.
    let packed: Vec<(&TensorSrc, Layout)> = decl
        .inputs
        .iter()
        .zip(&graph.inputs)
        .filter_map(|(src, i)| i.decl.layout.clone().map(|l| (src, l)))
        .chain(outputs.iter().filter_map(|(o, src)| o.layout.clone().map(|l| (*src, l))))
        .collect();
    for (src, layout) in &packed {
        for a in &layout.axes {
            let StoreAxis::Packed { total, ragged } = a else { continue };
            let info = graph.dims.get_mut(*ragged);
            if let Some(PerRequest { kind: PerRequestKind::Ragged { total: t, .. }, .. }) = &mut info.per_request {
                match t {
                    Some(prev) if prev != total => {
                        let (prev, name) = (*prev, info.name.clone());
                        return Err(Diagnostic::new(
                            src.pos,
                            format!(
                                "`{}` packs `{name}` into `{}`, but another tensor packs it into `{}`: the requests' rows \
                                 have one extent",
                                src.name,
                                graph.dims.get(*total).name,
                                graph.dims.get(prev).name
                            ),
                        ));
                    }
                    _ => *t = Some(*total),
                }
            }
        }
    }
    for (o, src) in &outputs {
        if o.is_index() {
            return Err(Diagnostic::new(
                src.dtype_pos,
                format!("output `{}` is i32; outputs are computed values: f16, bf16 or f32", src.name),
            ));
        }
        if o.layout.as_ref().is_some_and(Layout::is_paged) {
            return Err(Diagnostic::new(
                src.pos,
                format!(
                    "output `{}` is paged; a kernel writes packed or dense outputs, not through a page table",
                    src.name
                ),
            ));
        }
    }

    let stmts = parse(&decl.body.text).map_err(|e| Diagnostic::new(decl.body.pos(e.offset), e.message))?;
    if stmts.is_empty() {
        return Err(Diagnostic::new(decl.body.pos(0), "the body has no statements"));
    }
    let mut cx = Lowering { graph, env, decl, memo: HashMap::new() };
    let mut assigned_at: HashMap<String, usize> = HashMap::new();
    for stmt in &stmts {
        let at = decl.body.pos(stmt.offset);
        if let Some(msg) = check_ident(&stmt.target) {
            return Err(Diagnostic::new(at, msg));
        }
        if FUNCTIONS.contains(&stmt.target.as_str()) {
            return Err(Diagnostic::new(at, format!("`{}` is a function name and cannot be assigned", stmt.target)));
        }
        if let Some(b) = cx.env.get(&stmt.target) {
            let msg = if b.input {
                format!("`{}` is an input and cannot be assigned", stmt.target)
            } else {
                format!("`{}` is assigned twice (first at {}:{})", stmt.target, b.pos.line, b.pos.col)
            };
            return Err(Diagnostic::new(at, msg));
        }
        let node = cx.expr(&stmt.value)?;
        let ops = cx.graph.nodes.iter().filter(|n| !n.op.is_leaf()).count();
        if ops > MAX_OPS {
            return Err(Diagnostic::new(
                at,
                format!(
                    "the body reaches {ops} ops here; a kernel holds at most {MAX_OPS} (split it into several kernels)"
                ),
            ));
        }
        cx.env.insert(stmt.target.clone(), Binding { node, pos: at, used: false, input: false });
        assigned_at.insert(stmt.target.clone(), stmt.offset);
    }

    for (out_decl, src) in outputs {
        let Some(binding) = cx.env.get_mut(&src.name) else {
            return Err(Diagnostic::new(src.pos, format!("output `{}` is never assigned in the body", src.name)));
        };
        binding.used = true;
        let (node, at) = (binding.node, binding.pos);
        match cx.graph.node(node).op {
            Op::Input(i) => {
                let name = &cx.graph.inputs[i as usize].decl.name;
                return Err(Diagnostic::new(
                    at,
                    format!("output `{}` must be computed, not be a copy of input `{name}`", src.name),
                ));
            }
            Op::Const(_) => {
                return Err(Diagnostic::new(
                    at,
                    format!("output `{}` must be computed from the inputs, not be a constant", src.name),
                ))
            }
            _ => {}
        }
        let computed = cx.graph.shape(node).to_vec();
        if crate::graph::squeeze_leading(&computed) != crate::graph::squeeze_leading(&out_decl.shape) {
            return Err(Diagnostic::new(
                at,
                format!(
                    "output `{}` is declared {}{} but the body computes {}",
                    src.name,
                    out_decl.dtype,
                    cx.graph.dims.show(&out_decl.shape),
                    cx.graph.dims.show(&computed)
                ),
            ));
        }
        cx.graph.add_output(out_decl, node);
    }
    for t in &decl.inputs {
        if !cx.env[&t.name].used {
            return Err(Diagnostic::new(t.pos, format!("input `{}` is never used", t.name)));
        }
    }
    for stmt in &stmts {
        if !cx.env[&stmt.target].used {
            return Err(Diagnostic::new(
                decl.body.pos(stmt.offset),
                format!("`{}` is assigned but never used (and is not an output)", stmt.target),
            ));
        }
    }
    let graph = cx.graph;
    validate(graph).map_err(|e| Diagnostic::new(decl.pos, format!("internal error: the lowered graph is invalid: {e}")))
}

fn tensor_decl(t: &TensorSrc, dims: &DimTable) -> Result<TensorDecl, Diagnostic> {
    let Some(dtype) = DType::parse(&t.dtype) else {
        let shown = if t.dtype.is_empty() { "nothing".to_string() } else { format!("`{}`", t.dtype) };
        return Err(Diagnostic::new(
            t.dtype_pos,
            format!("unknown dtype {shown} for `{}`; expected f16, bf16, f32 or i32 (index tensors)", t.name),
        ));
    };
    if !dtype.is_float() {
        return index_decl(t, dtype, dims);
    }

    if t.shape.len() > MAX_RANK {
        return Err(Diagnostic::new(
            t.pos,
            format!("`{}` has {} axes; a tensor has at most {MAX_RANK}", t.name, t.shape.len()),
        ));
    }
    let mut shape: Shape = Vec::new();
    let mut elements: u128 = 1;
    for AxisDecl { name, pos } in &t.shape {
        if name == "1" {
            shape.push(Dim::One);
            continue;
        }
        if name.contains('+') {
            return Err(Diagnostic::new(
                *pos,
                format!("`{name}` in the shape of `{}`: only an i32 `indptr` may have `n + 1` entries", t.name),
            ));
        }
        let Some(v) = dims.find(name) else {
            let msg = if name.chars().all(|c| c.is_ascii_digit() || c == '-') {
                format!("axis `{name}` of `{}` must name a declared dim (or be 1)", t.name)
            } else {
                format!("`{name}` in the shape of `{}` is not a declared dim", t.name)
            };
            return Err(Diagnostic::new(*pos, msg));
        };
        elements = elements.saturating_mul(u128::from(dims.get(v).value));
        shape.push(Dim::Var(v));
    }
    if elements > MAX_ELEMENTS {
        return Err(Diagnostic::new(
            t.pos,
            format!("`{}` has {elements} elements, more than the limit of 2^48", t.name),
        ));
    }
    let layout = match &t.storage {
        Some(groups) => Some(storage_layout(t, &shape, groups, dims)?),
        None => {
            // A per-request dim has no dense extent: its tensor must say how requests pack.
            if let Some(v) = shape.iter().filter_map(|d| d.var()).find(|v| dims.get(*v).per_request.is_some()) {
                let d = dims.get(v);
                let what = if crate::graph::layout::is_paged(dims, v) { "paged" } else { "ragged" };
                return Err(Diagnostic::new(
                    t.pos,
                    format!(
                        "`{}` has the {what} dim `{}`, whose extent differs between requests; declare its buffer \
                         with `as [..]`, e.g. `as [{}, ..]` with the axis that holds every request's part",
                        t.name,
                        d.name,
                        if what == "paged" { "num_pages, page_size" } else { "total" }
                    ),
                ));
            }
            None
        }
    };
    Ok(TensorDecl { name: t.name.clone(), dtype, shape, layout })
}

/// An `i32` index tensor: `i32[n]` or `i32[batch + 1]`, rank 1, no storage clause.
fn index_decl(t: &TensorSrc, dtype: DType, dims: &DimTable) -> Result<TensorDecl, Diagnostic> {
    if let Some(s) = t.storage.as_ref().and_then(|s| s.first()) {
        return Err(Diagnostic::new(
            s.pos,
            format!("index tensor `{}` takes no `as [..]`: it is one dense list", t.name),
        ));
    }
    let [axis] = t.shape.as_slice() else {
        return Err(Diagnostic::new(
            t.pos,
            format!("index tensor `{}` must have one axis (`i32[n]`, or `i32[batch + 1]` for an indptr)", t.name),
        ));
    };
    let (name, plus_one) = match axis.name.split_once('+') {
        Some((n, one)) if one.trim() == "1" => (n.trim(), true),
        Some(_) => {
            return Err(Diagnostic::new(axis.pos, format!("`{}`: an index axis is `n` or `n + 1`", axis.name)));
        }
        None => (axis.name.as_str(), false),
    };
    let Some(v) = dims.find(name) else {
        return Err(Diagnostic::new(axis.pos, format!("`{name}` in the shape of `{}` is not a declared dim", t.name)));
    };
    if dims.get(v).per_request.is_some() {
        return Err(Diagnostic::new(
            axis.pos,
            format!("`{name}` differs between requests; an index tensor's length is a batch or a table size"),
        ));
    }
    let layout = plus_one.then(|| Layout { axes: vec![StoreAxis::PlusOne(v)] });
    Ok(TensorDecl { name: t.name.clone(), dtype, shape: vec![Dim::Var(v)], layout })
}

/// The shape of an input as declared, before any checking: `(dtype, [axis names])`.
fn raw_input<'d>(decl: &'d KernelDecl, name: &str) -> Option<(usize, &'d TensorSrc)> {
    decl.inputs.iter().enumerate().find(|(_, t)| t.name == name)
}

/// Resolves the `ragged:` and `paged:` declarations of the dims into [`PerRequest`] facts.
fn per_request_dims(decl: &KernelDecl, dims: &mut DimTable) -> Result<(), Diagnostic> {
    for d in &decl.dims {
        let Some(pr) = &d.per_request else { continue };
        let v = dims.find(&d.name).expect("declared above");
        // An index tensor: an input of dtype i32 with one axis, `[batch + 1]` when `plus_one`.
        let table =
            |a: &AxisDecl, role: &str, plus_one: Option<bool>| -> Result<(IndexRef, Option<DimVar>), Diagnostic> {
                let Some((i, t)) = raw_input(decl, &a.name) else {
                    return Err(Diagnostic::new(
                        a.pos,
                        format!("`{}`, the {role} of dim `{}`, is not an input of the kernel", a.name, d.name),
                    ));
                };
                if t.dtype != "i32" {
                    return Err(Diagnostic::new(
                        a.pos,
                        format!(
                            "`{}` is {}, but the {role} of dim `{}` is an index tensor: declare it i32",
                            a.name, t.dtype, d.name
                        ),
                    ));
                }
                let axis = match t.shape.as_slice() {
                    [axis] => axis.name.as_str(),
                    _ => "",
                };
                let (len, is_plus) = match axis.split_once('+') {
                    Some((n, _)) => (n.trim(), true),
                    None => (axis, false),
                };
                if plus_one.is_some_and(|p| p != is_plus) || len.is_empty() {
                    let want = if plus_one == Some(true) { "i32[batch + 1]" } else { "i32[n]" };
                    return Err(Diagnostic::new(
                        t.pos,
                        format!("`{}`, the {role} of dim `{}`, must be declared `{want}`", t.name, d.name),
                    ));
                }
                let Some(len_var) = dims.find(len) else {
                    return Err(Diagnostic::new(
                        t.pos,
                        format!("`{len}` in the shape of `{}` is not a declared dim", t.name),
                    ));
                };
                let r = IndexRef { input: i as u32, name: t.name.clone(), len: len_var, plus_one: is_plus };
                Ok((r, Some(len_var)))
            };
        let (kind, pos, batch) = match pr {
            PerRequestDecl::Ragged { pos, indptr } => {
                let (indptr, batch) = table(indptr, "indptr", Some(true))?;
                (PerRequestKind::Ragged { indptr, total: None }, *pos, batch)
            }
            PerRequestDecl::Paged { pos, indices, indptr, page_size, last_page_len } => {
                let need = |x: &Option<AxisDecl>, key: &str, what: &str| {
                    x.clone()
                        .ok_or_else(|| Diagnostic::new(*pos, format!("paged dim `{}` needs `{key}:` ({what})", d.name)))
                };
                let indices = need(indices, "indices", "the i32 page table")?;
                let indptr = need(indptr, "indptr", "an i32[batch + 1] index into the page table")?;
                let ps = need(page_size, "page_size", "slots per page: 1, or a static dim")?;
                let (indptr, batch) = table(&indptr, "indptr", Some(true))?;
                let (indices, _) = table(&indices, "page table", Some(false))?;
                let page_size = match ps.name.parse::<i128>() {
                    Ok(n) if n <= 0 => {
                        return Err(Diagnostic::new(
                            ps.pos,
                            format!("the page size of paged dim `{}` must be positive, got {n}", d.name),
                        ))
                    }
                    Ok(n) if n > MAX_DIM => {
                        return Err(Diagnostic::new(ps.pos, format!("page size {n} is too large")));
                    }
                    Ok(n) => n as u64,
                    Err(_) => match dims.find(&ps.name) {
                        Some(p) if !dims.get(p).dynamic => dims.get(p).value,
                        Some(_) => {
                            return Err(Diagnostic::new(
                                ps.pos,
                                format!("the page size of `{}` must be static; `{}` is dynamic", d.name, ps.name),
                            ))
                        }
                        None => {
                            return Err(Diagnostic::new(
                                ps.pos,
                                format!(
                                    "page size `{}` of `{}` is neither an integer nor a declared dim",
                                    ps.name, d.name
                                ),
                            ))
                        }
                    },
                };
                let last_page_len = match last_page_len {
                    Some(a) => {
                        let (r, b) = table(a, "last_page_len", Some(false))?;
                        if b != batch {
                            return Err(Diagnostic::new(
                                a.pos,
                                format!("`{}` must be `i32[batch]` over the batch of its indptr", a.name),
                            ));
                        }
                        Some(r)
                    }
                    None => None,
                };
                (PerRequestKind::Paged { indptr, indices, page_size, last_page_len }, *pos, batch)
            }
        };
        let Some(batch) = batch else {
            return Err(Diagnostic::new(pos, format!("the indptr of dim `{}` names no declared batch dim", d.name)));
        };
        if batch == v {
            return Err(Diagnostic::new(pos, format!("dim `{}` cannot be its own batch", d.name)));
        }
        dims.get_mut(v).per_request = Some(PerRequest { batch, kind });
    }
    // A batch dim is a plain count of requests.
    for (_, info) in dims.clone().iter() {
        if let Some(p) = &info.per_request {
            if dims.get(p.batch).per_request.is_some() {
                let at = decl.dims.iter().find(|d| d.name == info.name).map_or(decl.pos, |d| d.pos);
                return Err(Diagnostic::new(
                    at,
                    format!(
                        "the batch `{}` of `{}` differs between requests itself",
                        dims.get(p.batch).name,
                        info.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Resolves `as [..]`: each storage axis to the logical axes it holds.
fn storage_layout(
    t: &TensorSrc,
    shape: &[Dim],
    groups: &[StorageAxisDecl],
    dims: &DimTable,
) -> Result<Layout, Diagnostic> {
    let fail = |pos, msg: String| Err(Diagnostic::new(pos, msg));
    let vars: Vec<DimVar> = shape.iter().filter_map(|d| d.var()).collect();
    for (i, v) in vars.iter().enumerate() {
        if vars[..i].contains(v) {
            return fail(
                t.pos,
                format!(
                    "`{}` has the axis `{}` twice; a tensor with a storage clause names each dim once",
                    t.name,
                    dims.get(*v).name
                ),
            );
        }
    }
    // Per-request dims of this tensor and their batches: placed by their packed or paged axes.
    let requests: Vec<DimVar> = vars.iter().copied().filter(|v| dims.get(*v).per_request.is_some()).collect();
    for r in &requests {
        let batch = dims.get(*r).per_request.as_ref().map(|p| p.batch).expect("a per-request dim");
        if !vars.contains(&batch) {
            return fail(
                t.pos,
                format!(
                    "`{}` has the per-request dim `{}` but not its batch `{}`: every request has its own part",
                    t.name,
                    dims.get(*r).name,
                    dims.get(batch).name
                ),
            );
        }
    }
    let batch_of = |v: DimVar| requests.iter().any(|r| dims.get(*r).per_request.as_ref().is_some_and(|p| p.batch == v));
    let mut placed: Vec<DimVar> = Vec::new();
    let mut axes: Vec<StoreAxis> = Vec::new();
    let mut elements: u128 = 1;
    for g in groups {
        let find = |a: &AxisDecl| dims.find(&a.name);
        // The slot axis of the paged dim whose page axis came just before.
        if let Some(StoreAxis::Pages { paged, .. }) = axes.last() {
            let paged = *paged;
            let size = match &dims.get(paged).per_request.as_ref().map(|p| &p.kind) {
                Some(PerRequestKind::Paged { page_size, .. }) => *page_size,
                _ => unreachable!("a pages axis is of a paged dim"),
            };
            let slot = match (g.grouped, g.names.as_slice()) {
                (false, [a]) if a.name == "1" && size == 1 => Some(Dim::One),
                (false, [a]) => find(a).filter(|v| !vars.contains(v) && dims.get(*v).value == size).map(Dim::Var),
                _ => None,
            };
            let Some(slot) = slot else {
                return fail(
                    g.pos,
                    format!(
                        "after the page axis of `{}`, the storage of `{}` needs its slot axis: the page size ({size}){}",
                        dims.get(paged).name,
                        t.name,
                        if size == 1 { ", written `1`" } else { ", a static dim of that value (`page_size: N` in dims)" }
                    ),
                );
            };
            axes.push(StoreAxis::Slot { paged, size: slot });
            elements = elements.saturating_mul(u128::from(size));
            continue;
        }
        if !g.grouped && g.names[0].name == "1" {
            axes.push(StoreAxis::One);
            continue;
        }
        let mut members = Vec::new();
        for a in &g.names {
            let Some(v) = find(a) else {
                return fail(a.pos, format!("`{}` in the storage of `{}` is not a declared dim", a.name, t.name));
            };
            members.push((a, v));
        }
        let (a0, v0) = members[0];
        if !g.grouped && !vars.contains(&v0) {
            // An axis the logical shape does not have: the packed rows or the pages of the next
            // per-request dim not yet placed.
            let Some(r) = requests.iter().copied().find(|r| !placed.contains(r)) else {
                return fail(
                    a0.pos,
                    format!(
                        "`{}` is not an axis of `{}`: a storage axis names its dims, `1`, `(a b ..)`, or the axis that \
                         packs a ragged dim",
                        a0.name, t.name
                    ),
                );
            };
            let batch = dims.get(r).per_request.as_ref().map(|p| p.batch).expect("per-request");
            placed.push(r);
            placed.push(batch);
            elements = elements.saturating_mul(u128::from(dims.get(v0).value));
            axes.push(if crate::graph::layout::is_paged(dims, r) {
                StoreAxis::Pages { pages: v0, paged: r }
            } else {
                StoreAxis::Packed { total: v0, ragged: r }
            });
            continue;
        }
        for (a, v) in &members {
            if !vars.contains(v) {
                return fail(a.pos, format!("`{}` is not an axis of `{}`", a.name, t.name));
            }
            if dims.get(*v).per_request.is_some() || batch_of(*v) {
                let what = if batch_of(*v) { "the batch of a per-request dim" } else { "a per-request dim" };
                return fail(
                    a.pos,
                    format!(
                        "`{}` is {what} of `{}`: it lies in the axis that packs the requests (name that axis, e.g. \
                         `total`), not in an axis of its own",
                        a.name, t.name
                    ),
                );
            }
            if placed.contains(v) {
                return fail(a.pos, format!("`{}` appears twice in the storage of `{}`", a.name, t.name));
            }
            placed.push(*v);
            elements = elements.saturating_mul(u128::from(dims.get(*v).value));
        }
        axes.push(StoreAxis::Dims(members.iter().map(|(_, v)| *v).collect()));
    }
    if let Some(StoreAxis::Pages { paged, .. }) = axes.last() {
        return fail(
            t.pos,
            format!(
                "the storage of `{}` ends at the page axis of `{}`; its slot axis must follow",
                t.name,
                dims.get(*paged).name
            ),
        );
    }
    if let Some(missing) = vars.iter().find(|v| !placed.contains(v)) {
        return fail(
            t.pos,
            format!("axis `{}` of `{}` is in none of its storage axes", dims.get(*missing).name, t.name),
        );
    }
    // The last storage axis is contiguous, and copies read the logical tensor's last axis along
    // it (a last axis of extent 1, a row reduction's, is stored element by element).
    let inner = shape.last().and_then(|d| d.var());
    let last_ok = match (axes.last(), inner) {
        (Some(StoreAxis::Dims(ds)), Some(i)) => ds.last() == Some(&i),
        (_, None) => true,
        _ => false,
    };
    if !last_ok {
        let at = groups.last().map_or(t.pos, |g| g.pos);
        return fail(
            at,
            format!(
                "the last storage axis of `{}` must end with its last axis `{}`, which is contiguous in memory",
                t.name,
                inner.map_or("?".to_string(), |i| dims.get(i).name.clone())
            ),
        );
    }
    if elements > MAX_ELEMENTS {
        return fail(t.pos, format!("the buffer of `{}` has {elements} elements, more than the limit of 2^48", t.name));
    }
    Ok(Layout { axes })
}

struct Binding {
    node: NodeId,
    pos: Pos,
    used: bool,
    input: bool,
}

struct Lowering<'d> {
    graph: Graph,
    env: HashMap<String, Binding>,
    decl: &'d KernelDecl,
    memo: HashMap<(Op, Vec<NodeId>), NodeId>,
}

impl Lowering<'_> {
    fn at(&self, offset: usize) -> Pos {
        self.decl.body.pos(offset)
    }

    fn fail<T>(&self, offset: usize, message: impl Into<String>) -> Result<T, Diagnostic> {
        Err(Diagnostic::new(self.at(offset), message))
    }

    fn constant_value(&self, id: NodeId) -> Option<f64> {
        match self.graph.node(id).op {
            Op::Const(c) => Some(c),
            _ => None,
        }
    }

    /// Adds an op (or finds the identical one already built), folding constants.
    fn op(&mut self, op: Op, args: &[NodeId], offset: usize) -> Result<NodeId, Diagnostic> {
        let consts: Option<Vec<f64>> = args.iter().map(|a| self.constant_value(*a)).collect();
        if let Some(c) = consts {
            let folded = match op {
                Op::Unary(u) => Some(u.eval(c[0])),
                Op::Binary(b) => Some(b.eval(c[0], c[1])),
                _ => None,
            };
            if let Some(v) = folded {
                if !v.is_finite() {
                    return self.fail(offset, format!("this constant expression evaluates to {v}"));
                }
                return Ok(self.graph.constant(v));
            }
        }
        let key = (op, args.to_vec());
        if let Some(&id) = self.memo.get(&key) {
            return Ok(id);
        }
        let reduced = match op {
            Op::Reduce(_, axis) => self.graph.shape(args[0]).get(axis as usize).copied(),
            Op::MatMul => self.graph.shape(args[0]).last().copied(),
            _ => None,
        };
        if let Some(Dim::Var(v)) = reduced {
            if let Some((_, r)) =
                self.graph.dims.iter().find(|(_, d)| d.per_request.as_ref().is_some_and(|p| p.batch == v))
            {
                return self.fail(
                    offset,
                    format!(
                        "this reduces over `{}`, the requests of `{}`; a computation over per-request dims stays \
                         within each request",
                        self.graph.dims.get(v).name,
                        r.name
                    ),
                );
            }
        }
        let id = self.graph.add(op, args).map_err(|e| Diagnostic::new(self.at(offset), e.message(&self.graph.dims)))?;
        self.memo.insert(key, id);
        Ok(id)
    }

    fn expr(&mut self, e: &Expr) -> Result<NodeId, Diagnostic> {
        match &e.kind {
            ExprKind::Num(x) => Ok(self.graph.constant(*x)),
            ExprKind::Name(name) => match self.env.get_mut(name) {
                Some(b)
                    if b.input
                        && self.graph.input_index(b.node).is_some_and(|i| self.graph.inputs[i].decl.is_index()) =>
                {
                    self.fail(
                        e.offset,
                        format!(
                            "`{name}` is an index tensor (i32): it addresses other tensors as the table of a ragged or \
                             paged dim, and cannot be computed with"
                        ),
                    )
                }
                Some(b) => {
                    b.used = true;
                    Ok(b.node)
                }
                None if self.graph.dims.find(name).is_some() => {
                    self.fail(e.offset, format!("`{name}` is a dim, not a tensor; dims cannot appear in expressions"))
                }
                None if FUNCTIONS.contains(&name.as_str()) => {
                    self.fail(e.offset, format!("`{name}` is a function; call it as `{name}(...)`"))
                }
                None => self.fail(e.offset, format!("undefined name `{name}`")),
            },
            ExprKind::Neg(inner) => {
                let x = self.expr(inner)?;
                self.op(Op::Unary(UnaryOp::Neg), &[x], e.offset)
            }
            ExprKind::Bin(op, a, b) => {
                // A division by a literal zero is a mistake wherever it is written; a computed
                // zero is the data's business.
                if *op == BinTok::Div && self.float_literal(b).is_ok_and(|v| v == 0.0) {
                    return self.fail(b.offset, "division by zero");
                }
                let (x, y) = (self.expr(a)?, self.expr(b)?);
                let op = match op {
                    BinTok::Add => BinaryOp::Add,
                    BinTok::Sub => BinaryOp::Sub,
                    BinTok::Mul => BinaryOp::Mul,
                    BinTok::Div => BinaryOp::Div,
                };
                self.op(Op::Binary(op), &[x, y], e.offset)
            }
            ExprKind::Call { func, args } => self.call(func, args, e.offset),
        }
    }

    fn call(&mut self, func: &str, args: &[Arg], offset: usize) -> Result<NodeId, Diagnostic> {
        let allowed: &[&str] = match func {
            "max" if args.iter().any(|a| a.keyword.is_some()) => &["axis"],
            "sum" | "mean" | "softmax" => &["axis"],
            "rmsnorm" => &["axis", "eps"],
            "causal" => &["diagonal"],
            f if FUNCTIONS.contains(&f) => &[],
            _ => return self.fail(offset, format!("unknown op `{func}`; expected one of {}", FUNCTIONS.join(", "))),
        };
        let mut positional = Vec::new();
        let mut keywords: Vec<(&str, usize, &Expr)> = Vec::new();
        for a in args {
            match &a.keyword {
                Some((k, koff)) => {
                    if !allowed.contains(&k.as_str()) {
                        let hint = match allowed {
                            [] => format!("`{func}` takes no keyword arguments"),
                            list => format!(
                                "expected {}",
                                list.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(" or ")
                            ),
                        };
                        return self.fail(*koff, format!("unknown keyword `{k}` for `{func}`; {hint}"));
                    }
                    if keywords.iter().any(|(prev, ..)| prev == k) {
                        return self.fail(*koff, format!("keyword `{k}` is given twice"));
                    }
                    keywords.push((k, *koff, &a.value));
                }
                None => {
                    if let Some((k, koff, _)) = keywords.first() {
                        return self.fail(*koff, format!("positional arguments must come before `{k}=`"));
                    }
                    positional.push(&a.value);
                }
            }
        }
        let want = match func {
            "matmul" => 2,
            "max" if keywords.is_empty() => 2,
            _ => 1,
        };
        if positional.len() != want {
            let what = if want == 1 { "1 tensor argument".to_string() } else { format!("{want} tensor arguments") };
            return self.fail(offset, format!("`{func}` takes {what}, got {}", positional.len()));
        }
        let keyword = |name: &str| keywords.iter().find(|(k, ..)| *k == name).map(|(_, _, e)| *e);
        let mut xs = Vec::new();
        for p in &positional {
            xs.push(self.expr(p)?);
        }
        let x = xs[0];
        let rank = self.graph.shape(x).len();
        let axis = |cx: &Self, required: bool| -> Result<u32, Diagnostic> {
            match keyword("axis") {
                Some(e) => {
                    let v = cx.int_literal(e)?;
                    normalize_axis(v, rank).map_err(|err| Diagnostic::new(cx.at(e.offset), err.message(&cx.graph.dims)))
                }
                None if required => cx.fail(offset, format!("`{func}` needs `axis=`")),
                None => {
                    normalize_axis(-1, rank).map_err(|err| Diagnostic::new(cx.at(offset), err.message(&cx.graph.dims)))
                }
            }
        };
        match func {
            "matmul" => self.op(Op::MatMul, &xs, offset),
            "transpose" => self.op(Op::Transpose, &xs, offset),
            "max" if keywords.is_empty() => self.op(Op::Binary(BinaryOp::Max), &xs, offset),
            "max" => {
                let a = axis(self, true)?;
                self.op(Op::Reduce(ReduceOp::Max, a), &xs, offset)
            }
            "sum" | "mean" => {
                let a = axis(self, true)?;
                let r = if func == "sum" { ReduceOp::Sum } else { ReduceOp::Mean };
                self.op(Op::Reduce(r, a), &xs, offset)
            }
            "causal" => {
                let diagonal = match keyword("diagonal") {
                    Some(e) => {
                        let v = self.int_literal(e)?;
                        match i32::try_from(v) {
                            Ok(d) if d.abs() <= MAX_DIAGONAL => d,
                            _ => {
                                return self
                                    .fail(e.offset, format!("`diagonal` must be within ±{MAX_DIAGONAL}, got {v}"))
                            }
                        }
                    }
                    None => 0,
                };
                self.op(Op::Mask(Mask::Causal { diagonal }), &xs, offset)
            }
            "softmax" => {
                let a = axis(self, false)?;
                let e = self.op(Op::Unary(UnaryOp::Exp), &[x], offset)?;
                let s = self.op(Op::Reduce(ReduceOp::Sum, a), &[e], offset)?;
                self.op(Op::Binary(BinaryOp::Div), &[e, s], offset)
            }
            "rmsnorm" => {
                let a = axis(self, false)?;
                let eps = match keyword("eps") {
                    Some(e) => {
                        let v = self.float_literal(e)?;
                        if v <= 0.0 {
                            return self.fail(e.offset, format!("`eps` must be positive, got {v}"));
                        }
                        v
                    }
                    None => RMSNORM_EPS,
                };
                let sq = self.op(Op::Unary(UnaryOp::Square), &[x], offset)?;
                let ms = self.op(Op::Reduce(ReduceOp::Mean, a), &[sq], offset)?;
                let eps = self.graph.constant(eps);
                let den = self.op(Op::Binary(BinaryOp::Add), &[ms, eps], offset)?;
                let r = self.op(Op::Unary(UnaryOp::Rsqrt), &[den], offset)?;
                self.op(Op::Binary(BinaryOp::Mul), &[x, r], offset)
            }
            unary => {
                let u = UnaryOp::from_name(unary).expect("FUNCTIONS lists only known unary names here");
                self.op(Op::Unary(u), &xs, offset)
            }
        }
    }

    fn float_literal(&self, e: &Expr) -> Result<f64, Diagnostic> {
        match &e.kind {
            ExprKind::Num(x) => Ok(*x),
            ExprKind::Neg(inner) => Ok(-self.float_literal(inner)?),
            _ => self.fail(e.offset, "expected a number literal"),
        }
    }

    fn int_literal(&self, e: &Expr) -> Result<i64, Diagnostic> {
        // One sign at most: `--1` is a typo, not 1.
        if let ExprKind::Neg(inner) = &e.kind {
            if !matches!(inner.kind, ExprKind::Num(_)) {
                return self.fail(e.offset, "expected an integer literal for the axis");
            }
        }
        let v = match self.float_literal(e) {
            Ok(v) => v,
            Err(_) => return self.fail(e.offset, "expected an integer literal for the axis"),
        };
        if v.fract() != 0.0 || v.abs() > 1e9 {
            return self.fail(e.offset, format!("expected an integer axis, got {v}"));
        }
        Ok(v as i64)
    }
}

/// Dims of a graph that are dynamic.
pub fn dynamic_dims(graph: &Graph) -> Vec<DimVar> {
    graph.dims.iter().filter(|(_, d)| d.dynamic).map(|(v, _)| v).collect()
}
