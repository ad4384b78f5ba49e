//! The FP64 CPU reference: every op ([`ops`]) and the whole backbone ([`ReferenceModel`]),
//! written from the contract and sharing nothing with the GPU kernels but the checkpoint.
//! Tests compare the GPU against it.

pub mod codec;
mod model;
pub mod ops;
pub mod stored;
pub mod tower;
pub mod weights;

pub use model::{ForcedRoutes, ReferenceModel, ReferenceTrace, TokenRoute};
