//! The declarative tensor table of the contract (section 3): every tensor name template, and
//! the rule (dtype and shape, or "a linear of this size") each name must satisfy.
//!
//! Adapting the engine to a checkpoint that names things differently is an edit here and
//! nowhere else: the loader, the fixture generator and the graph builder all read these names.

use safetensors::Dtype;

use super::config::{ModelConfig, ScoringFunc};

/// Tensor and module name templates. `{i}` is a decoder layer, `{e}` an ORIGINAL expert id,
/// `{j}` a voice-tower block, `{u}` a codec stage, `{r}` a residual unit.
pub mod names {
    /// Text token embeddings [VT, H].
    pub const EMBED_TOKENS: &str = "model.embed_tokens.weight";
    /// Audio token embeddings [C+2, H].
    pub const AUDIO_EMBED: &str = "model.audio_embed.weight";
    /// Pre-attention RMSNorm weight.
    pub const INPUT_NORM: &str = "model.layers.{i}.input_layernorm.weight";
    /// Attention query projection (module).
    pub const Q_PROJ: &str = "model.layers.{i}.self_attn.q_proj";
    /// Attention key projection (module).
    pub const K_PROJ: &str = "model.layers.{i}.self_attn.k_proj";
    /// Attention value projection (module).
    pub const V_PROJ: &str = "model.layers.{i}.self_attn.v_proj";
    /// Attention output projection (module).
    pub const O_PROJ: &str = "model.layers.{i}.self_attn.o_proj";
    /// Pre-MLP RMSNorm weight.
    pub const POST_ATTN_NORM: &str = "model.layers.{i}.post_attention_layernorm.weight";
    /// Dense MLP projections (modules): gate, up, down.
    pub const DENSE_MLP: [&str; 3] = [
        "model.layers.{i}.mlp.gate_proj",
        "model.layers.{i}.mlp.up_proj",
        "model.layers.{i}.mlp.down_proj",
    ];
    /// Router weight [E_kept or E, H].
    pub const ROUTER: &str = "model.layers.{i}.mlp.gate.weight";
    /// Original ids of the kept experts, strictly ascending.
    pub const KEPT_EXPERT_IDS: &str = "model.layers.{i}.mlp.kept_expert_ids";
    /// Sigmoid routers' selection bias [E_kept or E].
    pub const ROUTER_BIAS: &str = "model.layers.{i}.mlp.gate.e_score_correction_bias";
    /// Routed expert projections (modules): gate, up, down.
    pub const EXPERT: [&str; 3] = [
        "model.layers.{i}.mlp.experts.{e}.gate_proj",
        "model.layers.{i}.mlp.experts.{e}.up_proj",
        "model.layers.{i}.mlp.experts.{e}.down_proj",
    ];
    /// Prefix shared by every routed-expert tensor of a layer.
    pub const EXPERT_PREFIX: &str = "model.layers.{i}.mlp.experts.";
    /// Shared expert projections (modules): gate, up, down.
    pub const SHARED_EXPERT: [&str; 3] = [
        "model.layers.{i}.mlp.shared_expert.gate_proj",
        "model.layers.{i}.mlp.shared_expert.up_proj",
        "model.layers.{i}.mlp.shared_expert.down_proj",
    ];
    /// Shared-expert gate [1, H].
    pub const SHARED_EXPERT_GATE: &str = "model.layers.{i}.mlp.shared_expert_gate.weight";
    /// Final RMSNorm weight.
    pub const FINAL_NORM: &str = "model.norm.weight";
    /// Audio head [C+2, H].
    pub const AUDIO_HEAD: &str = "audio_head.weight";

    /// Voice tower input projection (module).
    pub const TOWER_IN: &str = "voice_tower.in_proj";
    /// Voice tower block norm.
    pub const TOWER_NORM: &str = "voice_tower.blocks.{j}.norm.weight";
    /// Voice tower block first linear (module).
    pub const TOWER_FC1: &str = "voice_tower.blocks.{j}.fc1";
    /// Voice tower block second linear (module).
    pub const TOWER_FC2: &str = "voice_tower.blocks.{j}.fc2";
    /// Voice tower output norm.
    pub const TOWER_OUT_NORM: &str = "voice_tower.out_norm.weight";
    /// Voice tower output projection (module).
    pub const TOWER_OUT: &str = "voice_tower.out_proj";
    /// The unconditional (guidance) prefix [P, H].
    pub const NULL_PREFIX: &str = "voice_tower.null_prefix";
    /// The prefix used when no voice is given [P, H].
    pub const DEFAULT_PREFIX: &str = "voice_tower.default_prefix";

    /// Codec codebook [C, D_c].
    pub const CODEBOOK: &str = "codec.codebook";
    /// Codec input convolution (module).
    pub const CODEC_IN: &str = "codec.in_conv";
    /// Snake alpha before each upsampling stage.
    pub const STAGE_SNAKE: &str = "codec.blocks.{u}.snake.alpha";
    /// Transposed convolution of each stage (module).
    pub const STAGE_UP: &str = "codec.blocks.{u}.up";
    /// Residual unit: first snake alpha.
    pub const RES_SNAKE1: &str = "codec.blocks.{u}.res.{r}.snake1.alpha";
    /// Residual unit: dilated convolution (module).
    pub const RES_CONV1: &str = "codec.blocks.{u}.res.{r}.conv1";
    /// Residual unit: second snake alpha.
    pub const RES_SNAKE2: &str = "codec.blocks.{u}.res.{r}.snake2.alpha";
    /// Residual unit: pointwise convolution (module).
    pub const RES_CONV2: &str = "codec.blocks.{u}.res.{r}.conv2";
    /// Snake alpha before the output convolution.
    pub const OUT_SNAKE: &str = "codec.out_snake.alpha";
    /// Output convolution (module).
    pub const CODEC_OUT: &str = "codec.out_conv";

    /// Fills a template: each `(placeholder, value)` pair replaces `{placeholder}`.
    pub fn fill(template: &str, values: &[(&str, usize)]) -> String {
        let mut name = template.to_string();
        for (key, value) in values {
            name = name.replace(&format!("{{{key}}}"), &value.to_string());
        }
        name
    }

    /// Fills a per-layer template.
    pub fn layer(template: &str, i: usize) -> String {
        fill(template, &[("i", i)])
    }

    /// Fills a per-expert template.
    pub fn expert(template: &str, i: usize, e: usize) -> String {
        fill(template, &[("i", i), ("e", e)])
    }
}

/// What a linear module is allowed to be stored as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearKind {
    /// A backbone linear: any format of section 4, as the quant config says.
    Quantizable,
    /// Always BF16 (voice tower, codec).
    Bf16Only,
}

/// Whether a rule's tensor must be present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Must be present.
    Required,
    /// May be absent.
    Optional,
}

/// One entry of the table.
#[derive(Debug, Clone, PartialEq)]
pub enum Rule {
    /// A plain tensor of a fixed dtype and one of the allowed shapes.
    Tensor {
        /// Full tensor name.
        name: String,
        /// Required dtype.
        dtype: Dtype,
        /// Allowed shapes (more than one when, e.g., a router may be compact or full-width).
        shapes: Vec<Vec<usize>>,
        /// Whether it must be present.
        presence: Presence,
    },
    /// A linear (or convolution) module: weight tensors in one detected format, and an
    /// optional or required BF16 bias.
    Linear {
        /// Module name (tensor names without their last component).
        module: String,
        /// Weight shape as stored (outermost first); `[out, in]` for linears,
        /// convolution kernels have a third dimension.
        shape: Vec<usize>,
        /// Whether a `bias` [shape[0] or as given] is required.
        bias: Option<usize>,
        /// Which formats are allowed.
        kind: LinearKind,
    },
}

impl Rule {
    fn tensor(name: String, dtype: Dtype, shape: Vec<usize>) -> Rule {
        Rule::Tensor {
            name,
            dtype,
            shapes: vec![shape],
            presence: Presence::Required,
        }
    }

    fn linear(module: String, out: usize, in_: usize, bias: bool) -> Rule {
        Rule::Linear {
            module,
            shape: vec![out, in_],
            bias: bias.then_some(out),
            kind: LinearKind::Quantizable,
        }
    }

    fn bf16_linear(module: String, shape: Vec<usize>, bias: Option<usize>) -> Rule {
        Rule::Linear {
            module,
            shape,
            bias,
            kind: LinearKind::Bf16Only,
        }
    }
}

/// The rules of the backbone, given each MoE layer's kept original expert ids
/// (`kept[i]` is `None` for dense layers).
pub fn backbone_rules(config: &ModelConfig, kept: &[Option<Vec<usize>>]) -> Vec<Rule> {
    use names::*;
    let h = config.hidden_size;
    let audio_vocab = config.speech.audio_vocab_size;
    let q_out = config.num_attention_heads * config.head_dim;
    let kv_out = config.num_key_value_heads * config.head_dim;
    let mut rules = vec![
        Rule::tensor(EMBED_TOKENS.into(), Dtype::BF16, vec![config.text_vocab_size, h]),
        Rule::tensor(AUDIO_EMBED.into(), Dtype::BF16, vec![audio_vocab, h]),
    ];
    for (i, kept_ids) in kept.iter().enumerate() {
        rules.push(Rule::tensor(layer(INPUT_NORM, i), Dtype::BF16, vec![h]));
        rules.push(Rule::linear(layer(Q_PROJ, i), q_out, h, true));
        rules.push(Rule::linear(layer(K_PROJ, i), kv_out, h, true));
        rules.push(Rule::linear(layer(V_PROJ, i), kv_out, h, true));
        rules.push(Rule::linear(layer(O_PROJ, i), h, q_out, false));
        rules.push(Rule::tensor(layer(POST_ATTN_NORM, i), Dtype::BF16, vec![h]));
        match kept_ids {
            None => {
                let f = config.intermediate_size;
                for (module, (out, in_)) in DENSE_MLP.iter().zip([(f, h), (f, h), (h, f)]) {
                    rules.push(Rule::linear(layer(module, i), out, in_, false));
                }
            }
            Some(ids) => rules.extend(moe_rules(config, i, ids)),
        }
    }
    rules.push(Rule::tensor(FINAL_NORM.into(), Dtype::BF16, vec![h]));
    rules.push(Rule::tensor(AUDIO_HEAD.into(), Dtype::BF16, vec![audio_vocab, h]));
    rules
}

fn moe_rules(config: &ModelConfig, i: usize, kept: &[usize]) -> Vec<Rule> {
    use names::*;
    let h = config.hidden_size;
    let e_full = config.num_experts;
    let widths = vec![vec![kept.len(), h], vec![e_full, h]];
    let mut rules = vec![
        Rule::tensor(layer(KEPT_EXPERT_IDS, i), Dtype::I32, vec![kept.len()]),
        Rule::Tensor {
            name: layer(ROUTER, i),
            dtype: Dtype::BF16,
            shapes: widths,
            presence: Presence::Required,
        },
    ];
    if config.router.scoring_func == ScoringFunc::Sigmoid {
        rules.push(Rule::Tensor {
            name: layer(ROUTER_BIAS, i),
            dtype: Dtype::F32,
            shapes: vec![vec![kept.len()], vec![e_full]],
            presence: Presence::Optional,
        });
    }
    let ie = config.moe_intermediate_size;
    for &e in kept {
        for (module, (out, in_)) in EXPERT.iter().zip([(ie, h), (ie, h), (h, ie)]) {
            rules.push(Rule::linear(expert(module, i, e), out, in_, false));
        }
    }
    let is = config.shared_expert_intermediate_size;
    if is > 0 {
        for (module, (out, in_)) in SHARED_EXPERT.iter().zip([(is, h), (is, h), (h, is)]) {
            rules.push(Rule::linear(layer(module, i), out, in_, false));
        }
        rules.push(Rule::tensor(layer(SHARED_EXPERT_GATE, i), Dtype::BF16, vec![1, h]));
    }
    rules
}

/// Every rule of a checkpoint: backbone, voice tower and codec.
pub fn all_rules(config: &ModelConfig, kept: &[Option<Vec<usize>>]) -> Vec<Rule> {
    let mut rules = backbone_rules(config, kept);
    rules.extend(voice_tower_rules(config));
    rules.extend(codec_rules(config));
    rules
}

/// The rules of the voice tower (all BF16).
pub fn voice_tower_rules(config: &ModelConfig) -> Vec<Rule> {
    use names::*;
    let v = &config.voice_tower;
    let h = config.hidden_size;
    let p = config.speech.voice_prefix_len;
    let mut rules = vec![Rule::bf16_linear(TOWER_IN.into(), vec![v.dim, v.n_mels], Some(v.dim))];
    for j in 0..v.blocks {
        let at = |t: &str| fill(t, &[("j", j)]);
        rules.push(Rule::tensor(at(TOWER_NORM), Dtype::BF16, vec![v.dim]));
        rules.push(Rule::bf16_linear(at(TOWER_FC1), vec![v.ffn, v.dim], Some(v.ffn)));
        rules.push(Rule::bf16_linear(at(TOWER_FC2), vec![v.dim, v.ffn], Some(v.dim)));
    }
    rules.push(Rule::tensor(TOWER_OUT_NORM.into(), Dtype::BF16, vec![v.dim]));
    rules.push(Rule::bf16_linear(TOWER_OUT.into(), vec![p * h, v.dim], Some(p * h)));
    rules.push(Rule::tensor(NULL_PREFIX.into(), Dtype::BF16, vec![p, h]));
    rules.push(Rule::tensor(DEFAULT_PREFIX.into(), Dtype::BF16, vec![p, h]));
    rules
}

/// The rules of the codec decoder (all BF16).
pub fn codec_rules(config: &ModelConfig) -> Vec<Rule> {
    use names::*;
    let c = &config.codec;
    let k = c.kernel_size;
    let mut rules = vec![
        Rule::tensor(
            CODEBOOK.into(),
            Dtype::BF16,
            vec![config.speech.audio_codes, c.codebook_dim],
        ),
        Rule::bf16_linear(
            CODEC_IN.into(),
            vec![c.channels[0], c.codebook_dim, k],
            Some(c.channels[0]),
        ),
    ];
    for (u, &rate) in c.upsample_rates.iter().enumerate() {
        let (c_in, c_out) = (c.channels[u], c.channels[u + 1]);
        let at = |t: &str| fill(t, &[("u", u)]);
        rules.push(Rule::tensor(at(STAGE_SNAKE), Dtype::BF16, vec![c_in]));
        rules.push(Rule::bf16_linear(
            at(STAGE_UP),
            vec![c_in, c_out, 2 * rate],
            Some(c_out),
        ));
        for r in 0..c.residual_dilations.len() {
            let at = |t: &str| fill(t, &[("u", u), ("r", r)]);
            rules.push(Rule::tensor(at(RES_SNAKE1), Dtype::BF16, vec![c_out]));
            rules.push(Rule::bf16_linear(at(RES_CONV1), vec![c_out, c_out, k], Some(c_out)));
            rules.push(Rule::tensor(at(RES_SNAKE2), Dtype::BF16, vec![c_out]));
            rules.push(Rule::bf16_linear(at(RES_CONV2), vec![c_out, c_out, 1], Some(c_out)));
        }
    }
    let last = *c.channels.last().expect("validated: at least two channel counts");
    rules.push(Rule::tensor(OUT_SNAKE.into(), Dtype::BF16, vec![last]));
    rules.push(Rule::bf16_linear(CODEC_OUT.into(), vec![1, last, k], Some(1)));
    rules
}
