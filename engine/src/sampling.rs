//! Seeded sampling of the next audio token from the (guidance-mixed) logits.
//!
//! Deterministic on every platform: candidates are ranked by exact f32 comparisons (ties to
//! the lower id), probabilities are computed in f64 with the pure-Rust `libm` (not the
//! platform's math library), and the random stream is ChaCha8 from the u64 seed.
//! `audio_bos` is never sampled; codes and `audio_eos` are.

use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

use crate::error::EngineError;

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

/// A sampler: the settings and the random stream they started.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// A sampler seeded with `params.seed`.
    pub fn new(params: SamplingParams) -> Result<Sampler, EngineError> {
        params.validate()?;
        Ok(Sampler {
            rng: ChaCha8Rng::seed_from_u64(params.seed),
            params,
        })
    }

    /// Picks a token id from `logits`, never `forbidden` (audio_bos).
    pub fn sample(&mut self, logits: &[f32], forbidden: usize) -> Result<u32, EngineError> {
        if let Some(i) = logits.iter().position(|v| v.is_nan()) {
            return Err(EngineError::Unsupported(format!("logit {i} is NaN")));
        }
        // Each candidate as one integer, smaller = more likely, ties toward the lower id (a
        // total order, so partial selections below pick exactly the ids a full sort would
        // put first).
        let mut keys: Vec<u64> = (0..logits.len())
            .filter(|&i| i != forbidden)
            .map(|i| candidate_key(logits[i], i))
            .collect();
        // One draw per token whatever the settings, so the stream stays aligned.
        let draw = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        if self.params.temperature == 0.0 {
            let best = keys.iter().min().expect("at least one candidate");
            return Ok(candidate_id(*best) as u32);
        }
        // Only the top k need ordering.
        if self.params.top_k > 0 && self.params.top_k < keys.len() {
            keys.select_nth_unstable(self.params.top_k - 1);
            keys.truncate(self.params.top_k);
            keys.sort_unstable();
        } else {
            sort_in_id_order(&mut keys);
        }
        let order: Vec<usize> = keys.iter().map(|&key| candidate_id(key)).collect();
        Ok(order[choose(&order, logits, &self.params, draw)] as u32)
    }
}

/// Sorts candidate keys made in ascending id order: a stable radix sort of their logit halves
/// (three passes of 11 bits), so candidates with equal logits keep their ids ascending and
/// the result is the keys' full order, in linear time where a comparison sort of a whole
/// vocabulary would take n log n (the same tokens either way).
fn sort_in_id_order(keys: &mut Vec<u64>) {
    let mut scratch = vec![0u64; keys.len()];
    for shift in [32u32, 43, 54] {
        let digit = |key: u64| ((key >> shift) & 0x7ff) as usize;
        let mut starts = [0usize; 0x800];
        for &key in keys.iter() {
            starts[digit(key)] += 1;
        }
        let mut total = 0;
        for start in starts.iter_mut() {
            let count = *start;
            *start = total;
            total += count;
        }
        for &key in keys.iter() {
            let place = &mut starts[digit(key)];
            scratch[*place] = key;
            *place += 1;
        }
        std::mem::swap(keys, &mut scratch);
    }
}

/// An integer that orders like `f32::total_cmp` orders the floats.
fn total_order_key(value: f32) -> i32 {
    let bits = value.to_bits() as i32;
    bits ^ (((bits >> 31) as u32) >> 1) as i32
}

/// Candidate `id` with logit `logit` as one integer: the logit's total-order key inverted
/// (most likely smallest) above the id (ties toward the lower id).
fn candidate_key(logit: f32, id: usize) -> u64 {
    (u64::from(!((total_order_key(logit) as u32) ^ 0x8000_0000)) << 32) | id as u64
}

/// The id a [`candidate_key`] holds.
fn candidate_id(key: u64) -> usize {
    (key & 0xFFFF_FFFF) as usize
}

/// Which of the `order`ed candidates (most likely first, already cut to top-k) a draw in
/// [0, 1) picks: softmax at the temperature, cut to the top-p nucleus, then the draw's place
/// in the cumulative weights.
fn choose(order: &[usize], logits: &[f32], params: &SamplingParams, draw: f64) -> usize {
    let t = f64::from(params.temperature);
    let best = f64::from(logits[order[0]]);
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| libm::exp((f64::from(logits[i]) - best) / t))
        .collect();
    let total: f64 = weights.iter().sum();
    let mut keep = weights.len();
    if params.top_p < 1.0 {
        let mut cumulative = 0.0;
        for (n, w) in weights.iter().enumerate() {
            cumulative += w / total;
            if cumulative >= f64::from(params.top_p) {
                keep = n + 1;
                break;
            }
        }
    }
    let kept_total: f64 = weights[..keep].iter().sum();
    let target = draw * kept_total;
    let mut cumulative = 0.0;
    for (n, w) in weights[..keep].iter().enumerate() {
        cumulative += w;
        if target < cumulative {
            return n;
        }
    }
    keep - 1
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

    #[test]
    fn greedy_picks_the_first_maximum_and_skips_bos() {
        let mut s = Sampler::new(params(0.0, 0, 1.0, 1)).unwrap();
        assert_eq!(s.sample(&[1.0, 5.0, 5.0, 9.0], 3).unwrap(), 1);
    }

    #[test]
    fn same_seed_same_tokens_and_frequencies_follow_softmax() {
        let logits = [0.0f32, 1.0, 2.0, -1.0];
        let run = |seed| {
            let mut s = Sampler::new(params(1.0, 0, 1.0, seed)).unwrap();
            (0..4000).map(|_| s.sample(&logits, 99).unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let tokens = run(11);
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        for (id, &l) in logits.iter().enumerate() {
            let expected = f64::from(l).exp() / z;
            let seen = tokens.iter().filter(|&&t| t as usize == id).count() as f64 / tokens.len() as f64;
            assert!((seen - expected).abs() < 0.03, "token {id}: {seen} vs {expected}");
        }
    }

    #[test]
    fn top_k_and_top_p_restrict_the_candidates() {
        let logits = [3.0f32, 2.9, 0.0, -5.0];
        let mut s = Sampler::new(params(1.0, 2, 1.0, 3)).unwrap();
        assert!((0..500).all(|_| s.sample(&logits, 99).unwrap() < 2));
        let mut s = Sampler::new(params(1.0, 0, 0.5, 3)).unwrap();
        assert!((0..500).all(|_| s.sample(&logits, 99).unwrap() == 0));
        assert!(
            Sampler::new(params(-1.0, 0, 1.0, 0))
                .unwrap_err()
                .to_string()
                .contains("temperature")
        );
        assert!(
            Sampler::new(params(1.0, 0, 0.0, 0))
                .unwrap_err()
                .to_string()
                .contains("top_p")
        );
    }

    #[test]
    fn radix_sort_of_keys_in_id_order_is_their_full_order() {
        let mut rng = crate::test_support::rng("sampling radix sort");
        for case in 0..20 {
            // Any f32 bit pattern but NaN (signed zeros and infinities included), or
            // quantised values full of ties.
            let logits: Vec<f32> = (0..4097)
                .map(|_| match case % 2 {
                    0 => f32::from_bits(rng.next_u32()),
                    _ => ((rng.next_u32() % 9) as f32 - 4.0) * 0.5,
                })
                .map(|v| if v.is_nan() { -0.0 } else { v })
                .collect();
            let mut keys: Vec<u64> = logits.iter().enumerate().map(|(i, &l)| candidate_key(l, i)).collect();
            let mut want = keys.clone();
            want.sort_unstable();
            sort_in_id_order(&mut keys);
            assert_eq!(keys, want, "case {case}");
        }
    }

    #[test]
    fn integer_keys_order_like_total_cmp() {
        let mut rng = crate::test_support::rng("sampling keys");
        let mut values: Vec<f32> = (0..2000)
            .map(|_| f32::from_bits(rng.next_u32()))
            .filter(|v| !v.is_nan())
            .collect();
        values.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
        ]);
        for pair in values.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            assert_eq!(
                total_order_key(a).cmp(&total_order_key(b)),
                a.total_cmp(&b),
                "{a} vs {b}"
            );
        }
    }

    /// The choice with every candidate fully sorted first (the selection's oracle).
    fn full_sort_choice(logits: &[f32], forbidden: usize, p: &SamplingParams, draw: f64) -> u32 {
        let mut order: Vec<usize> = (0..logits.len()).filter(|&i| i != forbidden).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if p.temperature == 0.0 {
            return order[0] as u32;
        }
        if p.top_k > 0 {
            order.truncate(p.top_k);
        }
        order[choose(&order, logits, p, draw)] as u32
    }

    /// The selections and sorts of `sample` (partial selection for top-k, a radix sort
    /// otherwise) against a comparison sort of every candidate.
    #[test]
    fn partial_selection_picks_what_a_full_sort_picks() {
        let mut rng = crate::test_support::rng("sampling selection");
        for case in 0..60u64 {
            // Quantised logits, so ties are common; every fifth case as many candidates as
            // an audio head has.
            let candidates = if case % 5 == 4 { 4097 } else { 200 };
            let logits: Vec<f32> = (0..candidates)
                .map(|_| ((rng.next_u32() % 40) as f32 - 20.0) * 0.25)
                .collect();
            let p = params(
                [0.0, 0.7, 1.3][case as usize % 3],
                [0, 1, 5, 50][case as usize % 4],
                [1.0, 0.9, 0.3][(case / 3) as usize % 3],
                case,
            );
            let mut sampler = Sampler::new(p).unwrap();
            let mut oracle_rng = ChaCha8Rng::seed_from_u64(case);
            for _ in 0..5 {
                let draw = (oracle_rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                assert_eq!(
                    sampler.sample(&logits, 7).unwrap(),
                    full_sort_choice(&logits, 7, &p, draw),
                    "{p:?}"
                );
            }
        }
    }
}
