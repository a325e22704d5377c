//! The content-addressed build cache, outside `OUT_DIR` so it survives `cargo clean`, profile
//! switches and other crates building the same kernels.
//!
//! ```text
//! <cache>/build/v2/kernels/<kernel>-<key>.json   pipeline result of one declaration
//! <cache>/build/v2/fatbin/<key>.fatbin           the fatbin of one kernel's source
//! <cache>/build/v2/emu/<key>/lib<name>.a         the host-emulation library of one kernel
//! ```
//!
//! Every file is published by an atomic rename, so concurrent builds (two crates, two
//! profiles) never see half-written entries; a corrupt or unreadable entry is a miss.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::env::Env;

/// The layout version: bumped when the format of an entry changes.
const LAYOUT: &str = "v2";

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

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename, so
/// that a concurrent reader sees the old file or the new one, never a part.
pub(crate) fn publish(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.persist(path).map(drop).map_err(|e| e.error)
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
