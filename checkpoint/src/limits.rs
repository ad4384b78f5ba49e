//! The engine's own limits: what its kernels run beyond what the contract requires
//! (`docs/contract.md` §11). They are checked when a checkpoint opens, beside the
//! contract's rules, so whatever `drama verify` accepts the engine loads, and whatever it
//! refuses is refused by `synth`, `serve` and `trace` with the same words.

use std::collections::BTreeMap;

use drama_kernels::MAX_HEAD_DIM;

use super::{CheckpointError, LayerMlp, LinearFormat, LinearInfo, ModelConfig, names};

/// The limits `config.json` alone decides: `head_dim` (attention's workgroup).
pub fn config_beyond_limits(config: &ModelConfig) -> Vec<CheckpointError> {
    let mut found = Vec::new();
    let head_dim = config.head_dim;
    if head_dim > MAX_HEAD_DIM {
        found.push(CheckpointError::EngineLimit {
            what: "config.json key `head_dim`".into(),
            found: head_dim.to_string(),
            limit: format!("up to {MAX_HEAD_DIM} (attention's workgroup holds one query head)"),
        });
    }
    found
}

/// The limits of the tensors, by module name: each backbone linear's input width, then
/// each layer's expert formats. (The voice tower's linears and the BF16 linears that do
/// not read the hidden width run at any width.)
pub fn tensors_beyond_limits(linears: &BTreeMap<String, LinearInfo>, layers: &[LayerMlp]) -> Vec<CheckpointError> {
    let mut found = Vec::new();
    for (module, info) in linears {
        // The codec's convolutions run in kernels of their own, and the voice tower's
        // linears where their width needs it (`Kernel::LinearRagged`), at any width.
        if module.starts_with("codec.") || module.starts_with("voice_tower.") || runs_ragged(module, info) {
            continue;
        }
        let multiple = info.format.kernel_format().width_multiple();
        let width = info.shape[1];
        if !width.is_multiple_of(multiple) {
            found.push(CheckpointError::EngineLimit {
                what: format!("linear {module}'s input width"),
                found: width.to_string(),
                limit: format!(
                    "a multiple of {multiple} for {} weights (a row must start one load of its weights)",
                    info.format.describe()
                ),
            });
        }
    }
    for (layer, mlp) in layers.iter().enumerate() {
        let LayerMlp::Moe(moe) = mlp else { continue };
        for projection in names::EXPERT {
            let format_of =
                |expert: usize| -> LinearFormat { linears[&names::expert(projection, layer, expert)].format };
            let first = moe.kept_expert_ids[0];
            if let Some(&other) = moe.kept_expert_ids.iter().find(|&&e| format_of(e) != format_of(first)) {
                found.push(CheckpointError::EngineLimit {
                    what: format!("layer {layer}'s routed experts"),
                    found: format!(
                        "{} in {} but {} in {}",
                        format_of(first).describe(),
                        names::expert(projection, layer, first),
                        format_of(other).describe(),
                        names::expert(projection, layer, other)
                    ),
                    limit: "one format per projection across a layer's experts (one launch reads them all)".into(),
                });
            }
        }
    }
    found
}

/// Whether a backbone linear runs at any input width: a BF16 attention output projection,
/// or a dense layer's or shared expert's BF16 down projection, which the graph builds as
/// plain linears (`Kernel::LinearRagged` reads their f32 inputs where the width needs it).
/// The others read the hidden width, fused with the work beside them.
fn runs_ragged(module: &str, info: &LinearInfo) -> bool {
    info.format == LinearFormat::Bf16
        && module.starts_with("model.layers.")
        && [".self_attn.o_proj", ".mlp.down_proj", ".mlp.shared_expert.down_proj"]
            .iter()
            .any(|tail| module.ends_with(tail))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MoeLayer, RouterWidth};

    fn linear(module: String, format: LinearFormat, width: usize) -> (String, LinearInfo) {
        let info = LinearInfo {
            module: module.clone(),
            format,
            shape: vec![32, width],
            has_bias: false,
            tensor_scale: 1.0,
            stored_bytes: 0,
        };
        (module, info)
    }

    /// The down projections of dense layers and shared experts run at any BF16 width; a
    /// BF16 linear reading the hidden width keeps its multiple of 8, and an NVFP4 one its
    /// multiple of 16 (the format's block).
    #[test]
    fn only_bf16_down_projections_run_at_any_width() {
        let linears: BTreeMap<String, LinearInfo> = [
            linear("model.layers.0.mlp.down_proj".into(), LinearFormat::Bf16, 98),
            linear(
                "model.layers.1.mlp.shared_expert.down_proj".into(),
                LinearFormat::Bf16,
                52,
            ),
            linear("model.layers.0.mlp.gate_proj".into(), LinearFormat::Bf16, 60),
            linear(
                "model.layers.2.mlp.shared_expert.down_proj".into(),
                LinearFormat::Nvfp4ModelOpt,
                40,
            ),
        ]
        .into_iter()
        .collect();
        let words: Vec<String> = tensors_beyond_limits(&linears, &[])
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            words,
            [
                "linear model.layers.0.mlp.gate_proj's input width is 60; this engine runs a multiple of 8 for BF16 \
                 weights (a row must start one load of its weights)",
                "linear model.layers.2.mlp.shared_expert.down_proj's input width is 40; this engine runs a multiple \
                 of 16 for NVFP4 (ModelOpt) weights (a row must start one load of its weights)",
            ]
        );
    }

    /// A layer whose experts mix formats in one projection is refused, naming both experts;
    /// one format per projection (another in another projection) passes.
    #[test]
    fn experts_of_a_layer_share_one_format_per_projection() {
        let layers = vec![LayerMlp::Moe(MoeLayer {
            kept_expert_ids: vec![2, 5],
            router_width: RouterWidth::Compact,
            has_score_bias: false,
        })];
        let experts = |down_of_5: LinearFormat| -> BTreeMap<String, LinearInfo> {
            [2, 5]
                .into_iter()
                .flat_map(|e| {
                    names::EXPERT.iter().enumerate().map(move |(p, template)| {
                        let format = match (p, e) {
                            (2, 5) => down_of_5,
                            (2, _) => LinearFormat::Nvfp4ModelOpt,
                            _ => LinearFormat::Fp8Block,
                        };
                        linear(names::expert(template, 0, e), format, 64)
                    })
                })
                .collect()
        };
        assert!(tensors_beyond_limits(&experts(LinearFormat::Nvfp4ModelOpt), &layers).is_empty());
        let refused = tensors_beyond_limits(&experts(LinearFormat::Fp8Block), &layers);
        let words: Vec<String> = refused.iter().map(ToString::to_string).collect();
        assert_eq!(
            words,
            [
                "layer 0's routed experts is NVFP4 (ModelOpt) in model.layers.0.mlp.experts.2.down_proj but FP8 \
              block-scaled in model.layers.0.mlp.experts.5.down_proj; this engine runs one format per projection \
              across a layer's experts (one launch reads them all)"
            ]
        );
    }
}
