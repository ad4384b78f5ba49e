//! The Drama 3 inference engine.
//!
//! - [`checkpoint`]: reading, verifying and validating checkpoints (no GPU).
//! - [`numerics`]: the contract's scalar formats (BF16, E2M1, E4M3).

pub mod checkpoint;
pub mod numerics;
