//! The Drama 3 op graph: a closed set of typed ops with shape and dtype inference
//! ([`ir`], [`infer`]), the model's plain graph of one step ([`drama3`]), the passes that
//! decide how it runs ([`passes`]) with the kernel choices they ask ([`select`]), the static
//! memory plan ([`plan`]) and text/JSON/DOT dumps ([`dump`]). It knows nothing of wgpu.

pub mod drama3;
pub mod dump;
mod graph;
pub mod infer;
pub mod ir;
pub mod passes;
pub mod plan;
pub mod select;

pub use graph::{Graph, GraphBuilder, GraphError, Node};
pub use ir::{DType, NormOutput, Op, Value, ValueId, ValueKind};
