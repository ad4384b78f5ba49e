//! Output files of the commands (`-o`/`--out`): checked before the work whose result they
//! hold, then written whole or not at all.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail};

/// The reader of standard output has gone (a closed pipe, as in `drama graph | head`): what
/// was left to print has no one to read it, so the command ends quietly (see `main`).
#[derive(Debug)]
pub struct ReaderGone;

impl std::fmt::Display for ReaderGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output was closed by its reader")
    }
}

impl std::error::Error for ReaderGone {}

/// Writes `bytes` to standard output: the error is [`ReaderGone`] when its reader has gone,
/// never a panic (as `print!` would).
pub fn stdout(bytes: &[u8]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes).and_then(|()| out.flush()).map_err(|e| {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            anyhow::Error::new(ReaderGone)
        } else {
            anyhow::Error::new(e).context("writing to standard output")
        }
    })
}

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

/// Fails, naming the flag, if the output at `path` is one of the command's `inputs` (flag,
/// path): writing it would replace what the command reads.
pub fn check_not_an_input(path: &Path, inputs: &[(&str, Option<&Path>)]) -> Result<()> {
    let Ok(out) = path.canonicalize() else {
        return Ok(()); // Not there yet, so no input.
    };
    for (flag, input) in inputs {
        if input.and_then(|i| i.canonicalize().ok()).is_some_and(|i| i == out) {
            bail!("cannot write {}: it is the {flag} this command reads", path.display());
        }
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically.
pub fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    drama_engine::files::write_atomically(path, bytes).with_context(|| format!("writing {}", path.display()))
}
