//! `SHA256SUMS`: the manifest that vouches for every other file of a checkpoint.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use super::CheckpointError;

/// Name of the manifest file.
pub const MANIFEST_FILE: &str = "SHA256SUMS";

/// The parsed manifest: file name to lowercase hex SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// File name (no directories) to its expected digest.
    pub digests: BTreeMap<String, String>,
}

impl Manifest {
    /// Parses `sha256sum` output: `<64 hex>  <name>` (or `<64 hex> *<name>`), one per line.
    pub fn parse(text: &str) -> Result<Self, CheckpointError> {
        let mut digests = BTreeMap::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let bad = |problem: String| CheckpointError::Manifest { line, problem };
            if raw.trim().is_empty() {
                continue;
            }
            let (digest, rest) = raw
                .split_once(' ')
                .ok_or_else(|| bad("expected `<sha256>  <file>`".into()))?;
            let name = rest
                .strip_prefix(' ')
                .or_else(|| rest.strip_prefix('*'))
                .ok_or_else(|| bad("expected two spaces or ` *` after the digest".into()))?;
            if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad(format!("{digest:?} is not a SHA-256 hex digest")));
            }
            if name.is_empty() || name.contains(['/', '\\']) || name == "." || name == ".." {
                return Err(bad(format!(
                    "{name:?} is not a plain file name in the checkpoint directory"
                )));
            }
            if name == MANIFEST_FILE {
                return Err(bad("the manifest cannot list itself".into()));
            }
            if digests.insert(name.to_string(), digest.to_ascii_lowercase()).is_some() {
                return Err(bad(format!("{name} is listed twice")));
            }
        }
        if digests.is_empty() {
            return Err(CheckpointError::Manifest {
                line: 0,
                problem: "lists no files".into(),
            });
        }
        Ok(Manifest { digests })
    }

    /// Renders the manifest in `sha256sum` format (sorted by name).
    pub fn render(&self) -> String {
        self.digests
            .iter()
            .map(|(name, digest)| format!("{digest}  {name}\n"))
            .collect()
    }

    /// Whether `name` is listed.
    pub fn lists(&self, name: &str) -> bool {
        self.digests.contains_key(name)
    }

    /// Checks the directory against the manifest: every listed file exists with its digest,
    /// and every file present (except the manifest and hidden entries) is listed.
    /// Returns the total number of bytes hashed.
    pub fn verify_dir(&self, dir: &Path) -> Result<u64, CheckpointError> {
        let (bytes, mut problems) = self.check_dir(dir);
        if problems.is_empty() {
            Ok(bytes)
        } else {
            Err(problems.swap_remove(0))
        }
    }

    /// Every problem [`Manifest::verify_dir`] would report, in its order: files the
    /// directory holds that the manifest does not list (by name), then listed files that
    /// are missing or differ (by name); and the bytes hashed.
    pub fn check_dir(&self, dir: &Path) -> (u64, Vec<CheckpointError>) {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => return (0, vec![CheckpointError::io(dir, e)]),
        };
        let mut unlisted = Vec::new();
        for entry in entries {
            let name = match entry {
                Ok(entry) => entry.file_name().to_string_lossy().into_owned(),
                Err(e) => return (0, vec![CheckpointError::io(dir, e)]),
            };
            if name != MANIFEST_FILE && !name.starts_with('.') && !self.lists(&name) {
                unlisted.push(name);
            }
        }
        unlisted.sort();
        let mut problems: Vec<CheckpointError> = unlisted.into_iter().map(CheckpointError::Unlisted).collect();
        // The files are hashed in parallel (a sharded checkpoint's shards on cores of their
        // own, rather than one file after another); the problems come in name order, as one
        // after another.
        let checked: Vec<Result<u64, CheckpointError>> = self
            .digests
            .par_iter()
            .map(|(name, expected)| check_file(dir, name, expected))
            .collect();
        let mut bytes = 0;
        for result in checked {
            match result {
                Ok(length) => bytes += length,
                Err(problem) => problems.push(problem),
            }
        }
        (bytes, problems)
    }
}

/// Checks that `dir/name` exists and has the `expected` digest; returns its length.
fn check_file(dir: &Path, name: &str, expected: &str) -> Result<u64, CheckpointError> {
    let path = dir.join(name);
    if !path.is_file() {
        return Err(CheckpointError::MissingFile(name.to_string()));
    }
    let (found, bytes) = sha256_file(&path)?;
    if found != expected {
        return Err(CheckpointError::DigestMismatch {
            file: name.to_string(),
            expected: expected.to_string(),
            found,
        });
    }
    Ok(bytes)
}

/// Hex SHA-256 of a file and its length, read in 1 MiB pieces.
pub fn sha256_file(path: &Path) -> Result<(String, u64), CheckpointError> {
    let mut file = std::fs::File::open(path).map_err(|e| CheckpointError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buffer).map_err(|e| CheckpointError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        total += n as u64;
    }
    Ok((hex::encode(hasher.finalize()), total))
}

/// Hex SHA-256 of a byte slice.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_sha256sum_modes_and_refuses_paths() {
        let d = "a".repeat(64);
        let m = Manifest::parse(&format!("{d}  config.json\n{d} *model.safetensors\n")).unwrap();
        assert!(m.lists("config.json") && m.lists("model.safetensors"));
        let err = Manifest::parse(&format!("{d}  ../etc/passwd\n")).unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
        let err = Manifest::parse("abc  config.json\n").unwrap_err();
        assert!(err.to_string().contains("not a SHA-256"), "{err}");
    }
}
