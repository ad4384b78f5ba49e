//! The quantization config (contract section 4): which linear modules are stored in which
//! format, from `hf_quant_config.json` (ModelOpt) and/or `config.json`'s
//! `quantization_config`. Modules are matched by name against shell-style wildcards.

use std::collections::BTreeMap;

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::Serialize;
use serde_json::Value;

use super::CheckpointError;

/// Name of the ModelOpt quantization config file.
pub const HF_QUANT_CONFIG_FILE: &str = "hf_quant_config.json";

/// How one linear's weight is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinearFormat {
    /// BF16 `weight` [out, in].
    Bf16,
    /// NVFP4, ModelOpt tensors: value = E2M1 * E4M3 block scale * `weight_scale_2`.
    Nvfp4ModelOpt,
    /// NVFP4, compressed-tensors tensors: value = E2M1 * E4M3 block scale / `weight_global_scale`.
    Nvfp4CompressedTensors,
    /// FP8 E4M3 weights with an F32 `weight_scale_inv` per 128x128 block.
    Fp8Block,
}

impl LinearFormat {
    /// Human-readable name used in reports and errors.
    /// The kernels' weight format of linears stored in this format (the two NVFP4
    /// conventions differ only in how their per-tensor factor is stored).
    pub fn kernel_format(self) -> drama_kernels::WeightFormat {
        use drama_kernels::WeightFormat;
        match self {
            LinearFormat::Bf16 => WeightFormat::Bf16,
            LinearFormat::Nvfp4ModelOpt | LinearFormat::Nvfp4CompressedTensors => WeightFormat::Nvfp4,
            LinearFormat::Fp8Block => WeightFormat::Fp8Block,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            LinearFormat::Bf16 => "BF16",
            LinearFormat::Nvfp4ModelOpt => "NVFP4 (ModelOpt)",
            LinearFormat::Nvfp4CompressedTensors => "NVFP4 (compressed-tensors)",
            LinearFormat::Fp8Block => "FP8 block-scaled",
        }
    }
}

/// Which format the config prescribes for each linear module.
#[derive(Debug, Clone)]
pub struct QuantScheme {
    kind: SchemeKind,
    unquantized: GlobSet,
    unquantized_patterns: Vec<String>,
    /// ModelOpt's `kv_cache_quant_algo`, when it names one: an exporter's hint for serving
    /// engines that quantize their KV cache. The model's attention reads keys and values at
    /// full precision (`docs/contract.md` §4.8), so the engine keeps its cache in f32 and
    /// says so in the report.
    kv_cache_hint: Option<String>,
}

/// The values of ModelOpt's `kv_cache_quant_algo` the engine accepts as a hint (those its
/// exports write and serving engines read); any other is refused as a likely typo.
const KV_CACHE_HINTS: [&str; 2] = ["FP8", "NVFP4"];

#[derive(Debug, Clone, PartialEq)]
enum SchemeKind {
    /// Every module not excluded is in this format.
    Uniform(LinearFormat),
    /// ModelOpt MIXED_PRECISION: listed modules in their format, the rest BF16.
    Mixed(BTreeMap<String, LinearFormat>),
}

impl PartialEq for QuantScheme {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.unquantized_patterns == other.unquantized_patterns
    }
}

impl QuantScheme {
    /// The format the config prescribes for `module`.
    pub fn expected_format(&self, module: &str) -> LinearFormat {
        if self.unquantized.is_match(module) {
            return LinearFormat::Bf16;
        }
        match &self.kind {
            SchemeKind::Uniform(format) => *format,
            SchemeKind::Mixed(map) => map.get(module).copied().unwrap_or(LinearFormat::Bf16),
        }
    }

    /// A one-line description for reports.
    pub fn describe(&self) -> String {
        let weights = match &self.kind {
            SchemeKind::Uniform(f) => format!(
                "{} except {} excluded pattern(s)",
                f.describe(),
                self.unquantized_patterns.len()
            ),
            SchemeKind::Mixed(map) => format!("mixed precision, {} quantized module(s)", map.len()),
        };
        match &self.kv_cache_hint {
            Some(hint) => format!("{weights}; kv_cache_quant_algo {hint} not applied (the KV cache stays f32)"),
            None => weights,
        }
    }

    /// Reads the scheme from the two possible sources; at least one must exist, and when
    /// both do they must agree.
    pub fn from_sources(hf_quant_config: Option<&str>, config_json: &str) -> Result<Self, CheckpointError> {
        let config: Value = serde_json::from_str(config_json).map_err(|e| CheckpointError::Json {
            file: "config.json".into(),
            problem: e.to_string(),
        })?;
        let from_config = match config.get("quantization_config") {
            Some(q) => Some(Self::from_quantization_config(q)?),
            None => None,
        };
        let from_file = match hf_quant_config {
            Some(text) => {
                let value: Value = serde_json::from_str(text).map_err(|e| CheckpointError::Json {
                    file: HF_QUANT_CONFIG_FILE.into(),
                    problem: e.to_string(),
                })?;
                let section = value.get("quantization").ok_or_else(|| {
                    CheckpointError::QuantConfig(format!("{HF_QUANT_CONFIG_FILE}: missing key `quantization`"))
                })?;
                Some(Self::from_modelopt(section, HF_QUANT_CONFIG_FILE)?)
            }
            None => None,
        };
        match (from_file, from_config) {
            (Some(a), Some(b)) if a != b => Err(CheckpointError::QuantConfig(format!(
                "{HF_QUANT_CONFIG_FILE} and config.json quantization_config disagree"
            ))),
            (Some(a), _) => Ok(a),
            (None, Some(b)) => Ok(b),
            (None, None) => Err(CheckpointError::QuantConfig(format!(
                "neither {HF_QUANT_CONFIG_FILE} nor config.json `quantization_config` is present"
            ))),
        }
    }

    fn from_quantization_config(q: &Value) -> Result<Self, CheckpointError> {
        let where_ = "config.json quantization_config";
        match str_key(q, "quant_method", where_)? {
            "modelopt" => Self::from_modelopt(q, where_),
            "compressed-tensors" => {
                let format = str_key(q, "format", where_)?;
                if format != "nvfp4-pack-quantized" {
                    return Err(CheckpointError::QuantConfig(format!(
                        "{where_}: compressed-tensors format {format:?} is not supported (only \"nvfp4-pack-quantized\")"
                    )));
                }
                Self::uniform(LinearFormat::Nvfp4CompressedTensors, patterns(q, "ignore", where_)?)
            }
            "fp8" => {
                let block = q.get("weight_block_size").cloned().unwrap_or(Value::Null);
                if block != serde_json::json!([128, 128]) {
                    return Err(CheckpointError::QuantConfig(format!(
                        "{where_}: `weight_block_size` must be [128, 128], found {block}"
                    )));
                }
                Self::uniform(LinearFormat::Fp8Block, patterns(q, "modules_to_not_convert", where_)?)
            }
            other => Err(CheckpointError::QuantConfig(format!(
                "{where_}: quant_method {other:?} is not supported (modelopt, compressed-tensors, fp8)"
            ))),
        }
    }

    fn from_modelopt(q: &Value, where_: &str) -> Result<Self, CheckpointError> {
        let kv_cache_hint = match q.get("kv_cache_quant_algo") {
            None | Some(Value::Null) => None,
            Some(Value::String(hint)) if KV_CACHE_HINTS.contains(&hint.as_str()) => Some(hint.clone()),
            Some(other) => {
                return Err(CheckpointError::QuantConfig(format!(
                    "{where_}: kv_cache_quant_algo {other} is not one of null, \"FP8\", \"NVFP4\""
                )));
            }
        };
        let mut scheme = Self::modelopt_weights(q, where_)?;
        scheme.kv_cache_hint = kv_cache_hint;
        Ok(scheme)
    }

    fn modelopt_weights(q: &Value, where_: &str) -> Result<Self, CheckpointError> {
        let algo = str_key(q, "quant_algo", where_)?;
        let exclude = patterns(q, "exclude_modules", where_)?;
        match algo {
            "NVFP4" | "W4A16_NVFP4" => {
                check_group_size(q, where_)?;
                Self::uniform(LinearFormat::Nvfp4ModelOpt, exclude)
            }
            "MIXED_PRECISION" => {
                let layers = q.get("quantized_layers").and_then(Value::as_object).ok_or_else(|| {
                    CheckpointError::QuantConfig(format!("{where_}: MIXED_PRECISION needs a `quantized_layers` map"))
                })?;
                let mut map = BTreeMap::new();
                for (module, entry) in layers {
                    let algo = str_key(entry, "quant_algo", &format!("{where_}: quantized_layers.{module}"))?;
                    let format = match algo {
                        "NVFP4" | "W4A16_NVFP4" => LinearFormat::Nvfp4ModelOpt,
                        "FP8_BLOCK" => LinearFormat::Fp8Block,
                        other => {
                            return Err(CheckpointError::QuantConfig(format!(
                                "{where_}: quantized_layers.{module}: quant_algo {other:?} is not supported"
                            )));
                        }
                    };
                    map.insert(module.clone(), format);
                }
                Self::build(SchemeKind::Mixed(map), exclude)
            }
            other => Err(CheckpointError::QuantConfig(format!(
                "{where_}: quant_algo {other:?} is not supported (NVFP4, W4A16_NVFP4, MIXED_PRECISION)"
            ))),
        }
    }

    fn uniform(format: LinearFormat, unquantized: Vec<String>) -> Result<Self, CheckpointError> {
        Self::build(SchemeKind::Uniform(format), unquantized)
    }

    fn build(kind: SchemeKind, unquantized_patterns: Vec<String>) -> Result<Self, CheckpointError> {
        let mut builder = GlobSetBuilder::new();
        for pattern in &unquantized_patterns {
            let glob = Glob::new(pattern).map_err(|e| {
                CheckpointError::QuantConfig(format!("pattern {pattern:?} is not a valid wildcard: {e}"))
            })?;
            builder.add(glob);
        }
        let unquantized = builder
            .build()
            .map_err(|e| CheckpointError::QuantConfig(format!("patterns: {e}")))?;
        Ok(QuantScheme {
            kind,
            unquantized,
            unquantized_patterns,
            kv_cache_hint: None,
        })
    }
}

fn str_key<'a>(value: &'a Value, key: &str, where_: &str) -> Result<&'a str, CheckpointError> {
    value
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| CheckpointError::QuantConfig(format!("{where_}: missing string key `{key}`")))
}

fn patterns(value: &Value, key: &str, where_: &str) -> Result<Vec<String>, CheckpointError> {
    match value.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| CheckpointError::QuantConfig(format!("{where_}: `{key}` holds a non-string {item}")))
            })
            .collect(),
        Some(other) => Err(CheckpointError::QuantConfig(format!(
            "{where_}: `{key}` must be a list of patterns, found {other}"
        ))),
    }
}

fn check_group_size(q: &Value, where_: &str) -> Result<(), CheckpointError> {
    match q.get("group_size").and_then(Value::as_u64) {
        Some(16) => Ok(()),
        other => Err(CheckpointError::QuantConfig(format!(
            "{where_}: NVFP4 needs `group_size` 16, found {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_crosses_dots_and_mixed_maps_exact_names() {
        let q = r#"{"quantization": {"quant_algo": "NVFP4", "group_size": 16,
            "exclude_modules": ["*self_attn*", "model.layers.0.*"], "kv_cache_quant_algo": null}}"#;
        let s = QuantScheme::from_sources(Some(q), "{}").unwrap();
        assert_eq!(s.expected_format("model.layers.3.self_attn.q_proj"), LinearFormat::Bf16);
        assert_eq!(s.expected_format("model.layers.0.mlp.gate_proj"), LinearFormat::Bf16);
        assert_eq!(
            s.expected_format("model.layers.3.mlp.experts.7.up_proj"),
            LinearFormat::Nvfp4ModelOpt
        );

        let cfg = r#"{"quantization_config": {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
            "quantized_layers": {"model.layers.1.mlp.experts.2.up_proj": {"quant_algo": "FP8_BLOCK"}}}}"#;
        let s = QuantScheme::from_sources(None, cfg).unwrap();
        assert_eq!(
            s.expected_format("model.layers.1.mlp.experts.2.up_proj"),
            LinearFormat::Fp8Block
        );
        assert_eq!(
            s.expected_format("model.layers.1.mlp.experts.3.up_proj"),
            LinearFormat::Bf16
        );
    }

    #[test]
    fn refusals_name_the_problem() {
        let err = QuantScheme::from_sources(None, "{}").unwrap_err().to_string();
        assert!(err.contains("neither"), "{err}");
        let q = r#"{"quantization": {"quant_algo": "NVFP4", "group_size": 32}}"#;
        let err = QuantScheme::from_sources(Some(q), "{}").unwrap_err().to_string();
        assert!(err.contains("group_size"), "{err}");
        let q = r#"{"quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": "fp8"}}"#;
        let err = QuantScheme::from_sources(Some(q), "{}").unwrap_err().to_string();
        assert!(
            err.contains(r#"kv_cache_quant_algo "fp8" is not one of null, "FP8", "NVFP4""#),
            "{err}"
        );
    }

    /// ModelOpt's KV-cache hint (ModelOpt NVFP4 exports commonly write "FP8") is accepted,
    /// not applied, and named in the report; the weights' scheme is the same as without it.
    #[test]
    fn a_kv_cache_hint_is_accepted_and_reported() {
        let with = |kv: &str| {
            let q = format!(
                r#"{{"quantization": {{"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": {kv}}}}}"#
            );
            QuantScheme::from_sources(Some(&q), "{}").unwrap()
        };
        assert_eq!(with("\"FP8\""), with("null"));
        assert_eq!(
            with("\"FP8\"").describe(),
            "NVFP4 (ModelOpt) except 0 excluded pattern(s); kv_cache_quant_algo FP8 not applied (the KV cache stays f32)"
        );
        assert_eq!(with("null").describe(), "NVFP4 (ModelOpt) except 0 excluded pattern(s)");
    }
}
