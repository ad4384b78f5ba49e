//! Writing data into new GPU buffers: staged by the host, copied by the GPU in batches.
//!
//! A buffer's bytes go through staging memory that wgpu makes for each write; the GPU copies
//! them into the buffer at the queue's next submission. A checkpoint's upload sends its
//! writes in batches as it goes ([`Gpu::send_writes`]), so that the GPU copies one batch
//! while the host stages the next, and waits for the last before it ends.

use std::ops::Range;

use rayon::prelude::*;

use super::{Gpu, GpuError};

/// Bytes of buffer writes gathered before they are sent to the GPU while weights upload (a
/// batch closes with the buffer that reaches it): the GPU copies one batch while the host
/// stages the next, and at most two batches of staging memory are held at a time. (Left to
/// the first submission, as wgpu leaves a buffer mapped at its creation, the bench
/// checkpoint's 9 GB crossed PCIe in front of the first request: on an H200 a CLI
/// synthesis's first audio came after 0.50-0.55 s, against 0.15 s sent in batches.)
pub const UPLOAD_BATCH: u64 = 256 << 20;

/// Bytes of a buffer that one thread stages (a multiple of 4): each range is a write of its
/// own, so the host's threads fill a large buffer's staging memory side by side. (16 MiB
/// gave sixteen threads seven ranges of a 113 MB buffer: on an H200 machine the bench
/// checkpoint's staging took 0.82-0.88 s to fill that way, 0.56-0.67 s in 4 MiB ranges.)
const STAGING_CHUNK: usize = 4 << 20;

impl Gpu {
    /// A storage buffer holding `bytes` (padded with zeros to a multiple of 4).
    pub fn buffer_with(&self, label: &str, bytes: &[u8]) -> wgpu::Buffer {
        self.buffer_gathered(label, &[bytes])
    }

    /// A storage buffer holding `pieces` one after another (padded with zeros to a multiple
    /// of 4 bytes), each copied straight from where it lies (a checkpoint's mapped file, say)
    /// into staging memory, by several threads for a large buffer: no copy of the whole is
    /// made on the way. The GPU copies the staging memory into the buffer at the queue's
    /// next submission ([`Gpu::send_writes`] starts it without other work). (A buffer mapped
    /// at its creation is staged the same way in wgpu, but its staging memory is zeroed
    /// first: every byte written twice.)
    pub fn buffer_gathered(&self, label: &str, pieces: &[&[u8]]) -> wgpu::Buffer {
        let len: usize = pieces.iter().map(|piece| piece.len()).sum();
        let size = len.div_ceil(4).max(1) * 4;
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: size as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let writes: Vec<(Range<usize>, wgpu::QueueWriteBufferView)> = (0..size)
            .step_by(STAGING_CHUNK)
            .map(|start| {
                let range = start..(start + STAGING_CHUNK).min(size);
                let bytes = wgpu::BufferSize::new(range.len() as u64).expect("a chunk holds at least 4 bytes");
                let view = self
                    .queue
                    .write_buffer_with(&buffer, start as u64, bytes)
                    .expect("a new buffer with COPY_DST usage takes writes of 4-byte multiples");
                (range, view)
            })
            .collect();
        writes.into_par_iter().for_each(|(range, mut view)| {
            let mut at = 0;
            for piece in bytes_of(pieces, range.start.min(len)..range.end.min(len)) {
                view.slice(at..at + piece.len()).copy_from_slice(piece);
                at += piece.len();
            }
            view.slice(at..).fill(0);
        });
        buffer
    }

    /// Submits the buffer writes made so far (their copies from staging memory) without
    /// other work, so that they run while the host prepares more; wait for the returned
    /// submission with [`Gpu::finish`], after which their staging memory is freed.
    pub fn send_writes(&self) -> wgpu::SubmissionIndex {
        self.queue.submit([])
    }

    /// Blocks until `submission` has finished.
    pub fn finish(&self, submission: &wgpu::SubmissionIndex) -> Result<(), GpuError> {
        self.block(Some(submission), None).map(|_| ())
    }
}

/// The pieces of `pieces`' concatenation that cover its bytes `range`.
pub(crate) fn bytes_of<'p>(pieces: &[&'p [u8]], range: Range<usize>) -> Vec<&'p [u8]> {
    let mut covered = Vec::new();
    let mut start = 0;
    for piece in pieces {
        let end = start + piece.len();
        let (from, to) = (range.start.max(start), range.end.min(end));
        if from < to {
            covered.push(&piece[from - start..to - start]);
        }
        start = end;
    }
    covered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_of_covers_a_range_of_the_concatenation() {
        let (a, b, c) = ([1u8, 2, 3], [4u8], [5u8, 6, 7, 8]);
        let pieces: [&[u8]; 4] = [&a, &[], &b, &c];
        let whole: Vec<u8> = pieces.concat();
        for start in 0..=whole.len() {
            for end in start..=whole.len() {
                let covered = bytes_of(&pieces, start..end);
                assert_eq!(covered.concat(), whole[start..end], "{start}..{end}");
                assert!(covered.iter().all(|piece| !piece.is_empty()), "{start}..{end}");
            }
        }
    }
}
