//! Records the target triple for `cleave::emulate`, which compiles the host-emulation library
//! at run time for the process it is loaded into and tells `cc` which target that is.

// Printing to stdout is how a build script talks to Cargo.
#![allow(clippy::print_stdout)]

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    if let Ok(target) = std::env::var("TARGET") {
        println!("cargo::rustc-env=CLEAVE_TARGET={target}");
    }
}
