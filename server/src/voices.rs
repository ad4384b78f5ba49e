//! Saved voices: voice files under `<data dir>/voices/<id>.safetensors`, written atomically
//! (temporary file, fsync, rename), so they survive restarts and a crash mid-write loses
//! nothing. A voice saved with a name (OpenAI's `POST /v1/audio/voices`) has its name and
//! creation time beside it in `<id>.json`, written the same way.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use drama_checkpoint::Checkpoint;
use drama_engine::files::{TEMPORARY_SUFFIX, write_atomically};
use drama_engine::voice::{read_voice_file, voice_file_bytes, voice_file_checkpoint};
use sha2::{Digest, Sha256};

use crate::api::{ApiError, OPENAI_VOICES, VoiceChoice};

/// The voice store.
pub struct VoiceStore {
    dir: PathBuf,
    /// Held while a name is given, so that two uploads cannot both take one name.
    naming: Mutex<()>,
}

/// A named voice's label, `<id>.json` beside its file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Label {
    /// The name `voice` may give instead of the id.
    pub name: String,
    /// When it was saved under this name (Unix seconds).
    pub created_at: u64,
}

/// Longest voice name, in characters.
pub const MAX_NAME_CHARS: usize = 64;

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
        Ok(VoiceStore {
            dir,
            naming: Mutex::new(()),
        })
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.safetensors"))
    }

    fn label_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Voice `id`'s label, if it was saved with a name and the label reads.
    pub fn label(&self, id: &str) -> Option<Label> {
        serde_json::from_slice(&std::fs::read(self.label_path(id)).ok()?).ok()
    }

    /// Gives voice `id` the name `name` (replacing any name it had), unless another voice
    /// has that name.
    pub fn name(&self, id: &str, name: &str, created_at: u64) -> Result<Label, ApiError> {
        check_name(name)?;
        let _naming = self.naming.lock().expect("naming lock");
        if let Some(other) = self.find_name(name).filter(|other| other != id) {
            return Err(taken(name, &other));
        }
        let label = Label {
            name: name.to_string(),
            created_at,
        };
        let bytes = serde_json::to_vec(&label).expect("a label serializes");
        write_atomically(&self.label_path(id), &bytes)
            .map_err(|e| ApiError::status(500, format!("naming voice {id}: {e}")))?;
        Ok(label)
    }

    /// Refuses a name another voice has (409) or that no voice may have (400), before a
    /// recording is encoded for it.
    pub fn check_free(&self, name: &str) -> Result<(), ApiError> {
        check_name(name)?;
        match self.find_name(name) {
            Some(other) => Err(taken(name, &other)),
            None => Ok(()),
        }
    }

    /// The id of the saved voice named `name`.
    fn find_name(&self, name: &str) -> Option<String> {
        self.ids()
            .into_iter()
            .find(|id| self.label(id).is_some_and(|label| label.name == name))
    }

    /// When voice `id`'s file was last written (Unix seconds).
    pub fn saved_at(&self, id: &str) -> Option<u64> {
        let modified = std::fs::metadata(self.path(id)).ok()?.modified().ok()?;
        Some(modified.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs())
    }

    /// The id a request's `voice` names: a saved voice's id, or its name.
    pub fn resolve(&self, id_or_name: &str) -> Option<String> {
        if valid_id(id_or_name) && self.path(id_or_name).exists() {
            return Some(id_or_name.to_string());
        }
        self.find_name(id_or_name)
    }

    /// The ids of the voice files in the store, sorted.
    fn ids(&self) -> Vec<String> {
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
        ids
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
            VoiceChoice::Saved(choice) => match self.resolve(choice).and_then(|id| self.load(&id, checkpoint)) {
                Some(Ok(prefix)) => Ok(Some(prefix)),
                Some(Err(e)) => Err(ApiError::invalid(
                    "voice",
                    format!(
                        "voice {choice} cannot be used: {e}; upload its reference recording again (POST /v1/voices), \
                         or delete it (DELETE /v1/voices/{choice})"
                    ),
                )),
                None => Err(ApiError::invalid("voice", format!("unknown voice '{choice}'"))),
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
        self.ids()
            .into_iter()
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
        // The label goes first: a voice file without one is an unnamed voice, a label
        // without its voice file would be a name for nothing.
        match std::fs::remove_file(self.label_path(id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
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

/// The refusal of a name voice `other` has.
fn taken(name: &str, other: &str) -> ApiError {
    ApiError::status(
        409,
        format!("the name '{name}' is taken by voice {other}; delete that voice first or choose another name"),
    )
}

/// Refuses a name that is empty, too long, holds control characters, could be read as an
/// id, or is `default` or one of OpenAI's built-in voices (which mean the default voice).
fn check_name(name: &str) -> Result<(), ApiError> {
    let refuse = |why: &str| Err(ApiError::invalid("name", format!("the name '{name}' {why}")));
    if name.trim().is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return refuse(&format!("must have 1 to {MAX_NAME_CHARS} characters, not only spaces"));
    }
    if name.chars().any(char::is_control) {
        return refuse("holds control characters");
    }
    if valid_id(name) {
        return refuse("has the shape of a voice id (16 hex digits)");
    }
    if name == "default" || OPENAI_VOICES.contains(&name) {
        return refuse("means the default voice (one of OpenAI's built-in voice names, or `default`)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name finds its voice, belongs to one voice at a time, goes with its voice, and
    /// cannot be an id, OpenAI's built-in names or blank.
    #[test]
    fn names_find_their_voice_and_belong_to_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = VoiceStore::open(dir.path()).unwrap();
        let (first, second) = ("0123456789abcdef", "fedcba9876543210");
        for id in [first, second] {
            std::fs::write(store.path(id), b"voice").unwrap();
        }
        assert_eq!(store.resolve("narrator"), None);
        let label = store.name(first, "narrator", 17).unwrap();
        assert_eq!(
            label,
            Label {
                name: "narrator".into(),
                created_at: 17
            }
        );
        assert_eq!(store.resolve("narrator").as_deref(), Some(first));
        assert_eq!(store.resolve(second).as_deref(), Some(second));
        let taken = store.name(second, "narrator", 18).unwrap_err();
        assert_eq!(taken.status, 409, "{}", taken.message);
        assert!(taken.message.contains(first), "{}", taken.message);
        // Naming the same voice again renames it.
        store.name(first, "reader", 19).unwrap();
        assert_eq!(store.resolve("narrator"), None);
        store.name(second, "narrator", 20).unwrap();
        assert_eq!(store.resolve("narrator").as_deref(), Some(second));
        std::fs::remove_file(store.label_path(first)).unwrap();
        for refused in [
            "",
            "   ",
            "alloy",
            "default",
            first,
            "a\nb",
            &"x".repeat(MAX_NAME_CHARS + 1),
        ] {
            let e = store.name(first, refused, 1).unwrap_err();
            assert_eq!(
                (e.status, e.param.as_deref()),
                (400, Some("name")),
                "{refused:?}: {}",
                e.message
            );
        }
    }

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
