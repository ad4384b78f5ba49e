//! Output files of the commands (`-o`/`--out`): checked before the work whose result they
//! hold, then written whole or not at all.

use std::path::Path;

use anyhow::{Context, Result, bail};

/// Fails, naming `path` and the reason, if the output cannot be written there.
pub fn check(path: &Path) -> Result<()> {
    drama_engine::files::check_writable(path).with_context(|| format!("cannot write {}", path.display()))
}

/// Fails, naming `path` and `reason`, if its extension names another kind of file than
/// `extension` (compared without case): a command writes one kind of file, and whatever
/// goes by the name (`--voice`, a player) must not find another kind under it. With
/// `unnamed_allowed`, a path without an extension passes.
pub fn check_extension(path: &Path, extension: &str, unnamed_allowed: bool, reason: &str) -> Result<()> {
    match path.extension().and_then(|e| e.to_str()) {
        Some(found) if found.eq_ignore_ascii_case(extension) => Ok(()),
        None if unnamed_allowed => Ok(()),
        _ => bail!("cannot write {}: {reason}", path.display()),
    }
}

/// Writes `bytes` to `path` atomically.
pub fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    drama_engine::files::write_atomically(path, bytes).with_context(|| format!("writing {}", path.display()))
}
