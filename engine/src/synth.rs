//! Speech synthesis: prefill, then token-by-token decoding with guidance and seeded
//! sampling, and the codec streaming PCM while tokens are generated.
//!
//! Guidance runs the cond lane (the voice prefix) and the uncond lane (`null_prefix`, same
//! text) either as two lanes of one batched step (paired) or as two sessions (separate);
//! both give the same bits. Both lanes consume the token sampled from the mixed logits.
//! Long text arrives as segments (see [`crate::text`]); they are synthesized in order with
//! the same voice and one random stream, and the codec stream runs on across them, so
//! segments join without a discontinuity.

use std::time::{Duration, Instant};

use crate::checkpoint::names;
use crate::codec::CodecDecoder;
use crate::error::EngineError;
use crate::guidance::mix;
use crate::reference::weights;
use crate::sampling::{Sampler, SamplingParams};
use crate::session::{Engine, Row, RowSource, Session};

/// How the guidance lanes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuidanceMode {
    /// Both lanes in one batched step.
    Paired,
    /// Two single-lane sessions.
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

/// Why generation of the request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Every segment reached audio_eos or its token cap.
    Finished,
    /// The sink asked to stop.
    Cancelled,
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
}

impl SynthesisStats {
    /// Seconds of audio produced.
    pub fn audio_seconds(&self) -> f64 {
        self.samples as f64 / f64::from(self.sample_rate)
    }
}

/// The guidance lanes of one segment.
enum Lanes<'e> {
    Single(Session<'e>),
    Paired(Session<'e>),
    Separate(Session<'e>, Session<'e>),
}

impl<'e> Lanes<'e> {
    fn open(
        engine: &'e Engine,
        request: &SynthesisRequest,
        capacity: usize,
        null: &[f32],
    ) -> Result<Self, EngineError> {
        let set_cond = |session: &mut Session<'e>| match &request.prefix {
            Some(prefix) => session.set_prefix(0, prefix),
            None => Ok(()),
        };
        if request.gamma == 1.0 {
            let mut session = Session::new(engine, 1, capacity)?;
            set_cond(&mut session)?;
            return Ok(Lanes::Single(session));
        }
        Ok(match request.guidance {
            GuidanceMode::Paired => {
                let mut session = Session::new(engine, 2, capacity)?;
                set_cond(&mut session)?;
                session.set_prefix(1, null)?;
                Lanes::Paired(session)
            }
            GuidanceMode::Separate => {
                let mut cond = Session::new(engine, 1, capacity)?;
                set_cond(&mut cond)?;
                let mut uncond = Session::new(engine, 1, capacity)?;
                uncond.set_prefix(0, null)?;
                Lanes::Separate(cond, uncond)
            }
        })
    }

    /// Feeds the same sources to every lane; returns the last row's logits of (cond, uncond).
    fn step(
        &mut self,
        sources: &[RowSource],
        start: usize,
        vocab: usize,
    ) -> Result<(Vec<f32>, Option<Vec<f32>>), EngineError> {
        let rows = |lane: usize| -> Vec<Row> {
            sources
                .iter()
                .enumerate()
                .map(|(i, &source)| Row {
                    source,
                    lane,
                    pos: start + i,
                })
                .collect()
        };
        let last = |logits: &[f32], row: usize| logits[row * vocab..(row + 1) * vocab].to_vec();
        let n = sources.len();
        Ok(match self {
            Lanes::Single(s) => (last(&s.step(&rows(0), false)?.logits, n - 1), None),
            Lanes::Paired(s) => {
                let mut both = rows(0);
                both.extend(rows(1));
                let logits = s.step(&both, false)?.logits;
                (last(&logits, n - 1), Some(last(&logits, 2 * n - 1)))
            }
            Lanes::Separate(cond, uncond) => {
                let c = cond.step(&rows(0), false)?.logits;
                let u = uncond.step(&rows(0), false)?.logits;
                (last(&c, n - 1), Some(last(&u, n - 1)))
            }
        })
    }
}

/// Synthesizes the request, handing PCM to `sink` as it is produced; `sink` returns false
/// to cancel (generation stops before the next step).
pub fn synthesize(
    engine: &Engine,
    request: &SynthesisRequest,
    sink: &mut dyn FnMut(&[f32]) -> bool,
) -> Result<SynthesisStats, EngineError> {
    let start = Instant::now();
    let c = engine.checkpoint.config.clone();
    if request.segments.is_empty() || request.segments.iter().any(Vec::is_empty) {
        return Err(EngineError::Input("nothing to say: the text has no tokens".into()));
    }
    if !(request.gamma.is_finite()) {
        return Err(EngineError::Input(format!("gamma {} is not finite", request.gamma)));
    }
    if request.max_audio_tokens == 0 {
        return Err(EngineError::Input("max_audio_tokens must be at least 1".into()));
    }
    let p = c.speech.voice_prefix_len;
    let vocab = c.speech.audio_vocab_size;
    let (bos, eos) = (c.speech.audio_bos(), c.speech.audio_eos());
    for segment in &request.segments {
        let needed = p + segment.len() + 1 + request.max_audio_tokens;
        if needed > c.max_position_embeddings {
            return Err(EngineError::Input(format!(
                "a segment of {} tokens with {} audio tokens needs {needed} positions, more than max_position_embeddings {}",
                segment.len(),
                request.max_audio_tokens,
                c.max_position_embeddings
            )));
        }
    }
    let null: Vec<f32> = weights::values(&engine.checkpoint, names::NULL_PREFIX)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let mut sampler = Sampler::new(request.sampling)?;
    let mut codec = CodecDecoder::new(engine.gpu.clone(), &engine.checkpoint)?;
    codec.reset();
    let mut stats = SynthesisStats {
        tokens: 0,
        samples: 0,
        sample_rate: c.codec.sample_rate,
        wall: Duration::ZERO,
        first_audio: None,
        stop: Stop::Finished,
    };
    let mut emit = |pcm: &[f32], stats: &mut SynthesisStats| -> bool {
        if pcm.is_empty() {
            return true;
        }
        stats.first_audio.get_or_insert_with(|| start.elapsed());
        stats.samples += pcm.len();
        sink(pcm)
    };
    'segments: for segment in &request.segments {
        let capacity = p + segment.len() + 1 + request.max_audio_tokens;
        let mut lanes = Lanes::open(engine, request, capacity, &null)?;
        let prompt: Vec<RowSource> = (0..p)
            .map(RowSource::Prefix)
            .chain(segment.iter().map(|&t| RowSource::Text(t)))
            .chain(std::iter::once(RowSource::Audio(bos as u32)))
            .collect();
        let mut position = prompt.len();
        let (mut cond, mut uncond) = lanes.step(&prompt, 0, vocab)?;
        let mut pending = Vec::new();
        for generated in 0..request.max_audio_tokens {
            let logits = match &uncond {
                Some(u) => mix(&cond, u, request.gamma),
                None => cond.clone(),
            };
            let token = sampler.sample(&logits, bos)?;
            if token as usize == eos {
                break;
            }
            stats.tokens += 1;
            pending.push(token);
            if pending.len() == CODEC_CHUNK {
                let pcm = codec.decode(&pending)?;
                pending.clear();
                if !emit(&pcm, &mut stats) {
                    stats.stop = Stop::Cancelled;
                    break 'segments;
                }
            }
            if generated + 1 == request.max_audio_tokens {
                break;
            }
            (cond, uncond) = lanes.step(&[RowSource::Audio(token)], position, vocab)?;
            position += 1;
        }
        let pcm = codec.decode(&pending)?;
        if !emit(&pcm, &mut stats) {
            stats.stop = Stop::Cancelled;
            break;
        }
    }
    stats.wall = start.elapsed();
    Ok(stats)
}
