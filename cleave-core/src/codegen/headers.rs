//! The tile-primitive headers, embedded so emitted sources are self-contained.

/// Every header of `include/cleave/`, as (file name, contents).
pub const FILES: &[(&str, &str)] = &[
    ("tile.cuh", include_str!("../../include/cleave/tile.cuh")),
    ("emu.h", include_str!("../../include/cleave/emu.h")),
    ("emu_context.h", include_str!("../../include/cleave/emu_context.h")),
    ("emu_numeric.h", include_str!("../../include/cleave/emu_numeric.h")),
];

/// Writes the headers under `dir/cleave/`.
pub fn write_to(dir: &std::path::Path) -> std::io::Result<()> {
    let sub = dir.join("cleave");
    std::fs::create_dir_all(&sub)?;
    for (name, text) in FILES {
        let path = sub.join(name);
        // Rewrite only on change, so build systems watching the files see no spurious edits.
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text) {
            std::fs::write(&path, text)?;
        }
    }
    Ok(())
}

/// A hash of all headers, for cache keys.
pub fn fingerprint() -> String {
    let parts: Vec<&[u8]> = FILES.iter().flat_map(|(n, t)| [n.as_bytes(), t.as_bytes()]).collect();
    crate::hash::hex(&parts)
}
