//! `cleave emit`: writes the generated sources of one kernel.

use std::path::Path;

use cleave_core::codegen::rust::{module, ModuleSpec, TargetPlan};
use cleave_core::codegen::{cuda, headers, plan::plan_data, tilelang};

use super::compile::compile_with_decl;
use super::{Opts, UserError};

pub(crate) fn run(o: &Opts) -> Result<(), UserError> {
    let target = o.required("target")?.to_string();
    let out = o.required("out")?.to_string();
    let (decl, c) = compile_with_decl(o)?;
    let launch = c.best();
    let name = &c.declared.name;
    let dir = Path::new(&out);
    std::fs::create_dir_all(dir).map_err(|e| UserError(format!("{out}: {e}")))?;
    let write = |file: &str, text: &str| -> Result<(), UserError> {
        let p = dir.join(file);
        std::fs::write(&p, text).map_err(|e| UserError(format!("{}: {e}", p.display())))?;
        println!("wrote {}", p.display());
        Ok(())
    };
    match target.as_str() {
        "cuda" => {
            write(&format!("{name}.cu"), &cuda::emit_launch(launch, name))?;
            headers::write_to(dir).map_err(|e| UserError(format!("{out}: {e}")))?;
            println!("wrote {}/cleave/ (headers)", dir.display());
        }
        "tilelang" => write(&format!("{name}.py"), &tilelang::emit_launch(launch, name))?,
        "rust" => {
            // The launcher module the build integration would include; outside a build there is
            // no fatbin to embed, so its GPU path reports `NotBuilt`.
            let plan = plan_data(launch, name).map_err(|e| UserError(format!("{name}: {e}")))?;
            let host: Vec<String> = plan.launches.iter().map(|l| format!("cleave_emu_{}", l.symbol)).collect();
            // One plan for every GPU of `--arch` together, as `cleave compile` makes it (a build
            // makes one per kind of GPU).
            let archs = super::compile::options(o)?.archs;
            let names: Vec<&str> = archs.iter().map(|a| a.name).collect();
            let min_cc = if archs.iter().any(|a| a.name == "sm_80") { 80 } else { 90 };
            let plans = [TargetPlan { target: names.join(", "), min_cc, plan, shares: None }];
            let text = module(&ModuleSpec {
                decl: &decl,
                plans: &plans,
                host_symbols: &[host],
                fatbin: "::core::option::Option::None",
                summary: &[],
            })
            .map_err(|e| UserError(e.to_string()))?;
            write(&format!("{name}.rs"), &text)?;
        }
        other => return Err(UserError(format!("unknown target `{other}`; expected cuda, tilelang or rust"))),
    }
    Ok(())
}
