//! Where submissions run on the GPU's clock, for `drama bench`'s token loop: empty passes
//! open each marked submission, split it in two and close it, with a timestamp each, so the
//! time the GPU spends between two submissions is measured instead of inferred from work
//! timed alone. Timestamps sit at pass boundaries only, as Apple GPUs allow.
//!
//! Pass timestamps are written once all the work before them has finished (on Vulkan at the
//! bottom of the pipe), so a submission's opening mark is when the GPU is done with
//! everything before it and has reached it, and each later mark when the work before it in
//! the submission is done.

use super::{Gpu, GpuError};

/// wgpu caps a query set at 4096 queries: three a submission.
pub const MAX_MARKED_SUBMISSIONS: u32 = 4096 / MARKS;

/// Marks a submission: opening, splitting, closing.
const MARKS: u32 = 3;

/// A marked submission's time on the GPU, in nanoseconds of the GPU's clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MarkedSpan {
    /// When the GPU reached its opening mark.
    pub start_ns: f64,
    /// When the work before its splitting mark was done.
    pub split_ns: f64,
    /// When all its work was done.
    pub end_ns: f64,
}

/// The empty passes that mark one submission, each a command buffer of its own.
pub struct Marks {
    /// Goes first.
    pub open: wgpu::CommandBuffer,
    /// Goes between the two parts the submission is split in.
    pub split: wgpu::CommandBuffer,
    /// Goes last.
    pub close: wgpu::CommandBuffer,
}

/// Timestamps for up to a fixed number of submissions, marked in submission order.
pub struct SubmissionTimeline {
    queries: wgpu::QuerySet,
    capacity: u32,
    marked: u32,
}

impl SubmissionTimeline {
    /// Room for `submissions` marked submissions (at most [`MAX_MARKED_SUBMISSIONS`]); needs
    /// timestamp queries.
    pub fn new(gpu: &Gpu, submissions: u32) -> Result<SubmissionTimeline, GpuError> {
        if !gpu.caps.timestamps {
            return Err(GpuError::Limit {
                limit: "timestamp queries (a submission timeline needs them)",
                found: 0,
                needed: 1,
            });
        }
        let capacity = submissions.clamp(1, MAX_MARKED_SUBMISSIONS);
        let queries = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("submission timeline"),
            ty: wgpu::QueryType::Timestamp,
            count: MARKS * capacity,
        });
        Ok(SubmissionTimeline {
            queries,
            capacity,
            marked: 0,
        })
    }

    /// The marks of the next submission; `None` once the timeline is full (that submission
    /// goes unmarked).
    pub fn marks(&mut self, gpu: &Gpu) -> Option<Marks> {
        if self.marked == self.capacity {
            return None;
        }
        let first = MARKS * self.marked;
        self.marked += 1;
        let mark = |index| {
            let mut encoder = gpu.device.create_command_encoder(&Default::default());
            encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("submission mark"),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: &self.queries,
                    beginning_of_pass_write_index: Some(index),
                    end_of_pass_write_index: None,
                }),
            });
            encoder.finish()
        };
        Some(Marks {
            open: mark(first),
            split: mark(first + 1),
            close: mark(first + 2),
        })
    }

    /// The marked submissions' spans, in submission order, once they have all run.
    pub fn read(&self, gpu: &Gpu) -> Result<Vec<MarkedSpan>, GpuError> {
        if self.marked == 0 {
            return Ok(Vec::new());
        }
        let encoder = gpu.device.create_command_encoder(&Default::default());
        let nanos = gpu.resolve_timestamps(encoder, &self.queries, MARKS * self.marked)?;
        Ok(nanos
            .chunks_exact(MARKS as usize)
            .map(|t| MarkedSpan {
                start_ns: t[0],
                split_ns: t[1],
                end_ns: t[2],
            })
            .collect())
    }
}
