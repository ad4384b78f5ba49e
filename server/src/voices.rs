//! Saved voices: voice files under `<data dir>/voices/<id>.safetensors`, written atomically
//! (temporary file, fsync, rename), so they survive restarts and a crash mid-write loses
//! nothing.

use std::path::{Path, PathBuf};

use drama_checkpoint::Checkpoint;
use drama_engine::files::{TEMPORARY_SUFFIX, write_atomically};
use drama_engine::voice::{read_voice_file, voice_file_bytes, voice_file_checkpoint};
use sha2::{Digest, Sha256};

use crate::api::{ApiError, VoiceChoice};

/// The voice store.
pub struct VoiceStore {
    dir: PathBuf,
}

/// Whose a file in the store is, by its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// A voice made for the served checkpoint.
    This,
    /// A voice of another checkpoint sharing the data directory.
    Other,
    /// No voice header can be read: damaged (or placed there from outside). Listed and
    /// deletable, so that it can be seen and removed through the API.
    Unreadable,
}

/// A saved voice as `GET /v1/voices` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedVoice {
    /// Its id.
    pub id: String,
    /// Its file has no readable voice header: it cannot be used, only deleted.
    pub damaged: bool,
}

/// Whether `id` is a well-formed voice id (16 lowercase hex digits).
pub fn valid_id(id: &str) -> bool {
    id.len() == 16 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl VoiceStore {
    /// Opens (creating) the store under `data_dir`.
    pub fn open(data_dir: &Path) -> std::io::Result<VoiceStore> {
        let dir = data_dir.join("voices");
        std::fs::create_dir_all(&dir)?;
        // Leftovers of interrupted writes are not voices.
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.to_str().is_some_and(|p| p.ends_with(TEMPORARY_SUFFIX)) {
                let _ = std::fs::remove_file(path);
            }
        }
        Ok(VoiceStore { dir })
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.safetensors"))
    }

    /// Saves a prefix; returns its id (derived from its content).
    pub fn save(&self, prefix: &[f32], checkpoint: &Checkpoint) -> Result<String, String> {
        let bytes = voice_file_bytes(prefix, checkpoint).map_err(|e| e.to_string())?;
        let id = hex::encode(&Sha256::digest(&bytes)[..8]);
        write_atomically(&self.path(&id), &bytes).map_err(|e| format!("saving voice {id}: {e}"))?;
        Ok(id)
    }

    /// Loads a saved voice's prefix.
    pub fn load(&self, id: &str, checkpoint: &Checkpoint) -> Option<Result<Vec<f32>, String>> {
        if !valid_id(id) {
            return None;
        }
        let bytes = std::fs::read(self.path(id)).ok()?;
        Some(read_voice_file(&bytes, checkpoint).map_err(|e| e.to_string()))
    }

    /// The voice prefix a request asked for (`None`: the default voice), or why it cannot
    /// be used.
    pub fn prefix_for(&self, choice: &VoiceChoice, checkpoint: &Checkpoint) -> Result<Option<Vec<f32>>, ApiError> {
        match choice {
            VoiceChoice::Default => Ok(None),
            VoiceChoice::Saved(id) => match self.load(id, checkpoint) {
                Some(Ok(prefix)) => Ok(Some(prefix)),
                Some(Err(e)) => Err(ApiError::invalid(
                    "voice",
                    format!(
                        "voice {id} cannot be used: {e}; upload its reference recording again (POST /v1/voices), \
                         or delete it (DELETE /v1/voices/{id})"
                    ),
                )),
                None => Err(ApiError::invalid("voice", format!("unknown voice '{id}'"))),
            },
        }
    }

    /// Whose the saved voice `id` is (read from its header).
    fn owner(&self, id: &str, checkpoint: &Checkpoint) -> Owner {
        match voice_file_checkpoint(&self.path(id)) {
            Some(digest) if digest == checkpoint.manifest_digest => Owner::This,
            Some(_) => Owner::Other,
            None => Owner::Unreadable,
        }
    }

    /// The saved voices made for `checkpoint` and the damaged ones, sorted by id (those of
    /// other checkpoints sharing the data directory are left out).
    pub fn list(&self, checkpoint: &Checkpoint) -> Vec<ListedVoice> {
        let mut ids: Vec<String> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .filter_map(|e| {
                e.ok()?
                    .file_name()
                    .to_str()?
                    .strip_suffix(".safetensors")
                    .map(str::to_string)
            })
            .filter(|id| valid_id(id))
            .collect();
        ids.sort();
        ids.into_iter()
            .filter_map(|id| match self.owner(&id, checkpoint) {
                Owner::This => Some(ListedVoice { id, damaged: false }),
                Owner::Unreadable => Some(ListedVoice { id, damaged: true }),
                Owner::Other => None,
            })
            .collect()
    }

    /// Deletes a voice made for `checkpoint`, or a damaged one; false if there was none
    /// (another checkpoint's voices sharing the data directory are not this service's to
    /// delete), an error if it could not be removed.
    pub fn delete(&self, id: &str, checkpoint: &Checkpoint) -> std::io::Result<bool> {
        if !valid_id(id) || self.owner(id, checkpoint) == Owner::Other {
            return Ok(false);
        }
        self.remove(id)
    }

    /// Removes voice `id`'s file; false if there was none.
    fn remove(&self, id: &str) -> std::io::Result<bool> {
        match std::fs::remove_file(self.path(id)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Removing answers whether there was a voice, and reports a removal that failed as an
    /// error rather than as "no such voice".
    #[test]
    fn remove_tells_absent_from_failed() {
        let dir = tempfile::tempdir().unwrap();
        let store = VoiceStore::open(dir.path()).unwrap();
        let (saved, blocked) = ("0123456789abcdef", "fedcba9876543210");
        std::fs::write(store.path(saved), b"voice").unwrap();
        assert!(store.remove(saved).unwrap());
        assert!(!store.path(saved).exists());
        assert!(!store.remove(saved).unwrap());
        // A directory in a voice's place cannot be removed as a file (even by root).
        std::fs::create_dir(store.path(blocked)).unwrap();
        std::fs::write(store.path(blocked).join("inside"), b"x").unwrap();
        assert!(store.remove(blocked).is_err());
        assert!(store.path(blocked).exists());
    }
}
