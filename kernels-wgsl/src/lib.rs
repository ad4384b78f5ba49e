//! The WGSL compute kernels of the Drama 3 engine.
//!
//! One `.wgsl` file per kernel family under `wgsl/`; a [`Module`] is a family assembled with
//! the shared helpers (and, for linears, a weight-format file). A [`Kernel`] is one entry
//! point of a module together with the bindings it uses and its parameter block. Kernels know
//! nothing of the model: shapes arrive in the parameter blocks at dispatch time.
//!
//! [`validate`] runs naga's validator on a module and [`to_msl`] translates it to Metal
//! Shading Language; the tests do both for every module, so everything that ships also
//! compiles for Apple GPUs.

mod codec_launch;
pub mod flags;
mod params;

pub use codec_launch::{CODEC_CONV_FRAMES, CodecLaunch, conv_transpose_launch, conv1d_launch};
pub use params::{
    AttentionParams, BandwidthParams, CodecParams, ElementwiseParams, GroupParams, LinearParams, NormParams,
    ProbeParams, RouterParams,
};

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

const COMMON: &str = include_str!("wgsl/common.wgsl");
/// The fixed-order tree reduction, appended to the modules that combine one value per
/// invocation.
const REDUCE: &str = include_str!("wgsl/reduce.wgsl");

/// The linear kernels' parameter block, shared by `linear.wgsl` and `linear_ragged.wgsl`.
const LINEAR_PARAMS: &str = include_str!("wgsl/linear_params.wgsl");

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

/// The workgroup width of the dense linears ([`Kernel::Linear`], [`Kernel::LinearKv`]): wide,
/// which on an H200 made their launches in the decode steps of every lane count shorter than
/// at 64 invocations, the prefill's the same.
pub const DENSE_LINEAR_WIDTH: LinearWidth = LinearWidth::Wide;

/// The workgroup width of the launches a linear shares: [`Kernel::LinearPair`] (wide made its
/// eight-lane launches longer) and the routing modules' linear
/// ([`Kernel::RouteLinear`]). Routing sums its softmax denominator over the first WG
/// invocations in both its entry points (`router.wgsl`), so another width there would change
/// routing's bits.
pub const SHARED_LAUNCH_LINEAR_WIDTH: LinearWidth = LinearWidth::Standard;

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

/// Activation rows a dense linear workgroup applies each decoded weight to per pass over its
/// weights (`linear.wgsl`'s PASS_ROWS); a launch gives each pass its own workgroup row.
pub const LINEAR_PASS_ROWS: usize = 2;

/// Workgroup memory a device must offer (`max_compute_workgroup_storage_size`): at least
/// what the largest entry point uses (routing of 512 kept experts with the linear beside it:
/// 17728 bytes). Apple GPUs offer 32 KB, NVIDIA's Vulkan driver 48 KB, and lavapipe, on
/// which every test runs, at least this.
pub const WORKGROUP_MEMORY_BYTES: u32 = 18 * 1024;

/// Slots of one expert a `gathered_grouped` workgroup computes together (`linear.wgsl`'s and
/// `moe.wgsl`'s GROUP_SLOTS).
pub const EXPERT_GROUP_SLOTS: usize = 8;

/// Whether a workgroup's memory is filled with zeros before its first invocation runs, as
/// WGSL promises by default: off. Every kernel here writes each workgroup value before it
/// reads it, so the fill would buy nothing, and on Apple GPUs it costs every workgroup of
/// every launch: naga's Metal translation has the first invocation store every workgroup
/// variable the entry point uses, one after another, while the others wait at a barrier
/// (naga 30's `write_workgroup_variables_initialization`): 10 KB per attention workgroup,
/// 5.6-16 KB per routing one (by its [`KeptCapacity`]). Vulkan drivers fill natively: on an
/// H200 decode steps, prefill and PCM were the same either way. The engine's pipelines and
/// [`to_msl`] use this setting.
pub const ZERO_FILL_WORKGROUP_MEMORY: bool = false;

/// Whether the translated kernels count every loop's iterations and leave a loop after
/// 2^64 of them (wgpu's default `force_loop_bounding`, which keeps a shader compiler from
/// treating an endless loop as unreachable): off. Every loop here ends: its counter moves
/// by a step that is never zero (a constant, or a parameter the host makes nonzero: a
/// convolution's lanes, the roofline's stride, a linear's workgroup rows; attention's
/// `parts` loops run only when `parts` is nonzero) toward a bound that the counter reaches
/// without wrapping (sizes stay below 2^31). A new loop must keep to that. The counters
/// cost: on an H200 they made the decode steps, the prefill and a codec chunk longer, the
/// PCM identical.
pub const FORCE_LOOP_BOUNDING: bool = false;

/// Kept experts per MoE layer that routing and slot grouping take at most (the largest
/// [`KeptCapacity`], `moe.wgsl`'s MAX_EXPERTS: their workgroup arrays).
pub const MAX_KEPT_EXPERTS: usize = 512;

/// `head_dim` the attention kernel runs is a multiple of this: it reads a head as vec4s,
/// and RoPE pairs each vec4 of the first half with one of the second.
pub const HEAD_DIM_MULTIPLE: usize = 8;

/// The largest `head_dim` the attention kernel runs: its workgroup holds a query head as
/// 256 vec4s.
pub const MAX_HEAD_DIM: usize = 1024;

/// Row widths the RMSNorm kernel reads are a multiple of this: it reads rows as vec4s.
pub const NORM_WIDTH_MULTIPLE: usize = 4;

/// Expert groups a sigmoid router may have (`router.wgsl`'s MAX_GROUPS).
pub const MAX_EXPERT_GROUPS: usize = 64;

/// Experts routing chooses per token at most (`router.wgsl`'s MAX_K).
pub const MAX_ROUTED_PER_TOKEN: usize = 16;

/// The kept experts a routing module's workgroup arrays hold (`router.wgsl`'s MAX_KEPT): a
/// layer routes with the smallest capacity that holds its kept experts, since routing's
/// workgroup memory (about 16 KB at 512) is carried by every workgroup of its launch, the
/// linear's beside it too. (On an H200, 128 kept experts compiled for 128 instead of 512
/// made a guidance-pair decode step and its `route_linear` launches shorter, the bits the
/// same.)
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

/// A compilable WGSL module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Module {
    /// `linear.wgsl` with one weight format and workgroup width.
    Linear(WeightFormat, LinearWidth),
    /// `linear_ragged.wgsl`: a BF16 linear at any input width.
    LinearRagged,
    /// `norm.wgsl`.
    Norm,
    /// `attention.wgsl`: RoPE, KV writes, attention.
    Attention,
    /// `router.wgsl` appended to the BF16 linear module: routing of up to that many kept
    /// experts, and a BF16 linear in the same launch.
    Router(KeptCapacity),
    /// `elementwise.wgsl`.
    Elementwise,
    /// `moe.wgsl`.
    Moe,
    /// `codec.wgsl`: causal convolutions, snake, tanh, stream history.
    Codec,
    /// `bandwidth.wgsl`: the read-bandwidth roofline.
    Bandwidth,
    /// `probe.wgsl`: device behaviour checked when the device opens.
    Probe,
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

impl Module {
    /// Every module the engine can use.
    pub const ALL: [Module; 20] = [
        Module::Linear(WeightFormat::Bf16, LinearWidth::Narrow),
        Module::Linear(WeightFormat::Bf16, LinearWidth::Standard),
        Module::Linear(WeightFormat::Bf16, LinearWidth::Wide),
        Module::Linear(WeightFormat::Nvfp4, LinearWidth::Narrow),
        Module::Linear(WeightFormat::Nvfp4, LinearWidth::Standard),
        Module::Linear(WeightFormat::Nvfp4, LinearWidth::Wide),
        Module::Linear(WeightFormat::Fp8Block, LinearWidth::Narrow),
        Module::Linear(WeightFormat::Fp8Block, LinearWidth::Standard),
        Module::Linear(WeightFormat::Fp8Block, LinearWidth::Wide),
        Module::LinearRagged,
        Module::Norm,
        Module::Attention,
        Module::Router(KeptCapacity::ALL[0]),
        Module::Router(KeptCapacity::ALL[1]),
        Module::Router(KeptCapacity::ALL[2]),
        Module::Elementwise,
        Module::Moe,
        Module::Codec,
        Module::Bandwidth,
        Module::Probe,
    ];

    /// The assembled WGSL source, as the kernels are written.
    pub fn source(self) -> String {
        self.source_with(Numerics::AsWritten)
    }

    /// The assembled WGSL source with `numerics`: [`Numerics::FastMathEmulation`] does in
    /// the source what Metal's default fast math may do to it (see [`Numerics`]).
    pub fn source_with(self, numerics: Numerics) -> String {
        let switch = format!(
            "const FAST_MATH_EMULATION: bool = {};\n{}",
            numerics == Numerics::FastMathEmulation,
            flags::wgsl_constants()
        );
        format!("{switch}{}", self.assembled())
    }

    fn assembled(self) -> String {
        // The helpers a family needs besides COMMON, and its file.
        let (helpers, family) = match self {
            Module::Linear(format, width) => return linear_source(format, width),
            // The router refers to the BF16 linear's `Params` and `linear_rows`.
            Module::Router(capacity) => {
                return format!(
                    "{}\n{REDUCE}\nconst MAX_KEPT: u32 = {}u;\n{}",
                    linear_source(WeightFormat::Bf16, SHARED_LAUNCH_LINEAR_WIDTH),
                    capacity.experts(),
                    include_str!("wgsl/router.wgsl")
                );
            }
            Module::LinearRagged => (LINEAR_PARAMS, include_str!("wgsl/linear_ragged.wgsl")),
            Module::Norm => (REDUCE, include_str!("wgsl/norm.wgsl")),
            Module::Attention => (REDUCE, include_str!("wgsl/attention.wgsl")),
            Module::Elementwise => {
                return format!(
                    "{COMMON}\nconst ROW_PREFIX: u32 = {}u;\nconst ROW_TEXT: u32 = {}u;\nconst ROW_AUDIO: u32 = {}u;\n{}",
                    row_source::PREFIX,
                    row_source::TEXT,
                    row_source::AUDIO,
                    include_str!("wgsl/elementwise.wgsl")
                );
            }
            Module::Moe => ("", include_str!("wgsl/moe.wgsl")),
            Module::Codec => ("", include_str!("wgsl/codec.wgsl")),
            Module::Bandwidth => ("", include_str!("wgsl/bandwidth.wgsl")),
            Module::Probe => ("", include_str!("wgsl/probe.wgsl")),
        };
        format!("{COMMON}\n{helpers}\n{family}")
    }

    /// A short name for labels and dumps.
    pub fn name(self) -> String {
        match self {
            Module::Linear(format, width) => format!("linear_{format:?}_{}", width.invocations()).to_lowercase(),
            Module::Router(capacity) => format!("router_{}", capacity.experts()),
            other => format!("{other:?}").to_lowercase(),
        }
    }
}

/// `linear.wgsl` with the format file of `format`, which refers to the bindings and `Params`
/// declared by linear.wgsl (WGSL allows any order at module scope), and workgroups of
/// `width`.
fn linear_source(format: WeightFormat, width: LinearWidth) -> String {
    let format_source = match format {
        WeightFormat::Bf16 => include_str!("wgsl/fmt_bf16.wgsl"),
        WeightFormat::Nvfp4 => include_str!("wgsl/fmt_nvfp4.wgsl"),
        WeightFormat::Fp8Block => include_str!("wgsl/fmt_fp8.wgsl"),
    };
    format!(
        "{COMMON}\nconst WG: u32 = {}u;\n{LINEAR_PARAMS}\n{}\n{format_source}",
        width.invocations(),
        include_str!("wgsl/linear.wgsl")
    )
}

/// How the kernels' floating point is compiled. Apple's Metal compiler defaults to fast
/// math (wgpu passes no math mode): it may reassociate and contract operations, assume no
/// NaN or infinity and take fast transcendentals. [`Numerics::FastMathEmulation`] writes
/// into the source what that may do to the kernels that rely on evaluation order, so the
/// tests can run them so on any GPU: the codec's compensated sums become plain sums
/// (compensation terms fold to zero under reassociation) and its hand-written `sin` the
/// platform's `sin`. It does not emulate contraction into fused multiply-adds or Apple's
/// own `exp` and `sin` accuracy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
pub enum Numerics {
    /// The kernels as written (how Vulkan and DX12 compile them).
    #[default]
    AsWritten,
    /// The kernels as Metal's fast math may compile them.
    FastMathEmulation,
}

/// One entry point: what the engine dispatches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kernel {
    /// Dense linear, each decoded weight applied to up to [`LINEAR_PASS_ROWS`] activation rows
    /// per pass.
    Linear(WeightFormat, LinearInput),
    /// The dense linear of an attention layer's [q|k|v] projection, which also writes each
    /// row's keys (rotated) and values into the KV caches.
    LinearKv(WeightFormat, LinearInput),
    /// Two BF16 linears over the same input in one launch, each with its own weight and
    /// output (a MoE layer's router logits and its shared expert's SwiGLU).
    LinearPair(LinearInput),
    /// A BF16 linear at an input width [`Kernel::Linear`] cannot read (not a multiple of
    /// [`WeightFormat::width_multiple`]), with plain outputs: bias, rounding, residual.
    LinearRagged,
    /// Routed-expert linear: expert per slot read on the GPU, workgroups of a width.
    Gathered(WeightFormat, LinearWidth),
    /// Routed-expert linear over blocks of slots that share an expert (from
    /// [`Kernel::GroupSlots`]), each expert's rows read once per block.
    GatheredGrouped(WeightFormat, LinearWidth),
    /// Groups a step's routed-expert slots by expert.
    GroupSlots,
    /// RMSNorm.
    RmsNorm,
    /// A MoE layer's combine into the residual stream (routed experts, and the shared expert
    /// when there is one), written out, then the RMSNorm of the result.
    CombineRmsNorm,
    /// Causal grouped-query attention over one chunk of positions (queries rotated as they
    /// are staged); writes the chunk's partial results to the scratch buffer.
    Attend,
    /// [`Kernel::Attend`] whose workgroup of each (row, head)'s last chunk to finish also does
    /// [`Kernel::AttendCombine`]'s work (needs device-scope storage barriers): the same entry
    /// point, compiled with `LAST_CHUNK_COMBINES` (see [`Kernel::overrides`]).
    AttendAndCombine,
    /// Combines a row's attention chunks into its output.
    AttendCombine,
    /// Top-k routing over up to that many kept experts.
    Route(KeptCapacity),
    /// Top-k routing over up to that many kept experts, and a BF16 linear (a MoE layer's
    /// shared-expert down projection) computed by the launch's other workgroups.
    RouteLinear(KeptCapacity),
    /// silu(gate) * up from [gate | up] rows.
    Swiglu,
    /// BF16 values (f32 storage) packed two to a word: the input of a many-row step's linears.
    PackBf16,
    /// Element-wise addition (the voice tower's residual connections).
    Add,
    /// A step's input rows from the text and audio tables (BF16) and the voice prefixes
    /// (F32): the segments of the two tables the launch binds (see [`row_source`]).
    Embed,
    /// Causal dilated convolution, and what it writes.
    Conv1d(ConvOutput),
    /// Transposed convolution (upsampling), and the snake that reads its output next,
    /// rounded to BF16 (alpha at binding 6, the snake's output at 8).
    ConvTransposeSnake,
    /// Snake activation: the tests' reference for the convolutions' snake outputs (the
    /// decoder writes every snake in the launch of the convolution before it).
    Snake,
    /// A stream history after a chunk: the last frames of [history | chunk], written into
    /// the other buffer of the history's pair.
    ShiftHistory,
    /// GELU (erf form).
    Gelu,
    /// Mean over rows.
    MeanRows,
    /// Streams a buffer: the bandwidth roofline.
    ReadBandwidth,
    /// Converts f16 pairs to f32 (the subnormal probe).
    UnpackF16,
}

impl Kernel {
    /// The dense linear for `format` reading `input`: [`Kernel::LinearKv`] when it also
    /// writes the KV caches (an attention projection), [`Kernel::Linear`] otherwise.
    pub fn dense_linear(format: WeightFormat, writes_cache: bool, input: LinearInput) -> Kernel {
        if writes_cache {
            Kernel::LinearKv(format, input)
        } else {
            Kernel::Linear(format, input)
        }
    }

    /// Every kernel.
    pub fn all() -> Vec<Kernel> {
        let formats = [WeightFormat::Bf16, WeightFormat::Nvfp4, WeightFormat::Fp8Block];
        let mut all: Vec<Kernel> = formats
            .iter()
            .flat_map(|&f| LinearInput::ALL.map(|i| [Kernel::Linear(f, i), Kernel::LinearKv(f, i)]))
            .flatten()
            .collect();
        all.extend(LinearInput::ALL.map(Kernel::LinearPair));
        all.push(Kernel::LinearRagged);
        for width in LinearWidth::ALL {
            all.extend(
                formats
                    .iter()
                    .flat_map(|&f| [Kernel::Gathered(f, width), Kernel::GatheredGrouped(f, width)]),
            );
        }
        all.extend([
            Kernel::RmsNorm,
            Kernel::CombineRmsNorm,
            Kernel::Attend,
            Kernel::AttendAndCombine,
            Kernel::AttendCombine,
            Kernel::Swiglu,
            Kernel::PackBf16,
            Kernel::Add,
            Kernel::GroupSlots,
            Kernel::Embed,
            Kernel::Conv1d(ConvOutput::Plain),
            Kernel::Conv1d(ConvOutput::Snake),
            Kernel::Conv1d(ConvOutput::ResidualAndSnake),
            Kernel::Conv1d(ConvOutput::Tanh),
            Kernel::ConvTransposeSnake,
            Kernel::Snake,
            Kernel::ShiftHistory,
            Kernel::Gelu,
            Kernel::MeanRows,
            Kernel::ReadBandwidth,
            Kernel::UnpackF16,
        ]);
        all.extend(
            KeptCapacity::ALL
                .iter()
                .flat_map(|&c| [Kernel::Route(c), Kernel::RouteLinear(c)]),
        );
        all
    }

    /// The module holding this entry point.
    pub fn module(self) -> Module {
        match self {
            Kernel::Linear(f, _) | Kernel::LinearKv(f, _) => Module::Linear(f, DENSE_LINEAR_WIDTH),
            Kernel::Gathered(f, width) | Kernel::GatheredGrouped(f, width) => Module::Linear(f, width),
            Kernel::LinearPair(_) => Module::Linear(WeightFormat::Bf16, SHARED_LAUNCH_LINEAR_WIDTH),
            Kernel::LinearRagged => Module::LinearRagged,
            Kernel::RmsNorm | Kernel::CombineRmsNorm => Module::Norm,
            Kernel::Attend | Kernel::AttendAndCombine | Kernel::AttendCombine => Module::Attention,
            Kernel::Route(c) | Kernel::RouteLinear(c) => Module::Router(c),
            Kernel::Swiglu | Kernel::PackBf16 | Kernel::Add | Kernel::Embed | Kernel::Gelu | Kernel::MeanRows => {
                Module::Elementwise
            }
            Kernel::GroupSlots => Module::Moe,
            Kernel::Conv1d(_) | Kernel::ConvTransposeSnake | Kernel::Snake | Kernel::ShiftHistory => Module::Codec,
            Kernel::ReadBandwidth => Module::Bandwidth,
            Kernel::UnpackF16 => Module::Probe,
        }
    }

    /// The WGSL function name.
    pub fn entry_point(self) -> &'static str {
        match self {
            Kernel::Linear(_, LinearInput::F32) => "linear",
            Kernel::Linear(_, LinearInput::Bf16Pairs) => "linear_packed",
            Kernel::LinearKv(_, LinearInput::F32) => "linear_kv",
            Kernel::LinearKv(_, LinearInput::Bf16Pairs) => "linear_kv_packed",
            Kernel::LinearPair(LinearInput::F32) => "linear_pair",
            Kernel::LinearPair(LinearInput::Bf16Pairs) => "linear_pair_packed",
            Kernel::LinearRagged => "linear_ragged",
            Kernel::Gathered(..) => "gathered",
            Kernel::GatheredGrouped(..) => "gathered_grouped",
            Kernel::GroupSlots => "group_slots",
            Kernel::RmsNorm => "rms_norm",
            Kernel::CombineRmsNorm => "combine_rms_norm",
            Kernel::Attend | Kernel::AttendAndCombine => "attend",
            Kernel::AttendCombine => "attend_combine",
            Kernel::Route(_) => "route",
            Kernel::RouteLinear(_) => "route_linear",
            Kernel::Swiglu => "swiglu",
            Kernel::PackBf16 => "pack_bf16",
            Kernel::Add => "add",
            Kernel::Embed => "embed",
            Kernel::Conv1d(ConvOutput::Plain) => "conv1d",
            Kernel::Conv1d(ConvOutput::Snake) => "conv1d_snake",
            Kernel::Conv1d(ConvOutput::ResidualAndSnake) => "conv1d_residual_snake",
            Kernel::Conv1d(ConvOutput::Tanh) => "conv1d_tanh",
            Kernel::ConvTransposeSnake => "conv_transpose_snake",
            Kernel::Snake => "snake",
            Kernel::ShiftHistory => "shift_history",
            Kernel::Gelu => "gelu",
            Kernel::MeanRows => "mean_rows",
            Kernel::ReadBandwidth => "read_bandwidth",
            Kernel::UnpackF16 => "unpack_f16",
        }
    }

    /// The binding numbers of group 0 the entry point uses, in order; the first is always
    /// the parameter block (uniform): binding 0, or routing's 17 for routing alone.
    pub fn bindings(self) -> &'static [u32] {
        match self {
            // params, x, w, (scales,) bias, y, residual, x_packed, row_lane, row_pos,
            // rope_table, k_cache, v_cache, w_second, y_second: BF16 weights have no scales
            // (every dense entry point names the pair's second weight and output, which only
            // `linear_pair` touches, and both forms of its input, bound to the same buffer)
            Kernel::Linear(WeightFormat::Bf16, _) | Kernel::LinearKv(WeightFormat::Bf16, _) | Kernel::LinearPair(_) => {
                &[0, 1, 2, 4, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16]
            }
            Kernel::Linear(..) | Kernel::LinearKv(..) => &[0, 1, 2, 3, 4, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16],
            // params, x, w, bias, y, residual
            Kernel::LinearRagged => &[0, 1, 2, 4, 6, 8],
            // params, x, w, (scales,) bias, expert_ids, y, expert_scales, x_packed (x again)
            Kernel::Gathered(WeightFormat::Bf16, _) => &[0, 1, 2, 4, 5, 6, 7, 9],
            Kernel::Gathered(..) => &[0, 1, 2, 3, 4, 5, 6, 7, 9],
            // params, x (x_packed again), w, (scales,) bias, slot_blocks, y, expert_scales,
            // slot_order, x_packed
            Kernel::GatheredGrouped(WeightFormat::Bf16, _) => &[0, 1, 2, 4, 5, 6, 7, 8, 9],
            Kernel::GatheredGrouped(..) => &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
            // params, expert_ids, blocks, order
            Kernel::GroupSlots => &[0, 1, 2, 3],
            // params, x, weight, y
            Kernel::RmsNorm => &[0, 1, 2, 3],
            // params, residual, weight, y, routed_out, routed_weights, gate_logits,
            // shared_out, h
            Kernel::CombineRmsNorm => &[0, 1, 2, 3, 4, 5, 6, 7, 8],
            // params, row_lane, row_pos, rope_table, [q|k|v], k_cache, v_cache, dst, scratch,
            // chunk counts, scratch again (which the combining workgroup reads atomically)
            Kernel::Attend | Kernel::AttendAndCombine => &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
            // params, row_pos, dst, scratch, scratch again (which `attend_combine` names but
            // reads plainly)
            Kernel::AttendCombine => &[0, 2, 7, 8, 10],
            // the router's params, logits, kept_ids, score_bias, chosen_ids, chosen_weights,
            // listed
            Kernel::Route(_) => &[17, 18, 19, 20, 21, 22, 23],
            // the BF16 dense linear's, then the router's
            Kernel::RouteLinear(_) => &[0, 1, 2, 4, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22],
            // params, a ([gate | up]), out
            Kernel::Swiglu => &[0, 1, 8],
            // params, a, out_words
            Kernel::PackBf16 => &[0, 1, 8],
            // params, a, b, out
            Kernel::Add => &[0, 1, 2, 8],
            // params, prefixes (a), audio segment, text segment, row_table, row_index, out
            Kernel::Embed => &[0, 1, 2, 5, 6, 7, 8],
            // params, a, out
            Kernel::Gelu | Kernel::MeanRows => &[0, 1, 8],
            // params, data, sink
            Kernel::ReadBandwidth | Kernel::UnpackF16 => &[0, 1, 2],
            // params, x, hist, w, bias, y
            Kernel::Conv1d(ConvOutput::Plain | ConvOutput::Tanh) => &[0, 1, 2, 3, 4, 5],
            Kernel::ConvTransposeSnake => &[0, 1, 2, 3, 4, 5, 6, 8],
            Kernel::Conv1d(ConvOutput::Snake) => &[0, 1, 2, 3, 4, 5, 6],
            Kernel::Conv1d(ConvOutput::ResidualAndSnake) => &[0, 1, 2, 3, 4, 5, 6, 7, 8],
            // params, x, alpha, y
            Kernel::Snake => &[0, 1, 3, 5],
            // params, x, hist, y
            Kernel::ShiftHistory => &[0, 1, 2, 5],
        }
    }

    /// The workgroup width of a `linear.wgsl` kernel (None for the others):
    /// [`DENSE_LINEAR_WIDTH`], [`SHARED_LAUNCH_LINEAR_WIDTH`], or the routed experts' own.
    pub fn linear_width(self) -> Option<LinearWidth> {
        match self {
            Kernel::Linear(..) | Kernel::LinearKv(..) => Some(DENSE_LINEAR_WIDTH),
            Kernel::LinearPair(_) | Kernel::RouteLinear(_) => Some(SHARED_LAUNCH_LINEAR_WIDTH),
            Kernel::Gathered(_, width) | Kernel::GatheredGrouped(_, width) => Some(width),
            _ => None,
        }
    }

    /// The pipeline constants (WGSL `override`s) the kernel's pipeline is compiled with;
    /// the others keep their defaults.
    pub fn overrides(self) -> &'static [(&'static str, f64)] {
        match self {
            Kernel::AttendAndCombine => &[("LAST_CHUNK_COMBINES", 1.0)],
            _ => &[],
        }
    }

    /// Invocations per workgroup.
    pub fn workgroup_size(self) -> u32 {
        if let Some(width) = self.linear_width() {
            return width.invocations();
        }
        match self {
            Kernel::ReadBandwidth
            | Kernel::Attend
            | Kernel::AttendAndCombine
            | Kernel::RmsNorm
            | Kernel::CombineRmsNorm
            | Kernel::Route(_)
            | Kernel::GroupSlots => 256,
            _ => 64,
        }
    }
}

/// Positions per attention chunk (`attention.wgsl`'s CHUNK): `Kernel::Attend` runs one
/// workgroup per (row, head, chunk), `[rows, heads, attention_chunks(capacity)]`.
pub const ATTENTION_CHUNK: usize = 64;

/// Chunks of a cache slot of `capacity` positions.
pub fn attention_chunks(capacity: usize) -> usize {
    capacity.div_ceil(ATTENTION_CHUNK)
}

/// Floats of the scratch buffer attention needs for `rows` rows (`attention.wgsl`): per
/// (row, head) and chunk, a head's partial output and a vec4 of the chunk's max and
/// exponential sum.
pub fn attention_scratch_floats(rows: usize, heads: usize, head_dim: usize, capacity: usize) -> usize {
    rows * heads * attention_chunks(capacity) * (head_dim + 4)
}

/// A module that failed to parse, validate or translate.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// WGSL parse error.
    #[error("{module}: WGSL does not parse: {message}")]
    Parse {
        /// Module name.
        module: String,
        /// naga's message with source context.
        message: String,
    },
    /// naga validation error.
    #[error("{module}: WGSL does not validate: {message}")]
    Validate {
        /// Module name.
        module: String,
        /// naga's message.
        message: String,
    },
    /// MSL translation error.
    #[error("{module}: cannot translate to MSL: {message}")]
    Msl {
        /// Module name.
        module: String,
        /// naga's message.
        message: String,
    },
}

/// Parses and validates a module with naga (with the one capability beyond core WGSL the
/// kernels use: f16 packing in f32 shaders, which Metal and Vulkan have); returns the IR and
/// its analysis.
pub fn validate(module: Module) -> Result<(naga::Module, naga::valid::ModuleInfo), KernelError> {
    validate_with(module, Numerics::AsWritten)
}

/// [`validate`] of the module's source with `numerics`.
pub fn validate_with(
    module: Module,
    numerics: Numerics,
) -> Result<(naga::Module, naga::valid::ModuleInfo), KernelError> {
    let source = module.source_with(numerics);
    let ir = naga::front::wgsl::parse_str(&source).map_err(|e| KernelError::Parse {
        module: module.name(),
        message: e.emit_to_string(&source),
    })?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32,
    )
    .validate(&ir)
    .map_err(|e| KernelError::Validate {
        module: module.name(),
        message: e.emit_to_string(&source),
    })?;
    Ok((ir, info))
}

/// Translates a module to Metal Shading Language (MSL 2.4), as wgpu's Metal backend does for
/// the engine's pipelines, its pipeline constants at their defaults.
pub fn to_msl(module: Module) -> Result<String, KernelError> {
    msl_with(module, &[], ZERO_FILL_WORKGROUP_MEMORY, FORCE_LOOP_BOUNDING)
}

/// A module validated with the pipeline constants `constants` set (the others at their
/// defaults), as wgpu compiles a pipeline.
fn specialised(
    module: Module,
    constants: &[(&str, f64)],
) -> Result<(naga::Module, naga::valid::ModuleInfo), KernelError> {
    let (ir, info) = validate(module)?;
    let constants: naga::back::PipelineConstants = constants
        .iter()
        .map(|&(name, value)| (name.to_string(), value))
        .collect();
    let (ir, info) = naga::back::pipeline_constants::process_overrides(&ir, &info, None, &constants).map_err(|e| {
        KernelError::Validate {
            module: module.name(),
            message: e.to_string(),
        }
    })?;
    Ok((ir.into_owned(), info.into_owned()))
}

/// [`to_msl`] with `constants` set and the workgroup memory fill and the loop counters on or
/// off.
fn msl_with(
    module: Module,
    constants: &[(&str, f64)],
    zero_fill: bool,
    loop_bounding: bool,
) -> Result<String, KernelError> {
    let (ir, info) = specialised(module, constants)?;
    let options = naga::back::msl::Options {
        lang_version: (2, 4),
        zero_initialize_workgroup_memory: zero_fill,
        force_loop_bounding: loop_bounding,
        // wgpu keeps bounds checks on for the engine's pipelines: every index clamped.
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: naga::proc::BoundsCheckPolicy::Restrict,
            buffer: naga::proc::BoundsCheckPolicy::Restrict,
            image_load: naga::proc::BoundsCheckPolicy::Restrict,
            binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
        },
        ..Default::default()
    };
    let (msl, _) = naga::back::msl::write_string(&ir, &info, &options, &naga::back::msl::PipelineOptions::default())
        .map_err(|e| KernelError::Msl {
            module: module.name(),
            message: e.to_string(),
        })?;
    Ok(msl)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast-math emulation's sources parse and validate too, and differ from the
    /// sources as written in the codec module only.
    #[test]
    fn every_module_validates_in_the_fast_math_emulation() {
        for module in Module::ALL {
            validate_with(module, Numerics::FastMathEmulation).unwrap_or_else(|e| panic!("{e}"));
            let uses_switch = module
                .source()
                .lines()
                .any(|line| line.contains("FAST_MATH_EMULATION") && !line.starts_with("const "));
            assert_eq!(uses_switch, module == Module::Codec, "{}", module.name());
        }
    }

    #[test]
    fn every_module_validates_and_translates_to_msl() {
        for module in Module::ALL {
            let msl = to_msl(module).unwrap_or_else(|e| panic!("{e}"));
            assert!(msl.contains("kernel void"), "{}: no kernel in MSL", module.name());
        }
        // And with each kernel's own pipeline constants.
        for kernel in Kernel::all().into_iter().filter(|k| !k.overrides().is_empty()) {
            let msl = msl_with(
                kernel.module(),
                kernel.overrides(),
                ZERO_FILL_WORKGROUP_MEMORY,
                FORCE_LOOP_BOUNDING,
            )
            .unwrap_or_else(|e| panic!("{kernel:?}: {e}"));
            assert!(msl.contains(kernel.entry_point()), "{kernel:?}: no entry point in MSL");
        }
    }

    /// The Metal code the engine's pipelines get has no zero fill of workgroup memory at the
    /// start of a kernel: no statement `name = {};` for a workgroup variable `name` (with the
    /// fill on there is one).
    #[test]
    fn metal_kernels_do_not_zero_fill_workgroup_memory() {
        for module in Module::ALL {
            let (ir, _) = validate(module).unwrap();
            let fills: Vec<String> = ir
                .global_variables
                .iter()
                .filter(|(_, var)| var.space == naga::AddressSpace::WorkGroup)
                .filter_map(|(_, var)| var.name.as_ref().map(|name| format!("{name} = {{}};")))
                .collect();
            let has_fill = |msl: &str| msl.lines().any(|line| fills.iter().any(|fill| line.trim() == fill));
            assert!(
                !has_fill(&to_msl(module).unwrap()),
                "{}: zero fill in MSL",
                module.name()
            );
            if !fills.is_empty() {
                let filled = msl_with(module, &[], true, FORCE_LOOP_BOUNDING).unwrap();
                assert!(has_fill(&filled), "{}: the fill is not recognised", module.name());
            }
        }
    }

    /// Metal runs a pipeline whose register use caps its threadgroup below the workgroup
    /// size as a silent no-op (gfx-rs/wgpu#9176) unless the kernel declares its size: every
    /// entry point's MSL carries `[[max_total_threads_per_threadgroup(N)]]`, N its workgroup
    /// size, so Metal compiles it for N threads or fails the pipeline, an error the engine
    /// reports (`GpuError::Pipeline`).
    #[test]
    fn every_metal_kernel_declares_its_threadgroup_size() {
        for kernel in Kernel::all() {
            let msl = msl_with(
                kernel.module(),
                kernel.overrides(),
                ZERO_FILL_WORKGROUP_MEMORY,
                FORCE_LOOP_BOUNDING,
            )
            .unwrap();
            // naga's namer appends `_` to a name taken by another function of the module.
            let declared = |name: &str| {
                format!(
                    "[[max_total_threads_per_threadgroup({})]] kernel void {name}(",
                    kernel.workgroup_size()
                )
            };
            let entry = kernel.entry_point();
            assert!(
                msl.contains(&declared(entry)) || msl.contains(&declared(&format!("{entry}_"))),
                "{kernel:?}: no `{}` in its MSL",
                declared(entry)
            );
        }
    }

    /// What Metal's default fast math may break in a WGSL source (it assumes no NaN or
    /// infinity): a value compared with itself (a NaN test, which may fold to false) and a
    /// float literal past f32's range (an infinity). Comments are skipped.
    fn fast_math_hazards(source: &str) -> Vec<String> {
        let operand = |c: char| c.is_ascii_alphanumeric() || "_.[]".contains(c);
        let mut found = Vec::new();
        for (number, line) in source.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for op in ["==", "!="] {
                for (at, _) in code.match_indices(op) {
                    let left: String = code[..at]
                        .trim_end()
                        .chars()
                        .rev()
                        .take_while(|&c| operand(c))
                        .collect();
                    let left: String = left.chars().rev().collect();
                    let right: String = code[at + 2..]
                        .trim_start()
                        .chars()
                        .take_while(|&c| operand(c))
                        .collect();
                    if !left.is_empty() && left == right {
                        found.push(format!("line {}: `{left} {op} {right}`", number + 1));
                    }
                }
            }
            for token in code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '+')) {
                let literal = token.trim_start_matches(['-', '+']).trim_end_matches('f');
                let is_float = literal.starts_with(|c: char| c.is_ascii_digit()) && literal.contains(['.', 'e']);
                if let Ok(value) = literal.parse::<f64>()
                    && is_float
                    && value > f64::from(f32::MAX)
                {
                    found.push(format!("line {}: `{literal}` is past f32's range", number + 1));
                }
            }
        }
        found
    }

    /// No kernel relies on NaN or infinity: no self-comparison, no infinite literal
    /// (sentinels are finite, like attention's -3e38, or tested in integer bits, like
    /// `round_bf16`). The check finds both in a planted source.
    #[test]
    fn no_kernel_relies_on_nan_or_infinity() {
        for module in Module::ALL {
            let hazards = fast_math_hazards(&module.source());
            assert!(hazards.is_empty(), "{}: {hazards:?}", module.name());
        }
        let planted = "let m = -3.0e38; // 1e39 in a comment\nif (v != v) { return 1e39; }\nlet ok = a[i] == a[j];";
        assert_eq!(
            fast_math_hazards(planted),
            ["line 2: `v != v`", "line 2: `1e39` is past f32's range"]
        );
    }

    /// The Metal code the engine's pipelines get counts no loop's iterations (naga's
    /// `loop_bound` counters; with the counting on, the linear module has them).
    #[test]
    fn metal_kernels_do_not_count_loop_iterations() {
        for module in Module::ALL {
            assert!(
                !to_msl(module).unwrap().contains("loop_bound"),
                "{}: loop counters",
                module.name()
            );
        }
        let counted = msl_with(
            Module::Linear(WeightFormat::Nvfp4, LinearWidth::Standard),
            &[],
            ZERO_FILL_WORKGROUP_MEMORY,
            true,
        )
        .unwrap();
        assert!(counted.contains("loop_bound"), "the loop counters are not recognised");
    }

    /// [`Kernel::AttendAndCombine`]'s combine rests on naga's SPIR-V giving `storageBarrier`
    /// device memory scope with acquire-release semantics (what
    /// `Capabilities::device_barriers` claims for Vulkan): its every barrier over storage
    /// memory has them.
    #[test]
    fn storage_barriers_have_device_scope_in_spirv() {
        let kernel = Kernel::AttendAndCombine;
        let (ir, info) = specialised(kernel.module(), kernel.overrides()).unwrap();
        let pipeline = naga::back::spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: kernel.entry_point().to_string(),
        };
        let words =
            naga::back::spv::write_vec(&ir, &info, &naga::back::spv::Options::default(), Some(&pipeline)).unwrap();
        const OP_CONSTANT: u32 = 43;
        const OP_CONTROL_BARRIER: u32 = 224;
        const SCOPE_DEVICE: u32 = 1;
        const ACQUIRE_RELEASE: u32 = 0x8;
        const UNIFORM_MEMORY: u32 = 0x40;
        let mut constants = std::collections::HashMap::new();
        let mut barriers = Vec::new();
        let mut at = 5; // past the header
        while at < words.len() {
            let (count, opcode) = ((words[at] >> 16) as usize, words[at] & 0xffff);
            let operands = &words[at + 1..at + count];
            match opcode {
                OP_CONSTANT => {
                    constants.insert(operands[1], operands[2]);
                }
                OP_CONTROL_BARRIER => barriers.push([operands[1], operands[2]]),
                _ => {}
            }
            at += count;
        }
        let storage: Vec<[u32; 2]> = barriers
            .iter()
            .map(|ids| ids.map(|id| constants[&id]))
            .filter(|[_, semantics]| semantics & UNIFORM_MEMORY != 0)
            .collect();
        assert_eq!(storage.len(), 2, "the two storage barriers: {barriers:?}");
        for [scope, semantics] in storage {
            assert_eq!(scope, SCOPE_DEVICE);
            assert_ne!(semantics & ACQUIRE_RELEASE, 0);
        }
    }

    /// The value of the WGSL `const` named `name` (a u32 literal) in `module`.
    fn wgsl_u32(module: Module, name: &str) -> u32 {
        let (ir, _) = validate(module).unwrap();
        let (_, constant) = ir
            .constants
            .iter()
            .find(|(_, c)| c.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("{}: no const {name}", module.name()));
        match ir.global_expressions[constant.init] {
            naga::Expression::Literal(naga::Literal::U32(value)) => value,
            ref other => panic!("{}: {name} is {other:?}", module.name()),
        }
    }

    /// The sizes the host plans with are the ones the WGSL is written for.
    #[test]
    fn host_constants_match_the_wgsl() {
        for format in [WeightFormat::Bf16, WeightFormat::Nvfp4, WeightFormat::Fp8Block] {
            for width in LinearWidth::ALL {
                let linear = Module::Linear(format, width);
                assert_eq!(wgsl_u32(linear, "PASS_ROWS") as usize, LINEAR_PASS_ROWS);
                assert_eq!(wgsl_u32(linear, "GROUP_SLOTS") as usize, EXPERT_GROUP_SLOTS);
                assert_eq!(wgsl_u32(linear, "LANES"), format.thread_row_lanes());
                assert_eq!(wgsl_u32(linear, "UNIT") as usize, format.width_multiple());
                assert_eq!(wgsl_u32(linear, "WG"), width.invocations());
            }
        }
        assert_eq!(wgsl_u32(Module::Attention, "CHUNK") as usize, ATTENTION_CHUNK);
        assert_eq!(wgsl_u32(Module::Moe, "GROUP_SLOTS") as usize, EXPERT_GROUP_SLOTS);
        assert_eq!(wgsl_u32(Module::Moe, "MAX_EXPERTS") as usize, MAX_KEPT_EXPERTS);
        let router = Module::Router(KeptCapacity::ALL[0]);
        assert_eq!(wgsl_u32(router, "MAX_GROUPS") as usize, MAX_EXPERT_GROUPS);
        assert_eq!(wgsl_u32(router, "MAX_K") as usize, MAX_ROUTED_PER_TOKEN);
        for capacity in KeptCapacity::ALL {
            assert_eq!(
                wgsl_u32(Module::Router(capacity), "MAX_KEPT") as usize,
                capacity.experts()
            );
        }
        let largest = KeptCapacity::ALL[KeptCapacity::ALL.len() - 1];
        assert_eq!(largest.experts(), MAX_KEPT_EXPERTS);
    }

    #[test]
    fn every_kernel_entry_point_exists_with_its_bindings() {
        for kernel in Kernel::all() {
            let (ir, workgroup_size, uses) = entry_point_uses(kernel);
            assert_eq!(workgroup_size, [kernel.workgroup_size(), 1, 1]);
            let mut used: Vec<u32> = uses
                .iter()
                .filter_map(|&handle| ir.global_variables[handle].binding.as_ref().map(|b| b.binding))
                .collect();
            used.sort_unstable();
            assert_eq!(used, kernel.bindings(), "{kernel:?}: bindings used by the WGSL");
        }
    }

    /// Every entry point's workgroup memory fits what the engine asks of a device.
    #[test]
    fn every_kernel_fits_the_workgroup_memory_required() {
        for kernel in Kernel::all() {
            let (ir, _, uses) = entry_point_uses(kernel);
            let bytes: u32 = uses
                .iter()
                .map(|&handle| &ir.global_variables[handle])
                .filter(|var| var.space == naga::AddressSpace::WorkGroup)
                .map(|var| ir.types[var.ty].inner.size(ir.to_ctx()))
                .sum();
            assert!(
                bytes <= WORKGROUP_MEMORY_BYTES,
                "{kernel:?}: {bytes} bytes of workgroup memory"
            );
        }
    }

    /// A kernel's validated module, its entry point's workgroup size, and the global
    /// variables the entry point uses.
    fn entry_point_uses(kernel: Kernel) -> (naga::Module, [u32; 3], Vec<naga::Handle<naga::GlobalVariable>>) {
        let (ir, info) = validate(kernel.module()).unwrap();
        let index = ir
            .entry_points
            .iter()
            .position(|e| e.name == kernel.entry_point())
            .unwrap_or_else(|| panic!("{kernel:?}: no entry point"));
        let uses = ir
            .global_variables
            .iter()
            .filter(|(handle, _)| !info.get_entry_point(index)[*handle].is_empty())
            .map(|(handle, _)| handle)
            .collect();
        let workgroup_size = ir.entry_points[index].workgroup_size;
        (ir, workgroup_size, uses)
    }
}
