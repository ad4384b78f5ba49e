//! The contract's sampling on the GPU (`Kernel::Sample`, `sample.wgsl`): one token per row
//! of logits, the same token [`super::exact::choose`] picks on the host.

use drama_kernels::{Kernel, SampleParams, SampleRow};

use super::exact::{ExactSettings, ExpTables};
use crate::error::EngineError;
use crate::gpu::Gpu;

/// The kernel's token for a row with a NaN logit.
const NO_TOKEN: u32 = u32::MAX;

/// The sampling kernel with its tables of e^-x uploaded.
pub struct GpuSampler {
    tables: wgpu::Buffer,
}

impl GpuSampler {
    /// Uploads the tables ([`ExpTables`]) to `gpu`.
    pub fn new(gpu: &Gpu) -> GpuSampler {
        let words = ExpTables::get().words();
        GpuSampler {
            tables: gpu.buffer_with("sampling tables", bytemuck::cast_slice(&words)),
        }
    }

    /// One token per row of `logits` (`vocab` each) under that row's settings and
    /// forbidden id; `None` for a row with a NaN logit.
    pub fn sample(
        &self,
        gpu: &Gpu,
        logits: &[f32],
        vocab: usize,
        rows: &[(ExactSettings, usize)],
    ) -> Result<Vec<Option<u32>>, EngineError> {
        if rows.is_empty() || logits.len() != rows.len() * vocab {
            return Err(EngineError::Input(format!(
                "{} logits for {} rows of {vocab}",
                logits.len(),
                rows.len()
            )));
        }
        let settings: Vec<SampleRow> = rows
            .iter()
            .map(|(s, forbidden)| SampleRow {
                tau: s.tau,
                top_k: s.top_k,
                top_p: s.top_p,
                random: s.random,
                forbidden: *forbidden as u32,
                pad: [0; 3],
            })
            .collect();
        let params = SampleParams {
            rows: rows.len() as u32,
            vocab: vocab as u32,
            pad: [0; 2],
        };
        let logits = gpu.buffer_with("sampled logits", bytemuck::cast_slice(logits));
        let settings = gpu.buffer_with("sampling settings", bytemuck::cast_slice(&settings));
        let tokens = gpu.buffer("sampled tokens", (rows.len() * 4) as u64);
        let launch = gpu.dispatch(
            Kernel::Sample,
            &params,
            &[&logits, &settings, &self.tables, &tokens],
            [rows.len() as u32, 1, 1],
        )?;
        gpu.submit(&[launch]);
        let tokens = gpu.read_u32(&tokens)?;
        Ok(tokens.into_iter().map(|t| (t != NO_TOKEN).then_some(t)).collect())
    }
}
