//! Reading GPU results back to the host: a staging buffer that a command buffer copies into
//! at its end, read once that submission (and only it) has finished, so later submissions
//! (the codec's next chunk, say) keep the GPU busy while the host reads and works.

use super::{Gpu, GpuError, WaitHistory};

/// A reusable host-readable copy of the first bytes of a buffer.
pub struct Readback {
    staging: wgpu::Buffer,
    /// The last read's wait, which plans the next one's (see [`Gpu::wait_for`]).
    waits: WaitHistory,
}

impl Readback {
    /// A staging buffer of `bytes` bytes.
    pub fn new(gpu: &Gpu, label: &str, bytes: u64) -> Readback {
        Readback {
            staging: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            waits: WaitHistory::default(),
        }
    }

    /// Records the copy of `source`'s first bytes (as many as the staging buffer holds).
    pub fn record(&self, encoder: &mut wgpu::CommandEncoder, source: &wgpu::Buffer) {
        encoder.copy_buffer_to_buffer(source, 0, &self.staging, 0, self.staging.size());
    }

    /// Waits until `submission` (which recorded the copy) has finished and returns the
    /// copied values.
    pub fn read<T: bytemuck::Pod>(&self, gpu: &Gpu, submission: wgpu::SubmissionIndex) -> Result<Vec<T>, GpuError> {
        let failed = |e: &dyn std::fmt::Display| GpuError::Readback(e.to_string());
        let (sender, receiver) = std::sync::mpsc::channel();
        self.staging.map_async(wgpu::MapMode::Read, .., move |result| {
            let _ = sender.send(result);
        });
        let values = (|| {
            gpu.wait_for(&submission, &self.waits)?;
            receiver.recv().map_err(|e| failed(&e))?.map_err(|e| failed(&e))?;
            let range = self.staging.get_mapped_range(..).map_err(|e| failed(&e))?;
            Ok(bytemuck::cast_slice(&range).to_vec())
        })();
        // Unmapped on every path (a pending map is cancelled), so the next copy can use it.
        self.staging.unmap();
        values
    }
}
