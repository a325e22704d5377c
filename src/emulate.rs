//! Host emulation of generated kernels, for the command line and the tests: compiles a launch's
//! CUDA source as C++ against the emulation header into a shared library (cached by content),
//! loads it, and runs the launch through the runtime's host executor, the same code path
//! `run_host` uses.

use std::path::{Path, PathBuf};

use cleave_core::codegen::plan::{AxisData, DeriveData, FactorData, ParamData, PlanData, TableData};
use cleave_core::codegen::{cuda, headers};
use cleave_core::graph::{Bindings, DType};
use cleave_core::plan::Launch;
use cleave_core::reference::Tensor;
use cleave_runtime::host::{EmuFn, EmuOptions};
use cleave_runtime::{
    Axis, Derive, DimSpec, Factor, KernelLaunch, LaunchPlan, Param, Product, Table, TensorSpec, WorkspaceSpec,
};

/// A compiled host-emulation library of one launch.
pub struct HostLibrary {
    lib: libloading::Library,
    plan: &'static LaunchPlan,
}

/// The directory for cached builds: `CLEAVE_CACHE_DIR`, else the user cache, else a temp dir.
pub fn cache_dir() -> PathBuf {
    cache_dir_from(std::env::var_os("CLEAVE_CACHE_DIR").filter(|v| !v.is_empty()))
}

/// The cache directory given an explicit choice (`CLEAVE_CACHE_DIR`'s value): that, else
/// `cleave` in the platform's user cache directory (`$XDG_CACHE_HOME` or `~/.cache` on Linux),
/// else a temp dir. The command line and the build script both use this one rule.
pub fn cache_dir_from(explicit: Option<std::ffi::OsString>) -> PathBuf {
    match explicit {
        Some(d) => PathBuf::from(d),
        None => dirs::cache_dir().map_or_else(|| std::env::temp_dir().join("cleave-cache"), |d| d.join("cleave")),
    }
}

/// The target this process was built for: the emulation library is loaded into it, so it is
/// compiled for the same target.
const TARGET: &str = cleave_core::toolchain::BUILD_TARGET;

/// The `cc` configuration of every host-emulation build, for `target`: C++17, optimized (the
/// emulator runs every thread of every block, and unoptimized it would crawl), the emulation
/// define and headers, and no Cargo output of `cc`'s own. The build script and [`compile`]
/// both start from it.
pub(crate) fn emulation_build(target: &str, include: &Path) -> cc::Build {
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        .debug(false)
        .warnings(false)
        .cargo_metadata(false)
        .cargo_warnings(false)
        .define("CLEAVE_EMULATE", None)
        .include(include);
    if !target.contains("msvc") {
        build.flag("-pthread").flag("-w");
    }
    build
}

/// The C++ compiler command for the emulation library, as `cc` chooses it (`CXX`, `CXXFLAGS`
/// and the target's defaults), with the flags of a shared library of this process' target.
fn compiler(include: &Path) -> Result<cc::Tool, String> {
    let mut build = emulation_build(TARGET, include);
    // Outside a build script nothing sets Cargo's variables, so the target is given here.
    build.target(TARGET).host(TARGET).pic(true).emit_rerun_if_env_changed(false);
    build.try_get_compiler().map_err(|e| format!("no C++ compiler for the host emulation (set CXX): {e}"))
}

/// Compiles the emulation library for a launch (or reuses the cached one).
pub fn compile(launch: &Launch, plan: &PlanData) -> Result<HostLibrary, String> {
    // SAFETY: the source is generated from this launch, and `plan` is that launch's plan.
    unsafe { compile_source(&cuda::emit_launch(launch, &plan.kernel), plan) }
}

/// Compiles CUDA source that implements `plan` (what `cleave emit --target cuda` writes, edited
/// or not) for the emulator, or reuses the cached library of the same source. The source is
/// compiled against the emulation headers of this build.
///
/// # Safety
///
/// The source is C++ that runs in this process. It must implement `plan`: one entry point per
/// launch, reading exactly the parameters the plan lists and touching the tensors only within
/// their extents. The emulator's bounds checks catch stray indexing through its accessors, but
/// no check can contain arbitrary C++ (raw pointer arithmetic, for one).
pub unsafe fn compile_source(source: &str, plan: &PlanData) -> Result<HostLibrary, String> {
    let dir = cache_dir().join("emu");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let inc = dir.join(format!("include-{}", headers::fingerprint()));
    let tool = compiler(&inc)?;
    let command: Vec<String> = std::iter::once(tool.path().to_string_lossy().into_owned())
        .chain(tool.args().iter().map(|a| a.to_string_lossy().into_owned()))
        .collect();
    let key =
        cleave_core::hash::hex(&[source.as_bytes(), headers::fingerprint().as_bytes(), command.join(" ").as_bytes()]);
    let lib_path = dir.join(format!("{}-{key}.so", plan.kernel));
    if !lib_path.exists() {
        headers::write_to(&inc).map_err(|e| format!("{}: {e}", inc.display()))?;
        let src_path = dir.join(format!("{}-{key}.cpp", plan.kernel));
        std::fs::write(&src_path, source).map_err(|e| format!("{}: {e}", src_path.display()))?;
        // Built under a unique name and renamed into place: concurrent test processes may
        // build the same library, and a reader must never load a half-written one.
        let tmp = tempfile::Builder::new()
            .prefix(&format!("{}-{key}.", plan.kernel))
            .suffix(".so")
            .tempfile_in(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .into_temp_path();
        let out = tool
            .to_command()
            .arg("-shared")
            .arg(&src_path)
            .arg("-o")
            .arg(&tmp)
            .output()
            .map_err(|e| format!("cannot run the C++ compiler `{}` (set CXX): {e}", command[0]))?;
        if !out.status.success() {
            return Err(format!(
                "the C++ compiler failed on {}:\n{}",
                src_path.display(),
                String::from_utf8_lossy(&out.stderr).lines().take(40).collect::<Vec<_>>().join("\n")
            ));
        }
        tmp.persist(&lib_path).map_err(|e| format!("{}: {e}", lib_path.display()))?;
    }
    load(&lib_path, plan)
}

fn load(path: &Path, plan: &PlanData) -> Result<HostLibrary, String> {
    // SAFETY: the library is one we just compiled from generated source; loading it runs no
    // initializers beyond the C++ runtime's.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(HostLibrary { lib, plan: leak_plan(plan) })
}

fn leak<T>(v: Vec<T>) -> &'static [T] {
    Box::leak(v.into_boxed_slice())
}

fn leak_str(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

fn rt_dtype(d: DType) -> cleave_runtime::DType {
    match d {
        DType::F16 => cleave_runtime::DType::F16,
        DType::BF16 => cleave_runtime::DType::BF16,
        DType::F32 => cleave_runtime::DType::F32,
        DType::I32 => cleave_runtime::DType::I32,
    }
}

fn product(fs: &[FactorData]) -> Product {
    Product(leak(
        fs.iter()
            .map(|f| match *f {
                FactorData::Const(c) => Factor::Const(c),
                FactorData::Dim(d) => Factor::Dim(d),
                FactorData::CeilDiv(d, t) => Factor::CeilDiv(d, t),
                FactorData::Slots { total, batch, tile } => Factor::Slots { total, batch, tile },
            })
            .collect(),
    ))
}

/// Builds the runtime's plan from plan data. The command line runs one plan per process, so
/// leaking it is the simplest way to give it the `'static` lifetime generated plans have.
pub fn leak_plan(p: &PlanData) -> &'static LaunchPlan {
    let tensor = |t: &cleave_core::codegen::plan::TensorData| TensorSpec {
        name: leak_str(&t.name),
        dtype: rt_dtype(t.dtype),
        shape: leak(
            t.shape
                .iter()
                .map(|a| match a {
                    AxisData::One => Axis::One,
                    AxisData::Dim(d) => Axis::Dim(*d),
                    AxisData::Merged(ds) => Axis::Merged(leak(ds.clone())),
                    AxisData::PlusOne(d) => Axis::PlusOne(*d),
                })
                .collect(),
        ),
    };
    Box::leak(Box::new(LaunchPlan {
        kernel: leak_str(&p.kernel),
        dims: leak(
            p.dims
                .iter()
                .map(|d| DimSpec {
                    name: leak_str(&d.name),
                    value: d.value,
                    dynamic: d.dynamic,
                    derive: d.derive.as_ref().map(
                        |DeriveData::SplitCount { blocks, streams, entries, batch, sms, resident, fill, launch }| {
                            Derive::SplitCount {
                                blocks: product(blocks),
                                streams: product(streams),
                                entries: product(entries),
                                batch: *batch,
                                sms: *sms,
                                resident: *resident,
                                fill: *fill,
                                launch: *launch,
                            }
                        },
                    ),
                })
                .collect(),
        ),
        inputs: leak(p.inputs.iter().map(tensor).collect()),
        outputs: leak(p.outputs.iter().map(tensor).collect()),
        workspaces: leak(p.workspaces.iter().map(|(b, f)| WorkspaceSpec { elem_bytes: *b, len: product(f) }).collect()),
        launches: leak(
            p.launches
                .iter()
                .map(|l| KernelLaunch {
                    symbol: leak_str(&l.symbol),
                    grid: [product(&l.grid), Product(&[]), Product(&[])],
                    threads: l.threads,
                    smem_bytes: l.smem_bytes,
                    params: leak(
                        l.params
                            .iter()
                            .map(|p| match *p {
                                ParamData::Input(i) => Param::Input(i),
                                ParamData::Output(i) => Param::Output(i),
                                ParamData::Workspace(i) => Param::Workspace(i),
                                ParamData::Extent(i) => Param::Extent(i),
                                ParamData::InputStride(i, a) => Param::InputStride(i, a),
                                ParamData::OutputStride(i, a) => Param::OutputStride(i, a),
                                ParamData::Scalar(i) => Param::Scalar(i),
                            })
                            .collect(),
                    ),
                })
                .collect(),
        ),
        tables: leak(
            p.tables
                .iter()
                .map(|t| match t {
                    TableData::Indptr { input, batch, bound } => {
                        Table::Indptr { input: *input, batch: *batch, bound: *bound }
                    }
                    TableData::Pages { input, indptr, batch, pages } => {
                        Table::Pages { input: *input, indptr: *indptr, batch: *batch, pages: leak(pages.clone()) }
                    }
                    TableData::LastPage { input, indptr, batch, page_size } => {
                        Table::LastPage { input: *input, indptr: *indptr, batch: *batch, page_size: *page_size }
                    }
                })
                .collect(),
        ),
    }))
}

/// A byte buffer whose start is 16-byte aligned, as device allocations are: kernels copy
/// through 16-byte vector accesses and cp.async.
struct Aligned {
    chunks: Vec<u128>,
    len: usize,
}

impl Aligned {
    fn new(bytes: &[u8]) -> Aligned {
        let chunks = bytes
            .chunks(16)
            .map(|b| {
                let mut v = [0u8; 16];
                v[..b.len()].copy_from_slice(b);
                u128::from_ne_bytes(v)
            })
            .collect();
        Aligned { chunks, len: bytes.len() }
    }

    fn as_ptr(&self) -> *const u8 {
        self.chunks.as_ptr().cast()
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.chunks.as_mut_ptr().cast()
    }

    fn bytes(&self) -> Vec<u8> {
        self.chunks.iter().flat_map(|c| c.to_ne_bytes()).take(self.len).collect()
    }
}

fn to_bytes(dtype: DType, data: &[f64]) -> Vec<u8> {
    match dtype {
        DType::F16 => data.iter().flat_map(|x| half::f16::from_f64(*x).to_bits().to_le_bytes()).collect(),
        DType::BF16 => data.iter().flat_map(|x| half::bf16::from_f64(*x).to_bits().to_le_bytes()).collect(),
        DType::F32 => data.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect(),
        DType::I32 => data.iter().flat_map(|x| (*x as i32).to_le_bytes()).collect(),
    }
}

fn from_bytes(dtype: DType, b: &[u8]) -> Vec<f64> {
    match dtype {
        DType::F16 => {
            b.chunks_exact(2).map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64()).collect()
        }
        DType::BF16 => {
            b.chunks_exact(2).map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64()).collect()
        }
        DType::F32 => b.chunks_exact(4).map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
        DType::I32 => b.chunks_exact(4).map(|c| f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
    }
}

/// The buffer shape of a tensor at these extents: its storage axes, or its shape when dense.
pub fn storage_shape(decl: &cleave_core::graph::TensorDecl, bindings: &Bindings) -> Vec<usize> {
    match &decl.layout {
        Some(l) => l.extents(&|d| bindings.extent(d) as u64).into_iter().map(|e| e as usize).collect(),
        None => bindings.extents(&decl.shape),
    }
}

/// How [`HostLibrary::run_shaped`] passes the tensors and picks the split count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunShape {
    /// Every tensor a padded, offset view of a larger buffer ([`HostLibrary::run_views`]).
    pub views: bool,
    /// The split count every split-count dim is pinned to (`None`: the launcher's choice).
    pub split_count: Option<u64>,
}

impl HostLibrary {
    /// The runtime plan this library implements.
    pub fn plan(&self) -> &'static LaunchPlan {
        self.plan
    }

    /// Runs the launch on inputs (graph input order, each its buffer: storage axes, row-major)
    /// at the given extents (one per dim of the launch's table; split chunks and per-request
    /// dims are derived), with the emulator's options from the environment. Returns the
    /// outputs' buffers.
    pub fn run(
        &self,
        launch: &Launch,
        bindings: &Bindings,
        inputs: &[Tensor],
        seed: u64,
    ) -> Result<Vec<Tensor>, String> {
        self.run_with(launch, bindings, inputs, seed, &EmuOptions::from_env()?)
    }

    /// Like [`HostLibrary::run`], with the emulator's checks and schedule given.
    pub fn run_with(
        &self,
        launch: &Launch,
        bindings: &Bindings,
        inputs: &[Tensor],
        seed: u64,
        options: &EmuOptions,
    ) -> Result<Vec<Tensor>, String> {
        self.run_shaped(launch, bindings, inputs, seed, options, RunShape::default())
    }

    /// Like [`HostLibrary::run_with`], with every input and output passed as a view inside a
    /// larger buffer: rows 16 bytes longer than the tensor's, one spare index on every outer
    /// axis, and a start 16 bytes into the buffer; every element outside a view is a NaN. An
    /// output element outside its view that the kernels change is an error. The outputs come
    /// back dense, so they can be compared with a dense run's: the kernels' arithmetic does not
    /// depend on where the tensors lie, so the two agree bit for bit.
    pub fn run_views(
        &self,
        launch: &Launch,
        bindings: &Bindings,
        inputs: &[Tensor],
        seed: u64,
        options: &EmuOptions,
    ) -> Result<Vec<Tensor>, String> {
        self.run_shaped(launch, bindings, inputs, seed, options, RunShape { views: true, ..RunShape::default() })
    }

    /// The run of [`HostLibrary::run_with`] or [`HostLibrary::run_views`] as `shape` says,
    /// with the split count pinned when it names one (as `Args::split_count` pins it on a GPU).
    pub fn run_shaped(
        &self,
        launch: &Launch,
        bindings: &Bindings,
        inputs: &[Tensor],
        seed: u64,
        options: &EmuOptions,
        shape: RunShape,
    ) -> Result<Vec<Tensor>, String> {
        let views = shape.views;
        let g = &launch.graph;
        let mut fns: Vec<EmuFn> = Vec::new();
        for l in self.plan.launches {
            let name = format!("cleave_emu_{}\0", l.symbol);
            // SAFETY: every `cleave_emu_*` entry point the generator writes has the `EmuFn`
            // signature.
            let f: libloading::Symbol<'_, EmuFn> =
                unsafe { self.lib.get(name.as_bytes()) }.map_err(|e| format!("{}: {e}", l.symbol))?;
            fns.push(*f);
        }
        // The plan's extents: the launch's dims without split chunks and per-request dims (the
        // kernels derive both), in table order.
        let mut extents: Vec<u64> = launch
            .dims()
            .iter()
            .filter(|(_, d)| {
                !matches!(d.kind, cleave_core::graph::DimKind::SplitChunk { .. }) && d.per_request.is_none()
            })
            .map(|(v, _)| bindings.values[v.index()])
            .collect();
        // Every buffer is sized from the library's own plan, not from `launch`, so a launch or
        // tensors that do not match the plan are refused here instead of reaching the kernels.
        let plan = self.plan;
        if inputs.len() != plan.inputs.len() {
            return Err(format!(
                "{}: {} inputs were given, but the plan declares {}",
                plan.kernel,
                inputs.len(),
                plan.inputs.len()
            ));
        }
        if extents.len() != plan.dims.len() {
            return Err(format!(
                "{}: the launch has {} dims, but the plan has {}",
                plan.kernel,
                extents.len(),
                plan.dims.len()
            ));
        }
        // A split count chosen at run time is the launcher's choice, for the GPU the plan was
        // made for (a launch on a device also takes that device's SM count and residency),
        // unless the caller pins it.
        cleave_runtime::plan::derive_extents(plan, &mut extents);
        if let Some(count) = shape.split_count {
            cleave_runtime::plan::pin_split_count(plan, &mut extents, count).map_err(|e| e.to_string())?;
        }
        let count = |spec: &TensorSpec| -> Result<usize, String> {
            let n = spec.elements(plan, &extents).map_err(|e| e.to_string())?;
            usize::try_from(n).map_err(|_| format!("{}: `{}` has {n} elements", plan.kernel, spec.name))
        };
        if g.inputs.len() != plan.inputs.len() || g.outputs.len() != plan.outputs.len() {
            return Err(format!("{}: the launch's tensors do not match the plan", plan.kernel));
        }
        // Index tensors and scalars are passed whole: only views of values are padded.
        let padded = |shape: &[usize], dtype: DType| {
            if views && dtype.is_float() && !shape.is_empty() {
                Padded::new(shape, dtype.size())
            } else {
                Padded::dense(shape)
            }
        };
        let mut in_views: Vec<Padded> = Vec::with_capacity(inputs.len());
        let mut in_bytes: Vec<Aligned> = Vec::with_capacity(inputs.len());
        for ((t, i), spec) in inputs.iter().zip(&g.inputs).zip(plan.inputs) {
            let n = count(spec)?;
            if t.data.len() != n || rt_dtype(i.decl.dtype) != spec.dtype {
                return Err(format!(
                    "{}: input `{}` has {} elements of {:?}, but the plan expects {n} of {:?}",
                    plan.kernel,
                    spec.name,
                    t.data.len(),
                    i.decl.dtype,
                    spec.dtype
                ));
            }
            let view = padded(&t.shape, i.decl.dtype);
            in_bytes.push(Aligned::new(&view.scatter(i.decl.dtype, &to_bytes(i.decl.dtype, &t.data))));
            in_views.push(view);
        }
        let mut out_views: Vec<Padded> = Vec::with_capacity(plan.outputs.len());
        let mut out_bytes: Vec<Aligned> = Vec::with_capacity(plan.outputs.len());
        for (o, spec) in g.outputs.iter().zip(plan.outputs) {
            if rt_dtype(o.decl.dtype) != spec.dtype {
                return Err(format!("{}: output `{}` has another dtype in the plan", plan.kernel, spec.name));
            }
            let shape = storage_shape(&o.decl, bindings);
            if shape.iter().product::<usize>() != count(spec)? {
                return Err(format!("{}: output `{}` has another shape in the plan", plan.kernel, spec.name));
            }
            let view = padded(&shape, o.decl.dtype);
            out_bytes.push(Aligned::new(&vec![0xFFu8; view.len * o.decl.dtype.size() as usize]));
            out_views.push(view);
        }
        // Each view starts `offset` elements into its buffer.
        let in_ptrs: Vec<*const u8> = in_bytes
            .iter()
            .zip(&in_views)
            .zip(&g.inputs)
            .map(|((b, v), i)| b.as_ptr().wrapping_add(v.offset * i.decl.dtype.size() as usize))
            .collect();
        let out_ptrs: Vec<*mut u8> = out_bytes
            .iter_mut()
            .zip(&out_views)
            .zip(&g.outputs)
            .map(|((b, v), o)| b.as_mut_ptr().wrapping_add(v.offset * o.decl.dtype.size() as usize))
            .collect();
        let mut layouts = cleave_runtime::Layouts::contiguous(plan, &extents).map_err(|e| e.to_string())?;
        for (i, (v, p)) in in_views.iter().zip(&in_ptrs).enumerate() {
            if plan.inputs[i].shape.is_empty() || plan.inputs[i].dtype == cleave_runtime::DType::I32 {
                continue;
            }
            layouts.set_input(plan, &extents, i, &v.strides, v.len - v.offset, *p as u64).map_err(|e| e.to_string())?;
        }
        for (o, (v, p)) in out_views.iter().zip(&out_ptrs).enumerate() {
            layouts
                .set_output(plan, &extents, o, &v.strides, v.len - v.offset, *p as u64)
                .map_err(|e| e.to_string())?;
        }
        // SAFETY: each buffer holds its tensor's view, whose strides, span and alignment the
        // layouts checked against the buffer from the view's start to its end, in the dtype
        // that `self.plan` gives the tensor for these extents (checked above); each is a
        // separate allocation, so outputs overlap nothing else, and the layouts checked that
        // no output overlaps itself; `fns` are the library's entry points for the plan's
        // launches, in order, and `compile_source`'s caller vouched that the library
        // implements the plan.
        unsafe {
            cleave_runtime::host::execute_with(plan, &fns, &extents, &layouts, &in_ptrs, &out_ptrs, seed, options)
        }
        .map_err(|e| e.to_string())?;
        let mut outs = Vec::with_capacity(g.outputs.len());
        for ((o, b), v) in g.outputs.iter().zip(&out_bytes).zip(&out_views) {
            let (dense, stray) = v.gather(o.decl.dtype, &b.bytes());
            if let Some(at) = stray {
                return Err(format!(
                    "{}: output `{}`: element {at} of its buffer, outside its view, was written",
                    plan.kernel, o.decl.name
                ));
            }
            outs.push(Tensor { shape: storage_shape(&o.decl, bindings), data: from_bytes(o.decl.dtype, &dense) });
        }
        Ok(outs)
    }
}

/// Where a tensor lies in the buffer the emulator passes: dense, or a padded view (see
/// [`HostLibrary::run_views`]).
struct Padded {
    shape: Vec<usize>,
    strides: Vec<usize>,
    /// The element the view starts at.
    offset: usize,
    /// The buffer's length in elements.
    len: usize,
}

impl Padded {
    fn dense(shape: &[usize]) -> Padded {
        let mut strides = vec![1; shape.len()];
        for a in (0..shape.len().saturating_sub(1)).rev() {
            strides[a] = strides[a + 1] * shape[a + 1];
        }
        Padded { shape: shape.to_vec(), strides, offset: 0, len: shape.iter().product() }
    }

    /// Rows 16 bytes longer, a spare index on each outer axis, and a 16-byte offset, so that
    /// a tensor copied in 16-byte chunks stays aligned.
    fn new(shape: &[usize], size: u64) -> Padded {
        let pad = (16 / size) as usize;
        let n = shape.len();
        let mut strides = vec![1; n];
        for a in (0..n.saturating_sub(1)).rev() {
            strides[a] = if a + 2 == n { shape[a + 1] + pad } else { strides[a + 1] * (shape[a + 1] + 1) };
        }
        let span: usize = 1 + shape.iter().zip(&strides).map(|(e, s)| e.saturating_sub(1) * s).sum::<usize>();
        Padded { shape: shape.to_vec(), strides, offset: pad, len: pad + span + pad }
    }

    /// The buffer offset of every element of the tensor, in row-major order.
    fn offsets(&self) -> Vec<usize> {
        let mut out = vec![self.offset];
        for (e, s) in self.shape.iter().zip(&self.strides) {
            out = out.iter().flat_map(|base| (0..*e).map(move |i| base + i * s)).collect();
        }
        out
    }

    /// The buffer holding `dense` (row-major bytes) at this view, NaN (all ones) elsewhere.
    fn scatter(&self, dtype: DType, dense: &[u8]) -> Vec<u8> {
        let size = dtype.size() as usize;
        let mut buf = vec![0xFFu8; self.len * size];
        for (d, at) in self.offsets().into_iter().enumerate() {
            buf[at * size..][..size].copy_from_slice(&dense[d * size..][..size]);
        }
        buf
    }

    /// The view's elements as dense row-major bytes, and the first element outside the view
    /// that is not all ones (written by someone), if any.
    fn gather(&self, dtype: DType, buf: &[u8]) -> (Vec<u8>, Option<usize>) {
        let size = dtype.size() as usize;
        let offsets = self.offsets();
        let mut inside = vec![false; self.len];
        let mut dense = Vec::with_capacity(offsets.len() * size);
        for at in offsets {
            inside[at] = true;
            dense.extend_from_slice(&buf[at * size..][..size]);
        }
        let stray = (0..self.len).find(|&at| !inside[at] && buf[at * size..][..size].iter().any(|&b| b != 0xFF));
        (dense, stray)
    }
}

#[cfg(test)]
mod tests {
    use super::cache_dir_from;
    use std::path::PathBuf;

    /// An explicit directory is used as given; otherwise the cache is `cleave` inside the
    /// platform's user cache directory (or a temp directory where there is none).
    #[test]
    fn the_cache_directory_rule() {
        assert_eq!(cache_dir_from(Some("/some/where".into())), PathBuf::from("/some/where"));
        let default = cache_dir_from(None);
        match dirs::cache_dir() {
            Some(user) => assert_eq!(default, user.join("cleave")),
            None => assert_eq!(default, std::env::temp_dir().join("cleave-cache")),
        }
        assert!(default.is_absolute(), "{}", default.display());
    }
}
