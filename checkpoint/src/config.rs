//! `config.json`: the architecture of a Drama 3 checkpoint (contract section 2), parsed and
//! checked for consistency. Unknown keys are ignored; a missing or inconsistent required key
//! is refused with its dotted path.

use drama_kernels::{MAX_EXPERT_GROUPS, MAX_ROUTED_PER_TOKEN};
use serde::{Deserialize, Serialize};

use super::CheckpointError;

/// The whole architecture description read from `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Must be `"drama3"`.
    pub model_type: String,
    /// Width of the residual stream (H).
    pub hidden_size: usize,
    /// Number of decoder layers (L).
    pub num_hidden_layers: usize,
    /// Query heads (NH).
    pub num_attention_heads: usize,
    /// Key/value heads (NKV); NH must be a multiple of it.
    pub num_key_value_heads: usize,
    /// Width of one head (HD).
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base (NeoX rotate-half over the full head).
    pub rope_theta: f64,
    /// Longest sequence (prefix + text + audio) the model supports.
    pub max_position_embeddings: usize,
    /// Whether q/k/v carry a bias (the contract requires `true`).
    pub attention_bias: bool,
    /// Rows of `model.embed_tokens` (VT).
    pub text_vocab_size: usize,
    /// Width of the dense MLP of the layers in `mlp_only_layers`.
    pub intermediate_size: usize,
    /// Layers that use a dense SwiGLU MLP instead of the mixture of experts.
    pub mlp_only_layers: Vec<usize>,
    /// Width of one routed expert (I_e).
    pub moe_intermediate_size: usize,
    /// Width of the shared expert (I_s); 0 means no shared expert.
    pub shared_expert_intermediate_size: usize,
    /// ORIGINAL number of routed experts (E), before pruning.
    pub num_experts: usize,
    /// Experts chosen per token (K).
    pub num_experts_per_tok: usize,
    /// How tokens are routed to experts.
    pub router: RouterConfig,
    /// Audio vocabulary and generation settings.
    pub speech: SpeechConfig,
    /// The reference-voice encoder.
    pub voice_tower: VoiceTowerConfig,
    /// The codec decoder (codes to PCM).
    pub codec: CodecConfig,
}

/// Router scoring function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScoringFunc {
    /// Softmax over the kept experts; weights are the probabilities.
    Softmax,
    /// Sigmoid scores, optional selection bias and expert groups (DeepSeek-V3 style).
    Sigmoid,
}

/// The router section of `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterConfig {
    /// Softmax or sigmoid scoring.
    pub scoring_func: ScoringFunc,
    /// Whether the chosen weights are renormalised to sum to one.
    pub norm_topk_prob: bool,
    /// Factor applied to the final weights (1.0 for softmax routers).
    pub routed_scaling_factor: f64,
    /// Number of expert groups (sigmoid routers; 1 = no groups).
    #[serde(default = "one")]
    pub n_group: usize,
    /// Groups kept per token (sigmoid routers).
    #[serde(default = "one")]
    pub topk_group: usize,
    /// How pruned experts are handled; only `"renormalize_kept"` is accepted.
    pub pruned_softmax: String,
}

fn one() -> usize {
    1
}

/// The speech section: the audio vocabulary and generation defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeechConfig {
    /// Codec codebook size (C).
    pub audio_codes: usize,
    /// C + 2: the codes plus `audio_bos` (C) and `audio_eos` (C + 1).
    pub audio_vocab_size: usize,
    /// Rows of the voice prefix (P).
    pub voice_prefix_len: usize,
    /// Default cap on generated audio tokens.
    pub max_audio_tokens: usize,
}

impl SpeechConfig {
    /// Token id that starts the audio stream.
    pub fn audio_bos(&self) -> usize {
        self.audio_codes
    }
    /// Token id that ends the audio stream.
    pub fn audio_eos(&self) -> usize {
        self.audio_codes + 1
    }
}

/// The voice tower: log-mel front end and a small residual MLP encoder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VoiceTowerConfig {
    /// Sample rate the reference audio is resampled to.
    pub sample_rate: u32,
    /// FFT length (and window length).
    pub n_fft: usize,
    /// Hop between frames, in samples.
    pub hop: usize,
    /// Number of mel filters.
    pub n_mels: usize,
    /// Upper edge of the mel filter bank, in Hz.
    pub f_max: f64,
    /// Tower width (D_t).
    pub dim: usize,
    /// Tower MLP width (F_t).
    pub ffn: usize,
    /// Number of residual blocks (B_t).
    pub blocks: usize,
}

/// The codec decoder: codebook, causal convolutions and upsampling stages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CodecConfig {
    /// Output PCM sample rate.
    pub sample_rate: u32,
    /// Codebook vector width (D_c).
    pub codebook_dim: usize,
    /// Channels before each stage and after the last: [C_0 .. C_n].
    pub channels: Vec<usize>,
    /// Upsampling factor of each stage: [r_0 .. r_{n-1}].
    pub upsample_rates: Vec<usize>,
    /// Dilations of the residual units of every stage.
    pub residual_dilations: Vec<usize>,
    /// Kernel size of the input, output and dilated convolutions.
    pub kernel_size: usize,
}

impl CodecConfig {
    /// PCM samples produced per audio code (the product of the upsampling rates).
    pub fn samples_per_code(&self) -> usize {
        self.upsample_rates.iter().product()
    }
}

/// The largest size a config may give (hidden size, heads, vocabulary, context...), and the
/// most layers (or voice-tower blocks). Far past any real model; refusing more before the
/// layout checks run keeps a hostile config from making them allocate for it or overflow.
const MAX_SIZE: usize = 1 << 24;
const MAX_LAYERS: usize = 4096;
/// The voice tower's largest FFT and most mel bands: its filter bank and a reference's mel
/// frames are made on the host at these sizes, so they bound what a config can make it
/// allocate.
const MAX_FFT: usize = 1 << 15;
const MAX_MELS: usize = 1024;
/// The most mel frames a second of reference audio makes (`sample_rate / hop`): a
/// reference's frames, their spectra and the tower's activations grow with it (a hop of 1
/// at 2^20 Hz would make 63 million frames of a minute). Speech encoders run near 100.
pub const MAX_MEL_FRAMES_PER_SECOND: u64 = 1000;
/// The most host work the log-mel analysis of a second of reference audio may take: frames a
/// second times a frame's FFT (n_fft log2 n_fft) and filter bank (n_mels (n_fft/2 + 1))
/// multiply-adds. A minute then stays seconds of host work; speech encoders take under 2^23.
pub const MAX_MEL_WORK_PER_SECOND: u64 = 1 << 27;

/// Whether a config's f64 stays a positive, finite number as the f32 the kernels use.
fn positive_f32(value: f64) -> bool {
    let narrowed = value as f32;
    narrowed.is_finite() && narrowed > 0.0
}

/// A refusal of `key` (returned as an `Err`).
fn bad(key: &str, problem: String) -> Result<(), CheckpointError> {
    Err(CheckpointError::Config {
        key: key.to_string(),
        problem,
    })
}

impl ModelConfig {
    /// Parses `config.json` text and checks every consistency rule of the contract.
    pub fn from_json(text: &str) -> Result<Self, CheckpointError> {
        let mut de = serde_json::Deserializer::from_str(text);
        let config: ModelConfig = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let problem = e.into_inner().to_string();
            // serde reports a missing field at its parent; name the field itself.
            let missing = problem
                .strip_prefix("missing field `")
                .and_then(|rest| rest.split_once('`'))
                .map(|(field, _)| field.to_string());
            let key = match (missing, path.as_str()) {
                (Some(field), ".") => field,
                (Some(field), parent) => format!("{parent}.{field}"),
                (None, _) => path,
            };
            CheckpointError::Config { key, problem }
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Whether layer `layer` uses a mixture of experts (not listed in `mlp_only_layers`).
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        !self.mlp_only_layers.contains(&layer)
    }

    /// Checks the cross-key rules; the error names the offending key.
    pub fn validate(&self) -> Result<(), CheckpointError> {
        if self.model_type != "drama3" {
            return bad(
                "model_type",
                format!("expected \"drama3\", found {:?}", self.model_type),
            );
        }
        let positive: [(&str, usize); 14] = [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
            ("text_vocab_size", self.text_vocab_size),
            ("speech.audio_codes", self.speech.audio_codes),
            ("speech.voice_prefix_len", self.speech.voice_prefix_len),
            ("speech.max_audio_tokens", self.speech.max_audio_tokens),
            ("voice_tower.hop", self.voice_tower.hop),
            ("voice_tower.n_mels", self.voice_tower.n_mels),
            ("voice_tower.dim", self.voice_tower.dim),
            ("codec.codebook_dim", self.codec.codebook_dim),
        ];
        for (key, value) in positive {
            if value == 0 {
                return bad(key, "must be positive".into());
            }
            if value > MAX_SIZE {
                return bad(
                    key,
                    format!("{value} is past any model this engine runs (at most {MAX_SIZE})"),
                );
            }
        }
        for (key, value) in [
            ("num_hidden_layers", self.num_hidden_layers),
            ("voice_tower.blocks", self.voice_tower.blocks),
        ] {
            if value > MAX_LAYERS {
                return bad(
                    key,
                    format!("{value} layers is past any model this engine runs (at most {MAX_LAYERS})"),
                );
            }
        }
        // The default cap must leave the context a text token beside the voice prefix and
        // audio_bos (contract 6.4, 9.2): otherwise every request that does not set its own
        // cap is refused, for a field it never sent.
        let context_for_default = self.speech.voice_prefix_len + 2 + self.speech.max_audio_tokens;
        if context_for_default > self.max_position_embeddings {
            return bad(
                "speech.max_audio_tokens",
                format!(
                    "{} codes beside the voice prefix of {}, audio_bos and one text token need {context_for_default} positions, more than max_position_embeddings {}",
                    self.speech.max_audio_tokens, self.speech.voice_prefix_len, self.max_position_embeddings
                ),
            );
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return bad(
                "num_key_value_heads",
                format!(
                    "num_attention_heads {} is not a multiple of {}",
                    self.num_attention_heads, self.num_key_value_heads
                ),
            );
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(
                "head_dim",
                format!("{} is odd; rotate-half RoPE needs an even head", self.head_dim),
            );
        }
        if !positive_f32(self.rms_norm_eps) {
            return bad(
                "rms_norm_eps",
                format!("{} is not a positive f32 (the norms add it in f32)", self.rms_norm_eps),
            );
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return bad("rope_theta", format!("{} is not a number above 1", self.rope_theta));
        }
        if !self.attention_bias {
            return bad("attention_bias", "the contract requires q/k/v biases (true)".into());
        }
        let mut seen = vec![false; self.num_hidden_layers];
        for &layer in &self.mlp_only_layers {
            match seen.get_mut(layer) {
                None => {
                    return bad("mlp_only_layers", format!("layer {layer} is beyond num_hidden_layers"));
                }
                Some(true) => {
                    return bad("mlp_only_layers", format!("layer {layer} is listed twice"));
                }
                Some(flag) => *flag = true,
            }
        }
        if !self.mlp_only_layers.is_empty() && self.intermediate_size == 0 {
            return bad("intermediate_size", "dense layers need a positive width".into());
        }
        let has_moe = (0..self.num_hidden_layers).any(|l| self.is_moe_layer(l));
        if has_moe {
            self.validate_moe()?;
        }
        if self.speech.audio_vocab_size != self.speech.audio_codes + 2 {
            return bad(
                "speech.audio_vocab_size",
                format!(
                    "expected audio_codes + 2 = {}, found {}",
                    self.speech.audio_codes + 2,
                    self.speech.audio_vocab_size
                ),
            );
        }
        self.validate_voice_tower()?;
        self.validate_codec()
    }

    fn validate_moe(&self) -> Result<(), CheckpointError> {
        let r = &self.router;
        if self.num_experts == 0 {
            return bad("num_experts", "must be positive".into());
        }
        if self.num_experts > MAX_SIZE {
            return bad(
                "num_experts",
                format!(
                    "{} is past any model this engine runs (at most {MAX_SIZE})",
                    self.num_experts
                ),
            );
        }
        if self.moe_intermediate_size == 0 {
            return bad("moe_intermediate_size", "must be positive".into());
        }
        if self.num_experts_per_tok == 0 || self.num_experts_per_tok > self.num_experts {
            return bad(
                "num_experts_per_tok",
                format!("{} is not in 1..={}", self.num_experts_per_tok, self.num_experts),
            );
        }
        if self.num_experts_per_tok > MAX_ROUTED_PER_TOKEN {
            return bad(
                "num_experts_per_tok",
                format!(
                    "{} is past what this engine routes (at most {MAX_ROUTED_PER_TOKEN})",
                    self.num_experts_per_tok
                ),
            );
        }
        if r.pruned_softmax != "renormalize_kept" {
            return bad(
                "router.pruned_softmax",
                format!("only \"renormalize_kept\" is supported, found {:?}", r.pruned_softmax),
            );
        }
        if !positive_f32(r.routed_scaling_factor) {
            return bad(
                "router.routed_scaling_factor",
                format!("{} is not a positive f32", r.routed_scaling_factor),
            );
        }
        match r.scoring_func {
            ScoringFunc::Softmax => {
                if r.routed_scaling_factor != 1.0 {
                    return bad("router.routed_scaling_factor", "softmax routers use 1.0".into());
                }
                if r.n_group != 1 || r.topk_group != 1 {
                    return bad(
                        "router.n_group",
                        "expert groups are only defined for sigmoid routers".into(),
                    );
                }
            }
            ScoringFunc::Sigmoid => {
                if r.n_group == 0 || !self.num_experts.is_multiple_of(r.n_group) {
                    return bad(
                        "router.n_group",
                        format!("{} does not divide num_experts {}", r.n_group, self.num_experts),
                    );
                }
                if r.n_group > MAX_EXPERT_GROUPS {
                    return bad(
                        "router.n_group",
                        format!(
                            "{} groups is past what this engine routes (at most {MAX_EXPERT_GROUPS})",
                            r.n_group
                        ),
                    );
                }
                if r.topk_group == 0 || r.topk_group > r.n_group {
                    return bad(
                        "router.topk_group",
                        format!("{} is not in 1..={}", r.topk_group, r.n_group),
                    );
                }
            }
        }
        Ok(())
    }

    fn validate_voice_tower(&self) -> Result<(), CheckpointError> {
        let v = &self.voice_tower;
        if v.sample_rate == 0 || v.sample_rate as usize > MAX_SIZE {
            return bad(
                "voice_tower.sample_rate",
                format!("{} is not in 1..={MAX_SIZE}", v.sample_rate),
            );
        }
        if v.n_fft < 2 || !v.n_fft.is_multiple_of(2) {
            return bad(
                "voice_tower.n_fft",
                format!("{} is not an even length of at least 2", v.n_fft),
            );
        }
        if !(v.f_max.is_finite() && v.f_max > 0.0 && v.f_max <= f64::from(v.sample_rate) / 2.0) {
            return bad("voice_tower.f_max", format!("{} is not in (0, sample_rate/2]", v.f_max));
        }
        if v.ffn == 0 {
            return bad("voice_tower.ffn", "must be positive".into());
        }
        if v.n_fft > MAX_FFT {
            return bad(
                "voice_tower.n_fft",
                format!("{} is past any model this engine runs (at most {MAX_FFT})", v.n_fft),
            );
        }
        let frames_per_second = u64::from(v.sample_rate).div_ceil(v.hop as u64);
        if frames_per_second > MAX_MEL_FRAMES_PER_SECOND {
            return bad(
                "voice_tower.hop",
                format!(
                    "{} at {} Hz makes more than {MAX_MEL_FRAMES_PER_SECOND} mel frames a second, past any model this engine runs",
                    v.hop, v.sample_rate
                ),
            );
        }
        let bins = v.n_fft / 2 + 1;
        if v.n_mels > bins.min(MAX_MELS) {
            return bad(
                "voice_tower.n_mels",
                format!(
                    "{} mel bands for {bins} frequency bins (at most the bins, and {MAX_MELS})",
                    v.n_mels
                ),
            );
        }
        let frame_work = (v.n_fft as u64) * u64::from(v.n_fft.ilog2()) + (v.n_mels * bins) as u64;
        let work = frames_per_second * frame_work;
        if work > MAX_MEL_WORK_PER_SECOND {
            return bad(
                "voice_tower.hop",
                format!(
                    "{frames_per_second} frames a second of an FFT of {} and {} mel bands take {work} multiply-adds a second of reference audio, past any model this engine runs (at most {MAX_MEL_WORK_PER_SECOND})",
                    v.n_fft, v.n_mels
                ),
            );
        }
        Ok(())
    }

    fn validate_codec(&self) -> Result<(), CheckpointError> {
        let c = &self.codec;
        if c.sample_rate == 0 || c.sample_rate as usize > MAX_SIZE {
            return bad(
                "codec.sample_rate",
                format!("{} is not in 1..={MAX_SIZE}", c.sample_rate),
            );
        }
        if c.upsample_rates.is_empty() || c.channels.len() != c.upsample_rates.len() + 1 {
            return bad(
                "codec.channels",
                format!(
                    "{} channel counts for {} upsampling stages (need stages + 1, at least one stage)",
                    c.channels.len(),
                    c.upsample_rates.len()
                ),
            );
        }
        if c.channels.contains(&0) {
            return bad("codec.channels", "every channel count must be positive".into());
        }
        if c.upsample_rates.contains(&0) {
            return bad("codec.upsample_rates", "every rate must be positive".into());
        }
        if c.residual_dilations.is_empty() || c.residual_dilations.contains(&0) {
            return bad(
                "codec.residual_dilations",
                "needs at least one positive dilation".into(),
            );
        }
        if c.kernel_size == 0 || c.kernel_size.is_multiple_of(2) {
            return bad(
                "codec.kernel_size",
                format!("{} is not an odd positive size", c.kernel_size),
            );
        }
        // Sizes, and lists of stages, bounded as the model's are (the layout's shapes and the
        // samples per code are products of them).
        for (key, values) in [
            ("codec.channels", c.channels.as_slice()),
            ("codec.upsample_rates", c.upsample_rates.as_slice()),
            ("codec.residual_dilations", c.residual_dilations.as_slice()),
            ("codec.kernel_size", std::slice::from_ref(&c.kernel_size)),
        ] {
            if values.len() > MAX_LAYERS {
                return bad(
                    key,
                    format!("{} entries is past any model this engine runs", values.len()),
                );
            }
            if let Some(value) = values.iter().find(|&&v| v > MAX_SIZE) {
                return bad(
                    key,
                    format!("{value} is past any model this engine runs (at most {MAX_SIZE})"),
                );
            }
        }
        let samples_per_code = c.upsample_rates.iter().try_fold(1usize, |product, &rate| {
            product.checked_mul(rate).filter(|&p| p <= MAX_SIZE)
        });
        if samples_per_code.is_none() {
            return bad(
                "codec.upsample_rates",
                format!("their product (samples per code) is past any model this engine runs (at most {MAX_SIZE})"),
            );
        }
        Ok(())
    }
}
