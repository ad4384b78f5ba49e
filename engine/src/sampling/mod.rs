//! Seeded sampling of the next audio token from the (guidance-mixed) logits, as
//! `docs/contract.md` §6.2 defines it: in integers only ([`exact`]), so the host, the GPU's
//! `sample.wgsl` and every platform pick the same token for the same logits and seed.
//! `audio_bos` is never sampled; codes and `audio_eos` are.

pub mod exact;
pub mod gpu;

use crate::error::EngineError;
use exact::{ExactSettings, ExpTables, TEMPERATURE_SHIFT, TOP_P_SHIFT};

/// The highest temperature accepted, by the CLI and the server alike (beyond it the
/// distribution is all but uniform).
pub const MAX_TEMPERATURE: f32 = 10.0;

/// Sampling settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 picks the most likely token.
    pub temperature: f32,
    /// Keep only the k most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches p (1: all).
    pub top_p: f32,
    /// Seed of the random stream.
    pub seed: u64,
}

impl SamplingParams {
    /// Sampling from the whole distribution at temperature 1 (no top-k or top-p cut),
    /// seeded with `seed`.
    pub fn unfiltered(seed: u64) -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed,
        }
    }

    /// Checks the settings; the error names the field.
    pub fn validate(&self) -> Result<(), EngineError> {
        if !(0.0..=MAX_TEMPERATURE).contains(&self.temperature) {
            return Err(EngineError::Input(format!(
                "temperature {} must be in [0, {MAX_TEMPERATURE}]",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(EngineError::Input(format!("top_p {} must be in (0, 1]", self.top_p)));
        }
        Ok(())
    }
}

impl SamplingParams {
    /// The settings as the integer definition takes them, with the random word of draw
    /// `index` of the request's stream.
    pub fn exact(&self, index: u64) -> ExactSettings {
        ExactSettings {
            tau: exact::fixed(self.temperature.to_bits(), TEMPERATURE_SHIFT).max(0) as u32,
            top_k: u32::try_from(self.top_k).unwrap_or(u32::MAX),
            top_p: exact::fixed(self.top_p.to_bits(), TOP_P_SHIFT).clamp(0, 1 << TOP_P_SHIFT) as u32,
            random: exact::draw(self.seed, index),
        }
    }
}

/// The logits a token is drawn from: one lane's, or a guidance pair's with its scale.
#[derive(Debug, Clone, Copy)]
pub enum Logits<'a> {
    /// Unguided: the cond lane's logits as they are.
    Plain(&'a [f32]),
    /// Guided: the cond and uncond lanes' logits, mixed at `gamma` (§6.1).
    Guided {
        /// The cond lane's logits.
        cond: &'a [f32],
        /// The uncond lane's logits.
        uncond: &'a [f32],
        /// The guidance scale.
        gamma: f32,
    },
}

impl Logits<'_> {
    /// The levels the draw samples from; `None` when a logit is NaN.
    fn levels(&self) -> Option<Vec<i32>> {
        match *self {
            Logits::Plain(logits) => exact::levels(logits),
            Logits::Guided { cond, uncond, gamma } => exact::guided_levels(cond, uncond, gamma_fixed(gamma)),
        }
    }

    /// The error of logits without levels, naming the first NaN's lane and index.
    fn nan_error(&self) -> EngineError {
        let nan = |logits: &[f32]| logits.iter().position(|v| v.is_nan());
        let place = match *self {
            Logits::Plain(logits) => nan(logits).map(|i| ("cond", i)),
            Logits::Guided { cond, uncond, .. } => {
                nan(cond).map(|i| ("cond", i)).or(nan(uncond).map(|i| ("uncond", i)))
            }
        };
        match place {
            Some((lane, i)) => EngineError::Unsupported(format!("the {lane} lane's logit {i} is NaN")),
            None => EngineError::Unsupported("a logit is NaN".into()),
        }
    }
}

/// A guidance scale in the units the mix takes: `fix(gamma, 16)`.
pub fn gamma_fixed(gamma: f32) -> u32 {
    exact::fixed(gamma.to_bits(), exact::GAMMA_SHIFT).max(0) as u32
}

/// A request's sampler on the host, the contract's reference for the GPU's: its settings
/// and how many tokens it has drawn (one draw per token, whatever the settings).
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    draws: u64,
}

impl Sampler {
    /// A sampler at the start of the stream `params.seed` names.
    pub fn new(params: SamplingParams) -> Result<Sampler, EngineError> {
        params.validate()?;
        Ok(Sampler { params, draws: 0 })
    }

    /// Picks a token id from `logits`, never `forbidden` (audio_bos).
    pub fn sample(&mut self, logits: Logits<'_>, forbidden: usize) -> Result<u32, EngineError> {
        let settings = self.params.exact(self.draws);
        self.draws += 1;
        let Some(levels) = logits.levels() else {
            return Err(logits.nan_error());
        };
        match exact::choose(ExpTables::get(), &levels, forbidden, &settings) {
            Some(token) => Ok(token as u32),
            None => Err(EngineError::Input(
                "no token to sample: every logit is forbidden".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            seed,
        }
    }

    /// One draw per token whatever the settings: the same seed gives the same tokens, and a
    /// greedy token in between leaves the stream where it would be.
    #[test]
    fn same_seed_same_tokens_one_draw_per_token() {
        let logits = [0.0f32, 1.0, 2.0, -1.0, 0.5];
        let run = |seed| {
            let mut s = Sampler::new(params(1.0, 0, 1.0, seed)).unwrap();
            (0..400)
                .map(|_| s.sample(Logits::Plain(&logits), 99).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let mut sampler = Sampler::new(params(1.0, 0, 1.0, 7)).unwrap();
        let first = sampler.sample(Logits::Plain(&logits), 99).unwrap();
        let second = sampler.sample(Logits::Plain(&logits), 99).unwrap();
        assert_eq!([first, second], run(7)[..2]);
        assert_eq!(sampler.params.exact(2).random, exact::draw(7, 2));
    }

    /// Out-of-range settings are refused naming the field; a NaN logit fails the draw.
    #[test]
    fn refusals_name_the_field() {
        let words = |p: SamplingParams| Sampler::new(p).unwrap_err().to_string();
        assert!(words(params(-1.0, 0, 1.0, 0)).contains("temperature"));
        assert!(words(params(1.0, 0, 0.0, 0)).contains("top_p"));
        let mut s = Sampler::new(params(1.0, 0, 1.0, 0)).unwrap();
        assert!(
            s.sample(Logits::Plain(&[0.0, f32::NAN]), 9)
                .unwrap_err()
                .to_string()
                .contains("cond lane's logit 1 is NaN")
        );
        let guided = Logits::Guided {
            cond: &[0.0, 1.0],
            uncond: &[f32::NAN, 0.0],
            gamma: 1.5,
        };
        assert!(
            s.sample(guided, 9)
                .unwrap_err()
                .to_string()
                .contains("uncond lane's logit 0")
        );
    }

    /// The settings as integers: T and p in fixed point, k saturated.
    #[test]
    fn settings_become_integers() {
        let e = params(1.5, usize::MAX, 0.9, 3).exact(0);
        assert_eq!((e.tau, e.top_k, e.top_p), (1536, u32::MAX, 15_099_494));
        assert_eq!(params(10.0, 0, 1.0, 3).exact(0).top_p, 1 << 24);
    }
}
