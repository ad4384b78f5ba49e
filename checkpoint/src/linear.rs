//! Detects a linear's storage format from its tensors (contract section 4) and validates
//! dtypes, shapes and scale values. Nothing is converted: the result only describes.

use safetensors::Dtype;
use serde::Serialize;

use super::CheckpointError;
use super::layout::LinearKind;
use super::quant::LinearFormat;
use super::shards::{TensorEntry, WeightFiles, dtype_name};
use crate::numerics::{bf16_to_f32, e4m3_is_nan};

/// Every tensor suffix a linear module may carry, in any format.
pub const LINEAR_SUFFIXES: [&str; 8] = [
    "weight",
    "weight_packed",
    "weight_scale",
    "weight_scale_2",
    "weight_global_scale",
    "weight_scale_inv",
    "input_scale",
    "bias",
];

/// NVFP4 block length along the input dimension.
pub const NVFP4_BLOCK: usize = 16;
/// FP8 block-scale tile edge.
pub const FP8_BLOCK: usize = 128;

/// What the loader learned about one linear module.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinearInfo {
    /// Module name.
    pub module: String,
    /// Detected storage format.
    pub format: LinearFormat,
    /// Logical weight shape, outermost first (`[out, in]` for linears).
    pub shape: Vec<usize>,
    /// Whether a BF16 bias is present.
    pub has_bias: bool,
    /// The per-tensor scale (`weight_scale_2`, or `1 / weight_global_scale`); 1 otherwise.
    pub tensor_scale: f32,
    /// Bytes the weight occupies on disk (codes, scales and bias).
    pub stored_bytes: usize,
}

impl LinearInfo {
    /// Number of weights (not counting the bias).
    pub fn parameter_count(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Detects and validates the linear `module`; returns what it is and the tensor names it used.
pub fn detect(
    files: &WeightFiles,
    module: &str,
    shape: &[usize],
    bias: Option<usize>,
    kind: LinearKind,
) -> Result<(LinearInfo, Vec<String>), CheckpointError> {
    let name = |suffix: &str| format!("{module}.{suffix}");
    let present: Vec<&str> = LINEAR_SUFFIXES
        .iter()
        .copied()
        .filter(|s| files.entry(&name(s)).is_some())
        .collect();
    let has = |s: &str| present.contains(&s);
    let format = if has("weight_scale_2") {
        LinearFormat::Nvfp4ModelOpt
    } else if has("weight_global_scale") {
        LinearFormat::Nvfp4CompressedTensors
    } else if has("weight_scale_inv") {
        LinearFormat::Fp8Block
    } else if has("weight") {
        LinearFormat::Bf16
    } else {
        return Err(CheckpointError::MissingTensor(name("weight")));
    };
    if kind == LinearKind::Bf16Only && format != LinearFormat::Bf16 {
        return Err(CheckpointError::TensorMismatch {
            name: name("weight"),
            expected: "BF16 (this module is never quantized)".into(),
            found: format.describe().into(),
        });
    }
    let (required, optional): (&[&str], &[&str]) = match format {
        LinearFormat::Bf16 => (&["weight"], &[]),
        LinearFormat::Nvfp4ModelOpt => (&["weight", "weight_scale", "weight_scale_2"], &["input_scale"]),
        LinearFormat::Nvfp4CompressedTensors => (&["weight_packed", "weight_scale", "weight_global_scale"], &[]),
        LinearFormat::Fp8Block => (&["weight", "weight_scale_inv"], &[]),
    };
    for suffix in &present {
        if *suffix != "bias" && !required.contains(suffix) && !optional.contains(suffix) {
            return Err(CheckpointError::UnexpectedTensor {
                name: name(suffix),
                why: format!("it does not belong to a {} linear", format.describe()),
            });
        }
    }
    let mut used = Vec::new();
    let mut stored_bytes = 0;
    let mut take = |suffix: &str| -> Result<&TensorEntry, CheckpointError> {
        let full = name(suffix);
        let entry = files
            .entry(&full)
            .ok_or_else(|| CheckpointError::MissingTensor(full.clone()))?;
        stored_bytes += entry.byte_len();
        used.push(full);
        Ok(entry)
    };
    let mut tensor_scale = 1.0f32;
    match format {
        LinearFormat::Bf16 => {
            let w = take("weight")?;
            expect(&name("weight"), w, Dtype::BF16, shape)?;
            check_finite_bf16(&name("weight"), files.bytes(w))?;
        }
        LinearFormat::Nvfp4ModelOpt | LinearFormat::Nvfp4CompressedTensors => {
            let [out, in_] = two_dims(module, shape)?;
            if in_ % NVFP4_BLOCK != 0 {
                return Err(CheckpointError::TensorMismatch {
                    name: name("weight_scale"),
                    expected: format!("an input width that is a multiple of {NVFP4_BLOCK}"),
                    found: format!("input width {in_}"),
                });
            }
            let codes_name = if format == LinearFormat::Nvfp4ModelOpt {
                "weight"
            } else {
                "weight_packed"
            };
            let codes = take(codes_name)?;
            expect(&name(codes_name), codes, Dtype::U8, &[out, in_ / 2])?;
            let scales = take("weight_scale")?;
            expect(&name("weight_scale"), scales, Dtype::F8_E4M3, &[out, in_ / NVFP4_BLOCK])?;
            check_block_scales(&name("weight_scale"), files.bytes(scales), in_ / NVFP4_BLOCK)?;
            if format == LinearFormat::Nvfp4ModelOpt {
                let s2 = take("weight_scale_2")?;
                tensor_scale = positive_scalar(&name("weight_scale_2"), s2, files)?;
                if has("input_scale") {
                    let s = take("input_scale")?;
                    positive_scalar(&name("input_scale"), s, files)?;
                }
            } else {
                let g = take("weight_global_scale")?;
                tensor_scale = 1.0 / positive_scalar(&name("weight_global_scale"), g, files)?;
            }
        }
        LinearFormat::Fp8Block => {
            let [out, in_] = two_dims(module, shape)?;
            let w = take("weight")?;
            expect(&name("weight"), w, Dtype::F8_E4M3, shape)?;
            if let Some(index) = files.bytes(w).iter().position(|&b| e4m3_is_nan(b)) {
                return Err(CheckpointError::BadValues {
                    name: name("weight"),
                    problem: format!("element {index} is NaN"),
                });
            }
            let s = take("weight_scale_inv")?;
            let grid = [out.div_ceil(FP8_BLOCK), in_.div_ceil(FP8_BLOCK)];
            expect(&name("weight_scale_inv"), s, Dtype::F32, &grid)?;
            check_positive_f32s(&name("weight_scale_inv"), files.bytes(s))?;
        }
    }
    let has_bias = has("bias");
    match (bias, has_bias) {
        (Some(len), true) => {
            let b = take("bias")?;
            expect(&name("bias"), b, Dtype::BF16, &[len])?;
            check_finite_bf16(&name("bias"), files.bytes(b))?;
        }
        (Some(_), false) => return Err(CheckpointError::MissingTensor(name("bias"))),
        (None, true) => {
            return Err(CheckpointError::UnexpectedTensor {
                name: name("bias"),
                why: "the contract gives this linear no bias".into(),
            });
        }
        (None, false) => {}
    }
    let info = LinearInfo {
        module: module.to_string(),
        format,
        shape: shape.to_vec(),
        has_bias,
        tensor_scale,
        stored_bytes,
    };
    Ok((info, used))
}

fn two_dims(module: &str, shape: &[usize]) -> Result<[usize; 2], CheckpointError> {
    match shape {
        [out, in_] => Ok([*out, *in_]),
        _ => Err(CheckpointError::TensorMismatch {
            name: format!("{module}.weight"),
            expected: "a 2-D linear weight".into(),
            found: format!("a {}-D module", shape.len()),
        }),
    }
}

/// Checks a tensor's dtype and shape.
pub fn expect(name: &str, entry: &TensorEntry, dtype: Dtype, shape: &[usize]) -> Result<(), CheckpointError> {
    if entry.dtype != dtype || entry.shape != shape {
        return Err(CheckpointError::TensorMismatch {
            name: name.to_string(),
            expected: format!("{} {:?}", dtype_name(dtype), shape),
            found: format!("{} {:?}", dtype_name(entry.dtype), entry.shape),
        });
    }
    Ok(())
}

/// Refuses NaN or negative E4M3 block scales, naming the first bad one.
fn check_block_scales(name: &str, bytes: &[u8], blocks_per_row: usize) -> Result<(), CheckpointError> {
    if let Some(index) = bytes.iter().position(|&b| e4m3_is_nan(b) || b & 0x80 != 0) {
        let kind = if e4m3_is_nan(bytes[index]) { "NaN" } else { "negative" };
        return Err(CheckpointError::BadValues {
            name: name.to_string(),
            problem: format!(
                "block scale at row {}, block {} is {kind} (0x{:02X})",
                index / blocks_per_row,
                index % blocks_per_row,
                bytes[index]
            ),
        });
    }
    Ok(())
}

/// Reads an F32 scalar (shape [] or [1]) that must be finite and positive.
fn positive_scalar(name: &str, entry: &TensorEntry, files: &WeightFiles) -> Result<f32, CheckpointError> {
    if entry.dtype != Dtype::F32 || entry.element_count() != 1 || entry.shape.len() > 1 {
        return Err(CheckpointError::TensorMismatch {
            name: name.to_string(),
            expected: "F32 scalar ([] or [1])".into(),
            found: format!("{} {:?}", dtype_name(entry.dtype), entry.shape),
        });
    }
    let bytes = files.bytes(entry);
    let value = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if !(value.is_finite() && value > 0.0) {
        return Err(CheckpointError::BadValues {
            name: name.to_string(),
            problem: format!("tensor scale {value} is not a finite positive number"),
        });
    }
    Ok(value)
}

fn check_positive_f32s(name: &str, bytes: &[u8]) -> Result<(), CheckpointError> {
    for (index, chunk) in bytes.chunks_exact(4).enumerate() {
        let value = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        if !(value.is_finite() && value > 0.0) {
            return Err(CheckpointError::BadValues {
                name: name.to_string(),
                problem: format!("scale {index} is {value}, not a finite positive number"),
            });
        }
    }
    Ok(())
}

/// Refuses BF16 data holding NaN or infinity.
pub fn check_finite_bf16(name: &str, bytes: &[u8]) -> Result<(), CheckpointError> {
    for (index, chunk) in bytes.chunks_exact(2).enumerate() {
        let value = bf16_to_f32(u16::from_le_bytes([chunk[0], chunk[1]]));
        if !value.is_finite() {
            return Err(CheckpointError::BadValues {
                name: name.to_string(),
                problem: format!("element {index} is {value}"),
            });
        }
    }
    Ok(())
}
