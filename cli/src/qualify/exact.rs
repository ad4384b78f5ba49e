//! The engine's exactness promises on a generated tiny checkpoint, each a bit-for-bit
//! comparison (`docs/contract.md` §10): paired == separate guidance lanes, chunked ==
//! whole codec decoding, batched == solo requests, voice file == recording, the same seed
//! twice; and the codec and the voice tower against the FP64 reference.

use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, ensure};
use drama_engine::batch::Batcher;
use drama_engine::batch::synthesize;
use drama_engine::codec::{CodecDecoder, CodecWeights};
use drama_engine::sampling::SamplingParams;
use drama_engine::session::Engine;
use drama_engine::synth::{GuidanceMode, SynthesisRequest};
use drama_engine::tower::VoiceTower;
use drama_engine::trace::{LaneMode, TraceRequest, trace};
use drama_engine::voice::{prefix_from_wav, read_voice_file, voice_file_bytes};
use drama_fixtures::CODEC_REFERENCE_CHECKPOINTS;
use drama_reference::ops::Rounding;
use drama_reference::rel_l2;
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

use super::Plant;
use super::receipt::{Check, Measured};

/// Audio tokens each synthesis generates at most.
const TOKENS: usize = 24;

/// The guidance scale of the guided checks: two lanes per request.
const GAMMA: f32 = 1.5;

/// Values whose bits differ between two results (a length difference counts every value
/// past the shorter).
pub fn differing_bits(a: &[f32], b: &[f32]) -> usize {
    let differing = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
    differing + a.len().abs_diff(b.len())
}

/// A guided request for `text` with `prefix` (None: the default voice) and `seed`.
pub fn request(text: Vec<u32>, prefix: Option<Vec<f32>>, seed: u64) -> SynthesisRequest {
    SynthesisRequest {
        segments: vec![text],
        prefix,
        gamma: GAMMA,
        guidance: GuidanceMode::Paired,
        sampling: SamplingParams::unfiltered(seed),
        max_audio_tokens: TOKENS,
    }
}

/// The PCM of `request` synthesized alone.
pub fn speak(engine: &Engine, request: &SynthesisRequest) -> Result<Vec<f32>> {
    let mut pcm = Vec::new();
    synthesize(engine, request, &mut |chunk| {
        pcm.extend_from_slice(chunk);
        true
    })?;
    Ok(pcm)
}

/// A half-second test recording at 16 kHz: two tones and a sweep.
pub fn recording() -> Vec<u8> {
    let samples: Vec<f32> = (0..8000)
        .map(|i| {
            let t = i as f32 / 16000.0;
            0.2 * (2.0 * std::f32::consts::PI * 220.0 * t).sin()
                + 0.1 * (2.0 * std::f32::consts::PI * (300.0 + 900.0 * t) * t).sin()
        })
        .collect();
    drama_engine::audio::write_wav_pcm16(&samples, 16000).expect("a valid recording")
}

/// The checks, on `engine` (a generated tiny checkpoint); `fresh` generates and loads
/// another tiny checkpoint from a seed, for a reference check that may need one.
pub fn checks(engine: &Engine, fresh: &dyn Fn(u64) -> Result<Engine>, seed: u64, plant: &Plant) -> Vec<Check> {
    let c = &engine.checkpoint.config;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut text = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.next_u32() % c.text_vocab_size as u32).collect() };
    let (first, second) = (text(11), text(7));
    let codes: Vec<u32> = (0..40).map(|_| rng.next_u32() % c.speech.audio_codes as u32).collect();
    vec![
        Check::run("exact.paired-separate", || {
            paired_separate(engine, &first, &codes[..6], plant)
        }),
        Check::run("exact.codec-chunked", || codec_chunked(engine, &codes, plant)),
        Check::run("exact.batched-solo", || {
            batched_solo(engine, &first, &second, seed, plant)
        }),
        Check::run("exact.voice-file", || voice_file(engine, &first, seed, plant)),
        Check::run("exact.same-seed", || {
            let a = speak(engine, &request(first.clone(), None, seed))?;
            let mut b = speak(engine, &request(first.clone(), None, seed))?;
            plant.corrupt("exact.same-seed", &mut b);
            Ok(Measured::exact(
                differing_bits(&a, &b),
                format!("{} samples, one seed, twice", a.len()),
            ))
        }),
        Check::run("exact.sampler", || gpu_sampler(engine, seed, plant)),
        Check::run("reference.codec", || codec_reference(engine, fresh, seed, plant)),
        Check::run("reference.voice-tower", || tower_reference(engine, seed, plant)),
    ]
}

/// The GPU's sampling kernel against the host's integer sampling (`docs/contract.md`
/// §6.1-6.2) on rows of the checkpoint's audio vocabulary and of the pinned model's (4098):
/// spread logits, runs of ties and near-ties a few 2^-16 apart, under random temperatures,
/// top-k, top-p and draws, every other draw guided (mixed with the next row).
fn gpu_sampler(engine: &Engine, seed: u64, plant: &Plant) -> Result<Measured> {
    use drama_engine::sampling::exact::ExactSettings;
    use drama_engine::sampling::gamma_fixed;
    use drama_engine::sampling::gpu::{Draw, GpuSampler};
    const ROWS: usize = 128;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5A3F1E);
    let speech = &engine.checkpoint.config.speech;
    let vocabs = [(speech.audio_vocab_size, speech.audio_bos()), (4098, 4096)];
    let mut differing = 0;
    for (vocab, forbidden) in vocabs {
        let mut sampler = GpuSampler::new(&engine.gpu, vocab, ROWS)?;
        let mut logits = Vec::with_capacity(ROWS * vocab);
        let mut draws = Vec::with_capacity(ROWS);
        for row in 0..ROWS {
            logits.extend((0..vocab).map(|_| {
                let unit = rng.next_u32() as f32 / u32::MAX as f32;
                match row % 3 {
                    0 => 24.0 * unit - 12.0,
                    1 => (rng.next_u32() % 9) as f32 * 0.5 - 2.0,
                    _ => -3.0 + (rng.next_u32() % 64) as f32 * 2f32.powi(-18),
                }
            }));
            draws.push(Draw {
                settings: ExactSettings {
                    tau: [0, 1 << 10, 1 + rng.next_u32() % 10240][row % 3],
                    top_k: [0, 1, 5, 50][row % 4],
                    top_p: [1 << 24, 1 + rng.next_u32() % (1 << 24)][row % 2],
                    random: rng.next_u32(),
                },
                forbidden,
                cond: row,
                uncond: (row % 2 == 1).then(|| ((row + 1) % ROWS, gamma_fixed(GAMMA))),
            });
        }
        let got = sampler.sample(&engine.gpu, &logits, &draws)?;
        let mut tokens: Vec<f32> = got.iter().map(|t| t.map_or(-1.0, |t| t as f32)).collect();
        plant.corrupt("exact.sampler", &mut tokens);
        differing += draws
            .iter()
            .zip(&tokens)
            .filter(|&(draw, &token)| token != draw.on_host(&logits, vocab).map_or(-1.0, |t| t as f32))
            .count();
    }
    Ok(Measured::exact(
        differing,
        format!(
            "{} draws (half guided) each of {} and {} logits sampled on the GPU and on the host",
            ROWS, vocabs[0].0, vocabs[1].0
        ),
    ))
}

fn paired_separate(engine: &Engine, text: &[u32], codes: &[u32], plant: &Plant) -> Result<Measured> {
    let run = |lanes| -> Result<Vec<f32>> {
        let traced = trace(
            engine,
            &TraceRequest {
                text,
                codes,
                prefix: None,
                gamma: GAMMA,
                lanes,
            },
        )?;
        let lane = |name| traced.f32s(name).with_context(|| format!("the trace has no {name}"));
        let mut logits = lane("logits.cond")?;
        logits.extend(lane("logits.uncond")?);
        Ok(logits)
    };
    let paired = run(LaneMode::Paired)?;
    let mut separate = run(LaneMode::Separate)?;
    plant.corrupt("exact.paired-separate", &mut separate);
    Ok(Measured::exact(
        differing_bits(&paired, &separate),
        format!("{} cond and uncond logits, lanes in one forward vs two", paired.len()),
    ))
}

fn codec_chunked(engine: &Engine, codes: &[u32], plant: &Plant) -> Result<Measured> {
    let mut decoder = CodecDecoder::new(CodecWeights::upload(engine.gpu.clone(), &engine.checkpoint)?);
    let whole = decoder.decode(codes)?;
    let mut differing = 0;
    for pieces in [vec![8usize; codes.len() / 8], vec![1, 3, 4, codes.len() - 8]] {
        decoder.reset();
        let mut streamed = Vec::new();
        let mut start = 0;
        for n in pieces {
            streamed.extend(decoder.decode(&codes[start..start + n])?);
            start += n;
        }
        plant.corrupt("exact.codec-chunked", &mut streamed);
        differing += differing_bits(&whole, &streamed);
    }
    Ok(Measured::exact(
        differing,
        format!(
            "{} samples of {} codes, whole vs in chunks (8 each; 1, 3, 4, rest)",
            whole.len(),
            codes.len()
        ),
    ))
}

fn batched_solo(engine: &Engine, first: &[u32], second: &[u32], seed: u64, plant: &Plant) -> Result<Measured> {
    let requests = [
        request(first.to_vec(), None, seed),
        request(second.to_vec(), None, seed + 1),
    ];
    let solo: Vec<Vec<f32>> = requests.iter().map(|r| speak(engine, r)).collect::<Result<_>>()?;
    let capacity = requests
        .iter()
        .map(|r| {
            Batcher::positions_needed(
                engine.checkpoint.config.speech.voice_prefix_len,
                r.segments[0].len(),
                TOKENS,
            )
        })
        .max()
        .unwrap_or(1);
    let mut batcher = Batcher::new(engine, 4, capacity)?;
    let outputs: Vec<Arc<Mutex<Vec<f32>>>> = requests.iter().map(|_| Arc::default()).collect();
    for (r, out) in requests.iter().zip(&outputs) {
        let out = out.clone();
        batcher.admit(
            r.clone(),
            Box::new(move |pcm: &[f32]| {
                out.lock().expect("one writer").extend_from_slice(pcm);
                true
            }),
        )?;
    }
    let mut ended = 0;
    while ended < requests.len() {
        for (_, result) in batcher.step()? {
            result?;
            ended += 1;
        }
    }
    let mut differing = 0;
    for (alone, together) in solo.iter().zip(&outputs) {
        let mut together = together.lock().expect("the batcher is done").clone();
        plant.corrupt("exact.batched-solo", &mut together);
        differing += differing_bits(alone, &together);
    }
    Ok(Measured::exact(
        differing,
        "two guided requests in one batch vs each alone",
    ))
}

fn voice_file(engine: &Engine, text: &[u32], seed: u64, plant: &Plant) -> Result<Measured> {
    let tower = VoiceTower::new(engine.gpu.clone(), &engine.checkpoint)?;
    let from_recording = prefix_from_wav(&recording(), &tower)?;
    let from_file = read_voice_file(
        &voice_file_bytes(&from_recording, &engine.checkpoint)?,
        &engine.checkpoint,
    )?;
    let a = speak(engine, &request(text.to_vec(), Some(from_recording), seed))?;
    let mut b = speak(engine, &request(text.to_vec(), Some(from_file), seed))?;
    plant.corrupt("exact.voice-file", &mut b);
    Ok(Measured::exact(
        differing_bits(&a, &b),
        format!("{} samples, a recording's voice vs its voice file", a.len()),
    ))
}

/// Six utterances of random codes: the fourth best must match the contract-rounding
/// reference to f32 precision and none may be beyond a BF16 flip's reach (5e-2), as the
/// codec tests require; where the fourth best does not, a fresh checkpoint's codec gets six
/// more, up to [`CODEC_REFERENCE_CHECKPOINTS`] checkpoints.
fn codec_reference(
    engine: &Engine,
    fresh: &dyn Fn(u64) -> Result<Engine>,
    seed: u64,
    plant: &Plant,
) -> Result<Measured> {
    let mut measured = codec_utterances(engine, seed, plant)?;
    for attempt in 1..CODEC_REFERENCE_CHECKPOINTS {
        if measured.passes() {
            break;
        }
        measured = codec_utterances(&fresh(seed + attempt as u64)?, seed, plant)?;
        measured.detail += &format!(", checkpoint {} of up to {CODEC_REFERENCE_CHECKPOINTS}", attempt + 1);
    }
    Ok(measured)
}

/// [`codec_reference`] on one checkpoint.
fn codec_utterances(engine: &Engine, seed: u64, plant: &Plant) -> Result<Measured> {
    let checkpoint = &engine.checkpoint;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xC0DEC);
    let mut decoder = CodecDecoder::new(CodecWeights::upload(engine.gpu.clone(), checkpoint)?);
    let mut errors = Vec::new();
    for _ in 0..6 {
        let codes: Vec<u32> = (0..12)
            .map(|_| rng.next_u32() % checkpoint.config.speech.audio_codes as u32)
            .collect();
        decoder.reset();
        let mut pcm = decoder.decode(&codes)?;
        plant.corrupt("reference.codec", &mut pcm);
        errors.push(rel_l2(
            &pcm,
            &drama_reference::codec::decode(checkpoint, &codes, Rounding::Contract),
        ));
    }
    errors.sort_by(f64::total_cmp);
    ensure!(
        errors[5] <= 5e-2,
        "an utterance is beyond a BF16 flip's reach: {errors:?}"
    );
    Ok(Measured::new(
        errors[3],
        1e-6,
        format!(
            "4th best PCM rel-L2 of 6 utterances vs the contract-rounding FP64 reference (worst {:.1e})",
            errors[5]
        ),
    ))
}

fn tower_reference(engine: &Engine, seed: u64, plant: &Plant) -> Result<Measured> {
    let checkpoint = &engine.checkpoint;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x70E4);
    let n_mels = checkpoint.config.voice_tower.n_mels;
    let frames = 13;
    let mel: Vec<f32> = (0..frames * n_mels)
        .map(|_| (rng.next_u32() as f64 / f64::from(u32::MAX) * 6.5 - 4.5) as f32)
        .collect();
    let tower = VoiceTower::new(engine.gpu.clone(), checkpoint)?;
    let mut got = tower.encode(&mel, frames)?;
    plant.corrupt("reference.voice-tower", &mut got);
    let mel64: Vec<f64> = mel.iter().map(|&v| f64::from(v)).collect();
    let want = drama_reference::tower::encode(checkpoint, &mel64, frames, Rounding::Contract);
    Ok(Measured::new(
        rel_l2(&got, &want),
        5e-3,
        format!("voice prefix rel-L2 of {frames} mel frames vs the contract-rounding FP64 reference"),
    ))
}
