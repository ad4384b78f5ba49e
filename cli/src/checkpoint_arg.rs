//! The `--checkpoint` argument shared by every command that loads a model: a directory,
//! `pinned` (the pinned checkpoint, fetched if missing), or nothing (the built-in demo,
//! generated on first use). Resolution happens before any GPU is opened.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use drama_checkpoint::fetch::{FetchRequest, fetch};
use drama_checkpoint::{Checkpoint, PINNED_REPO, PINNED_REVISION, Provenance};

/// The demo checkpoint's preset and seed.
const DEMO_PRESET: &str = "demo";
const DEMO_SEED: u64 = 0;

/// Which checkpoint to load.
#[derive(Args)]
pub struct CheckpointArg {
    /// Checkpoint directory (labelled `local <dir>`), or `pinned` for the pinned checkpoint
    /// (downloaded on first use). Default: the built-in demo checkpoint (random weights).
    #[arg(long)]
    checkpoint: Option<String>,
}

impl CheckpointArg {
    /// The argument as if given on the command line (`pinned` or a directory).
    pub fn named(checkpoint: String) -> CheckpointArg {
        CheckpointArg {
            checkpoint: Some(checkpoint),
        }
    }

    /// The folder the checkpoint is read from, without validating it (the demo is generated
    /// if missing; the pinned checkpoint must have been fetched).
    pub fn dir(&self) -> Result<PathBuf> {
        match self.checkpoint.as_deref() {
            None => demo_dir(),
            Some("pinned") => {
                let dir = default_pinned_dir()?;
                anyhow::ensure!(
                    dir.is_dir(),
                    "the pinned checkpoint has not been fetched into {} yet (drama fetch)",
                    dir.display()
                );
                Ok(dir)
            }
            Some(dir) => Ok(PathBuf::from(dir)),
        }
    }

    /// Resolves and validates the checkpoint.
    pub fn open(&self) -> Result<Checkpoint> {
        match self.checkpoint.as_deref() {
            None => open_demo(),
            Some("pinned") => {
                let mut request = FetchRequest::pinned(default_pinned_dir()?);
                request.progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
                Ok(fetch(&request).context("resolving the pinned checkpoint")?.checkpoint)
            }
            Some(dir) => {
                let dir = PathBuf::from(dir);
                let absolute = std::path::absolute(&dir).unwrap_or_else(|_| dir.clone());
                Checkpoint::open(&dir, Provenance::Local(absolute))
                    .with_context(|| format!("checkpoint {} refused", dir.display()))
            }
        }
    }
}

fn cache_root() -> Result<PathBuf> {
    Ok(dirs::cache_dir()
        .context("no user cache directory; pass --checkpoint DIR")?
        .join("drama"))
}

/// Where the pinned checkpoint lives unless the user says otherwise.
pub fn default_pinned_dir() -> Result<PathBuf> {
    let name = format!("{}@{}", PINNED_REPO.replace('/', "--"), PINNED_REVISION);
    Ok(cache_root()?.join(name))
}

/// The demo checkpoint: generated deterministically into the cache on first use (staged,
/// then renamed into place), verified like any other local checkpoint afterwards.
fn open_demo() -> Result<Checkpoint> {
    let dir = demo_dir()?;
    let absolute = std::path::absolute(&dir).unwrap_or_else(|_| dir.clone());
    Checkpoint::open(&dir, Provenance::Local(absolute)).with_context(|| {
        format!(
            "the demo checkpoint in {} is damaged; delete that directory to regenerate it",
            dir.display()
        )
    })
}

/// The demo checkpoint's folder, generated first if it is not there yet.
fn demo_dir() -> Result<PathBuf> {
    let dir = cache_root()?.join(format!(
        "demo-{}-r{}-seed{DEMO_SEED}",
        env!("CARGO_PKG_VERSION"),
        drama_fixtures::DEMO_REVISION
    ));
    if !dir.exists() {
        eprintln!("generating the demo checkpoint (random weights) into {}", dir.display());
        let staging = dir.with_extension(format!("partial-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        drama_fixtures::write_preset(DEMO_PRESET, DEMO_SEED, &staging).context("generating the demo checkpoint")?;
        if let Err(e) = std::fs::rename(&staging, &dir) {
            let _ = std::fs::remove_dir_all(&staging);
            if !dir.exists() {
                bail!("installing the demo checkpoint into {}: {e}", dir.display());
            }
        }
    }
    Ok(dir)
}
