//! The FP64 CPU reference: every op ([`ops`]) and the whole backbone ([`ReferenceModel`]),
//! written from the contract and sharing nothing with the GPU kernels but the checkpoint.
//! Tests compare the GPU against it.

pub mod codec;
mod model;
pub mod ops;
pub mod stored;
pub mod tower;
pub mod weights;

pub use model::{ForcedRoutes, ReferenceModel, ReferenceTrace, TokenRoute, forced_routes};

/// The relative L2 distance of a GPU result from the reference's values:
/// ||got - want|| / ||want||.
pub fn rel_l2(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(&g, &w)| (f64::from(g) - w).powi(2)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}
