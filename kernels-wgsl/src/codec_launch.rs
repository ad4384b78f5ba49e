//! The codec convolutions' launches: their parameter blocks and grids, from `codec.wgsl`'s
//! tiling, so that the engine and the tests launch them alike.

use crate::params::CodecParams;

/// Frames a codec convolution workgroup computes (`codec.wgsl`'s FRAMES).
pub const CODEC_CONV_FRAMES: usize = 4;

/// Output channels per thread of a conv1d (`codec.wgsl`'s CHANNELS).
const CONV_CHANNELS: usize = 4;

/// Phases per thread of a transposed convolution (`codec.wgsl`'s PHASES).
const TRANSPOSE_PHASES: usize = 2;

/// A codec convolution's parameter block and workgroup grid.
pub struct CodecLaunch {
    /// The parameter block.
    pub params: CodecParams,
    /// Workgroups along x, y, z.
    pub grid: [u32; 3],
}

/// Threads per output channel of a convolution over `cin` input channels: the largest power
/// of two up to 64 that leaves each thread at least eight channels.
fn conv_lanes(cin: usize) -> usize {
    let wanted = (cin / 8).clamp(1, 64);
    1 << wanted.ilog2()
}

/// The fields every convolution's parameter block shares: its shape, the threads per output
/// channel, and flags 3 (bias added, output rounded to BF16).
fn conv_params(cin: usize, cout: usize, frames: usize) -> CodecParams {
    CodecParams {
        frames: frames as u32,
        in_ch: cin as u32,
        out_ch: cout as u32,
        flags: 3,
        lanes: conv_lanes(cin) as u32,
        ..Default::default()
    }
}

/// A causal conv1d of `cin` -> `cout` channels, `kernel` taps `dilation` frames apart, over
/// `frames` frames (its history holds the (kernel - 1) * dilation frames before them), bias
/// added and the output rounded to BF16. Grid: (output channel groups, tiles of frames, 1).
pub fn conv1d_launch(cin: usize, cout: usize, frames: usize, kernel: usize, dilation: usize) -> CodecLaunch {
    CodecLaunch {
        params: CodecParams {
            kernel: kernel as u32,
            dilation: dilation as u32,
            history: ((kernel - 1) * dilation) as u32,
            count: (frames * cout) as u32,
            ..conv_params(cin, cout, frames)
        },
        grid: [
            cout.div_ceil(64 / conv_lanes(cin) * CONV_CHANNELS) as u32,
            frames.div_ceil(CODEC_CONV_FRAMES) as u32,
            1,
        ],
    }
}

/// A transposed convolution of `cin` -> `cout` channels upsampling `frames` frames by `rate`
/// (its history holds the frame before them), bias added and the output rounded to BF16.
/// Grid: (output channel groups, tiles of input frames, groups of phases).
pub fn conv_transpose_launch(cin: usize, cout: usize, frames: usize, rate: usize) -> CodecLaunch {
    CodecLaunch {
        params: CodecParams {
            kernel: rate as u32,
            dilation: 1,
            history: 1,
            count: (frames * rate * cout) as u32,
            ..conv_params(cin, cout, frames)
        },
        grid: [
            cout.div_ceil(64 / conv_lanes(cin)) as u32,
            frames.div_ceil(CODEC_CONV_FRAMES) as u32,
            rate.div_ceil(TRANSPOSE_PHASES) as u32,
        ],
    }
}
