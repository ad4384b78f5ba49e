//! Parameter blocks, laid out exactly like the `Params` structs of the WGSL files.

use std::ops::Range;

use bytemuck::{Pod, Zeroable};

/// `linear.wgsl` parameters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct LinearParams {
    /// Activation rows (linear) or slots (gathered).
    pub rows: u32,
    /// Input width K.
    pub in_features: u32,
    /// Weight rows in this segment (per expert when gathered).
    pub out_features: u32,
    /// Column of the output row where this segment starts.
    pub out_offset: u32,
    /// Floats per output row.
    pub y_stride: u32,
    /// Gathered: input row = slot / x_row_div.
    pub x_row_div: u32,
    /// Gathered: first local expert id held by this segment.
    pub expert_begin: u32,
    /// Gathered: one past the last.
    pub expert_end: u32,
    /// [`crate::flags::linear`] bits.
    pub flags: u32,
    /// Dense: NVFP4 tensor scale (1 otherwise); gathered kernels read per-expert scales.
    pub tensor_scale: f32,
    /// Bias element of this segment's first output.
    pub bias_offset: u32,
    /// `linear_kv`: floats per attention head.
    pub head_dim: u32,
    /// `linear_kv`: output columns before the keys (the queries).
    pub q_width: u32,
    /// `linear_kv`: positions per lane in the caches.
    pub capacity: u32,
    /// `linear_pair`: workgroups of the first linear (the rest compute the second);
    /// `route_linear`: routing workgroups per grid row (the rest compute the linear).
    pub split_groups: u32,
    /// `linear_pair`: the second linear's weight rows.
    pub second_out_features: u32,
    /// `linear_pair`: floats per row of the second linear's output.
    pub second_y_stride: u32,
    /// `linear_pair`: the second linear's flags (as `flags`).
    pub second_flags: u32,
}

/// `norm.wgsl` parameters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct NormParams {
    /// Row width.
    pub width: u32,
    /// [`crate::flags::norm`] bits.
    pub flags: u32,
    /// Epsilon.
    pub eps: f32,
    /// `combine_rms_norm`: routed experts per token.
    pub k: u32,
    /// `combine_rms_norm`: floats per row of the router logits, the shared gate's logit last.
    pub gate_stride: u32,
    /// Padding.
    pub pad: [u32; 3],
}

/// `attention.wgsl` parameters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct AttentionParams {
    /// Token rows.
    pub rows: u32,
    /// Query heads.
    pub heads: u32,
    /// Key/value heads.
    pub kv_heads: u32,
    /// Head width.
    pub head_dim: u32,
    /// Positions per cache slot.
    pub capacity: u32,
    /// [`crate::flags::attention`] bits.
    pub flags: u32,
    /// Score scale 1/sqrt(head_dim).
    pub scale: f32,
    /// Query heads per block of a row that goes by blocks ([`crate::attention_block_heads`]).
    pub block_heads: u32,
    /// Chunks a row must reach to go by blocks of heads ([`crate::ATTENTION_BLOCKS_FROM`];
    /// `u32::MAX`: no row does). The same bits either way.
    pub block_from: u32,
    /// Padding.
    pub pad: [u32; 2],
}

/// `router.wgsl` parameters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct RouterParams {
    /// Token rows.
    pub rows: u32,
    /// Router logits per token.
    pub logit_width: u32,
    /// Kept experts.
    pub kept: u32,
    /// Experts chosen per token.
    pub k: u32,
    /// [`crate::flags::router`] bits.
    pub flags: u32,
    /// Expert groups.
    pub n_group: u32,
    /// Groups kept per token.
    pub topk_group: u32,
    /// Original ids per group.
    pub group_size: u32,
    /// Routed scaling factor.
    pub scaling: f32,
    /// Padding.
    pub pad: [u32; 3],
}

/// `elementwise.wgsl` parameters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct ElementwiseParams {
    /// Output elements.
    pub count: u32,
    /// Row width.
    pub width: u32,
    /// embed: first row of the text table's segment; mean_rows: rows averaged.
    pub k: u32,
    /// [`crate::flags::elementwise`] bits.
    pub flags: u32,
    /// embed: one past the last row of the text table's segment.
    pub row_end: u32,
    /// embed: first row of the audio table's segment.
    pub audio_begin: u32,
    /// embed: one past the last row of the audio table's segment.
    pub audio_end: u32,
    /// Padding.
    pub pad: u32,
}

impl ElementwiseParams {
    /// `embed`'s parameters: `rows` rows of `width` values, the rows `text` and `audio` of
    /// the two tables' segments the launch binds, and with `prefixes` the voice-prefix rows.
    pub fn embed(rows: usize, width: usize, text: Range<usize>, audio: Range<usize>, prefixes: bool) -> Self {
        ElementwiseParams {
            count: (rows * width) as u32,
            width: width as u32,
            k: text.start as u32,
            flags: if prefixes {
                crate::flags::elementwise::PREFIX_ROWS
            } else {
                0
            },
            row_end: text.end as u32,
            audio_begin: audio.start as u32,
            audio_end: audio.end as u32,
            pad: 0,
        }
    }
}

/// `moe.wgsl`'s `group_slots` parameters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct GroupParams {
    /// Routed-expert slots of the step.
    pub slots: u32,
    /// Local expert ids are below this.
    pub experts: u32,
    /// Entries of the blocks buffer.
    pub blocks: u32,
    /// Padding.
    pub pad: u32,
}

/// `codec.wgsl` parameters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct CodecParams {
    /// Input frames in this chunk.
    pub frames: u32,
    /// Input channels.
    pub in_ch: u32,
    /// Output channels (channels of the element-wise kernels).
    pub out_ch: u32,
    /// conv1d: kernel size; conv_transpose: upsampling rate.
    pub kernel: u32,
    /// conv1d: dilation.
    pub dilation: u32,
    /// Frames held in the history binding.
    pub history: u32,
    /// [`crate::flags::codec`] bits.
    pub flags: u32,
    /// Output elements.
    pub count: u32,
    /// Convolutions: threads per output channel (a power of two dividing 64).
    pub lanes: u32,
    /// Padding to 16 bytes.
    pub pad: [u32; 3],
}

/// `probe.wgsl` parameters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct ProbeParams {
    /// Words to convert.
    pub count: u32,
    /// Padding.
    pub pad: [u32; 3],
}

/// `bandwidth.wgsl` parameters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct BandwidthParams {
    /// vec4<u32> elements to read.
    pub words: u32,
    /// Total invocations of the grid.
    pub stride: u32,
    /// Padding.
    pub pad: [u32; 2],
}

/// `sample.wgsl` parameters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct SampleParams {
    /// Draws (one token each).
    pub rows: u32,
    /// Logits per row.
    pub vocab: u32,
    /// Padding.
    pub pad: [u32; 2],
}

/// One draw's settings for `sample.wgsl` (its `Row`), in a storage buffer of one per draw.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
pub struct SampleRow {
    /// floor(T * 2^10); 0 picks the best.
    pub tau: u32,
    /// Keep the k best levels (0: all).
    pub top_k: u32,
    /// floor(p * 2^24).
    pub top_p: u32,
    /// The draw's random word.
    pub random: u32,
    /// The id never sampled.
    pub forbidden: u32,
    /// The row of logits drawn from (the cond lane's).
    pub cond: u32,
    /// The uncond lane's row mixed in, or [`SampleRow::UNGUIDED`].
    pub uncond: u32,
    /// The guidance scale, floor(gamma * 2^16).
    pub gamma: u32,
}

impl SampleRow {
    /// The `uncond` of an unguided draw.
    pub const UNGUIDED: u32 = u32::MAX;
}
