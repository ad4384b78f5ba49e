//! Service metrics, rendered as Prometheus text.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters and gauges of the service.
#[derive(Default)]
pub struct Metrics {
    responses: Mutex<BTreeMap<u16, u64>>,
    /// Jobs waiting for lanes.
    pub queue_depth: AtomicU64,
    /// Lanes held by running jobs.
    pub active_lanes: AtomicU64,
    /// Jobs cancelled (client gone or time limit).
    pub cancellations: AtomicU64,
    /// Streamed responses that began with status 200 and then failed (the job's error, its
    /// time limit, or the engine stopping), which `responses` counts as 200.
    pub failed_streams: AtomicU64,
    /// Compiled step shapes the batcher's session keeps.
    pub compiled_steps: AtomicU64,
    /// The bytes of their buffers.
    pub compiled_step_bytes: AtomicU64,
    /// Client connections open now.
    pub open_connections: AtomicU64,
    /// Speech requests holding a place in flight: being tokenized, queued or running (a
    /// streamed one until its job ends, whatever its client has still to read).
    pub requests_in_flight: AtomicU64,
    /// Voice uploads being received or encoded.
    pub voice_uploads: AtomicU64,
    /// Audio produced for responses and not yet written to their clients, in bytes (see
    /// `unread`).
    pub unread_audio_bytes: AtomicU64,
    first_audio: Mutex<Summary>,
    real_time_factor: Mutex<Summary>,
}

#[derive(Default)]
struct Summary {
    count: u64,
    sum: f64,
}

impl Metrics {
    /// Counts a response by status code.
    pub fn response(&self, status: u16) {
        *self.responses.lock().expect("metrics lock").entry(status).or_default() += 1;
    }

    /// Records a finished synthesis: seconds to first audio and real-time factor.
    pub fn synthesis(&self, first_audio_s: f64, real_time_factor: f64) {
        for (summary, value) in [
            (&self.first_audio, first_audio_s),
            (&self.real_time_factor, real_time_factor),
        ] {
            if value.is_finite() {
                let mut s = summary.lock().expect("metrics lock");
                s.count += 1;
                s.sum += value;
            }
        }
    }

    /// Prometheus exposition text.
    pub fn render(&self) -> String {
        let mut out = String::from("# TYPE drama_responses_total counter\n");
        for (status, count) in self.responses.lock().expect("metrics lock").iter() {
            out.push_str(&format!("drama_responses_total{{status=\"{status}\"}} {count}\n"));
        }
        for (name, value) in [
            ("drama_queue_depth", self.queue_depth.load(Ordering::SeqCst)),
            ("drama_active_lanes", self.active_lanes.load(Ordering::SeqCst)),
            ("drama_compiled_steps", self.compiled_steps.load(Ordering::SeqCst)),
            (
                "drama_compiled_step_bytes",
                self.compiled_step_bytes.load(Ordering::SeqCst),
            ),
            ("drama_open_connections", self.open_connections.load(Ordering::SeqCst)),
            (
                "drama_requests_in_flight",
                self.requests_in_flight.load(Ordering::SeqCst),
            ),
            ("drama_voice_uploads", self.voice_uploads.load(Ordering::SeqCst)),
            (
                "drama_unread_audio_bytes",
                self.unread_audio_bytes.load(Ordering::SeqCst),
            ),
        ] {
            out.push_str(&format!("# TYPE {name} gauge\n{name} {value}\n"));
        }
        for (name, value) in [
            ("drama_cancellations_total", &self.cancellations),
            ("drama_failed_streams_total", &self.failed_streams),
        ] {
            let value = value.load(Ordering::SeqCst);
            out.push_str(&format!("# TYPE {name} counter\n{name} {value}\n"));
        }
        for (name, summary) in [
            ("drama_time_to_first_audio_seconds", &self.first_audio),
            ("drama_real_time_factor", &self.real_time_factor),
        ] {
            let s = summary.lock().expect("metrics lock");
            out.push_str(&format!(
                "# TYPE {name} summary\n{name}_sum {}\n{name}_count {}\n",
                s.sum, s.count
            ));
        }
        out
    }
}
