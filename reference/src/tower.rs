//! The voice tower in FP64 (contract section 7): log-mel frames to a voice prefix.

use super::ops::{self, Matrix, Rounding};
use super::weights;
use drama_checkpoint::{Checkpoint, names};

/// gelu(x) = 0.5 x (1 + erf(x / sqrt 2)), with the pure-Rust libm erf.
pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

/// Encodes `mel` ([frames, n_mels]) into the [P, H] prefix.
pub fn encode(checkpoint: &Checkpoint, mel: &[f64], frames: usize, rounding: Rounding) -> Vec<f64> {
    let c = &checkpoint.config;
    let d = c.voice_tower.dim;
    let eps = c.rms_norm_eps;
    let linear = |module: &str| -> Matrix { weights::linear(checkpoint, module) };
    let mut x = ops::linear(mel, frames, &linear(names::TOWER_IN), rounding, true);
    for j in 0..c.voice_tower.blocks {
        let at = |t: &str| names::fill(t, &[("j", j)]);
        let normed = ops::rms_norm(&x, d, &weights::values(checkpoint, &at(names::TOWER_NORM)), eps);
        let hidden = ops::linear(&normed, frames, &linear(&at(names::TOWER_FC1)), rounding, true);
        let act: Vec<f64> = hidden.iter().map(|&v| gelu(v)).collect();
        let out = ops::linear(&act, frames, &linear(&at(names::TOWER_FC2)), rounding, true);
        for (a, b) in x.iter_mut().zip(&out) {
            *a += b;
        }
    }
    let normed = ops::rms_norm(&x, d, &weights::values(checkpoint, names::TOWER_OUT_NORM), eps);
    let mean: Vec<f64> = (0..d)
        .map(|col| (0..frames).map(|t| normed[t * d + col]).sum::<f64>() / frames as f64)
        .collect();
    ops::linear(&mean, 1, &linear(names::TOWER_OUT), rounding, true)
}
