//! The voice tower on the GPU (contract section 7): log-mel frames of a reference recording
//! to the [P, H] voice prefix: in_proj, residual blocks `x += fc2(gelu(fc1(rmsnorm(x))))`,
//! out_norm, mean over frames, out_proj. BF16 activations into every linear, FP32 elsewhere.

use std::sync::Arc;

use drama_kernels::{ElementwiseParams, Kernel, NormParams, flags};

use crate::error::EngineError;
use crate::exec::{LinearIo, linear_launches};
use crate::gpu::{Dispatch, Gpu};
use crate::weights::{GpuLinear, upload_linear};
use drama_checkpoint::config::VoiceTowerConfig;
use drama_checkpoint::numerics::round_to_bf16;
use drama_checkpoint::{Checkpoint, names};

struct Block {
    norm: wgpu::Buffer,
    fc1: GpuLinear,
    fc2: GpuLinear,
}

/// The tower's weights on the GPU.
pub struct VoiceTower {
    gpu: Arc<Gpu>,
    in_proj: GpuLinear,
    blocks: Vec<Block>,
    out_norm: wgpu::Buffer,
    out_proj: GpuLinear,
    placeholder: wgpu::Buffer,
    dim: usize,
    ffn: usize,
    n_mels: usize,
    eps: f32,
    config: VoiceTowerConfig,
}

impl VoiceTower {
    /// Uploads the tower's weights (BF16, as stored).
    pub fn new(gpu: Arc<Gpu>, checkpoint: &Checkpoint) -> Result<VoiceTower, EngineError> {
        let c = &checkpoint.config;
        let vector = |name: &str| {
            let entry = checkpoint.weights.entry(name).expect("validated tensor");
            gpu.buffer_with(name, checkpoint.weights.bytes(entry))
        };
        let blocks = (0..c.voice_tower.blocks)
            .map(|j| {
                let at = |t: &str| names::fill(t, &[("j", j)]);
                Ok(Block {
                    norm: vector(&at(names::TOWER_NORM)),
                    fc1: upload_linear(&gpu, checkpoint, &at(names::TOWER_FC1))?,
                    fc2: upload_linear(&gpu, checkpoint, &at(names::TOWER_FC2))?,
                })
            })
            .collect::<Result<_, EngineError>>()?;
        Ok(VoiceTower {
            in_proj: upload_linear(&gpu, checkpoint, names::TOWER_IN)?,
            out_proj: upload_linear(&gpu, checkpoint, names::TOWER_OUT)?,
            out_norm: vector(names::TOWER_OUT_NORM),
            placeholder: gpu.buffer("placeholder", 4),
            blocks,
            dim: c.voice_tower.dim,
            ffn: c.voice_tower.ffn,
            n_mels: c.voice_tower.n_mels,
            eps: c.rms_norm_eps as f32,
            config: c.voice_tower.clone(),
            gpu,
        })
    }

    /// The tower's configuration (its sample rate and log-mel front end).
    pub fn config(&self) -> &VoiceTowerConfig {
        &self.config
    }

    fn linear(
        &self,
        linear: &GpuLinear,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        rows: usize,
        out: &mut Vec<Dispatch>,
    ) -> Result<(), EngineError> {
        let io = LinearIo::plain(x, y, rows, linear.out, true);
        out.extend(linear_launches(&self.gpu, linear, &self.placeholder, &io)?);
        Ok(())
    }

    fn rms_norm(
        &self,
        weight: &wgpu::Buffer,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        rows: usize,
        round: bool,
    ) -> Result<Dispatch, EngineError> {
        let params = NormParams {
            width: self.dim as u32,
            flags: if round { flags::norm::ROUND } else { 0 },
            eps: self.eps,
            ..Default::default()
        };
        let kernel = Kernel::rms_norm(self.dim);
        // `Kernel::RmsNorm` binds its output a second time, as the BF16 pairs it does not
        // write here.
        let resources: &[&wgpu::Buffer] = match kernel {
            Kernel::RmsNorm => &[x, weight, y, y],
            _ => &[x, weight, y],
        };
        Ok(self.gpu.dispatch(kernel, &params, resources, [rows as u32, 1, 1])?)
    }

    fn elementwise(
        &self,
        kernel: Kernel,
        params: ElementwiseParams,
        resources: &[&wgpu::Buffer],
    ) -> Result<Dispatch, EngineError> {
        let grid = self.gpu.elements_grid(params.count as usize);
        Ok(self.gpu.dispatch(kernel, &params, resources, grid)?)
    }

    /// Encodes log-mel frames ([frames, n_mels] row-major) into the [P, H] prefix.
    pub fn encode(&self, mel: &[f32], frames: usize) -> Result<Vec<f32>, EngineError> {
        if frames == 0 || mel.len() != frames * self.n_mels {
            return Err(EngineError::Input(format!(
                "voice tower: {} mel values for {frames} frames of {}",
                mel.len(),
                self.n_mels
            )));
        }
        let gpu = &self.gpu;
        let (d, f) = (self.dim, self.ffn);
        let rounded: Vec<f32> = mel.iter().map(|&v| round_to_bf16(v)).collect();
        let input = gpu.buffer_with("mel", bytemuck::cast_slice(&rounded));
        let mut x = gpu.buffer("tower x", (frames * d * 4) as u64);
        let normed = gpu.buffer("tower normed", (frames * d * 4) as u64);
        let hidden = gpu.buffer("tower hidden", (frames * f * 4) as u64);
        let act = gpu.buffer("tower act", (frames * f * 4) as u64);
        let block_out = gpu.buffer("tower block out", (frames * d * 4) as u64);
        let mean = gpu.buffer("tower mean", (d * 4) as u64);
        let prefix = gpu.buffer("tower prefix", (self.out_proj.out * 4) as u64);
        let mut launches = Vec::new();
        self.linear(&self.in_proj, &input, &x, frames, &mut launches)?;
        for block in &self.blocks {
            launches.push(self.rms_norm(&block.norm, &x, &normed, frames, true)?);
            self.linear(&block.fc1, &normed, &hidden, frames, &mut launches)?;
            let gelu = ElementwiseParams {
                count: (frames * f) as u32,
                flags: flags::elementwise::ROUND,
                ..Default::default()
            };
            launches.push(self.elementwise(Kernel::Gelu, gelu, &[&hidden, &act])?);
            self.linear(&block.fc2, &act, &block_out, frames, &mut launches)?;
            let next = gpu.buffer("tower x", (frames * d * 4) as u64);
            let add = ElementwiseParams {
                count: (frames * d) as u32,
                ..Default::default()
            };
            launches.push(self.elementwise(Kernel::Add, add, &[&x, &block_out, &next])?);
            x = next;
        }
        launches.push(self.rms_norm(&self.out_norm, &x, &normed, frames, false)?);
        let average = ElementwiseParams {
            count: d as u32,
            width: d as u32,
            k: frames as u32,
            flags: flags::elementwise::ROUND,
            ..Default::default()
        };
        launches.push(self.elementwise(Kernel::MeanRows, average, &[&normed, &mean])?);
        self.linear(&self.out_proj, &mean, &prefix, 1, &mut launches)?;
        gpu.submit(&launches);
        Ok(gpu.read_first(&prefix, self.out_proj.out)?)
    }
}
