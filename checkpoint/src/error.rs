//! Why a checkpoint was refused. Every variant names the file, key or tensor at fault.

use std::path::PathBuf;

/// A refusal while reading or validating a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file could not be read.
    #[error("cannot read {path}: {reason}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's reason.
        reason: std::io::Error,
    },
    /// A required file is absent.
    #[error("missing file {0}")]
    MissingFile(String),
    /// `SHA256SUMS` is malformed.
    #[error("SHA256SUMS line {line}: {problem}")]
    Manifest {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        problem: String,
    },
    /// A file's digest differs from the manifest: the directory was modified.
    #[error(
        "{file}: SHA-256 {found} does not match SHA256SUMS ({expected}); the checkpoint was modified or is incomplete"
    )]
    DigestMismatch {
        /// The file.
        file: String,
        /// Digest listed in `SHA256SUMS`.
        expected: String,
        /// Digest of the bytes on disk.
        found: String,
    },
    /// A file of the checkpoint is not listed in the manifest.
    #[error("{0} is not listed in SHA256SUMS; the directory holds files the manifest does not vouch for")]
    Unlisted(String),
    /// A JSON file is not valid JSON of the expected form.
    #[error("{file}: {problem}")]
    Json {
        /// The file.
        file: String,
        /// The parser's message.
        problem: String,
    },
    /// A `config.json` key is missing or inconsistent.
    #[error("config.json: key `{key}`: {problem}")]
    Config {
        /// Dotted path of the key.
        key: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The quantization config is missing, unsupported or inconsistent.
    #[error("quantization config: {0}")]
    QuantConfig(String),
    /// A safetensors file cannot be parsed.
    #[error("{file}: not a valid safetensors file: {problem}")]
    Safetensors {
        /// The shard.
        file: String,
        /// The parser's message.
        problem: String,
    },
    /// The shard index and the shards disagree.
    #[error("model.safetensors.index.json: {0}")]
    Index(String),
    /// A tensor the contract requires is absent.
    #[error("missing tensor {0}")]
    MissingTensor(String),
    /// A tensor the contract does not know is present.
    #[error("unexpected tensor {name}: {why}")]
    UnexpectedTensor {
        /// The tensor.
        name: String,
        /// Why it cannot belong here.
        why: String,
    },
    /// A tensor has the wrong dtype or shape.
    #[error("tensor {name}: expected {expected}, found {found}")]
    TensorMismatch {
        /// The tensor.
        name: String,
        /// What the contract requires.
        expected: String,
        /// What the file holds.
        found: String,
    },
    /// A tensor's values break the contract (NaN scales, unsorted ids, ...).
    #[error("tensor {name}: {problem}")]
    BadValues {
        /// The tensor.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// A linear's stored format disagrees with the quantization config.
    #[error("linear {module}: the quantization config expects {expected}, but the tensors are {found}")]
    FormatMismatch {
        /// Module name (tensor name without the last component).
        module: String,
        /// Format the config prescribes.
        expected: String,
        /// Format detected from the tensors.
        found: String,
    },
    /// The checkpoint keeps the contract but is past what this engine's kernels run
    /// (`docs/contract.md` §11).
    #[error("{what} is {found}; this engine runs {limit}")]
    EngineLimit {
        /// The key, tensor or module.
        what: String,
        /// Its value.
        found: String,
        /// What the engine runs.
        limit: String,
    },
    /// The routing configuration cannot be satisfied by the kept experts.
    #[error("layer {layer}: {problem}")]
    Routing {
        /// Decoder layer.
        layer: usize,
        /// What is wrong.
        problem: String,
    },
}

impl CheckpointError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, reason: std::io::Error) -> Self {
        CheckpointError::Io {
            path: path.into(),
            reason,
        }
    }
}

impl CheckpointError {
    /// A short, stable name of the kind of problem, for reports that group them
    /// (`drama verify --all`).
    pub fn kind(&self) -> &'static str {
        match self {
            CheckpointError::Io { .. } => "unreadable file",
            CheckpointError::MissingFile(_) => "missing file",
            CheckpointError::Manifest { .. } => "malformed SHA256SUMS",
            CheckpointError::DigestMismatch { .. } => "modified file",
            CheckpointError::Unlisted(_) => "unlisted file",
            CheckpointError::Json { .. } => "malformed JSON file",
            CheckpointError::Config { .. } => "config key",
            CheckpointError::QuantConfig(_) => "quantization config",
            CheckpointError::Safetensors { .. } => "malformed safetensors file",
            CheckpointError::Index(_) => "shard index",
            CheckpointError::MissingTensor(_) => "missing tensor",
            CheckpointError::UnexpectedTensor { .. } => "unexpected tensor",
            CheckpointError::TensorMismatch { .. } => "misshapen tensor",
            CheckpointError::BadValues { .. } => "bad values",
            CheckpointError::FormatMismatch { .. } => "format disagrees with the quantization config",
            CheckpointError::EngineLimit { .. } => "past an engine limit",
            CheckpointError::Routing { .. } => "routing",
        }
    }
}
