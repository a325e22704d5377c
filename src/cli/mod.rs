//! Command dispatch and argument parsing.

mod compile;
mod emit;
mod explain;
mod run;
mod schedule;
mod search;

use std::path::Path;

use cleave_core::front::{check_source, Module};

const USAGE: &str = "\
usage: cleave <command> FILE [options]

commands:
  check FILE                              parse and validate a declaration file
  search FILE --kernel NAME [--json]      run the algebraic phase: equivalent graphs
  schedule FILE --kernel NAME [--json] [--rank N]
                                          run the scheduling phase: candidates, best first,
                                          and the program of the chosen one (or of rank N)
  emit FILE --kernel NAME --target cuda|tilelang|rust --out DIR
                                          write the generated sources
  explain FILE --kernel NAME              every stage, readable: graphs, cost table, program
  run FILE --kernel NAME --backend emulate [--dims s=256,l=512] [--seed N] [--scale X,q=Y]
      [--source DIR] [--checks all|none|races,bounds] [--schedule random|round-robin|run-ahead]
                                          run the generated CUDA (or DIR/NAME.cu from `emit`)
                                          on the host emulator, checking for races, hazards and
                                          out-of-bounds accesses, against the f64 reference;
                                          prints max_rel_err=<x> last

options:
  --no-split                              search without Split-K
";

/// A user-facing failure: printed to stderr, exit code 1.
pub(crate) struct UserError(pub(crate) String);

/// Parsed `--flag value` options after the positional file.
pub(crate) struct Opts {
    pub(crate) file: String,
    pairs: Vec<(String, Option<String>)>,
}

impl Opts {
    fn parse(args: &[String], flags_with_values: &[&str], switches: &[&str]) -> Result<Opts, UserError> {
        let mut file = None;
        let mut pairs = Vec::new();
        let mut i = 0;
        while i < args.len() {
            let a = &args[i];
            if let Some(name) = a.strip_prefix("--") {
                let (name, inline) = match name.split_once('=') {
                    Some((n, v)) => (n, Some(v.to_string())),
                    None => (name, None),
                };
                if flags_with_values.contains(&name) {
                    let v = match inline {
                        Some(v) => v,
                        None => {
                            i += 1;
                            args.get(i).cloned().ok_or_else(|| UserError(format!("--{name} needs a value")))?
                        }
                    };
                    pairs.push((name.to_string(), Some(v)));
                } else if switches.contains(&name) && inline.is_none() {
                    pairs.push((name.to_string(), None));
                } else {
                    return Err(UserError(format!("unknown option --{name}\n\n{USAGE}")));
                }
            } else if file.is_none() {
                file = Some(a.clone());
            } else {
                return Err(UserError(format!("unexpected argument `{a}`\n\n{USAGE}")));
            }
            i += 1;
        }
        let file = file.ok_or_else(|| UserError(format!("missing FILE\n\n{USAGE}")))?;
        Ok(Opts { file, pairs })
    }

    pub(crate) fn value(&self, name: &str) -> Option<&str> {
        self.pairs.iter().rev().find(|(n, _)| n == name).and_then(|(_, v)| v.as_deref())
    }

    pub(crate) fn switch(&self, name: &str) -> bool {
        self.pairs.iter().any(|(n, v)| n == name && v.is_none())
    }

    pub(crate) fn required(&self, name: &str) -> Result<&str, UserError> {
        self.value(name).ok_or_else(|| UserError(format!("missing --{name}\n\n{USAGE}")))
    }
}

/// Reads and checks a declaration file; diagnostics become one user error.
pub(crate) fn load(file: &str) -> Result<Module, UserError> {
    let bytes = std::fs::read(Path::new(file)).map_err(|e| UserError(format!("{file}: cannot read: {e}")))?;
    check_source(&bytes).map_err(|diags| UserError(diags.iter().map(|d| d.render(file)).collect::<Vec<_>>().join("\n")))
}

/// Runs a command line; returns the exit code.
pub(crate) fn run(args: &[String]) -> i32 {
    let Some((cmd, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return 1;
    };
    let result = match cmd.as_str() {
        "check" => Opts::parse(rest, &[], &[]).and_then(|o| check(&o)),
        "explain" => Opts::parse(rest, &["kernel"], &["no-split"]).and_then(|o| explain::run(&o)),
        "search" => Opts::parse(rest, &["kernel", "max-ops", "max-states", "time-limit"], &["json", "no-split"])
            .and_then(|o| search::run(&o)),
        "schedule" => Opts::parse(rest, &["kernel", "rank"], &["json", "no-split"]).and_then(|o| schedule::run(&o)),
        "emit" => Opts::parse(rest, &["kernel", "target", "out"], &["no-split"]).and_then(|o| emit::run(&o)),
        "run" => Opts::parse(
            rest,
            &["kernel", "backend", "dims", "seed", "scale", "source", "checks", "schedule"],
            &["no-split"],
        )
        .and_then(|o| run::run(&o)),
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(())
        }
        other => Err(UserError(format!("unknown command `{other}`\n\n{USAGE}"))),
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
