//! The Drama 3 inference engine.
//!
//! - [`checkpoint`]: reading, verifying and validating checkpoints (no GPU).
//! - [`numerics`]: the contract's scalar formats (BF16, E2M1, E4M3).
//! - [`gpu`]: the wgpu device, capabilities, buffers and pipelines.
//! - [`audio`]: reference-voice audio: WAV in and out, resampling, the contract's log-mel.
//! - [`spec`]: a checkpoint described to the graph builder.
//! - [`weights`]: weights on the GPU, as stored, split to the binding limit.
//! - [`exec`]: a graph lowered to kernel launches; one pass and one submit per step.
//! - [`session`]: the loaded engine and its lanes (KV caches, prefixes, steps).
//! - [`codec`], [`tower`]: the streaming codec decoder (codes to PCM) and the voice tower.
//! - [`text`], [`sampling`], [`synth`], [`batch`]: text front end, seeded sampling, synthesis, continuous batching.
//! - [`guidance`], [`trace`], [`voice`]: guidance mixing, teacher-forced traces, voice files.
//! - [`reference`]: the FP64 CPU reference of every op and of the whole backbone.
//! - [`bench`]: the benchmark suite of `drama bench`.
//! - [`error`]: the engine's error type.

pub mod audio;
pub mod batch;
pub mod bench;
pub mod checkpoint;
pub mod codec;
pub mod error;
pub mod exec;
pub mod files;
pub mod gpu;
pub mod guidance;
pub mod numerics;
pub mod reference;
pub mod sampling;
pub mod session;
pub mod spec;
mod step_cache;
pub mod synth;
#[doc(hidden)]
pub mod test_support;
pub mod text;
pub mod tower;
pub mod trace;
pub mod voice;
pub mod weights;
