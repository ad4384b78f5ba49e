//! What a synthesis is asked and what it did: the request, its guidance mode, how it
//! stopped, its statistics. [`crate::batch`] runs requests (prefill, then token-by-token
//! decoding with guidance and seeded sampling, the codec streaming PCM while tokens are
//! generated); [`crate::batch::synthesize`] runs one alone.
//!
//! Guidance runs the cond lane (the voice prefix) and the uncond lane (`null_prefix`, same
//! text) either as two lanes of one batched step (paired) or as two forwards (separate);
//! both give the same bits. Both lanes consume the token sampled from the mixed logits.
//! Long text arrives as segments (see [`crate::text`]); they are synthesized in order with
//! the same voice and one random stream, and the codec stream runs on across them, so
//! segments join without a discontinuity.

use std::time::Duration;

use crate::error::EngineError;
use crate::sampling::SamplingParams;
use crate::session::ForwardSplit;
use crate::text::TextFrontEnd;

/// How the guidance lanes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuidanceMode {
    /// Both lanes in one batched step.
    Paired,
    /// Two forwards per step: all cond rows, then all uncond rows.
    Separate,
}

/// Codes decoded per codec chunk while generating.
pub const CODEC_CHUNK: usize = 8;

/// One synthesis job.
#[derive(Debug, Clone)]
pub struct SynthesisRequest {
    /// Token ids of each text segment.
    pub segments: Vec<Vec<u32>>,
    /// The cond lane's voice prefix [P, H] (None: the checkpoint's default prefix).
    pub prefix: Option<Vec<f32>>,
    /// Guidance scale (1: cond lane only).
    pub gamma: f32,
    /// Paired or separate guidance lanes.
    pub guidance: GuidanceMode,
    /// Sampling settings.
    pub sampling: SamplingParams,
    /// Generated tokens per segment at most.
    pub max_audio_tokens: usize,
}

/// Everything a [`SynthesisRequest`] holds but its text.
#[derive(Debug, Clone)]
pub struct SpeechSettings {
    /// The cond lane's voice prefix [P, H] (None: the checkpoint's default prefix).
    pub prefix: Option<Vec<f32>>,
    /// Guidance scale (1: cond lane only).
    pub gamma: f32,
    /// Paired or separate guidance lanes.
    pub guidance: GuidanceMode,
    /// Sampling settings.
    pub sampling: SamplingParams,
    /// Generated tokens per segment at most.
    pub max_audio_tokens: usize,
}

impl SynthesisRequest {
    /// The request that speaks `text` with `settings`: the text cut into segments that each
    /// fit the context beside the voice prefix and `settings.max_audio_tokens` tokens of
    /// speech. What the CLI and the service both run.
    pub fn for_text(
        front: &TextFrontEnd,
        text: &str,
        settings: SpeechSettings,
    ) -> Result<SynthesisRequest, EngineError> {
        let segments = front.segments_for(text, settings.max_audio_tokens)?;
        Ok(SynthesisRequest::with_segments(segments, settings))
    }

    /// The request that speaks `text` with `settings`, as [`SynthesisRequest::for_text`],
    /// cut so that its speech may start before all of its text is cut: when the first
    /// sentence is a segment of its own and text follows it, the request holds that segment
    /// alone and the rest comes back as a [`LaterText`]; otherwise the whole request and
    /// `None`. What the service runs: the time to first audio does not grow with the text
    /// after the first sentence.
    pub fn opening(
        front: &TextFrontEnd,
        text: &str,
        settings: SpeechSettings,
    ) -> Result<(SynthesisRequest, Option<LaterText>), EngineError> {
        let budget = front.budget_for(settings.max_audio_tokens)?;
        let Some((first, at)) = front.first_segment(text, budget)? else {
            let segments = front.segments(text, budget)?;
            return Ok((SynthesisRequest::with_segments(segments, settings), None));
        };
        let later = LaterText {
            text: text[at..].to_string(),
            budget,
        };
        Ok((SynthesisRequest::with_segments(vec![first], settings), Some(later)))
    }

    /// The request that speaks `segments` with `settings`.
    fn with_segments(segments: Vec<Vec<u32>>, settings: SpeechSettings) -> SynthesisRequest {
        let SpeechSettings {
            prefix,
            gamma,
            guidance,
            sampling,
            max_audio_tokens,
        } = settings;
        SynthesisRequest {
            segments,
            prefix,
            gamma,
            guidance,
            sampling,
            max_audio_tokens,
        }
    }
}

/// The text after a request's first segment, to be cut into segments while the first is
/// spoken ([`SynthesisRequest::opening`]).
#[derive(Debug, Clone)]
pub struct LaterText {
    text: String,
    budget: usize,
}

impl LaterText {
    /// Its segments: with the request's first, those of the whole text (contract §9.3).
    pub fn segments(&self, front: &TextFrontEnd) -> Result<Vec<Vec<u32>>, EngineError> {
        front.segments_after(&self.text, self.budget)
    }
}

/// Segments that reach a job after it started ([`crate::batch::Batcher::admit_open`]): the
/// segments of its [`LaterText`], or why they could not be cut. The job speaks the
/// segments it has and waits for these after its last.
pub type LaterSegments = std::sync::mpsc::Receiver<Result<Vec<Vec<u32>>, EngineError>>;

/// Why generation of the request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Every segment reached audio_eos or its token cap.
    Finished,
    /// The sink asked to stop.
    Cancelled,
    /// The job failed alone (a NaN in its logits, or its codec): the batcher returns the
    /// error.
    Failed,
}

/// What a synthesis did.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthesisStats {
    /// Audio tokens generated (all segments).
    pub tokens: usize,
    /// PCM samples produced.
    pub samples: usize,
    /// Their sample rate.
    pub sample_rate: u32,
    /// Wall time from start to the last sample.
    pub wall: Duration,
    /// Wall time to the first samples.
    pub first_audio: Option<Duration>,
    /// How it ended.
    pub stop: Stop,
    /// Where the wall time went.
    pub time_split: TimeSplit,
    /// Codec chunks submitted in parts, one behind each step (the others ran whole; see
    /// [`crate::batch::parts_for`]).
    pub chunks_in_parts: usize,
    /// Segments that reached their token cap before audio_eos: their speech may end before
    /// their text does (the contract stops generation there; the caller decides what to
    /// tell).
    pub capped_segments: usize,
}

/// Where a job's wall time went, each part summed over its steps (the rest is waiting for
/// other jobs' work and the sink).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TimeSplit {
    /// The batched steps the job took part in: from submitting one until the tokens of the
    /// step before are on the host.
    pub forward: Duration,
    /// How the forwards' time divides (its parts add up to `forward`, to within the
    /// bookkeeping between them).
    pub forward_split: ForwardSplit,
    /// Its codec chunks: submit until the PCM is on the host.
    pub codec: Duration,
}

impl SynthesisStats {
    /// Seconds of audio produced.
    pub fn audio_seconds(&self) -> f64 {
        self.samples as f64 / f64::from(self.sample_rate)
    }
}
