//! The content-addressed build cache, outside `OUT_DIR` so it survives `cargo clean`, profile
//! switches and other crates building the same kernels.
//!
//! ```text
//! <cache>/build/v1/kernels/<kernel>-<key>.json   pipeline result of one declaration
//! <cache>/build/v1/fatbin/<key>.fatbin           one fatbin per set of sources
//! <cache>/build/v1/emu/<key>/lib<name>.a         host-emulation library per set of sources
//! ```
//!
//! Every file is published by an atomic rename, so concurrent builds (two crates, two
//! profiles) never see half-written entries; a corrupt or unreadable entry is a miss.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::env::Env;

/// The layout version: bumped when the format of an entry changes.
const LAYOUT: &str = "v1";

/// The cache root: the builder's setting, else the command line's rule
/// ([`crate::emulate::cache_dir_from`]: `CLEAVE_CACHE_DIR`, else the user cache, else the temp
/// dir).
pub(crate) fn root(explicit: Option<&Path>, env: &Env) -> PathBuf {
    let base = match explicit {
        Some(dir) => dir.to_owned(),
        None => {
            let chosen = env.var("CLEAVE_CACHE_DIR");
            // The user cache directory comes from these on Linux.
            env.record("XDG_CACHE_HOME");
            env.record("HOME");
            crate::emulate::cache_dir_from(chosen)
        }
    };
    base.join("build").join(LAYOUT)
}

/// A unique temporary name next to `path`, for an atomic publish.
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(format!(".tmp.{}.{n}", std::process::id()));
    path.with_file_name(name)
}

/// Writes `bytes` to `path` through a temporary file and a rename.
pub(crate) fn publish(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let tmp = temp_path(path);
    fs::write(&tmp, bytes)?;
    fs::rename(&tmp, path).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// Writes `bytes` to `path` unless it already holds exactly them, so that nothing watching
/// the file sees a change that is not one. Returns whether it wrote.
pub(crate) fn write_if_changed(path: &Path, bytes: &[u8]) -> io::Result<bool> {
    if fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(false);
    }
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(path, bytes)?;
    Ok(true)
}

/// Copies `from` to `to` unless `to` already has the same contents.
pub(crate) fn copy_if_changed(from: &Path, to: &Path) -> io::Result<()> {
    let bytes = fs::read(from)?;
    write_if_changed(to, &bytes).map(|_| ())
}
