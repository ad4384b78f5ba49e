//! Describing a validated checkpoint to the graph builder: its model spec and the tensor
//! names the graph refers to (from the checkpoint's declarative table).

use std::collections::BTreeMap;

use drama_graph::drama3::{GlobalWeight, LayerWeight, ModelSpec, MoeSpec, WeightNames};
use drama_graph::ir::Projection;
use drama_kernels::WeightFormat;

use drama_checkpoint::config::ScoringFunc;
use drama_checkpoint::{Checkpoint, LayerMlp, RouterWidth, names};

/// The checkpoint's tensor names, for the graph builder.
pub struct CheckpointNames;

impl WeightNames for CheckpointNames {
    fn layer(&self, template: LayerWeight, i: usize) -> String {
        let projection = |p: Projection, set: [&str; 3]| names::layer(set[p as usize], i);
        match template {
            LayerWeight::InputNorm => names::layer(names::INPUT_NORM, i),
            LayerWeight::Q => names::layer(names::Q_PROJ, i),
            LayerWeight::K => names::layer(names::K_PROJ, i),
            LayerWeight::V => names::layer(names::V_PROJ, i),
            LayerWeight::O => names::layer(names::O_PROJ, i),
            LayerWeight::PostNorm => names::layer(names::POST_ATTN_NORM, i),
            LayerWeight::Dense(p) => projection(p, names::DENSE_MLP),
            LayerWeight::Router => names::layer(names::ROUTER, i),
            LayerWeight::Shared(p) => projection(p, names::SHARED_EXPERT),
            LayerWeight::SharedGate => names::layer(names::SHARED_EXPERT_GATE, i),
        }
    }

    fn global(&self, which: GlobalWeight) -> String {
        match which {
            GlobalWeight::EmbedTokens => names::EMBED_TOKENS,
            GlobalWeight::AudioEmbed => names::AUDIO_EMBED,
            GlobalWeight::FinalNorm => names::FINAL_NORM,
            GlobalWeight::AudioHead => names::AUDIO_HEAD,
        }
        .to_string()
    }
}

/// The model spec of a validated checkpoint.
pub fn model_spec(checkpoint: &Checkpoint) -> ModelSpec {
    let c = &checkpoint.config;
    let formats: BTreeMap<String, WeightFormat> = checkpoint
        .linears
        .iter()
        .map(|(module, info)| (module.clone(), info.format.kernel_format()))
        .collect();
    let layers = checkpoint
        .layers
        .iter()
        .enumerate()
        .map(|(i, mlp)| match mlp {
            LayerMlp::Dense => None,
            LayerMlp::Moe(moe) => {
                let first = moe.kept_expert_ids[0];
                let expert_formats = names::EXPERT.map(|t| formats[&names::expert(t, i, first)]);
                Some(MoeSpec {
                    kept: moe.kept_expert_ids.len(),
                    full_width_router: moe.router_width == RouterWidth::Full,
                    score_bias: moe.has_score_bias,
                    expert_formats,
                })
            }
        })
        .collect();
    ModelSpec {
        hidden: c.hidden_size,
        heads: c.num_attention_heads,
        kv_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
        eps: c.rms_norm_eps as f32,
        audio_vocab: c.speech.audio_vocab_size,
        dense_width: c.intermediate_size,
        expert_width: c.moe_intermediate_size,
        shared_width: c.shared_expert_intermediate_size,
        top_k: c.num_experts_per_tok,
        num_experts: c.num_experts,
        sigmoid: c.router.scoring_func == ScoringFunc::Sigmoid,
        norm_topk_prob: c.router.norm_topk_prob,
        routed_scaling_factor: c.router.routed_scaling_factor as f32,
        n_group: c.router.n_group,
        topk_group: c.router.topk_group,
        layers,
        formats,
    }
}
