//! The contract's sampling on the GPU (`Kernel::Sample`, `sample.wgsl`): the same token
//! [`super::exact::choose`] picks on the host, for plain and guided draws alike.
//!
//! A [`GpuSampler`] draws from rows of logits kept in a buffer of its own. Inside a step
//! the session copies each job's last logit rows there behind the forward, the draws run
//! behind it in the same queue, and the next step's rows read the drawn tokens on the GPU:
//! the host reads them one step later, while the GPU runs the next step.

use std::collections::HashMap;

use drama_kernels::{Kernel, SampleParams, SampleRow};

use super::exact::{self, ExactSettings, ExpTables};
use crate::error::EngineError;
use crate::gpu::{Dispatch, Gpu, Readback};

/// The kernel's token for a draw with a NaN logit.
const NO_TOKEN: u32 = u32::MAX;

/// One token to draw: its settings and the rows of kept logits it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Draw {
    /// The integer settings of the draw (its random word included).
    pub settings: ExactSettings,
    /// The id never drawn (audio_bos).
    pub forbidden: usize,
    /// The kept row of the cond lane's logits.
    pub cond: usize,
    /// With guidance: the kept row of the uncond lane's logits and the scale, in units of
    /// 2^-16 (`super::gamma_fixed`).
    pub uncond: Option<(usize, u32)>,
}

impl Draw {
    /// The token the host's definition (`super::exact`) draws from `kept` (rows of `vocab`
    /// logits): what the GPU's draw must give. `None` for a NaN logit (or no candidate).
    pub fn on_host(&self, kept: &[f32], vocab: usize) -> Option<u32> {
        let row = |r: usize| &kept[r * vocab..(r + 1) * vocab];
        let levels = match self.uncond {
            None => exact::levels(row(self.cond))?,
            Some((uncond, gamma)) => exact::guided_levels(row(self.cond), row(uncond), gamma)?,
        };
        exact::choose(ExpTables::get(), &levels, self.forbidden, &self.settings).map(|t| t as u32)
    }

    fn row(&self) -> SampleRow {
        let (uncond, gamma) = self
            .uncond
            .map_or((SampleRow::UNGUIDED, 0), |(row, gamma)| (row as u32, gamma));
        SampleRow {
            tau: self.settings.tau,
            top_k: self.settings.top_k,
            top_p: self.settings.top_p,
            random: self.settings.random,
            forbidden: self.forbidden as u32,
            cond: self.cond as u32,
            uncond,
            gamma,
        }
    }
}

/// Draws submitted to the GPU and not read yet ([`GpuSampler::read`]).
#[must_use = "drawn tokens are read with GpuSampler::read"]
#[derive(Debug)]
pub struct DrawnTokens {
    serial: u64,
    count: usize,
    submission: wgpu::SubmissionIndex,
}

impl DrawnTokens {
    /// The submission that carries the draws.
    pub fn submission(&self) -> &wgpu::SubmissionIndex {
        &self.submission
    }
}

/// The draws read back: the same ring slot holds them until the draws after the next.
const READBACKS: usize = 2;

/// Sampling on the GPU: kept rows of logits, the draws' settings, the tokens drawn and
/// their readback, for up to `capacity` rows and draws.
pub struct GpuSampler {
    vocab: usize,
    capacity: usize,
    coarse: wgpu::Buffer,
    fine: wgpu::Buffer,
    kept: wgpu::Buffer,
    settings: wgpu::Buffer,
    tokens: wgpu::Buffer,
    readbacks: [Readback; READBACKS],
    /// The serial of the draws each readback holds.
    held: [u64; READBACKS],
    submitted: u64,
    /// The kernel's launch for each number of draws seen.
    launches: HashMap<usize, Dispatch>,
}

impl GpuSampler {
    /// A sampler of up to `capacity` kept rows (and draws) of `vocab` logits; uploads the
    /// tables of e^-x ([`ExpTables`]). Refused where the kept rows exceed the device's
    /// storage-binding limit.
    pub fn new(gpu: &Gpu, vocab: usize, capacity: usize) -> Result<GpuSampler, EngineError> {
        let capacity = capacity.max(1);
        let kept_bytes = (capacity as u64).saturating_mul(vocab as u64 * 4);
        if kept_bytes > gpu.caps.max_storage_binding {
            return Err(EngineError::Unsupported(format!(
                "sampling {capacity} rows of {vocab} logits needs {kept_bytes} bytes, above the device's storage-binding limit of {} bytes",
                gpu.caps.max_storage_binding
            )));
        }
        let tables = ExpTables::get();
        Ok(GpuSampler {
            vocab,
            capacity,
            coarse: gpu.buffer_with("e^-x coarse", bytemuck::cast_slice(&tables.coarse)),
            fine: gpu.buffer_with("e^-x fine", bytemuck::cast_slice(&tables.fine)),
            kept: gpu.buffer("kept logits", kept_bytes),
            settings: gpu.buffer("draws", (capacity * size_of::<SampleRow>()) as u64),
            tokens: gpu.buffer("drawn tokens", (capacity * 4) as u64),
            readbacks: std::array::from_fn(|_| Readback::new(gpu, "drawn tokens", (capacity * 4) as u64)),
            held: [0; READBACKS],
            submitted: 0,
            launches: HashMap::new(),
        })
    }

    /// The buffer of kept logit rows ([capacity, vocab] f32) that draws read.
    pub fn kept(&self) -> &wgpu::Buffer {
        &self.kept
    }

    /// The buffer of the last draws' tokens, one u32 per draw, in draw order.
    pub fn tokens(&self) -> &wgpu::Buffer {
        &self.tokens
    }

    /// The most kept rows and draws.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Submits `draws` (each reading rows of [`GpuSampler::kept`] as the work queued before
    /// leaves them); their tokens land in [`GpuSampler::tokens`] and, for the host, in a
    /// readback that [`GpuSampler::read`] reads.
    pub fn submit(&mut self, gpu: &Gpu, draws: &[Draw]) -> Result<DrawnTokens, EngineError> {
        let commands = self.encode(gpu, draws)?;
        Ok(self.submitted(gpu.submit_commands([commands]), draws.len()))
    }

    /// Records `draws` and the copy of their tokens to the next readback, to submit behind
    /// the work they read; [`GpuSampler::submitted`] then names the submission.
    pub fn encode(&mut self, gpu: &Gpu, draws: &[Draw]) -> Result<wgpu::CommandBuffer, EngineError> {
        let count = self.prepare(gpu, draws)?;
        let slot = ((self.submitted + 1) % READBACKS as u64) as usize;
        Ok(gpu.encode_then_copy(
            std::slice::from_ref(&self.launches[&count]),
            Some((&self.tokens, &self.readbacks[slot])),
        ))
    }

    /// The draws of `count` tokens last recorded ([`GpuSampler::encode`]), submitted in
    /// `submission`.
    pub fn submitted(&mut self, submission: wgpu::SubmissionIndex, count: usize) -> DrawnTokens {
        self.submitted += 1;
        let slot = (self.submitted % READBACKS as u64) as usize;
        self.held[slot] = self.submitted;
        DrawnTokens {
            serial: self.submitted,
            count,
            submission,
        }
    }

    /// Runs `draws` alone and returns their GPU time (timestamps at the pass boundaries);
    /// their tokens land in [`GpuSampler::tokens`] only.
    pub fn timed(&mut self, gpu: &Gpu, draws: &[Draw]) -> Result<std::time::Duration, EngineError> {
        let count = self.prepare(gpu, draws)?;
        Ok(gpu.timed_submit(std::slice::from_ref(&self.launches[&count]))?)
    }

    /// Checks `draws`, writes their settings for the next submission and makes the launch
    /// for their number; returns the number.
    fn prepare(&mut self, gpu: &Gpu, draws: &[Draw]) -> Result<usize, EngineError> {
        if draws.is_empty() || draws.len() > self.capacity {
            return Err(EngineError::Input(format!(
                "{} draws for a sampler of {}",
                draws.len(),
                self.capacity
            )));
        }
        let rows: Vec<SampleRow> = draws.iter().map(Draw::row).collect();
        if let Some(bad) = rows.iter().find(|r| {
            r.cond as usize >= self.capacity || (r.uncond != SampleRow::UNGUIDED && r.uncond as usize >= self.capacity)
        }) {
            return Err(EngineError::Input(format!(
                "a draw reads kept rows {} and {}, past the {} kept",
                bad.cond, bad.uncond, self.capacity
            )));
        }
        gpu.queue.write_buffer(&self.settings, 0, bytemuck::cast_slice(&rows));
        let count = draws.len();
        if !self.launches.contains_key(&count) {
            let params = SampleParams {
                rows: count as u32,
                vocab: self.vocab as u32,
                pad: [0; 2],
            };
            let launch = gpu.dispatch(
                Kernel::Sample,
                &params,
                &[&self.kept, &self.settings, &self.coarse, &self.fine, &self.tokens],
                [count as u32, 1, 1],
            )?;
            self.launches.insert(count, launch);
        }
        Ok(count)
    }

    /// The tokens of submitted draws, in draw order, once they are drawn (`None` for a draw
    /// with a NaN logit). Read each before submitting the draws after the next.
    pub fn read(&self, gpu: &Gpu, drawn: DrawnTokens) -> Result<Vec<Option<u32>>, EngineError> {
        let slot = (drawn.serial % READBACKS as u64) as usize;
        if self.held[slot] != drawn.serial {
            return Err(EngineError::Input(
                "draws were read after two later ones were submitted".into(),
            ));
        }
        let tokens: Vec<u32> = self.readbacks[slot].read(gpu, drawn.submission)?;
        Ok(tokens[..drawn.count]
            .iter()
            .map(|&t| (t != NO_TOKEN).then_some(t))
            .collect())
    }

    /// Draws from `logits` (rows of `vocab`, at most `capacity` of them) uploaded first: one
    /// token per draw, `None` for a draw with a NaN logit.
    pub fn sample(&mut self, gpu: &Gpu, logits: &[f32], draws: &[Draw]) -> Result<Vec<Option<u32>>, EngineError> {
        if !logits.len().is_multiple_of(self.vocab.max(1)) || logits.len() > self.capacity * self.vocab {
            return Err(EngineError::Input(format!(
                "{} logits are not rows of {} within {} rows",
                logits.len(),
                self.vocab,
                self.capacity
            )));
        }
        gpu.queue.write_buffer(&self.kept, 0, bytemuck::cast_slice(logits));
        let drawn = self.submit(gpu, draws)?;
        self.read(gpu, drawn)
    }
}
