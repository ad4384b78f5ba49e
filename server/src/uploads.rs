//! Voice uploads: one thread of their own turns recordings into saved voices beside the GPU
//! worker, so that synthesis keeps stepping while a voice encodes (their submissions to the
//! GPU interleave). The voice tower goes onto the GPU at the first upload and stays.

use std::sync::Arc;

use drama_engine::checkpoint::Checkpoint;
use drama_engine::error::EngineError;
use drama_engine::gpu::Gpu;
use drama_engine::tower::VoiceTower;
use drama_engine::voice::prefix_from_wav;
use tokio::sync::oneshot;

use crate::api::ApiError;
use crate::voices::VoiceStore;

/// Uploads received or encoding at once (each body holds up to [`MAX_UPLOAD_BYTES`]); a
/// further one gets 429.
pub const MAX_UPLOADS: usize = 2;

/// The largest WAV body of an upload.
pub const MAX_UPLOAD_BYTES: usize = 32 << 20;

/// A recording to save as a voice.
pub struct Upload {
    /// The WAV bytes.
    pub wav: Vec<u8>,
    /// The new voice's id, or why not.
    pub reply: oneshot::Sender<Result<String, ApiError>>,
}

/// Encodes uploads in order until every sender is gone.
pub fn run(
    gpu: Arc<Gpu>,
    checkpoint: Arc<Checkpoint>,
    store: Arc<VoiceStore>,
    uploads: std::sync::mpsc::Receiver<Upload>,
) {
    let mut tower = None;
    for Upload { wav, reply } in uploads {
        let _ = reply.send(save(&mut tower, &gpu, &checkpoint, &store, &wav));
    }
}

/// Encodes `wav` with the tower (uploading it first if `tower` is empty) and saves it.
fn save(
    tower: &mut Option<VoiceTower>,
    gpu: &Arc<Gpu>,
    checkpoint: &Checkpoint,
    store: &VoiceStore,
    wav: &[u8],
) -> Result<String, ApiError> {
    // The recording's fault, or the server's (the GPU, the tower).
    let refusal = |e: EngineError| {
        let status = match e {
            EngineError::Audio(_) | EngineError::Input(_) => 400,
            _ => 500,
        };
        ApiError::status(status, e.to_string())
    };
    let tower = match tower {
        Some(tower) => tower,
        None => tower.insert(VoiceTower::new(gpu.clone(), checkpoint).map_err(refusal)?),
    };
    let prefix = prefix_from_wav(wav, tower).map_err(refusal)?;
    store.save(&prefix, checkpoint).map_err(|e| ApiError::status(500, e))
}
