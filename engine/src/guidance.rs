//! Classifier-free guidance: the accepted scales. The mix itself is integer arithmetic on
//! the two lanes' logit levels (`docs/contract.md` §6.1, [`crate::sampling::exact::mixed_level`]),
//! so the host and the GPU mix the same bits under any compiler's float rules.

use crate::error::EngineError;

/// The largest guidance scale accepted, by the CLI and the server alike: the recipe's is
/// 1.5, and far past it the mix amplifies the logits' rounding noise.
pub const MAX_GAMMA: f32 = 10.0;

/// Checks a guidance scale: in (0, [`MAX_GAMMA`]] (1 disables guidance).
pub fn check_gamma(gamma: f32) -> Result<(), EngineError> {
    if gamma > 0.0 && gamma <= MAX_GAMMA {
        Ok(())
    } else {
        Err(EngineError::Input(format!("gamma {gamma} must be in (0, {MAX_GAMMA}]")))
    }
}
