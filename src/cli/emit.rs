//! `cleave emit`: writes the generated sources of one kernel.

use std::path::Path;

use cleave_core::codegen::{cuda, headers, plan::plan_data, tilelang};

use super::compile::compile_kernel;
use super::{Opts, UserError};

pub(crate) fn run(o: &Opts) -> Result<(), UserError> {
    let target = o.required("target")?.to_string();
    let out = o.required("out")?.to_string();
    let c = compile_kernel(o)?;
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
            let plan = plan_data(launch, name).map_err(|e| UserError(format!("{name}: {e}")))?;
            write(&format!("{name}_plan.rs"), &format!("{}\n", plan.to_rust("::cleave::runtime")))?;
        }
        other => return Err(UserError(format!("unknown target `{other}`; expected cuda, tilelang or rust"))),
    }
    Ok(())
}
