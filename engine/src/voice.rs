//! Voice files: a voice prefix saved for reuse (contract section 7), tied to one checkpoint.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use safetensors::Dtype;

use crate::error::EngineError;
use crate::tower::VoiceTower;
use drama_checkpoint::Checkpoint;
use drama_checkpoint::numerics::float_values;

/// The `format` metadata value of a voice file.
pub const VOICE_FORMAT: &str = "drama-voice";
/// The tensor holding the prefix.
pub const PREFIX_TENSOR: &str = "prefix";

/// Reads a voice file and checks it belongs to `checkpoint`; returns the [P, H] prefix.
pub fn read_voice_file(bytes: &[u8], checkpoint: &Checkpoint) -> Result<Vec<f32>, EngineError> {
    let bad = |what: String| EngineError::Input(format!("voice file: {what}"));
    let (_, metadata) =
        safetensors::SafeTensors::read_metadata(bytes).map_err(|e| bad(format!("not a safetensors file ({e})")))?;
    let info = metadata.metadata().clone().unwrap_or_default();
    if info.get("format").map(String::as_str) != Some(VOICE_FORMAT) {
        return Err(bad(format!("metadata `format` must be \"{VOICE_FORMAT}\"")));
    }
    match info.get("checkpoint") {
        Some(digest) if *digest == checkpoint.manifest_digest => {}
        Some(digest) => {
            return Err(bad(format!(
                "made for checkpoint {digest}, not this one ({}); make it again from its reference recording",
                checkpoint.manifest_digest
            )));
        }
        None => return Err(bad("metadata lacks `checkpoint`".into())),
    }
    let tensors = safetensors::SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
    let prefix = tensors
        .tensor(PREFIX_TENSOR)
        .map_err(|_| bad(format!("no tensor `{PREFIX_TENSOR}`")))?;
    let c = &checkpoint.config;
    let want = [c.speech.voice_prefix_len, c.hidden_size];
    if prefix.shape() != want {
        return Err(bad(format!(
            "prefix shape {:?}, this checkpoint needs {:?}",
            prefix.shape(),
            want
        )));
    }
    let Some(values) = float_values(prefix.data(), prefix.dtype()) else {
        return Err(bad(format!("prefix dtype {:?}, expected BF16 or F32", prefix.dtype())));
    };
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return Err(bad(format!("prefix element {i} is not finite")));
    }
    Ok(values)
}

/// The largest safetensors header a voice file is read with (its own is under 200 bytes).
const MAX_VOICE_HEADER: u64 = 1 << 16;

/// The checkpoint digest the voice file at `path` was made for, read from its header alone;
/// `None` when the file cannot be read or is not a voice file.
pub fn voice_file_checkpoint(path: &Path) -> Option<String> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut length = [0u8; 8];
    file.read_exact(&mut length).ok()?;
    let length = u64::from_le_bytes(length);
    if length > MAX_VOICE_HEADER {
        return None;
    }
    let mut header = vec![0u8; length as usize];
    file.read_exact(&mut header).ok()?;
    let header: serde_json::Value = serde_json::from_slice(header.trim_ascii_end()).ok()?;
    let metadata = header.get("__metadata__")?;
    if metadata.get("format")?.as_str()? != VOICE_FORMAT {
        return None;
    }
    Some(metadata.get("checkpoint")?.as_str()?.to_string())
}

/// Serializes a [P, H] prefix as an F32 voice file for `checkpoint`.
pub fn voice_file_bytes(prefix: &[f32], checkpoint: &Checkpoint) -> Result<Vec<u8>, EngineError> {
    let c = &checkpoint.config;
    let shape = vec![c.speech.voice_prefix_len, c.hidden_size];
    let data: Vec<u8> = bytemuck::cast_slice(prefix).to_vec();
    let view = safetensors::tensor::TensorView::new(Dtype::F32, shape, &data)
        .map_err(|e| EngineError::Input(format!("voice prefix: {e}")))?;
    let metadata = HashMap::from([
        ("format".to_string(), VOICE_FORMAT.to_string()),
        ("checkpoint".to_string(), checkpoint.manifest_digest.clone()),
    ]);
    let bytes = safetensors::serialize([(PREFIX_TENSOR, view)], Some(metadata))
        .map_err(|e| EngineError::Input(format!("voice file: {e}")))?;
    Ok(with_sorted_header(bytes))
}

/// `bytes` (a safetensors file) with its JSON header's keys sorted. safetensors writes its
/// metadata map in the order of a randomly keyed hash map, so the same prefix would make
/// different bytes (and a different saved voice id) from run to run. The sorted header has
/// the same length, so the offsets and the padding after it stand.
fn with_sorted_header(mut bytes: Vec<u8>) -> Vec<u8> {
    let length = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header = &bytes[8..8 + length];
    let json = header.trim_ascii_end();
    let value: serde_json::Value = serde_json::from_slice(json).expect("safetensors writes JSON");
    // serde_json's maps keep their keys sorted.
    let sorted = serde_json::to_vec(&value).expect("a JSON value serializes");
    assert_eq!(sorted.len(), json.len(), "compact JSON of the same content");
    bytes[8..8 + sorted.len()].copy_from_slice(&sorted);
    bytes
}

/// The longest reference recording a voice is made from, in seconds. The tower averages
/// its frames, so a longer one adds little, while its resampling, spectrogram and tower
/// buffers grow with it (a 32 MiB WAV declaring 63 Hz would resample to 4 billion samples).
pub const MAX_REFERENCE_SECONDS: u32 = 60;

/// The voice prefix of a reference recording: WAV bytes downmixed, resampled to the tower's
/// rate, turned into log-mel frames and encoded by `tower` on the GPU. A recording longer
/// than [`MAX_REFERENCE_SECONDS`] is refused before any of that work, by the length its file
/// declares.
pub fn prefix_from_wav(bytes: &[u8], tower: &VoiceTower) -> Result<Vec<f32>, EngineError> {
    let pcm = crate::audio::read_reference_wav(bytes, MAX_REFERENCE_SECONDS)?;
    let mono = crate::audio::downmix(&pcm);
    let tower_config = tower.config();
    let samples = crate::audio::resample(&mono, pcm.sample_rate, tower_config.sample_rate)?;
    let mel = crate::audio::log_mel(&samples, tower_config)?;
    tower.encode(&mel.values, mel.frames)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each metadata map has fresh hash keys, so without sorting two of sixteen serializations
    /// would almost surely order `format` and `checkpoint` differently.
    #[test]
    fn a_prefix_always_makes_the_same_voice_file() {
        let prefix = [0.5f32, -1.25, 3.0, 7.5e-3];
        let metadata = |i: usize| {
            HashMap::from([
                ("format".to_string(), VOICE_FORMAT.to_string()),
                ("checkpoint".to_string(), format!("{i:064x}")),
            ])
        };
        let files: Vec<Vec<u8>> = (0..16)
            .map(|_| {
                let view = safetensors::tensor::TensorView::new(Dtype::F32, vec![2, 2], bytemuck::cast_slice(&prefix))
                    .unwrap();
                with_sorted_header(safetensors::serialize([(PREFIX_TENSOR, view)], Some(metadata(7))).unwrap())
            })
            .collect();
        assert!(files.iter().all(|f| *f == files[0]));
        let (_, read) = safetensors::SafeTensors::read_metadata(&files[0]).unwrap();
        let info = read.metadata().clone().unwrap();
        assert_eq!(info, metadata(7));
        let tensors = safetensors::SafeTensors::deserialize(&files[0]).unwrap();
        let tensor = tensors.tensor(PREFIX_TENSOR).unwrap();
        assert_eq!(tensor.data(), bytemuck::cast_slice::<f32, u8>(&prefix));
        let header = String::from_utf8_lossy(&files[0][8..]);
        assert!(header.starts_with(r#"{"__metadata__":{"checkpoint":"#), "{header}");
    }

    /// The digest is read from the header alone; files that are not voice files give none.
    #[test]
    fn a_voice_files_checkpoint_is_read_from_its_header() {
        let dir = tempfile::tempdir().unwrap();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let digest = format!("{nanos:064x}");
        let prefix = [0.25f32, -2.0];
        let file = |format: &str| {
            let metadata = HashMap::from([
                ("format".to_string(), format.to_string()),
                ("checkpoint".to_string(), digest.clone()),
            ]);
            let view =
                safetensors::tensor::TensorView::new(Dtype::F32, vec![1, 2], bytemuck::cast_slice(&prefix)).unwrap();
            safetensors::serialize([(PREFIX_TENSOR, view)], Some(metadata)).unwrap()
        };
        let voice = dir.path().join("voice.safetensors");
        std::fs::write(&voice, file(VOICE_FORMAT)).unwrap();
        assert_eq!(voice_file_checkpoint(&voice), Some(digest.clone()));
        let other = dir.path().join("other.safetensors");
        std::fs::write(&other, file("something-else")).unwrap();
        assert_eq!(voice_file_checkpoint(&other), None);
        let truncated = dir.path().join("truncated.safetensors");
        std::fs::write(&truncated, &file(VOICE_FORMAT)[..20]).unwrap();
        assert_eq!(voice_file_checkpoint(&truncated), None);
        let huge = dir.path().join("huge.safetensors");
        std::fs::write(&huge, u64::MAX.to_le_bytes()).unwrap();
        assert_eq!(voice_file_checkpoint(&huge), None);
        assert_eq!(voice_file_checkpoint(&dir.path().join("missing")), None);
    }
}
