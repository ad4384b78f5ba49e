//! The `--checkpoint` argument shared by every command that loads a model.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use drama_engine::checkpoint::{Checkpoint, PINNED_REPO, PINNED_REVISION, Provenance};

/// Which checkpoint to load.
#[derive(Args)]
pub struct CheckpointArg {
    /// Checkpoint directory (labelled `local <dir>`).
    #[arg(long)]
    checkpoint: PathBuf,
}

impl CheckpointArg {
    /// Opens and validates the checkpoint.
    pub fn open(&self) -> Result<Checkpoint> {
        let dir = &self.checkpoint;
        let absolute = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
        Checkpoint::open(dir, Provenance::Local(absolute))
            .with_context(|| format!("checkpoint {} refused", dir.display()))
    }
}

/// Where the pinned checkpoint lives unless the user says otherwise.
pub fn default_pinned_dir() -> Result<PathBuf> {
    let cache = dirs::cache_dir().context("no user cache directory; pass --dir")?;
    let name = format!("{}@{}", PINNED_REPO.replace('/', "--"), PINNED_REVISION);
    Ok(cache.join("drama").join(name))
}
