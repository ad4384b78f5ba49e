//! Loading a `--voice`: a voice file (`.safetensors`) or a WAV recording.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use drama_checkpoint::Checkpoint;
use drama_engine::gpu::Gpu;
use drama_engine::tower::VoiceTower;
use drama_engine::voice::{prefix_from_wav, read_voice_file};

/// The extension by which `--voice` knows a voice file (from `drama voice`) from a
/// recording.
pub const VOICE_FILE_EXTENSION: &str = "safetensors";

/// The [P, H] voice prefix of `path`, chosen by its extension.
pub fn load_voice(path: &Path, checkpoint: &Checkpoint, gpu: &Arc<Gpu>) -> Result<Vec<f32>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading voice {}", path.display()))?;
    let extension = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    let prefix = match extension.as_deref() {
        Some(VOICE_FILE_EXTENSION) => read_voice_file(&bytes, checkpoint),
        Some("wav") => VoiceTower::new(gpu.clone(), checkpoint).and_then(|tower| prefix_from_wav(&bytes, &tower)),
        _ => bail!(
            "voice {}: expected a .wav recording or a .safetensors voice file",
            path.display()
        ),
    };
    prefix.with_context(|| format!("voice {}", path.display()))
}
