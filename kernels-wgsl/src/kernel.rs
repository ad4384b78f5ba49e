//! The kernels: every entry point the engine dispatches, each with one registry entry
//! ([`KernelSpec`]) naming its module, entry point, bindings, workgroup and parameter
//! blocks.

use crate::format::{ConvOutput, KeptCapacity, LinearInput, LinearWidth, WeightFormat};
use crate::module::Module;
use crate::params::{
    AttentionParams, BandwidthParams, CodecParams, ElementwiseParams, GroupParams, LinearParams, NormParams,
    ProbeParams, RouterParams, SampleParams,
};
use crate::tuning::{DENSE_LINEAR_WIDTH, SHARED_LAUNCH_LINEAR_WIDTH};

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
    /// RMSNorm of rows whose width is a multiple of [`crate::NORM_WIDTH_MULTIPLE`].
    RmsNorm,
    /// RMSNorm of rows of any width (the voice tower's), element by element.
    RmsNormAny,
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
    /// [`Kernel::Attend`] for the rows long enough to go by blocks of a key/value head's
    /// query heads (the rest are [`Kernel::Attend`]'s): a workgroup per (row, block, chunk)
    /// reads the chunk's keys and values once for the block. The same bits.
    AttendBlocks,
    /// [`Kernel::AttendBlocks`] combining as [`Kernel::AttendAndCombine`] does.
    AttendBlocksAndCombine,
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
    /// One token per row of logits, as the contract's integer sampling defines it.
    Sample,
    /// Streams a buffer: the bandwidth roofline.
    ReadBandwidth,
    /// Converts f16 pairs to f32 (the subnormal probe).
    UnpackF16,
}

/// Everything the engine needs to know of one kernel, in one place.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelSpec {
    /// The module holding the entry point.
    pub module: Module,
    /// The WGSL function name.
    pub entry_point: &'static str,
    /// The binding numbers of group 0 the entry point uses, in order; the first is always a
    /// parameter block (uniform): binding 0, or routing's 17 for routing alone.
    pub bindings: &'static [u32],
    /// The workgroup width of a `linear.wgsl` kernel (None for the others):
    /// [`DENSE_LINEAR_WIDTH`], [`SHARED_LAUNCH_LINEAR_WIDTH`], or the routed experts' own.
    pub linear_width: Option<LinearWidth>,
    /// Invocations per workgroup.
    pub workgroup_size: u32,
    /// The pipeline constants (WGSL `override`s) the pipeline is compiled with; the others
    /// keep their defaults.
    pub overrides: &'static [(&'static str, f64)],
    /// The parameter blocks it reads: (binding, layout).
    pub params: &'static [(u32, ParamBlock)],
}

/// The layout of a parameter block: which `Params` struct of the WGSL, laid out exactly as
/// the host struct of the same name ([`crate::LinearParams`]...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamBlock {
    /// [`LinearParams`].
    Linear,
    /// [`NormParams`].
    Norm,
    /// [`AttentionParams`].
    Attention,
    /// [`RouterParams`].
    Router,
    /// [`ElementwiseParams`].
    Elementwise,
    /// [`GroupParams`].
    Group,
    /// [`CodecParams`].
    Codec,
    /// [`ProbeParams`].
    Probe,
    /// [`BandwidthParams`].
    Bandwidth,
    /// [`SampleParams`].
    Sample,
}

impl ParamBlock {
    /// Bytes of the host struct.
    pub fn bytes(self) -> usize {
        match self {
            ParamBlock::Linear => size_of::<LinearParams>(),
            ParamBlock::Norm => size_of::<NormParams>(),
            ParamBlock::Attention => size_of::<AttentionParams>(),
            ParamBlock::Router => size_of::<RouterParams>(),
            ParamBlock::Elementwise => size_of::<ElementwiseParams>(),
            ParamBlock::Group => size_of::<GroupParams>(),
            ParamBlock::Codec => size_of::<CodecParams>(),
            ParamBlock::Probe => size_of::<ProbeParams>(),
            ParamBlock::Bandwidth => size_of::<BandwidthParams>(),
            ParamBlock::Sample => size_of::<SampleParams>(),
        }
    }
}

/// A registry entry whose workgroup is its linear width's, or `size` for other kernels.
const fn entry(
    module: Module,
    entry_point: &'static str,
    bindings: &'static [u32],
    params: &'static [(u32, ParamBlock)],
    linear_width: Option<LinearWidth>,
    size: u32,
) -> KernelSpec {
    KernelSpec {
        module,
        entry_point,
        bindings,
        linear_width,
        workgroup_size: match linear_width {
            Some(LinearWidth::Narrow) => 32,
            Some(LinearWidth::Standard) => 64,
            Some(LinearWidth::Wide) => 128,
            None => size,
        },
        overrides: &[],
        params,
    }
}

/// The parameter block at binding 0, for kernels that read one.
const LINEAR: &[(u32, ParamBlock)] = &[(0, ParamBlock::Linear)];
const NORM: &[(u32, ParamBlock)] = &[(0, ParamBlock::Norm)];
const ATTENTION: &[(u32, ParamBlock)] = &[(0, ParamBlock::Attention)];
const ELEMENTWISE: &[(u32, ParamBlock)] = &[(0, ParamBlock::Elementwise)];
const CODEC: &[(u32, ParamBlock)] = &[(0, ParamBlock::Codec)];

/// Dense entry points' bindings: params, x, w, (scales,) bias, y, residual, x_packed,
/// row_lane, row_pos, rope_table, k_cache, v_cache, w_second, y_second. BF16 weights have
/// no scales; every dense entry point names the pair's second weight and output, which only
/// `linear_pair` touches, and both forms of its input, bound to the same buffer.
const DENSE_BF16_BINDINGS: &[u32] = &[0, 1, 2, 4, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16];
const DENSE_SCALED_BINDINGS: &[u32] = &[0, 1, 2, 3, 4, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16];

impl Kernel {
    /// The RMSNorm for rows `width` wide: vec4 rows where the width allows, else
    /// element by element.
    pub fn rms_norm(width: usize) -> Kernel {
        if width.is_multiple_of(crate::NORM_WIDTH_MULTIPLE) {
            Kernel::RmsNorm
        } else {
            Kernel::RmsNormAny
        }
    }

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
            Kernel::RmsNormAny,
            Kernel::CombineRmsNorm,
            Kernel::Attend,
            Kernel::AttendAndCombine,
            Kernel::AttendBlocks,
            Kernel::AttendBlocksAndCombine,
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
            Kernel::Sample,
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

    /// Its registry entry.
    pub fn spec(self) -> KernelSpec {
        use Kernel as K;
        let dense = |format: WeightFormat| match format {
            WeightFormat::Bf16 => DENSE_BF16_BINDINGS,
            WeightFormat::Nvfp4 | WeightFormat::Fp8Block => DENSE_SCALED_BINDINGS,
        };
        let wide = Some(DENSE_LINEAR_WIDTH);
        let shared = Some(SHARED_LAUNCH_LINEAR_WIDTH);
        match self {
            K::Linear(f, input) => {
                let name = match input {
                    LinearInput::F32 => "linear",
                    LinearInput::Bf16Pairs => "linear_packed",
                };
                entry(Module::Linear(f, DENSE_LINEAR_WIDTH), name, dense(f), LINEAR, wide, 0)
            }
            K::LinearKv(f, input) => {
                let name = match input {
                    LinearInput::F32 => "linear_kv",
                    LinearInput::Bf16Pairs => "linear_kv_packed",
                };
                entry(Module::Linear(f, DENSE_LINEAR_WIDTH), name, dense(f), LINEAR, wide, 0)
            }
            K::LinearPair(input) => {
                let name = match input {
                    LinearInput::F32 => "linear_pair",
                    LinearInput::Bf16Pairs => "linear_pair_packed",
                };
                let module = Module::Linear(WeightFormat::Bf16, SHARED_LAUNCH_LINEAR_WIDTH);
                entry(module, name, DENSE_BF16_BINDINGS, LINEAR, shared, 0)
            }
            // params, x, w, bias, y, residual
            K::LinearRagged => entry(
                Module::LinearRagged,
                "linear_ragged",
                &[0, 1, 2, 4, 6, 8],
                LINEAR,
                None,
                64,
            ),
            // params, x, w, (scales,) bias, expert_ids, y, expert_scales, x_packed (x again)
            K::Gathered(f, width) => {
                let bindings: &[u32] = match f {
                    WeightFormat::Bf16 => &[0, 1, 2, 4, 5, 6, 7, 9],
                    _ => &[0, 1, 2, 3, 4, 5, 6, 7, 9],
                };
                entry(Module::Linear(f, width), "gathered", bindings, LINEAR, Some(width), 0)
            }
            // params, x (x_packed again), w, (scales,) bias, slot_blocks, y, expert_scales,
            // slot_order, x_packed
            K::GatheredGrouped(f, width) => {
                let bindings: &[u32] = match f {
                    WeightFormat::Bf16 => &[0, 1, 2, 4, 5, 6, 7, 8, 9],
                    _ => &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
                };
                entry(
                    Module::Linear(f, width),
                    "gathered_grouped",
                    bindings,
                    LINEAR,
                    Some(width),
                    0,
                )
            }
            // params, expert_ids, blocks, order
            K::GroupSlots => entry(
                Module::Moe,
                "group_slots",
                &[0, 1, 2, 3],
                &[(0, ParamBlock::Group)],
                None,
                256,
            ),
            // params, x, weight, y, y as BF16 pairs
            K::RmsNorm => entry(Module::Norm, "rms_norm", &[0, 1, 2, 3, 12], NORM, None, 256),
            // params, x, weight, y (as scalars)
            K::RmsNormAny => entry(Module::Norm, "rms_norm_any", &[0, 9, 10, 11], NORM, None, 256),
            // params, residual, weight, y, routed_out, routed_weights, gate_logits,
            // shared_out, h, y as BF16 pairs
            K::CombineRmsNorm => entry(
                Module::Norm,
                "combine_rms_norm",
                &[0, 1, 2, 3, 4, 5, 6, 7, 8, 12],
                NORM,
                None,
                256,
            ),
            // params, row_lane, row_pos, rope_table, [q|k|v], k_cache, v_cache, dst, scratch,
            // chunk counts, scratch again (which the combining workgroup reads atomically)
            K::Attend | K::AttendAndCombine | K::AttendBlocks | K::AttendBlocksAndCombine => KernelSpec {
                overrides: match self {
                    K::AttendAndCombine | K::AttendBlocksAndCombine => &[("LAST_CHUNK_COMBINES", 1.0)],
                    _ => &[],
                },
                ..entry(
                    Module::Attention,
                    match self {
                        K::AttendBlocks | K::AttendBlocksAndCombine => "attend_blocks",
                        _ => "attend",
                    },
                    &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
                    ATTENTION,
                    None,
                    256,
                )
            },
            // params, row_pos, dst, scratch, and `scratch_bits` (the same buffer), which the
            // chunk loads `attend_combine` shares with the in-launch combine name
            K::AttendCombine => entry(
                Module::Attention,
                "attend_combine",
                &[0, 2, 7, 8, 10],
                ATTENTION,
                None,
                64,
            ),
            // the router's params, logits, kept_ids, score_bias, chosen_ids, chosen_weights,
            // listed
            K::Route(c) => entry(
                Module::Router(c),
                "route",
                &[17, 18, 19, 20, 21, 22, 23],
                &[(17, ParamBlock::Router)],
                None,
                256,
            ),
            // the BF16 dense linear's, then the router's
            K::RouteLinear(c) => entry(
                Module::Router(c),
                "route_linear",
                &[0, 1, 2, 4, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22],
                &[(0, ParamBlock::Linear), (17, ParamBlock::Router)],
                shared,
                0,
            ),
            // params, a ([gate | up]), out
            K::Swiglu => entry(Module::Elementwise, "swiglu", &[0, 1, 8], ELEMENTWISE, None, 64),
            // params, a, out_words
            K::PackBf16 => entry(Module::Elementwise, "pack_bf16", &[0, 1, 8], ELEMENTWISE, None, 64),
            // params, a, b, out
            K::Add => entry(Module::Elementwise, "add", &[0, 1, 2, 8], ELEMENTWISE, None, 64),
            // params, prefixes (a), audio segment, text segment, row_table, row_index, out
            K::Embed => entry(
                Module::Elementwise,
                "embed",
                &[0, 1, 2, 5, 6, 7, 8],
                ELEMENTWISE,
                None,
                64,
            ),
            // params, a, out
            K::Gelu => entry(Module::Elementwise, "gelu", &[0, 1, 8], ELEMENTWISE, None, 64),
            K::MeanRows => entry(Module::Elementwise, "mean_rows", &[0, 1, 8], ELEMENTWISE, None, 64),
            // params, x, hist, w, bias, y
            K::Conv1d(ConvOutput::Plain) => entry(Module::Codec, "conv1d", &[0, 1, 2, 3, 4, 5], CODEC, None, 64),
            K::Conv1d(ConvOutput::Tanh) => entry(Module::Codec, "conv1d_tanh", &[0, 1, 2, 3, 4, 5], CODEC, None, 64),
            // ... and alpha
            K::Conv1d(ConvOutput::Snake) => {
                entry(Module::Codec, "conv1d_snake", &[0, 1, 2, 3, 4, 5, 6], CODEC, None, 64)
            }
            // ... alpha, residual, snake output
            K::Conv1d(ConvOutput::ResidualAndSnake) => entry(
                Module::Codec,
                "conv1d_residual_snake",
                &[0, 1, 2, 3, 4, 5, 6, 7, 8],
                CODEC,
                None,
                64,
            ),
            // params, x, hist, w, bias, y, alpha, snake output
            K::ConvTransposeSnake => entry(
                Module::Codec,
                "conv_transpose_snake",
                &[0, 1, 2, 3, 4, 5, 6, 8],
                CODEC,
                None,
                64,
            ),
            // params, x, alpha, y
            K::Snake => entry(Module::Codec, "snake", &[0, 1, 3, 5], CODEC, None, 64),
            // params, x, hist, y
            K::ShiftHistory => entry(Module::Codec, "shift_history", &[0, 1, 2, 5], CODEC, None, 64),
            // params, logits, draws, coarse and fine tables of e^-x, tokens
            K::Sample => entry(
                Module::Sample,
                "sample",
                &[0, 1, 2, 3, 4, 5],
                &[(0, ParamBlock::Sample)],
                None,
                256,
            ),
            // params, data, sink
            K::ReadBandwidth => entry(
                Module::Bandwidth,
                "read_bandwidth",
                &[0, 1, 2],
                &[(0, ParamBlock::Bandwidth)],
                None,
                256,
            ),
            K::UnpackF16 => entry(
                Module::Probe,
                "unpack_f16",
                &[0, 1, 2],
                &[(0, ParamBlock::Probe)],
                None,
                64,
            ),
        }
    }

    /// The module holding this entry point.
    pub fn module(self) -> Module {
        self.spec().module
    }

    /// The WGSL function name.
    pub fn entry_point(self) -> &'static str {
        self.spec().entry_point
    }

    /// The binding numbers of group 0 the entry point uses ([`KernelSpec::bindings`]).
    pub fn bindings(self) -> &'static [u32] {
        self.spec().bindings
    }

    /// The workgroup width of a `linear.wgsl` kernel ([`KernelSpec::linear_width`]).
    pub fn linear_width(self) -> Option<LinearWidth> {
        self.spec().linear_width
    }

    /// The pipeline constants the kernel's pipeline is compiled with.
    pub fn overrides(self) -> &'static [(&'static str, f64)] {
        self.spec().overrides
    }

    /// Invocations per workgroup.
    pub fn workgroup_size(self) -> u32 {
        self.spec().workgroup_size
    }
}
