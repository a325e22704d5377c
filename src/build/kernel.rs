//! One declared kernel through the pipeline, or out of the cache: its CUDA source, launcher
//! module, host-emulation symbols and lock entry.

use std::path::Path;
use std::time::Instant;

use cleave_core::codegen::plan::plan_data;
use cleave_core::codegen::rust::{self, ModuleSpec, TargetPlan};
use cleave_core::codegen::{cuda, headers};
use cleave_core::front::tokens::canonical;
use cleave_core::front::KernelDecl;
use cleave_core::graph::ValidGraph;
use cleave_core::pipeline::{self, KernelSchedule, Options, Variant};
use cleave_core::toolchain::ArchSet;
use serde_json::{json, Value};

use super::cache;

/// Where a kernel was declared, for messages and the lockfile.
#[derive(Clone, Debug)]
pub(crate) enum Origin {
    /// A kernel of a YAML file (the path as shown).
    Yaml(String),
    /// An inline `kernel!` at a file, line and column.
    Inline(String, usize, usize),
}

impl Origin {
    /// `kernels.yaml:12:5` or `src/lib.rs:3:1`.
    pub(crate) fn at(&self, decl: &KernelDecl) -> String {
        match self {
            Origin::Yaml(file) => format!("{file}:{}:{}", decl.name_pos.line, decl.name_pos.col),
            Origin::Inline(file, line, col) => format!("{file}:{line}:{col}"),
        }
    }

    /// The file.
    pub(crate) fn file(&self) -> &str {
        match self {
            Origin::Yaml(f) | Origin::Inline(f, ..) => f,
        }
    }
}

/// One kernel to build.
#[derive(Clone, Debug)]
pub(crate) struct Job {
    pub(crate) decl: KernelDecl,
    pub(crate) graph: ValidGraph,
    pub(crate) origin: Origin,
}

/// A kernel's generated artifacts.
#[derive(Clone, Debug)]
pub(crate) struct Generated {
    pub(crate) name: String,
    /// The CUDA translation unit (also the host-emulation source).
    pub(crate) cuda: String,
    /// `(kernel symbol, host entry point)` per launch: the names the emulation build gives the
    /// kernel's `extern "C"` functions.
    pub(crate) renames: Vec<(String, String)>,
    /// The launcher module.
    pub(crate) module: String,
    /// The chosen configuration, for `kernels.lock`.
    pub(crate) lock: Value,
    /// How it was obtained, for the build log.
    pub(crate) how: How,
}

/// Whether a kernel came from the cache or was searched.
#[derive(Clone, Debug)]
pub(crate) enum How {
    /// Loaded from this cache entry.
    Hit,
    /// Searched and scheduled.
    Searched {
        seconds: f64,
        search_seconds: f64,
        schedule_seconds: f64,
        graphs: usize,
        states: u64,
        /// The searches, one per set of extents planned for.
        searches: usize,
    },
}

/// The expression a module uses for its fatbin: a file the builder writes per build and per
/// kernel (each kernel has its own fatbin, so that editing one recompiles only it), so the
/// cached module text does not depend on whether nvcc was found.
fn fatbin_expr(kernel: &str) -> String {
    format!(r#"include!(concat!(env!("OUT_DIR"), "/cleave/fatbin/{kernel}.rs"))"#)
}

/// The cache key of a declaration under these options, for these architectures: everything
/// the generated artifacts depend on.
pub(crate) fn key(decl: &KernelDecl, opts: &Options, arches: &ArchSet) -> String {
    cleave_core::hash::hex(&[
        b"cleave-kernel-v1",
        rust::GENERATOR_FINGERPRINT.as_bytes(),
        headers::fingerprint().as_bytes(),
        env!("CARGO_PKG_VERSION").as_bytes(),
        rust::RUNTIME.as_bytes(),
        canonical(decl).as_bytes(),
        format!("{opts:?}").as_bytes(),
        format!("{arches:?}").as_bytes(),
    ])
}

/// Loads the kernel from the cache, or runs the pipeline and stores the result.
pub(crate) fn build(job: &Job, opts: &Options, arches: &ArchSet, cache_root: &Path) -> Result<Generated, String> {
    let name = &job.decl.name;
    let key = key(&job.decl, opts, arches);
    let path = cache_root.join("kernels").join(format!("{name}-{key}.json"));
    if let Some(hit) = load(&path, name) {
        return Ok(hit);
    }
    let start = Instant::now();
    let variants = guarded("search and scheduling", || {
        // The declaration was checked at every one of its extents when it was read.
        let points = cleave_core::front::points(&job.decl).map_err(|e| e.message)?;
        pipeline::compile_points(&job.graph, &points, opts, &arches.plan_targets()).map_err(|e| e.to_string())
    })?;
    let generated = guarded("code generation", || generate(job, &variants, arches, start))?;
    let entry = json!({
        "kernel": name,
        "cuda": generated.cuda,
        "renames": generated.renames,
        "module": generated.module,
        "lock": generated.lock,
    });
    // A cache that cannot be written only costs the next build a search.
    let _ = cache::publish(&path, entry.to_string().as_bytes());
    Ok(generated)
}

/// Runs one stage of a kernel's build and turns a panic in it into that kernel's error, naming
/// the stage: a compiler bug fails one kernel with a message, never the whole build script
/// with a backtrace.
fn guarded<T>(stage: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(format!("internal error in {stage}: {msg}"))
        }
    }
}

fn load(path: &Path, name: &str) -> Option<Generated> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    let renames = v["renames"]
        .as_array()?
        .iter()
        .map(|pair| Some((pair[0].as_str()?.to_string(), pair[1].as_str()?.to_string())))
        .collect::<Option<Vec<_>>>()?;
    Some(Generated {
        name: name.to_string(),
        cuda: v["cuda"].as_str()?.to_string(),
        renames,
        module: v["module"].as_str()?.to_string(),
        lock: v["lock"].clone(),
        how: How::Hit,
    })
}

fn generate(job: &Job, variants: &[Variant], arches: &ArchSet, start: Instant) -> Result<Generated, String> {
    let name = &job.decl.name;
    // A plan that shares another's kernels adds no code.
    let launches: Vec<(&cleave_core::plan::Launch, Option<u32>)> = variants
        .iter()
        .filter(|v| v.shares.is_none())
        .map(|v| (v.compiled.best(), arches.code_floor(v.min_cc)))
        .collect();
    // The host emulation runs the first target's plans.
    let hosted =
        variants.iter().take_while(|v| v.targets == variants[0].targets).filter(|v| v.shares.is_none()).count();
    let cuda = cuda::emit_plans(&launches, hosted, name);
    let mut plans = Vec::new();
    let mut targets = serde_json::Map::new();
    let mut summary = Vec::new();
    // The lock's key of each plan: its targets, and the extents it was made for.
    let key = |v: &Variant| {
        let target = v.targets.join(", ");
        if v.at.is_empty() {
            target
        } else {
            format!("{target} at {}", cleave_core::front::label(&v.at))
        }
    };
    for v in variants {
        let target = v.targets.join(", ");
        let plan = plan_data(v.compiled.best(), name).map_err(|e| e.to_string())?;
        if variants.len() > 1 {
            summary.push(format!("for {} (compute capability {}.{} and newer):", key(v), v.min_cc / 10, v.min_cc % 10));
        }
        match v.shares {
            Some(j) => {
                let same = key(&variants[j]);
                summary.push(format!("the plan for {same}"));
                targets.insert(key(v), json!({ "same_plan_as": same }));
            }
            None => {
                let (lock, lines) = describe(v);
                targets.insert(key(v), lock);
                summary.extend(lines);
            }
        }
        plans.push(TargetPlan { target, min_cc: v.min_cc, plan, shares: v.shares });
    }
    // Host entry points carry a hash of the source: kernels of the same name in two crates of
    // one binary then never clash at link time, and identical ones are identical code.
    let tag = &cleave_core::hash::hex(&[cuda.as_bytes()])[..16];
    let host_name = |symbol: &str| format!("{symbol}_{tag}");
    let renames: Vec<(String, String)> = plans
        .iter()
        .filter(|p| p.shares.is_none())
        .flat_map(|p| &p.plan.launches)
        .map(|l| (l.symbol.clone(), host_name(&l.symbol)))
        .collect();
    // The host emulation runs the first target's plans.
    let host_symbols: Vec<Vec<String>> = plans
        .iter()
        .take_while(|p| p.target == plans[0].target)
        .map(|p| match p.shares {
            Some(_) => Vec::new(),
            None => p.plan.launches.iter().map(|l| format!("cleave_emu_{}", host_name(&l.symbol))).collect(),
        })
        .collect();
    let lock = json!({
        "declaration": cleave_core::front::tokens::fingerprint(&job.decl),
        "targets": targets,
    });
    let module = rust::module(&ModuleSpec {
        decl: &job.decl,
        plans: &plans,
        host_symbols: &host_symbols,
        fatbin: &fatbin_expr(name),
        summary: &summary,
    })
    .map_err(|e| e.to_string())?;
    // Each set of extents is searched once for every target: the first target's plans have
    // one search each.
    let searches: Vec<_> = variants
        .iter()
        .filter(|v| v.targets == variants[0].targets)
        .filter_map(|v| v.compiled.search.as_ref().ok())
        .collect();
    Ok(Generated {
        name: name.clone(),
        cuda,
        renames,
        module,
        lock,
        how: How::Searched {
            seconds: start.elapsed().as_secs_f64(),
            search_seconds: searches.iter().map(|s| s.seconds).sum(),
            schedule_seconds: variants.iter().map(|v| v.compiled.schedule_seconds).sum(),
            graphs: searches.iter().map(|s| s.graphs.len()).sum(),
            states: searches.iter().map(|s| s.states_explored).sum(),
            searches: searches.len(),
        },
    })
}

/// One plan's lock entry (the graph, the split counts, each kernel's configuration, the
/// estimate) and its lines of the module's documentation.
fn describe(v: &Variant) -> (Value, Vec<String>) {
    let best = &v.compiled.ranked[0];
    let launch = &best.candidate.launch;
    let g = &launch.graph;
    let graph_form: Vec<String> = g.outputs.iter().map(|o| format!("{} = {}", o.decl.name, g.expr(o.node))).collect();
    let dims = launch.dims();
    // A split count the launcher derives from the extents has no one value to record.
    let splits: serde_json::Map<String, Value> = best
        .splits
        .iter()
        .map(|s| {
            let value = if cleave_core::plan::requests::is_runtime_split(dims, s.count) {
                json!("run time")
            } else {
                json!(s.value)
            };
            (s.name.clone(), value)
        })
        .collect();
    let kernels: Vec<Value> = launch
        .kernels
        .iter()
        .zip(&best.candidate.schedules)
        .map(|(k, schedule)| {
            let grid: Vec<String> = k
                .grid()
                .iter()
                .map(|a| {
                    let d = dims.get(a.dim);
                    if a.tile == 1 {
                        d.name.clone()
                    } else {
                        format!("ceil({}/{})", d.name, a.tile)
                    }
                })
                .collect();
            let KernelSchedule::Tiled(tiled) = schedule else {
                return json!({ "symbol": k.symbol(), "grid": grid, "fallback": true, "threads": k.threads() });
            };
            let config = &tiled.config;
            let out_tiles: serde_json::Map<String, Value> =
                config.out.iter().map(|(v, t)| (dims.get(*v).name.clone(), json!(t))).collect();
            let red_tiles: serde_json::Map<String, Value> =
                config.red.iter().map(|(n, t)| (format!("%{}", n.0), json!(t))).collect();
            json!({
                "symbol": k.symbol(),
                "grid": grid,
                "output_tiles": out_tiles,
                "reduction_tiles": red_tiles,
                "warps": config.warps,
                "stages": config.stages,
                "threads": k.threads(),
                "smem_bytes": k.smem_bytes(),
            })
        })
        .collect();
    let lock = json!({
        "min_compute_capability": format!("{}.{}", v.min_cc / 10, v.min_cc % 10),
        "graph": graph_form,
        "splits": splits,
        "kernels": kernels,
        "estimated_seconds": best.candidate.seconds,
    });

    let mut summary: Vec<String> = graph_form.iter().map(|f| format!("graph: `{f}`")).collect();
    if !best.splits.is_empty() {
        let s: Vec<String> = best.splits.iter().map(|s| s.label(launch.dims())).collect();
        summary.push(format!("split-K: {}", s.join(", ")));
    }
    for k in &launch.kernels {
        summary.push(format!(
            "`{}`: {} threads, {} bytes of dynamic shared memory",
            k.symbol(),
            k.threads(),
            k.smem_bytes()
        ));
    }
    summary.push(format!("estimated {:.3e} s at the representative extents", best.candidate.seconds));
    (lock, summary)
}

#[cfg(test)]
mod tests {
    use super::guarded;

    #[test]
    fn a_panic_in_a_stage_is_an_error_that_names_it() {
        let r: Result<(), String> = guarded("code generation", || panic!("index out of bounds"));
        assert_eq!(r, Err("internal error in code generation: index out of bounds".to_string()));
        let r: Result<(), String> = guarded("search and scheduling", || panic!("{}", String::from("bad tile")));
        assert_eq!(r, Err("internal error in search and scheduling: bad tile".to_string()));
        assert_eq!(guarded("x", || Ok::<_, String>(3)), Ok(3));
        assert_eq!(guarded("x", || Err::<(), _>("plain".to_string())), Err("plain".to_string()));
    }

    #[test]
    fn a_cached_lock_entry_reads_back_bit_for_bit() {
        // A cache hit must write the lock a miss writes. The default float parser of serde_json
        // can be one ulp off (0.00009716528615384615 read back as ...617), so the crate is built
        // with exact round trips.
        let mut rng = cleave_core::reference::Rng::new(3);
        let values = (0..2000).map(|_| f64::from_bits(rng.next_u64() >> 2)).chain([0.00009716528615384615, 1e-300]);
        for x in values.filter(|x| x.is_finite()) {
            let text = serde_json::json!({ "estimated_seconds": x }).to_string();
            let back: serde_json::Value = serde_json::from_str(&text).expect("json");
            assert_eq!(back["estimated_seconds"].as_f64().map(f64::to_bits), Some(x.to_bits()), "{text}");
        }
    }
}
