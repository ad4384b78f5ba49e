//! The `drama verify` report: what a validated checkpoint holds, as text or JSON.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use super::{Checkpoint, LayerMlp, LinearFormat, RouterWidth, names};

/// Parameter and byte counts of one storage format.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FormatTotals {
    /// Number of weights (elements, not bytes).
    pub parameters: u64,
    /// Bytes on disk, scales included.
    pub bytes: u64,
}

/// One decoder layer in the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerReport {
    /// Layer index.
    pub layer: usize,
    /// `dense` or `moe`.
    pub mlp: String,
    /// Formats of the attention projections.
    pub attention_formats: Vec<LinearFormat>,
    /// Formats of the MLP linears (dense, experts and shared expert).
    pub mlp_formats: Vec<LinearFormat>,
    /// Kept experts (MoE layers).
    pub kept_experts: Option<usize>,
    /// Their original ids (MoE layers).
    pub kept_expert_ids: Option<Vec<usize>>,
    /// Compact or full-width router (MoE layers).
    pub router_width: Option<RouterWidth>,
}

/// Everything `drama verify` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerifyReport {
    /// `pinned <repo>@<revision>` or `local <dir>`.
    pub provenance: String,
    /// The checkpoint's identity: SHA-256 of its `SHA256SUMS`.
    pub manifest_sha256: String,
    /// Files whose digests matched.
    pub files_verified: usize,
    /// Bytes hashed.
    pub bytes_verified: u64,
    /// The quantization scheme.
    pub quantization: String,
    /// Per-layer formats and experts.
    pub layers: Vec<LayerReport>,
    /// Linears by format, plus plain tensors by dtype (keys like `tensor BF16`).
    pub totals: BTreeMap<String, FormatTotals>,
}

impl Checkpoint {
    /// Builds the verification report of this (already validated) checkpoint.
    pub fn report(&self) -> VerifyReport {
        let formats_of = |modules: &mut dyn Iterator<Item = &String>| -> Vec<LinearFormat> {
            let mut formats: Vec<LinearFormat> =
                modules.filter_map(|m| self.linears.get(m)).map(|l| l.format).collect();
            formats.sort();
            formats.dedup();
            formats
        };
        let layers = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, mlp)| {
                let attention: Vec<String> = [names::Q_PROJ, names::K_PROJ, names::V_PROJ, names::O_PROJ]
                    .iter()
                    .map(|t| names::layer(t, i))
                    .collect();
                let prefix = format!("model.layers.{i}.mlp.");
                let mlp_modules = self.linears.keys().filter(|m| m.starts_with(&prefix));
                let moe = match mlp {
                    LayerMlp::Moe(moe) => Some(moe),
                    LayerMlp::Dense => None,
                };
                LayerReport {
                    layer: i,
                    mlp: if moe.is_some() { "moe" } else { "dense" }.into(),
                    attention_formats: formats_of(&mut attention.iter()),
                    mlp_formats: formats_of(&mut mlp_modules.into_iter()),
                    kept_experts: moe.map(|m| m.kept_expert_ids.len()),
                    kept_expert_ids: moe.map(|m| m.kept_expert_ids.clone()),
                    router_width: moe.map(|m| m.router_width),
                }
            })
            .collect();
        let mut totals: BTreeMap<String, FormatTotals> = BTreeMap::new();
        for info in self.linears.values() {
            let entry = totals.entry(format!("linear {}", info.format.describe())).or_default();
            entry.parameters += info.parameter_count() as u64;
            entry.bytes += info.stored_bytes as u64;
        }
        for (name, entry) in self.weights.entries() {
            let module = name.rsplit_once('.').map_or(name.as_str(), |(m, _)| m);
            if self.linears.contains_key(module) {
                continue;
            }
            let t = totals
                .entry(format!("tensor {}", super::shards::dtype_name(entry.dtype)))
                .or_default();
            t.parameters += entry.element_count() as u64;
            t.bytes += entry.byte_len() as u64;
        }
        VerifyReport {
            provenance: self.provenance.to_string(),
            manifest_sha256: self.manifest_digest.clone(),
            files_verified: self.files_verified,
            bytes_verified: self.bytes_verified,
            quantization: self.quant.describe(),
            layers,
            totals,
        }
    }
}

impl VerifyReport {
    /// The report as readable text, one fact per line.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "checkpoint OK");
        let _ = writeln!(out, "provenance:    {}", self.provenance);
        let _ = writeln!(out, "identity:      sha256(SHA256SUMS) = {}", self.manifest_sha256);
        let _ = writeln!(
            out,
            "files:         {} verified against SHA256SUMS ({} bytes)",
            self.files_verified, self.bytes_verified
        );
        let _ = writeln!(out, "quantization:  {}", self.quantization);
        let _ = writeln!(out, "layers:");
        for layer in &self.layers {
            let describe =
                |formats: &[LinearFormat]| formats.iter().map(|f| f.describe()).collect::<Vec<_>>().join(" + ");
            let _ = write!(
                out,
                "  {:>3}  {:<5}  attention {:<18}  mlp {}",
                layer.layer,
                layer.mlp,
                describe(&layer.attention_formats),
                describe(&layer.mlp_formats)
            );
            if let (Some(n), Some(ids), Some(width)) = (layer.kept_experts, &layer.kept_expert_ids, layer.router_width)
            {
                let _ = write!(out, "  experts kept {n} {}  router {width:?}", compress_ids(ids));
            }
            let _ = writeln!(out);
        }
        let _ = writeln!(out, "totals:");
        for (kind, t) in &self.totals {
            let _ = writeln!(
                out,
                "  {kind:<34} {:>14} parameters {:>14} bytes",
                t.parameters, t.bytes
            );
        }
        out
    }
}

/// Renders ascending ids as ranges: `[0-3,7,9-10]`.
fn compress_ids(ids: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            ids[i].to_string()
        } else {
            format!("{}-{}", ids[i], ids[j])
        });
        i = j + 1;
    }
    format!("[{}]", parts.join(","))
}
