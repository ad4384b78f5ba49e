//! The Drama 3 inference engine.
//!
//! - [`checkpoint`]: reading, verifying and validating checkpoints (no GPU).
//! - [`numerics`]: the contract's scalar formats (BF16, E2M1, E4M3).
//! - [`gpu`]: the wgpu device, capabilities, buffers and pipelines.
//! - [`audio`]: reference-voice audio: WAV in and out, resampling, the contract's log-mel.

pub mod audio;
pub mod checkpoint;
pub mod error;
pub mod exec;
pub mod gpu;
pub mod numerics;
pub mod reference;
pub mod session;
pub mod spec;
pub mod weights;
