//! Classifier-free guidance over the two lanes' logits (contract section 6), in FP32 on the
//! host so every platform mixes the same bits: mixed = uncond + gamma * (cond - uncond).

use crate::error::EngineError;

/// Checks a guidance scale: any finite one (1 disables guidance).
pub fn check_gamma(gamma: f32) -> Result<(), EngineError> {
    if gamma.is_finite() {
        Ok(())
    } else {
        Err(EngineError::Input(format!("gamma {gamma} is not finite")))
    }
}

/// Mixes cond and uncond logits with scale `gamma`.
pub fn mix(cond: &[f32], uncond: &[f32], gamma: f32) -> Vec<f32> {
    cond.iter().zip(uncond).map(|(&c, &u)| u + gamma * (c - u)).collect()
}
