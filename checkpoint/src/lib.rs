//! Reading and validating a Drama 3 checkpoint directory, without touching a GPU.
//!
//! [`Checkpoint::open`] verifies the `SHA256SUMS` manifest, parses `config.json` and the
//! quantization config, maps the safetensors shards, and checks every tensor against the
//! declarative table in [`layout`]: names, dtypes, shapes, detected linear formats, kept
//! expert ids and scale values. A checkpoint that passes is described by [`Checkpoint`];
//! anything else is refused with a [`CheckpointError`] naming what was wrong.

pub mod config;
mod error;
pub mod fetch;
pub mod layout;
mod limits;
pub mod linear;
pub mod manifest;
pub mod numerics;
pub mod quant;
mod report;
pub mod shards;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rayon::prelude::*;
use safetensors::Dtype;
use serde::Serialize;
use tokenizers::Tokenizer;

pub use config::ModelConfig;
pub use error::CheckpointError;
pub use layout::names;
pub use linear::LinearInfo;
pub use manifest::{MANIFEST_FILE, Manifest};
pub use quant::{LinearFormat, QuantScheme};
pub use report::{FormatTotals, VerifyReport};
pub use shards::WeightFiles;

use layout::{Presence, Rule};

/// Name of the architecture file.
pub const CONFIG_FILE: &str = "config.json";
/// Name of the tokenizer file.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// The Hugging Face repository of the pinned checkpoint.
pub const PINNED_REPO: &str = "plotarmordev/drama-3-NVFP4-Pruned";
/// The pinned revision (a commit of [`PINNED_REPO`]).
pub const PINNED_REVISION: &str = "494db08481db952f834b2241bce63fb3dfa72554";

/// Where a checkpoint came from, as reported to users.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provenance {
    /// Resolved through the pin.
    Pinned {
        /// Hub repository.
        repo: String,
        /// Commit.
        revision: String,
    },
    /// Given explicitly as a directory (even if its bytes match the pin).
    Local(PathBuf),
}

impl Provenance {
    /// The provenance of the pinned checkpoint.
    pub fn pinned() -> Self {
        Provenance::Pinned {
            repo: PINNED_REPO.into(),
            revision: PINNED_REVISION.into(),
        }
    }
}

impl std::fmt::Display for Provenance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Provenance::Pinned { repo, revision } => write!(f, "pinned {repo}@{revision}"),
            Provenance::Local(dir) => write!(f, "local {}", dir.display()),
        }
    }
}

/// How a MoE layer's router addresses experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RouterWidth {
    /// One router row per kept expert, in `kept_expert_ids` order.
    Compact,
    /// One router row per original expert id.
    Full,
}

/// A MoE layer as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MoeLayer {
    /// Original ids of the kept experts, strictly ascending.
    pub kept_expert_ids: Vec<usize>,
    /// Whether the router (and its bias) is compact or full-width.
    pub router_width: RouterWidth,
    /// Whether a sigmoid router carries `e_score_correction_bias`.
    pub has_score_bias: bool,
}

/// The MLP of one decoder layer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerMlp {
    /// Dense SwiGLU MLP.
    Dense,
    /// Mixture of experts.
    Moe(MoeLayer),
}

/// A validated checkpoint: its description and its memory-mapped weights.
pub struct Checkpoint {
    /// The directory.
    pub dir: PathBuf,
    /// Where it came from.
    pub provenance: Provenance,
    /// The architecture.
    pub config: ModelConfig,
    /// The quantization scheme the formats were checked against.
    pub quant: QuantScheme,
    /// Each decoder layer's MLP.
    pub layers: Vec<LayerMlp>,
    /// Every linear and convolution module, by name.
    pub linears: BTreeMap<String, LinearInfo>,
    /// The weights, read in place.
    pub weights: WeightFiles,
    /// Hex SHA-256 of the `SHA256SUMS` file: the checkpoint's identity (voice files carry it).
    pub manifest_digest: String,
    /// The text tokenizer (`tokenizer.json`), whose ids fit `text_vocab_size`.
    pub tokenizer: Arc<Tokenizer>,
    /// Number of files whose digests were verified.
    pub files_verified: usize,
    /// Bytes hashed during verification.
    pub bytes_verified: u64,
}

impl Checkpoint {
    /// How the checkpoint is named where others read it (HTTP responses, `drama qualify`'s
    /// receipt): the pin for the pinned one; a local one by its manifest digest (its first
    /// 16 hex digits), never its path, which would tell about the machine's file system.
    pub fn public_label(&self) -> String {
        match &self.provenance {
            Provenance::Pinned { .. } => self.provenance.to_string(),
            Provenance::Local(_) => format!("local sha256:{:.16}", self.manifest_digest),
        }
    }

    /// Opens, verifies and validates the checkpoint in `dir`.
    pub fn open(dir: &Path, provenance: Provenance) -> Result<Self, CheckpointError> {
        if !dir.is_dir() {
            return Err(CheckpointError::io(
                dir,
                std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory"),
            ));
        }
        let manifest_text = read_text(dir, MANIFEST_FILE)?;
        let manifest = Manifest::parse(&manifest_text)?;
        for required in [CONFIG_FILE, TOKENIZER_FILE] {
            if !manifest.lists(required) {
                return Err(CheckpointError::MissingFile(format!(
                    "{required} (not listed in {MANIFEST_FILE})"
                )));
            }
        }
        // The files are hashed while their contents are checked against the layout (each
        // side on its own threads): a digest that does not match is still the problem
        // reported, before anything the checks found in the files it covers.
        let (bytes_verified, checked) = rayon::join(
            || manifest.verify_dir(dir),
            || Checkpoint::read_and_check(dir, provenance, &manifest, &manifest_text),
        );
        let bytes_verified = bytes_verified?;
        let mut checkpoint = checked?;
        checkpoint.bytes_verified = bytes_verified;
        Ok(checkpoint)
    }

    /// Reads the configuration and the weight files and checks the tensors against the
    /// layout (everything [`Checkpoint::open`] does but hashing).
    fn read_and_check(
        dir: &Path,
        provenance: Provenance,
        manifest: &Manifest,
        manifest_text: &str,
    ) -> Result<Self, CheckpointError> {
        let Parts {
            config,
            quant,
            tokenizer,
            weights,
            kept,
        } = Parts::read(dir)?;
        let tokenizer = Arc::new(tokenizer?);
        let checked = TensorChecks {
            config: &config,
            quant: &quant,
            weights: &weights,
        }
        .check(&kept);
        if let Some(problem) = checked.problems.into_iter().next() {
            return Err(problem);
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            provenance,
            layers: checked.layers,
            linears: checked.linears,
            manifest_digest: manifest::sha256_hex(manifest_text.as_bytes()),
            tokenizer,
            files_verified: manifest.digests.len(),
            bytes_verified: 0,
            config,
            quant,
            weights,
        })
    }

    /// Every deviation from the contract and the engine's limits that the checks of
    /// [`Checkpoint::open`] find, in the order `open` meets them, instead of the first
    /// (`drama verify --all`). A problem with the manifest's text, `config.json`, the
    /// quantization config, the weight files' headers or the kept expert ids ends the list:
    /// the tensor checks are derived from them.
    pub fn deviations(dir: &Path) -> Vec<CheckpointError> {
        let manifest = match read_text(dir, MANIFEST_FILE).and_then(|text| Manifest::parse(&text)) {
            Ok(manifest) => manifest,
            Err(problem) => return vec![problem],
        };
        let mut found: Vec<CheckpointError> = [CONFIG_FILE, TOKENIZER_FILE]
            .into_iter()
            .filter(|required| !manifest.lists(required))
            .map(|required| CheckpointError::MissingFile(format!("{required} (not listed in {MANIFEST_FILE})")))
            .collect();
        found.extend(manifest.check_dir(dir).1);
        match Parts::read(dir) {
            Err(problem) => found.push(problem),
            Ok(parts) => {
                let problems = parts.tensors().check(&parts.kept).problems;
                found.extend(parts.tokenizer.err());
                found.extend(problems);
            }
        }
        found
    }

    /// A validated BF16 or F32 tensor (norms, prefixes, codebooks) as f32 values.
    pub fn float_tensor(&self, name: &str) -> Vec<f32> {
        let entry = self
            .weights
            .entry(name)
            .unwrap_or_else(|| panic!("validated checkpoint lacks {name}"));
        crate::numerics::float_values(self.weights.bytes(entry), entry.dtype)
            .unwrap_or_else(|| panic!("{name}: {:?} is not a float tensor", entry.dtype))
    }

    /// The validated description of a linear module.
    pub fn linear(&self, module: &str) -> Option<&LinearInfo> {
        self.linears.get(module)
    }
}

/// What a checkpoint's tensor checks are derived from, read from its folder.
struct Parts {
    config: ModelConfig,
    quant: QuantScheme,
    /// The tokenizer, or why it was refused (which stops no other check).
    tokenizer: Result<Tokenizer, CheckpointError>,
    weights: WeightFiles,
    kept: Vec<Option<Vec<usize>>>,
}

impl Parts {
    fn read(dir: &Path) -> Result<Parts, CheckpointError> {
        let config_text = read_text(dir, CONFIG_FILE)?;
        let config = ModelConfig::from_json(&config_text)?;
        let hf_quant = if dir.join(quant::HF_QUANT_CONFIG_FILE).is_file() {
            Some(read_text(dir, quant::HF_QUANT_CONFIG_FILE)?)
        } else {
            None
        };
        let quant = QuantScheme::from_sources(hf_quant.as_deref(), &config_text)?;
        let tokenizer = read_tokenizer(dir, config.text_vocab_size);
        let (weights, _) = WeightFiles::open(dir)?;
        let kept = read_kept_ids(&config, &weights)?;
        Ok(Parts {
            config,
            quant,
            tokenizer,
            weights,
            kept,
        })
    }

    fn tensors(&self) -> TensorChecks<'_> {
        TensorChecks {
            config: &self.config,
            quant: &self.quant,
            weights: &self.weights,
        }
    }
}

/// The checks of every tensor against the layout rules and the engine's limits.
struct TensorChecks<'a> {
    config: &'a ModelConfig,
    quant: &'a QuantScheme,
    weights: &'a WeightFiles,
}

/// What [`TensorChecks::check`] established.
struct CheckedTensors {
    /// Every problem, in the order [`Checkpoint::open`] meets them.
    problems: Vec<CheckpointError>,
    /// The linear modules the rules vouch for.
    linears: BTreeMap<String, LinearInfo>,
    /// Each layer's MLP (empty when a rule failed).
    layers: Vec<LayerMlp>,
}

impl TensorChecks<'_> {
    /// Checks the tensors: every problem in rule order, then tensors no rule claims (by
    /// name), then router bias widths, then the engine's limits.
    fn check(&self, kept: &[Option<Vec<usize>>]) -> CheckedTensors {
        let rules = layout::all_rules(self.config, kept);
        // The rules are checked in parallel (they read every value: each BF16 weight checked
        // finite, each block scale checked); the problems come in rule order, as one after
        // another.
        let matches: Vec<Result<RuleMatch, CheckpointError>> =
            rules.par_iter().map(|rule| self.check_rule(rule)).collect();
        let mut problems = Vec::new();
        let mut linears = BTreeMap::new();
        let mut used: BTreeSet<String> = BTreeSet::new();
        // The tensors of a failed rule are its problem, not also unexpected ones.
        let mut claimed: Vec<String> = Vec::new();
        for (rule, found) in rules.iter().zip(matches) {
            match found {
                Ok(found) => {
                    used.extend(found.used);
                    linears.extend(found.linear);
                }
                Err(problem) => {
                    problems.push(problem);
                    claimed.push(match rule {
                        Rule::Tensor { name, .. } => name.clone(),
                        Rule::Linear { module, .. } => format!("{module}."),
                    });
                }
            }
        }
        let is_claimed = |name: &str| {
            claimed
                .iter()
                .any(|c| name == c || (c.ends_with('.') && name.starts_with(c)))
        };
        problems.extend(
            self.weights
                .entries()
                .keys()
                .filter(|name| !used.contains(*name) && !is_claimed(name))
                .map(|extra| unexpected(kept, extra)),
        );
        if !problems.is_empty() {
            // The layers and the limits read tensors the rules vouch for.
            return CheckedTensors {
                problems,
                linears,
                layers: Vec::new(),
            };
        }
        let layers: Vec<LayerMlp> = kept
            .iter()
            .enumerate()
            .map(|(i, ids)| match ids {
                None => LayerMlp::Dense,
                Some(ids) => {
                    let router = self
                        .weights
                        .entry(&names::layer(names::ROUTER, i))
                        .expect("checked above");
                    let compact = router.shape[0] == ids.len();
                    LayerMlp::Moe(MoeLayer {
                        kept_expert_ids: ids.clone(),
                        router_width: if compact {
                            RouterWidth::Compact
                        } else {
                            RouterWidth::Full
                        },
                        has_score_bias: used.contains(&names::layer(names::ROUTER_BIAS, i)),
                    })
                }
            })
            .collect();
        for (i, layer) in layers.iter().enumerate() {
            if let LayerMlp::Moe(moe) = layer {
                let bias = names::layer(names::ROUTER_BIAS, i);
                if let Some(entry) = self.weights.entry(&bias) {
                    let compact_bias = entry.shape[0] == moe.kept_expert_ids.len();
                    if compact_bias != (moe.router_width == RouterWidth::Compact) {
                        problems.push(CheckpointError::TensorMismatch {
                            name: bias,
                            expected: "the same width (compact or full) as the router".into(),
                            found: format!("{:?}", entry.shape),
                        });
                    }
                }
            }
        }
        problems.extend(limits::config_beyond_limits(self.config));
        problems.extend(limits::tensors_beyond_limits(&linears, &layers));
        CheckedTensors {
            problems,
            linears,
            layers,
        }
    }

    /// Checks one layout rule against the tensors: names, dtypes, shapes, formats and values.
    fn check_rule(&self, rule: &Rule) -> Result<RuleMatch, CheckpointError> {
        match rule {
            Rule::Tensor {
                name,
                dtype,
                shapes,
                presence,
            } => {
                let Some(entry) = self.weights.entry(name) else {
                    if *presence == Presence::Required {
                        return Err(CheckpointError::MissingTensor(name.clone()));
                    }
                    return Ok(RuleMatch::default());
                };
                if entry.dtype != *dtype || !shapes.contains(&entry.shape) {
                    let options: Vec<String> = shapes.iter().map(|s| format!("{s:?}")).collect();
                    return Err(CheckpointError::TensorMismatch {
                        name: name.clone(),
                        expected: format!("{} {}", shards::dtype_name(*dtype), options.join(" or ")),
                        found: format!("{} {:?}", shards::dtype_name(entry.dtype), entry.shape),
                    });
                }
                check_values(name, entry.dtype, self.weights.bytes(entry))?;
                Ok(RuleMatch {
                    used: vec![name.clone()],
                    linear: None,
                })
            }
            Rule::Linear {
                module,
                shape,
                bias,
                kind,
            } => {
                let (info, used) = linear::detect(self.weights, module, shape, *bias, *kind)?;
                if *kind == layout::LinearKind::Quantizable {
                    let expected = self.quant.expected_format(module);
                    if expected != info.format {
                        return Err(CheckpointError::FormatMismatch {
                            module: module.clone(),
                            expected: expected.describe().into(),
                            found: info.format.describe().into(),
                        });
                    }
                }
                Ok(RuleMatch {
                    used,
                    linear: Some((module.clone(), info)),
                })
            }
        }
    }
}

/// What one layout rule found: the tensors it accounts for and, for a linear, its description.
#[derive(Default)]
struct RuleMatch {
    used: Vec<String>,
    linear: Option<(String, LinearInfo)>,
}

fn read_text(dir: &Path, name: &str) -> Result<String, CheckpointError> {
    let path = dir.join(name);
    if !path.is_file() {
        return Err(CheckpointError::MissingFile(name.to_string()));
    }
    std::fs::read_to_string(&path).map_err(|e| CheckpointError::io(&path, e))
}

/// Checks plain tensors' values: finite floats.
fn check_values(name: &str, dtype: Dtype, bytes: &[u8]) -> Result<(), CheckpointError> {
    match dtype {
        Dtype::BF16 => linear::check_finite_bf16(name, bytes),
        Dtype::F32 => {
            for (index, chunk) in bytes.chunks_exact(4).enumerate() {
                let value = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                if !value.is_finite() {
                    return Err(CheckpointError::BadValues {
                        name: name.to_string(),
                        problem: format!("element {index} is {value}"),
                    });
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Parses `tokenizer.json` and checks that its ids fit a text vocabulary of `vocab`.
fn read_tokenizer(dir: &Path, vocab: usize) -> Result<Tokenizer, CheckpointError> {
    let refused = |problem: String| CheckpointError::Json {
        file: TOKENIZER_FILE.to_string(),
        problem,
    };
    let mut tokenizer = Tokenizer::from_file(dir.join(TOKENIZER_FILE)).map_err(|e| refused(e.to_string()))?;
    // The engine cuts text into segments itself (contract §9.1): a file's truncation would
    // drop text past its length (or panic on a stride not below it), and its padding would
    // speak pad ids, so neither applies.
    tokenizer.with_truncation(None).map_err(|e| refused(e.to_string()))?;
    tokenizer.with_padding(None);
    let size = tokenizer.get_vocab_size(true);
    if size > vocab {
        return Err(refused(format!("{size} tokens, more than text_vocab_size {vocab}")));
    }
    Ok(tokenizer)
}

/// Reads and validates `kept_expert_ids` of every MoE layer (`None` for dense layers).
fn read_kept_ids(config: &ModelConfig, weights: &WeightFiles) -> Result<Vec<Option<Vec<usize>>>, CheckpointError> {
    (0..config.num_hidden_layers)
        .map(|i| {
            if !config.is_moe_layer(i) {
                return Ok(None);
            }
            let name = names::layer(names::KEPT_EXPERT_IDS, i);
            let entry = weights
                .entry(&name)
                .ok_or_else(|| CheckpointError::MissingTensor(name.clone()))?;
            if entry.dtype != Dtype::I32 || entry.shape.len() != 1 || entry.shape[0] == 0 {
                return Err(CheckpointError::TensorMismatch {
                    name,
                    expected: "I32 [E_kept] with E_kept >= 1".into(),
                    found: format!("{} {:?}", shards::dtype_name(entry.dtype), entry.shape),
                });
            }
            if entry.shape[0] > drama_kernels::MAX_KEPT_EXPERTS {
                return Err(CheckpointError::BadValues {
                    name,
                    problem: format!(
                        "{} kept experts is past what this engine routes (at most {})",
                        entry.shape[0],
                        drama_kernels::MAX_KEPT_EXPERTS
                    ),
                });
            }
            let ids: Vec<i32> = weights
                .bytes(entry)
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let mut previous: Option<i32> = None;
            for (position, &id) in ids.iter().enumerate() {
                if id < 0 || id as usize >= config.num_experts {
                    return Err(CheckpointError::BadValues {
                        name,
                        problem: format!("id {id} at position {position} is outside [0, {})", config.num_experts),
                    });
                }
                if previous.is_some_and(|p| p >= id) {
                    return Err(CheckpointError::BadValues {
                        name,
                        problem: format!("ids are not strictly ascending at position {position} ({id})"),
                    });
                }
                previous = Some(id);
            }
            let ids: Vec<usize> = ids.into_iter().map(|id| id as usize).collect();
            check_reachable(config, i, &ids)?;
            Ok(Some(ids))
        })
        .collect()
}

/// Refuses a layer whose top-k cannot be filled from the experts the router can reach.
fn check_reachable(config: &ModelConfig, layer: usize, kept: &[usize]) -> Result<(), CheckpointError> {
    let k = config.num_experts_per_tok;
    let router = &config.router;
    let reachable = if router.n_group > 1 {
        let group_size = config.num_experts / router.n_group;
        let mut counts = vec![0usize; router.n_group];
        for &id in kept {
            counts[id / group_size] += 1;
        }
        let mut non_empty: Vec<usize> = counts.into_iter().filter(|&c| c > 0).collect();
        non_empty.sort_unstable();
        non_empty.iter().take(router.topk_group).sum()
    } else {
        kept.len()
    };
    if k > reachable {
        return Err(CheckpointError::Routing {
            layer,
            problem: format!(
                "num_experts_per_tok {k} exceeds the {reachable} kept experts the router can always reach"
            ),
        });
    }
    Ok(())
}

fn unexpected(kept: &[Option<Vec<usize>>], name: &str) -> CheckpointError {
    for (i, ids) in kept.iter().enumerate() {
        let prefix = names::layer(names::EXPERT_PREFIX, i);
        if let Some(rest) = name.strip_prefix(&prefix) {
            let id = rest.split('.').next().unwrap_or("");
            let why = match ids {
                Some(_) => format!("expert {id} is not in kept_expert_ids of layer {i}"),
                None => format!("layer {i} is a dense layer (mlp_only_layers)"),
            };
            return CheckpointError::UnexpectedTensor {
                name: name.to_string(),
                why,
            };
        }
    }
    CheckpointError::UnexpectedTensor {
        name: name.to_string(),
        why: "no rule of the contract names it".into(),
    }
}
