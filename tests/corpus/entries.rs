//! The corpus's declarations (`tests/corpus/*.yaml`) and the arguments of their `# run:`
//! comments, shared by the emulator's run (`tests/corpus.rs`) and TileLang's
//! (`tests/generated_tilelang.rs`).

use std::path::{Path, PathBuf};

use cleave_core::front::check_source;
use cleave_core::graph::{Bindings, ValidGraph};
use cleave_core::reference::InputScale;

/// One corpus kernel: its file, name, graph and the arguments of its `# run:` comment.
pub(crate) struct Entry {
    pub(crate) file: PathBuf,
    pub(crate) name: String,
    pub(crate) graph: ValidGraph,
    /// The `# run:` arguments, as `cleave run` takes them.
    pub(crate) args: Vec<String>,
}

pub(crate) fn corpus() -> Vec<Entry> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/corpus")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("corpus file");
        let module =
            check_source(text.as_bytes()).unwrap_or_else(|d| panic!("{} does not check: {d:?}", file.display()));
        // The `# run:` comment right above a `- name:` line gives that kernel's arguments.
        let mut run_args: Vec<(String, Vec<String>)> = Vec::new();
        let mut pending: Option<Vec<String>> = None;
        for line in text.lines() {
            let t = line.trim();
            if let Some(rest) = t.strip_prefix("# run:") {
                pending = Some(rest.split_whitespace().map(str::to_string).collect());
            } else if let Some(name) = t.strip_prefix("- name:") {
                let args = pending
                    .take()
                    .unwrap_or_else(|| panic!("{}: `{}` has no `# run:` line", file.display(), name.trim()));
                run_args.push((name.trim().to_string(), args));
            }
        }
        for (decl, graph) in module.kernels {
            let args = run_args
                .iter()
                .find(|(n, _)| *n == decl.name)
                .map(|(_, a)| a.clone())
                .unwrap_or_else(|| panic!("{}: no run line for {}", file.display(), decl.name));
            out.push(Entry { file: file.clone(), name: decl.name.clone(), graph, args });
        }
    }
    out
}

impl Entry {
    /// The extents and input scales of the `# run:` arguments (`--dims a=3,b=5`, `--scale 8`
    /// or `--scale 8,v=1`); dims they do not name keep their declared values.
    pub(crate) fn run(&self) -> Result<(Bindings, InputScale), String> {
        let g = &self.graph;
        let mut b = Bindings::of_table(&g.dims);
        let mut scale = InputScale { default: 1.0, per_input: Vec::new() };
        let mut args = self.args.iter();
        while let Some(flag) = args.next() {
            let value = args.next().ok_or_else(|| format!("`{flag}` has no value"))?;
            for item in value.split(',') {
                match (flag.as_str(), item.split_once('=')) {
                    ("--dims", Some((name, x))) => {
                        let (v, _) =
                            g.dims.iter().find(|(_, d)| d.name == name).ok_or_else(|| format!("no dim `{name}`"))?;
                        b.values[v.index()] = x.parse().map_err(|e| format!("--dims {item}: {e}"))?;
                    }
                    ("--scale", Some((input, x))) => {
                        let x = x.parse().map_err(|e| format!("--scale {item}: {e}"))?;
                        scale.per_input.push((input.to_string(), x));
                    }
                    ("--scale", None) => scale.default = item.parse().map_err(|e| format!("--scale {item}: {e}"))?,
                    _ => return Err(format!("`{flag} {value}` is not a dims or scale argument")),
                }
            }
        }
        b.complete(&g.dims);
        Ok((b, scale))
    }
}
