//! The build-script side of Cleave: from kernel declarations to generated, compiled and
//! embedded kernels with typed launchers.
//!
//! ```no_run
//! // build.rs
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     cleave::build::Builder::new().kernels("kernels.yaml").compile()?;
//!     Ok(())
//! }
//! ```
//!
//! and in the crate:
//!
//! ```ignore
//! cleave::include_kernels!();          // pub mod kernels { pub mod attention { .. } .. }
//! cleave::kernel!(attention);          // pub mod attention { .. }, one kernel of the YAML
//! cleave::kernel! {                    // an inline declaration: pub mod swiglu { .. }
//!     name: swiglu,
//!     dims: { t: dyn 256, k: 4096, f: 14336 },
//!     inputs: { x: f16[t, k], w1: f16[k, f], w2: f16[k, f] },
//!     outputs: { y: f16[t, f] },
//!     body: { y = silu(matmul(x, w1)) * matmul(x, w2) }
//! }
//! ```
//!
//! # What `compile` does
//!
//! 1. Reads every YAML file (paths relative to `CARGO_MANIFEST_DIR`) and, unless disabled,
//!    scans `src/**/*.rs` for inline `kernel! { .. }` declarations. Errors in a YAML file fail
//!    the build with `FILE:LINE:COL: message` diagnostics, each reported to Cargo as a
//!    `cargo::error` (so Cargo prints it first, not buried in the script's output) and shown in
//!    the returned error with the source line it points at; an inline declaration with errors
//!    is left to the macro, which reports it at the offending token.
//! 2. Runs the pipeline (search, scheduling, code generation) for every kernel, in parallel,
//!    or takes the result from the cache.
//! 3. Writes under `OUT_DIR/cleave/`: the CUDA sources, the launcher modules, the headers and
//!    `build.log` (whether each kernel was a cache hit or searched, and how long it took).
//! 4. Compiles a fatbin per kernel with nvcc (in parallel), if nvcc is found; without it the
//!    build still succeeds with one warning, `launch` returns
//!    [`Error::NotBuilt`](crate::Error::NotBuilt) and `run_host` works.
//! 5. Compiles a host-emulation static library per kernel (the same CUDA source, as C++ against
//!    the emulation header) with the system C++ compiler and links them.
//! 6. Writes `kernels.lock` next to the (first) YAML file: the configuration chosen for every
//!    kernel. It is rewritten only when a choice changes; commit it to see in review when a
//!    kernel's schedule changed.
//!
//! # Environment
//!
//! - `CUDA_COMPUTE_CAP`: the architectures, a list (`80,90`, `sm_86 90a`) or `all`; the
//!   default is SASS for sm_80 and sm_90 plus compute_90 PTX. The GPU of the build machine is
//!   never consulted (no `nvidia-smi`).
//! - `NVCC`, `CUDA_HOME`, `CUDA_PATH`, `CUDA_ROOT`, `CUDA_TOOLKIT_ROOT_DIR`, `PATH`,
//!   `NVCC_CCBIN`: how nvcc is found (see [`cleave_core::toolchain::discover_with`]).
//! - `CLEAVE_CACHE_DIR`: the cache (default `cleave` in the user cache directory,
//!   `$XDG_CACHE_HOME` or `~/.cache` on Linux).
//! - `CXX`, `CXXFLAGS` and the other variables of the `cc` crate: the host C++ compiler.
//!
//! The script reruns only when a YAML file, a scanned source or one of these variables
//! changes (each is named in a precise `rerun-if-changed` / `rerun-if-env-changed`).
//!
//! # Cache
//!
//! Searching is the slow part, so its results live in a content-addressed cache outside
//! `OUT_DIR` (it survives `cargo clean`): one entry per declaration, keyed by the declaration,
//! the pipeline options (including the architectures), the versions of the generator and its
//! headers; one fatbin per kernel source, nvcc and architectures; one emulation library per
//! kernel source and C++ compiler. A rebuild with nothing changed searches nothing, and an
//! edit of one kernel searches and compiles that kernel only.
//!
//! # Build profile
//!
//! The search runs inside the build script, which Cargo compiles without optimizations by
//! default. Add this to the workspace's `Cargo.toml` to make it several times faster:
//!
//! ```toml
//! [profile.dev.build-override]
//! opt-level = 2
//! [profile.release.build-override]
//! opt-level = 2
//! ```

mod cache;
mod env;
mod expand;
mod kernel;
mod native;
mod scan;

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cleave_core::codegen::headers;
use cleave_core::front::check_source;
use cleave_core::front::tokens::fingerprint;
use cleave_core::pipeline::Options;
use cleave_core::toolchain::{discover_with, ArchSet};
use rayon::prelude::*;

use env::{Directives, Env};
use kernel::{Generated, How, Job, Origin};

/// Configures and runs the build of a crate's kernels; see the [module docs](self).
#[derive(Clone, Debug)]
pub struct Builder {
    yaml: Vec<PathBuf>,
    scan_src: bool,
    scan_extra: Vec<PathBuf>,
    arches: Option<String>,
    cache_dir: Option<PathBuf>,
    use_nvcc: bool,
    require_nvcc: bool,
    lockfile: bool,
    search_time_limit: Option<Duration>,
}

impl Default for Builder {
    fn default() -> Self {
        Self::new()
    }
}

impl Builder {
    /// A builder with no YAML file that scans `src/` for inline declarations, uses nvcc when it
    /// finds it, and writes a lockfile.
    pub fn new() -> Self {
        Builder {
            yaml: Vec::new(),
            scan_src: true,
            scan_extra: Vec::new(),
            arches: None,
            cache_dir: None,
            use_nvcc: true,
            require_nvcc: false,
            lockfile: true,
            search_time_limit: None,
        }
    }

    /// Adds a YAML declaration file, relative to the crate's manifest directory. Its kernels
    /// become `cleave::include_kernels!()`'s `kernels` module and `cleave::kernel!(name)`.
    pub fn kernels(mut self, path: impl Into<PathBuf>) -> Self {
        self.yaml.push(path.into());
        self
    }

    /// Whether to scan `src/**/*.rs` for inline `kernel! { .. }` declarations (default: yes).
    pub fn scan_sources(mut self, yes: bool) -> Self {
        self.scan_src = yes;
        self
    }

    /// Also scans this file or directory (relative to the manifest directory) for inline
    /// declarations: for kernels declared in `examples/`, `tests/` or `benches/`.
    pub fn scan(mut self, path: impl Into<PathBuf>) -> Self {
        self.scan_extra.push(path.into());
        self
    }

    /// The target architectures, in `CUDA_COMPUTE_CAP` syntax (`"80,90"`, `"all"`); overrides
    /// the variable.
    pub fn arches(mut self, list: impl Into<String>) -> Self {
        self.arches = Some(list.into());
        self
    }

    /// The cache directory (default: `CLEAVE_CACHE_DIR`, else the user cache directory).
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }

    /// Whether to look for nvcc at all (default: yes). Without it, `launch` returns
    /// `Error::NotBuilt` and `run_host` works.
    pub fn nvcc(mut self, yes: bool) -> Self {
        self.use_nvcc = yes;
        self
    }

    /// Fails the build when nvcc is not found, instead of warning (default: warn). For
    /// release pipelines that must ship GPU code.
    pub fn require_nvcc(mut self, yes: bool) -> Self {
        self.require_nvcc = yes;
        self
    }

    /// Whether to write `kernels.lock` next to the first YAML file (default: yes).
    pub fn lockfile(mut self, yes: bool) -> Self {
        self.lockfile = yes;
        self
    }

    /// Bounds the algebraic search of each kernel (default: the pipeline's own limit). A search
    /// that stops early still yields the best schedule among what it found.
    pub fn search_time_limit(mut self, limit: Duration) -> Self {
        self.search_time_limit = Some(limit);
        self
    }

    /// Runs the build; see the [module docs](self). Prints Cargo directives on stdout, so it
    /// belongs in a build script.
    pub fn compile(self) -> Result<Report, BuildError> {
        let env = Env::default();
        let mut directives = Directives::default();
        let result = self.run(&env, &mut directives);
        // Each located message goes to Cargo as an error, which it prints first rather than
        // inside the script's output; the snippets stay in the returned error, for stderr.
        if let Err(e) = &result {
            for m in e.messages() {
                directives.error(m);
            }
        }
        // Directives are printed even when the build fails, so that fixing a watched file
        // reruns the script.
        directives.emit(&env);
        result
    }

    fn run(&self, env: &Env, directives: &mut Directives) -> Result<Report, BuildError> {
        let out_dir = Env::cargo("OUT_DIR").map(PathBuf::from).ok_or_else(|| {
            BuildError::one("cleave::build::Builder::compile must run in a build script (OUT_DIR is not set)")
        })?;
        let manifest = Env::cargo("CARGO_MANIFEST_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
        let package = Env::cargo("CARGO_PKG_NAME").map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();

        let jobs = self.declarations(&manifest, directives)?;

        let arches = match &self.arches {
            Some(list) => ArchSet::parse(list),
            None => ArchSet::from_env(|v| env.var(v)),
        }
        .map_err(|e| BuildError::one(format!("{}: {e}", cleave_core::toolchain::COMPUTE_CAP_VAR)))?;
        let mut opts = Options { archs: arches.budgets(), ..Options::default() };
        if let Some(limit) = self.search_time_limit {
            opts.search.time_limit = limit;
        }
        let cache_root = cache::root(self.cache_dir.as_deref(), env);

        let results: Vec<Result<Generated, String>> =
            jobs.par_iter().map(|job| kernel::build(job, &opts, &arches, &cache_root)).collect();
        let mut generated = Vec::new();
        let mut errors = Vec::new();
        for (job, r) in jobs.iter().zip(results) {
            match r {
                Ok(g) => generated.push(g),
                Err(e) => errors.push(format!("{}: kernel `{}`: {e}", job.origin.at(&job.decl), job.decl.name)),
            }
        }
        if !errors.is_empty() {
            return Err(BuildError::new(errors));
        }

        let dir = out_dir.join("cleave");
        let io = |path: &Path, e: std::io::Error| BuildError::one(format!("{}: {e}", path.display()));
        let include = dir.join("include");
        headers::write_to(&include).map_err(|e| io(&include, e))?;
        let mut log = vec![format!("cleave {} build of `{package}`", env!("CARGO_PKG_VERSION"))];
        let (sources, units) = write_sources(&dir, &jobs, &generated).map_err(|(p, e)| io(&p, e))?;
        write_modules(&dir, &jobs, &generated).map_err(|(p, e)| io(&p, e))?;
        for (job, g) in jobs.iter().zip(&generated) {
            log.push(match &g.how {
                How::Hit => format!("kernel {} ({}): cache hit", g.name, job.origin.at(&job.decl)),
                How::Searched { seconds, search_seconds, schedule_seconds, graphs, states, searches } => format!(
                    "kernel {} ({}): searched in {seconds:.2} s (search {search_seconds:.2} s, {graphs} graphs, \
                     {states} states{}; schedule {schedule_seconds:.2} s)",
                    g.name,
                    job.origin.at(&job.decl),
                    if *searches > 1 { format!(", over {searches} sets of extents") } else { String::new() }
                ),
            });
        }

        // The GPU binaries, one fatbin per kernel.
        let named = |paths: &[PathBuf]| -> Vec<(String, PathBuf)> {
            generated.iter().zip(paths).map(|(g, p)| (g.name.clone(), p.clone())).collect()
        };
        let fatbin_dir = dir.join("fatbin");
        let mut fatbins = Vec::new();
        if !sources.is_empty() && self.use_nvcc {
            let found = discover_with(|v| {
                env.record(v);
                std::env::var_os(v)
            });
            match &found.nvcc {
                Some(nvcc) => {
                    let (major, minor) = nvcc.version;
                    log.push(format!(
                        "nvcc: {} (CUDA {major}.{minor}, found by {})",
                        nvcc.path.display(),
                        nvcc.found_by
                    ));
                    let lines = native::fatbins(nvcc, &named(&sources), &include, &arches, &cache_root, &fatbin_dir)
                        .map_err(|e| BuildError::one(format!("nvcc could not compile the generated kernels: {e}")))?;
                    log.extend(lines);
                    fatbins = generated.iter().map(|g| fatbin_dir.join(format!("{}.fatbin", g.name))).collect();
                }
                None => {
                    let why =
                        if found.notes.is_empty() { String::new() } else { format!(" ({})", found.notes.join("; ")) };
                    let message = format!(
                        "cleave: nvcc not found{why}; the kernels are generated but not compiled for the GPU, so \
                         `launch` returns Error::NotBuilt (`run_host` works). Set NVCC or CUDA_HOME to build GPU code"
                    );
                    if self.require_nvcc {
                        return Err(BuildError::one(message));
                    }
                    directives.warn(&message);
                    log.push("fatbin: not built (nvcc not found)".to_string());
                }
            }
        } else if !sources.is_empty() {
            log.push("fatbin: not built (disabled by the builder)".to_string());
        }
        // Each module includes `fatbin/NAME.rs`: its fatbin, or `None` without nvcc.
        let mut written = fatbins.clone();
        for g in &generated {
            let rs = fatbin_dir.join(format!("{}.rs", g.name));
            let text = if fatbins.is_empty() {
                "::core::option::Option::None\n".to_string()
            } else {
                format!(
                    "::core::option::Option::Some(::cleave::runtime::cuda::Fatbin {{ image: \
                     include_bytes!(concat!(env!(\"OUT_DIR\"), \"/cleave/fatbin/{}.fatbin\")), built_for: {:?} }})\n",
                    g.name,
                    arches.describe()
                )
            };
            cache::write_if_changed(&rs, text.as_bytes()).map_err(|e| io(&rs, e))?;
            written.push(rs);
        }
        remove_others(&fatbin_dir, &written);

        // The host-emulation libraries, one per kernel.
        if !units.is_empty() {
            let lines = native::emulation_libraries(
                &named(&units),
                &include,
                &package,
                &cache_root,
                &dir.join("lib"),
                env,
                directives,
            )
            .map_err(BuildError::one)?;
            log.extend(lines);
        }

        if self.lockfile && !jobs.is_empty() {
            let lock_path = self.lock_path(&manifest);
            let old = fs::read_to_string(&lock_path).ok();
            let text = lock_text(old.as_deref(), &jobs, &generated, &arches);
            match cache::write_if_changed(&lock_path, text.as_bytes()) {
                Ok(true) => log.push(format!("lockfile: updated {}", lock_path.display())),
                Ok(false) => log.push(format!("lockfile: unchanged {}", lock_path.display())),
                Err(e) => directives.warn(&format!("cleave: could not write {}: {e}", lock_path.display())),
            }
        }

        let log_path = dir.join("build.log");
        log.push(String::new());
        fs::write(&log_path, log.join("\n")).map_err(|e| io(&log_path, e))?;
        Ok(Report {
            kernels: jobs
                .iter()
                .zip(&generated)
                .map(|(job, g)| KernelReport {
                    name: g.name.clone(),
                    origin: job.origin.at(&job.decl),
                    cache_hit: matches!(g.how, How::Hit),
                    seconds: match g.how {
                        How::Hit => 0.0,
                        How::Searched { seconds, .. } => seconds,
                    },
                })
                .collect(),
            fatbins,
            out_dir: dir,
            log: log_path,
        })
    }

    /// Reads the YAML files and scans the sources: every kernel to build, with names unique
    /// across both.
    fn declarations(&self, manifest: &Path, directives: &mut Directives) -> Result<Vec<Job>, BuildError> {
        let mut jobs = Vec::new();
        let mut errors = Vec::new();
        for file in &self.yaml {
            let path = manifest.join(file);
            let shown = file.display().to_string();
            directives.watch(&path);
            let bytes = match fs::read(&path) {
                Ok(b) => b,
                Err(e) => {
                    let message = format!("{shown}: cannot read the kernel declarations ({}): {e}", path.display());
                    errors.push((message, None));
                    continue;
                }
            };
            match check_source(&bytes) {
                Ok(module) => jobs.extend(module.kernels.into_iter().map(|(decl, graph)| Job {
                    decl,
                    graph,
                    origin: Origin::Yaml(shown.clone()),
                })),
                Err(diags) => {
                    let text = std::str::from_utf8(&bytes).ok().filter(|t| !t.contains('\0'));
                    errors.extend(diags.iter().map(|d| {
                        let shown_with_source = text.map(|t| d.render_with_source(&shown, t));
                        (d.render(&shown), shown_with_source)
                    }));
                }
            }
        }
        let mut roots = Vec::new();
        if self.scan_src {
            roots.push(manifest.join("src"));
        }
        roots.extend(self.scan_extra.iter().map(|p| manifest.join(p)));
        // Every file is read first: a `macro_rules!` of one file may be invoked in another.
        let mut files = Vec::new();
        for root in roots {
            for path in scan::rust_files(&root) {
                directives.watch(&path);
                let Ok(text) = fs::read_to_string(&path) else { continue };
                files.push((path.strip_prefix(manifest).unwrap_or(&path).display().to_string(), text));
            }
        }
        let macros = scan::macros(files.iter().map(|(_, t)| t.as_str()));
        for (shown, text) in &files {
            for k in scan::scan_text(shown, text, &macros) {
                jobs.push(Job { decl: k.decl, graph: k.graph, origin: Origin::Inline(k.file, k.line, k.col) });
            }
        }
        let mut first: BTreeMap<&str, String> = BTreeMap::new();
        for job in &jobs {
            let at = job.origin.at(&job.decl);
            if let Some(prev) = first.get(job.decl.name.as_str()) {
                let message = format!(
                    "{at}: kernel `{}` is declared twice (first at {prev}); kernel names must be unique in a crate",
                    job.decl.name
                );
                errors.push((message, None));
            } else {
                first.insert(&job.decl.name, at);
            }
        }
        if errors.is_empty() {
            Ok(jobs)
        } else {
            let (messages, shown): (Vec<String>, Vec<Option<String>>) = errors.into_iter().unzip();
            let shown = shown.into_iter().zip(&messages).map(|(s, m)| s.unwrap_or_else(|| m.clone())).collect();
            Err(BuildError { messages, shown })
        }
    }

    fn lock_path(&self, manifest: &Path) -> PathBuf {
        match self.yaml.first() {
            Some(yaml) => manifest.join(yaml).with_extension("lock"),
            None => manifest.join("kernels.lock"),
        }
    }
}

/// Writes each kernel's CUDA source and its host-emulation unit; returns both lists.
fn write_sources(
    dir: &Path,
    jobs: &[Job],
    generated: &[Generated],
) -> Result<(Vec<PathBuf>, Vec<PathBuf>), (PathBuf, std::io::Error)> {
    let src = dir.join("src");
    let mut sources = Vec::new();
    let mut units = Vec::new();
    for (job, g) in jobs.iter().zip(generated) {
        let cu = src.join(format!("{}.cu", g.name));
        cache::write_if_changed(&cu, g.cuda.as_bytes()).map_err(|e| (cu.clone(), e))?;
        let mut unit = format!(
            "// Generated by cleave: the host-emulation build of kernel `{}` ({}).\n\
             // Its extern \"C\" functions are renamed with a hash of the source, so that kernels of the\n\
             // same name in two crates of one program never clash at link time.\n",
            g.name,
            job.origin.file()
        );
        for (symbol, renamed) in &g.renames {
            unit.push_str(&format!("#define {symbol} {renamed}\n#define cleave_emu_{symbol} cleave_emu_{renamed}\n"));
        }
        unit.push_str(&format!("#include \"{}.cu\"\n", g.name));
        let cpp = src.join(format!("{}.emu.cpp", g.name));
        cache::write_if_changed(&cpp, unit.as_bytes()).map_err(|e| (cpp.clone(), e))?;
        sources.push(cu);
        units.push(cpp);
    }
    remove_others(&src, &sources.iter().chain(&units).cloned().collect::<Vec<_>>());
    Ok((sources, units))
}

/// Writes the launcher modules: `yaml/<name>.rs` per YAML kernel with `kernels.rs` including
/// them all, and `inline/<name>-<declaration hash>.rs` per inline kernel. Files of kernels no
/// longer declared are removed, so the macros report a stale name instead of using old code.
fn write_modules(dir: &Path, jobs: &[Job], generated: &[Generated]) -> Result<(), (PathBuf, std::io::Error)> {
    let yaml_dir = dir.join("yaml");
    let inline_dir = dir.join("inline");
    fs::create_dir_all(&yaml_dir).map_err(|e| (yaml_dir.clone(), e))?;
    fs::create_dir_all(&inline_dir).map_err(|e| (inline_dir.clone(), e))?;
    let mut index = String::from("// Generated by cleave: every kernel of the YAML files. Do not edit.\n");
    let mut written = Vec::new();
    for (job, g) in jobs.iter().zip(generated) {
        let path = match &job.origin {
            Origin::Yaml(_) => {
                index.push_str(&format!("include!(concat!(env!(\"OUT_DIR\"), \"/cleave/yaml/{}.rs\"));\n", g.name));
                yaml_dir.join(format!("{}.rs", g.name))
            }
            Origin::Inline(..) => inline_dir.join(format!("{}-{}.rs", g.name, fingerprint(&job.decl))),
        };
        cache::write_if_changed(&path, g.module.as_bytes()).map_err(|e| (path.clone(), e))?;
        written.push(path);
    }
    remove_others(&yaml_dir, &written);
    remove_others(&inline_dir, &written);
    let index_path = dir.join("kernels.rs");
    cache::write_if_changed(&index_path, index.as_bytes()).map_err(|e| (index_path.clone(), e))?;
    Ok(())
}

/// Removes the files of `dir` that are not in `keep`.
fn remove_others(dir: &Path, keep: &[PathBuf]) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_file() && !keep.contains(&path) {
            let _ = fs::remove_file(&path);
        }
    }
}

/// The lockfile: per set of target architectures, per kernel, where it is declared and what
/// was chosen. The plans differ by architecture (shared memory, SM count), so each set has its
/// own entry, and the entries of other sets in the `old` lockfile are kept as they are:
/// building for another `CUDA_COMPUTE_CAP` adds or updates its entry and changes no other.
fn lock_text(old: Option<&str>, jobs: &[Job], generated: &[Generated], arches: &ArchSet) -> String {
    let mut kernels = serde_json::Map::new();
    for (job, g) in jobs.iter().zip(generated) {
        let mut entry = g.lock.clone();
        if let Some(obj) = entry.as_object_mut() {
            obj.insert("source".into(), serde_json::Value::String(job.origin.file().to_string()));
        }
        kernels.insert(g.name.clone(), entry);
    }
    merged_lock(old, &arches.describe(), kernels)
}

/// The lockfile text with the plan of `arches` set to `kernels` and every other plan of `old`
/// (a lockfile of this format; anything else is replaced) unchanged. Keys are sorted, so the
/// same plans always give the same bytes.
fn merged_lock(old: Option<&str>, arches: &str, kernels: serde_json::Map<String, serde_json::Value>) -> String {
    let mut plans = old
        .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
        .and_then(|v| v.get("plans").and_then(|p| p.as_object()).cloned())
        .unwrap_or_default();
    let mut plan = serde_json::Map::new();
    plan.insert("cleave".into(), serde_json::Value::String(env!("CARGO_PKG_VERSION").into()));
    plan.insert("kernels".into(), serde_json::Value::Object(kernels));
    plans.insert(arches.to_string(), serde_json::Value::Object(plan));
    let doc = serde_json::json!({
        "comment": "Generated by cleave::build: the configuration chosen for each kernel, per set of target \
                    architectures. Do not edit; commit it.",
        "plans": plans,
    });
    let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    text.push('\n');
    text
}

/// What a build did.
#[derive(Clone, Debug)]
pub struct Report {
    /// One entry per kernel, YAML kernels first.
    pub kernels: Vec<KernelReport>,
    /// One fatbin per kernel, in the order of `kernels`, when nvcc built them.
    pub fatbins: Vec<PathBuf>,
    /// `OUT_DIR/cleave`.
    pub out_dir: PathBuf,
    /// The build log.
    pub log: PathBuf,
}

/// What happened to one kernel.
#[derive(Clone, Debug)]
pub struct KernelReport {
    /// The kernel name.
    pub name: String,
    /// Where it is declared (`FILE:LINE:COL`).
    pub origin: String,
    /// Whether the pipeline result came from the cache.
    pub cache_hit: bool,
    /// Seconds spent searching and scheduling (0 on a cache hit).
    pub seconds: f64,
}

/// Why a build failed: one located message per problem.
#[derive(Clone, PartialEq, Eq)]
pub struct BuildError {
    messages: Vec<String>,
    /// Each message as printed: with the source line it points at, where there is one.
    shown: Vec<String>,
}

impl BuildError {
    fn new(messages: Vec<String>) -> Self {
        BuildError { shown: messages.clone(), messages }
    }

    fn one(message: impl Into<String>) -> Self {
        BuildError::new(vec![message.into()])
    }

    /// The messages, each `FILE:LINE:COL: message` where a location is known.
    pub fn messages(&self) -> &[String] {
        &self.messages
    }
}

/// Every message, each followed by the source line it points at where the build read one.
impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown.join("\n"))
    }
}

/// The same text as `Display`: a build script's `main` returning this error prints it with
/// `Debug`, and the user should see the located messages, not a struct dump.
impl fmt::Debug for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "cleave could not build the kernels:")?;
        f.write_str(&self.shown.join("\n"))
    }
}

impl std::error::Error for BuildError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lockfile_keeps_the_plans_of_other_architectures() {
        let kernels = |graph: &str| {
            let mut m = serde_json::Map::new();
            m.insert("attention".into(), serde_json::json!({ "graph": [graph] }));
            m
        };
        let both = merged_lock(None, "sm_80, sm_90, compute_90", kernels("o = a"));
        let with_86 = merged_lock(Some(&both), "sm_86", kernels("o = b"));
        let v: serde_json::Value = serde_json::from_str(&with_86).expect("JSON");
        assert_eq!(v["plans"]["sm_80, sm_90, compute_90"]["kernels"]["attention"]["graph"][0], "o = a");
        assert_eq!(v["plans"]["sm_86"]["kernels"]["attention"]["graph"][0], "o = b");
        // Building the first set again changes nothing; updating it leaves sm_86 alone.
        assert_eq!(merged_lock(Some(&with_86), "sm_80, sm_90, compute_90", kernels("o = a")), with_86);
        let updated = merged_lock(Some(&with_86), "sm_80, sm_90, compute_90", kernels("o = c"));
        let u: serde_json::Value = serde_json::from_str(&updated).expect("JSON");
        assert_eq!(u["plans"]["sm_86"], v["plans"]["sm_86"]);
        assert_eq!(u["plans"]["sm_80, sm_90, compute_90"]["kernels"]["attention"]["graph"][0], "o = c");
        // A lockfile of the earlier format, or not JSON at all, is replaced.
        let fresh = merged_lock(Some("{\"arches\": \"sm_80\", \"kernels\": {}}"), "sm_86", kernels("o = b"));
        let f: serde_json::Value = serde_json::from_str(&fresh).expect("JSON");
        assert_eq!(f["plans"].as_object().map(|p| p.len()), Some(1));
        assert!(f.get("kernels").is_none());
    }

    #[test]
    fn build_errors_print_their_messages() {
        let e = BuildError::one("kernels.yaml:3:5: unknown op `foo`");
        assert_eq!(e.to_string(), "kernels.yaml:3:5: unknown op `foo`");
        assert!(format!("{e:?}").ends_with("kernels.yaml:3:5: unknown op `foo`"));
    }
}
