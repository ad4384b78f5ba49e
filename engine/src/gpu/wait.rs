//! Waiting for submitted work: block for most of the time the last such wait took, then poll.
//!
//! A wait that blocks in the driver until the GPU signals hands the thread to the OS, and the
//! host then holds the results only once the thread has been woken and scheduled again: time
//! in which the GPU idles, since the next step needs what the host does with them. Polling
//! costs a CPU core for as long as it lasts. So a wait blocks for the part of it that the
//! last wait for the same kind of work says is safe and polls through the rest, so the wake-up
//! latency is not paid at the end of a wait (the experiment log at the `lab-notebook` tag has
//! the measurements). An adapter that is the CPU itself (lavapipe) never polls: there the
//! polling thread would take a core from the rasterizer that runs the work.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{Gpu, GpuError};

/// The part of the last wait's time that a wait still polls through: a quarter of it plus
/// this margin, for steps that run a little faster than the one before.
const POLLED_MARGIN: Duration = Duration::from_micros(200);

/// How long the blocking part of a wait lasts when the last one for the same kind of work
/// took `expected`: three quarters of it less [`POLLED_MARGIN`] (none for short waits).
fn blocking_part(expected: Duration) -> Duration {
    expected.saturating_sub(expected / 4 + POLLED_MARGIN)
}

/// What the last wait for one kind of work (a step's logits, a codec chunk's samples) took,
/// to plan the next one.
#[derive(Debug, Default)]
pub struct WaitHistory {
    last_nanos: AtomicU64,
}

impl WaitHistory {
    /// The last wait's duration (zero before the first).
    pub fn last(&self) -> Duration {
        Duration::from_nanos(self.last_nanos.load(Ordering::Relaxed))
    }

    fn record(&self, waited: Duration) {
        let nanos = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.last_nanos.store(nanos, Ordering::Relaxed);
    }
}

impl Gpu {
    /// Returns once `submission` has finished (and the callbacks it completes, such as a
    /// buffer mapping, have run): blocking for three quarters of the last wait in `history`
    /// less a margin, then polling; or blocking all the way where this device does not poll.
    pub fn wait_for(&self, submission: &wgpu::SubmissionIndex, history: &WaitHistory) -> Result<(), GpuError> {
        let start = Instant::now();
        let result = if self.polls_waits {
            self.block_then_poll(submission, blocking_part(history.last()))
        } else {
            self.block(Some(submission), None).map(|_| ())
        };
        history.record(start.elapsed());
        result
    }

    fn block_then_poll(&self, submission: &wgpu::SubmissionIndex, blocking: Duration) -> Result<(), GpuError> {
        if !blocking.is_zero() && self.block(Some(submission), Some(blocking))? {
            return Ok(());
        }
        while !self.block(Some(submission), Some(Duration::ZERO))? {
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Blocks until `submission` (None: everything submitted) finished (true) or `timeout`
    /// passed (false). Every wait for the GPU comes through here, so here an error wgpu
    /// reported outside an error scope since the last wait becomes this wait's error.
    ///
    /// It polls holding the lock [`Gpu::submit_commands`] submits under (wgpu 30 panics when
    /// threads poll and submit at once), so a wait may also wait for another thread's wait.
    pub(super) fn block(
        &self,
        submission: Option<&wgpu::SubmissionIndex>,
        timeout: Option<Duration>,
    ) -> Result<bool, GpuError> {
        let polled = {
            let _one_at_a_time = self.polling();
            self.device.poll(wgpu::PollType::Wait {
                submission_index: submission.cloned(),
                timeout,
            })
        };
        let finished = match polled {
            Ok(_) => true,
            Err(wgpu::PollError::Timeout) => false,
            Err(e) => return Err(GpuError::Wait(e.to_string())),
        };
        match self.reported.lock().expect("error slot poisoned").take() {
            Some(error) => Err(GpuError::Reported(error)),
            None => Ok(finished),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_block_for_three_quarters_of_the_last_less_the_margin() {
        let ms = Duration::from_millis;
        assert_eq!(blocking_part(Duration::ZERO), Duration::ZERO);
        assert_eq!(blocking_part(Duration::from_micros(266)), Duration::ZERO);
        assert_eq!(blocking_part(Duration::from_micros(267)), Duration::from_nanos(250));
        assert_eq!(blocking_part(ms(4)), ms(3) - POLLED_MARGIN);
        assert_eq!(blocking_part(ms(100)), ms(75) - POLLED_MARGIN);
    }
}
