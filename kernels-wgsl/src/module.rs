//! WGSL modules: a kernel family's file assembled with the shared helpers (and, for linears,
//! a weight-format file), and how its floating point is compiled.

use crate::flags;
use crate::format::{KeptCapacity, LinearWidth, WeightFormat, row_source};
use crate::tuning::SHARED_LAUNCH_LINEAR_WIDTH;

const COMMON: &str = include_str!("wgsl/common.wgsl");
/// The fixed-order tree reduction, appended to the modules that combine one value per
/// invocation.
const REDUCE: &str = include_str!("wgsl/reduce.wgsl");

/// The linear kernels' parameter block, shared by `linear.wgsl` and `linear_ragged.wgsl`.
const LINEAR_PARAMS: &str = include_str!("wgsl/linear_params.wgsl");
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
    /// `sample.wgsl`: the contract's integer sampling.
    Sample,
    /// `bandwidth.wgsl`: the read-bandwidth roofline.
    Bandwidth,
    /// `probe.wgsl`: device behaviour checked when the device opens.
    Probe,
}
impl Module {
    /// Every module the engine can use.
    pub const ALL: [Module; 21] = [
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
        Module::Sample,
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
            Module::Sample => ("", include_str!("wgsl/sample.wgsl")),
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

/// `linear.wgsl` and the routed experts' `experts.wgsl` with the format file of `format`,
/// which refers to the bindings and `Params` declared by linear.wgsl (WGSL allows any order
/// at module scope), and workgroups of `width`.
fn linear_source(format: WeightFormat, width: LinearWidth) -> String {
    let format_source = match format {
        WeightFormat::Bf16 => include_str!("wgsl/fmt_bf16.wgsl"),
        WeightFormat::Nvfp4 => include_str!("wgsl/fmt_nvfp4.wgsl"),
        WeightFormat::Fp8Block => include_str!("wgsl/fmt_fp8.wgsl"),
    };
    format!(
        "{COMMON}\nconst WG: u32 = {}u;\n{LINEAR_PARAMS}\n{}\n{}\n{format_source}",
        width.invocations(),
        include_str!("wgsl/linear.wgsl"),
        include_str!("wgsl/experts.wgsl")
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
