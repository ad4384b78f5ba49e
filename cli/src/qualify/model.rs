//! Generated tiny checkpoints against the FP64 reference: teacher-forced logits, every
//! layer's hidden state and every router choice of fresh random utterances. The presets
//! cover softmax and grouped-sigmoid routing, compact and full-width routers over pruned
//! expert ids, NVFP4 and FP8 experts, and the widths of `docs/contract.md` §11 (the awkward
//! preset).

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use drama_checkpoint::{Checkpoint, Provenance};
use drama_engine::gpu::Gpu;
use drama_engine::session::{Engine, Row, RowSource, Session, StepOutput};
use drama_reference::ops::Rounding;
use drama_reference::{ForcedRoutes, ReferenceModel, ReferenceTrace, rel_l2};
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

use super::Plant;
use super::receipt::{Check, Measured};

/// Utterances per checkpoint.
const UTTERANCES: usize = 5;

/// The median utterance's logits stay within this relative L2 of the contract-rounding
/// reference (a BF16 flip's reach is about 1e-2).
const LOGITS_MEDIAN_LIMIT: f64 = 5e-3;

/// At least one utterance matches the contract-rounding reference to f32 precision.
const F32_PRECISION: f64 = 1e-6;

/// Every layer's hidden state within a BF16 flip's reach.
pub const HIDDEN_LIMIT: f64 = 1e-2;

/// The GPU may choose other experts than the reference only at a near-tie: where the
/// reference's decision margin is below this.
const NEAR_TIE: f64 = 5e-2;

/// What one utterance showed.
struct UtteranceFigures {
    logits: f64,
    hidden: f64,
    /// The largest margin at which the GPU chose differently (0: the same choices).
    route_margin: f64,
}

/// The checks of one preset: logits (median), f32 precision (best), hidden states, routes.
pub fn checks(gpu: &Arc<Gpu>, preset: &str, seed: u64, scratch: &Path, plant: &Plant) -> Vec<Check> {
    let names = ["logits", "f32-precision", "hidden", "routes"].map(|n| format!("model.{preset}.{n}"));
    let started = std::time::Instant::now();
    let attempts = match run_preset(gpu, preset, seed, scratch, plant, &names[0]) {
        Ok(attempts) => attempts,
        Err(e) => {
            let failed = Check::run(&names[0], || Err(e));
            return std::iter::once(failed)
                .chain(names[1..].iter().map(|n| Check::skipped(n, "the preset did not run")))
                .collect();
        }
    };
    // The four checks share one run: each gets a quarter of its time.
    let seconds = started.elapsed().as_secs_f64() / 4.0;
    // The median and the best utterance of one checkpoint: the last, which met both if
    // any did. Hidden states and routes hold on every checkpoint.
    let logits = sorted_logits(attempts.last().expect("at least one checkpoint"));
    let all = attempts.iter().flatten();
    let hidden = all.clone().map(|u| u.hidden).fold(0.0, f64::max);
    let margin = all.clone().map(|u| u.route_margin).fold(0.0, f64::max);
    let n = attempts.len();
    let measured = [
        Measured::new(
            logits[UTTERANCES / 2],
            LOGITS_MEDIAN_LIMIT,
            format!(
                "median logits rel-L2 of the last checkpoint's {UTTERANCES} utterances vs the contract-rounding FP64 reference"
            ),
        ),
        Measured::new(
            logits[0],
            F32_PRECISION,
            format!("best utterance's logits rel-L2 of the last of {n} checkpoint(s), {UTTERANCES} utterances each"),
        ),
        Measured::new(
            hidden,
            HIDDEN_LIMIT,
            "worst layer's hidden-state rel-L2 over every utterance",
        ),
        Measured::new(
            margin,
            NEAR_TIE,
            "largest reference decision margin at which the GPU chose other experts (0: none)",
        ),
    ];
    names
        .iter()
        .zip(measured)
        .map(|(name, m)| Check::measured(name, m, seconds))
        .collect()
}

/// One checkpoint's utterances' logits errors, smallest first.
fn sorted_logits(figures: &[UtteranceFigures]) -> Vec<f64> {
    let mut logits: Vec<f64> = figures.iter().map(|u| u.logits).collect();
    logits.sort_by(f64::total_cmp);
    logits
}

/// Fresh checkpoints of `preset`, up to its `reference_checkpoints`, until one has its
/// median utterance within [`LOGITS_MEDIAN_LIMIT`] and an utterance at f32 precision: each
/// checkpoint's utterances' figures. Two correct implementations may round a value to the
/// other BF16 neighbour where f32 arithmetic lands within an ulp of a rounding boundary,
/// and the flip spreads through random weights; every utterance shares the audio BOS row,
/// so one flip there moves them all.
fn run_preset(
    gpu: &Arc<Gpu>,
    preset: &str,
    seed: u64,
    scratch: &Path,
    plant: &Plant,
    plant_name: &str,
) -> Result<Vec<Vec<UtteranceFigures>>> {
    let checkpoints = drama_fixtures::Preset::by_name(preset)
        .with_context(|| format!("no preset {preset}"))?
        .reference_checkpoints;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut attempts = Vec::new();
    for attempt in 0..checkpoints {
        let dir = scratch.join(format!("{preset}-{attempt}"));
        drama_fixtures::write_preset(preset, rng.next_u64(), &dir).with_context(|| format!("generating {preset}"))?;
        let checkpoint = Checkpoint::open(&dir, Provenance::Local(dir.clone()))?;
        let reference = ReferenceModel::load(&checkpoint);
        let engine = Engine::load(gpu.clone(), checkpoint)?;
        let figures = (0..UTTERANCES)
            .map(|_| utterance(&engine, &reference, &mut rng, plant, plant_name))
            .collect::<Result<Vec<_>>>()?;
        std::fs::remove_dir_all(&dir).ok();
        let logits = sorted_logits(&figures);
        let clean = logits[0] <= F32_PRECISION && logits[UTTERANCES / 2] <= LOGITS_MEDIAN_LIMIT;
        attempts.push(figures);
        if clean {
            break;
        }
    }
    Ok(attempts)
}

/// A teacher-forced utterance: a voice prefix, text and audio codes (the audio BOS first),
/// and its rows in one lane from position 0.
pub struct Utterance {
    pub prefix: Vec<f32>,
    pub text: Vec<u32>,
    pub audio: Vec<u32>,
    pub rows: Vec<Row>,
}

impl Utterance {
    /// Fresh random `text_len` text tokens and `codes` audio codes after the BOS, with a
    /// fresh voice prefix, for the checkpoint of `c`.
    pub fn random(c: &drama_checkpoint::ModelConfig, rng: &mut ChaCha8Rng, text_len: usize, codes: usize) -> Utterance {
        let p = c.speech.voice_prefix_len;
        let text: Vec<u32> = (0..text_len)
            .map(|_| rng.next_u32() % c.text_vocab_size as u32)
            .collect();
        let mut audio = vec![c.speech.audio_bos() as u32];
        audio.extend((0..codes).map(|_| rng.next_u32() % c.speech.audio_codes as u32));
        let prefix: Vec<f32> = (0..p * c.hidden_size)
            .map(|_| (rng.next_u32() as f64 / f64::from(u32::MAX) * 3.0 - 1.5) as f32)
            .collect();
        let rows: Vec<Row> = (0..p)
            .map(RowSource::Prefix)
            .chain(text.iter().map(|&t| RowSource::Text(t)))
            .chain(audio.iter().map(|&a| RowSource::Audio(a)))
            .enumerate()
            .map(|(pos, source)| Row { source, lane: 0, pos })
            .collect();
        Utterance {
            prefix,
            text,
            audio,
            rows,
        }
    }

    /// A session of one lane holding the whole utterance, its voice prefix set.
    pub fn session<'e>(&self, engine: &'e Engine) -> Result<Session<'e>> {
        let mut session = Session::new(engine, 1, self.rows.len())?;
        session.set_prefix(0, &self.prefix)?;
        Ok(session)
    }

    /// The reference's input rows.
    pub fn reference_inputs(&self, reference: &ReferenceModel) -> Vec<f64> {
        let prefix: Vec<f64> = self.prefix.iter().map(|&v| f64::from(v)).collect();
        reference.embed(&prefix, &self.text, &self.audio)
    }
}

/// One teacher-forced utterance with a fresh voice prefix, text and codes.
fn utterance(
    engine: &Engine,
    reference: &ReferenceModel,
    rng: &mut ChaCha8Rng,
    plant: &Plant,
    plant_name: &str,
) -> Result<UtteranceFigures> {
    let utterance = Utterance::random(&engine.checkpoint.config, rng, 9, 6);
    let mut out = utterance.session(engine)?.step(&utterance.rows, true)?;
    plant.corrupt(plant_name, &mut out.logits);
    let inputs = utterance.reference_inputs(reference);
    let (contract, route_margin) = follow_near_ties(reference, &inputs, &out);
    let hidden = out
        .hidden
        .iter()
        .zip(&contract.hidden)
        .map(|(got, want)| rel_l2(got, want))
        .fold(0.0, f64::max);
    Ok(UtteranceFigures {
        logits: rel_l2(&out.logits, &contract.logits),
        hidden,
        route_margin,
    })
}

/// The contract-rounding reference, made to follow the GPU's expert choices where they
/// differ (so the rest stays comparable), and the largest reference decision margin at
/// which they differed.
fn follow_near_ties(reference: &ReferenceModel, inputs: &[f64], out: &StepOutput) -> (ReferenceTrace, f64) {
    let mut forced = ForcedRoutes::new();
    let mut margin = 0.0f64;
    let mut contract = reference.forward(inputs, Rounding::Contract);
    // Following one choice changes the layers after it; a few passes settle it.
    for _ in 0..4 {
        let mut changed = false;
        for (layer, route) in out.routes.iter().enumerate() {
            let (Some((ids, _)), Some(want), Some(margins)) =
                (route, &contract.routes[layer], &contract.margins[layer])
            else {
                continue;
            };
            let k = ids.len() / want.len().max(1);
            for (pos, chosen) in want.iter().enumerate() {
                let got: Vec<usize> = ids[pos * k..(pos + 1) * k].iter().map(|&e| e as usize).collect();
                let want_ids: Vec<usize> = chosen.iter().map(|c| c.0).collect();
                if got != want_ids && !forced.contains_key(&(layer, pos)) {
                    margin = margin.max(margins[pos]);
                    forced.insert((layer, pos), got);
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
        contract = reference.forward_routed(inputs, Rounding::Contract, &forced);
    }
    (contract, margin)
}
