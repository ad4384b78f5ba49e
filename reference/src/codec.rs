//! The codec decoder in FP64 (contract section 8): codes to PCM, whole utterance.

use super::ops::Rounding;
use super::weights;
use drama_checkpoint::{Checkpoint, names};

/// Activations [frames, channels], row-major.
struct Signal {
    frames: usize,
    channels: usize,
    values: Vec<f64>,
}

/// Causal dilated conv1d, weight [out, in, k] (PyTorch), left zero padding (k-1)*d.
fn conv1d(x: &Signal, checkpoint: &Checkpoint, module: &str, k: usize, d: usize, rounding: Rounding) -> Signal {
    let w = weights::values(checkpoint, &format!("{module}.weight"));
    let b = weights::values(checkpoint, &format!("{module}.bias"));
    let cin = x.channels;
    let cout = b.len();
    let input: Vec<f64> = x.values.iter().map(|&v| rounding.bf16(v)).collect();
    let mut values = vec![0.0; x.frames * cout];
    for t in 0..x.frames {
        for o in 0..cout {
            let mut acc = b[o];
            for j in 0..k {
                let back = (k - 1 - j) * d;
                if back > t {
                    continue;
                }
                for i in 0..cin {
                    acc += w[(o * cin + i) * k + j] * input[(t - back) * cin + i];
                }
            }
            values[t * cout + o] = rounding.bf16(acc);
        }
    }
    Signal {
        frames: x.frames,
        channels: cout,
        values,
    }
}

/// ConvTranspose1d, weight [in, out, 2r] (PyTorch), stride r, the first frames*r outputs.
fn conv_transpose(x: &Signal, checkpoint: &Checkpoint, module: &str, r: usize, rounding: Rounding) -> Signal {
    let w = weights::values(checkpoint, &format!("{module}.weight"));
    let b = weights::values(checkpoint, &format!("{module}.bias"));
    let cin = x.channels;
    let cout = b.len();
    let input: Vec<f64> = x.values.iter().map(|&v| rounding.bf16(v)).collect();
    let frames = x.frames * r;
    let mut values: Vec<f64> = (0..frames * cout).map(|n| b[n % cout]).collect();
    // Scatter form (the definition), independent of the kernel's gather form.
    for t in 0..x.frames {
        for j in 0..2 * r {
            let s = t * r + j;
            if s >= frames {
                continue;
            }
            for o in 0..cout {
                for i in 0..cin {
                    values[s * cout + o] += w[(i * cout + o) * 2 * r + j] * input[t * cin + i];
                }
            }
        }
    }
    let values = values.into_iter().map(|v| rounding.bf16(v)).collect();
    Signal {
        frames,
        channels: cout,
        values,
    }
}

fn snake(x: &Signal, checkpoint: &Checkpoint, alpha: &str, rounding: Rounding) -> Signal {
    let a = weights::values(checkpoint, alpha);
    let values = x
        .values
        .iter()
        .enumerate()
        .map(|(n, &v)| {
            let alpha = a[n % x.channels];
            rounding.bf16(v + (alpha * v).sin().powi(2) / (alpha + 1e-9))
        })
        .collect();
    Signal {
        frames: x.frames,
        channels: x.channels,
        values,
    }
}

/// Decodes `codes` (each below C) to PCM samples at the codec's rate.
pub fn decode(checkpoint: &Checkpoint, codes: &[u32], rounding: Rounding) -> Vec<f64> {
    let c = &checkpoint.config.codec;
    let k = c.kernel_size;
    let book = weights::values(checkpoint, names::CODEBOOK);
    let dim = c.codebook_dim;
    let mut x = Signal {
        frames: codes.len(),
        channels: dim,
        values: codes
            .iter()
            .flat_map(|&code| book[code as usize * dim..(code as usize + 1) * dim].to_vec())
            .collect(),
    };
    x = conv1d(&x, checkpoint, names::CODEC_IN, k, 1, rounding);
    for (u, &rate) in c.upsample_rates.iter().enumerate() {
        let at = |t: &str| names::fill(t, &[("u", u)]);
        x = snake(&x, checkpoint, &at(names::STAGE_SNAKE), rounding);
        x = conv_transpose(&x, checkpoint, &at(names::STAGE_UP), rate, rounding);
        for (r, &d) in c.residual_dilations.iter().enumerate() {
            let at = |t: &str| names::fill(t, &[("u", u), ("r", r)]);
            let mut y = snake(&x, checkpoint, &at(names::RES_SNAKE1), rounding);
            y = conv1d(&y, checkpoint, &at(names::RES_CONV1), k, d, rounding);
            y = snake(&y, checkpoint, &at(names::RES_SNAKE2), rounding);
            y = conv1d(&y, checkpoint, &at(names::RES_CONV2), 1, 1, rounding);
            for (a, b) in x.values.iter_mut().zip(&y.values) {
                *a += b;
            }
        }
    }
    x = snake(&x, checkpoint, names::OUT_SNAKE, rounding);
    x = conv1d(&x, checkpoint, names::CODEC_OUT, k, 1, rounding);
    x.values.iter().map(|v| v.tanh()).collect()
}
