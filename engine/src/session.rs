//! A loaded model on the GPU ([`Engine`]) and the state of the lanes using it
//! ([`Session`]): KV caches, voice prefixes and the compiled steps.
//!
//! A step processes any set of token rows, each naming its lane, position and source (a
//! voice-prefix row, a text token or an audio token). Rows never influence each other except
//! through their own lane's cache, so a prefill equals the same tokens fed one by one, and a
//! guidance pair run as two lanes of one step equals two separate runs, bit for bit.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use drama_graph::drama3::{self, ModelSpec, StepShape, row_source};
use rayon::prelude::*;

use crate::error::EngineError;
use crate::exec::{Bindings, Executable, LaunchSet, largest_step_buffer};
use crate::gpu::{Gpu, GpuError, MarkedSpan, Marks, SubmissionTimeline};
use crate::rope::rope_table;
use crate::sampling::gpu::{Draw, DrawnTokens, GpuSampler};
use crate::spec::{CheckpointNames, model_spec};
use crate::step_cache::StepCache;
use crate::weights::GpuWeights;
use drama_checkpoint::{Checkpoint, LayerMlp};

/// A validated checkpoint with its backbone weights on the GPU.
pub struct Engine {
    /// The device.
    pub gpu: Arc<Gpu>,
    /// The checkpoint (weights stay memory-mapped for the CPU-side parts); shared with
    /// whatever else reads it beside the engine, such as a service's voice encoder.
    pub checkpoint: Arc<Checkpoint>,
    /// What the graph builder needs.
    pub spec: ModelSpec,
    /// Weights on the GPU.
    pub weights: GpuWeights,
}

impl Engine {
    /// Uploads the checkpoint's backbone to the device and builds every pipeline a step can
    /// use, so that no request waits for shader compilation.
    pub fn load(gpu: Arc<Gpu>, checkpoint: Checkpoint) -> Result<Engine, EngineError> {
        let spec = model_spec(&checkpoint);
        let groups = drama3::linear_groups(&spec, &CheckpointNames)?;
        let weights = GpuWeights::upload(&gpu, &checkpoint, &groups)?;
        build_step_pipelines(&gpu, &spec)?;
        Ok(Engine {
            spec,
            gpu,
            checkpoint: Arc::new(checkpoint),
            weights,
        })
    }
}

/// Builds every pipeline a step of any size uses (those of steps of
/// [`drama_graph::select::PIPELINE_ROWS`] rows), then the sampler's, on the host's threads
/// side by side; a failure reported is the first in that order.
fn build_step_pipelines(gpu: &Gpu, spec: &ModelSpec) -> Result<(), EngineError> {
    let mut kernels = Vec::new();
    for rows in drama_graph::select::PIPELINE_ROWS {
        let shape = StepShape {
            rows,
            lanes: 1,
            capacity: rows,
            prefix_rows: 1,
            trace: false,
            concurrent_launches: gpu.caps.concurrent_launches,
            device_barriers: gpu.caps.device_barriers,
        };
        for node in drama3::build(spec, &CheckpointNames, shape)?.nodes {
            for kernel in drama_graph::select::kernels_of(&node.op) {
                if !kernels.contains(&kernel) {
                    kernels.push(kernel);
                }
            }
        }
    }
    kernels.push(drama_kernels::Kernel::Sample);
    let built: Vec<_> = kernels.par_iter().map(|&kernel| gpu.pipeline(kernel)).collect();
    for pipeline in built {
        pipeline?;
    }
    Ok(())
}

/// Where one row of a step comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowSource {
    /// Row `p` of the lane's voice prefix.
    Prefix(usize),
    /// A text token id.
    Text(u32),
    /// An audio token id (a code, audio_bos or audio_eos).
    Audio(u32),
    /// The audio token of draw `d` of the session's last draws ([`Session::draw`]), read
    /// on the GPU when the step runs: a step can be submitted before the host has it.
    Drawn(usize),
}

/// One token row of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// What is embedded.
    pub source: RowSource,
    /// Which lane (KV-cache slot).
    pub lane: usize,
    /// Position in the lane's sequence.
    pub pos: usize,
}

/// What a step returns.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    /// Logits of every row, [rows, C + 2].
    pub logits: Vec<f32>,
    /// With tracing: every layer's residual stream after the layer, [rows, H] each.
    pub hidden: Vec<Vec<f32>>,
    /// With tracing: per MoE layer, the chosen ORIGINAL expert ids and weights, [rows, K].
    pub routes: Vec<Option<(Vec<u32>, Vec<f32>)>>,
}

/// A compiled step's key: its rows and whether it traces.
type StepKey = (usize, bool);

/// The bytes of compiled steps a session keeps beyond the one in use (see
/// [`Session::set_step_cache_budget`]). At the bench shape a step holds about 0.3 MB per
/// row in a session of a few hundred positions, 0.85 MB at the whole context of 4096 (its
/// attention scratch grows with the context), so this keeps every decode shape of a batch
/// and a few prompts' prefills.
pub const STEP_CACHE_BYTES: u64 = 1 << 30;

/// The most rows [`Session::max_step_rows`] considers: far below the 65535 workgroups a
/// launch may have along one dimension (routing and attention launch a workgroup row per
/// token row). The batcher runs more rows as several steps.
pub const MAX_STEP_ROWS: usize = 8192;

/// What a session's compiled steps hold (see [`Session::step_cache_usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepCacheUsage {
    /// Compiled step shapes kept.
    pub steps: usize,
    /// The bytes of their buffers.
    pub bytes: u64,
}

/// The compiled step of `key`, which [`Session::executable`] made and which stays cached
/// while in use (the newest entry, or pinned as unread).
fn compiled(steps: &StepCache<StepKey, Executable>, key: StepKey) -> &Executable {
    steps.get(&key).expect("a step in use stays compiled")
}

/// A step submitted to the GPU and not read yet (see [`Session::submit`]).
#[must_use = "a submitted step's logits are read with Session::logits"]
pub struct SubmittedStep {
    key: StepKey,
    submission: wgpu::SubmissionIndex,
    serial: u64,
}

/// How a step is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timing {
    None,
    Pass,
    PerDispatch,
}

/// The timing a step returns.
enum StepTiming {
    None,
    Pass(std::time::Duration),
    Kernels(Vec<(drama_kernels::Kernel, std::time::Duration)>),
}

/// Lanes sharing one engine: caches, prefixes and compiled steps.
pub struct Session<'e> {
    engine: &'e Engine,
    lanes: usize,
    capacity: usize,
    /// KV caches and the voice-prefix table, by the graph's state names.
    states: HashMap<String, wgpu::Buffer>,
    rope_table: wgpu::Buffer,
    steps: StepCache<StepKey, Executable>,
    /// The next step's commands, recorded while the GPU ran the last one (keyed like
    /// `steps`, with the launches they hold): a repeated step shape costs no recording time
    /// between steps.
    prepared: Option<(StepKey, LaunchSet, wgpu::CommandBuffer)>,
    /// Kept original expert ids per layer (None for dense layers), to name traced routes.
    moe_kept: Vec<Option<Vec<usize>>>,
    /// Steps submitted so far, and the number of the last one of each shape (whose logits
    /// its shape's readback holds).
    submitted: u64,
    last_of_shape: HashMap<StepKey, u64>,
    /// Shapes whose last submitted step's logits are not read yet: their compiled steps
    /// (which hold those logits) stay cached.
    unread: HashSet<StepKey>,
    /// Host time of the forwards since [`Session::take_forward_split`] last ran.
    forward_split: Cell<ForwardSplit>,
    /// Sampling on the GPU: the rows kept from steps, the draws, the tokens drawn.
    sampler: GpuSampler,
    /// A step's commands staged to go with its draws in one submission
    /// ([`Session::submit_for_draws`], [`Session::draw`]), and the shape whose next step
    /// is recorded once they are submitted.
    staged: Option<(StepKey, Vec<wgpu::CommandBuffer>)>,
    /// Marks on every submission of draws, when `drama bench` asks ([`Session::mark_draws`]).
    timeline: Option<SubmissionTimeline>,
}

/// Where the host's time went in forwards ([`Session::submit`] then [`Session::logits`]),
/// summed over steps.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ForwardSplit {
    /// Checking the step's rows and writing its inputs (the GPU has nothing to run
    /// meanwhile).
    pub inputs: Duration,
    /// Submitting the step's recorded commands (nor here).
    pub submit: Duration,
    /// Recording the next step's commands (while the GPU runs this one).
    pub record: Duration,
    /// Waiting for the logits or the drawn tokens and reading them back.
    pub wait: Duration,
}

impl std::ops::AddAssign for ForwardSplit {
    fn add_assign(&mut self, other: ForwardSplit) {
        self.inputs += other.inputs;
        self.submit += other.submit;
        self.record += other.record;
        self.wait += other.wait;
    }
}

/// The row index written for a [`RowSource::Drawn`] row, which the drawn token's copy
/// replaces: never an id the host writes.
const DRAWN_PLACEHOLDER: u32 = u32::MAX;

/// Records copies of `unit`-byte items from `source` to `target`, item `from` to item `to`
/// for each pair, consecutive pairs in one copy.
fn copy_runs(
    gpu: &Gpu,
    pairs: &[(usize, usize)],
    source: &wgpu::Buffer,
    target: &wgpu::Buffer,
    unit: u64,
) -> wgpu::CommandBuffer {
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    let mut i = 0;
    while i < pairs.len() {
        let (from, to) = pairs[i];
        let mut length = 1;
        while pairs.get(i + length) == Some(&(from + length, to + length)) {
            length += 1;
        }
        encoder.copy_buffer_to_buffer(
            source,
            from as u64 * unit,
            target,
            to as u64 * unit,
            length as u64 * unit,
        );
        i += length;
    }
    encoder.finish()
}

/// The most lanes a session takes: far past what a real model's KV caches leave room for,
/// it keeps every size computed from the lane count well inside 64 bits.
pub const MAX_LANES: usize = 4096;

impl<'e> Session<'e> {
    /// A session of `lanes` lanes with room for `capacity` positions each.
    pub fn new(engine: &'e Engine, lanes: usize, capacity: usize) -> Result<Self, EngineError> {
        let c = &engine.checkpoint.config;
        if lanes == 0 || capacity == 0 {
            return Err(EngineError::Input(
                "a session needs at least one lane and one position".into(),
            ));
        }
        if lanes > MAX_LANES {
            return Err(EngineError::Input(format!(
                "{lanes} lanes are more than the {MAX_LANES} a session takes"
            )));
        }
        if capacity > c.max_position_embeddings {
            return Err(EngineError::Input(format!(
                "capacity {capacity} exceeds max_position_embeddings {}",
                c.max_position_embeddings
            )));
        }
        let gpu = &engine.gpu;
        let cache_width = drama_graph::drama3::kv_cache_width(c.num_key_value_heads, c.head_dim);
        let cache_bytes = [lanes, capacity, cache_width, 4]
            .into_iter()
            .try_fold(1u64, |bytes, n| bytes.checked_mul(n as u64))
            .filter(|&bytes| bytes <= gpu.caps.max_storage_binding)
            .ok_or_else(|| {
                EngineError::Unsupported(format!(
                    "a KV cache of {lanes} lanes x {capacity} positions per layer is above the device's storage-binding limit of {} bytes",
                    gpu.caps.max_storage_binding
                ))
            })?;
        let mut states = HashMap::new();
        for i in 0..c.num_hidden_layers {
            for which in ["k_cache", "v_cache"] {
                let name = format!("layers.{i}.{which}");
                let buffer = gpu.buffer(&name, cache_bytes);
                states.insert(name, buffer);
            }
        }
        let table = rope_table(capacity, c.head_dim, c.rope_theta);
        let rope_table = gpu.buffer_with("rope table", bytemuck::cast_slice(&table));
        let p = c.speech.voice_prefix_len;
        let h = c.hidden_size;
        let default_prefix = engine.checkpoint.float_tensor(drama_checkpoint::names::DEFAULT_PREFIX);
        let prefixes = default_prefix.repeat(lanes);
        debug_assert_eq!(prefixes.len(), lanes * p * h);
        // The voice-prefix table is state the steps bind, written only when a prefix is set.
        states.insert(
            "prefixes".to_string(),
            gpu.buffer_with("prefixes", bytemuck::cast_slice(&prefixes)),
        );
        let moe_kept = engine
            .checkpoint
            .layers
            .iter()
            .map(|layer| match layer {
                LayerMlp::Moe(moe) => Some(moe.kept_expert_ids.clone()),
                LayerMlp::Dense => None,
            })
            .collect();
        Ok(Session {
            engine,
            lanes,
            capacity,
            states,
            rope_table,
            steps: StepCache::new(STEP_CACHE_BYTES),
            prepared: None,
            moe_kept,
            submitted: 0,
            last_of_shape: HashMap::new(),
            unread: HashSet::new(),
            forward_split: Cell::default(),
            sampler: GpuSampler::new(gpu, c.speech.audio_vocab_size, lanes)?,
            staged: None,
            timeline: None,
        })
    }

    /// From now on marks each submission of draws ([`Session::draw`]: the step before them
    /// and the draws, split from what goes behind) with timestamps, for the first
    /// `submissions` of them (see [`SubmissionTimeline`]): `drama bench` measures the GPU's
    /// time between steps with it. Needs timestamp queries.
    pub fn mark_draws(&mut self, submissions: u32) -> Result<(), EngineError> {
        self.timeline = Some(SubmissionTimeline::new(&self.engine.gpu, submissions)?);
        Ok(())
    }

    /// The marked submissions' spans so far, in order (none unless [`Session::mark_draws`]
    /// ran); waits for them to finish.
    pub fn marked_spans(&self) -> Result<Vec<MarkedSpan>, EngineError> {
        match &self.timeline {
            Some(timeline) => Ok(timeline.read(&self.engine.gpu)?),
            None => Ok(Vec::new()),
        }
    }

    /// Sets the voice prefix ([P, H] values) a lane's `Prefix` rows embed.
    pub fn set_prefix(&mut self, lane: usize, prefix: &[f32]) -> Result<(), EngineError> {
        let c = &self.engine.checkpoint.config;
        let size = c.speech.voice_prefix_len * c.hidden_size;
        if lane >= self.lanes || prefix.len() != size {
            return Err(EngineError::Input(format!(
                "prefix for lane {lane}: {} values, expected {size} for one of {} lanes",
                prefix.len(),
                self.lanes
            )));
        }
        // Queued writes land before the next submitted step, prepared commands included.
        self.engine.gpu.queue.write_buffer(
            &self.states["prefixes"],
            (lane * size * 4) as u64,
            bytemuck::cast_slice(prefix),
        );
        Ok(())
    }

    /// Kernel launches of a step of `rows` rows (compiling it if needed): all of them, and
    /// those that wait for the launch before them.
    pub fn dispatch_count(&mut self, rows: usize) -> Result<(usize, usize), EngineError> {
        let exe = self.executable(rows, false)?;
        Ok((exe.dispatch_count(), exe.waiting_dispatch_count()))
    }

    /// The number of launches of the nodes labelled `first` through `last` in a `rows`-row step.
    pub fn dispatch_span(&mut self, rows: usize, first: &str, last: &str) -> Result<usize, EngineError> {
        Ok(self.executable(rows, false)?.dispatch_span(first, last)?.len())
    }

    /// Reads a U32 value (by name) as the last run of the `rows`-row step (or of a span of
    /// it) left it; a buffer later nodes reuse holds what the last of them wrote.
    pub fn read_u32_value(&mut self, rows: usize, name: &str) -> Result<Vec<u32>, EngineError> {
        let gpu = self.engine.gpu.clone();
        let exe = self.executable(rows, false)?;
        let id = exe
            .graph
            .find(name)
            .ok_or_else(|| EngineError::Input(format!("the step has no value {name}")))?;
        exe.read_u32(&gpu, id)
    }

    /// Reruns the launches of the nodes labelled `first` through `last` of the last
    /// `rows`-row step (its buffers as that step left them) and returns their GPU time.
    pub fn timed_span(&mut self, rows: usize, first: &str, last: &str) -> Result<std::time::Duration, EngineError> {
        let gpu = self.engine.gpu.clone();
        self.executable(rows, false)?.timed_run_span(&gpu, first, last)
    }

    /// Sets the bytes of compiled steps kept beyond the one last used (and those whose
    /// logits are not read yet); the least recently used go first. Dropping one frees its
    /// buffers; its shape compiles again when next used.
    pub fn set_step_cache_budget(&mut self, bytes: u64) {
        let dropped = self.steps.set_budget(bytes, |key| self.unread.contains(key));
        self.forget(&dropped);
    }

    /// The compiled steps kept and the bytes of their buffers.
    pub fn step_cache_usage(&self) -> StepCacheUsage {
        StepCacheUsage {
            steps: self.steps.len(),
            bytes: self.steps.bytes(),
        }
    }

    /// Forgets what the session held for dropped compiled steps.
    fn forget(&mut self, dropped: &[StepKey]) {
        for key in dropped {
            self.last_of_shape.remove(key);
            if self.prepared.as_ref().is_some_and(|(prepared, ..)| prepared == key) {
                self.prepared = None;
            }
        }
    }

    /// The shape of this session's steps of `rows` rows.
    fn shape(&self, rows: usize, trace: bool) -> StepShape {
        let gpu = &self.engine.gpu;
        StepShape {
            rows,
            lanes: self.lanes,
            capacity: self.capacity,
            prefix_rows: self.lanes * self.engine.checkpoint.config.speech.voice_prefix_len,
            trace,
            concurrent_launches: gpu.caps.concurrent_launches,
            device_barriers: gpu.caps.device_barriers,
        }
    }

    /// The most rows one step of this session can take (up to [`MAX_STEP_ROWS`]): the
    /// largest count whose buffers fit the device's storage-binding limit. Planned without
    /// allocating; an error where not even one row fits.
    pub fn max_step_rows(&self) -> Result<usize, EngineError> {
        let limit = self.engine.gpu.caps.max_storage_binding;
        let fits = |rows: usize| -> Result<bool, EngineError> {
            let shape = self.shape(rows, false);
            let graph = drama3::build(&self.engine.spec, &CheckpointNames, shape)?;
            Ok(largest_step_buffer(&graph, shape) <= limit)
        };
        if !fits(1)? {
            return Err(EngineError::Unsupported(format!(
                "a step of one row needs more than the device's storage-binding limit of {limit} bytes"
            )));
        }
        // The largest count that fits lies in [low, high).
        let (mut low, mut high) = (1, MAX_STEP_ROWS + 1);
        while high - low > 1 {
            let middle = (low + high) / 2;
            if fits(middle)? {
                low = middle;
            } else {
                high = middle;
            }
        }
        Ok(low)
    }

    fn executable(&mut self, rows: usize, trace: bool) -> Result<&Executable, EngineError> {
        if !self.steps.touch(&(rows, trace)) {
            let shape = self.shape(rows, trace);
            let graph = drama3::build(&self.engine.spec, &CheckpointNames, shape)?;
            let bind = Bindings {
                weights: &self.engine.weights,
                states: &self.states,
                rope_table: &self.rope_table,
            };
            let executable = Executable::compile(&self.engine.gpu, graph, shape, &bind)?;
            let bytes = executable.device_bytes();
            let dropped = self
                .steps
                .insert((rows, trace), executable, bytes, |key| self.unread.contains(key));
            self.forget(&dropped);
        }
        Ok(compiled(&self.steps, (rows, trace)))
    }

    /// Checks rows against the model and the session.
    fn validate(&self, rows: &[Row]) -> Result<(), EngineError> {
        let c = &self.engine.checkpoint.config;
        if rows.is_empty() {
            return Err(EngineError::Input("a step needs at least one row".into()));
        }
        for (i, row) in rows.iter().enumerate() {
            let bad = |what: String| Err(EngineError::Input(format!("row {i}: {what}")));
            if row.lane >= self.lanes {
                return bad(format!("lane {} of {}", row.lane, self.lanes));
            }
            if row.pos >= self.capacity {
                return bad(format!(
                    "position {} beyond the session's capacity {}",
                    row.pos, self.capacity
                ));
            }
            match row.source {
                RowSource::Prefix(p) if p >= c.speech.voice_prefix_len => return bad(format!("prefix row {p}")),
                RowSource::Text(t) if t as usize >= c.text_vocab_size => {
                    return bad(format!(
                        "text token {t} outside the vocabulary of {}",
                        c.text_vocab_size
                    ));
                }
                RowSource::Audio(a) if a as usize >= c.speech.audio_vocab_size => {
                    return bad(format!(
                        "audio token {a} outside the audio vocabulary of {}",
                        c.speech.audio_vocab_size
                    ));
                }
                RowSource::Drawn(d) if d >= self.sampler.capacity() => {
                    return bad(format!("draw {d} of at most {}", self.sampler.capacity()));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Runs one step: embeds the rows, writes their keys/values into their lanes' caches at
    /// their positions, and returns the logits of every row (and, with `trace`, every
    /// layer's hidden states and router choices).
    pub fn step(&mut self, rows: &[Row], trace: bool) -> Result<StepOutput, EngineError> {
        Ok(self.run_step(rows, trace, Timing::None)?.0)
    }

    /// Like [`Session::step`], and returns the GPU time of the step's pass (timestamps at
    /// the pass boundaries where the adapter has them, wall time otherwise).
    pub fn timed_step(&mut self, rows: &[Row]) -> Result<(StepOutput, std::time::Duration), EngineError> {
        let (output, timing) = self.run_step(rows, false, Timing::Pass)?;
        match timing {
            StepTiming::Pass(time) => Ok((output, time)),
            _ => Ok((output, std::time::Duration::ZERO)),
        }
    }

    /// Like [`Session::step`], one dispatch per pass, returning each kernel's GPU time.
    pub fn profiled_step(
        &mut self,
        rows: &[Row],
    ) -> Result<Vec<(drama_kernels::Kernel, std::time::Duration)>, EngineError> {
        match self.run_step(rows, false, Timing::PerDispatch)?.1 {
            StepTiming::Kernels(kernels) => Ok(kernels),
            _ => Ok(Vec::new()),
        }
    }

    /// Submits a step of `rows` without waiting for it: the GPU runs it while the host goes
    /// on (the next step's commands are recorded meanwhile); [`Session::logits`] reads its
    /// result. Work submitted after it runs after it.
    pub fn submit(&mut self, rows: &[Row]) -> Result<SubmittedStep, EngineError> {
        let key = self.prepare_step(rows, &[])?;
        let submission = self.submit_staged(None, None).expect("a step was staged");
        self.unread.insert(key);
        Ok(SubmittedStep {
            key,
            submission,
            serial: self.submitted,
        })
    }

    /// Submits a step of `rows` for the GPU's sampling ([`Session::draw`]): behind it, the
    /// logits of each `(row, kept)` pair are copied to kept row `kept` of the sampler, so a
    /// later step of the same shape may overwrite them. Its logits are not read. The step
    /// goes to the GPU with the draws, in one submission, or before the next step.
    pub fn submit_for_draws(&mut self, rows: &[Row], keep: &[(usize, usize)]) -> Result<(), EngineError> {
        if let Some(&(row, kept)) = keep
            .iter()
            .find(|&&(row, kept)| row >= rows.len() || kept >= self.sampler.capacity())
        {
            return Err(EngineError::Input(format!(
                "row {row} of {} kept as row {kept} of {}",
                rows.len(),
                self.sampler.capacity()
            )));
        }
        self.prepare_step(rows, keep).map(|_| ())
    }

    /// Submits the draws of `draws`, which read the rows kept by the steps submitted before
    /// ([`Session::submit_for_draws`]), with `after` behind them in the same submission;
    /// the steps submitted after read the tokens through [`RowSource::Drawn`], and
    /// [`Session::drawn`] reads them on the host.
    pub fn draw(&mut self, draws: &[Draw], after: Vec<wgpu::CommandBuffer>) -> Result<DrawnTokens, EngineError> {
        if self.staged.is_none() {
            return Err(EngineError::Input("draws need a step submitted for them first".into()));
        }
        let commands = self.sampler.encode(&self.engine.gpu, draws)?;
        let (open, split, close) = match self.timeline.as_mut().and_then(|t| t.marks(&self.engine.gpu)) {
            Some(Marks { open, split, close }) => (Some(open), Some(split), Some(close)),
            None => (None, None, None),
        };
        let after = std::iter::once(commands).chain(split).chain(after).chain(close);
        let submission = self.submit_staged(open, after).expect("a step is staged");
        Ok(self.sampler.submitted(submission, draws.len()))
    }

    /// Runs `draws` alone (as [`Session::draw`] would) and returns their GPU time.
    pub fn timed_draw(&mut self, draws: &[Draw]) -> Result<Duration, EngineError> {
        self.sampler.timed(&self.engine.gpu, draws)
    }

    /// The tokens of submitted draws, in draw order (`None` for a draw with a NaN logit),
    /// once drawn (work submitted after them may still run). Read each before the draws
    /// after the next are submitted.
    pub fn drawn(&mut self, drawn: DrawnTokens) -> Result<Vec<Option<u32>>, EngineError> {
        let start = Instant::now();
        let tokens = self.sampler.read(&self.engine.gpu, drawn);
        self.add_forward_time(ForwardSplit {
            wait: start.elapsed(),
            ..ForwardSplit::default()
        });
        tokens
    }

    /// Stages a step of `rows` with the copies of `keep`'s logit rows behind it (a step
    /// staged before goes to the GPU first); returns its key.
    fn prepare_step(&mut self, rows: &[Row], keep: &[(usize, usize)]) -> Result<StepKey, EngineError> {
        let start = Instant::now();
        let (key, drawn_tokens) = self.write_step_inputs(rows, false)?;
        let gpu = self.engine.gpu.clone();
        let exe = compiled(&self.steps, key);
        let commands = match self.prepared.take() {
            Some((prepared, launches, commands)) if prepared == key && launches == exe.launch_set() => commands,
            _ => exe.encode(&gpu),
        };
        let row_bytes = (self.engine.checkpoint.config.speech.audio_vocab_size * 4) as u64;
        let kept =
            (!keep.is_empty()).then(|| copy_runs(&gpu, keep, exe.logits_buffer(), self.sampler.kept(), row_bytes));
        let staged = drawn_tokens.into_iter().chain([commands]).chain(kept).collect();
        self.staged = Some((key, staged));
        self.add_forward_time(ForwardSplit {
            inputs: start.elapsed(),
            ..ForwardSplit::default()
        });
        self.submitted += 1;
        self.last_of_shape.insert(key, self.submitted);
        Ok(key)
    }

    /// Submits the staged step with `before` ahead of it and `after` behind it in one
    /// submission, then records the next step of its shape while the GPU runs it; `None`
    /// when nothing was staged.
    fn submit_staged(
        &mut self,
        before: Option<wgpu::CommandBuffer>,
        after: impl IntoIterator<Item = wgpu::CommandBuffer>,
    ) -> Option<wgpu::SubmissionIndex> {
        let (key, staged) = self.staged.take()?;
        let gpu = self.engine.gpu.clone();
        let start = Instant::now();
        let submission = gpu.submit_commands(before.into_iter().chain(staged).chain(after));
        let submitted = Instant::now();
        let exe = compiled(&self.steps, key);
        self.prepared = Some((key, exe.launch_set(), exe.encode(&gpu)));
        self.add_forward_time(ForwardSplit {
            submit: submitted - start,
            record: submitted.elapsed(),
            ..ForwardSplit::default()
        });
        Some(submission)
    }

    /// The logits of every row of a submitted step, [rows, C + 2], once it has finished
    /// (work submitted after it may still run). Read each step before submitting another
    /// of the same shape: they share a readback buffer (reading an older one is an error).
    pub fn logits(&mut self, step: SubmittedStep) -> Result<Vec<f32>, EngineError> {
        if self.last_of_shape.get(&step.key) != Some(&step.serial) {
            return Err(EngineError::Input(format!(
                "a later step of {} rows was submitted before this one's logits were read",
                step.key.0
            )));
        }
        self.unread.remove(&step.key);
        let start = Instant::now();
        let logits = compiled(&self.steps, step.key).read_encoded_logits(&self.engine.gpu, step.submission);
        self.add_forward_time(ForwardSplit {
            wait: start.elapsed(),
            ..ForwardSplit::default()
        });
        logits
    }

    /// The host time of the forwards since the last call, and starts counting anew.
    pub fn take_forward_split(&self) -> ForwardSplit {
        self.forward_split.take()
    }

    fn add_forward_time(&self, time: ForwardSplit) {
        let mut total = self.forward_split.get();
        total += time;
        self.forward_split.set(total);
    }

    /// Checks `rows`, compiles their step shape if needed and writes the step's inputs (a
    /// staged step goes to the GPU first, so its inputs are not overwritten); returns the
    /// shape's key and, for [`RowSource::Drawn`] rows, the commands that copy their tokens
    /// in, to submit before the step.
    fn write_step_inputs(
        &mut self,
        rows: &[Row],
        trace: bool,
    ) -> Result<(StepKey, Option<wgpu::CommandBuffer>), EngineError> {
        self.validate(rows)?;
        self.submit_staged(None, None);
        let p = self.engine.checkpoint.config.speech.voice_prefix_len;
        let mut table = Vec::with_capacity(rows.len());
        let mut index = Vec::with_capacity(rows.len());
        // (draw, row): the rows whose token the GPU copies in from the last draws.
        let mut drawn = Vec::new();
        for (r, row) in rows.iter().enumerate() {
            let (source, i) = match row.source {
                RowSource::Prefix(p_row) => (row_source::PREFIX, (row.lane * p + p_row) as u32),
                RowSource::Text(t) => (row_source::TEXT, t),
                RowSource::Audio(a) => (row_source::AUDIO, a),
                RowSource::Drawn(d) => {
                    drawn.push((d, r));
                    // No id: the host writing the same words next time must not skip a
                    // row the copy below overwrote.
                    (row_source::AUDIO, DRAWN_PLACEHOLDER)
                }
            };
            table.push(source);
            index.push(i);
        }
        let lanes: Vec<u32> = rows.iter().map(|r| r.lane as u32).collect();
        let positions: Vec<u32> = rows.iter().map(|r| r.pos as u32).collect();
        let key = (rows.len(), trace);
        let engine = self.engine;
        self.executable(rows.len(), trace)?;
        let exe = compiled(&self.steps, key);
        exe.write_inputs(&engine.gpu, [&table, &index, &lanes, &positions])?;
        // The copies run after the written inputs land (queued writes precede a submission)
        // and before the step.
        let copies = (!drawn.is_empty())
            .then(|| copy_runs(&engine.gpu, &drawn, self.sampler.tokens(), exe.row_index_buffer(), 4));
        Ok((key, copies))
    }

    fn run_step(&mut self, rows: &[Row], trace: bool, timing: Timing) -> Result<(StepOutput, StepTiming), EngineError> {
        let key = match timing {
            Timing::None if !trace => {
                let step = self.submit(rows)?;
                let logits = self.logits(step)?;
                let output = StepOutput {
                    logits,
                    hidden: Vec::new(),
                    routes: Vec::new(),
                };
                return Ok((output, StepTiming::None));
            }
            _ => {
                let (key, drawn_tokens) = self.write_step_inputs(rows, trace)?;
                if let Some(copies) = drawn_tokens {
                    self.engine.gpu.submit_commands([copies]);
                }
                key
            }
        };
        let gpu = self.engine.gpu.clone();
        let exe = compiled(&self.steps, key);
        let (time, logits) = match timing {
            Timing::None => {
                let submission = gpu.submit_commands([exe.encode(&gpu)]);
                (StepTiming::None, exe.read_encoded_logits(&gpu, submission)?)
            }
            Timing::Pass => (StepTiming::Pass(exe.timed_run(&gpu)?), exe.read_logits(&gpu)?),
            Timing::PerDispatch => (StepTiming::Kernels(exe.profile_run(&gpu)?), exe.read_logits(&gpu)?),
        };
        let find = |name: &str| {
            exe.graph
                .find(name)
                .ok_or_else(|| EngineError::Unsupported(format!("the step graph has no value {name}")))
        };
        let mut hidden = Vec::new();
        let mut routes = Vec::new();
        if trace {
            for (i, kept) in self.moe_kept.iter().enumerate() {
                hidden.push(exe.read_f32(&gpu, find(&format!("layers.{i}.hidden"))?)?);
                routes.push(match kept {
                    None => None,
                    Some(kept) => {
                        let local = exe.read_u32(&gpu, find(&format!("layers.{i}.router"))?)?;
                        let weights = exe.read_f32(&gpu, find(&format!("layers.{i}.router.1"))?)?;
                        // A local id past the kept list would be a broken kernel or device: an
                        // error naming it, not a panic.
                        let ids = local
                            .iter()
                            .map(|&l| {
                                kept.get(l as usize).map(|&id| id as u32).ok_or_else(|| {
                                    GpuError::Readback(format!(
                                        "layer {i}: routing chose local expert {l}, past the {} kept",
                                        kept.len()
                                    ))
                                })
                            })
                            .collect::<Result<_, _>>()?;
                        Some((ids, weights))
                    }
                });
            }
        }
        Ok((StepOutput { logits, hidden, routes }, time))
    }
}
