//! Classifier-free guidance over the two lanes' logits (contract section 6), in FP32 on the
//! host so every platform mixes the same bits: mixed = uncond + gamma * (cond - uncond).

use crate::error::EngineError;

/// The largest guidance scale accepted, by the CLI and the server alike: the recipe's is
/// 1.5, and far past it the mix amplifies rounding noise (at 1e30 it overflows to NaN).
pub const MAX_GAMMA: f32 = 10.0;

/// Checks a guidance scale: in (0, [`MAX_GAMMA`]] (1 disables guidance).
pub fn check_gamma(gamma: f32) -> Result<(), EngineError> {
    if gamma > 0.0 && gamma <= MAX_GAMMA {
        Ok(())
    } else {
        Err(EngineError::Input(format!("gamma {gamma} must be in (0, {MAX_GAMMA}]")))
    }
}

/// Mixes cond and uncond logits with scale `gamma`.
pub fn mix(cond: &[f32], uncond: &[f32], gamma: f32) -> Vec<f32> {
    cond.iter().zip(uncond).map(|(&c, &u)| u + gamma * (c - u)).collect()
}
