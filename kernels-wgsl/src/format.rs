//! How weights, inputs and outputs of the kernels are laid out: the stored weight formats,
//! the linear kernels' workgroup widths and input forms, the codec's fused outputs, routing's
//! capacities, and where an embedded row comes from.

/// Where an embedded row comes from: the values of a step's `row_table`, which `embed`
/// (elementwise.wgsl) reads.
pub mod row_source {
    /// A voice-prefix row (`row_index` = lane * P + p).
    pub const PREFIX: u32 = 0;
    /// A text token.
    pub const TEXT: u32 = 1;
    /// An audio token.
    pub const AUDIO: u32 = 2;
}

/// How a linear's weights are stored on the GPU (exactly as in the checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum WeightFormat {
    /// BF16, two per word.
    Bf16,
    /// NVFP4: packed E2M1 nibbles, E4M3 block scales, one tensor scale.
    Nvfp4,
    /// FP8 E4M3 with F32 scales per 128x128 tile.
    Fp8Block,
}

/// Invocations per workgroup of a `linear.wgsl` kernel (its WG): how many weight rows a
/// workgroup takes, and so how many workgroups a launch has. A row's bits do not depend on
/// it: every thread row of the format's LANES threads computes its weight rows alone, by the
/// same partition and tree. Which launch takes which width: [`Kernel::linear_width`] (and,
/// for the routed experts, `drama_graph::select::expert_width`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum LinearWidth {
    /// 32 invocations.
    Narrow,
    /// 64 invocations.
    Standard,
    /// 128 invocations.
    Wide,
}

/// How a dense linear reads its input's BF16 values: as f32 (decode steps), or two to a
/// 32-bit word (steps of many rows, whose inputs a `pack_bf16` launch packs first: half
/// the bytes and loads). The same bits either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum LinearInput {
    /// f32 storage (binding 1).
    F32,
    /// BF16 pairs (binding 9).
    Bf16Pairs,
}

impl LinearInput {
    /// Both forms.
    pub const ALL: [LinearInput; 2] = [LinearInput::F32, LinearInput::Bf16Pairs];
}

impl LinearWidth {
    /// Every width, narrowest first.
    pub const ALL: [LinearWidth; 3] = [LinearWidth::Narrow, LinearWidth::Standard, LinearWidth::Wide];

    /// Invocations per workgroup.
    pub fn invocations(self) -> u32 {
        match self {
            LinearWidth::Narrow => 32,
            LinearWidth::Standard => 64,
            LinearWidth::Wide => 128,
        }
    }
}
/// What a codec conv1d launch writes (`codec.wgsl`'s conv1d entry points): the
/// convolution itself, or the convolution followed by the element-wise steps that always
/// come next in the decoder, in the same launch and with the same bits as those steps' own
/// kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum ConvOutput {
    /// The convolution (bias added, rounded as the flags ask): the first step of every form
    /// below, which the tests compare them with (the decoder fuses each of its conv1ds with
    /// the steps after it).
    Plain,
    /// snake(convolution) rounded to BF16: the input convolution and the first stage's
    /// snake, or a residual unit's dilated convolution and its second snake (alpha at
    /// binding 6).
    Snake,
    /// residual + convolution, and snake(that) rounded to BF16 at binding 8: a residual
    /// unit's 1x1 convolution, its residual connection, and the snake that reads the result
    /// next (alpha at binding 6, the residual at 7).
    ResidualAndSnake,
    /// tanh(convolution): the output convolution and the PCM.
    Tanh,
}
/// The kept experts a routing module's workgroup arrays hold (`router.wgsl`'s MAX_KEPT): a
/// layer routes with the smallest capacity that holds its kept experts, since routing's
/// workgroup memory (about 16 KB at 512) is carried by every workgroup of its launch, the
/// linear's beside it too. (128 kept experts compiled for 128 instead of 512 measured faster,
/// the bits the same.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeptCapacity(u16);

impl KeptCapacity {
    /// Every capacity, smallest first.
    pub const ALL: [KeptCapacity; 3] = [KeptCapacity(128), KeptCapacity(256), KeptCapacity(512)];

    /// The smallest capacity holding `kept` experts; None past [`MAX_KEPT_EXPERTS`].
    pub fn for_kept(kept: usize) -> Option<KeptCapacity> {
        KeptCapacity::ALL
            .into_iter()
            .find(|capacity| kept <= capacity.experts())
    }

    /// Experts it holds.
    pub fn experts(self) -> usize {
        usize::from(self.0)
    }
}
impl WeightFormat {
    /// The input widths the linear kernels run for this format are multiples of this (the
    /// format file's UNIT: the weights of one load, which must start a row's bytes).
    pub fn width_multiple(self) -> usize {
        match self {
            WeightFormat::Bf16 => 8,
            WeightFormat::Nvfp4 | WeightFormat::Fp8Block => 16,
        }
    }

    /// Whether a linear of this format and input width runs in [`Kernel::LinearRagged`]
    /// (which reads f32 rows): BF16 at a width the main kernels cannot read.
    pub fn runs_ragged(self, in_features: usize) -> bool {
        self == WeightFormat::Bf16 && !in_features.is_multiple_of(self.width_multiple())
    }

    /// Threads per thread row of the linear kernels for this format (the format file's
    /// LANES): the threads that share each weight row's units.
    pub fn thread_row_lanes(self) -> u32 {
        match self {
            WeightFormat::Bf16 | WeightFormat::Fp8Block => 32,
            WeightFormat::Nvfp4 => 16,
        }
    }

    /// Weight rows one workgroup of `width` of the dense linear kernels computes for this
    /// format (two per thread row): a launch covering N rows needs
    /// `N.div_ceil(rows_per_workgroup(width))` workgroups along x (half as many features
    /// with the SwiGLU epilogue, which pairs a gate and an up row).
    pub fn rows_per_workgroup(self, width: LinearWidth) -> u32 {
        2 * width.invocations() / self.thread_row_lanes()
    }

    /// Weight rows one workgroup of `width` of the gathered (routed-expert) kernels
    /// computes: four per thread row, twice [`WeightFormat::rows_per_workgroup`] (half as
    /// many features with the SwiGLU epilogue).
    pub fn gathered_rows_per_workgroup(self, width: LinearWidth) -> u32 {
        2 * self.rows_per_workgroup(width)
    }
}
