//! The benchmark suite behind `drama bench`: the read-bandwidth roofline, linear kernels at
//! the model's matrix sizes, whole decode steps (1, 2, 4 and 8 lanes by default, any lane
//! counts and contexts on request), a prefill, and end-to-end synthesis, each set against its floor (bytes / roofline).
//!
//! GPU times come from timestamps at pass boundaries where the adapter has them (wall time
//! otherwise); medians of repeats; linear kernels rotate over weight copies larger than any
//! cache so no repeat is served from cache. The GPU streams for a moment before each timed
//! part (`WARM_UP`), except end-to-end synthesis, which times what a request meets.

use std::time::{Duration, Instant};

use drama_graph::select::expert_width;
use drama_kernels::{BandwidthParams, Kernel, LinearParams, WeightFormat};
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};
use serde::Serialize;

use drama_checkpoint::{LayerMlp, ModelConfig};
use drama_engine::batch::Batcher;
use drama_engine::batch::synthesize;
use drama_engine::codec::{CodecDecoder, CodecWeights};
use drama_engine::error::EngineError;
use drama_engine::exec::{LinearIo, linear_launches};
use drama_engine::gpu::{Capabilities, Dispatch, Gpu, MAX_MARKED_SUBMISSIONS, MarkedSpan};
use drama_engine::sampling::gpu::Draw;
use drama_engine::sampling::{SamplingParams, gamma_fixed};
use drama_engine::session::{Engine, Row, RowSource, Session};
use drama_engine::synth::{CODEC_CHUNK, GuidanceMode, SpeechSettings, SynthesisRequest};
use drama_engine::text::TextFrontEnd;
use drama_engine::weights::GpuLinear;

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct BenchOptions {
    /// Timed repeats per measurement (the median is reported).
    pub repeats: usize,
    /// KV context length of the timed decode steps.
    pub context: usize,
    /// Lanes of the decode steps timed at `context`.
    pub lanes: Vec<usize>,
    /// More contexts at which a guidance pair's decode step is timed (how the step grows
    /// with the context).
    pub more_contexts: Vec<usize>,
    /// More chunk sizes, in codes, at which the codec part times a chunk alone besides
    /// synthesis's own (how a chunk's cost grows with its codes).
    pub more_codec_chunks: Vec<usize>,
    /// Prompt rows of the prefill measurement.
    pub prefill_rows: usize,
    /// Audio tokens of the synthesis measurement.
    pub synthesis_tokens: usize,
    /// Bytes of weight copies each linear measurement rotates over (at least).
    pub rotation_bytes: u64,
    /// The parts to measure besides the roofline and the launch cost, which every run
    /// measures (the other parts' floors are set against them).
    pub parts: Vec<BenchPart>,
}

impl BenchOptions {
    /// Refuses options no run could measure, naming the one at fault, before any work: no
    /// repeats, or decode steps, a prefill or a synthesis whose positions would not fit a
    /// lane of the model `config` describes.
    pub fn check(&self, config: &ModelConfig) -> Result<(), EngineError> {
        let max_positions = config.max_position_embeddings;
        if self.repeats == 0 {
            return Err(EngineError::Input("repeats must be at least 1".into()));
        }
        if self.parts.contains(&BenchPart::Decode) {
            self.decode_capacity(max_positions)?;
        }
        if self.parts.contains(&BenchPart::Prefill) && !(1..=max_positions).contains(&self.prefill_rows) {
            return Err(EngineError::Input(format!(
                "prefill rows {} must be in 1..={max_positions} (the positions a lane holds)",
                self.prefill_rows
            )));
        }
        if self.parts.contains(&BenchPart::Codec) {
            let most = config.speech.max_audio_tokens;
            if let Some(&codes) = self
                .more_codec_chunks
                .iter()
                .find(|&&codes| !(1..=most).contains(&codes))
            {
                return Err(EngineError::Input(format!(
                    "codec chunks of {codes} codes: chunks must hold 1..={most} codes (the most an utterance has)"
                )));
            }
        }
        if self.parts.contains(&BenchPart::TokenLoop) && self.lanes.contains(&0) {
            return Err(EngineError::Input("the token loop needs at least one lane".into()));
        }
        if self.parts.contains(&BenchPart::Synthesis) || self.parts.contains(&BenchPart::TokenLoop) {
            // Positions taken before the first audio token: the voice prefix, the text and
            // audio_bos.
            let before = Batcher::positions_needed(config.speech.voice_prefix_len, SYNTHESIS_TEXT_TOKENS, 0);
            let most = max_positions.saturating_sub(before);
            if !(1..=most).contains(&self.synthesis_tokens) {
                return Err(EngineError::Input(format!(
                    "synthesis tokens {} must be in 1..={most} (with the voice prefix and the text, the positions a lane holds)",
                    self.synthesis_tokens
                )));
            }
        }
        Ok(())
    }

    /// Positions per lane the decode-step sessions hold: the longest context, a step per
    /// repeat, and five more (warm-up, the trace and the profile).
    fn decode_capacity(&self, max_positions: usize) -> Result<usize, EngineError> {
        if self.lanes.contains(&0) {
            return Err(EngineError::Input("decode steps need at least one lane".into()));
        }
        let context = self.more_contexts.iter().copied().fold(self.context, usize::max);
        context
            .checked_add(self.repeats)
            .and_then(|n| n.checked_add(5))
            .filter(|&n| n <= max_positions)
            .ok_or_else(|| {
                EngineError::Input(format!(
                    "decode steps at context {context} with {} repeats need more than the {max_positions} positions a lane holds",
                    self.repeats
                ))
            })
    }
}

/// A part of the suite that a run may leave out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BenchPart {
    /// Linear kernels at the model's matrix sizes.
    Kernels,
    /// Whole decode steps of 1, 2, 4 and 8 lanes.
    Decode,
    /// A prefill of `prefill_rows` rows.
    Prefill,
    /// End-to-end synthesis of `synthesis_tokens` tokens.
    Synthesis,
    /// Synthesis through the batcher at each of `lanes`: the time per token against the
    /// GPU's busy time per token.
    TokenLoop,
    /// One codec chunk alone.
    Codec,
    /// Cutting requests of 1, 10, 100 and 1000 sentences into segments (the host alone).
    Text,
}

impl BenchPart {
    /// Every part, in the order a run measures them.
    pub const ALL: [BenchPart; 7] = [
        BenchPart::Kernels,
        BenchPart::Decode,
        BenchPart::Prefill,
        BenchPart::Synthesis,
        BenchPart::TokenLoop,
        BenchPart::Codec,
        BenchPart::Text,
    ];
}

/// Where the numbers were measured.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// The adapter's capability report.
    pub adapter: Capabilities,
    /// wgpu version the binary was built with.
    pub wgpu: String,
    /// Source commit (with `-dirty` when the binary was built from uncommitted changes).
    pub commit: String,
    /// Checkpoint provenance.
    pub checkpoint: String,
}

/// The measured read-bandwidth ceiling.
#[derive(Debug, Clone, Serialize)]
pub struct Roofline {
    /// Bytes read per run.
    pub bytes: u64,
    /// Workgroups of the fastest grid.
    pub workgroups: u32,
    /// Median GPU milliseconds.
    pub ms: f64,
    /// GB/s (1e9 bytes per second).
    pub gb_per_s: f64,
}

/// What one launch costs on its own: chains of launches that each read 4 KiB with one
/// workgroup, timed as one pass. A decode step's launches each depend on the one before, so
/// `dependent_us` times its launch count is a floor under the step, as its bytes are.
#[derive(Debug, Clone, Serialize)]
pub struct LaunchCost {
    /// Launches per timed chain.
    pub launches: usize,
    /// Median GPU microseconds per launch when each writes what the next one writes (wgpu
    /// puts a barrier before each, as before every launch of a step).
    pub dependent_us: f64,
    /// Median GPU microseconds per launch when each writes a buffer of its own (no
    /// barriers: the launches may overlap).
    pub independent_us: f64,
}

/// Which kernel a linear measurement times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinearKernel {
    /// The dense linear (`linear`), as the model runs its dense weights.
    Dense,
    /// The routed-expert kernel (`gathered`) on one expert, each lane a slot routed to it:
    /// how the model runs its NVFP4 weights in decode steps.
    RoutedExpert,
}

/// One linear-kernel measurement.
#[derive(Debug, Clone, Serialize)]
pub struct KernelResult {
    /// The kernel timed.
    pub kernel: LinearKernel,
    /// Weight format.
    pub format: String,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Activation rows (lanes).
    pub lanes: usize,
    /// Weight bytes (codes and scales) read per launch.
    pub bytes: u64,
    /// Median microseconds per launch.
    pub us: f64,
    /// Achieved GB/s.
    pub gb_per_s: f64,
    /// Achieved / roofline.
    pub fraction_of_roofline: f64,
    /// Median microseconds per launch of the roofline kernel streaming the same weight
    /// copies in the same chain of dependent launches: the ceiling at this size, launch and
    /// ramp costs included.
    pub stream_us: f64,
    /// stream_us / us: how close the kernel comes to streaming its bytes and nothing else.
    pub fraction_of_stream: f64,
    /// Median microseconds per launch when each copy's launch writes an output of its own:
    /// no barriers, so the launches overlap and their ramps and tails hide behind each
    /// other. What the kernel's own work costs per byte, with the launch latency a decode
    /// step pays taken out.
    pub overlapped_us: f64,
    /// Achieved / roofline, launches overlapped.
    pub overlapped_fraction_of_roofline: f64,
    /// The roofline kernel streaming the same copies, each launch writing a sink of its own.
    pub overlapped_stream_us: f64,
}

/// One decode-step measurement.
#[derive(Debug, Clone, Serialize)]
pub struct StepResult {
    /// `single`, `pair` or `lanes-N`.
    pub label: String,
    /// Lanes in the step.
    pub lanes: usize,
    /// KV context at the timed steps.
    pub context: usize,
    /// Kernel launches per step.
    pub dispatches: usize,
    /// Those that wait for the launch before them (the others run beside it).
    pub waiting_dispatches: usize,
    /// Wall milliseconds to compile the step's shape the first time a session meets it
    /// (graph, memory plan, buffers, parameter blocks, bind groups; the pipelines already
    /// built by the prompt's step).
    pub compile_ms: f64,
    /// Median GPU milliseconds of the step's pass.
    pub gpu_ms: f64,
    /// Median wall milliseconds (inputs, pass, logits read back).
    pub wall_ms: f64,
    /// Bytes the step must read: dense weights, the chosen experts, the KV caches.
    pub bytes: u64,
    /// bytes / roofline, in milliseconds.
    pub floor_ms: f64,
    /// gpu_ms / floor_ms.
    pub ratio_to_floor: f64,
    /// waiting_dispatches x the dependent launch cost, in milliseconds: what the launches
    /// cost before any of them reads a byte.
    pub launch_floor_ms: f64,
    /// gpu_ms / (floor_ms + launch_floor_ms).
    pub ratio_to_floors: f64,
    /// The first MoE layer's MoE block alone (none in a model without MoE layers).
    pub moe_layer: Option<MoeLayerResult>,
    /// Where the time goes: each kernel kind's launches and GPU time, one dispatch per pass
    /// (empty without timestamp queries); most time first.
    pub profile: Vec<KernelShare>,
}

/// One MoE layer's block (router logits through the combine), timed alone as one pass on
/// the buffers a decode step left.
#[derive(Debug, Clone, Serialize)]
pub struct MoeLayerResult {
    /// Decoder layer.
    pub layer: usize,
    /// Kernel launches of the block.
    pub dispatches: usize,
    /// Median GPU microseconds.
    pub gpu_us: f64,
    /// Bytes it must read: the router, the shared expert and the chosen experts.
    pub bytes: u64,
    /// bytes / roofline, in microseconds.
    pub floor_us: f64,
    /// gpu_us / floor_us.
    pub ratio_to_floor: f64,
}

/// One kernel kind's share of a profiled step.
#[derive(Debug, Clone, Serialize)]
pub struct KernelShare {
    /// Kernel (entry point and format).
    pub kernel: String,
    /// Launches in the step.
    pub launches: usize,
    /// Their summed GPU microseconds.
    pub total_us: f64,
}

/// The prefill measurement.
#[derive(Debug, Clone, Serialize)]
pub struct PrefillResult {
    /// Prompt rows.
    pub rows: usize,
    /// GPU milliseconds.
    pub gpu_ms: f64,
    /// Rows per second.
    pub rows_per_s: f64,
    /// Launches and GPU time per kernel kind of one profiled prefill (one launch per pass;
    /// empty without timestamps).
    pub profile: Vec<KernelShare>,
}

/// The end-to-end synthesis measurement.
#[derive(Debug, Clone, Serialize)]
pub struct SynthesisResult {
    /// Audio tokens generated.
    pub tokens: usize,
    /// Seconds of audio.
    pub audio_s: f64,
    /// Wall seconds.
    pub wall_s: f64,
    /// wall / audio.
    pub real_time_factor: f64,
    /// Seconds to the first audio.
    pub first_audio_s: f64,
    /// Tokens per second.
    pub tokens_per_s: f64,
    /// Seconds in batched steps (from submitting one until the tokens of the one before are
    /// on the host).
    pub forward_s: f64,
    /// Of them: checking each step's rows and writing its inputs (the GPU has nothing to
    /// run meanwhile).
    pub inputs_s: f64,
    /// Of them: submitting the recorded steps (nor here).
    pub submit_s: f64,
    /// Of them: recording each next step's commands (while the GPU runs the current one).
    pub record_s: f64,
    /// Of them: waiting for the drawn tokens and reading them back.
    pub wait_s: f64,
    /// Seconds in codec chunks (submit until the PCM is on the host).
    pub codec_s: f64,
    /// Codec chunks submitted in parts behind the steps (the others ran whole).
    pub codec_chunks_in_parts: usize,
}

/// Synthesis through the batcher with `lanes` lanes busy (guided pairs, and an unguided
/// job for an odd lane), set against what the GPU has to do per token.
#[derive(Debug, Clone, Serialize)]
pub struct TokenLoopResult {
    /// Lanes in use.
    pub lanes: usize,
    /// Jobs running side by side.
    pub jobs: usize,
    /// Steps timed: from the third (the first two hold the prompts and their first tokens)
    /// to the last before a job ended.
    pub steps: usize,
    /// Median wall milliseconds per step of the timed ones: a token of every job.
    pub token_ms: f64,
    /// GPU milliseconds of one decode step of `lanes` rows at the timed steps' middle
    /// position (timestamps at the pass boundaries, median of the repeats).
    pub step_gpu_ms: f64,
    /// GPU milliseconds of the step's draws (the guidance mix and the sampling), alone.
    pub draw_gpu_ms: f64,
    /// GPU milliseconds of codec work per step: a chunk's time alone, times the jobs, over
    /// the codes of a chunk.
    pub codec_gpu_ms: f64,
    /// What the GPU is busy with per token: the step, its draws and its codec share.
    pub busy_ms: f64,
    /// `token_ms / busy_ms`: 1 means the GPU never waits for the host.
    pub token_over_busy: f64,
    /// What the timed steps' submissions took in the loop itself, from timestamps that
    /// open and close each (none where the adapter has no timestamps).
    pub in_loop: Option<InLoopTimes>,
}

/// A token loop's step submissions on the GPU's clock (see
/// `drama_engine::gpu::SubmissionTimeline`), medians over the timed steps.
#[derive(Debug, Clone, Serialize)]
pub struct InLoopTimes {
    /// Milliseconds from a step submission's opening mark to its closing one: the step,
    /// its draws and the codec work that rides with it, as they run in the loop.
    pub span_ms: f64,
    /// The part of `span_ms` the step and its draws take (to the splitting mark).
    pub step_ms: f64,
    /// The part of `span_ms` the codec work behind the draws takes.
    pub codec_ms: f64,
    /// Milliseconds from the closing mark of the step before to a step's opening mark: the
    /// GPU between two steps' work.
    pub gap_ms: f64,
}

/// One codec chunk (the codes a synthesis decodes at a time), timed alone.
#[derive(Debug, Clone, Serialize)]
pub struct CodecResult {
    /// Codes in the chunk.
    pub codes: usize,
    /// PCM samples they decode to.
    pub samples: usize,
    /// Kernel launches of the chunk.
    pub dispatches: usize,
    /// Median GPU milliseconds of the chunk's pass.
    pub gpu_ms: f64,
    /// Each kernel kind's launches and GPU time, one dispatch per pass (empty without
    /// timestamp queries); most time first.
    pub profile: Vec<KernelShare>,
}

/// Everything `drama bench` writes: the parts a run left out are absent.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// Where it ran.
    pub machine: Machine,
    /// Settings.
    pub options: BenchOptions,
    /// The ceiling.
    pub roofline: Roofline,
    /// What a launch costs on its own.
    pub launch: LaunchCost,
    /// Linear kernels at the model's sizes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernels: Option<Vec<KernelResult>>,
    /// Decode steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode: Option<Vec<StepResult>>,
    /// Prefill.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill: Option<PrefillResult>,
    /// Synthesis.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub synthesis: Option<SynthesisResult>,
    /// The token loop at each lane count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_loop: Option<Vec<TokenLoopResult>>,
    /// The codec alone, a chunk of the size synthesis decodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub codec: Option<CodecResult>,
    /// The codec alone, a chunk of each of `more_codec_chunks`' sizes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub more_codec_chunks: Option<Vec<CodecResult>>,
    /// Segmenting requests' text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<Vec<TextResult>>,
}

/// Cutting one request's text into segments.
#[derive(Debug, Clone, Serialize)]
pub struct TextResult {
    /// Sentences in the text.
    pub sentences: usize,
    /// Its characters.
    pub characters: usize,
    /// Segments it is cut into (beside the checkpoint's default cap on audio tokens).
    pub segments: usize,
    /// The fastest of the repeats, ms.
    pub ms: f64,
    /// The fastest of the repeats to cut what the service cuts before a request's first
    /// step (the first segment alone when text follows it; the rest is cut while it is
    /// spoken), ms.
    pub first_ms: f64,
}

/// The text of a request of `sentences` sentences (`bench/ttfa.py`'s).
pub fn bench_text(sentences: usize) -> String {
    (0..sentences)
        .map(|i| format!("Sentence number {i} of this request says a few plain words about the weather."))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Segments texts of 1, 10, 100 and 1000 sentences with the checkpoint's tokenizer, whole
/// (as `drama synth` does before its first step) and as the service does before it
/// ([`SynthesisRequest::opening`]: the first segment alone when text follows it); the
/// fastest of `options.repeats` each.
pub fn text(engine: &Engine, options: &BenchOptions) -> Result<Vec<TextResult>, EngineError> {
    let front = TextFrontEnd::new(&engine.checkpoint);
    let max_audio_tokens = engine.checkpoint.config.speech.max_audio_tokens;
    let settings = SpeechSettings {
        prefix: None,
        gamma: 1.0,
        guidance: GuidanceMode::Paired,
        sampling: SamplingParams::unfiltered(0),
        max_audio_tokens,
    };
    let mut results = Vec::new();
    for sentences in [1, 10, 100, 1000] {
        let text = bench_text(sentences);
        let (whole_ms, segments) = fastest_of(options.repeats, || {
            Ok(front.segments_for(&text, max_audio_tokens)?.len())
        })?;
        let (first_ms, _) = fastest_of(options.repeats, || {
            Ok(SynthesisRequest::opening(&front, &text, settings.clone())?
                .0
                .segments
                .len())
        })?;
        results.push(TextResult {
            sentences,
            characters: text.len(),
            segments,
            ms: whole_ms,
            first_ms,
        });
    }
    Ok(results)
}

/// The fastest of `repeats` runs of `cut`, ms, and what the last returned.
fn fastest_of(
    repeats: usize,
    mut cut: impl FnMut() -> Result<usize, EngineError>,
) -> Result<(f64, usize), EngineError> {
    let (mut fastest, mut value) = (Duration::MAX, 0);
    for _ in 0..repeats {
        let start = Instant::now();
        value = cut()?;
        fastest = fastest.min(start.elapsed());
    }
    Ok((ms(fastest), value))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The median in milliseconds of `repeats` runs of `run` (each returning its time), after
/// one untimed run that pays first-use costs.
fn median_ms(repeats: usize, mut run: impl FnMut() -> Result<Duration, EngineError>) -> Result<f64, EngineError> {
    run()?;
    let times: Vec<f64> = (0..repeats).map(|_| run().map(ms)).collect::<Result<_, _>>()?;
    Ok(median(times))
}

/// The roofline kernel reading all of `data` with `groups` workgroups of 256 invocations
/// (grid-stride), writing `sink`.
fn read_dispatch(gpu: &Gpu, data: &wgpu::Buffer, sink: &wgpu::Buffer, groups: u32) -> Result<Dispatch, EngineError> {
    let params = BandwidthParams {
        words: (data.size() / 16) as u32,
        stride: groups * 256,
        pad: [0; 2],
    };
    Ok(gpu.dispatch(Kernel::ReadBandwidth, &params, &[data, sink], [groups, 1, 1])?)
}

/// Workgroup counts (of 256 invocations) the roofline tries; the fastest is the ceiling.
const ROOFLINE_GRIDS: [u32; 5] = [1024, 2048, 4096, 8192, 65535];

/// How long the GPU streams before each measured part: after host-side setup (weight copies
/// generated and uploaded, a session built) a GPU's clock may have fallen far below its
/// working clock, and short measurements would run there (seen with nvidia-smi; see the
/// experiment log at the `lab-notebook` tag).
const WARM_UP: Duration = Duration::from_millis(200);

/// Bytes the warm-up streams per launch.
const WARM_UP_BYTES: u64 = 64 << 20;

/// Keeps the GPU streaming for `duration`, four launches per submit, so that what is
/// measured next runs at working clocks, not at the idle clocks left by host-side work.
fn warm_up(gpu: &Gpu, duration: Duration) -> Result<(), EngineError> {
    let data = gpu.buffer(
        "warm-up data",
        WARM_UP_BYTES.min(gpu.caps.max_storage_binding) / 16 * 16,
    );
    let groups = ROOFLINE_GRIDS[0];
    let sink = gpu.buffer("warm-up sink", u64::from(groups) * 256 * 4);
    let launches = (0..4)
        .map(|_| read_dispatch(gpu, &data, &sink, groups))
        .collect::<Result<Vec<_>, _>>()?;
    let start = std::time::Instant::now();
    while start.elapsed() < duration {
        gpu.timed_submit(&launches)?;
    }
    Ok(())
}

/// Measures the read bandwidth over a buffer as large as one binding allows (up to 1 GiB),
/// with several grid sizes; the fastest is reported.
pub fn roofline(gpu: &Gpu, repeats: usize) -> Result<Roofline, EngineError> {
    let bytes = gpu.caps.max_storage_binding.min(1 << 30) / 16 * 16;
    let data = gpu.buffer("roofline data", bytes);
    warm_up(gpu, Duration::from_secs(1))?;
    let mut best: Option<Roofline> = None;
    for groups in ROOFLINE_GRIDS {
        let sink = gpu.buffer("roofline sink", u64::from(groups) * 256 * 4);
        let launch = read_dispatch(gpu, &data, &sink, groups)?;
        let t = median_ms(repeats, || Ok(gpu.timed_submit(std::slice::from_ref(&launch))?))?;
        let measured = Roofline {
            bytes,
            workgroups: groups,
            ms: t,
            gb_per_s: bytes as f64 / (t * 1e-3) / 1e9,
        };
        if best.as_ref().is_none_or(|b| measured.gb_per_s > b.gb_per_s) {
            best = Some(measured);
        }
    }
    Ok(best.expect("at least one grid"))
}

/// Launches per chain of [`launch_cost`].
const LAUNCH_CHAIN: usize = 256;

/// Times chains of LAUNCH_CHAIN one-workgroup launches reading 4 KiB: writing one shared
/// buffer (dependent) and each its own (independent).
pub fn launch_cost(gpu: &Gpu, repeats: usize) -> Result<LaunchCost, EngineError> {
    let data = gpu.buffer("launch data", 4096);
    let shared_sink = gpu.buffer("launch sink", 256 * 4);
    let own_sinks: Vec<wgpu::Buffer> = (0..LAUNCH_CHAIN).map(|_| gpu.buffer("launch sink", 256 * 4)).collect();
    let dependent = (0..LAUNCH_CHAIN)
        .map(|_| read_dispatch(gpu, &data, &shared_sink, 1))
        .collect::<Result<Vec<_>, _>>()?;
    let independent = own_sinks
        .iter()
        .map(|sink| read_dispatch(gpu, &data, sink, 1))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(LaunchCost {
        launches: LAUNCH_CHAIN,
        dependent_us: per_launch_us(gpu, &dependent, repeats)?,
        independent_us: per_launch_us(gpu, &independent, repeats)?,
    })
}

/// Random stored weights of one format: (codes, scales) bytes.
fn random_weights(rng: &mut ChaCha8Rng, format: WeightFormat, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let mut bytes = |n: usize| (0..n).map(|_| rng.next_u32() as u8).collect::<Vec<u8>>();
    match format {
        WeightFormat::Bf16 => {
            // Random finite BF16: clear the top exponent bit of every high byte.
            let mut codes = bytes(rows * cols * 2);
            for pair in codes.chunks_exact_mut(2) {
                pair[1] &= 0xBF;
            }
            (codes, vec![0; 4])
        }
        WeightFormat::Nvfp4 => {
            let codes = bytes(rows * cols / 2);
            let scales = bytes(rows * cols / 16).into_iter().map(|b| 0x20 + b % 0x40).collect();
            (codes, scales)
        }
        WeightFormat::Fp8Block => {
            let codes = bytes(rows * cols).into_iter().map(|b| b & 0x77).collect();
            let tiles = rows.div_ceil(128) * cols.div_ceil(128);
            (codes, bytemuck::cast_slice(&vec![0.01f32; tiles]).to_vec())
        }
    }
}

/// A linear measurement's kernel, weight format and size.
#[derive(Debug, Clone, Copy)]
pub struct KernelCase {
    /// The kernel timed.
    pub kernel: LinearKernel,
    /// Weight format.
    pub format: WeightFormat,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
}

/// One linear kernel over rotating weight copies.
pub fn linear_kernel(
    gpu: &Gpu,
    case: KernelCase,
    lanes: usize,
    options: &BenchOptions,
    roofline: &Roofline,
) -> Result<KernelResult, EngineError> {
    let KernelCase {
        kernel,
        format,
        rows,
        cols,
    } = case;
    let mut rng = ChaCha8Rng::seed_from_u64((rows * 31 + cols) as u64);
    let (codes, scales) = random_weights(&mut rng, format, rows, cols);
    let per_copy = (codes.len() + scales.len()) as u64;
    let copies = (options.rotation_bytes.div_ceil(per_copy) as usize).clamp(2, 256);
    let x: Vec<f32> = (0..lanes * cols).map(|i| ((i % 7) as f32 - 3.0) * 0.125).collect();
    let xb = gpu.buffer_with("x", bytemuck::cast_slice(&x));
    let y = gpu.buffer("y", (lanes * rows * 4) as u64);
    let placeholder = gpu.buffer("placeholder", 4);
    let launch = |linear: &GpuLinear, y: &wgpu::Buffer| -> Result<Vec<Dispatch>, EngineError> {
        match kernel {
            LinearKernel::Dense => {
                linear_launches(gpu, linear, &placeholder, &LinearIo::plain(&xb, y, lanes, rows, true))
            }
            LinearKernel::RoutedExpert => Ok(vec![routed_expert_launch(gpu, linear, &placeholder, &xb, y, lanes)?]),
        }
    };
    let mut launches: Vec<Dispatch> = Vec::new();
    let mut streams: Vec<Dispatch> = Vec::new();
    let sink = gpu.buffer("stream sink", u64::from(STREAM_GROUPS) * 256 * 4);
    let mut overlapped: Vec<Dispatch> = Vec::new();
    let mut overlapped_streams: Vec<Dispatch> = Vec::new();
    for _ in 0..copies {
        // The stream reads a copy of all the bytes the kernel reads: codes and scales.
        let all = gpu.buffer_with("w+scales", &[codes.as_slice(), scales.as_slice()].concat());
        streams.push(stream_dispatch(gpu, &all, &sink)?);
        overlapped_streams.push(stream_dispatch(gpu, &all, &gpu.buffer("own stream sink", sink.size()))?);
        // The launch the engine makes for a linear of this format and size.
        let linear = GpuLinear::one_segment(gpu, format, (rows, cols), &codes, &scales);
        launches.extend(launch(&linear, &y)?);
        overlapped.extend(launch(&linear, &gpu.buffer("own y", y.size()))?);
    }
    warm_up(gpu, WARM_UP)?;
    let us = per_launch_us(gpu, &launches, options.repeats)?;
    let stream_us = per_launch_us(gpu, &streams, options.repeats)?;
    let overlapped_us = per_launch_us(gpu, &overlapped, options.repeats)?;
    let overlapped_stream_us = per_launch_us(gpu, &overlapped_streams, options.repeats)?;
    let gb_per_s = per_copy as f64 / (us * 1e-6) / 1e9;
    Ok(KernelResult {
        kernel,
        format: format!("{format:?}"),
        rows,
        cols,
        lanes,
        bytes: per_copy,
        us,
        gb_per_s,
        fraction_of_roofline: gb_per_s / roofline.gb_per_s,
        stream_us,
        fraction_of_stream: stream_us / us,
        overlapped_us,
        overlapped_fraction_of_roofline: per_copy as f64 / (overlapped_us * 1e-6) / 1e9 / roofline.gb_per_s,
        overlapped_stream_us,
    })
}

/// The `gathered` launch a decode step of `lanes` rows makes for `linear`'s one segment as
/// its one expert (tensor scale 1), every slot routed to it, slot s reading input row s and
/// writing row s of `y`, rounded to BF16.
fn routed_expert_launch(
    gpu: &Gpu,
    linear: &GpuLinear,
    placeholder: &wgpu::Buffer,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    lanes: usize,
) -> Result<Dispatch, EngineError> {
    let segment = &linear.segments[0];
    let expert_ids = gpu.buffer_with("expert ids", bytemuck::cast_slice(&vec![0u32; lanes]));
    let expert_scales = gpu.buffer_with("expert scales", bytemuck::cast_slice(&[1.0f32]));
    let width = expert_width(lanes);
    let params = LinearParams {
        rows: lanes as u32,
        in_features: linear.in_features as u32,
        out_features: linear.out as u32,
        y_stride: linear.out as u32,
        x_row_div: 1,
        expert_begin: 0,
        expert_end: 1,
        flags: drama_kernels::flags::linear::ROUND,
        tensor_scale: 1.0,
        ..Default::default()
    };
    let mut resources = vec![x, &segment.codes];
    if linear.format != WeightFormat::Bf16 {
        resources.push(&segment.scales);
    }
    resources.extend([placeholder, &expert_ids, y, &expert_scales, x]);
    let grid = [
        (linear.out as u32).div_ceil(linear.format.gathered_rows_per_workgroup(width)),
        lanes as u32,
        1,
    ];
    Ok(gpu.dispatch(Kernel::Gathered(linear.format, width), &params, &resources, grid)?)
}

/// Most workgroups (of 256 invocations) a size-matched stream launches: the grid at which
/// the roofline measured fastest on the bench's GPU.
const STREAM_GROUPS: u32 = 2048;

/// The roofline kernel reading all of `data` once (about four 16-byte loads per invocation,
/// at most STREAM_GROUPS workgroups), writing `sink`.
fn stream_dispatch(gpu: &Gpu, data: &wgpu::Buffer, sink: &wgpu::Buffer) -> Result<Dispatch, EngineError> {
    let groups = ((data.size() / 16) as u32).div_ceil(4 * 256).clamp(1, STREAM_GROUPS);
    read_dispatch(gpu, data, sink, groups)
}

/// Median microseconds per launch of `launches` run back to back in one pass.
fn per_launch_us(gpu: &Gpu, launches: &[Dispatch], repeats: usize) -> Result<f64, EngineError> {
    let total_ms = median_ms(repeats, || Ok(gpu.timed_submit(launches)?))?;
    Ok(total_ms * 1e3 / launches.len() as f64)
}

/// Bytes of every dense weight (read in full by every step).
fn dense_bytes(engine: &Engine) -> u64 {
    engine
        .weights
        .linears
        .values()
        .map(|l| {
            l.segments.iter().map(|s| s.codes.size() + s.scales.size()).sum::<u64>()
                + l.bias.as_ref().map_or(0, |b| b.size())
        })
        .sum()
}

/// Bytes of one expert of each projection of a layer.
fn expert_bytes(engine: &Engine, layer: usize) -> u64 {
    engine
        .weights
        .experts
        .iter()
        .filter(|((l, _), _)| *l == layer)
        .map(|(_, linear)| {
            let experts: usize = linear.segments.iter().map(|s| s.range.len()).sum();
            let total: u64 = linear.segments.iter().map(|s| s.codes.size() + s.scales.size()).sum();
            total / experts as u64
        })
        .sum()
}

/// A token of guidance pair `pair` (lanes 2 pair and 2 pair + 1) derived from `token`: the
/// pairs step through the codes by a prime (by one where the codes are a multiple of it),
/// so each reads its own text while there are fewer pairs than codes; both lanes of a pair
/// read the same one.
fn pair_token(token: u32, pair: usize, codes: u32) -> u32 {
    const STEP: u64 = 7919;
    let codes = u64::from(codes);
    let step = if codes.is_multiple_of(STEP) { 1 } else { STEP };
    ((u64::from(token) + pair as u64 * step) % codes) as u32
}

/// One decode row per lane at `pos`, each guidance pair's token derived from `token`.
fn decode_rows(lanes: usize, pos: usize, token: u32, codes: u32) -> Vec<Row> {
    (0..lanes)
        .map(|lane| Row {
            source: RowSource::Audio(pair_token(token, lane / 2, codes)),
            lane,
            pos,
        })
        .collect()
}

/// A session of `lanes` lanes of `capacity` positions, each holding `context` of them: an
/// odd lane holds the null prefix (the uncond lane of a guidance pair) and every pair has
/// codes of its own.
fn prefilled_session<'e>(
    engine: &'e Engine,
    lanes: usize,
    context: usize,
    capacity: usize,
) -> Result<Session<'e>, EngineError> {
    let c = &engine.checkpoint.config;
    let mut session = Session::new(engine, lanes, capacity)?;
    let null = engine.checkpoint.float_tensor(drama_checkpoint::names::NULL_PREFIX);
    for lane in (1..lanes).step_by(2) {
        session.set_prefix(lane, &null)?;
    }
    let codes = c.speech.audio_codes as u32;
    let prompt: Vec<Row> = (0..lanes)
        .flat_map(|lane| {
            (0..context).map(move |pos| Row {
                source: if pos < c.speech.voice_prefix_len {
                    RowSource::Prefix(pos)
                } else {
                    RowSource::Audio(pair_token((pos as u32 * 7919) % codes, lane / 2, codes))
                },
                lane,
                pos,
            })
        })
        .collect();
    // In forwards the device's binding limit allows, as the batcher runs a long prompt.
    for rows in prompt.chunks(session.max_step_rows()?) {
        session.step(rows, false)?;
    }
    Ok(session)
}

/// Decode steps of `lanes` lanes at `options.context` positions of history. The lanes are
/// guidance pairs as a served request runs them: an odd lane holds the null prefix and its
/// pair's text, and every pair has a text of its own (so eight lanes are four requests,
/// whose routes differ as served requests' do).
pub fn decode_step(
    engine: &Engine,
    label: &str,
    lanes: usize,
    options: &BenchOptions,
    roofline: &Roofline,
    launch: &LaunchCost,
) -> Result<StepResult, EngineError> {
    let c = &engine.checkpoint.config;
    let capacity = options.decode_capacity(c.max_position_embeddings)?;
    let steps = options.repeats + 3;
    let codes = c.speech.audio_codes as u32;
    let mut session = prefilled_session(engine, lanes, options.context, capacity)?;
    let compile_start = std::time::Instant::now();
    let (dispatches, waiting_dispatches) = session.dispatch_count(lanes)?;
    let compile_ms = ms(compile_start.elapsed());
    let mut gpu_times = Vec::new();
    let mut wall_times = Vec::new();
    warm_up(&engine.gpu, WARM_UP)?;
    for i in 0..steps {
        let rows = decode_rows(lanes, options.context + i, (i as u32 * 104_729) % codes, codes);
        let start = std::time::Instant::now();
        let (_, gpu) = session.timed_step(&rows)?;
        if i >= 3 {
            gpu_times.push(ms(gpu));
            wall_times.push(ms(start.elapsed()));
        }
    }
    // Experts actually chosen: one traced step at the next position.
    let traced = session.step(&decode_rows(lanes, options.context + steps, 17 % codes, codes), true)?;
    let moe_layer = moe_layer(engine, &mut session, lanes, options, roofline)?;
    let profile = if engine.gpu.caps.timestamps {
        kernel_shares(session.profiled_step(&decode_rows(lanes, options.context + steps + 1, 29 % codes, codes))?)
    } else {
        Vec::new()
    };
    let mut bytes = dense_bytes(engine);
    for (layer, route) in traced.routes.iter().enumerate() {
        if let Some((ids, _)) = route {
            let mut unique = ids.clone();
            unique.sort_unstable();
            unique.dedup();
            bytes += unique.len() as u64 * expert_bytes(engine, layer);
        }
    }
    let kv_width = drama_graph::drama3::kv_cache_width(c.num_key_value_heads, c.head_dim) as u64;
    bytes += lanes as u64 * options.context as u64 * kv_width * 4 * 2 * c.num_hidden_layers as u64;
    let gpu_ms = median(gpu_times);
    let floor_ms = bytes as f64 / (roofline.gb_per_s * 1e9) * 1e3;
    let launch_floor_ms = waiting_dispatches as f64 * launch.dependent_us * 1e-3;
    Ok(StepResult {
        label: label.to_string(),
        lanes,
        context: options.context,
        dispatches,
        waiting_dispatches,
        compile_ms,
        gpu_ms,
        wall_ms: median(wall_times),
        bytes,
        floor_ms,
        ratio_to_floor: gpu_ms / floor_ms,
        launch_floor_ms,
        ratio_to_floors: gpu_ms / (floor_ms + launch_floor_ms),
        moe_layer,
        profile,
    })
}

/// Times the first MoE layer's block of the last `lanes`-row step alone.
fn moe_layer(
    engine: &Engine,
    session: &mut Session<'_>,
    lanes: usize,
    options: &BenchOptions,
    roofline: &Roofline,
) -> Result<Option<MoeLayerResult>, EngineError> {
    let Some(layer) = engine
        .checkpoint
        .layers
        .iter()
        .position(|l| matches!(l, LayerMlp::Moe(_)))
    else {
        return Ok(None);
    };
    // Run the plain step of this shape once more so its buffers hold a decode step's values
    // (the block's inputs are whatever later layers left in reused buffers: realistic
    // activations, and the floor below counts the experts the block chooses on them).
    let codes = engine.checkpoint.config.speech.audio_codes as u32;
    session.step(&decode_rows(lanes, options.context, 3 % codes, codes), false)?;
    let (first, last) = (
        format!("layers.{layer}.router_logits"),
        format!("layers.{layer}.hidden"),
    );
    let dispatches = session.dispatch_span(lanes, &first, &last)?;
    let gpu_us = median_ms(options.repeats, || session.timed_span(lanes, &first, &last))? * 1e3;
    let prefix = format!("model.layers.{layer}.mlp.");
    let mut bytes: u64 = engine
        .weights
        .linears
        .iter()
        .filter(|(name, _)| name.starts_with(&prefix))
        .map(|(_, l)| {
            l.segments.iter().map(|s| s.codes.size() + s.scales.size()).sum::<u64>()
                + l.bias.as_ref().map_or(0, |b| b.size())
        })
        .sum();
    // The experts the block chooses on these inputs: rerun up to the router (its ids are
    // then the last thing written to their buffer) and read them.
    let router = format!("layers.{layer}.router");
    session.timed_span(lanes, &first, &router)?;
    let mut unique = session.read_u32_value(lanes, &router)?;
    unique.sort_unstable();
    unique.dedup();
    bytes += unique.len() as u64 * expert_bytes(engine, layer);
    let floor_us = bytes as f64 / (roofline.gb_per_s * 1e9) * 1e6;
    Ok(Some(MoeLayerResult {
        layer,
        dispatches,
        gpu_us,
        bytes,
        floor_us,
        ratio_to_floor: gpu_us / floor_us,
    }))
}

/// A prefill of `options.prefill_rows` rows on one lane.
pub fn prefill(engine: &Engine, options: &BenchOptions) -> Result<PrefillResult, EngineError> {
    let mut session = Session::new(engine, 1, options.prefill_rows)?;
    let codes = engine.checkpoint.config.speech.audio_codes as u32;
    let rows: Vec<Row> = (0..options.prefill_rows)
        .map(|pos| Row {
            source: RowSource::Audio((pos as u32 * 31) % codes),
            lane: 0,
            pos,
        })
        .collect();
    warm_up(&engine.gpu, WARM_UP)?;
    let gpu_ms = median_ms(options.repeats.min(5), || Ok(session.timed_step(&rows)?.1))?;
    // Rerunning the prompt rewrites the same cache entries.
    let profile = if engine.gpu.caps.timestamps {
        kernel_shares(session.profiled_step(&rows)?)
    } else {
        Vec::new()
    };
    Ok(PrefillResult {
        rows: options.prefill_rows,
        gpu_ms,
        rows_per_s: options.prefill_rows as f64 / (gpu_ms * 1e-3),
        profile,
    })
}

/// Launches and GPU time per kernel kind, most time first.
fn kernel_shares(launches: Vec<(Kernel, Duration)>) -> Vec<KernelShare> {
    let mut shares: Vec<KernelShare> = Vec::new();
    for (kernel, time) in launches {
        let name = format!("{kernel:?}");
        match shares.iter_mut().find(|s| s.kernel == name) {
            Some(share) => {
                share.launches += 1;
                share.total_us += time.as_secs_f64() * 1e6;
            }
            None => shares.push(KernelShare {
                kernel: name,
                launches: 1,
                total_us: time.as_secs_f64() * 1e6,
            }),
        }
    }
    shares.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
    shares
}

/// A codec chunk of each of `sizes` codes, timed alone on one decoder (fresh codes each
/// repeat).
pub fn codec_chunks(engine: &Engine, options: &BenchOptions, sizes: &[usize]) -> Result<Vec<CodecResult>, EngineError> {
    let weights = CodecWeights::upload(engine.gpu.clone(), &engine.checkpoint)?;
    let mut decoder = CodecDecoder::new(weights);
    let codes = engine.checkpoint.config.speech.audio_codes as u32;
    let mut round = 0;
    warm_up(&engine.gpu, WARM_UP)?;
    let mut results = Vec::with_capacity(sizes.len());
    for &size in sizes {
        let chunk = |i: usize| -> Vec<u32> { (0..size as u32).map(|j| (i as u32 * 131 + j * 29) % codes).collect() };
        let mut dispatches = 0;
        let gpu_ms = median_ms(options.repeats, || {
            round += 1;
            let (time, launches) = decoder.timed_chunk(&chunk(round))?;
            dispatches = launches;
            Ok(time)
        })?;
        let profile = if engine.gpu.caps.timestamps {
            round += 1;
            kernel_shares(decoder.profiled_chunk(&chunk(round))?)
        } else {
            Vec::new()
        };
        results.push(CodecResult {
            codes: size,
            samples: size * engine.checkpoint.config.codec.samples_per_code(),
            dispatches,
            gpu_ms,
            profile,
        });
    }
    Ok(results)
}

/// Text tokens of the synthesis measurement's prompt.
const SYNTHESIS_TEXT_TOKENS: usize = 24;

/// End-to-end synthesis with guidance (paired), a fixed seed and a token cap.
pub fn synthesis(engine: &Engine, options: &BenchOptions) -> Result<SynthesisResult, EngineError> {
    let request = synthesis_request(0, true, options.synthesis_tokens);
    let stats = synthesize(engine, &request, &mut |_| true)?;
    let wall_s = stats.wall.as_secs_f64();
    Ok(SynthesisResult {
        tokens: stats.tokens,
        audio_s: stats.audio_seconds(),
        wall_s,
        real_time_factor: wall_s / stats.audio_seconds().max(1e-9),
        first_audio_s: stats.first_audio.map_or(f64::NAN, |d| d.as_secs_f64()),
        tokens_per_s: stats.tokens as f64 / wall_s,
        forward_s: stats.time_split.forward.as_secs_f64(),
        inputs_s: stats.time_split.forward_split.inputs.as_secs_f64(),
        submit_s: stats.time_split.forward_split.submit.as_secs_f64(),
        record_s: stats.time_split.forward_split.record.as_secs_f64(),
        wait_s: stats.time_split.forward_split.wait.as_secs_f64(),
        codec_s: stats.time_split.codec.as_secs_f64(),
        codec_chunks_in_parts: stats.chunks_in_parts,
    })
}

/// The measured synthesis `job` (the measurement's first is 0): a text and a seed of its
/// own, guided (paired, gamma 1.5) or not, up to `tokens` audio tokens.
fn synthesis_request(job: usize, guided: bool, tokens: usize) -> SynthesisRequest {
    let text = (0..SYNTHESIS_TEXT_TOKENS as u32)
        .map(|i| (i * 37 + 11 + job as u32 * 101) % 256)
        .collect();
    SynthesisRequest {
        segments: vec![text],
        prefix: None,
        gamma: if guided { 1.5 } else { 1.0 },
        guidance: GuidanceMode::Paired,
        sampling: SamplingParams::unfiltered(job as u64 + 1),
        max_audio_tokens: tokens,
    }
}

/// Steps a token-loop run needs: the two it does not time and three timed.
const TOKEN_LOOP_STEPS: usize = 5;

/// The token loop with `lanes` lanes busy: `lanes / 2` guided jobs (and an unguided one for
/// an odd lane), each with its own text and seed, run through the batcher as a server runs
/// them until the first ends; then what the GPU does per step, timed alone.
pub fn token_loop(engine: &Engine, lanes: usize, options: &BenchOptions) -> Result<TokenLoopResult, EngineError> {
    let c = &engine.checkpoint.config;
    let pairs = lanes / 2;
    let jobs = pairs + lanes % 2;
    let prompt = Batcher::positions_needed(c.speech.voice_prefix_len, SYNTHESIS_TEXT_TOKENS, 0);
    let capacity = prompt + options.synthesis_tokens;
    let mut batcher = Batcher::new(engine, lanes, capacity)?;
    let marked = engine.gpu.caps.timestamps;
    if marked {
        batcher.mark_steps(MAX_MARKED_SUBMISSIONS)?;
    }
    for job in 0..jobs {
        let request = synthesis_request(job, job < pairs, options.synthesis_tokens);
        batcher.admit(request, Box::new(|_| true))?;
    }
    let mut ends = vec![std::time::Instant::now()];
    while batcher.active() == jobs {
        batcher.step()?;
        ends.push(std::time::Instant::now());
    }
    // ends[i] is when step i - 1 returned; the last step ended a job.
    let last = ends.len() - 2;
    if last + 1 < TOKEN_LOOP_STEPS {
        return Err(EngineError::Input(format!(
            "a job ended after {} steps; the token loop times at least {TOKEN_LOOP_STEPS}",
            last + 1
        )));
    }
    let token_times: Vec<f64> = (3..=last).map(|i| ms(ends[i] - ends[i - 1])).collect();
    let steps = token_times.len();
    let token_ms = median(token_times);
    let in_loop = if marked {
        in_loop_times(&batcher.marked_steps()?, last)
    } else {
        None
    };
    drop(batcher);

    let codes = c.speech.audio_codes as u32;
    let middle = prompt + last / 2;
    let mut session = prefilled_session(engine, lanes, middle, middle + options.repeats + 1)?;
    warm_up(&engine.gpu, WARM_UP)?;
    let mut step = 0;
    let step_gpu_ms = median_ms(options.repeats, || {
        let rows = decode_rows(lanes, middle + step, (step as u32 * 104_729) % codes, codes);
        step += 1;
        Ok(session.timed_step(&rows)?.1)
    })?;
    let draws: Vec<Draw> = (0..jobs)
        .map(|job| {
            let guided = job < pairs;
            Draw {
                settings: SamplingParams::unfiltered(job as u64).exact(0),
                forbidden: c.speech.audio_bos(),
                cond: if guided { 2 * job } else { lanes - 1 },
                uncond: guided.then(|| (2 * job + 1, gamma_fixed(1.5))),
            }
        })
        .collect();
    let draw_gpu_ms = median_ms(options.repeats, || session.timed_draw(&draws))?;
    let codec_gpu_ms = codec_chunks(engine, options, &[CODEC_CHUNK])?[0].gpu_ms * jobs as f64 / CODEC_CHUNK as f64;
    let busy_ms = step_gpu_ms + draw_gpu_ms + codec_gpu_ms;
    Ok(TokenLoopResult {
        lanes,
        jobs,
        steps,
        token_ms,
        step_gpu_ms,
        draw_gpu_ms,
        codec_gpu_ms,
        busy_ms,
        token_over_busy: token_ms / busy_ms,
        in_loop,
    })
}

/// The in-loop times of the token loop's timed steps (steps 2 to `last` - 1, whose calls
/// `token_ms` times) from the spans of the marked steps, one a step from the first. `None`
/// when the spans do not reach them (the timeline filled up).
fn in_loop_times(spans: &[MarkedSpan], last: usize) -> Option<InLoopTimes> {
    let timed = 2..last;
    if timed.is_empty() || spans.len() < last {
        return None;
    }
    let median_of = |time: &dyn Fn(usize) -> f64| median(timed.clone().map(|k| time(k) / 1e6).collect());
    Some(InLoopTimes {
        span_ms: median_of(&|k| spans[k].end_ns - spans[k].start_ns),
        step_ms: median_of(&|k| spans[k].split_ns - spans[k].start_ns),
        codec_ms: median_of(&|k| spans[k].end_ns - spans[k].split_ns),
        gap_ms: median_of(&|k| spans[k].start_ns - spans[k - 1].end_ns),
    })
}

/// The linear kernels and sizes measured: the model's own (per format), each NVFP4 size
/// also in the routed-expert kernel, and one large NVFP4 matrix in both.
pub fn kernel_shapes(engine: &Engine) -> Vec<KernelCase> {
    let c = &engine.checkpoint.config;
    let h = c.hidden_size;
    let q = c.num_attention_heads * c.head_dim;
    let mut shapes = vec![
        (WeightFormat::Nvfp4, c.moe_intermediate_size, h),
        (WeightFormat::Nvfp4, h, c.moe_intermediate_size),
        (WeightFormat::Nvfp4, 8 * c.moe_intermediate_size, h),
        (WeightFormat::Bf16, q, h),
        (WeightFormat::Bf16, c.intermediate_size, h),
        (WeightFormat::Bf16, c.speech.audio_vocab_size, h),
    ];
    if h >= 1024 {
        // The largest row count one dispatch takes (65535 workgroups), rounded to 1024.
        shapes.push((WeightFormat::Nvfp4, 64512, 8192));
    }
    let case = |kernel, &(format, rows, cols): &(WeightFormat, usize, usize)| KernelCase {
        kernel,
        format,
        rows,
        cols,
    };
    let routed = shapes
        .iter()
        .filter(|(format, ..)| *format == WeightFormat::Nvfp4)
        .map(|shape| case(LinearKernel::RoutedExpert, shape));
    shapes
        .iter()
        .map(|shape| case(LinearKernel::Dense, shape))
        .chain(routed)
        .collect()
}

/// The lanes a decode step is measured with, unless a run names others: one lane, a guidance
/// pair, two and four pairs.
pub const DEFAULT_STEP_LANES: [usize; 4] = [1, 2, 4, 8];

/// A decode step's label by its lanes: `single`, `pair`, `lanes-N`.
fn step_label(lanes: usize) -> String {
    match lanes {
        1 => "single".into(),
        2 => "pair".into(),
        n => format!("lanes-{n}"),
    }
}

/// Runs the roofline, the launch cost and the parts `options` names.
pub fn run(
    engine: &Engine,
    options: &BenchOptions,
    wgpu: &str,
    commit: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<BenchReport, EngineError> {
    options.check(&engine.checkpoint.config)?;
    let gpu = &engine.gpu;
    let wanted = |part: BenchPart| options.parts.contains(&part);
    progress("roofline");
    let roof = roofline(gpu, options.repeats)?;
    progress("launch cost");
    let launch = launch_cost(gpu, options.repeats)?;
    let kernels = if wanted(BenchPart::Kernels) {
        let mut results = Vec::new();
        for case in kernel_shapes(engine) {
            for lanes in [1, 2] {
                progress(&format!(
                    "linear {:?} {:?} {}x{} lanes {lanes}",
                    case.kernel, case.format, case.rows, case.cols
                ));
                results.push(linear_kernel(gpu, case, lanes, options, &roof)?);
            }
        }
        Some(results)
    } else {
        None
    };
    let decode = if wanted(BenchPart::Decode) {
        let mut steps = Vec::new();
        for &lanes in &options.lanes {
            let label = step_label(lanes);
            progress(&format!("decode step {label}"));
            steps.push(decode_step(engine, &label, lanes, options, &roof, &launch)?);
        }
        for &context in &options.more_contexts {
            progress(&format!("decode step pair at context {context}"));
            let at = BenchOptions {
                context,
                ..options.clone()
            };
            steps.push(decode_step(engine, &step_label(2), 2, &at, &roof, &launch)?);
        }
        Some(steps)
    } else {
        None
    };
    let prefill = if wanted(BenchPart::Prefill) {
        progress("prefill");
        Some(prefill(engine, options)?)
    } else {
        None
    };
    let synthesis = if wanted(BenchPart::Synthesis) {
        progress("synthesis");
        Some(synthesis(engine, options)?)
    } else {
        None
    };
    let token_loop = if wanted(BenchPart::TokenLoop) {
        let mut results = Vec::new();
        for &lanes in &options.lanes {
            progress(&format!("token loop, {lanes} lanes"));
            results.push(token_loop(engine, lanes, options)?);
        }
        Some(results)
    } else {
        None
    };
    // Synthesis's own chunk first, then the more sizes asked for.
    let (codec, more_codec_chunks) = if wanted(BenchPart::Codec) {
        progress("codec");
        let sizes: Vec<usize> = std::iter::once(CODEC_CHUNK)
            .chain(options.more_codec_chunks.iter().copied())
            .collect();
        let mut chunks = codec_chunks(engine, options, &sizes)?;
        let more = chunks.split_off(1);
        (chunks.pop(), (!more.is_empty()).then_some(more))
    } else {
        (None, None)
    };
    let text = if wanted(BenchPart::Text) {
        progress("text");
        Some(text(engine, options)?)
    } else {
        None
    };
    Ok(BenchReport {
        machine: Machine {
            adapter: gpu.caps.clone(),
            wgpu: wgpu.to_string(),
            commit: commit.to_string(),
            checkpoint: engine.checkpoint.provenance.to_string(),
        },
        options: options.clone(),
        roofline: roof,
        launch,
        kernels,
        decode,
        prefill,
        synthesis,
        token_loop,
        codec,
        more_codec_chunks,
        text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two lanes of a guidance pair read one token, every pair its own, and one lane
    /// reads the token it is given.
    #[test]
    fn decode_rows_give_each_guidance_pair_its_own_token() {
        let mut rng = drama_engine::test_support::rng("bench decode rows");
        // The step's prime and a multiple of it, and a random count.
        for codes in [7919, 2 * 7919, 16 + rng.next_u32() % 8000] {
            let token = rng.next_u32() % codes;
            let pos = (rng.next_u32() % 1000) as usize;
            let tokens = |lanes: usize| -> Vec<u32> {
                decode_rows(lanes, pos, token, codes)
                    .iter()
                    .enumerate()
                    .map(|(lane, row)| {
                        assert_eq!((row.lane, row.pos), (lane, pos));
                        match row.source {
                            RowSource::Audio(t) => t,
                            _ => panic!("a decode row reads an audio token"),
                        }
                    })
                    .collect()
            };
            assert_eq!(tokens(1), [token]);
            let eight = tokens(8);
            for pair in eight.chunks(2) {
                assert_eq!(pair[0], pair[1], "{eight:?}");
                assert!(pair[0] < codes);
            }
            let mut firsts: Vec<u32> = eight.iter().step_by(2).copied().collect();
            firsts.sort_unstable();
            firsts.dedup();
            assert_eq!(firsts.len(), 4, "{eight:?} with {codes} codes");
        }
    }
}
