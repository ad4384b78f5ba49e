//! The Drama 3 inference engine.
//!
//! Checkpoints are read and validated by `drama_checkpoint` (no GPU); the FP64 reference
//! the tests and `drama qualify` compare against is `drama_reference`, which this crate
//! does not depend on.
//!
//! - [`gpu`]: the wgpu device, capabilities, buffers and pipelines.
//! - [`audio`]: reference-voice audio: WAV in and out, resampling, the contract's log-mel.
//! - [`spec`]: a checkpoint described to the graph builder; [`rope`]: the RoPE table.
//! - [`weights`]: weights on the GPU, as stored, split to the binding limit.
//! - [`exec`]: a graph lowered to kernel launches; one pass and one submit per step.
//! - [`session`]: the loaded engine and its lanes (KV caches, prefixes, steps).
//! - [`codec`], [`tower`]: the streaming codec decoder (codes to PCM) and the voice tower.
//! - [`text`], [`sampling`], [`synth`], [`batch`]: text front end, seeded sampling, a
//!   synthesis request and its outcome, continuous batching (and one request alone).
//! - [`guidance`], [`trace`], [`voice`]: guidance mixing, teacher-forced traces, voice files.
//! - [`error`]: the engine's error type.

pub mod audio;
pub mod batch;
pub mod codec;
pub mod error;
pub mod exec;
pub mod files;
pub mod gpu;
pub mod guidance;
pub mod rope;
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
