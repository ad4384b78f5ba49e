//! The linear kernels, one check per weight format, against the FP64 reference on seeded
//! random inputs, their outputs poisoned before the launch. The weights cover what a
//! checkpoint may hold: every E2M1 code in both nibble positions, E4M3 block scales at the
//! subnormal, normal and maximum boundaries, the NVFP4 per-tensor factor of both
//! conventions, FP8 128x128 tiles with ragged edges, and a BF16 width no multiple of 8.
//! (Attention, norms, routing, SwiGLU and the codec run in the model checks, against the
//! same reference.)

use anyhow::{Result, ensure};
use drama_engine::exec::{LinearIo, linear_launches};
use drama_engine::gpu::Gpu;
use drama_engine::weights::GpuLinear;
use drama_kernels::WeightFormat;
use drama_reference::stored::{StoredWeights, random_bf16, random_weights};
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

use super::Plant;
use super::receipt::{Check, Measured};

/// The error bound of an FP32-accumulated linear, relative to the sum of its terms'
/// magnitudes (`docs/tolerances.md`).
pub const LINEAR_TOLERANCE: f64 = 2e-6;

/// Activation rows of each launch: more than one, not a power of two.
const ROWS: usize = 5;

/// The cases: (check name, format, outputs, input width, per-tensor factor).
fn cases() -> [(&'static str, WeightFormat, usize, usize, TensorScale); 5] {
    [
        ("kernel.linear.bf16", WeightFormat::Bf16, 72, 136, TensorScale::One),
        (
            "kernel.linear.bf16-ragged",
            WeightFormat::Bf16,
            24,
            20,
            TensorScale::One,
        ),
        (
            "kernel.linear.nvfp4-modelopt",
            WeightFormat::Nvfp4,
            40,
            144,
            TensorScale::ModelOpt,
        ),
        (
            "kernel.linear.nvfp4-compressed-tensors",
            WeightFormat::Nvfp4,
            40,
            144,
            TensorScale::CompressedTensors,
        ),
        (
            "kernel.linear.fp8-block",
            WeightFormat::Fp8Block,
            200,
            272,
            TensorScale::One,
        ),
    ]
}

/// How an NVFP4 checkpoint states its per-tensor factor (`docs/contract.md` §4.3, §4.4).
#[derive(Clone, Copy)]
enum TensorScale {
    /// None (BF16, FP8).
    One,
    /// ModelOpt: `weight_scale_2`, multiplied.
    ModelOpt,
    /// compressed-tensors: `weight_global_scale`, divided by: the engine multiplies by its
    /// f32 reciprocal.
    CompressedTensors,
}

impl TensorScale {
    fn draw(self, rng: &mut ChaCha8Rng) -> f32 {
        match self {
            TensorScale::One => 1.0,
            TensorScale::ModelOpt => 0.001 + (rng.next_u32() % 1000) as f32 * 1e-4,
            TensorScale::CompressedTensors => 1.0 / (100.0 + (rng.next_u32() % 10_000) as f32 * 0.37),
        }
    }
}

/// Runs `w` on `x` ([ROWS, width]) on the GPU: y unrounded, [ROWS, out].
fn run_on_gpu(gpu: &Gpu, w: &StoredWeights, x: &[f32]) -> Result<Vec<f32>> {
    let mut linear = GpuLinear::one_segment(gpu, w.format, (w.rows, w.cols), &w.packed, &w.scales);
    linear.tensor_scale = w.tensor_scale;
    let xb = gpu.buffer_with("qualify x", bytemuck::cast_slice(x));
    // NaN bit patterns: an output the kernel does not write stays NaN and fails.
    let y = gpu.buffer_with("qualify y", &vec![0xFF; ROWS * w.rows * 4]);
    let placeholder = gpu.buffer("placeholder", 4);
    let launches = linear_launches(
        gpu,
        &linear,
        &placeholder,
        &LinearIo::plain(&xb, &y, ROWS, w.rows, false),
    )?;
    gpu.submit(&launches);
    Ok(gpu.read_f32(&y)?)
}

/// The worst error of `got` against the FP64 product, relative to the sum of the terms'
/// magnitudes of each output.
fn worst_relative_error(w: &StoredWeights, x: &[f32], got: &[f32]) -> Result<f64> {
    ensure!(
        got.len() == ROWS * w.rows,
        "{} outputs, want {}",
        got.len(),
        ROWS * w.rows
    );
    let mut worst = 0.0f64;
    for r in 0..ROWS {
        for n in 0..w.rows {
            let (mut sum, mut magnitude) = (0.0f64, 0.0f64);
            for k in 0..w.cols {
                let term = w.decoded[n * w.cols + k] * f64::from(x[r * w.cols + k]);
                sum += term;
                magnitude += term.abs();
            }
            let g = got[r * w.rows + n];
            ensure!(g.is_finite(), "output ({r}, {n}) is {g}: not written, or overflowed");
            worst = worst.max((f64::from(g) - sum).abs() / magnitude.max(f64::MIN_POSITIVE));
        }
    }
    Ok(worst)
}

/// One check per weight format.
pub fn checks(gpu: &Gpu, seed: u64, plant: &Plant) -> Vec<Check> {
    cases()
        .into_iter()
        .map(|(name, format, out, width, scale)| {
            Check::run(name, || {
                let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (out * 1009 + width) as u64);
                let tensor_scale = scale.draw(&mut rng);
                let w = random_weights(&mut rng, format, out, width, tensor_scale);
                let x = random_bf16(&mut rng, ROWS * width, 2.0);
                let mut got = run_on_gpu(gpu, &w, &x)?;
                plant.corrupt(name, &mut got);
                let worst = worst_relative_error(&w, &x, &got)?;
                Ok(Measured::new(
                    worst,
                    LINEAR_TOLERANCE,
                    format!("{ROWS}x{width} by {out}x{width}: worst error / sum of |terms|"),
                ))
            })
        })
        .collect()
}
