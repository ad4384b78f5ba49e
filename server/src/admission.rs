//! Places under the server's admission limits (requests in flight, voice uploads): a place
//! is held by the host work it admits (an upload until it is encoded or skipped, a request's
//! tokenizing until it ends), not by the handler that asked for it, so a client that leaves
//! early frees no room while that work still runs. (A job on the GPU worker whose client
//! left ends at its next step.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::metrics::Metrics;

/// A place among those a limit admits at once (the gauge `counter` picks out of the
/// metrics counts them), released when dropped.
pub struct Place {
    metrics: Arc<Metrics>,
    counter: fn(&Metrics) -> &AtomicU64,
}

impl Place {
    /// Takes a place if fewer than `limit` are taken.
    pub fn take(metrics: &Arc<Metrics>, counter: fn(&Metrics) -> &AtomicU64, limit: usize) -> Option<Place> {
        if counter(metrics).fetch_add(1, Ordering::SeqCst) >= limit as u64 {
            counter(metrics).fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Place {
            metrics: metrics.clone(),
            counter,
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        (self.counter)(&self.metrics).fetch_sub(1, Ordering::SeqCst);
    }
}
