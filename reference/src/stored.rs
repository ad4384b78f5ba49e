//! Random weights in each stored linear format, with their exact values: what the kernel
//! tests and `drama qualify` feed the GPU and compare against. They cover every E2M1 code
//! in both nibble positions, E4M3 block scales at the subnormal, normal and maximum
//! boundaries, and FP8 128x128 tiles with ragged edges.

use drama_checkpoint::numerics::{bf16_to_f32, e2m1_to_f32, e4m3_to_f32, f32_to_bf16_bits};
use drama_kernels::WeightFormat;
use rand_chacha::ChaCha8Rng;
use rand_core::Rng;

/// A weight matrix [rows, cols] as a checkpoint stores it, and its decoded values.
pub struct StoredWeights {
    /// The format.
    pub format: WeightFormat,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// The codes: BF16 values, packed E2M1 nibbles (low nibble first) or E4M3 bytes.
    pub packed: Vec<u8>,
    /// NVFP4: E4M3 block scales [rows, cols / 16]; FP8: f32 tile scales; BF16: a placeholder.
    pub scales: Vec<u8>,
    /// NVFP4's per-tensor factor as the kernel multiplies it (1 otherwise).
    pub tensor_scale: f32,
    /// Every weight's exact value.
    pub decoded: Vec<f64>,
}

/// E4M3 block scales worth covering: the smallest and largest subnormal, the smallest
/// normal, the maximum (448) and random normal values; never NaN or negative.
fn block_scale(rng: &mut ChaCha8Rng) -> u8 {
    match rng.next_u32() % 8 {
        0 => 0x01,
        1 => 0x07,
        2 => 0x08,
        3 => 0x7E,
        _ => 0x20 + (rng.next_u32() % 0x30) as u8,
    }
}

/// A random value in [-1, 1].
fn signed_unit(rng: &mut ChaCha8Rng) -> f32 {
    (f64::from(rng.next_u32()) / f64::from(u32::MAX) * 2.0 - 1.0) as f32
}

/// `n` random BF16 values in [-scale, scale] (as f32): activations as a linear reads them.
pub fn random_bf16(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| bf16_to_f32(f32_to_bf16_bits(scale * signed_unit(rng))))
        .collect()
}

/// Random weights of `format` and shape [rows, cols] (cols a multiple of 16 for NVFP4);
/// `tensor_scale` is NVFP4's per-tensor factor (ignored for the other formats).
pub fn random_weights(
    rng: &mut ChaCha8Rng,
    format: WeightFormat,
    rows: usize,
    cols: usize,
    tensor_scale: f32,
) -> StoredWeights {
    let (packed, scales, tensor_scale, decoded): (Vec<u8>, Vec<u8>, f32, Vec<f64>) = match format {
        WeightFormat::Bf16 => {
            let bits: Vec<u16> = (0..rows * cols).map(|_| f32_to_bf16_bits(signed_unit(rng))).collect();
            let decoded = bits.iter().map(|&b| f64::from(bf16_to_f32(b))).collect();
            let packed = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
            (packed, vec![0; 4], 1.0, decoded)
        }
        WeightFormat::Nvfp4 => {
            let mut packed: Vec<u8> = (0..rows * cols / 2).map(|_| rng.next_u32() as u8).collect();
            // Every nibble value, in both positions, at the start of the matrix.
            for (i, byte) in packed.iter_mut().take(16).enumerate() {
                *byte = (i as u8) | (((15 - i) as u8) << 4);
            }
            let scales: Vec<u8> = (0..rows * cols / 16).map(|_| block_scale(rng)).collect();
            let decoded = (0..rows * cols)
                .map(|i| {
                    let (r, c) = (i / cols, i % cols);
                    let byte = packed[i / 2];
                    let code = if c % 2 == 0 { byte & 15 } else { byte >> 4 };
                    f64::from(e2m1_to_f32(code))
                        * f64::from(e4m3_to_f32(scales[r * cols / 16 + c / 16]))
                        * f64::from(tensor_scale)
                })
                .collect();
            (packed, scales, tensor_scale, decoded)
        }
        WeightFormat::Fp8Block => {
            // Any E4M3 but NaN (0x7F, 0xFF).
            let packed: Vec<u8> = (0..rows * cols)
                .map(|_| {
                    loop {
                        let b = rng.next_u32() as u8;
                        if b & 0x7F != 0x7F {
                            break b;
                        }
                    }
                })
                .collect();
            let grid = (rows.div_ceil(128), cols.div_ceil(128));
            let tiles: Vec<f32> = (0..grid.0 * grid.1).map(|i| 0.001 * (1 + i) as f32).collect();
            let decoded = (0..rows * cols)
                .map(|i| {
                    let (r, c) = (i / cols, i % cols);
                    f64::from(e4m3_to_f32(packed[i])) * f64::from(tiles[(r / 128) * grid.1 + c / 128])
                })
                .collect();
            let scales = tiles.iter().flat_map(|t| t.to_le_bytes()).collect();
            (packed, scales, 1.0, decoded)
        }
    };
    StoredWeights {
        format,
        rows,
        cols,
        packed,
        scales,
        tensor_scale,
        decoded,
    }
}
