//! Audio produced for a response and not yet written to its client, counted while it is
//! held, so that clients who leave their responses unread (a slow reader, a real-time
//! player) cannot make the server hold an unbounded amount of it: past
//! [`MAX_UNREAD_AUDIO_BYTES`], new speech requests are refused until clients read.
//!
//! A request's place in flight ends with its job, not with its client's reading (see
//! `streamed_body`); this count is what bounds the memory its unread audio keeps.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use crate::metrics::Metrics;

/// Unread audio, in bytes, beyond which new speech requests get 429.
pub const MAX_UNREAD_AUDIO_BYTES: u64 = 512 << 20;

/// Bytes of unread audio, counted in the metrics while this lives.
pub struct Held {
    bytes: u64,
    metrics: Arc<Metrics>,
}

impl Held {
    /// Counts `bytes` until the returned value is dropped.
    pub fn new(bytes: u64, metrics: &Arc<Metrics>) -> Held {
        metrics.unread_audio_bytes.fetch_add(bytes, Ordering::SeqCst);
        Held {
            bytes,
            metrics: metrics.clone(),
        }
    }

    /// Takes over what `other` counts.
    pub fn absorb(&mut self, mut other: Held) {
        self.bytes += std::mem::take(&mut other.bytes);
    }

    /// `data` as bytes that keep this count until the last of them is dropped (written to
    /// the client, or the response dropped).
    pub fn attach(self, data: Vec<u8>) -> Bytes {
        Bytes::from_owner(HeldData { data, _held: self })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.metrics.unread_audio_bytes.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

struct HeldData {
    data: Vec<u8>,
    _held: Held,
}

impl AsRef<[u8]> for HeldData {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

/// A chunk of a job's PCM on its way to the response, counted at its samples' `f32` size
/// (no smaller than any encoding the response sends).
pub struct Chunk {
    /// The samples.
    pub pcm: Vec<f32>,
    /// Their count.
    pub held: Held,
}

impl Chunk {
    /// `pcm`, counted in `metrics`.
    pub fn new(pcm: Vec<f32>, metrics: &Arc<Metrics>) -> Chunk {
        let held = Held::new(std::mem::size_of_val(pcm.as_slice()) as u64, metrics);
        Chunk { pcm, held }
    }
}

/// Refuses a new speech request while more than [`MAX_UNREAD_AUDIO_BYTES`] wait for their
/// clients.
pub fn check_room(metrics: &Metrics) -> Result<(), crate::api::ApiError> {
    let unread = metrics.unread_audio_bytes.load(Ordering::SeqCst);
    if unread > MAX_UNREAD_AUDIO_BYTES {
        return Err(crate::api::ApiError::status(
            429,
            format!(
                "{} MiB of audio wait for their clients to read them (the limit is {} MiB); retry later",
                unread >> 20,
                MAX_UNREAD_AUDIO_BYTES >> 20
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_bytes_are_counted_until_the_last_copy_is_dropped() {
        let metrics = Arc::new(Metrics::default());
        let count = || metrics.unread_audio_bytes.load(Ordering::SeqCst);
        let chunk = Chunk::new(vec![0.5; 300], &metrics);
        let mut whole = Held::new(0, &metrics);
        whole.absorb(Chunk::new(vec![-0.25; 100], &metrics).held);
        assert_eq!(count(), 1600);
        let bytes = chunk.held.attach(vec![7; 600]);
        let copy = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(count(), 1600, "a slice of the data still holds it");
        assert_eq!(copy.as_ref(), &[7; 10]);
        drop(copy);
        assert_eq!(count(), 400);
        drop(whole);
        assert_eq!(count(), 0);
    }

    #[test]
    fn requests_are_refused_past_the_limit_naming_it() {
        let metrics = Arc::new(Metrics::default());
        let held = Held::new(MAX_UNREAD_AUDIO_BYTES, &metrics);
        assert!(check_room(&metrics).is_ok());
        let over = Held::new(1, &metrics);
        let refused = check_room(&metrics).unwrap_err();
        assert_eq!(refused.status, 429);
        assert!(refused.message.contains("the limit is 512 MiB"), "{}", refused.message);
        drop((held, over));
        assert!(check_room(&metrics).is_ok());
    }
}
