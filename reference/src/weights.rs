//! Decoding checkpoint tensors to f64, straight from the contract's formulas (independent of
//! the GPU kernels, which never expand weights).

use safetensors::Dtype;

use super::ops::Matrix;
use drama_checkpoint::linear::{FP8_BLOCK, NVFP4_BLOCK};
use drama_checkpoint::numerics::{e2m1_to_f32, e4m3_to_f32};
use drama_checkpoint::{Checkpoint, LinearFormat};

fn tensor<'a>(checkpoint: &'a Checkpoint, name: &str) -> (&'a [u8], Dtype, Vec<usize>) {
    let entry = checkpoint
        .weights
        .entry(name)
        .unwrap_or_else(|| panic!("validated checkpoint lacks {name}"));
    (checkpoint.weights.bytes(entry), entry.dtype, entry.shape.clone())
}

/// A BF16 or F32 tensor as f64 values.
pub fn values(checkpoint: &Checkpoint, name: &str) -> Vec<f64> {
    checkpoint.float_tensor(name).into_iter().map(f64::from).collect()
}

/// An I32 tensor.
pub fn ints(checkpoint: &Checkpoint, name: &str) -> Vec<i64> {
    let (bytes, _, _) = tensor(checkpoint, name);
    bytes
        .chunks_exact(4)
        .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .collect()
}

fn f32_scalar(checkpoint: &Checkpoint, name: &str) -> f64 {
    values(checkpoint, name)[0]
}

/// A linear (or convolution, flattened to [out, in*k]) module decoded to f64.
pub fn linear(checkpoint: &Checkpoint, module: &str) -> Matrix {
    let info = checkpoint
        .linear(module)
        .unwrap_or_else(|| panic!("validated checkpoint lacks linear {module}"));
    let out = info.shape[0];
    let in_: usize = info.shape[1..].iter().product();
    let name = |suffix: &str| format!("{module}.{suffix}");
    let decoded = match info.format {
        LinearFormat::Bf16 => values(checkpoint, &name("weight")),
        LinearFormat::Nvfp4ModelOpt | LinearFormat::Nvfp4CompressedTensors => {
            let codes_name = if info.format == LinearFormat::Nvfp4ModelOpt {
                "weight"
            } else {
                "weight_packed"
            };
            let (codes, _, _) = tensor(checkpoint, &name(codes_name));
            let (scales, _, _) = tensor(checkpoint, &name("weight_scale"));
            let tensor_factor = |v: f64| {
                if info.format == LinearFormat::Nvfp4ModelOpt {
                    v * f32_scalar(checkpoint, &name("weight_scale_2"))
                } else {
                    v / f32_scalar(checkpoint, &name("weight_global_scale"))
                }
            };
            (0..out * in_)
                .map(|index| {
                    let (r, c) = (index / in_, index % in_);
                    let byte = codes[(r * in_ + c) / 2];
                    let code = if c % 2 == 0 { byte & 0x0F } else { byte >> 4 };
                    let scale = e4m3_to_f32(scales[r * (in_ / NVFP4_BLOCK) + c / NVFP4_BLOCK]);
                    tensor_factor(f64::from(e2m1_to_f32(code)) * f64::from(scale))
                })
                .collect()
        }
        LinearFormat::Fp8Block => {
            let (codes, _, _) = tensor(checkpoint, &name("weight"));
            let scale_inv = values(checkpoint, &name("weight_scale_inv"));
            let tiles_per_row = in_.div_ceil(FP8_BLOCK);
            (0..out * in_)
                .map(|index| {
                    let (r, c) = (index / in_, index % in_);
                    f64::from(e4m3_to_f32(codes[index])) * scale_inv[(r / FP8_BLOCK) * tiles_per_row + c / FP8_BLOCK]
                })
                .collect()
        }
    };
    let bias = info.has_bias.then(|| values(checkpoint, &name("bias")));
    Matrix {
        out,
        in_,
        values: decoded,
        bias,
    }
}
