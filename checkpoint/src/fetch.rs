//! Downloading the pinned checkpoint with hf-hub into a new directory, verified before use.
//!
//! Files go to a hidden staging directory beside the target; only after `SHA256SUMS` and
//! the whole contract check pass is the staging directory renamed into place. An existing
//! target is never modified: if it verifies it is used as it is, otherwise it is refused.
//! What a killed fetch left staged is removed by the next fetch to the same target.
//!
//! A fetched directory holds a hidden record, [`FETCH_RECORD`], of the repository, revision
//! and manifest digest it was fetched for (hidden entries are outside the manifest's
//! coverage). An existing target is labelled pinned only when its record names the pin and
//! its verified files' manifest; any other valid checkpoint there is refused, not relabelled.

use std::path::{Path, PathBuf};

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Repo, RepoType};

use super::{Checkpoint, CheckpointError, MANIFEST_FILE, Manifest, Provenance};

/// Why the pinned checkpoint could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The target exists but does not verify; it is left untouched.
    #[error(
        "{dir} exists but is not a complete, unmodified checkpoint ({reason}); it is not repaired: remove it or choose another directory"
    )]
    ExistingInvalid {
        /// The target directory.
        dir: PathBuf,
        /// The verification failure.
        reason: CheckpointError,
    },
    /// The target is a valid checkpoint but not one fetched for this pin.
    #[error(
        "{dir} holds a valid checkpoint, but not one fetched from {repo}@{revision} ({reason}); to use it as a local checkpoint give --checkpoint {dir}, or remove it to fetch the pinned one"
    )]
    NotFetched {
        /// The target directory.
        dir: PathBuf,
        /// The repository asked for.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// What its fetch record lacks or says.
        reason: String,
    },
    /// The hub could not be reached or refused a request.
    #[error("downloading {what} from {endpoint}: {message}")]
    Hub {
        /// The endpoint used.
        endpoint: String,
        /// The file or listing being fetched.
        what: String,
        /// hf-hub's message.
        message: String,
    },
    /// The hub answered for a different commit than the pin.
    #[error("the hub resolved revision {requested} to {served}; refusing a checkpoint that is not the pinned commit")]
    RevisionMismatch {
        /// The pinned revision.
        requested: String,
        /// What the hub reported.
        served: String,
    },
    /// The downloaded files do not form a valid checkpoint (truncated, tampered...).
    #[error("the downloaded checkpoint was refused and deleted: {0}")]
    Refused(CheckpointError),
    /// Local file system trouble.
    #[error("{path}: {reason}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The operating system's reason.
        reason: std::io::Error,
    },
}

/// What to fetch and where.
#[derive(Debug, Clone)]
pub struct FetchRequest {
    /// Hub repository.
    pub repo: String,
    /// Commit to download.
    pub revision: String,
    /// Target directory (must not exist, or must already hold the verified checkpoint).
    pub dir: PathBuf,
    /// Show hf-hub's progress bars.
    pub progress: bool,
}

impl FetchRequest {
    /// The pinned checkpoint into `dir`.
    pub fn pinned(dir: PathBuf) -> Self {
        FetchRequest {
            repo: super::PINNED_REPO.into(),
            revision: super::PINNED_REVISION.into(),
            dir,
            progress: false,
        }
    }
}

/// The outcome of a successful fetch.
pub struct Fetched {
    /// The verified checkpoint.
    pub checkpoint: Checkpoint,
    /// Whether files were downloaded (false: the directory was already complete).
    pub downloaded: bool,
}

/// Downloads (or finds) the checkpoint and returns it verified, labelled as pinned.
/// The hub endpoint comes from `HF_ENDPOINT` (default `https://huggingface.co`).
pub fn fetch(request: &FetchRequest) -> Result<Fetched, FetchError> {
    let provenance = Provenance::Pinned {
        repo: request.repo.clone(),
        revision: request.revision.clone(),
    };
    if request.dir.exists() {
        let checkpoint = Checkpoint::open(&request.dir, provenance).map_err(|reason| FetchError::ExistingInvalid {
            dir: request.dir.clone(),
            reason,
        })?;
        check_record(request, &checkpoint)?;
        return Ok(Fetched {
            checkpoint,
            downloaded: false,
        });
    }
    let staging = Staging::create(&request.dir)?;
    let result = download_into(request, &staging.dir).and_then(|()| {
        let checkpoint_dir = staging.dir.join("checkpoint");
        let checkpoint = Checkpoint::open(&checkpoint_dir, provenance.clone()).map_err(FetchError::Refused)?;
        let record = checkpoint_dir.join(FETCH_RECORD);
        std::fs::write(&record, fetch_record(request, &checkpoint.manifest_digest).to_string()).map_err(|e| {
            FetchError::Io {
                path: record,
                reason: e,
            }
        })?;
        std::fs::rename(&checkpoint_dir, &request.dir).map_err(|e| FetchError::Io {
            path: request.dir.clone(),
            reason: e,
        })
    });
    drop(staging);
    result?;
    let checkpoint = Checkpoint::open(&request.dir, provenance).map_err(FetchError::Refused)?;
    Ok(Fetched {
        checkpoint,
        downloaded: true,
    })
}

/// The hidden file in a fetched directory recording what it was fetched for.
pub const FETCH_RECORD: &str = ".drama-fetched.json";

/// The fetch record of `request`'s pin for a checkpoint whose manifest has `manifest_digest`.
fn fetch_record(request: &FetchRequest, manifest_digest: &str) -> serde_json::Value {
    serde_json::json!({
        "repo": request.repo,
        "revision": request.revision,
        "manifest_sha256": manifest_digest,
    })
}

/// Refuses an existing, verified target whose fetch record is missing or is not the one
/// this request would have written for its files.
fn check_record(request: &FetchRequest, checkpoint: &Checkpoint) -> Result<(), FetchError> {
    let not_fetched = |reason: String| FetchError::NotFetched {
        dir: request.dir.clone(),
        repo: request.repo.clone(),
        revision: request.revision.clone(),
        reason,
    };
    let found = match std::fs::read_to_string(request.dir.join(FETCH_RECORD)) {
        Ok(found) => found,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(not_fetched(format!("it has no {FETCH_RECORD}")));
        }
        Err(e) => return Err(not_fetched(format!("its {FETCH_RECORD} cannot be read: {e}"))),
    };
    let found: serde_json::Value = serde_json::from_str(&found)
        .map_err(|e| not_fetched(format!("its {FETCH_RECORD} is not a fetch record: {e}")))?;
    let expected = fetch_record(request, &checkpoint.manifest_digest);
    for field in ["repo", "revision", "manifest_sha256"] {
        if found.get(field) != expected.get(field) {
            return Err(not_fetched(format!(
                "its {FETCH_RECORD} gives {field} {}, where this pin and its files give {}",
                found.get(field).unwrap_or(&serde_json::Value::Null),
                expected[field]
            )));
        }
    }
    Ok(())
}

/// A fresh hidden directory beside the target (so the final rename stays on one file
/// system), `.NAME.fetch-PID`, with a lock file beside it, `.NAME.fetch-PID.lock`, that this
/// process holds locked until it removes both. A staging directory whose lock nobody holds
/// (or that has none) was left by a fetch that was killed; the next fetch removes it.
struct Staging {
    dir: PathBuf,
    lock_path: PathBuf,
    _lock: std::fs::File,
    /// Directories created to hold the target, deepest first.
    created_parents: Vec<PathBuf>,
}

impl Staging {
    fn create(target: &Path) -> Result<Staging, FetchError> {
        let parent = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |reason| FetchError::Io { path, reason }
        };
        // The directories this fetch creates to hold the target, deepest first: a failed
        // fetch removes them again (those still empty).
        let created_parents: Vec<PathBuf> = parent
            .ancestors()
            .take_while(|dir| !dir.as_os_str().is_empty() && !dir.exists())
            .map(Path::to_path_buf)
            .collect();
        std::fs::create_dir_all(&parent).map_err(io(&parent))?;
        let name = target
            .file_name()
            .map_or("checkpoint".into(), |n| n.to_string_lossy().into_owned());
        let prefix = format!(".{name}.fetch-");
        remove_abandoned(&parent, &prefix);
        let stem = format!("{prefix}{}", std::process::id());
        // The lock first, the directory second (and removed in the other order), so that a
        // staging directory without a lock file never belongs to a running fetch.
        let lock_path = parent.join(format!("{stem}.lock"));
        let lock = std::fs::File::create(&lock_path).map_err(io(&lock_path))?;
        lock.lock().map_err(io(&lock_path))?;
        let dir = parent.join(stem);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("checkpoint")).map_err(io(&dir))?;
        Ok(Staging {
            dir,
            lock_path,
            _lock: lock,
            created_parents,
        })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(&self.lock_path);
        // After a successful fetch the target keeps them from being empty.
        for dir in &self.created_parents {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Removes the staging directories (and lock files) under `parent` named `prefix...` that
/// no running fetch holds: those whose lock this process can take, and those without one.
fn remove_abandoned(parent: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(prefix) {
            continue;
        }
        let path = entry.path();
        if let Some(stem) = name.strip_suffix(".lock") {
            let Ok(lock) = std::fs::OpenOptions::new().write(true).open(&path) else {
                continue;
            };
            if lock.try_lock().is_ok() {
                let _ = std::fs::remove_dir_all(parent.join(stem));
                let _ = std::fs::remove_file(&path);
            }
        } else if path.is_dir() && !parent.join(format!("{name}.lock")).exists() {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// Downloads `SHA256SUMS`, then exactly the files it lists, into `staging/checkpoint`.
fn download_into(request: &FetchRequest, staging: &Path) -> Result<(), FetchError> {
    let builder = ApiBuilder::from_env()
        .with_cache_dir(staging.join("cache"))
        .with_progress(request.progress)
        .with_retries(2);
    let endpoint = std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into());
    let hub_error = |what: &str, e: hf_hub::api::sync::ApiError| FetchError::Hub {
        endpoint: endpoint.clone(),
        what: what.to_string(),
        message: e.to_string(),
    };
    let api = builder.build().map_err(|e| hub_error("(client setup)", e))?;
    let repo = api.repo(Repo::with_revision(
        request.repo.clone(),
        RepoType::Model,
        request.revision.clone(),
    ));
    let listing = format!("the file list of {}@{}", request.repo, request.revision);
    let info = repo.info().map_err(|e| hub_error(&listing, e))?;
    if info.sha != request.revision {
        return Err(FetchError::RevisionMismatch {
            requested: request.revision.clone(),
            served: info.sha,
        });
    }
    let target = staging.join("checkpoint");
    let fetch_one = |name: &str| -> Result<(), FetchError> {
        if !info.siblings.iter().any(|s| s.rfilename == name) {
            return Err(FetchError::Hub {
                endpoint: endpoint.clone(),
                what: name.to_string(),
                message: "the repository at this revision has no such file".into(),
            });
        }
        let cached = repo.get(name).map_err(|e| hub_error(name, e))?;
        let blob = std::fs::canonicalize(&cached).map_err(|e| FetchError::Io {
            path: cached.clone(),
            reason: e,
        })?;
        std::fs::rename(&blob, target.join(name)).map_err(|e| FetchError::Io {
            path: blob.clone(),
            reason: e,
        })
    };
    fetch_one(MANIFEST_FILE)?;
    let manifest_text = std::fs::read_to_string(target.join(MANIFEST_FILE)).map_err(|e| FetchError::Io {
        path: target.join(MANIFEST_FILE),
        reason: e,
    })?;
    let manifest = Manifest::parse(&manifest_text).map_err(FetchError::Refused)?;
    for name in manifest.digests.keys() {
        fetch_one(name)?;
    }
    Ok(())
}
