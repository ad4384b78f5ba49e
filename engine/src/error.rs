//! The engine's error type at its library boundary.

use crate::audio::AudioError;
use crate::gpu::GpuError;
use drama_checkpoint::CheckpointError;

/// Why the engine could not load or run a model.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The checkpoint was refused.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The GPU could not be used.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// The graph could not be built (an op's inputs did not fit).
    #[error("graph: {0}")]
    Graph(drama_graph::GraphError),
    /// The checkpoint is valid but this engine cannot run it on this device.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Reference audio was refused.
    #[error(transparent)]
    Audio(#[from] AudioError),
    /// A request does not fit the model or the session.
    #[error("invalid input: {0}")]
    Input(String),
    /// A token cap per segment that leaves no position of the context for text.
    #[error(
        "max_audio_tokens {max_audio_tokens} leaves no room for text in the context of {positions} positions \
         ({prefix_len} of them the voice prefix)"
    )]
    NoRoomForText {
        /// The cap asked for.
        max_audio_tokens: usize,
        /// Positions of the context.
        positions: usize,
        /// Positions the voice prefix takes.
        prefix_len: usize,
    },
}

/// Not `#[from]`: that would also make the graph error the source, and a chain printed whole
/// (`{:#}`) would name it twice.
impl From<drama_graph::GraphError> for EngineError {
    fn from(error: drama_graph::GraphError) -> Self {
        Self::Graph(error)
    }
}
