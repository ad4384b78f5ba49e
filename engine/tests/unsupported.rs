//! Checkpoints that are valid under the contract but have shapes the kernels cannot run:
//! `Engine::load` refuses them with an error naming the shape, before any step runs.

mod common;

use common::{Fixture, rng, shared_gpu};
use drama_engine::session::Engine;
use drama_fixtures::Preset;
use rand_core::Rng;

/// Writes the tiny preset with `change` applied to its architecture, opens it (the
/// checkpoint itself is valid) and returns the engine's refusal.
fn load_error(label: &str, change: fn(&mut Preset)) -> String {
    let mut preset = Preset::by_name("tiny").expect("tiny preset");
    change(&mut preset);
    let checkpoint = Fixture::generated(&preset, rng(label).next_u64()).open();
    match Engine::load(shared_gpu(), checkpoint) {
        Ok(_) => panic!("the engine loaded a checkpoint its kernels cannot run"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_head_width_attention_cannot_read_is_refused_by_name() {
    let error = load_error("head_dim 24", |p| p.config.head_dim = 24);
    assert!(error.contains("head_dim 24"), "{error}");
    assert!(error.contains("multiple of 16"), "{error}");
}

#[test]
fn a_bf16_input_width_the_linear_kernel_cannot_read_is_refused_by_name() {
    // The dense layer's down projection (BF16, excluded from quantization) reads 100 inputs.
    let error = load_error("intermediate 100", |p| p.config.intermediate_size = 100);
    assert!(error.contains("mlp.down_proj"), "{error}");
    assert!(error.contains("input width 100 is not a multiple of 8"), "{error}");
}
