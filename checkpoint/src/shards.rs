//! The weight files: one `model.safetensors`, or shards named by
//! `model.safetensors.index.json`, memory-mapped (never copied whole into RAM).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use super::CheckpointError;

/// Name of the single-file weights.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Name of the shard index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Where one tensor lives and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// Element type.
    pub dtype: Dtype,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    shard: usize,
    start: usize,
    end: usize,
}

impl TensorEntry {
    /// Number of bytes the tensor occupies.
    pub fn byte_len(&self) -> usize {
        self.end - self.start
    }
    /// Number of elements.
    pub fn element_count(&self) -> usize {
        self.shape.iter().product()
    }
}

struct Shard {
    name: String,
    map: Mmap,
    data_offset: usize,
}

/// All tensors of a checkpoint, read in place from memory-mapped shards.
pub struct WeightFiles {
    shards: Vec<Shard>,
    tensors: BTreeMap<String, TensorEntry>,
}

#[derive(Deserialize)]
struct IndexJson {
    weight_map: BTreeMap<String, String>,
}

impl WeightFiles {
    /// Opens the weights of the checkpoint in `dir` (index + shards, or the single file).
    /// Returns the weights and the names of the files they came from.
    pub fn open(dir: &Path) -> Result<(Self, Vec<String>), CheckpointError> {
        let index_path = dir.join(INDEX_FILE);
        if index_path.is_file() {
            let text = std::fs::read_to_string(&index_path).map_err(|e| CheckpointError::io(&index_path, e))?;
            let index: IndexJson = serde_json::from_str(&text).map_err(|e| CheckpointError::Json {
                file: INDEX_FILE.into(),
                problem: e.to_string(),
            })?;
            let shard_names: BTreeSet<&String> = index.weight_map.values().collect();
            for name in &shard_names {
                if name.contains(['/', '\\']) || !name.ends_with(".safetensors") {
                    return Err(CheckpointError::Index(format!("{name:?} is not a shard file name")));
                }
            }
            let mut files = WeightFiles {
                shards: Vec::new(),
                tensors: BTreeMap::new(),
            };
            let mut used = Vec::new();
            for name in shard_names {
                files.add_shard(dir, name)?;
                used.push(name.clone());
            }
            for (tensor, shard) in &index.weight_map {
                let entry = files.tensors.get(tensor).ok_or_else(|| {
                    CheckpointError::Index(format!("tensor {tensor} is mapped to {shard}, which does not hold it"))
                })?;
                if files.shards[entry.shard].name != *shard {
                    return Err(CheckpointError::Index(format!(
                        "tensor {tensor} is mapped to {shard} but stored in {}",
                        files.shards[entry.shard].name
                    )));
                }
            }
            if let Some(extra) = files.tensors.keys().find(|t| !index.weight_map.contains_key(*t)) {
                return Err(CheckpointError::Index(format!(
                    "tensor {extra} is stored in a shard but not in weight_map"
                )));
            }
            Ok((files, used))
        } else if dir.join(SINGLE_FILE).is_file() {
            let mut files = WeightFiles {
                shards: Vec::new(),
                tensors: BTreeMap::new(),
            };
            files.add_shard(dir, SINGLE_FILE)?;
            Ok((files, vec![SINGLE_FILE.to_string()]))
        } else {
            Err(CheckpointError::MissingFile(format!("{INDEX_FILE} (or {SINGLE_FILE})")))
        }
    }

    fn add_shard(&mut self, dir: &Path, name: &str) -> Result<(), CheckpointError> {
        let path = dir.join(name);
        if !path.is_file() {
            return Err(CheckpointError::MissingFile(name.to_string()));
        }
        let file = std::fs::File::open(&path).map_err(|e| CheckpointError::io(&path, e))?;
        // SAFETY: the map is read-only, and the checkpoint directory must not change while
        // it is loaded, as with every mmap-based loader: the digests are computed from
        // separate reads of the files while the maps are made, so they vouch for the bytes
        // the maps hold only if nothing rewrites the files in between (a file truncated
        // under its map would fault on access).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| CheckpointError::io(&path, e))?;
        let (header_len, metadata) = SafeTensors::read_metadata(&map).map_err(|e| CheckpointError::Safetensors {
            file: name.to_string(),
            problem: e.to_string(),
        })?;
        let shard = self.shards.len();
        let infos: HashMap<String, &safetensors::tensor::TensorInfo> = metadata.tensors();
        for (tensor, info) in infos {
            let entry = TensorEntry {
                dtype: info.dtype,
                shape: info.shape.clone(),
                shard,
                start: info.data_offsets.0,
                end: info.data_offsets.1,
            };
            if self.tensors.insert(tensor.clone(), entry).is_some() {
                return Err(CheckpointError::Index(format!(
                    "tensor {tensor} is stored in more than one shard"
                )));
            }
        }
        self.shards.push(Shard {
            name: name.to_string(),
            map,
            data_offset: 8 + header_len,
        });
        Ok(())
    }

    /// Every tensor name with its entry, sorted by name.
    pub fn entries(&self) -> &BTreeMap<String, TensorEntry> {
        &self.tensors
    }

    /// Looks up a tensor.
    pub fn entry(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.get(name)
    }

    /// The raw little-endian bytes of a tensor, straight from the mapped file.
    pub fn bytes(&self, entry: &TensorEntry) -> &[u8] {
        let shard = &self.shards[entry.shard];
        &shard.map[shard.data_offset + entry.start..shard.data_offset + entry.end]
    }
}

/// Short text form of a safetensors dtype, as the contract writes it.
pub fn dtype_name(dtype: Dtype) -> String {
    format!("{dtype:?}")
}
