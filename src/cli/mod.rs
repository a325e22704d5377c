//! Command dispatch and argument parsing.

mod compile;
mod emit;
mod explain;
mod run;
mod schedule;
mod search;
mod tensors;

use std::path::Path;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{Arg, ArgAction, ArgMatches, Command};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use cleave_core::front::{check_source, Module};

/// The command line: every subcommand with its options, `--help` for each and `--version`.
/// Parsing errors (an unknown option, with the closest known one suggested; a missing value or
/// argument) are user errors, exit code 1.
/// The `NAME=N,...` pairs of `--dims` and `--at`, in order: each name once, each extent in
/// 1..2^31. The caller checks the names against the kernel's dims.
fn extent_pairs(spec: &str) -> Result<Vec<(&str, u64)>, String> {
    let mut pairs: Vec<(&str, u64)> = Vec::new();
    for part in spec.split(',').filter(|p| !p.trim().is_empty()) {
        let (name, value) = part.split_once('=').ok_or_else(|| format!("expects name=value pairs, got `{part}`"))?;
        let name = name.trim();
        if pairs.iter().any(|(n, _)| *n == name) {
            return Err(format!("`{name}` is given twice"));
        }
        let x = value
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|x| (1..1 << 31).contains(x))
            .ok_or_else(|| format!("`{name}` must be an integer in 1..2^31, got `{value}`"))?;
        pairs.push((name, x));
    }
    Ok(pairs)
}

fn command() -> Command {
    let file = || Arg::new("file").value_name("FILE").required(true).help("the declaration file (kernels.yaml)");
    let kernel = || Arg::new("kernel").long("kernel").value_name("NAME").required(true).help("the kernel to compile");
    let json = || Arg::new("json").long("json").action(ArgAction::SetTrue).help("machine-readable output (JSON)");
    let no_split = || Arg::new("no-split").long("no-split").action(ArgAction::SetTrue).help("search without Split-K");
    let arch = || {
        Arg::new("arch").long("arch").value_name("LIST").help(
            "the architectures to plan for, as CUDA_COMPUTE_CAP takes them (80,86,90 or all); by default \
             CUDA_COMPUTE_CAP, as a build reads it, else sm_80 and sm_90",
        )
    };
    let value = |name: &'static str, value_name: &'static str, help: &'static str| {
        Arg::new(name).long(name).value_name(value_name).help(help)
    };
    let at = || {
        value(
            "at",
            "NAME=N,...",
            "plan for these extents of dynamic dims instead of the declared ones, as a build does for an \
             `also` extent (e.g. b=64)",
        )
    };
    Command::new("cleave")
        .version(env!("CARGO_PKG_VERSION"))
        .about("Ahead-of-time fused-kernel compiler: search, schedule, generate and emulate kernels")
        .subcommand_required(true)
        .arg_required_else_help(true)
        .subcommand(Command::new("check").about("Parse and validate a declaration file").arg(file()))
        .subcommand(
            Command::new("search")
                .about("Run the algebraic phase: the graphs equivalent to a kernel")
                .args([file(), kernel(), json(), no_split()])
                .arg(value("max-ops", "N", "the largest graph the search builds, in ops"))
                .arg(value("max-states", "N", "stop after exploring this many states"))
                .arg(value("time-limit", "SECONDS", "stop after this much time")),
        )
        .subcommand(
            Command::new("schedule")
                .about("Run the scheduling phase: the candidates, best first, and the chosen program")
                .args([file(), kernel(), json(), no_split(), arch(), at()])
                .arg(value("rank", "N", "print the program of the candidate of this rank instead")),
        )
        .subcommand(
            Command::new("emit")
                .about("Write the generated sources of one kernel")
                .args([file(), kernel(), no_split(), arch(), at()])
                .arg(value("target", "cuda|tilelang|rust", "what to generate").required(true))
                .arg(value("out", "DIR", "the directory to write to").required(true)),
        )
        .subcommand(
            Command::new("explain")
                .about("Every stage, readable: graphs, cost table, program")
                .args([file(), kernel(), no_split(), arch(), at()])
                .arg(value(
                    "svg",
                    "DIR",
                    "also draw NAME.declared.svg, NAME.chosen.svg and NAME.schedule.svg into DIR",
                )),
        )
        .subcommand(
            Command::new("run")
                .about("Run a kernel's generated CUDA on the host emulator against the f64 reference")
                .long_about(
                    "Run the generated CUDA (or DIR/NAME.cu from `emit`) on the host emulator, checking for \
                     races, hazards and out-of-bounds accesses, against the f64 reference; prints \
                     max_rel_err=<x> last",
                )
                .args([file(), kernel(), no_split(), arch(), at()])
                .arg(value("backend", "emulate", "where to run (the host emulator)"))
                .arg(value("dims", "NAME=N,...", "extents of dynamic dims, e.g. s=256,l=512"))
                .arg(value("seed", "N", "the seed of the random inputs"))
                .arg(value(
                    "split",
                    "N",
                    "pin the split count the launcher would choose to N parts (1 to the most it could choose)",
                ))
                .arg(value("scale", "X[,INPUT=Y...]", "the inputs' magnitude, overall and per input"))
                .arg(value("source", "DIR", "run DIR/NAME.cu (as written by `emit`, perhaps edited)"))
                .arg(value("checks", "all|none|races,bounds,...", "the emulator's checks"))
                .arg(value("schedule", "random|round-robin|run-ahead", "the emulator's thread schedule"))
                .arg(value(
                    "inputs",
                    "FILE",
                    "read the inputs from a safetensors file (dynamic dims from their shapes)",
                ))
                .arg(value("outputs", "FILE", "write the emulated outputs to a safetensors file"))
                .arg(Arg::new("views").long("views").action(ArgAction::SetTrue).help(
                    "run again with every tensor a padded, offset view of a larger buffer; the outputs must match bit \
                     for bit",
                )),
        )
}

/// A user-facing failure: printed to stderr, exit code 1.
pub(crate) struct UserError(pub(crate) String);

/// A subcommand's options, as the commands read them: the positional file, then each option
/// given (a switch has no value).
pub(crate) struct Opts {
    pub(crate) file: String,
    pairs: Vec<(String, Option<String>)>,
}

impl Opts {
    fn from_matches(m: &ArgMatches, sub: &Command) -> Opts {
        let mut file = String::new();
        let mut pairs = Vec::new();
        for arg in sub.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "file" {
                file = m.get_one::<String>(id).cloned().unwrap_or_default();
            } else if matches!(arg.get_action(), ArgAction::SetTrue) {
                if m.get_flag(id) {
                    pairs.push((id.to_string(), None));
                }
            } else if let Some(v) = m.get_one::<String>(id) {
                pairs.push((id.to_string(), Some(v.clone())));
            }
        }
        Opts { file, pairs }
    }

    pub(crate) fn value(&self, name: &str) -> Option<&str> {
        self.pairs.iter().rev().find(|(n, _)| n == name).and_then(|(_, v)| v.as_deref())
    }

    pub(crate) fn switch(&self, name: &str) -> bool {
        self.pairs.iter().any(|(n, v)| n == name && v.is_none())
    }

    pub(crate) fn required(&self, name: &str) -> Result<&str, UserError> {
        self.value(name).ok_or_else(|| UserError(format!("missing --{name} (see `cleave help`)")))
    }
}

/// Shows a spinner on stderr while `work` runs, on a terminal only: indicatif draws nothing
/// when stderr is a pipe or a file, so scripts, pipes and build scripts stay quiet.
pub(crate) fn with_progress<T>(message: String, work: impl FnOnce() -> T) -> T {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        bar.set_style(style);
    }
    bar.set_message(message);
    bar.enable_steady_tick(Duration::from_millis(120));
    let out = work();
    bar.finish_and_clear();
    out
}

/// Reads and checks a declaration file; diagnostics become one user error, each its
/// `FILE:LINE:COL: message` line followed by the source line it points at (for a text file).
pub(crate) fn load(file: &str) -> Result<Module, UserError> {
    let bytes = std::fs::read(Path::new(file)).map_err(|e| UserError(format!("{file}: cannot read: {e}")))?;
    check_source(&bytes).map_err(|diags| {
        let text = std::str::from_utf8(&bytes).ok().filter(|t| !t.contains('\0'));
        let shown: Vec<String> = diags
            .iter()
            .map(|d| match text {
                Some(t) => d.render_with_source(file, t),
                None => d.render(file),
            })
            .collect();
        UserError(shown.join("\n"))
    })
}

/// Runs a command line (without the program name); returns the exit code.
pub(crate) fn run(args: &[String]) -> i32 {
    let cmd = command();
    let matches =
        match cmd.clone().try_get_matches_from(std::iter::once("cleave".to_string()).chain(args.iter().cloned())) {
            Ok(m) => m,
            Err(e) => {
                // Help and version go to stdout with success; a usage error is the user's.
                let _ = e.print();
                return match e.kind() {
                    ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => 0,
                    _ => 1,
                };
            }
        };
    let Some((name, m)) = matches.subcommand() else { return 1 };
    let Some(sub) = cmd.find_subcommand(name) else { return 1 };
    let o = Opts::from_matches(m, sub);
    let result = match name {
        "check" => check(&o),
        "explain" => explain::run(&o),
        "search" => search::run(&o),
        "schedule" => schedule::run(&o),
        "emit" => emit::run(&o),
        "run" => run::run(&o),
        other => Err(UserError(format!("unknown command `{other}`"))),
    };
    match result {
        Ok(()) => 0,
        Err(UserError(msg)) => {
            eprintln!("{msg}");
            1
        }
    }
}

fn check(o: &Opts) -> Result<(), UserError> {
    let module = load(&o.file)?;
    println!("{}: ok ({} kernel{})", o.file, module.kernels.len(), if module.kernels.len() == 1 { "" } else { "s" });
    Ok(())
}

/// Finds a kernel by name.
pub(crate) fn kernel<'m>(
    module: &'m Module,
    name: &str,
) -> Result<&'m (cleave_core::front::KernelDecl, cleave_core::graph::ValidGraph), UserError> {
    module.kernels.iter().find(|(d, _)| d.name == name).ok_or_else(|| {
        let names: Vec<&str> = module.kernels.iter().map(|(d, _)| d.name.as_str()).collect();
        UserError(format!("no kernel named `{name}`; the file declares: {}", names.join(", ")))
    })
}
