//! What a build script reads from and says to Cargo: every environment variable read is
//! recorded, so that the script emits exactly one `cargo::rerun-if-env-changed` per variable,
//! and every directive is collected and printed at the end, in a stable order.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::Path;
use std::sync::Mutex;

/// The environment as the build sees it, with a record of what was read.
#[derive(Debug, Default)]
pub(crate) struct Env {
    read: Mutex<BTreeSet<String>>,
}

impl Env {
    /// Reads a variable and records that it was read; an empty value counts as unset.
    pub(crate) fn var(&self, name: &str) -> Option<OsString> {
        self.record(name);
        std::env::var_os(name).filter(|v| !v.is_empty())
    }

    /// Records a variable that some other code (nvcc discovery, the C++ compiler) read.
    pub(crate) fn record(&self, name: &str) {
        self.read.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(name.to_string());
    }

    /// A variable Cargo sets for build scripts; not recorded, because Cargo reruns the script
    /// whenever it changes them.
    pub(crate) fn cargo(name: &str) -> Option<OsString> {
        std::env::var_os(name).filter(|v| !v.is_empty())
    }

    fn names(&self) -> Vec<String> {
        self.read.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().cloned().collect()
    }
}

/// The directives for Cargo, printed together by [`Directives::emit`].
#[derive(Debug, Default)]
pub(crate) struct Directives {
    files: BTreeSet<String>,
    link: Vec<String>,
    warnings: Vec<String>,
    errors: Vec<String>,
}

impl Directives {
    /// Reruns the build script when `path` changes. Only existing files are watched: a missing
    /// path would make Cargo rerun the script on every build, and a directory would make it
    /// rerun on any change below it.
    pub(crate) fn watch(&mut self, path: &Path) {
        if path.is_file() {
            self.files.insert(path.display().to_string());
        }
    }

    /// A `cargo::rustc-link-*` directive (without the `cargo::` prefix).
    pub(crate) fn link(&mut self, directive: String) {
        if !self.link.contains(&directive) {
            self.link.push(directive);
        }
    }

    /// A warning Cargo shows to the user; one line.
    pub(crate) fn warn(&mut self, message: &str) {
        self.warnings.push(message.replace('\n', " "));
    }

    /// Reports a build failure to Cargo, which shows it above the script's output.
    pub(crate) fn error(&mut self, message: &str) {
        self.errors.push(message.replace('\n', " "));
    }

    /// Prints every directive: watched files, read variables, link directives, warnings.
    // Printing to stdout is how a build script talks to Cargo.
    #[allow(clippy::print_stdout)]
    pub(crate) fn emit(&self, env: &Env) {
        for f in &self.files {
            println!("cargo::rerun-if-changed={f}");
        }
        for v in env.names() {
            println!("cargo::rerun-if-env-changed={v}");
        }
        for l in &self.link {
            println!("cargo::{l}");
        }
        for w in &self.warnings {
            println!("cargo::warning={w}");
        }
        for e in &self.errors {
            println!("cargo::error={e}");
        }
    }
}
