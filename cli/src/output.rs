//! Output files of the commands (`-o`/`--out`): checked before the work whose result they
//! hold, then written whole or not at all.

use std::path::Path;

use anyhow::{Context, Result};

/// Fails, naming `path` and the reason, if the output cannot be written there.
pub fn check(path: &Path) -> Result<()> {
    drama_engine::files::check_writable(path).with_context(|| format!("cannot write {}", path.display()))
}

/// Writes `bytes` to `path` atomically.
pub fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    drama_engine::files::write_atomically(path, bytes).with_context(|| format!("writing {}", path.display()))
}
