//! `drama fetch`: download the pinned checkpoint into a new directory and verify it.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use drama_checkpoint::fetch::{FetchRequest, fetch};

use crate::checkpoint_arg::default_pinned_dir;

/// Arguments of `drama fetch`.
#[derive(Args)]
pub struct FetchArgs {
    /// Target directory (default: the user cache, `drama/<repo>@<revision>`). Must not exist,
    /// or must already hold the complete, unmodified checkpoint.
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Runs `drama fetch`. The hub endpoint is `HF_ENDPOINT` (default huggingface.co).
pub fn run(args: FetchArgs) -> Result<()> {
    let dir = match args.dir {
        Some(dir) => dir,
        None => default_pinned_dir()?,
    };
    let mut request = FetchRequest::pinned(dir);
    request.progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fetched = fetch(&request)?;
    let checkpoint = &fetched.checkpoint;
    let action = if fetched.downloaded {
        "downloaded and verified"
    } else {
        "already present, verified"
    };
    outln!(
        "{action}: {} ({} files, {} bytes) in {}",
        checkpoint.provenance,
        checkpoint.files_verified,
        checkpoint.bytes_verified,
        checkpoint.dir.display()
    )?;
    Ok(())
}
