//! Model descriptions the graph tests build steps of.
#![allow(dead_code)]

use std::collections::BTreeMap;

use drama_graph::drama3::{GlobalWeight, LayerWeight, ModelSpec, MoeSpec, WeightNames};
use drama_kernels::WeightFormat;

/// Weight names made of the template and the layer.
pub struct Names;

impl WeightNames for Names {
    fn layer(&self, template: LayerWeight, layer: usize) -> String {
        format!("layers.{layer}.{template:?}")
    }

    fn global(&self, which: GlobalWeight) -> String {
        format!("{which:?}")
    }
}

/// The bench shape (`drama fixture --preset bench`): hidden 2048, 24 layers, the first
/// dense, 23 MoE layers keeping 128 of 256 experts, top-8, a shared expert, routed experts
/// in NVFP4.
pub fn bench_spec() -> ModelSpec {
    let moe = MoeSpec {
        kept: 128,
        full_width_router: false,
        score_bias: false,
        expert_formats: [WeightFormat::Nvfp4; 3],
    };
    ModelSpec {
        hidden: 2048,
        heads: 16,
        kv_heads: 4,
        head_dim: 128,
        eps: 1e-6,
        audio_vocab: 4098,
        dense_width: 6144,
        expert_width: 768,
        shared_width: 2048,
        top_k: 8,
        num_experts: 256,
        sigmoid: false,
        norm_topk_prob: true,
        routed_scaling_factor: 1.0,
        n_group: 1,
        topk_group: 1,
        layers: (0..24).map(|i| (i != 0).then(|| moe.clone())).collect(),
        formats: BTreeMap::new(),
    }
}

/// A small model: a dense layer, then a MoE layer with a shared expert (`experts`: the
/// routed experts' format), all else BF16.
pub fn small_spec(experts: WeightFormat) -> ModelSpec {
    let moe = MoeSpec {
        kept: 12,
        full_width_router: false,
        score_bias: false,
        expert_formats: [experts; 3],
    };
    ModelSpec {
        hidden: 64,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        eps: 1e-6,
        audio_vocab: 34,
        dense_width: 96,
        expert_width: 32,
        shared_width: 48,
        top_k: 2,
        num_experts: 16,
        sigmoid: false,
        norm_topk_prob: true,
        routed_scaling_factor: 1.0,
        n_group: 1,
        topk_group: 1,
        layers: vec![None, Some(moe)],
        formats: BTreeMap::new(),
    }
}
