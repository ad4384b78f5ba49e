//! Voice uploads: one thread of their own turns recordings into saved voices beside the GPU
//! worker, so that synthesis keeps stepping while a voice encodes (their submissions to the
//! GPU interleave). The voice tower goes onto the GPU at the first upload and stays.

use std::sync::Arc;

use drama_checkpoint::Checkpoint;
use drama_engine::error::EngineError;
use drama_engine::gpu::Gpu;
use drama_engine::tower::VoiceTower;
use drama_engine::voice::prefix_from_wav;
use tokio::sync::oneshot;

use crate::admission::Place;
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
    /// Its place among [`MAX_UPLOADS`], held until it is encoded or skipped.
    pub place: Place,
}

/// Encodes uploads in order until every sender is gone; an upload whose client has left
/// is skipped (no one would learn its voice's id).
pub fn run(
    gpu: Arc<Gpu>,
    checkpoint: Arc<Checkpoint>,
    store: Arc<VoiceStore>,
    uploads: std::sync::mpsc::Receiver<Upload>,
) {
    let mut tower = None;
    encode_each(uploads, |wav| save(&mut tower, &gpu, &checkpoint, &store, wav));
}

/// Answers each upload whose client still waits with what `encode` makes of its WAV, in
/// order, releasing each upload's place once it is done with (or skipped).
fn encode_each(uploads: std::sync::mpsc::Receiver<Upload>, mut encode: impl FnMut(&[u8]) -> Result<String, ApiError>) {
    for Upload { wav, reply, place } in uploads {
        if !reply.is_closed() {
            let _ = reply.send(encode(&wav));
        }
        drop(place);
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::metrics::Metrics;

    /// An upload whose client left is skipped, and every upload holds its place until the
    /// encoder is done with it: while the first one encodes, both places are still taken.
    #[test]
    fn uploads_hold_their_places_until_encoded_and_departed_clients_are_skipped() {
        let metrics = Arc::new(Metrics::default());
        let (sender, uploads) = std::sync::mpsc::channel();
        let mut answers = Vec::new();
        for wav in [b"kept".to_vec(), b"left".to_vec()] {
            let place = Place::take(&metrics, |m| &m.voice_uploads, MAX_UPLOADS).expect("a free place");
            let (reply, answer) = oneshot::channel();
            sender.send(Upload { wav, reply, place }).unwrap();
            answers.push(answer);
        }
        assert!(Place::take(&metrics, |m| &m.voice_uploads, MAX_UPLOADS).is_none());
        // The second client leaves before its upload is encoded.
        drop(answers.pop());
        drop(sender);
        let mut encoded = Vec::new();
        encode_each(uploads, |wav| {
            encoded.push(wav.to_vec());
            assert_eq!(
                metrics.voice_uploads.load(Ordering::SeqCst),
                2,
                "places held while encoding"
            );
            Ok(String::from_utf8_lossy(wav).into_owned())
        });
        assert_eq!(encoded, vec![b"kept".to_vec()]);
        assert_eq!(answers.pop().unwrap().try_recv().unwrap().unwrap(), "kept");
        assert_eq!(metrics.voice_uploads.load(Ordering::SeqCst), 0, "every place released");
    }
}
