//! The reference over buffers: a graph whose inputs and outputs have layouts (requests packed
//! by an indptr, tokens behind a page table, merged axes) evaluated on the buffers themselves.
//!
//! Each request of a batch is its own dense graph: its rows are gathered from the buffers
//! through the layouts and tables, the graph is evaluated at that request's extents (an empty
//! request has extent 0, so its sums are 0 and its maxima `-inf`), and the results are
//! scattered back into the output buffers. Elements of an output buffer that no request owns
//! are not written, and [`Evaluated::written`] says which ones were.

use super::{eval_nodes, RefError, Tensor};
use crate::graph::{Bindings, Dim, DimVar, Graph, PerRequestKind, StoreAxis, TensorDecl, ValidGraph};

/// Outputs evaluated over buffers.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluated {
    /// Each output's buffer (its storage shape, row-major); unwritten elements are NaN.
    pub outputs: Vec<Tensor>,
    /// Per output, per element: whether some request owns it.
    pub written: Vec<Vec<bool>>,
    /// The largest magnitude of an `exp`'s argument over every request (0 without exps).
    pub max_exp_arg: f64,
}

/// The shape of a tensor's buffer at these extents.
pub fn buffer_shape(t: &TensorDecl, b: &Bindings) -> Vec<usize> {
    match &t.layout {
        Some(l) => l.extents(&|d| b.extent(d) as u64).into_iter().map(|e| e as usize).collect(),
        None => b.extents(&t.shape),
    }
}

/// The entries of an index input as integers.
fn table(inputs: &[Tensor], i: u32) -> Vec<i64> {
    inputs[i as usize].data.iter().map(|x| *x as i64).collect()
}

/// Where request `b`'s part of a per-request dim lies: its first packed row or page-table
/// entry, and its extent.
#[derive(Clone, Copy, Debug)]
struct Part {
    start: usize,
    len: usize,
}

/// Checks a per-request dim's tables for request count `n` and returns each request's part.
fn parts(g: &Graph, v: DimVar, b: &Bindings, inputs: &[Tensor]) -> Result<Vec<Part>, RefError> {
    let info = g.dims.get(v);
    let pr = info.per_request.as_ref().expect("a per-request dim");
    let n = b.extent(Dim::Var(pr.batch));
    let bad = |name: &str, m: String| RefError::Table(format!("`{name}`: {m}"));
    let indptr = table(inputs, pr.indptr().input);
    let name = &pr.indptr().name;
    if indptr.len() < n + 1 {
        return Err(bad(name, format!("{} entries for {n} requests", indptr.len())));
    }
    let bound = match &pr.kind {
        PerRequestKind::Ragged { total: Some(t), .. } => Some(b.extent(Dim::Var(*t)) as i64),
        PerRequestKind::Ragged { total: None, .. } => None,
        PerRequestKind::Paged { indices, .. } => Some(inputs[indices.input as usize].data.len() as i64),
    };
    for k in 0..n {
        let (s, e) = (indptr[k], indptr[k + 1]);
        if s < 0 || e < s || bound.is_some_and(|m| e > m) {
            return Err(bad(name, format!("request {k} owns entries {s}..{e}, which is not a range inside the table")));
        }
    }
    let mut out = Vec::with_capacity(n);
    for k in 0..n {
        let (s, e) = (indptr[k] as usize, indptr[k + 1] as usize);
        let len = match &pr.kind {
            PerRequestKind::Ragged { .. } => e - s,
            PerRequestKind::Paged { page_size, last_page_len, indices, .. } => {
                let pages = e - s;
                let ps = *page_size as usize;
                let pool: Vec<usize> = g
                    .inputs
                    .iter()
                    .filter_map(|i| i.decl.layout.as_ref())
                    .flat_map(|l| &l.axes)
                    .filter_map(|a| match a {
                        StoreAxis::Pages { pages, paged } if *paged == v => Some(b.extent(Dim::Var(*pages))),
                        _ => None,
                    })
                    .collect();
                let idx = table(inputs, indices.input);
                for (j, &p) in idx[s..e].iter().enumerate() {
                    if p < 0 || pool.iter().any(|&m| p as usize >= m) {
                        return Err(bad(&indices.name, format!("entry {} (page {j} of request {k}) is {p}", s + j)));
                    }
                }
                match last_page_len {
                    _ if pages == 0 => 0,
                    Some(l) => {
                        let last = table(inputs, l.input)[k];
                        if last < 1 || last as usize > ps {
                            return Err(bad(&l.name, format!("entry {k} is {last}, not in 1..={ps}")));
                        }
                        (pages - 1) * ps + last as usize
                    }
                    None => pages * ps,
                }
            }
        };
        out.push(Part { start: s, len });
    }
    Ok(out)
}

/// A per-request dim with each request's part.
struct Requests {
    dim: DimVar,
    kind: PerRequestKind,
    parts: Vec<Part>,
}

/// The buffer offset of a logical element `idx` (one index per axis of `t.shape`) of request
/// `req`, through the layout.
fn offset(t: &TensorDecl, idx: &[usize], req: usize, requests: &[Requests], b: &Bindings, inputs: &[Tensor]) -> usize {
    let Some(layout) = &t.layout else {
        let shape = b.extents(&t.shape);
        return idx.iter().zip(&shape).fold(0, |acc, (i, e)| acc * e + i);
    };
    let of = |v: DimVar| -> usize {
        let a = t.shape.iter().position(|d| *d == Dim::Var(v)).expect("the dim is an axis");
        idx[a]
    };
    let request = |v: DimVar| requests.iter().find(|r| r.dim == v).expect("a per-request dim");
    let mut off = 0usize;
    let mut k = 0;
    while k < layout.axes.len() {
        let axis = &layout.axes[k];
        let extent = axis.extent(&|d| b.extent(d) as u64) as usize;
        let i = match axis {
            StoreAxis::One | StoreAxis::PlusOne(_) => 0,
            StoreAxis::Dims(ds) => ds.iter().fold(0, |acc, d| acc * b.extent(Dim::Var(*d)) + of(*d)),
            StoreAxis::Packed { ragged, .. } => request(*ragged).parts[req].start + of(*ragged),
            StoreAxis::Pages { paged, .. } => {
                let r = request(*paged);
                let PerRequestKind::Paged { indices, page_size, .. } = &r.kind else {
                    unreachable!("a pages axis is of a paged dim")
                };
                let ps = *page_size as usize;
                let l = of(*paged);
                let page = table(inputs, indices.input)[r.parts[req].start + l / ps] as usize;
                // The slot axis follows.
                let slot_extent = layout.axes[k + 1].extent(&|d| b.extent(d) as u64) as usize;
                off = (off * extent + page) * slot_extent + l % ps;
                k += 2;
                continue;
            }
            StoreAxis::Slot { .. } => unreachable!("a slot axis follows its pages axis"),
        };
        off = off * extent + i;
        k += 1;
    }
    off
}

/// Evaluates `graph` on its inputs' buffers (each its storage shape, row-major; index tensors
/// as their integer values) at the extents of `bindings` (the per-request dims' values are
/// ignored: every request has its own, from its tables). A table that breaks its rules (an
/// indptr that decreases, a page outside the pool) is an error.
pub fn eval_buffers(graph: &ValidGraph, bindings: &Bindings, inputs: &[Tensor]) -> Result<Evaluated, RefError> {
    let g: &Graph = graph;
    if inputs.len() != g.inputs.len() {
        return Err(RefError::InputCount { want: g.inputs.len(), got: inputs.len() });
    }
    for (t, i) in inputs.iter().zip(&g.inputs) {
        let want = buffer_shape(&i.decl, bindings);
        if t.shape != want {
            return Err(RefError::InputShape { name: i.decl.name.clone(), want, got: t.shape.clone() });
        }
    }
    let mut requests: Vec<Requests> = Vec::new();
    for (v, d) in g.dims.iter() {
        if let Some(pr) = &d.per_request {
            requests.push(Requests { dim: v, kind: pr.kind.clone(), parts: parts(g, v, bindings, inputs)? });
        }
    }
    let batches: Vec<DimVar> = crate::graph::layout::batch_dims(&g.dims);
    if batches.len() > 1 {
        return Err(RefError::Table("per-request dims over more than one batch dim".into()));
    }
    let batch = batches.first().copied();
    let n_requests = batch.map_or(1, |bd| bindings.extent(Dim::Var(bd)));
    let mut outputs: Vec<Tensor> = g
        .outputs
        .iter()
        .map(|o| {
            let shape = buffer_shape(&o.decl, bindings);
            let n = shape.iter().product();
            Tensor { shape, data: vec![f64::NAN; n] }
        })
        .collect();
    let mut written: Vec<Vec<bool>> = outputs.iter().map(|t| vec![false; t.data.len()]).collect();
    let mut max_exp_arg = 0.0f64;
    for req in 0..n_requests {
        // This request's extents: the batch is one request, each per-request dim its own.
        let mut rb = bindings.clone();
        if let Some(bd) = batch {
            rb.values[bd.index()] = 1;
        }
        for r in &requests {
            rb.values[r.dim.index()] = r.parts[req].len as u64;
        }
        rb.complete(&g.dims);
        // The logical inputs of this request, gathered from the buffers.
        let mut logical = Vec::with_capacity(g.inputs.len());
        for (t, i) in inputs.iter().zip(&g.inputs) {
            let shape = rb.extents(&i.decl.shape);
            if i.decl.is_index() {
                logical.push(Tensor { shape: shape.clone(), data: vec![0.0; shape.iter().product()] });
                continue;
            }
            let data = indices(&shape)
                .map(|idx| {
                    let idx = with_batch(&i.decl, &idx, req, batch);
                    t.data[offset(&i.decl, &idx, req, &requests, bindings, inputs)]
                })
                .collect();
            logical.push(Tensor { shape, data });
        }
        let values = eval_nodes(graph, &rb, &logical)?;
        for id in g.ids() {
            if g.node(id).op == crate::graph::Op::Unary(crate::graph::UnaryOp::Exp) {
                for x in &values[g.node(id).args[0].index()].data {
                    if x.is_finite() {
                        max_exp_arg = max_exp_arg.max(x.abs());
                    }
                }
            }
        }
        let outs: Vec<Tensor> = g.outputs.iter().map(|o| values[o.node.index()].clone()).collect();
        for (o, ((out, w), val)) in g.outputs.iter().zip(outputs.iter_mut().zip(written.iter_mut()).zip(outs)) {
            let shape = rb.extents(&o.decl.shape);
            // A combine's result may carry leading unit axes the declaration does not.
            let data = &val.data;
            for (lin, idx) in indices(&shape).enumerate() {
                let idx = with_batch(&o.decl, &idx, req, batch);
                let at = offset(&o.decl, &idx, req, &requests, bindings, inputs);
                out.data[at] = data[lin];
                w[at] = true;
            }
        }
    }
    Ok(Evaluated { outputs, written, max_exp_arg })
}

/// The request's batch index put in place of the batch axis' 0.
fn with_batch(t: &TensorDecl, idx: &[usize], req: usize, batch: Option<DimVar>) -> Vec<usize> {
    let mut idx = idx.to_vec();
    if let Some(bd) = batch {
        if let Some(a) = t.shape.iter().position(|d| *d == Dim::Var(bd)) {
            idx[a] = req;
        }
    }
    idx
}

/// Every index of a shape, row-major.
fn indices(shape: &[usize]) -> impl Iterator<Item = Vec<usize>> + '_ {
    let total: usize = shape.iter().product();
    (0..total).map(move |mut lin| {
        let mut idx = vec![0; shape.len()];
        for a in (0..shape.len()).rev() {
            idx[a] = lin % shape[a];
            lin /= shape[a];
        }
        idx
    })
}
