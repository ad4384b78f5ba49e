//! Writing data into new GPU buffers: staged by the host, copied by the GPU.
//!
//! A buffer's bytes go through staging memory; the GPU copies them into the buffer. For a
//! few buffers, staging memory that wgpu makes for each write ([`Gpu::buffer_gathered`]);
//! for a checkpoint's upload, a [`Stager`]: staging memory reused batch after batch, each
//! batch sent to the GPU as it fills, so that the GPU copies one while the host stages the
//! next, and waited for before the upload ends.

use std::ops::Range;

use rayon::prelude::*;

use super::{Gpu, GpuError};

/// Bytes of buffer writes gathered before they are sent to the GPU while weights upload (a
/// batch closes with the buffer that reaches it): the GPU copies one batch while the host
/// stages the next, and at most two batches of staging memory are held at a time. (Left to
/// the first submission, as wgpu leaves a buffer mapped at its creation, the bench
/// checkpoint's 9 GB would cross PCIe in front of the first request, delaying its first
/// audio.)
pub const UPLOAD_BATCH: u64 = 256 << 20;

/// Bytes of a buffer that one thread stages (a multiple of 4): each range is a write of its
/// own, so the host's threads fill a large buffer's staging memory side by side. (16 MiB
/// gives sixteen threads only seven ranges of a 113 MB buffer; 4 MiB ranges filled the
/// bench checkpoint's staging faster.)
const STAGING_CHUNK: usize = 4 << 20;

impl Gpu {
    /// A storage buffer holding `bytes` (padded with zeros to a multiple of 4).
    pub fn buffer_with(&self, label: &str, bytes: &[u8]) -> wgpu::Buffer {
        self.buffer_gathered(label, &[bytes])
    }

    /// A new storage buffer of `len` bytes padded with zeros to a multiple of 4.
    fn new_buffer(&self, label: &str, len: usize) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: padded(len) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    }

    /// A storage buffer holding `pieces` one after another (padded with zeros to a multiple
    /// of 4 bytes), each copied straight from where it lies (a checkpoint's mapped file, say)
    /// into staging memory, by several threads for a large buffer: no copy of the whole is
    /// made on the way. The GPU copies the staging memory into the buffer at the queue's
    /// next submission. (A buffer mapped at its creation is staged the same way in wgpu,
    /// but its staging memory is zeroed first: every byte written twice.)
    pub fn buffer_gathered(&self, label: &str, pieces: &[&[u8]]) -> wgpu::Buffer {
        let len: usize = pieces.iter().map(|piece| piece.len()).sum();
        let size = padded(len);
        let buffer = self.new_buffer(label, len);
        // A write is refused only when wgpu could not make the buffer or its staging memory
        // (out of memory): it reports that, and the next wait returns it.
        let writes: Vec<(Range<usize>, wgpu::QueueWriteBufferView)> = staging_ranges(size)
            .map_while(|(range, bytes)| {
                let view = self.queue.write_buffer_with(&buffer, range.start as u64, bytes)?;
                Some((range, view))
            })
            .collect();
        writes
            .into_par_iter()
            .for_each(|(range, mut view)| stage(view.slice(..), pieces, range, len));
        buffer
    }
}

/// Bytes of a staging belt's chunk: a multiple of [`STAGING_CHUNK`], each write's range.
const BELT_CHUNK: u64 = 16 * STAGING_CHUNK as u64;

/// Writes a checkpoint's buffers through staging memory it reuses: each buffer's ranges are
/// staged by the host's threads side by side and copied by the GPU in batches of
/// [`GpuOptions::upload_batch`](super::GpuOptions::upload_batch) bytes, a batch sent once it
/// fills while the one before it is waited for. (Reusing the staging memory loads the bench
/// checkpoint faster than fresh staging memory for every write, as
/// `Queue::write_buffer_with` makes it.)
pub struct Stager<'g> {
    gpu: &'g Gpu,
    belt: wgpu::util::StagingBelt,
    encoder: wgpu::CommandEncoder,
    /// Bytes staged since the last batch was sent.
    unsent: u64,
    /// The last batch sent, still to be waited for.
    in_flight: Option<wgpu::SubmissionIndex>,
}

impl<'g> Stager<'g> {
    /// A stager writing through `gpu`'s queue.
    pub fn new(gpu: &'g Gpu) -> Stager<'g> {
        Stager {
            gpu,
            belt: wgpu::util::StagingBelt::new(gpu.device.clone(), BELT_CHUNK),
            encoder: gpu.device.create_command_encoder(&Default::default()),
            unsent: 0,
            in_flight: None,
        }
    }

    /// A storage buffer holding `pieces` one after another (padded with zeros to a multiple
    /// of 4 bytes), copied straight from where they lie into staging memory; it holds them
    /// once [`Stager::finish`] returns.
    pub fn buffer(&mut self, label: &str, pieces: &[&[u8]]) -> Result<wgpu::Buffer, GpuError> {
        let len: usize = pieces.iter().map(|piece| piece.len()).sum();
        let size = padded(len);
        let buffer = self.gpu.new_buffer(label, len);
        let writes = staging_ranges(size)
            .map(|(range, bytes)| Ok((range.clone(), self.stage_range(&buffer, range.start as u64, bytes)?)))
            .collect::<Result<Vec<(Range<usize>, wgpu::BufferViewMut)>, GpuError>>()?;
        writes
            .into_par_iter()
            .for_each(|(range, mut view)| stage(view.slice(..), pieces, range, len));
        self.unsent += size as u64;
        if self.unsent >= self.gpu.upload_batch {
            self.send()?;
        }
        Ok(buffer)
    }

    /// Staging memory for `bytes` bytes of `target` at `offset`, and the copy from it
    /// recorded. (`StagingBelt::write_buffer` does the same but panics when the memory
    /// cannot be mapped: wgpu could not make the belt's buffer, out of memory, say, or the
    /// device was lost.)
    fn stage_range(
        &mut self,
        target: &wgpu::Buffer,
        offset: u64,
        bytes: wgpu::BufferSize,
    ) -> Result<wgpu::BufferViewMut, GpuError> {
        const ALIGNMENT: wgpu::BufferSize = wgpu::BufferSize::new(wgpu::COPY_BUFFER_ALIGNMENT).unwrap();
        let slice = self.belt.allocate(bytes, ALIGNMENT);
        self.encoder
            .copy_buffer_to_buffer(slice.buffer(), slice.offset(), target, offset, bytes.get());
        slice
            .get_mapped_range_mut()
            .map_err(|error| GpuError::Staging(error.to_string()))
    }

    /// Sends the copies staged so far, then waits for the batch sent before them (whose
    /// staging memory then returns to the belt).
    fn send(&mut self) -> Result<(), GpuError> {
        self.belt.finish();
        let encoder = std::mem::replace(
            &mut self.encoder,
            self.gpu.device.create_command_encoder(&Default::default()),
        );
        let sent = self.gpu.submit_commands([encoder.finish()]);
        self.belt.recall();
        if let Some(previous) = self.in_flight.replace(sent) {
            self.gpu.finish(&previous)?;
        }
        self.unsent = 0;
        Ok(())
    }

    /// Sends what is left and waits until every buffer holds its bytes.
    pub fn finish(mut self) -> Result<(), GpuError> {
        self.send()?;
        match self.in_flight.take() {
            Some(last) => self.gpu.finish(&last),
            None => Ok(()),
        }
    }
}

/// The staging ranges of a buffer of `size` bytes (a multiple of 4), each a write of its
/// own: [`STAGING_CHUNK`] bytes, the last one shorter.
fn staging_ranges(size: usize) -> impl Iterator<Item = (Range<usize>, wgpu::BufferSize)> {
    (0..size).step_by(STAGING_CHUNK).map(move |start| {
        let range = start..(start + STAGING_CHUNK).min(size);
        let bytes = wgpu::BufferSize::new(range.len() as u64).expect("a range holds at least 4 bytes");
        (range, bytes)
    })
}

/// `len` rounded up to whole 4-byte words (at least one).
fn padded(len: usize) -> usize {
    len.div_ceil(4).max(1) * 4
}

/// Writes bytes `range` of `pieces`' concatenation (`len` bytes, zeros past its end) into
/// `out`, a staging range of exactly that size.
fn stage(mut out: wgpu::WriteOnly<'_, [u8]>, pieces: &[&[u8]], range: Range<usize>, len: usize) {
    let mut at = 0;
    for piece in bytes_of(pieces, range.start.min(len)..range.end.min(len)) {
        out.slice(at..at + piece.len()).copy_from_slice(piece);
        at += piece.len();
    }
    out.slice(at..).fill(0);
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
