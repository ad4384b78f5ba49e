//! The codec convolutions' launches: their parameter blocks and grids, from `codec.wgsl`'s
//! tiling, so that the engine and the tests launch them alike.

use crate::flags;
use crate::params::CodecParams;

/// Frames a codec convolution workgroup computes (`codec.wgsl`'s FRAMES).
pub const CODEC_CONV_FRAMES: usize = 4;

/// Output channels per thread of a conv1d (`codec.wgsl`'s CHANNELS).
const CONV_CHANNELS: usize = 4;

/// Phases per thread of a transposed convolution (`codec.wgsl`'s PHASES).
const TRANSPOSE_PHASES: usize = 2;

/// Output channels per thread of a transposed convolution (`codec.wgsl`'s
/// TRANSPOSE_CHANNELS).
const TRANSPOSE_CHANNELS: usize = 2;

/// A codec convolution's parameter block and workgroup grid.
pub struct CodecLaunch {
    /// The parameter block.
    pub params: CodecParams,
    /// Workgroups along x, y, z.
    pub grid: [u32; 3],
}

/// The fewest input channels a thread of a conv1d with more than one tap sums over.
const CONV_CHANNELS_PER_THREAD: usize = 8;

/// The fewest input channels a thread of a 1x1 conv1d sums over.
const POINTWISE_CHANNELS_PER_THREAD: usize = 16;

/// The fewest input channels a thread of a transposed convolution sums over.
const TRANSPOSE_CHANNELS_PER_THREAD: usize = 32;

// Fewer channels per thread mean more threads per output channel and a longer tree to add
// their sums; more mean longer loops on fewer threads. Each floor above is the one that
// measured fastest for a chunk of the bench codec, each kind varied alone and then together.

/// Threads per output channel of a convolution over `cin` input channels: the largest power
/// of two up to 64 that leaves each thread at least `least` channels (one thread below).
fn conv_lanes(cin: usize, least: usize) -> usize {
    let wanted = (cin / least).clamp(1, 64);
    1 << wanted.ilog2()
}

/// The fewest threads per output channel that leave no thread row of a conv1d workgroup
/// without a channel: a workgroup holds 64 / lanes * CONV_CHANNELS channels, so a convolution with
/// fewer outputs (the output convolution's one) gives the threads it would leave idle to the
/// channels it has. (With 8 lanes the output convolution, 64 -> 1 channels, left seven of
/// each workgroup's eight thread rows idle and measured markedly slower.)
fn lanes_for_few_outputs(cout: usize) -> usize {
    let groups = cout.div_ceil(CONV_CHANNELS).clamp(1, 64);
    64 / (1 << groups.ilog2())
}

/// The fields every convolution's parameter block shares: its shape, the threads per output
/// channel (`lanes`), and flags 3 (bias added, output rounded to BF16).
fn conv_params(cin: usize, cout: usize, frames: usize, lanes: usize) -> CodecParams {
    CodecParams {
        frames: frames as u32,
        in_ch: cin as u32,
        out_ch: cout as u32,
        flags: flags::codec::BIAS | flags::codec::ROUND,
        lanes: lanes as u32,
        ..Default::default()
    }
}

/// A causal conv1d of `cin` -> `cout` channels, `kernel` taps `dilation` frames apart, over
/// `frames` frames (its history holds the (kernel - 1) * dilation frames before them), bias
/// added and the output rounded to BF16. Grid: (output channel groups, tiles of frames, 1).
pub fn conv1d_launch(cin: usize, cout: usize, frames: usize, kernel: usize, dilation: usize) -> CodecLaunch {
    let least = if kernel == 1 {
        POINTWISE_CHANNELS_PER_THREAD
    } else {
        CONV_CHANNELS_PER_THREAD
    };
    let lanes = conv_lanes(cin, least).max(lanes_for_few_outputs(cout));
    CodecLaunch {
        params: CodecParams {
            kernel: kernel as u32,
            dilation: dilation as u32,
            history: ((kernel - 1) * dilation) as u32,
            count: (frames * cout) as u32,
            ..conv_params(cin, cout, frames, lanes)
        },
        grid: [
            cout.div_ceil(64 / lanes * CONV_CHANNELS) as u32,
            frames.div_ceil(CODEC_CONV_FRAMES) as u32,
            1,
        ],
    }
}

/// A transposed convolution of `cin` -> `cout` channels upsampling `frames` frames by `rate`
/// (its history holds the frame before them), bias added and the output rounded to BF16.
/// Grid: (output channel groups, tiles of input frames, groups of phases).
pub fn conv_transpose_launch(cin: usize, cout: usize, frames: usize, rate: usize) -> CodecLaunch {
    let lanes = conv_lanes(cin, TRANSPOSE_CHANNELS_PER_THREAD);
    CodecLaunch {
        params: CodecParams {
            kernel: rate as u32,
            dilation: 1,
            history: 1,
            count: (frames * rate * cout) as u32,
            ..conv_params(cin, cout, frames, lanes)
        },
        grid: [
            cout.div_ceil(64 / lanes * TRANSPOSE_CHANNELS) as u32,
            frames.div_ceil(CODEC_CONV_FRAMES) as u32,
            rate.div_ceil(TRANSPOSE_PHASES) as u32,
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A conv1d workgroup's channel slots (64 / lanes thread rows of CONV_CHANNELS each) never
    /// outnumber a small convolution's channels by a thread row or more, and wide ones keep
    /// the lanes their inputs ask for.
    #[test]
    fn few_output_channels_take_the_idle_threads_as_lanes() {
        for cout in [1usize, 2, 3, 4, 5, 8, 9, 16, 31, 64, 256, 1024] {
            for cin in [16usize, 64, 512] {
                let lanes = conv1d_launch(cin, cout, 8, 7, 1).params.lanes as usize;
                let slots = 64 / lanes * CONV_CHANNELS;
                assert!(
                    slots < cout.max(1) + CONV_CHANNELS,
                    "{cin} -> {cout}: {lanes} lanes leave {slots} channel slots"
                );
                assert!(lanes >= conv_lanes(cin, CONV_CHANNELS_PER_THREAD), "{cin} -> {cout}");
            }
        }
        assert_eq!(conv1d_launch(512, 512, 8, 7, 1).params.lanes, 64);
        assert_eq!(conv1d_launch(64, 256, 8, 7, 1).params.lanes, 8);
        assert_eq!(conv1d_launch(64, 1, 8, 7, 1).params.lanes, 64);
    }
}
